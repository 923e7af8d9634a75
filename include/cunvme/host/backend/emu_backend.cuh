// The emulator as a register backend: "emu:" in `host::open`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/emu/controller.cuh>
#include <cunvme/emu/controller_config.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/memory/gpu_export.cuh>
#include <cunvme/host/memory/host_registration.cuh>
#include <cunvme/host/backend/register_backend.cuh>
#include <cunvme/host/backend/uri_options.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/status.cuh>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// DMA memory of an emulated controller: ordinary (or, with CUDA hooks, pinned and mapped)
/// host memory registered with the emulator's IOMMU, so each buffer is one bus range.
///
/// Every method fails with `host::error` naming "emu", as a real backend's do: what the
/// emulator's `dma_space` throws (std::invalid_argument, std::length_error) goes through
/// `map_range`, the one place this class registers a range, and a buffer's release never
/// throws (`unmap_quietly`): it runs in `dma_buffer`'s noexcept destructor.
class emu_allocator final : public dma_allocator {
 public:
  explicit emu_allocator(emu::controller& c) : ctrl_(c), link_(std::make_shared<link>(&c)) {}
  emu_allocator(const emu_allocator&) = delete;
  emu_allocator& operator=(const emu_allocator&) = delete;
  /// Buffers released later leave the emulator's IOMMU alone: it goes with the emulator.
  ~emu_allocator() override { link_->sever(); }

  [[nodiscard]] dma_buffer map_gpu(void* gpu, std::size_t bytes) override {
    // A buffer's page list starts at a page boundary (as cudaMalloc's allocations do).
    if (reinterpret_cast<std::uintptr_t>(gpu) % 4096 != 0) throw error("Map GPU memory", "emu", "GPU memory must start on a 4 KiB boundary");
    return map_gpu_range(gpu, bytes);
  }

  /// Any start: the range is one bus range whose bus address keeps the start's offset within
  /// its page, and the emulator's IOMMU lets the controller reach exactly these bytes.
  [[nodiscard]] dma_buffer map_gpu_range(void* gpu, std::size_t bytes) override {
    if (gpu == nullptr || bytes == 0) throw error("Map GPU memory", "emu", "empty range");
    const std::uint64_t bus = map_range("Map GPU memory", gpu, bytes, emu::memory_kind::device);
    return dma_buffer(nullptr, gpu, bytes, 4096, bus_range_pages(bus, bytes), memory_location::gpu, [l = link_, bus] { unmap_quietly(*l, bus); });
  }

  /// The emulator reaches any host memory the process has: the range is registered with its
  /// IOMMU, as its own allocations are.
  [[nodiscard]] dma_buffer map_host(void* host, std::size_t bytes) override {
    if (host == nullptr || bytes == 0) throw error("Map host memory", "emu", "empty range");
    if (reinterpret_cast<std::uintptr_t>(host) % 4096 != 0) throw error("Map host memory", "emu", "host memory must start on a 4 KiB boundary");
    const std::uint64_t bus = map_range("Map host memory", host, bytes, emu::memory_kind::host);
    return dma_buffer(static_cast<std::byte*>(host), nullptr, bytes, 4096, bus_range_pages(bus, bytes), memory_location::pinned_host,
                      [l = link_, bus] { unmap_quietly(*l, bus); });
  }

 protected:
  [[nodiscard]] std::string name() const override { return "emu"; }

  /// Bus addresses keep a buffer's offset within 2 MiB (`emu::dma_space`), so aligning the
  /// host address aligns the bus address for any controller page up to 2 MiB.
  [[nodiscard]] dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0) throw error("Allocate DMA memory", "emu", "0 bytes asked for");
    // The memory hooks hand out 4 KiB-aligned memory: reserve alignment - 4 KiB more and
    // start the buffer on the first aligned byte inside it.
    std::size_t rounded = 0, reserved = 0;
    if (cunvme::detail::round_up_overflows(bytes, std::size_t{4096}, rounded) || cunvme::detail::add_overflows(rounded, alignment - 4096, reserved)) {
      throw error("Allocate DMA memory", "emu", std::to_string(bytes) + " bytes aligned to " + std::to_string(alignment) + " do not fit the address space");
    }
    const auto& hooks = ctrl_.config().memory;
    void* raw = hooks.allocate ? hooks.allocate(reserved) : std::aligned_alloc(4096, reserved);
    if (raw == nullptr) throw error("Allocate DMA memory", "emu", "out of memory for " + std::to_string(bytes) + " bytes");
    const std::uintptr_t at = (reinterpret_cast<std::uintptr_t>(raw) + alignment - 1) / alignment * alignment;
    auto* p = reinterpret_cast<std::byte*>(at);
    std::memset(p, 0, rounded);
    // The hook is copied: the buffer may free its memory after the emulator (and its
    // configuration) is gone.
    const auto release = [free_hook = hooks.release, raw, reserved] {
      if (free_hook) {
        free_hook(raw, reserved);
      } else {
        std::free(raw);
      }
    };
    std::uint64_t bus = 0;
    try {
      // The bus address aligned as the pointer is: controller pages may exceed 2 MiB (MPSMIN 10..15).
      bus = map_range("Allocate DMA memory", p, rounded, emu::memory_kind::host, alignment);
    } catch (...) {
      release();
      throw;
    }
    return dma_buffer(p, hooks.allocate ? p : nullptr, bytes, 4096, bus_range_pages(bus, rounded), memory_location::pinned_host,
                      [l = link_, bus, release] {
                        unmap_quietly(*l, bus);
                        release();
                      });
  }

 private:
  using link = backend_link<emu::controller*>;

  /// Registers [pointer, pointer + bytes) with the emulator's IOMMU; what it refuses (a range
  /// the bus cannot hold, an exhausted bus) comes back as `host::error` naming `operation`.
  [[nodiscard]] std::uint64_t map_range(const char* operation, void* pointer, std::size_t bytes, emu::memory_kind kind,
                                        std::uint64_t alignment = emu::dma_space::bus_granule) {
    try {
      return ctrl_.dma().map(pointer, bytes, kind, alignment);
    } catch (const std::exception& e) {
      throw error(operation, "emu", e.what());
    }
  }
  /// Takes a buffer's range out of the IOMMU while the emulator lives. It is gone already only
  /// if someone unmapped it through `emu_backend::controller().dma()`; then there is nothing
  /// left to do, and a release must not throw.
  static void unmap_quietly(link& l, std::uint64_t bus) noexcept {
    l.if_alive([bus](emu::controller* ctrl) { (void)ctrl->dma().try_unmap(bus); });
  }

  emu::controller& ctrl_;
  std::shared_ptr<link> link_;
};

/// Who besides CPU threads reaches a controller `host::open` brings up: nobody (the default),
/// or GPU threads too (`host::gpu_reach()`, <cunvme/host/gpu/gpu_reach.cuh>, CUDA code only). An
/// opaque option, so `open`'s callers name no emulator or CUDA type. A real controller's BAR
/// and DMA memory are registered for GPU threads at bring-up (`registrar`); an emulated
/// controller must know when it is built, since its BAR, CMB and DMA copies are placed then
/// (`emu::memory_hooks`).
class memory_reach {
 public:
  memory_reach() = default;

  /// Reach through the emulator's memory hooks `make` returns (called once per emulated
  /// controller opened with this reach), and through `registrar` for what a backend maps
  /// that GPU threads cannot use yet (`register_backend::needs_gpu_registration`).
  [[nodiscard]] static memory_reach for_gpu(std::function<emu::memory_hooks()> make, host_registrar registrar, gpu_exporter exporter = {}) {
    memory_reach r;
    r.make_ = std::move(make);
    r.registrar_ = std::move(registrar);
    r.exporter_ = std::move(exporter);
    return r;
  }

  /// Whether anything beyond CPU threads is asked for.
  [[nodiscard]] bool beyond_cpu() const noexcept { return static_cast<bool>(make_) || static_cast<bool>(registrar_); }

  /// Installs the hooks in an emulated controller's configuration; the CPU-only reach leaves
  /// it as it is.
  void configure(emu::controller_config& config) const {
    if (make_) config.memory = make_();
  }
  /// What registers host mappings for GPU threads; empty for the CPU-only reach.
  [[nodiscard]] const host_registrar& registrar() const noexcept { return registrar_; }
  /// What exports GPU memory to the owner of a shared controller; empty for the CPU-only reach.
  [[nodiscard]] const gpu_exporter& exporter() const noexcept { return exporter_; }

 private:
  std::function<emu::memory_hooks()> make_;
  host_registrar registrar_;
  gpu_exporter exporter_;
};

/// An emulated controller in this process, driven through its BAR like any other.
class emu_backend final : public register_backend {
 public:
  explicit emu_backend(emu::controller_config config = {}) : ctrl_(std::move(config)), memory_(ctrl_) {}

  [[nodiscard]] std::string name() const override { return "emu"; }
  [[nodiscard]] std::byte* bar() const override { return ctrl_.bar(); }
  [[nodiscard]] std::size_t bar_size() const override { return ctrl_.bar_size(); }
  /// The BAR's memory file where the emulator was built with a shared BAR0 (`emu:shared`).
  [[nodiscard]] shareable_bar bar_for_other_processes() const override { return {ctrl_.bar_file(), 0, ctrl_.bar_size()}; }
  // Registers go through the emulator's register file (read-only ones never show a write);
  // doorbells land in bar(), where GPU threads store them too.
  // An offset outside BAR0 or not 4-byte aligned is the emulator's std::out_of_range,
  // reported as the host's error.
  [[nodiscard]] std::uint32_t read32(std::uint32_t offset) const override {
    try {
      return ctrl_.read_register(offset);
    } catch (const std::out_of_range& e) {
      throw error("Read register", "emu", e.what());
    }
  }
  void write32(std::uint32_t offset, std::uint32_t value) const override {
    try {
      device_->write_register(offset, value);
    } catch (const std::out_of_range& e) {
      throw error("Write register", "emu", e.what());
    }
  }
  [[nodiscard]] std::byte* cmb() const override { return cmb_mapped_ ? ctrl_.cmb() : nullptr; }
  [[nodiscard]] std::size_t cmb_size() const override { return cmb_mapped_ ? ctrl_.cmb_size() : 0; }
  [[nodiscard]] std::uint64_t cmb_bus_address() const override { return cmb_mapped_ ? emu::controller::suggested_cmb_address : 0; }
  void map_cmb(unsigned, std::uint64_t offset, std::uint64_t bytes) override {
    if (ctrl_.cmb() == nullptr) throw error("Map CMB", "emu", "the emulated controller has no CMB (set cmb_bytes)");
    if (offset != 0 || bytes > ctrl_.cmb_size()) throw error("Map CMB", "emu", "CMBLOC/CMBSZ describe more than the emulated CMB");
    cmb_mapped_ = true;
  }
  [[nodiscard]] dma_allocator& memory() override { return memory_; }
  /// Built with CUDA memory hooks, its BAR, CMB and DMA memory are GPU-usable from the start;
  /// without them they are plain memory a `host_registrar` registers as a real backend's.
  [[nodiscard]] bool needs_gpu_registration() const override { return !ctrl_.config().memory.allocate; }
  [[nodiscard]] bool bar_is_io_memory() const override { return false; }
  [[nodiscard]] std::string timeout_cause(std::chrono::nanoseconds recent) const override {
    return emu::copy_stall_note(ctrl_.stats().copies, static_cast<std::uint64_t>(std::max<std::int64_t>(recent.count(), 0)));
  }

  /// The emulator itself: its namespaces' bytes, counters, fault counters.
  [[nodiscard]] emu::controller& controller() noexcept { return ctrl_; }

 private:
  emu::controller ctrl_;
  emu::controller* const device_ = &ctrl_;  // MMIO writes from the const register interface
  emu_allocator memory_;
  bool cmb_mapped_ = false;
};

namespace detail {

/// A number of an `emu:fault=` field: decimal, or hexadecimal after 0x (statuses and opcodes
/// are written in hex in the specification); nullopt unless the whole text is one in [0, max].
[[nodiscard]] inline std::optional<std::uint64_t> fault_number(std::string_view text, std::uint64_t max) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || value > max) return std::nullopt;
  return value;
}

/// One `emu:fault=` rule, `COMMANDS:FIELD:…` (`rule` counts from 1, for messages): COMMANDS is
/// read, write, flush, write_zeroes, dsm, io (any I/O command) or admin (any admin command),
/// narrowed by opcode=N for io and admin; exactly one action: status=S (S = SCT << 8 | SC, a
/// status of the specification's table, dnr=0 to post it retryable), delay_us=N, lose or
/// fatal; nth=N or fraction=F to pick commands, max=N firings at most, lba=A-B or lba=A and
/// sqid=N to narrow them. What `emu::fault_injector` refuses is refused here, naming the rule.
[[nodiscard]] inline emu::fault_rule parse_fault_rule(std::string_view text, std::size_t rule, std::string_view uri) {
  const auto colon = text.find(':');
  const std::string_view commands = text.substr(0, colon);
  uri_options f(colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1), uri, ':',
                "fault rule " + std::to_string(rule) + " ('" + std::string(text) + "'): ");
  emu::fault_rule r;
  struct named_opcode {
    std::string_view name;
    spec::nvm_opcode opcode;
  };
  constexpr named_opcode io_commands[] = {{"read", spec::nvm_opcode::read},
                                          {"write", spec::nvm_opcode::write},
                                          {"flush", spec::nvm_opcode::flush},
                                          {"write_zeroes", spec::nvm_opcode::write_zeroes},
                                          {"dsm", spec::nvm_opcode::dataset_management}};
  for (const named_opcode& c : io_commands) {
    if (c.name == commands) r.opcode = static_cast<std::uint8_t>(c.opcode);
  }
  r.admin = commands == "admin";
  if (!r.opcode && !r.admin && commands != "io") {
    f.fail("'" + std::string(commands) + "' is no class of commands: read, write, flush, write_zeroes, dsm, io or admin");
  }
  if (const auto opcode = f.text("opcode")) {
    if (r.opcode) f.refuse("opcode", "'opcode' goes with io or admin; '" + std::string(commands) + "' names its opcode already");
    const auto value = fault_number(*opcode, 0xff);
    if (!value) f.refuse("opcode", "'opcode' needs a number 0..255 (decimal, or hex after 0x)");
    r.opcode = static_cast<std::uint8_t>(*value);
  }
  int actions = 0;
  const auto status = f.text("status");
  if (status) {
    ++actions;
    const auto value = fault_number(*status, 0x7ff);
    if (!value) f.refuse("status", "'status' needs a number SCT << 8 | SC, 0x000..0x7ff (0x281: Unrecovered Read Error)");
    r.status = static_cast<spec::status>(*value);
    bool listed = false;
    for (const auto& row : spec::status_names()) listed = listed || row.value == r.status;
    if (!listed) f.refuse("status", std::string(*status) + " is not a status of the specification's table (spec/status.cuh)");
  }
  if (const auto us = f.number("delay_us", 1, 3'600'000'000)) {
    ++actions;
    r.action = emu::fault_action::add_delay;
    r.delay_ns = *us * 1000;
  }
  if (f.flag("lose")) {
    ++actions;
    r.action = emu::fault_action::lose_completion;
  }
  if (f.flag("fatal")) {
    ++actions;
    r.action = emu::fault_action::controller_fatal;
  }
  if (actions == 0) f.fail("needs an action: status=S, delay_us=N, lose or fatal");
  if (actions > 1) f.fail("gives more than one action (status, delay_us, lose, fatal): give one action a rule");
  if (const auto dnr = f.number("dnr", 0, 1)) {
    if (!status) f.refuse("dnr", "'dnr' (Do Not Retry) goes with a 'status' rule");
    r.dnr = *dnr == 1;
  }
  r.nth = f.number("nth", 1, ~std::uint64_t{0}).value_or(0);
  if (const auto fraction = f.text("fraction")) {
    const auto [end, ec] = std::from_chars(fraction->data(), fraction->data() + fraction->size(), r.fraction);
    if (ec != std::errc{} || end != fraction->data() + fraction->size()) f.refuse("fraction", "'fraction' needs a decimal number in [0, 1]");
  }
  if (r.nth == 0 && r.fraction == 0) f.fail("needs nth=N (the Nth matching command) or fraction=F (that share of them)");
  if (const auto max = f.number("max", 1, ~std::uint64_t{0})) r.max_fires = *max;
  if (const auto sqid = f.number("sqid", 0, 0xffff)) r.sqid = static_cast<std::uint16_t>(*sqid);
  if (const auto lba = f.text("lba")) {
    const auto dash = lba->find('-');
    const auto first = fault_number(lba->substr(0, dash), ~std::uint64_t{0});
    const auto last = dash == std::string_view::npos ? first : fault_number(lba->substr(dash + 1), ~std::uint64_t{0});
    if (!first || !last) f.refuse("lba", "'lba' needs FIRST-LAST or one LBA");
    r.lba_first = *first;
    r.lba_last = *last;
  }
  f.finish();
  if (const auto why = emu::fault_injector::problem(r)) f.fail(*why);
  return r;
}

/// The rules of `emu:fault=RULE[+RULE…]`, in order.
[[nodiscard]] inline std::vector<emu::fault_rule> parse_fault_rules(std::string_view rules, std::string_view uri) {
  std::vector<emu::fault_rule> parsed;
  for (;;) {
    const auto plus = rules.find('+');
    const std::string_view rule = rules.substr(0, plus);
    if (rule.empty()) throw error("Open", std::string(uri), "fault rule " + std::to_string(parsed.size() + 1) + " is an empty rule: rules are joined by single '+'");
    parsed.push_back(parse_fault_rule(rule, parsed.size() + 1, uri));
    if (plus == std::string_view::npos) return parsed;
    rules.remove_prefix(plus + 1);
  }
}

/// `emu:` options: lba=512|4096, blocks=N, namespaces=1..1024, file=PATH (the namespaces'
/// bytes: ⌈size / block⌉ blocks unless `blocks` is given, `emu::namespace_config::from_file`), cmb_mb=0..4095,
/// timing=none|gen4-tlc|datacenter-gen4|scm, workers=1..1024, pin_granule_mb=1..2^20 (a power
/// of two), pin_ahead=N and pin_threads=0..64 (`emu::pinning_config`: how a namespace is pinned
/// for copies to and from GPU memory), mpsmin=0..15 (CAP.MPSMIN: the
/// smallest controller page is 2^(12 + mpsmin) bytes), and the flags (bare, =1/true or
/// =0/false) pattern (every namespace filled with `pattern_word`), readonly (Write, Write Zeroes and deallocation
/// fail with Namespace Is Write Protected; a file is opened read-only), spin (worker threads poll without ever sleeping: for latency measurements, at a
/// busy core per thread; or idle_spins=N polls before sleeping idle_us=1..10^6 µs per poll,
/// `emu::idle_policy`: fewer spins and longer sleeps trade latency for host CPU), nodata (Read and Write are checked and complete but copy no data:
/// `emu::controller_config::move_data`, for command-rate measurements); ms=0..4096 (metadata
/// bytes per block, LBAF.MS) with mset=1 (extended LBAs: metadata at the end of each block) or
/// mset=0 (the default: a separate metadata buffer through MPTR), as QEMU's nvme-ns options;
/// fault=RULE[+RULE…] (`parse_fault_rule`) with fault_seed=N (default 1); shared (BAR0 in a
/// memory file, for a controller other processes attach to: host/sharing/).
[[nodiscard]] inline emu::controller_config parse_emu(std::string_view options, std::string_view uri, bool& fill_pattern) {
  constexpr std::uint64_t max = ~std::uint64_t{0};
  uri_options o(options, uri);
  emu::controller_config config;
  emu::namespace_config ns = emu::namespace_config::in_memory(512, 1ull << 17);  // 131072 blocks: 64 MiB, 512 MiB with lba=4096
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
  if (const auto mb = o.number("pin_granule_mb", 1, 1u << 20)) {
    config.pinning.granule_bytes = *mb << 20;
    try {
      emu::detail::pinned_granules::check_granule(config.pinning.granule_bytes);  // the controller's own rule
    } catch (const std::invalid_argument& e) {
      o.refuse("pin_granule_mb", e.what());
    }
  }
  if (const auto ahead = o.number("pin_ahead", 0, 1u << 20)) config.pinning.ahead = static_cast<unsigned>(*ahead);
  if (const auto threads = o.number("pin_threads", 0, 64)) config.pinning.threads = static_cast<unsigned>(*threads);
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
  config.shared_bar = o.flag("shared");
  ns.read_only = o.flag("readonly");
  // The pattern is written into the namespace when it opens: a read-only file cannot take it.
  if (fill_pattern && ns.read_only) o.refuse("pattern", "'pattern' writes the namespace, which 'readonly' forbids");
  if (const auto ms = o.number("ms", 0, 4096)) ns.metadata_size = static_cast<std::uint16_t>(*ms);
  if (const auto mset = o.number("mset", 0, 1)) {
    if (ns.metadata_size == 0) o.refuse("mset", "'mset' needs metadata: give 'ms' (bytes per block) too");
    ns.extended_lba = *mset == 1;
  }
  const auto idle_spins = o.number("idle_spins", 0, ~std::uint32_t{0});
  const auto idle_us = o.number("idle_us", 1, 1'000'000);
  if (o.flag("spin")) {
    if (idle_spins || idle_us) o.refuse("spin", "'spin' (never sleep) contradicts 'idle_spins' and 'idle_us' (how to sleep)");
    config.idle.spins = ~std::uint32_t{0};  // workers never sleep between polls: lowest latency, a core each
  }
  if (idle_spins) config.idle.spins = static_cast<std::uint32_t>(*idle_spins);
  if (idle_us) config.idle.sleep = std::chrono::microseconds(*idle_us);
  if (const auto faults = o.text("fault")) config.faults = parse_fault_rules(*faults, uri);
  if (const auto seed = o.number("fault_seed", 0, max)) {
    if (config.faults.empty()) o.refuse("fault_seed", "'fault_seed' seeds the 'fault' rules' fraction draws: give 'fault' too");
    config.fault_seed = *seed;
  }
  o.finish();
  if (ns.lba_count > max / ns.stored_block_bytes()) {
    o.refuse("blocks", "'blocks' of " + std::to_string(ns.stored_block_bytes()) + " bytes exceed 2^64 bytes");
  }
  config.namespaces.assign(count, ns);
  return config;
}

}  // namespace detail

/// The emulator an `emu:` URI's options describe (`host::open`'s "emu" scheme), its namespaces
/// filled with `pattern_word` where the options say `pattern`. Throws `host::error` naming the
/// URI for a bad option or a combination the emulator cannot build, and for whatever else
/// stops it being built (a file that cannot be opened or mapped: the error keeps the OS's code).
[[nodiscard]] inline std::unique_ptr<emu_backend> open_emulator(std::string_view options, std::string_view uri, const memory_reach& reach) {
  const std::string_view rest = options;
  bool fill_pattern = false;
  emu::controller_config config = detail::parse_emu(rest, uri, fill_pattern);
  reach.configure(config);
  std::unique_ptr<emu_backend> backend;
  try {
    backend = std::make_unique<emu_backend>(std::move(config));
  } catch (const error&) {
    throw;
  } catch (const std::system_error& e) {
    // The OS refused: the file cannot be opened, sized or mapped, a thread cannot start.
    throw error("Open", std::string(uri), e.code(), e.what());
  } catch (const std::exception& e) {
    // A combination of in-range values the emulator cannot build (a file too short, say:
    // std::invalid_argument), memory the hooks could not get (std::bad_alloc, cuda_error).
    throw error("Open", std::string(uri), e.what());
  }
  if (fill_pattern) {
    for (std::uint32_t nsid = 1; nsid <= backend->controller().config().namespaces.size(); ++nsid) {
      auto& store = backend->controller().store(nsid);
      store.with_write_access(0, store.file_bytes(), [&](std::byte* p) {
        for (std::uint64_t o = 0; o + 8 <= store.file_bytes(); o += 8) {
          const std::uint64_t w = pattern_word(o);
          std::memcpy(p + o, &w, 8);
        }
      });
    }
  }
  return backend;
}

}  // namespace host
CUNVME_NAMESPACE_END
