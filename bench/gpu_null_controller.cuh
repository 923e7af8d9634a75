// A null NVMe controller that runs on a few SMs of the same GPU, to measure the command path
// (slot reservation, SQE writes, doorbells, CQ drains, completion records) without PCIe or host
// threads in the way. Its queues, doorbells and (optional) namespace live in GPU memory; bus
// addresses are GPU virtual addresses. Each controller warp serves its queues: it reads the SQ
// tail doorbell, fetches up to 32 SQEs at once (one per lane), checks each as a controller
// would (opcode, namespace, LBA range, PRP alignment), optionally copies the data between the
// namespace and the PRP pages, and posts the CQEs with the phase tag (DW3 last, with release).
// With a timing model (`options::timing`, the emulator's `emu::timing_model` and its
// arithmetic, `emu::timing_costs`) it is a modelled drive on the GPU: each command's CQE is held
// until its due time — its latency passed and its share of the drive's IOPS and bandwidth
// reserved on the controller's timeline — so a benchmark measures how many GPU threads hold
// such drives busy, with no host thread in the way (issue 18, P2).
//
// Numbers measured against it are the command path's, not a drive's: label them so.
//
// A benchmark device, not part of the library: it lives beside the benchmarks (the GPU tests
// reach it through bench/ on their include path). It serves commands with the spec's
// accessors and the policies' PRP walker (`prp::walk`, shared with the CPU emulator) and
// lays out queues with `bookkeeping_layout`; it takes `namespace_view` from the io layer only
// to hand its readers the namespace, and `emu::cuda_error` for CUDA failures.
//
// ```
// cunvme::bench::gpu_null_controller ctrl({.queues = 8, .entries = 1024});
// ctrl.start();
// reader r(ctrl.views()[0], ctrl.namespace_view());   // any block_reader over prp::contiguous
// my_kernel<<<…>>>(r, cunvme::prp::contiguous{reinterpret_cast<std::uint64_t>(gpu_buffer)}, …);
// ctrl.stop();
// ```
// CUDA host code: include from .cu files. The controller kernel runs until `stop()`, so a
// kernel launched beside it must not need anything the driver does only on an idle GPU:
// loading its code (lazy module loading) or growing the local-memory reservation (a kernel
// with more local memory per thread than any before it). Either waits for the controller
// kernel to end: a deadlock. Pass your kernels to `prepare_kernels_to_run_beside` before
// `start()` (the same holds for a dedicated poller kernel).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/emu/cuda_memory.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/prp_walk.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <cuda/atomic>
#include <cuda/std/cstdint>

#include <cooperative_groups.h>
#include <cooperative_groups/scan.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace bench {

namespace null_detail {

/// The controller's own state of one queue pair (written only by the warp that serves it).
struct queue_state {
  cuda::std::uint32_t sq_head;
  cuda::std::uint32_t cq_tail;
  cuda::std::uint32_t odd_lap;  ///< 0 while the CQ is on an even pass (phase tag 1: memory starts zeroed)
  cuda::std::uint32_t cq_head;  ///< the last valid CQ head doorbell value (memory starts zeroed: the CQ's start)
  cuda::std::uint32_t pending_head;   ///< timed: the oldest fetched command whose CQE is not posted yet
  cuda::std::uint32_t pending_count;  ///< timed: fetched commands whose CQEs are not posted yet
};

/// A fetched command whose CQE waits for its due time (timed controllers only).
struct pending_completion {
  cuda::std::uint64_t due_ns;  ///< %globaltimer
  cuda::std::uint16_t cid;
  spec::status status;
};

struct queue {
  spec::submission_entry* sq;
  spec::completion_entry* cq;
  cuda::std::uint32_t* sq_tail_doorbell;
  cuda::std::uint32_t* cq_head_doorbell;
  queue_state* state;
  pending_completion* pending;  ///< [entries], a ring from state->pending_head
  cuda::std::uint32_t entries;
  cuda::std::uint16_t qid;
};

/// Everything the controller kernel needs.
struct controller_view {
  queue* queues;
  cuda::std::uint32_t count;
  cuda::std::byte* data;  ///< namespace 1's bytes; nullptr: no data moved
  cuda::std::uint64_t lba_count;
  cuda::std::uint32_t lba_shift;
  cuda::std::uint32_t page_shift;
  cuda::std::uint64_t max_transfer_bytes;
  cuda::std::uint32_t* stop;  ///< mapped host memory: non-zero ends the kernel
  bool timed;                      ///< a timing model holds CQEs until due
  emu::timing_costs timing;
  cuda::std::uint64_t* timeline;   ///< the drive's timeline (ticks), for its IOPS and bandwidth caps
  const cuda::std::uint64_t* epoch;  ///< %globaltimer when the kernel started: the timeline's zero
};

/// The controller's clock: ns since `start()`. %globaltimer counts from the Unix epoch, beyond
/// the 2^60 ns the timeline holds (the emulator's steady clock counts from boot), so the
/// timeline counts from the start instead: clamped, every reservation fell in the past and
/// no IOPS cap held (the GPU test of the cap caught it).
__device__ inline cuda::std::uint64_t clock_ns(const controller_view& c) { return access::now_ns() - *c.epoch; }

/// Notes the start of the controller's clock (run on its stream before `run`).
__global__ void start_clock(cuda::std::uint64_t* epoch, cuda::std::uint64_t* timeline) {
  *epoch = access::now_ns();
  *timeline = 0;
}

/// Copies `bytes` between the namespace at `at` and the pages the PRPs describe, by the
/// emulator's own PRP rules (`prp::walk`, NVMe 2.0 section 4.1.1): list entries and data are
/// reached directly at their bus addresses, which here are GPU virtual addresses.
__device__ inline spec::status move_data(const controller_view& c, const spec::submission_entry& sqe, cuda::std::byte* at, cuda::std::uint64_t bytes,
                                         bool to_host) {
  const auto read_entries = [](cuda::std::uint64_t bus, cuda::std::uint64_t* out, cuda::std::uint64_t count) {
    if ((bus & 7u) != 0) {
      // A list pointer need only be dword aligned: a 64-bit load there would be misaligned.
      const auto* words = reinterpret_cast<const cuda::std::uint32_t*>(bus);
      for (cuda::std::uint64_t i = 0; i < count; ++i) out[i] = words[2 * i] | cuda::std::uint64_t{words[2 * i + 1]} << 32;
    } else {
      const auto* entries = reinterpret_cast<const cuda::std::uint64_t*>(bus);
      for (cuda::std::uint64_t i = 0; i < count; ++i) out[i] = entries[i];
    }
    return true;
  };
  const auto segment = [&](cuda::std::uint64_t address, cuda::std::uint64_t length) {
    if (c.data != nullptr) {
      auto* p = reinterpret_cast<cuda::std::byte*>(address);
      if (to_host) {
        memcpy(p, at, length);
      } else {
        memcpy(at, p, length);
      }
      at += length;
    }
    return spec::status::successful_completion;
  };
  return prp::walk<1>(sqe.prp1, sqe.prp2, bytes, cuda::std::uint64_t{1} << c.page_shift, read_entries, segment);
}

/// Executes one I/O command; returns its status.
__device__ inline spec::status execute(const controller_view& c, const spec::submission_entry& sqe) {
  if (sqe.fuse() != spec::fused_operation::normal || sqe.psdt() != spec::data_transfer_kind::prp) return spec::status::invalid_field_in_command;
  const auto opcode = static_cast<spec::nvm_opcode>(sqe.opcode());
  if (opcode == spec::nvm_opcode::flush) return sqe.nsid == 1 || sqe.nsid == spec::broadcast_nsid ? spec::status::successful_completion : spec::status::invalid_namespace_or_format;
  if (opcode != spec::nvm_opcode::read && opcode != spec::nvm_opcode::write) return spec::status::invalid_command_opcode;
  if (sqe.nsid != 1) return spec::status::invalid_namespace_or_format;
  const cuda::std::uint64_t slba = spec::starting_lba(sqe);
  const cuda::std::uint64_t blocks = spec::rw_fields::nlb::get(sqe.cdw12) + 1u;
  if (slba >= c.lba_count || blocks > c.lba_count - slba) return spec::status::lba_out_of_range;
  const cuda::std::uint64_t bytes = blocks << c.lba_shift;
  if (bytes > c.max_transfer_bytes) return spec::status::invalid_field_in_command;
  cuda::std::byte* at = c.data == nullptr ? nullptr : c.data + (slba << c.lba_shift);
  return move_data(c, sqe, at, bytes, opcode == spec::nvm_opcode::read);
}

/// The CQ head after the host rang `rung`: `rung` when it lies in the queue and frees no
/// more entries than are posted (from `head` up to `tail`), else `head` unchanged.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint32_t cq_head_after_doorbell(cuda::std::uint32_t rung, cuda::std::uint32_t head,
                                                                                   cuda::std::uint32_t tail, cuda::std::uint32_t entries) noexcept {
  if (rung >= entries || head >= entries || tail >= entries) return head;
  const cuda::std::uint32_t posted = (tail + entries - head) % entries;
  const cuda::std::uint32_t advance = (rung + entries - head) % entries;
  return advance <= posted ? rung : head;
}

/// Writes the CQE of command `cid` at CQ position `at` (counted from the pass `odd_lap` began,
/// so it may lie one pass beyond), DW3 last with release: whoever sees the phase sees the
/// entry and the data.
__device__ inline void post(const queue& q, cuda::std::uint32_t at, cuda::std::uint32_t odd_lap, cuda::std::uint32_t sq_head, cuda::std::uint16_t cid,
                            spec::status s) {
  // Phase 1 on even passes through the CQ, 0 on odd ones (NVMe 2.0 section 4.6).
  const bool my_phase = (at >= q.entries) ? odd_lap != 0 : odd_lap == 0;
  auto* words = reinterpret_cast<cuda::std::uint32_t*>(q.cq + at % q.entries);
  words[0] = 0;
  words[1] = 0;
  words[spec::cqe_dword::dw2_offset / 4] = spec::cqe_dword::make_dw2(static_cast<cuda::std::uint16_t>(sq_head), q.qid);
  const cuda::std::uint16_t status = spec::cqe_status::make_status_field(s, my_phase, s != spec::status::successful_completion);
  cuda::atomic_ref<cuda::std::uint32_t, cuda::thread_scope_system>(words[spec::cqe_dword::dw3_offset / 4])
      .store(spec::cqe_dword::make_dw3(cid, status), cuda::std::memory_order_release);
}

/// The bytes a command moves (0 for one that moves none or that `execute` refuses).
__device__ inline cuda::std::uint64_t bytes_of(const controller_view& c, const spec::submission_entry& sqe) {
  const auto opcode = static_cast<spec::nvm_opcode>(sqe.opcode());
  if (opcode != spec::nvm_opcode::read && opcode != spec::nvm_opcode::write) return 0;
  return (cuda::std::uint64_t{spec::rw_fields::nlb::get(sqe.cdw12)} + 1u) << c.lba_shift;
}

/// The doorbells as the warp serving `q` takes them (warp-collective): the SQ tail as rung, and
/// the CQ head the controller may trust.
struct rung_doorbells {
  cuda::std::uint32_t sq_tail;
  cuda::std::uint32_t cq_head;
};
__device__ inline rung_doorbells read_doorbells(const queue& q) {
  constexpr unsigned all_lanes = 0xffffffffu;
  const queue_state& st = *q.state;
  // One lane reads the doorbells and every lane uses its values: lanes reading them on their
  // own could see different values (a submitter rings in between) and disagree on the batch.
  // The acquire load, then the warp barrier, orders every lane's SQE reads after the
  // submitters' writes (they fenced before ringing).
  cuda::std::uint32_t tail = 0, rung_cq_head = 0;
  if (threadIdx.x % 32 == 0) {
    tail = cuda::atomic_ref<cuda::std::uint32_t, cuda::thread_scope_system>(*q.sq_tail_doorbell).load(cuda::std::memory_order_acquire);
    rung_cq_head = cuda::atomic_ref<cuda::std::uint32_t, cuda::thread_scope_system>(*q.cq_head_doorbell).load(cuda::std::memory_order_relaxed);
  }
  tail = __shfl_sync(all_lanes, tail, 0);
  rung_cq_head = __shfl_sync(all_lanes, rung_cq_head, 0);
  __syncwarp();
  // A CQ head outside the queue, or past CQEs not yet posted, is ignored and the last valid
  // one kept (as the CPU emulator's refresh_cq_head does: Invalid Doorbell Write Value):
  // trusting it would let the controller overwrite CQEs the host has not consumed.
  return {tail, cq_head_after_doorbell(rung_cq_head, st.cq_head, st.cq_tail, q.entries)};
}

/// One pass over one queue by a whole warp (every lane calls it). Returns whether it found work.
__device__ inline bool serve(const controller_view& c, const queue& q) {
  const unsigned lane = threadIdx.x % 32;
  queue_state& st = *q.state;
  const cuda::std::uint32_t head = st.sq_head, tail_cq = st.cq_tail, odd_lap = st.odd_lap;
  const rung_doorbells rung = read_doorbells(q);
  const cuda::std::uint32_t tail = rung.sq_tail, cq_head = rung.cq_head;
  if (tail >= q.entries || tail == head) return false;  // an invalid value is ignored, as a controller would
  const cuda::std::uint32_t waiting = (tail + q.entries - head) % q.entries;
  const cuda::std::uint32_t posted = (tail_cq + q.entries - cq_head) % q.entries;
  const cuda::std::uint32_t room = q.entries - 1 - posted;  // never overwrite an unconsumed CQE
  cuda::std::uint32_t n = waiting < room ? waiting : room;
  if (n > 32) n = 32;
  if (n == 0) return false;
  const cuda::std::uint32_t new_head = (head + n) % q.entries;
  if (lane < n) {
    const spec::submission_entry sqe = q.sq[(head + lane) % q.entries];
    post(q, tail_cq + lane, odd_lap, new_head, sqe.cid(), execute(c, sqe));
  }
  __syncwarp();
  if (lane == 0) {
    st.cq_head = cq_head;
    st.sq_head = new_head;
    st.cq_tail = (tail_cq + n) % q.entries;
    if (tail_cq + n >= q.entries) st.odd_lap = odd_lap ^ 1u;
  }
  __syncwarp();
  return true;
}

/// Reserves `cost_ticks` for each coalesced lane on the drive's timeline with one atomic for
/// them all: the lanes' reservations follow each other in lane order from the later of the
/// timeline's free point and `now_ticks`. Returns this lane's reservation end.
__device__ inline cuda::std::uint64_t reserve_together(const controller_view& c, cuda::std::uint64_t now_ticks, cuda::std::uint64_t cost_ticks) {
  namespace cg = cooperative_groups;
  const auto lanes = cg::coalesced_threads();
  const cuda::std::uint64_t upto = cg::inclusive_scan(lanes, cost_ticks);
  const cuda::std::uint64_t total = lanes.shfl(upto, lanes.size() - 1);
  cuda::std::uint64_t start = 0;
  if (lanes.thread_rank() == 0) {
    cuda::atomic_ref<cuda::std::uint64_t, cuda::thread_scope_device> timeline(*c.timeline);
    cuda::std::uint64_t next = timeline.load(cuda::std::memory_order_relaxed);
    cuda::std::uint64_t end = 0;
    // Relaxed: the timeline's value is all that is shared.
    do {
      start = next > now_ticks ? next : now_ticks;
      end = cunvme::detail::saturating_add(start, total);
    } while (!timeline.compare_exchange_weak(next, end, cuda::std::memory_order_relaxed));
  }
  start = lanes.shfl(start, 0);
  return cunvme::detail::saturating_add(start, upto);
}

/// `serve` for a timed controller: first posts, oldest first, the held CQEs that are due; then
/// fetches and executes new commands (the data moves now) and holds their CQEs until due. A
/// CQE waits behind an older one that is not due yet, so none is ever posted early; commands
/// are fetched only while the CQ has room for every CQE held.
__device__ inline bool serve_timed(const controller_view& c, const queue& q) {
  constexpr unsigned all_lanes = 0xffffffffu;
  const unsigned lane = threadIdx.x % 32;
  queue_state& st = *q.state;
  const cuda::std::uint32_t head = st.sq_head, tail_cq = st.cq_tail, odd_lap = st.odd_lap;
  const cuda::std::uint32_t held_first = st.pending_head, held = st.pending_count;
  const rung_doorbells rung = read_doorbells(q);
  const cuda::std::uint32_t tail = rung.sq_tail, cq_head = rung.cq_head;
  // One clock for the warp: every lane judges "due" by the same instant.
  cuda::std::uint64_t now = lane == 0 ? clock_ns(c) : 0;
  now = __shfl_sync(all_lanes, now, 0);
  const cuda::std::uint32_t in_cq = (tail_cq + q.entries - cq_head) % q.entries;
  // 1. The due CQEs: the longest run of the oldest held ones whose time has come.
  cuda::std::uint32_t can_post = held < q.entries - 1 - in_cq ? held : q.entries - 1 - in_cq;
  if (can_post > 32) can_post = 32;
  const pending_completion* mine = lane < can_post ? &q.pending[(held_first + lane) % q.entries] : nullptr;
  const unsigned due = __ballot_sync(all_lanes, mine != nullptr && mine->due_ns <= now);
  const cuda::std::uint32_t posting = due == all_lanes ? 32u : static_cast<cuda::std::uint32_t>(__ffs(~due) - 1);
  if (lane < posting) post(q, tail_cq + lane, odd_lap, head, mine->cid, mine->status);
  __syncwarp();
  const cuda::std::uint32_t new_tail_cq = (tail_cq + posting) % q.entries;
  const cuda::std::uint32_t new_odd_lap = tail_cq + posting >= q.entries ? odd_lap ^ 1u : odd_lap;
  // 2. New commands, as many as the CQ has room for beside every CQE still held.
  cuda::std::uint32_t n = 0;
  if (tail < q.entries && tail != head) {  // an invalid tail is ignored, as a controller would
    const cuda::std::uint32_t waiting = (tail + q.entries - head) % q.entries;
    const cuda::std::uint32_t used = in_cq + held;  // below entries while the state is the controller's own
    const cuda::std::uint32_t room = used < q.entries - 1 ? q.entries - 1 - used : 0;
    n = waiting < room ? waiting : room;
    if (n > 32) n = 32;
  }
  if (lane < n) {
    const spec::submission_entry sqe = q.sq[(head + lane) % q.entries];
    const spec::status s = execute(c, sqe);
    const bool is_write = static_cast<spec::nvm_opcode>(sqe.opcode()) != spec::nvm_opcode::read;
    // A refused command moves nothing and takes no device time: its CQE is due at once.
    const cuda::std::uint64_t due_at =
        s != spec::status::successful_completion
            ? now
            : c.timing.due_ns(now, bytes_of(c, sqe), is_write,
                              [&](cuda::std::uint64_t now_ticks, cuda::std::uint64_t cost_ticks) { return reserve_together(c, now_ticks, cost_ticks); });
    q.pending[(held_first + held + lane) % q.entries] = pending_completion{due_at, sqe.cid(), s};
  }
  __syncwarp();
  if (lane == 0) {
    st.cq_head = cq_head;
    st.sq_head = (head + n) % q.entries;
    st.cq_tail = new_tail_cq;
    st.odd_lap = new_odd_lap;
    st.pending_head = (held_first + posting) % q.entries;
    st.pending_count = held - posting + n;
  }
  __syncwarp();
  return posting != 0 || n != 0;
}

/// Each warp serves queues warp, warp + warps, … until told to stop.
__global__ void run(controller_view c) {
  const cuda::std::uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const cuda::std::uint32_t warps = gridDim.x * blockDim.x / 32;
  cuda::std::uint32_t idle = 0;
  for (cuda::std::uint32_t round = 0;; ++round) {
    bool busy = false;
    for (cuda::std::uint32_t q = warp; q < c.count; q += warps) busy |= c.timed ? serve_timed(c, c.queues[q]) : serve(c, c.queues[q]);
    idle = busy ? 0 : idle + 1;
    // The stop word is host memory: read it now and then, not on every pass; one lane reads
    // it so the whole warp leaves together (serve() is warp-collective).
    if ((round & 1023u) == 0 || idle % 64 == 1) {
      cuda::std::uint32_t stop = 0;
      if (threadIdx.x % 32 == 0) stop = cuda::atomic_ref<cuda::std::uint32_t, cuda::thread_scope_system>(*c.stop).load(cuda::std::memory_order_relaxed);
      if (__shfl_sync(0xffffffffu, stop, 0) != 0) return;
    }
    if (idle > 16) __nanosleep(idle < 64 ? 32u : 256u);
  }
}

}  // namespace null_detail

/// Loads `kernels` and reserves the local memory they need, so that launching them while a
/// persistent kernel runs (this controller, a dedicated poller kernel) does not wait for it
/// (see the top of this file). Keeps the reservation from shrinking back after launches.
template <class... Kernels>
void prepare_kernels_to_run_beside(Kernels... kernels) {
  std::size_t need = 0;
  auto inspect = [&](auto kernel) {
    cudaFuncAttributes a{};
    if (const cudaError_t e = cudaFuncGetAttributes(&a, kernel); e != cudaSuccess) {
      throw emu::cuda_error(e, "prepare_kernels_to_run_beside: reading a kernel's attributes");
    }
    need = std::max(need, a.localSizeBytes);
  };
  (inspect(kernels), ...);
  unsigned flags = 0;
  if (cudaGetDeviceFlags(&flags) == cudaSuccess && (flags & cudaDeviceLmemResizeToMax) == 0) {
    (void)cudaSetDeviceFlags(flags | cudaDeviceLmemResizeToMax);  // refused once the context runs: the limit below still holds
    (void)cudaGetLastError();
  }
  std::size_t stack = 0;
  if (cudaDeviceGetLimit(&stack, cudaLimitStackSize) == cudaSuccess && need + 1024 > stack) {
    if (const cudaError_t e = cudaDeviceSetLimit(cudaLimitStackSize, need + 1024); e != cudaSuccess) {
      throw emu::cuda_error(e, "prepare_kernels_to_run_beside: reserving local memory");
    }
  }
}

/// Owns the queues, namespace and kernel of an on-GPU null controller (see the top of this file).
class gpu_null_controller {
 public:
  struct options {
    std::uint32_t queues = 1;
    std::uint32_t entries = 1024;                       ///< per queue (2..65536)
    std::uint64_t lba_count = std::uint64_t{1} << 21;   ///< namespace size in LBAs
    std::uint32_t lba_shift = 9;
    bool move_data = false;                             ///< keep the namespace in GPU memory and copy it
    std::uint32_t max_transfer_bytes = 1u << 20;        ///< MDTS
    unsigned blocks = 4;                                ///< controller blocks (a few SMs)
    unsigned threads_per_block = 128;
    std::chrono::nanoseconds timeout = std::chrono::seconds(10);  ///< of the readers' waits
    emu::timing_model timing = emu::timing_model::none();       ///< the modelled drive; none: CQEs as fast as it goes
  };

  explicit gpu_null_controller(options o) : o_(o) {
    if (o.queues == 0 || o.entries < 2 || o.entries > 65536) throw std::invalid_argument("gpu_null_controller: queues ≥ 1 and entries 2..65536");
    if (o.threads_per_block % 32 != 0 || o.blocks == 0) throw std::invalid_argument("gpu_null_controller: whole warps and at least one block");
    timing_ = emu::timing_costs::of(o.timing);  // throws std::invalid_argument for a rate that is no number
    const std::uint64_t page = 4096;
    const std::uint32_t cids = o.entries - 1;
    const std::uint32_t list_entries = static_cast<std::uint32_t>(prp::list_bytes_per_command(o.max_transfer_bytes, 12) / 8);
    const bookkeeping_layout book = bookkeeping_layout::of(o.entries);
    const std::size_t sq_bytes = std::size_t{o.entries} * sizeof(spec::submission_entry);
    const std::size_t cq_bytes = std::size_t{o.entries} * sizeof(spec::completion_entry);
    const std::size_t lists_bytes = std::size_t{cids} * list_entries * 8;
    const std::size_t held_bytes = std::size_t{o.entries} * sizeof(null_detail::pending_completion);
    // Per queue, page-aligned pieces: SQ, CQ, PRP lists, bookkeeping, held CQEs, then doorbells + state.
    auto up = [&](std::size_t b) { return (b + page - 1) / page * page; };
    const std::size_t per_queue = up(sq_bytes) + up(cq_bytes) + up(lists_bytes) + up(book.bytes) + up(held_bytes) + page;
    queue_memory_ = allocate(per_queue * o.queues + page, "queues");
    auto* base = reinterpret_cast<std::byte*>(up(reinterpret_cast<std::uintptr_t>(queue_memory_)));
    std::vector<null_detail::queue> queues(o.queues);
    views_.resize(o.queues);
    for (std::uint32_t i = 0; i < o.queues; ++i) {
      std::byte* at = base + per_queue * i;
      queue_view& v = views_[i];
      v.sq = reinterpret_cast<spec::submission_entry*>(at);
      v.cq = reinterpret_cast<spec::completion_entry*>(at + up(sq_bytes));
      std::byte* lists = at + up(sq_bytes) + up(cq_bytes);
      std::byte* bookkeeping = lists + up(lists_bytes);
      auto* held = reinterpret_cast<null_detail::pending_completion*>(bookkeeping + up(book.bytes));
      std::byte* registers = bookkeeping + up(book.bytes) + up(held_bytes);
      v.sq_doorbell = reinterpret_cast<std::uint32_t*>(registers);
      v.cq_doorbell = reinterpret_cast<std::uint32_t*>(registers + 4);
      v.entries = o.entries;
      v.qid = static_cast<std::uint16_t>(i + 1);
      book.bind(v, bookkeeping);
      v.prp_lists = reinterpret_cast<std::uint64_t*>(lists);
      v.prp_lists_bus = reinterpret_cast<std::uint64_t>(lists);
      v.list_entries = list_entries;
      v.page_shift = 12;
      v.timeout_ns = static_cast<std::uint64_t>(o.timeout.count());
      queues[i] = null_detail::queue{v.sq, v.cq, v.sq_doorbell, v.cq_doorbell, reinterpret_cast<null_detail::queue_state*>(registers + 64), held, o.entries,
                                     v.qid};
    }
    queue_table_ = static_cast<null_detail::queue*>(allocate(sizeof(null_detail::queue) * o.queues, "queue table"));
    check(cudaMemcpy(queue_table_, queues.data(), sizeof(null_detail::queue) * o.queues, cudaMemcpyHostToDevice), "copy the queue table");
    if (o.move_data) data_ = static_cast<std::byte*>(allocate(o.lba_count << o.lba_shift, "namespace"));
    timeline_ = static_cast<std::uint64_t*>(allocate(2 * sizeof *timeline_, "timeline"));  // the timeline, then the epoch
    check(cudaHostAlloc(&stop_, sizeof *stop_, cudaHostAllocMapped), "allocate the stop word");
    *stop_ = 0;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create the controller's stream");
  }

  gpu_null_controller(const gpu_null_controller&) = delete;
  gpu_null_controller& operator=(const gpu_null_controller&) = delete;

  ~gpu_null_controller() {
    stop();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaFreeHost(stop_);
    cudaFree(queue_table_);
    cudaFree(data_);
    cudaFree(timeline_);
    cudaFree(queue_memory_);
  }

  /// Launches the controller kernel on its own stream (after `prepare_kernels_to_run_beside`).
  void start() {
    if (running_) return;
    prepare_kernels_to_run_beside(null_detail::run, null_detail::start_clock);
    __atomic_store_n(stop_, 0u, __ATOMIC_RELEASE);
    null_detail::controller_view c{queue_table_, o_.queues, reinterpret_cast<cuda::std::byte*>(data_), o_.lba_count, o_.lba_shift, 12, o_.max_transfer_bytes, stop_,
                                   o_.timing.enabled(), timing_, timeline_, timeline_ + 1};
    null_detail::start_clock<<<1, 1, 0, stream_>>>(timeline_ + 1, timeline_);
    null_detail::run<<<o_.blocks, o_.threads_per_block, 0, stream_>>>(c);
    check(cudaGetLastError(), "launch the controller kernel");
    running_ = true;
  }
  /// Tells the controller kernel to end and waits for it.
  void stop() {
    if (!running_) return;
    __atomic_store_n(stop_, 1u, __ATOMIC_RELEASE);
    running_ = false;
    check(cudaStreamSynchronize(stream_), "end the controller kernel");
  }

  [[nodiscard]] const std::vector<queue_view>& views() const noexcept { return views_; }
  [[nodiscard]] cunvme::namespace_view namespace_view() const noexcept {
    const std::uint64_t blocks = std::uint64_t{o_.max_transfer_bytes} >> o_.lba_shift;
    cunvme::namespace_view v;  // no metadata: the null controller's blocks are data only
    v.nsid = 1;
    v.lba_shift = o_.lba_shift;
    v.max_blocks = static_cast<std::uint32_t>(blocks < 65536 ? blocks : 65536);
    v.lba_count = o_.lba_count;
    return v;
  }
  /// Namespace 1's bytes in GPU memory (nullptr unless `move_data`): fill it before reading.
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] const options& config() const noexcept { return o_; }

 private:
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw emu::cuda_error(e, std::string("gpu_null_controller: ") + what);
  }
  static void* allocate(std::size_t bytes, const char* what) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), what);
    check(cudaMemset(p, 0, bytes), what);
    return p;
  }

  options o_;
  void* queue_memory_ = nullptr;
  null_detail::queue* queue_table_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t* timeline_ = nullptr;  // the modelled drive's timeline: its reservations' end, in ticks
  emu::timing_costs timing_{};
  std::uint32_t* stop_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool running_ = false;
  std::vector<queue_view> views_;
};

}  // namespace bench
CUNVME_NAMESPACE_END
