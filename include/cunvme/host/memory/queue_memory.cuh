// Where a queue pair lives: its placement, and the memory of its bookkeeping (counters,
// per-slot turns, the CID bitmap, completion records) and its PRP lists (one per CID), laid
// out once (`bookkeeping_layout`) for every submitter — GPU threads and the host's own I/O.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/status.cuh>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Where a queue pair's queues live.
enum class queue_placement : std::uint8_t {
  host,            ///< both in pinned host memory
  cmb_submission,  ///< the SQ in the controller memory buffer (a GPU then only writes across PCIe), the CQ in host memory
  provided,        ///< memory the caller provides, e.g. GPU memory from `dma_allocator::map_gpu`
};

/// A queue's base must be on a controller page (CC.MPS; Create I/O SQ/CQ, 5.4/5.5): the
/// controller answers Invalid PRP Offset otherwise.
inline void require_page_aligned(std::uint64_t bus, std::size_t page, const std::string& operation, const std::string& device) {
  if (bus % page != 0) {
    throw error(operation, device, "the queue's bus address " + std::to_string(bus) + " is not on a " + std::to_string(page) + "-byte controller page (CC.MPS)");
  }
}

/// Queues are created physically contiguous (PC = 1; CAP.CQR): one bus range.
inline void require_contiguous(const dma_buffer& queue, const std::string& operation, const std::string& device) {
  if (!queue.contiguous(0, queue.size())) {
    // A 2 MiB huge page is the most physically contiguous memory pinned pages give: a hint
    // to reserve them helps only queues that fit one.
    constexpr std::size_t huge_page = std::size_t{2} << 20;
    throw error(operation, device, "the queue's " + std::to_string(queue.size()) + " bytes are not contiguous in bus address space: " +
                                       (queue.size() <= huge_page ? "reserve huge pages (/proc/sys/vm/nr_hugepages) or use a smaller queue"
                                                                  : "a queue over 2 MiB needs an IOMMU (vfio:, or kmod: with the IOMMU on); use a smaller queue"));
  }
}

/// Where a queue pair keeps its bookkeeping and its PRP lists. The defaults suit CPU threads
/// (the host's own I/O among them): both in the controller's DMA memory. Kernels want the
/// bookkeeping in GPU memory (its atomics stay on the GPU): see `host/gpu/gpu_queue.cuh`; the
/// host's own I/O then refuses the queue (it cannot address the bookkeeping).
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

/// The bookkeeping and PRP lists of one queue pair, allocated and zeroed.
class queue_bookkeeping {
 public:
  queue_bookkeeping() = default;

  /// Allocates for a queue of `entries` whose commands move at most `max_transfer_bytes`
  /// with controller pages of 2^`page_shift` bytes, in `memory` or else the controller's
  /// DMA memory (`allocator`). Throws `host::error` (`operation` on `device`).
  queue_bookkeeping(const io_queue_memory& memory, dma_allocator& allocator, std::uint32_t entries,
                    unsigned page_shift, std::uint64_t max_transfer_bytes, const std::string& operation, const std::string& device)
      : layout_(bookkeeping_layout::of(entries)), copy_in_(memory.copy_in), copy_out_(memory.copy_out) {
    const std::uint32_t cids = entries - 1;
    const std::size_t page = std::size_t{1} << page_shift;
    const std::uint64_t list_bytes = prp::list_bytes_per_command(max_transfer_bytes, page_shift);
    // One list per CID, each whole controller pages, then room for a table of each list
    // page's bus address (used when the lists are contiguous only page by page). MDTS may be
    // reported as anything up to 2^64 - 1 bytes: every size is checked.
    std::uint64_t total = 0;
    if (list_bytes / 8 > ~std::uint32_t{0} || cunvme::detail::mul_overflows<std::uint64_t>(cids, list_bytes, lists_bytes_) ||
        cunvme::detail::mul_overflows<std::uint64_t>(lists_bytes_ / page, 8, table_bytes_) ||
        cunvme::detail::add_overflows<std::uint64_t>(lists_bytes_, table_bytes_, total) || total > ~std::size_t{0}) {
      throw error(operation, device, std::to_string(cids) + " PRP lists for " + std::to_string(max_transfer_bytes) +
                                         "-byte transfers (MDTS) do not fit the address space");
    }
    list_entries_ = static_cast<std::uint32_t>(list_bytes / 8);
    page_shift_ = page_shift;
    state_ = memory.bookkeeping ? memory.bookkeeping(layout_.bytes) : allocator.allocate(layout_.bytes);
    lists_ = memory.prp_lists ? memory.prp_lists(total, page) : allocator.allocate(total, page);
    if (lists_.bus() % page != 0) throw error(operation, device, "the PRP list memory is not on a controller page");
    // A PRP list needs each of its pages contiguous (4.1.1), not the whole block of lists:
    // where the lists are one bus range a CID's list is found by offset, otherwise through
    // the table of page addresses.
    if (!lists_.contiguous(0, lists_bytes_)) {
      std::vector<std::uint64_t> pages = lists_.bus_pages(page);
      if (pages.size() < lists_bytes_ / page) {
        throw error(operation, device, "a " + std::to_string(page) + "-byte page of the PRP list memory is not one aligned bus range");
      }
      pages.resize(lists_bytes_ / page);
      paged_ = true;
      if (lists_.data() != nullptr) {
        std::memcpy(lists_.data() + lists_bytes_, pages.data(), table_bytes_);
      } else if (memory.copy_in) {
        memory.copy_in(static_cast<std::byte*>(lists_.device_data()) + lists_bytes_, pages.data(), table_bytes_);
      } else {
        throw error(operation, device, "the PRP list memory is contiguous only page by page and the host cannot write its page table");
      }
    }
  }

  /// Points `view`'s bookkeeping and PRP lists at this memory, through the addresses kernels
  /// use (`device`: GPU-usable where the memory has them) or the host's. False when the host
  /// is asked for and cannot address some of it (GPU memory).
  bool bind(queue_view& view, bool device, std::chrono::nanoseconds timeout) const {
    const auto pick = [device](const dma_buffer& b) -> std::byte* {
      return device && b.device_data() != nullptr ? static_cast<std::byte*>(b.device_data()) : b.data();
    };
    std::byte* base = pick(state_);
    std::byte* lists = pick(lists_);
    if (!device && (base == nullptr || lists == nullptr)) return false;
    layout_.bind(view, base);
    view.prp_lists = reinterpret_cast<std::uint64_t*>(lists);
    view.prp_lists_bus = lists_.bus();
    view.prp_list_pages = paged_ ? reinterpret_cast<const std::uint64_t*>(lists + lists_bytes_) : nullptr;
    view.list_entries = list_entries_;
    view.page_shift = page_shift_;
    view.timeout_ns = static_cast<std::uint64_t>(timeout.count());
    return true;
  }

  /// After a controller reset deleted the queues (no submitter or waiter running): the
  /// counters, turns and drain/ring state start again as for a new queue; a record whose
  /// waiter timed out (or that was taken but never submitted) gives its CID back; a record
  /// still pending completes with Command Aborted By Host for whoever waits for it; a record
  /// already done keeps its completion. Statistics (doorbell writes, unexpected completions)
  /// are kept.
  void forget_commands(std::uint32_t entries, const std::string& device) {
    std::vector<std::byte> state(layout_.bytes);
    read(state.data(), state_, state.size(), device);
    auto* c = reinterpret_cast<queue_counters*>(state.data());
    const queue_counters kept = *c;
    *c = queue_counters{};
    c->doorbell_mmio_writes = kept.doorbell_mmio_writes;
    c->doorbell_skipped = kept.doorbell_skipped;
    c->unexpected_completions = kept.unexpected_completions;
    std::memset(state.data() + layout_.turns_at, 0, std::size_t{entries} * 8);
    auto* bits = reinterpret_cast<std::uint32_t*>(state.data() + layout_.bits_at);
    auto* records = reinterpret_cast<completion_record*>(state.data() + layout_.records_at);
    const std::uint16_t aborted = spec::cqe_status::make_status_field(spec::status::command_aborted_by_host, false, false);
    for (std::uint32_t cid = 0; cid + 1 < entries; ++cid) {
      completion_record& r = records[cid];
      switch (static_cast<record_state>(r.state)) {
        case record_state::pending:
        case record_state::delivering:  // a drainer stopped between claiming and finishing: the command is over either way
          r.status = static_cast<std::uint16_t>(spec::status::command_aborted_by_host);
          r.status_field = aborted;
          r.dw0 = r.dw1 = 0;
          r.state = static_cast<std::uint32_t>(record_state::done);  // its waiter gives the CID back
          break;
        case record_state::abandoned:
        case record_state::reserved:
          r.state = static_cast<std::uint32_t>(record_state::free);
          bits[cid / 32] &= ~(std::uint32_t{1} << (cid % 32));
          break;
        default: break;
      }
    }
    write(state_, state.data(), state.size(), device);
  }

  /// The state of CID `cid`'s completion record, through the host's pointer or `copy_out` for
  /// memory only the GPU addresses. Throws `host::error` where neither reaches it.
  [[nodiscard]] record_state state_of(std::uint16_t cid, const std::string& device) const {
    const std::size_t at = layout_.records_at + std::size_t{cid} * sizeof(completion_record);
    if (state_.data() != nullptr) {
      // A drainer may store it meanwhile: one atomic word.
      auto& r = *reinterpret_cast<completion_record*>(state_.data() + at);
      return static_cast<record_state>(bookkeeping_word<std::uint32_t>(r.state).load(cuda::std::memory_order_acquire));
    }
    std::uint32_t state = 0;
    read(&state, state_, sizeof state, device, at + offsetof(completion_record, state));
    return static_cast<record_state>(state);
  }

  /// Whether `forget_commands` and `zero(cq)` can run: the host addresses the bookkeeping and
  /// `cq` or has the copy hooks to reach them.
  [[nodiscard]] bool can_rewrite(const dma_buffer& cq) const noexcept {
    return (state_.data() != nullptr || (copy_in_ && copy_out_)) && (cq.data() != nullptr || copy_in_);
  }

  /// Writes `bytes` of zeros at the start of `target` (a CQ after a reset), through the host's
  /// pointer or `copy_in` for memory only the GPU addresses.
  void zero(const dma_buffer& target, std::size_t bytes, const std::string& device) const {
    const std::vector<std::byte> zeros(bytes);
    write(target, zeros.data(), bytes, device);
  }

 private:
  void read(void* to, const dma_buffer& from, std::size_t bytes, const std::string& device, std::size_t at = 0) const {
    if (from.data() != nullptr) {
      std::memcpy(to, from.data() + at, bytes);
    } else if (copy_out_) {
      copy_out_(to, static_cast<const std::byte*>(from.device_data()) + at, bytes);
    } else {
      throw error("Reset queue bookkeeping", device, "the host can neither address nor copy out the queue's bookkeeping");
    }
  }
  void write(const dma_buffer& to, const void* from, std::size_t bytes, const std::string& device) const {
    if (to.data() != nullptr) {
      std::memcpy(to.data(), from, bytes);
    } else if (copy_in_) {
      copy_in_(to.device_data(), from, bytes);
    } else {
      throw error("Reset queue memory", device, "the host can neither address nor copy into the queue's memory");
    }
  }

  bookkeeping_layout layout_{};
  std::uint64_t lists_bytes_ = 0, table_bytes_ = 0;
  std::uint32_t list_entries_ = 0;
  unsigned page_shift_ = 12;
  bool paged_ = false;
  std::function<void(void* to, const void* from, std::size_t bytes)> copy_in_, copy_out_;
  dma_buffer state_;  // zeroed by the allocator: counters 0, turns 0, CIDs free
  dma_buffer lists_;
};

}  // namespace host
CUNVME_NAMESPACE_END
