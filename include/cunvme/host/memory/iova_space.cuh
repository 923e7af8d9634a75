// The I/O virtual addresses a VFIO process hands its DMA buffers (and its CMB): ranges the
// IOMMU translates, handed out upwards and never reused.
#pragma once

#include <cunvme/config.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// An inclusive range of I/O virtual addresses the IOMMU translates, as VFIO reports them.
struct iova_range {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
};

/// Hands out IOVA ranges upwards from 1 MiB, skipping what the IOMMU cannot translate (on x86
/// the MSI window at 0xfee00000 is one hole). IOVAs are never reused: a 48-bit space outlasts
/// any process, and a stale PRP from a buffer already freed then faults in the IOMMU instead
/// of landing in a newer buffer. A 4 KiB unmapped guard follows every range for the same
/// reason. Thread-safe.
class iova_space {
 public:
  /// `valid`: the translatable ranges (everything when empty); `start`: the lowest IOVA handed
  /// out — 0 is kept free, so a zero PRP faults.
  explicit iova_space(std::vector<iova_range> valid = {}, std::uint64_t start = std::uint64_t{1} << 20) : next_(start) {
    if (valid.empty()) valid.push_back({0, std::numeric_limits<std::uint64_t>::max()});
    std::sort(valid.begin(), valid.end(), [](const iova_range& a, const iova_range& b) { return a.first < b.first; });
    ranges_ = std::move(valid);
  }

  /// An IOVA aligned to `alignment` (a power of two, at least 4 KiB) for `bytes` (a multiple
  /// of 4 KiB), or nothing when no valid range above the last one handed out has room.
  [[nodiscard]] std::optional<std::uint64_t> take(std::uint64_t bytes, std::uint64_t alignment = page) {
    if (bytes == 0 || bytes % page != 0 || alignment < page || (alignment & (alignment - 1)) != 0) return std::nullopt;
    const std::lock_guard lock(mutex_);
    for (const auto& r : ranges_) {
      if (r.last < next_ || r.last - r.first < bytes - 1) continue;
      const std::uint64_t from = std::max(next_, r.first);
      if (from > std::numeric_limits<std::uint64_t>::max() - (alignment - 1)) continue;
      const std::uint64_t at = (from + alignment - 1) / alignment * alignment;
      if (at > r.last || r.last - at < bytes - 1) continue;
      // The next range starts past a guard page (saturating at the top of the space).
      const std::uint64_t end = at + (bytes - 1);
      next_ = end > std::numeric_limits<std::uint64_t>::max() - page - 1 ? std::numeric_limits<std::uint64_t>::max() : end + 1 + page;
      return at;
    }
    return std::nullopt;
  }

  /// Takes [first, last] out of the valid ranges, so `take` never hands out an IOVA in it.
  /// False when part of it was handed out already.
  [[nodiscard]] bool reserve(std::uint64_t first, std::uint64_t last) {
    if (last < first) return false;
    const std::lock_guard lock(mutex_);
    if (next_ > first) return false;
    std::vector<iova_range> left;
    for (const auto& r : ranges_) {
      if (r.last < first || r.first > last) {
        left.push_back(r);
        continue;
      }
      if (r.first < first) left.push_back({r.first, first - 1});
      if (r.last > last) left.push_back({last + 1, r.last});
    }
    ranges_ = std::move(left);
    return true;
  }

 private:
  static constexpr std::uint64_t page = 4096;
  std::mutex mutex_;
  std::vector<iova_range> ranges_;
  std::uint64_t next_;
};

}  // namespace host
CUNVME_NAMESPACE_END
