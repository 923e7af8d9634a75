// An optional timing model, so benchmarks can ask how close the GPU gets to a modelled SSD.
#pragma once

#include <cunvme/config.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string_view>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// Latency and throughput of a modelled SSD. All zero: as fast as the host threads go.
///
/// ```
/// emu::controller_config config;
/// config.timing = emu::timing_model::gen4_tlc();
/// ```
struct timing_model {
  std::uint64_t read_latency_ns = 0;   ///< fixed part of a read's latency
  std::uint64_t write_latency_ns = 0;  ///< fixed part of a write's latency
  double ns_per_byte = 0;              ///< added to the latency per byte moved
  double max_iops = 0;                 ///< commands per second; 0: unlimited
  double max_bytes_per_second = 0;     ///< 0: unlimited

  [[nodiscard]] constexpr bool enabled() const noexcept {
    return read_latency_ns != 0 || write_latency_ns != 0 || ns_per_byte != 0 || max_iops != 0 || max_bytes_per_second != 0;
  }

  /// As fast as the emulator's threads go.
  static constexpr timing_model none() { return {}; }

  /// A PCIe Gen4 x4 TLC client/enterprise SSD: ~1 M random 4 KiB read IOPS, ~7 GB/s
  /// sequential, ~80 µs read latency (TLC page read plus controller), ~20 µs write latency
  /// (writes land in the SSD's DRAM/SLC cache). Numbers of the class of Samsung PM9A3 /
  /// 980 Pro data sheets.
  static constexpr timing_model gen4_tlc() { return {80'000, 20'000, 0, 1'000'000, 7e9}; }

  /// The "modelled SSD" of cunvme's benchmarks: 1.5 M 4 KiB read IOPS at 80 µs, ~6.2 GB/s
  /// (1.5 M × 4 KiB), a data-centre Gen4 drive.
  static constexpr timing_model datacenter_gen4() { return {80'000, 20'000, 0, 1'500'000, 6.2e9}; }

  /// A low-latency storage-class-memory SSD: ~5 M 512 B IOPS, ~10 µs, ~10 GB/s (the class of
  /// Intel Optane P5800X / Samsung Z-NAND data sheets).
  static constexpr timing_model scm() { return {10'000, 10'000, 0, 5'000'000, 10e9}; }
};

/// The preset named `name`: "none", "gen4-tlc", "datacenter-gen4" or "scm".
[[nodiscard]] inline std::optional<timing_model> timing_preset(std::string_view name) {
  if (name == "none") return timing_model::none();
  if (name == "gen4-tlc") return timing_model::gen4_tlc();
  if (name == "datacenter-gen4") return timing_model::datacenter_gen4();
  if (name == "scm") return timing_model::scm();
  return std::nullopt;
}

/// Decides when each command completes under a timing model; safe to call from many threads.
///
/// The device is parallel: at low load a command completes after its latency. Throughput is
/// capped by reserving `cost = max(1 s / max_iops, bytes / max_bytes_per_second)` of device
/// time per command on one shared timeline; a command completes when both its latency has
/// passed and its reservation has ended, so the IOPS and bandwidth limits hold at any load
/// (Little's law gives the queue depth needed to reach them).
class timing_scheduler {
 public:
  explicit timing_scheduler(timing_model m) : model_(m) {}

  [[nodiscard]] std::uint64_t due_ns(std::uint64_t now_ns, std::uint64_t bytes, bool is_write) {
    const double latency = static_cast<double>(is_write ? model_.write_latency_ns : model_.read_latency_ns) +
                           model_.ns_per_byte * static_cast<double>(bytes);
    const std::uint64_t ready = now_ns + static_cast<std::uint64_t>(latency);
    double cost = 0;
    if (model_.max_iops > 0) cost = 1e9 / model_.max_iops;
    if (model_.max_bytes_per_second > 0) cost = std::max(cost, 1e9 * static_cast<double>(bytes) / model_.max_bytes_per_second);
    if (cost <= 0) return ready;
    // Rounded to whole nanoseconds: 1.5 M IOPS (666.7 ns) becomes 667 ns, 0.05 % slow.
    const auto cost_ns = static_cast<std::uint64_t>(cost + 0.5);
    std::uint64_t next = next_free_ns_.load(std::memory_order_relaxed);
    std::uint64_t end = 0;
    do {
      end = std::max(next, now_ns) + cost_ns;
    } while (!next_free_ns_.compare_exchange_weak(next, end, std::memory_order_relaxed));
    return std::max(ready, end);
  }

  [[nodiscard]] const timing_model& model() const noexcept { return model_; }

 private:
  timing_model model_;
  std::atomic<std::uint64_t> next_free_ns_{0};
};

}  // namespace emu
CUNVME_NAMESPACE_END
