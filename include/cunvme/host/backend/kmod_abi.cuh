// C++ names over the cunvme kernel module's interface (kmod/): a character device
// /dev/cunvme/<BDF> per controller the module is bound to, its ioctls, and mmap offsets that
// select a BAR or a pin of GPU memory. The structures and numbers are the module's own C
// header, <cunvme/kmod/cunvme_ioctl.h>, included here: the ABI is defined once. What this file
// adds is constexpr names in host::kmod and the layout the library was written against,
// asserted field by field (the module asserts the same in cunvme_check_abi()).
#pragma once

#include <cunvme/config.cuh>
#include <cunvme/kmod/cunvme_ioctl.h>

#include <cstddef>
#include <cstdint>

CUNVME_NAMESPACE_BEGIN
namespace host::kmod {

inline constexpr std::uint32_t abi_version = CUNVME_ABI_VERSION;

/// What the module reports about its controller (CUNVME_IOCTL_INFO).
using device_info = ::cunvme_device_info;
/// Pins [address, address + bytes) of this process (host memory, or GPU memory with
/// `pin_gpu_memory`) and returns the DMA address of each page (CUNVME_IOCTL_PIN).
using pin_request = ::cunvme_pin_request;
/// Maps a range of a dma-buf for the controller (CUNVME_IOCTL_MAP_DMA_BUF). Released by unpin.
using dma_buf_request = ::cunvme_dma_buf_request;
using unpin_request = ::cunvme_unpin_request;

// The layout of ABI version 1; a change to it comes with a new version, checked at open.
static_assert(abi_version == 1);
static_assert(sizeof(device_info) == 112);
static_assert(offsetof(device_info, flags) == 4);
static_assert(offsetof(device_info, bar_size) == 8);
static_assert(offsetof(device_info, bar_bus_address) == 56);
static_assert(offsetof(device_info, max_pinned_bytes) == 104);
static_assert(sizeof(device_info::bar_size) / sizeof(device_info::bar_size[0]) == CUNVME_BAR_COUNT);
static_assert(sizeof(pin_request) == 48);
static_assert(offsetof(pin_request, bytes) == 8);
static_assert(offsetof(pin_request, addresses) == 16);
static_assert(offsetof(pin_request, max_addresses) == 24);
static_assert(offsetof(pin_request, flags) == 28);
static_assert(offsetof(pin_request, handle) == 32);
static_assert(offsetof(pin_request, count) == 40);
static_assert(offsetof(pin_request, page_shift) == 44);
static_assert(sizeof(dma_buf_request) == 56);
static_assert(offsetof(dma_buf_request, flags) == 4);
static_assert(offsetof(dma_buf_request, offset) == 8);
static_assert(offsetof(dma_buf_request, bytes) == 16);
static_assert(offsetof(dma_buf_request, addresses) == 24);
static_assert(offsetof(dma_buf_request, max_addresses) == 32);
static_assert(offsetof(dma_buf_request, page_shift) == 36);
static_assert(offsetof(dma_buf_request, handle) == 40);
static_assert(offsetof(dma_buf_request, count) == 48);
static_assert(offsetof(dma_buf_request, reserved) == 52);
static_assert(sizeof(unpin_request) == 8);

inline constexpr std::uint32_t info_gpu_pinning = CUNVME_INFO_GPU_PINNING;  ///< built with nvidia_p2p: GPU memory can be pinned
inline constexpr std::uint32_t info_dma_buf = CUNVME_INFO_DMA_BUF;          ///< dma-bufs can be mapped (ioctl_map_dma_buf)
/// A dma-buf this open device had mapped was revoked by its exporter: the module turned the
/// controller's bus mastering off; pins and maps fail with ENOLINK until the device is closed.
inline constexpr std::uint32_t info_dma_revoked = CUNVME_INFO_DMA_REVOKED;
/// GPU pins can be mapped into the process (mmap at `gpu_mmap_offset(handle)`).
inline constexpr std::uint32_t info_gpu_mapping = CUNVME_INFO_GPU_MAPPING;
inline constexpr std::uint32_t pin_gpu_memory = CUNVME_PIN_GPU_MEMORY;

inline constexpr unsigned long ioctl_info = CUNVME_IOCTL_INFO;
inline constexpr unsigned long ioctl_pin = CUNVME_IOCTL_PIN;
inline constexpr unsigned long ioctl_unpin = CUNVME_IOCTL_UNPIN;
inline constexpr unsigned long ioctl_map_dma_buf = CUNVME_IOCTL_MAP_DMA_BUF;
// Linux's _IOC encoding (dir 31:30, size 29:16, type 15:8, nr 7:0) of the sizes above.
static_assert(ioctl_info == 0x80704301ul && ioctl_pin == 0xc0304302ul && ioctl_unpin == 0x40084303ul &&
              ioctl_map_dma_buf == 0xc0384304ul);

/// mmap offset selecting BAR `index` of the device node (uncached mapping).
[[nodiscard]] constexpr std::uint64_t bar_mmap_offset(unsigned index) noexcept {
  return std::uint64_t{index} << CUNVME_BAR_MMAP_SHIFT;
}

/// mmap offset of the GPU memory pinned under `handle` (pin_gpu_memory): a write-combined
/// mapping of its 64 KiB pages, MAP_SHARED, from the pin's start, whole 64 KiB pages, at most
/// the pin's length. Gone (SIGBUS on touch) once the pin is released or the NVIDIA driver
/// revokes the memory.
[[nodiscard]] constexpr std::uint64_t gpu_mmap_offset(std::uint64_t handle) noexcept {
  return CUNVME_GPU_MMAP_OFFSET(handle);
}

}  // namespace host::kmod
CUNVME_NAMESPACE_END
