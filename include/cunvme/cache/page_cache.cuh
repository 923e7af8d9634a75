// A software page cache over one namespace or a volume (volume/volume.cuh), used alike by GPU
// threads and CPU threads: fixed-size pages kept in slots of DMA-reachable memory, read in by
// the block reader and written back by the block writer (over one queue pair, or through each
// member's queue pairs of a volume).
//
// Usage: examples/snippets/kernels.cu, `read_through_cache` and `caches`.
//
// The protocol (page_table.cuh has the word layout):
// - hit: one compare-and-swap adds a reference to a VALID word (acquire, so the bytes the filler
//   published are seen); the slot's clock bit is set.
// - miss: the one thread that swaps INVALID → FILLING reads the page; every other thread wanting
//   it waits for FILLING to end (bounded) — misses coalesce into one read. The filler takes a
//   slot by clock (second chance): a slot whose page has references is never taken, because the
//   evictor must swap "VALID, no references" → EVICTING; a dirty victim is written back first.
//   A failed fill puts the word back to INVALID and hands the reader's io_result to that thread;
//   waiters then fill it themselves, so each gets its own honest result, never bytes that did
//   not arrive.
// - unreferenced hit (GPU threads' `read` of up to 16 bytes): the page's word gives its slot;
//   the slot's generation (page_table.cuh) is read before and after copying the bytes (into
//   registers), the word once more in between (acquire); an even generation that did not move,
//   with the word still VALID in that slot, means the copy is the page's, and only then does it
//   reach the caller. A generation is 32 bits: a reader would have to stall through 2^31 refills
//   of one slot between two of its loads to be fooled. Nothing shared is written but the clock
//   bit (once) and the hit counter (once per group of lanes), so a warp's 32 lanes on one page
//   cost one set of loads, not 32 swaps on one word. Anything else (not VALID, a fill under way,
//   a slot refilled) takes the hit or miss path above. CPU threads always take references: their
//   copy would race with the controller's writes of the slot in the C++ memory model.
// - every wait is bounded by the queue's timeout and ends in an io_result.
#pragma once

#include <cunvme/cache/page_ref.cuh>
#include <cunvme/cache/page_table.cuh>
#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/detail/copy_widest.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/volume/volume.cuh>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#if defined(CUNVME_DEVICE_COMPILATION)
#  include <cooperative_groups.h>
#endif
#include <cuda/std/cstring>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN

/// The cache, as GPU or CPU threads use it: a trivially copyable value over a `page_cache_view`
/// (the shared state), the queue pair its reads and write-backs go through and the namespace.
/// Any number of threads share one; the queue's slot policy must allow that
/// (`slots::multi_producer` or `slots::warp_aggregated`, not `slots::exclusive`).
/// @tparam Queue    `queue_policies<Slots, Completion>` of the queue pair
/// @tparam Doorbell `doorbell::mmio`, `doorbell::shadow` or `doorbell::coalescing<…>`
template <queue_policy Queue, doorbell::policy Doorbell>
class page_cache {
 public:
  using reader = block_reader<Queue, prp::page_list, Doorbell>;
  using writer = block_writer<Queue, prp::page_list, Doorbell>;

  /// The largest GPU read served without a reference: it is staged in registers, so that a copy
  /// found stale afterwards never reaches the caller's memory.
  static constexpr cuda::std::uint64_t max_unreferenced_bytes = 16;

  /// Waiters for another thread's fill wait at most this many queue timeouts: the filler itself
  /// may spend one searching for a slot, one writing a dirty victim back and one reading, and a
  /// waiter should see the filler's outcome rather than time out just before it comes.
  static constexpr cuda::std::uint64_t fill_wait_timeouts = 3;

  /// The cache over one namespace, its reads and write-backs through `q`.
  CUNVME_HOST_DEVICE page_cache(const page_cache_view& cache, const queue_view& q, const namespace_view& ns) noexcept
      : c_(cache), q_(q), ns_(ns), timeout_ns_(q.timeout_ns) {
    // The table describes one namespace's pages: with another namespace (or another block size)
    // every access would read or write the wrong blocks, so every access is refused instead.
    const bool same = cache.members == 0 && ns.nsid == cache.nsid &&
                      cuda::std::uint64_t{cache.blocks_per_page} * ns.block_bytes() == cache.page_bytes();
    blocks_per_page_ = same ? cache.blocks_per_page : 0;
  }

  /// The cache over a volume (`host::page_cache_memory` made for it): a page is read from and
  /// written back to the member holding it (mirrored: written to every member), through the
  /// calling thread's queue pair there.
  CUNVME_HOST_DEVICE page_cache(const page_cache_view& cache, const volume_view& v) noexcept : c_(cache), v_(v), timeout_ns_(v.timeout_ns) {
    // The same refusal for a volume of another shape: and a page must lie within one stripe.
    const cuda::std::uint64_t bpp = cache.blocks_per_page;
    const bool same = cache.members != 0 && cache.members == v.member_count && v.members != nullptr && cache.nsid == 0 && bpp != 0 &&
                      (bpp << v.lba_shift) == cache.page_bytes() && cache.pages == v.blocks / bpp &&
                      (v.layout == volume_layout::mirrored || v.stripe_blocks() >= bpp);
    blocks_per_page_ = same ? cache.blocks_per_page : 0;
  }

  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint64_t page_bytes() const noexcept { return c_.page_bytes(); }
  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint64_t pages() const noexcept { return c_.pages; }
  [[nodiscard]] CUNVME_HOST_DEVICE const page_cache_view& view() const noexcept { return c_; }
  /// The namespace's first LBA of `page`.
  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint64_t first_lba(cuda::std::uint64_t page) const noexcept { return page * blocks_per_page_; }

  /// Takes a reference to `page` (reading it in on a miss) and returns its bytes, valid until
  /// `release(page)`; while referenced it is never evicted. `page_access::write` marks it
  /// dirty. A failure (io_result) holds no reference: `invalid_request` for a page past the
  /// namespace (or a cache given another namespace than its memory's), `timeout` after waiting
  /// out another thread's fill, or the filler's own failure. References are shared, not locks:
  /// threads that write a page while others read it order their accesses themselves.
  /// A thread that already holds pages and misses may find every slot held: it gets
  /// `cache_full` after the timeout rather than waiting on itself.
  [[nodiscard]] CUNVME_HOST_DEVICE cached_page acquire(cuda::std::uint64_t page, page_access access) const {
    if (page >= c_.pages || blocks_per_page_ == 0) return {io_result::failure(io_error::invalid_request, first_lba(page), 0), nullptr};
    bookkeeping_word<cuda::std::uint64_t> word(c_.table[page]);
    const cuda::std::uint64_t dirty = access == page_access::write ? page_word::dirty_bit : 0;
    // Relaxed: only the swap below, which is acquire, decides what this thread may read.
    cuda::std::uint64_t seen = word.load(cuda::std::memory_order_relaxed);
    cuda::std::uint64_t deadline = 0;
    bool waited = false;
    for (cuda::std::uint32_t round = 0;;) {
      const page_state state = page_word::state(seen);
      if (state == page_state::valid && page_word::references(seen) < page_word::max_references) {
        // Acquire: pairs with the filler's release of VALID (and a previous writer's release),
        // so this thread sees the bytes that arrived in the slot, not what was there before.
        if (word.compare_exchange_weak(seen, (seen + page_word::one_reference) | dirty, cuda::std::memory_order_acquire,
                                       cuda::std::memory_order_relaxed)) {
          const cuda::std::uint32_t slot = page_word::slot(seen);
          mark_referenced(slot);
          count(c_.counters->hits);
          return {io_result{}, slot_bytes(slot)};
        }
        continue;  // the word changed (another reference, an eviction): `seen` is fresh
      }
      if (state == page_state::invalid) {
        // Acquire: the evictor's release of INVALID came after its write-back completed, so the
        // read this thread now issues sees the written-back data.
        if (word.compare_exchange_weak(seen, page_word::make(page_state::filling), cuda::std::memory_order_acquire,
                                       cuda::std::memory_order_relaxed)) {
          return miss(page, access);
        }
        continue;
      }
      // FILLING or EVICTING (or references saturated): someone else moves it on.
      if (state == page_state::filling && !waited) {
        waited = true;
        count(c_.counters->coalesced_waits);
      }
      const cuda::std::uint64_t now = access::now_ns();
      if (deadline == 0) {
        cuda::std::uint64_t bound = 0;
        if (detail::mul_overflows<cuda::std::uint64_t>(timeout_ns_, fill_wait_timeouts, bound)) bound = ~cuda::std::uint64_t{0};
        deadline = detail::saturating_add<cuda::std::uint64_t>(now, bound);
      } else if (now > deadline) {
        return {io_result::failure(io_error::timeout, first_lba(page), blocks_per_page_), nullptr};
      }
      access::back_off(++round);
      seen = word.load(cuda::std::memory_order_acquire);
    }
  }

  /// Gives back one reference taken by `acquire`. Returns false (and changes nothing) where
  /// `page` held no reference: a caller's bug, which must not corrupt the count of another.
  CUNVME_HOST_DEVICE bool release(cuda::std::uint64_t page) const noexcept {
    if (page >= c_.pages) return false;
    bookkeeping_word<cuda::std::uint64_t> word(c_.table[page]);
    cuda::std::uint64_t seen = word.load(cuda::std::memory_order_relaxed);
    for (;;) {
      if (page_word::state(seen) != page_state::valid || page_word::references(seen) == 0) return false;
      // Release: this thread's reads and writes of the bytes happen before the evictor's acquire
      // of "no references" — the slot is not refilled under a reader, and a writer's bytes are in
      // memory before the write-back sends them.
      if (word.compare_exchange_weak(seen, seen - page_word::one_reference, cuda::std::memory_order_release, cuda::std::memory_order_relaxed)) {
        return true;
      }
    }
  }

  /// Copies `bytes` at byte `offset` of the namespace into `out`, through the cache. The range
  /// must lie within one page (invalid_request otherwise): for small values. On the GPU a hit
  /// of at most `max_unreferenced_bytes` takes no reference (the unreferenced hit above); a
  /// larger read takes one, which its copy amortizes. `out` is written only on success.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result read(cuda::std::uint64_t offset, cuda::std::uint64_t bytes, void* out) const {
#if defined(CUNVME_DEVICE_COMPILATION)
    const cuda::std::uint64_t page = offset >> c_.page_shift;
    const cuda::std::uint64_t within = offset & (c_.page_bytes() - 1);
    if (page < c_.pages && blocks_per_page_ != 0 && bytes != 0 && bytes <= max_unreferenced_bytes && bytes <= c_.page_bytes() - within &&
        read_unreferenced(page, within, bytes, out)) {
      return io_result{};
    }
#endif
    return copy(offset, bytes, page_access::read, [&](unsigned char* at) { detail::copy_widest(out, at, bytes); });
  }

  /// Copies `bytes` from `in` to byte `offset` of the namespace, through the cache (the page
  /// becomes dirty; it reaches the namespace on eviction or `flush`). Within one page.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result write(cuda::std::uint64_t offset, cuda::std::uint64_t bytes, const void* in) const {
    return copy(offset, bytes, page_access::write, [&](unsigned char* at) { detail::copy_widest(at, in, bytes); });
  }

  /// Writes back every dirty page no thread holds, then sends an NVM Flush so the writes are
  /// durable; returns the first failure (the page it concerned stays dirty) or success. A page
  /// written while its write-back runs stays dirty for the next flush; a referenced dirty page
  /// is left for its eviction or a later flush.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result flush() const {
    io_result first{};
    for (cuda::std::uint32_t slot = 0; slot < c_.slots; ++slot) {
      const cuda::std::uint64_t owner = bookkeeping_word<cuda::std::uint64_t>(c_.owners[slot]).load(cuda::std::memory_order_acquire);
      if (!slot_owner::holds_page(owner)) continue;
      const cuda::std::uint64_t page = owner - 1;
      bookkeeping_word<cuda::std::uint64_t> word(c_.table[page]);
      cuda::std::uint64_t seen = word.load(cuda::std::memory_order_relaxed);
      bool taken = false;
      while (page_word::state(seen) == page_state::valid && page_word::dirty(seen) && page_word::references(seen) == 0 &&
             page_word::slot(seen) == slot) {
        // One reference and a clean bit in one swap: no evictor takes the page during its
        // write-back, hits go on, and a writer arriving meanwhile sets the bit again. Acquire:
        // the last writer's released bytes are what gets written.
        if (word.compare_exchange_weak(seen, page_word::make(page_state::valid, slot, false, 1), cuda::std::memory_order_acquire,
                                       cuda::std::memory_order_relaxed)) {
          taken = true;
          break;
        }
      }
      if (!taken) continue;
      const io_result r = write_back(page, slot);
      if (!r.ok()) {
        // Dirty again: the namespace does not hold these bytes.
        word.fetch_or(page_word::dirty_bit, cuda::std::memory_order_relaxed);
        if (first.ok()) first = r;
      }
      release(page);
    }
    if (!first.ok()) return first;
    return on_volume() ? volume_io<Queue, Doorbell>(v_).flush() : writer(q_, ns_).flush();
  }

 private:
  /// The miss path: this thread swapped the word to FILLING and alone moves it on.
  [[nodiscard]] CUNVME_HOST_DEVICE cached_page miss(cuda::std::uint64_t page, page_access access) const {
    bookkeeping_word<cuda::std::uint64_t> word(c_.table[page]);
    count(c_.counters->misses);
    cuda::std::uint32_t slot = 0;
    if (const io_result r = take_slot(page, slot); !r.ok()) {
      // No slot was held and no command sent: the word goes back as it was, and a waiter
      // (whose acquire on INVALID pairs with this release, as with every INVALID) fills it itself.
      word.store(page_word::make(page_state::invalid), cuda::std::memory_order_release);
      return {r, nullptr};
    }
    bookkeeping_word<cuda::std::uint64_t> owner(c_.owners[slot]);
    bookkeeping_word<cuda::std::uint32_t> generation(c_.generations[slot]);
    // Only the claimer writes a slot's generation. Odd before the read is sent: an unreferenced
    // reader still copying the slot's last page then finds another generation after its copy.
    // On the GPU the fence (system scope) orders the store before the submission's writes, and
    // so before the controller can write the slot; CPU threads take no unreferenced hits.
    const cuda::std::uint32_t refilling = generation.load(cuda::std::memory_order_relaxed) + 1;
    generation.store(refilling, cuda::std::memory_order_relaxed);
#if defined(CUNVME_DEVICE_COMPILATION)
    access::stores_before_submission();
#endif
    const io_result r = fill(page, slot);
    if (!r.ok()) {
      count(c_.counters->fill_failures);
      // A read that timed out was abandoned, not cancelled: the controller may still write the
      // slot, so it must never hold another page (and its generation stays odd). Any other failure
      // completed (or sent nothing), so the slot is free; release, so the next claimer's acquire
      // orders its read after this one's.
      if (r.error == io_error::timeout) {
        owner.store(slot_owner::retired, cuda::std::memory_order_relaxed);
        count(c_.counters->retired_slots);
      } else {
        generation.store(refilling + 1, cuda::std::memory_order_relaxed);
        owner.store(slot_owner::empty, cuda::std::memory_order_release);
      }
      word.store(page_word::make(page_state::invalid), cuda::std::memory_order_release);
      return {r, nullptr};
    }
    count(c_.counters->fills);
    // The owner before the word (both release): an evictor that finds the owner then checks
    // that the word names this slot, which it does only once VALID is published. The even
    // generation between them (release: the bytes the read brought are seen by a reader that
    // acquires it) and before VALID, which is what an unreferenced reader's checks rely on.
    owner.store(slot_owner::of_page(page), cuda::std::memory_order_release);
    generation.store(refilling + 1, cuda::std::memory_order_release);
    mark_referenced(slot);
    // Release: the bytes the read brought (ordered before this by the completion record's
    // acquire) are visible to every thread whose hit reads this VALID.
    word.store(page_word::make(page_state::valid, slot, access == page_access::write, 1), cuda::std::memory_order_release);
    return {io_result{}, slot_bytes(slot)};
  }

#if defined(CUNVME_DEVICE_COMPILATION)
  /// The unreferenced hit (GPU threads only): copies `bytes` (at most `max_unreferenced_bytes`)
  /// at `within` of `page` into `out` where the page is VALID and its slot is not refilled
  /// during the copy, and counts the hit; false (nothing counted, `out` untouched) otherwise:
  /// the caller takes the referenced path.
  [[nodiscard]] CUNVME_HOST_DEVICE bool read_unreferenced(cuda::std::uint64_t page, cuda::std::uint64_t within, cuda::std::uint64_t bytes,
                                                          void* out) const {
    bookkeeping_word<cuda::std::uint64_t> word(c_.table[page]);
    // Relaxed: only the slot is taken from it; the checks below decide what may be read.
    const cuda::std::uint64_t seen = word.load(cuda::std::memory_order_relaxed);
    if (page_word::state(seen) != page_state::valid) return false;
    const cuda::std::uint32_t slot = page_word::slot(seen);
    bookkeeping_word<cuda::std::uint32_t> generation(c_.generations[slot]);
    // Acquire: pairs with the release of this even generation by the fill that set it (the same
    // thread evicted the slot's last page first), so no older VALID of this page is seen below.
    const cuda::std::uint32_t before = generation.load(cuda::std::memory_order_acquire);
    if ((before & 1) != 0) return false;
    // The word again: VALID in this slot means the slot held the page at `before`, since an
    // evictor moves the word off VALID before it makes the generation odd. Acquire: pairs with
    // the word's last release — the fill's VALID or a writer giving its reference back — so the
    // copy sees their bytes, as a referenced hit's swap would; and a later fill of the page into
    // this slot, whose VALID follows a newer generation, makes the second look below see that one.
    const cuda::std::uint64_t again = word.load(cuda::std::memory_order_acquire);
    if (page_word::state(again) != page_state::valid || page_word::slot(again) != slot) return false;
    // The copy's loads before the second look at the generation: one aligned 8-byte value (an
    // `array<uint64_t>` element) by an acquire load of it, anything else by a fence after the
    // copy (on the H200 the acquire load served 7–12 % more hits: bench/RESULTS.md, P7a).
    alignas(16) unsigned char staged[max_unreferenced_bytes];
    const unsigned char* from = slot_bytes(slot) + within;
    if (bytes == 8 && reinterpret_cast<cuda::std::uintptr_t>(from) % 8 == 0) {
      auto& value = *const_cast<cuda::std::uint64_t*>(reinterpret_cast<const cuda::std::uint64_t*>(from));
      const cuda::std::uint64_t got = bookkeeping_word<cuda::std::uint64_t>(value).load(cuda::std::memory_order_acquire);
      cuda::std::memcpy(staged, &got, 8);
    } else {
      detail::copy_widest(staged, from, bytes);
      access::loads_before_later_loads();
    }
    if (generation.load(cuda::std::memory_order_relaxed) != before) return false;
    detail::copy_widest(out, staged, bytes);
    mark_referenced(slot);
    count(c_.counters->hits);
    return true;
  }
#endif

  /// Finds a slot for `page` by clock with second chance: a set clock bit is cleared and the
  /// slot passed over once; a free slot is claimed; a slot whose page is VALID with no
  /// references is taken by swapping its word to EVICTING (after a write-back if dirty). Tries
  /// until the queue's timeout, then `cache_full`. A failed write-back of the victim leaves it
  /// dirty in its slot and returns that failure to this (missing) thread.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result take_slot(cuda::std::uint64_t page, cuda::std::uint32_t& slot) const {
    const cuda::std::uint64_t deadline = detail::saturating_add<cuda::std::uint64_t>(access::now_ns(), timeout_ns_);
    for (cuda::std::uint32_t round = 0;; ++round) {
      // Two sweeps: the first may only clear clock bits.
      for (cuda::std::uint64_t probe = 0; probe < 2ull * c_.slots; ++probe) {
        const auto s = static_cast<cuda::std::uint32_t>(
            bookkeeping_word<cuda::std::uint64_t>(c_.counters->clock_hand).fetch_add(1, cuda::std::memory_order_relaxed) % c_.slots);
        bookkeeping_word<cuda::std::uint32_t> bit(c_.referenced[s]);
        if (bit.load(cuda::std::memory_order_relaxed) != 0) {
          bit.store(0, cuda::std::memory_order_relaxed);  // a hint only: orders nothing
          continue;
        }
        bookkeeping_word<cuda::std::uint64_t> owner(c_.owners[s]);
        cuda::std::uint64_t held = owner.load(cuda::std::memory_order_acquire);
        if (held == slot_owner::empty) {
          if (owner.compare_exchange_strong(held, slot_owner::claimed, cuda::std::memory_order_acquire, cuda::std::memory_order_relaxed)) {
            slot = s;
            return io_result{};
          }
          continue;
        }
        if (!slot_owner::holds_page(held)) continue;  // claimed by another thread, or retired
        const io_result r = evict(held - 1, s);
        if (r.error == io_error::none) {
          slot = s;
          return r;
        }
        if (r.error != io_error::cache_full) return r;  // the victim's write-back failed
      }
      if (access::now_ns() > deadline) return io_result::failure(io_error::cache_full, first_lba(page), blocks_per_page_);
      access::back_off(round);
    }
  }

  /// Takes slot `slot` from `victim` if the victim is VALID there with no references:
  /// success (the slot is claimed), `cache_full` when it cannot be taken now, or the failure
  /// of the victim's write-back (then the victim is VALID and dirty in its slot again).
  [[nodiscard]] CUNVME_HOST_DEVICE io_result evict(cuda::std::uint64_t victim, cuda::std::uint32_t slot) const {
    bookkeeping_word<cuda::std::uint64_t> word(c_.table[victim]);
    cuda::std::uint64_t seen = word.load(cuda::std::memory_order_relaxed);
    // The slot check refuses a stale owner: the victim may have been evicted and filled into
    // another slot since its owner word was read.
    if (page_word::state(seen) != page_state::valid || page_word::references(seen) != 0 || page_word::slot(seen) != slot) {
      return io_result::failure(io_error::cache_full, 0, 0);
    }
    const bool dirty = page_word::dirty(seen);
    // Acquire: pairs with the last holder's release, so its reads of the slot are over and its
    // writes are in memory before this thread writes the slot back or refills it.
    if (!word.compare_exchange_strong(seen, page_word::make(page_state::evicting, slot, dirty), cuda::std::memory_order_acquire,
                                      cuda::std::memory_order_relaxed)) {
      return io_result::failure(io_error::cache_full, 0, 0);
    }
    bookkeeping_word<cuda::std::uint64_t> owner(c_.owners[slot]);
    // Claimed: other evictors pass the slot over (they would also refuse the EVICTING word).
    owner.store(slot_owner::claimed, cuda::std::memory_order_relaxed);
    if (dirty) {
      if (const io_result r = write_back(victim, slot); !r.ok()) {
        // Back as it was, owner first (as a fill publishes): the bytes are still only here.
        owner.store(slot_owner::of_page(victim), cuda::std::memory_order_release);
        word.store(page_word::make(page_state::valid, slot, true), cuda::std::memory_order_release);
        return r;
      }
    }
    count(c_.counters->evictions);
    // Release: the write-back completed before this; the next filler of the victim (acquire on
    // INVALID) reads the namespace only after it.
    word.store(page_word::make(page_state::invalid), cuda::std::memory_order_release);
    return io_result{};
  }

  /// Writes `page` from `slot` to the namespace. A write-back that timed out may still be
  /// carried out later: the page stays dirty and is written again, and until the host aborts
  /// the abandoned command (`host::io_queue::abort_timed_out`) the two may land in either order.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result write_back(cuda::std::uint64_t page, cuda::std::uint32_t slot) const {
    const cuda::std::uint64_t at = cuda::std::uint64_t{slot} << c_.page_shift;
    const io_result r = on_volume() ? volume_io<Queue, Doorbell>(v_).write(first_lba(page), blocks_per_page_, slot_buffer{&c_}, at)
                                    : writer(q_, ns_).write(first_lba(page), blocks_per_page_, c_.data_bus, at);
    count(r.ok() ? c_.counters->write_backs : c_.counters->write_back_failures);
    return r;
  }

  /// Reads `page` into `slot` from the namespace (the volume).
  [[nodiscard]] CUNVME_HOST_DEVICE io_result fill(cuda::std::uint64_t page, cuda::std::uint32_t slot) const {
    const cuda::std::uint64_t at = cuda::std::uint64_t{slot} << c_.page_shift;
    return on_volume() ? volume_io<Queue, Doorbell>(v_).read(first_lba(page), blocks_per_page_, slot_buffer{&c_}, at)
                       : reader(q_, ns_).read(first_lba(page), blocks_per_page_, c_.data_bus, at);
  }

  /// The slots as each member of the volume reaches them.
  struct slot_buffer {
    const page_cache_view* c;
    [[nodiscard]] CUNVME_HOST_DEVICE prp::page_list of(cuda::std::uint32_t member) const noexcept { return c->bus_of(member); }
  };
  [[nodiscard]] CUNVME_HOST_DEVICE bool on_volume() const noexcept { return v_.member_count != 0; }

  /// acquire, `use` the bytes at `offset`, release — for a range within one page.
  CUNVME_EXEC_CHECK_DISABLE
  template <class Use>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result copy(cuda::std::uint64_t offset, cuda::std::uint64_t bytes, page_access access, Use&& use) const {
    const cuda::std::uint64_t page = offset >> c_.page_shift;
    const cuda::std::uint64_t within = offset & (c_.page_bytes() - 1);
    if (bytes == 0 || bytes > c_.page_bytes() - within) return io_result::failure(io_error::invalid_request, first_lba(page), 0);
    const cached_page p = acquire(page, access);
    if (!p.ok()) return p.result;
    use(p.data + within);
    release(page);
    return io_result{};
  }

  [[nodiscard]] CUNVME_HOST_DEVICE unsigned char* slot_bytes(cuda::std::uint32_t slot) const noexcept {
    return c_.data + (cuda::std::uint64_t{slot} << c_.page_shift);
  }
  /// Sets the slot's clock bit, reading first so hot slots are not written on every hit.
  CUNVME_HOST_DEVICE void mark_referenced(cuda::std::uint32_t slot) const noexcept {
    bookkeeping_word<cuda::std::uint32_t> bit(c_.referenced[slot]);
    if (bit.load(cuda::std::memory_order_relaxed) == 0) bit.store(1, cuda::std::memory_order_relaxed);
  }
  CUNVME_HOST_DEVICE static void count(cuda::std::uint64_t& counter) noexcept {
#if defined(CUNVME_DEVICE_COMPILATION)
    // One atomic per group of lanes counting the same word at once, not one per lane: every hit
    // of a grid counts `hits`, and atomics on one address are served one at a time by one L2
    // slice. (Not what limits P7a: on the H100 the all-hit gather ran as fast with no counting
    // at all — bench/RESULTS.md.) Lanes may count different caches' counters, hence the
    // partition by address.
    namespace cg = cooperative_groups;
    const auto lanes = cg::labeled_partition(cg::coalesced_threads(), reinterpret_cast<unsigned long long>(&counter));
    if (lanes.thread_rank() == 0) bookkeeping_word<cuda::std::uint64_t>(counter).fetch_add(lanes.size(), cuda::std::memory_order_relaxed);
#else
    bookkeeping_word<cuda::std::uint64_t>(counter).fetch_add(1, cuda::std::memory_order_relaxed);
#endif
  }

  page_cache_view c_;
  queue_view q_{};          // one namespace's cache
  namespace_view ns_{};
  volume_view v_{};         // a volume's cache (member_count 0 otherwise)
  cuda::std::uint64_t timeout_ns_ = 0;
  cuda::std::uint32_t blocks_per_page_ = 0;
};

CUNVME_NAMESPACE_END
