// The command-identifier pool: a lock-free bitmap, one bit per CID, entries − 1 CIDs.
#include "fake_queue.hpp"

#include <cunvme/policy/cid_pool.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

using test::fake_queue;
namespace cid_pool = cunvme::cid_pool;

TEST_CASE("a queue of N entries hands out exactly N − 1 distinct CIDs, then none") {
  fake_queue f(70);  // 69 CIDs: two full bitmap words and a partial third
  std::set<std::uint16_t> taken;
  std::uint16_t cid = 0;
  for (int i = 0; i < 69; ++i) {
    REQUIRE(cid_pool::try_take(f.view, static_cast<std::uint32_t>(i), cid));
    CHECK(cid < 69);
    taken.insert(cid);
  }
  CHECK(taken.size() == 69);
  CHECK_FALSE(cid_pool::try_take(f.view, 0, cid));
  CHECK(cid_pool::in_use(f.view) == 69);
}

TEST_CASE("a taken CID's record is pending; a given-back CID is free and is handed out again") {
  fake_queue f(4);
  std::uint16_t a = 0, b = 0, c = 0, d = 0;
  REQUIRE(cid_pool::try_take(f.view, 0, a));
  REQUIRE(cid_pool::try_take(f.view, 0, b));
  REQUIRE(cid_pool::try_take(f.view, 0, c));
  CHECK(f.records[b].state == static_cast<std::uint32_t>(cunvme::record_state::pending));
  CHECK_FALSE(cid_pool::try_take(f.view, 0, d));
  cid_pool::give_back(f.view, b);
  CHECK(f.records[b].state == static_cast<std::uint32_t>(cunvme::record_state::free));
  REQUIRE(cid_pool::try_take(f.view, 0, d));
  CHECK(d == b);
}

TEST_CASE("the smallest queue, two entries, has a single CID") {
  fake_queue f(2);
  std::uint16_t cid = 9;
  REQUIRE(cid_pool::try_take(f.view, 5, cid));
  CHECK(cid == 0);
  CHECK_FALSE(cid_pool::try_take(f.view, 5, cid));
}

TEST_CASE("four threads taking and giving back CIDs never hold the same one at once") {
  fake_queue f(40);
  std::vector<std::atomic<int>> holders(39);
  std::atomic<std::uint64_t> collisions{0}, taken{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 4; ++t) threads.emplace_back([&, t] {
    for (int i = 0; i < 50000; ++i) {
      std::uint16_t cid = 0;
      if (!cid_pool::try_take(f.view, t * 3 + static_cast<std::uint32_t>(i), cid)) continue;
      taken.fetch_add(1, std::memory_order_relaxed);
      if (holders[cid].fetch_add(1) != 0) collisions.fetch_add(1);
      holders[cid].fetch_sub(1);
      cid_pool::give_back(f.view, cid);
    }
  });
  for (auto& t : threads) t.join();
  CHECK(collisions.load() == 0);
  CHECK(taken.load() == 200000);  // 39 CIDs for 4 threads: nobody ever finds the pool empty
  CHECK(cid_pool::in_use(f.view) == 0);
}
