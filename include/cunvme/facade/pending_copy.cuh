// What `cunvme::copy_n` returns: a copy enqueued on a stream, whose outcome is read once the
// stream has reached the end of it. CUDA host code.
//
// Usage: examples/snippets/facade.cu, `copies`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/facade/pinned_pool.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_context.cuh>
#include <cunvme/io/io_result.cuh>

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// One enqueued copy: the event recorded after its kernel and the per-warp results the kernel
/// writes. Shared by the `pending_copy` and the device's list of copies in flight, so neither
/// outlives what the other still needs; the device also holds the buffer's mapping until the
/// event has completed.
struct copy_state {
  copy_state(std::string device_name, const char* what) : device(std::move(device_name)), operation(what) {}
  copy_state(const copy_state&) = delete;
  copy_state& operator=(const copy_state&) = delete;
  ~copy_state() {
    // A recorded event not yet reached is released by the driver once it completes.
    if (done != nullptr) (void)cudaEventDestroy(done);
  }

  /// Whether the stream has passed the copy (or failed on the way there).
  [[nodiscard]] bool reached() const noexcept {
    const host::gpu_context_scope scope(gpu, device, std::nothrow);
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaErrorNotReady) {
      // Not an error: kept out of the caller's next cudaGetLastError, which keeps theirs.
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      return false;
    }
    return true;
  }

  /// Whether a warp gave up on a command (read once the stream has passed the copy): the
  /// controller may still write its buffer.
  [[nodiscard]] bool timed_out() const noexcept {
    const io_result* r = results.as<io_result>();
    for (std::uint64_t w = 0; w < warps; ++w) {
      if (r[w].error == io_error::timeout) return true;
    }
    return false;
  }

  std::string device;
  int gpu = 0;            ///< the device's GPU: waits run in its context, whichever thread waits
  const char* operation;  ///< "Run the read kernel", for errors
  cudaEvent_t done = nullptr;
  pinned_pool::lease results;  ///< `warps` io_results, one per warp
  std::uint64_t warps = 0;
  std::optional<io_result> outcome;
};

}  // namespace detail

/// A copy enqueued on a stream. `wait()` blocks until the stream has run it and returns the
/// status of the first failing command by LBA (or success); `ready()` says, without blocking,
/// whether `wait()` would return at once. Destroying it without waiting is allowed: the copy
/// still runs, and what it uses stays alive until the stream reaches its end.
///
/// Errors: an outcome of I/O (an NVMe status, a timeout, a request the namespace refuses) is the
/// `io_result`; a CUDA failure of the kernel itself (a launch the GPU could not run, a fault)
/// throws `host::error` from `wait()`.
class pending_copy {
 public:
  /// A copy with nothing to run: `wait()` returns `result` at once.
  explicit pending_copy(io_result result = {}) : refused_(result) {}
  explicit pending_copy(std::shared_ptr<detail::copy_state> state) : state_(std::move(state)) {}
  // Move-only: one owner waits (a copy waited on from two threads would race on its outcome).
  // A moved-from pending_copy refuses `wait()` rather than report a success it never had.
  pending_copy(pending_copy&& other) noexcept : state_(std::move(other.state_)), refused_(other.refused_) { other.refuse_moved_from(); }
  pending_copy& operator=(pending_copy&& other) noexcept {
    if (this != &other) {
      state_ = std::move(other.state_);
      refused_ = other.refused_;
      other.refuse_moved_from();
    }
    return *this;
  }
  pending_copy(const pending_copy&) = delete;
  pending_copy& operator=(const pending_copy&) = delete;

  /// Whether `wait()` would return without blocking. Never blocks.
  [[nodiscard]] bool ready() const noexcept { return state_ == nullptr || state_->outcome.has_value() || state_->reached(); }

  /// Blocks until the stream has run the copy; its outcome. Throws `host::error` when the
  /// kernel failed to run. May be called again: the same outcome.
  io_result wait() {
    if (state_ == nullptr) return refused_;
    detail::copy_state& s = *state_;
    if (s.outcome) return *s.outcome;
    // A thread that made no CUDA call would otherwise have the runtime set up GPU 0 for it.
    const host::gpu_context_scope scope(s.gpu, s.device);
    host::cuda_check(cudaEventSynchronize(s.done), s.operation, s.device);
    const io_result* results = s.results.as<io_result>();
    io_result first{};
    for (std::uint64_t w = 0; w < s.warps; ++w) {
      if (!results[w].ok() && (first.ok() || results[w].lba < first.lba)) first = results[w];
    }
    s.outcome = first;
    return first;
  }

 private:
  void refuse_moved_from() noexcept {
    state_.reset();
    refused_ = io_result::failure(io_error::invalid_request, 0, 0);
  }

  std::shared_ptr<detail::copy_state> state_;
  io_result refused_{};
};

CUNVME_NAMESPACE_END
