// Stopping and restarting a controller: Abort (5.1), the one timeout policy, controller reset
// (3.7.2: CC.EN → 0, then bring-up again with the live queue pairs re-created), halting a
// controller whose queues or commands cannot be ended otherwise, and shutdown (CC.SHN).
// Included by controller.cuh after the queue pair, whose memory a reset re-uses.
//
// The recovery rule, for every path that waits for an I/O command (queue_pair's own I/O,
// readers and kernels on an io_queue, cunvme::device's copies): a command that times out is
// aborted; where the Abort fails or the command's completion does not follow, the controller
// is stopped (CC.EN = 0) before the caller gets its buffer back, and the error says so. A
// stopped (or fatal) controller stays so until `controller::reset()`, which its owner calls:
// the caller for a controller it opened (queue pairs, io_queues and volumes never reset a
// controller, whose other queue pairs' commands a reset ends), `cunvme::device` in its
// recovery (`recover()`, and the next `copy_n` or `copies_in_flight()`) for its own.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// What the timeout policy (`controller::end_timed_out`, defined with the rest of recovery in
/// recovery.cuh) did with commands whose waiters timed out.
struct timeout_outcome {
  std::uint32_t aborted = 0;      ///< their completions came (Abort brought them, or they were late): they move no more data, their CIDs are free
  std::uint32_t not_aborted = 0;  ///< the Abort failed, or the command's completion did not follow it in time
  bool fatal = false;             ///< the controller is in fatal status (CSTS.CFS): it processes nothing, aborts nothing
  bool stopped = false;           ///< for `not_aborted`, the controller was stopped (CC.EN = 0): no more DMA
  bool abort_disabled = false;    ///< `controller_options::abort_on_timeout` is off: left abandoned, holding their CIDs

  /// Whether only `controller::reset()` brings the queues back into use: the controller was
  /// stopped, is fatal, or would not stop (then the reset fails too, and nothing it was given
  /// may be released).
  [[nodiscard]] bool needs_reset() const noexcept { return fatal || (not_aborted != 0 && !abort_disabled); }
  timeout_outcome& operator+=(const timeout_outcome& o) noexcept {
    aborted += o.aborted, not_aborted += o.not_aborted;
    fatal = fatal || o.fatal, stopped = stopped || o.stopped, abort_disabled = abort_disabled || o.abort_disabled;
    return *this;
  }
  /// What was done, as the tail of an error message ("; Abort brought …"); empty for nothing.
  [[nodiscard]] std::string describe() const;
};

inline bool controller::abort(std::uint16_t sqid, std::uint16_t cid) {
  const auto cqe = admin_command(spec::make_abort(sqid, cid), "Abort command " + std::to_string(cid) + " of SQ " + std::to_string(sqid));
  return cqe.status() == spec::status::successful_completion && !spec::abort_fields::not_aborted::get(cqe.dw0);
}

/// Each command of `cids` is aborted (Abort), and where an Abort fails, or the command's
/// completion (`completed(cid)`, which may drain the CQ) does not come within `wait`, the
/// controller is stopped (CC.EN = 0) so that no command moves data into memory its caller gets
/// back. Every path that times out an I/O command ends here.
inline timeout_outcome controller::end_timed_out(std::uint16_t sqid, const std::vector<std::uint16_t>& cids, std::chrono::nanoseconds wait,
                                                 const std::function<bool(std::uint16_t)>& completed) {
  timeout_outcome out;
  if (cids.empty()) return out;
  if (!options_.abort_on_timeout) {
    out.not_aborted = static_cast<std::uint32_t>(cids.size());
    out.abort_disabled = true;
    return out;
  }
  // A fatal controller answers no Abort and processes nothing more; stopping it would clear
  // CSTS.CFS, the one sign of what happened, which reset() clears anyway.
  if (csts().cfs()) {
    out.not_aborted = static_cast<std::uint32_t>(cids.size());
    out.fatal = true;
    return out;
  }
  for (const std::uint16_t cid : cids) {
    bool ended = completed(cid);  // it may have come since its waiter gave up
    if (!ended) {
      bool asked = false;
      try {
        asked = abort(sqid, cid);
      } catch (const error&) {
        // The admin queue does not answer either (an Abort without completion stopped the
        // controller already): not aborted.
      }
      // The Abort's completion may come before the command's (5.1): the command moves data
      // until its own completion is posted.
      const auto until = std::chrono::steady_clock::now() + wait;
      while (asked && !(ended = completed(cid)) && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    (ended ? out.aborted : out.not_aborted) += 1;
  }
  // A command still running may write a buffer its caller is about to release: stop the
  // controller, as a driver resets one whose command will not abort.
  if (out.not_aborted != 0) out.stopped = halt();
  return out;
}

inline std::string timeout_outcome::describe() const {
  if (abort_disabled) return "; abort_on_timeout is off: the command keeps its CID until its completion comes, and may still write its buffer";
  if (fatal) return "; the controller is in fatal status (CSTS.CFS) and processes no command: reset() brings it back";
  if (not_aborted == 0) {
    return aborted == 0 ? "" : "; Abort brought its completion: the command moves no more data and its CID is free again";
  }
  return "; the controller did not abort " + std::to_string(not_aborted) + " command(s) (Abort)" +
         (stopped ? ", so it was stopped (CC.EN = 0) and moves no more data: reset() brings it back"
                  : " and does not stop (CSTS.RDY stays 1): they may still write their buffers; release none of its memory");
}

inline std::string queue_pair::timeout_report() { return end_timed_out().describe(); }

inline timeout_outcome queue_pair::end_timed_out() {
  // Handled before and completed late since: the CID may be in use again, by a command this
  // run must handle.
  std::uint64_t late = 0;
  std::erase_if(abandoned_, [&](std::uint16_t cid) { return state_of(cid) != record_state::abandoned && ++late != 0; });
  ctrl_.count_io(0, 0, late);
  std::vector<std::uint16_t> timed_out;
  for (std::uint16_t cid = 0; cid < host_view_.cids(); ++cid) {
    if (state_of(cid) == record_state::abandoned && std::find(abandoned_.begin(), abandoned_.end(), cid) == abandoned_.end()) {
      timed_out.push_back(cid);
    }
  }
  const timeout_outcome out = ctrl_.end_timed_out(qid_, timed_out, timeout_, [this](std::uint16_t cid) {
    // The host drains where it reaches the queue (no submitter runs meanwhile): the aborted
    // command's completion frees its record. Elsewhere a drain by the next command will.
    if (host_io_ && state_of(cid) == record_state::abandoned) {
      if (with_doorbell([&](auto doorbell) { return completion::drain<decltype(doorbell)>(host_view_); }) == 0) std::this_thread::yield();
    }
    return state_of(cid) != record_state::abandoned;
  });
  // Those still abandoned hold their CIDs until a late completion or a reset.
  for (const std::uint16_t cid : timed_out) {
    if (state_of(cid) == record_state::abandoned) abandoned_.push_back(cid);
  }
  return out;
}

inline void controller::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (owner_) return;  // the owner shuts the controller down; its queue pairs went already
  const auto cc_off = spec::to_underlying(spec::register_offset::cc);
  if (csts().rdy() && !csts().cfs()) {
    backend_->write32(cc_off, spec::cc_register{backend_->read32(cc_off)}.set_shn(spec::shutdown_notification::normal).raw);
    if (!wait_until([&] { return csts().shst() == spec::shutdown_status::shutdown_complete; }, ready_timeout_)) {
      disable();
      throw error("Shutdown", name_, "CSTS.SHST did not report shutdown complete within " + std::to_string(ready_timeout_.count()) + " ms");
    }
  }
  disable();
}

inline void controller::disable() {
  const auto cc_off = spec::to_underlying(spec::register_offset::cc);
  backend_->write32(cc_off, spec::cc_register{backend_->read32(cc_off)}.set_en(false).raw);
  if (!wait_until([&] { return !csts().rdy(); }, ready_timeout_)) {
    throw error("Disable", name_, "CSTS.RDY still 1 " + std::to_string(ready_timeout_.count()) + " ms after CC.EN was cleared");
  }
}

inline void controller::disable_if_enabled() {
  if (spec::cc_register{backend_->read32(spec::to_underlying(spec::register_offset::cc))}.en() || csts().rdy()) disable();
}

inline void controller::require_running(const std::string& operation) const {
  if (stopped()) {
    throw error(operation, name_, "controller not ready — reset() brings it back (cunvme stopped it, CC.EN = 0, after a command that would not end)");
  }
}

inline bool controller::halt() noexcept {
  // Attached: CC.EN is the owner's, which stops the controller where its admin commands end
  // without completion; until then, memory given to the controller stays given.
  if (owner_) return false;
  try {
    disable();
    stopped_.store(true, std::memory_order_release);
    return true;
  } catch (...) {
    return false;
  }
}

inline void controller::keep_forever() noexcept {
  new admin_queue(std::move(admin_));
  (void)shadow_.release();
  (void)event_index_.release();
}

inline void controller::reset() {
  if (owner_) throw error("Reset", name_, "attached to a controller owned by " + owner_->owner() + ": only the owner resets it");
  {
    std::scoped_lock lock(admin_mutex_);
    if (lent_ != 0) {
      throw error("Reset", name_, std::to_string(lent_) + " queue identifier(s) are lent to attached processes (host::sharing::controller_owner): "
                                  "CC.EN = 0 would delete their queues under them; stop serving first");
    }
  }
  std::unique_lock state(state_mutex_);
  if (shut_down_) throw error("Reset", name_, "the controller was shut down");
  std::scoped_lock live_lock(live_mutex_);
  // Every queue pair must be re-creatable before the controller is stopped.
  for (const queue_pair* q : live_) {
    if (!q->can_forget_commands()) {
      throw error("Reset", name_, "I/O queue " + std::to_string(q->id()) +
                                      " is in memory the host can neither address nor zero (provided GPU memory without copy hooks: "
                                      "create it through host::io_queue with io_queue_memory's copy_in/copy_out); nothing was reset");
    }
  }
  // CC.EN → 0 first: once CSTS.RDY reads 0 the controller fetches, executes and moves
  // nothing, and every I/O queue is gone (3.7.2). Only then are queues and records touched.
  try {
    disable();
  } catch (const error& e) {
    throw error("Reset", name_, std::string(e.what()) + ": the controller may still DMA to the memory it was given; release none of it");
  }
  const std::vector<queue_pair*>& live = live_;
  for (queue_pair* q : live) q->forget_commands();
  {
    // Another thread's admin command (misuse during a reset) waits rather than using the
    // admin queue being replaced.
    std::scoped_lock lock(admin_mutex_);
    setup_admin_queues();
  }
  enable();
  // Enabled again: admin commands (and, once re-created, the queues' I/O) run.
  stopped_.store(false, std::memory_order_release);
  negotiate_queues();
  // The live queue pairs keep their identifiers (taken from them, not from the table
  // negotiate_queues just cleared, so a reset that failed half-way can be retried).
  {
    std::scoped_lock lock(admin_mutex_);
    for (queue_pair* q : live) {
      if (q->id() >= used_qids_.size()) {
        throw error("Reset", name_, "the controller now grants " + std::to_string(granted_) + " I/O queue pairs, fewer than queue " + std::to_string(q->id()) + " needs");
      }
      used_qids_[q->id()] = true;
    }
  }
  if (shadow_) {
    std::memset(shadow_->data(), 0, shadow_->size());
    std::memset(event_index_->data(), 0, event_index_->size());
    admin(spec::make_doorbell_buffer_config(shadow_->bus(), event_index_->bus()), "Doorbell Buffer Config");
  }
  if (backend_->cmb() != nullptr) enable_cmb_at_mapping();
  for (queue_pair* q : live) {
    const std::string which = std::to_string(q->id());
    start_shadow_doorbells(q->id());
    admin(spec::make_create_io_cq(q->id(), q->entries(), q->cq_bus()), "Re-create I/O CQ " + which);
    admin(spec::make_create_io_sq(q->id(), q->entries(), q->sq_bus(), q->id()), "Re-create I/O SQ " + which);
  }
  ++resets_;
}

}  // namespace host
CUNVME_NAMESPACE_END
