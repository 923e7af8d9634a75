// A volume: one block address space over namespaces on several controllers, striped (RAID-0)
// or mirrored (RAID-1), read and written by GPU or CPU threads through the block reader and
// writer of each member's queue pairs.
//
// Usage: examples/snippets/kernels.cu, `read_volume` and `volumes`; on CPU threads, host.cpp `striped_volume`.
//
// Why members carry several queue pairs: a queue pair shared by a whole grid serialises its
// submitters on one SQ tail and one CQ; each thread takes the queue pair of its SM (its CPU on
// the host), so the threads of one SM share one, and SMs spread over the rest.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/access.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/io/reader.cuh>
#include <cunvme/policy/doorbell.cuh>
#include <cunvme/policy/prp.cuh>
#include <cunvme/policy/queue.cuh>
#include <cunvme/policy/queue_view.cuh>

#include <cuda/std/bit>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cuda/std/utility>

CUNVME_NAMESPACE_BEGIN

/// How a volume spreads its blocks over its members.
enum class volume_layout : cuda::std::uint8_t {
  striped,   ///< RAID-0: stripe k of the volume is stripe k / N of member k % N
  mirrored,  ///< RAID-1: every member holds every block; reads go to one, writes to all
};

/// Members a volume may have: the view is passed by value to kernels, its members by pointer.
inline constexpr cuda::std::uint32_t max_volume_members = 64;

/// One member: a namespace and the queue pairs on its controller that threads of this volume use.
struct volume_member {
  const queue_view* queues = nullptr;  ///< [queue_count], addressable by the threads using the volume
  cuda::std::uint32_t queue_count = 0;
  namespace_view ns{};
};
static_assert(cuda::std::is_trivially_copyable_v<volume_member>);

/// A contiguous run of volume blocks that lies on one member.
struct volume_run {
  cuda::std::uint32_t member = 0;
  cuda::std::uint64_t lba = 0;     ///< the run's first LBA in the member's namespace
  cuda::std::uint64_t blocks = 0;  ///< as many blocks as stay on that member (up to the stripe's end)
};

/// The shape of a volume and where its members are: what `volume_io` and the page cache take.
/// `host::volume` builds it (and checks it); trivially copyable.
struct volume_view {
  const volume_member* members = nullptr;  ///< [member_count]
  cuda::std::uint32_t member_count = 0;
  volume_layout layout = volume_layout::striped;
  cuda::std::uint32_t stripe_shift = 0;  ///< log2 of the stripe's blocks (striped); mirrored reads balance by stripe too
  cuda::std::uint32_t lba_shift = 9;     ///< log2 of every member's block size
  cuda::std::uint64_t blocks = 0;        ///< the volume's size in blocks
  cuda::std::uint64_t timeout_ns = 0;    ///< the longest timeout of the members' queue pairs (bounds waits on the volume)

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t block_bytes() const noexcept { return cuda::std::uint64_t{1} << lba_shift; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t stripe_blocks() const noexcept {
    return cuda::std::uint64_t{1} << stripe_shift;
  }

  /// Where volume block `lba` is, and how many of `count` blocks from it stay on that member:
  /// striped, the member holding its stripe; mirrored, the replica that serves reads of its
  /// stripe (stripes take the members in turn, so random reads spread evenly). `lba` < `blocks`.
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr volume_run locate(cuda::std::uint64_t lba, cuda::std::uint64_t count) const noexcept {
    const cuda::std::uint64_t stripe = lba >> stripe_shift;
    const cuda::std::uint64_t within = lba & (stripe_blocks() - 1);
    const cuda::std::uint64_t left = stripe_blocks() - within;
    const auto member = static_cast<cuda::std::uint32_t>(stripe % member_count);
    if (layout == volume_layout::mirrored) return {member, lba, count};
    return {member, ((stripe / member_count) << stripe_shift) + within, count < left ? count : left};
  }

  /// The queue pair of `member` that the calling thread uses: the one of its SM (CPU).
  [[nodiscard]] CUNVME_HOST_DEVICE const queue_view& queue_for(cuda::std::uint32_t member) const noexcept {
    const volume_member& m = members[member];
    return m.queues[access::processor_id() % m.queue_count];
  }
};
static_assert(cuda::std::is_trivially_copyable_v<volume_view>);

/// A buffer every member of a volume reaches: `of(m)` is how member m's controller addresses
/// it (each controller may map the same memory at its own bus addresses: IOVAs, emulator bus
/// ranges).
template <class B>
concept volume_buffer = requires(const B& b, cuda::std::uint32_t member) {
  { b.of(member) } -> prp::buffer;
};

/// A `volume_buffer` as an array of one buffer description per member.
template <prp::buffer Prp>
struct member_buffers {
  const Prp* bus = nullptr;  ///< [member_count], addressable by the threads using it
  [[nodiscard]] CUNVME_HOST_DEVICE const Prp& of(cuda::std::uint32_t member) const noexcept { return bus[member]; }
};
static_assert(volume_buffer<member_buffers<prp::contiguous>>);

/// Reads and writes of volume blocks, for a GPU or CPU thread (the per-thread reader form): a
/// request is split at stripe ends and each piece sent to its member through the thread's
/// queue pair there. Failures come back as the reader's `io_result`, with `lba` and `blocks`
/// in volume blocks (`volume_view::locate` names the member): a member that fails fails only
/// the requests it served.
/// @tparam Queue    `queue_policies<Slots, Completion>` of every member's queue pairs (shared: not `slots::exclusive`)
/// @tparam Doorbell a doorbell policy
template <queue_policy Queue, doorbell::policy Doorbell>
class volume_io {
 public:
  CUNVME_HOST_DEVICE explicit volume_io(const volume_view& v) noexcept : v_(v) {}

  [[nodiscard]] CUNVME_HOST_DEVICE const volume_view& view() const noexcept { return v_; }

  /// Reads `blocks` volume blocks from `lba` into `dst` at byte `offset`. Mirrored: from the
  /// replica of each stripe; where that replica answers with an error status, from the next
  /// replica — but never after a timeout, since the abandoned command may still write the
  /// buffer (the first replica's failure is returned where every replica fails).
  template <volume_buffer Buffer>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result read(cuda::std::uint64_t lba, cuda::std::uint64_t blocks, const Buffer& dst,
                                                  cuda::std::uint64_t offset) const {
    if (const io_result r = check(lba, blocks); !r.ok()) return r;
    return for_runs(lba, blocks, [&](const volume_run& run, cuda::std::uint64_t at) {
      io_result first{};
      for (cuda::std::uint32_t tries = 0; tries < replicas(); ++tries) {
        const cuda::std::uint32_t m = (run.member + tries) % v_.member_count;
        const io_result r = reader<prp_of<Buffer>>(m).read(run.lba, run.blocks, dst.of(m), offset + at);
        if (r.ok()) return r;
        if (first.ok()) first = r;
        if (r.error != io_error::nvme_status) break;
      }
      return first;
    });
  }

  /// Writes `blocks` volume blocks at `lba` from `src` at byte `offset`: striped, each piece
  /// to its member; mirrored, to every member (the first failure is returned; members that
  /// succeeded hold the new blocks, so rewrite after a failure).
  template <volume_buffer Buffer>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result write(cuda::std::uint64_t lba, cuda::std::uint64_t blocks, const Buffer& src,
                                                   cuda::std::uint64_t offset) const {
    if (const io_result r = check(lba, blocks); !r.ok()) return r;
    return for_runs(lba, blocks, [&](const volume_run& run, cuda::std::uint64_t at) {
      if (v_.layout == volume_layout::striped) return writer<prp_of<Buffer>>(run.member).write(run.lba, run.blocks, src.of(run.member), offset + at);
      io_result first{};
      for (cuda::std::uint32_t m = 0; m < v_.member_count; ++m) {
        const io_result r = writer<prp_of<Buffer>>(m).write(run.lba, run.blocks, src.of(m), offset + at);
        if (!r.ok() && first.ok()) first = r;
      }
      return first;
    });
  }

  /// NVM Flush on every member; the first failure.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result flush() const {
    io_result first{};
    for (cuda::std::uint32_t m = 0; m < v_.member_count; ++m) {
      const io_result r = writer<prp::contiguous>(m).flush();
      if (!r.ok() && first.ok()) first = r;
    }
    return first;
  }

 private:
  template <class Buffer>
  using prp_of = cuda::std::remove_cvref_t<decltype(cuda::std::declval<const Buffer&>().of(0u))>;

  template <class Prp>
  [[nodiscard]] CUNVME_HOST_DEVICE block_reader<Queue, Prp, Doorbell> reader(cuda::std::uint32_t m) const {
    return block_reader<Queue, Prp, Doorbell>(v_.queue_for(m), v_.members[m].ns);
  }
  template <class Prp>
  [[nodiscard]] CUNVME_HOST_DEVICE block_writer<Queue, Prp, Doorbell> writer(cuda::std::uint32_t m) const {
    return block_writer<Queue, Prp, Doorbell>(v_.queue_for(m), v_.members[m].ns);
  }
  [[nodiscard]] CUNVME_HOST_DEVICE cuda::std::uint32_t replicas() const noexcept {
    return v_.layout == volume_layout::mirrored ? v_.member_count : 1;
  }

  /// invalid_request for an empty volume view, zero blocks or a range past the volume's end.
  [[nodiscard]] CUNVME_HOST_DEVICE io_result check(cuda::std::uint64_t lba, cuda::std::uint64_t blocks) const noexcept {
    const bool fits = blocks != 0 && lba < v_.blocks && blocks <= v_.blocks - lba;
    if (v_.member_count == 0 || v_.members == nullptr || !fits) {
      return io_result::failure(io_error::invalid_request, lba, static_cast<cuda::std::uint32_t>(blocks < 0xffff'ffffu ? blocks : 0xffff'ffffu));
    }
    return io_result{};
  }

  /// Runs `send(run, byte offset of the run in the request)` for each run of [lba, lba +
  /// blocks), in order, stopping at the first failure, whose LBA it restates in volume blocks.
  template <class Send>
  [[nodiscard]] CUNVME_HOST_DEVICE io_result for_runs(cuda::std::uint64_t lba, cuda::std::uint64_t blocks, Send&& send) const {
    for (cuda::std::uint64_t done = 0; done < blocks;) {
      const volume_run run = v_.locate(lba + done, blocks - done);
      io_result r = send(run, done << v_.lba_shift);
      if (!r.ok()) {
        // The member's LBA, back in the volume's blocks (a run is contiguous on both sides).
        if (r.lba >= run.lba && r.lba - run.lba < run.blocks) r.lba = lba + done + (r.lba - run.lba);
        return r;
      }
      done += run.blocks;
    }
    return io_result{};
  }

  volume_view v_;
};

CUNVME_NAMESPACE_END
