// What the JSON records of cunvme_bench, file_peers and emu_worker_cost share: nlohmann-json's
// insertion-ordered object, figures rounded to the precision they have, one line per record,
// the record's date and the process CPU time its figures count.
// Plain C++ (no CUDA).
#pragma once

#include <cunvme/config.cuh>

#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <cmath>
#include <ctime>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace bench {

/// Insertion-ordered: a record reads in the order of the command line, then the figures.
using json = nlohmann::ordered_json;

/// `value` to `decimals` places: a record keeps the precision a figure has, not 17 digits.
[[nodiscard]] inline double rounded(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

/// One line of JSON (sweep.py reads the last line of the output). Text that is not UTF-8 (a GPU
/// name, a path) is replaced, not thrown over.
[[nodiscard]] inline std::string one_line(const json& record) { return record.dump(-1, ' ', false, json::error_handler_t::replace); }

/// Now, UTC, as a record's "date": 2026-11-27T19:47:36Z.
[[nodiscard]] inline std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

/// CPU seconds (user and system) of every thread of this process so far.
[[nodiscard]] inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace bench
CUNVME_NAMESPACE_END
