// The machine's memory as the system reports it. Host code (POSIX), for the bounds on pinned
// and shared memory: the emulator's pinning budget and the controller owner's cap on what an
// attached process may map.
#pragma once

#include <cunvme/config.cuh>

#include <cstdint>

#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace detail {

/// The machine's physical memory in bytes (0 when the system will not say).
[[nodiscard]] inline std::uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

}  // namespace detail
CUNVME_NAMESPACE_END
