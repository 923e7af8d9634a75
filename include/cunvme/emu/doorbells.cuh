// The emulated controller's doorbells: the values the host rang, through MMIO or, once
// Doorbell Buffer Config is in effect, the shadow doorbell buffer (NVMe 2.0 base
// specification 5.8) with EventIdx published back; the checks on rung values, and writes to
// the doorbells of queues that do not exist (Invalid Doorbell Register/Write Value, 5.2).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/emu/dma_space.cuh>
#include <cunvme/emu/events.cuh>
#include <cunvme/emu/register_file.cuh>
#include <cunvme/spec/registers.cuh>
#include <cunvme/spec/shadow_doorbell.cuh>

#include <atomic>
#include <cstdint>
#include <mutex>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

class doorbells : public register_file {
 protected:
  using register_file::register_file;

  /// Byte offset of a queue's slot in the Shadow Doorbell and EventIdx buffers. In 64 bits:
  /// 2 × 65535 queues × a 128 KiB stride wraps 32.
  [[nodiscard]] std::uint64_t doorbell_slot(std::uint16_t qid, bool is_cq) const noexcept {
    return std::uint64_t{spec::shadow_doorbell_slot(qid, is_cq, config_.doorbell_stride)} * sizeof(std::uint32_t);
  }

  /// Whether a doorbell's shadow and EventIdx slots lie inside the buffers' one memory page
  /// (5.8): with a large CAP.DSTRD or many queues they do not, and such a queue keeps its MMIO
  /// doorbell; the bytes past the page are not the controller's to read or write.
  [[nodiscard]] bool has_shadow_slot(std::uint16_t qid, bool is_cq) const noexcept {
    return doorbell_slot(qid, is_cq) + sizeof(std::uint32_t) <= page_size_;
  }

  /// The value the host last rang for an I/O queue: the shadow doorbell once Doorbell Buffer
  /// Config is in effect (5.8), the MMIO doorbell otherwise. The admin queue always uses MMIO.
  [[nodiscard]] std::uint32_t read_doorbell(const dma_space::view* mem, std::uint16_t qid, bool is_cq) {
    if (qid != 0 && mem != nullptr && has_shadow_slot(qid, is_cq)) {
      // A shadow page the host has unmapped leaves only the MMIO doorbell to go by.
      if (const std::uint64_t shadow = shadow_doorbells_.load(std::memory_order_acquire); shadow != 0) {
        if (const auto v = mem->load32(shadow + doorbell_slot(qid, is_cq))) return *v;
      }
    }
    return load32(is_cq ? cq_doorbell(qid) : sq_doorbell(qid));
  }

  /// EventIdx tells a shadow-doorbell host how far the controller has looked, so it rings the
  /// MMIO doorbell only when it moves past that point.
  void publish_event_index(const dma_space::view& mem, std::uint16_t qid, bool is_cq, std::uint32_t value) {
    if (!has_shadow_slot(qid, is_cq)) return;
    if (const std::uint64_t events = event_indexes_.load(std::memory_order_acquire); events != 0) {
      (void)mem.store32(events + doorbell_slot(qid, is_cq), value);
    }
  }

  /// A queue created while shadow doorbells are in effect starts from 0 on both sides: its
  /// shadow slot and EventIdx are set to the queue's initial value before the queue goes live
  /// (DESIGN.md rule 5). A value left in the slot for an earlier queue with this identifier was
  /// never rung for this one: read as a tail it runs zeroed SQEs nobody submitted, read as a
  /// head it is an invalid doorbell value. The NVMe 2.0 base specification (5.8, Doorbell
  /// Buffer Config) has the controller keep its doorbell state in the host's buffer and does
  /// not carry a deleted queue's state over to a new one; QEMU likewise writes its own state
  /// into the buffer (hw/nvme nvme_dbbuf_config), and Linux zeroes both buffers on every reset.
  void start_shadow_doorbell(const dma_space::view& mem, std::uint16_t qid, bool is_cq) {
    if (!has_shadow_slot(qid, is_cq)) return;
    if (const std::uint64_t shadow = shadow_doorbells_.load(std::memory_order_acquire); shadow != 0) {
      (void)mem.store32(shadow + doorbell_slot(qid, is_cq), 0);
    }
    publish_event_index(mem, qid, is_cq, 0);
  }

  [[nodiscard]] std::uint32_t read_sq_tail(const dma_space::view* mem, std::uint16_t qid, sq_state& sq) {
    const std::uint32_t value = read_doorbell(mem, qid, false);
    if (value < sq.size) return value;
    if (value != sq.rejected_tail) {
      sq.rejected_tail = value;
      doorbell_error(qid, value, async_error_info::invalid_doorbell_write_value);
    }
    return sq.tail;
  }

  /// A CQ head may only move over entries the controller has posted (Invalid Doorbell Write
  /// Value otherwise, 5.2); such a write is ignored.
  void refresh_cq_head(const dma_space::view* mem, std::uint16_t qid, cq_state& cq) {
    const std::uint32_t value = read_doorbell(mem, qid, true);
    if (value == cq.head) return;
    const std::uint32_t posted = (cq.tail + cq.size - cq.head) % cq.size;
    const std::uint32_t advance = (value + cq.size - cq.head) % cq.size;
    if (value < cq.size && advance <= posted) {
      cq.head = value;
      if (qid != 0 && mem != nullptr) publish_event_index(*mem, qid, true, value);
      return;
    }
    if (value != cq.rejected_head) {
      cq.rejected_head = value;
      doorbell_error(qid, value, async_error_info::invalid_doorbell_write_value);
    }
  }

  /// Noted for the admin thread (doorbell_fault_inbox says why it does not log here).
  void doorbell_error(std::uint16_t qid, std::uint32_t value, async_error_info info) {
    doorbell_errors_.fetch_add(1, std::memory_order_relaxed);
    doorbell_faults_.note(doorbell_fault{qid, value, info});
  }

  /// Doorbells of queues that do not exist are not backed by anything on a real controller;
  /// a write to one is an error the host learns about through the error log and an
  /// asynchronous event (Write to Invalid Doorbell Register, 5.2).
  void scan_stray_doorbells() {
    for (std::uint32_t q = 1; q <= config_.max_io_queues; ++q) {
      const auto qid = static_cast<std::uint16_t>(q);
      for (int is_cq = 0; is_cq < 2; ++is_cq) {
        bool live = false;
        {
          auto& m = is_cq ? cqs_[q].mutex : sqs_[q].mutex;
          std::scoped_lock lock(m);
          live = is_cq ? cqs_[q].live : sqs_[q].live.load(std::memory_order_relaxed);
        }
        if (live) continue;
        const std::uint32_t offset = is_cq ? cq_doorbell(qid) : sq_doorbell(qid);
        const std::uint32_t value = load32(offset);
        std::uint32_t& seen = stray_doorbell(qid, is_cq != 0);
        if (value != seen) {
          seen = value;
          doorbell_error(qid, value, async_error_info::invalid_doorbell_register);
        }
      }
    }
  }
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
