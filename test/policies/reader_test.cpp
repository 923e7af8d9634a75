// Readers and writers end to end against the emulator, driven by CPU threads through the
// same code GPU threads run: every slot × completion × doorbell policy, random verified
// reads and writes, queue sizes from 2 to MQES, out-of-order completions, injected errors
// and lost completions.
#include "policy_fixture.hpp"

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

using namespace test;
using namespace std::chrono_literals;

namespace {

/// How many random operations each thread runs (CUNVME_POLICY_OPS overrides; TSan runs fewer).
std::uint32_t ops_per_thread(std::uint32_t fallback) {
  if (const char* v = std::getenv("CUNVME_POLICY_OPS")) return static_cast<std::uint32_t>(std::strtoul(v, nullptr, 10));
  return fallback;
}

/// One thread's share of the namespace and its own shadow copy of it: random reads (checked
/// against the copy) and writes (recorded in it), `ops` of them, through `reader`/`writer`,
/// or, with `group`, collectively with the other members.
template <class Reader, class Writer, class Group>
void random_io(const Reader& reader, const Writer& writer, Group& group, const host::dma_buffer& buffer, std::uint64_t first_lba,
               std::uint64_t lbas, std::uint32_t ops, std::uint32_t seed, std::uint64_t& mismatches, std::uint64_t& failures) {
  const std::uint64_t lba_size = reader.ns().lba_size();
  const std::uint64_t max_blocks = std::min<std::uint64_t>(buffer.size() / lba_size, lbas);
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> shadow(lbas * lba_size / 8);
  for (std::size_t i = 0; i < shadow.size(); ++i) shadow[i] = word_at(first_lba * lba_size + i * 8);
  auto* words = reinterpret_cast<std::uint64_t*>(buffer.data());
  for (std::uint32_t op = 0; op < ops; ++op) {
    // Every member draws the same numbers: a group works on one request together.
    const std::uint64_t blocks = 1 + rng() % (rng() % 4 == 0 ? max_blocks : std::min<std::uint64_t>(8, max_blocks));
    const std::uint64_t lba = rng() % (lbas - blocks + 1);
    const bool write = rng() % 3 == 0;
    const std::size_t n = blocks * lba_size / 8, at = lba * lba_size / 8;
    if (write) {
      if (group.rank() == 0) {
        for (std::size_t i = 0; i < n; ++i) words[i] = shadow[at + i] = word_at((first_lba + lba) * lba_size + i * 8, seed * 1000003ull + op);
      }
      group.sync();
      const io_result r = writer.write(group, first_lba + lba, blocks, contiguous_of(buffer), 0);
      failures += !r.ok();
    } else {
      const io_result r = reader.read(group, first_lba + lba, blocks, contiguous_of(buffer), 0);
      failures += !r.ok();
      if (group.rank() == 0) {
        for (std::size_t i = 0; i < n; ++i) mismatches += words[i] != shadow[at + i];
      }
      group.sync();
    }
    if (group.rank() != 0) {  // keep the members' copies in step with the leader's writes
      if (write) {
        for (std::size_t i = 0; i < n; ++i) shadow[at + i] = word_at((first_lba + lba) * lba_size + i * 8, seed * 1000003ull + op);
      }
    }
  }
}

struct outcome {
  std::uint64_t mismatches = 0, failures = 0, commands = 0, mmio_doorbells = 0, skipped_doorbells = 0, unexpected = 0;
};

/// `threads` CPU threads, each with its own region and shadow copy, on queues of `entries`:
/// one queue each for `slots::exclusive`, one shared queue otherwise.
template <class Slots, class Completion, class Doorbell>
outcome run_threads(rig& r, std::uint32_t entries, unsigned threads, std::uint32_t ops, std::uint64_t buffer_bytes = 64 * 1024) {
  constexpr bool exclusive = std::is_same_v<Slots, slots::exclusive>;
  std::vector<std::unique_ptr<host::io_queue>> queues;
  for (unsigned t = 0; t < (exclusive ? threads : 1u); ++t) queues.push_back(std::make_unique<host::io_queue>(*r.ctrl, entries));
  std::vector<host::dma_buffer> buffers;
  for (unsigned t = 0; t < threads; ++t) buffers.push_back(r.ctrl->memory().allocate(buffer_bytes));
  const cunvme::namespace_view ns = queues[0]->namespace_view(1);
  const std::uint64_t region = ns.lba_count / threads;
  std::vector<std::unique_ptr<poller_thread<Completion, Doorbell>>> pollers;
  for (auto& q : queues) pollers.push_back(std::make_unique<poller_thread<Completion, Doorbell>>(q->view()));
  const std::uint64_t before = r.emulator->stats().io_commands;
  std::vector<std::uint64_t> mismatches(threads), failures(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto& q = *queues[exclusive ? t : 0];
      reader_of<Slots, Completion, Doorbell> reader(q.view(), ns);
      writer_of<Slots, Completion, Doorbell> writer(q.view(), ns);
      cunvme::single_thread self;
      random_io(reader, writer, self, buffers[t], t * region, region, ops, 17 + t, mismatches[t], failures[t]);
    });
  }
  for (auto& th : pool) th.join();
  for (auto& p : pollers) p->stop();
  outcome o;
  for (unsigned t = 0; t < threads; ++t) o.mismatches += mismatches[t], o.failures += failures[t];
  o.commands = r.emulator->stats().io_commands - before;
  for (auto& q : queues) {
    const auto c = q->counters();
    o.mmio_doorbells += c.doorbell_mmio_writes;
    o.skipped_doorbells += c.doorbell_skipped;
    o.unexpected += c.unexpected_completions;
    CHECK(cunvme::cid_pool::in_use(q->view()) == 0);
  }
  return o;
}

template <class Doorbell>
host::controller_options options_for() {
  host::controller_options o;
  o.shadow_doorbells = std::is_same_v<Doorbell, doorbell::shadow> || std::is_same_v<Doorbell, doorbell::coalescing<doorbell::shadow>>;
  return o;
}

template <class S, class C, class D>
struct combo {
  using slots_t = S;
  using completion_t = C;
  using doorbell_t = D;
};

}  // namespace

#define EVERY_COMBINATION                                                                                                             \
  combo<slots::exclusive, completion::cooperative, doorbell::mmio>, combo<slots::exclusive, completion::cooperative, doorbell::shadow>,  \
      combo<slots::exclusive, completion::dedicated_poller, doorbell::mmio>,                                                            \
      combo<slots::exclusive, completion::dedicated_poller, doorbell::shadow>,                                                          \
      combo<slots::multi_producer, completion::cooperative, doorbell::mmio>,                                                            \
      combo<slots::multi_producer, completion::cooperative, doorbell::coalescing<doorbell::mmio>>,                                      \
      combo<slots::multi_producer, completion::cooperative, doorbell::shadow>,                                                          \
      combo<slots::multi_producer, completion::cooperative, doorbell::coalescing<doorbell::shadow>>,                                    \
      combo<slots::multi_producer, completion::dedicated_poller, doorbell::mmio>,                                                       \
      combo<slots::multi_producer, completion::dedicated_poller, doorbell::coalescing<doorbell::mmio>>,                                 \
      combo<slots::warp_aggregated, completion::cooperative, doorbell::mmio>,                                                           \
      combo<slots::warp_aggregated, completion::cooperative, doorbell::coalescing<doorbell::shadow>>,                                   \
      combo<slots::warp_aggregated, completion::dedicated_poller, doorbell::shadow>,                                                    \
      combo<slots::warp_aggregated, completion::dedicated_poller, doorbell::coalescing<doorbell::mmio>>

TEST_CASE_TEMPLATE("random reads and writes from four threads are verified, for every policy combination", T, EVERY_COMBINATION) {
  rig r(small_config(), options_for<typename T::doorbell_t>());
  r.fill();
  const outcome o = run_threads<typename T::slots_t, typename T::completion_t, typename T::doorbell_t>(r, 32, 4, ops_per_thread(400));
  CHECK(o.mismatches == 0);
  CHECK(o.failures == 0);
  CHECK(o.unexpected == 0);
  CHECK(o.commands >= 4 * ops_per_thread(400));
  CHECK(o.mmio_doorbells > 0);
}

TEST_CASE("queue sizes from 2 to MQES + 1 entries carry verified traffic from four threads") {
  rig r;
  for (const std::uint32_t entries : {2u, 3u, 8u, 33u, 4096u}) {
    CAPTURE(entries);
    r.fill();  // each run's threads start from the initial pattern
    const outcome o = run_threads<slots::multi_producer, completion::cooperative, doorbell::mmio>(r, entries, 4, ops_per_thread(400) / 4);
    CHECK(o.mismatches == 0);
    CHECK(o.failures == 0);
  }
}

TEST_CASE("a queue of two entries (one command at a time) serves the exclusive and aggregated policies too") {
  rig r;
  r.fill();
  const outcome a = run_threads<slots::exclusive, completion::cooperative, doorbell::mmio>(r, 2, 2, ops_per_thread(400) / 4);
  r.fill();
  const outcome b = run_threads<slots::warp_aggregated, completion::dedicated_poller, doorbell::mmio>(r, 2, 4, ops_per_thread(400) / 4);
  CHECK(a.mismatches + b.mismatches == 0);
  CHECK(a.failures + b.failures == 0);
}

TEST_CASE("completions posted out of order reach their own waiters") {
  auto config = small_config();
  config.out_of_order_completions = true;
  config.timing = emu::timing_model::scm();  // commands overlap, so batches hold several completions
  rig r(config);
  r.fill();
  const outcome o = run_threads<slots::multi_producer, completion::cooperative, doorbell::coalescing<doorbell::mmio>>(r, 64, 4, ops_per_thread(400) / 2);
  CHECK(o.mismatches == 0);
  CHECK(o.failures == 0);
  CHECK(o.unexpected == 0);
}

TEST_CASE("with a coalescing doorbell eight threads sharing a queue leave no SQE unrung") {
  auto config = small_config();
  config.timing = emu::timing_model::scm();
  rig r(config);
  r.fill();
  const outcome o = run_threads<slots::multi_producer, completion::dedicated_poller, doorbell::coalescing<doorbell::mmio>>(r, 64, 8, ops_per_thread(400) / 4);
  CHECK(o.mismatches == 0);
  CHECK(o.failures == 0);
  CHECK(o.mmio_doorbells <= 2 * o.commands);  // at most one SQ and one CQ store per command
}
