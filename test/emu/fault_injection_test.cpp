// Fault rules: which commands they hit, when, what they do, and how they are counted.
#include <cunvme/emu/fault_injection.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace emu = cunvme::emu;
namespace spec = cunvme::spec;

namespace {

constexpr std::uint8_t read_opcode = 0x02;
constexpr std::uint8_t write_opcode = 0x01;

/// The seq-th 8-block read on I/O queue `sqid`, its CID cycling as a host's would.
emu::command_view read_cmd(std::uint64_t seq, std::uint64_t slba = 0, std::uint16_t sqid = 1) {
  return emu::command_view{.admin = false,
                           .sqid = sqid,
                           .cid = static_cast<std::uint16_t>(seq % 1024),
                           .opcode = read_opcode,
                           .sequence = seq,
                           .has_lba = true,
                           .slba = slba,
                           .nlb = 8};
}

/// An admin command without LBAs (Identify, say).
emu::command_view admin_cmd(std::uint64_t seq, std::uint8_t opcode = 0x06) {
  return emu::command_view{.admin = true, .sqid = 0, .cid = static_cast<std::uint16_t>(seq), .opcode = opcode, .sequence = seq};
}

emu::fault_rule status_rule() {
  emu::fault_rule r;
  r.status = spec::status::unrecovered_read_error;
  return r;
}

emu::fault_rule always(emu::fault_rule r) {
  r.fraction = 1.0;
  return r;
}

}  // namespace

// ---- firing -----------------------------------------------------------------------------------------

TEST_CASE("an injector without rules injects nothing and counts nothing") {
  emu::fault_injector f;
  int hits = 0;
  for (std::uint64_t i = 0; i < 100; ++i) hits += f.decide(read_cmd(i)).any() + f.decide(admin_cmd(i)).any();
  CHECK(hits == 0);
  const auto c = f.counters();
  CHECK(c.statuses + c.delays + c.lost_completions + c.controller_fatals == 0);
}

TEST_CASE("an nth rule fires exactly once, on the nth matching command") {
  auto r = status_rule();
  r.nth = 3;
  emu::fault_injector f({r}, 1);
  for (std::uint64_t i = 1; i <= 20; ++i) {
    const auto d = f.decide(read_cmd(i));
    CHECK(d.status.has_value() == (i == 3));
  }
  CHECK(f.fired(0) == 1);
  CHECK(f.counters().statuses == 1);
}

TEST_CASE("an nth rule counts only the commands it matches") {
  auto r = status_rule();
  r.opcode = read_opcode;
  r.nth = 2;
  emu::fault_injector f({r}, 1);
  auto write = read_cmd(0);
  write.opcode = write_opcode;
  CHECK_FALSE(f.decide(write).any());
  CHECK_FALSE(f.decide(read_cmd(1)).any());
  CHECK_FALSE(f.decide(write).any());
  CHECK(f.decide(read_cmd(2)).any());
  CHECK_FALSE(f.decide(read_cmd(3)).any());
}

TEST_CASE("an nth rule fires exactly once when four threads race through it") {
  auto r = status_rule();
  r.nth = 5000;
  emu::fault_injector f({r}, 1);
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (std::uint16_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < 5000; ++i) hits += f.decide(read_cmd(i, 0, static_cast<std::uint16_t>(t + 1))).any();
    });
  }
  for (auto& th : threads) th.join();
  CHECK(hits == 1);
  CHECK(f.fired(0) == 1);
}

TEST_CASE("a fraction rule fires on about that fraction of 100 k commands") {
  for (const double fraction : {0.01, 0.1, 0.5}) {
    auto r = status_rule();
    r.fraction = fraction;
    emu::fault_injector f({r}, 42);
    int hits = 0;
    for (std::uint64_t i = 0; i < 100'000; ++i) hits += f.decide(read_cmd(i)).any();
    CAPTURE(fraction);
    // Binomial spread is below 1 % of the mean at these sizes except for 1 %; 5 % is ample.
    CHECK(std::fabs(hits - fraction * 100'000) < 0.05 * fraction * 100'000);
    CHECK(f.fired(0) == static_cast<std::uint64_t>(hits));
  }
}

TEST_CASE("a fraction rule of 1 fires on every matching command") {
  emu::fault_injector f({always(status_rule())}, 7);
  int hits = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) hits += f.decide(read_cmd(i)).status.has_value();
  CHECK(hits == 1000);
}

TEST_CASE("the same seed and commands give the same decisions, in any order") {
  auto r = status_rule();
  r.fraction = 0.1;
  emu::fault_injector forward({r}, 42), backward({r}, 42);
  std::vector<bool> first(100'000);
  for (std::uint64_t i = 0; i < first.size(); ++i) first[i] = forward.decide(read_cmd(i)).any();
  int differ = 0;
  for (std::uint64_t i = first.size(); i-- > 0;) differ += backward.decide(read_cmd(i)).any() != first[i];
  CHECK(differ == 0);
}

TEST_CASE("another seed gives other decisions") {
  auto r = status_rule();
  r.fraction = 0.1;
  emu::fault_injector a({r}, 42), b({r}, 43);
  int same_hits = 0, hits = 0;
  for (std::uint64_t i = 0; i < 100'000; ++i) {
    const bool x = a.decide(read_cmd(i)).any();
    const bool y = b.decide(read_cmd(i)).any();
    hits += x;
    same_hits += x && y;
  }
  // Independent draws share about 10 % of their hits; identical ones would share all.
  CHECK(same_hits < hits / 5);
}

TEST_CASE("rules draw independently: two equal fraction rules do not hit the same commands") {
  auto r = always(emu::fault_rule{});
  r.action = emu::fault_action::add_delay;
  r.delay_ns = 1;
  r.fraction = 0.5;
  emu::fault_injector f({r, r}, 3);
  int both = 0;
  for (std::uint64_t i = 0; i < 10'000; ++i) both += f.decide(read_cmd(i)).extra_delay_ns == 2;
  CHECK(both > 2000);  // about a quarter
  CHECK(both < 3000);
}

// ---- matching -----------------------------------------------------------------------------------

TEST_CASE("a rule with an opcode matches only that opcode") {
  auto r = always(status_rule());
  r.opcode = write_opcode;
  emu::fault_injector f({r}, 1);
  auto c = read_cmd(1);
  CHECK_FALSE(f.decide(c).any());
  c.opcode = write_opcode;
  CHECK(f.decide(c).any());
}

TEST_CASE("an I/O rule skips admin commands and an admin rule skips I/O commands") {
  auto io = always(status_rule());
  auto admin = always(status_rule());
  admin.admin = true;
  admin.status = spec::status::internal_error;
  emu::fault_injector f({io, admin}, 1);
  CHECK(f.decide(read_cmd(1)).status == spec::status::unrecovered_read_error);
  CHECK(f.decide(admin_cmd(1)).status == spec::status::internal_error);
  CHECK(f.fired(0) == 1);
  CHECK(f.fired(1) == 1);
}

TEST_CASE("an admin rule with an opcode matches only that admin command") {
  auto r = always(status_rule());
  r.admin = true;
  r.opcode = 0x06;  // Identify
  emu::fault_injector f({r}, 1);
  CHECK(f.decide(admin_cmd(1, 0x06)).any());
  CHECK_FALSE(f.decide(admin_cmd(2, 0x0a)).any());  // Get Features
}

TEST_CASE("a rule with an sqid matches only that queue") {
  auto r = always(status_rule());
  r.sqid = 2;
  emu::fault_injector f({r}, 1);
  CHECK_FALSE(f.decide(read_cmd(1, 0, 1)).any());
  CHECK(f.decide(read_cmd(1, 0, 2)).any());
  CHECK_FALSE(f.decide(read_cmd(1, 0, 3)).any());
}

TEST_CASE("an LBA range matches commands whose blocks meet it, at either edge") {
  auto r = always(status_rule());
  r.lba_first = 100;
  r.lba_last = 199;
  emu::fault_injector f({r}, 1);
  // 8-block reads: [slba, slba + 7].
  CHECK_FALSE(f.decide(read_cmd(1, 92)).any());  // 92..99 ends just before the range
  CHECK(f.decide(read_cmd(2, 93)).any());        // 93..100 meets its first LBA
  CHECK(f.decide(read_cmd(3, 150)).any());       // inside
  CHECK(f.decide(read_cmd(4, 199)).any());       // 199..206 meets its last LBA
  CHECK_FALSE(f.decide(read_cmd(5, 200)).any()); // 200..207 starts just after it
  auto wide = read_cmd(6, 0);
  wide.nlb = 1000;                                // 0..999 covers it
  CHECK(f.decide(wide).any());
}

TEST_CASE("an LBA range does not match commands without LBAs; the full range does") {
  auto narrow = always(status_rule());
  narrow.lba_last = 1000;
  auto full = always(emu::fault_rule{});
  full.action = emu::fault_action::add_delay;
  full.delay_ns = 10;
  emu::fault_injector f({narrow, full}, 1);
  auto flush = read_cmd(1);
  flush.opcode = 0x00;
  flush.has_lba = false;
  flush.slba = 0;
  flush.nlb = 0;
  const auto d = f.decide(flush);
  CHECK_FALSE(d.status.has_value());
  CHECK(d.extra_delay_ns == 10);
}

TEST_CASE("a command whose blocks run past the last LBA is matched without wrapping") {
  auto r = always(status_rule());
  r.lba_first = 10;
  r.lba_last = 20;
  emu::fault_injector f({r}, 1);
  auto c = read_cmd(1, std::numeric_limits<std::uint64_t>::max() - 2);
  c.nlb = 65536;  // its end would wrap round to 65533, "meeting" 10..20
  CHECK_FALSE(f.decide(c).any());
}

TEST_CASE("all of a rule's conditions must hold together") {
  auto r = always(status_rule());
  r.opcode = write_opcode;
  r.sqid = 2;
  r.lba_first = 100;
  r.lba_last = 199;
  emu::fault_injector f({r}, 1);
  emu::command_view w{.sqid = 2, .cid = 1, .opcode = write_opcode, .sequence = 1, .has_lba = true, .slba = 120, .nlb = 8};
  CHECK(f.decide(w).any());
  auto other = w;
  other.opcode = read_opcode;
  CHECK_FALSE(f.decide(other).any());
  other = w;
  other.sqid = 3;
  CHECK_FALSE(f.decide(other).any());
  other = w;
  other.slba = 300;
  CHECK_FALSE(f.decide(other).any());
}

// ---- limits and combinations --------------------------------------------------------------------------

TEST_CASE("max_fires bounds how often a rule fires") {
  auto r = always(status_rule());
  r.max_fires = 2;
  emu::fault_injector f({r}, 1);
  int hits = 0;
  for (std::uint64_t i = 0; i < 10; ++i) hits += f.decide(read_cmd(i)).any();
  CHECK(hits == 2);
  CHECK(f.fired(0) == 2);
  CHECK(f.counters().statuses == 2);
}

TEST_CASE("max_fires holds exactly when four threads race through a rule") {
  auto r = always(status_rule());
  r.max_fires = 1000;
  emu::fault_injector f({r}, 1);
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (std::uint16_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < 2000; ++i) hits += f.decide(read_cmd(i, 0, static_cast<std::uint16_t>(t + 1))).any();
    });
  }
  for (auto& th : threads) th.join();
  CHECK(hits == 1000);
  CHECK(f.fired(0) == 1000);
}

TEST_CASE("several rules may fire on one command: a delay, a lost completion and a status") {
  emu::fault_rule delay;
  delay.action = emu::fault_action::add_delay;
  delay.delay_ns = 500;
  delay.nth = 1;
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.nth = 1;
  auto status = status_rule();
  status.nth = 1;
  status.dnr = false;
  emu::fault_injector f({delay, lose, status}, 1);
  const auto d = f.decide(read_cmd(1));
  CHECK(d.extra_delay_ns == 500);
  CHECK(d.lose_completion);
  CHECK(d.status == spec::status::unrecovered_read_error);
  CHECK_FALSE(d.dnr);
  CHECK_FALSE(d.controller_fatal);
  CHECK_FALSE(f.decide(read_cmd(2)).any());
}

TEST_CASE("the delays of several firing rules add up") {
  auto a = always(emu::fault_rule{});
  a.action = emu::fault_action::add_delay;
  a.delay_ns = 300;
  auto b = a;
  b.delay_ns = 700;
  emu::fault_injector f({a, b}, 1);
  CHECK(f.decide(read_cmd(1)).extra_delay_ns == 1000);
  CHECK(f.counters().delays == 2);
}

TEST_CASE("the first status rule to fire decides the status; later ones skip the command") {
  auto first = always(status_rule());
  auto second = status_rule();
  second.status = spec::status::write_fault;
  second.nth = 1;
  emu::fault_injector f({first, second}, 1);
  CHECK(f.decide(read_cmd(1)).status == spec::status::unrecovered_read_error);
  CHECK(f.fired(1) == 0);
  CHECK(f.counters().statuses == 1);
}

TEST_CASE("each action is counted under its own counter") {
  auto status = status_rule();
  status.nth = 1;
  emu::fault_rule delay;
  delay.action = emu::fault_action::add_delay;
  delay.delay_ns = 1;
  delay.nth = 2;
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.nth = 3;
  emu::fault_rule fatal;
  fatal.action = emu::fault_action::controller_fatal;
  fatal.nth = 3;
  emu::fault_injector f({status, delay, lose, fatal}, 1);
  CHECK(f.decide(read_cmd(1)).status.has_value());
  CHECK(f.decide(read_cmd(2)).extra_delay_ns == 1);
  const auto third = f.decide(read_cmd(3));
  CHECK(third.lose_completion);
  CHECK(third.controller_fatal);
  const auto c = f.counters();
  CHECK(c.statuses == 1);
  CHECK(c.delays == 1);
  CHECK(c.lost_completions == 1);
  CHECK(c.controller_fatals == 1);
  CHECK(f.fired(0) + f.fired(1) + f.fired(2) + f.fired(3) == 4);
}

TEST_CASE("an injected status carries the rule's DNR bit, set by default") {
  auto r = always(status_rule());
  emu::fault_injector f({r}, 1);
  CHECK(f.decide(read_cmd(1)).dnr);
}

// ---- validation --------------------------------------------------------------------------------------

namespace {

/// The message of the std::invalid_argument that `rules` draw, or "" when they are accepted.
std::string rejection(const std::vector<emu::fault_rule>& rules) {
  try {
    emu::fault_injector f(rules, 1);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

emu::fault_rule valid() {
  auto r = status_rule();
  r.nth = 1;
  return r;
}

}  // namespace

TEST_CASE("valid rules are accepted") {
  CHECK(rejection({valid(), always(status_rule())}).empty());
}

TEST_CASE("a fraction outside [0, 1] is refused, naming the rule") {
  auto r = status_rule();
  r.fraction = 1.5;
  CHECK(rejection({valid(), r}).find("rule 1 has fraction") != std::string::npos);
  r.fraction = -0.1;
  CHECK(rejection({r}).find("rule 0 has fraction") != std::string::npos);
  r.fraction = std::nan("");
  CHECK(rejection({r}).find("rule 0 has fraction") != std::string::npos);
}

TEST_CASE("a rule with both nth and fraction is refused") {
  auto r = status_rule();
  r.nth = 1;
  r.fraction = 0.5;
  CHECK(rejection({valid(), valid(), r}).find("rule 2 sets both nth") != std::string::npos);
}

TEST_CASE("a rule with neither nth nor fraction is refused: it would never fire") {
  CHECK(rejection({status_rule()}).find("rule 0 sets neither nth nor fraction") != std::string::npos);
}

TEST_CASE("complete_with_status without an error status is refused") {
  emu::fault_rule r;
  r.nth = 1;
  CHECK(rejection({r}).find("rule 0 completes with Successful Completion") != std::string::npos);
  r.status = static_cast<spec::status>(0x800);
  CHECK(rejection({r}).find("11-bit") != std::string::npos);
}

TEST_CASE("add_delay without a delay is refused") {
  emu::fault_rule r;
  r.action = emu::fault_action::add_delay;
  r.nth = 1;
  CHECK(rejection({r}).find("rule 0 is add_delay with delay_ns 0") != std::string::npos);
}

TEST_CASE("an LBA range whose first LBA is above its last is refused") {
  auto r = valid();
  r.lba_first = 10;
  r.lba_last = 9;
  CHECK(rejection({r}).find("rule 0 has lba_first 10 above lba_last 9") != std::string::npos);
}

TEST_CASE("an admin rule with an LBA range is refused: admin commands carry no LBAs") {
  auto r = valid();
  r.admin = true;
  r.lba_last = 100;
  CHECK(rejection({r}).find("rule 0 is an admin rule with an LBA range") != std::string::npos);
}

TEST_CASE("a rule with max_fires 0 is refused") {
  auto r = valid();
  r.max_fires = 0;
  CHECK(rejection({r}).find("rule 0 has max_fires 0") != std::string::npos);
}

TEST_CASE("a rule with an unknown action is refused") {
  auto r = valid();
  r.action = static_cast<emu::fault_action>(9);
  CHECK(rejection({r}).find("rule 0 has unknown action 9") != std::string::npos);
}

TEST_CASE("asking how often a missing rule fired is an error") {
  CHECK_THROWS_AS((void)emu::fault_injector().fired(0), std::out_of_range);
  emu::fault_injector f({valid()}, 1);
  CHECK(f.fired(0) == 0);
  CHECK_THROWS_WITH_AS((void)f.fired(1), doctest::Contains("no rule 1"), std::out_of_range);
}

TEST_CASE("the usage snippet of fault_injector compiles and behaves as described") {
  emu::fault_rule fail_third_read{.opcode = 0x02, .nth = 3};
  fail_third_read.status = spec::status::unrecovered_read_error;
  emu::fault_injector faults({fail_third_read}, /*seed=*/42);
  int failed = 0;
  for (std::uint16_t i = 0; i < 5; ++i) {
    const auto d = faults.decide(emu::command_view{.sqid = 1, .cid = i, .opcode = 0x02, .sequence = i});
    failed += d.status.has_value();
  }
  CHECK(failed == 1);
}
