// DMA memory for machines without an IOMMU: page-locked memory whose bus addresses are its
// physical addresses, read from /proc/self/pagemap (root only).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/dma_memory.cuh>
#include <cunvme/host/error.cuh>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Allocates 2 MiB huge pages where the system has them (physically contiguous, never moved)
/// and locked 4 KiB pages otherwise, and lists each 4 KiB page's physical address.
///
/// Locked pages are not swapped out but may still be migrated by memory compaction unless
/// `/proc/sys/vm/compact_unevictable_allowed` is 0; huge pages are safe either way.
class pagemap_allocator final : public dma_allocator {
 public:
  explicit pagemap_allocator(std::string device) : device_(std::move(device)) {}

  [[nodiscard]] dma_buffer allocate(std::size_t bytes) override {
    if (bytes == 0) throw error("Allocate DMA memory", device_, "0 bytes asked for");
    // Anything larger than a page may be a queue, which must be physically contiguous: it
    // gets huge pages when there are any. A page or less is one locked page.
    constexpr std::size_t huge = 2u << 20;
    std::size_t mapped = (bytes + huge - 1) / huge * huge;
    void* p = bytes <= 4096 ? MAP_FAILED
                            : ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      mapped = (bytes + 4095) / 4096 * 4096;
      p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (p == MAP_FAILED) throw os_error("Allocate DMA memory", device_);
      if (::mlock(p, mapped) != 0) {
        const int e = errno;
        ::munmap(p, mapped);
        errno = e;
        throw os_error("Lock DMA memory", device_, "raise RLIMIT_MEMLOCK (ulimit -l) or run as root");
      }
    }
    auto* bytes_ptr = static_cast<std::byte*>(p);
    std::memset(bytes_ptr, 0, mapped);  // also faults every page in before it is translated
    std::vector<std::uint64_t> pages;
    try {
      pages = translate(bytes_ptr, (bytes + 4095) / 4096);
    } catch (...) {
      ::munmap(p, mapped);
      throw;
    }
    return dma_buffer(bytes_ptr, nullptr, bytes, 4096, std::move(pages), memory_location::pinned_host, [p, mapped] { ::munmap(p, mapped); });
  }

  [[nodiscard]] dma_buffer map_gpu(void*, std::size_t) override {
    throw error("Map GPU memory", device_,
                "peer-to-peer DMA to GPU memory needs the cunvme kernel module (kmod:) or VFIO with dma-buf; sysfs: reaches pinned "
                "host memory only");
  }

  /// Whether locked pages stay where they are (compaction of unevictable pages is off).
  [[nodiscard]] static bool unevictable_compaction_disabled() {
    std::ifstream in("/proc/sys/vm/compact_unevictable_allowed");
    int value = 1;
    return (in >> value) && value == 0;
  }

 private:
  /// Physical address of each 4 KiB page (pagemap: bit 63 present, bits 54:0 PFN).
  [[nodiscard]] std::vector<std::uint64_t> translate(const std::byte* p, std::size_t count) const {
    const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw os_error("Open /proc/self/pagemap", device_);
    std::vector<std::uint64_t> entries(count);
    const auto first = reinterpret_cast<std::uintptr_t>(p) / 4096;
    const auto want = static_cast<ssize_t>(count * sizeof(std::uint64_t));
    const ssize_t got = ::pread(fd, entries.data(), static_cast<std::size_t>(want), static_cast<off_t>(first * sizeof(std::uint64_t)));
    const int e = errno;
    ::close(fd);
    if (got != want) {
      errno = got < 0 ? e : EIO;
      throw os_error("Read /proc/self/pagemap", device_);
    }
    for (auto& entry : entries) {
      const bool present = (entry >> 63) & 1u;
      const std::uint64_t pfn = entry & ((std::uint64_t{1} << 55) - 1);
      if (!present) throw error("Translate DMA memory", device_, "a locked page is not present");
      // Without CAP_SYS_ADMIN the kernel hides PFNs as 0.
      if (pfn == 0) throw error("Translate DMA memory", device_, "needs root (CAP_SYS_ADMIN) to read physical addresses from /proc/self/pagemap");
      entry = pfn * 4096;
    }
    return entries;
  }

  std::string device_;
};

}  // namespace host
CUNVME_NAMESPACE_END
