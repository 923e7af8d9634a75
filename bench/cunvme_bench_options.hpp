// cunvme_bench's command line: its options, their ranges, and the checks that involve more than
// one of them. Plain C++ (no CUDA): the bench suite (test/bench/options_test.cpp) runs it on any
// machine; cunvme_bench.cu adds what only the opened device can tell (its LBA size, MDTS).
#pragma once

#include "command_line.hpp"

#include <cunvme/emu/timing_model.cuh>
#include <cunvme/host/backend/uri_options.cuh>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

CUNVME_NAMESPACE_BEGIN
namespace bench::cunvme_bench {

/// Commands one GPU thread keeps in flight: the size of the kernel's per-thread handle array.
inline constexpr unsigned max_qd = 32;
/// Threads per block: the I/O kernel's __launch_bounds__.
inline constexpr unsigned max_block_threads = 256;
/// A run given neither --size nor --time runs this long.
inline constexpr double default_seconds = 2;

struct options {
  std::string rw = "randread";
  std::string slots = "warp_aggregated", completion = "cooperative", doorbell = "coalescing";
  std::string device = "emu";
  std::string baseline;       ///< "", "h2d" or "pingpong"
  std::uint64_t bs = 4096;    ///< bytes per command
  std::uint64_t size = 0;     ///< bytes to move in all; 0: run for `time`
  double time = 0;            ///< seconds to run; 0 when `size` is given
  std::uint64_t buffer = std::uint64_t{1} << 30;  ///< data buffer bytes, split over the devices
  std::uint64_t seed = 1;
  std::string volume = "none";  ///< "none", or the --devices as one volume: "striped" or "mirrored"
  std::uint64_t stripe = 64 * 1024;  ///< bytes of a volume's stripe (a power of two)
  unsigned qd = 1, threads = 1024, block_threads = 128, queues = 1, entries = 1024, tier = 2, devices = 1, null_blocks = 4;
  bool json = false, verify = false;
  bool probe = false;  ///< sample the first queue pairs' bookkeeping while running: where commands wait

  [[nodiscard]] bool writes() const { return rw == "write" || rw == "randwrite"; }
  [[nodiscard]] bool random() const { return rw == "randread" || rw == "randwrite"; }
  [[nodiscard]] bool on_null_controller() const { return device.rfind("gpu-null", 0) == 0; }
  [[nodiscard]] bool on_volume() const { return volume != "none"; }
  /// Each device (emulator, drive, on-GPU null controller) has its share of the buffer.
  [[nodiscard]] std::uint64_t buffer_per_device() const { return buffer / devices; }
};

/// What an on-GPU null controller device asks for: `gpu-null[:keys]`, the keys as the emulator's
/// URI takes them — `copy` (keep a namespace in GPU memory and move its data) and
/// `timing=none|gen4-tlc|datacenter-gen4|scm` (a modelled drive: CQEs held until due).
struct null_device {
  bool copy = false;
  cunvme::emu::timing_model timing = cunvme::emu::timing_model::none();
};

/// The null controller `device` names; throws CLI::ValidationError naming --device for an
/// unknown key or preset.
[[nodiscard]] inline null_device null_device_of(const std::string& device) {
  null_device d;
  if (device != "gpu-null" && device.rfind("gpu-null:", 0) != 0) throw CLI::ValidationError("--device", "'" + device + "' is not gpu-null[:copy,timing=PRESET]");
  const std::string_view keys = device.size() > 9 ? std::string_view(device).substr(9) : std::string_view{};
  try {
    cunvme::host::detail::uri_options flags(keys, device);
    d.copy = flags.flag("copy");
    if (const auto preset = flags.text("timing")) {
      const auto model = cunvme::emu::timing_preset(*preset);
      if (!model) flags.refuse("timing", "unknown timing preset '" + std::string(*preset) + "' (none, gen4-tlc, datacenter-gen4, scm)");
      d.timing = *model;
    }
    flags.finish();
  } catch (const cunvme::host::error& e) {
    throw CLI::ValidationError("--device", e.what());
  }
  return d;
}

namespace detail {

/// Why `--verify` cannot check what `device` returns, or "" when it can. It compares each read
/// with `host::pattern_word`: only a namespace filled with that pattern, moved for real, passes.
[[nodiscard]] inline std::string why_unverifiable(const std::string& device) {
  if (device.rfind("gpu-null", 0) == 0) {
    return null_device_of(device).copy ? "" : "the null controller moves no data with " + device + " (gpu-null:copy does)";
  }
  if (device != "emu" && device.rfind("emu:", 0) != 0) return "";  // a drive: the QEMU harness's test disks hold the pattern
  const std::string_view uri_options = device == "emu" ? std::string_view{} : std::string_view(device).substr(4);
  // The emulator's own URI parser, so that "pattern=0" reads as it does when the device opens.
  try {
    cunvme::host::detail::uri_options flags(uri_options, device);
    if (flags.flag("nodata")) return device + " moves no data (nodata)";
    if (!flags.flag("pattern")) return device + " is not filled with the pattern it checks: add 'pattern' (emu:pattern,...)";
  } catch (const cunvme::host::error& e) {
    return e.what();
  }
  return "";
}

/// The checks of more than one option; throws CLI::ValidationError naming them.
inline void check_combination(options& o) {
  if (o.size == 0 && o.time == 0) o.time = default_seconds;
  if (!o.baseline.empty()) return;  // the baselines use --size and --json only
  if (o.on_null_controller()) (void)null_device_of(o.device);  // its keys, before anything opens
  if (o.queues < o.devices) throw CLI::ValidationError("--queues", "must be at least --devices (" + std::to_string(o.devices) + "): every device needs a queue");
  if (o.on_volume()) {
    if (o.queues % o.devices != 0) {
      throw CLI::ValidationError("--volume", "gives each member the same queue pairs: --queues (" + std::to_string(o.queues) + ") must be a multiple of --devices (" +
                                                 std::to_string(o.devices) + ")");
    }
    if (o.slots == "exclusive") throw CLI::ValidationError("--volume", "threads take their SM's queue pair on each member: --slots exclusive cannot be used");
    if (o.volume == "mirrored" && o.writes()) {
      throw CLI::ValidationError("--volume mirrored", "a write goes to every replica, which this benchmark's one command per request does not do: use reads");
    }
    if (o.volume == "striped" && o.stripe % o.bs != 0) {
      throw CLI::ValidationError("--stripe", std::to_string(o.stripe) + " is not a multiple of --bs (" + std::to_string(o.bs) + "): a command must lie on one member");
    }
  }
  if (o.slots == "exclusive" && o.threads > o.queues) {
    throw CLI::ValidationError("--slots exclusive", "a queue has one submitting thread: --threads (" + std::to_string(o.threads) +
                                                        ") must not exceed --queues (" + std::to_string(o.queues) + ")");
  }
  const std::uint64_t slots = o.buffer_per_device() / o.bs;
  if (slots == 0) {
    throw CLI::ValidationError("--buffer", std::to_string(o.buffer_per_device()) + " bytes per device is smaller than --bs (" + std::to_string(o.bs) + ")");
  }
  if (o.verify) {
    if (o.writes()) throw CLI::ValidationError("--verify", "checks what reads return: it cannot check --rw " + o.rw);
    if (const std::string why = why_unverifiable(o.device); !why.empty()) throw CLI::ValidationError("--verify", why);
    if (slots < std::uint64_t{o.threads} * o.qd) {
      throw CLI::ValidationError("--verify", "needs a buffer slot per command in flight (--threads × --qd = " + std::to_string(std::uint64_t{o.threads} * o.qd) +
                                                 ", --buffer holds " + std::to_string(slots) + " of --bs per device): raise --buffer");
    }
  }
}

}  // namespace detail

/// cunvme_bench's options on a CLI11 app, bound to `o`; parsing the app also runs the checks of
/// more than one option. Ranges: what the kernel and the devices can take (qd up to max_qd, whole
/// warps up to max_block_threads a block, NVMe's 2..65536 queue entries, 65535 I/O queues).
inline std::unique_ptr<CLI::App> make_app(options& o) {
  auto app = std::make_unique<CLI::App>(
      "fio-style measurements of the GPU I/O path (IOPS, bandwidth, completion latency percentiles), and the machine's limits\n"
      "(--baseline) they are compared with. Sizes take k, m, g or t (powers of 1024).",
      "cunvme_bench");
  // An option given twice takes its last value, as the hand-written parser before CLI11 did.
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("--rw", o.rw, "access pattern")->check(CLI::IsMember({"read", "randread", "write", "randwrite"}))->capture_default_str();
  app->add_option("--bs", o.bs, "bytes per command (a multiple of the device's LBA size)")->transform(size_in_bytes())->capture_default_str();
  app->add_option("--qd", o.qd, "commands in flight per GPU thread")->transform(whole_number(1, max_qd))->capture_default_str();
  app->add_option("--threads", o.threads, "GPU threads issuing I/O")->transform(whole_number(1, 1u << 30))->capture_default_str();
  app->add_option("--block-threads", o.block_threads, "threads per block (whole warps); the threads of a block share a queue")
      ->transform(whole_number(32, max_block_threads))
      ->check(CLI::Validator([](std::string& text) { return std::stoul(text) % 32 == 0 ? std::string{} : "must be a multiple of 32 (whole warps), not " + text; },
                             "", "whole warps"))
      ->capture_default_str();
  app->add_option("--queues", o.queues, "I/O queue pairs, spread over the devices; block b uses queue b % queues")
      ->transform(whole_number(1, 65535))
      ->capture_default_str();
  app->add_option("--entries", o.entries, "entries per queue (capped at the controller's CAP.MQES)")->transform(whole_number(2, 65536))->capture_default_str();
  app->add_option("--slots", o.slots, "submission slot policy")->check(CLI::IsMember({"exclusive", "warp_aggregated", "multi_producer"}))->capture_default_str();
  app->add_option("--completion", o.completion, "completion policy")->check(CLI::IsMember({"cooperative", "dedicated_poller"}))->capture_default_str();
  app->add_option("--doorbell", o.doorbell, "doorbell policy")->check(CLI::IsMember({"mmio", "coalescing"}))->capture_default_str();
  app->add_option("--tier", o.tier, "memory tier: 1 host queues and data, 2 host queues and GPU data, 3 all in GPU memory")
      ->transform(whole_number(1, 3))
      ->capture_default_str();
  CLI::Option* size = app->add_option("--size", o.size, "bytes to move in all (the run ends after them)")->transform(size_in_bytes());
  CLI::Option* time = app->add_option("--time", o.time, "seconds to run (default 2 without --size)")->check(seconds_up_to(86400));
  size->excludes(time);
  app->add_option("--device", o.device,
                  "emu[:options], gpu-null[:copy,timing=PRESET] (the on-GPU null controller; copy: with data; timing: a modelled drive), or a drive "
                  "(sysfs:, vfio:, kmod:BDF)")
      ->capture_default_str();
  app->add_option("--devices", o.devices, "devices of --device to open (emulators or on-GPU null controllers: that many controllers)")->transform(whole_number(1, 1024))->capture_default_str();
  app->add_option("--volume", o.volume, "make the --devices one volume (volume_io's layout and queue choice): striped (RAID-0) or mirrored (RAID-1, reads)")
      ->check(CLI::IsMember({"none", "striped", "mirrored"}))
      ->capture_default_str();
  app->add_option("--stripe", o.stripe, "stripe bytes of --volume striped (a power of two, a multiple of --bs; mirrored reads take the replicas in turn by 64 KiB)")
      ->transform(size_in_bytes())
      ->check(CLI::Validator([](std::string& text) {
        const std::uint64_t v = std::stoull(text);
        return (v & (v - 1)) == 0 ? std::string{} : "must be a power of two, not " + text;
      }, "", "power of two"))
      ->capture_default_str();
  app->add_option("--null-blocks", o.null_blocks, "thread blocks the on-GPU null controller runs on")->transform(whole_number(1, 1024))->capture_default_str();
  app->add_option("--buffer", o.buffer, "data buffer bytes, split over the devices")->transform(size_in_bytes())->capture_default_str();
  app->add_option("--seed", o.seed, "seed of the random offsets")->transform(whole_number(0, ~std::uint64_t{0}))->capture_default_str();
  app->add_option("--baseline", o.baseline, "measure a limit instead: h2d (pinned cudaMemcpy host to GPU), pingpong (GPU-CPU round trip)")
      ->check(CLI::IsMember({"h2d", "pingpong"}));
  app->add_flag("--verify", o.verify, "check the first and last word of every read against the namespace's pattern");
  app->add_flag("--probe", o.probe,
                "copy the first 16 queue pairs' bookkeeping and CQs every 20 ms while running and report where commands wait (bench/queue_probe.hpp)");
  app->add_flag("--json", o.json, "print one JSON object (with the latency histogram) instead of text");
  app->callback([&o] { detail::check_combination(o); });
  return app;
}

/// The options of a command line (argv[0] first), or the CLI::ParseError that refused it.
[[nodiscard]] inline options parse(int argc, const char* const* argv) {
  options o;
  make_app(o)->parse(argc, argv);
  return o;
}

}  // namespace bench::cunvme_bench
CUNVME_NAMESPACE_END
