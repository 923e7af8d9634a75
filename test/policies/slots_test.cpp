// Submission-slot policies without a controller: a test thread plays the controller, reading
// the SQ tail doorbell and consuming SQEs (advancing the SQ head as CQE.SQHD would).
#include "fake_queue.hpp"

#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/group.cuh>
#include <cunvme/policy/slots.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using test::fake_queue;
namespace slots = cunvme::slots;
namespace doorbell = cunvme::doorbell;
using u64_ref = std::atomic_ref<std::uint64_t>;

namespace {

void no_progress() {}

/// Writes one SQE whose CDW10 carries its ticket + 1 (so the consumer can check it).
void write_sqe(fake_queue& f, std::uint64_t ticket) {
  cunvme::spec::submission_entry sqe{};
  sqe.cdw10 = static_cast<std::uint32_t>(ticket + 1);
  sqe.cdw11 = static_cast<std::uint32_t>((ticket + 1) >> 32);
  f.sq[f.view.slot(ticket)] = sqe;
}

/// The controller's side: follows the SQ tail doorbell, checks that every SQE between head and
/// tail is the one for its ticket (never overwritten, never stale), checks the tail never goes
/// backwards, and frees the slots by advancing sq_head. Stops after `total` SQEs.
struct consumer {
  explicit consumer(fake_queue& queue, std::uint64_t total) : f(queue), expected(total) {
    thread = std::thread([this] { run(); });
  }
  ~consumer() { finish(); }
  /// Waits for the consumer to have taken every SQE (or to give up after 30 s).
  void finish() {
    if (thread.joinable()) thread.join();
  }
  void run() {
    std::uint64_t head = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (head < expected && std::chrono::steady_clock::now() < until) {
      const std::uint32_t tail = f.sq_tail_doorbell();
      while (f.view.slot(head) != tail) {
        const auto& sqe = f.sq[f.view.slot(head)];
        const std::uint64_t carried = sqe.cdw10 | std::uint64_t{sqe.cdw11} << 32;
        wrong += carried != head + 1;
        ++head;
        u64_ref(f.counters->sq_head).store(head, std::memory_order_release);
      }
      std::this_thread::yield();
    }
    consumed = head;
  }
  fake_queue& f;
  std::uint64_t expected;
  std::uint64_t consumed = 0, wrong = 0;
  std::thread thread;
};

template <class Slots, class Doorbell>
void submit_one(fake_queue& f) {
  cunvme::single_thread self;
  std::uint64_t ticket = 0;
  const auto deadline = cunvme::access::now_ns() + 5'000'000'000ull;
  REQUIRE(Slots::reserve(f.view, self, 1, deadline, no_progress, ticket));
  write_sqe(f, ticket);
  Slots::template commit<Doorbell>(f.view, self, ticket, 1);
}

}  // namespace

TEST_CASE("exclusive: one owner's tickets are consecutive and each commit rings the new tail") {
  fake_queue f(8);
  for (std::uint64_t i = 0; i < 5; ++i) {
    submit_one<slots::exclusive, doorbell::mmio>(f);
    CHECK(f.sq_tail_doorbell() == (i + 1) % 8);
  }
  CHECK(f.counters->sq_reserved == 5);
  CHECK(f.counters->sq_rung == 5);
}

TEST_CASE("a full SQ refuses a reservation at the deadline and takes no ticket") {
  fake_queue f(4);  // room for three SQEs
  for (int i = 0; i < 3; ++i) submit_one<slots::multi_producer, doorbell::mmio>(f);
  cunvme::single_thread self;
  std::uint64_t ticket = 0;
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(slots::multi_producer::reserve(f.view, self, 1, cunvme::access::now_ns() + 50'000'000, no_progress, ticket));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(50));
  CHECK_FALSE(slots::exclusive::reserve(f.view, self, 1, cunvme::access::now_ns() + 1'000'000, no_progress, ticket));
  CHECK(f.counters->sq_reserved == 3);  // no hole was left for later submitters
  u64_ref(f.counters->sq_head).store(1);  // the controller fetched one
  CHECK(slots::multi_producer::reserve(f.view, self, 1, cunvme::access::now_ns() + 1'000'000, no_progress, ticket));
  CHECK(ticket == 3);
}

TEST_CASE("a reservation waiting for room calls progress between looks") {
  fake_queue f(2);
  submit_one<slots::multi_producer, doorbell::mmio>(f);
  int calls = 0;
  // A functor, not a lambda: nvcc treats a lambda as constexpr, which device-capable code may not call.
  struct free_one_on_third_call {
    fake_queue& queue;
    int& calls;
    void operator()() const {
      if (++calls == 3) u64_ref(queue.counters->sq_head).store(1);
    }
  } progress{f, calls};
  cunvme::single_thread self;
  std::uint64_t ticket = 0;
  CHECK(slots::multi_producer::reserve(f.view, self, 1, cunvme::access::now_ns() + 1'000'000'000, progress, ticket));
  CHECK(calls == 3);
  CHECK(ticket == 1);
}

TEST_CASE("the doorbell never passes an SQE that is still being written") {
  fake_queue f(8);
  cunvme::single_thread self;
  std::uint64_t first = 0, second = 0;
  const auto deadline = cunvme::access::now_ns() + 1'000'000'000;
  REQUIRE(slots::multi_producer::reserve(f.view, self, 1, deadline, no_progress, first));
  REQUIRE(slots::multi_producer::reserve(f.view, self, 1, deadline, no_progress, second));
  write_sqe(f, second);
  slots::multi_producer::commit<doorbell::mmio>(f.view, self, second, 1);
  CHECK(f.sq_tail_doorbell() == 0);  // ticket 0 is not written yet: nothing may be rung
  write_sqe(f, first);
  slots::multi_producer::commit<doorbell::mmio>(f.view, self, first, 1);
  CHECK(f.sq_tail_doorbell() == 2);  // the first one's commit rings both
}

TEST_CASE("coalescing: only the last SQE in rings, and a waiter rings its own unrung SQE") {
  fake_queue f(8);
  using coalescing = doorbell::coalescing<doorbell::mmio>;
  cunvme::single_thread self;
  std::uint64_t a = 0, b = 0, c = 0;
  const auto deadline = cunvme::access::now_ns() + 1'000'000'000;
  REQUIRE(slots::multi_producer::reserve(f.view, self, 1, deadline, no_progress, a));
  REQUIRE(slots::multi_producer::reserve(f.view, self, 1, deadline, no_progress, b));
  write_sqe(f, a);
  slots::multi_producer::commit<coalescing>(f.view, self, a, 1);
  CHECK(f.counters->doorbell_mmio_writes == 0);  // b is still being written: its commit will ring
  write_sqe(f, b);
  slots::multi_producer::commit<coalescing>(f.view, self, b, 1);
  CHECK(f.sq_tail_doorbell() == 2);
  CHECK(f.counters->doorbell_mmio_writes == 1);  // one store for two SQEs
  // A submitter that reserves and commits while another holds a reservation forever would
  // wait unrung; ensure_rung from its wait loop rings what is published.
  REQUIRE(slots::multi_producer::reserve(f.view, self, 1, deadline, no_progress, c));
  std::uint64_t stuck = 0;
  REQUIRE(slots::multi_producer::reserve(f.view, self, 1, deadline, no_progress, stuck));
  write_sqe(f, c);
  slots::multi_producer::commit<coalescing>(f.view, self, c, 1);
  CHECK(f.sq_tail_doorbell() == 2);
  slots::multi_producer::ensure_rung<coalescing>(f.view, c);
  CHECK(f.sq_tail_doorbell() == 3);
}

TEST_CASE_TEMPLATE("many submitters on one queue: every SQE is fetched once, in ticket order, none overwritten", Doorbell, doorbell::mmio,
                   doorbell::coalescing<doorbell::mmio>) {
  constexpr std::uint32_t threads = 4, per_thread = 20000;
  fake_queue f(16);
  consumer controller(f, threads * per_thread);
  std::vector<std::thread> pool;
  for (std::uint32_t t = 0; t < threads; ++t) pool.emplace_back([&] {
    for (std::uint32_t i = 0; i < per_thread; ++i) {
      cunvme::single_thread self;
      std::uint64_t ticket = 0;
      const bool ok = slots::multi_producer::reserve(f.view, self, 1, cunvme::access::now_ns() + 10'000'000'000ull, no_progress, ticket);
      if (!ok) continue;
      write_sqe(f, ticket);
      slots::multi_producer::commit<Doorbell>(f.view, self, ticket, 1);
      slots::multi_producer::ensure_rung<Doorbell>(f.view, ticket);
    }
  });
  for (auto& t : pool) t.join();
  controller.finish();
  CHECK(controller.consumed == threads * per_thread);
  CHECK(controller.wrong == 0);
  CHECK(f.counters->sq_reserved == threads * per_thread);
  CHECK(f.counters->sq_rung == threads * per_thread);
}

TEST_CASE_TEMPLATE("groups reserving together get contiguous tickets, one reservation per group", Slots, slots::warp_aggregated,
                   slots::exclusive) {
  constexpr std::uint32_t members = 4, rounds = 2000;
  constexpr bool exclusive = std::is_same_v<Slots, slots::exclusive>;
  constexpr std::uint32_t groups = exclusive ? 1 : 3;  // exclusive: one owner group
  fake_queue f(32);
  consumer controller(f, std::uint64_t{groups} * members * rounds);
  std::vector<std::thread> pool;
  std::vector<std::unique_ptr<cunvme::host_group>> all;
  std::atomic<std::uint64_t> not_contiguous{0};
  for (std::uint32_t g = 0; g < groups; ++g) all.push_back(std::make_unique<cunvme::host_group>(members));
  for (std::uint32_t g = 0; g < groups; ++g) {
    for (std::uint32_t m = 0; m < members; ++m) pool.emplace_back([&, g, m] {
      auto member = all[g]->member_at(m);
      for (std::uint32_t i = 0; i < rounds; ++i) {
        std::uint64_t ticket = 0;
        const bool ok = Slots::reserve(f.view, member, 1, cunvme::access::now_ns() + 10'000'000'000ull, no_progress, ticket);
        REQUIRE(ok);
        // The members' tickets are the leader's plus their rank.
        const std::uint64_t leader = member.broadcast(ticket, 0);
        not_contiguous += ticket != leader + m;
        write_sqe(f, ticket);
        Slots::template commit<doorbell::mmio>(f.view, member, ticket, 1);
      }
    });
  }
  for (auto& t : pool) t.join();
  controller.finish();
  CHECK(not_contiguous.load() == 0);
  CHECK(controller.wrong == 0);
  CHECK(controller.consumed == std::uint64_t{groups} * members * rounds);
}
