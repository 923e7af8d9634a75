// Doorbell policies: how a new SQ tail or CQ head reaches the controller.
//
//   doorbell::mmio                 one MMIO store per update
//   doorbell::shadow               Doorbell Buffer Config shadow slots; MMIO only when EventIdx asks
//   doorbell::coalescing<D>        submitters leave the SQ doorbell to the last one in
//
// A policy is an empty type; `ring` gets the old and the new value (the shadow rule needs
// both) and the queue's counters for statistics.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/shadow_doorbell.cuh>

#include <cuda/atomic>
#include <cuda/std/concepts>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace doorbell {

/// Which doorbell of the pair.
enum class which : cuda::std::uint8_t { sq_tail, cq_head };

/// What a doorbell policy provides.
template <class D>
concept policy = requires(const queue_view& q, which w, cuda::std::uint32_t value) {
  { D::ring(q, w, value, value) } -> cuda::std::same_as<void>;
  /// Whether the queue view has what the policy needs (shadow slots, say).
  { D::usable(q) } -> cuda::std::same_as<bool>;
  /// Whether submitters leave ringing to the last one in (see `coalescing`).
  { D::coalesces } -> cuda::std::convertible_to<bool>;
};

namespace detail {
CUNVME_HOST_DEVICE inline void count(cuda::std::uint64_t& counter) noexcept { bookkeeping_word<cuda::std::uint64_t>(counter).fetch_add(1, cuda::std::memory_order_relaxed); }
}  // namespace detail

/// Direct MMIO: every update is one store to the BAR.
///
/// When to choose it: the default. Each store is a posted PCIe write (~tens of ns from a
/// GPU); with many submitters on one queue, wrap it in `coalescing`.
struct mmio {
  static constexpr bool coalesces = false;
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr bool usable(const queue_view& q) noexcept {
    return q.sq_doorbell != nullptr && q.cq_doorbell != nullptr;
  }
  CUNVME_HOST_DEVICE static void ring(const queue_view& q, which w, cuda::std::uint32_t value, cuda::std::uint32_t /*old*/) noexcept {
    access::mmio_store_after_writes(w == which::sq_tail ? q.sq_doorbell : q.cq_doorbell, value);
    detail::count(q.counters->doorbell_mmio_writes);
  }
};

/// Shadow doorbells (NVMe 2.0 section 5.8, Doorbell Buffer Config): the new value goes to the
/// shadow slot in memory the controller polls; the MMIO doorbell is written only when the
/// controller's EventIdx lies between the old and the new value.
///
/// A queue's first SQ tail and first CQ head write go to MMIO whatever EventIdx says (DESIGN.md
/// rule 5): EventIdx may still hold what the controller wrote for a deleted queue with the same
/// identifier, and a controller need not look at a new queue's shadow slot before it is rung
/// once (QEMU does not). Each doorbell has one writer at a time (the ring lock, the owner, the
/// drain lock), so its "rung" flag in the bookkeeping needs no read-modify-write.
///
/// When to choose it: controllers that advertise OACS bit 8 (emulated ones — QEMU, cloud
/// NVMe — poll the shadow and so save most MMIO exits); needs the controller brought up with
/// `shadow_doorbells` on (otherwise `usable` is false and readers refuse to run).
struct shadow {
  static constexpr bool coalesces = false;
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr bool usable(const queue_view& q) noexcept {
    return mmio::usable(q) && q.sq_shadow != nullptr && q.cq_shadow != nullptr && q.sq_event_index != nullptr && q.cq_event_index != nullptr;
  }
  CUNVME_HOST_DEVICE static void ring(const queue_view& q, which w, cuda::std::uint32_t value, cuda::std::uint32_t old) noexcept {
    const bool sq = w == which::sq_tail;
    using ref = system_word<cuda::std::uint32_t>;
    // seq_cst on both: the shadow store must be visible before EventIdx is read, or host and
    // controller can each miss the other's update (Linux and SPDK put a full barrier here).
    // The shadow store also publishes the SQE (or the consumed CQ slots), as a doorbell does.
    ref(*(sq ? q.sq_shadow : q.cq_shadow)).store(value, cuda::std::memory_order_seq_cst);
    const cuda::std::uint32_t event = ref(*(sq ? q.sq_event_index : q.cq_event_index)).load(cuda::std::memory_order_seq_cst);
    bookkeeping_word<cuda::std::uint32_t> rung(sq ? q.counters->sq_doorbell_rung : q.counters->cq_doorbell_rung);
    const bool first = rung.load(cuda::std::memory_order_relaxed) == 0;
    if (first || spec::shadow_doorbell_needs_mmio(static_cast<cuda::std::uint16_t>(event), static_cast<cuda::std::uint16_t>(value),
                                                  static_cast<cuda::std::uint16_t>(old))) {
      access::mmio_store_after_writes(sq ? q.sq_doorbell : q.cq_doorbell, value);
      if (first) rung.store(1, cuda::std::memory_order_relaxed);
      detail::count(q.counters->doorbell_mmio_writes);
    } else {
      detail::count(q.counters->doorbell_skipped);
    }
  }
};

/// Coalescing: a submitter that publishes its SQE rings only if no SQE reserved before it is
/// still being written — the last one in rings for everybody (BaM's scheme). A waiter whose
/// SQE is still unrung rings itself, so a steady stream of submitters cannot starve the
/// doorbell. CQ head updates go straight to `Inner` (they are already one per drained batch).
///
/// When to choose it: many threads or warps sharing one queue; it turns one doorbell store
/// per command into one per burst.
/// @tparam Inner `mmio` or `shadow`: how the doorbell is finally written.
template <class Inner>
struct coalescing {
  static_assert(!Inner::coalesces, "coalescing<coalescing<…>> adds nothing: wrap mmio or shadow");
  static constexpr bool coalesces = true;
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr bool usable(const queue_view& q) noexcept { return Inner::usable(q); }
  CUNVME_HOST_DEVICE static void ring(const queue_view& q, which w, cuda::std::uint32_t value, cuda::std::uint32_t old) noexcept {
    Inner::ring(q, w, value, old);
  }
};

static_assert(policy<mmio>);
static_assert(policy<shadow>);
static_assert(policy<coalescing<mmio>>);
static_assert(policy<coalescing<shadow>>);

}  // namespace doorbell
CUNVME_NAMESPACE_END
