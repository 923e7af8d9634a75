// A minimal host driver for the conformance tests: it writes registers, SQEs and doorbells
// itself, as the tests must (they check the controller, not a driver).
#pragma once

#include <cunvme/emu/controller.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace test {

namespace spec = cunvme::spec;
namespace emu = cunvme::emu;
using namespace std::chrono_literals;

/// Page-aligned memory registered with the controller's IOMMU, as host memory or (`kind`) as
/// memory the controller takes for a GPU's, which it reaches through `memory_hooks::device_copy`.
struct dma_buffer {
  dma_buffer(emu::controller& c, std::size_t bytes, std::size_t align = 4096, emu::memory_kind kind = emu::memory_kind::host) : ctrl(&c), size(bytes) {
    data = static_cast<std::byte*>(std::aligned_alloc(align, (bytes + align - 1) / align * align));
    std::memset(data, 0, bytes);
    bus = c.dma().map(data, bytes, kind);
  }
  dma_buffer(const dma_buffer&) = delete;
  dma_buffer& operator=(const dma_buffer&) = delete;
  ~dma_buffer() {
    ctrl->dma().unmap(bus);
    std::free(data);
  }
  template <class T>
  T* as() const { return reinterpret_cast<T*>(data); }

  emu::controller* ctrl;
  std::size_t size;
  std::byte* data = nullptr;
  std::uint64_t bus = 0;
};

/// One submission/completion queue pair as the host sees it.
struct queue_pair {
  queue_pair(emu::controller& c, std::uint16_t id, std::uint32_t n, std::byte* sq_memory = nullptr, std::uint64_t sq_bus_address = 0)
      : qid(id), entries(n), cq(c, n * sizeof(spec::completion_entry)) {
    if (sq_memory == nullptr) {
      sq_owned = std::make_unique<dma_buffer>(c, n * sizeof(spec::submission_entry));
      sq_memory = sq_owned->data;
      sq_bus_address = sq_owned->bus;
    }
    sq = reinterpret_cast<spec::submission_entry*>(sq_memory);
    sq_bus = sq_bus_address;
  }
  std::uint16_t qid;
  std::uint32_t entries;
  std::unique_ptr<dma_buffer> sq_owned;
  spec::submission_entry* sq = nullptr;
  std::uint64_t sq_bus = 0;
  dma_buffer cq;
  std::uint32_t sq_tail = 0;
  std::uint32_t cq_head = 0;
  bool phase = true;
  std::uint16_t next_cid = 1;
};

class test_host {
 public:
  explicit test_host(emu::controller& c) : ctrl(c) {}

  // ---- registers ---------------------------------------------------------------------------
  // MMIO: registers through the controller's register file, doorbells into the BAR memory.
  [[nodiscard]] std::uint32_t read32(std::uint32_t offset) const { return ctrl.read_register(offset); }
  void write32(std::uint32_t offset, std::uint32_t value) const { ctrl.write_register(offset, value); }
  [[nodiscard]] std::uint32_t reg(spec::register_offset r) const { return read32(spec::to_underlying(r)); }
  void set_reg(spec::register_offset r, std::uint32_t v) const { write32(spec::to_underlying(r), v); }
  [[nodiscard]] std::uint64_t reg64(spec::register_offset r) const {
    return std::uint64_t{read32(spec::to_underlying(r))} | std::uint64_t{read32(spec::to_underlying(r) + 4)} << 32;
  }
  void set_reg64(spec::register_offset r, std::uint64_t v) const {
    write32(spec::to_underlying(r), static_cast<std::uint32_t>(v));
    write32(spec::to_underlying(r) + 4, static_cast<std::uint32_t>(v >> 32));
  }
  [[nodiscard]] spec::cap_register cap() const { return spec::cap_register{reg64(spec::register_offset::cap)}; }
  [[nodiscard]] spec::csts_register csts() const { return spec::csts_register{reg(spec::register_offset::csts)}; }
  [[nodiscard]] std::uint32_t dstrd() const { return cap().dstrd(); }

  /// Waits (bounded) until `done()` holds.
  template <class F>
  static bool eventually(F done, std::chrono::milliseconds timeout = 10s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(50us);
    }
    return true;
  }

  // ---- bring-up -----------------------------------------------------------------------------
  /// Admin queues of `entries`, CC with 64/16-byte I/O entries; true when CSTS.RDY rose.
  bool enable(std::uint32_t entries = 32, std::uint8_t mps = 0) {
    admin = std::make_unique<queue_pair>(ctrl, 0, entries);
    set_reg(spec::register_offset::aqa,
            spec::aqa_register{}.set_asqs(static_cast<std::uint16_t>(entries - 1)).set_acqs(static_cast<std::uint16_t>(entries - 1)).raw);
    set_reg64(spec::register_offset::asq, admin->sq_bus);
    set_reg64(spec::register_offset::acq, admin->cq.bus);
    set_reg(spec::register_offset::cc, spec::cc_register{}.set_iosqes(6).set_iocqes(4).set_mps(mps).set_en(true).raw);
    return eventually([&] { return csts().rdy() || csts().cfs(); }) && csts().rdy();
  }
  /// After a reset (3.7.2) the admin queues start empty: zeroes them and the host's indices.
  void clear_admin_queues() {
    std::memset(admin->sq, 0, admin->entries * sizeof(spec::submission_entry));
    std::memset(admin->cq.data, 0, admin->cq.size);
    admin->sq_tail = admin->cq_head = 0;
    admin->phase = true;
  }
  bool disable() {
    set_reg(spec::register_offset::cc, spec::cc_register{reg(spec::register_offset::cc)}.set_en(false).raw);
    return eventually([&] { return !csts().rdy(); });
  }

  // ---- commands -------------------------------------------------------------------------------
  /// Places `sqe` (with a fresh CID) in the next slot without ringing; returns the CID.
  std::uint16_t place(queue_pair& q, spec::submission_entry sqe) {
    const std::uint16_t cid = q.next_cid++;
    sqe.set_cid(cid);
    q.sq[q.sq_tail] = sqe;
    q.sq_tail = (q.sq_tail + 1) % q.entries;
    return cid;
  }
  void ring_sq(const queue_pair& q) { write32(spec::sq_tail_doorbell_offset(q.qid, dstrd()), q.sq_tail); }
  void ring_cq(const queue_pair& q) { write32(spec::cq_head_doorbell_offset(q.qid, dstrd()), q.cq_head); }

  /// The phase tag of a CQE, read with the same 32-bit acquire load the controller's release
  /// store of DW3 pairs with (ordering rule 2).
  [[nodiscard]] static bool phase_of(spec::completion_entry* slot) {
    auto& dw3 = *reinterpret_cast<std::uint32_t*>(reinterpret_cast<std::byte*>(slot) + 12);
    return ((std::atomic_ref<std::uint32_t>(dw3).load(std::memory_order_acquire) >> 16) & 1u) != 0;
  }

  /// The next completion, if one arrives within `timeout`; rings the CQ head doorbell.
  std::optional<spec::completion_entry> next_completion(queue_pair& q, std::chrono::milliseconds timeout = 10s) {
    auto* slot = reinterpret_cast<spec::completion_entry*>(q.cq.data) + q.cq_head;
    if (!eventually([&] { return phase_of(slot) == q.phase; }, timeout)) return std::nullopt;
    spec::completion_entry cqe = *slot;
    q.cq_head = (q.cq_head + 1) % q.entries;
    if (q.cq_head == 0) q.phase = !q.phase;
    ring_cq(q);
    return cqe;
  }

  /// Submits one command and waits for its completion (which must be the next one).
  spec::completion_entry run(queue_pair& q, const spec::submission_entry& sqe, std::chrono::milliseconds timeout = 10s) {
    const std::uint16_t cid = place(q, sqe);
    ring_sq(q);
    auto cqe = next_completion(q, timeout);
    REQUIRE_MESSAGE(cqe.has_value(), "no completion for CID " << cid << " on queue " << q.qid);
    CHECK(cqe->cid == cid);
    CHECK(cqe->sqid == q.qid);
    return *cqe;
  }
  spec::status admin_status(const spec::submission_entry& sqe) { return run(*admin, sqe).status(); }

  /// Creates I/O CQ and SQ `qid` of `entries` each.
  std::unique_ptr<queue_pair> create_pair(std::uint16_t qid, std::uint32_t entries) {
    auto q = std::make_unique<queue_pair>(ctrl, qid, entries);
    REQUIRE(admin_status(spec::make_create_io_cq(qid, entries, q->cq.bus)) == spec::status::successful_completion);
    REQUIRE(admin_status(spec::make_create_io_sq(qid, entries, q->sq_bus, qid)) == spec::status::successful_completion);
    return q;
  }

  emu::controller& ctrl;
  std::unique_ptr<queue_pair> admin;
};

}  // namespace test
