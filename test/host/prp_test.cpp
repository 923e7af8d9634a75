// PRP builder: entries checked one by one, including page offsets and list chaining.
#include <cunvme/policy/prp.cuh>

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

TEST_CASE("list_entries_needed counts lengths near 2^64 without wrapping or truncating") {
  // PRP1 four bytes before a page end: 2^64 - 5 bytes remain, 2^52 list entries and their chains.
  const std::uint64_t data_entries = (~std::uint64_t{0} - 4) / 4096 + 1;
  const std::uint64_t expected = data_entries + (data_entries - 2) / 511;
  CHECK(std::uint64_t{prp::list_entries_needed(4092, ~std::uint64_t{0}, 12)} == expected);
  CHECK(std::uint64_t{prp::list_entries_needed(0, std::uint64_t{1} << 46, 12)} == (std::uint64_t{1} << 34) - 1 + ((std::uint64_t{1} << 34) - 3) / 511);
}

TEST_CASE("a length near 2^64 is list_too_small and writes nothing past the list memory") {
  list_page l;
  prp::prp_entries e;
  // PRP1 four bytes before a page end: rounding the rest up to whole pages wraps 64 bits.
  CHECK(prp::build(prp::contiguous{0x10ffc}, 0, ~std::uint64_t{0} - 8, 12, l.memory(8), e) == prp::build_result::list_too_small);
  for (std::size_t i = 8; i < l.entries.size(); ++i) REQUIRE(l.entries[i] == 0);
}

TEST_CASE("a list address that is not page aligned is list_misaligned") {
  list_page l;
  prp::prp_entries e;
  const prp::list_memory unaligned{l.entries.data(), 0x900100, 1024};
  CHECK(prp::build(prp::contiguous{0x10000}, 0, 600 * 4096, 12, unaligned, e) == prp::build_result::list_misaligned);
  CHECK(l.entries[0] == 0);
}

TEST_CASE("a controller page size outside 4 KiB..128 MiB, or a buffer page shift past 63, is invalid_page_size") {
  list_page l;
  prp::prp_entries e;
  CHECK(prp::build(prp::contiguous{0x10000}, 0, 4096, 11, l.memory(), e) == prp::build_result::invalid_page_size);
  CHECK(prp::build(prp::contiguous{0x10000}, 0, 4096, 64, l.memory(), e) == prp::build_result::invalid_page_size);
  const std::uint64_t pages[] = {0x1000};
  CHECK(prp::build(prp::page_list{pages, 64}, 0, 4096, 12, l.memory(), e) == prp::build_result::invalid_page_size);
}

TEST_CASE("an offset plus length that wraps 64 bits is range_overflow") {
  list_page l;
  prp::prp_entries e;
  CHECK(prp::build(prp::contiguous{0}, ~std::uint64_t{0} - 4095, 3 * 4096, 12, l.memory(), e) == prp::build_result::range_overflow);
}

TEST_CASE("a list whose bus range wraps 64 bits is range_overflow") {
  list_page l;
  prp::prp_entries e;
  const prp::list_memory top{l.entries.data(), ~std::uint64_t{0} - 4095, 1024};
  CHECK(prp::build(prp::contiguous{0x10000}, 0, 600 * 4096, 12, top, e) == prp::build_result::range_overflow);
}

TEST_CASE("buffer pages smaller than the controller page that are not contiguous are refused even inside PRP1") {
  list_page l;
  prp::prp_entries e;
  const std::uint64_t scattered[] = {0x10000, 0x5000, 0x3000};
  CHECK(prp::build(prp::page_list{scattered, 12}, 0, 3 * 4096, 16, l.memory(), e) == prp::build_result::pages_misaligned);
}

TEST_CASE("a buffer page that does not start page aligned cannot hide a break inside a PRP entry") {
  list_page l;
  prp::prp_entries e;
  // Page 0 starts 16 bytes into a controller page: PRP1 would cover 16 bytes of page 1's range.
  const std::uint64_t pages[] = {0x5010, 0x9000, 0xb000};
  CHECK(prp::build(prp::page_list{pages, 12}, 0, 4080 + 4096, 12, l.memory(), e) == prp::build_result::pages_misaligned);
}

TEST_CASE("a list contiguous page by page may start on the last page of the bus space") {
  // Found by prp_fuzz: the whole-list wrap check refused page-by-page lists (each page is
  // one range on its own; the chain goes to the next page's own address).
  list_page l;
  prp::prp_entries e;
  const std::uint64_t top = ~std::uint64_t{0} - 4095;
  const std::uint64_t list_pages[] = {top, 0x700000};
  const prp::list_memory paged{l.entries.data(), top, 1024, list_pages};
  CHECK(prp::build(prp::contiguous{0x10000}, 0, 600 * 4096, 12, paged, e) == prp::build_result::ok);
  CHECK(e.prp2 == top);
  CHECK(l.entries[511] == 0x700000);
}

#ifdef __CUDACC__
__global__ void build_on_device(std::uint64_t* list, std::uint64_t* out) {
  prp::prp_entries e;
  const auto r = prp::build(prp::contiguous{0x200000}, 0, 16 * 4096, 12, prp::list_memory{list, 0x1000, 64}, e);
  out[0] = static_cast<std::uint64_t>(r);
  out[1] = e.prp2;
}
#endif
