// Where a queue pair's commands wait (issue 18: the shared-queue limit of P1s and P2e). A
// snapshot of the library's bookkeeping for one queue pair — its counters, its completion
// records and its CQ, copied while a run goes on — is sorted into the stages every command
// passes, in order:
//
//   waiting_for_slot  a CID is taken (record `reserved`), no SQ ticket yet: the SQ is full
//   unrung            an SQ ticket is taken, the SQ tail doorbell does not cover it yet
//   at_device         rung, no CQE posted yet: the controller (or the modelled drive) has it
//   cq_unread         its CQE is posted (phase tag of the lap), no drain has consumed it yet
//   being_delivered   consumed by a drain, its record not `done` yet (drains deliver after
//                     releasing the drain lock)
//   record_untaken    delivered into its record (`done`), its waiter has not taken it yet
//
// The mean count in a stage, divided by the queue pair's completion rate, is the mean time a
// command spends there (Little's law). The copies are not one atomic snapshot: the counters
// are copied first, then the records, then the CQ, microseconds apart, so a CQE posted or
// consumed in between counts as unread — cq_unread reads high by about the queue pair's rate ×
// the copies' time (2–3 commands at QD 1 on an H100), and the stages computed from it
// (at_device, being_delivered) low by as much. A stage is clamped at zero, never negative.
// Plain C++ over the library's layouts: the bench suite tests it without a GPU.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace bench {

/// Commands in each stage (one snapshot), or their sums over snapshots.
struct queue_stages {
  double waiting_for_slot = 0, unrung = 0, at_device = 0, cq_unread = 0, being_delivered = 0, record_untaken = 0;

  [[nodiscard]] double total() const { return waiting_for_slot + unrung + at_device + cq_unread + being_delivered + record_untaken; }
  /// Every stage, in order, for code that treats them alike.
  [[nodiscard]] auto stages() { return std::array<double*, 6>{&waiting_for_slot, &unrung, &at_device, &cq_unread, &being_delivered, &record_untaken}; }
  queue_stages& operator+=(queue_stages o) {
    const auto mine = stages();
    const auto theirs = o.stages();
    for (std::size_t i = 0; i < mine.size(); ++i) *mine[i] += *theirs[i];
    return *this;
  }
};

/// The CQEs posted past `cq_head` (a count of CQEs consumed) that no drain has taken: the run of
/// slots from there whose phase tag is the one of their pass (1 on even passes, NVMe 2.0
/// section 4.6). At most entries − 1, the most a CQ can hold.
[[nodiscard]] inline std::uint32_t unread_cqes(const std::vector<spec::completion_entry>& cq, std::uint64_t cq_head) {
  const auto entries = static_cast<std::uint32_t>(cq.size());
  std::uint32_t n = 0;
  for (std::uint64_t at = cq_head; entries > 1 && n < entries - 1; ++at, ++n) {
    const bool expected = (at / entries) % 2 == 0;
    if (cq[at % entries].phase() != expected) break;
  }
  return n;
}

/// One snapshot sorted into stages: `records` has one entry per CID, `cq` one per CQ slot.
[[nodiscard]] inline queue_stages classify(const queue_counters& c, const std::vector<completion_record>& records, const std::vector<spec::completion_entry>& cq) {
  queue_stages s;
  std::uint64_t submitted = 0;  // records pending or being delivered: ticket taken, record not done
  for (const completion_record& r : records) {
    if (r.state == static_cast<std::uint32_t>(record_state::reserved)) ++s.waiting_for_slot;
    if (r.state == static_cast<std::uint32_t>(record_state::done)) ++s.record_untaken;
    if (r.state == static_cast<std::uint32_t>(record_state::pending) || r.state == static_cast<std::uint32_t>(record_state::delivering)) ++submitted;
  }
  const auto at_least_zero = [](std::uint64_t high, std::uint64_t low) { return high > low ? static_cast<double>(high - low) : 0.0; };
  s.unrung = at_least_zero(c.sq_reserved, c.sq_rung);
  s.cq_unread = unread_cqes(cq, c.cq_head);
  // Every rung command gets one CQE: those neither consumed nor waiting in the CQ are at the device.
  s.at_device = at_least_zero(c.sq_rung, c.cq_head + static_cast<std::uint64_t>(s.cq_unread));
  // Submitted commands in none of the stages before: their CQE was consumed, their record not done.
  s.being_delivered = at_least_zero(submitted, static_cast<std::uint64_t>(s.unrung + s.at_device + s.cq_unread));
  return s;
}

}  // namespace bench
CUNVME_NAMESPACE_END
