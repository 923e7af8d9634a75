// cunvme_bench's JSON reports (one object a run, read by bench/sweep.py and bench/plot.py), and
// the rule that a run whose commands failed or whose data did not verify reports no figure.
// Plain C++ (no CUDA): the bench suite (test/bench/report_test.cpp) runs it on any machine.
#pragma once

#include "cunvme_bench_options.hpp"
#include "json_record.hpp"
#include "queue_probe.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace bench::cunvme_bench {

struct latency_summary {
  double p50 = 0, p99 = 0, p999 = 0, mean = 0;  ///< nanoseconds, from the histogram (±3 %)
};

/// What one I/O run measured: the kernel's counters as the host read them back, and the
/// emulators' own view of trouble.
struct measurement {
  double seconds = 0;      ///< the I/O kernel, by CUDA events
  double cpu_seconds = 0;  ///< this process's CPU time meanwhile: the emulators' workers
  std::uint64_t ops = 0, bytes = 0;  ///< commands that completed successfully, and their bytes
  std::uint64_t errors = 0, timeouts = 0;  ///< commands that failed; timeouts among them
  std::uint64_t mismatches = 0;            ///< words of successful reads that were not the namespace's (--verify)
  std::string first_error;                 ///< the first failed command's error and NVMe status; "" when none failed
  latency_summary latency;
  std::uint64_t max_ns = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> histogram;  ///< (lowest ns of a bin, commands), bins that have any
  std::uint64_t timer_step_ns = 0;  ///< the smallest step of %globaltimer on this GPU
  bool emulated = false;            ///< the devices were emulators: the counts below are theirs
  std::uint64_t emulator_commands = 0, emulator_doorbell_errors = 0, emulator_dma_faults = 0, emulator_completions_dropped = 0;
  // --probe: the stage counts summed over every probed queue pair and snapshot (queue_probe.hpp).
  queue_stages stages;
  std::uint64_t probe_samples = 0;     ///< snapshots of each probed queue pair
  unsigned probed_queues = 0, queues = 0;
  std::string probe_error;             ///< why the probe stopped ("" when it did not)

  /// The GPU time the I/O took: `sms_busy` SMs (those the I/O kernel's blocks occupied, of
  /// `sm_count`) for the kernel's whole run, over the commands: an upper bound of what a user
  /// pays in SM time per command (the null controller's own SMs are the drive's, not counted).
  unsigned sms_busy = 0, sm_count = 0;

  [[nodiscard]] double iops() const { return ops / seconds; }
  [[nodiscard]] double sm_seconds() const { return seconds * sms_busy; }
  [[nodiscard]] double sm_us_per_command() const { return ops != 0 ? sm_seconds() / static_cast<double>(ops) * 1e6 : 0; }
  [[nodiscard]] double gb_per_s() const { return bytes / seconds / 1e9; }
  [[nodiscard]] double cpu_s_per_million_ios() const { return emulator_commands != 0 ? cpu_seconds / (emulator_commands / 1e6) : 0; }
  /// The mean commands of one probed queue pair in each stage.
  [[nodiscard]] queue_stages stages_per_queue() const {
    const double n = static_cast<double>(probe_samples) * probed_queues;
    queue_stages s = stages;
    for (double* v : s.stages()) *v = n != 0 ? *v / n : 0;
    return s;
  }
  /// The mean microseconds a command spends in each stage (Little's law, the queue pairs sharing
  /// the commands evenly: each completes iops / queues a second).
  [[nodiscard]] queue_stages stage_microseconds() const {
    queue_stages s = stages_per_queue();
    const double per_queue = queues != 0 && seconds > 0 ? iops() / queues : 0;
    for (double* v : s.stages()) *v = per_queue != 0 ? *v / per_queue * 1e6 : 0;
    return s;
  }
};

/// What a run ran on.
struct run_context {
  std::string date, gpu;
  unsigned tier = 0;  ///< the tier in effect (the null controller's is 3 whatever --tier says)
  std::vector<std::string> notes;
};

/// Why a run's figures cannot be trusted, or "" when they can: a command failed, a read did not
/// hold the namespace's data, nothing completed, or an emulator saw the protocol broken (a bad
/// doorbell value, DMA outside every buffer, a completion for no command in flight).
[[nodiscard]] inline std::string failure(const measurement& m) {
  std::string why;
  const auto add = [&why](const std::string& reason) { why += (why.empty() ? "" : "; ") + reason; };
  if (m.errors != 0) add(std::to_string(m.errors) + " commands failed (" + std::to_string(m.timeouts) + " timed out; the first: " + m.first_error + ")");
  if (m.mismatches != 0) add(std::to_string(m.mismatches) + " words read did not hold the namespace's data (--verify)");
  if (m.ops == 0 && m.errors == 0) add("no command completed");
  if (m.emulated && m.emulator_doorbell_errors + m.emulator_dma_faults + m.emulator_completions_dropped != 0) {
    add("the emulator rejected " + std::to_string(m.emulator_doorbell_errors) + " doorbell writes, faulted " + std::to_string(m.emulator_dma_faults) +
        " DMA accesses and dropped " + std::to_string(m.emulator_completions_dropped) + " completions");
  }
  return why;
}

namespace detail {

/// A latency in whole nanoseconds: the finest step %globaltimer has.
[[nodiscard]] inline std::int64_t whole(double value) { return std::llround(value); }

[[nodiscard]] inline json stage_fields(const queue_stages& s, int decimals) {
  return json{{"waiting_for_slot", rounded(s.waiting_for_slot, decimals)}, {"unrung", rounded(s.unrung, decimals)},
              {"at_device", rounded(s.at_device, decimals)}, {"cq_unread", rounded(s.cq_unread, decimals)},
              {"being_delivered", rounded(s.being_delivered, decimals)}, {"record_untaken", rounded(s.record_untaken, decimals)}};
}

}  // namespace detail

/// The run as the command line asked for it: the first fields of every I/O run's record.
[[nodiscard]] inline json configuration(const options& o, const run_context& ran) {
  return json{{"tool", "cunvme_bench"}, {"date", ran.date}, {"gpu", ran.gpu}, {"device", o.device}, {"devices", o.devices},
              {"rw", o.rw}, {"bs", o.bs}, {"qd", o.qd}, {"threads", o.threads}, {"block_threads", o.block_threads},
              {"queues", o.queues}, {"entries", o.entries}, {"slots", o.slots}, {"completion", o.completion},
              {"doorbell", o.doorbell}, {"tier", ran.tier}, {"verify", o.verify}, {"volume", o.volume}, {"stripe", o.stripe}};
}

/// An I/O run's record: its figures (IOPS, bandwidth, latency and its histogram) when it
/// succeeded; "error" and the counts that say what went wrong, and no figure, when it did not.
[[nodiscard]] inline json report(const options& o, const run_context& ran, const measurement& m) {
  json r = configuration(o, ran);
  const std::string why = failure(m);
  if (!why.empty()) r["error"] = why;
  if (why.empty()) {
    r["seconds"] = rounded(m.seconds, 6);
    r["ops"] = m.ops;
    r["iops"] = rounded(m.iops(), 1);
    r["gb_per_s"] = rounded(m.gb_per_s(), 4);
  }
  r["errors"] = m.errors;
  r["timeouts"] = m.timeouts;
  r["mismatches"] = m.mismatches;
  if (why.empty()) {
    r["lat_ns"] = json{{"p50", detail::whole(m.latency.p50)}, {"p99", detail::whole(m.latency.p99)}, {"p999", detail::whole(m.latency.p999)},
                       {"mean", detail::whole(m.latency.mean)}, {"max", m.max_ns}};
    r["timer_step_ns"] = m.timer_step_ns;
    r["cpu_seconds"] = rounded(m.cpu_seconds, 4);
    r["emulator_commands"] = m.emulator_commands;
    r["cpu_s_per_million_ios"] = rounded(m.cpu_s_per_million_ios(), 4);
    r["sms_busy"] = m.sms_busy;
    r["sm_count"] = m.sm_count;
    r["sm_seconds"] = rounded(m.sm_seconds(), 6);
    r["sm_us_per_command"] = rounded(m.sm_us_per_command(), 4);
  }
  r["first_error"] = m.first_error;
  r["emulator_doorbell_errors"] = m.emulator_doorbell_errors;
  r["emulator_dma_faults"] = m.emulator_dma_faults;
  r["emulator_completions_dropped"] = m.emulator_completions_dropped;
  r["notes"] = ran.notes;
  if (why.empty() && m.probe_samples != 0) {
    r["stages"] = json{{"queues_probed", m.probed_queues}, {"samples", m.probe_samples},
                       {"commands_per_queue", detail::stage_fields(m.stages_per_queue(), 2)}, {"us_per_command", detail::stage_fields(m.stage_microseconds(), 2)}};
  }
  if (!m.probe_error.empty()) r["probe_error"] = m.probe_error;
  if (why.empty()) {
    json hist = json::array();
    for (const auto& [low_ns, commands] : m.histogram) hist.push_back(json::array({low_ns, commands}));
    r["hist"] = std::move(hist);
  }
  return r;
}

/// The record of `--baseline h2d`: `bytes` copied in copies of `chunk` bytes in `seconds`.
[[nodiscard]] inline json h2d_report(const std::string& date, const std::string& gpu, std::uint64_t bytes, std::uint64_t chunk, double seconds) {
  return json{{"tool", "cunvme_bench"}, {"baseline", "h2d"}, {"date", date}, {"gpu", gpu}, {"bytes", bytes}, {"chunk", chunk},
              {"seconds", rounded(seconds, 6)}, {"gb_per_s", rounded(bytes / seconds / 1e9, 4)}};
}

/// The record of `--baseline pingpong`: round trips in nanoseconds.
[[nodiscard]] inline json pingpong_report(const std::string& date, const std::string& gpu, unsigned rounds, double p50, double p99, double mean) {
  return json{{"tool", "cunvme_bench"}, {"baseline", "pingpong"}, {"date", date}, {"gpu", gpu}, {"rounds", rounds},
              {"rtt_ns", json{{"p50", detail::whole(p50)}, {"p99", detail::whole(p99)}, {"mean", detail::whole(mean)}}}};
}

/// The record of a run that ended in an exception (a kernel that faulted, a device that did not
/// open): what was asked for, and why there is nothing else.
[[nodiscard]] inline json error_report(const options& o, const std::string& date, const std::string& error) {
  json r{{"tool", "cunvme_bench"}};
  if (!o.baseline.empty()) r["baseline"] = o.baseline;
  r["date"] = date;
  if (o.baseline.empty()) {
    const json asked = configuration(o, run_context{date, "", o.on_null_controller() ? 3u : o.tier, {}});
    for (const auto& [key, value] : asked.items()) {
      if (key != "tool" && key != "date" && key != "gpu") r[key] = value;
    }
  }
  r["error"] = error;
  return r;
}

}  // namespace bench::cunvme_bench
CUNVME_NAMESPACE_END
