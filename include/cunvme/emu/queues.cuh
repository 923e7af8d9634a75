// The emulated controller's queues at work: fetching submission entries and posting
// completion entries (NVMe 2.0 base specification 3.3.1, 4.6): a completion is built, shaped
// by fault injection and the timing model, posted when due and the CQ has room, parked until
// then; completions for Asynchronous Event Requests (5.2) and the doorbell errors that raise them.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/doorbells.cuh>
#include <cunvme/emu/events.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

class queues : public doorbells {
 protected:
  using doorbells::doorbells;

  /// Reads the SQE at `head` and advances the head. A queue whose own memory is gone is
  /// a controller fatal condition: nothing sensible can continue.
  [[nodiscard]] bool fetch(const dma_space::view& mem, sq_state& sq, std::uint32_t head, spec::submission_entry& sqe) {
    if (!mem.read(sq.base + std::uint64_t{head} * sizeof sqe, &sqe, sizeof sqe)) {
      go_fatal();
      return false;
    }
    sq.head.store(head + 1 == sq.size ? 0 : head + 1, std::memory_order_release);
    return true;
  }

  /// Builds the completion, applies injected faults and the timing model, and queues it.
  void complete(engine& e, std::uint16_t sqid, std::uint16_t cqid, const spec::submission_entry& sqe, const outcome& o,
                std::uint64_t sequence) {
    const bool admin = sqid == 0;
    const bool has_lba = !admin && o.nsid != 0 && (sqe.opcode() == static_cast<std::uint8_t>(spec::nvm_opcode::read) ||
                                                   sqe.opcode() == static_cast<std::uint8_t>(spec::nvm_opcode::write) ||
                                                   sqe.opcode() == static_cast<std::uint8_t>(spec::nvm_opcode::write_zeroes));
    const auto nlb = static_cast<std::uint32_t>(spec::rw_fields::nlb::get(sqe.cdw12)) + 1u;
    const fault_decision f = faults_->decide(command_view{admin, sqid, sqe.cid(), sqe.opcode(), sequence, has_lba,
                                                          has_lba ? spec::starting_lba(sqe) : 0, has_lba ? nlb : 0});
    if (f.controller_fatal) {
      go_fatal();
      return;
    }
    spec::status status = o.status;
    bool dnr = status != spec::status::successful_completion;
    if (f.status) {
      status = *f.status;
      dnr = f.dnr;
    }
    if (status != spec::status::successful_completion) {
      errors_.log_command(sqid, sqe.cid(), status, o.lba, o.nsid ? o.nsid : sqe.nsid);
    }
    if (f.lose_completion) {
      completions_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    pending_completion pc;
    pc.sqid = sqid;
    pc.cqid = cqid;
    pc.cq_generation = cqs_[cqid].generation.load(std::memory_order_relaxed);
    pc.cqe.dw0 = o.dw0;
    pc.cqe.sqid = sqid;
    pc.cqe.cid = sqe.cid();
    pc.cqe.status_field = spec::cqe_status::make_status_field(status, false, dnr);
    pc.dnr = dnr;
    const std::uint64_t now = now_ns();
    pc.due_ns = now;
    if (!admin && config_.timing.enabled()) pc.due_ns = timing_->due_ns(now, o.bytes, o.is_write);
    pc.due_ns += f.extra_delay_ns;
    e.batch.push_back(pc);
  }

  /// Posts a batch's completions that are due (in a shuffled order when asked) and parks the rest.
  void dispatch_batch(engine& e, const dma_space::view& mem) {
    if (e.batch.empty()) return;
    if (config_.out_of_order_completions) std::shuffle(e.batch.begin(), e.batch.end(), e.rng);
    const std::uint64_t now = now_ns();
    for (const auto& pc : e.batch) {
      if (pc.due_ns <= now && post(mem, pc)) continue;
      park(e, pc);
    }
    e.batch.clear();
  }

  static bool later(const pending_completion& a, const pending_completion& b) { return a.due_ns > b.due_ns; }

  void park(engine& e, const pending_completion& pc) {
    cqs_[pc.cqid].parked.fetch_add(1, std::memory_order_relaxed);
    std::scoped_lock lock(e.pending_mutex);
    e.pending.push_back(pc);
    std::push_heap(e.pending.begin(), e.pending.end(), later);
  }

  /// Posts parked completions whose time has come; those whose CQ is full wait.
  bool post_due(engine& e) {
    std::vector<pending_completion>& due = e.due;
    due.clear();
    {
      std::scoped_lock lock(e.pending_mutex);
      const std::uint64_t now = now_ns();
      while (!e.pending.empty() && e.pending.front().due_ns <= now) {
        std::pop_heap(e.pending.begin(), e.pending.end(), later);
        due.push_back(e.pending.back());
        e.pending.pop_back();
        cqs_[due.back().cqid].parked.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (due.empty()) return false;
    bool posted = false;
    const dma_space::view mem = dma_.pin();
    for (const auto& pc : due) {
      if (post(mem, pc)) {
        posted = true;
      } else {
        park(e, pc);
      }
    }
    return posted;
  }

  /// Writes one CQE: DW0–DW2 first, then DW3 (CID, status and the phase tag) with release
  /// semantics, so a consumer that sees the new phase also sees the rest (DESIGN rule 2).
  /// Returns false when the CQ is full; the caller keeps the completion for later.
  bool post(const dma_space::view& mem, const pending_completion& pc) {
    cq_state& cq = cqs_[pc.cqid];
    std::scoped_lock lock(cq.mutex);
    if (!cq.live || cq.generation.load(std::memory_order_relaxed) != pc.cq_generation) {
      completions_dropped_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    refresh_cq_head(&mem, pc.cqid, cq);
    const std::uint32_t next = cq.tail + 1 == cq.size ? 0 : cq.tail + 1;
    if (next == cq.head) return false;  // full: a controller never overwrites an unconsumed entry
    spec::completion_entry cqe = pc.cqe;
    cqe.sqhd = static_cast<std::uint16_t>(sqs_[pc.sqid].head.load(std::memory_order_acquire));
    cqe.status_field = spec::cqe_status::phase_tag_field::set(cqe.status_field, cq.phase);
    const std::uint64_t at = cq.base + std::uint64_t{cq.tail} * sizeof cqe;
    std::uint32_t dwords[4];
    std::memcpy(dwords, &cqe, sizeof dwords);
    constexpr std::uint32_t dw3 = spec::cqe_dword::dw3_offset;
    // DW3 goes last: store32 completes the earlier device copies before its own.
    if (!mem.write(at, dwords, dw3) || !mem.store32(at + dw3, dwords[dw3 / sizeof(std::uint32_t)])) {
      go_fatal();  // the CQ's memory is gone
      return true;
    }
    cq.tail = next;
    if (next == 0) cq.phase = !cq.phase;
    cq.posted.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // ---- asynchronous events ----------------------------------------------------------------------
  /// Logs and reports the doorbell errors the other threads noted, with no lock held.
  void report_doorbell_errors() {
    for (const auto& f : doorbell_faults_.take()) {
      errors_.log_doorbell(f);
      raise_error_event(f.info);
    }
  }

  void raise_error_event(async_error_info info) {
    if (const auto cid = events_.raise(async_events::error_event_dw0(info))) {
      post_admin_now(*cid, spec::status::successful_completion, async_events::error_event_dw0(info));
    }
  }

  void post_admin_now(std::uint16_t cid, spec::status status, std::uint32_t dw0) {
    pending_completion pc;
    pc.sqid = 0;
    pc.cqid = 0;
    pc.cq_generation = cqs_[0].generation.load(std::memory_order_relaxed);
    pc.cqe.dw0 = dw0;
    pc.cqe.cid = cid;
    pc.cqe.status_field = spec::cqe_status::make_status_field(status, false, false);
    bool posted = false;
    {
      const dma_space::view mem = dma_.pin();
      posted = post(mem, pc);
    }
    if (!posted) park(*engines_[config_.workers], pc);
  }
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
