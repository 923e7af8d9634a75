// The `key=value,…` options of a device URI, parsed one way for every scheme, and the data
// pattern of `emu:pattern` and the QEMU harness's test disks.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Every 8-byte little-endian word at byte offset `o` of a pattern-filled namespace holds
/// `(o / 8) ^ 0x5a5a5a5a5a5a5a5a`: the test disks of the QEMU harness and `emu:pattern`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr std::uint64_t pattern_word(std::uint64_t byte_offset) noexcept {
  return (byte_offset / 8) ^ 0x5a5a5a5a5a5a5a5aull;
}

namespace detail {


/// The `key=value,…` options of a URI, each checked the same way: every item has a key, no key
/// comes twice, a value is a plain decimal number in its key's range (no sign, no spaces, no
/// wrap), a flag's value is 1/true or 0/false, a text value is not empty, and `finish` refuses
/// every key nobody asked for. Errors are `host::error`s naming the key and the value, so a
/// mistyped URI is never silently read as something else. The fields inside one option's value
/// (`emu:fault=read:nth=3`) are parsed the same way with their own `separator`, and `context`
/// (which rule of which option) leads each of their errors.
class uri_options {
 public:
  uri_options(std::string_view options, std::string_view uri, char separator = ',', std::string context = {})
      : uri_(uri), context_(std::move(context)) {
    if (options.empty()) return;
    for (;;) {
      const auto comma = options.find(separator);
      const std::string_view item = options.substr(0, comma);
      const auto eq = item.find('=');
      entry e{item.substr(0, eq), eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1), eq != std::string_view::npos};
      if (e.key.empty()) {
        fail("an empty option ('" + std::string(item) + "'): options are key=value or key, separated by single '" +
             std::string(1, separator) + "'");
      }
      for (const entry& seen : entries_) {
        if (seen.key == e.key) refuse(e, "'" + std::string(e.key) + "' is given twice");
      }
      entries_.push_back(e);
      if (comma == std::string_view::npos) break;
      options = options.substr(comma + 1);
    }
  }

  /// The value of `key`, a decimal number in [min, max]; nullopt when the key is absent.
  [[nodiscard]] std::optional<std::uint64_t> number(std::string_view key, std::uint64_t min, std::uint64_t max) {
    entry* e = take(key);
    if (e == nullptr) return std::nullopt;
    if (e->value.empty()) refuse(*e, "'" + std::string(key) + "' needs a number");
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(e->value.data(), e->value.data() + e->value.size(), value);
    const std::string range = std::to_string(min) + ".." + std::to_string(max);
    if (ec == std::errc::result_out_of_range) refuse(*e, "'" + std::string(key) + "' must be " + range + " (the value does not fit 64 bits)");
    if (ec != std::errc{} || end != e->value.data() + e->value.size()) refuse(*e, "'" + std::string(key) + "' needs a decimal number");
    if (value < min || value > max) refuse(*e, "'" + std::string(key) + "' must be " + range);
    return value;
  }

  /// Whether flag `key` is on: absent is off, `key`, `key=1` and `key=true` are on, `key=0`
  /// and `key=false` off.
  [[nodiscard]] bool flag(std::string_view key) {
    entry* e = take(key);
    if (e == nullptr) return false;
    if (!e->has_value || e->value == "1" || e->value == "true") return true;
    if (e->value == "0" || e->value == "false") return false;
    refuse(*e, "flag '" + std::string(key) + "' takes 1, true, 0 or false");
  }

  /// The value of `key`, not empty; nullopt when the key is absent.
  [[nodiscard]] std::optional<std::string_view> text(std::string_view key) {
    entry* e = take(key);
    if (e == nullptr) return std::nullopt;
    if (e->value.empty()) refuse(*e, "'" + std::string(key) + "' needs a value");
    return e->value;
  }

  /// Refuses `key`'s value (which must have been taken) for `why`.
  [[noreturn]] void refuse(std::string_view key, const std::string& why) const {
    for (const entry& e : entries_) {
      if (e.key == key) refuse(e, why);
    }
    fail(why);
  }

  /// Refuses the whole URI for `why`.
  [[noreturn]] void fail(const std::string& why) const { throw error("Open", std::string(uri_), context_ + why); }

  /// Refuses the first key nobody took.
  void finish() const {
    for (const entry& e : entries_) {
      if (!e.taken) refuse(e, "unknown option '" + std::string(e.key) + "'");
    }
  }

 private:
  struct entry {
    std::string_view key, value;
    bool has_value = false;
    bool taken = false;
  };

  entry* take(std::string_view key) {
    for (entry& e : entries_) {
      if (e.key == key) {
        e.taken = true;
        return &e;
      }
    }
    return nullptr;
  }
  [[noreturn]] void refuse(const entry& e, const std::string& why) const {
    fail(std::string(e.key) + (e.has_value ? "=" + std::string(e.value) : std::string{}) + ": " + why);
  }
  std::string_view uri_;
  std::string context_;
  std::vector<entry> entries_;
};

}  // namespace detail
}  // namespace host
CUNVME_NAMESPACE_END
