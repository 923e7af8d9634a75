/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * The cunvme module's user interface: one character device /dev/cunvme/<BDF> per NVMe
 * controller bound to the module, these ioctls, and mmap offsets that select a BAR or a
 * pin of GPU memory.
 *
 * The one definition of the ABI: the module (kmod/, whose Kbuild puts include/ on its path)
 * and the library (host/backend/kmod_abi.cuh, C++ names over these) both include this file, as
 * gdrcopy's user library includes gdrdrv.h. Plain C for the kernel and for user space (C or
 * C++, 64- or 32-bit: every field is naturally aligned, so i386 lays them out the same and
 * compat_ioctl passes them through). Each side asserts the sizes, offsets and request numbers
 * it was written against: the module in cunvme_check_abi(), the library in kmod_abi.cuh,
 * C user space in test/kmod/kmod_abi.c. Changing any of them means a new CUNVME_ABI_VERSION.
 */
#ifndef CUNVME_IOCTL_H
#define CUNVME_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define CUNVME_ABI_VERSION 1
#define CUNVME_BAR_COUNT 6

/* mmap offset of BAR i: i << CUNVME_BAR_MMAP_SHIFT (plus a page-aligned offset into it). */
#define CUNVME_BAR_MMAP_SHIFT 40

/*
 * mmap offset of the GPU memory pinned under `handle` (CUNVME_PIN_GPU_MEMORY): maps its 64 KiB
 * GPU pages into the process, write-combined, for CPU copies to and from GPU memory (what
 * NVIDIA's gdrcopy does). MAP_SHARED, from the pin's first byte, a multiple of 64 KiB long and
 * no longer than the pin. A GPU pin's handle advances the handle counter by its number of
 * 64 KiB pages, so the offset ranges of two pins never overlap.
 *
 * The pages are mapped as they are first touched. When the pin goes (UNPIN, close, or the
 * NVIDIA driver revoking the memory through its free callback) the module removes the pages
 * from every mapping of it before the GPU memory is let go; a later touch gets SIGBUS.
 *
 * Errnos: ENOENT (no pin with that handle in this file), EINVAL (not MAP_SHARED, not at the
 * pin's start, not whole 64 KiB pages, or a host-memory pin: that memory is the process's
 * already), ERANGE (longer than the pin), EOPNOTSUPP (a dma-buf's handle: the module has only
 * its DMA addresses, which are not CPU physical addresses; mmap the dma-buf itself), ENOLINK
 * (the NVIDIA driver revoked that pin's memory), and what reserving the pages' memory type
 * (x86 PAT) returns.
 */
#define CUNVME_GPU_MMAP_BASE (1ULL << 56)
#define CUNVME_GPU_MMAP_SHIFT 16
#define CUNVME_GPU_MMAP_OFFSET(handle) (CUNVME_GPU_MMAP_BASE + ((__u64)(handle) << CUNVME_GPU_MMAP_SHIFT))

/* cunvme_device_info.flags */
#define CUNVME_INFO_GPU_PINNING (1u << 0) /* built with nvidia_p2p: GPU memory can be pinned */
#define CUNVME_INFO_DMA_BUF (1u << 1)      /* dma-buf import: CUNVME_IOCTL_MAP_DMA_BUF */
/*
 * A dma-buf this open file had mapped was revoked by its exporter (move_notify): the module
 * turned the controller's bus mastering off so that no command, in flight or later, can reach
 * the memory. PIN and MAP_DMA_BUF fail with ENOLINK until the file is closed; the next open
 * starts afresh.
 */
#define CUNVME_INFO_DMA_REVOKED (1u << 2)
/* GPU pins can be mapped into the process: mmap at CUNVME_GPU_MMAP_OFFSET(handle) */
#define CUNVME_INFO_GPU_MAPPING (1u << 3)

/* cunvme_pin_request.flags */
#define CUNVME_PIN_GPU_MEMORY (1u << 0) /* address is CUDA device memory (64 KiB pages) */

/* CUNVME_IOCTL_INFO: what the module reports about its controller. */
struct cunvme_device_info {
	__u32 abi_version;
	__u32 flags;
	__u64 bar_size[CUNVME_BAR_COUNT];        /* bytes of each memory BAR; 0 where absent */
	__u64 bar_bus_address[CUNVME_BAR_COUNT]; /* each BAR as the controller's peers see it */
	__u64 max_pinned_bytes;                  /* what this open file may pin in all */
};

/*
 * CUNVME_IOCTL_PIN: pins [address, address + bytes) of the calling process and writes the DMA
 * address of each page, as the controller sees it, to the user array `addresses`.
 */
struct cunvme_pin_request {
	__u64 address;       /* in: page aligned (64 KiB for GPU memory) */
	__u64 bytes;         /* in: a multiple of the page size, not 0 */
	__u64 addresses;     /* in: user pointer to max_addresses __u64 slots */
	__u32 max_addresses; /* in */
	__u32 flags;         /* in: CUNVME_PIN_* */
	__u64 handle;        /* out: for UNPIN (and mmap of GPU memory); never 0, never reused */
	__u32 count;         /* out: addresses written */
	__u32 page_shift;    /* out: log2 of the page size the addresses are in */
};

/*
 * CUNVME_IOCTL_MAP_DMA_BUF: attaches the dma-buf `fd` (GPU memory exported with
 * cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), or any other exporter's)
 * to the controller, maps it for the controller's DMA and writes the DMA address of each page
 * of [offset, offset + bytes) of it to the user array `addresses`, like CUNVME_IOCTL_PIN. The
 * module holds its own reference: the caller may close `fd` afterwards. Released with
 * CUNVME_IOCTL_UNPIN (the handles are PIN's), on close and when the process dies. The bytes
 * count against max_pinned_bytes; the exporter maps the whole dma-buf, only the range's
 * addresses are handed out.
 *
 * Revocation (the exporter's move_notify, e.g. the memory going away while mapped): the
 * module turns the controller's bus mastering off, then unmaps the dma-buf; the handle (and
 * the module's pin of the dma-buf) stays until UNPIN or close, and INFO reports
 * CUNVME_INFO_DMA_REVOKED. What the controller may
 * still do: commands in flight can no longer move data or post completions (the queues are in
 * memory it cannot reach either) and never complete; memory writes it had already issued
 * before bus mastering went off may still land within the fabric's latency. The process has
 * to close the device (which disables and resets the controller, /sys/class/cunvme/<BDF>/resets)
 * and open it again.
 *
 * Errnos besides PIN's: EBADF/EINVAL (fd is no dma-buf), ERANGE (the range runs past the
 * dma-buf), ENOLINK (a dma-buf of this file was revoked), EIO (the exporter's mapping is not
 * in whole pages), and whatever the exporter's attach/map returns.
 */
struct cunvme_dma_buf_request {
	__s32 fd;            /* in: the dma-buf */
	__u32 flags;         /* in: 0 */
	__u64 offset;        /* in: page aligned */
	__u64 bytes;         /* in: a multiple of the page size, not 0 */
	__u64 addresses;     /* in: user pointer to max_addresses __u64 slots */
	__u32 max_addresses; /* in */
	__u32 page_shift;    /* out: log2 of the page size the addresses are in */
	__u64 handle;        /* out: for CUNVME_IOCTL_UNPIN; never 0, never reused */
	__u32 count;         /* out: addresses written */
	__u32 reserved;      /* in: 0 */
};

/* CUNVME_IOCTL_UNPIN: releases one pin (or dma-buf mapping) of this open file. */
struct cunvme_unpin_request {
	__u64 handle;
};

#define CUNVME_IOCTL_MAGIC 'C'
#define CUNVME_IOCTL_INFO _IOR(CUNVME_IOCTL_MAGIC, 1, struct cunvme_device_info)
#define CUNVME_IOCTL_PIN _IOWR(CUNVME_IOCTL_MAGIC, 2, struct cunvme_pin_request)
#define CUNVME_IOCTL_UNPIN _IOW(CUNVME_IOCTL_MAGIC, 3, struct cunvme_unpin_request)
#define CUNVME_IOCTL_MAP_DMA_BUF _IOWR(CUNVME_IOCTL_MAGIC, 4, struct cunvme_dma_buf_request)

#endif /* CUNVME_IOCTL_H */
