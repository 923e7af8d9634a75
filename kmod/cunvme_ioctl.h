/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * The cunvme module's user interface: one character device /dev/cunvme/<BDF> per NVMe
 * controller bound to the module, these ioctls, and mmap offsets that select a BAR.
 *
 * cunvme's C++ side (include/cunvme/host/kmod_abi.cuh) lays these out byte for byte the same;
 * the module checks sizes, offsets and request numbers at build time (BUILD_BUG_ON in
 * cunvme_check_abi()) and the guest test (test/kmod/kmod_negative.cpp) checks that both
 * headers agree.
 */
#ifndef CUNVME_IOCTL_H
#define CUNVME_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define CUNVME_ABI_VERSION 1
#define CUNVME_BAR_COUNT 6

/* mmap offset of BAR i: i << CUNVME_BAR_MMAP_SHIFT (plus a page-aligned offset into it). */
#define CUNVME_BAR_MMAP_SHIFT 40

/* cunvme_device_info.flags */
#define CUNVME_INFO_GPU_PINNING (1u << 0) /* built with nvidia_p2p: GPU memory can be pinned */

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
	__u64 handle;        /* out: for CUNVME_IOCTL_UNPIN; never 0, never reused */
	__u32 count;         /* out: addresses written */
	__u32 page_shift;    /* out: log2 of the page size the addresses are in */
};

/* CUNVME_IOCTL_UNPIN: releases one pin of this open file. */
struct cunvme_unpin_request {
	__u64 handle;
};

#define CUNVME_IOCTL_MAGIC 'C'
#define CUNVME_IOCTL_INFO _IOR(CUNVME_IOCTL_MAGIC, 1, struct cunvme_device_info)
#define CUNVME_IOCTL_PIN _IOWR(CUNVME_IOCTL_MAGIC, 2, struct cunvme_pin_request)
#define CUNVME_IOCTL_UNPIN _IOW(CUNVME_IOCTL_MAGIC, 3, struct cunvme_unpin_request)

#endif /* CUNVME_IOCTL_H */
