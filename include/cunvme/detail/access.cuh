// The access layer: the only header with inline PTX, volatile accesses or fences. Everything
// that touches a controller register or device memory mapped into the process (a BAR, GPU
// memory through the GPU's BAR), or orders memory against one, goes through these functions,
// each named for what it orders (ordering rules 1–3 of DESIGN.md). The copy loops over
// write-combined mappings (write_combined.cuh) are built from the host-only accesses at the end.
//
// - GPU (sm_70+): doorbells are stored with `st.mmio.relaxed.sys` — performed exactly once,
//   never merged or split, as a register needs — after a system-scope fence that makes the
//   SQE (or the consumed CQ slots) visible to the controller's DMA first.
// - Host (CPU threads, also under TSan): a release store through a volatile pointer with the
//   compiler's atomic builtins, so the store is neither elided nor torn and the sanitizer
//   sees the synchronisation (a standalone fence is invisible to TSan).
// Memory shared with the controller (CQ entries, shadow doorbells) is accessed with
// `system_word` elsewhere, queue bookkeeping with `bookkeeping_word` (device scope); no fence
// is needed there. The doorbell fence below is the one system-scope fence of a submit.
#pragma once

#include <cunvme/config.cuh>

#include <cuda/atomic>
#include <cuda/std/cstdint>

#include <atomic>

#if defined(CUNVME_DEVICE_COMPILATION)
#  include <cuda/ptx>
#else
#  include <chrono>
#  include <thread>
#  if defined(__linux__)
#    include <sched.h>
#  endif
#  if defined(__x86_64__)
#    include <emmintrin.h>
#  endif
#endif

CUNVME_NAMESPACE_BEGIN
namespace access {

#if defined(CUNVME_DEVICE_COMPILATION) && __CUDA_ARCH__ < 700
static_assert(__CUDA_ARCH__ >= 700, "cunvme's device code needs sm_70 or newer (st.mmio, independent thread scheduling)");
#endif

/// Writes a doorbell register after everything this thread wrote before it (the SQE, or the
/// CQ slots it consumed) is visible system-wide: rule 1, "sqe_before_doorbell".
CUNVME_HOST_DEVICE inline void mmio_store_after_writes(cuda::std::uint32_t* reg, cuda::std::uint32_t value) noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  // fence.sc.sys: the controller reads the SQ over PCIe (or from GPU memory through the BAR
  // of the GPU), so ordering must hold at system scope, not only within the GPU.
  asm volatile("fence.sc.sys;" ::: "memory");
  asm volatile("st.mmio.relaxed.sys.global.b32 [%0], %1;" ::"l"(reg), "r"(value) : "memory");
#else
  __atomic_store_n(static_cast<volatile cuda::std::uint32_t*>(reg), value, __ATOMIC_RELEASE);
#endif
}

#if defined(CUNVME_DEVICE_COMPILATION)
/// (GPU only) Orders this thread's earlier stores before its later ones at system scope, so
/// before anything a controller does once it sees the later ones: a page cache slot's odd
/// generation before the submission of the fill that overwrites the slot.
__device__ inline void stores_before_submission() noexcept { cuda::atomic_thread_fence(cuda::std::memory_order_release, cuda::thread_scope_system); }

/// (GPU only) Completes this thread's earlier loads before its later ones (device scope): a page
/// cache reader's copy of a slot before its second look at the slot's generation.
__device__ inline void loads_before_later_loads() noexcept { cuda::atomic_thread_fence(cuda::std::memory_order_acquire, cuda::thread_scope_device); }
#endif

/// Dwords 0 to 2 of a completion entry.
struct entry_words {
  cuda::std::uint32_t dw0, dw1, dw2;
};

/// Reads Dwords 0 to 2 of the CQE at `entry` after an acquire load of its phase word matched
/// (rule 2): the controller wrote them before the phase tag and leaves the slot alone until the
/// CQ head doorbell passes it. On the GPU the entry's 16 bytes come in one load, one read across
/// PCIe where there were three (a GPU thread's reads of host memory come back one after
/// another: bench/RESULTS.md, P4); `ld.global.cv` fetches them again, never from a cached line
/// of the slot's last pass.
[[nodiscard]] CUNVME_HOST_DEVICE inline entry_words load_entry_words(const cuda::std::uint32_t* entry) noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  const uint4 v = __ldcv(reinterpret_cast<const uint4*>(entry));
  return {v.x, v.y, v.z};
#else
  const auto word = [entry](int i) {
    return cuda::atomic_ref<cuda::std::uint32_t, cuda::thread_scope_system>(const_cast<cuda::std::uint32_t&>(entry[i]))
        .load(cuda::std::memory_order_relaxed);
  };
  return {word(0), word(1), word(2)};
#endif
}

/// Reads a controller register exactly once (not cached, not merged with another load).
[[nodiscard]] CUNVME_HOST_DEVICE inline cuda::std::uint32_t mmio_load(const cuda::std::uint32_t* reg) noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  cuda::std::uint32_t value;
  asm volatile("ld.mmio.relaxed.sys.global.b32 %0, [%1];" : "=r"(value) : "l"(reg) : "memory");
  return value;
#else
  return __atomic_load_n(static_cast<const volatile cuda::std::uint32_t*>(reg), __ATOMIC_ACQUIRE);
#endif
}

/// Nanoseconds of a monotonic clock, for bounding waits: the GPU's `%globaltimer` on the
/// device, `steady_clock` on the host. Only differences are meaningful.
[[nodiscard]] CUNVME_HOST_DEVICE inline cuda::std::uint64_t now_ns() noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  return cuda::ptx::get_sreg_globaltimer();
#else
  return static_cast<cuda::std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}

/// Which processor runs the calling thread, for spreading threads over queue pairs: the SM
/// (`%smid`) on the device, the CPU (`sched_getcpu`, 0 where unknown) on the host. A hint
/// only: a CPU thread may migrate right after, and either may exceed the processor count.
[[nodiscard]] CUNVME_HOST_DEVICE inline cuda::std::uint32_t processor_id() noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  return cuda::ptx::get_sreg_smid();
#elif defined(__linux__)
  const int cpu = sched_getcpu();
  return cpu < 0 ? 0u : static_cast<cuda::std::uint32_t>(cpu);
#else
  return 0;
#endif
}

/// Backs off between polls. `round` counts the polls so far: the pause grows with it (up to
/// about 1 µs on the GPU) so spinning threads leave memory bandwidth to the ones doing work;
/// on the host it yields, since submitters may outnumber cores.
CUNVME_HOST_DEVICE inline void back_off(cuda::std::uint32_t round) noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  __nanosleep(round < 6 ? 32u << round : 1024u);
#else
  if (round > 2) std::this_thread::yield();
#endif
}

// Host functions (nvcc's device pass parses them too, hence the guards on the intrinsics).

/// Stores `value` to device memory mapped into the process (host only) in one access of exactly
/// sizeof(T) bytes: never elided, merged with another or torn, as a write-combined BAR needs.
/// Unordered: `write_combined_before_later_stores` orders a copy's stores.
template <class T>
inline void mapped_store(void* at, T value) noexcept {
  __atomic_store_n(static_cast<volatile T*>(at), value, __ATOMIC_RELAXED);
}

/// Loads one sizeof(T)-byte value from device memory mapped into the process (host only), in
/// one access, never cached by the compiler or merged with another.
template <class T>
[[nodiscard]] inline T mapped_load(const void* at) noexcept {
  return __atomic_load_n(static_cast<const volatile T*>(at), __ATOMIC_RELAXED);
}

/// Makes every store to write-combined memory before it visible before any store after it:
/// "write_combined_before_later_stores" (WC stores are weakly ordered, x86 SDM vol. 3, 11.3;
/// SFENCE drains them).
inline void write_combined_before_later_stores() noexcept {
#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
  _mm_sfence();
  std::atomic_signal_fence(std::memory_order_seq_cst);  // and keeps the compiler from moving stores across
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

/// Makes the streaming loads after it go to the device: "device_writes_before_streaming_loads".
/// A streaming buffer (MOVNTDQA) may still hold a line from an earlier copy that the device has
/// rewritten since; MFENCE empties them.
inline void device_writes_before_streaming_loads() noexcept {
#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
  _mm_mfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace access
CUNVME_NAMESPACE_END
