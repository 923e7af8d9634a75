// pagemap DMA memory: physical addresses of locked 4 KiB pages and of 2 MiB huge pages (as
// root), and the errors where they cannot be had.
#include <cunvme/host/memory/pagemap_memory.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace host = cunvme::host;

namespace {

/// Whether this process sees real PFNs in /proc/self/pagemap (CAP_SYS_ADMIN).
bool pagemap_shows_frames() {
  static volatile std::uint64_t probe = 1;
  probe = probe + 1;  // resident and private
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::uint64_t entry = 0;
  const auto index = reinterpret_cast<std::uintptr_t>(&probe) / static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const bool read = ::pread(fd, &entry, 8, static_cast<off_t>(index * 8)) == 8;
  ::close(fd);
  return read && (entry >> 63) != 0 && (entry & ((std::uint64_t{1} << 55) - 1)) != 0;
}

/// The page size the kernel maps `p` with, in KiB, from /proc/self/smaps (0 if not found).
long kernel_page_kib(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= at && at < end;
      continue;
    }
    if (inside && line.rfind("KernelPageSize:", 0) == 0) {
      std::istringstream fields(line.substr(15));
      long kib = 0;
      fields >> kib;
      return kib;
    }
  }
  return 0;
}

long read_number(const char* path) {
  std::ifstream in(path);
  long v = -1;
  in >> v;
  return v;
}

long free_huge_pages() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "HugePages_Free:") return value;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

/// Sets /proc/sys/vm/nr_hugepages for one scope and restores it after.
class huge_page_pool {
 public:
  explicit huge_page_pool(long extra) : before_(read_number("/proc/sys/vm/nr_hugepages")) {
    std::ofstream out("/proc/sys/vm/nr_hugepages");
    writable_ = before_ >= 0 && (out << before_ + extra).flush().good();
  }
  huge_page_pool(const huge_page_pool&) = delete;
  huge_page_pool& operator=(const huge_page_pool&) = delete;
  ~huge_page_pool() {
    if (writable_) std::ofstream("/proc/sys/vm/nr_hugepages") << before_;
  }
  [[nodiscard]] bool writable() const { return writable_; }

 private:
  long before_;
  bool writable_ = false;
};

/// The checks every buffer must pass: 4 KiB pages, each listed, non-zero, aligned, distinct;
/// zeroed; writes read back; bus() adds the offset within the page.
void check_buffer(const host::dma_buffer& buf, std::size_t bytes) {
  REQUIRE(buf.size() == bytes);
  REQUIRE(buf.page_size() == 4096);
  REQUIRE(buf.pages().size() == (bytes + 4095) / 4096);
  CHECK(buf.location() == host::memory_location::pinned_host);
  CHECK(buf.device_data() == nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % 4096 == 0);
  std::set<std::uint64_t> seen;
  bool all_nonzero = true, all_aligned = true;
  for (auto page : buf.pages()) {
    all_nonzero = all_nonzero && page != 0;
    all_aligned = all_aligned && page % 4096 == 0;
    seen.insert(page);
  }
  CHECK(all_nonzero);
  CHECK(all_aligned);
  CHECK(seen.size() == buf.pages().size());
  bool zeroed = true;
  for (std::size_t i = 0; i < bytes; ++i) zeroed = zeroed && buf.data()[i] == std::byte{0};
  CHECK(zeroed);
  for (std::size_t i = 0; i < bytes; i += 4096) buf.data()[i + 7] = static_cast<std::byte>(i / 4096 + 1);
  bool read_back = true;
  for (std::size_t i = 0; i < bytes; i += 4096) read_back = read_back && buf.data()[i + 7] == static_cast<std::byte>(i / 4096 + 1);
  CHECK(read_back);
  CHECK(buf.bus(4096 + 100) == buf.pages()[1] + 100);
}

}  // namespace

TEST_CASE("locked 4 KiB pages: distinct, page-aligned physical addresses, zeroed, writable") {
  host::pagemap_allocator memory("test", host::huge_pages::never);
  if (!pagemap_shows_frames()) {
    CHECK_THROWS_WITH_AS((void)memory.allocate(4096), doctest::Contains("root"), host::error);
    return;
  }
  const std::size_t bytes = 3u << 20;
  auto buf = memory.allocate(bytes);
  check_buffer(buf, bytes);
  CHECK(kernel_page_kib(buf.data()) == 4);

  auto odd = memory.allocate(5000);  // rounded up to whole pages, listed per page
  CHECK(odd.pages().size() == 2);
  CHECK(odd.data()[4999] == std::byte{0});
}

TEST_CASE("with huge pages reserved, each 2 MiB of a buffer is one physically contiguous huge page") {
  if (!pagemap_shows_frames()) return;
  huge_page_pool pool(2);  // 3 MiB rounds up to two huge pages
  if (!pool.writable() || free_huge_pages() < 2) {
    MESSAGE("cannot reserve 2 huge pages here; only the fallback is tested");
    return;
  }
  {
    host::pagemap_allocator memory("test");
    const std::size_t bytes = 3u << 20;
    auto buf = memory.allocate(bytes);
    check_buffer(buf, bytes);
    REQUIRE(kernel_page_kib(buf.data()) == 2048);
    CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % (2u << 20) == 0);
    bool consecutive = true;
    for (std::size_t i = 0; i < buf.pages().size(); ++i) {
      const std::size_t head = i / 512 * 512;
      consecutive = consecutive && buf.pages()[i] == buf.pages()[head] + 4096 * (i - head);
    }
    CHECK(consecutive);
    CHECK(buf.pages()[0] % (2u << 20) == 0);
    CHECK(buf.contiguous(0, 2u << 20));
    CHECK(buf.contiguous(2u << 20, 1u << 20));
  }
  // The buffers are gone, so the pool is whole again for the next user.
  CHECK(free_huge_pages() >= 2);
}

TEST_CASE("preferring huge pages with none free falls back to locked 4 KiB pages") {
  if (!pagemap_shows_frames()) return;
  if (free_huge_pages() != 0) {
    MESSAGE("huge pages are free on this machine; the fallback is tested with huge_pages::never only");
    return;
  }
  host::pagemap_allocator memory("test");
  auto buf = memory.allocate(64 * 1024);
  check_buffer(buf, 64 * 1024);
  CHECK(kernel_page_kib(buf.data()) == 4);
}

namespace {

/// Exit status of a child that drops root (to nobody) and allocates: 0 when allocation threw a
/// host::error asking for root. `dumpable` makes /proc/self readable again after setuid, as for
/// any program started by a normal user; the kernel then shows PFN 0 instead of refusing.
int allocate_as_nobody(bool dumpable) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(20);  // never outlive a wedged child
    int code = 4;
    if (::setgid(65534) == 0 && ::setuid(65534) == 0 && (!dumpable || ::prctl(PR_SET_DUMPABLE, 1) == 0)) {
      try {
        host::pagemap_allocator memory("test", host::huge_pages::never);
        (void)memory.allocate(4096);
        code = 1;
      } catch (const host::error& e) {
        code = std::string(e.what()).find("needs root (CAP_SYS_ADMIN)") != std::string::npos ? 0 : 2;
      } catch (...) {
        code = 3;
      }
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("without CAP_SYS_ADMIN allocation says root is needed") {
  if (::geteuid() != 0) return;  // the first case checks this for a non-root run
  CHECK(allocate_as_nobody(true) == 0);   // pagemap shows PFN 0
  CHECK(allocate_as_nobody(false) == 0);  // pagemap cannot even be opened
}

TEST_CASE("GPU memory cannot be mapped without the kernel module, and the error says so") {
  host::pagemap_allocator memory("0000:01:00.0");
  int x = 0;
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(&x, 4), doctest::Contains("kmod"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(&x, 4), doctest::Contains("0000:01:00.0"), host::error);
}

TEST_CASE("an empty allocation is refused") {
  host::pagemap_allocator memory("test");
  CHECK_THROWS_AS((void)memory.allocate(0), host::error);
}

TEST_CASE("the compaction check reads /proc/sys/vm/compact_unevictable_allowed") {
  const long value = read_number("/proc/sys/vm/compact_unevictable_allowed");
  if (value < 0) return;
  CHECK(host::pagemap_allocator::unevictable_compaction_disabled() == (value == 0));
}

TEST_CASE("locked 4 KiB pages serve as PRP list memory page by page, and as memory aligned to a larger controller page") {
  host::pagemap_allocator memory("test", host::huge_pages::never);
  if (!pagemap_shows_frames()) return;
  // 1023 CIDs' lists of 12 KiB: rarely one physical range, always one per list page.
  const std::size_t bytes = 1023u * 12 * 1024;
  auto lists = memory.allocate(bytes);
  const std::vector<std::uint64_t> pages = lists.bus_pages(4096);
  REQUIRE(pages.size() == bytes / 4096);
  CHECK(pages == lists.pages());
  // An 8 KiB controller page (CAP.MPSMIN = 1): a buffer physically on 8 KiB.
  auto page = memory.allocate(8192, 8192);
  CHECK(page.bus() % 8192 == 0);
  check_buffer(page, 8192);
}

TEST_CASE("a pagemap buffer is still at its pages when nothing moved them, and not when its recorded pages differ") {
  if (!pagemap_shows_frames()) return;  // reading physical addresses needs root
  host::pagemap_allocator memory("test", host::huge_pages::never);
  auto buf = memory.allocate(3 * 4096);
  CHECK(memory.still_at(buf));
  // The same memory described with other bus addresses: what a migration would leave recorded.
  std::vector<std::uint64_t> moved = buf.pages();
  moved[1] += 4096 * 1024;
  const host::dma_buffer stale(buf.data(), nullptr, buf.size(), buf.page_size(), std::move(moved), host::memory_location::pinned_host, nullptr);
  CHECK_FALSE(memory.still_at(stale));
}

// ---- map_host: memory another allocator handed out, translated for this controller too ----

namespace {

/// Anonymous private memory, faulted in, with the properties asked for; unmapped when dropped.
struct plain_memory {
  plain_memory(std::size_t n, bool lock, bool dontfork, int prot = PROT_READ | PROT_WRITE) : bytes(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<std::byte*>(p);
    std::memset(data, 1, n);  // a private page of its own each, not the shared zero page
    if (lock) REQUIRE(host::lock_memory(data, n) == 0);
    if (dontfork) REQUIRE(::madvise(data, n, MADV_DONTFORK) == 0);
    if (prot != (PROT_READ | PROT_WRITE)) REQUIRE(::mprotect(data, n, prot) == 0);
  }
  plain_memory(const plain_memory&) = delete;
  plain_memory& operator=(const plain_memory&) = delete;
  ~plain_memory() { ::munmap(data, bytes); }
  std::byte* data = nullptr;
  std::size_t bytes;
};

}  // namespace

TEST_CASE("pagemap map_host refuses a null pointer, a start inside a page and zero bytes") {
  host::pagemap_allocator memory("0000:01:00.0");
  plain_memory m(8192, false, true);
  CHECK_THROWS_WITH_AS((void)memory.map_host(nullptr, 4096), doctest::Contains("empty range"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data + 64, 4096), doctest::Contains("4 KiB boundary"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data, 0), doctest::Contains("0000:01:00.0"), host::error);
}

TEST_CASE("pagemap map_host gives memory another pagemap allocator handed out from huge pages the same physical pages") {
  if (!pagemap_shows_frames()) return;
  huge_page_pool pool(1);
  if (!pool.writable() || free_huge_pages() < 1) {
    MESSAGE("cannot reserve a huge page here");
    return;
  }
  host::pagemap_allocator first("first"), second("second");
  auto slots = first.allocate(1u << 20);
  if (kernel_page_kib(slots.data()) != 2048) {
    MESSAGE("the huge page went to someone else; the huge-page case is not tested");
    return;
  }
  auto mapped = second.map_host(slots.data(), slots.size());
  CHECK(mapped.data() == slots.data());
  CHECK(mapped.size() == slots.size());
  CHECK(mapped.page_size() == 4096);
  CHECK(mapped.location() == host::memory_location::pinned_host);
  CHECK(mapped.pages() == slots.pages());
  CHECK(second.still_at(mapped));
}

TEST_CASE("pagemap map_host takes locked 4 KiB pages only where compaction leaves them alone, and says which sysctl otherwise") {
  if (!pagemap_shows_frames()) return;
  host::pagemap_allocator first("first", host::huge_pages::never), second("second");
  auto slots = first.allocate(3 * 4096);
  if (host::pagemap_allocator::unevictable_compaction_disabled()) {
    auto mapped = second.map_host(slots.data(), slots.size());
    CHECK(mapped.pages() == slots.pages());
  } else {
    CHECK_THROWS_WITH_AS((void)second.map_host(slots.data(), slots.size()), doctest::Contains("/proc/sys/vm/compact_unevictable_allowed"), host::error);
  }
}

TEST_CASE("pagemap map_host refuses memory that is not locked, saying to lock it or use huge pages") {
  host::pagemap_allocator memory("test");
  plain_memory m(8192, false, true);
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data, m.bytes), doctest::Contains("mlock"), host::error);
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data, m.bytes), doctest::Contains("not locked"), host::error);
}

TEST_CASE("pagemap map_host refuses memory a fork() child would share, naming MADV_DONTFORK") {
  host::pagemap_allocator memory("test");
  plain_memory m(8192, true, false);
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data, m.bytes), doctest::Contains("MADV_DONTFORK"), host::error);
}

TEST_CASE("pagemap map_host refuses read-only memory") {
  host::pagemap_allocator memory("test");
  plain_memory m(8192, true, true, PROT_READ);
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data, m.bytes), doctest::Contains("read-only"), host::error);
}

TEST_CASE("pagemap map_host refuses file-backed memory, whose pages the page cache may move") {
  host::pagemap_allocator memory("test");
  char path[] = "/tmp/cunvme-map-host-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::unlink(path);
  REQUIRE(::ftruncate(fd, 8192) == 0);
  void* p = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  (void)host::lock_memory(p, 8192);
  (void)::madvise(p, 8192, MADV_DONTFORK);
  CHECK_THROWS_WITH_AS((void)memory.map_host(p, 8192), doctest::Contains("file-backed"), host::error);
  ::munmap(p, 8192);
}

TEST_CASE("pagemap map_host refuses a range part of which is not mapped") {
  host::pagemap_allocator memory("test");
  plain_memory m(3 * 4096, true, true);
  REQUIRE(::munmap(m.data + 4096, 4096) == 0);  // a hole in the middle
  CHECK_THROWS_WITH_AS((void)memory.map_host(m.data, m.bytes), doctest::Contains("not mapped"), host::error);
}

TEST_CASE("a pagemap map_host buffer owns no memory: after it is gone the memory is still its owner's") {
  if (!pagemap_shows_frames()) return;
  huge_page_pool pool(1);
  host::pagemap_allocator owner("owner"), memory("test");
  auto slots = owner.allocate(4096);  // a huge page where one is free, else locked 4 KiB pages
  if (kernel_page_kib(slots.data()) != 2048 && !host::pagemap_allocator::unevictable_compaction_disabled()) {
    MESSAGE("neither a huge page nor unmovable locked pages here");
    return;
  }
  { auto mapped = memory.map_host(slots.data(), slots.size()); }
  slots.data()[100] = std::byte{7};  // still mapped and writable
  CHECK(slots.data()[100] == std::byte{7});
  CHECK(owner.still_at(slots));
}
