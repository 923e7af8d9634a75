// The user-space side of the cunvme kernel module's interface (kmod/): a character device
// /dev/cunvme/<BDF> per controller the module is bound to, these ioctls, and mmap offsets
// that select a BAR or a pin of GPU memory. The module's C header must lay these out byte for byte the same; its
// build checks the sizes and request numbers below.
#pragma once

#include <cunvme/config.cuh>

#include <cstddef>
#include <cstdint>

CUNVME_NAMESPACE_BEGIN
namespace host::kmod {

inline constexpr std::uint32_t abi_version = 1;

/// What the module reports about its controller (CUNVME_IOCTL_INFO).
struct device_info {
  std::uint32_t abi_version;
  std::uint32_t flags;                 ///< info_gpu_pinning, info_dma_buf, info_dma_revoked, info_gpu_mapping
  std::uint64_t bar_size[6];           ///< bytes of each BAR; 0 where absent
  std::uint64_t bar_bus_address[6];    ///< each BAR's address as the controller's peers see it
  std::uint64_t max_pinned_bytes;      ///< what this open device may have pinned at once (the module's
                                       ///< max_pinned_mb; also RLIMIT_MEMLOCK without CAP_IPC_LOCK)
};
static_assert(sizeof(device_info) == 112);
static_assert(offsetof(device_info, bar_size) == 8);
static_assert(offsetof(device_info, bar_bus_address) == 56);
static_assert(offsetof(device_info, max_pinned_bytes) == 104);

inline constexpr std::uint32_t info_gpu_pinning = 1u << 0;  ///< built with nvidia_p2p: GPU memory can be pinned
inline constexpr std::uint32_t info_dma_buf = 1u << 1;      ///< dma-bufs can be mapped (ioctl_map_dma_buf)
/// A dma-buf this open device had mapped was revoked by its exporter: the module turned the
/// controller's bus mastering off; pins and maps fail with ENOLINK until the device is closed.
inline constexpr std::uint32_t info_dma_revoked = 1u << 2;
/// GPU pins can be mapped into the process (mmap at `gpu_mmap_offset(handle)`).
inline constexpr std::uint32_t info_gpu_mapping = 1u << 3;
inline constexpr std::uint32_t pin_gpu_memory = 1u << 0;

/// Pins [address, address + bytes) of this process (host memory, or GPU memory with
/// `pin_gpu_memory`) and writes the DMA address of each page, as the controller sees it, to
/// `addresses` (CUNVME_IOCTL_PIN).
struct pin_request {
  std::uint64_t address;        ///< in: virtual address (page aligned; 64 KiB for GPU memory)
  std::uint64_t bytes;          ///< in
  std::uint64_t addresses;      ///< in: user pointer to `max_addresses` 64-bit slots
  std::uint32_t max_addresses;  ///< in
  std::uint32_t flags;          ///< in
  std::uint64_t handle;         ///< out: for unpin
  std::uint32_t count;          ///< out: pages written
  std::uint32_t page_shift;     ///< out: 12 for host pages, 16 for GPU pages
};
static_assert(sizeof(pin_request) == 48);
static_assert(offsetof(pin_request, handle) == 32);
static_assert(offsetof(pin_request, page_shift) == 44);

/// Maps [offset, offset + bytes) of the dma-buf `fd` for the controller and writes the DMA
/// address of each page to `addresses` (CUNVME_IOCTL_MAP_DMA_BUF). Released by unpin.
struct dma_buf_request {
  std::int32_t fd;              ///< in: the dma-buf (the module keeps its own reference)
  std::uint32_t flags;          ///< in: 0
  std::uint64_t offset;         ///< in: page aligned, within the dma-buf
  std::uint64_t bytes;          ///< in: whole pages, not 0
  std::uint64_t addresses;      ///< in: user pointer to `max_addresses` 64-bit slots
  std::uint32_t max_addresses;  ///< in
  std::uint32_t page_shift;     ///< out: log2 of the page size of `addresses`
  std::uint64_t handle;         ///< out: for unpin
  std::uint32_t count;          ///< out: pages written
  std::uint32_t reserved;       ///< in: 0
};
static_assert(sizeof(dma_buf_request) == 56);
static_assert(offsetof(dma_buf_request, offset) == 8);
static_assert(offsetof(dma_buf_request, max_addresses) == 32);
static_assert(offsetof(dma_buf_request, handle) == 40);
static_assert(offsetof(dma_buf_request, count) == 48);

struct unpin_request {
  std::uint64_t handle;
};
static_assert(sizeof(unpin_request) == 8);

/// Linux's _IOC encoding (asm-generic/ioctl.h): dir 31:30, size 29:16, type 15:8, nr 7:0.
[[nodiscard]] constexpr unsigned long ioctl_request(unsigned dir, unsigned nr, std::size_t size) noexcept {
  return (static_cast<unsigned long>(dir) << 30) | (static_cast<unsigned long>(size) << 16) | (static_cast<unsigned long>('C') << 8) | nr;
}
inline constexpr unsigned ioc_write = 1, ioc_read = 2;
inline constexpr unsigned long ioctl_info = ioctl_request(ioc_read, 1, sizeof(device_info));
inline constexpr unsigned long ioctl_pin = ioctl_request(ioc_read | ioc_write, 2, sizeof(pin_request));
inline constexpr unsigned long ioctl_unpin = ioctl_request(ioc_write, 3, sizeof(unpin_request));
inline constexpr unsigned long ioctl_map_dma_buf = ioctl_request(ioc_read | ioc_write, 4, sizeof(dma_buf_request));

/// mmap offset selecting BAR `index` of the device node (uncached mapping).
[[nodiscard]] constexpr std::uint64_t bar_mmap_offset(unsigned index) noexcept { return std::uint64_t{index} << 40; }

/// mmap offset of the GPU memory pinned under `handle` (pin_gpu_memory): a write-combined
/// mapping of its 64 KiB pages, MAP_SHARED, from the pin's start, whole 64 KiB pages, at most
/// the pin's length. Gone (SIGBUS on touch) once the pin is released or the NVIDIA driver
/// revokes the memory.
[[nodiscard]] constexpr std::uint64_t gpu_mmap_offset(std::uint64_t handle) noexcept {
  return (std::uint64_t{1} << 56) + (handle << 16);
}

}  // namespace host::kmod
CUNVME_NAMESPACE_END
