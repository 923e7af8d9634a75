// The timing model decides completion times; no wall clock is involved.
#include <cunvme/emu/timing_model.cuh>

#include <doctest/doctest.h>

#include <thread>
#include <vector>

namespace emu = cunvme::emu;

TEST_CASE("with no model, commands are due immediately") {
  emu::timing_scheduler s(emu::timing_model::none());
  CHECK_FALSE(s.model().enabled());
  CHECK(s.due_ns(1000, 4096, false) == 1000);
}

TEST_CASE("at low load a command completes after its fixed latency plus its bytes") {
  emu::timing_model m;
  m.read_latency_ns = 80'000;
  m.write_latency_ns = 20'000;
  m.ns_per_byte = 0.5;
  emu::timing_scheduler s(m);
  CHECK(s.due_ns(1'000'000, 4096, false) == 1'000'000 + 80'000 + 2048);
  CHECK(s.due_ns(2'000'000, 0, true) == 2'000'000 + 20'000);
}

TEST_CASE("an IOPS cap spaces completions: 1000 commands at once end 1 ms later at 1 M IOPS") {
  emu::timing_model m;
  m.max_iops = 1e6;
  emu::timing_scheduler s(m);
  std::uint64_t last = 0;
  for (int i = 0; i < 1000; ++i) last = s.due_ns(0, 4096, false);
  CHECK(last == 1'000'000);
  // Once the device has caught up, a new command is not held back.
  CHECK(s.due_ns(5'000'000, 4096, false) == 5'001'000);
}

TEST_CASE("a bandwidth cap charges each command its bytes") {
  emu::timing_model m;
  m.max_bytes_per_second = 1e9;  // 1 byte per ns
  emu::timing_scheduler s(m);
  CHECK(s.due_ns(0, 1 << 20, false) == 1 << 20);
  CHECK(s.due_ns(0, 1 << 20, false) == 2u << 20);
}

TEST_CASE("latency and throughput limits combine: the later of the two wins") {
  auto m = emu::timing_model::datacenter_gen4();
  emu::timing_scheduler s(m);
  std::uint64_t first = s.due_ns(0, 4096, false);
  CHECK(first == 80'000);
  std::uint64_t last = 0;
  for (int i = 0; i < 299; ++i) last = s.due_ns(0, 4096, false);
  CHECK(last == 300u * 667u);  // 300 commands at 667 ns each: 200 us > 80 us
}

TEST_CASE("the presets carry their documented numbers") {
  constexpr auto tlc = emu::timing_model::gen4_tlc();
  static_assert(tlc.read_latency_ns == 80'000 && tlc.max_iops == 1e6 && tlc.max_bytes_per_second == 7e9);
  constexpr auto dc = emu::timing_model::datacenter_gen4();
  static_assert(dc.max_iops == 1.5e6 && dc.read_latency_ns == 80'000);
  constexpr auto scm = emu::timing_model::scm();
  static_assert(scm.read_latency_ns == 10'000 && scm.max_iops == 5e6 && scm.max_bytes_per_second == 10e9);
  CHECK(tlc.enabled());
}

TEST_CASE("presets are found by name and unknown names are not") {
  CHECK(emu::timing_preset("gen4-tlc")->max_iops == 1e6);
  CHECK(emu::timing_preset("scm")->read_latency_ns == 10'000);
  CHECK(emu::timing_preset("datacenter-gen4").has_value());
  CHECK_FALSE(emu::timing_preset("none")->enabled());
  CHECK_FALSE(emu::timing_preset("floppy").has_value());
}

TEST_CASE("concurrent callers never get the same reservation") {
  emu::timing_model m;
  m.max_iops = 1e9;  // 1 ns per command
  emu::timing_scheduler s(m);
  std::vector<std::vector<std::uint64_t>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) seen[t].push_back(s.due_ns(0, 0, false));
    });
  }
  for (auto& th : threads) th.join();
  std::vector<std::uint64_t> all;
  for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.back() == 40000);
}
