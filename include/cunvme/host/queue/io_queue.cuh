// A queue pair for the device-side readers, its bookkeeping placed where its submitters are
// (io_queue_memory: GPU memory for kernels) and every wait bounded by a timeout of its own;
// `view()` is the queue pair's one view, what kernels and CPU threads get.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/controller/namespace_info.cuh>
#include <cunvme/host/memory/queue_memory.cuh>
#include <cunvme/host/queue/queue_pair.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/policy/queue_view.cuh>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// How a reader addresses namespace `nsid` of `ctrl` (`make_namespace_view` with its MDTS).
[[nodiscard]] inline namespace_view make_namespace_view(const controller& ctrl, std::uint32_t nsid) {
  return make_namespace_view(ctrl.namespace_by_id(nsid), ctrl.max_transfer_bytes(), ctrl.name());
}

/// A queue pair and its shared bookkeeping.
///
/// Usage: examples/snippets/host.cpp, `read_with_a_reader`.
class io_queue {
 public:
  /// Creates an I/O queue pair of `entries` (2..MQES+1) on `ctrl`; every wait of a reader on
  /// it is bounded by `timeout`.
  io_queue(controller& ctrl, std::uint32_t entries, queue_placement placement = queue_placement::host,
           std::chrono::nanoseconds timeout = std::chrono::seconds(10), io_queue_memory memory = {})
      : ctrl_(ctrl), memory_(std::move(memory)) {
    pair_ = ctrl.make_queue_pair(entries, placement, dma_buffer{}, dma_buffer{}, memory_, checked_timeout(timeout, ctrl));
  }

  /// The same over queues in memory the caller provides (GPU memory, say; see
  /// `controller::create_queue_pair`).
  io_queue(controller& ctrl, std::uint32_t entries, dma_buffer sq, dma_buffer cq, std::chrono::nanoseconds timeout = std::chrono::seconds(10),
           io_queue_memory memory = {})
      : ctrl_(ctrl), memory_(std::move(memory)) {
    pair_ = ctrl.make_queue_pair(entries, queue_placement::provided, std::move(sq), std::move(cq), memory_, checked_timeout(timeout, ctrl));
  }

  [[nodiscard]] const queue_view& view() const noexcept { return pair_->view(); }
  [[nodiscard]] cunvme::namespace_view namespace_view(std::uint32_t nsid) const { return make_namespace_view(ctrl_, nsid); }
  /// The queue pair for the host's own I/O: only while no kernel or reader uses `view()`.
  [[nodiscard]] queue_pair& pair() noexcept { return *pair_; }
  [[nodiscard]] const controller& owner() const noexcept { return ctrl_; }
  [[nodiscard]] controller& owner() noexcept { return ctrl_; }
  /// A snapshot of the shared counters (doorbell writes, unexpected completions, …); read it
  /// while no submitter runs.
  [[nodiscard]] queue_counters counters() const {
    queue_counters c;
    read_bookkeeping(&c, view().counters, sizeof c);
    return c;
  }
  /// What `abort_timed_out` did.
  using abort_outcome = timeout_outcome;

  /// The timeout policy (`controller::end_timed_out`) for every command whose waiter timed out
  /// (its record abandoned) since it last ran, as a driver handles a command past its timeout:
  /// Abort, waiting (bounded by the queue's timeout) for the aborted command's completion, and
  /// where that fails, the controller stopped (CC.EN = 0) until `controller::reset()`. Call it
  /// while no submitter runs (after the kernel). Where the host cannot reach the queue (GPU
  /// memory) it cannot drain the aborted completions either: those count as not aborted, and
  /// the controller is stopped, more than needed, never less.
  abort_outcome abort_timed_out() { return pair_->end_timed_out(); }

  /// Commands whose waiter timed out and whose completion has not been drained yet (read it
  /// while no submitter runs): the controller may still write their buffers.
  [[nodiscard]] std::uint32_t abandoned_commands() const {
    std::vector<completion_record> records(view().cids());
    read_bookkeeping(records.data(), view().records, records.size() * sizeof(completion_record));
    return static_cast<std::uint32_t>(std::count_if(records.begin(), records.end(), [](const completion_record& r) {
      return r.state == static_cast<std::uint32_t>(record_state::abandoned);
    }));
  }

  /// CIDs in use now (read it while no submitter runs): 0 once every command was waited for;
  /// an abandoned command (timed out) holds its CID until its completion arrives.
  [[nodiscard]] std::uint32_t cids_in_use() const {
    std::vector<std::uint32_t> bits(view().cid_words());
    read_bookkeeping(bits.data(), view().cid_bits, bits.size() * 4);
    std::uint32_t n = 0;
    for (const auto w : bits) n += static_cast<std::uint32_t>(std::popcount(w));
    return n;
  }

 private:
  /// Copies bookkeeping bytes to the host: through `io_queue_memory::copy_out` where it lives
  /// in memory only the GPU addresses.
  void read_bookkeeping(void* to, const void* from, std::size_t bytes) const {
    if (memory_.copy_out) {
      memory_.copy_out(to, from, bytes);
    } else {
      std::memcpy(to, from, bytes);
    }
  }

  /// Waits are bounded by `timeout` from now: it must be positive (a negative count would
  /// read as a bound centuries away once stored as an unsigned number of nanoseconds).
  [[nodiscard]] static std::chrono::nanoseconds checked_timeout(std::chrono::nanoseconds timeout, const controller& ctrl) {
    if (timeout.count() <= 0) {
      throw error("Create I/O queue", ctrl.name(), "the timeout must be positive, not " + std::to_string(timeout.count()) + " ns");
    }
    return timeout;
  }

  controller& ctrl_;
  io_queue_memory memory_;
  // Owns the queues, the bookkeeping and the PRP lists: deleting the queues (which aborts
  // what is still outstanding) comes before the PRP lists a command may still point to go.
  std::unique_ptr<queue_pair> pair_;
};

}  // namespace host
CUNVME_NAMESPACE_END
