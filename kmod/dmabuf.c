// SPDX-License-Identifier: GPL-2.0
/*
 * dma-buf import (CUNVME_IOCTL_MAP_DMA_BUF): GPU memory the NVIDIA driver exports, or any
 * exporter's buffer, attached dynamically to the controller, pinned and mapped for its DMA.
 * Built where the kernel has CONFIG_DMA_SHARED_BUFFER (Kbuild); without it cunvme.h's stubs
 * answer EOPNOTSUPP.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/overflow.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "cunvme.h"

/* dma_buf_* are exported in the DMA_BUF namespace (since 5.16); 6.13 made the name a string. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif

/* Under dmabuf->resv: undoes the mapping, once. */
static void cunvme_dma_buf_unmap_locked(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
	if (!pin->dma_sgt)
		return;
	dma_buf_unmap_attachment(pin->attach, pin->dma_sgt, DMA_BIDIRECTIONAL);
	pin->dma_sgt = NULL;
	atomic64_sub(pin->npages, &cd->dma_buf_pages);
	atomic64_sub(pin->npages, &cunvme_dma_buf_pages);
}

/* Under dmabuf->resv: undoes the mapping and our dma_buf_pin(), each once. */
static void cunvme_dma_buf_release_locked(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
	cunvme_dma_buf_unmap_locked(cd, pin);
	if (pin->dma_pinned) {
		dma_buf_unpin(pin->attach);
		pin->dma_pinned = false;
	}
}

/*
 * The exporter is moving or revoking the buffer (dma_buf_move_notify, under dmabuf->resv).
 * The addresses are in user space and may sit in commands the controller has in flight, and
 * without an IOMMU unmapping does not stop a device from reaching them. So bus mastering goes
 * off first (no command of this file, in flight or later, can reach any memory after that),
 * and then the mapping goes, right here under the lock, as RDMA's invalidate callback does
 * (mlx5_ib_dmabuf_invalidate_cb). The pin stays until UNPIN/close: dma_buf_unpin() here would
 * call back into an exporter that is in the middle of moving the buffer. The controller's
 * commands in flight stay too: the close resets it (cunvme_release). f->lock is not taken
 * here: the ioctls hold it while they take dmabuf->resv.
 */
static void cunvme_dma_buf_move_notify(struct dma_buf_attachment *attach)
{
	struct cunvme_pin *pin = attach->importer_priv;
	struct cunvme_dev *cd = pin->file->cd;

	if (!pin->dma_sgt)
		return;
	pci_clear_master(cd->pdev);
	WRITE_ONCE(pin->file->dma_revoked, true);
	cunvme_dma_buf_unmap_locked(cd, pin);
	dev_warn(&cd->pdev->dev, "a mapped dma-buf was revoked by its exporter: bus mastering is off until /dev/cunvme/%s is closed\n",
		 pci_name(cd->pdev));
}

static const struct dma_buf_attach_ops cunvme_dma_buf_attach_ops = {
	/* Only DMA addresses are used, never struct pages: GPU memory (a PCI BAR) may come. */
	.allow_peer2peer = true,
	.move_notify = cunvme_dma_buf_move_notify,
};

void cunvme_release_dma_buf(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
	dma_resv_lock(pin->dmabuf->resv, NULL);
	cunvme_dma_buf_release_locked(cd, pin);
	dma_resv_unlock(pin->dmabuf->resv);
	/* After detach no move_notify can run for this attachment: the pin may be freed. */
	dma_buf_detach(pin->dmabuf, pin->attach);
	dma_buf_put(pin->dmabuf);
}

/* The DMA address of each page of [offset, offset + npages pages) of the mapped table. */
static int cunvme_dma_buf_addresses(struct sg_table *sgt, u64 offset, unsigned long npages,
				    u64 *out)
{
	u64 end = offset + ((u64)npages << PAGE_SHIFT), at = 0;
	unsigned long written = 0;
	struct scatterlist *sg;
	unsigned int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		dma_addr_t address = sg_dma_address(sg);
		unsigned int len = sg_dma_len(sg);
		unsigned int off;

		if (at >= end)
			break;
		if (!PAGE_ALIGNED(address) || !PAGE_ALIGNED(len))
			return -EIO;
		for (off = 0; off < len && at < end; off += PAGE_SIZE, at += PAGE_SIZE)
			if (at >= offset)
				out[written++] = (u64)address + off;
	}
	return written == npages ? 0 : -EIO;
}

/*
 * Attaches `fd` to the controller (dynamically: revocation arrives as move_notify), pins it
 * (the addresses live on in user space) and maps it; the range's addresses go to `out`, a
 * kernel array, copied to user space by the caller once dmabuf->resv is dropped (a fault
 * must not be taken under it).
 */
static int cunvme_map_dma_buf(struct cunvme_file *f, struct cunvme_pin *pin, int fd,
			      u64 offset, u64 *out)
{
	struct sg_table *sgt;
	int ret;

	pin->dmabuf = dma_buf_get(fd);
	if (IS_ERR(pin->dmabuf))
		return PTR_ERR(pin->dmabuf);
	ret = -ERANGE;
	if (offset > pin->dmabuf->size || pin->bytes > pin->dmabuf->size - offset)
		goto put;
	pin->file = f;
	pin->attach = dma_buf_dynamic_attach(pin->dmabuf, &f->cd->pdev->dev,
					     &cunvme_dma_buf_attach_ops, pin);
	if (IS_ERR(pin->attach)) {
		ret = PTR_ERR(pin->attach);
		goto put;
	}
	dma_resv_lock(pin->dmabuf->resv, NULL);
	ret = dma_buf_pin(pin->attach);
	if (ret)
		goto unlock;
	pin->dma_pinned = true;
	sgt = dma_buf_map_attachment(pin->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		cunvme_dma_buf_release_locked(f->cd, pin);
		goto unlock;
	}
	pin->dma_sgt = sgt;
	atomic64_add(pin->npages, &f->cd->dma_buf_pages);
	atomic64_add(pin->npages, &cunvme_dma_buf_pages);
	ret = cunvme_dma_buf_addresses(sgt, offset, pin->npages, out);
	if (ret)
		cunvme_dma_buf_release_locked(f->cd, pin);
unlock:
	dma_resv_unlock(pin->dmabuf->resv);
	if (!ret)
		return 0;
	dma_buf_detach(pin->dmabuf, pin->attach);
put:
	dma_buf_put(pin->dmabuf);
	return ret;
}

long cunvme_ioctl_map_dma_buf(struct cunvme_file *f, void __user *arg)
{
	struct cunvme_dma_buf_request req;
	struct cunvme_pin *pin;
	u64 end, *addresses;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.flags || req.reserved)
		return -EINVAL;
	if (!req.bytes || !PAGE_ALIGNED(req.offset) || !PAGE_ALIGNED(req.bytes))
		return -EINVAL;
	if (check_add_overflow(req.offset, req.bytes, &end))
		return -EOVERFLOW;
	if (req.bytes >> PAGE_SHIFT > req.max_addresses)
		return -E2BIG;
	if (!access_ok(u64_to_user_ptr(req.addresses), (req.bytes >> PAGE_SHIFT) * sizeof(u64)))
		return -EFAULT;
	/* Before the address array is allocated: the limit bounds its size. */
	if (req.bytes > cunvme_max_pinned_bytes())
		return -ENOMEM;

	pin = kzalloc(sizeof(*pin), GFP_KERNEL_ACCOUNT);
	if (!pin)
		return -ENOMEM;
	pin->kind = CUNVME_PIN_DMA_BUF;
	pin->bytes = req.bytes;
	refcount_set(&pin->refs, 1);
	pin->npages = req.bytes >> PAGE_SHIFT;
	addresses = kvmalloc_array(pin->npages, sizeof(*addresses), GFP_KERNEL_ACCOUNT);
	if (!addresses) {
		kfree(pin);
		return -ENOMEM;
	}

	mutex_lock(&f->lock);
	ret = cunvme_may_pin(f, req.bytes);
	if (ret)
		goto free;
	ret = cunvme_map_dma_buf(f, pin, req.fd, req.offset, addresses);
	if (ret)
		goto free;
	f->pinned_bytes += pin->bytes;
	pin->handle = atomic64_inc_return(&cunvme_next_handle);
	ret = xa_insert(&f->pins, pin->handle, pin, GFP_KERNEL_ACCOUNT);
	if (ret)
		goto release;
	req.handle = pin->handle;
	req.count = pin->npages;
	req.page_shift = PAGE_SHIFT;
	if (copy_to_user(u64_to_user_ptr(req.addresses), addresses,
			 pin->npages * sizeof(*addresses)) ||
	    copy_to_user(arg, &req, sizeof(req))) {
		xa_erase(&f->pins, pin->handle);
		ret = -EFAULT;
		goto release;
	}
	mutex_unlock(&f->lock);
	kvfree(addresses);
	return 0;

release:
	cunvme_release_pin(f, pin);
	mutex_unlock(&f->lock);
	kvfree(addresses);
	return ret;
free:
	mutex_unlock(&f->lock);
	kvfree(addresses);
	kfree(pin);
	return ret;
}
