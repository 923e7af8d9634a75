// file_peers' JSON report (one object a run, read by bench/sweep.py), and the rule that a run
// in which a method failed or left wrong bytes reports no figure. Plain C++ (no CUDA): the bench
// suite (test/bench/report_test.cpp) runs it on any machine.
#pragma once

#include "file_peers_options.hpp"
#include "json_record.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace bench::file_peers {

/// How one method did.
struct outcome {
  std::string name;
  std::string status = "ok";  ///< "ok", "failed" or "not built"
  std::string reason, note;
  bool fails_the_run = false;  ///< a failure that is not the machine's (cuFile that cannot run here is the machine's)
  double setup_s = 0;
  std::vector<double> runs;  ///< seconds of each timed run
  std::uint64_t checksum = 0;
};

[[nodiscard]] inline double best_s(const outcome& r) { return *std::min_element(r.runs.begin(), r.runs.end()); }
[[nodiscard]] inline double median_s(std::vector<double> runs) {
  std::sort(runs.begin(), runs.end());
  const std::size_t n = runs.size();
  return n % 2 == 1 ? runs[n / 2] : (runs[n / 2 - 1] + runs[n / 2]) / 2;
}
[[nodiscard]] inline double gb_per_s(std::uint64_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

[[nodiscard]] inline std::string hex(std::uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

/// Why the run's figures cannot be trusted, or "" when they can: each method that failed the run, with its reason.
[[nodiscard]] inline std::string failure(const std::vector<outcome>& results) {
  std::string why;
  for (const outcome& r : results) {
    if (r.fails_the_run) why += (why.empty() ? "" : "; ") + r.name + " failed: " + r.reason;
  }
  return why;
}

/// The fastest method other than cunvme that ran, or null.
[[nodiscard]] inline const outcome* best_peer(const std::vector<outcome>& results) {
  const outcome* best = nullptr;
  for (const outcome& r : results) {
    if (r.status == "ok" && r.name != "cunvme" && (!best || best_s(r) < best_s(*best))) best = &r;
  }
  return best;
}

/// What the run read, and where.
struct run_context {
  std::string date, gpu;
  std::uint64_t bytes = 0;  ///< the file's size
  double resident = 0;      ///< the fraction of the file in the page cache after the warming pass
};

/// The run's record: each method's figures when the run succeeded; "error", each method's status
/// and reason, and no figure when it did not.
[[nodiscard]] inline json report(const options& o, const run_context& ran, const std::vector<outcome>& results) {
  const std::string why = failure(results);
  json r{{"tool", "file_peers"}, {"date", ran.date}, {"device", ran.gpu}, {"file", o.file}, {"bytes", ran.bytes},
         {"page_cache_warm", ran.resident >= 0.99}, {"page_cache_resident", rounded(ran.resident, 4)}, {"threads", o.threads},
         {"chunk", o.chunk}, {"workers", o.workers}, {"repeat", o.repeat}};
  if (!why.empty()) r["error"] = why;
  json methods = json::array();
  for (const outcome& m : results) {
    json method{{"name", m.name}, {"status", m.status}, {"reason", m.reason}, {"note", m.note}};
    if (why.empty() && m.status == "ok") {
      method["setup_seconds"] = rounded(m.setup_s, 6);
      method["seconds"] = rounded(best_s(m), 6);
      method["gb_per_s"] = rounded(gb_per_s(ran.bytes, best_s(m)), 4);
      method["median_gb_per_s"] = rounded(gb_per_s(ran.bytes, median_s(m.runs)), 4);
      method["checksum"] = hex(m.checksum);
    } else if (why.empty()) {
      method["seconds"] = nullptr;
      method["gb_per_s"] = nullptr;
      method["checksum"] = nullptr;
    }
    methods.push_back(std::move(method));
  }
  r["methods"] = std::move(methods);
  if (why.empty()) {
    const outcome* peer = best_peer(results);
    const auto ours = std::find_if(results.begin(), results.end(), [](const outcome& m) { return m.name == "cunvme" && m.status == "ok"; });
    r["best_peer"] = peer ? json(peer->name) : json(nullptr);
    r["cunvme_over_best_peer"] = peer && ours != results.end() ? json(rounded(best_s(*peer) / best_s(*ours), 4)) : json(nullptr);
  }
  return r;
}

/// The record of a run that ended before its methods ran (a file that cannot be read, say).
[[nodiscard]] inline json error_report(const options& o, const std::string& date, const std::string& error) {
  return json{{"tool", "file_peers"}, {"date", date}, {"file", o.file}, {"error", error}};
}

}  // namespace bench::file_peers
CUNVME_NAMESPACE_END
