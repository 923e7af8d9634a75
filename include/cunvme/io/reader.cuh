// Block readers and writers: the policies of a queue, a PRP builder and a doorbell composed
// into one straight-line I/O path, run alike by GPU threads and CPU threads.
//
// Usage: examples/snippets/kernels.cu, `read_per_thread`; on CPU threads, host.cpp `read_with_a_reader`.
// Forms: per thread (`read(lba, n, dst, offset)`), per group (`read(group, …)`: a warp, a
// thread block or `host_group` members call together with the same arguments and split the
// request between them), and asynchronous (`submit_read` → `io_handle`, then `test`/`wait`), so one
// thread keeps many commands in flight. Requests are checked and split by the one planner
// (`plan_request`, io/request_plan.cuh) into commands of at most `namespace_view::max_blocks`.
#pragma once

#include <cunvme/policy/cid_pool.cuh>
#include <cunvme/policy/completion.cuh>
#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/group.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/io/request_plan.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/policy/slots.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cuda/atomic>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

CUNVME_NAMESPACE_BEGIN

/// One command in flight from the asynchronous form.
struct io_handle {
  enum class phase : cuda::std::uint8_t { empty, in_flight, finished };
  cuda::std::uint64_t ticket = 0;
  cuda::std::uint64_t lba = 0;
  cuda::std::uint32_t blocks = 0;
  cuda::std::uint16_t cid = 0;
  phase state = phase::empty;
  io_result result{};
};

namespace detail {

/// The I/O path shared by readers and writers.
template <queue_policy Queue, prp::buffer Prp, doorbell::policy Doorbell>
class block_io {
 public:
  using slots = typename Queue::slots;
  using completion = typename Queue::completion;
  using buffer = Prp;

  CUNVME_HOST_DEVICE block_io(const queue_view& q, const namespace_view& ns) noexcept : q_(q), ns_(ns) {}

  [[nodiscard]] CUNVME_HOST_DEVICE const queue_view& queue() const noexcept { return q_; }
  [[nodiscard]] CUNVME_HOST_DEVICE const namespace_view& ns() const noexcept { return ns_; }

 protected:
  /// Reads or writes `blocks` blocks at `lba` to/from bytes `offset`… of `data`, in the
  /// commands `plan_request` makes of it (at most max_blocks each). Collective over `g`: every
  /// member passes the same arguments; chunk i goes to member i % size, one command per member
  /// per round.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result transfer(Group& g, spec::nvm_opcode opcode, cuda::std::uint64_t lba, cuda::std::uint64_t blocks,
                                                      const Prp& data, cuda::std::uint64_t offset) const {
    const request_plan plan = plan_request(ns_, lba, blocks);
    if (const io_result bad = check(plan, data, offset); !bad) return bad;
    const cuda::std::uint64_t chunks = plan.commands();
    io_result mine{};
    cid_wait waiting;
    for (cuda::std::uint64_t next = g.rank(); g.any(next < chunks);) {
      const bool want = next < chunks;
      const planned_command c = want ? plan.command(next) : planned_command{};
      io_handle h = issue(g, want, [&](cuda::std::uint16_t cid, spec::submission_entry& sqe) {
        sqe = spec::make_rw(opcode, ns_.nsid, c.slba, c.blocks);
        return build_prps(data, offset + c.byte_offset, cuda::std::uint64_t{c.blocks} * ns_.block_bytes(), cid, sqe);
      });
      if (!want) continue;
      if (h.state == io_handle::phase::in_flight) {
        waiting.reset();
        wait_for(h);
      } else if (h.result.ok() && !waiting.again(*this)) {  // no CID free this round
        h.result = io_result::failure(io_error::no_command_id, c.slba, c.blocks);
      }
      if (!h.result.ok()) {
        mine = h.result;
        next = chunks;  // a member stops at its first failure; the others finish theirs
      } else if (h.state == io_handle::phase::finished) {
        next += g.size();
      }
    }
    return first_failure(g, mine);
  }

  /// One command without data (Flush), issued by the group's first member.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result no_data(Group& g, const spec::submission_entry& command) const {
    if (!Doorbell::usable(q_)) return io_result::failure(io_error::doorbell_unusable, 0, 0);
    io_result mine{};
    cid_wait waiting;
    for (bool pending = g.rank() == 0; g.any(pending);) {
      io_handle h = issue(g, pending, [&](cuda::std::uint16_t, spec::submission_entry& sqe) {
        sqe = command;
        return io_error::none;
      });
      if (!pending) continue;
      if (h.state == io_handle::phase::in_flight) {
        wait_for(h);
        pending = false;
      } else if (h.result.ok() && !waiting.again(*this)) {
        h.result = io_result::failure(io_error::no_command_id, 0, 0);
      }
      if (!h.result.ok()) {
        mine = h.result;
        pending = false;
      }
    }
    return first_failure(g, mine);
  }

  /// A member that found no free CID: drains (or lets the poller drain), backs off, and
  /// gives up once the queue's timeout has passed since its first miss.
  struct cid_wait {
    cuda::std::uint64_t deadline = 0;
    cuda::std::uint32_t rounds = 0;
    CUNVME_HOST_DEVICE void reset() noexcept { deadline = 0, rounds = 0; }
    [[nodiscard]] CUNVME_HOST_DEVICE bool again(const block_io& io) noexcept {
      const cuda::std::uint64_t now = access::now_ns();
      if (deadline == 0) deadline = detail::saturating_add(now, io.q_.timeout_ns);
      if (now > deadline) return false;
      completion::template progress<Doorbell>(io.q_);
      access::back_off(++rounds);
      return true;
    }
  };

  /// Submits one command of at most max_blocks without waiting for it. When every CID is in
  /// flight it returns at once with `no_command_id`: finish a handle (`test`/`wait`) and submit
  /// again — the CIDs may all be held by this thread's own handles.
  [[nodiscard]] CUNVME_HOST_DEVICE io_handle submit(spec::nvm_opcode opcode, cuda::std::uint64_t lba, cuda::std::uint32_t blocks, const Prp& data,
                                                    cuda::std::uint64_t offset) const {
    io_handle h;
    const request_plan plan = plan_request(ns_, lba, blocks);
    if (const io_result bad = check(plan, data, offset); !bad) {
      h.result = bad;
      h.state = io_handle::phase::finished;
      return h;
    }
    if (plan.commands() > 1) {
      h.result = io_result::failure(io_error::invalid_request, lba, blocks);
      h.state = io_handle::phase::finished;
      return h;
    }
    // One drain between two tries: CIDs whose completions have arrived are taken back by
    // their waiters. No longer wait: the CIDs may all be this thread's own handles.
    single_thread self;
    for (int attempt = 0; attempt < 2; ++attempt) {
      h = issue(self, true, [&](cuda::std::uint16_t cid, spec::submission_entry& sqe) {
        sqe = spec::make_rw(opcode, ns_.nsid, lba, blocks);
        return build_prps(data, offset, cuda::std::uint64_t{blocks} * ns_.block_bytes(), cid, sqe);
      });
      if (h.state != io_handle::phase::empty || !h.result.ok()) break;
      if (attempt == 0) completion::template progress<Doorbell>(q_);
      else h.result = io_result::failure(io_error::no_command_id, lba, blocks);
    }
    if (!h.result.ok()) h.state = io_handle::phase::finished;
    return h;
  }

 public:
  /// Whether the command of `h` has finished (then `h.result` holds its outcome). Never
  /// blocks; drains completions (cooperative policy) or rings an unrung SQE on the way.
  [[nodiscard]] CUNVME_HOST_DEVICE bool test(io_handle& h) const noexcept {
    if (h.state != io_handle::phase::in_flight) return true;
    if (take_record(h)) return true;
    slots::template ensure_rung<Doorbell>(q_, h.ticket);
    completion::template progress<Doorbell>(q_);
    return take_record(h);
  }

  /// Waits (at most the queue's timeout) for the command of `h`; returns its outcome. On a
  /// timeout the command is abandoned: its CID stays reserved until a completion comes.
  CUNVME_HOST_DEVICE io_result wait(io_handle& h) const noexcept {
    wait_for(h);
    return h.result;
  }

 protected:
  /// Whether `plan` can be sent through this queue with this doorbell policy: the first reason
  /// it cannot, or success.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result check(const request_plan& plan, const Prp& data, cuda::std::uint64_t offset) const noexcept {
    if (!Doorbell::usable(q_)) return io_result::failure(io_error::doorbell_unusable, plan.lba, 0);
    if (!ns_.transferable()) return io_result::failure(io_error::metadata_unsupported, plan.lba, 0);
    if (plan.error != plan_error::past_capacity) return to_io_result(plan);
    // Nothing is sent for a range past the end. What the commands up to the one crossing it
    // would have met here, before any controller saw them, still comes first, as when they
    // were sent: an unaligned data pointer, a command too large for the queue's PRP lists.
    for (cuda::std::uint64_t i = 0;; ++i) {
      const planned_command c = plan.command(i);
      const cuda::std::uint64_t prp1 = data.bus(offset + c.byte_offset);
      if (!spec::prp_dword_aligned(prp1)) return io_result::failure(io_error::unaligned_buffer, c.slba, c.blocks);
      if (prp::list_entries_needed(prp1, cuda::std::uint64_t{c.blocks} * ns_.block_bytes(), q_.page_shift) > q_.list_entries) {
        return io_result::failure(io_error::prp_list_too_small, c.slba, c.blocks);
      }
      if (c.slba == plan.fail_lba) return to_io_result(plan);
    }
  }

  /// PRP1/PRP2 (and the CID's PRP list) for `bytes` of `data` at `offset`.
  [[nodiscard]] CUNVME_HOST_DEVICE io_error build_prps(const Prp& data, cuda::std::uint64_t offset, cuda::std::uint64_t bytes, cuda::std::uint16_t cid,
                                                       spec::submission_entry& sqe) const noexcept {
    const cuda::std::uint64_t first = cuda::std::uint64_t{cid} * q_.list_entries;
    prp::list_memory list{q_.prp_lists + first, q_.prp_lists_bus + first * 8, q_.list_entries};
    if (q_.prp_list_pages != nullptr) {
      // Each CID's list is whole controller pages: its first page is an index into the table.
      list.pages = q_.prp_list_pages + ((first * 8) >> q_.page_shift);
      list.bus = list.pages[0];
    }
    prp::prp_entries e;
    switch (prp::build(data, offset, bytes, q_.page_shift, list, e)) {
      case prp::build_result::ok: break;
      case prp::build_result::unaligned_start: return io_error::unaligned_buffer;
      case prp::build_result::pages_misaligned: return io_error::buffer_pages_misaligned;
      case prp::build_result::list_too_small: return io_error::prp_list_too_small;
      // A queue's lists are page aligned and its page size valid; an offset + length past
      // 2^64 is a bad request.
      case prp::build_result::list_misaligned:
      case prp::build_result::invalid_page_size:
      case prp::build_result::range_overflow: return io_error::invalid_request;
    }
    sqe.prp1 = e.prp1;
    sqe.prp2 = e.prp2;
    return io_error::none;
  }

  /// Collective: members with `want` take a CID (without waiting), let `prepare` fill the SQE
  /// (returning an io_error for a bad buffer), and submit together. Returns `in_flight` with
  /// the CID and ticket, `empty` when no CID was free (or `want` was false), or a failure.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group, class Prepare>
  [[nodiscard]] CUNVME_HOST_DEVICE io_handle issue(Group& g, bool want, Prepare&& prepare) const {
    io_handle h;
    spec::submission_entry sqe{};
    // Reserved, not in flight, until its SQE is written: a completion drained meanwhile (by
    // this thread's own progress while it waits for a slot) naming this CID is not ours.
    bool go = want && cid_pool::try_reserve(q_, hint(g), h.cid);
    if (go) {
      if (const io_error e = prepare(h.cid, sqe); e != io_error::none) {
        cid_pool::give_back(q_, h.cid);
        h.result = io_result::failure(e, spec::starting_lba(sqe), spec::rw_fields::nlb::get(sqe.cdw12) + 1u);
        go = false;
      }
    }
    const cuda::std::uint64_t deadline = detail::saturating_add(access::now_ns(), q_.timeout_ns);
    auto progress = [this] { completion::template progress<Doorbell>(q_); };
    const bool room = slots::reserve(q_, g, go ? 1u : 0u, deadline, progress, h.ticket);
    if (go && !room) {
      cid_pool::give_back(q_, h.cid);
      h.result = io_result::failure(io_error::no_submission_slot, spec::starting_lba(sqe), spec::rw_fields::nlb::get(sqe.cdw12) + 1u);
      go = false;
    }
    if (go) {
      cid_pool::mark_in_flight(q_, h.cid);
      sqe.set_cid(h.cid);
      q_.sq[q_.slot(h.ticket)] = sqe;
      h.lba = spec::starting_lba(sqe);
      h.blocks = spec::rw_fields::nlb::get(sqe.cdw12) + 1u;
    }
    slots::template commit<Doorbell>(q_, g, h.ticket, go ? 1u : 0u);
    if (go) h.state = io_handle::phase::in_flight;
    return h;
  }

  /// Takes the completion of `h` if it has come: fills `h.result` and gives the CID back.
  [[nodiscard]] CUNVME_HOST_DEVICE bool take_record(io_handle& h) const noexcept {
    completion_record& r = q_.records[h.cid];
    if (bookkeeping_word<cuda::std::uint32_t>(r.state).load(cuda::std::memory_order_acquire) != static_cast<cuda::std::uint32_t>(record_state::done)) return false;
    const auto status = static_cast<spec::status>(r.status);
    h.result = status == spec::status::successful_completion ? io_result{} : io_result::failure(io_error::nvme_status, h.lba, h.blocks, status);
    cid_pool::give_back(q_, h.cid);
    h.state = io_handle::phase::finished;
    return true;
  }

  CUNVME_HOST_DEVICE void wait_for(io_handle& h) const noexcept {
    const cuda::std::uint64_t deadline = detail::saturating_add(access::now_ns(), q_.timeout_ns);
    for (cuda::std::uint32_t round = 0; !test(h); ++round) {
      if (access::now_ns() > deadline) {
        cuda::std::uint32_t expected = static_cast<cuda::std::uint32_t>(record_state::pending);
        const bool abandoned = bookkeeping_word<cuda::std::uint32_t>(q_.records[h.cid].state)
                                   .compare_exchange_strong(expected, static_cast<cuda::std::uint32_t>(record_state::abandoned), cuda::std::memory_order_acq_rel);
        // The completion came just now, or a drainer is writing it into the record: take it.
        if (!abandoned && (expected == static_cast<cuda::std::uint32_t>(record_state::done) ||
                           expected == static_cast<cuda::std::uint32_t>(record_state::delivering))) {
          continue;
        }
        // Abandoned (its late completion frees the CID), or neither pending nor done: the record
        // is no longer this command's, waiting on could last forever, and the CID is not ours
        // to give back.
        h.result = io_result::failure(io_error::timeout, h.lba, h.blocks);
        h.state = io_handle::phase::finished;
        return;
      }
      access::back_off(round);
    }
  }

  /// The group's failure with the lowest LBA, or success; the same for every member.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE static io_result first_failure(Group& g, const io_result& mine) {
    const cuda::std::uint64_t none = ~cuda::std::uint64_t{0};
    const cuda::std::uint64_t lowest = g.min(mine.ok() ? none : mine.lba);
    if (lowest == none) return io_result{};
    const cuda::std::uint64_t owner = g.min(!mine.ok() && mine.lba == lowest ? g.rank() : none);
    const cuda::std::uint64_t packed = g.broadcast(cuda::std::uint64_t{static_cast<cuda::std::uint8_t>(mine.error)} << 48 |
                                                       cuda::std::uint64_t{static_cast<cuda::std::uint16_t>(mine.status)} << 32 | mine.blocks,
                                                   static_cast<cuda::std::uint32_t>(owner));
    return io_result{static_cast<io_error>(packed >> 48), static_cast<spec::status>((packed >> 32) & 0xffffu),
                     static_cast<cuda::std::uint32_t>(packed), lowest};
  }

  /// Where a member starts looking for a free CID: spread so members do not collide.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE static cuda::std::uint32_t hint(Group& g) noexcept {
    return g.rank() * 7u + static_cast<cuda::std::uint32_t>(access::now_ns() >> 10);
  }

  queue_view q_;
  namespace_view ns_;
};

}  // namespace detail

/// Reads blocks into a buffer described by `Prp`.
/// @tparam Queue    `queue_policies<Slots, Completion>` (any `queue_policy`)
/// @tparam Prp      `prp::contiguous` or `prp::page_list` (the buffer's bus layout)
/// @tparam Doorbell `doorbell::mmio`, `doorbell::shadow` or `doorbell::coalescing<…>`
template <queue_policy Queue, prp::buffer Prp, doorbell::policy Doorbell>
class block_reader : public detail::block_io<Queue, Prp, Doorbell> {
  using base = detail::block_io<Queue, Prp, Doorbell>;

 public:
  using base::base;

  /// Per thread: reads `blocks` blocks at `lba` into bytes `offset`… of `dst`.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result read(cuda::std::uint64_t lba, cuda::std::uint64_t blocks, const Prp& dst, cuda::std::uint64_t offset) const {
    single_thread self;
    return this->transfer(self, spec::nvm_opcode::read, lba, blocks, dst, offset);
  }
  /// Per group (warp, thread block, host_group member): all members pass the same request.
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result read(Group& g, cuda::std::uint64_t lba, cuda::std::uint64_t blocks, const Prp& dst,
                                                  cuda::std::uint64_t offset) const {
    return this->transfer(g, spec::nvm_opcode::read, lba, blocks, dst, offset);
  }
  /// Asynchronous: one command of at most max_blocks; finish it with `test` or `wait`. When
  /// every CID is in flight it returns at once, finished, with `io_error::no_command_id` and
  /// nothing submitted: the caller must retry — after finishing one of its own handles
  /// (`test`/`wait`), since they may hold all the CIDs — or the read never happens.
  [[nodiscard]] CUNVME_HOST_DEVICE io_handle submit_read(cuda::std::uint64_t lba, cuda::std::uint32_t blocks, const Prp& dst,
                                                         cuda::std::uint64_t offset) const {
    return this->submit(spec::nvm_opcode::read, lba, blocks, dst, offset);
  }
};

/// Writes blocks from a buffer described by `Prp`, and flushes. Template parameters as for
/// `block_reader`.
template <queue_policy Queue, prp::buffer Prp, doorbell::policy Doorbell>
class block_writer : public detail::block_io<Queue, Prp, Doorbell> {
  using base = detail::block_io<Queue, Prp, Doorbell>;

 public:
  using base::base;

  [[nodiscard]] CUNVME_HOST_DEVICE io_result write(cuda::std::uint64_t lba, cuda::std::uint64_t blocks, const Prp& src, cuda::std::uint64_t offset) const {
    single_thread self;
    return this->transfer(self, spec::nvm_opcode::write, lba, blocks, src, offset);
  }
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result write(Group& g, cuda::std::uint64_t lba, cuda::std::uint64_t blocks, const Prp& src,
                                                   cuda::std::uint64_t offset) const {
    return this->transfer(g, spec::nvm_opcode::write, lba, blocks, src, offset);
  }
  /// Asynchronous, as `block_reader::submit_read`: `io_error::no_command_id` (nothing
  /// submitted) when every CID is in flight, and the caller must retry.
  [[nodiscard]] CUNVME_HOST_DEVICE io_handle submit_write(cuda::std::uint64_t lba, cuda::std::uint32_t blocks, const Prp& src,
                                                          cuda::std::uint64_t offset) const {
    return this->submit(spec::nvm_opcode::write, lba, blocks, src, offset);
  }
  /// Makes every completed write durable (NVM Flush; volatile write cache).
  [[nodiscard]] CUNVME_HOST_DEVICE io_result flush() const {
    single_thread self;
    return this->no_data(self, spec::make_flush(this->ns().nsid));
  }
  CUNVME_EXEC_CHECK_DISABLE
  template <thread_group Group>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result flush(Group& g) const {
    return this->no_data(g, spec::make_flush(this->ns().nsid));
  }
};

CUNVME_NAMESPACE_END
