// The page cache over one namespace, driven by CPU threads through the same code GPU threads
// run, against the emulator: hits and misses return the namespace's bytes, misses coalesce,
// referenced pages stay, writes reach the namespace through eviction and flush, and injected
// errors and lost completions reach the accessing thread as its io_result.
#include <cunvme/cache/page_cache.cuh>
#include <cunvme/emu/fault_injection.cuh>
#include <cunvme/host/owners/page_cache_memory.cuh>

#include "cache_fixture.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace test;
using namespace std::chrono_literals;

namespace {

using cache_t = cpu_cache;

/// An emulator with the pattern filled in, a queue pair and a cache's memory over namespace 1
/// (8 MiB of 512-byte blocks unless `config` says otherwise; `max_blocks`, where not 0, splits
/// each fill into commands of that many blocks).
struct cache_rig {
  explicit cache_rig(std::uint64_t page_bytes, std::uint64_t slots, emu::controller_config config = small_config(),
                     std::chrono::nanoseconds timeout = 10s, std::uint32_t max_blocks = 0)
      : r(std::move(config)), q(*r.ctrl, 64, host::queue_placement::host, timeout), ns(limited(q.namespace_view(1), max_blocks)),
        memory(*r.ctrl, ns, page_bytes, slots) {
    r.fill();
  }
  [[nodiscard]] cache_t cache() const { return cache_t(memory.view(), q.view(), ns); }
  [[nodiscard]] std::uint64_t io_commands() const { return r.emulator->stats().io_commands; }

  rig r;
  host::io_queue q;
  cunvme::namespace_view ns;
  host::page_cache_memory memory;

 private:
  static cunvme::namespace_view limited(cunvme::namespace_view n, std::uint32_t max_blocks) {
    if (max_blocks != 0) n.max_blocks = max_blocks;
    return n;
  }
};

/// Words of `data` (a page's bytes) that differ from page `page`'s pattern of write round `round`.
std::uint64_t mismatches_in(const unsigned char* data, std::uint64_t page, std::uint64_t page_bytes, std::uint64_t round = 0) {
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < page_bytes / 8; ++i) {
    std::uint64_t w;
    std::memcpy(&w, data + i * 8, 8);
    bad += w != word_at(page * page_bytes + i * 8, round);
  }
  return bad;
}

}  // namespace

TEST_CASE("a miss reads the page from the namespace and a hit returns the same bytes from its slot") {
  cache_rig c(4096, 8);
  const cache_t cache = c.cache();
  const cunvme::cached_page first = cache.acquire(3, page_access::read);
  REQUIRE_MESSAGE(first.ok(), cunvme::to_string(first.result));
  CHECK(mismatches_in(first.data, 3, 4096) == 0);
  CHECK(cache.release(3));
  const cunvme::cached_page again = cache.acquire(3, page_access::read);
  REQUIRE(again.ok());
  CHECK(again.data == first.data);
  CHECK(mismatches_in(again.data, 3, 4096) == 0);
  CHECK(cache.release(3));
  std::uint64_t word = 0;
  CHECK(cache.read(3 * 4096 + 8 * 17, 8, &word).ok());
  CHECK(word == word_at(3 * 4096 + 8 * 17));
  const auto counters = c.memory.counters();
  CHECK(counters.misses == 1);
  CHECK(counters.fills == 1);
  CHECK(counters.hits == 2);
  CHECK(c.io_commands() == 1);
  // One fill: the slot's generation went odd for it and even again after it, and hits leave it.
  CHECK(c.memory.slot_generation(page_word::slot(c.memory.page_entry(3))) == 2);
}

TEST_CASE("every refill of a slot moves its generation on by two, and it is even whenever the slot holds a page") {
  cache_rig c(4096, 1);
  const cache_t cache = c.cache();
  for (std::uint64_t page = 0; page < 5; ++page) {
    std::uint64_t word = 0;
    REQUIRE(cache.read(page * 4096, 8, &word).ok());
    CHECK(word == word_at(page * 4096));
    CHECK(c.memory.slot_entry(0) == slot_owner::of_page(page));
    CHECK(c.memory.slot_generation(0) == 2 * (page + 1));
  }
  CHECK(c.memory.counters().evictions == 4);
}

/// A cache shape: page bytes, the namespace's block bytes, and blocks per command (0: MDTS).
template <std::uint64_t Page, std::uint32_t Block, std::uint32_t MaxBlocks = 0>
struct shape {
  static constexpr std::uint64_t page_bytes = Page;
  static constexpr std::uint32_t block_bytes = Block;
  static constexpr std::uint32_t max_blocks = MaxBlocks;
};

TEST_CASE_TEMPLATE("with far fewer slots than pages, random pages read by four threads are verified byte for byte, for page and block sizes and split fills",
                   S, shape<4096, 512>, shape<16384, 512, 8>, shape<65536, 4096>, shape<65536, 512, 24>) {
  cache_rig c(S::page_bytes, 16, small_config(S::block_bytes), 10s, S::max_blocks);
  const cache_t cache = c.cache();
  const std::uint64_t pages = std::min<std::uint64_t>(cache.pages(), 512);
  REQUIRE(pages >= 8 * 16);
  constexpr unsigned threads = 4;
  constexpr std::uint32_t ops = 300;
  std::vector<std::uint64_t> bad(threads), failed(threads);
  on_threads(threads, [&](unsigned t) {
    std::mt19937_64 rng(t + 1);
    for (std::uint32_t i = 0; i < ops; ++i) {
      const std::uint64_t page = rng() % pages;
      const cunvme::cached_page p = cache.acquire(page, page_access::read);
      if (!p.ok()) {
        ++failed[t];
        continue;
      }
      bad[t] += mismatches_in(p.data, page, S::page_bytes);
      cache.release(page);
    }
  });
  for (unsigned t = 0; t < threads; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  const auto counters = c.memory.counters();
  CHECK(counters.hits + counters.misses == threads * ops);
  CHECK(counters.fills == counters.misses);
  // The first 16 fills took the free slots; every later one evicted a page.
  REQUIRE(counters.fills > 16);
  CHECK(counters.evictions == counters.fills - 16);
  CHECK(counters.fill_failures == 0);
  // One command per fill, or as many as the split asks.
  const std::uint64_t blocks = S::page_bytes / S::block_bytes;
  const std::uint64_t per_fill = S::max_blocks == 0 ? 1 : (blocks + S::max_blocks - 1) / S::max_blocks;
  CHECK(c.io_commands() == counters.fills * per_fill);
}

TEST_CASE("hot pages hammered by eight threads are read once each and hit ever after") {
  cache_rig c(16384, 32);
  const cache_t cache = c.cache();
  constexpr unsigned threads = 8;
  constexpr std::uint32_t ops = 2000;
  constexpr std::uint64_t hot = 16;
  std::vector<std::uint64_t> bad(threads), failed(threads);
  on_threads(threads, [&](unsigned t) {
    std::mt19937_64 rng(100 + t);
    for (std::uint32_t i = 0; i < ops; ++i) {
      const std::uint64_t offset = (rng() % hot) * 16384 + (rng() % (16384 / 8)) * 8;
      std::uint64_t value = 0;
      const io_result r = cache.read(offset, 8, &value);
      failed[t] += !r.ok();
      bad[t] += r.ok() && value != word_at(offset);
    }
  });
  for (unsigned t = 0; t < threads; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  const auto counters = c.memory.counters();
  CHECK(counters.fills == hot);
  CHECK(counters.misses == hot);
  CHECK(counters.hits == threads * ops - hot);
  CHECK(counters.evictions == 0);
  CHECK(c.io_commands() == hot);  // a 16 KiB page is one command (MDTS 512 KiB)
}

TEST_CASE("a page a thread holds is never evicted, however many misses need its slot") {
  cache_rig c(4096, 8);
  const cache_t cache = c.cache();
  cunvme::page_ref held(cache, 7, page_access::read);
  REQUIRE(held.ok());
  const std::uint64_t entry = c.memory.page_entry(7);
  const std::uint32_t slot = page_word::slot(entry);
  constexpr unsigned threads = 4;
  std::vector<std::uint64_t> bad(threads), failed(threads);
  on_threads(threads, [&](unsigned t) {
    std::mt19937_64 rng(7 + t);
    for (std::uint32_t i = 0; i < 400; ++i) {
      const std::uint64_t page = 8 + rng() % 256;
      const cunvme::cached_page p = cache.acquire(page, page_access::read);
      if (!p.ok()) {
        ++failed[t];
        continue;
      }
      bad[t] += mismatches_in(p.data, page, 4096);
      cache.release(page);
    }
  });
  for (unsigned t = 0; t < threads; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  CHECK(c.memory.counters().evictions > 100);
  const std::uint64_t now = c.memory.page_entry(7);
  CHECK(page_word::state(now) == page_state::valid);
  CHECK(page_word::slot(now) == slot);
  CHECK(page_word::references(now) == 1);
  CHECK(c.memory.slot_entry(slot) == slot_owner::of_page(7));
  CHECK(mismatches_in(held.data(), 7, 4096) == 0);
  held.reset();
  CHECK(page_word::references(c.memory.page_entry(7)) == 0);
}

TEST_CASE("misses on one page by eight threads at once issue one read and every thread gets its bytes") {
  emu::fault_rule slow;  // the read stays in flight while the others arrive
  slow.action = emu::fault_action::add_delay;
  slow.delay_ns = 300'000'000;
  slow.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  slow.fraction = 1;
  cache_rig c(4096, 8, with_rule(slow));
  const cache_t cache = c.cache();
  const std::uint64_t before = c.io_commands();
  constexpr unsigned threads = 8;
  std::vector<std::uint64_t> bad(threads), failed(threads);
  on_threads(threads, [&](unsigned t) {
    cunvme::page_ref p(cache, 42, page_access::read);
    if (!p.ok()) {
      ++failed[t];
      return;
    }
    bad[t] = mismatches_in(p.data(), 42, 4096);
  });
  for (unsigned t = 0; t < threads; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  CHECK(c.io_commands() - before == 1);
  const auto counters = c.memory.counters();
  CHECK(counters.misses == 1);
  CHECK(counters.fills == 1);
  CHECK(counters.hits == threads - 1);
  CHECK(counters.coalesced_waits >= 1);
  CHECK(page_word::references(c.memory.page_entry(42)) == 0);
}

TEST_CASE("writes through the cache reach the namespace by eviction and flush: a fresh cache and a raw reader read them") {
  cache_rig c(4096, 8);
  constexpr std::uint64_t pages = 64;
  constexpr unsigned threads = 4;
  {
    const cache_t cache = c.cache();
    std::vector<std::uint64_t> failed(threads);
    on_threads(threads, [&](unsigned t) {
      std::vector<std::uint64_t> order(pages);
      for (std::uint64_t i = 0; i < pages; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937_64(t + 11));
      for (const std::uint64_t page : order) {
        // Each thread owns the words w with w % threads == t: disjoint bytes of shared pages.
        if (page % 2 == 0) {
          cunvme::page_ref p(cache, page, page_access::write);
          if (!p.ok()) {
            ++failed[t];
            continue;
          }
          for (std::uint64_t w = t; w < 4096 / 8; w += threads) {
            const std::uint64_t v = word_at(page * 4096 + w * 8, 1);
            std::memcpy(p.data() + w * 8, &v, 8);
          }
        } else {
          for (std::uint64_t w = t; w < 4096 / 8; w += threads) {
            const std::uint64_t v = word_at(page * 4096 + w * 8, 1);
            failed[t] += !cache.write(page * 4096 + w * 8, 8, &v).ok();
          }
        }
      }
    });
    for (unsigned t = 0; t < threads; ++t) CHECK(failed[t] == 0);
    const io_result flushed = cache.flush();
    CHECK_MESSAGE(flushed.ok(), cunvme::to_string(flushed));
    const auto counters = c.memory.counters();
    CHECK(counters.write_backs >= pages);
    CHECK(counters.evictions > 0);
    CHECK(counters.write_back_failures == 0);
    for (std::uint64_t page = 0; page < pages; ++page) CHECK_FALSE(page_word::dirty(c.memory.page_entry(page)));
  }
  host::page_cache_memory fresh_memory(*c.r.ctrl, c.q.namespace_view(1), 4096, 4);
  const cache_t fresh(fresh_memory.view(), c.q.view(), c.q.namespace_view(1));
  std::uint64_t fresh_bad = 0;
  for (std::uint64_t page = 0; page < pages; ++page) {
    cunvme::page_ref p(fresh, page, page_access::read);
    REQUIRE(p.ok());
    fresh_bad += mismatches_in(p.data(), page, 4096, 1);
  }
  CHECK(fresh_bad == 0);
  auto buffer = c.r.ctrl->memory().allocate(pages * 4096);
  reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio> raw(c.q.view(), c.q.namespace_view(1));
  REQUIRE(raw.read(0, pages * 8, contiguous_of(buffer), 0).ok());
  std::uint64_t raw_bad = 0;
  for (std::uint64_t page = 0; page < pages; ++page) raw_bad += mismatches_in(reinterpret_cast<unsigned char*>(buffer.data()) + page * 4096, page, 4096, 1);
  CHECK(raw_bad == 0);
  // The page after the written ones still holds the pattern: write-backs stayed within their pages.
  std::uint64_t after = 0;
  CHECK(fresh.read(pages * 4096, 8, &after).ok());
  CHECK(after == word_at(pages * 4096));
}

TEST_CASE("random reads and writes of four threads through eight slots see their own last writes, and flush keeps them") {
  cache_rig c(4096, 8);
  const cache_t cache = c.cache();
  constexpr unsigned threads = 4;
  constexpr std::uint64_t pages = 64, words = 4096 / 8;
  constexpr std::uint32_t ops = 1500;
  // Word w of the first `pages` pages belongs to thread w % threads: its shadow says what it last wrote.
  std::vector<std::vector<std::uint64_t>> shadows(threads);
  std::vector<std::uint64_t> bad(threads), failed(threads);
  on_threads(threads, [&](unsigned t) {
    auto& shadow = shadows[t];
    shadow.resize(pages * words);
    for (std::uint64_t i = 0; i < shadow.size(); ++i) shadow[i] = word_at(i * 8);
    std::mt19937_64 rng(31 + t);
    for (std::uint32_t op = 0; op < ops; ++op) {
      const std::uint64_t word = (rng() % (pages * words / threads)) * threads + t;
      if (rng() % 3 == 0) {
        const std::uint64_t v = word_at(word * 8, 2 + op);
        if (cache.write(word * 8, 8, &v).ok()) shadow[word] = v;
        else ++failed[t];
      } else {
        std::uint64_t v = 0;
        if (!cache.read(word * 8, 8, &v).ok()) ++failed[t];
        else bad[t] += v != shadow[word];
      }
    }
  });
  for (unsigned t = 0; t < threads; ++t) {
    CHECK(bad[t] == 0);
    CHECK(failed[t] == 0);
  }
  REQUIRE(cache.flush().ok());
  const auto counters = c.memory.counters();
  CHECK(counters.evictions > 0);
  CHECK(counters.write_backs > 0);
  auto buffer = c.r.ctrl->memory().allocate(pages * 4096);
  reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio> raw(c.q.view(), c.q.namespace_view(1));
  REQUIRE(raw.read(0, pages * 8, contiguous_of(buffer), 0).ok());
  const auto* namespace_words = reinterpret_cast<const std::uint64_t*>(buffer.data());
  std::uint64_t lost = 0;
  for (std::uint64_t w = 0; w < pages * words; ++w) lost += namespace_words[w] != shadows[w % threads][w];
  CHECK(lost == 0);
}

TEST_CASE("an injected read error reaches exactly the threads that access the page, and the page is not left valid") {
  cache_rig c(4096, 8, with_rule(read_error_at(5 * 8, 5 * 8 + 7)));  // page 5's blocks
  const cache_t cache = c.cache();
  constexpr unsigned threads = 8;
  std::vector<io_result> results(threads);
  std::vector<std::uint64_t> bad(threads);
  on_threads(threads, [&](unsigned t) {
    const std::uint64_t page = t % 2 == 0 ? 5 : 6;  // even threads the failing page
    cunvme::page_ref p(cache, page, page_access::read);
    results[t] = p.result();
    if (p.ok()) bad[t] = mismatches_in(p.data(), page, 4096);
    else CHECK(p.data() == nullptr);
  });
  for (unsigned t = 0; t < threads; ++t) {
    if (t % 2 == 0) {
      CHECK(results[t].error == io_error::nvme_status);
      CHECK(results[t].status == spec::status::unrecovered_read_error);
      CHECK(results[t].lba == 40);
      CHECK(results[t].blocks == 8);
    } else {
      CHECK(results[t].ok());
      CHECK(bad[t] == 0);
    }
  }
  CHECK(page_word::state(c.memory.page_entry(5)) == page_state::invalid);
  for (std::uint32_t s = 0; s < 8; ++s) {
    CHECK(c.memory.slot_entry(s) != slot_owner::of_page(5));
    CHECK(c.memory.slot_generation(s) % 2 == 0);  // a failed read completed: its slot is free and stable again
  }
  const auto counters = c.memory.counters();
  // Each accessor of page 5 read it itself (a waiter retries the fill), so each got its own status.
  CHECK(counters.fill_failures == threads / 2);
  CHECK(counters.fill_failures == c.r.emulator->injected_faults().statuses);
  CHECK(counters.fills == 1);
}

TEST_CASE("a lost completion becomes a bounded timeout for the accessor, its slot is retired and the page reads again") {
  emu::fault_rule lose;
  lose.action = emu::fault_action::lose_completion;
  lose.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::read);
  lose.nth = 1;
  cache_rig c(4096, 8, with_rule(lose), 1s);
  const cache_t cache = c.cache();
  constexpr unsigned threads = 2;
  std::vector<io_result> results(threads);
  std::vector<std::uint64_t> bad(threads);
  std::vector<std::chrono::steady_clock::duration> waited(threads);
  on_threads(threads, [&](unsigned t) {
    const auto start = std::chrono::steady_clock::now();
    cunvme::page_ref p(cache, 9, page_access::read);
    waited[t] = std::chrono::steady_clock::now() - start;
    results[t] = p.result();
    if (p.ok()) bad[t] = mismatches_in(p.data(), 9, 4096);
  });
  // The first read of page 9 was lost: its filler timed out; the other thread then read it itself.
  unsigned timeouts = 0;
  for (unsigned t = 0; t < threads; ++t) {
    if (results[t].ok()) {
      CHECK(bad[t] == 0);
      continue;
    }
    ++timeouts;
    CHECK(results[t].error == io_error::timeout);
    CHECK(results[t].lba == 72);
    CHECK(results[t].blocks == 8);
    CHECK(waited[t] >= 1s);
    CHECK(waited[t] < 10s);
  }
  CHECK(timeouts == 1);
  const auto counters = c.memory.counters();
  CHECK(counters.retired_slots == 1);
  CHECK(counters.fill_failures == 1);
  unsigned retired = 0;
  for (std::uint32_t s = 0; s < 8; ++s) {
    const bool gone = c.memory.slot_entry(s) == slot_owner::retired;
    retired += gone;
    // Odd for good where the controller may still write the slot: no unreferenced reader trusts it.
    CHECK((c.memory.slot_generation(s) % 2 == 1) == gone);
  }
  CHECK(retired == 1);
  cunvme::page_ref again(cache, 9, page_access::read);
  REQUIRE(again.ok());
  CHECK(mismatches_in(again.data(), 9, 4096) == 0);
}

TEST_CASE("a write-back that fails on eviction reaches the missing thread and the page stays dirty in its slot") {
  emu::fault_rule fault;
  fault.status = spec::status::write_fault;
  fault.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::write);
  fault.nth = 1;
  cache_rig c(4096, 1, with_rule(fault));
  const cache_t cache = c.cache();
  const std::uint64_t v = 0x1234'5678'9abc'def0ull;
  REQUIRE(cache.write(2 * 4096, 8, &v).ok());
  std::uint64_t other = 0;
  const io_result r = cache.read(3 * 4096, 8, &other);  // needs page 2's only slot
  CHECK(r.error == io_error::nvme_status);
  CHECK(r.status == spec::status::write_fault);
  CHECK(r.lba == 16);
  const std::uint64_t entry = c.memory.page_entry(2);
  CHECK(page_word::state(entry) == page_state::valid);
  CHECK(page_word::dirty(entry));
  CHECK(page_word::state(c.memory.page_entry(3)) == page_state::invalid);
  CHECK(c.memory.counters().write_back_failures == 1);
  // The fault fired once: the next miss writes page 2 back and reads page 3.
  CHECK(cache.read(3 * 4096, 8, &other).ok());
  CHECK(other == word_at(3 * 4096));
  std::uint64_t back = 0;
  CHECK(cache.read(2 * 4096, 8, &back).ok());
  CHECK(back == v);
}

TEST_CASE("flush leaves a dirty page a thread holds for later, and writes it once released") {
  cache_rig c(4096, 4);
  const cache_t cache = c.cache();
  const std::uint64_t v = 0x0bad'cafe'f00d'0001ull;
  {
    cunvme::page_ref held(cache, 3, page_access::write);
    REQUIRE(held.ok());
    std::memcpy(held.data(), &v, 8);
    REQUIRE(cache.flush().ok());
    CHECK(page_word::dirty(c.memory.page_entry(3)));
    CHECK(c.memory.counters().write_backs == 0);
  }
  REQUIRE(cache.flush().ok());
  CHECK_FALSE(page_word::dirty(c.memory.page_entry(3)));
  CHECK(c.memory.counters().write_backs == 1);
  auto buffer = c.r.ctrl->memory().allocate(4096);
  reader_of<slots::multi_producer, completion::cooperative, doorbell::mmio> raw(c.q.view(), c.ns);
  REQUIRE(raw.read(3 * 8, 8, contiguous_of(buffer), 0).ok());
  std::uint64_t on_disk = 0;
  std::memcpy(&on_disk, buffer.data(), 8);
  CHECK(on_disk == v);
}

TEST_CASE("a write-back that fails in flush is returned, the page stays dirty, and the next flush writes it") {
  emu::fault_rule fault;
  fault.status = spec::status::write_fault;
  fault.opcode = static_cast<std::uint8_t>(spec::nvm_opcode::write);
  fault.nth = 1;
  cache_rig c(4096, 4, with_rule(fault));
  const cache_t cache = c.cache();
  const std::uint64_t v = 42;
  REQUIRE(cache.write(5 * 4096, 8, &v).ok());
  const io_result first = cache.flush();
  CHECK(first.error == io_error::nvme_status);
  CHECK(first.status == spec::status::write_fault);
  CHECK(first.lba == 40);
  CHECK(first.blocks == 8);
  CHECK(page_word::dirty(c.memory.page_entry(5)));
  CHECK(page_word::references(c.memory.page_entry(5)) == 0);
  CHECK(cache.flush().ok());
  CHECK_FALSE(page_word::dirty(c.memory.page_entry(5)));
  const auto counters = c.memory.counters();
  CHECK(counters.write_back_failures == 1);
  CHECK(counters.write_backs == 1);
}

TEST_CASE("a miss finds no slot while every slot is held: cache_full after the queue's timeout") {
  // 1 s: the fills of pages 0 and 1 must not time out on a loaded 2-core machine.
  cache_rig c(4096, 2, small_config(), 1s);
  const cache_t cache = c.cache();
  cunvme::page_ref a(cache, 0, page_access::read), b(cache, 1, page_access::read);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const auto start = std::chrono::steady_clock::now();
  const cunvme::cached_page p = cache.acquire(2, page_access::read);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(p.result.error == io_error::cache_full);
  CHECK(p.data == nullptr);
  CHECK(waited >= 1s);
  CHECK(waited < 10s);
  CHECK(std::string(cunvme::to_string(io_error::cache_full)).find("slot") != std::string::npos);
  CHECK(page_word::state(c.memory.page_entry(2)) == page_state::invalid);
  b.reset();
  CHECK(cache.acquire(2, page_access::read).ok());  // page 1's slot is free to take now
}

TEST_CASE("requests outside the namespace, across a page or releases of pages not held are refused") {
  cache_rig c(4096, 4);
  const cache_t cache = c.cache();
  CHECK(cache.acquire(cache.pages(), page_access::read).result.error == io_error::invalid_request);
  std::uint64_t x = 0;
  CHECK(cache.read(4096 - 4, 8, &x).error == io_error::invalid_request);
  CHECK(cache.write(4096 - 4, 8, &x).error == io_error::invalid_request);
  CHECK(cache.read(0, 0, &x).error == io_error::invalid_request);
  CHECK_FALSE(cache.release(3));
  CHECK_FALSE(cache.release(cache.pages()));
  CHECK(c.io_commands() == 0);
}

TEST_CASE("a cache given another namespace than its memory was made for refuses every access") {
  cache_rig c(4096, 4);
  cunvme::namespace_view other = c.ns;
  other.nsid = 2;
  CHECK(cache_t(c.memory.view(), c.q.view(), other).acquire(0, page_access::read).result.error == io_error::invalid_request);
  cunvme::namespace_view larger_blocks = c.ns;
  larger_blocks.lba_shift = 10;
  std::uint64_t x = 0;
  CHECK(cache_t(c.memory.view(), c.q.view(), larger_blocks).read(0, 8, &x).error == io_error::invalid_request);
  CHECK(c.io_commands() == 0);
  CHECK(c.cache().read(0, 8, &x).ok());
}

TEST_CASE("a cache of impossible shape is refused with a host::error that says why") {
  rig r;
  host::io_queue q(*r.ctrl, 8);
  const cunvme::namespace_view ns = q.namespace_view(1);
  auto refused = [&](const cunvme::namespace_view& n, std::uint64_t page_bytes, std::uint64_t slots, const std::string& why) {
    try {
      host::page_cache_memory m(*r.ctrl, n, page_bytes, slots);
      FAIL("a cache of " << page_bytes << "-byte pages and " << slots << " slots was made");
    } catch (const host::error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(why) != std::string::npos, e.what());
    }
  };
  refused(ns, 3000, 4, "not a power of two");
  refused(ns, 2048, 4, "outside 4 KiB..64 KiB");
  refused(ns, 128 * 1024, 4, "outside 4 KiB..64 KiB");
  refused(ns, 4096, 0, "at least one slot");
  refused(ns, 4096, (8 << 20) / 4096 + 1, "more than namespace 1's 2048 pages");
  cunvme::namespace_view large_blocks = ns;
  large_blocks.lba_shift = 13;  // a block larger than the page
  refused(large_blocks, 4096, 4, "not a whole number of namespace 1's 8192-byte blocks");
  cunvme::namespace_view separate = ns;
  separate.metadata = cunvme::metadata_layout::separate;
  refused(separate, 4096, 4, "separate metadata");
  CHECK_NOTHROW(host::page_cache_memory(*r.ctrl, ns, 65536, 128));
}

TEST_CASE("the view for GPU threads is refused where the cache's memory is not mapped for the GPU") {
  cache_rig c(4096, 4);  // an emulator opened without gpu_reach(): host memory only
  try {
    (void)c.memory.device_view();
    FAIL("a device view of host-only memory was handed out");
  } catch (const host::error& e) {
    CHECK(std::string(e.what()).find("gpu_reach()") != std::string::npos);
  }
  CHECK(c.memory.view().data != nullptr);
}

TEST_CASE("a cache whose bookkeeping lies where the host cannot address it refuses CPU threads and reads its state through copy_out") {
  rig r(small_config());
  r.fill();
  host::io_queue q(*r.ctrl, 64);
  // Stands in for GPU memory: no host address, a "device" address the copy hooks reach.
  std::vector<std::unique_ptr<unsigned char[]>> blocks;
  std::uint64_t copied_in = 0, copied_out = 0;
  host::io_queue_memory elsewhere;
  elsewhere.bookkeeping = [&](std::size_t bytes) {
    blocks.push_back(std::make_unique<unsigned char[]>(bytes));  // value-initialized: zeroed
    return host::dma_buffer(nullptr, blocks.back().get(), bytes, 4096, {}, host::memory_location::gpu, [] {});
  };
  elsewhere.copy_in = [&](void* to, const void* from, std::size_t bytes) {
    std::memcpy(to, from, bytes);
    copied_in += bytes;
  };
  elsewhere.copy_out = [&](void* to, const void* from, std::size_t bytes) {
    std::memcpy(to, from, bytes);
    copied_out += bytes;
  };
  host::page_cache_memory memory(*r.ctrl, q.namespace_view(1), 4096, 8, elsewhere);
  CHECK(copied_in > 0);  // the slots' bus addresses went in through copy_in
  CHECK_THROWS_WITH_AS((void)memory.view(), doctest::Contains("GPU memory"), host::error);
  CHECK(memory.counters().misses == 0);
  CHECK(page_word::state(memory.page_entry(3)) == page_state::invalid);
  CHECK(memory.slot_entry(7) == slot_owner::empty);
  CHECK(copied_out > 0);
  CHECK_THROWS_AS((void)memory.page_entry(std::uint64_t{1} << 40), host::error);
}
