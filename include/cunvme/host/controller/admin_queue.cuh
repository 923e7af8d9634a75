// The admin queue pair: one command at a time (the controller serialises its callers), MMIO
// doorbells (the admin queue takes no shadow doorbell here), and the same CQE rules as every
// queue: the phase tag read first with acquire (DESIGN.md rule 2), the CQ head doorbell after
// consuming (rule 3), and a CQE naming any other command counted and dropped (rule 4).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/backend/register_backend.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/registers.cuh>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>

CUNVME_NAMESPACE_BEGIN
namespace host {

class admin_queue {
 public:
  admin_queue() = default;
  /// Over `sq` and `cq` of `entries` each (ASQ, ACQ and AQA already point at them), with
  /// doorbells `dstrd` apart in `backend`'s BAR.
  admin_queue(register_backend& backend, dma_buffer sq, dma_buffer cq, std::uint32_t entries, unsigned dstrd)
      : backend_(&backend), sq_(std::move(sq)), cq_(std::move(cq)), entries_(entries), dstrd_(dstrd) {
    if (backend.queues_in_bar(dstrd) == 0) {
      throw error("Set up admin queues", backend.name(), "the " + std::to_string(backend.bar_size()) + "-byte BAR0 ends before the admin queue's doorbells (CAP.DSTRD = " +
                                                            std::to_string(dstrd) + ": " + std::to_string(spec::bar_bytes_for_queues(0, dstrd)) + " bytes needed)");
    }
  }

  [[nodiscard]] std::uint64_t sq_bus() const { return sq_.bus(); }
  [[nodiscard]] std::uint64_t cq_bus() const { return cq_.bus(); }

  /// Submits `sqe` (its CID chosen here) and waits at most `timeout` for its completion; none
  /// within it: nullopt. CQEs for other commands are added to `unexpected` and dropped.
  std::optional<spec::completion_entry> execute(spec::submission_entry sqe, std::chrono::milliseconds timeout, std::atomic<std::uint64_t>& unexpected) {
    const std::uint16_t cid = cid_++;
    sqe.set_cid(cid);
    reinterpret_cast<spec::submission_entry*>(sq_.data())[tail_] = sqe;
    tail_ = tail_ + 1 == entries_ ? 0 : tail_ + 1;
    // Rule 1: the SQE is complete before the doorbell (the backend's store is a release).
    backend_->write32(spec::sq_tail_doorbell_offset(0, dstrd_), tail_);
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (unsigned spins = 0;;) {
      std::byte* entry = cq_.data() + std::size_t{head_} * sizeof(spec::completion_entry);
      const std::uint32_t dw3 = std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(entry + spec::cqe_dword::dw3_offset))
                                    .load(std::memory_order_acquire);
      if (spec::cqe_dword::phase(dw3) != phase_) {
        if (std::chrono::steady_clock::now() >= until) return std::nullopt;
        if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
        continue;
      }
      spec::completion_entry cqe;
      std::memcpy(&cqe, entry, sizeof cqe);
      head_ = head_ + 1 == entries_ ? 0 : head_ + 1;
      if (head_ == 0) phase_ = !phase_;
      backend_->write32(spec::cq_head_doorbell_offset(0, dstrd_), head_);
      if (cqe.cid == cid && cqe.sqid == 0) return cqe;
      unexpected.fetch_add(1, std::memory_order_relaxed);
    }
  }

 private:
  register_backend* backend_ = nullptr;
  dma_buffer sq_, cq_;
  std::uint32_t entries_ = 0;
  unsigned dstrd_ = 0;
  std::uint32_t tail_ = 0, head_ = 0;
  bool phase_ = true;
  std::uint16_t cid_ = 0;
};

}  // namespace host
CUNVME_NAMESPACE_END
