// What the JSON records of cunvme_bench and file_peers share: nlohmann-json's insertion-ordered
// object, figures rounded to the precision they have, and one line per record.
// Plain C++ (no CUDA).
#pragma once

#include <cunvme/config.cuh>

#include <nlohmann/json.hpp>

#include <cmath>
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

}  // namespace bench
CUNVME_NAMESPACE_END
