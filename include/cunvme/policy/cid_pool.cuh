// Command identifiers: a lock-free bitmap of the CIDs of one queue pair, decoupled from SQ
// slots (an SQ slot is free again once the controller fetched it; the CID, its completion
// record and its PRP list stay taken until its completion is consumed). Taking a CID never
// blocks: a caller that finds none makes progress (drains completions) and tries again, so
// nobody holds one CID while waiting for another.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/queue_view.cuh>

#include <cuda/atomic>
#include <cuda/std/bit>
#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace cid_pool {

/// The valid bits of bitmap word `w` (the last word may be partial).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t valid_bits(const queue_view& q, cuda::std::uint32_t w) noexcept {
  const cuda::std::uint32_t left = q.cids() - w * 32;
  return left >= 32 ? ~0u : (1u << left) - 1u;
}

/// Takes a free CID for a command not submitted yet (its record `reserved`: a completion naming
/// it is foreign and is dropped, DESIGN.md rule 4), starting the search at word `hint % words`
/// (spread callers over the bitmap to keep them off each other's words). Returns false when
/// every CID is taken. Call `mark_in_flight` before the command's SQE is written.
[[nodiscard]] CUNVME_HOST_DEVICE inline bool try_reserve(const queue_view& q, cuda::std::uint32_t hint, cuda::std::uint16_t& cid) noexcept {
  const cuda::std::uint32_t words = q.cid_words();
  for (cuda::std::uint32_t i = 0; i < words; ++i) {
    const cuda::std::uint32_t w = (hint + i) % words;
    bookkeeping_word<cuda::std::uint32_t> word(q.cid_bits[w]);
    cuda::std::uint32_t taken = word.load(cuda::std::memory_order_relaxed);
    while ((~taken & valid_bits(q, w)) != 0) {
      const cuda::std::uint32_t bit = 1u << cuda::std::countr_zero(~taken & valid_bits(q, w));
      // acquire: pairs with the release in `give_back`, so the previous user's reads of the
      // record and PRP list are finished before we overwrite them.
      const cuda::std::uint32_t before = word.fetch_or(bit, cuda::std::memory_order_acq_rel);
      if ((before & bit) == 0) {
        cid = static_cast<cuda::std::uint16_t>(w * 32 + cuda::std::countr_zero(bit));
        bookkeeping_word<cuda::std::uint32_t>(q.records[cid].state).store(static_cast<cuda::std::uint32_t>(record_state::reserved), cuda::std::memory_order_relaxed);
        return true;
      }
      taken = before | bit;
    }
  }
  return false;
}

/// A reserved CID's command is about to be submitted: from now on a completion naming it is
/// its. Relaxed: the SQE's publication (a release fence before the doorbell, or the turn words
/// a coalescing ringer reads) orders it before the controller can complete the command, as it
/// orders the SQE itself.
CUNVME_HOST_DEVICE inline void mark_in_flight(const queue_view& q, cuda::std::uint16_t cid) noexcept {
  bookkeeping_word<cuda::std::uint32_t>(q.records[cid].state).store(static_cast<cuda::std::uint32_t>(record_state::pending), cuda::std::memory_order_relaxed);
}

/// `try_reserve` and `mark_in_flight` at once, for a caller that submits right away.
[[nodiscard]] CUNVME_HOST_DEVICE inline bool try_take(const queue_view& q, cuda::std::uint32_t hint, cuda::std::uint16_t& cid) noexcept {
  if (!try_reserve(q, hint, cid)) return false;
  mark_in_flight(q, cid);
  return true;
}

/// Returns a CID whose record has been read (or whose late completion was dropped).
CUNVME_HOST_DEVICE inline void give_back(const queue_view& q, cuda::std::uint16_t cid) noexcept {
  bookkeeping_word<cuda::std::uint32_t>(q.records[cid].state).store(static_cast<cuda::std::uint32_t>(record_state::free), cuda::std::memory_order_relaxed);
  bookkeeping_word<cuda::std::uint32_t>(q.cid_bits[cid / 32]).fetch_and(~(1u << (cid % 32)), cuda::std::memory_order_release);
}

/// CIDs in use now (for tests and statistics; a snapshot, not synchronised).
[[nodiscard]] CUNVME_HOST_DEVICE inline cuda::std::uint32_t in_use(const queue_view& q) noexcept {
  cuda::std::uint32_t n = 0;
  for (cuda::std::uint32_t w = 0; w < q.cid_words(); ++w) n += cuda::std::popcount(bookkeeping_word<cuda::std::uint32_t>(q.cid_bits[w]).load(cuda::std::memory_order_relaxed));
  return n;
}

}  // namespace cid_pool
CUNVME_NAMESPACE_END
