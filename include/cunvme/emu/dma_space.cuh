// The emulator's IOMMU: the only way the emulated controller reaches memory.
//
// A real controller can DMA anywhere the IOMMU lets it; the emulator can only touch memory
// the host registered here, and every access is checked against the region it falls in.
// An address outside every region fails the command with Data Transfer Error instead of
// corrupting memory the emulator was not given.
#pragma once

#include <cunvme/config.cuh>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>

#include <time.h>

CUNVME_NAMESPACE_BEGIN
namespace emu {

/// Where a registered region lives, which decides how the emulator moves its bytes.
enum class memory_kind : std::uint8_t {
  host,    ///< host memory the emulator's threads can address (pageable, pinned or mapped)
  device,  ///< GPU memory: moved with the device copier (CUDA copies on the emulator's streams)
  cmb,     ///< the controller's own memory buffer
};

/// One registered region: `bytes` bytes at bus address `bus`.
struct dma_region {
  std::uint64_t bus = 0;
  std::byte* pointer = nullptr;  ///< host address, or device address for `memory_kind::device`
  std::uint64_t bytes = 0;
  memory_kind kind = memory_kind::host;
  int gpu = -1;  ///< the CUDA ordinal of a `memory_kind::device` region's GPU (`device_copier::gpu_of`)

  [[nodiscard]] bool contains(std::uint64_t address, std::uint64_t length) const noexcept {
    return address >= bus && length <= bytes && address - bus <= bytes - length;
  }
};

/// Moves bytes to and from `memory_kind::device` regions; installed by the CUDA layer.
///
/// Copies to the device may still be in flight when `copy` returns (so the pieces of one
/// command, and of a burst of commands, go out together), in any order among themselves, with
/// their sources read until then; `wait` completes those the calling thread started. Copies
/// from the device are complete when `copy` returns and see the calling thread's earlier
/// copies to the device. `thread_start`, if set, runs once on each
/// controller thread before it serves any queue: per-thread setup (a CUDA stream) made there,
/// before kernels run, is not made on the I/O path while a kernel waits for that I/O;
/// `thread_end` undoes it.
///
/// Several GPUs: a region of device memory is asked `gpu_of` once, when it is mapped, and each
/// of its copies names that GPU (`gpu`), so a copier moves each GPU's bytes on that GPU's own
/// streams. Without `gpu_of` every device region is GPU 0's.
struct device_copier {
  std::function<bool(void* dst, const void* src, std::uint64_t bytes, bool to_device, int gpu)> copy;
  std::function<bool()> wait;
  std::function<void()> thread_start;
  /// If set, runs once on each controller thread as it ends (after its last copy): releases
  /// what `thread_start` made.
  std::function<void()> thread_end;
  /// The GPU that owns device memory at `pointer`, or -1 where it is none (the region is refused).
  std::function<int(const void* pointer)> gpu_of;
  [[nodiscard]] explicit operator bool() const noexcept { return static_cast<bool>(copy); }
};

/// How long the device copier's calls took. A CUDA copy call returns in microseconds and a
/// wait for one burst's copies in milliseconds; one that takes `copy_stall_ns` or longer was
/// held up in the CUDA driver — most often by another thread's call that waits for a kernel
/// which itself waits for this emulator (emu::cuda_memory, "Threads") — and the commands
/// behind it may time out. A call still running counts once it has run that long: the kernel
/// waiting for it times out, and its error is written, before the call comes back. Times are
/// the coarse clock's (a few milliseconds).
struct copier_delays {
  static constexpr std::uint64_t copy_stall_ns = 1'000'000'000;
  static constexpr std::uint64_t never = ~std::uint64_t{0};
  std::uint64_t stalls = 0;                  ///< calls that took `copy_stall_ns` or longer, ended or running
  std::uint64_t longest_ns = 0;              ///< the longest call, ended or running
  std::uint64_t running_stall_ns = 0;        ///< the longest call still running, if a stall; else 0
  std::uint64_t last_stall_ns = 0;           ///< how long the last stall that ended took (0: none ended)
  std::uint64_t last_stall_ended_ns = never; ///< how long ago it ended
};

/// The set of regions the controller may reach, with bus addresses handed out like an IOMMU.
///
/// Usage: examples/snippets/emu.cpp, `dma_space_round_trip`.
/// Bus addresses keep the buffer's offset inside a 2 MiB page (or the larger alignment `map`
/// is given), so a buffer's page boundaries (4 KiB host pages, 64 KiB GPU pages, controller
/// pages up to 2 MiB, larger ones when asked) fall where they fall in its virtual addresses,
/// and unmapped guard space separates regions.
class dma_space {
 public:
  static constexpr std::uint64_t first_bus_address = 0x10'0000'0000ull;  // 64 GiB: far from 0
  static constexpr std::uint64_t bus_granule = 2ull << 20;
  /// Bus addresses stay below 2^63, so `bus + bytes` of any region never wraps.
  static constexpr std::uint64_t max_bus_address = 1ull << 63;

  dma_space() = default;
  dma_space(const dma_space&) = delete;
  dma_space& operator=(const dma_space&) = delete;

  /// Registers `bytes` bytes at `pointer` and returns the bus address of `pointer`, which is
  /// congruent to `pointer` modulo `alignment` (a power of two; at least 2 MiB is kept): a
  /// pointer aligned to a controller page larger than 2 MiB gets a bus address aligned as much.
  [[nodiscard]] std::uint64_t map(void* pointer, std::uint64_t bytes, memory_kind kind = memory_kind::host,
                                  std::uint64_t alignment = bus_granule) {
    if (pointer == nullptr || bytes == 0) {
      throw std::invalid_argument("dma_space::map: empty region (pointer " + hex(reinterpret_cast<std::uintptr_t>(pointer)) +
                                  ", " + std::to_string(bytes) + " bytes)");
    }
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > max_bus_address / 4) {
      throw std::invalid_argument("dma_space::map: alignment " + std::to_string(alignment) + " is not a power of two up to 2^61");
    }
    alignment = std::max(alignment, bus_granule);
    // Asked before the lock: a CUDA query may take a while, and accesses wait on the lock.
    const int gpu = kind == memory_kind::device ? gpu_owning(pointer) : -1;
    std::unique_lock lock(mutex_);
    const std::uint64_t offset = reinterpret_cast<std::uintptr_t>(pointer) % alignment;
    if (bytes > max_bus_address - offset - 2 * alignment) {
      throw std::invalid_argument("dma_space::map: region of " + std::to_string(bytes) + " bytes is larger than the bus");
    }
    // The region (from the alignment boundary before it) and one empty granule after it as a guard.
    const std::uint64_t span = ((offset + bytes + bus_granule - 1) / bus_granule + 1) * bus_granule;
    const auto aligned_next = [&] { return (next_bus_ + alignment - 1) / alignment * alignment; };
    // Skip the ranges of regions placed with map_at (the CMB at the host's CMBMSC.CBA): a
    // buffer aliasing one would send its DMA into the other, and unmapping one would remove
    // the other. Every region placed ahead of next_bus_ is passed at most once.
    // next_bus_ < 2^63 and alignment <= 2^61: rounding it up cannot wrap.
    std::uint64_t start = aligned_next();
    for (;;) {
      if (start > max_bus_address - span) throw std::length_error("dma_space::map: bus address space exhausted");
      auto after = regions_.lower_bound(start + span);
      if (after == regions_.begin()) break;
      const dma_region& before = std::prev(after)->second;
      if (before.bus + before.bytes + bus_granule <= start) break;
      next_bus_ = (before.bus + before.bytes + bus_granule - 1) / bus_granule * bus_granule + bus_granule;
      start = aligned_next();
    }
    const std::uint64_t bus = start + offset;
    next_bus_ = start + span;
    regions_.emplace(bus, dma_region{bus, static_cast<std::byte*>(pointer), bytes, kind, gpu});
    return bus;
  }

  /// Registers a region at a bus address the host chose (the CMB at CMBMSC.CBA).
  /// Returns false when it would overlap a registered region.
  [[nodiscard]] bool map_at(std::uint64_t bus, void* pointer, std::uint64_t bytes, memory_kind kind) {
    if (pointer == nullptr || bytes == 0 || bus + bytes < bus) return false;
    std::unique_lock lock(mutex_);
    auto after = regions_.lower_bound(bus);
    if (after != regions_.end() && after->first < bus + bytes) return false;
    if (after != regions_.begin()) {
      const auto& before = std::prev(after)->second;
      if (before.bus + before.bytes > bus) return false;
    }
    regions_.emplace(bus, dma_region{bus, static_cast<std::byte*>(pointer), bytes, kind});
    return true;
  }

  /// Removes the region starting at `bus`. Waits for accesses in progress (`view`s) to end,
  /// so once it returns the controller will not touch the memory again and it may be freed.
  void unmap(std::uint64_t bus) {
    if (!try_unmap(bus)) throw std::invalid_argument("dma_space::unmap: no region starts at bus address " + hex(bus));
  }

  /// As `unmap`; false, not an exception, when no region starts at `bus` (the controller's
  /// own threads, which must not throw).
  [[nodiscard]] bool try_unmap(std::uint64_t bus) noexcept {
    std::unique_lock lock(mutex_);
    return regions_.erase(bus) != 0;
  }

  /// Accesses through a view see a fixed set of regions: none is unmapped while it lives.
  /// The emulator holds one across each command, from PRP walk to the last byte copied.
  /// Views are shared; a thread must not take a second one while it holds one.
  class view {
   public:
    explicit view(const dma_space& space) : space_(&space), lock_(space.mutex_) {}

    /// The region holding all of [bus, bus + length), if one does. Counts a fault otherwise.
    [[nodiscard]] std::optional<dma_region> find(std::uint64_t bus, std::uint64_t length) const {
      const auto& regions = space_->regions_;
      auto it = regions.upper_bound(bus);
      if (it != regions.begin()) {
        const dma_region& r = std::prev(it)->second;
        if (r.contains(bus, length)) return r;
      }
      space_->faults_.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }

    /// Copies `length` bytes at bus address `bus` to host memory `dst`. False on a fault.
    [[nodiscard]] bool read(std::uint64_t bus, void* dst, std::uint64_t length) const {
      if (length == 0) return true;
      const auto r = find(bus, length);
      return r && copy_out(*r, bus - r->bus, dst, length);
    }

    /// Copies `length` bytes from host memory `src` to bus address `bus`. False on a fault.
    [[nodiscard]] bool write(std::uint64_t bus, const void* src, std::uint64_t length) const {
      if (length == 0) return true;
      const auto r = find(bus, length);
      return r && copy_in(*r, bus - r->bus, src, length);
    }

    /// A 32-bit load with acquire semantics (doorbell shadows written by another agent).
    [[nodiscard]] std::optional<std::uint32_t> load32(std::uint64_t bus) const {
      const auto r = find(bus, 4);
      if (!r || (bus & 3u) != 0) return std::nullopt;
      std::uint32_t value = 0;
      if (r->kind == memory_kind::device) {
        if (!copy_out(*r, bus - r->bus, &value, 4)) return std::nullopt;
        return value;
      }
      return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(r->pointer + (bus - r->bus)))
          .load(std::memory_order_acquire);
    }

    /// A 32-bit store with release semantics: everything written before it is visible to an
    /// agent that sees it (the CQE's last dword, EventIdx).
    [[nodiscard]] bool store32(std::uint64_t bus, std::uint32_t value) const {
      const auto r = find(bus, 4);
      if (!r || (bus & 3u) != 0) return false;
      // The earlier writes complete first: a copier may land the copies it holds in any order
      // (one CUDA batch), and this store publishes them.
      if (r->kind == memory_kind::device) return finish_device_writes() && copy_in(*r, bus - r->bus, &value, 4) && finish_device_writes();
      std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(r->pointer + (bus - r->bus)))
          .store(value, std::memory_order_release);
      return true;
    }

    /// Copies between a region found through this view and host memory.
    [[nodiscard]] bool copy_out(const dma_region& r, std::uint64_t offset, void* dst, std::uint64_t length) const {
      if (r.kind == memory_kind::device) return space_->device_copy(dst, r.pointer + offset, length, false, r.gpu);
      std::memcpy(dst, r.pointer + offset, length);
      return true;
    }
    [[nodiscard]] bool copy_in(const dma_region& r, std::uint64_t offset, const void* src, std::uint64_t length) const {
      if (r.kind == memory_kind::device) return space_->device_copy(r.pointer + offset, src, length, true, r.gpu);
      std::memcpy(r.pointer + offset, src, length);
      return true;
    }

    /// Completes this thread's copies into device regions: call before anyone may look at
    /// the data (before the command's completion is posted). False if one failed.
    [[nodiscard]] bool finish_device_writes() const {
      const auto& c = space_->copier_;
      if (!c.wait || space_->timed([&] { return c.wait(); })) return true;
      space_->faults_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }

   private:
    const dma_space* space_;
    std::shared_lock<std::shared_mutex> lock_;
  };

  [[nodiscard]] view pin() const { return view(*this); }

  // One-shot forms, each under its own view.
  [[nodiscard]] std::optional<dma_region> find(std::uint64_t bus, std::uint64_t length) const { return pin().find(bus, length); }
  [[nodiscard]] bool read(std::uint64_t bus, void* dst, std::uint64_t length) const { return pin().read(bus, dst, length); }
  [[nodiscard]] bool write(std::uint64_t bus, const void* src, std::uint64_t length) const { return pin().write(bus, src, length); }

  /// Installs how device regions are reached (the CUDA layer does this, before the
  /// controller starts); without one, any access to a device region faults.
  void set_device_copier(device_copier copier) { copier_ = std::move(copier); }

  /// Accesses that fell outside every region, or failed to copy, since construction.
  [[nodiscard]] std::uint64_t faults() const noexcept { return faults_.load(std::memory_order_relaxed); }
  /// The device copier's slow calls since construction.
  [[nodiscard]] copier_delays copier_delays_seen() const noexcept {
    copier_delays d;
    d.stalls = copy_stalls_.load(std::memory_order_relaxed);
    d.longest_ns = longest_copy_ns_.load(std::memory_order_relaxed);
    const std::uint64_t now = coarse_now_ns();
    // The two words of the last stall are written one after the other: a stall ending meanwhile
    // may pair one's length with the other's end, which only blurs this diagnosis.
    d.last_stall_ns = last_stall_ns_.load(std::memory_order_relaxed);
    const std::uint64_t ended = last_stall_end_.load(std::memory_order_relaxed);
    if (ended != 0) d.last_stall_ended_ns = now > ended ? now - ended : 0;
    for (const call_start& c : running_calls_) {
      const std::uint64_t started = c.at.load(std::memory_order_relaxed);
      if (started == 0 || started > now || now - started < copier_delays::copy_stall_ns) continue;
      ++d.stalls;
      d.running_stall_ns = std::max(d.running_stall_ns, now - started);
      d.longest_ns = std::max(d.longest_ns, now - started);
    }
    return d;
  }

 private:
  [[nodiscard]] bool device_copy(void* dst, const void* src, std::uint64_t length, bool to_device, int gpu) const {
    if (copier_ && timed([&] { return copier_.copy(dst, src, length, to_device, gpu); })) return true;
    faults_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  /// `call()`, its time noted in `copier_delays_seen`. The coarse clock: a few nanoseconds a
  /// reading (this runs for every copy), its ticks of a few milliseconds enough for stalls of
  /// a second.
  template <class Call>
  [[nodiscard]] bool timed(Call&& call) const {
    const std::uint64_t start = coarse_now_ns();
    std::atomic<std::uint64_t>& running = running_calls_[this_thread_slot()].at;
    running.store(start, std::memory_order_relaxed);
    const bool ok = call();
    running.store(0, std::memory_order_relaxed);
    const std::uint64_t end = coarse_now_ns();
    const std::uint64_t took = end - start;
    if (took >= copier_delays::copy_stall_ns) {
      copy_stalls_.fetch_add(1, std::memory_order_relaxed);
      last_stall_ns_.store(took, std::memory_order_relaxed);
      last_stall_end_.store(end, std::memory_order_relaxed);
    }
    std::uint64_t longest = longest_copy_ns_.load(std::memory_order_relaxed);
    while (took > longest && !longest_copy_ns_.compare_exchange_weak(longest, took, std::memory_order_relaxed)) {
    }
    return ok;
  }
  /// The calling thread's entry in `running_calls_`: threads take them in turn as they first
  /// copy, so the process's first `running_call_slots` copying threads have one each; later
  /// ones share, and a running call may then go unseen (only this diagnosis loses).
  [[nodiscard]] static unsigned this_thread_slot() noexcept {
    static std::atomic<unsigned> next{0};
    thread_local const unsigned slot = next.fetch_add(1, std::memory_order_relaxed) % running_call_slots;
    return slot;
  }
  [[nodiscard]] static std::uint64_t coarse_now_ns() noexcept {
    timespec t{};
    (void)clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(t.tv_nsec);
  }

  /// The GPU of a device region about to be mapped: GPU 0 without a `gpu_of` (one GPU, or a
  /// test's copier); memory the copier places on no GPU is refused, as an IOMMU refuses an
  /// address nothing backs.
  [[nodiscard]] int gpu_owning(const void* pointer) const {
    if (!copier_.gpu_of) return 0;
    const int gpu = copier_.gpu_of(pointer);
    if (gpu < 0) throw std::invalid_argument("dma_space::map: " + hex(reinterpret_cast<std::uintptr_t>(pointer)) + " is not GPU memory CUDA knows");
    return gpu;
  }

  static std::string hex(std::uint64_t v) {
    char text[2 + 16];
    text[0] = '0';
    text[1] = 'x';
    const auto end = std::to_chars(text + 2, text + sizeof text, v, 16).ptr;
    return std::string(text, end);
  }

  mutable std::shared_mutex mutex_;
  std::map<std::uint64_t, dma_region> regions_;
  std::uint64_t next_bus_ = first_bus_address;
  device_copier copier_;
  mutable std::atomic<std::uint64_t> faults_{0};
  mutable std::atomic<std::uint64_t> copy_stalls_{0}, longest_copy_ns_{0}, last_stall_ns_{0}, last_stall_end_{0};
  /// When each thread's copier call now running started (coarse ns; 0: none), a cache line each.
  struct alignas(64) call_start {
    std::atomic<std::uint64_t> at{0};
  };
  static constexpr unsigned running_call_slots = 64;
  mutable std::array<call_start, running_call_slots> running_calls_{};
};

}  // namespace emu
CUNVME_NAMESPACE_END
