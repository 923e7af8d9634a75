// The page cache's shared state: one 64-bit word per page of the namespace (its state, the
// slot holding it, whether it is dirty, how many threads hold it), one owner word, one clock
// bit and one generation per slot, and the counters. `page_cache` (page_cache.cuh) works on it;
// `host::page_cache_memory` lays it out once, zeroed, and hands out the view.
//
// Why one word per page: a hit is then a single compare-and-swap that both checks the page is
// VALID and adds a reference, so no lock is taken on the lookup path, and an evictor can take a
// page only by the same kind of swap from "VALID with no references" — a page some thread holds
// can never be evicted under it (the bug BaM's PR #39 fixed in its cache).
//
// Why a generation per slot: GPU threads that only read a page need not write shared state at
// all. A slot's generation is odd while its bytes are being replaced and moves on with every
// refill, so a reader that finds the same even generation before and after copying its bytes
// (and the page's word naming that slot in between) copied the page's bytes, with no reference
// taken: `page_cache::read`'s unreferenced hit.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/policy/prp.cuh>

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN

/// Where a page is in its life. Only the thread that moved a word to `filling` or `evicting`
/// moves it on; every other thread waits (bounded) or looks elsewhere.
enum class page_state : cuda::std::uint8_t {
  invalid = 0,   ///< not cached: the first thread to want it swaps it to `filling`
  filling = 1,   ///< one thread is reading it into a slot; others wanting it wait (misses coalesce)
  valid = 2,     ///< in its slot: hits add references
  evicting = 3,  ///< its slot is being taken (after a write-back if dirty); it becomes `invalid`
};

/// One page's table word, as raw bits with accessors (no bitfields: their layout is the
/// compiler's choice, and the word is swapped as a whole).
///
///   bits  0..31  slot        (valid, evicting: the slot holding the page)
///   bits 32..33  page_state
///   bit  34      dirty       (valid, evicting: the slot's bytes are newer than the namespace's)
///   bits 40..63  references  (valid: threads holding the page)
namespace page_word {
inline constexpr cuda::std::uint64_t slot_mask = 0xffff'ffffull;
inline constexpr unsigned state_shift = 32;
inline constexpr cuda::std::uint64_t state_mask = 3ull << state_shift;
inline constexpr cuda::std::uint64_t dirty_bit = 1ull << 34;
inline constexpr unsigned reference_shift = 40;
inline constexpr cuda::std::uint64_t one_reference = 1ull << reference_shift;
/// References a page may have at once (24 bits: more than the threads a GPU keeps resident).
inline constexpr cuda::std::uint32_t max_references = (1u << 24) - 1;
/// Slots a cache may have: the count fits 32 bits, and so every slot index the slot field.
inline constexpr cuda::std::uint64_t max_slots = slot_mask;

[[nodiscard]] CUNVME_HOST_DEVICE constexpr page_state state(cuda::std::uint64_t w) noexcept {
  return static_cast<page_state>((w & state_mask) >> state_shift);
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t slot(cuda::std::uint64_t w) noexcept {
  return static_cast<cuda::std::uint32_t>(w & slot_mask);
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool dirty(cuda::std::uint64_t w) noexcept { return (w & dirty_bit) != 0; }
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t references(cuda::std::uint64_t w) noexcept {
  return static_cast<cuda::std::uint32_t>(w >> reference_shift);
}
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t make(page_state s, cuda::std::uint32_t slot = 0, bool is_dirty = false,
                                                                    cuda::std::uint32_t refs = 0) noexcept {
  return cuda::std::uint64_t{slot} | (cuda::std::uint64_t{static_cast<cuda::std::uint8_t>(s)} << state_shift) | (is_dirty ? dirty_bit : 0) |
         (cuda::std::uint64_t{refs} << reference_shift);
}

static_assert(state(make(page_state::valid, 7, true, 3)) == page_state::valid);
static_assert(slot(make(page_state::evicting, 0xffff'ffffu, false, max_references)) == 0xffff'ffffu);
static_assert(dirty(make(page_state::valid, 1, true)) && !dirty(make(page_state::valid, 1, false)));
static_assert(references(make(page_state::valid, 0xffff'ffffu, true, max_references)) == max_references);
static_assert(make(page_state::invalid) == 0, "a zeroed table is a table of invalid pages");
}  // namespace page_word

/// What a slot's owner word holds: the page it holds plus one, or one of these.
namespace slot_owner {
inline constexpr cuda::std::uint64_t empty = 0;                 ///< never held a page, or its fill failed
inline constexpr cuda::std::uint64_t claimed = ~0ull;           ///< a thread is evicting from or filling it
inline constexpr cuda::std::uint64_t retired = ~0ull - 1;       ///< a fill into it timed out: the controller may still
                                                                ///< write it, so it is never handed out again
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t of_page(cuda::std::uint64_t page) noexcept { return page + 1; }
[[nodiscard]] CUNVME_HOST_DEVICE constexpr bool holds_page(cuda::std::uint64_t owner) noexcept {
  return owner != empty && owner != claimed && owner != retired;
}
}  // namespace slot_owner

/// What the cache did, counted by every thread that uses it (relaxed: statistics, they order
/// nothing). The clock hand, written by every miss, has a 128-byte line of its own so it does
/// not share one with the counters.
struct page_cache_counters {
  alignas(128) cuda::std::uint64_t clock_hand;  ///< probes of the clock so far (slot = hand % slots)
  alignas(128) cuda::std::uint64_t hits;        ///< acquires that found the page VALID (also after waiting for a fill)
  cuda::std::uint64_t misses;                   ///< acquires that found it INVALID and so read it themselves
  cuda::std::uint64_t fills;                    ///< reads into a slot that succeeded
  cuda::std::uint64_t fill_failures;            ///< reads into a slot that failed (the accessor got the io_result)
  cuda::std::uint64_t evictions;                ///< pages taken out of their slot for another
  cuda::std::uint64_t write_backs;              ///< dirty pages written to the namespace (eviction and flush)
  cuda::std::uint64_t write_back_failures;      ///< writes of dirty pages that failed (the page stayed dirty)
  cuda::std::uint64_t coalesced_waits;          ///< acquires that waited for another thread's fill instead of reading
  cuda::std::uint64_t retired_slots;            ///< slots given up after a fill timed out
};
static_assert(sizeof(page_cache_counters) == 2 * 128);
static_assert(offsetof(page_cache_counters, hits) == 128);

/// Everything a `page_cache` works on, as addresses one side (CPU threads or a GPU's) uses.
/// Trivially copyable: kernels take it by value. The host fills it in (`host::page_cache_memory`).
struct page_cache_view {
  cuda::std::uint64_t* table = nullptr;              ///< [pages]: page_word per page of the namespace
  cuda::std::uint64_t* owners = nullptr;             ///< [slots]: slot_owner per slot
  cuda::std::uint32_t* referenced = nullptr;         ///< [slots]: clock bits, set by hits, cleared by the hand
  cuda::std::uint32_t* generations = nullptr;        ///< [slots]: odd while a fill replaces the slot's bytes; +2 per refill
  page_cache_counters* counters = nullptr;
  unsigned char* data = nullptr;                     ///< [slots × page_bytes()]: the slots' bytes
  prp::page_list data_bus{};                         ///< the same bytes as the controller reaches them
  cuda::std::uint64_t pages = 0;                     ///< pages of the namespace the cache covers
  cuda::std::uint32_t slots = 0;                     ///< capacity, in pages
  cuda::std::uint32_t page_shift = 12;               ///< log2 of the page size (12..16)
  cuda::std::uint32_t nsid = 0;                      ///< the namespace the table describes (0 for a volume's)
  cuda::std::uint32_t blocks_per_page = 0;           ///< of that namespace's (volume's) blocks
  cuda::std::uint32_t members = 0;                   ///< a volume's cache: its members (0: one namespace's cache)
  cuda::std::uint64_t data_pages = 0;                ///< entries of data_bus.pages per member (member m's follow m's predecessor's)

  /// The slots' bytes as member `m` of a volume reaches them (m = 0 for one namespace's cache).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr prp::page_list bus_of(cuda::std::uint32_t m) const noexcept {
    return prp::page_list{data_bus.pages + m * data_pages, data_bus.page_shift};
  }

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t page_bytes() const noexcept { return cuda::std::uint64_t{1} << page_shift; }
};
static_assert(cuda::std::is_trivially_copyable_v<page_cache_view>);

/// Page sizes a cache takes: 4 KiB (one controller page at the smallest) to 64 KiB (a GPU's
/// page-table granule; larger pages read more than random accesses use).
inline constexpr unsigned min_cache_page_shift = 12;
inline constexpr unsigned max_cache_page_shift = 16;

/// Where a cache's bookkeeping lies in one zeroed allocation: the counters, then the page
/// table, the slot owners, the clock bits, the generations and the data's page addresses
/// (8-byte aligned).
struct page_cache_layout {
  cuda::std::size_t table_at = 0, owners_at = 0, referenced_at = 0, generations_at = 0, bus_pages_at = 0, bytes = 0;

  /// The layout for `pages` pages, `slots` slots and `data_pages` data pages; false where a
  /// size does not fit `size_t` (callers refuse such a cache).
  [[nodiscard]] static constexpr bool of(cuda::std::uint64_t pages, cuda::std::uint64_t slots, cuda::std::uint64_t data_pages,
                                         page_cache_layout& out) noexcept {
    // Each count below 2^58 (on a 64-bit size_t): five arrays of at most 8 bytes an entry then
    // sum to less than 2^63, so nothing below wraps.
    constexpr cuda::std::uint64_t limit = ~cuda::std::size_t{0} / 64;
    if (pages > limit || slots > limit || data_pages > limit) return false;
    page_cache_layout l;
    l.table_at = sizeof(page_cache_counters);
    l.owners_at = l.table_at + static_cast<cuda::std::size_t>(pages) * 8;
    l.referenced_at = l.owners_at + static_cast<cuda::std::size_t>(slots) * 8;
    l.generations_at = l.referenced_at + static_cast<cuda::std::size_t>(slots) * 4;
    l.bus_pages_at = (l.generations_at + static_cast<cuda::std::size_t>(slots) * 4 + 7) / 8 * 8;
    l.bytes = l.bus_pages_at + static_cast<cuda::std::size_t>(data_pages) * 8;
    out = l;
    return true;
  }
  /// Points `view`'s bookkeeping into `memory` (`bytes` of zeroed memory, 128-byte aligned).
  void bind(page_cache_view& view, void* memory) const noexcept {
    auto* base = static_cast<unsigned char*>(memory);
    view.counters = reinterpret_cast<page_cache_counters*>(base);
    view.table = reinterpret_cast<cuda::std::uint64_t*>(base + table_at);
    view.owners = reinterpret_cast<cuda::std::uint64_t*>(base + owners_at);
    view.referenced = reinterpret_cast<cuda::std::uint32_t*>(base + referenced_at);
    view.generations = reinterpret_cast<cuda::std::uint32_t*>(base + generations_at);
  }
};

CUNVME_NAMESPACE_END
