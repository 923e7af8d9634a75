// The extension's seam between its bindings (module.cpp, any C++ compiler) and the GPU path
// (gpu_path.cu, nvcc): `cunvme::device` and `copy_n` behind an interface that names no CUDA
// type, so that nanobind never goes through nvcc and a toolkit without nvcc still builds the
// host path (gpu_path_absent.cpp then answers "no GPU path in this build").
#pragma once

#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/controller/controller_options.cuh>
#include <cunvme/io/io_result.cuh>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace cunvme_python {

/// A `copy_n` enqueued on a stream (`cunvme::pending_copy`).
class gpu_copy {
 public:
  virtual ~gpu_copy() = default;
  /// Whether `wait()` would return at once. Never blocks (false while another thread waits).
  [[nodiscard]] virtual bool ready() const = 0;
  /// Blocks until the stream has run the copy; its outcome. Throws `host::error` when the
  /// kernel failed to run.
  virtual cunvme::io_result wait() = 0;
  /// What the controller's backend saw that may explain a timeout (`cunvme::device::describe`);
  /// empty where it saw nothing or the controller is gone.
  [[nodiscard]] virtual std::string timeout_cause() const = 0;
};

/// A controller opened for GPU threads with queue pairs for `copy_n` (`cunvme::device`).
class gpu_path {
 public:
  virtual ~gpu_path() = default;
  /// The controller the device owns: the host path opens its own queue pair on it.
  [[nodiscard]] virtual cunvme::host::controller& controller() = 0;
  /// The GPU (CUDA ordinal) it serves.
  [[nodiscard]] virtual int gpu() const = 0;
  /// `copy_n(dev, lba, blocks, gpu, stream)`, the request checked against `capacity` bytes.
  [[nodiscard]] virtual std::unique_ptr<gpu_copy> read(std::uint64_t lba, std::uint64_t blocks, void* gpu, std::size_t capacity,
                                                       std::uintptr_t stream) = 0;
  /// `copy_n(gpu, blocks, dev, lba, stream)`.
  [[nodiscard]] virtual std::unique_ptr<gpu_copy> write(std::uint64_t lba, std::uint64_t blocks, const void* gpu, std::size_t capacity,
                                                        std::uintptr_t stream) = 0;
};

/// Why this process cannot use the GPU path ("" when it can): a build without nvcc, or CUDA
/// reporting no usable GPU (no driver, no device) — then `Device` drives the controller from
/// CPU threads only.
[[nodiscard]] std::string gpu_unavailable_reason();

/// `cunvme::device(uri, {gpu, nsid, timeout, controller})`: GPU `gpu` (-1: the current one).
/// Throws `host::error`.
[[nodiscard]] std::unique_ptr<gpu_path> open_gpu_path(std::string_view uri, std::uint32_t nsid, std::chrono::nanoseconds timeout,
                                                      const cunvme::host::controller_options& controller, int gpu);

}  // namespace cunvme_python
