// The host's synchronous I/O: the readers' own path (io/reader.cuh) run by the calling CPU
// thread, so that the host has no ring, no doorbell rule, no CQ drain and no MDTS split of its
// own. A host queue has one submitter at a time (`queue_pair` has no lock), so it takes
// `slots::exclusive` and drains its CQ itself (`completion::cooperative`).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/policy/completion.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/group.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue.cuh>
#include <cunvme/policy/queue_view.cuh>
#include <cunvme/policy/slots.cuh>
#include <cunvme/spec/opcodes.cuh>
#include <cunvme/spec/queue_entry.cuh>

#include <cstdint>

CUNVME_NAMESPACE_BEGIN
namespace host {
namespace detail {

using host_queue = cunvme::queue_policies<slots::exclusive, completion::cooperative>;

/// What `sync_io::command` returns.
struct command_outcome {
  io_result result{};
  std::uint16_t cid = 0;
  completion_record record{};  ///< the completion's fields, where one came (success or nvme_status)
};

/// A reader/writer for the host's commands: `transfer` is the readers' (MDTS split included);
/// `command` submits one command a reader does not build (raw SQEs, MPTR for separate
/// metadata) through the same CID, PRP-list, ring and wait steps.
/// @tparam Prp      how the data buffer's bus addresses are found
/// @tparam Doorbell `doorbell::shadow` where the queue has shadow slots, else `doorbell::mmio`
template <prp::buffer Prp, doorbell::policy Doorbell>
class sync_io : public cunvme::detail::block_io<host_queue, Prp, Doorbell> {
  using base = cunvme::detail::block_io<host_queue, Prp, Doorbell>;

 public:
  using base::base;

  /// Reads or writes `blocks` at `lba` from/to bytes `offset`… of `data`, in commands of at
  /// most `namespace_view::max_blocks`; the first failure by LBA, or success.
  [[nodiscard]] io_result transfer(spec::nvm_opcode opcode, std::uint64_t lba, std::uint64_t blocks, const Prp& data, std::uint64_t offset) const {
    single_thread self;
    return base::transfer(self, opcode, lba, blocks, data, offset);
  }

  /// One command that `prepare(cid, sqe, *this)` writes (returning an io_error for a bad
  /// buffer); waits for it, bounded by the queue's timeout, as a reader waits.
  template <class Prepare>
  [[nodiscard]] command_outcome command(Prepare&& prepare) const {
    if (!Doorbell::usable(this->q_)) return {io_result::failure(io_error::doorbell_unusable, 0, 0)};
    single_thread self;
    typename base::cid_wait waiting;
    for (;;) {
      io_handle h = this->issue(self, true, [&](std::uint16_t cid, spec::submission_entry& sqe) { return prepare(cid, sqe, *this); });
      if (h.state == io_handle::phase::in_flight) {
        this->wait_for(h);
        // The record keeps its fields after the CID went back, until the CID is taken again:
        // only by this thread, the queue's one submitter.
        return {h.result, h.cid, this->q_.records[h.cid]};
      }
      if (!h.result.ok()) return {h.result};
      if (!waiting.again(*this)) return {io_result::failure(io_error::no_command_id, 0, 0)};
    }
  }

  /// PRP1/PRP2 for `bytes` of `data` at `offset`, with CID `cid`'s PRP list.
  [[nodiscard]] io_error prps(const Prp& data, std::uint64_t offset, std::uint64_t bytes, std::uint16_t cid, spec::submission_entry& sqe) const {
    return this->build_prps(data, offset, bytes, cid, sqe);
  }
};

}  // namespace detail
}  // namespace host
CUNVME_NAMESPACE_END
