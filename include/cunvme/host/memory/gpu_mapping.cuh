// GPU memory mapped into the process for the CPU, write-combined: low-latency CPU copies to
// and from GPU memory without a CUDA call (the CPU role of NVIDIA's gdrcopy). CUDA-free.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/write_combined.cuh>
#include <cunvme/host/error.cuh>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// A CPU mapping of GPU memory, owning it (and whatever pins it): move-only, undone when
/// destroyed.
///
/// The memory is write-combined device memory behind the GPU's BAR: plain pointer accesses
/// work but are the wrong tool (stores are weakly ordered, every load is an uncached round
/// trip over PCIe). `copy_to` and `copy_from` use aligned accesses that never leave the range,
/// fence the stores, and read with streaming loads where the CPU has them. Both are
/// bounds-checked and throw `host::error` for a range outside the mapping.
///
/// Where it comes from: `kmod_allocator::map_gpu_for_cpu` (the cunvme kernel module pins the
/// GPU memory with nvidia_p2p and maps its pages), or the constructor below over memory that
/// something else mapped.
///
/// Usage: examples/snippets/host.cpp, `gpu_flag`.
class gpu_for_cpu_mapping {
 public:
  gpu_for_cpu_mapping() = default;
  /// Takes over `bytes` at `base`, mapped by the caller: another driver's write-combined
  /// mapping of GPU memory, or — for tests of the copy helpers — ordinary memory, where the
  /// copies behave the same. `release` (may be empty) undoes the mapping on destruction;
  /// `device` names it in errors.
  gpu_for_cpu_mapping(std::byte* base, std::size_t bytes, std::string device, std::function<void()> release = {})
      : base_(base), bytes_(bytes), device_(std::move(device)), release_(std::move(release)) {
    if (base_ == nullptr && bytes_ != 0) {
      if (release_) release_();
      throw error("Map GPU memory for the CPU", device_, "no address for " + std::to_string(bytes_) + " bytes");
    }
  }
  gpu_for_cpu_mapping(gpu_for_cpu_mapping&& o) noexcept { swap(o); }
  gpu_for_cpu_mapping& operator=(gpu_for_cpu_mapping&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  gpu_for_cpu_mapping(const gpu_for_cpu_mapping&) = delete;
  gpu_for_cpu_mapping& operator=(const gpu_for_cpu_mapping&) = delete;
  ~gpu_for_cpu_mapping() { reset(); }

  /// The mapping's first byte (write-combined memory: see the class comment).
  [[nodiscard]] std::byte* data() const noexcept { return base_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] explicit operator bool() const noexcept { return bytes_ != 0; }

  /// Writes `n` bytes from `src` at byte `offset` of the mapping, visible to the GPU before
  /// any store the caller makes afterwards.
  void copy_to(std::size_t offset, const void* src, std::size_t n) {
    check("Copy to GPU memory", offset, n, src);
    access::copy_to_write_combined(base_ + offset, static_cast<const std::byte*>(src), n);
  }

  /// Reads `n` bytes at byte `offset` of the mapping into `dst`.
  void copy_from(std::size_t offset, void* dst, std::size_t n) const {
    check("Copy from GPU memory", offset, n, dst);
    access::copy_from_write_combined(static_cast<std::byte*>(dst), base_ + offset, n);
  }

 private:
  void check(const char* operation, std::size_t offset, std::size_t n, const void* buffer) const {
    // Compared without forming offset + n, which may wrap.
    if (offset > bytes_ || n > bytes_ - offset) {
      throw error(operation, device_,
                  "bytes [" + std::to_string(offset) + ", +" + std::to_string(n) + ") run past the mapping's " + std::to_string(bytes_));
    }
    if (buffer == nullptr && n != 0) throw error(operation, device_, "no buffer for " + std::to_string(n) + " bytes");
  }
  void reset() noexcept {
    if (release_) release_();
    release_ = nullptr;
    base_ = nullptr;
    bytes_ = 0;
  }
  void swap(gpu_for_cpu_mapping& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(device_, o.device_);
    std::swap(release_, o.release_);
  }

  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string device_;
  std::function<void()> release_;
};

}  // namespace host
CUNVME_NAMESPACE_END
