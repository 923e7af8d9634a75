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

#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Every 8-byte little-endian word at byte offset `o` of a pattern-filled namespace holds
/// `(o / 8) ^ 0x5a5a5a5a5a5a5a5a`: the test disks of the QEMU harness and `emu:pattern`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr std::uint64_t pattern_word(std::uint64_t byte_offset) noexcept {
  return (byte_offset / 8) ^ 0x5a5a5a5a5a5a5a5aull;
}

namespace detail {

[[nodiscard]] inline std::uint64_t parse_number(std::string_view text, std::string_view key, std::string_view uri) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    throw error("Open", std::string(uri), "'" + std::string(key) + "' needs a number, not '" + std::string(text) + "'");
  }
  return value;
}

/// `emu:` options: lba=512|4096, blocks=N, namespaces=N, file=PATH, cmb_mb=N,
/// timing=none|gen4-tlc|datacenter-gen4|scm, workers=N, pattern, readonly (a file namespace
/// opened read-only: writes fail with Write Fault), spin (worker threads poll without ever
/// sleeping: for latency measurements, at a busy core per thread), nodata (Read and Write
/// are checked and complete but copy no data: `emu::controller_config::move_data`, for
/// command-rate measurements).
[[nodiscard]] inline emu::controller_config parse_emu(std::string_view options, std::string_view uri, bool& fill_pattern) {
  emu::controller_config config;
  emu::namespace_config ns = emu::namespace_config::in_memory(512, 1ull << 17);  // 64 MiB
  std::uint64_t count = 1;
  while (!options.empty()) {
    const auto comma = options.find(',');
    const std::string_view item = options.substr(0, comma);
    options = comma == std::string_view::npos ? std::string_view{} : options.substr(comma + 1);
    const auto eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1);
    if (key == "lba") {
      ns.lba_size = static_cast<std::uint32_t>(parse_number(value, key, uri));
    } else if (key == "blocks") {
      ns.lba_count = parse_number(value, key, uri);
    } else if (key == "namespaces") {
      count = parse_number(value, key, uri);
    } else if (key == "file") {
      ns.file = std::string(value);
      ns.lba_count = 0;
    } else if (key == "cmb_mb") {
      config.cmb_bytes = parse_number(value, key, uri) << 20;
    } else if (key == "workers") {
      config.workers = static_cast<unsigned>(parse_number(value, key, uri));
    } else if (key == "timing") {
      const auto preset = emu::timing_preset(value);
      if (!preset) throw error("Open", std::string(uri), "unknown timing preset '" + std::string(value) + "'");
      config.timing = *preset;
    } else if (key == "pattern") {
      fill_pattern = true;
    } else if (key == "nodata") {
      config.move_data = false;
    } else if (key == "readonly") {
      ns.read_only = true;
    } else if (key == "spin") {
      config.idle.spins = ~std::uint32_t{0};  // workers never sleep between polls: lowest latency, a core each
    } else if (!key.empty()) {
      throw error("Open", std::string(uri), "unknown emulator option '" + std::string(key) + "'");
    }
  }
  if (count == 0 || count > 1024) throw error("Open", std::string(uri), "namespaces must be 1..1024");
  config.namespaces.assign(count, ns);
  return config;
}

}  // namespace detail

/// Opens and brings up the controller `uri` names.
///
/// ```
/// auto ctrl = cunvme::host::open("emu:lba=4096,blocks=262144");
/// auto real = cunvme::host::open("sysfs:0000:01:00.0");
/// ```
/// `emu_memory` replaces an emulated controller's memory hooks (`emu::cuda_memory()` makes its
/// BAR writable by GPU threads and its DMA reach GPU memory); other schemes ignore it.
[[nodiscard]] inline std::unique_ptr<controller> open(std::string_view uri, controller_options options = {}, emu::memory_hooks emu_memory = {}) {
  const auto colon = uri.find(':');
  const std::string_view scheme = uri.substr(0, colon);
  const std::string_view rest = colon == std::string_view::npos ? std::string_view{} : uri.substr(colon + 1);
  if (scheme == "emu") {
    bool fill_pattern = false;
    emu::controller_config config = detail::parse_emu(rest, uri, fill_pattern);
    if (emu_memory.allocate || emu_memory.device_copy.copy) config.memory = std::move(emu_memory);
    auto backend = std::make_unique<emu_backend>(std::move(config));
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
  if (scheme == "sysfs") return std::make_unique<controller>(std::make_unique<sysfs_backend>(std::string(rest)), options);
  if (scheme == "vfio") return std::make_unique<controller>(std::make_unique<vfio_backend>(std::string(rest)), options);
  if (scheme == "kmod") return std::make_unique<controller>(std::make_unique<kmod_backend>(std::string(rest)), options);
  throw error("Open", std::string(uri), "unknown device URI: use emu:, sysfs:BDF, vfio:BDF or kmod:BDF");
}

}  // namespace host
CUNVME_NAMESPACE_END
