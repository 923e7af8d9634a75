// One entry point for every way to reach a controller:
//   emu[:key=value,...]     the embedded emulator (keys below)
//   sysfs:0000:01:00.0      BAR0 through sysfs resource0, DMA through pagemap (root, no IOMMU)
//   vfio:0000:01:00.0       VFIO: BAR mapping and DMA through the IOMMU
//   kmod:0000:01:00.0       the cunvme kernel module
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/host/controller.cuh>
#include <cunvme/host/emu_backend.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/kmod_backend.cuh>
#include <cunvme/host/sysfs_backend.cuh>
#include <cunvme/host/vfio_backend.cuh>
#include <cunvme/spec/registers.cuh>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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
/// mistyped URI is never silently read as something else.
class uri_options {
 public:
  uri_options(std::string_view options, std::string_view uri) : uri_(uri) {
    if (options.empty()) return;
    for (;;) {
      const auto comma = options.find(',');
      const std::string_view item = options.substr(0, comma);
      const auto eq = item.find('=');
      entry e{item.substr(0, eq), eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1), eq != std::string_view::npos};
      if (e.key.empty()) fail("an empty option ('" + std::string(item) + "'): options are key=value or key, separated by single commas");
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
  [[noreturn]] void fail(const std::string& why) const { throw error("Open", std::string(uri_), why); }

  std::string_view uri_;
  std::vector<entry> entries_;
};

/// `emu:` options: lba=512|4096, blocks=N, namespaces=1..1024, file=PATH, cmb_mb=0..4095,
/// timing=none|gen4-tlc|datacenter-gen4|scm, workers=1..1024, mpsmin=0..15 (CAP.MPSMIN: the
/// smallest controller page is 2^(12 + mpsmin) bytes), and the flags (bare, =1/true or
/// =0/false) pattern, readonly (a file namespace opened read-only: writes fail with Write
/// Fault), spin (worker threads poll without ever sleeping: for latency measurements, at a
/// busy core per thread), nodata (Read and Write are checked and complete but copy no data:
/// `emu::controller_config::move_data`, for command-rate measurements); ms=0..4096 (metadata
/// bytes per block, LBAF.MS) with mset=1 (extended LBAs: metadata at the end of each block) or
/// mset=0 (the default: a separate metadata buffer through MPTR), as QEMU's nvme-ns options.
[[nodiscard]] inline emu::controller_config parse_emu(std::string_view options, std::string_view uri, bool& fill_pattern) {
  constexpr std::uint64_t max = ~std::uint64_t{0};
  uri_options o(options, uri);
  emu::controller_config config;
  emu::namespace_config ns = emu::namespace_config::in_memory(512, 1ull << 17);  // 64 MiB
  if (const auto lba = o.number("lba", 512, 4096)) {
    if (*lba != 512 && *lba != 4096) o.refuse("lba", "'lba' must be 512 or 4096");
    ns.lba_size = static_cast<std::uint32_t>(*lba);
  }
  if (const auto file = o.text("file")) {
    ns.file = std::string(*file);
    ns.lba_count = 0;  // the file's size
  }
  if (const auto blocks = o.number("blocks", 1, max)) ns.lba_count = *blocks;
  const std::uint64_t count = o.number("namespaces", 1, 1024).value_or(1);
  // CMBSZ.SZ counts 4 KiB units in 20 bits: just under 4 GiB.
  constexpr std::uint64_t max_cmb_mb = (std::uint64_t{spec::cmbsz_register::sz_field::max} * 4096) >> 20;
  if (const auto mb = o.number("cmb_mb", 0, max_cmb_mb)) config.cmb_bytes = *mb << 20;
  if (const auto workers = o.number("workers", 1, 1024)) config.workers = static_cast<unsigned>(*workers);
  if (const auto mpsmin = o.number("mpsmin", 0, 15)) {
    // CAP.MPSMIN: the host then uses 2^(12 + mpsmin)-byte pages, as it must on such a controller.
    config.mpsmin = static_cast<std::uint8_t>(*mpsmin);
    config.mpsmax = std::max(config.mpsmax, config.mpsmin);
  }
  if (const auto timing = o.text("timing")) {
    const auto preset = emu::timing_preset(*timing);
    if (!preset) o.refuse("timing", "unknown timing preset '" + std::string(*timing) + "' (none, gen4-tlc, datacenter-gen4, scm)");
    config.timing = *preset;
  }
  fill_pattern = o.flag("pattern");
  config.move_data = !o.flag("nodata");
  ns.read_only = o.flag("readonly");
  if (const auto ms = o.number("ms", 0, 4096)) ns.metadata_size = static_cast<std::uint16_t>(*ms);
  if (const auto mset = o.number("mset", 0, 1)) {
    if (ns.metadata_size == 0) o.refuse("mset", "'mset' needs metadata: give 'ms' (bytes per block) too");
    ns.extended_lba = *mset == 1;
  }
  if (o.flag("spin")) config.idle.spins = ~std::uint32_t{0};  // workers never sleep between polls: lowest latency, a core each
  o.finish();
  if (ns.lba_count > max / ns.stored_block_bytes()) {
    o.refuse("blocks", "'blocks' of " + std::to_string(ns.stored_block_bytes()) + " bytes exceed 2^64 bytes");
  }
  config.namespaces.assign(count, ns);
  return config;
}

/// The PCI address of a `sysfs:`, `vfio:` or `kmod:` URI, checked before any device is touched.
[[nodiscard]] inline std::string parse_bdf(std::string_view bdf, std::string_view uri) {
  if (!valid_bdf(bdf)) {
    throw error("Open", std::string(uri), "'" + std::string(bdf) + "' is not a PCI address of the form DDDD:BB:DD.F (hex), e.g. 0000:01:00.0");
  }
  return std::string(bdf);
}

}  // namespace detail

/// Opens and brings up the controller `uri` names.
///
/// ```
/// auto ctrl = cunvme::host::open("emu:lba=4096,blocks=262144");
/// auto real = cunvme::host::open("sysfs:0000:01:00.0");
/// ```
/// `reach` says who besides CPU threads drives the controller: `host::gpu_reach()`
/// (<cunvme/host/gpu_reach.cuh>) lets GPU threads ring an emulated controller's doorbells and
/// its DMA reach GPU memory; real controllers ignore it.
[[nodiscard]] inline std::unique_ptr<controller> open(std::string_view uri, controller_options options = {}, const memory_reach& reach = {}) {
  const auto colon = uri.find(':');
  const std::string_view scheme = uri.substr(0, colon);
  const std::string_view rest = colon == std::string_view::npos ? std::string_view{} : uri.substr(colon + 1);
  if (scheme == "emu") {
    bool fill_pattern = false;
    emu::controller_config config = detail::parse_emu(rest, uri, fill_pattern);
    reach.configure(config);
    std::unique_ptr<emu_backend> backend;
    try {
      backend = std::make_unique<emu_backend>(std::move(config));
    } catch (const std::invalid_argument& e) {
      // A combination of in-range values the emulator cannot build (a file too short, say).
      throw error("Open", std::string(uri), e.what());
    }
    if (fill_pattern) {
      for (std::uint32_t nsid = 1; nsid <= backend->controller().config().namespaces.size(); ++nsid) {
        auto& store = backend->controller().store(nsid);
        store.with_write_access(0, store.size(), [&](std::byte* p) {
          for (std::uint64_t o = 0; o + 8 <= store.size(); o += 8) {
            const std::uint64_t w = pattern_word(o);
            std::memcpy(p + o, &w, 8);
          }
        });
      }
    }
    return std::make_unique<controller>(std::move(backend), options);
  }
  if (scheme == "sysfs") return std::make_unique<controller>(std::make_unique<sysfs_backend>(detail::parse_bdf(rest, uri)), options);
  if (scheme == "vfio") return std::make_unique<controller>(std::make_unique<vfio_backend>(detail::parse_bdf(rest, uri)), options);
  if (scheme == "kmod") return std::make_unique<controller>(std::make_unique<kmod_backend>(detail::parse_bdf(rest, uri)), options);
  throw error("Open", std::string(uri), "unknown device URI: use emu:, sysfs:BDF, vfio:BDF or kmod:BDF");
}

}  // namespace host
CUNVME_NAMESPACE_END
