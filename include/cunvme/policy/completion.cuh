// Completion policies: who drains the CQ, and how a waiter learns its command finished.
//
//   completion::cooperative       waiters drain the CQ themselves, one at a time
//   completion::dedicated_poller  one poller (a warp, a thread, a CPU thread) drains for all
//
// Both consume CQEs by phase tag (NVMe 2.0 section 4.6), in CQ order, into per-CID completion
// records: a waiter polls its own record, never the CQ, so completions may come back in any
// order and nobody scans the queue for its CID. Per drained batch the SQ head is taken from
// CQE.SQHD and the CQ head doorbell is written once (after the batch was read, rule 3).
#pragma once

#include <cunvme/policy/cid_pool.cuh>
#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace completion {

/// CQEs taken per drain: bounds the time the drain lock is held and the registers used.
inline constexpr cuda::std::uint32_t max_batch = 16;

namespace detail {
struct drained_entry {
  cuda::std::uint32_t dw0, dw1;
  cuda::std::uint16_t cid, status_field, sqid;  ///< status_field: DW3 bits 31:16 (spec::cqe_dword::status_field)
};

/// Hands a consumed CQE to its record. A CQE naming a CID with no command in flight (free,
/// reserved but not submitted, already done) or another SQ than this CQ's is counted and
/// dropped, never delivered (DESIGN.md rule 4); one for an abandoned command (its waiter
/// timed out) frees the CID, which was held back exactly so that this late completion cannot
/// be taken for a newer command. Deliveries run outside the drain lock, so two drainers may
/// hold CQEs naming the same CID at once (a controller's duplicate): each claims the record by
/// compare-and-swap before writing it, and the loser drops its CQE — it never mixes its fields
/// into the winner's, nor frees an abandoned CID a second time.
CUNVME_HOST_DEVICE inline void deliver(const queue_view& q, const drained_entry& e) noexcept {
  bookkeeping_word<cuda::std::uint32_t> unexpected(q.counters->unexpected_completions);
  if (e.cid >= q.cids() || e.sqid != q.qid) {
    unexpected.fetch_add(1, cuda::std::memory_order_relaxed);
    return;
  }
  completion_record& r = q.records[e.cid];
  bookkeeping_word<cuda::std::uint32_t> state(r.state);
  auto current = static_cast<cuda::std::uint32_t>(record_state::pending);
  // acquire: the field writes below stay after the claim.
  if (state.compare_exchange_strong(current, static_cast<cuda::std::uint32_t>(record_state::delivering), cuda::std::memory_order_acquire,
                                    cuda::std::memory_order_acquire)) {
    r.status = static_cast<cuda::std::uint16_t>(spec::cqe_status::status_of(e.status_field));
    r.status_field = e.status_field;
    r.dw0 = e.dw0;
    r.dw1 = e.dw1;
    // release: the waiter that sees `done` sees the fields (and the data the controller moved
    // before posting the CQE).
    state.store(static_cast<cuda::std::uint32_t>(record_state::done), cuda::std::memory_order_release);
    return;
  }
  if (current == static_cast<cuda::std::uint32_t>(record_state::abandoned) &&
      state.compare_exchange_strong(current, static_cast<cuda::std::uint32_t>(record_state::free), cuda::std::memory_order_acq_rel,
                                    cuda::std::memory_order_relaxed)) {
    cid_pool::give_back(q, e.cid);
    return;
  }
  unexpected.fetch_add(1, cuda::std::memory_order_relaxed);
}
}  // namespace detail

/// Drains up to `max_batch` new CQEs if no one else is draining. Returns how many it took.
/// Not inlined: every wait loop calls it, and one out-of-line copy keeps kernels small (the
/// call costs nothing next to the CQ reads across PCIe).
template <class Doorbell>
[[gnu::noinline]] CUNVME_HOST_DEVICE cuda::std::uint32_t drain(const queue_view& q) noexcept {
  queue_counters& c = *q.counters;
  bookkeeping_word<cuda::std::uint32_t> lock(c.drain_lock);
  if (lock.load(cuda::std::memory_order_relaxed) != 0 || lock.exchange(1, cuda::std::memory_order_acquire) != 0) return 0;
  const cuda::std::uint64_t first = bookkeeping_word<cuda::std::uint64_t>(c.cq_head).load(cuda::std::memory_order_relaxed);
  cuda::std::uint64_t head = first;
  cuda::std::uint64_t sq_head = bookkeeping_word<cuda::std::uint64_t>(c.sq_head).load(cuda::std::memory_order_relaxed);
  // Every rung SQE gets one CQE here: past the CQE of the last command rung, the next slot can
  // hold nothing yet, and is not read (a read across PCIe for a CQ in host memory). The first
  // slot always is, so a CQE the controller sent beyond them is taken by this drain or the next.
  const cuda::std::uint64_t rung = bookkeeping_word<cuda::std::uint64_t>(c.sq_rung).load(cuda::std::memory_order_relaxed);
  // Rule 2 ("phase_before_payload"): the acquire load of DW3, which carries the phase tag,
  // orders every later read of the entry (and of the data) after the controller's writes. The
  // entry's other dwords come in one load (`load_entry_words`), issued together with the next
  // slot's DW3. An acquire load, not relaxed loads and a fence: `fence.acq_rel` is a full memory
  // barrier, an acquire load is not. And one slot at a time: the phase words of a whole batch at
  // once are one read across PCIe per slot for every poll of a CQ in host memory, which made a
  // QD 1 read on the H100 take 36 µs instead of 16 (bench/RESULTS.md, P4).
  // The controller writes phase 1 on the first pass through the queue (memory zeroed at
  // creation), 0 on the second, and so on. A batch takes at most a full CQ (entries - 1, NVMe's
  // full condition): taking `entries` at once would write the CQ head doorbell back unchanged.
  const cuda::std::uint32_t most = q.entries - 1 < max_batch ? q.entries - 1 : max_batch;
  const auto phase_word = [&q](cuda::std::uint64_t at) {
    return system_word<cuda::std::uint32_t>(reinterpret_cast<cuda::std::uint32_t*>(q.cq + q.slot(at))[spec::cqe_dword::dw3_offset / 4])
        .load(cuda::std::memory_order_acquire);
  };
  detail::drained_entry taken[max_batch];
  cuda::std::uint32_t n = 0;
  // Rolled loop: an unrolled batch only multiplies code; the loads wait on memory anyway.
  bool look = most != 0;
#if defined(CUNVME_DEVICE_COMPILATION)
#  pragma unroll 1
#endif
  for (cuda::std::uint32_t dw3 = look ? phase_word(head) : 0u; look && (spec::cqe_dword::phase(dw3) ? 1u : 0u) == (q.lap(head) % 2 == 0 ? 1u : 0u); ++n) {
    const access::entry_words w = access::load_entry_words(reinterpret_cast<const cuda::std::uint32_t*>(q.cq + q.slot(head)));
    // Issued before `w` is used, so both loads are in flight together.
    look = n + 1 < most && head + 1 < rung;
    const cuda::std::uint32_t next = look ? phase_word(head + 1) : 0u;
    taken[n] = {w.dw0, w.dw1, spec::cqe_dword::cid(dw3), spec::cqe_dword::status_field(dw3), spec::cqe_dword::sq_id(w.dw2)};
    // SQHD is an index; the fetched count moves forward by its distance from our count's slot.
    const cuda::std::uint32_t sqhd = spec::cqe_dword::sq_head(w.dw2);
    if (sqhd < q.entries) sq_head += q.slot(sqhd + q.entries - q.slot(sq_head));
    ++head;
    dw3 = next;
  }
  if (n != 0) {
    // The SQ head goes first: a CID freed below must find its command's slot already free
    // (the room argument in slots.cuh depends on it).
    bookkeeping_word<cuda::std::uint64_t>(c.sq_head).store(sq_head, cuda::std::memory_order_release);
    bookkeeping_word<cuda::std::uint64_t>(c.cq_head).store(head, cuda::std::memory_order_relaxed);
    // Rule 3: the CQ head doorbell once per batch, after the entries were read (the doorbell
    // store orders the reads before it), before waiters are told: a waiter that submits again
    // at once must not find the controller still seeing a full CQ.
    Doorbell::ring(q, doorbell::which::cq_head, q.slot(head),
                   q.slot(first));
  }
  // The entries are copied out and the heads moved: the next drainer may start now. Delivery
  // (a compare-and-swap and a release store per record) happens after the unlock: inside it,
  // it made the lock the limit of a shared queue — 500–1000 CQEs waited unread per queue pair
  // while one drainer at a time delivered 16 (bench/RESULTS.md, `--probe`). Records are per CID
  // and handed over by compare-and-swap, so two drainers delivering at once cannot collide, and
  // a CID is reused only after its waiter took the record this drain delivers.
  lock.store(0, cuda::std::memory_order_release);
#if defined(CUNVME_DEVICE_COMPILATION)
#  pragma unroll 1
#endif
  for (cuda::std::uint32_t i = 0; i < n; ++i) detail::deliver(q, taken[i]);
  return n;
}

/// What a completion policy provides: `progress` is what a waiting thread does between
/// looks at its record (drain, or leave it to the poller).
template <class C>
concept policy = requires(const queue_view& q) {
  { C::template progress<doorbell::mmio>(q) } -> cuda::std::same_as<void>;
};

/// Waiters drain: a thread waiting for its command tries the drain lock and, if it gets it,
/// drains a batch for everybody; the others look at their records in the meantime.
///
/// When to choose it: the default; no thread to dedicate, and latency is lowest at low
/// queue depth (the waiter itself sees its CQE first).
struct cooperative {
  template <class Doorbell>
  CUNVME_HOST_DEVICE static void progress(const queue_view& q) noexcept {
    (void)drain<Doorbell>(q);
  }
};

/// A dedicated poller drains the CQ for everybody; waiters only watch their records. Run
/// `poller<Doorbell>::run` in one thread (or a warp's lane 0) per queue for as long as commands
/// are outstanding, on the side that submits: a GPU thread for kernels, a CPU thread for CPU
/// submitters (bookkeeping is device-scope, see `bookkeeping_word`).
///
/// When to choose it: very many waiters per queue, where cooperative waiters would contend
/// for the drain lock, or when the submitting threads should not spend time on completions
/// (they submit and go on; `test` is then a single load).
struct dedicated_poller {
  template <class Doorbell>
  CUNVME_HOST_DEVICE static void progress(const queue_view&) noexcept {}
};

/// The dedicated poller's loop. On the GPU it may run in a kernel of its own beside the
/// readers' kernel; then load the readers' kernel before the poller starts (launch it once, call
/// cudaFuncGetAttributes on it, or set CUDA_MODULE_LOADING=EAGER): with lazy module loading a
/// kernel's first launch waits for running kernels, and the poller runs until told to stop.
/// Usage: examples/snippets/host.cpp, `read_with_a_dedicated_poller`.
template <class Doorbell>
struct poller {
  /// Drains until `*stop` becomes non-zero. Returns the CQEs it consumed.
  CUNVME_HOST_DEVICE static cuda::std::uint64_t run(const queue_view& q, cuda::std::uint32_t& stop) noexcept {
    cuda::std::uint64_t consumed = 0;
    cuda::std::uint32_t idle = 0;
    while (system_word<cuda::std::uint32_t>(stop).load(cuda::std::memory_order_acquire) == 0) {
      const cuda::std::uint32_t n = drain<Doorbell>(q);
      consumed += n;
      idle = n == 0 ? idle + 1 : 0;
      if (idle != 0) access::back_off(idle);
    }
    return consumed;
  }
};

static_assert(policy<cooperative>);
static_assert(policy<dedicated_poller>);

}  // namespace completion
CUNVME_NAMESPACE_END
