#include <cunvme/spec/bit_field.cuh>

#include <doctest/doctest.h>

#include <cstdint>

namespace spec = cunvme::spec;

using low_nibble  = spec::bit_field<std::uint32_t, 0, 4, std::uint8_t>;
using mid_flag    = spec::bit_field<std::uint32_t, 7, 1, bool>;
using top_half    = spec::bit_field<std::uint32_t, 16, 16, std::uint16_t>;
using whole_word  = spec::bit_field<std::uint64_t, 0, 64>;

enum class colour : std::uint8_t { red = 1, green = 2, blue = 3 };
using colour_field = spec::bit_field<std::uint16_t, 14, 2, colour>;

TEST_CASE("a bit field reads only its own bits") {
  static_assert(low_nibble::get(0xfffffff5u) == 5);
  static_assert(mid_flag::get(0x80u));
  static_assert(!mid_flag::get(0x7fu));
  static_assert(top_half::get(0xabcd0000u) == 0xabcd);
  CHECK(top_half::get(0x1234ffffu) == 0x1234);
}

TEST_CASE("setting a bit field leaves every other bit untouched") {
  static_assert(low_nibble::set(0xffffffffu, 0) == 0xfffffff0u);
  static_assert(mid_flag::set(0u, true) == 0x80u);
  static_assert(top_half::set(0x0000beefu, 0xcafe) == 0xcafebeefu);
  CHECK(top_half::set(0xffffffffu, 0) == 0x0000ffffu);
}

TEST_CASE("values wider than the field are truncated by set and refused by fits") {
  static_assert(low_nibble::set(0u, 0x1f) == 0xfu);
  static_assert(low_nibble::fits(15));
  static_assert(!low_nibble::fits(16));
  CHECK(mid_flag::fits(true));
}

TEST_CASE("a field may span the whole word") {
  static_assert(whole_word::max == ~std::uint64_t{0});
  static_assert(whole_word::get(0x0123456789abcdefull) == 0x0123456789abcdefull);
  CHECK(whole_word::set(0, 42) == 42);
}

TEST_CASE("enum-valued fields convert both ways") {
  static_assert(colour_field::get(0xc000) == colour::blue);
  static_assert(colour_field::set(0x0fff, colour::green) == 0x8fff);
  CHECK(colour_field::mask == 0xc000);
}
