// The GPU path: `cunvme::device` and `copy_n`, behind gpu_path.hpp's CUDA-free interface.
#include "gpu_path.hpp"

#include <cunvme/facade/copy.cuh>
#include <cunvme/facade/device.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_reach.cuh>
#include <cunvme/host/open.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>

namespace cunvme_python {
namespace {

/// A `pending_copy` that Python threads may share: it has one owner that waits, so waits take
/// turns, and `ready()` (which must not block) answers "not yet" while another thread waits.
class pending final : public gpu_copy {
 public:
  pending(cunvme::pending_copy copy, const cunvme::device& dev)
      : copy_(std::move(copy)), controller_(dev.shared_controller()), timeout_(dev.timeout()) {}
  [[nodiscard]] bool ready() const override {
    const std::unique_lock lock(mutex_, std::try_to_lock);
    return lock.owns_lock() && copy_.ready();
  }
  cunvme::io_result wait() override {
    const std::lock_guard lock(mutex_);
    return copy_.wait();
  }
  [[nodiscard]] std::string timeout_cause() const override {
    const std::shared_ptr<cunvme::host::controller> c = controller_.lock();
    return c ? cunvme::device::timeout_cause(*c, timeout_) : std::string();
  }

 private:
  mutable std::mutex mutex_;
  cunvme::pending_copy copy_;
  std::weak_ptr<cunvme::host::controller> controller_;  // not kept alive by a copy: close() ends it
  std::chrono::nanoseconds timeout_;
};

class device_path final : public gpu_path {
 public:
  device_path(std::string_view uri, cunvme::device_options options) : dev_(uri, std::move(options)) {}

  [[nodiscard]] cunvme::host::controller& controller() override { return dev_.controller(); }
  [[nodiscard]] int gpu() const override { return dev_.gpu(); }

  [[nodiscard]] std::unique_ptr<gpu_copy> read(std::uint64_t lba, std::uint64_t blocks, void* gpu, std::size_t capacity,
                                               std::uintptr_t stream) override {
    // A span carries the capacity: copy_n refuses (invalid_request) a request larger than it.
    const cuda::std::span<std::byte> dst(static_cast<std::byte*>(gpu), capacity);
    return std::make_unique<pending>(cunvme::copy_n(dev_, lba, blocks, dst, reinterpret_cast<cudaStream_t>(stream)), dev_);
  }

  [[nodiscard]] std::unique_ptr<gpu_copy> write(std::uint64_t lba, std::uint64_t blocks, const void* gpu, std::size_t capacity,
                                                std::uintptr_t stream) override {
    const cuda::std::span<const std::byte> src(static_cast<const std::byte*>(gpu), capacity);
    return std::make_unique<pending>(cunvme::copy_n(src, blocks, dev_, lba, reinterpret_cast<cudaStream_t>(stream)), dev_);
  }

 private:
  cunvme::device dev_;
};

}  // namespace

std::string gpu_unavailable_reason() {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    return "CUDA reports no usable GPU: " + cunvme::host::cuda_error_text(e);
  }
  return count == 0 ? "CUDA reports no GPU" : "";
}

std::unique_ptr<gpu_path> open_gpu_path(std::string_view uri, std::uint32_t nsid, std::chrono::nanoseconds timeout,
                                        const cunvme::host::controller_options& controller, int gpu) {
  // As many queue pairs as copy_n may use, and one for the host path.
  cunvme::host::controller_options with_queues = controller;
  with_queues.io_queue_pairs = std::max<std::uint16_t>(controller.io_queue_pairs, cunvme::copy_tuning::max_queues + 1);
  cunvme::device_options options;
  options.gpu = gpu;
  options.nsid = nsid;
  options.timeout = timeout;
  options.controller = with_queues;
  return std::make_unique<device_path>(uri, std::move(options));
}

}  // namespace cunvme_python
