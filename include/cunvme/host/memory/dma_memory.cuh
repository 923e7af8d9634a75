// Memory a controller can DMA to, with its bus addresses: the interface every backend's
// allocator implements, and the buffer type it returns.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/error.cuh>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// Where a buffer lives.
enum class memory_location : std::uint8_t {
  pinned_host,  ///< page-locked host memory (GPU-mapped when CUDA registered it)
  gpu,          ///< GPU memory (peer-to-peer DMA)
  controller,   ///< the controller's memory buffer (CMB)
};

/// A buffer and the bus address of each of its pages, as the controller sees them.
/// Move-only; it releases its memory (and its mappings) when destroyed. It may outlive the
/// controller and backend that handed it out: released then, it frees its memory and leaves
/// the mappings, which went with the backend (`backend_link`).
///
/// Usage: examples/snippets/host.cpp, `first_prp`.
class dma_buffer {
 public:
  dma_buffer() = default;
  /// `pages[i]` is the bus address of bytes [i·page_size, (i+1)·page_size) of the buffer;
  /// `release` frees the memory and undoes the mappings.
  dma_buffer(std::byte* host, void* device, std::size_t bytes, std::size_t page_size, std::vector<std::uint64_t> pages,
             memory_location location, std::function<void()> release)
      : host_(host), device_(device), bytes_(bytes), page_size_(page_size), pages_(std::move(pages)), location_(location),
        release_(std::move(release)) {}
  dma_buffer(dma_buffer&& o) noexcept { swap(o); }
  dma_buffer& operator=(dma_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  dma_buffer(const dma_buffer&) = delete;
  dma_buffer& operator=(const dma_buffer&) = delete;
  ~dma_buffer() { reset(); }

  /// Host address of the buffer, or nullptr when the host cannot address it (GPU memory).
  [[nodiscard]] std::byte* data() const noexcept { return host_; }
  /// Device (GPU-usable) address: GPU memory, or pinned memory mapped for the GPU; else nullptr.
  [[nodiscard]] void* device_data() const noexcept { return device_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t page_size() const noexcept { return page_size_; }
  [[nodiscard]] const std::vector<std::uint64_t>& pages() const noexcept { return pages_; }
  [[nodiscard]] memory_location location() const noexcept { return location_; }
  [[nodiscard]] explicit operator bool() const noexcept { return bytes_ != 0; }

  /// The bus address of byte `offset`.
  [[nodiscard]] std::uint64_t bus(std::size_t offset = 0) const { return pages_.at(offset / page_size_) + offset % page_size_; }

  /// The bus address of each `page`-byte piece of the buffer (`page` a power of two), when each
  /// piece is one bus range starting on a multiple of `page`; empty when one is not. What a
  /// PRP list needs of its memory: each list page contiguous and aligned, not the whole list.
  [[nodiscard]] std::vector<std::uint64_t> bus_pages(std::size_t page) const {
    std::vector<std::uint64_t> out;
    if (bytes_ == 0 || page == 0 || (page & (page - 1)) != 0) return out;
    for (std::size_t at = 0; at < bytes_; at += page) {
      const std::size_t length = bytes_ - at < page ? bytes_ - at : page;
      const std::uint64_t start = bus(at);
      if (start % page != 0 || !contiguous(at, length)) return {};
      out.push_back(start);
    }
    return out;
  }

  /// Whether bytes [offset, offset + length) are contiguous in bus address space.
  /// A range outside the buffer is not (and no sum wraps).
  [[nodiscard]] bool contiguous(std::size_t offset, std::size_t length) const {
    if (length == 0) return true;
    if (offset > bytes_ || length > bytes_ - offset) return false;
    const std::size_t first = offset / page_size_, last = (offset + length - 1) / page_size_;
    for (std::size_t p = first; p < last; ++p) {
      if (pages_.at(p + 1) != pages_.at(p) + page_size_) return false;
    }
    return true;
  }

 private:
  void reset() noexcept {
    if (release_) release_();
    release_ = nullptr;
    host_ = nullptr;
    device_ = nullptr;
    bytes_ = 0;
    pages_.clear();
  }
  void swap(dma_buffer& o) noexcept {
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
    std::swap(bytes_, o.bytes_);
    std::swap(page_size_, o.page_size_);
    std::swap(pages_, o.pages_);
    std::swap(location_, o.location_);
    std::swap(release_, o.release_);
  }

  std::byte* host_ = nullptr;
  void* device_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t page_size_ = 4096;
  std::vector<std::uint64_t> pages_;
  memory_location location_ = memory_location::pinned_host;
  std::function<void()> release_;
};

/// What a buffer keeps of the backend that handed it out, so that buffer and backend may go in
/// either order: the backend's mapping state (`Target`: an emulator, a device descriptor) while
/// the backend lives, nothing once it `sever`s the link in its destructor. A buffer released
/// later finds the link severed and only frees its own memory: its mappings went with the
/// backend (the emulator's IOMMU with the emulator, the kernel module's pins with the closed
/// descriptor). The mutex makes a release that runs while the backend is being destroyed on
/// another thread finish before the target goes, or skip it. Allocators hold it through a
/// `std::shared_ptr`, which each buffer's release shares.
template <class Target>
class backend_link {
 public:
  explicit backend_link(Target target) : target_(std::move(target)) {}
  backend_link(const backend_link&) = delete;
  backend_link& operator=(const backend_link&) = delete;

  /// Runs `use(target)` if the backend still lives; it must not throw (releases run in
  /// noexcept destructors).
  template <class Use>
  void if_alive(Use&& use) noexcept {
    const std::lock_guard lock(mutex_);
    if (alive_) use(target_);
  }
  /// The backend is going: later releases leave its state alone.
  void sever() noexcept {
    const std::lock_guard lock(mutex_);
    alive_ = false;
  }

 private:
  std::mutex mutex_;
  Target target_;
  bool alive_ = true;
};

/// The 4 KiB page addresses of `bytes` at bus address `bus`, one bus range (an IOMMU's mapping,
/// the emulator's, memory an owner process mapped for its controller).
[[nodiscard]] inline std::vector<std::uint64_t> bus_range_pages(std::uint64_t bus, std::size_t bytes) {
  std::vector<std::uint64_t> pages((bytes + 4095) / 4096);
  for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = bus + 4096 * i;
  return pages;
}

/// Hands out DMA memory for one controller. Implementations: the emulator's IOMMU,
/// `/proc/self/pagemap` with huge pages (no IOMMU, root), VFIO IOVA mappings, the cunvme
/// kernel module's pins.
class dma_allocator {
 public:
  /// The alignment every buffer has at least: the smallest controller page (CC.MPS = 0).
  static constexpr std::size_t min_alignment = 4096;
  /// The largest controller page (CC.MPS = 15): no structure needs a coarser alignment.
  static constexpr std::size_t max_alignment = std::size_t{1} << 27;

  virtual ~dma_allocator() = default;
  /// `bytes` of zeroed, page-locked host memory whose pages the controller can reach, its
  /// first byte's bus address a multiple of `alignment` (a power of two, 4 KiB..128 MiB).
  /// Queues, PRP lists and the buffers of admin commands must start on a controller page
  /// (CC.MPS, which may exceed 4 KiB when CAP.MPSMIN > 0): pass the controller's page size
  /// for them. Throws `host::error` where the memory cannot be had, aligned as asked.
  [[nodiscard]] dma_buffer allocate(std::size_t bytes, std::size_t alignment = min_alignment) {
    if (alignment < min_alignment || alignment > max_alignment || (alignment & (alignment - 1)) != 0) {
      throw error("Allocate DMA memory", name(), "alignment " + std::to_string(alignment) + " is not a power of two from 4 KiB to 128 MiB");
    }
    dma_buffer b = allocate_aligned(bytes, alignment);
    if (b.pages().empty() || b.bus() % alignment != 0) {
      throw error("Allocate DMA memory", name(), "the memory's bus address is not aligned to " + std::to_string(alignment) + " bytes");
    }
    return b;
  }
  /// Makes `bytes` of GPU memory at `gpu` reachable by the controller (peer-to-peer); throws
  /// `host::error` where the backend cannot.
  [[nodiscard]] virtual dma_buffer map_gpu(void* gpu, std::size_t bytes) = 0;
  /// `map_gpu` for bytes that may start inside a page: where a GPU allocation begins off a
  /// page boundary, the controller must reach exactly [gpu, gpu + bytes), never the bytes
  /// before it, which belong to another allocation. Backends that map whole pages only
  /// (peer-to-peer pinning) refuse such a start, as `map_gpu` does.
  [[nodiscard]] virtual dma_buffer map_gpu_range(void* gpu, std::size_t bytes) { return map_gpu(gpu, bytes); }
  /// Makes `bytes` of host memory at `host` reachable by this controller too: memory another
  /// controller's allocator handed out, so that one buffer (a page cache's slots, say) serves
  /// every controller of a volume. `host` starts on a 4 KiB boundary; the memory must stay
  /// allocated (and, for backends without an IOMMU, where it is) until the returned buffer,
  /// which owns only the mapping, is gone. Throws `host::error` where the backend cannot.
  [[nodiscard]] virtual dma_buffer map_host(void* host, std::size_t bytes) = 0;

  /// Whether `b`'s pages still have the bus addresses it was handed out with, after another
  /// agent pinned it too: cudaHostRegister takes a long-term pin, for which the kernel first
  /// migrates pages out of ZONE_MOVABLE and CMA, which moves memory that only this
  /// allocator's lock held (the pagemap backend's). Backends whose pin is itself long-term
  /// (VFIO, the kernel module) and the emulator keep their addresses.
  [[nodiscard]] virtual bool still_at(const dma_buffer& b) const {
    (void)b;
    return true;
  }

  /// Whether memory another process shares with this allocator's process (a memory file, for a
  /// controller shared by processes: host/sharing/) must be in 2 MiB huge pages to be mapped:
  /// where DMA goes to physical pages only a lock holds (the pagemap backend), the page cache
  /// may move a shared file's small pages.
  [[nodiscard]] virtual bool shared_memory_needs_huge_pages() const { return false; }

 protected:
  /// What every backend's `map_host` checks before it asks the kernel: a non-null start on a
  /// 4 KiB boundary, at least one byte, and whole pages that neither wrap the address space nor
  /// exceed what a page list can describe. Returns `bytes` rounded up to 4 KiB; throws
  /// `host::error` naming the device otherwise.
  [[nodiscard]] std::size_t host_range(const void* host, std::size_t bytes) const {
    const auto start = reinterpret_cast<std::uintptr_t>(host);
    if (host == nullptr || bytes == 0) throw error("Map host memory", name(), "empty range (a null pointer or 0 bytes)");
    if (start % min_alignment != 0) throw error("Map host memory", name(), "host memory must start on a 4 KiB boundary");
    // 2^46 bytes: more than any machine pins, and a page list of it still fits a vector.
    constexpr std::size_t most = std::size_t{1} << 46;
    if (bytes > most || start > UINTPTR_MAX - most) throw error("Map host memory", name(), std::to_string(bytes) + " bytes at this address do not fit the address space");
    return (bytes + min_alignment - 1) / min_alignment * min_alignment;
  }
  /// `allocate` with `alignment` checked: a power of two, 4 KiB..128 MiB.
  [[nodiscard]] virtual dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) = 0;
  /// The device errors are reported for.
  [[nodiscard]] virtual std::string name() const = 0;
};

}  // namespace host
CUNVME_NAMESPACE_END
