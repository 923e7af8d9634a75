// Doorbell policies: MMIO stores, the shadow doorbell's EventIdx rule, and coalescing.
#include "fake_queue.hpp"

#include <cunvme/policy/doorbell.cuh>
#include <cunvme/spec/shadow_doorbell.cuh>

#include <doctest/doctest.h>

using test::fake_queue;
namespace doorbell = cunvme::doorbell;

TEST_CASE("mmio writes every new value to the doorbell register and counts it") {
  fake_queue f(16);
  doorbell::mmio::ring(f.view, doorbell::which::sq_tail, 5, 4);
  doorbell::mmio::ring(f.view, doorbell::which::cq_head, 3, 2);
  CHECK(f.sq_tail_doorbell() == 5);
  CHECK(f.cq_head_doorbell() == 3);
  CHECK(f.counters->doorbell_mmio_writes == 2);
  CHECK(doorbell::mmio::usable(f.view));
}

TEST_CASE("shadow is usable only with shadow and EventIdx slots") {
  fake_queue f(16);
  CHECK_FALSE(doorbell::shadow::usable(f.view));
  CHECK_FALSE(doorbell::coalescing<doorbell::shadow>::usable(f.view));
  f.add_shadow();
  CHECK(doorbell::shadow::usable(f.view));
}

// NVMe 2.0 section 5.8: the host writes the MMIO doorbell when the new value passes EventIdx,
// i.e. EventIdx lies in [old, new) modulo 2^16.
struct event_case {
  std::uint16_t event, old_value, new_value;
  bool mmio;
};

TEST_CASE("shadow writes the shadow slot always and MMIO exactly when EventIdx lies in [old, new)") {
  const event_case cases[] = {
      {4, 4, 5, true},         // EventIdx == old: the controller waits for the next value
      {5, 4, 5, false},        // EventIdx == new: not passed yet
      {4, 2, 8, true},         // inside a batch
      {1, 2, 8, false},        // behind the batch: the controller is still polling
      {9, 2, 8, false},        // ahead of the batch
      {7, 2, 8, true},         // the last value of the batch
      {0xfffe, 0xfffd, 2, true},  // the range wraps past 2^16 and EventIdx sits before the wrap
      {1, 0xfffd, 2, true},       // … and after it
      {2, 0xfffd, 2, false},      // EventIdx == new across the wrap
      {3, 3, 3, false},           // no movement never rings
  };
  for (const auto& c : cases) {
    CAPTURE(c.event);
    CAPTURE(c.old_value);
    CAPTURE(c.new_value);
    fake_queue f(16);
    f.add_shadow();
    f.counters->sq_doorbell_rung = 1;  // a doorbell rung before: the rule applies (a new queue's first write is MMIO, below)
    f.event_index[0] = c.event;
    f.registers[0] = 0xdead;
    doorbell::shadow::ring(f.view, doorbell::which::sq_tail, c.new_value, c.old_value);
    CHECK(f.shadow[0] == c.new_value);
    CHECK((f.sq_tail_doorbell() == c.new_value) == c.mmio);
    CHECK(f.counters->doorbell_mmio_writes == (c.mmio ? 1u : 0u));
    CHECK(f.counters->doorbell_skipped == (c.mmio ? 0u : 1u));
    CHECK(cunvme::spec::shadow_doorbell_needs_mmio(c.event, c.new_value, c.old_value) == c.mmio);
  }
}

TEST_CASE("shadow applies the rule to the CQ head with the CQ's own slots") {
  fake_queue f(16);
  f.add_shadow();
  f.event_index[1] = 6;
  doorbell::shadow::ring(f.view, doorbell::which::cq_head, 7, 6);
  CHECK(f.shadow[1] == 7);
  CHECK(f.cq_head_doorbell() == 7);
  CHECK(f.shadow[0] == 0);
}

TEST_CASE("coalescing declares itself, and writes through its inner policy") {
  static_assert(doorbell::coalescing<doorbell::mmio>::coalesces);
  static_assert(!doorbell::mmio::coalesces && !doorbell::shadow::coalesces);
  fake_queue f(16);
  doorbell::coalescing<doorbell::mmio>::ring(f.view, doorbell::which::sq_tail, 9, 1);
  CHECK(f.sq_tail_doorbell() == 9);
}

// DESIGN.md rule 5: EventIdx left by a deleted queue with the same identifier (or one the
// controller has not written for this queue yet) proves nothing about the new queue.
TEST_CASE("shadow writes a new queue's first SQ tail and CQ head by MMIO whatever EventIdx says, then follows the rule") {
  fake_queue f(16);
  f.add_shadow();
  f.event_index[0] = 5;  // stale: the rule alone would skip 0 -> 1
  f.event_index[1] = 5;
  doorbell::shadow::ring(f.view, doorbell::which::sq_tail, 1, 0);
  CHECK(f.shadow[0] == 1);
  CHECK(f.sq_tail_doorbell() == 1);
  doorbell::shadow::ring(f.view, doorbell::which::cq_head, 1, 0);
  CHECK(f.shadow[1] == 1);
  CHECK(f.cq_head_doorbell() == 1);
  CHECK(f.counters->doorbell_mmio_writes == 2);
  doorbell::shadow::ring(f.view, doorbell::which::sq_tail, 2, 1);  // EventIdx 5 not in [1, 2)
  CHECK(f.shadow[0] == 2);
  CHECK(f.sq_tail_doorbell() == 1);
  CHECK(f.counters->doorbell_skipped == 1);
}
