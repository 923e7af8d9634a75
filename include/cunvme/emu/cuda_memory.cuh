// CUDA memory for the emulator: BAR0 and the CMB in pinned, mapped host memory (so GPU
// threads can store to doorbells), copies to and from GPU memory on the worker threads'
// own non-blocking streams, and namespaces pinned so those copies run at full speed.
//
// Copies never use the legacy default stream: a kernel that polls for its completion there
// would wait for the copy and the copy for the kernel.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/controller_config.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <stdlib.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// A CUDA runtime failure, with what was being done.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, const std::string& what)
      : std::runtime_error(what + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")"), code_(code) {}
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace detail {

/// The calling emulator thread's copy stream, if it made one.
struct copy_stream_state {
  cudaStream_t stream = nullptr;
  bool created = false;
};
inline copy_stream_state& this_thread_copy_stream() {
  thread_local copy_stream_state state;
  return state;
}

/// One non-blocking stream per emulator thread, created when the thread starts (`thread_start`)
/// and destroyed as it ends (`thread_end`, `release_copy_stream`).
inline cudaStream_t copy_stream() {
  copy_stream_state& s = this_thread_copy_stream();
  if (!s.created) {
    if (const auto e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking); e != cudaSuccess) {
      throw cuda_error(e, "emu: creating the emulator's copy stream");
    }
    s.created = true;
  }
  return s.stream;
}

/// Destroys the calling thread's stream once its copies are done. Runs from the controller's
/// threads as they end, which is in the controller's destructor, not at thread-local teardown:
/// that can come after the CUDA runtime was torn down at process exit (then both calls fail
/// with an error code, which is dropped: the driver frees the stream with the context).
inline void release_copy_stream() noexcept {
  copy_stream_state& s = this_thread_copy_stream();
  if (!s.created) return;
  const bool synced = cudaStreamSynchronize(s.stream) == cudaSuccess;
  const bool destroyed = cudaStreamDestroy(s.stream) == cudaSuccess;
  if (!synced || !destroyed) (void)cudaGetLastError();
  s.stream = nullptr;
  s.created = false;
}

/// Whether the calling thread queued host → device copies not yet waited for.
inline bool& copies_queued() {
  thread_local bool queued = false;
  return queued;
}

/// The machine's physical memory in bytes (0 when the system will not say).
inline std::size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

}  // namespace detail

/// Call first in `main`, before any CUDA call, in a program whose kernels wait for emulated
/// I/O. It sets two things the CUDA driver reads once, at the program's first CUDA call, each
/// only if the environment does not already say:
/// - `CUDA_DEVICE_MAX_CONNECTIONS=32`. The driver feeds streams to the GPU through this many
///   hardware work queues (8 by default), handed out round robin as streams are created.
///   Every emulator thread copies on a stream of its own; once streams outnumber the work
///   queues, a worker's copy can wait in one queue behind the very kernel that waits for
///   that copy, and the kernel's reads end in timeouts. On the H100 with 12 workers, 5 of
///   12 queue pairs stopped this way (4 KiB reads); with 32 work queues none did.
/// - `CUDA_MODULE_LOADING=EAGER`. With lazy loading, a kernel's first launch waits for the
///   kernels already running; a poller or a null controller spinning beside it never ends.
inline void prepare_cuda_environment() {
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

/// `memory_hooks` for a controller whose BAR and CMB GPU threads can write to, and whose
/// DMA reaches GPU memory registered as `memory_kind::device`.
///
/// Each namespace is pinned (cudaHostRegister) when the controller is built, since copies
/// from pageable memory go through the driver's staging buffers at about half the pinned
/// bandwidth. That faults in and locks every page of the store: a 1 GiB RAM namespace
/// costs 1 GiB of locked memory and a fraction of a second, a file namespace is read in
/// whole. A store larger than half the machine's memory stays pageable (pinning a sparse
/// RAM namespace past physical memory would summon the OOM killer), as does one the driver
/// refuses; `controller::namespace_memory_pinned` tells. To never pin, clear
/// `register_host` in the returned hooks.
///
/// ```
/// emu::controller_config config;
/// config.memory = emu::cuda_memory();
/// emu::controller ctrl(config);
/// auto bus = ctrl.dma().map(device_buffer, bytes, emu::memory_kind::device);
/// ```
[[nodiscard]] inline memory_hooks cuda_memory() {
  memory_hooks hooks;
  hooks.allocate = [](std::size_t bytes) -> void* {
    // Page-aligned memory, then pinned and mapped: cudaHostAlloc sub-allocates small requests
    // without page alignment, and queues, PRP lists and BAR pages must start on a page.
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) throw cuda_error(cudaErrorMemoryAllocation, "emu: allocating " + std::to_string(bytes) + " bytes of host memory");
    // Portable: usable from every device; Mapped: GPU threads store to it through UVA.
    if (const auto e = cudaHostRegister(p, rounded, cudaHostRegisterMapped | cudaHostRegisterPortable); e != cudaSuccess) {
      std::free(p);
      throw cuda_error(e, "emu: pinning and mapping " + std::to_string(bytes) + " bytes of host memory");
    }
    return p;
  };
  hooks.release = [](void* p, std::size_t) {
    (void)cudaHostUnregister(p);
    std::free(p);
  };
  hooks.register_host = [](void* p, std::size_t bytes, bool read_only) {
    const long page_size = ::sysconf(_SC_PAGESIZE);
    const std::size_t page = page_size > 0 ? static_cast<std::size_t>(page_size) : 4096;
    // The store's mapping starts on a page; its last page is mapped whole.
    const std::size_t rounded = (bytes + page - 1) / page * page;
    if (rounded > detail::physical_memory_bytes() / 2) return false;
    // Portable: pinned for every context, the worker threads' included. ReadOnly: a
    // PROT_READ mapping (a read-only file namespace) cannot be pinned for writing.
    const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    if (cudaHostRegister(p, rounded, flags) == cudaSuccess) return true;
    // The failure is not sticky, but would stay the thread's last error and surface in the
    // user's next cudaGetLastError; the namespace just stays pageable.
    (void)cudaGetLastError();
    return false;
  };
  hooks.unregister_host = [](void* p, std::size_t) {
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  };
  hooks.device_copy.copy = [](void* dst, const void* src, std::uint64_t bytes, bool to_device) {
    cudaStream_t stream = nullptr;
    try {
      stream = detail::copy_stream();
    } catch (const cuda_error&) {
      return false;  // the command fails with Data Transfer Error; the worker thread lives on
    }
    if (!to_device) {
      return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
             cudaStreamSynchronize(stream) == cudaSuccess;
    }
    // Host → device copies of one command queue up on the thread's stream; `wait` runs
    // before the command's completion is posted.
    detail::copies_queued() = true;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream) == cudaSuccess;
  };
  // Called for every read: with nothing queued (data in host memory) no CUDA call is made.
  hooks.device_copy.wait = [] {
    if (!detail::copies_queued()) return true;
    detail::copies_queued() = false;
    try {
      return cudaStreamSynchronize(detail::copy_stream()) == cudaSuccess;
    } catch (const cuda_error&) {
      return false;
    }
  };
  hooks.device_copy.thread_start = [] {
    try {
      (void)detail::copy_stream();
    } catch (const cuda_error&) {
      // Left to the first copy, which then fails its command with Data Transfer Error.
    }
  };
  hooks.device_copy.thread_end = [] { detail::release_copy_stream(); };
  return hooks;
}

}  // namespace emu
CUNVME_NAMESPACE_END
