// An optional timing model, so benchmarks can ask how close the GPU gets to a modelled SSD.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// Latency and throughput of a modelled SSD; all zero (the default) models nothing, and
/// commands complete as fast as the emulator's threads go. `timing_scheduler` explains how
/// the numbers combine.
///
/// The presets are round numbers of their class of drive, taken from vendors' data sheets
/// (4 KiB random-read IOPS at high queue depth, sequential read bandwidth) and from
/// published queue-depth-1 latency measurements. They model no particular product.
///
/// Usage: examples/snippets/emu.cpp, `timing_models`.
struct timing_model {
  std::uint64_t read_latency_ns = 0;  ///< fixed part of a read's latency
  std::uint64_t write_latency_ns = 0; ///< fixed part of a write's latency (and any other non-read)
  double ns_per_byte = 0;             ///< added to a command's latency per byte it moves
  double max_iops = 0;                ///< commands per second the device sustains; 0: unlimited
  double max_bytes_per_second = 0;    ///< bytes per second the device sustains; 0: unlimited

  /// Whether the model delays anything.
  [[nodiscard]] constexpr bool enabled() const noexcept {
    return read_latency_ns != 0 || write_latency_ns != 0 || ns_per_byte != 0 || max_iops != 0 ||
           max_bytes_per_second != 0;
  }

  friend constexpr bool operator==(const timing_model&, const timing_model&) = default;

  /// Nothing modelled: commands complete as fast as the host threads go. The emulator's default.
  [[nodiscard]] static constexpr timing_model none() noexcept { return {}; }

  /// A PCIe Gen4 x4 TLC NAND SSD: 1 M random 4 KiB read IOPS and 7 GB/s sequential read (the
  /// data-sheet figures of the class of Samsung 980 PRO / PM9A3 and WD SN850), 80 µs read
  /// latency (a TLC page read of ~50–60 µs plus controller and link), 20 µs write latency
  /// (writes complete once they land in the drive's DRAM or SLC cache).
  [[nodiscard]] static constexpr timing_model gen4_tlc() noexcept {
    return {.read_latency_ns = 80'000, .write_latency_ns = 20'000, .max_iops = 1e6, .max_bytes_per_second = 7e9};
  }

  /// The "modelled SSD" of cunvme's benchmarks: a data-centre PCIe Gen4 drive at 1.5 M random
  /// 4 KiB read IOPS (the class of Samsung PM1733 and Kioxia CM6 data sheets) with the
  /// latencies of `gen4_tlc`; its bandwidth cap, 6.2 GB/s, is 1.5 M × 4 KiB, so small reads
  /// reach the IOPS limit and the bandwidth limit at once.
  [[nodiscard]] static constexpr timing_model datacenter_gen4() noexcept {
    return {.read_latency_ns = 80'000, .write_latency_ns = 20'000, .max_iops = 1.5e6, .max_bytes_per_second = 6.2e9};
  }

  /// A low-latency storage-class-memory SSD: 5 M random 512 B IOPS, 10 µs read and write
  /// latency, 10 GB/s — the class of Intel Optane P5800X (PCIe Gen4, 3D XPoint) and Samsung
  /// Z-NAND data sheets, rounded.
  [[nodiscard]] static constexpr timing_model scm() noexcept {
    return {.read_latency_ns = 10'000, .write_latency_ns = 10'000, .max_iops = 5e6, .max_bytes_per_second = 10e9};
  }
};

/// The preset named `name`: "none", "gen4-tlc", "datacenter-gen4" or "scm"; nullopt for any
/// other name (names are case sensitive).
///
/// Usage: examples/snippets/emu.cpp, `timing_models`.
[[nodiscard]] inline std::optional<timing_model> timing_preset(std::string_view name) {
  if (name == "none") return timing_model::none();
  if (name == "gen4-tlc") return timing_model::gen4_tlc();
  if (name == "datacenter-gen4") return timing_model::datacenter_gen4();
  if (name == "scm") return timing_model::scm();
  return std::nullopt;
}

/// The arithmetic of a `timing_model` per command, trivially copyable so that any controller
/// can carry it: the emulator's host threads (`timing_scheduler`) and the on-GPU null
/// controller (gpu_null_controller.cuh) decide due times by the same
/// code, each reserving time on a timeline word of its own.
///
/// The device is parallel: at low load a command completes after its latency,
/// `latency + bytes × ns_per_byte`. Its throughput is capped by reserving
/// `cost = max(1 s / max_iops, bytes / max_bytes_per_second)` of device time per command on
/// one shared timeline, starting when the timeline is free or when the command arrives,
/// whichever is later. A command completes when its latency has passed and its reservation
/// has ended, so neither cap is ever exceeded, and by Little's law a host reaches the IOPS cap
/// only with `max_iops × latency` commands in flight (120 for `datacenter_gen4`), as on a real
/// drive.
///
/// The timeline counts sixteenths of a nanosecond, so a fractional cost (666.7 ns at 1.5 M
/// IOPS) does not drift by rounding, and it holds clock times up to 2^60 ns (36 years).
struct timing_costs {
  static constexpr unsigned tick_shift = 4;
  static constexpr std::uint64_t ticks_per_ns = std::uint64_t{1} << tick_shift;
  static constexpr double ticks_per_second = 1e9 * ticks_per_ns;
  static constexpr std::uint64_t max_timeline_ns = (std::uint64_t{1} << (64 - tick_shift)) - 1;

  std::uint64_t read_latency_ns = 0;
  std::uint64_t write_latency_ns = 0;
  double ns_per_byte = 0;
  double ticks_per_command = 0;  ///< 0: no IOPS cap
  double ticks_per_byte = 0;     ///< 0: no bandwidth cap

  /// The costs of `m`; throws std::invalid_argument, naming the field, when a rate or the
  /// per-byte cost is negative, infinite or NaN.
  [[nodiscard]] static timing_costs of(const timing_model& m) {
    auto check = [](double value, const char* field) {
      if (!std::isfinite(value) || value < 0) {
        throw std::invalid_argument(std::string("timing_scheduler: timing_model::") + field +
                                    " must be a finite number >= 0, not " + std::to_string(value));
      }
    };
    check(m.ns_per_byte, "ns_per_byte");
    check(m.max_iops, "max_iops");
    check(m.max_bytes_per_second, "max_bytes_per_second");
    return {m.read_latency_ns, m.write_latency_ns, m.ns_per_byte, m.max_iops > 0 ? ticks_per_second / m.max_iops : 0,
            m.max_bytes_per_second > 0 ? ticks_per_second / m.max_bytes_per_second : 0};
  }

  /// When (ns on the caller's clock) a command that arrived at `now_ns` moving `bytes`
  /// completes: `max(now + latency, reservation end)`. `reserve(now_ticks, cost_ticks)`
  /// reserves `cost_ticks` on the caller's timeline from the later of its free point and
  /// `now_ticks`, and returns the reservation's end (in ticks). Call once per command.
  CUNVME_EXEC_CHECK_DISABLE
  template <class Reserve>
  [[nodiscard]] CUNVME_HOST_DEVICE std::uint64_t due_ns(std::uint64_t now_ns, std::uint64_t bytes, bool is_write, Reserve&& reserve) const {
    const std::uint64_t fixed = is_write ? write_latency_ns : read_latency_ns;
    const std::uint64_t latency = cunvme::detail::saturating_add(fixed, to_integer(ns_per_byte * static_cast<double>(bytes)));
    const std::uint64_t ready = cunvme::detail::saturating_add(now_ns, latency);
    const double per_byte = ticks_per_byte * static_cast<double>(bytes);
    const double cost = ticks_per_command > per_byte ? ticks_per_command : per_byte;
    if (cost <= 0) return ready;
    // At least one tick, so a cap, however high, still gives every command its own slot.
    const std::uint64_t rounded = to_integer(cost + 0.5);
    const std::uint64_t cost_ticks = rounded > 0 ? rounded : 1;
    const std::uint64_t now_ticks = (now_ns < max_timeline_ns ? now_ns : max_timeline_ns) << tick_shift;
    const std::uint64_t end = reserve(now_ticks, cost_ticks);
    // Rounded up: a command is never due before its reservation ends.
    const std::uint64_t end_ns = (end >> tick_shift) + ((end & (ticks_per_ns - 1)) != 0 ? 1 : 0);
    return ready > end_ns ? ready : end_ns;
  }

  /// `x` (finite, >= 0) truncated, saturating: converting a double beyond the range of
  /// uint64_t is undefined behaviour.
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr std::uint64_t to_integer(double x) noexcept {
    constexpr double limit = 0x1p63;
    return x >= limit ? std::uint64_t{1} << 63 : static_cast<std::uint64_t>(x);
  }
};

/// Decides when each command completes under a `timing_model` (`timing_costs` says how);
/// lock-free and safe to call from any number of threads.
///
/// Usage: examples/snippets/emu.cpp, `read_due_ns`.
class timing_scheduler {
 public:
  /// Throws std::invalid_argument, naming the field, when a rate or the per-byte cost is
  /// negative, infinite or NaN.
  explicit timing_scheduler(timing_model m) : model_(m), costs_(timing_costs::of(m)) {}

  /// When (steady-clock ns) a command that arrived at `now_ns` moving `bytes` completes.
  /// Each call reserves device time, so call it once per command.
  [[nodiscard]] std::uint64_t due_ns(std::uint64_t now_ns, std::uint64_t bytes, bool is_write) {
    return costs_.due_ns(now_ns, bytes, is_write, [this](std::uint64_t now_ticks, std::uint64_t cost_ticks) {
      std::uint64_t next = next_free_ticks_.load(std::memory_order_relaxed);
      std::uint64_t end = 0;
      // Relaxed: the timeline's value is all that is shared; it publishes no other data.
      do {
        end = cunvme::detail::saturating_add(std::max(next, now_ticks), cost_ticks);
      } while (!next_free_ticks_.compare_exchange_weak(next, end, std::memory_order_relaxed));
      return end;
    });
  }

  [[nodiscard]] const timing_model& model() const noexcept { return model_; }
  [[nodiscard]] const timing_costs& costs() const noexcept { return costs_; }

 private:
  timing_model model_;
  timing_costs costs_;
  std::atomic<std::uint64_t> next_free_ticks_{0};
};

}  // namespace emu
CUNVME_NAMESPACE_END
