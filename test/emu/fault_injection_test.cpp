// Fault rules: which commands they hit, when, and what they do.
#include <cunvme/emu/fault_injection.cuh>

#include <doctest/doctest.h>

namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

emu::command_view read_cmd(std::uint64_t seq, std::uint64_t slba = 0, std::uint16_t sqid = 1) {
  return emu::command_view{false, sqid, static_cast<std::uint16_t>(seq), 0x02, seq, true, slba, 8};
}

emu::fault_rule status_rule() {
  emu::fault_rule r;
  r.status = spec::status::unrecovered_read_error;
  return r;
}

}  // namespace

TEST_CASE("an injector without rules injects nothing") {
  emu::fault_injector f;
  CHECK_FALSE(f.decide(read_cmd(1)).any());
}

TEST_CASE("an nth rule fires exactly once, on the nth matching command") {
  auto r = status_rule();
  r.nth = 3;
  emu::fault_injector f({r}, 1);
  for (std::uint64_t i = 1; i <= 10; ++i) {
    const auto d = f.decide(read_cmd(i));
    CHECK(d.status.has_value() == (i == 3));
  }
  CHECK(f.fired(0) == 1);
  CHECK(f.counters().statuses == 1);
}

TEST_CASE("a fraction rule fires on about that fraction, reproducibly for one seed") {
  auto r = status_rule();
  r.fraction = 0.1;
  emu::fault_injector a({r}, 42), b({r}, 42), c({r}, 43);
  int hits = 0, same = 0, same_other_seed = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const bool x = a.decide(read_cmd(i)).any();
    hits += x;
    same += x == b.decide(read_cmd(i)).any();
    same_other_seed += x == c.decide(read_cmd(i)).any();
  }
  CHECK(hits > 9500);
  CHECK(hits < 10500);
  CHECK(same == 100000);
  CHECK(same_other_seed < 100000);
}

TEST_CASE("rules match by opcode, queue type, queue and LBA range") {
  auto r = status_rule();
  r.fraction = 1.0;
  r.opcode = 0x01;
  r.sqid = 2;
  r.lba_first = 100;
  r.lba_last = 199;
  emu::fault_injector f({r}, 1);
  emu::command_view w{false, 2, 1, 0x01, 1, true, 96, 8};
  CHECK(f.decide(w).any());              // 96..103 meets 100..199
  w.slba = 200;
  CHECK_FALSE(f.decide(w).any());        // past the range
  w.slba = 150;
  w.opcode = 0x02;
  CHECK_FALSE(f.decide(w).any());        // another opcode
  w.opcode = 0x01;
  w.sqid = 3;
  CHECK_FALSE(f.decide(w).any());        // another queue
  w.sqid = 2;
  w.admin = true;
  CHECK_FALSE(f.decide(w).any());        // admin commands need an admin rule
  w.admin = false;
  w.has_lba = false;
  CHECK_FALSE(f.decide(w).any());        // no LBAs: no match for an LBA-limited rule
}

TEST_CASE("max_fires bounds how often a rule fires") {
  auto r = status_rule();
  r.fraction = 1.0;
  r.max_fires = 2;
  emu::fault_injector f({r}, 1);
  int hits = 0;
  for (std::uint64_t i = 0; i < 10; ++i) hits += f.decide(read_cmd(i)).any();
  CHECK(hits == 2);
  CHECK(f.fired(0) == 2);
}

TEST_CASE("several rules may fire on one command and every action is counted") {
  emu::fault_rule delay;
  delay.action = emu::fault_action::add_delay;
  delay.delay_ns = 500;
  delay.nth = 1;
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.nth = 1;
  emu::fault_rule fatal;
  fatal.action = emu::fault_action::controller_fatal;
  fatal.nth = 2;
  auto status = status_rule();
  status.nth = 1;
  status.dnr = false;
  emu::fault_injector f({delay, lose, fatal, status}, 1);
  const auto d = f.decide(read_cmd(1));
  CHECK(d.extra_delay_ns == 500);
  CHECK(d.lose_completion);
  CHECK(d.status == spec::status::unrecovered_read_error);
  CHECK_FALSE(d.dnr);
  CHECK_FALSE(d.controller_fatal);
  CHECK(f.decide(read_cmd(2)).controller_fatal);
  const auto c = f.counters();
  CHECK(c.delays == 1);
  CHECK(c.lost_completions == 1);
  CHECK(c.controller_fatals == 1);
  CHECK(c.statuses == 1);
}

TEST_CASE("invalid rules are refused with the rule's index") {
  auto valid = status_rule();
  valid.nth = 1;
  auto r = status_rule();
  r.fraction = 1.5;
  CHECK_THROWS_WITH_AS(emu::fault_injector({valid, r}, 1), doctest::Contains("rule 1"), std::invalid_argument);
  r = status_rule();
  r.nth = 1;
  r.fraction = 0.5;
  CHECK_THROWS_AS(emu::fault_injector({r}, 1), std::invalid_argument);
  r = status_rule();
  CHECK_THROWS_WITH_AS(emu::fault_injector({r}, 1), doctest::Contains("never fire"), std::invalid_argument);
  r = emu::fault_rule{};
  r.nth = 1;
  CHECK_THROWS_WITH_AS(emu::fault_injector({r}, 1), doctest::Contains("error status"), std::invalid_argument);
  r.action = emu::fault_action::add_delay;
  CHECK_THROWS_AS(emu::fault_injector({r}, 1), std::invalid_argument);
  CHECK_THROWS_AS((void)emu::fault_injector().fired(0), std::out_of_range);
}
