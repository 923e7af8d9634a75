// Stopping and restarting a controller: Abort (5.1), controller reset (3.7.2: CC.EN → 0, then
// bring-up again with the live queue pairs re-created), halting a controller whose queues or
// commands cannot be ended otherwise, and shutdown (CC.SHN). Included by controller.cuh after
// the queue pair, whose memory a reset re-uses.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/queue_pair.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/status.cuh>

#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

inline bool controller::abort(std::uint16_t sqid, std::uint16_t cid) {
  const auto cqe = admin_command(spec::make_abort(sqid, cid), "Abort command " + std::to_string(cid) + " of SQ " + std::to_string(sqid));
  return cqe.status() == spec::status::successful_completion && !spec::abort_fields::not_aborted::get(cqe.dw0);
}

inline void controller::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
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
