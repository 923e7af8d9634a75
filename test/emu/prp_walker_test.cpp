// PRP entry and list rules (NVMe 2.0 section 4.1.1), checked without a controller.
#include <cunvme/emu/prp_walker.cuh>

#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>

namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

struct pages {
  explicit pages(std::size_t n, emu::memory_kind kind = emu::memory_kind::host)
      : memory(static_cast<std::byte*>(std::aligned_alloc(4096, n * 4096)), std::free) {
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
