// The device-side view of one I/O queue pair: where its SQ, CQ, doorbells and shadow slots
// are, and the shared bookkeeping every submitter and completer of the pair works on (tickets,
// per-slot turns, command-identifier pool, per-command completion records, per-command PRP
// lists). A `queue_view` is trivially copyable and passed to kernels (or CPU threads) by
// value; the memory it points to is set up once by the host (`host::io_queue`).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cuda/atomic>
#include <cuda/std/bit>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN

/// An atomic view of queue bookkeeping (counters, turns, CID words, completion records).
/// Bookkeeping is shared only by the threads that submit to and complete on one queue pair:
/// the threads of one GPU, or CPU threads, never both at once and never two GPUs (give each
/// GPU queue pairs of its own). So device scope is enough, and it matters: every seq_cst or
/// release operation is a fence, 340 ns at device scope and 700 ns at system scope on the
/// H100 (bench/RESULTS.md), and a QD1 submit went from 10.3 to 6.8 µs when bookkeeping left
/// system scope.
/// The controller and the host never read bookkeeping while kernels run; what they share with
/// the GPU goes through `system_word` and the access layer. On the host the scope is moot.
template <class T>
using bookkeeping_word = cuda::atomic_ref<T, cuda::thread_scope_device>;

/// An atomic view of a word an agent outside the GPU reads or writes while kernels run: CQ
/// entries and shadow doorbells/EventIdx (the controller), a poller's stop flag (the host).
/// System scope: a completion's data and a doorbell's SQE are ordered against the controller
/// by these accesses, and device-scope bookkeeping orders everything else after them
/// (PTX fences and release/acquire are cumulative).
template <class T>
using system_word = cuda::atomic_ref<T, cuda::thread_scope_system>;

/// The life of one command identifier's record.
enum class record_state : cuda::std::uint32_t {
  free = 0,       ///< the CID is not in use
  pending = 1,    ///< submitted, no completion yet
  done = 2,       ///< a completion arrived; `status`/`dw0` are valid until the waiter frees the CID
  abandoned = 3,  ///< its waiter timed out: the CID stays reserved until a completion arrives, so a late
                  ///< completion can never be taken for a newer command's
  reserved = 4,   ///< taken, its command not submitted yet: a completion naming it is foreign (DESIGN.md rule 4)
  delivering = 5, ///< a drainer claimed it for a completion and is writing the fields; `done` follows at once
};

/// Where a completion for one CID lands (drained from the CQ by whoever drains).
struct completion_record {
  cuda::std::uint32_t state;   ///< a record_state, written with release by the drainer
  cuda::std::uint16_t status;  ///< spec::status of the CQE
  cuda::std::uint16_t status_field;  ///< the CQE's Phase Tag and Status field as posted: DNR, More and CRD for whoever needs them
  cuda::std::uint32_t dw0;
  cuda::std::uint32_t dw1;
};
static_assert(sizeof(completion_record) == 16);
static_assert(offsetof(completion_record, state) == 0);
static_assert(offsetof(completion_record, status) == 4);
static_assert(offsetof(completion_record, status_field) == 6);
static_assert(offsetof(completion_record, dw0) == 8);
static_assert(offsetof(completion_record, dw1) == 12);

/// Counters shared by every user of a queue pair. Tickets and heads are 64-bit counts that
/// never wrap in practice, so `count % entries` is the slot for any queue size and two counts
/// subtract without modular care. Each group written by different parties sits on its own
/// 128-byte line (no false sharing between submitters and the drainer).
struct queue_counters {
  alignas(128) cuda::std::uint64_t sq_reserved;  ///< SQ tickets handed out
  alignas(128) cuda::std::uint64_t sq_published; ///< SQEs written and published (coalescing doorbells)
  alignas(128) cuda::std::uint64_t sq_rung;      ///< the SQ tail doorbell was written up to here
  cuda::std::uint32_t ring_lock;                 ///< held while writing the SQ tail doorbell (its values must not go backwards)
  cuda::std::uint32_t sq_doorbell_rung;          ///< non-zero once the SQ tail doorbell was written (by its ringer only)
  alignas(128) cuda::std::uint64_t sq_head;      ///< SQ entries the controller has fetched, from CQE.SQHD
  alignas(128) cuda::std::uint64_t cq_head;      ///< CQ entries consumed
  cuda::std::uint32_t drain_lock;                ///< held while draining the CQ
  cuda::std::uint32_t unexpected_completions;    ///< CQEs naming a CID with no command in flight, or another SQ (counted, dropped)
  cuda::std::uint32_t cq_doorbell_rung;          ///< non-zero once the CQ head doorbell was written (by the drainer only)
  cuda::std::uint64_t doorbell_mmio_writes;      ///< SQ/CQ doorbell stores that went to MMIO
  cuda::std::uint64_t doorbell_skipped;          ///< shadow-doorbell updates EventIdx let skip
};
static_assert(sizeof(queue_counters) == 5 * 128);
static_assert(offsetof(queue_counters, sq_published) == 128);
static_assert(offsetof(queue_counters, sq_rung) == 256);
static_assert(offsetof(queue_counters, sq_head) == 384);
static_assert(offsetof(queue_counters, cq_head) == 512);

/// Everything the device side needs to drive one queue pair.
struct queue_view {
  // The NVMe queues and their doorbells (GPU-usable addresses where the memory has them).
  spec::submission_entry* sq = nullptr;
  spec::completion_entry* cq = nullptr;
  cuda::std::uint32_t* sq_doorbell = nullptr;   ///< in BAR0
  cuda::std::uint32_t* cq_doorbell = nullptr;
  cuda::std::uint32_t* sq_shadow = nullptr;     ///< Doorbell Buffer Config slots; nullptr without them
  cuda::std::uint32_t* cq_shadow = nullptr;
  cuda::std::uint32_t* sq_event_index = nullptr;
  cuda::std::uint32_t* cq_event_index = nullptr;
  cuda::std::uint32_t entries = 0;              ///< of the SQ and of the CQ (the same)
  cuda::std::uint16_t qid = 0;

  // Bookkeeping (host::io_queue lays it out).
  queue_counters* counters = nullptr;
  cuda::std::uint64_t* turns = nullptr;         ///< [entries]: ticket + 1 once that ticket's SQE is written
  cuda::std::uint32_t* cid_bits = nullptr;      ///< [cid_words()]: bit set = CID in use
  completion_record* records = nullptr;         ///< [cids()]
  cuda::std::uint64_t* prp_lists = nullptr;     ///< [cids() × list_entries], one page-aligned list per CID
  cuda::std::uint64_t prp_lists_bus = 0;        ///< bus address of prp_lists[0]
  /// The bus address of each controller page of prp_lists, where they are contiguous only page
  /// by page (pinned 4 KiB pages without an IOMMU); nullptr: prp_lists is one bus range.
  const cuda::std::uint64_t* prp_list_pages = nullptr;
  cuda::std::uint32_t list_entries = 0;         ///< entries per CID's list (a whole number of controller pages)
  cuda::std::uint32_t page_shift = 12;          ///< controller memory page size (CC.MPS + 12)
  cuda::std::uint64_t timeout_ns = 10'000'000'000ull;  ///< bound of every wait on this queue

  /// Commands that may be outstanding at once: one less than the queue size, so the CQ (as
  /// large as the SQ) can never be asked to hold more completions than it has room for, and
  /// the SQ never looks full to a submitter that holds a CID (see slots.cuh).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t cids() const noexcept { return entries - 1; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t cid_words() const noexcept { return (cids() + 31) / 32; }
  /// The queue slot of a ticket or head count. A 64-bit division costs dozens of GPU
  /// instructions; the usual power-of-two queue takes a mask instead.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t slot(cuda::std::uint64_t count) const noexcept {
    return static_cast<cuda::std::uint32_t>((entries & (entries - 1)) == 0 ? count & (entries - 1) : count % entries);
  }
  /// Which pass through the queue a count is on (the CQ's phase tag flips with each).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t lap(cuda::std::uint64_t count) const noexcept {
    return (entries & (entries - 1)) == 0 ? count >> cuda::std::countr_zero(entries) : count / entries;
  }
};
static_assert(cuda::std::is_trivially_copyable_v<queue_view>);

/// Where a queue's bookkeeping lies in one zeroed allocation: counters, then the turns, the CID
/// bitmap and the records (16-byte aligned). Shared by every kind of queue setup (host
/// io_queue, the on-GPU null controller) so they cannot drift apart.
struct bookkeeping_layout {
  cuda::std::size_t turns_at = 0, bits_at = 0, records_at = 0, bytes = 0;

  [[nodiscard]] static constexpr bookkeeping_layout of(cuda::std::uint32_t entries) noexcept {
    bookkeeping_layout l;
    const cuda::std::uint32_t cids = entries - 1;
    l.turns_at = sizeof(queue_counters);
    l.bits_at = l.turns_at + cuda::std::size_t{entries} * 8;
    l.records_at = (l.bits_at + cuda::std::size_t{(cids + 31) / 32} * 4 + 15) / 16 * 16;
    l.bytes = l.records_at + cuda::std::size_t{cids} * sizeof(completion_record);
    return l;
  }
  /// Points `view`'s bookkeeping into `base` (`bytes` of zeroed memory).
  void bind(queue_view& view, void* memory) const noexcept {
    auto* base = static_cast<unsigned char*>(memory);
    view.counters = reinterpret_cast<queue_counters*>(base);
    view.turns = reinterpret_cast<cuda::std::uint64_t*>(base + turns_at);
    view.cid_bits = reinterpret_cast<cuda::std::uint32_t*>(base + bits_at);
    view.records = reinterpret_cast<completion_record*>(base + records_at);
  }
};

CUNVME_NAMESPACE_END
