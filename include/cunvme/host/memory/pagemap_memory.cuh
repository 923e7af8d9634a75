// DMA memory for machines without an IOMMU: page-locked memory whose bus addresses are its
// physical addresses, read from /proc/self/pagemap (root only). The `sysfs:` backend's memory.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Locks `bytes` at `p` in memory (mlock(2)) through the system call itself: the sanitizers'
/// runtimes replace `mlock` with a no-op that reports success, which would leave DMA memory
/// unlocked without a word (and `map_host` refusing it) in ThreadSanitizer and ASan builds.
[[nodiscard]] inline int lock_memory(void* p, std::size_t bytes) noexcept {
  return static_cast<int>(::syscall(SYS_mlock, p, bytes));
}

/// Which pages a `pagemap_allocator` hands out.
enum class huge_pages : std::uint8_t {
  /// 2 MiB huge pages while the pool (/proc/sys/vm/nr_hugepages) has free ones, locked 4 KiB
  /// pages after. Choose it unless the huge-page pool is reserved for something else: huge
  /// pages are physically contiguous (queues larger than 4 KiB need that) and never moved.
  prefer,
  /// Locked 4 KiB pages only. A buffer larger than 4 KiB is then rarely contiguous in bus
  /// address space, so it serves data and PRP lists, not queues.
  never,
};

/// Page-locked host memory and the physical address of each 4 KiB page, for controllers that
/// DMA to physical addresses (no IOMMU between them and memory), as root.
///
/// Each buffer is its own mapping: with huge pages it is rounded up to 2 MiB and each 2 MiB of
/// it is physically contiguous; otherwise it is rounded up to 4 KiB and locked with mlock.
/// Pages are listed per 4 KiB either way (`page_size() == 4096`).
///
/// Why locked pages are not enough on their own: mlock keeps a page in memory but not at one
/// physical address. Memory compaction migrates locked ("unevictable") pages too unless
/// /proc/sys/vm/compact_unevictable_allowed is 0; a migrated page leaves the controller
/// DMA-ing into memory that belongs to someone else. Set that sysctl to 0 (see
/// `unevictable_compaction_disabled()`) or reserve huge pages, which compaction leaves alone.
/// The mappings are also excluded from fork(): a child sharing them copy-on-write would make
/// the parent's next write move the page.
///
/// Usage: examples/snippets/host.cpp, `pagemap`.
class pagemap_allocator final : public dma_allocator {
 public:
  /// `device` names the controller in error messages.
  explicit pagemap_allocator(std::string device, huge_pages policy = huge_pages::prefer) : device_(std::move(device)), policy_(policy) {}

  /// Translates `bytes` at `host` (memory another controller's allocator handed out) for this
  /// controller: the same physical pages, listed per 4 KiB (`page_size() == 4096`), never
  /// assumed contiguous beyond what pagemap says. Without an IOMMU nothing pins them for this
  /// controller, so only memory that stays at its physical addresses as this allocator's own
  /// does is taken; the rest is refused with why and what to do. The memory must be, in every
  /// mapping the range spans:
  /// - writable (reads put their data there);
  /// - huge pages (MAP_HUGETLB), which neither swap nor compaction move, or private anonymous
  ///   memory locked with mlock while /proc/sys/vm/compact_unevictable_allowed is 0
  ///   (`unevictable_compaction_disabled()`); file-backed and shared memory belong to the page
  ///   cache, which may move and write them back;
  /// - excluded from fork (MADV_DONTFORK), unless shared huge pages: a child sharing a private
  ///   page copy-on-write moves the parent's page at its next write;
  /// - resident, and translated by a process with CAP_SYS_ADMIN (pagemap shows PFNs to root).
  /// The allocators' own buffers (pagemap, VFIO, kmod) qualify wherever their pages are huge or
  /// compaction leaves locked pages alone. Later pinning by another agent (cudaHostRegister, a
  /// VFIO or kmod controller) may migrate memory only an mlock held: check with `still_at`.
  /// The buffer has no mapping to undo: dropping it leaves the memory to its owner.
  [[nodiscard]] dma_buffer map_host(void* host, std::size_t bytes) override {
    const std::size_t mapped = host_range(host, bytes);
    const auto start = reinterpret_cast<std::uintptr_t>(host);
    check_stays_put(start, start + mapped);
    std::vector<std::uint64_t> pages = translate(static_cast<const std::byte*>(host), mapped / page);
    return dma_buffer(static_cast<std::byte*>(host), nullptr, bytes, page, std::move(pages), memory_location::pinned_host, nullptr);
  }
  /// Shared small pages are the page cache's to move (`check_stays_put`); huge ones stay.
  [[nodiscard]] bool shared_memory_needs_huge_pages() const override { return true; }

  [[nodiscard]] dma_buffer map_gpu(void*, std::size_t) override {
    throw error("Map GPU memory", device_,
                "sysfs: reaches pinned host memory only (tier 1); peer-to-peer DMA to GPU memory (tiers 2 and 3) needs the cunvme "
                "kernel module: open kmod:BDF instead");
  }

  /// Whether memory compaction leaves locked pages where they are: /proc/sys/vm/
  /// compact_unevictable_allowed reads 0, or the kernel has no compaction at all (the file is
  /// absent while /proc/sys/vm is there). Locked 4 KiB DMA pages are safe only then.
  [[nodiscard]] static bool unevictable_compaction_disabled() {
    std::ifstream in("/proc/sys/vm/compact_unevictable_allowed");
    if (!in) return ::access("/proc/sys/vm", F_OK) == 0;
    int value = 1;
    return (in >> value) && value == 0;
  }

  /// Reads the buffer's physical pages again: a long-term pin by another agent (CUDA's) may
  /// have migrated them (`dma_allocator::still_at`).
  [[nodiscard]] bool still_at(const dma_buffer& b) const override {
    if (b.data() == nullptr || b.size() == 0) return true;
    return translate(b.data(), (b.size() + page - 1) / page) == b.pages();
  }

 protected:
  [[nodiscard]] std::string name() const override { return device_; }

  /// `bytes` of zeroed memory, each 4 KiB page translated to its physical address, the first
  /// physically aligned to `alignment`. Huge pages are physically aligned to 2 MiB; a locked
  /// 4 KiB page is aligned to more than 4 KiB only by chance, so for a larger alignment
  /// without huge pages each try maps `alignment - 4 KiB` more and starts the buffer at the
  /// first page of it that is aligned (a bounded number of tries). Taking whole mappings until
  /// one's first page was aligned failed now and then: the kernel hands consecutive small
  /// mappings pages of the same parity.
  [[nodiscard]] dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) throw error("Allocate DMA memory", device_, "0 bytes asked for");
    if (bytes > std::numeric_limits<std::size_t>::max() / 2) throw error("Allocate DMA memory", device_, std::to_string(bytes) + " bytes asked for");
    mapping m = policy_ == huge_pages::prefer ? map_huge(bytes) : mapping{};
    std::vector<std::uint64_t> pages;
    std::size_t offset = 0;  // of the buffer in the mapping
    if (m.address != nullptr) {
      pages = prepare(m, bytes);
    } else {
      std::vector<mapping> misaligned;  // held until the end, so the kernel cannot hand their pages back
      constexpr int attempts = 64;
      const std::size_t slack = alignment > page ? alignment - page : 0;
      const std::size_t page_count = (bytes + page - 1) / page;
      for (int i = 0; i < attempts && m.address == nullptr; ++i) {
        mapping candidate = map_locked(bytes + slack);
        const std::vector<std::uint64_t> all = prepare(candidate, bytes + slack);
        for (std::size_t first = 0; first <= slack / page; ++first) {
          if (all[first] % alignment != 0) continue;
          offset = first * page;
          pages.assign(all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(first + page_count));
          m = std::move(candidate);
          break;
        }
        if (m.address == nullptr) misaligned.push_back(std::move(candidate));
      }
      if (m.address == nullptr) {
        throw error("Allocate DMA memory", device_,
                    "no locked 4 KiB page at a physical address aligned to " + std::to_string(alignment) +
                        " bytes (the controller's page size) in " + std::to_string(attempts) + " tries: reserve 2 MiB huge pages (/proc/sys/vm/nr_hugepages)");
      }
    }
    const std::size_t size = m.size;
    std::byte* const address = m.release();
    return dma_buffer(address + offset, nullptr, bytes, page, std::move(pages), memory_location::pinned_host,
                      [address, size] { ::munmap(address, size); });
  }


 private:
  static constexpr std::size_t page = 4096;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;
  static constexpr const char* root_hint = "needs root (CAP_SYS_ADMIN) to read physical addresses from /proc/self/pagemap";

  /// An mmap'ed range, unmapped when dropped unless released to a buffer.
  struct mapping {
    std::byte* address = nullptr;
    std::size_t size = 0;

    mapping() = default;
    mapping(std::byte* a, std::size_t s) noexcept : address(a), size(s) {}
    mapping(mapping&& o) noexcept : address(std::exchange(o.address, nullptr)), size(o.size) {}
    mapping& operator=(mapping&& o) noexcept {
      if (this != &o) {
        reset();
        address = std::exchange(o.address, nullptr);
        size = o.size;
      }
      return *this;
    }
    mapping(const mapping&) = delete;
    mapping& operator=(const mapping&) = delete;
    ~mapping() { reset(); }

    /// Hands the range over: it is no longer unmapped here.
    [[nodiscard]] std::byte* release() noexcept { return std::exchange(address, nullptr); }
    void reset() noexcept {
      if (address != nullptr) ::munmap(address, size);
      address = nullptr;
    }
  };
  /// Excludes `m` from fork, zeroes it and translates its pages.
  [[nodiscard]] std::vector<std::uint64_t> prepare(mapping& m, std::size_t bytes) const {
    // A child process sharing the pages copy-on-write would make our next write move them.
    if (::madvise(m.address, m.size, MADV_DONTFORK) != 0) throw os_error("Exclude DMA memory from fork", device_);
    // Writing every page both zeroes it and gives each virtual page a private physical page:
    // an untouched anonymous page reads from the one shared zero page, which must never be a
    // DMA target.
    std::memset(m.address, 0, m.size);
    return translate(m.address, (bytes + page - 1) / page);
  }

  /// 2 MiB huge pages, or an empty mapping when the pool has too few free ones (mmap reserves
  /// them up front and fails with ENOMEM then) or the kernel has no 2 MiB size (EINVAL).
  [[nodiscard]] static mapping map_huge(std::size_t bytes) {
    const std::size_t size = (bytes + huge_page - 1) / huge_page * huge_page;
    // Ask for 2 MiB explicitly: the default huge-page size may be 1 GiB (default_hugepagesz).
    constexpr int two_mib = 21 << MAP_HUGE_SHIFT;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | two_mib | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return {};
    return {static_cast<std::byte*>(p), size};
  }

  /// Anonymous memory, faulted in and locked so it is never swapped out.
  [[nodiscard]] mapping map_locked(std::size_t bytes) const {
    const std::size_t granule = std::max(page, system_page_size());
    const std::size_t size = (bytes + granule - 1) / granule * granule;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw os_error("Allocate DMA memory", device_);
    mapping m(static_cast<std::byte*>(p), size);
    if (lock_memory(p, size) != 0) throw os_error("Lock DMA memory", device_, "raise RLIMIT_MEMLOCK (ulimit -l) or run as root");
    return m;
  }

  [[nodiscard]] static std::size_t system_page_size() noexcept {
    const long size = ::sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<std::size_t>(size) : page;
  }

  /// One mapping of this process as /proc/self/smaps describes it.
  struct vma {
    std::uintptr_t start = 0, end = 0;
    std::string perms;                ///< "rw-p": read, write, execute, private or shared
    unsigned long inode = 0;          ///< 0 for anonymous memory
    std::string path;
    std::vector<std::string> flags;   ///< VmFlags: "lo" locked, "dc" not copied at fork, "ht" hugetlb
    [[nodiscard]] bool has(const char* flag) const { return std::find(flags.begin(), flags.end(), flag) != flags.end(); }
  };

  /// The mappings of this process that overlap [first, last), in address order.
  [[nodiscard]] std::vector<vma> mappings(std::uintptr_t first, std::uintptr_t last) const {
    std::ifstream smaps("/proc/self/smaps");
    if (!smaps) throw os_error("Open /proc/self/smaps", device_, "needs /proc mounted");
    std::vector<vma> out;
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
      std::istringstream fields(line);
      vma v;
      char dash = 0;
      std::string offset, dev;
      // A mapping's header: "start-end perms offset dev inode [path]"; other lines are "Key: value".
      if (fields >> std::hex >> v.start >> dash >> v.end && dash == '-' && fields >> v.perms >> offset >> dev >> std::dec >> v.inode) {
        inside = v.start < last && first < v.end;
        if (inside) {
          std::getline(fields >> std::ws, v.path);
          out.push_back(std::move(v));
        }
        continue;
      }
      if (inside && line.rfind("VmFlags:", 0) == 0) {
        std::istringstream flags(line.substr(8));
        for (std::string f; flags >> f;) out.back().flags.push_back(f);
      }
    }
    return out;
  }

  /// Throws `host::error` unless every byte of [first, last) is mapped and stays at its
  /// physical address (`map_host`).
  void check_stays_put(std::uintptr_t first, std::uintptr_t last) const {
    const auto refuse = [&](std::uintptr_t at, const std::string& why) {
      throw error("Map host memory", device_, "sysfs: the memory at 0x" + hex(at) + " " + why);
    };
    std::uintptr_t covered = first;
    bool small_pages = false;
    for (const vma& v : mappings(first, last)) {
      if (v.start > covered) break;
      const std::uintptr_t at = std::max(v.start, first);
      const bool huge = v.has("ht"), shared = v.perms.size() > 3 && v.perms[3] == 's';
      if (v.perms.size() < 2 || v.perms[1] != 'w') refuse(at, "is read-only: the controller writes a read's data into it");
      if (!huge && (v.inode != 0 || shared)) {
        refuse(at, "is file-backed or shared (" + (v.path.empty() ? std::string("shared anonymous") : v.path) +
                       "): the page cache may move or write back its pages; use private anonymous memory or 2 MiB huge pages (MAP_HUGETLB)");
      }
      if (!huge && !v.has("lo")) {
        refuse(at, "is not locked: the kernel may swap it out or move it; mlock it (as the allocators' own buffers are) or use 2 MiB huge pages (MAP_HUGETLB)");
      }
      if (!(huge && shared) && !v.has("dc")) {
        refuse(at, "would be shared copy-on-write with a fork() child, and the parent's next write would move it: madvise(MADV_DONTFORK) it first");
      }
      small_pages = small_pages || !huge;
      covered = v.end;
      if (covered >= last) break;
    }
    if (covered < last) refuse(covered, "is not mapped in this process");
    if (small_pages && !unevictable_compaction_disabled()) {
      refuse(first, "is locked 4 KiB pages, which memory compaction still moves: set /proc/sys/vm/compact_unevictable_allowed to 0, or use memory from 2 MiB huge pages (MAP_HUGETLB)");
    }
  }

  [[nodiscard]] static std::string hex(std::uintptr_t v) {
    char text[2 * sizeof v + 1];
    const auto end = std::to_chars(text, text + sizeof text, v, 16).ptr;
    return std::string(text, end);
  }

  /// Physical address of each of the `count` 4 KiB pages at `p`. /proc/self/pagemap holds one
  /// 64-bit entry per system page: bit 63 present, bits 54:0 the page frame number.
  [[nodiscard]] std::vector<std::uint64_t> translate(const std::byte* p, std::size_t count) const {
    const std::size_t system_page = system_page_size();
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const std::size_t first = address / system_page;
    const std::size_t entry_count = (address + count * page - 1) / system_page - first + 1;

    const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw os_error("Open /proc/self/pagemap", device_,
                     errno == EACCES || errno == EPERM ? std::string(root_hint) : "needs /proc mounted");
    }
    std::vector<std::uint64_t> entries(entry_count);
    auto* out = reinterpret_cast<char*>(entries.data());
    std::size_t done = 0;
    const std::size_t want = entry_count * sizeof(std::uint64_t);
    // pagemap may return fewer bytes than asked; each pread makes progress or fails.
    while (done < want) {
      const ssize_t got = ::pread(fd, out + done, want - done, static_cast<off_t>(first * sizeof(std::uint64_t) + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        const int e = got < 0 ? errno : EIO;
        ::close(fd);
        errno = e;
        throw os_error("Read /proc/self/pagemap", device_);
      }
      done += static_cast<std::size_t>(got);
    }
    ::close(fd);

    constexpr std::uint64_t present = std::uint64_t{1} << 63;
    constexpr std::uint64_t pfn_mask = (std::uint64_t{1} << 55) - 1;
    std::vector<std::uint64_t> pages(count);
    for (std::size_t i = 0; i < count; ++i) {
      const std::uintptr_t at = address + i * page;
      const std::uint64_t entry = entries[at / system_page - first];
      if ((entry & present) == 0) throw error("Translate DMA memory", device_, "a locked page is not resident");
      // Since Linux 4.2 the kernel reports PFN 0 to readers without CAP_SYS_ADMIN.
      const std::uint64_t pfn = entry & pfn_mask;
      if (pfn == 0) throw error("Translate DMA memory", device_, root_hint);
      pages[i] = pfn * system_page + at % system_page;
    }
    return pages;
  }

  std::string device_;
  huge_pages policy_;
};

}  // namespace host
CUNVME_NAMESPACE_END
