// One I/O queue pair: its NVMe queues, its bookkeeping and PRP lists (queue_memory.cuh), and
// its `queue_view`, the one view of a queue pair, which kernels, CPU readers and the host's
// own synchronous I/O (sync_io.cuh: the readers' path on the calling thread) all use.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/controller/controller.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>
#include <cunvme/host/controller/namespace_info.cuh>
#include <cunvme/host/memory/queue_memory.cuh>
#include <cunvme/host/queue/sync_io.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/io/request_plan.cuh>
#include <cunvme/policy/completion.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// One I/O submission/completion queue pair. Host threads use its I/O one at a time (it has
/// no lock, and submits as `slots::exclusive`); kernels and CPU readers may drive the same
/// queues through `view()`, but never while the host's own I/O on it runs: the exclusive
/// submitter's plain counter stores would race with theirs.
///
/// A command that times out keeps its CID until its completion arrives (DESIGN.md rule 4), so
/// a completion the controller never posts holds one CID for the queue pair's life: on a queue
/// of few entries, later commands then fail with "no command identifier", naming the cause.
/// Each queue pair holds one PRP list per CID (about one 4 KiB page per CID up to 2 MiB MDTS).
///
/// Usage: examples/snippets/host.cpp, `read_a_megabyte`.
namespace detail {
/// Whether a Delete I/O SQ/CQ status leaves the queue gone: deleted, or unknown to the
/// controller (Invalid Queue Identifier: a reset that failed before re-creating it).
[[nodiscard]] inline bool queue_deleted(spec::status s) noexcept {
  return s == spec::status::successful_completion || s == spec::status::invalid_queue_identifier;
}
}  // namespace detail

class queue_pair {
 public:
  queue_pair(const queue_pair&) = delete;
  queue_pair& operator=(const queue_pair&) = delete;
  ~queue_pair() {
    std::shared_lock state(ctrl_.state_mutex_);
    ctrl_.detach(this);
    // SQ before CQ: a CQ still in use cannot be deleted (Invalid Queue Deletion, 5.7).
    bool deleted = false;
    try {
      deleted = detail::queue_deleted(ctrl_.admin_command(spec::make_delete_io_sq(qid_), "Delete I/O SQ " + std::to_string(qid_)).status()) &&
                detail::queue_deleted(ctrl_.admin_command(spec::make_delete_io_cq(qid_), "Delete I/O CQ " + std::to_string(qid_)).status());
    } catch (...) {
      // The controller is fatal, not ready or not answering.
    }
    // Queues the controller may still use must not go back to the allocator: stop it first
    // (CC.EN = 0 deletes every queue), and where even that fails keep the memory for good.
    if (!deleted && !ctrl_.halt()) {
      new dma_buffer(std::move(cq_));
      new dma_buffer(std::move(sq_memory_));
      new queue_bookkeeping(std::move(bookkeeping_));
    }
    ctrl_.release_queue_id(qid_);
  }

  [[nodiscard]] std::uint16_t id() const noexcept { return qid_; }
  [[nodiscard]] std::uint32_t entries() const noexcept { return entries_; }
  [[nodiscard]] queue_placement placement() const noexcept { return placement_; }
  /// Bus address of the SQ (in the CMB for `cmb_submission`) and of the CQ.
  [[nodiscard]] std::uint64_t sq_bus() const noexcept { return sq_bus_; }
  [[nodiscard]] std::uint64_t cq_bus() const noexcept { return cq_.bus(); }
  [[nodiscard]] spec::submission_entry* sq() const noexcept { return sq_; }
  [[nodiscard]] spec::completion_entry* cq() const noexcept { return reinterpret_cast<spec::completion_entry*>(cq_.data()); }
  /// The queues, doorbells, shadow slots and bookkeeping, for kernels (GPU-usable addresses
  /// where the memory has them) and CPU readers.
  [[nodiscard]] const queue_view& view() const noexcept { return view_; }

  /// Submits one command and waits (bounded) for its completion; the CID is chosen here.
  /// Returns the completion (DW0, DW1, CID, SQ identifier and the Status field with DNR, More
  /// and CRD; SQHD is not kept),
  /// whatever its status. Throws `host::error` on a timeout, or when the queues or their
  /// bookkeeping are in memory the host cannot address (GPU memory: drive them from the
  /// device side).
  spec::completion_entry execute(spec::submission_entry sqe, const std::string& operation);

  /// Reads `blocks` logical blocks at `lba` of namespace `nsid` into `buffer` at `offset`,
  /// split into commands of at most MDTS (`plan_request`). Returns the first failing status, or
  /// success; LBA Out of Range, with no command sent, for a range past the namespace's end.
  /// Each block takes `namespace_info::block_bytes()` of the buffer: its data, and with
  /// extended LBAs its metadata after it. A namespace with separate metadata needs the
  /// overload with a metadata buffer, and one with protection information is refused
  /// (`require_transferable`); both throw `host::error` before anything is sent.
  [[nodiscard]] spec::status read(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer,
                                  std::size_t offset = 0) {
    return transfer(spec::nvm_opcode::read, nsid, lba, blocks, buffer, offset, nullptr, 0);
  }
  [[nodiscard]] spec::status write(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer,
                                   std::size_t offset = 0) {
    return transfer(spec::nvm_opcode::write, nsid, lba, blocks, buffer, offset, nullptr, 0);
  }
  /// The same on a namespace with separate metadata: `metadata` at `metadata_offset` holds
  /// `metadata_size` bytes per block, dword aligned and contiguous in bus address space (one
  /// MPTR per command).
  [[nodiscard]] spec::status read(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer, std::size_t offset,
                                  const dma_buffer& metadata, std::size_t metadata_offset = 0) {
    return transfer(spec::nvm_opcode::read, nsid, lba, blocks, buffer, offset, &metadata, metadata_offset);
  }
  [[nodiscard]] spec::status write(std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer, std::size_t offset,
                                   const dma_buffer& metadata, std::size_t metadata_offset = 0) {
    return transfer(spec::nvm_opcode::write, nsid, lba, blocks, buffer, offset, &metadata, metadata_offset);
  }
  [[nodiscard]] spec::status flush(std::uint32_t nsid) { return execute(spec::make_flush(nsid), "Flush").status(); }

  /// Runs the timeout policy (`controller::end_timed_out`, recovery.cuh) for this queue pair's
  /// commands whose waiters timed out since it last ran: the host's own I/O does on each
  /// timeout, `io_queue::abort_timed_out` for readers and kernels. Call it while no thread
  /// submits to or waits on this queue pair. Commands it leaves abandoned keep their CIDs until
  /// a late completion or `controller::reset()`.
  timeout_outcome end_timed_out();

 private:
  friend class controller;

  queue_pair(controller& c, std::uint16_t qid, std::uint32_t entries, queue_placement placement, dma_buffer cq, dma_buffer sq_memory,
             spec::submission_entry* sq, std::uint64_t sq_bus, queue_bookkeeping bookkeeping, std::chrono::nanoseconds timeout)
      : ctrl_(c), qid_(qid), entries_(entries), placement_(placement), cq_(std::move(cq)), sq_memory_(std::move(sq_memory)), sq_(sq),
        sq_bus_(sq_bus), bookkeeping_(std::move(bookkeeping)), timeout_(timeout) {
    const unsigned dstrd = ctrl_.cap().dstrd();
    queue_view queues;
    queues.sq_doorbell = reinterpret_cast<std::uint32_t*>(ctrl_.backend().bar() + spec::sq_tail_doorbell_offset(qid_, dstrd));
    queues.cq_doorbell = reinterpret_cast<std::uint32_t*>(ctrl_.backend().bar() + spec::cq_head_doorbell_offset(qid_, dstrd));
    std::tie(queues.sq_shadow, queues.sq_event_index) = ctrl_.shadow_slots(qid_, false);
    std::tie(queues.cq_shadow, queues.cq_event_index) = ctrl_.shadow_slots(qid_, true);
    queues.entries = entries_;
    queues.qid = qid_;
    // Kernels get the GPU-usable address where the memory has one, the host's otherwise.
    view_ = queues;
    view_.sq_doorbell = reinterpret_cast<std::uint32_t*>(ctrl_.device_bar() + spec::sq_tail_doorbell_offset(qid_, dstrd));
    view_.cq_doorbell = reinterpret_cast<std::uint32_t*>(ctrl_.device_bar() + spec::cq_head_doorbell_offset(qid_, dstrd));
    std::tie(view_.sq_shadow, view_.sq_event_index) = ctrl_.shadow_slots(qid_, false, true);
    std::tie(view_.cq_shadow, view_.cq_event_index) = ctrl_.shadow_slots(qid_, true, true);
    view_.cq = reinterpret_cast<spec::completion_entry*>(cq_.device_data() != nullptr ? cq_.device_data() : static_cast<void*>(cq_.data()));
    view_.sq = sq_memory_ && sq_memory_.device_data() != nullptr ? static_cast<spec::submission_entry*>(sq_memory_.device_data())
               : placement_ == queue_placement::cmb_submission ? reinterpret_cast<spec::submission_entry*>(ctrl_.device_cmb(reinterpret_cast<std::byte*>(sq_)))
                                                               : sq_;
    (void)bookkeeping_.bind(view_, true, timeout_);
    // The host's own I/O: the same queues and bookkeeping through host addresses, where it has them.
    host_view_ = queues;
    host_view_.cq = reinterpret_cast<spec::completion_entry*>(cq_.data());
    host_view_.sq = sq_memory_ ? reinterpret_cast<spec::submission_entry*>(sq_memory_.data()) : sq_;
    host_io_ = bookkeeping_.bind(host_view_, false, timeout_) && host_view_.cq != nullptr && host_view_.sq != nullptr &&
               sq_memory_.location() != memory_location::gpu;
    ctrl_.attach(this);
  }

  void require_host_io(const std::string& operation) const {
    if (!host_io_) {
      throw error(operation, ctrl_.name(), "I/O queue " + std::to_string(qid_) + " or its bookkeeping is in GPU memory: drive it from the device side");
    }
  }

  /// Runs `f` with the queue's doorbell policy: shadow where the queue has shadow slots
  /// (Doorbell Buffer Config, a slot inside the buffers' page), MMIO otherwise.
  template <class F>
  decltype(auto) with_doorbell(F&& f) const {
    if (doorbell::shadow::usable(host_view_)) return f(doorbell::shadow{});
    return f(doorbell::mmio{});
  }

  /// `controller::reset` deleted the queues: the bookkeeping forgets their commands
  /// (`queue_bookkeeping::forget_commands`) and the CQ is zeroed, as for a new queue.
  [[nodiscard]] bool can_forget_commands() const noexcept { return bookkeeping_.can_rewrite(cq_); }
  void forget_commands() {
    bookkeeping_.forget_commands(entries_, ctrl_.name());
    bookkeeping_.zero(cq_, std::size_t{entries_} * sizeof(spec::completion_entry), ctrl_.name());
    abandoned_.clear();
  }

  /// Adds what the queue counted since the last call to the controller's totals, late
  /// completions of commands that timed out among the dropped ones (the readers free their
  /// CIDs without counting them), and throws for an outcome the caller gets no status for.
  void settle(const io_result& r, const std::string& operation) {
    queue_counters& c = *host_view_.counters;
    const std::uint64_t mmio = bookkeeping_word<std::uint64_t>(c.doorbell_mmio_writes).load(cuda::std::memory_order_relaxed);
    const std::uint64_t skipped = bookkeeping_word<std::uint64_t>(c.doorbell_skipped).load(cuda::std::memory_order_relaxed);
    const std::uint32_t unexpected = bookkeeping_word<std::uint32_t>(c.unexpected_completions).load(cuda::std::memory_order_relaxed);
    std::uint64_t late = 0;
    std::erase_if(abandoned_, [&](std::uint16_t cid) {
      const bool arrived = state_of(cid) != record_state::abandoned;
      late += arrived ? 1 : 0;
      return arrived;
    });
    ctrl_.count_io(mmio - counted_mmio_, skipped - counted_skipped_, std::uint64_t{unexpected - counted_unexpected_} + late);
    counted_mmio_ = mmio, counted_skipped_ = skipped, counted_unexpected_ = unexpected;
    if (r.ok() || r.error == io_error::nvme_status) return;
    if (r.error == io_error::timeout) {
      // Named before the policy runs: stopping the controller clears CSTS.CFS.
      const std::string why = ctrl_.no_completion_reason(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_));
      throw error(operation, ctrl_.name(), why + timeout_report());
    }
    std::string why = std::string(to_string(r.error)) + " (LBA " + std::to_string(r.lba) + ", " + std::to_string(r.blocks) + " blocks)";
    if (r.error == io_error::no_command_id && !abandoned_.empty()) {
      // Rule 4: a timed-out command keeps its CID until its completion comes, so a lost
      // completion holds one for good: say so, not just that none was free.
      why += ": " + std::to_string(abandoned_.size()) + " command(s) timed out earlier and still hold their CIDs until their completions arrive;"
             " delete this queue pair (or reset the controller) to get them back";
    }
    throw error(operation, ctrl_.name(), why);
  }

  /// `end_timed_out`, as the tail of the error its timeout throws.
  [[nodiscard]] std::string timeout_report();

  [[nodiscard]] record_state state_of(std::uint16_t cid) const { return bookkeeping_.state_of(cid, ctrl_.name()); }

  spec::status transfer(spec::nvm_opcode opcode, std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks, const dma_buffer& buffer,
                        std::size_t offset, const dma_buffer* metadata, std::size_t metadata_offset);

  controller& ctrl_;
  std::uint16_t qid_;
  std::uint32_t entries_;
  queue_placement placement_;
  dma_buffer cq_;
  dma_buffer sq_memory_;  // empty when the SQ is in the CMB
  spec::submission_entry* sq_;
  std::uint64_t sq_bus_;
  queue_bookkeeping bookkeeping_;
  std::chrono::nanoseconds timeout_;
  queue_view view_{};       // for kernels and CPU readers
  queue_view host_view_{};  // the same, through host addresses, for execute/transfer
  bool host_io_ = false;
  std::uint64_t counted_mmio_ = 0, counted_skipped_ = 0;
  std::uint32_t counted_unexpected_ = 0;
  std::vector<std::uint16_t> abandoned_;  // CIDs of commands that timed out, until their completions come
};

inline spec::completion_entry queue_pair::execute(spec::submission_entry sqe, const std::string& operation) {
  const std::string where = operation + " on I/O queue " + std::to_string(qid_);
  require_host_io(operation);
  ctrl_.require_running(where);
  const auto out = with_doorbell([&](auto doorbell) {
    const detail::sync_io<prp::contiguous, decltype(doorbell)> io(host_view_, namespace_view{});
    return io.command([&](std::uint16_t, spec::submission_entry& s, const auto&) {
      s = sqe;
      return io_error::none;
    });
  });
  settle(out.result, where);
  spec::completion_entry cqe{};
  cqe.dw0 = out.record.dw0;
  cqe.dw1 = out.record.dw1;
  cqe.sqid = qid_;
  cqe.cid = out.cid;
  cqe.status_field = out.record.status_field;
  return cqe;
}

inline spec::status queue_pair::transfer(spec::nvm_opcode opcode, std::uint32_t nsid, std::uint64_t lba, std::uint64_t blocks,
                                         const dma_buffer& buffer, std::size_t offset, const dma_buffer* metadata, std::size_t metadata_offset) {
  const std::string operation = opcode == spec::nvm_opcode::read ? "Read" : "Write";
  const namespace_info& ns = ctrl_.namespace_by_id(nsid);
  require_transferable(ns, metadata != nullptr, operation, ctrl_.name());
  // Extended LBAs: the controller moves data and metadata, block_bytes() per block, through
  // the PRPs. The comparisons divide, so no product can wrap.
  const std::uint64_t block = ns.block_bytes();
  if (offset > buffer.size() || blocks > (buffer.size() - offset) / block) {
    throw error(operation, ctrl_.name(),
                std::to_string(blocks) + " blocks of " + std::to_string(block) + " bytes" +
                    (ns.extended_lba ? " (" + std::to_string(ns.lba_size) + " data + " + std::to_string(ns.metadata_size) + " metadata)" : "") +
                    " do not fit the buffer of " + std::to_string(buffer.size()) + " bytes at offset " + std::to_string(offset));
  }
  const std::uint64_t metadata_block = metadata != nullptr ? ns.metadata_size : 0u;
  // MDTS counts metadata interleaved with the data (block_bytes()), not a separate metadata buffer.
  const request_plan plan = plan_request(
      request_geometry::of(block, metadata_block, ns.lba_count, max_blocks_per_command(ctrl_.max_transfer_bytes(), block)), lba, blocks);
  switch (plan.error) {
    case plan_error::none:
    case plan_error::past_capacity: break;  // after the buffer checks: LBA Out of Range, as the controller says it
    case plan_error::zero_blocks: return spec::status::successful_completion;
    case plan_error::lba_wrap:
      throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks at LBA " + std::to_string(lba) + " run past LBA 2^64 - 1");
    case plan_error::byte_count_overflow:  // the buffer checks above bound it: kept for a complete answer
      throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks: " + to_string(plan.error));
    case plan_error::block_exceeds_mdts:
      throw error(operation, ctrl_.name(), "MDTS (" + std::to_string(ctrl_.max_transfer_bytes()) + " bytes) is smaller than one " +
                                               std::to_string(block) + "-byte block");
    case plan_error::unaligned_split:
      // Refused before any command: a later command refused for its start would leave the
      // transfer partly done.
      throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks of " + std::to_string(block) +
                                               " bytes need several commands under MDTS (" + std::to_string(ctrl_.max_transfer_bytes()) +
                                               " bytes), and no split starts every command dword aligned");
  }
  if (metadata != nullptr) {
    if (metadata_offset % 4 != 0) throw error(operation, ctrl_.name(), "the metadata buffer offset is not dword aligned (MPTR)");
    if (metadata_offset > metadata->size() || blocks > (metadata->size() - metadata_offset) / metadata_block) {
      throw error(operation, ctrl_.name(), std::to_string(blocks) + " blocks of " + std::to_string(metadata_block) +
                                               " metadata bytes do not fit the metadata buffer of " + std::to_string(metadata->size()) +
                                               " bytes at offset " + std::to_string(metadata_offset));
    }
    // One MPTR per command addresses one bus range (PSDT 00b).
    if (!metadata->contiguous(metadata_offset, blocks * metadata_block)) {
      throw error(operation, ctrl_.name(), "the metadata buffer's " + std::to_string(blocks * metadata_block) +
                                               " bytes are not contiguous in bus address space (MPTR addresses one range)");
    }
  }
  // Nothing is sent for a range past the namespace's end: no command of it runs.
  if (plan.error == plan_error::past_capacity) return spec::status::lba_out_of_range;
  if (buffer.page_size() == 0 || !std::has_single_bit(buffer.page_size())) {
    throw error(operation, ctrl_.name(), "the buffer's page size " + std::to_string(buffer.page_size()) + " is not a power of two");
  }
  require_host_io(operation);
  namespace_view nv = make_namespace_view(ns, ctrl_.max_transfer_bytes(), ctrl_.name());
  nv.max_blocks = static_cast<std::uint32_t>(plan.per_command);
  const std::string where = operation + " on I/O queue " + std::to_string(qid_);
  ctrl_.require_running(where);
  // A buffer that is one bus range (the emulator's, VFIO's, a huge page) serves any
  // controller page size; one listed page by page only pages at least as large.
  const auto run = [&](const auto& data) {
    using buffer_type = std::decay_t<decltype(data)>;
    return with_doorbell([&](auto doorbell) {
      const detail::sync_io<buffer_type, decltype(doorbell)> io(host_view_, nv);
      if (metadata == nullptr) return io.transfer(opcode, lba, blocks, data, offset);
      // Readers supply no MPTR: the same steps, one command per chunk, with MPTR set.
      for (std::uint64_t i = 0; i < plan.commands(); ++i) {
        const planned_command c = plan.command(i);
        const auto out = io.command([&](std::uint16_t cid, spec::submission_entry& sqe, const auto& self) {
          sqe = spec::make_rw(opcode, nsid, c.slba, c.blocks);
          sqe.mptr = metadata->bus(metadata_offset + c.metadata_offset);
          return self.prps(data, offset + c.byte_offset, std::uint64_t{c.blocks} * block, cid, sqe);
        });
        if (!out.result.ok()) return out.result;
      }
      return io_result{};
    });
  };
  const io_result r = buffer.contiguous(offset, blocks * block)
                          ? run(prp::contiguous{buffer.bus(offset) - offset})
                          : run(prp::page_list{buffer.pages().data(), static_cast<unsigned>(std::countr_zero(buffer.page_size()))});
  settle(r, where);
  return r.ok() ? spec::status::successful_completion : r.status;
}

// ---- controller members that make queue pairs --------------------------------------------

inline void controller::start_shadow_doorbells(std::uint16_t qid) {
  if (!shadow_) return;
  for (const bool is_cq : {false, true}) {
    const auto [shadow, event] = shadow_slots(qid, is_cq);
    if (shadow == nullptr) continue;
    std::atomic_ref<std::uint32_t>(*shadow).store(0, std::memory_order_seq_cst);
    std::atomic_ref<std::uint32_t>(*event).store(0, std::memory_order_seq_cst);
  }
}

inline std::unique_ptr<queue_pair> controller::create_queue_pair(std::uint32_t entries, queue_placement placement) {
  return make_queue_pair(entries, placement, dma_buffer{}, dma_buffer{}, io_queue_memory{}, options_.command_timeout);
}

inline std::unique_ptr<queue_pair> controller::create_queue_pair(std::uint32_t entries, dma_buffer sq, dma_buffer cq) {
  return make_queue_pair(entries, queue_placement::provided, std::move(sq), std::move(cq), io_queue_memory{}, options_.command_timeout);
}

inline std::unique_ptr<queue_pair> controller::make_queue_pair(std::uint32_t entries, queue_placement placement, dma_buffer provided_sq,
                                                              dma_buffer provided_cq, const io_queue_memory& hooks, std::chrono::nanoseconds timeout) {
  std::shared_lock state(state_mutex_);
  if (placement == queue_placement::provided && !provided_sq && !provided_cq) {
    throw error("Create I/O queue pair", name_, "provided placement takes the queues' memory: use the overload with two buffers");
  }
  if (placement == queue_placement::provided && (provided_sq.size() < std::size_t{entries} * sizeof(spec::submission_entry) ||
                                                 provided_cq.size() < std::size_t{entries} * sizeof(spec::completion_entry))) {
    throw error("Create I/O queue pair", name_, "the provided memory is smaller than " + std::to_string(entries) + " entries");
  }
  if (entries < 2 || entries > 65536) {
    throw error("Create I/O queue pair", name_, "a queue holds 2 to 65536 entries, not " + std::to_string(entries));
  }
  const std::uint16_t qid = take_queue_id();
  try {
    dma_buffer cq = placement == queue_placement::provided ? std::move(provided_cq)
                                                           : memory().allocate(std::size_t{entries} * sizeof(spec::completion_entry), page_bytes());
    dma_buffer sq_memory;
    spec::submission_entry* sq = nullptr;
    std::uint64_t sq_bus = 0;
    if (placement == queue_placement::provided) {
      sq_memory = std::move(provided_sq);
      sq = reinterpret_cast<spec::submission_entry*>(sq_memory.data() != nullptr ? sq_memory.data()
                                                                                  : static_cast<std::byte*>(sq_memory.device_data()));
      sq_bus = sq_memory.bus();
    } else if (placement == queue_placement::cmb_submission) {
      const auto [pointer, bus] = take_cmb(std::size_t{entries} * sizeof(spec::submission_entry));
      sq = reinterpret_cast<spec::submission_entry*>(pointer);
      sq_bus = bus;
    } else {
      sq_memory = memory().allocate(std::size_t{entries} * sizeof(spec::submission_entry), page_bytes());
      sq = reinterpret_cast<spec::submission_entry*>(sq_memory.data());
      sq_bus = sq_memory.bus();
    }
    require_contiguous(cq, "Create I/O CQ " + std::to_string(qid), name_);
    if (sq_memory) require_contiguous(sq_memory, "Create I/O SQ " + std::to_string(qid), name_);
    require_page_aligned(cq.bus(), page_bytes(), "Create I/O CQ " + std::to_string(qid), name_);
    require_page_aligned(sq_bus, page_bytes(), "Create I/O SQ " + std::to_string(qid), name_);
    // Before the queues exist: a queue is never created without the bookkeeping its I/O needs.
    queue_bookkeeping bookkeeping(hooks, memory(), entries, page_shift_, max_transfer_bytes(),
                                  "Create PRP lists for I/O queue " + std::to_string(qid), name_);
    start_shadow_doorbells(qid);
    admin(spec::make_create_io_cq(qid, entries, cq.bus()), "Create I/O CQ " + std::to_string(qid));
    try {
      admin(spec::make_create_io_sq(qid, entries, sq_bus, qid), "Create I/O SQ " + std::to_string(qid));
    } catch (const error&) {
      // The error is the SQ's: undoing the CQ must not replace it (after a Create I/O SQ
      // without completion the controller was stopped, and Delete I/O CQ finds it not ready).
      // CC.EN = 0 deletes every queue; a controller that neither deletes the CQ nor stops may
      // still write both queues' memory, which is then kept for good.
      bool cq_gone = false;
      try {
        cq_gone = detail::queue_deleted(admin_command(spec::make_delete_io_cq(qid), "Delete I/O CQ " + std::to_string(qid)).status());
      } catch (const error&) {
      }
      if (!cq_gone && !halt()) {
        new dma_buffer(std::move(cq));
        new dma_buffer(std::move(sq_memory));
      }
      throw;
    }
    return std::unique_ptr<queue_pair>(
        new queue_pair(*this, qid, entries, placement, std::move(cq), std::move(sq_memory), sq, sq_bus, std::move(bookkeeping), timeout));
  } catch (...) {
    release_queue_id(qid);
    throw;
  }
}

}  // namespace host
CUNVME_NAMESPACE_END
