// A queue pair ready for the device-side readers: the NVMe queues (host::queue_pair) plus the
// bookkeeping every submitter shares — counters, per-slot turns, the CID bitmap, completion
// records and one PRP list per CID — laid out in DMA memory the controller (PRP lists) and
// the submitting threads (everything) can reach. `view()` is what kernels and CPU threads get.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/controller.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/io/reader.cuh>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// How a reader addresses namespace `nsid` of `ctrl`: LBA size, metadata, capacity, and the
/// blocks one command may carry (MDTS, which counts extended LBAs' metadata, and NLB's 65536).
/// A namespace with separate metadata or protection information gets a view its readers
/// refuse (io_error::metadata_unsupported); host::queue_pair handles separate metadata.
[[nodiscard]] inline namespace_view make_namespace_view(const controller& ctrl, std::uint32_t nsid) {
  const namespace_info& ns = ctrl.namespace_by_id(nsid);
  const std::uint64_t per_command = std::min<std::uint64_t>(ctrl.max_transfer_bytes() / ns.block_bytes(), spec::rw_fields::max_blocks);
  if (per_command == 0) {
    throw error("Prepare namespace " + std::to_string(nsid), ctrl.name(),
                "MDTS (" + std::to_string(ctrl.max_transfer_bytes()) + " bytes) is smaller than one " + std::to_string(ns.block_bytes()) + "-byte block");
  }
  namespace_view v;
  v.nsid = nsid;
  v.lba_shift = static_cast<std::uint32_t>(std::countr_zero(ns.lba_size));
  // Readers split at max_blocks: a count whose bytes are whole dwords keeps every command's
  // start dword aligned (readers refuse a split where none is: one command at most).
  const std::uint64_t aligned = dword_aligned_split(per_command, ns.block_bytes(), 0);
  v.max_blocks = static_cast<std::uint32_t>(aligned != 0 ? aligned : per_command);
  v.lba_count = ns.lba_count;
  v.metadata_size = ns.metadata_size;
  v.metadata = ns.metadata_size == 0 ? metadata_layout::none : ns.extended_lba ? metadata_layout::extended : metadata_layout::separate;
  v.protection = ns.protection_type != 0;
  return v;
}

/// Where an io_queue keeps its bookkeeping and its PRP lists. The defaults suit CPU threads:
/// both in the controller's DMA memory. Kernels want the bookkeeping in GPU memory (its
/// atomics stay on the GPU): see `host/gpu_queue.cuh`.
struct io_queue_memory {
  /// Zeroed memory every submitter can address; nullptr: the controller's DMA memory.
  std::function<dma_buffer(std::size_t bytes)> bookkeeping;
  /// Memory the controller reads PRP lists from, its bus address aligned to `alignment` (the
  /// controller page) and each controller page of it one bus range; nullptr: its DMA memory.
  std::function<dma_buffer(std::size_t bytes, std::size_t alignment)> prp_lists;
  /// Copies bookkeeping bytes to the host (for `counters()`); nullptr: memcpy.
  std::function<void(void* to, const void* from, std::size_t bytes)> copy_out;
  /// Copies bytes from the host into PRP list memory the host cannot address (GPU memory);
  /// nullptr: memcpy.
  std::function<void(void* to, const void* from, std::size_t bytes)> copy_in;
};

/// A queue pair and its shared bookkeeping.
///
/// ```
/// auto ctrl = cunvme::host::open("emu");
/// cunvme::host::io_queue q(*ctrl, 256);
/// using queue  = cunvme::queue<cunvme::slots::multi_producer, cunvme::completion::cooperative>;
/// cunvme::block_reader<queue, cunvme::prp::contiguous, cunvme::doorbell::mmio> reader(q.view(), q.namespace_view(1));
/// ```
class io_queue {
 public:
  /// Creates an I/O queue pair of `entries` (2..MQES+1) on `ctrl`; every wait of a reader on
  /// it is bounded by `timeout`.
  io_queue(controller& ctrl, std::uint32_t entries, queue_placement placement = queue_placement::host,
           std::chrono::nanoseconds timeout = std::chrono::seconds(10), io_queue_memory memory = {})
      : ctrl_(ctrl), timeout_(checked_timeout(timeout, ctrl)), memory_(std::move(memory)), pair_(ctrl.create_queue_pair(entries, placement)) {
    layout();
  }

  /// The same over queues in memory the caller provides (GPU memory, say; see
  /// `controller::create_queue_pair`).
  io_queue(controller& ctrl, std::uint32_t entries, dma_buffer sq, dma_buffer cq, std::chrono::nanoseconds timeout = std::chrono::seconds(10),
           io_queue_memory memory = {})
      : ctrl_(ctrl), timeout_(checked_timeout(timeout, ctrl)), memory_(std::move(memory)),
        pair_(ctrl.create_queue_pair(entries, std::move(sq), std::move(cq))) {
    layout();
  }

  [[nodiscard]] const queue_view& view() const noexcept { return view_; }
  [[nodiscard]] cunvme::namespace_view namespace_view(std::uint32_t nsid) const { return make_namespace_view(ctrl_, nsid); }
  [[nodiscard]] queue_pair& pair() noexcept { return *pair_; }
  [[nodiscard]] const controller& owner() const noexcept { return ctrl_; }
  /// A snapshot of the shared counters (doorbell writes, unexpected completions, …); read it
  /// while no submitter runs.
  [[nodiscard]] queue_counters counters() const {
    queue_counters c;
    if (memory_.copy_out) {
      memory_.copy_out(&c, view_.counters, sizeof c);
    } else {
      std::memcpy(&c, view_.counters, sizeof c);
    }
    return c;
  }
  /// CIDs in use now (read it while no submitter runs): 0 once every command was waited for;
  /// an abandoned command (timed out) holds its CID until its completion arrives.
  [[nodiscard]] std::uint32_t cids_in_use() const {
    std::vector<std::uint32_t> bits(view_.cid_words());
    if (memory_.copy_out) {
      memory_.copy_out(bits.data(), view_.cid_bits, bits.size() * 4);
    } else {
      std::memcpy(bits.data(), view_.cid_bits, bits.size() * 4);
    }
    std::uint32_t n = 0;
    for (const auto w : bits) n += static_cast<std::uint32_t>(std::popcount(w));
    return n;
  }

 private:
  /// Waits are bounded by `timeout` from now: it must be positive (a negative count would
  /// read as a bound centuries away once stored as an unsigned number of nanoseconds).
  [[nodiscard]] static std::chrono::nanoseconds checked_timeout(std::chrono::nanoseconds timeout, const controller& ctrl) {
    if (timeout.count() <= 0) {
      throw error("Create I/O queue", ctrl.name(), "the timeout must be positive, not " + std::to_string(timeout.count()) + " ns");
    }
    return timeout;
  }

  void layout() {
    const std::uint32_t entries = pair_->entries();
    const std::uint32_t cids = entries - 1;
    const unsigned shift = ctrl_.page_shift();
    const std::uint64_t list_bytes = prp::list_bytes_per_command(ctrl_.max_transfer_bytes(), shift);
    const std::string operation = "Create PRP lists for I/O queue " + std::to_string(pair_->id());
    const std::size_t page = ctrl_.page_bytes();
    // One list per CID, each whole controller pages, then room for a table of each list
    // page's bus address (used when the lists are contiguous only page by page). MDTS may be
    // reported as anything up to 2^64 - 1 bytes: every size is checked.
    std::uint64_t lists_bytes = 0, table_bytes = 0, total = 0;
    if (list_bytes / 8 > ~std::uint32_t{0} || cunvme::detail::mul_overflows<std::uint64_t>(cids, list_bytes, lists_bytes) ||
        cunvme::detail::mul_overflows<std::uint64_t>(lists_bytes / page, 8, table_bytes) ||
        cunvme::detail::add_overflows<std::uint64_t>(lists_bytes, table_bytes, total) || total > ~std::size_t{0}) {
      throw error(operation, ctrl_.name(), std::to_string(cids) + " PRP lists for " + std::to_string(ctrl_.max_transfer_bytes()) +
                                               "-byte transfers (MDTS) do not fit the address space");
    }

    const bookkeeping_layout bookkeeping = bookkeeping_layout::of(entries);
    state_ = memory_.bookkeeping ? memory_.bookkeeping(bookkeeping.bytes) : ctrl_.memory().allocate(bookkeeping.bytes);
    lists_ = memory_.prp_lists ? memory_.prp_lists(total, page) : ctrl_.memory().allocate(total, page);
    std::byte* base = state_.device_data() != nullptr ? static_cast<std::byte*>(state_.device_data()) : state_.data();
    std::byte* lists = lists_.device_data() != nullptr ? static_cast<std::byte*>(lists_.device_data()) : lists_.data();
    if (lists_.bus() % page != 0) throw error(operation, ctrl_.name(), "the PRP list memory is not on a controller page");
    // A PRP list needs each of its pages contiguous (4.1.1), not the whole block of lists:
    // where the lists are one bus range a CID's list is found by offset, otherwise through
    // the table of page addresses.
    view_.prp_list_pages = nullptr;
    if (!lists_.contiguous(0, lists_bytes)) {
      std::vector<std::uint64_t> pages = lists_.bus_pages(page);
      if (pages.size() < lists_bytes / page) {
        throw error(operation, ctrl_.name(), "a " + std::to_string(page) + "-byte page of the PRP list memory is not one aligned bus range");
      }
      pages.resize(lists_bytes / page);
      std::byte* table = lists + lists_bytes;
      if (lists_.data() != nullptr) {
        std::memcpy(lists_.data() + lists_bytes, pages.data(), table_bytes);
      } else if (memory_.copy_in) {
        memory_.copy_in(table, pages.data(), table_bytes);
      } else {
        throw error(operation, ctrl_.name(), "the PRP list memory is contiguous only page by page and the host cannot write its page table");
      }
      view_.prp_list_pages = reinterpret_cast<const std::uint64_t*>(table);
    }

    const queue_pair_view q = pair_->view();
    view_.sq = q.sq;
    view_.cq = q.cq;
    view_.sq_doorbell = q.sq_doorbell;
    view_.cq_doorbell = q.cq_doorbell;
    view_.sq_shadow = q.sq_shadow;
    view_.cq_shadow = q.cq_shadow;
    view_.sq_event_index = q.sq_event_index;
    view_.cq_event_index = q.cq_event_index;
    view_.entries = entries;
    view_.qid = pair_->id();
    bookkeeping.bind(view_, base);
    view_.prp_lists = reinterpret_cast<std::uint64_t*>(lists);
    view_.prp_lists_bus = lists_.bus();
    view_.list_entries = static_cast<std::uint32_t>(list_bytes / 8);
    view_.page_shift = shift;
    view_.timeout_ns = static_cast<std::uint64_t>(timeout_.count());
  }

  controller& ctrl_;
  std::chrono::nanoseconds timeout_;
  io_queue_memory memory_;
  dma_buffer state_;  // zeroed by the allocator: counters 0, turns 0, CIDs free
  dma_buffer lists_;
  // Declared after the memory so it is destroyed first: deleting the queues (which aborts what
  // is still outstanding) comes before the PRP lists a command may still point to are freed.
  std::unique_ptr<queue_pair> pair_;
  queue_view view_{};
};

}  // namespace host
CUNVME_NAMESPACE_END
