// The one request planner: what a transfer of `blocks` blocks at `lba` becomes in Read/Write
// commands on a namespace (MDTS and NLB split, dword-aligned command starts, LBA wrap, the
// namespace's capacity), checked before any command is sent. Readers and writers, the host's
// queue pairs, `copy_n` and the Python bindings all plan through it, on the host and on the
// device alike; it never throws and allocates nothing, so it is usable in constant expressions.
//
// ```
// constexpr cunvme::request_geometry g = cunvme::request_geometry::of(512, 0, 1 << 20, cunvme::max_blocks_per_command(128 << 10, 512));
// constexpr cunvme::request_plan p = cunvme::plan_request(g, /*lba*/ 10, /*blocks*/ 600);
// static_assert(p.ok() && p.commands() == 3 && p.command(2).slba == 522 && p.command(2).blocks == 88);
// ```
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/io/io_result.cuh>
#include <cunvme/io/namespace_view.cuh>
#include <cunvme/spec/command_fields.cuh>

#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN

/// Which check a request failed; `none` for a request that can be sent. Ordered as the
/// planner checks them: a request that fails several gets the first.
enum class plan_error : cuda::std::uint8_t {
  none = 0,
  zero_blocks,          ///< nothing to transfer
  lba_wrap,             ///< the last LBA, lba + blocks - 1, runs past 2^64 - 1
  byte_count_overflow,  ///< blocks x bytes per block (data or separate metadata) does not fit 64 bits
  block_exceeds_mdts,   ///< one block (with extended LBAs' metadata) is larger than MDTS: no command can carry it
  unaligned_split,      ///< several commands are needed and no split starts each one's data and metadata dword aligned (PRP1, MPTR)
  past_capacity,        ///< the range runs past the namespace's last LBA (NSZE - 1): what the controller refuses with LBA Out of Range
};

[[nodiscard]] CUNVME_HOST_DEVICE constexpr const char* to_string(plan_error e) noexcept {
  switch (e) {
    case plan_error::none: return "plannable";
    case plan_error::zero_blocks: return "zero blocks";
    case plan_error::lba_wrap: return "the LBA range runs past LBA 2^64 - 1";
    case plan_error::byte_count_overflow: return "the byte count does not fit 64 bits";
    case plan_error::block_exceeds_mdts: return "MDTS is smaller than one block";
    case plan_error::unaligned_split: return "no split into commands of at most MDTS starts every command dword aligned";
    case plan_error::past_capacity: return "the LBA range runs past the namespace's end";
  }
  return "unknown plan_error";
}

/// Blocks one command may carry: MDTS (`max_transfer_bytes`, which counts extended LBAs'
/// metadata: `block_bytes` per block) and NLB, a 16-bit 0's-based field (65536 blocks), the
/// smaller. 0: MDTS is smaller than one block.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t max_blocks_per_command(cuda::std::uint64_t max_transfer_bytes,
                                                                                    cuda::std::uint64_t block_bytes) noexcept {
  if (block_bytes == 0) return 0;
  const cuda::std::uint64_t by_mdts = max_transfer_bytes / block_bytes;
  return by_mdts < spec::rw_fields::max_blocks ? by_mdts : spec::rw_fields::max_blocks;
}

/// The largest count of at most `per_command` blocks whose data (`block_bytes` each) and
/// separate metadata (`metadata_bytes` each) are whole dwords, so that every command after the
/// first starts dword aligned as PRP1 and MPTR must (bits 1:0 zero). 0 where none of
/// 1..per_command is. A multiple of 4 always qualifies: at most three steps down.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t dword_aligned_split(cuda::std::uint64_t per_command, cuda::std::uint64_t block_bytes,
                                                                                 cuda::std::uint64_t metadata_bytes) noexcept {
  while (per_command > 0 && ((per_command * block_bytes) % 4 != 0 || (per_command * metadata_bytes) % 4 != 0)) --per_command;
  return per_command;
}

/// What the planner needs of a namespace.
struct request_geometry {
  cuda::std::uint64_t block_bytes = 0;     ///< bytes a block takes in the data buffer: data, and with extended LBAs its metadata
  cuda::std::uint64_t metadata_bytes = 0;  ///< bytes a block takes in a separate metadata buffer (MPTR); 0 without one
  cuda::std::uint64_t lba_count = 0;       ///< NSZE: LBAs 0..lba_count - 1 exist
  cuda::std::uint64_t max_blocks = 0;      ///< blocks one command may carry (`max_blocks_per_command`); 0: MDTS below one block

  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr request_geometry of(cuda::std::uint64_t block_bytes, cuda::std::uint64_t metadata_bytes,
                                                                        cuda::std::uint64_t lba_count, cuda::std::uint64_t max_blocks) noexcept {
    return request_geometry{block_bytes, metadata_bytes, lba_count, max_blocks};
  }
  /// As a reader addresses `ns` (no separate metadata: readers supply no MPTR).
  [[nodiscard]] CUNVME_HOST_DEVICE static constexpr request_geometry of(const namespace_view& ns) noexcept {
    return request_geometry{ns.block_bytes(), 0, ns.lba_count, ns.max_blocks};
  }
};

/// One command of a plan.
struct planned_command {
  cuda::std::uint64_t slba = 0;             ///< CDW10-11
  cuda::std::uint32_t blocks = 0;           ///< 1..65536; the command's NLB field holds blocks - 1
  cuda::std::uint64_t byte_offset = 0;      ///< where its data starts, from the request's first byte
  cuda::std::uint64_t metadata_offset = 0;  ///< where its separate metadata starts, from the request's first metadata byte

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint16_t nlb() const noexcept { return static_cast<cuda::std::uint16_t>(blocks - 1); }
};

/// A request checked and split: `commands()` commands of `per_command` blocks, the last one
/// fewer. Where `error` is set, `fail_lba`/`fail_blocks` name the blocks it concerns: the first
/// planned command that crosses the namespace's end for `past_capacity` (the command the
/// controller would have refused), else the request (its count clamped to 32 bits).
struct request_plan {
  plan_error error = plan_error::none;
  cuda::std::uint64_t lba = 0;
  cuda::std::uint64_t blocks = 0;
  cuda::std::uint64_t per_command = 0;  ///< blocks per command (MDTS, NLB and dword alignment applied)
  cuda::std::uint64_t block_bytes = 0;
  cuda::std::uint64_t metadata_bytes = 0;
  cuda::std::uint64_t fail_lba = 0;
  cuda::std::uint32_t fail_blocks = 0;

  [[nodiscard]] CUNVME_HOST_DEVICE constexpr bool ok() const noexcept { return error == plan_error::none; }
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t commands() const noexcept {
    return ok() ? (blocks + per_command - 1) / per_command : 0;
  }
  /// Bytes of the whole request in the data buffer (fits 64 bits once planned).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t bytes() const noexcept { return blocks * block_bytes; }
  /// Command `i` (< commands()).
  [[nodiscard]] CUNVME_HOST_DEVICE constexpr planned_command command(cuda::std::uint64_t i) const noexcept {
    const cuda::std::uint64_t done = i * per_command;
    const cuda::std::uint64_t left = blocks - done;
    return planned_command{lba + done, static_cast<cuda::std::uint32_t>(left < per_command ? left : per_command), done * block_bytes,
                           done * metadata_bytes};
  }
};

/// Plans `blocks` blocks at `lba` on a namespace of geometry `g`. Checks, in `plan_error`'s
/// order: zero blocks, LBA wrap, byte counts, MDTS, a dword-aligned split (only where several
/// commands are needed: `per_command` may then come out up to three blocks below
/// `g.max_blocks`), and last the capacity, whose failure names a planned command.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr request_plan plan_request(const request_geometry& g, cuda::std::uint64_t lba,
                                                                     cuda::std::uint64_t blocks) noexcept {
  request_plan p;
  p.lba = lba;
  p.blocks = blocks;
  p.block_bytes = g.block_bytes;
  p.metadata_bytes = g.metadata_bytes;
  p.fail_lba = lba;
  p.fail_blocks = static_cast<cuda::std::uint32_t>(blocks < 0xffff'ffffu ? blocks : 0xffff'ffffu);
  constexpr cuda::std::uint64_t max = ~cuda::std::uint64_t{0};
  const auto fail = [&p](plan_error e) {
    p.error = e;
    return p;
  };
  if (blocks == 0) return fail(plan_error::zero_blocks);
  if (lba > max - (blocks - 1)) return fail(plan_error::lba_wrap);
  if (g.block_bytes == 0 || blocks > max / g.block_bytes || (g.metadata_bytes != 0 && blocks > max / g.metadata_bytes)) {
    return fail(plan_error::byte_count_overflow);
  }
  if (g.max_blocks == 0) return fail(plan_error::block_exceeds_mdts);
  p.per_command = g.max_blocks < spec::rw_fields::max_blocks ? g.max_blocks : spec::rw_fields::max_blocks;
  if (blocks > p.per_command) {
    p.per_command = dword_aligned_split(p.per_command, g.block_bytes, g.metadata_bytes);
    if (p.per_command == 0) return fail(plan_error::unaligned_split);
  }
  if (lba >= g.lba_count || blocks > g.lba_count - lba) {
    // The command the controller would refuse with LBA Out of Range: the first that reaches
    // past the end (commands before it lie inside).
    const cuda::std::uint64_t first_out = lba >= g.lba_count ? 0 : (g.lba_count - lba) / p.per_command;
    const planned_command c = p.command(first_out);
    p.fail_lba = c.slba;
    p.fail_blocks = c.blocks;
    return fail(plan_error::past_capacity);
  }
  return p;
}

/// `plan_request` as a reader addresses `ns`.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr request_plan plan_request(const namespace_view& ns, cuda::std::uint64_t lba, cuda::std::uint64_t blocks) noexcept {
  return plan_request(request_geometry::of(ns), lba, blocks);
}

/// A refused plan as readers report it: past the namespace's end, the status the controller
/// gives such a command (LBA Out of Range) for the command it would have refused, so that a
/// request is refused alike before and after it reaches a controller; any other check,
/// `invalid_request` at the request's LBA. Success for a plan that can be sent.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr io_result to_io_result(const request_plan& p) noexcept {
  if (p.ok()) return io_result{};
  if (p.error == plan_error::past_capacity) return io_result::failure(io_error::nvme_status, p.fail_lba, p.fail_blocks, spec::status::lba_out_of_range);
  return io_result::failure(io_error::invalid_request, p.lba, 0);
}

CUNVME_NAMESPACE_END
