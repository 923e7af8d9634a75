#include <cunvme/spec/shadow_doorbell.cuh>

#include <doctest/doctest.h>

namespace spec = cunvme::spec;

TEST_CASE("an MMIO write is needed exactly when EventIdx lies in [old, new)") {
  // old 10 → new 14: EventIdx 10, 11, 12, 13 need the write; 9 and 14 do not.
  static_assert(!spec::shadow_doorbell_needs_mmio(9, 14, 10));
  static_assert(spec::shadow_doorbell_needs_mmio(10, 14, 10));
  static_assert(spec::shadow_doorbell_needs_mmio(13, 14, 10));
  static_assert(!spec::shadow_doorbell_needs_mmio(14, 14, 10));
  static_assert(!spec::shadow_doorbell_needs_mmio(15, 14, 10));
  CHECK_FALSE(spec::shadow_doorbell_needs_mmio(0, 5, 5));  // no movement, no write
}

TEST_CASE("the EventIdx rule works across the 16-bit wrap") {
  static_assert(spec::shadow_doorbell_needs_mmio(65535, 2, 65534));
  static_assert(spec::shadow_doorbell_needs_mmio(0, 2, 65534));
  static_assert(spec::shadow_doorbell_needs_mmio(1, 2, 65534));
  static_assert(!spec::shadow_doorbell_needs_mmio(2, 2, 65534));
  static_assert(!spec::shadow_doorbell_needs_mmio(65533, 2, 65534));
  CHECK(spec::shadow_doorbell_needs_mmio(65534, 2, 65534));
}

TEST_CASE("a controller that asks for every update gets every update") {
  // EventIdx = old value: the controller has seen everything up to old.
  for (unsigned old = 0; old < 70000; old += 997) {
    const auto o = static_cast<std::uint16_t>(old);
    CHECK(spec::shadow_doorbell_needs_mmio(o, static_cast<std::uint16_t>(o + 1), o));
  }
}
