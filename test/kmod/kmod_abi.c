/*
 * The module's ioctl ABI header as a C program in user space sees it (kmod_test.sh abi-c builds
 * this natively and, where the compiler can, for i386, whose 64-bit fields are only 4-byte
 * aligned: the module's compat_ioctl takes the same structures from 32-bit processes). The
 * header comes first, alone: it has to bring everything it needs. The numbers are the ABI
 * the module and host/backend/kmod_abi.cuh assert too; a change to any of them is a new ABI version.
 */
#include <cunvme/kmod/cunvme_ioctl.h>

#include <stddef.h>

_Static_assert(CUNVME_ABI_VERSION == 1, "ABI version");
_Static_assert(sizeof(struct cunvme_device_info) == 112, "cunvme_device_info size");
_Static_assert(offsetof(struct cunvme_device_info, flags) == 4, "cunvme_device_info.flags");
_Static_assert(offsetof(struct cunvme_device_info, bar_size) == 8, "cunvme_device_info.bar_size");
_Static_assert(offsetof(struct cunvme_device_info, bar_bus_address) == 56, "cunvme_device_info.bar_bus_address");
_Static_assert(offsetof(struct cunvme_device_info, max_pinned_bytes) == 104, "cunvme_device_info.max_pinned_bytes");
_Static_assert(sizeof(struct cunvme_pin_request) == 48, "cunvme_pin_request size");
_Static_assert(offsetof(struct cunvme_pin_request, max_addresses) == 24, "cunvme_pin_request.max_addresses");
_Static_assert(offsetof(struct cunvme_pin_request, handle) == 32, "cunvme_pin_request.handle");
_Static_assert(offsetof(struct cunvme_pin_request, page_shift) == 44, "cunvme_pin_request.page_shift");
_Static_assert(sizeof(struct cunvme_dma_buf_request) == 56, "cunvme_dma_buf_request size");
_Static_assert(offsetof(struct cunvme_dma_buf_request, offset) == 8, "cunvme_dma_buf_request.offset");
_Static_assert(offsetof(struct cunvme_dma_buf_request, max_addresses) == 32, "cunvme_dma_buf_request.max_addresses");
_Static_assert(offsetof(struct cunvme_dma_buf_request, handle) == 40, "cunvme_dma_buf_request.handle");
_Static_assert(offsetof(struct cunvme_dma_buf_request, count) == 48, "cunvme_dma_buf_request.count");
_Static_assert(sizeof(struct cunvme_unpin_request) == 8, "cunvme_unpin_request size");
_Static_assert(CUNVME_IOCTL_INFO == 0x80704301u, "_IOR('C', 1, 112 bytes)");
_Static_assert(CUNVME_IOCTL_PIN == 0xc0304302u, "_IOWR('C', 2, 48 bytes)");
_Static_assert(CUNVME_IOCTL_UNPIN == 0x40084303u, "_IOW('C', 3, 8 bytes)");
_Static_assert(CUNVME_IOCTL_MAP_DMA_BUF == 0xc0384304u, "_IOWR('C', 4, 56 bytes)");
_Static_assert(CUNVME_GPU_MMAP_OFFSET(1) == 0x0100000000010000ull, "GPU pin mmap offset");
_Static_assert(CUNVME_GPU_MMAP_BASE > ((__u64)CUNVME_BAR_COUNT << CUNVME_BAR_MMAP_SHIFT),
	       "GPU pins' mmap offsets lie above every BAR's");

int main(void)
{
	return 0;
}
