// The emulated controller's register file (BAR0 below the doorbells, NVMe 2.0 base
// specification 3.1) and its controller-configuration state machine: CC.EN enable and reset
// (3.5.1, 3.7.2), CSTS, shutdown (CC.SHN/CSTS.SHST), the Controller Memory Buffer's CMBMSC,
// and the raw doorbell words the host stores into BAR0's memory.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/controller_state.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

class register_file : public controller_state {
 protected:
  using controller_state::controller_state;

  /// The host's MMIO read of BAR0 (emu::controller::read_register says what it returns).
  [[nodiscard]] std::uint32_t mmio_read(std::uint32_t offset) const {
    check_register_offset(offset, "read_register");
    if (offset >= spec::to_underlying(spec::register_offset::doorbells)) return load32(offset);
    if (offset != spec::to_underlying(spec::register_offset::csts)) return register_word(offset).load(std::memory_order_acquire);
    // A reset the host asked for (CC.EN 1 → 0) clears CSTS.CFS (3.7.2). Until the admin thread
    // has done it, CFS reads 0 already, so a host that writes EN = 1 right after never sees the
    // fatal status its reset cleared. The counts are read before CSTS: the admin thread stores
    // the done count after the reset's CSTS, so a done count that matches means CSTS is read
    // from after that reset. Read after CSTS, a reset finishing in between passed a CFS read
    // from before it (emu_fuzz: the host took it for the new enable's, then read CSTS 0).
    const bool reset_pending =
        cc_disables_.load(std::memory_order_acquire) != cc_disables_done_.load(std::memory_order_acquire);
    std::uint32_t value = register_word(offset).load(std::memory_order_acquire);
    if (reset_pending) value &= ~spec::csts_register{}.set_cfs(true).raw;
    return value;
  }

  /// The host's MMIO write of BAR0 (as emu::controller::write_register).
  void mmio_write(std::uint32_t offset, std::uint32_t value) {
    check_register_offset(offset, "write_register");
    if (offset >= spec::to_underlying(spec::register_offset::doorbells)) {
      store32(offset, value);
      return;
    }
    write_register_file(offset, value);
  }

  void check_register_offset(std::uint32_t offset, const char* operation) const {
    if (offset % 4 != 0 || offset >= bar_size_ || bar_size_ - offset < 4) {
      throw std::out_of_range(std::string("emu::controller::") + operation + ": offset " + std::to_string(offset) +
                              " is not a 4-byte aligned offset inside BAR0's " + std::to_string(bar_size_) + " bytes");
    }
  }
  // Registers and doorbells are shared with the host (and GPU): accessed atomically so that
  // the doorbell's release/acquire pairs order the SQE and data accesses around them.
  [[nodiscard]] std::uint32_t load32(std::uint32_t offset) const noexcept {
    return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(bar_ + offset)).load(std::memory_order_acquire);
  }
  void store32(std::uint32_t offset, std::uint32_t value) const noexcept {
    std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(bar_ + offset)).store(value, std::memory_order_release);
  }
  // The registers below the doorbells live in `registers_`, the controller's copy, never in
  // the BAR memory the host can store into: a read-only register must never show a host's
  // write, not even until the admin thread would notice it (read_register/write_register).
  [[nodiscard]] std::uint64_t load64(spec::register_offset r) const noexcept {
    const auto off = spec::to_underlying(r);
    return std::uint64_t{register_word(off).load(std::memory_order_acquire)} |
           (std::uint64_t{register_word(off + 4).load(std::memory_order_acquire)} << 32);
  }
  void store64(spec::register_offset r, std::uint64_t value) noexcept {
    const auto off = spec::to_underlying(r);
    set_register_word(off, static_cast<std::uint32_t>(value));
    set_register_word(off + 4, static_cast<std::uint32_t>(value >> 32));
  }
  [[nodiscard]] std::uint32_t load(spec::register_offset r) const noexcept {
    return register_word(spec::to_underlying(r)).load(std::memory_order_acquire);
  }
  void store(spec::register_offset r, std::uint32_t v) noexcept {
    set_register_word(spec::to_underlying(r), v);
  }
  [[nodiscard]] std::atomic<std::uint32_t>& register_word(std::uint32_t offset) const noexcept { return registers_[offset / 4]; }
  /// The one way a register changes. A shared BAR0 (`controller_config::shared_bar`) also
  /// shows it in the BAR memory, where attached processes read it (and never write it: their
  /// backend refuses); the controller itself goes by its own copy only.
  void set_register_word(std::uint32_t offset, std::uint32_t value) const noexcept {
    register_word(offset).store(value, std::memory_order_release);
    if (config_.shared_bar && bar_ != nullptr) store32(offset, value);
  }

  void write_capability_registers() {
    cap_ = spec::cap_register{}
               .set_mqes(static_cast<std::uint16_t>(config_.max_queue_entries - 1))
               .set_cqr(config_.contiguous_queues_required)
               .set_to(config_.timeout)
               .set_dstrd(config_.doorbell_stride)
               .set_css(static_cast<std::uint8_t>(spec::cap_css::nvm_command_set))
               .set_mpsmin(config_.mpsmin)
               .set_mpsmax(config_.mpsmax)
               .set_cmbs(config_.cmb_bytes != 0);
    vs_ = spec::version_register::make(config_.version_major, static_cast<std::uint8_t>(config_.version_minor));
    store64(spec::register_offset::cap, cap_.raw);
    store(spec::register_offset::vs, vs_.raw);
    update_csts([](spec::csts_register& c) { c = {}; });
  }

  /// CSTS is changed by the admin thread and, on a fatal error, by any worker.
  template <class Change>
  void update_csts(Change change) {
    std::scoped_lock lock(csts_mutex_);
    change(csts_);
    store(spec::register_offset::csts, csts_.raw);
  }

  /// The host's MMIO write to the register file (below the doorbells): only the read/write
  /// fields take the value; read-only and reserved registers ignore it, as on hardware.
  void write_register_file(std::uint32_t offset, std::uint32_t value) {
    using spec::register_offset;
    std::scoped_lock lock(register_write_mutex_);
    const auto is = [offset](register_offset r, std::uint32_t words = 1) {
      return offset >= spec::to_underlying(r) && offset < spec::to_underlying(r) + 4 * words;
    };
    if (is(register_offset::cc)) {
      const spec::cc_register before{load(register_offset::cc)};
      // Every 1 → 0 write of EN is a reset (3.7.2), even if EN is set again before the admin
      // thread looks: it counts them, it does not sample EN.
      if (before.en() && !spec::cc_register{value}.en()) cc_disables_.fetch_add(1, std::memory_order_acq_rel);
      set_register_word(offset, value);
    } else if (is(register_offset::aqa) || is(register_offset::asq, 2) || is(register_offset::acq, 2)) {
      set_register_word(offset, value);
    } else if (is(register_offset::cmbmsc, 2) && cmb_ != nullptr) {
      set_register_word(offset, value);
      // CRE makes CMBLOC/CMBSZ readable at once (NVMe 1.4 CMBMSC); the mapping at CBA is the
      // admin thread's (handle_cmb).
      const bool cre = spec::cmbmsc_register{load64(register_offset::cmbmsc)}.cre();
      const auto loc = spec::cmbloc_register{}.set_bir(2).set_cdpmls(config_.cmb_mixed_data_locations).set_cdpcils(true);
      const auto sz = spec::cmbsz_register{}
                          .set_sqs(true)
                          .set_lists(true)
                          .set_rds(true)
                          .set_wds(true)
                          .set_szu(spec::cmb_size_unit::kib_4)
                          .set_sz(static_cast<std::uint32_t>(config_.cmb_bytes / 4096));
      store(register_offset::cmbloc, cre ? loc.raw : 0);
      store(register_offset::cmbsz, cre ? sz.raw : 0);
    }
    // Everything else (CAP, VS, CSTS, CMBLOC, CMBSZ, CMBSTS, CRTO, INTMS/INTMC under MSI-X,
    // NSSR without CAP.NSSRS, boot partitions, reserved space) is read-only here.
  }

  [[nodiscard]] std::uint32_t sq_doorbell(std::uint16_t qid) const noexcept {
    return spec::sq_tail_doorbell_offset(qid, config_.doorbell_stride);
  }
  [[nodiscard]] std::uint32_t cq_doorbell(std::uint16_t qid) const noexcept {
    return spec::cq_head_doorbell_offset(qid, config_.doorbell_stride);
  }

  /// A deleted queue's doorbells keep the last values written; only later writes are stray.
  void forget_doorbells(std::uint16_t qid) {
    stray_doorbell(qid, false) = load32(sq_doorbell(qid));
    stray_doorbell(qid, true) = load32(cq_doorbell(qid));
  }

  void go_fatal() {
    fatal_.store(true, std::memory_order_release);
    update_csts([](spec::csts_register& c) { c.set_cfs(true); });
  }

  // ---- CC state machine (the admin thread's) ----------------------------------------------------
  /// Reads CC and acts on it: a reset for every EN 1 → 0 write, an enable, RDY once the ready
  /// delay has passed. Returns whether anything changed; `cc` is the CC acted on.
  bool handle_cc(spec::cc_register& cc) {
    bool busy = false;
    // CC, the count of EN 1 -> 0 writes and AQA/ASQ/ACQ are read and acted on (reset,
    // enable, RDY) with host register writes held off. Acting on a snapshot, a host's
    // EN = 0 landing after it was lost for this pass: the controller went on to finish the
    // enable it had seen and raised RDY, and the host, which had read RDY = 0 (the enable
    // not yet acted on) and gone on with 3.7.2 (new admin queues, EN = 1), took that RDY
    // for its own; the counted reset then dropped it (CSTS 0) and re-attached the admin SQ
    // over a doorbell already rung (emu_fuzz). Before that, the count and CC were read
    // apart and the same happened with the old admin queues.
    std::scoped_lock lock(register_write_mutex_);
    const std::uint64_t disables = cc_disables_.load(std::memory_order_relaxed);
    cc = spec::cc_register{load(spec::register_offset::cc)};
    if (disables != cc_disables_seen_) {
      reset();
      cc_disables_seen_ = disables;
      cc_disables_done_.store(disables, std::memory_order_release);
      busy = true;
    }
    if (cc.en() && !enabled_) {
      begin_enable(cc);
      busy = true;
    } else if (!cc.en() && enabled_) {
      reset();
      busy = true;
    }
    if (enabled_ && !ready_.load(std::memory_order_relaxed) && !fatal_.load() && now_ns() >= ready_at_ns_) {
      ready_.store(true, std::memory_order_release);
      update_csts([](spec::csts_register& c) { c.set_rdy(true); });
    }
    return busy;
  }

  void begin_enable(spec::cc_register cc) {
    enabled_ = true;
    const spec::aqa_register aqa{load(spec::register_offset::aqa)};
    const std::uint64_t asq = load64(spec::register_offset::asq);
    const std::uint64_t acq = load64(spec::register_offset::acq);
    page_size_ = cc.page_size();
    // A configuration the controller cannot run is a fatal condition: CSTS.CFS, never ready.
    const bool valid = cc.mps() >= cap_.mpsmin() && cc.mps() <= cap_.mpsmax() && cc.css() == spec::cc_css::nvm_command_set &&
                       cc.ams() == spec::cc_ams::round_robin && aqa.asqs() >= 1 && aqa.acqs() >= 1 &&
                       (asq & (page_size_ - 1)) == 0 && (acq & (page_size_ - 1)) == 0 &&
                       attach_admin_queues(aqa.asqs() + 1u, asq, aqa.acqs() + 1u, acq);
    if (!valid || setup_failed_.load(std::memory_order_acquire)) {
      go_fatal();
      return;
    }
    ready_at_ns_ = now_ns() + static_cast<std::uint64_t>(std::chrono::nanoseconds(config_.ready_delay).count());
  }

  [[nodiscard]] bool attach_admin_queues(std::uint32_t sq_entries, std::uint64_t asq, std::uint32_t cq_entries, std::uint64_t acq) {
    const auto sq_region = dma_.find(asq, std::uint64_t{sq_entries} * sizeof(spec::submission_entry));
    const auto cq_region = dma_.find(acq, std::uint64_t{cq_entries} * sizeof(spec::completion_entry));
    if (!sq_region || !cq_region || cq_region->kind == memory_kind::cmb) return false;
    {
      std::scoped_lock lock(cqs_[0].mutex);
      init_cq(cqs_[0], cq_entries, acq);
    }
    std::scoped_lock lock(sqs_[0].mutex);
    init_sq(sqs_[0], 0, sq_entries, asq);
    store32(sq_doorbell(0), 0);
    store32(cq_doorbell(0), 0);
    return true;
  }

  /// CC.EN 1 → 0 (3.7.2 Controller Reset): every queue is deleted, outstanding commands and
  /// their completions are dropped, features return to defaults, CSTS.RDY falls.
  void reset() {
    ready_.store(false, std::memory_order_release);
    for (std::uint32_t q = 0; q <= config_.max_io_queues; ++q) {
      std::scoped_lock lock(sqs_[q].mutex, cqs_[q].mutex);
      sqs_[q].live = false;
      cqs_[q].live = false;
      cqs_[q].sq_refs = 0;
    }
    for (auto& e : engines_) {
      std::scoped_lock lock(e->pending_mutex);
      e->pending.clear();
    }
    for (std::uint32_t q = 0; q <= config_.max_io_queues; ++q) {
      cqs_[q].parked.store(0, std::memory_order_relaxed);
    }
    events_.reset();
    shadow_doorbells_.store(0, std::memory_order_release);
    event_indexes_.store(0, std::memory_order_release);
    allocated_sqs_ = allocated_cqs_ = config_.max_io_queues;
    volatile_write_cache_enabled_.store(config_.volatile_write_cache);
    for (std::uint32_t q = 1; q <= config_.max_io_queues; ++q) forget_doorbells(static_cast<std::uint16_t>(q));
    enabled_ = false;
    fatal_.store(false);
    update_csts([](spec::csts_register& c) { c = {}; });
  }

  void handle_shutdown(spec::cc_register cc) {
    const auto shn = cc.shn();
    if (shn == last_shn_) return;
    last_shn_ = shn;
    if (shn == spec::shutdown_notification::none) {
      update_csts([](spec::csts_register& c) { c.set_shst(spec::shutdown_status::normal_operation); });
      return;
    }
    update_csts([](spec::csts_register& c) { c.set_shst(spec::shutdown_status::shutdown_processing); });
    bool flushed = true;
    for (auto& n : namespaces_) {
      try {
        n.store.flush();
      } catch (const std::exception&) {
        flushed = false;
      }
    }
    update_csts([&](spec::csts_register& c) {
      c.set_shst(spec::shutdown_status::shutdown_complete);
      if (!flushed) c.set_cfs(true);  // data could not be made durable: report, don't pretend
    });
  }

  /// CMBMSC (NVMe 1.4+): CRE makes CMBLOC/CMBSZ readable, CMSE maps the CMB at CBA.
  void handle_cmb() {
    if (cmb_ == nullptr) return;
    const spec::cmbmsc_register msc{load64(spec::register_offset::cmbmsc)};
    const bool want = msc.cre() && msc.cmse();
    const std::uint64_t base = msc.controller_base_address();
    if (want == cmb_mapped_ && (!want || base == cmb_bus_)) return;
    if (cmb_mapped_) {
      // Only this thread maps and unmaps the CMB, and dma_space::map never places a buffer on
      // it, so the region is there; if it were not, there is nothing left to remove.
      (void)dma_.try_unmap(cmb_bus_);
      cmb_mapped_ = false;
    }
    spec::cmbsts_register cmbsts;
    if (want) {
      cmb_mapped_ = dma_.map_at(base, cmb_, config_.cmb_bytes, memory_kind::cmb);
      cmb_bus_ = base;
      if (!cmb_mapped_) cmbsts.set_cbai(true);
    }
    store(spec::register_offset::cmbsts, cmbsts.raw);
  }

  // The registers below the doorbells (load/store, read_register/write_register).
  std::unique_ptr<std::atomic<std::uint32_t>[]> registers_ =
      std::make_unique<std::atomic<std::uint32_t>[]>(spec::to_underlying(spec::register_offset::doorbells) / 4);
  std::mutex register_write_mutex_;  // host register writes; the admin thread's CC handling
  std::atomic<std::uint64_t> cc_disables_{0};       // CC.EN 1 → 0 writes by the host
  std::atomic<std::uint64_t> cc_disables_done_{0};  // of those, the resets the admin thread finished
  std::uint64_t cc_disables_seen_ = 0;              // admin thread only

  // Owned by the admin thread.
  spec::cap_register cap_{};
  spec::version_register vs_{};
  spec::csts_register csts_{};
  std::mutex csts_mutex_;
  bool enabled_ = false;
  std::uint64_t ready_at_ns_ = 0;
  spec::shutdown_notification last_shn_ = spec::shutdown_notification::none;
  bool cmb_mapped_ = false;
  std::uint64_t cmb_bus_ = 0;
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
