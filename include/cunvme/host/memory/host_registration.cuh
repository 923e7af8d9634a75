// Host mappings made addressable by GPU threads: a real controller's BAR (doorbells, CMB) and
// the DMA memory its queues and PRP lists live in (tier 1). The registering itself is CUDA's
// (`host::gpu_registrar()` in <cunvme/host/gpu/gpu_reach.cuh>); here is what host code keeps of
// it, so bring-up names no CUDA type.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// One host range registered for GPU threads: its GPU-usable address, undone (unregistered)
/// when destroyed. Move-only.
class host_registration {
 public:
  host_registration() = default;
  host_registration(void* device, std::function<void()> undo) : device_(device), undo_(std::move(undo)) {}
  host_registration(host_registration&& o) noexcept : device_(std::exchange(o.device_, nullptr)), undo_(std::exchange(o.undo_, nullptr)) {}
  host_registration& operator=(host_registration&& o) noexcept {
    if (this != &o) {
      release();
      device_ = std::exchange(o.device_, nullptr);
      undo_ = std::exchange(o.undo_, nullptr);
    }
    return *this;
  }
  host_registration(const host_registration&) = delete;
  host_registration& operator=(const host_registration&) = delete;
  ~host_registration() { release(); }

  [[nodiscard]] void* device() const noexcept { return device_; }
  [[nodiscard]] explicit operator bool() const noexcept { return device_ != nullptr; }

 private:
  void release() noexcept {
    if (undo_) undo_();
    undo_ = nullptr;
    device_ = nullptr;
  }
  void* device_ = nullptr;
  std::function<void()> undo_;
};

/// Registers `bytes` of host memory at `host` for GPU threads and returns its GPU address;
/// `io_memory`: the range maps a device's MMIO (a BAR), not RAM. `what` and `device` name it
/// in errors. Throws `host::error` where the GPU driver refuses, saying what to do.
using host_registrar =
    std::function<host_registration(void* host, std::size_t bytes, bool io_memory, const std::string& what, const std::string& device)>;

/// A backend's DMA allocator whose buffers come back registered for GPU threads
/// (`dma_buffer::device_data`), and are unregistered before the backend unpins and unmaps
/// them. GPU memory mapped for the controller passes through untouched.
class registering_allocator final : public dma_allocator {
 public:
  registering_allocator(dma_allocator& inner, host_registrar registrar, std::string device)
      : inner_(inner), registrar_(std::move(registrar)), device_(std::move(device)) {}

  [[nodiscard]] dma_buffer map_gpu(void* gpu, std::size_t bytes) override { return inner_.map_gpu(gpu, bytes); }
  [[nodiscard]] dma_buffer map_gpu_range(void* gpu, std::size_t bytes) override { return inner_.map_gpu_range(gpu, bytes); }
  /// The memory is registered for GPU threads by the allocator that handed it out (if at all).
  [[nodiscard]] dma_buffer map_host(void* host, std::size_t bytes) override { return inner_.map_host(host, bytes); }

 protected:
  [[nodiscard]] std::string name() const override { return device_; }

  [[nodiscard]] dma_buffer allocate_aligned(std::size_t bytes, std::size_t alignment) override {
    auto inner = std::make_shared<dma_buffer>(inner_.allocate(bytes, alignment));
    if (inner->device_data() != nullptr || inner->data() == nullptr) return std::move(*inner);  // GPU-usable already
    auto registration = std::make_shared<host_registration>(registrar_(inner->data(), inner->size(), false, "DMA memory", device_));
    if (!inner_.still_at(*inner)) {
      throw error("Register DMA memory for GPU threads", device_,
                  "registering moved the memory's pages (the kernel migrates movable pages before a long-term pin): the bus addresses "
                  "taken before are stale; reserve huge pages (/proc/sys/vm/nr_hugepages) or use vfio: or kmod:");
    }
    std::byte* host = inner->data();
    const std::size_t size = inner->size(), page = inner->page_size();
    std::vector<std::uint64_t> pages = inner->pages();
    const memory_location location = inner->location();
    void* device = registration->device();
    // Unregistered first, then given back to the backend (unpinned, unmapped).
    return dma_buffer(host, device, size, page, std::move(pages), location, [inner, registration]() mutable {
      registration.reset();
      inner.reset();
    });
  }

 private:
  dma_allocator& inner_;
  host_registrar registrar_;
  std::string device_;
};

}  // namespace host
CUNVME_NAMESPACE_END
