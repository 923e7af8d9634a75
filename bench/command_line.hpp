// What the command lines of cunvme_bench and file_peers share, on CLI11: sizes with units,
// whole numbers and seconds in a range, and how a refused command line ends the program.
// Plain C++ (no CUDA): the bench suite (test/bench/) runs it on any machine.
#pragma once

#include <cunvme/config.cuh>

#include <CLI/CLI.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

CUNVME_NAMESPACE_BEGIN
namespace bench {

/// A command line that parsed but cannot run on what it opened (a block size the device cannot
/// address, say): the program ends as for any refused option, with exit code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Decimal digits only, into 64 bits: no sign, no spaces, no base prefix.
[[nodiscard]] inline std::optional<std::uint64_t> decimal_digits(std::string_view text) {
  std::uint64_t value = 0;
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace detail

/// "4096" → 4096, "64K" → 65536, "1.5G" → 1610612736: a decimal number with an optional unit
/// k, m, g or t (either case, powers of 1024). Nullopt for anything else, for a value that is
/// not a whole number of bytes ("1.5" bytes, "0.3K") and for one past 2^64 − 1.
[[nodiscard]] inline std::optional<std::uint64_t> bytes_of(std::string_view text) {
  unsigned shift = 0;
  if (!text.empty()) {
    constexpr std::string_view units = "kmgt";
    const char last = text.back();
    const char lower = last >= 'A' && last <= 'Z' ? static_cast<char>(last - 'A' + 'a') : last;
    if (const std::size_t unit = units.find(lower); unit != std::string_view::npos) {
      shift = 10 * static_cast<unsigned>(unit + 1);
      text.remove_suffix(1);
    }
  }
  const std::size_t point = text.find('.');
  const std::optional<std::uint64_t> whole = detail::decimal_digits(text.substr(0, point));
  if (!whole || (shift != 0 && (*whole >> (64 - shift)) != 0)) return std::nullopt;  // past 2^64 − 1
  const std::uint64_t bytes = *whole << shift;
  if (point == std::string_view::npos) return bytes;
  // A fraction: exact, in integers. Six digits at most keep digits × 2^40 inside 64 bits.
  const std::string_view fraction_text = text.substr(point + 1);
  const std::optional<std::uint64_t> fraction = detail::decimal_digits(fraction_text);
  if (!fraction || fraction_text.size() > 6) return std::nullopt;
  std::uint64_t denominator = 1;
  for (std::size_t i = 0; i < fraction_text.size(); ++i) denominator *= 10;
  const std::uint64_t scaled = *fraction << shift;
  if (scaled % denominator != 0) return std::nullopt;  // not a whole number of bytes
  if (bytes > std::numeric_limits<std::uint64_t>::max() - scaled / denominator) return std::nullopt;
  return bytes + scaled / denominator;
}

/// A CLI11 transform for an option given in bytes: a size as `bytes_of` reads it, at least
/// `least` and a multiple of `multiple`, replaced by its byte count for CLI11 to convert.
[[nodiscard]] inline CLI::Validator size_in_bytes(std::uint64_t least = 1, std::uint64_t multiple = 1) {
  return CLI::Validator(
      [least, multiple](std::string& text) -> std::string {
        const std::optional<std::uint64_t> bytes = bytes_of(text);
        if (!bytes) return "needs a size such as 4096, 64K or 1.5G (units k, m, g, t: powers of 1024), not '" + text + "'";
        if (*bytes < least) return "must be at least " + std::to_string(least) + " bytes, not '" + text + "'";
        if (*bytes % multiple != 0) return "must be a multiple of " + std::to_string(multiple) + " bytes, not '" + text + "'";
        text = std::to_string(*bytes);
        return {};
      },
      "SIZE", "size in bytes");
}

/// A CLI11 transform for a count: a decimal whole number in [least, most], replaced by its
/// plain digits. Strict on purpose: CLI11 2.1's own conversion reads "010" as octal 8, "0x10" as
/// 16, and "-1" into a 64-bit option as 2^64 − 1.
[[nodiscard]] inline CLI::Validator whole_number(std::uint64_t least, std::uint64_t most) {
  return CLI::Validator(
      [least, most](std::string& text) -> std::string {
        const std::optional<std::uint64_t> value = detail::decimal_digits(text);
        if (!value || *value < least || *value > most) {
          return "needs a whole number from " + std::to_string(least) + " to " + std::to_string(most) + ", not '" + text + "'";
        }
        text = std::to_string(*value);
        return {};
      },
      "N", "whole number");
}

/// A CLI11 check for a duration: a finite number of seconds above 0 and at most `most`.
[[nodiscard]] inline CLI::Validator seconds_up_to(double most) {
  return CLI::Validator(
      [most](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ? NAN : std::strtod(text.c_str(), &end);
        if (!(value > 0 && value <= most) || end != text.c_str() + text.size()) {
          return "needs a number of seconds above 0 and at most " + std::to_string(static_cast<long long>(most)) + ", not '" + text + "'";
        }
        return {};
      },
      "SECONDS", "seconds");
}

/// Parses the command line with `app` (whose callback checks the combinations). Returns the exit
/// code when the program ends here: 0 after --help, 2 for a refused command line, whose reason
/// goes to stderr (CLI11's own codes would be 105-109: a script tests for 2). Nullopt: go on.
[[nodiscard]] inline std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& refused) {
    std::fprintf(stderr, "%s: %s\nRun with --help for the options.\n", app.get_name().c_str(), refused.what());
    return 2;
  }
}

}  // namespace bench
CUNVME_NAMESPACE_END
