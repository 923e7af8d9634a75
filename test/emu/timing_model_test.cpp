// The timing model decides completion times from synthetic arrival times; no clock is read.
#include <cunvme/emu/timing_model.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace emu = cunvme::emu;

TEST_CASE("with no model, a command is due when it arrives") {
  emu::timing_scheduler s(emu::timing_model::none());
  CHECK(s.due_ns(1000, 4096, false) == 1000);
  CHECK(s.due_ns(1000, 1 << 20, true) == 1000);
}

TEST_CASE("a model is enabled when any of its numbers is non-zero") {
  CHECK_FALSE(emu::timing_model{}.enabled());
  CHECK(emu::timing_model{.read_latency_ns = 1}.enabled());
  CHECK(emu::timing_model{.write_latency_ns = 1}.enabled());
  CHECK(emu::timing_model{.ns_per_byte = 0.1}.enabled());
  CHECK(emu::timing_model{.max_iops = 1}.enabled());
  CHECK(emu::timing_model{.max_bytes_per_second = 1}.enabled());
}

TEST_CASE("at low load a read or a write completes after its own latency plus its bytes") {
  const emu::timing_model m{.read_latency_ns = 80'000, .write_latency_ns = 20'000, .ns_per_byte = 0.5};
  emu::timing_scheduler s(m);
  CHECK(s.model() == m);
  CHECK(s.due_ns(1'000'000, 4096, false) == 1'000'000 + 80'000 + 2048);
  CHECK(s.due_ns(2'000'000, 4096, true) == 2'000'000 + 20'000 + 2048);
  CHECK(s.due_ns(3'000'000, 0, true) == 3'000'000 + 20'000);
}

TEST_CASE("an IOPS cap spaces commands that arrive together: 1000 at 1 M IOPS end after 1 ms") {
  emu::timing_scheduler s(emu::timing_model{.max_iops = 1e6});
  std::vector<std::uint64_t> due;
  for (int i = 0; i < 1000; ++i) due.push_back(s.due_ns(0, 4096, false));
  CHECK(due.front() == 1'000);
  CHECK(due.back() == 1'000'000);
  for (std::size_t i = 1; i < due.size(); ++i) {
    if (due[i] - due[i - 1] != 1'000) FAIL("command " << i << " is due " << due[i] - due[i - 1] << " ns after the one before");
  }
}

TEST_CASE("an idle device does not hold back a new command") {
  emu::timing_scheduler s(emu::timing_model{.read_latency_ns = 10'000, .max_iops = 1e6});
  for (int i = 0; i < 100; ++i) (void)s.due_ns(0, 4096, false);  // busy until 100 us
  CHECK(s.due_ns(5'000'000, 4096, false) == 5'010'000);
}

TEST_CASE("commands below the caps complete after their latency, however many arrive") {
  // 1 M IOPS, one command per 2 us: the device never falls behind.
  emu::timing_scheduler s(emu::timing_model{.read_latency_ns = 80'000, .max_iops = 1e6});
  for (std::uint64_t t = 0; t < 2'000'000; t += 2'000) {
    if (s.due_ns(t, 4096, false) != t + 80'000) FAIL("command at " << t << " held back");
  }
}

TEST_CASE("a bandwidth cap charges each command its bytes") {
  emu::timing_scheduler s(emu::timing_model{.max_bytes_per_second = 1e9});  // a byte per ns
  CHECK(s.due_ns(0, 1 << 20, false) == 1 << 20);
  CHECK(s.due_ns(0, 1 << 20, true) == 2u << 20);
  CHECK(s.due_ns(0, 512, false) == (2u << 20) + 512);
}

TEST_CASE("each command pays the larger of its IOPS cost and its bandwidth cost") {
  // 1 us per command; 4 KiB costs 4.096 us of bandwidth, 512 B only 0.512 us.
  emu::timing_scheduler s(emu::timing_model{.max_iops = 1e6, .max_bytes_per_second = 1e9});
  CHECK(s.due_ns(0, 4096, false) == 4'096);
  CHECK(s.due_ns(0, 512, false) == 4'096 + 1'000);
}

TEST_CASE("a command is due at the later of its latency and the end of its reservation") {
  emu::timing_scheduler s(emu::timing_model{.read_latency_ns = 80'000, .max_iops = 1e6});
  std::vector<std::uint64_t> due;
  for (int i = 0; i < 200; ++i) due.push_back(s.due_ns(0, 4096, false));
  CHECK(due[0] == 80'000);    // latency-bound
  CHECK(due[79] == 80'000);   // reservation ends at 80 us: a tie
  CHECK(due[80] == 81'000);   // throughput-bound from here
  CHECK(due[199] == 200'000);
}

TEST_CASE("a fractional per-command cost does not drift: 150 k commands at 1.5 M IOPS take 100 ms") {
  emu::timing_scheduler s(emu::timing_model::datacenter_gen4());
  std::uint64_t last = 0;
  for (int i = 0; i < 150'000; ++i) last = s.due_ns(0, 4096, false);
  // Whole-nanosecond costs would give 667 ns each, 100.05 ms; the timeline keeps 1/16 ns.
  CHECK(std::fabs(static_cast<double>(last) - 100e6) < 100e6 * 1e-4);
}

TEST_CASE("concurrent callers each get their own reservation") {
  emu::timing_scheduler s(emu::timing_model{.max_iops = 1e9});  // 1 ns per command
  std::vector<std::vector<std::uint64_t>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10'000; ++i) seen[t].push_back(s.due_ns(0, 0, false));
    });
  }
  for (auto& th : threads) th.join();
  std::vector<std::uint64_t> all;
  for (const auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.front() == 1);
  CHECK(all.back() == 40'000);
}

TEST_CASE("extreme sizes and times saturate instead of wrapping") {
  constexpr auto max = std::numeric_limits<std::uint64_t>::max();
  emu::timing_scheduler slow(emu::timing_model{.read_latency_ns = 1000, .ns_per_byte = 1e9, .max_bytes_per_second = 1});
  const std::uint64_t now = 1'000'000;
  CHECK(slow.due_ns(now, max, false) > now);
  CHECK(slow.due_ns(now, max, false) > now);
  emu::timing_scheduler latency(emu::timing_model{.read_latency_ns = max});
  CHECK(latency.due_ns(now, 0, false) == max);
}

TEST_CASE("a model with a negative, infinite or NaN rate is refused, naming the field") {
  CHECK_THROWS_WITH_AS(emu::timing_scheduler(emu::timing_model{.max_iops = -1}), doctest::Contains("max_iops"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(emu::timing_scheduler(emu::timing_model{.ns_per_byte = std::nan("")}),
                       doctest::Contains("ns_per_byte"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      emu::timing_scheduler(emu::timing_model{.max_bytes_per_second = std::numeric_limits<double>::infinity()}),
      doctest::Contains("max_bytes_per_second"), std::invalid_argument);
}

TEST_CASE("the presets carry their documented numbers") {
  static_assert(emu::timing_model::none() == emu::timing_model{});
  constexpr auto tlc = emu::timing_model::gen4_tlc();
  static_assert(tlc.read_latency_ns == 80'000 && tlc.write_latency_ns == 20'000 && tlc.ns_per_byte == 0 &&
                tlc.max_iops == 1e6 && tlc.max_bytes_per_second == 7e9);
  constexpr auto dc = emu::timing_model::datacenter_gen4();
  static_assert(dc.read_latency_ns == 80'000 && dc.write_latency_ns == 20'000 && dc.ns_per_byte == 0 &&
                dc.max_iops == 1.5e6 && dc.max_bytes_per_second == 6.2e9);
  constexpr auto scm = emu::timing_model::scm();
  static_assert(scm.read_latency_ns == 10'000 && scm.write_latency_ns == 10'000 && scm.ns_per_byte == 0 &&
                scm.max_iops == 5e6 && scm.max_bytes_per_second == 10e9);
  CHECK_FALSE(emu::timing_model::none().enabled());
  CHECK(tlc.enabled());
  CHECK(dc.enabled());
  CHECK(scm.enabled());
}

TEST_CASE("the presets reach their rated IOPS with 4 KiB reads, and scm with 512 B reads") {
  // 10 ms of commands all arriving at once: the last is due at count / IOPS.
  auto last_due = [](emu::timing_model m, std::uint64_t bytes, int count) {
    emu::timing_scheduler s(m);
    std::uint64_t last = 0;
    for (int i = 0; i < count; ++i) last = s.due_ns(0, bytes, false);
    return static_cast<double>(last);
  };
  CHECK(last_due(emu::timing_model::gen4_tlc(), 4096, 10'000) == doctest::Approx(10e6).epsilon(1e-3));
  CHECK(last_due(emu::timing_model::datacenter_gen4(), 4096, 15'000) == doctest::Approx(10e6).epsilon(1e-3));
  CHECK(last_due(emu::timing_model::scm(), 512, 50'000) == doctest::Approx(10e6).epsilon(1e-3));
  // Large reads hit the bandwidth cap instead: 7 GB/s moves 70 MB in 10 ms.
  CHECK(last_due(emu::timing_model::gen4_tlc(), 1 << 20, 67) == doctest::Approx(67.0 * (1 << 20) / 7.0).epsilon(1e-3));
}

TEST_CASE("presets are found by their names and only by them") {
  CHECK(emu::timing_preset("none") == emu::timing_model::none());
  CHECK(emu::timing_preset("gen4-tlc") == emu::timing_model::gen4_tlc());
  CHECK(emu::timing_preset("datacenter-gen4") == emu::timing_model::datacenter_gen4());
  CHECK(emu::timing_preset("scm") == emu::timing_model::scm());
  CHECK_FALSE(emu::timing_preset("floppy").has_value());
  CHECK_FALSE(emu::timing_preset("").has_value());
  CHECK_FALSE(emu::timing_preset("SCM").has_value());
  CHECK_FALSE(emu::timing_preset("gen4_tlc").has_value());
}
