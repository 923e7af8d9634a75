/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The module's internals, shared by its objects (Kbuild):
 *   core.o    the PCI driver, the class and its sysfs counters, module load and unload
 *   file.o    /dev/cunvme/<BDF>: open, release, the ioctl and mmap entry points, INFO
 *   bar.o     mmap of a memory BAR
 *   pin.o     pins of host memory, the pin table of an open file, PIN and UNPIN, the lookup
 *             behind mmap of a GPU pin
 *   dmabuf.o  dma-buf import (MAP_DMA_BUF); built where the kernel has CONFIG_DMA_SHARED_BUFFER
 *   p2p.o     GPU memory through nvidia_p2p and its CPU mapping; built with NVIDIA_SRC, which
 *             defines CUNVME_NV_P2P
 * An optional object that is not built is replaced by the stubs at the end of this file, so no
 * caller tests for it; cunvme_gpu_pinning() and cunvme_dma_buf_import() say what was built.
 */
#ifndef CUNVME_H
#define CUNVME_H

#include <linux/atomic.h>
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/errno.h>
#include <linux/kconfig.h>
#include <linux/mm_types.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/refcount.h>
#include <linux/scatterlist.h>
#include <linux/types.h>
#include <linux/wait.h>
#include <linux/xarray.h>

#include <cunvme/kmod/cunvme_ioctl.h>

#define CUNVME_GPU_PAGE_SHIFT 16 /* nvidia_p2p works in 64 KiB GPU pages */
#define CUNVME_GPU_PAGE_SIZE (1ULL << CUNVME_GPU_PAGE_SHIFT)

/* Pages pinned or mapped by every open file of every controller: driver sysfs (core.c). */
extern atomic64_t cunvme_pinned_pages;		/* host pages */
extern atomic64_t cunvme_pinned_gpu_pages;	/* 64 KiB GPU pages */
extern atomic64_t cunvme_dma_buf_pages;		/* mapped dma-buf pages */
/* The last handle given out (pin.c): never 0, never reused, across files and kinds. */
extern atomic64_t cunvme_next_handle;

struct cunvme_dev {
	struct pci_dev *pdev;
	void __iomem *bar0;
	struct device dev;	/* /sys/class/cunvme/<BDF>, the node /dev/cunvme/<BDF> */
	struct cdev cdev;
	struct mutex lock;	/* open, removed, needs_reset */
	bool open;		/* one open file at a time */
	bool removed;
	/* may resume old commands: reset before bus mastering goes on again (cunvme_release) */
	bool needs_reset;
	wait_queue_head_t closed;
	atomic64_t pinned_pages;
	atomic64_t dma_buf_pages;
	atomic_t resets;	/* function resets done, /sys/class/cunvme/<BDF>/resets */
	int minor;
};

struct cunvme_file {
	struct cunvme_dev *cd;
	struct mutex lock;	/* pinned_bytes, and pin/unpin against each other */
	struct xarray pins;	/* handle -> struct cunvme_pin */
	struct address_space *mapping;	/* where mmaps of GPU pins live (zapped on unpin) */
	u64 pinned_bytes;	/* counted against max_pinned_mb */
	bool dma_revoked;	/* a dma-buf was revoked: bus mastering is off until release */
};

enum cunvme_pin_kind {
	CUNVME_PIN_HOST,
	CUNVME_PIN_GPU,		/* nvidia_p2p */
	CUNVME_PIN_DMA_BUF,
};

struct nvidia_p2p_page_table;
struct nvidia_p2p_dma_mapping;

struct cunvme_pin {
	u64 handle;
	/* the file's reference, plus one per CPU mapping (vma) of a GPU pin */
	refcount_t refs;
	u64 bytes;
	enum cunvme_pin_kind kind;
	/* host memory (npages also for a dma-buf: the range's pages) */
	unsigned long npages;
	struct page **pages;
	struct sg_table sgt;
	struct mm_struct *mm;	/* charged with npages of locked_vm */
	/* GPU memory (p2p.c); page_table and mapping are NULL once revoked or released */
	u64 gpu_address;
	struct mutex gpu_lock;	/* page_table, mapping; against the free callback */
	bool counted;		/* in cunvme_pinned_gpu_pages */
	struct nvidia_p2p_page_table *page_table;
	struct nvidia_p2p_dma_mapping *mapping;
	struct address_space *file_mapping;	/* the file's, for CPU mappings of the pin */
	bool wc_reserved;	/* write-combining reserved for the pages (x86 PAT); gpu_lock */
	/*
	 * dma-buf (dmabuf.c); under dmabuf->resv: dma_sgt is NULL once revoked or released,
	 * dma_pinned is cleared at UNPIN/close only (never in move_notify: see there)
	 */
	struct cunvme_file *file;
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *dma_sgt;
	bool dma_pinned;
};

/* core.c */
int cunvme_reset(struct cunvme_dev *cd, bool device_locked);
extern const struct file_operations cunvme_fops;	/* file.c */

/* bar.c */
int cunvme_mmap_bar(struct cunvme_file *f, struct vm_area_struct *vma);

/* pin.c */
u64 cunvme_max_pinned_bytes(void);
int cunvme_may_pin(struct cunvme_file *f, u64 bytes);
void cunvme_pin_put(struct cunvme_pin *pin);
void cunvme_release_pin(struct cunvme_file *f, struct cunvme_pin *pin);
long cunvme_ioctl_pin(struct cunvme_file *f, void __user *arg);
long cunvme_ioctl_unpin(struct cunvme_file *f, void __user *arg);
int cunvme_mmap_gpu(struct cunvme_file *f, struct vm_area_struct *vma, u64 offset);

/* dmabuf.c */
static inline bool cunvme_dma_buf_import(void)
{
	return IS_ENABLED(CONFIG_DMA_SHARED_BUFFER);
}

#if IS_ENABLED(CONFIG_DMA_SHARED_BUFFER)
long cunvme_ioctl_map_dma_buf(struct cunvme_file *f, void __user *arg);
void cunvme_release_dma_buf(struct cunvme_dev *cd, struct cunvme_pin *pin);
#else
static inline long cunvme_ioctl_map_dma_buf(struct cunvme_file *f, void __user *arg)
{
	return -EOPNOTSUPP;
}

/* No dma-buf pin is ever made. */
static inline void cunvme_release_dma_buf(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
}
#endif

/* p2p.c */
static inline bool cunvme_gpu_pinning(void)
{
	return IS_ENABLED(CUNVME_NV_P2P);
}

#if IS_ENABLED(CUNVME_NV_P2P)
int cunvme_pin_gpu(struct cunvme_file *f, struct cunvme_pin *pin, u64 address, u64 __user *out);
void cunvme_release_gpu_pin(struct cunvme_dev *cd, struct cunvme_pin *pin);
int cunvme_gpu_mmap_pin(struct cunvme_pin *pin, struct vm_area_struct *vma);
#else
static inline int cunvme_pin_gpu(struct cunvme_file *f, struct cunvme_pin *pin, u64 address,
				 u64 __user *out)
{
	return -EOPNOTSUPP;
}

/* No GPU pin is ever made. */
static inline void cunvme_release_gpu_pin(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
}

static inline int cunvme_gpu_mmap_pin(struct cunvme_pin *pin, struct vm_area_struct *vma)
{
	return -EOPNOTSUPP;
}
#endif

#endif /* CUNVME_H */
