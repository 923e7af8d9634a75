// Submission-slot policies: how submitters get SQ slots, and how the SQ tail doorbell learns
// of the SQEs they wrote.
//
//   slots::exclusive        one thread (or one group) owns the queue: no atomics
//   slots::warp_aggregated  one atomic per group (per warp of per-thread callers on the GPU)
//   slots::multi_producer   one atomic per submitter; any number of threads share the queue
//
// Slots are numbered by 64-bit tickets (slot = ticket % entries). A reservation takes only
// free slots: the SQ holds at most entries − 1 SQEs (NVMe's full condition), the head is
// learnt from CQE.SQHD. Because at most entries − 1 CIDs exist and a CID is given back only
// after its completion (and so its SQHD) has been consumed, a submitter that holds CIDs
// always finds room once completions are drained: it waits (bounded), it never overwrites and
// it never deadlocks.
//
// Shared queues publish each written SQE in a per-slot turn word (ticket + 1); the SQ tail
// doorbell is then advanced over the longest published prefix by whoever holds the ring
// lock, so the doorbell never moves backwards nor past an SQE still being written.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/group.cuh>
#include <cunvme/policy/queue_view.cuh>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstdint>

#if defined(__CUDACC__)
#  include <cooperative_groups.h>
#  include <cooperative_groups/reduce.h>
#  include <cooperative_groups/scan.h>
#endif

CUNVME_NAMESPACE_BEGIN
namespace slots {

namespace detail {
[[nodiscard]] CUNVME_HOST_DEVICE inline bool has_room(const queue_view& q, cuda::std::uint64_t reserved, cuda::std::uint32_t count) noexcept {
  const cuda::std::uint64_t head = bookkeeping_word<cuda::std::uint64_t>(q.counters->sq_head).load(cuda::std::memory_order_acquire);
  return reserved + count - head <= q.entries - 1;
}

/// Waits (bounded by `deadline`, calling `progress` to drain completions) until `count`
/// slots are free, then takes them with one compare-and-swap. The ticket is taken only
/// when there is room, so a timeout leaves no hole in the SQ.
CUNVME_EXEC_CHECK_DISABLE
template <class Progress>
[[nodiscard]] CUNVME_HOST_DEVICE bool take_shared(const queue_view& q, cuda::std::uint32_t count, cuda::std::uint64_t deadline, Progress& progress,
                                                  cuda::std::uint64_t& ticket) {
  bookkeeping_word<cuda::std::uint64_t> reserved(q.counters->sq_reserved);
  cuda::std::uint64_t seen = reserved.load(cuda::std::memory_order_relaxed);
  for (cuda::std::uint32_t round = 0;; ++round) {
    if (has_room(q, seen, count)) {
      if (reserved.compare_exchange_weak(seen, seen + count, cuda::std::memory_order_acq_rel, cuda::std::memory_order_relaxed)) {
        ticket = seen;
        return true;
      }
      continue;  // another submitter took slots: `seen` is fresh
    }
    if (access::now_ns() > deadline) return false;
    progress();
    access::back_off(round);
    seen = reserved.load(cuda::std::memory_order_relaxed);
  }
}

/// Advances the SQ tail doorbell over every published SQE. The ring lock keeps doorbell
/// values in order; a submitter that finds it held leaves its SQE to the holder, who looks
/// again after unlocking (all four accesses seq_cst: either the holder sees the new turn,
/// or the submitter's try-lock comes after the unlock and succeeds).
template <class Doorbell>
CUNVME_HOST_DEVICE void ring_published(const queue_view& q) noexcept {
  queue_counters& c = *q.counters;
  for (;;) {
    if (bookkeeping_word<cuda::std::uint32_t>(c.ring_lock).exchange(1, cuda::std::memory_order_seq_cst) != 0) return;
    const cuda::std::uint64_t from = bookkeeping_word<cuda::std::uint64_t>(c.sq_rung).load(cuda::std::memory_order_relaxed);
    cuda::std::uint64_t to = from;
    while (to - from < q.entries && bookkeeping_word<cuda::std::uint64_t>(q.turns[q.slot(to)]).load(cuda::std::memory_order_acquire) == to + 1) ++to;
    if (to != from) {
      Doorbell::ring(q, doorbell::which::sq_tail, q.slot(to),
                     q.slot(from));
      // Relaxed: the unlock below (seq_cst) publishes it to the next holder, and `rung` only
      // spares a waiter a redundant ring.
      bookkeeping_word<cuda::std::uint64_t>(c.sq_rung).store(to, cuda::std::memory_order_relaxed);
    }
    bookkeeping_word<cuda::std::uint32_t>(c.ring_lock).store(0, cuda::std::memory_order_seq_cst);
    if (bookkeeping_word<cuda::std::uint64_t>(q.turns[q.slot(to)]).load(cuda::std::memory_order_seq_cst) != to + 1) return;
  }
}

/// Publishes `count` SQEs from `ticket` on, written by this thread.
CUNVME_HOST_DEVICE inline void publish(const queue_view& q, cuda::std::uint64_t ticket, cuda::std::uint32_t count) noexcept {
  for (cuda::std::uint32_t i = 0; i < count; ++i) {
    bookkeeping_word<cuda::std::uint64_t>(q.turns[q.slot(ticket + i)]).store(ticket + i + 1, cuda::std::memory_order_seq_cst);
  }
}

/// After SQEs of `count` tickets were published (by this thread or its group): ring, or with
/// a coalescing doorbell ring only if this was the last reserved SQE still being written.
template <class Doorbell>
CUNVME_HOST_DEVICE void ring_after_publish(const queue_view& q, cuda::std::uint32_t count) noexcept {
  if constexpr (Doorbell::coalesces) {
    // acq_rel: a publisher that counts past another's publication also sees that one's
    // reservation, so whoever publishes last reads the full reserved count and rings (the
    // turn words, not these counters, carry the SQEs to the ringer).
    const cuda::std::uint64_t published = bookkeeping_word<cuda::std::uint64_t>(q.counters->sq_published).fetch_add(count, cuda::std::memory_order_acq_rel) + count;
    if (published != bookkeeping_word<cuda::std::uint64_t>(q.counters->sq_reserved).load(cuda::std::memory_order_relaxed)) return;
  }
  ring_published<Doorbell>(q);
}

/// Whether the doorbell already covers `ticket`.
[[nodiscard]] CUNVME_HOST_DEVICE inline bool rung(const queue_view& q, cuda::std::uint64_t ticket) noexcept {
  return bookkeeping_word<cuda::std::uint64_t>(q.counters->sq_rung).load(cuda::std::memory_order_acquire) > ticket;
}
}  // namespace detail

/// What a slot policy provides. `reserve` and `commit` are collective over the group; a
/// member passes how many slots it needs (0 or more) and gets its first ticket.
template <class S>
concept policy = requires(const queue_view& q, single_thread& g, cuda::std::uint32_t count, cuda::std::uint64_t ticket, void (*progress)()) {
  { S::reserve(q, g, count, ticket, progress, ticket) } -> cuda::std::same_as<bool>;
  { S::template commit<doorbell::mmio>(q, g, ticket, count) } -> cuda::std::same_as<void>;
  { S::template ensure_rung<doorbell::mmio>(q, ticket) } -> cuda::std::same_as<void>;
};

/// One owner: a single thread, or a single group whose members call collectively. Tickets
/// are plain counters; the owner rings after each batch it wrote.
///
/// When to choose it: one queue per thread, warp or thread block (the usual layout with many
/// queues: 1 queue per SM), where nothing else submits to the queue. Cheapest: no atomic
/// read-modify-write on the submission path. Using it from two independent submitters at
/// once is a data race.
struct exclusive {
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group, class Progress>
  [[nodiscard]] CUNVME_HOST_DEVICE static bool reserve(const queue_view& q, Group& g, cuda::std::uint32_t count, cuda::std::uint64_t deadline,
                                                       Progress&& progress, cuda::std::uint64_t& ticket) {
    cuda::std::uint32_t total = 0;
    const cuda::std::uint32_t below = g.exclusive_sum(count, total);
    cuda::std::uint64_t base = ~cuda::std::uint64_t{0};
    if (g.rank() == 0 && total != 0) {
      bookkeeping_word<cuda::std::uint64_t> reserved(q.counters->sq_reserved);
      const cuda::std::uint64_t at = reserved.load(cuda::std::memory_order_relaxed);
      for (cuda::std::uint32_t round = 0; base == ~cuda::std::uint64_t{0}; ++round) {
        if (detail::has_room(q, at, total)) {
          base = at;
          reserved.store(at + total, cuda::std::memory_order_relaxed);
        } else if (access::now_ns() > deadline) {
          break;
        } else {
          progress();
          access::back_off(round);
        }
      }
    }
    base = total == 0 ? 0 : g.broadcast(base, 0);
    ticket = base + below;
    return base != ~cuda::std::uint64_t{0};
  }

  CUNVME_EXEC_CHECK_DISABLE
  template <class Doorbell, thread_group Group>
  CUNVME_HOST_DEVICE static void commit(const queue_view& q, Group& g, cuda::std::uint64_t, cuda::std::uint32_t count) {
    cuda::std::uint32_t total = 0;
    (void)g.exclusive_sum(count, total);  // also orders every member's SQE before the leader rings
    if (g.rank() == 0 && total != 0) {
      bookkeeping_word<cuda::std::uint64_t> rung(q.counters->sq_rung);
      const cuda::std::uint64_t from = rung.load(cuda::std::memory_order_relaxed);
      const cuda::std::uint64_t to = bookkeeping_word<cuda::std::uint64_t>(q.counters->sq_reserved).load(cuda::std::memory_order_relaxed);
      Doorbell::ring(q, doorbell::which::sq_tail, q.slot(to), q.slot(from));
      rung.store(to, cuda::std::memory_order_release);
    }
  }

  /// The owner rang in `commit`: nothing is left unrung.
  template <class Doorbell>
  CUNVME_HOST_DEVICE static void ensure_rung(const queue_view&, cuda::std::uint64_t) noexcept {}
};

/// Lock-free multi-producer: each submitter takes its own slots with one compare-and-swap,
/// writes its SQEs and publishes them in per-slot turn words; the doorbell is advanced over
/// the published prefix (see the top of this header).
///
/// When to choose it: many independent threads share a queue (fewer queues than warps, or
/// CPU threads); with groups whose members all submit at once, `warp_aggregated` does the
/// same with one atomic per group.
struct multi_producer {
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group, class Progress>
  [[nodiscard]] CUNVME_HOST_DEVICE static bool reserve(const queue_view& q, Group&, cuda::std::uint32_t count, cuda::std::uint64_t deadline,
                                                       Progress&& progress, cuda::std::uint64_t& ticket) {
    if (count == 0) return true;
    return detail::take_shared(q, count, deadline, progress, ticket);
  }

  CUNVME_EXEC_CHECK_DISABLE
  template <class Doorbell, thread_group Group>
  CUNVME_HOST_DEVICE static void commit(const queue_view& q, Group&, cuda::std::uint64_t ticket, cuda::std::uint32_t count) {
    if (count == 0) return;
    detail::publish(q, ticket, count);
    detail::ring_after_publish<Doorbell>(q, count);
  }

  template <class Doorbell>
  CUNVME_HOST_DEVICE static void ensure_rung(const queue_view& q, cuda::std::uint64_t ticket) noexcept {
    if (!detail::rung(q, ticket)) detail::ring_published<Doorbell>(q);
  }
};

/// Warp-aggregated: the group's leader takes the slots of all members with one
/// compare-and-swap and hands out contiguous tickets; on the GPU, per-thread callers are
/// aggregated over the lanes of their warp that submit together (coalesced threads).
///
/// When to choose it: many warps share a queue and most lanes submit at the same time (the
/// usual GPU pattern); it cuts atomics on the queue's counter by up to 32×.
struct warp_aggregated {
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group, class Progress>
  [[nodiscard]] CUNVME_HOST_DEVICE static bool reserve(const queue_view& q, Group& g, cuda::std::uint32_t count, cuda::std::uint64_t deadline,
                                                       Progress&& progress, cuda::std::uint64_t& ticket) {
#if defined(CUNVME_DEVICE_COMPILATION)
    if constexpr (cuda::std::is_same_v<Group, single_thread>) {
      namespace cg = cooperative_groups;
      const auto lanes = lanes_on(q);
      const cuda::std::uint32_t total = cg::reduce(lanes, count, cg::plus<cuda::std::uint32_t>());
      const cuda::std::uint32_t below = cg::exclusive_scan(lanes, count, cg::plus<cuda::std::uint32_t>());
      cuda::std::uint64_t base = ~cuda::std::uint64_t{0};
      if (lanes.thread_rank() == 0 && total != 0 && !detail::take_shared(q, total, deadline, progress, base)) base = ~cuda::std::uint64_t{0};
      base = lanes.shfl(base, 0);
      ticket = base + below;
      return total == 0 || base != ~cuda::std::uint64_t{0};
    }
#endif
    cuda::std::uint32_t total = 0;
    const cuda::std::uint32_t below = g.exclusive_sum(count, total);
    cuda::std::uint64_t base = ~cuda::std::uint64_t{0};
    if (g.rank() == 0 && total != 0 && !detail::take_shared(q, total, deadline, progress, base)) base = ~cuda::std::uint64_t{0};
    if (total == 0) return true;
    base = g.broadcast(base, 0);
    ticket = base + below;
    return base != ~cuda::std::uint64_t{0};
  }

  CUNVME_EXEC_CHECK_DISABLE
  template <class Doorbell, thread_group Group>
  CUNVME_HOST_DEVICE static void commit(const queue_view& q, Group& g, cuda::std::uint64_t ticket, cuda::std::uint32_t count) {
    detail::publish(q, ticket, count);
#if defined(CUNVME_DEVICE_COMPILATION)
    if constexpr (cuda::std::is_same_v<Group, single_thread>) {
      namespace cg = cooperative_groups;
      const auto lanes = lanes_on(q);
      const cuda::std::uint32_t total = cg::reduce(lanes, count, cg::plus<cuda::std::uint32_t>());
      if (lanes.thread_rank() == 0 && total != 0) detail::ring_after_publish<Doorbell>(q, total);
      return;
    }
#endif
    cuda::std::uint32_t total = 0;
    (void)g.exclusive_sum(count, total);  // every member has published before the leader rings
    if (g.rank() == 0 && total != 0) detail::ring_after_publish<Doorbell>(q, total);
  }

  template <class Doorbell>
  CUNVME_HOST_DEVICE static void ensure_rung(const queue_view& q, cuda::std::uint64_t ticket) noexcept {
    multi_producer::ensure_rung<Doorbell>(q, ticket);
  }

 private:
#if defined(CUNVME_DEVICE_COMPILATION)
  /// The lanes of this warp here now that submit to `q`'s queue pair: only they may share one
  /// reservation and one doorbell. Coalesced lanes may each be on another queue (a volume's
  /// members, a queue chosen per lane), and a ticket of one queue is no slot of another.
  [[nodiscard]] __device__ static cooperative_groups::coalesced_group lanes_on(const queue_view& q) {
    namespace cg = cooperative_groups;
    // The counters are the queue's own (every copy of its view points at them).
    return cg::labeled_partition(cg::coalesced_threads(), reinterpret_cast<unsigned long long>(q.counters));
  }
#endif
};

static_assert(policy<exclusive>);
static_assert(policy<multi_producer>);
static_assert(policy<warp_aggregated>);

}  // namespace slots
CUNVME_NAMESPACE_END
