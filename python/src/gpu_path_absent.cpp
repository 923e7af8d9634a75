// The GPU path of an extension built without nvcc: reported unavailable, so `Device` opens
// its controller for CPU threads only and refuses GPU arrays with this reason.
#include "gpu_path.hpp"

#include <cunvme/host/error.cuh>

namespace cunvme_python {

std::string gpu_unavailable_reason() { return "this build of cunvme has no GPU path (it was built without nvcc)"; }

std::unique_ptr<gpu_path> open_gpu_path(std::string_view uri, std::uint32_t, std::chrono::nanoseconds, const cunvme::host::controller_options&, int) {
  throw cunvme::host::error("Open for GPU threads", std::string(uri), gpu_unavailable_reason());
}

}  // namespace cunvme_python
