// The data the policies and gpu suites write and check: every 8-byte word of a namespace
// differs, and differs again in every round of writes, so a block read into the wrong place,
// a stale block or a lost write cannot pass a check.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/volume/volume.cuh>

#include <cstdint>

namespace test {

/// The word at byte `o` of the namespace after write round `round` (0: as first filled).
[[nodiscard]] CUNVME_HOST_DEVICE constexpr std::uint64_t word_at(std::uint64_t o, std::uint64_t round = 0) noexcept {
  return (o / 8) * 0x9e3779b97f4a7c15ull ^ (round + 1) * 0xd1b54a32d192ed03ull;
}

/// A well-mixed 64-bit hash (MurmurHash3's finaliser), for random LBAs and choices.
[[nodiscard]] CUNVME_HOST_DEVICE constexpr std::uint64_t mix(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

/// Word `i` of a volume whose member m was filled with `word_at(offset, m)` (round m): the member
/// and the place there that the volume's layout gives.
[[nodiscard]] CUNVME_HOST_DEVICE inline std::uint64_t volume_word_at(const cunvme::volume_view& v, std::uint64_t i) noexcept {
  const cunvme::volume_run run = v.locate(i * 8 / v.block_bytes(), 1);
  return word_at(run.lba * v.block_bytes() + i * 8 % v.block_bytes(), run.member);
}

}  // namespace test
