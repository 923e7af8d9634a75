// Stress: several host threads, each with its own queue pair, issue random verified reads and
// writes at queue depth 16 against one RAM namespace. CUNVME_STRESS_OPS sets the total
// (default 10^6).
#include "test_host.hpp"

#include <cstdlib>
#include <random>
#include <string>
#include <thread>

using namespace test;

namespace {

constexpr unsigned threads = 4;
constexpr unsigned depth = 16;
constexpr std::uint64_t blocks_per_thread = 4096;  // 2 MiB of 512-byte blocks each
constexpr std::uint32_t max_blocks = 8;

std::uint64_t total_ops() {
  if (const char* env = std::getenv("CUNVME_STRESS_OPS")) return std::strtoull(env, nullptr, 10);
  return 1'000'000;
}

struct result {
  std::uint64_t completed = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t errors = 0;
  bool timed_out = false;
};

/// One thread's workload on queue pair `qid` over LBAs [base, base + blocks_per_thread).
void drive(emu::controller& ctrl, test_host& host, queue_pair& q, std::uint64_t base, std::uint64_t ops, std::uint32_t seed,
           result& out) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> shadow(blocks_per_thread * 512);
  ctrl.store(1).read(base * 512, shadow.data(), shadow.size());
  struct slot {
    bool busy = false;
    bool write = false;
    std::uint64_t lba = 0;  // relative to base
    std::uint32_t blocks = 0;
  };
  slot slots[depth];
  dma_buffer buffers(ctrl, depth * max_blocks * 512);
  std::uint64_t issued = 0;
  unsigned inflight = 0;
  auto overlaps = [&](std::uint64_t lba, std::uint32_t n) {
    for (const auto& s : slots) {
      if (s.busy && lba < s.lba + s.blocks && s.lba < lba + n) return true;
    }
    return false;
  };
  while (out.completed < ops) {
    bool placed = false;
    for (unsigned i = 0; i < depth && issued < ops; ++i) {
      slot& s = slots[i];
      if (s.busy) continue;
      s.blocks = 1 + static_cast<std::uint32_t>(rng() % max_blocks);
      do {
        s.lba = rng() % (blocks_per_thread - s.blocks + 1);
      } while (overlaps(s.lba, s.blocks));
      s.write = (rng() & 1u) != 0;
      std::byte* data = buffers.data + std::size_t{i} * max_blocks * 512;
      if (s.write) {
        for (std::uint32_t b = 0; b < s.blocks * 512; b += 8) {
          const std::uint64_t word = rng();
          std::memcpy(data + b, &word, 8);
        }
      }
      auto sqe = spec::make_rw(s.write ? spec::nvm_opcode::write : spec::nvm_opcode::read, 1, base + s.lba, s.blocks,
                               buffers.bus + std::uint64_t{i} * max_blocks * 512);
      sqe.set_cid(static_cast<std::uint16_t>(i));
      q.sq[q.sq_tail] = sqe;
      q.sq_tail = (q.sq_tail + 1) % q.entries;
      s.busy = true;
      ++inflight;
      ++issued;
      placed = true;
    }
    if (placed) host.ring_sq(q);
    // Reap everything that has arrived, waiting (bounded) for at least one.
    auto cqe = host.next_completion(q, std::chrono::milliseconds(10000));
    if (!cqe) {
      out.timed_out = true;
      return;
    }
    while (cqe) {
      slot& s = slots[cqe->cid % depth];
      const std::byte* data = buffers.data + std::size_t{cqe->cid} * max_blocks * 512;
      if (cqe->status() != spec::status::successful_completion || !s.busy) {
        ++out.errors;
      } else if (s.write) {
        std::memcpy(shadow.data() + s.lba * 512, data, s.blocks * 512);
      } else if (std::memcmp(shadow.data() + s.lba * 512, data, s.blocks * 512) != 0) {
        ++out.mismatches;
      }
      s.busy = false;
      --inflight;
      ++out.completed;
      cqe = inflight == 0 ? std::nullopt : host.next_completion(q, std::chrono::milliseconds(0));
    }
  }
  // The namespace ends up exactly as the shadow says.
  std::vector<std::byte> final_bytes(shadow.size());
  ctrl.store(1).read(base * 512, final_bytes.data(), final_bytes.size());
  if (final_bytes != shadow) ++out.mismatches;
}

}  // namespace

TEST_CASE("four threads with their own queue pairs complete random verified I/O with no mismatch") {
  emu::controller_config config;
  config.namespaces = {emu::namespace_config::in_memory(512, threads * blocks_per_thread)};
  config.workers = 2;
  emu::controller ctrl(config);
  test_host host(ctrl);
  REQUIRE(host.enable());
  std::vector<std::unique_ptr<queue_pair>> queues;
  for (unsigned t = 0; t < threads; ++t) queues.push_back(host.create_pair(static_cast<std::uint16_t>(t + 1), 64));
  // Start from random contents so reads of never-written blocks are checked too.
  {
    std::mt19937_64 rng(99);
    std::vector<std::uint64_t> noise(threads * blocks_per_thread * 512 / 8);
    for (auto& w : noise) w = rng();
    ctrl.store(1).write(0, noise.data(), noise.size() * 8);
  }
  const std::uint64_t ops = total_ops();
  std::vector<result> results(threads);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back(drive, std::ref(ctrl), std::ref(host), std::ref(*queues[t]), t * blocks_per_thread, ops / threads, 1000 + t,
                         std::ref(results[t]));
  }
  for (auto& w : workers) w.join();
  std::uint64_t completed = 0;
  for (unsigned t = 0; t < threads; ++t) {
    CHECK_FALSE(results[t].timed_out);
    CHECK(results[t].mismatches == 0);
    CHECK(results[t].errors == 0);
    completed += results[t].completed;
  }
  CHECK(completed == ops / threads * threads);
  MESSAGE("completed " << completed << " verified commands, " << ctrl.stats().bytes_read << " bytes read, "
                       << ctrl.stats().bytes_written << " written");
}
