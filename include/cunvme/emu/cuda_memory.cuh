// CUDA memory for the emulator: BAR0 and the CMB in pinned, mapped host memory (so GPU
// threads can store to doorbells), copies to and from GPU memory on the worker threads'
// own non-blocking streams, and namespaces pinned so those copies run at full speed.
//
// Copies never use the legacy default stream: a kernel that polls for its completion there
// would wait for the copy and the copy for the kernel.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/host/cuda_error.cuh>
#include <cunvme/host/gpu/gpu_allocation.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <stdlib.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// A CUDA runtime failure of the emulator's CUDA memory: a `host::error` on device "emu",
/// worded by `host::cuda_error`, that keeps the runtime's code.
class cuda_error : public host::error {
 public:
  cuda_error(cudaError_t code, std::string operation) : host::error(host::cuda_error(code, std::move(operation), "emu", {})), code_(code) {}
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace detail {

/// The calling thread's host → device copies for one GPU not yet handed to CUDA.
struct held_copies {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes;
  bool failed = false;  ///< copies issued before `wait` (at the cap, or before a copy back) failed
  [[nodiscard]] std::size_t size() const noexcept { return sizes.size(); }
  void clear() noexcept {
    dsts.clear();
    srcs.clear();
    sizes.clear();
  }
};

/// What an emulator thread keeps for copies to and from one GPU: a non-blocking stream of that
/// GPU, made the first time (`thread_start` makes the current GPU's, before kernels run), and
/// the copies it holds for it. A copy goes out on the stream of the GPU whose memory it
/// touches, so the copies for several GPUs run on each GPU's own copy engines, side by side.
struct gpu_copy_lane {
  cudaStream_t stream = nullptr;
  bool created = false;
  bool queued = false;  ///< host → device copies queued since the last `wait`
  held_copies held;
};

/// The calling thread's lanes, by CUDA ordinal (grown to the largest ordinal it copied for).
inline std::vector<gpu_copy_lane>& this_thread_lanes() {
  thread_local std::vector<gpu_copy_lane> lanes;
  return lanes;
}

/// The calling thread's lane for GPU `gpu`, its stream created (on that GPU) if it was not.
inline gpu_copy_lane& copy_lane(int gpu) {
  if (gpu < 0) throw cuda_error(cudaErrorInvalidDevice, "Copy for GPU " + std::to_string(gpu));
  std::vector<gpu_copy_lane>& lanes = this_thread_lanes();
  if (lanes.size() <= static_cast<std::size_t>(gpu)) lanes.resize(static_cast<std::size_t>(gpu) + 1);
  gpu_copy_lane& lane = lanes[static_cast<std::size_t>(gpu)];
  if (!lane.created) {
    // Streams belong to the GPU current when they are made; copies may be issued to them from
    // any current GPU. The emulator thread's own current GPU is put back.
    int current = 0;
    if (const auto e = cudaGetDevice(&current); e != cudaSuccess) throw cuda_error(e, "Create the emulator's copy stream");
    if (current != gpu) {
      if (const auto e = cudaSetDevice(gpu); e != cudaSuccess) throw cuda_error(e, "Create the emulator's copy stream for GPU " + std::to_string(gpu));
    }
    const auto e = cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking);
    if (current != gpu) (void)cudaSetDevice(current);
    if (e != cudaSuccess) throw cuda_error(e, "Create the emulator's copy stream for GPU " + std::to_string(gpu));
    lane.created = true;
  }
  return lane;
}

/// Destroys the calling thread's streams once their copies are done. Runs from the controller's
/// threads as they end, which is in the controller's destructor, not at thread-local teardown:
/// that can come after the CUDA runtime was torn down at process exit (then both calls fail
/// with an error code, which is dropped: the driver frees the stream with the context).
inline void release_copy_streams() noexcept {
  for (gpu_copy_lane& lane : this_thread_lanes()) {
    if (!lane.created) continue;
    const bool synced = cudaStreamSynchronize(lane.stream) == cudaSuccess;
    const bool destroyed = cudaStreamDestroy(lane.stream) == cudaSuccess;
    if (!synced || !destroyed) (void)cudaGetLastError();
  }
  this_thread_lanes() = {};
}

/// Copies held before they are issued without waiting for `wait`: bounds the thread's lists
/// (a burst of 64 commands with scattered PRPs can name thousands of pages).
inline constexpr std::size_t max_held_copies = 1024;

/// Hands a lane's held copies to CUDA on its stream, in one `cudaMemcpyBatchAsync`. A CUDA call
/// per copy is what capped the emulator: those calls serialize in the driver, about 190 k
/// copies/s for the whole process however many threads make them; 64 copies of 128 KiB in one
/// batch run at the link's 54 GB/s (H100, bench/RESULTS.md P3). The batch's copies have no
/// order among themselves, which `device_copier` allows until `wait`; their sources stay valid
/// until then, so the driver may read them after this call returns.
inline bool issue_held_copies(gpu_copy_lane& lane) {
  held_copies& held = lane.held;
  if (held.size() == 0) return true;
  bool ok = false;
#if CUDART_VERSION >= 13000
  if (held.size() > 1) {
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t first_copy = 0;
    ok = cudaMemcpyBatchAsync(held.dsts.data(), held.srcs.data(), held.sizes.data(), held.size(), &attributes, &first_copy, 1, lane.stream) ==
         cudaSuccess;
    // A driver without batches: one call per copy, as before.
    if (!ok) (void)cudaGetLastError();
  }
#endif
  if (!ok) {
    ok = true;
    for (std::size_t i = 0; ok && i < held.size(); ++i) {
      ok = cudaMemcpyAsync(held.dsts[i], held.srcs[i], held.sizes[i], cudaMemcpyHostToDevice, lane.stream) == cudaSuccess;
    }
  }
  held.clear();
  held.failed |= !ok;
  return ok;
}

/// The GPU that owns device memory `pointer` (its CUDA ordinal); -1 where CUDA does not know it.
inline int gpu_of(const void* pointer) noexcept {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged ? attributes.device : -1;
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
/// Namespaces are pinned (cudaHostRegister) a granule at a time as commands move their data
/// to or from GPU memory, and ahead of them (`controller_config::pinning`), since copies from
/// pageable memory go through the driver's staging buffers at about half the pinned
/// bandwidth. Pinning faults in and locks the granule's pages: a file namespace is read
/// where it is used, not whole at open. Past the pinning budget (half the machine's memory
/// by default) or where the driver refuses, granules stay pageable;
/// `controller::namespace_pinned_bytes` tells. To never pin, clear `register_host` in the
/// returned hooks.
///
/// Threads: the emulator moves data with CUDA calls from its own threads, so a kernel waiting
/// for its I/O depends on those calls, which a real controller's DMA does not. While such a
/// kernel runs, a CUDA call on another thread that waits for it while holding the driver's
/// lock stalls the emulator's copies, and the kernel's commands time out. Measured on an H200
/// (bench/RESULTS.md "Two threads on one emulated device"):
/// - stalled it: `cudaFree`, `cudaFreeHost`, and a synchronous copy (`cudaMemcpy`) on the
///   legacy default stream while the kernel ran on a stream that synchronizes with it (the
///   legacy default stream itself, or any blocking stream);
/// - not seen to stall it in 16–34 calls each: `cudaMalloc`, `cudaHostAlloc`,
///   `cudaDeviceSynchronize`, and a synchronous copy that queues behind no such kernel. CUDA
///   documents allocations as synchronizing all the same.
/// So kernels that wait for emulated I/O run on non-blocking streams, and memory is allocated
/// and freed between them (`device::between_copies` does this for the library's own). The
/// emulator counts copy calls held up a second or more (`controller_stats::copies`), and an
/// error about a copy that timed out meanwhile says so (`device::describe`, the loader's
/// errors, Python's `IoError`).
///
/// Usage: examples/snippets/kernels.cu, `emulator_with_cuda_memory`.
[[nodiscard]] inline memory_hooks cuda_memory() {
  memory_hooks hooks;
  hooks.allocate = [](std::size_t bytes) -> void* {
    // Page-aligned memory, then pinned and mapped: cudaHostAlloc sub-allocates small requests
    // without page alignment, and queues, PRP lists and BAR pages must start on a page.
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) throw cuda_error(cudaErrorMemoryAllocation, "Allocate " + std::to_string(bytes) + " bytes of host memory");
    // Portable: usable from every device; Mapped: GPU threads store to it through UVA.
    if (const auto e = cudaHostRegister(p, rounded, cudaHostRegisterMapped | cudaHostRegisterPortable); e != cudaSuccess) {
      std::free(p);
      throw cuda_error(e, "Pin and map " + std::to_string(bytes) + " bytes of host memory");
    }
    return p;
  };
  hooks.release = [](void* p, std::size_t) {
    (void)cudaHostUnregister(p);
    std::free(p);
  };
  // The GPU current where the hooks are made (the one a `cunvme::device` opens the emulator
  // for): the emulator's threads start on it, not on GPU 0 where a new thread would.
  int home = 0;
  if (cudaGetDevice(&home) != cudaSuccess) (void)cudaGetLastError();
  hooks.register_host = [home](void* p, std::size_t bytes, bool read_only) {
    // The pin-ahead threads start on no GPU: registering from GPU 0 would make a context
    // there, in a process that may not use GPU 0 at all.
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != home) {
      if (cudaSetDevice(home) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
    }
    // Portable: pinned for every context, the worker threads' included. ReadOnly: a
    // PROT_READ mapping (a read-only file namespace) cannot be pinned for writing.
    const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    if (cudaHostRegister(p, bytes, flags) == cudaSuccess) return true;
    // The failure is not sticky, but would stay the thread's last error and surface in the
    // user's next cudaGetLastError; the granule just stays pageable.
    (void)cudaGetLastError();
    return false;
  };
  hooks.unregister_host = [](void* p, std::size_t) {
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  };
  // A region of GPU memory is copied on its GPU's streams; memory CUDA cannot place is refused
  // when it is mapped (a bus range whose copies would all fail).
  hooks.device_copy.gpu_of = [](const void* pointer) { return detail::gpu_of(pointer); };
  hooks.device_copy.copy = [](void* dst, const void* src, std::uint64_t bytes, bool to_device, int gpu) {
    detail::gpu_copy_lane* lane = nullptr;
    try {
      lane = &detail::copy_lane(gpu);
    } catch (const cuda_error&) {
      return false;  // the command fails with Data Transfer Error; the worker thread lives on
    }
    detail::held_copies& held = lane->held;
    if (!to_device) {
      // After the held copies, in stream order: a read of device memory sees this thread's
      // earlier writes to it (a failure of theirs is `wait`'s to report).
      (void)detail::issue_held_copies(*lane);
      return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, lane->stream) == cudaSuccess &&
             cudaStreamSynchronize(lane->stream) == cudaSuccess;
    }
    // Host → device copies of a burst are held and go out together in `wait`, which runs
    // before any of their commands' completions is posted.
    lane->queued = true;
    if (held.sizes.capacity() < detail::max_held_copies) {
      try {  // once per lane; the lists never grow past it, so the pushes below cannot throw
        held.dsts.reserve(detail::max_held_copies);
        held.srcs.reserve(detail::max_held_copies);
        held.sizes.reserve(detail::max_held_copies);
      } catch (const std::bad_alloc&) {
        (void)detail::issue_held_copies(*lane);
        return false;  // this copy's command fails with Data Transfer Error
      }
    }
    held.dsts.push_back(dst);
    held.srcs.push_back(src);
    held.sizes.push_back(static_cast<std::size_t>(bytes));
    if (held.size() == detail::max_held_copies) (void)detail::issue_held_copies(*lane);  // a failure is `wait`'s to report
    return true;
  };
  // Called for every read: with nothing queued (data in host memory) no CUDA call is made. The
  // copies of every GPU the thread queued for go out before it waits for any of them.
  hooks.device_copy.wait = [] {
    std::vector<detail::gpu_copy_lane>& lanes = detail::this_thread_lanes();
    bool any = false;
    for (detail::gpu_copy_lane& lane : lanes) {
      if (!lane.queued) continue;
      any = true;
      (void)detail::issue_held_copies(lane);
    }
    if (!any) return true;
    bool ok = true;
    for (detail::gpu_copy_lane& lane : lanes) {
      if (!lane.queued) continue;
      lane.queued = false;
      const bool synced = cudaStreamSynchronize(lane.stream) == cudaSuccess;
      const bool failed = std::exchange(lane.held.failed, false);
      ok = ok && synced && !failed;
    }
    return ok;
  };
  hooks.device_copy.thread_start = [home] {
    try {
      if (cudaSetDevice(home) != cudaSuccess) (void)cudaGetLastError();
      (void)detail::copy_lane(home);
    } catch (const cuda_error&) {
      // Left to the first copy, which then fails its command with Data Transfer Error.
    }
  };
  hooks.device_copy.thread_end = [] { detail::release_copy_streams(); };
  // Another process's GPU memory, for a controller this process shares with it.
  hooks.open_exported_gpu = [](const std::byte* exported) -> std::pair<void*, std::size_t> {
    cudaIpcMemHandle_t handle{};
    std::memcpy(&handle, exported, sizeof handle);
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      (void)cudaGetLastError();
      return {nullptr, 0};
    }
    // The allocation's size, so that a range named in it is checked against it.
    try {
      const host::gpu_allocation_range range = host::gpu_allocation_range_of(p, "emu");
      if (range.base == reinterpret_cast<std::uintptr_t>(p)) return {p, range.bytes};
    } catch (const std::exception&) {
      // Not an allocation CUDA can size: closed below, and the request refused.
    }
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) (void)cudaGetLastError();
    return {nullptr, 0};
  };
  // A shared BAR0 (a memory file): pinned and mapped like `allocate`'s memory, so GPU threads
  // store to its doorbells at its host address (UVA).
  hooks.register_bar = [](void* p, std::size_t bytes) {
    if (cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable) == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
  };
  hooks.unregister_bar = [](void* p) {
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  };
  hooks.close_exported_gpu = [](void* p) {
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) (void)cudaGetLastError();
  };
  return hooks;
}

}  // namespace emu
CUNVME_NAMESPACE_END
