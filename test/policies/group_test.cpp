// The collective reader forms: CPU threads as one group (as a warp or a block is on the GPU)
// split one request between them.
#include "policy_fixture.hpp"

#include <cunvme/policy/group.cuh>

#include <thread>
#include <vector>

using namespace test;

namespace {

/// Runs `body(member)` on `size` threads of one host_group and joins them.
template <class Body>
void in_group(std::uint32_t size, Body body) {
  cunvme::host_group group(size);
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < size; ++r) threads.emplace_back([&, r] {
    auto member = group.member_at(r);
    body(member);
  });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("host group operations: exclusive sum, broadcast, min and any agree across members") {
  std::vector<std::uint32_t> below(5), total(5);
  std::vector<std::uint64_t> from_three(5), lowest(5);
  std::vector<int> some(5), none(5);
  in_group(5, [&](cunvme::host_group::member& m) {
    const auto r = m.rank();
    below[r] = m.exclusive_sum(r + 1, total[r]);
    from_three[r] = m.broadcast(100 + r, 3);
    lowest[r] = m.min(50 - r * r);
    some[r] = m.any(r == 4);
    none[r] = m.any(false);
  });
  for (std::uint32_t r = 0; r < 5; ++r) {
    CHECK(below[r] == r * (r + 1) / 2);
    CHECK(total[r] == 15);
    CHECK(from_three[r] == 103);
    CHECK(lowest[r] == 34);
    CHECK(some[r] == 1);
    CHECK(none[r] == 0);
  }
}

TEST_CASE("a group splits a read larger than MDTS into commands and every member gets the same result") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 64);
  const auto ns = q.namespace_view(1);
  REQUIRE(ns.max_blocks == 1024);  // MDTS 7: 512 KiB of 512-byte blocks
  auto buf = r.ctrl->memory().allocate(4 << 20);
  const std::uint64_t blocks = 7 * 1024 + 100;  // 8 commands, the last one short
  const std::uint64_t before = r.emulator->stats().io_commands;
  std::vector<io_result> results(4);
  in_group(4, [&](cunvme::host_group::member& m) {
    reader_of<slots::warp_aggregated, completion::cooperative, doorbell::mmio> reader(q.view(), ns);
    results[m.rank()] = reader.read(m, 3, blocks, contiguous_of(buf), 0);
  });
  for (const auto& res : results) CHECK(res.ok());
  CHECK(r.emulator->stats().io_commands - before == 8);
  const auto* words = reinterpret_cast<const std::uint64_t*>(buf.data());
  std::uint64_t mismatches = 0;
  for (std::size_t i = 0; i < blocks * 512 / 8; ++i) mismatches += words[i] != word_at(3 * 512 + i * 8);
  CHECK(mismatches == 0);
}

TEST_CASE_TEMPLATE("a group's split read completes with a dedicated poller draining for it", Slots, slots::multi_producer,
                   slots::warp_aggregated, slots::exclusive) {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 128);
  poller_thread<completion::dedicated_poller, doorbell::mmio> poller(q.view());
  const auto ns = q.namespace_view(1);
  auto buf = r.ctrl->memory().allocate(4 * 3000 * 512);
  std::vector<io_result> results(4 * 3);
  std::vector<std::thread> groups;
  for (std::uint32_t g = 0; g < (std::is_same_v<Slots, slots::exclusive> ? 1u : 4u); ++g) {
    groups.emplace_back([&, g] {
      in_group(8, [&](cunvme::host_group::member& m) {
        reader_of<Slots, completion::dedicated_poller, doorbell::mmio> reader(q.view(), ns);
        for (std::uint64_t round = 0; round < 3; ++round) {
          const io_result res = reader.read(m, 1 + g * 3000 + round, 3000, contiguous_of(buf), std::uint64_t{g} * 3000 * 512);
          if (m.rank() == 0) results[g * 3 + round] = res;
        }
      });
    });
  }
  for (auto& t : groups) t.join();
  poller.stop();
  for (std::uint32_t g = 0; g < (std::is_same_v<Slots, slots::exclusive> ? 1u : 4u); ++g) {
    for (int round = 0; round < 3; ++round) CHECK(results[g * 3 + round].ok());
    const auto* words = reinterpret_cast<const std::uint64_t*>(buf.data() + std::size_t{g} * 3000 * 512);
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < 3000 * 64; ++i) bad += words[i] != word_at((1 + g * 3000 + 2) * 512 + i * 8);
    CHECK(bad == 0);
  }
  CHECK(q.cids_in_use() == 0);
}

TEST_CASE_TEMPLATE("groups sharing one queue read and write verified data with each slot policy", Slots, slots::exclusive,
                   slots::warp_aggregated, slots::multi_producer) {
  rig r;
  r.fill();
  constexpr bool exclusive = std::is_same_v<Slots, slots::exclusive>;
  constexpr std::uint32_t groups = 3, members = 4;
  std::vector<std::unique_ptr<host::io_queue>> queues;
  for (std::uint32_t g = 0; g < (exclusive ? groups : 1u); ++g) queues.push_back(std::make_unique<host::io_queue>(*r.ctrl, 16));
  const auto ns = queues[0]->namespace_view(1);
  const std::uint64_t region = ns.lba_count / groups;
  std::vector<host::dma_buffer> buffers;
  for (std::uint32_t g = 0; g < groups; ++g) buffers.push_back(r.ctrl->memory().allocate(region * 512));
  std::vector<std::uint64_t> mismatches(groups), failures(groups);
  std::vector<std::thread> runners;
  for (std::uint32_t g = 0; g < groups; ++g) {
    runners.emplace_back([&, g] {
      const auto& q = *queues[exclusive ? g : 0];
      in_group(members, [&](cunvme::host_group::member& m) {
        reader_of<Slots, completion::cooperative, doorbell::mmio> reader(q.view(), ns);
        writer_of<Slots, completion::cooperative, doorbell::mmio> writer(q.view(), ns);
        auto* words = reinterpret_cast<std::uint64_t*>(buffers[g].data());
        const std::size_t n = region * 512 / 8;
        for (std::uint64_t round = 1; round <= 3; ++round) {
          // Write the whole region with this round's pattern, read it back over a zeroed buffer.
          if (m.rank() == 0) {
            for (std::size_t i = 0; i < n; ++i) words[i] = word_at(g * region * 512 + i * 8, round);
          }
          m.sync();
          const io_result w = writer.write(m, g * region, region, contiguous_of(buffers[g]), 0);
          if (m.rank() == 0) std::memset(words, 0, n * 8);
          m.sync();
          const io_result rd = reader.read(m, g * region, region, contiguous_of(buffers[g]), 0);
          const io_result fl = writer.flush(m);
          if (m.rank() == 0) {
            failures[g] += !w.ok() + !rd.ok() + !fl.ok();
            for (std::size_t i = 0; i < n; ++i) mismatches[g] += words[i] != word_at(g * region * 512 + i * 8, round);
          }
          m.sync();
        }
      });
    });
  }
  for (auto& t : runners) t.join();
  for (std::uint32_t g = 0; g < groups; ++g) {
    CHECK(mismatches[g] == 0);
    CHECK(failures[g] == 0);
  }
  for (auto& q : queues) CHECK(cunvme::cid_pool::in_use(q->view()) == 0);
}

TEST_CASE("a group whose queue has fewer CIDs than members still finishes: members without one wait their turn") {
  rig r;
  r.fill();
  host::io_queue q(*r.ctrl, 3);  // two CIDs for eight members
  auto ns = q.namespace_view(1);
  ns.max_blocks = 64;             // commands of 32 KiB: 32 of them for 1 MiB
  auto buf = r.ctrl->memory().allocate(1 << 20);
  std::vector<io_result> results(8);
  in_group(8, [&](cunvme::host_group::member& m) {
    reader_of<slots::warp_aggregated, completion::cooperative, doorbell::coalescing<doorbell::mmio>> reader(q.view(), ns);
    results[m.rank()] = reader.read(m, 0, 2048, contiguous_of(buf), 0);
  });
  for (const auto& res : results) CHECK(res.ok());
  const auto* words = reinterpret_cast<const std::uint64_t*>(buf.data());
  std::uint64_t mismatches = 0;
  for (std::size_t i = 0; i < (1 << 20) / 8; ++i) mismatches += words[i] != word_at(i * 8);
  CHECK(mismatches == 0);
}
