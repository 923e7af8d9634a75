// PRP entry and list rules (NVMe 2.0 section 4.1.1), checked without a controller.
#include <cunvme/emu/prp_walker.cuh>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

struct pages {
  explicit pages(std::size_t n, emu::memory_kind kind = emu::memory_kind::host)
      : memory(static_cast<std::byte*>(std::aligned_alloc(4096, n * 4096)), std::free) {
    // Zeroed: a list entry a case does not set is 0 (no region there), whatever the allocator
    // left in the memory (meson test sets MALLOC_PERTURB_).
    std::memset(memory.get(), 0, n * 4096);
    bus = dma.map(memory.get(), n * 4096, kind);
  }
  std::uint64_t* entries(std::size_t page) { return reinterpret_cast<std::uint64_t*>(memory.get() + page * 4096); }
  emu::dma_space dma;
  std::unique_ptr<std::byte, void (*)(void*)> memory;
  std::uint64_t bus = 0;
};

constexpr auto ok = spec::status::successful_completion;

}  // namespace

TEST_CASE("a transfer inside PRP1's page needs no PRP2") {
  pages p(1);
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus + 1024, 0xbad, 2048, 4096, false) == ok);
  REQUIRE(w.segments().size() == 1);
  CHECK(w.segments()[0].offset == 1024);
  CHECK(w.segments()[0].length == 2048);
}

TEST_CASE("zero bytes need no PRPs at all") {
  pages p(1);
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), 0, 0, 0, 4096, false) == ok);
  CHECK(w.segments().empty());
}

TEST_CASE("contiguous pages merge into one segment") {
  pages p(4);
  for (int i = 0; i < 2; ++i) p.entries(3)[i] = p.bus + 4096u * (i + 1u);
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus, p.bus + 3 * 4096, 3 * 4096, 4096, false) == ok);
  REQUIRE(w.segments().size() == 1);
  CHECK(w.segments()[0].length == 3 * 4096);
}

TEST_CASE("the page size comes from CC.MPS: 64 KiB pages take 64 KiB per entry") {
  pages p(32);
  emu::prp_walker w;
  // 96 KiB from a 64 KiB-aligned spot: one 64 KiB entry, then PRP2 for the rest.
  const std::uint64_t base = (p.bus + 65535) & ~65535ull;
  if (base + 2 * 65536 <= p.bus + 32 * 4096) {
    CHECK(w.walk(p.dma.pin(), base, base + 65536, 96 * 1024, 65536, false) == ok);
    CHECK(w.walk(p.dma.pin(), base, base + 65536 + 4096, 96 * 1024, 65536, false) == spec::status::prp_offset_invalid);
  }
  CHECK(w.walk(p.dma.pin(), p.bus, 0, 4096, 65536, false) == ok);
}

TEST_CASE("a list pointer with an offset uses the rest of its page") {
  pages p(8);
  std::uint64_t* list = p.entries(0) + 510;  // two slots left in the page
  list[0] = p.bus + 4 * 4096;
  list[1] = p.bus + 5 * 4096;
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus + 3 * 4096, p.bus + 510 * 8, 3 * 4096, 4096, false) == ok);
  CHECK(w.segments().size() == 1);  // pages 3, 4, 5 are contiguous
}

TEST_CASE("a chained list whose chain pointer has an offset is PRP Offset Invalid") {
  pages p(8);
  std::uint64_t* list = p.entries(0) + 511;  // one slot left: it must chain
  list[0] = p.bus + 4096 + 8;
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus + 2 * 4096, p.bus + 511 * 8, 3 * 4096, 4096, false) == spec::status::prp_offset_invalid);
}

TEST_CASE("a list in unregistered memory is Data Transfer Error") {
  pages p(2);
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus, 0x5000, 3 * 4096, 4096, false) == spec::status::data_transfer_error);
}

TEST_CASE("data in CMB and host memory in one command is refused unless mixing is allowed") {
  pages host(2);
  std::unique_ptr<std::byte, void (*)(void*)> cmb(static_cast<std::byte*>(std::aligned_alloc(4096, 8192)), std::free);
  REQUIRE(host.dma.map_at(0x4000'0000, cmb.get(), 8192, emu::memory_kind::cmb));
  emu::prp_walker w;
  CHECK(w.walk(host.dma.pin(), host.bus, 0x4000'0000, 8192, 4096, false) == spec::status::invalid_use_of_controller_memory_buffer);
  CHECK(w.walk(host.dma.pin(), host.bus, 0x4000'0000, 8192, 4096, true) == ok);
  CHECK(w.walk(host.dma.pin(), 0x4000'0000, 0x4000'1000, 8192, 4096, false) == ok);
}

TEST_CASE("a list pointer four bytes before its page end leaves no room for an entry: PRP Offset Invalid") {
  pages p(8);
  emu::prp_walker w;
  // dword aligned (so not refused for its alignment) but no whole 8-byte entry fits in its page.
  CHECK(w.walk(p.dma.pin(), p.bus + 2 * 4096, p.bus + 4096 - 4, 3 * 4096, 4096, false) == spec::status::prp_offset_invalid);
  CHECK(w.walk(p.dma.pin(), p.bus + 2 * 4096, p.bus + 4096 - 4, 600 * 4096, 4096, false) == spec::status::prp_offset_invalid);
}

TEST_CASE("a list pointer with one slot left chains at once and still maps the data") {
  pages p(8);
  p.entries(0)[511] = p.bus + 4096;  // the only slot is the chain pointer
  p.entries(1)[0] = p.bus + 3 * 4096;
  p.entries(1)[1] = p.bus + 4 * 4096;
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus + 2 * 4096, p.bus + 511 * 8, 3 * 4096, 4096, false) == ok);
  REQUIRE(w.segments().size() == 1);
  CHECK(w.segments()[0].length == 3 * 4096);
}

TEST_CASE("a length near 2^64 ends in an error, not an endless walk") {
  pages p(8);
  emu::prp_walker w;
  // PRP1 four bytes before its page end leaves 2^64 - 5 bytes: rounding that up to pages wraps.
  CHECK(w.walk(p.dma.pin(), p.bus + 4096 - 4, p.bus + 4096, ~std::uint64_t{0}, 4096, false) == spec::status::data_transfer_error);
}

TEST_CASE("entries and lists at the very top of the bus address space do not wrap") {
  pages p(2);
  emu::prp_walker w;
  const std::uint64_t top = ~std::uint64_t{0} - 4095;  // the last page of the 64-bit space
  CHECK(w.walk(p.dma.pin(), p.bus, top, 2 * 4096, 4096, false) == spec::status::data_transfer_error);
  CHECK(w.walk(p.dma.pin(), p.bus, top, 3 * 4096, 4096, false) == spec::status::data_transfer_error);
  CHECK(w.walk(p.dma.pin(), top + 4092, 0, 8, 4096, false) == spec::status::data_transfer_error);
}

TEST_CASE("a page size that is not a power of two of at least 4 KiB is Invalid Field") {
  pages p(2);
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus, 0, 4096, 0, false) == spec::status::invalid_field_in_command);
  CHECK(w.walk(p.dma.pin(), p.bus, 0, 4096, 3000, false) == spec::status::invalid_field_in_command);
  CHECK(w.walk(p.dma.pin(), p.bus, 0, 4096, 2048, false) == spec::status::invalid_field_in_command);
}

TEST_CASE("a chained list that points back at itself ends when the data is mapped") {
  pages p(8);
  for (int i = 0; i < 511; ++i) p.entries(0)[i] = p.bus + 4096;  // every entry the same data page
  p.entries(0)[511] = p.bus;                                      // and the chain back to this list
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus + 4096, p.bus, 2000 * 4096, 4096, false) == ok);
  std::uint64_t total = 0;
  for (const auto& s : w.segments()) total += s.length;
  CHECK(total == 2000 * 4096);
}

TEST_CASE("a list pointer that is dword but not qword aligned is a valid list with an offset") {
  pages p(8);
  auto* list = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::byte*>(p.entries(0)) + 4);
  const std::uint64_t first = p.bus + 4 * 4096, second = p.bus + 5 * 4096;
  std::memcpy(list, &first, 8);
  std::memcpy(list + 1, &second, 8);
  emu::prp_walker w;
  CHECK(w.walk(p.dma.pin(), p.bus + 3 * 4096, p.bus + 4, 3 * 4096, 4096, false) == ok);
  REQUIRE(w.segments().size() == 1);
  CHECK(w.segments()[0].length == 3 * 4096);
}
