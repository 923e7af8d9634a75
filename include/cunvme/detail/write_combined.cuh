// The access layer's CPU side for write-combined mappings of device memory — GPU memory
// through the GPU's BAR, mapped into the process by the cunvme kernel module (the CPU role of
// NVIDIA's gdrcopy): copy loops built from access.cuh's mapped accesses and fences, and
// SSE's 16-byte loads and stores; host code only.
//
// Why copies to such memory need their own loops:
// - Every access reaches the device over PCIe, in the width the instruction has: a copy must
//   use aligned accesses, never touch a byte outside the range (a wider access rounded out to
//   alignment would read or write bytes that belong to someone else), and prefer 16-byte
//   accesses in the middle.
// - Stores are write-combined: buffered, merged and sent in no particular order, not even with
//   respect to later ordinary stores (x86 SDM vol. 3, 11.3 "Methods of caching available",
//   WC). A store fence after the copy makes it visible before anything the caller stores next
//   (a flag, a doorbell, a kernel launch through the driver).
// - Loads are uncached: each one is a round trip to the device. SSE4.1's MOVNTDQA (streaming
//   load) fetches a whole 64-byte line from WC memory into a streaming buffer, so the next
//   loads of that line do not go out again (Intel's "Increasing memory throughput with
//   streaming loads" note; gdrcopy's memcpy_sse41.c). It is used where the CPU has SSE4.1
//   (checked at run time), plain 16-byte loads otherwise.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
#  include <cpuid.h>
#  include <emmintrin.h>
#  include <smmintrin.h>
#endif

CUNVME_NAMESPACE_BEGIN
namespace access {

namespace write_combined_detail {

template <class T>
void store(std::byte* dst, const std::byte* src) noexcept {
  T value;
  std::memcpy(&value, src, sizeof(T));
  mapped_store<T>(dst, value);
}

template <class T>
void load(std::byte* dst, const std::byte* src) noexcept {
  const T value = mapped_load<T>(src);
  std::memcpy(dst, &value, sizeof(T));
}

/// The widest of 8, 4, 2, 1 bytes that `device` is aligned to and `n` still holds: the
/// alignment only grows along a copy, so a range is covered in aligned accesses inside it.
[[nodiscard]] inline std::size_t narrow_width(const std::byte* device, std::size_t n) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(device);
  for (std::size_t w = 8; w > 1; w /= 2) {
    if (a % w == 0 && n >= w) return w;
  }
  return 1;
}

/// Copies `n` bytes with one aligned access of `device`'s side per step; `op<T>` moves one.
template <class Op>
void copy_aligned(std::byte* dst, const std::byte* src, std::size_t n, const std::byte* device, Op&& op) noexcept {
  while (n != 0) {
    std::size_t w;
    if (reinterpret_cast<std::uintptr_t>(device) % 16 == 0 && n >= 16) {
      w = 16;
    } else {
      w = narrow_width(device, n);
    }
    op(w, dst, src);
    dst += w;
    src += w;
    device += w;
    n -= w;
  }
}

#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
// MOVNTDQA, compiled for SSE4.1 whatever the build's -march; called only where CPUID says the
// CPU has it.
__attribute__((target("sse4.1"))) inline void streaming_load16(std::byte* dst, const std::byte* src) noexcept {
  const __m128i value = _mm_stream_load_si128(reinterpret_cast<__m128i*>(const_cast<std::byte*>(src)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), value);
}
#endif

}  // namespace write_combined_detail

/// Whether `copy_from_write_combined` uses streaming loads on this CPU (x86 with SSE4.1).
[[nodiscard]] inline bool streaming_loads_available() noexcept {
#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
  static const bool available = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_SSE4_1) != 0;
  }();
  return available;
#else
  return false;
#endif
}

/// Copies `n` bytes from ordinary memory at `src` to write-combined memory at `dst` in aligned
/// stores (16 bytes where `dst` allows, narrower at the ends), none outside [dst, dst + n),
/// then fences them (`write_combined_before_later_stores`).
inline void copy_to_write_combined(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  using namespace write_combined_detail;
  copy_aligned(dst, src, n, dst, [](std::size_t w, std::byte* d, const std::byte* s) {
    switch (w) {
      case 16:
#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
        _mm_store_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
#else
        store<std::uint64_t>(d, s);
        store<std::uint64_t>(d + 8, s + 8);
#endif
        break;
      case 8: store<std::uint64_t>(d, s); break;
      case 4: store<std::uint32_t>(d, s); break;
      case 2: store<std::uint16_t>(d, s); break;
      default: store<std::uint8_t>(d, s); break;
    }
  });
  write_combined_before_later_stores();
}

/// Copies `n` bytes from write-combined memory at `src` to ordinary memory at `dst` in aligned
/// loads, none outside [src, src + n): 16-byte loads in the middle, streaming ones where
/// `streaming` (and the CPU has them, `streaming_loads_available`).
inline void copy_from_write_combined(std::byte* dst, const std::byte* src, std::size_t n, bool streaming = streaming_loads_available()) noexcept {
  using namespace write_combined_detail;
#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
  const bool stream = streaming && streaming_loads_available();
  if (stream) device_writes_before_streaming_loads();
#endif
  copy_aligned(dst, src, n, src, [&](std::size_t w, std::byte* d, const std::byte* s) {
    switch (w) {
      case 16:
#if defined(__x86_64__) && !defined(CUNVME_DEVICE_COMPILATION)
        if (stream) {
          streaming_load16(d, s);
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_load_si128(reinterpret_cast<const __m128i*>(s)));
        }
#else
        load<std::uint64_t>(d, s);
        load<std::uint64_t>(d + 8, s + 8);
#endif
        break;
      case 8: load<std::uint64_t>(d, s); break;
      case 4: load<std::uint32_t>(d, s); break;
      case 2: load<std::uint16_t>(d, s); break;
      default: load<std::uint8_t>(d, s); break;
    }
  });
#if !defined(__x86_64__) || defined(CUNVME_DEVICE_COMPILATION)
  (void)streaming;
#endif
}

}  // namespace access
CUNVME_NAMESPACE_END
