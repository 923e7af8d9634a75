// The checks of an NVM command that both emulated controllers make — the CPU emulator
// (nvm_commands.cuh) and the on-GPU null controller (gpu_null_controller.cuh) — written once,
// so that a command one of them refuses the other refuses with the same status, and a change
// of a rule reaches both. Pure functions of the command and the namespace: constexpr and
// `__host__ __device__`.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/spec/command_fields.cuh>
#include <cunvme/spec/queue_entry.cuh>
#include <cunvme/spec/status.cuh>

#include <cuda/std/cstdint>

CUNVME_NAMESPACE_BEGIN
namespace emu::nvm_checks {

/// The logical blocks a Read, Write or Write Zeroes names: SLBA (CDW10-11) and NLB + 1 (CDW12,
/// 0-based), so 1 to 65536 blocks.
struct block_range {
  cuda::std::uint64_t slba = 0;
  cuda::std::uint64_t blocks = 0;
};

[[nodiscard]] CUNVME_HOST_DEVICE constexpr block_range blocks_of(const spec::submission_entry& sqe) noexcept {
  return {spec::starting_lba(sqe), cuda::std::uint64_t{spec::rw_fields::nlb::get(sqe.cdw12)} + 1u};
}

/// What the emulators support of CDW0 beyond the opcode: no fused operations and PRPs only
/// (PSDT 00b; neither offers SGLs in Identify Controller SGLS). Anything else is Invalid Field
/// in Command.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr spec::status check_transfer_fields(const spec::submission_entry& sqe) noexcept {
  return sqe.fuse() == spec::fused_operation::normal && sqe.psdt() == spec::data_transfer_kind::prp ? spec::status::successful_completion
                                                                                                    : spec::status::invalid_field_in_command;
}

/// LBA Out of Range unless blocks [slba, slba + blocks) lie in a namespace of `lba_count`
/// blocks. Never computes slba + blocks, which may wrap; an empty range at the end is inside
/// (Dataset Management ranges may be empty).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr spec::status check_lba_range(cuda::std::uint64_t slba, cuda::std::uint64_t blocks,
                                                                        cuda::std::uint64_t lba_count) noexcept {
  return slba <= lba_count && blocks <= lba_count - slba ? spec::status::successful_completion : spec::status::lba_out_of_range;
}

/// The bytes one command may move: 2^MDTS minimum memory pages (CAP.MPSMIN), no limit when
/// MDTS is 0 (Identify Controller, MDTS), and no limit either where the product exceeds 64 bits.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr cuda::std::uint64_t max_transfer_bytes(cuda::std::uint32_t mdts,
                                                                                  cuda::std::uint64_t min_page_bytes) noexcept {
  constexpr cuda::std::uint64_t unlimited = ~cuda::std::uint64_t{0};
  if (mdts == 0 || mdts >= 64 || min_page_bytes == 0) return unlimited;
  const cuda::std::uint64_t pages = cuda::std::uint64_t{1} << mdts;
  return pages > unlimited / min_page_bytes ? unlimited : pages * min_page_bytes;
}

/// The namespace a command names, as the checks need it.
struct namespace_limits {
  bool active = false;                  ///< the NSID names an active namespace
  cuda::std::uint64_t lba_count = 0;    ///< NSZE
  cuda::std::uint64_t block_bytes = 0;  ///< bytes a block moves in the data buffer: data, and with extended LBAs its metadata (MDTS counts both)
};

/// The checks of a Read or Write before any data moves, in the order the statuses take
/// precedence in both emulators: the namespace (Invalid Namespace or Format), the LBA range (LBA
/// Out of Range), then the transfer size against MDTS (Invalid Field in Command). blocks ≤ 65536
/// and block_bytes below 2^32, so their product cannot wrap.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr spec::status check_read_write(block_range r, namespace_limits ns,
                                                                         cuda::std::uint64_t max_transfer) noexcept {
  if (!ns.active) return spec::status::invalid_namespace_or_format;
  if (const spec::status s = check_lba_range(r.slba, r.blocks, ns.lba_count); s != spec::status::successful_completion) return s;
  return r.blocks * ns.block_bytes > max_transfer ? spec::status::invalid_field_in_command : spec::status::successful_completion;
}

}  // namespace emu::nvm_checks
CUNVME_NAMESPACE_END
