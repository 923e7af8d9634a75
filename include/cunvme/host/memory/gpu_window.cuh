// Which bytes of a GPU allocation a transfer maps for the controller, and the page table a
// PRP builder reads for them. Host code without CUDA: the allocation's range comes from the
// caller (`copy_n` asks the driver with cuMemGetAddressRange), so the arithmetic is tested
// everywhere.
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/detail/checked.cuh>
#include <cunvme/host/memory/dma_memory.cuh>
#include <cunvme/host/error.cuh>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

CUNVME_NAMESPACE_BEGIN
namespace host {

/// The part of one GPU allocation to map for a transfer: from the GPU page (`gpu_page`
/// bytes, 64 KiB on NVIDIA GPUs) holding the transfer's first byte, or from the allocation's
/// start where that page begins before it, to the transfer's end. Never a byte outside the
/// allocation: on real hardware that memory belongs to someone else (or to nobody, and
/// pinning it fails).
struct gpu_window {
  std::uintptr_t start = 0;
  std::size_t bytes = 0;

  /// The window for `bytes` at `address` inside the allocation [`base`, `base` + `size`).
  /// Throws `host::error` when the transfer leaves the allocation or its end wraps.
  [[nodiscard]] static gpu_window of(std::uintptr_t address, std::size_t bytes, std::uintptr_t base, std::size_t size, std::size_t gpu_page,
                                     const std::string& device) {
    std::uintptr_t end = 0, allocation_end = 0;
    if (bytes == 0 || gpu_page == 0 || (gpu_page & (gpu_page - 1)) != 0) {
      throw error("Map GPU memory", device, "an empty transfer or a GPU page that is not a power of two");
    }
    if (cunvme::detail::add_overflows(address, bytes, end) || cunvme::detail::add_overflows(base, size, allocation_end) || address < base ||
        end > allocation_end) {
      throw error("Map GPU memory", device,
                  std::to_string(bytes) + " bytes at GPU address " + std::to_string(address) + " run outside their allocation [" + std::to_string(base) +
                      ", " + std::to_string(base) + " + " + std::to_string(size) + ")");
    }
    const std::uintptr_t page_start = address / gpu_page * gpu_page;
    gpu_window w;
    w.start = page_start >= base ? page_start : base;
    w.bytes = end - w.start;
    return w;
  }
};

/// A page table for a PRP builder (`prp::page_list`) over `mapped`, the buffer a backend
/// returned for `window`: entry k is the bus address of the k-th page (of `mapped`'s page
/// size) counted from the page holding `window.start`, and `offset` is where byte `address`
/// lies in those pages. The first page may begin before the window (a window starts at an
/// allocation's unaligned base); it is never transferred to, only named as PRP1's page.
struct gpu_page_table {
  std::vector<std::uint64_t> pages;
  unsigned page_shift = 12;
  std::uint64_t offset = 0;

  [[nodiscard]] static gpu_page_table of(const dma_buffer& mapped, gpu_window window, std::uintptr_t address, const std::string& device) {
    const std::size_t page = mapped.page_size();
    if (page < 4096 || (page & (page - 1)) != 0 || mapped.size() < window.bytes || address < window.start) {
      throw error("Map GPU memory", device, "the mapping does not cover the transfer in whole power-of-two pages");
    }
    gpu_page_table t;
    t.page_shift = static_cast<unsigned>(std::countr_zero(page));
    const std::uintptr_t origin = window.start / page * page;
    const std::size_t lead = window.start - origin;  // bytes of the first page before the window
    t.offset = address - origin;
    const std::size_t count = (lead + window.bytes + page - 1) / page;
    t.pages.resize(count);
    // Page 0 starts `lead` bytes before the window; it and the window's start share a page,
    // so one subtraction gives its start. Later pages start inside the window.
    t.pages[0] = mapped.bus(0) - lead;
    for (std::size_t k = 1; k < count; ++k) t.pages[k] = mapped.bus(k * page - lead);
    return t;
  }
};

}  // namespace host
CUNVME_NAMESPACE_END
