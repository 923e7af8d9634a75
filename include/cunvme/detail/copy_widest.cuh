// Copying a few bytes between addresses whose alignment is known only when the copy runs (a
// page cache slot's value into a caller's buffer): on the GPU, `memcpy` of an unknown alignment
// moves one byte per load, so the widest unit that both addresses and the size allow is chosen
// at run time instead.
#pragma once

#include <cunvme/config.cuh>

#include <cuda/std/cstdint>
#include <cuda/std/cstring>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// Copies `bytes` bytes from `from` to `to` (not overlapping) in 16-, 8-, 4-byte units where
/// both addresses and `bytes` are multiples of them, else byte by byte; on the host, `memcpy`.
CUNVME_HOST_DEVICE inline void copy_widest(void* to, const void* from, cuda::std::uint64_t bytes) noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
  const auto aligned = reinterpret_cast<cuda::std::uintptr_t>(to) | reinterpret_cast<cuda::std::uintptr_t>(from) | bytes;
  // Through a register by memcpy (no object is accessed as a Unit), with the alignment told to
  // the compiler: one wide load and one wide store per unit.
  const auto move = [&]<class Unit>(Unit unit) {
    const auto* src = static_cast<const unsigned char*>(__builtin_assume_aligned(from, sizeof(Unit)));
    auto* dst = static_cast<unsigned char*>(__builtin_assume_aligned(to, sizeof(Unit)));
    for (cuda::std::uint64_t i = 0; i < bytes; i += sizeof(Unit)) {
      cuda::std::memcpy(&unit, src + i, sizeof(Unit));
      cuda::std::memcpy(dst + i, &unit, sizeof(Unit));
    }
  };
  if (aligned % 16 == 0) return move(uint4{});
  if (aligned % 8 == 0) return move(cuda::std::uint64_t{});
  if (aligned % 4 == 0) return move(cuda::std::uint32_t{});
#endif
  cuda::std::memcpy(to, from, bytes);
}

}  // namespace detail
CUNVME_NAMESPACE_END
