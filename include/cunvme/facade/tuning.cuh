// The launch shape of `copy_n` and the queue pairs a `cunvme::device` opens for it, as one
// plain struct chosen by a constexpr function of the compute capability (CUB's
// `dispatch/tuning/` pattern): the host evaluates it for the launch, a caller can pass its own
// through `device_options::tuning`.
#pragma once

#include <cunvme/config.cuh>

#include <cstdint>
#include <ostream>

CUNVME_NAMESPACE_BEGIN

struct copy_tuning {
  /// The kernel's launch bound: its shared memory per warp is sized at launch, its registers
  /// for this many warps per block.
  static constexpr int max_warps_per_block = 8;
  /// Queue pairs a device can open.
  static constexpr std::uint32_t max_queues = 16;

  /// Warps in a block of the copy kernel. Each warp moves its own range; more per block
  /// packs them onto fewer SMs, which matters only beside other kernels.
  int warps_per_block = 4;
  /// MDTS-sized commands a warp keeps in flight (the per-warp reader submits them together):
  /// a request gives each warp up to this many, fewer where that leaves queue pairs idle.
  std::uint32_t commands_per_warp = 32;
  /// Queue pairs a device opens and `copy_n` spreads its warps over: a controller (and the
  /// emulator, one worker thread per queue) serves queues in parallel.
  std::uint32_t queues = 8;

  [[nodiscard]] constexpr bool valid() const noexcept {
    return warps_per_block >= 1 && warps_per_block <= max_warps_per_block && commands_per_warp >= 1 && queues >= 1 && queues <= max_queues;
  }
  friend constexpr bool operator==(const copy_tuning&, const copy_tuning&) = default;
  friend std::ostream& operator<<(std::ostream& os, const copy_tuning& t) {
    return os << "copy_tuning{warps_per_block=" << t.warps_per_block << ", commands_per_warp=" << t.commands_per_warp << ", queues=" << t.queues
              << "}";
  }
};

/// The tuning for a GPU of compute capability `major * 10 + minor`. One shape for all so far:
/// 4 warps per block, 32 commands per warp over 8 queues is what `bench/file_peers` measured on
/// the H100 (sm_90, bench/RESULTS.md: one copy_n over 8 queue pairs); nothing else is measured.
[[nodiscard]] constexpr copy_tuning copy_tuning_for(int /*compute_capability*/) noexcept { return copy_tuning{}; }

static_assert(copy_tuning_for(90).valid() && copy_tuning_for(80).valid());

CUNVME_NAMESPACE_END
