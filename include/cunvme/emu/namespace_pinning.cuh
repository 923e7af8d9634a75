// A namespace's memory pinned for DMA as commands use it, a granule at a time, instead of
// all of it when the controller is built.
//
// Pinning (cudaHostRegister) a page-cached file costs about as much as copying it: on an
// H200's host, pinning and copying 8 GiB a granule at a time took 0.2–0.27 s from 1–8 threads
// (the driver serializes most of it; bench/RESULTS.md P9). Pinning the whole file at open made
// a load wait that long before its first byte moved. Pinned a granule (64 MiB) at a time, the
// first command reads after one granule's pinning, a few threads pin the granules ahead of reads
// that move forward (so a sequential load finds them pinned), and a file larger than the
// budget is pinned only as far as the budget goes, the rest copied from pageable memory.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/system_memory.cuh>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// How a controller pins its namespaces' memory (`memory_hooks::register_host`).
struct pinning_config {
  /// Bytes pinned by one `register_host` call: a power of two, at least a page. Each granule
  /// is its own registration, so a copy never spans two (CUDA refuses a copy whose source
  /// spans two registrations; the controller splits its copies at granule boundaries).
  std::uint64_t granule_bytes = std::uint64_t{64} << 20;
  /// Granules pinned in the background after a command's last one, when that lies past every
  /// granule used before (reads moving forward), so that sequential reads find them pinned:
  /// 4 × 64 MiB is ~5 ms of a 50 GB/s load and 256 MiB of pinned memory past what was read.
  /// Random reads stop asking once they have reached the namespace's end. 0: only what
  /// commands use.
  unsigned ahead = 4;
  /// Threads doing the background pinning (started at the first request; 0: none). The driver
  /// serializes most of a registration: more than 2–4 do not pin faster.
  unsigned threads = 2;
  /// Bytes of namespaces that may be pinned at once in this process, every controller's
  /// together (`process_pinned_bytes`), checked before each granule; 0: half the machine's
  /// memory (and nothing, where the system does not say how much it has). Pinning past
  /// physical memory would summon the OOM killer, and a sparse RAM namespace can be larger
  /// than the machine. Granules past the budget stay pageable (copies from them go through
  /// the driver's staging buffers, at a fraction of the pinned bandwidth).
  std::uint64_t budget_bytes = 0;
};

namespace detail {

/// Bytes of namespaces pinned in this process now, every controller's together: what
/// `pinning_config::budget_bytes` is compared against.
inline std::atomic<std::uint64_t>& process_pinned_bytes() noexcept {
  static std::atomic<std::uint64_t> bytes{0};
  return bytes;
}

/// One namespace's mapping as granules, each pinned at most once and unpinned when this is
/// destroyed (before the mapping goes). Thread-safe: worker threads and the pin-ahead threads
/// call `pin` and `queue` at once; each granule is registered by exactly one of them. A
/// granule being zeroed (`hold_unpinned`) is not pinned meanwhile.
class pinned_granules {
 public:
  using register_function = std::function<bool(void* pointer, std::size_t bytes, bool read_only)>;
  using unregister_function = std::function<void(void* pointer, std::size_t bytes)>;

  /// `mapping` (page-aligned, `bytes` long, its last page mapped whole) in granules of
  /// `config.granule_bytes`, none pinned yet. Throws std::invalid_argument for a granule
  /// that is not a power of two of at least a page.
  pinned_granules(std::byte* mapping, std::uint64_t bytes, bool read_only, const pinning_config& config, register_function register_host,
                  unregister_function unregister_host)
      : mapping_(mapping),
        bytes_(bytes),
        read_only_(read_only),
        granule_(config.granule_bytes),
        budget_(config.budget_bytes != 0 ? config.budget_bytes : cunvme::detail::physical_memory_bytes() / 2),
        register_(std::move(register_host)),
        unregister_(std::move(unregister_host)) {
    check_granule(granule_);
    page_ = page_bytes();
    count_ = (bytes_ + granule_ - 1) / granule_;
    states_ = std::make_unique<std::atomic<std::uint8_t>[]>(count_);
    for (std::uint64_t g = 0; g < count_; ++g) states_[g].store(unpinned, std::memory_order_relaxed);
  }
  pinned_granules(const pinned_granules&) = delete;
  pinned_granules& operator=(const pinned_granules&) = delete;

  /// Unpins every granule pinned. Nothing may pin or copy any more (the controller's threads
  /// and the pin-ahead pool have stopped).
  ~pinned_granules() {
    for (std::uint64_t g = 0; g < count_; ++g) {
      if (states_[g].load(std::memory_order_acquire) != pinned) continue;
      try {
        unregister_(mapping_ + g * granule_, granule_length(g));
      } catch (...) {
        // A destructor must not throw; the registration goes with the process.
      }
      process_pinned_bytes().fetch_sub(granule_length(g), std::memory_order_relaxed);
    }
  }

  /// Throws std::invalid_argument unless `granule` is a power of two of at least a page.
  static void check_granule(std::uint64_t granule) {
    const std::uint64_t page = page_bytes();
    if (granule < page || (granule & (granule - 1)) != 0) {
      throw std::invalid_argument("emu: a pinning granule of " + std::to_string(granule) + " bytes: it must be a power of two of at least a page (" +
                                  std::to_string(page) + " bytes)");
    }
  }

  [[nodiscard]] std::uint64_t granule_bytes() const noexcept { return granule_; }
  [[nodiscard]] std::uint64_t granule_count() const noexcept { return count_; }
  [[nodiscard]] std::uint64_t granule_of(std::uint64_t offset) const noexcept { return offset / granule_; }
  /// Bytes registered now (counted once a registration succeeded).
  [[nodiscard]] std::uint64_t pinned_bytes() const noexcept { return pinned_bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool is_pinned(std::uint64_t g) const noexcept { return g < count_ && states_[g].load(std::memory_order_acquire) == pinned; }

  /// Pins every granule [offset, offset + len) touches that is not pinned yet, waiting for
  /// those another thread is pinning or zeroing. Declined granules (budget, or the hook said
  /// no) stay pageable: copies from them are slower, never wrong.
  void use(std::uint64_t offset, std::uint64_t len) {
    if (len == 0) return;
    const std::uint64_t last = granule_of(offset + len - 1);
    for (std::uint64_t g = granule_of(offset); g <= last && g < count_; ++g) pin(g, true);
  }

  /// Pins granule `g` if no thread has claimed it. `wait`: then wait until it is pinned or
  /// declined, else return at once.
  void pin(std::uint64_t g, bool wait) {
    std::atomic<std::uint8_t>& state = states_[g];
    std::uint8_t seen = state.load(std::memory_order_acquire);
    for (;;) {
      if (seen == unpinned || seen == queued) {
        if (!state.compare_exchange_weak(seen, pinning, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
        const bool ok = register_granule(g);
        set(g, ok ? pinned : declined);
        return;
      }
      if ((seen != pinning && seen != zeroing) || !wait) return;
      std::unique_lock lock(wait_mutex_);
      changed_.wait(lock, [&] {
        seen = state.load(std::memory_order_acquire);
        return seen != pinning && seen != zeroing;
      });
    }
  }

  /// Holds granule `g` unpinned while the caller hands its pages back (Deallocate, Write
  /// Zeroes): true if it was not pinned or being pinned, and `pin` waits until `end_hold`;
  /// false if it is pinned (its pages must stay: the DMA engine reads the pinned ones) or
  /// another thread holds or pins it, and the caller writes zeros instead.
  [[nodiscard]] bool hold_unpinned(std::uint64_t g, std::uint8_t& before) noexcept {
    std::uint8_t seen = states_[g].load(std::memory_order_acquire);
    while (seen == unpinned || seen == queued || seen == declined) {
      if (states_[g].compare_exchange_weak(seen, zeroing, std::memory_order_acq_rel, std::memory_order_acquire)) {
        before = seen;
        return true;
      }
    }
    return false;
  }
  /// Ends `hold_unpinned`, the granule back as it was.
  void end_hold(std::uint64_t g, std::uint8_t before) { set(g, before); }

  /// Records `last` as a granule a command used; true if it lies past every one used before
  /// (then the granules after it are worth pinning ahead: the reads move forward).
  [[nodiscard]] bool advanced_to(std::uint64_t last) noexcept {
    std::uint64_t seen = furthest_.load(std::memory_order_relaxed);
    while (seen == no_granule || last > seen) {
      if (furthest_.compare_exchange_weak(seen, last, std::memory_order_relaxed)) return true;
    }
    return false;
  }

  /// Marks granule `g` as wanted by the pin-ahead threads; false if it already was, or is
  /// pinned, pinning, declined or held (so each granule is queued at most once).
  [[nodiscard]] bool queue(std::uint64_t g) noexcept {
    if (g >= count_) return false;
    std::uint8_t expected = unpinned;
    return states_[g].compare_exchange_strong(expected, queued, std::memory_order_acq_rel);
  }
  /// Whether granule `g` is unpinned and not queued: worth queueing. A load, no write.
  [[nodiscard]] bool wanted(std::uint64_t g) const noexcept { return g < count_ && states_[g].load(std::memory_order_relaxed) == unpinned; }

  /// Calls `f(piece, at, length)` for the pieces of [p, p + len) of the mapping cut at
  /// granule boundaries (`at`: the piece's distance from `p`), stopping at the first false.
  /// A single piece when the range lies in one granule, as nearly every command's does.
  template <class F>
  [[nodiscard]] bool for_each_piece(const std::byte* p, std::uint64_t len, F&& f) const {
    std::uint64_t at = 0;
    while (at < len) {
      const auto offset = static_cast<std::uint64_t>(p + at - mapping_);
      const std::uint64_t to_boundary = granule_ - offset % granule_;
      const std::uint64_t piece = to_boundary < len - at ? to_boundary : len - at;
      if (!f(p + at, at, piece)) return false;
      at += piece;
    }
    return true;
  }

 private:
  enum : std::uint8_t { unpinned, queued, pinning, pinned, declined, zeroing };
  static constexpr std::uint64_t no_granule = ~std::uint64_t{0};

  [[nodiscard]] static std::uint64_t page_bytes() noexcept {
    const long page = ::sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<std::uint64_t>(page) : 4096;
  }

  /// Granule `g`'s bytes, its last page whole (the mapping covers it).
  [[nodiscard]] std::size_t granule_length(std::uint64_t g) const noexcept {
    const std::uint64_t start = g * granule_;
    const std::uint64_t end = start + granule_ < bytes_ ? start + granule_ : bytes_;
    return static_cast<std::size_t>((end - start + page_ - 1) / page_ * page_);
  }

  /// Moves granule `g` to `to` and wakes the threads waiting for it. Under the mutex, so a
  /// waiter cannot check the state and sleep between the store and the notification.
  void set(std::uint64_t g, std::uint8_t to) {
    {
      std::scoped_lock lock(wait_mutex_);
      states_[g].store(to, std::memory_order_release);
    }
    changed_.notify_all();
  }

  [[nodiscard]] bool register_granule(std::uint64_t g) noexcept {
    const std::size_t length = granule_length(g);
    std::atomic<std::uint64_t>& reserved = process_pinned_bytes();
    if (reserved.fetch_add(length, std::memory_order_relaxed) + length > budget_) {
      reserved.fetch_sub(length, std::memory_order_relaxed);
      return false;
    }
    bool ok = false;
    try {
      ok = register_(mapping_ + g * granule_, length, read_only_);
    } catch (...) {
      ok = false;  // a hook that throws declines, as one that returns false
    }
    if (!ok) {
      reserved.fetch_sub(length, std::memory_order_relaxed);
      return false;
    }
    pinned_bytes_.fetch_add(length, std::memory_order_relaxed);
    return true;
  }

  std::byte* mapping_;
  std::uint64_t bytes_;
  bool read_only_;
  std::uint64_t granule_;
  std::uint64_t budget_;
  std::uint64_t page_ = 4096;
  std::uint64_t count_ = 0;
  register_function register_;
  unregister_function unregister_;
  std::unique_ptr<std::atomic<std::uint8_t>[]> states_;
  std::atomic<std::uint64_t> pinned_bytes_{0};
  std::atomic<std::uint64_t> furthest_{no_granule};
  std::mutex wait_mutex_;
  std::condition_variable changed_;
};

/// The threads that pin granules ahead of the commands, for every namespace of a controller.
/// Declared after the namespaces in the controller, so stopped before they are destroyed.
class pin_ahead_pool {
 public:
  explicit pin_ahead_pool(unsigned threads) : wanted_threads_(threads) {}
  pin_ahead_pool(const pin_ahead_pool&) = delete;
  pin_ahead_pool& operator=(const pin_ahead_pool&) = delete;
  ~pin_ahead_pool() { stop(); }

  /// Queues the granules `first .. first + count - 1` of `granules` that no thread has
  /// claimed. Starts the threads the first time; where none can start, nothing is pinned
  /// ahead (commands still pin what they use).
  void request(pinned_granules& granules, std::uint64_t first, std::uint64_t count) {
    if (wanted_threads_ == 0 || first >= granules.granule_count()) return;
    count = std::min(count, granules.granule_count() - first);
    bool any = false;
    for (std::uint64_t g = first; g < first + count; ++g) any = any || granules.wanted(g);
    if (!any) return;
    {
      std::scoped_lock lock(mutex_);
      if (stopping_) return;
      try {
        start_threads();
        if (threads_.empty()) return;
        for (std::uint64_t g = first; g < first + count; ++g) {
          if (granules.queue(g)) work_.emplace_back(&granules, g);
        }
      } catch (const std::exception&) {
        // Out of memory for the list: pinning ahead is an optimization, and a granule left
        // queued is pinned by the first command that uses it.
      }
    }
    work_ready_.notify_all();
  }

  /// Stops the threads after the registrations they are in; granules still queued stay
  /// unpinned (a command that uses one pins it itself).
  void stop() noexcept {
    {
      std::scoped_lock lock(mutex_);
      stopping_ = true;
      work_.clear();
    }
    work_ready_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void start_threads() {
    if (started_) return;
    started_ = true;
    for (unsigned i = 0; i < wanted_threads_; ++i) {
      try {
        threads_.emplace_back([this] { run(); });
      } catch (const std::exception&) {
        break;  // fewer threads pin ahead; with none, commands pin what they use
      }
    }
  }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return stopping_ || !work_.empty(); });
      if (stopping_) return;
      const auto [granules, g] = work_.front();
      work_.pop_front();
      lock.unlock();
      granules->pin(g, false);
      lock.lock();
    }
  }

  unsigned wanted_threads_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<std::pair<pinned_granules*, std::uint64_t>> work_;
  std::vector<std::thread> threads_;
  bool started_ = false;
  bool stopping_ = false;
};

}  // namespace detail
}  // namespace emu
CUNVME_NAMESPACE_END
