// The locks over a backing store's bytes: striped reader/writer locks by 64 KiB chunk, and a
// store-wide lock for long accesses. Several emulator workers touch a store at once,
// sometimes the same blocks (NVMe lets commands on different queues overlap; the result is
// undefined but must not be a C++ data race), so every access holds locks over its bytes.
#pragma once

#include <cunvme/config.cuh>

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <shared_mutex>

CUNVME_NAMESPACE_BEGIN
namespace emu::detail {

/// Bytes guarded by one stripe.
inline constexpr std::uint64_t chunk_bytes = 64 * 1024;
inline constexpr std::size_t stripe_count = 256;
// ThreadSanitizer, which CI runs, aborts a thread that holds more than 64 locks (its
// deadlock detector keeps them in a fixed table of 64), and the controller holds a few of
// its own around store accesses: so no access holds more than 32 stripes.
inline constexpr std::uint64_t max_striped_chunks = 32;

/// A store's locks: chunk i is guarded by stripe i % 256.
struct lock_table {
  // Apart on cache lines: neighbouring chunks are guarded by neighbouring stripes, and
  // workers streaming through neighbouring chunks should not bounce one line between them.
  struct alignas(64) stripe {
    std::shared_mutex mutex;
  };

  std::array<stripe, stripe_count> stripes;
  std::shared_mutex whole;              ///< held exclusively by an access of too many chunks
  std::atomic<bool> whole_held{false};  ///< set while such an access is waiting or running
};

enum class lock_mode : bool { shared, exclusive };

/// Selects `range_lock`'s constructors that give up instead of waiting.
struct try_only_t {};

/// Locks [offset, offset + len) of a store for the lifetime of the object.
///
/// An access of up to 32 chunks locks its stripes, then reads `whole_held`: a single load of a
/// line nobody writes in the common case, so uncontended accesses on different stripes
/// share no written memory at all. A store-wide lock that every access took in shared mode
/// would be simpler, but its counter would be written by every access on every core.
///
/// A longer access takes `whole`, sets `whole_held`, and then locks and unlocks each stripe
/// in turn. An access that read `whole_held == false` still holds its stripes, so the sweep
/// waits for it to end; one that locks a stripe after the sweep has passed it sees the flag
/// (the sweep's unlock publishes it), lets its stripes go and waits on `whole`. Afterwards no
/// other access runs until the long one is done. A thread never waits for `whole` while
/// holding a stripe, so the two lock orders cannot deadlock.
template <lock_mode Mode>
class range_lock {
 public:
  /// Takes the ranges only if that needs no waiting: every stripe free for `Mode` at once, no
  /// long access in progress, at most 32 stripes. Otherwise `owns()` is false, nothing held.
  range_lock(lock_table* table, std::uint64_t offset, std::uint64_t len, try_only_t) : range_lock(table, offset, len, 0, 0, try_only_t{}) {}
  /// As above over two ranges at once (a command's data and its separate metadata).
  range_lock(lock_table* table, std::uint64_t offset, std::uint64_t len, std::uint64_t offset2, std::uint64_t len2, try_only_t)
      : table_(table) {
    if (len == 0 && len2 == 0) {
      owns_ = true;
      return;
    }
    if (!add_stripes(set_, offset, len) || !add_stripes(set_, offset2, len2) || stripes_in_set() > max_striped_chunks) return;
    count_ = stripes_in_set();
    std::size_t locked = 0;
    bool all = true;
    for_each_stripe([&](std::shared_mutex& m) {
      if (all && (Mode == lock_mode::shared ? m.try_lock_shared() : m.try_lock())) {
        ++locked;
      } else {
        all = false;
      }
    });
    if (all && !table_->whole_held.load(std::memory_order_acquire)) {
      owns_ = true;
      return;
    }
    std::size_t i = 0;
    for_each_stripe([&](std::shared_mutex& m) {
      if (i++ < locked) Mode == lock_mode::shared ? m.unlock_shared() : m.unlock();
    });
    count_ = 0;
  }

  [[nodiscard]] bool owns() const noexcept { return owns_; }
  /// Mutexes held (stripes, or 1 for the whole store).
  [[nodiscard]] std::size_t locks_held() const noexcept { return whole_ ? 1 : count_; }

  range_lock(lock_table* table, std::uint64_t offset, std::uint64_t len) : range_lock(table, offset, len, 0, 0) {}
  /// Both ranges under one lock: an access of the other sees both before or both after.
  range_lock(lock_table* table, std::uint64_t offset, std::uint64_t len, std::uint64_t offset2, std::uint64_t len2) : table_(table) {
    owns_ = true;
    // Nothing is touched: nothing to lock (a moved-from store has no lock table).
    if (len == 0 && len2 == 0) return;
    if (!add_stripes(set_, offset, len) || !add_stripes(set_, offset2, len2) || stripes_in_set() > max_striped_chunks) {
      lock_whole();
      return;
    }
    count_ = stripes_in_set();
    for (;;) {
      for_each_stripe([](std::shared_mutex& m) { Mode == lock_mode::shared ? m.lock_shared() : m.lock(); });
      if (!table_->whole_held.load(std::memory_order_acquire)) return;
      unlock_stripes();
      // Waits for the long access to end, then tries again.
      std::shared_lock wait(table_->whole);
    }
  }

  ~range_lock() {
    if (whole_) {
      table_->whole_held.store(false, std::memory_order_release);
      table_->whole.unlock();
    } else if (count_ != 0) {
      unlock_stripes();
    }
  }

  range_lock(const range_lock&) = delete;
  range_lock& operator=(const range_lock&) = delete;

 private:
  /// The stripes an access locks, one bit each: visited in ascending stripe order.
  using stripe_set = std::array<std::uint64_t, stripe_count / 64>;

  /// Adds the stripes of [offset, offset + len)'s chunks to `set`; false when that range
  /// spans more than 32 chunks (it then takes the whole store).
  static bool add_stripes(stripe_set& set, std::uint64_t offset, std::uint64_t len) noexcept {
    if (len == 0) return true;
    const std::uint64_t first = offset / chunk_bytes;
    const std::uint64_t chunks = (offset + len - 1) / chunk_bytes - first + 1;
    if (chunks > max_striped_chunks) return false;
    for (std::uint64_t i = 0; i < chunks; ++i) {
      const std::size_t s = static_cast<std::size_t>((first + i) % stripe_count);
      set[s / 64] |= std::uint64_t{1} << (s % 64);
    }
    return true;
  }

  void lock_whole() {
    table_->whole.lock();
    table_->whole_held.store(true, std::memory_order_relaxed);
    // The flag is published to later lockers of each stripe by that stripe's unlock.
    for (auto& s : table_->stripes) {
      s.mutex.lock();
      s.mutex.unlock();
    }
    whole_ = true;
  }

  void unlock_stripes() {
    for_each_stripe([](std::shared_mutex& m) { Mode == lock_mode::shared ? m.unlock_shared() : m.unlock(); });
  }

  [[nodiscard]] std::size_t stripes_in_set() const noexcept {
    std::size_t n = 0;
    for (const std::uint64_t word : set_) n += static_cast<std::size_t>(std::popcount(word));
    return n;
  }

  /// Visits the stripes in `set_` in ascending stripe order (one global order: no deadlock),
  /// each once even where two ranges share it.
  template <class Op>
  void for_each_stripe(Op op) {
    for (std::size_t w = 0; w < set_.size(); ++w) {
      for (std::uint64_t bits = set_[w]; bits != 0; bits &= bits - 1) {
        op(table_->stripes[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))].mutex);
      }
    }
  }

  lock_table* table_;
  stripe_set set_{};
  std::size_t count_ = 0;
  bool whole_ = false;
  bool owns_ = false;
};

}  // namespace emu::detail
CUNVME_NAMESPACE_END
