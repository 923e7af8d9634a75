// PRP builder: entries checked one by one, including page offsets and list chaining.
#include <cunvme/prp.cuh>

#include <doctest/doctest.h>

#include <vector>

namespace prp = cunvme::prp;

namespace {

struct list_page {
  std::vector<std::uint64_t> entries = std::vector<std::uint64_t>(1024, 0);
  prp::list_memory memory(std::uint32_t capacity = 1024) { return prp::list_memory{entries.data(), 0x900000, capacity}; }
};

}  // namespace

TEST_CASE("a transfer inside one page needs PRP1 only") {
  list_page l;
  prp::prp_entries e;
  CHECK(prp::build(prp::contiguous{0x10000}, 0x200, 0x800, 12, l.memory(), e) == prp::build_result::ok);
  CHECK(e.prp1 == 0x10200);
  CHECK(e.prp2 == 0);
}

TEST_CASE("a transfer over two pages puts the second page in PRP2") {
  list_page l;
  prp::prp_entries e;
  CHECK(prp::build(prp::contiguous{0x10000}, 0x200, 0x1000, 12, l.memory(), e) == prp::build_result::ok);
  CHECK(e.prp1 == 0x10200);
  CHECK(e.prp2 == 0x11000);
}

TEST_CASE("beyond two pages PRP2 points to a list of the following pages") {
  list_page l;
  prp::prp_entries e;
  const std::uint64_t pages[] = {0xa000, 0x5000, 0x7000, 0x3000};
  CHECK(prp::build(prp::page_list{pages, 12}, 0, 4 * 4096, 12, l.memory(), e) == prp::build_result::ok);
  CHECK(e.prp1 == 0xa000);
  CHECK(e.prp2 == 0x900000);
  CHECK(l.entries[0] == 0x5000);
  CHECK(l.entries[1] == 0x7000);
  CHECK(l.entries[2] == 0x3000);
  CHECK(prp::list_entries_needed(0, 4 * 4096, 12) == 3);
}

TEST_CASE("an offset into the first page shifts every later entry's start, not its alignment") {
  list_page l;
  prp::prp_entries e;
  const std::uint64_t pages[] = {0xa000, 0x5000, 0x7000};
  // 100 bytes into page 0, 2 pages and a bit: PRP1 + a list of two entries.
  CHECK(prp::build(prp::page_list{pages, 12}, 100, 2 * 4096, 12, l.memory(), e) == prp::build_result::ok);
  CHECK(e.prp1 == 0xa064);
  CHECK(l.entries[0] == 0x5000);
  CHECK(l.entries[1] == 0x7000);
}

TEST_CASE("a list longer than a page chains through the page's last entry") {
  list_page l;
  prp::prp_entries e;
  const std::uint64_t data_pages = 600;  // 1 in PRP1, 599 in the list: 511 + chain, then 88
  CHECK(prp::list_entries_needed(0, data_pages * 4096, 12) == 600);
  CHECK(prp::build(prp::contiguous{0x100000000}, 0, data_pages * 4096, 12, l.memory(), e) == prp::build_result::ok);
  CHECK(l.entries[510] == 0x100000000 + 511 * 4096);
  CHECK(l.entries[511] == 0x900000 + 512 * 8);  // chain pointer to the next list page
  CHECK(l.entries[512] == 0x100000000 + 512 * 4096);
  CHECK(l.entries[599] == 0x100000000 + 599 * 4096);
}

TEST_CASE("exactly one full list page needs no chain") {
  list_page l;
  prp::prp_entries e;
  CHECK(prp::list_entries_needed(0, 513 * 4096, 12) == 512);
  CHECK(prp::build(prp::contiguous{0}, 0, 513 * 4096, 12, l.memory(512), e) == prp::build_result::ok);
  CHECK(l.entries[511] == 512 * 4096);
}

TEST_CASE("64 KiB controller pages take 64 KiB per entry; smaller buffer pages are refused") {
  list_page l;
  prp::prp_entries e;
  const std::uint64_t gpu_pages[] = {0x40000, 0x80000, 0xc0000};
  CHECK(prp::build(prp::page_list{gpu_pages, 16}, 0, 3 * 65536, 16, l.memory(), e) == prp::build_result::ok);
  CHECK(l.entries[0] == 0x80000);
  CHECK(l.entries[1] == 0xc0000);
  const std::uint64_t host_pages[] = {0x1000, 0x2000, 0x3000};
  CHECK(prp::build(prp::page_list{host_pages, 12}, 0, 3 * 4096, 16, l.memory(), e) == prp::build_result::ok);  // one 64 KiB page holds it
  CHECK(prp::build(prp::page_list{host_pages, 12}, 0, 3 * 65536, 16, l.memory(), e) == prp::build_result::pages_misaligned);
}

TEST_CASE("a start that is not dword aligned, and a list that is too small, are refused") {
  list_page l;
  prp::prp_entries e;
  CHECK(prp::build(prp::contiguous{0x1000}, 2, 16, 12, l.memory(), e) == prp::build_result::unaligned_start);
  CHECK(prp::build(prp::contiguous{0x1000}, 0, 10 * 4096, 12, l.memory(8), e) == prp::build_result::list_too_small);
  CHECK(prp::build(prp::contiguous{0x1000}, 0, 10 * 4096, 12, l.memory(9), e) == prp::build_result::ok);
}

TEST_CASE("scattered buffer pages that do not start on a page boundary are refused") {
  list_page l;
  prp::prp_entries e;
  const std::uint64_t pages[] = {0x1000, 0x2800};
  CHECK(prp::build(prp::page_list{pages, 12}, 0, 8192, 12, l.memory(), e) == prp::build_result::pages_misaligned);
}

#ifdef __CUDACC__
__global__ void build_on_device(std::uint64_t* list, std::uint64_t* out) {
  prp::prp_entries e;
  const auto r = prp::build(prp::contiguous{0x200000}, 0, 16 * 4096, 12, prp::list_memory{list, 0x1000, 64}, e);
  out[0] = static_cast<std::uint64_t>(r);
  out[1] = e.prp2;
}
#endif
