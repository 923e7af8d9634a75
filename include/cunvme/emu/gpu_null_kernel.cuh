// The device side of the on-GPU null controller (gpu_null_controller.cuh): its queues' state,
// the command checks and data movement, CQE posting, and the persistent kernel whose warps serve
// the queues. Commands are checked by the rules the CPU emulator applies (`nvm_checks`), and
// their data walked by the policies' PRP walker (`prp::walk`), shared with the CPU emulator.
// CUDA code: include from .cu files.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/emu/nvm_checks.cuh>
#include <cunvme/emu/timing_model.cuh>
#include <cunvme/policy/prp_walk.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <cuda/atomic>
#include <cuda/std/cstdint>

#include <cooperative_groups.h>
#include <cooperative_groups/scan.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

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

/// Notes the start of the controller's clock (run on its stream before `run`). A template, as
/// every kernel in a header: included by several files of a program, it is defined once.
template <int = 0>
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

/// Executes one I/O command (Read, Write, Flush of namespace 1, the only one); returns its
/// status. The checks are the CPU emulator's own (`nvm_checks`).
__device__ inline spec::status execute(const controller_view& c, const spec::submission_entry& sqe) {
  if (const spec::status s = nvm_checks::check_transfer_fields(sqe); s != spec::status::successful_completion) return s;
  const auto opcode = static_cast<spec::nvm_opcode>(sqe.opcode());
  if (opcode == spec::nvm_opcode::flush) return sqe.nsid == 1 || sqe.nsid == spec::broadcast_nsid ? spec::status::successful_completion : spec::status::invalid_namespace_or_format;
  if (opcode != spec::nvm_opcode::read && opcode != spec::nvm_opcode::write) return spec::status::invalid_command_opcode;
  const nvm_checks::block_range range = nvm_checks::blocks_of(sqe);
  const nvm_checks::namespace_limits ns{sqe.nsid == 1, c.lba_count, cuda::std::uint64_t{1} << c.lba_shift};
  if (const spec::status s = nvm_checks::check_read_write(range, ns, c.max_transfer_bytes); s != spec::status::successful_completion) return s;
  cuda::std::byte* at = c.data == nullptr ? nullptr : c.data + (range.slba << c.lba_shift);
  return move_data(c, sqe, at, range.blocks << c.lba_shift, opcode == spec::nvm_opcode::read);
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
  return nvm_checks::blocks_of(sqe).blocks << c.lba_shift;
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

/// Each warp serves queues warp, warp + warps, … until told to stop. A warp with no queue
/// leaves at once.
template <int = 0>
__global__ void run(controller_view c) {
  const cuda::std::uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const cuda::std::uint32_t warps = gridDim.x * blockDim.x / 32;
  // Warps without a queue used to stay and poll the stop word (host memory) beside the serving
  // ones: 112 of them beside 16 serving warps cut the command rate from 5.7 M/s to 68 K/s on an
  // H200 (bench/RESULTS.md, 2026-11-28).
  if (warp >= c.count) return;
  cuda::std::uint32_t idle = 0;
  for (cuda::std::uint32_t round = 1;; ++round) {
    bool busy = false;
    for (cuda::std::uint32_t q = warp; q < c.count; q += warps) busy |= c.timed ? serve_timed(c, c.queues[q]) : serve(c, c.queues[q]);
    idle = busy ? 0 : idle + 1;
    // The stop word is host memory, a read across PCIe: read it every 1024 passes and after
    // every 64 idle ones, never on a queue's first empty pass (a busy queue has many). One lane
    // reads it so the whole warp leaves together (serve() is warp-collective).
    if ((round & 1023u) == 0 || (idle != 0 && idle % 64 == 0)) {
      cuda::std::uint32_t stop = 0;
      if (threadIdx.x % 32 == 0) stop = cuda::atomic_ref<cuda::std::uint32_t, cuda::thread_scope_system>(*c.stop).load(cuda::std::memory_order_relaxed);
      if (__shfl_sync(0xffffffffu, stop, 0) != 0) return;
    }
    if (idle > 16) __nanosleep(idle < 64 ? 32u : 256u);
  }
}

}  // namespace null_detail

}  // namespace emu
CUNVME_NAMESPACE_END
