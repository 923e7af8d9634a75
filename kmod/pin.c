// SPDX-License-Identifier: GPL-2.0
/*
 * An open file's pins: host memory pinned here (pin_user_pages, FOLL_LONGTERM) and mapped for
 * the controller's DMA, GPU memory through p2p.c, dma-bufs through dmabuf.c; the table of
 * handles, the limit they count against, PIN and UNPIN, and which pin an mmap at a GPU offset
 * names.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/overflow.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "cunvme.h"

static unsigned int max_pinned_mb = 16384;
module_param(max_pinned_mb, uint, 0644);
MODULE_PARM_DESC(max_pinned_mb,
		 "MiB one open device file may have pinned at a time (default 16384); processes without CAP_IPC_LOCK are also held to RLIMIT_MEMLOCK");

atomic64_t cunvme_next_handle = ATOMIC64_INIT(0);

/* ---- Pinning host memory ------------------------------------------------------------- */

static void cunvme_release_host_pin(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
	dma_unmap_sgtable(&cd->pdev->dev, &pin->sgt, DMA_BIDIRECTIONAL, 0);
	sg_free_table(&pin->sgt);
	/* The controller may have written any of them. */
	unpin_user_pages_dirty_lock(pin->pages, pin->npages, true);
	kvfree(pin->pages);
	account_locked_vm(pin->mm, pin->npages, false);
	mmdrop(pin->mm);
	atomic64_sub(pin->npages, &cd->pinned_pages);
	atomic64_sub(pin->npages, &cunvme_pinned_pages);
}

/* Copies each page's DMA address out of the mapped table to the user's array. */
static int cunvme_copy_host_addresses(struct cunvme_pin *pin, u64 __user *out)
{
	struct scatterlist *sg;
	unsigned long written = 0;
	unsigned int i;

	for_each_sgtable_dma_sg(&pin->sgt, sg, i) {
		dma_addr_t address = sg_dma_address(sg);
		unsigned int len = sg_dma_len(sg);
		unsigned int off;

		/* Full pages went in, so whole, aligned pages come out (merged or not). */
		if (!PAGE_ALIGNED(address) || !PAGE_ALIGNED(len) ||
		    len / PAGE_SIZE > pin->npages - written)
			return -EIO;
		for (off = 0; off < len; off += PAGE_SIZE, written++)
			if (put_user((u64)address + off, out + written))
				return -EFAULT;
	}
	return written == pin->npages ? 0 : -EIO;
}

static int cunvme_pin_host(struct cunvme_dev *cd, struct cunvme_pin *pin,
			   u64 address, u64 __user *out)
{
	unsigned long done = 0;
	int ret;

	pin->npages = pin->bytes >> PAGE_SHIFT;
	ret = account_locked_vm(current->mm, pin->npages, true);
	if (ret)
		return ret;
	pin->mm = current->mm;
	mmgrab(pin->mm);

	pin->pages = kvmalloc_array(pin->npages, sizeof(*pin->pages), GFP_KERNEL_ACCOUNT);
	if (!pin->pages) {
		ret = -ENOMEM;
		goto uncharge;
	}
	while (done < pin->npages) {
		int chunk = min_t(unsigned long, pin->npages - done, SZ_1M);

		ret = pin_user_pages_fast(address + (done << PAGE_SHIFT), chunk,
					  FOLL_WRITE | FOLL_LONGTERM, pin->pages + done);
		if (ret <= 0) {
			ret = ret ? ret : -EFAULT;
			goto unpin;
		}
		done += ret;
	}
	ret = sg_alloc_table_from_pages(&pin->sgt, pin->pages, pin->npages, 0, pin->bytes,
					GFP_KERNEL_ACCOUNT);
	if (ret)
		goto unpin;
	ret = dma_map_sgtable(&cd->pdev->dev, &pin->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto free_table;
	ret = cunvme_copy_host_addresses(pin, out);
	if (ret)
		goto unmap;
	atomic64_add(pin->npages, &cd->pinned_pages);
	atomic64_add(pin->npages, &cunvme_pinned_pages);
	return 0;

unmap:
	dma_unmap_sgtable(&cd->pdev->dev, &pin->sgt, DMA_BIDIRECTIONAL, 0);
free_table:
	sg_free_table(&pin->sgt);
unpin:
	unpin_user_pages(pin->pages, done);
	kvfree(pin->pages);
uncharge:
	account_locked_vm(pin->mm, pin->npages, false);
	mmdrop(pin->mm);
	return ret;
}

/* ---- Any pin ------------------------------------------------------------------------- */

/* A GPU pin's struct outlives its unpinning while a CPU mapping (vma) of it remains. */
void cunvme_pin_put(struct cunvme_pin *pin)
{
	if (refcount_dec_and_test(&pin->refs))
		kfree(pin);
}

/* Called with f->lock held, the pin already out of f->pins. */
void cunvme_release_pin(struct cunvme_file *f, struct cunvme_pin *pin)
{
	switch (pin->kind) {
	case CUNVME_PIN_HOST:
		cunvme_release_host_pin(f->cd, pin);
		break;
	case CUNVME_PIN_GPU:
		cunvme_release_gpu_pin(f->cd, pin);
		break;
	case CUNVME_PIN_DMA_BUF:
		cunvme_release_dma_buf(f->cd, pin);
		break;
	}
	f->pinned_bytes -= pin->bytes;
	cunvme_pin_put(pin);
}

/* ---- PIN and UNPIN ------------------------------------------------------------------- */

u64 cunvme_max_pinned_bytes(void)
{
	u64 limit = (u64)READ_ONCE(max_pinned_mb) << 20;

	if (!capable(CAP_IPC_LOCK))
		limit = min_t(u64, limit, rlimit(RLIMIT_MEMLOCK));
	return limit;
}

/*
 * Whether this file may pin @bytes more (called with f->lock held): not after a revoke of one
 * of its dma-bufs (-ENOLINK), and within max_pinned_mb (-ENOMEM).
 */
int cunvme_may_pin(struct cunvme_file *f, u64 bytes)
{
	lockdep_assert_held(&f->lock);
	if (READ_ONCE(f->dma_revoked))
		return -ENOLINK;
	if (bytes > cunvme_max_pinned_bytes() ||
	    f->pinned_bytes > cunvme_max_pinned_bytes() - bytes)
		return -ENOMEM;
	return 0;
}

long cunvme_ioctl_pin(struct cunvme_file *f, void __user *arg)
{
	struct cunvme_pin_request req;
	struct cunvme_pin *pin;
	unsigned int shift;
	u64 end, pages, span;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.flags & ~CUNVME_PIN_GPU_MEMORY)
		return -EINVAL;
	if ((req.flags & CUNVME_PIN_GPU_MEMORY) && !cunvme_gpu_pinning())
		return -EOPNOTSUPP;
	shift = req.flags & CUNVME_PIN_GPU_MEMORY ? CUNVME_GPU_PAGE_SHIFT : PAGE_SHIFT;
	if (!req.bytes || !IS_ALIGNED(req.address, 1ULL << shift) ||
	    !IS_ALIGNED(req.bytes, 1ULL << shift))
		return -EINVAL;
	if (check_add_overflow(req.address, req.bytes, &end))
		return -EOVERFLOW;
	pages = req.bytes >> shift;
	if (pages > req.max_addresses)
		return -E2BIG;
	/* Host memory must lie in user space; GPU addresses are the NVIDIA driver's to check. */
	if (!(req.flags & CUNVME_PIN_GPU_MEMORY) &&
	    !access_ok(u64_to_user_ptr(req.address), req.bytes))
		return -EFAULT;
	if (!access_ok(u64_to_user_ptr(req.addresses), pages * sizeof(u64)))
		return -EFAULT;

	pin = kzalloc(sizeof(*pin), GFP_KERNEL_ACCOUNT);
	if (!pin)
		return -ENOMEM;
	pin->bytes = req.bytes;
	pin->kind = req.flags & CUNVME_PIN_GPU_MEMORY ? CUNVME_PIN_GPU : CUNVME_PIN_HOST;
	refcount_set(&pin->refs, 1);
	/*
	 * A GPU pin takes one handle per 64 KiB page, so that the mmap offset ranges of two pins
	 * (CUNVME_GPU_MMAP_OFFSET) never overlap and unpinning one zaps only its own mappings.
	 * Taken before pinning: the free callback may need it as soon as the pages are pinned.
	 */
	span = pin->kind == CUNVME_PIN_GPU ? pages : 1;
	pin->handle = atomic64_add_return(span, &cunvme_next_handle) - span + 1;

	mutex_lock(&f->lock);
	ret = cunvme_may_pin(f, req.bytes);
	if (ret)
		goto free;
	if (pin->kind == CUNVME_PIN_GPU)
		ret = cunvme_pin_gpu(f, pin, req.address, u64_to_user_ptr(req.addresses));
	else
		ret = cunvme_pin_host(f->cd, pin, req.address, u64_to_user_ptr(req.addresses));
	if (ret)
		goto free;
	f->pinned_bytes += pin->bytes;

	ret = xa_insert(&f->pins, pin->handle, pin, GFP_KERNEL_ACCOUNT);
	if (ret)
		goto release;
	req.handle = pin->handle;
	req.count = pages;
	req.page_shift = shift;
	if (copy_to_user(arg, &req, sizeof(req))) {
		xa_erase(&f->pins, pin->handle);
		ret = -EFAULT;
		goto release;
	}
	mutex_unlock(&f->lock);
	return 0;

release:
	cunvme_release_pin(f, pin);
	mutex_unlock(&f->lock);
	return ret;
free:
	mutex_unlock(&f->lock);
	kfree(pin);
	return ret;
}

long cunvme_ioctl_unpin(struct cunvme_file *f, void __user *arg)
{
	struct cunvme_unpin_request req;
	struct cunvme_pin *pin;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.handle == 0 || req.handle != (unsigned long)req.handle)
		return -ENOENT;
	mutex_lock(&f->lock);
	pin = xa_erase(&f->pins, req.handle);
	if (pin)
		cunvme_release_pin(f, pin);
	mutex_unlock(&f->lock);
	return pin ? 0 : -ENOENT;
}

/* ---- mmap of a GPU pin: which pin (the mapping itself is p2p.c's) -------------------- */

/*
 * mmap at CUNVME_GPU_MMAP_OFFSET(handle). The pin is looked up under the xarray's lock, not
 * f->lock: PIN holds f->lock while it faults user pages in (mmap_lock), and mmap runs under
 * mmap_lock.
 */
int cunvme_mmap_gpu(struct cunvme_file *f, struct vm_area_struct *vma, u64 offset)
{
	enum cunvme_pin_kind kind = CUNVME_PIN_HOST;
	struct cunvme_pin *pin;
	u64 handle;
	int ret;

	if ((offset - CUNVME_GPU_MMAP_BASE) & (CUNVME_GPU_PAGE_SIZE - 1))
		return -EINVAL;	/* not at the start of a pin */
	handle = (offset - CUNVME_GPU_MMAP_BASE) >> CUNVME_GPU_MMAP_SHIFT;
	if (!handle || handle != (unsigned long)handle)
		return -ENOENT;
	xa_lock(&f->pins);
	pin = xa_load(&f->pins, handle);
	if (pin) {
		kind = pin->kind;
		if (kind == CUNVME_PIN_GPU)
			refcount_inc(&pin->refs);
	}
	xa_unlock(&f->pins);
	if (!pin)
		return -ENOENT;
	if (kind == CUNVME_PIN_HOST)
		return -EINVAL;	/* host memory: the process has it mapped already */
	if (kind == CUNVME_PIN_DMA_BUF)
		return -EOPNOTSUPP;	/* only DMA addresses, no CPU physical ones */
	ret = cunvme_gpu_mmap_pin(pin, vma);
	if (ret)
		cunvme_pin_put(pin);
	return ret;
}
