// dma_allocator::map_host on the emulator: one controller's buffer made reachable by a second
// (the memory of a page cache serving every controller of a volume), its mapping gone with the
// returned buffer, and the input it refuses.
#include <cunvme/host/open.cuh>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

namespace host = cunvme::host;
namespace spec = cunvme::spec;

namespace {

/// An emulated controller whose namespace 1 holds host::pattern_word (512-byte blocks).
std::unique_ptr<host::controller> patterned() { return host::open("emu:pattern,blocks=4096"); }

bool holds_pattern(const std::byte* p, std::size_t bytes, std::uint64_t from_byte) {
  for (std::size_t o = 0; o + 8 <= bytes; o += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + o, 8);
    if (w != host::pattern_word(from_byte + o)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a buffer from one emulated controller, mapped into a second, receives the second controller's read") {
  auto first = patterned();
  auto second = patterned();
  auto slots = first->memory().allocate(3 * 4096);
  auto mapped = second->memory().map_host(slots.data(), slots.size());
  CHECK(mapped.data() == slots.data());
  CHECK(mapped.size() == slots.size());
  CHECK(mapped.location() == host::memory_location::pinned_host);
  REQUIRE(mapped.pages().size() == 3);
  auto q = second->create_queue_pair(8);
  REQUIRE(q->read(1, 16, 24, mapped) == spec::status::successful_completion);
  CHECK(holds_pattern(slots.data(), 3 * 4096, 16 * 512));
}

TEST_CASE("the first controller still reaches its buffer while the second has it mapped, and after") {
  auto first = patterned();
  auto second = patterned();
  auto slots = first->memory().allocate(4096);
  auto q = first->create_queue_pair(8);
  {
    auto mapped = second->memory().map_host(slots.data(), slots.size());
    REQUIRE(q->read(1, 0, 8, slots) == spec::status::successful_completion);
    CHECK(holds_pattern(slots.data(), 4096, 0));
  }
  std::memset(slots.data(), 0, 4096);
  REQUIRE(q->read(1, 8, 8, slots) == spec::status::successful_completion);
  CHECK(holds_pattern(slots.data(), 4096, 8 * 512));
}

TEST_CASE("once the mapping's buffer is gone, a command into its bus addresses fails with Data Transfer Error and leaves the memory alone") {
  auto first = patterned();
  auto second = patterned();
  auto slots = first->memory().allocate(4096);
  std::uint64_t stale = 0;
  {
    auto mapped = second->memory().map_host(slots.data(), slots.size());
    stale = mapped.bus();
  }
  std::memset(slots.data(), 0x5a, 4096);
  auto q = second->create_queue_pair(8);
  const auto sqe = spec::make_rw(spec::nvm_opcode::read, 1, 0, 8, stale);
  CHECK(q->execute(sqe, "Read").status() == spec::status::data_transfer_error);
  bool untouched = true;
  for (std::size_t i = 0; i < 4096; ++i) untouched = untouched && slots.data()[i] == std::byte{0x5a};
  CHECK(untouched);
}

TEST_CASE("the emulator's map_host refuses a null pointer, a start inside a page and zero bytes, naming the operation") {
  auto ctrl = patterned();
  auto memory = ctrl->memory().allocate(2 * 4096);
  CHECK_THROWS_WITH_AS((void)ctrl->memory().map_host(nullptr, 4096), doctest::Contains("Map host memory"), host::error);
  CHECK_THROWS_WITH_AS((void)ctrl->memory().map_host(memory.data() + 512, 4096), doctest::Contains("4 KiB boundary"), host::error);
  CHECK_THROWS_WITH_AS((void)ctrl->memory().map_host(memory.data(), 0), doctest::Contains("Map host memory"), host::error);
}

TEST_CASE("the emulator's map_host refuses a range larger than its bus as a host::error") {
  auto ctrl = patterned();
  auto memory = ctrl->memory().allocate(4096);
  CHECK_THROWS_WITH_AS((void)ctrl->memory().map_host(memory.data(), std::numeric_limits<std::size_t>::max() - 4096), doctest::Contains("Map host memory"),
                       host::error);
}
