// The JSON records of cunvme_bench and file_peers (bench/*_report.hpp): a good run's record holds
// the fields bench/sweep.py and bench/plot.py read; a failed run's holds "error" and no figure.
#include "cunvme_bench_report.hpp"
#include "file_peers_report.hpp"
#include "queue_probe.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bench = cunvme::bench;
namespace cb = bench::cunvme_bench;
namespace fp = bench::file_peers;

namespace {

/// The fields that are figures: a failed run's record holds none of them.
const std::vector<std::string> bench_figures = {"seconds", "ops", "iops", "gb_per_s", "lat_ns", "timer_step_ns", "cpu_seconds", "cpu_s_per_million_ios",
                                                "sm_seconds", "sm_us_per_command", "hist"};

cb::options verified_reads() {
  cb::options o;
  o.device = "emu:pattern";
  o.verify = true;
  o.time = 2;
  return o;
}

/// A run in which 1000 reads of 4 KiB completed in 0.5 s, all verified.
cb::measurement clean_run() {
  cb::measurement m;
  m.seconds = 0.5;
  m.ops = 1000;
  m.bytes = 1000 * 4096;
  m.latency = {15600.4, 20100, 31000, 16000.6};
  m.max_ns = 40000;
  m.histogram = {{15360, 600}, {16384, 400}};
  m.timer_step_ns = 32;
  m.emulated = true;
  m.cpu_seconds = 0.25;
  m.emulator_commands = 1000;
  m.sms_busy = 4;
  m.sm_count = 132;
  return m;
}

const cb::run_context ran{"2026-11-25T10:00:00Z", "NVIDIA H100 80GB HBM3", 2, {"a note"}};

void check_no_bench_figure(const bench::json& record) {
  for (const std::string& figure : bench_figures) {
    CAPTURE(figure);
    CHECK_FALSE(record.contains(figure));
  }
}

fp::outcome ran_ok(const std::string& name, std::vector<double> runs) {
  fp::outcome r;
  r.name = name;
  r.runs = std::move(runs);
  r.checksum = 0x0123456789abcdefull;
  return r;
}

const fp::run_context file_run{"2026-11-25T10:00:00Z", "NVIDIA H100 80GB HBM3", std::uint64_t{1} << 30, 1.0};

fp::options file_options() {
  fp::options o;
  o.file = "/data/big.bin";
  return o;
}

}  // namespace

// ---- cunvme_bench --------------------------------------------------------------------------------

TEST_CASE("a clean run's record holds the fields sweep.py and plot.py read") {
  const bench::json r = cb::report(verified_reads(), ran, clean_run());
  CHECK_FALSE(r.contains("error"));
  CHECK(r["tool"] == "cunvme_bench");
  CHECK(r["gpu"] == "NVIDIA H100 80GB HBM3");
  CHECK(r["threads"] == 1024);
  CHECK(r["bs"] == 4096);
  CHECK(r["tier"] == 2);
  CHECK(r["verify"] == true);
  CHECK(r["iops"] == 2000.0);
  CHECK(r["gb_per_s"] == 0.0082);
  CHECK(r["errors"] == 0);
  CHECK(r["lat_ns"]["p50"] == 15600);
  CHECK(r["lat_ns"]["p99"] == 20100);
  CHECK(r["lat_ns"]["p999"] == 31000);
  CHECK(r["lat_ns"]["mean"] == 16001);
  CHECK(r["lat_ns"]["max"] == 40000);
  CHECK(r["cpu_s_per_million_ios"] == 250.0);
  // The GPU time the I/O took: 4 SMs for 0.5 s over 1000 commands.
  CHECK(r["sms_busy"] == 4);
  CHECK(r["sm_count"] == 132);
  CHECK(r["sm_seconds"] == 2.0);
  CHECK(r["sm_us_per_command"] == 2000.0);
  CHECK(r["emulator_commands"] == 1000);
  CHECK(r["first_error"] == "");
  CHECK(r["notes"] == bench::json::array({"a note"}));
  CHECK(r["hist"] == bench::json::parse("[[15360,600],[16384,400]]"));
}

TEST_CASE("a clean run's record reads in the order of the configuration, then the figures") {
  const std::string line = bench::one_line(cb::report(verified_reads(), ran, clean_run()));
  CHECK(line.rfind(R"({"tool":"cunvme_bench","date":"2026-11-25T10:00:00Z","gpu":)", 0) == 0);
  CHECK(line.find(R"("seconds":0.5,"ops":1000,"iops":2000.0,)") != std::string::npos);
}

TEST_CASE("a clean run has no failure") { CHECK(cb::failure(clean_run()).empty()); }

TEST_CASE("a run with failed commands reports an error and no figure") {
  cb::measurement m = clean_run();
  m.errors = 3;
  m.timeouts = 1;
  m.first_error = "timeout, NVMe status 0";
  const bench::json r = cb::report(verified_reads(), ran, m);
  REQUIRE(r.contains("error"));
  CHECK(r["error"].get<std::string>().find("3 commands failed") != std::string::npos);
  CHECK(r["error"].get<std::string>().find("timeout, NVMe status 0") != std::string::npos);
  CHECK(r["errors"] == 3);
  CHECK(r["timeouts"] == 1);
  check_no_bench_figure(r);
}

TEST_CASE("a run whose reads did not verify reports an error and no figure") {
  cb::measurement m = clean_run();
  m.mismatches = 2;
  const bench::json r = cb::report(verified_reads(), ran, m);
  REQUIRE(r.contains("error"));
  CHECK(r["error"].get<std::string>().find("--verify") != std::string::npos);
  CHECK(r["mismatches"] == 2);
  check_no_bench_figure(r);
}

TEST_CASE("a run in which no command completed reports an error and no figure") {
  cb::measurement m = clean_run();
  m.ops = m.bytes = 0;
  m.histogram.clear();
  const bench::json r = cb::report(verified_reads(), ran, m);
  CHECK(r["error"] == "no command completed");
  check_no_bench_figure(r);
}

TEST_CASE("a run in which the emulator saw the protocol broken reports an error and no figure") {
  cb::measurement m = clean_run();
  m.emulator_dma_faults = 5;
  const bench::json r = cb::report(verified_reads(), ran, m);
  REQUIRE(r.contains("error"));
  CHECK(r["error"].get<std::string>().find("faulted 5 DMA accesses") != std::string::npos);
  CHECK(r["emulator_dma_faults"] == 5);
  check_no_bench_figure(r);
}

TEST_CASE("the record of a run that threw holds the command line's configuration and the error") {
  const bench::json r = cb::error_report(verified_reads(), "2026-11-25T10:00:00Z", "run the I/O kernel: an illegal memory access was encountered");
  CHECK(r["tool"] == "cunvme_bench");
  CHECK(r["device"] == "emu:pattern");
  CHECK(r["error"] == "run the I/O kernel: an illegal memory access was encountered");
  check_no_bench_figure(r);
}

TEST_CASE("the record of a baseline that threw names the baseline") {
  cb::options o;
  o.baseline = "h2d";
  const bench::json r = cb::error_report(o, "2026-11-25T10:00:00Z", "copy: out of memory");
  CHECK(r["baseline"] == "h2d");
  CHECK(r["error"] == "copy: out of memory");
  CHECK_FALSE(r.contains("gb_per_s"));
}

// ---- --probe: where a queue pair's commands wait ---------------------------------------------------

namespace {

/// A CQ of `entries` slots, each with the phase tag a controller on pass `lap` of it would leave.
std::vector<cunvme::spec::completion_entry> cq_with_phases(std::uint32_t entries, const std::vector<bool>& phases) {
  std::vector<cunvme::spec::completion_entry> cq(entries);
  for (std::uint32_t i = 0; i < entries; ++i) cq[i].status_field = phases[i] ? 1 : 0;
  return cq;
}

std::vector<cunvme::completion_record> records_in(std::uint32_t cids, std::uint32_t reserved, std::uint32_t done, std::uint32_t pending,
                                                  std::uint32_t delivering = 0) {
  std::vector<cunvme::completion_record> records(cids);
  std::uint32_t at = 0;
  for (std::uint32_t i = 0; i < reserved; ++i) records[at++].state = static_cast<std::uint32_t>(cunvme::record_state::reserved);
  for (std::uint32_t i = 0; i < done; ++i) records[at++].state = static_cast<std::uint32_t>(cunvme::record_state::done);
  for (std::uint32_t i = 0; i < pending; ++i) records[at++].state = static_cast<std::uint32_t>(cunvme::record_state::pending);
  for (std::uint32_t i = 0; i < delivering; ++i) records[at++].state = static_cast<std::uint32_t>(cunvme::record_state::delivering);
  return records;
}

}  // namespace

TEST_CASE("the probe sorts a queue pair's commands into the stages they wait in") {
  cunvme::queue_counters c{};
  c.sq_reserved = 20;
  c.sq_rung = 17;
  c.cq_head = 5;
  // CQ of 16 on its first pass: slots 5..7 posted (phase 1), slot 8 not yet (phase 0).
  std::vector<bool> phases(16, false);
  for (int i = 0; i < 8; ++i) phases[i] = true;
  // 17 commands submitted (16 pending, 1 being written into its record): 3 unrung, 9 at the
  // device, 3 unread, so 2 were consumed by a drain and are being delivered.
  const bench::queue_stages s = bench::classify(c, records_in(31, 2, 3, 16, 1), cq_with_phases(16, phases));
  CHECK(s.waiting_for_slot == 2);
  CHECK(s.unrung == 3);
  CHECK(s.cq_unread == 3);
  CHECK(s.at_device == 17 - 5 - 3);
  CHECK(s.being_delivered == 2);
  CHECK(s.record_untaken == 3);
  CHECK(s.total() == 2 + 3 + 9 + 3 + 2 + 3);
}

TEST_CASE("the probe counts unread CQEs across the end of the CQ by the next pass's phase, at most entries - 1") {
  // CQ of 4, head at count 3 (slot 3, pass 0: phase 1), then slots 0, 1, 2 on pass 1 (phase 0).
  CHECK(bench::unread_cqes(cq_with_phases(4, {false, true, true, true}), 3) == 2);  // slot 3, then slot 0; slot 1 still holds pass 0's phase
  CHECK(bench::unread_cqes(cq_with_phases(4, {false, false, false, true}), 3) == 3);  // slots 3, 0, 1: a full CQ holds 3
  CHECK(bench::unread_cqes(cq_with_phases(4, {true, true, true, false}), 3) == 0);
  CHECK(bench::unread_cqes(cq_with_phases(4, {false, false, false, false}), 4) == 3);  // pass 1 from slot 0
}

TEST_CASE("a snapshot taken while commands move never puts a negative count in a stage") {
  cunvme::queue_counters c{};
  c.sq_reserved = 10;
  c.sq_rung = 12;  // copied after more tickets were rung than the reservation copied before them
  c.cq_head = 11;
  const bench::queue_stages s = bench::classify(c, records_in(15, 0, 0, 0), cq_with_phases(16, std::vector<bool>(16, true)));
  CHECK(s.unrung == 0);
  CHECK(s.cq_unread == 5);  // slots 11..15 hold the phase of pass 0
  CHECK(s.at_device == 0);  // 12 rung − 11 consumed − 5 unread < 0
  CHECK(s.being_delivered == 0);  // no record is pending
}

TEST_CASE("a probed run's record holds each stage per queue pair and in microseconds per command") {
  cb::measurement m = clean_run();  // 1000 reads in 0.5 s
  m.queues = 4;                     // 500 commands a second each
  m.probed_queues = 2;
  m.probe_samples = 5;
  m.stages.at_device = 100;  // 10 per queue pair and snapshot
  m.stages.cq_unread = 20;
  const bench::json r = cb::report(verified_reads(), ran, m);
  REQUIRE(r.contains("stages"));
  CHECK(r["stages"]["queues_probed"] == 2);
  CHECK(r["stages"]["samples"] == 5);
  CHECK(r["stages"]["commands_per_queue"]["at_device"] == 10.0);
  CHECK(r["stages"]["commands_per_queue"]["cq_unread"] == 2.0);
  CHECK(r["stages"]["commands_per_queue"]["unrung"] == 0.0);
  CHECK(r["stages"]["commands_per_queue"]["being_delivered"] == 0.0);
  CHECK(r["stages"]["us_per_command"]["at_device"] == 20000.0);  // 10 / 500 per second
  CHECK(r["stages"]["us_per_command"]["cq_unread"] == 4000.0);
  CHECK_FALSE(r.contains("probe_error"));
}

TEST_CASE("a failed run's record holds no stages, and a probe that stopped says why") {
  cb::measurement m = clean_run();
  m.queues = 4;
  m.probed_queues = 2;
  m.probe_samples = 5;
  m.stages.at_device = 100;
  m.errors = 1;
  m.probe_error = "the probe could not copy the queues' bookkeeping: invalid argument";
  const bench::json r = cb::report(verified_reads(), ran, m);
  CHECK_FALSE(r.contains("stages"));
  CHECK(r["probe_error"] == m.probe_error);
}

TEST_CASE("the baselines' records hold the fields plot.py reads") {
  const bench::json h2d = cb::h2d_report("2026-11-25T10:00:00Z", "H100", std::uint64_t{8} << 30, 256u << 20, 0.16);
  CHECK(h2d["baseline"] == "h2d");
  CHECK(h2d["gb_per_s"] == 53.6871);
  const bench::json pingpong = cb::pingpong_report("2026-11-25T10:00:00Z", "H100", 100000, 1500.4, 2100.6, 1600);
  CHECK(pingpong["rtt_ns"]["p50"] == 1500);
  CHECK(pingpong["rtt_ns"]["p99"] == 2101);
}

TEST_CASE("a record with text that is not UTF-8 prints with the bytes replaced") {
  cb::options o = verified_reads();
  o.device = "emu:file=/data/\xff.bin";
  CHECK(bench::one_line(cb::error_report(o, "", "x")).find("\xef\xbf\xbd") != std::string::npos);  // U+FFFD
}

// ---- file_peers ----------------------------------------------------------------------------------

TEST_CASE("file_peers' record of a clean run holds every method's figures and the ratio") {
  const std::vector<fp::outcome> results = {ran_ok("cunvme", {0.1, 0.2, 0.3}), ran_ok("pread", {0.4, 0.5})};
  const bench::json r = fp::report(file_options(), file_run, results);
  CHECK_FALSE(r.contains("error"));
  CHECK(r["tool"] == "file_peers");
  CHECK(r["page_cache_warm"] == true);
  REQUIRE(r["methods"].size() == 2);
  CHECK(r["methods"][0]["seconds"] == 0.1);
  CHECK(r["methods"][0]["median_gb_per_s"] == 5.3687);
  CHECK(r["methods"][0]["checksum"] == "0123456789abcdef");
  CHECK(r["methods"][1]["gb_per_s"] == 2.6844);
  CHECK(r["best_peer"] == "pread");
  CHECK(r["cunvme_over_best_peer"] == 4.0);
}

TEST_CASE("file_peers' record of a clean run with cuFile unable to run has null figures for cuFile") {
  fp::outcome cufile;
  cufile.name = "cufile";
  cufile.status = "failed";
  cufile.reason = "cuFileDriverOpen: CU_FILE_DRIVER_NOT_INITIALIZED";
  const bench::json r = fp::report(file_options(), file_run, {ran_ok("cunvme", {0.1}), cufile});
  CHECK_FALSE(r.contains("error"));
  CHECK(r["methods"][1]["gb_per_s"].is_null());
  CHECK(r["best_peer"].is_null());
  CHECK(r["cunvme_over_best_peer"].is_null());
}

TEST_CASE("file_peers' record of a run with wrong bytes reports an error and no figure") {
  fp::outcome wrong;
  wrong.name = "cunvme";
  wrong.status = "failed";
  wrong.reason = "checksum 0000000000000001 on the GPU after run 1, the file's is 0000000000000002";
  wrong.fails_the_run = true;
  const bench::json r = fp::report(file_options(), file_run, {wrong, ran_ok("pread", {0.4})});
  REQUIRE(r.contains("error"));
  CHECK(r["error"].get<std::string>().find("cunvme failed: checksum") != std::string::npos);
  CHECK_FALSE(r.contains("best_peer"));
  CHECK_FALSE(r.contains("cunvme_over_best_peer"));
  for (const auto& method : r["methods"]) {
    CHECK_FALSE(method.contains("seconds"));
    CHECK_FALSE(method.contains("gb_per_s"));
    CHECK_FALSE(method.contains("median_gb_per_s"));
  }
  CHECK(r["methods"][0]["reason"] == wrong.reason);
}
