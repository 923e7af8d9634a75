// pagemap DMA memory: physical page addresses of locked or huge pages (as root).
#include <cunvme/host/pagemap_memory.cuh>

#include <doctest/doctest.h>

#include <set>
#include <unistd.h>

namespace host = cunvme::host;

namespace {

bool can_read_physical_addresses() { return ::geteuid() == 0; }

}  // namespace

TEST_CASE("allocated pages have distinct, page-aligned physical addresses and start zeroed") {
  host::pagemap_allocator memory("test");
  if (!can_read_physical_addresses()) {
    CHECK_THROWS_WITH_AS((void)memory.allocate(4096), doctest::Contains("root"), host::error);
    return;
  }
  auto buf = memory.allocate(3 << 20);
  REQUIRE(buf.pages().size() == (3u << 20) / 4096);
  std::set<std::uint64_t> seen;
  for (auto page : buf.pages()) {
    CHECK(page != 0);
    CHECK(page % 4096 == 0);
    seen.insert(page);
  }
  CHECK(seen.size() == buf.pages().size());
  CHECK(buf.data()[0] == std::byte{0});
  CHECK(buf.data()[buf.size() - 1] == std::byte{0});
  buf.data()[12345] = std::byte{7};
  CHECK(buf.data()[12345] == std::byte{7});
  CHECK(buf.bus(4096 + 100) == buf.pages()[1] + 100);
}

TEST_CASE("with huge pages reserved, each 2 MiB of a buffer is physically contiguous") {
  if (!can_read_physical_addresses()) return;
  std::ifstream in("/proc/sys/vm/nr_hugepages");
  long before = 0;
  in >> before;
  {
    std::ofstream out("/proc/sys/vm/nr_hugepages");
    out << before + 4;
  }
  host::pagemap_allocator memory("test");
  auto buf = memory.allocate(4 << 20);
  std::ifstream check("/proc/sys/vm/nr_hugepages");
  long now = 0;
  check >> now;
  if (now >= before + 2) {
    for (std::size_t i = 1; i < 512; ++i) CHECK(buf.pages()[i] == buf.pages()[0] + 4096 * i);
    CHECK(buf.contiguous(0, 2 << 20));
  }
  buf = host::dma_buffer{};
  std::ofstream restore("/proc/sys/vm/nr_hugepages");
  restore << before;
}

TEST_CASE("GPU memory cannot be mapped without the kernel module, and the error says so") {
  host::pagemap_allocator memory("0000:01:00.0");
  int x = 0;
  CHECK_THROWS_WITH_AS((void)memory.map_gpu(&x, 4), doctest::Contains("kmod"), host::error);
}

TEST_CASE("an empty allocation is refused") {
  host::pagemap_allocator memory("test");
  CHECK_THROWS_AS((void)memory.allocate(0), host::error);
}
