// host::gpu_for_cpu_mapping's copy helpers — aligned accesses for write-combined GPU memory — on
// ordinary memory, with memcpy as the oracle: every alignment of offset and length near both
// ends of a mapping, guard bytes around it untouched, both load paths (streaming, plain), and
// the bounds checks. The kernel module's mapping itself needs an NVIDIA driver and is not run
// here (README, "Kernel module").
#include <cunvme/detail/write_combined.cuh>
#include <cunvme/host/memory/gpu_mapping.cuh>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace host = cunvme::host;
namespace wc = cunvme::access;

namespace {

constexpr std::size_t mapping_bytes = 192;  // three 64-byte lines: offsets reach both ends
constexpr std::size_t guard = 64;           // on each side of the mapping
constexpr std::size_t max_length = 64;
constexpr std::byte unwritten_byte{0xa5};

std::byte pattern(std::size_t i, unsigned seed) { return static_cast<std::byte>((i * 131 + seed * 29 + 7) & 0xff); }

/// The mapping's memory with guard bytes before and after it, 64-byte aligned like a page.
struct arena {
  alignas(64) std::byte bytes[guard + mapping_bytes + guard];
  arena() { std::memset(bytes, static_cast<int>(unwritten_byte), sizeof bytes); }
  std::byte* mapped() { return bytes + guard; }
};

/// Every (offset, length) of the mapping with length 0..64: all 16 alignments of each, at the
/// start, in the middle and against the end.
template <class F>
void for_each_range(F&& f) {
  for (std::size_t offset = 0; offset <= mapping_bytes; ++offset) {
    for (std::size_t length = 0; length <= max_length && offset + length <= mapping_bytes; ++length) f(offset, length);
  }
}

}  // namespace

TEST_CASE("copy_to writes exactly the range's bytes, at every alignment of offset and length, and nothing around it") {
  std::vector<std::byte> src(max_length + 16);
  std::size_t ranges = 0;
  for_each_range([&](std::size_t offset, std::size_t length) {
    for (std::size_t src_offset : {std::size_t{0}, std::size_t{3}, std::size_t{8}}) {
      arena a;
      arena expected;
      for (std::size_t i = 0; i < src.size(); ++i) src[i] = pattern(i, static_cast<unsigned>(offset + length));
      std::memcpy(expected.mapped() + offset, src.data() + src_offset, length);
      host::gpu_for_cpu_mapping m(a.mapped(), mapping_bytes, "test mapping");
      m.copy_to(offset, src.data() + src_offset, length);
      if (std::memcmp(a.bytes, expected.bytes, sizeof a.bytes) != 0) {
        FAIL("copy_to(" << offset << ", src + " << src_offset << ", " << length << ") differs from memcpy");
      }
      ++ranges;
    }
  });
  CHECK(ranges == 3 * ((mapping_bytes + 1) * (max_length + 1) - max_length * (max_length + 1) / 2));
}

TEST_CASE("copy_from reads exactly the range's bytes into the destination, at every alignment, leaving the mapping and the bytes around the destination alone") {
  arena a;
  for (std::size_t i = 0; i < mapping_bytes; ++i) a.mapped()[i] = pattern(i, 1);
  arena before = a;
  for_each_range([&](std::size_t offset, std::size_t length) {
    for (std::size_t dst_offset : {std::size_t{0}, std::size_t{5}, std::size_t{16}}) {
      std::vector<std::byte> dst(guard + max_length + 16 + guard, unwritten_byte);
      std::vector<std::byte> expected = dst;
      std::memcpy(expected.data() + guard + dst_offset, a.mapped() + offset, length);
      const host::gpu_for_cpu_mapping m(a.mapped(), mapping_bytes, "test mapping");
      m.copy_from(offset, dst.data() + guard + dst_offset, length);
      if (dst != expected) FAIL("copy_from(" << offset << ", dst + " << dst_offset << ", " << length << ") differs from memcpy");
    }
  });
  CHECK(std::memcmp(a.bytes, before.bytes, sizeof a.bytes) == 0);
}

TEST_CASE("streaming and plain loads read the same bytes at every alignment") {
  INFO("streaming loads on this CPU: " << wc::streaming_loads_available());
  arena a;
  for (std::size_t i = 0; i < mapping_bytes; ++i) a.mapped()[i] = pattern(i, 2);
  for_each_range([&](std::size_t offset, std::size_t length) {
    std::vector<std::byte> streamed(max_length, unwritten_byte), plain(max_length, unwritten_byte), expected(max_length, unwritten_byte);
    std::memcpy(expected.data(), a.mapped() + offset, length);
    wc::copy_from_write_combined(streamed.data(), a.mapped() + offset, length, true);
    wc::copy_from_write_combined(plain.data(), a.mapped() + offset, length, false);
    if (streamed != expected || plain != expected) FAIL("loads of [" << offset << ", +" << length << ") differ from memcpy");
  });
}

TEST_CASE("a range running past the mapping is refused with host::error and nothing is copied") {
  arena a;
  arena untouched;
  host::gpu_for_cpu_mapping m(a.mapped(), mapping_bytes, "test mapping");
  std::vector<std::byte> buffer(max_length + 1, std::byte{0x11});
  CHECK_THROWS_AS(m.copy_to(mapping_bytes - 3, buffer.data(), 4), host::error);
  CHECK_THROWS_AS(m.copy_to(mapping_bytes + 1, buffer.data(), 0), host::error);
  CHECK_THROWS_AS(m.copy_to(0, buffer.data(), mapping_bytes + 1), host::error);
  CHECK_THROWS_AS(m.copy_to(std::numeric_limits<std::size_t>::max(), buffer.data(), 2), host::error);  // offset + n wraps
  CHECK_THROWS_AS(m.copy_to(2, buffer.data(), std::numeric_limits<std::size_t>::max()), host::error);
  CHECK(std::memcmp(a.bytes, untouched.bytes, sizeof a.bytes) == 0);

  const std::vector<std::byte> kept = buffer;
  CHECK_THROWS_AS(m.copy_from(mapping_bytes - 63, buffer.data(), 64), host::error);
  CHECK_THROWS_AS(m.copy_from(std::numeric_limits<std::size_t>::max() - 1, buffer.data(), 4), host::error);
  CHECK(buffer == kept);
  try {
    m.copy_from(190, buffer.data(), 8);
    FAIL("copy_from past the end did not throw");
  } catch (const host::error& e) {
    CHECK(std::string(e.what()) == "Copy from GPU memory on test mapping: bytes [190, +8) run past the mapping's 192");
  }
}

TEST_CASE("an empty copy at the mapping's end is allowed; a missing buffer for a non-empty one is refused") {
  arena a;
  host::gpu_for_cpu_mapping m(a.mapped(), mapping_bytes, "test mapping");
  CHECK_NOTHROW(m.copy_to(mapping_bytes, nullptr, 0));
  CHECK_NOTHROW(m.copy_from(mapping_bytes, nullptr, 0));
  CHECK_THROWS_AS(m.copy_to(0, nullptr, 1), host::error);
  CHECK_THROWS_AS(m.copy_from(0, nullptr, 1), host::error);
}

TEST_CASE("a default or moved-from mapping is empty and refuses every non-empty copy") {
  host::gpu_for_cpu_mapping empty;
  std::byte b{};
  CHECK_FALSE(empty);
  CHECK(empty.size() == 0);
  CHECK_THROWS_AS(empty.copy_to(0, &b, 1), host::error);
  CHECK_THROWS_AS(empty.copy_from(0, &b, 1), host::error);

  arena a;
  host::gpu_for_cpu_mapping m(a.mapped(), mapping_bytes, "test mapping");
  host::gpu_for_cpu_mapping moved = std::move(m);
  CHECK(moved.size() == mapping_bytes);
  CHECK(moved.data() == a.mapped());
  CHECK(m.size() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  CHECK_THROWS_AS(m.copy_to(0, &b, 1), host::error);
}

TEST_CASE("the release runs once, when the last owner goes") {
  arena a;
  int released = 0;
  {
    host::gpu_for_cpu_mapping m(a.mapped(), mapping_bytes, "test mapping", [&] { ++released; });
    host::gpu_for_cpu_mapping moved(std::move(m));
    host::gpu_for_cpu_mapping assigned;
    assigned = std::move(moved);
    CHECK(released == 0);
  }
  CHECK(released == 1);

  host::gpu_for_cpu_mapping first(a.mapped(), mapping_bytes, "first", [&] { ++released; });
  host::gpu_for_cpu_mapping second(a.mapped(), mapping_bytes, "second", [&] { released += 10; });
  second = std::move(first);  // releases the second's mapping now
  CHECK(released == 11);
}

TEST_CASE("a mapping without an address is refused, and its release still runs") {
  int released = 0;
  CHECK_THROWS_AS(host::gpu_for_cpu_mapping(nullptr, 4096, "test mapping", [&] { ++released; }), host::error);
  CHECK(released == 1);
}
