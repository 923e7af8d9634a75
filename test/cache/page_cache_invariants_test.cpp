// The page cache's two safety invariants under randomized concurrency on CPU threads (the same
// code GPU threads run), with eviction pressure: the slots hold under 1 % of the pages.
//
// 1. A page a thread holds is never evicted: its bytes stay the page's, and its table word
//    stays VALID in the same slot with a reference, however many misses other threads (and the
//    holder itself) make meanwhile.
// 2. One page is never in two slots: after every stampede (all threads missing one cold page at
//    once) exactly one fill happened and one slot names the page; and at every quiescent point
//    (all references given back) each slot that names a page is the one slot that page's VALID
//    word names, every VALID page's slot names it back, and each such slot holds exactly that
//    page's current bytes.
//
// What it cannot see: a held *shared* page evicted and filled again into the same slot between
// two looks (its bytes and word would be the same); pages a thread writes are its own, so for
// them any eviction under the holder shows.
//
// And every value read is the one last written (or the namespace's pattern). BaM's cache had both
// kinds of bug (an in-use page evicted; one page loaded into two slots, its PR #39). The cache
// suite runs under ThreadSanitizer as well, which checks the orderings these rely on.
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>

#include "cache_fixture.hpp"

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace test;
using namespace std::chrono_literals;

namespace {

using cache_t = cpu_cache;

constexpr std::uint64_t page_bytes = 4096, words_per_page = page_bytes / 8;

/// The bytes page `page` should hold at `version` (0: the namespace's pattern as filled).
std::uint64_t expected_word(std::uint64_t page, std::uint64_t word, std::uint64_t version) {
  return word_at(page * page_bytes + word * 8, version);
}

/// Words of a page's bytes that are not `page` at `version`.
std::uint64_t wrong_words(const unsigned char* data, std::uint64_t page, std::uint64_t version) {
  std::uint64_t bad = 0;
  for (std::uint64_t w = 0; w < words_per_page; ++w) {
    std::uint64_t v;
    std::memcpy(&v, data + w * 8, 8);
    bad += v != expected_word(page, w, version);
  }
  return bad;
}

std::uint64_t load_word(const std::uint64_t& word) { return std::atomic_ref<const std::uint64_t>(word).load(std::memory_order_acquire); }

}  // namespace

TEST_CASE("randomized: a held page is never evicted, no page is ever in two slots, and every value read is the last written") {
  // 2048 pages of 4 KiB over 16 slots (0.8 %). Pages [0, shared) are read by every thread and
  // never written; page p ≥ shared belongs to thread p % threads, the only one that writes or
  // reads it (references are shared, not locks: a page written by one thread while another
  // reads it would be the callers' race, not the cache's).
  constexpr std::uint32_t slots = 16;
  constexpr unsigned threads = 4, rounds = 6, ops = 240, stampedes = 40;
  constexpr std::uint64_t pages = (8u << 20) / page_bytes, shared = 512;
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 64, host::queue_placement::host, 10s);
  const cunvme::namespace_view ns = q.namespace_view(1);
  host::page_cache_memory memory(*r.ctrl, ns, page_bytes, slots);
  const cache_t cache(memory.view(), q.view(), ns);
  const cunvme::page_cache_view view = memory.view();
  REQUIRE(view.pages == pages);

  // version[p]: the writes made to owned page p so far (only its owner touches its entry).
  std::vector<std::uint64_t> version(pages, 0);
  std::vector<std::uint64_t> wrong(threads), evicted_under_holder(threads), failures(threads), writes(threads);
  std::vector<std::string> first_failure(threads);
  std::vector<std::string> structural;
  // Around each stampede: the fills before it, and after it exactly one more, its page in one slot.
  std::uint64_t fills_before = 0, stampede_page = 0;
  std::barrier together(threads, [&]() noexcept { fills_before = memory.counters().fills; });
  std::barrier stampeded(threads, [&]() noexcept {
    if (memory.counters().fills != fills_before + 1) {
      structural.push_back("stampede on page " + std::to_string(stampede_page) + ": " + std::to_string(memory.counters().fills - fills_before) + " fills");
    }
    unsigned holding = 0;
    for (std::uint32_t s = 0; s < slots; ++s) holding += load_word(view.owners[s]) == slot_owner::of_page(stampede_page);
    if (holding != 1) structural.push_back("stampede page " + std::to_string(stampede_page) + " in " + std::to_string(holding) + " slots");
  });
  std::barrier quiescent(threads, [&]() noexcept {
    // Everyone has given back every reference: the table and the owners must agree exactly.
    std::vector<int> slot_of_page(pages, -1);
    for (std::uint32_t s = 0; s < slots; ++s) {
      const std::uint64_t owner = load_word(view.owners[s]);
      if (!slot_owner::holds_page(owner)) continue;
      const std::uint64_t page = owner - 1;
      const std::uint64_t w = load_word(view.table[page]);
      if (page_word::state(w) != page_state::valid || page_word::slot(w) != s || page_word::references(w) != 0) {
        structural.push_back("slot " + std::to_string(s) + " names page " + std::to_string(page) + ", whose word does not name it back, VALID and free");
      }
      if (slot_of_page[page] != -1) structural.push_back("page " + std::to_string(page) + " in two slots");
      slot_of_page[page] = static_cast<int>(s);
      if (wrong_words(view.data + s * page_bytes, page, version[page]) != 0) {
        structural.push_back("slot " + std::to_string(s) + " does not hold page " + std::to_string(page) + "'s current bytes");
      }
    }
    for (std::uint64_t p = 0; p < pages; ++p) {
      const std::uint64_t w = load_word(view.table[p]);
      if (page_word::state(w) == page_state::valid && slot_of_page[p] != static_cast<int>(page_word::slot(w))) {
        structural.push_back("page " + std::to_string(p) + " is VALID in slot " + std::to_string(page_word::slot(w)) + ", which does not name it");
      }
      if (page_word::state(w) != page_state::valid && page_word::state(w) != page_state::invalid) {
        structural.push_back("page " + std::to_string(p) + " left FILLING or EVICTING");
      }
    }
  });

  on_threads(threads, [&](unsigned t) {
    std::mt19937_64 rng(1009 * (t + 1));
    auto fail = [&](const cunvme::io_result& res) {
      if (failures[t]++ == 0) first_failure[t] = cunvme::to_string(res);
    };
    // A page this thread may look at: shared (read only; a quarter of the picks from 32 hot
    // pages, twice the slots, so that threads miss the same page at once) or its own. The last
    // `rounds × stampedes` shared pages are the stampedes' cold pages.
    auto pick = [&](bool own) {
      if (!own) return rng() % 4 == 0 ? rng() % 32 : rng() % (shared - rounds * stampedes);
      return shared + (rng() % ((pages - shared) / threads)) * threads + t;
    };
    for (unsigned round = 0; round < rounds; ++round) {
      // Stampedes: every thread misses the same cold page at once (released together by a
      // barrier), again and again: one fill, one slot, and every thread its bytes.
      for (unsigned k = 0; k < stampedes; ++k) {
        const std::uint64_t cold = shared - 1 - (round * stampedes + k);
        if (t == 0) stampede_page = cold;  // read in the completions, after the barriers
        together.arrive_and_wait();
        if (const cunvme::cached_page s = cache.acquire(cold, page_access::read); s.ok()) {
          wrong[t] += wrong_words(s.data, cold, 0);
          CHECK(cache.release(cold));
        } else {
          fail(s.result);
        }
        stampeded.arrive_and_wait();
      }
      for (unsigned op = 0; op < ops; ++op) {
        const bool own = rng() % 2 == 0, write = own && rng() % 3 == 0;
        const std::uint64_t held = pick(own);
        const cunvme::cached_page a = cache.acquire(held, write ? page_access::write : page_access::read);
        if (!a.ok()) {
          fail(a.result);
          continue;
        }
        const std::uint64_t slot = static_cast<std::uint64_t>(a.data - view.data) / page_bytes;
        if (write) {
          const std::uint64_t next = version[held] + 1;
          for (std::uint64_t w = 0; w < words_per_page; ++w) {
            const std::uint64_t v = expected_word(held, w, next);
            std::memcpy(a.data + w * 8, &v, 8);
          }
          version[held] = next;
          ++writes[t];
        } else {
          wrong[t] += wrong_words(a.data, held, version[held]);
        }
        // While holding it, make misses of our own (each may evict someone's page).
        for (unsigned k = rng() % 3; k > 0; --k) {
          const std::uint64_t other = pick(rng() % 2 == 0);
          if (other == held) continue;
          const cunvme::cached_page b = cache.acquire(other, page_access::read);
          if (!b.ok()) {
            fail(b.result);
            continue;
          }
          wrong[t] += wrong_words(b.data, other, version[other]);
          CHECK(cache.release(other));
        }
        // Invariant 1: still ours, in the same slot, with the bytes we saw or wrote.
        const std::uint64_t w = load_word(view.table[held]);
        if (page_word::state(w) != page_state::valid || page_word::slot(w) != slot || page_word::references(w) == 0 ||
            wrong_words(a.data, held, version[held]) != 0) {
          ++evicted_under_holder[t];
        }
        CHECK(cache.release(held));
      }
      quiescent.arrive_and_wait();
    }
  });

  for (unsigned t = 0; t < threads; ++t) {
    CAPTURE(t);
    CAPTURE(first_failure[t]);
    CHECK(failures[t] == 0);
    CHECK(wrong[t] == 0);
    CHECK(evicted_under_holder[t] == 0);
    CHECK(writes[t] > 0);
  }
  std::string broken;
  for (const auto& s : structural) broken += s + "; ";
  CAPTURE(broken);
  CHECK(structural.empty());
  const auto counters = memory.counters();
  CHECK(counters.evictions > 100);  // the pressure was real
  CHECK(counters.write_backs > 0);
  CHECK(counters.hits > 0);
  // And the namespace got every owned page's last version: flushed, then read past the cache.
  REQUIRE(cache.flush().ok());
  auto buffer = r.ctrl->memory().allocate(pages * page_bytes);
  reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio> raw(q.view(), ns);
  REQUIRE(raw.read(0, pages * page_bytes / 512, contiguous_of(buffer), 0).ok());
  std::uint64_t lost = 0;
  for (std::uint64_t p = 0; p < pages; ++p) lost += wrong_words(reinterpret_cast<const unsigned char*>(buffer.data()) + p * page_bytes, p, version[p]) != 0;
  CHECK(lost == 0);
}
