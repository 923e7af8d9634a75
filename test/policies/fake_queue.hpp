// A queue_view over plain memory, with no controller behind it: the unit tests of each
// policy play the controller's part by hand (reading doorbells, posting CQEs).
#pragma once

#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace test {

struct fake_queue {
  explicit fake_queue(std::uint32_t entries)
      : counters(std::make_unique<cunvme::queue_counters>()), turns(entries), cid_bits((entries - 1 + 31) / 32), records(entries - 1),
        sq(entries), cq(entries), lists((entries - 1) * 512) {
    std::memset(counters.get(), 0, sizeof(cunvme::queue_counters));
    std::memset(records.data(), 0, records.size() * sizeof(cunvme::completion_record));
    std::memset(sq.data(), 0, sq.size() * sizeof(cunvme::spec::submission_entry));
    std::memset(cq.data(), 0, cq.size() * sizeof(cunvme::spec::completion_entry));
    view.sq = sq.data();
    view.cq = cq.data();
    view.sq_doorbell = &registers[0];
    view.cq_doorbell = &registers[1];
    view.entries = entries;
    view.qid = 1;
    view.counters = counters.get();
    view.turns = turns.data();
    view.cid_bits = cid_bits.data();
    view.records = records.data();
    view.prp_lists = lists.data();
    view.prp_lists_bus = 0x40000000;
    view.list_entries = 512;
    view.timeout_ns = 2'000'000'000;
  }
  /// Shadow slots and EventIdx words, as Doorbell Buffer Config provides them.
  void add_shadow() {
    view.sq_shadow = &shadow[0];
    view.cq_shadow = &shadow[1];
    view.sq_event_index = &event_index[0];
    view.cq_event_index = &event_index[1];
  }
  [[nodiscard]] std::uint32_t sq_tail_doorbell() const { return std::atomic_ref<std::uint32_t>(registers[0]).load(std::memory_order_acquire); }
  [[nodiscard]] std::uint32_t cq_head_doorbell() const { return std::atomic_ref<std::uint32_t>(registers[1]).load(std::memory_order_acquire); }

  /// Posts a CQE for `cid` into CQ position `count` (a running count of posted entries, from
  /// which slot and phase follow), DW3 last with release, as a controller does.
  /// `sqid`: the SQ identifier the CQE names (0: this queue's own).
  void post(std::uint64_t count, std::uint16_t cid, cunvme::spec::status status, std::uint16_t sqhd, std::uint32_t dw0 = 0,
            std::uint16_t sqid = 0) {
    const std::uint32_t slot = static_cast<std::uint32_t>(count % view.entries);
    const bool phase = (count / view.entries) % 2 == 0;
    auto* words = reinterpret_cast<std::uint32_t*>(&cq[slot]);
    std::atomic_ref<std::uint32_t>(words[0]).store(dw0, std::memory_order_relaxed);
    std::atomic_ref<std::uint32_t>(words[1]).store(0, std::memory_order_relaxed);
    std::atomic_ref<std::uint32_t>(words[2]).store(std::uint32_t{sqhd} | std::uint32_t{sqid != 0 ? sqid : view.qid} << 16, std::memory_order_relaxed);
    const std::uint16_t field = cunvme::spec::cqe_status::make_status_field(status, phase);
    std::atomic_ref<std::uint32_t>(words[3]).store(std::uint32_t{cid} | std::uint32_t{field} << 16, std::memory_order_release);
  }

  std::unique_ptr<cunvme::queue_counters> counters;
  std::vector<std::uint64_t> turns;
  std::vector<std::uint32_t> cid_bits;
  std::vector<cunvme::completion_record> records;
  std::vector<cunvme::spec::submission_entry> sq;
  std::vector<cunvme::spec::completion_entry> cq;
  std::vector<std::uint64_t> lists;
  mutable std::uint32_t registers[2] = {0, 0};
  std::uint32_t shadow[2] = {0, 0};
  std::uint32_t event_index[2] = {0, 0};
  cunvme::queue_view view{};
};

}  // namespace test
