// SPDX-License-Identifier: GPL-2.0
/*
 * A dma-buf exporter for testing cunvme's dma-buf import without a GPU: Debian's kernel has
 * no udmabuf and no dma-buf heaps. /dev/cunvme_test_exporter hands out dma-bufs of zeroed,
 * individually allocated host pages (so the importer sees many scatterlist segments), mapped
 * for each importer's device with the DMA API (IOVAs behind an IOMMU), mmap-able for
 * checking their contents, and revocable: REVOKE calls dma_buf_move_notify() as an exporter
 * does when the memory goes away under its importers. It is a dynamic exporter (pin/unpin),
 * so dynamic importers map under the reservation lock and get move_notify.
 *
 * Each dma-buf holds a reference to this module: rmmod succeeds only once every importer has
 * let go of every buffer, which the test uses as its leak check.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "cunvme_test_exporter.h"

struct exporter_buffer {
	unsigned long npages;
	struct page **pages;
	atomic_t attachments;
	atomic_t mappings;
	atomic_t pins;
	bool revoked;	/* under the dma-buf's resv */
};

static int exporter_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct exporter_buffer *buf = dmabuf->priv;

	atomic_inc(&buf->attachments);
	return 0;
}

static void exporter_detach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct exporter_buffer *buf = dmabuf->priv;

	atomic_dec(&buf->attachments);
}

static int exporter_pin(struct dma_buf_attachment *attach)
{
	struct exporter_buffer *buf = attach->dmabuf->priv;

	if (buf->revoked)
		return -ENODEV;
	atomic_inc(&buf->pins);
	return 0;
}

static void exporter_unpin(struct dma_buf_attachment *attach)
{
	struct exporter_buffer *buf = attach->dmabuf->priv;

	atomic_dec(&buf->pins);
}

static struct sg_table *exporter_map(struct dma_buf_attachment *attach,
				     enum dma_data_direction dir)
{
	struct exporter_buffer *buf = attach->dmabuf->priv;
	struct sg_table *sgt;
	int ret;

	if (buf->revoked)
		return ERR_PTR(-ENODEV);
	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table_from_pages(sgt, buf->pages, buf->npages, 0,
					buf->npages << PAGE_SHIFT, GFP_KERNEL);
	if (ret)
		goto free;
	ret = dma_map_sgtable(attach->dev, sgt, dir, 0);
	if (ret)
		goto free_table;
	atomic_inc(&buf->mappings);
	return sgt;

free_table:
	sg_free_table(sgt);
free:
	kfree(sgt);
	return ERR_PTR(ret);
}

static void exporter_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
			   enum dma_data_direction dir)
{
	struct exporter_buffer *buf = attach->dmabuf->priv;

	dma_unmap_sgtable(attach->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(sgt);
	atomic_dec(&buf->mappings);
}

static int exporter_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct exporter_buffer *buf = dmabuf->priv;

	return vm_map_pages(vma, buf->pages, buf->npages);
}

static void exporter_free(struct exporter_buffer *buf)
{
	unsigned long i;

	for (i = 0; i < buf->npages; i++)
		if (buf->pages[i])
			__free_page(buf->pages[i]);
	kvfree(buf->pages);
	kfree(buf);
}

static void exporter_release(struct dma_buf *dmabuf)
{
	struct exporter_buffer *buf = dmabuf->priv;

	WARN_ON(atomic_read(&buf->attachments) || atomic_read(&buf->mappings) ||
		atomic_read(&buf->pins));
	exporter_free(buf);
}

static const struct dma_buf_ops exporter_ops = {
	.attach = exporter_attach,
	.detach = exporter_detach,
	.pin = exporter_pin,
	.unpin = exporter_unpin,
	.map_dma_buf = exporter_map,
	.unmap_dma_buf = exporter_unmap,
	.mmap = exporter_mmap,
	.release = exporter_release,
};

static long exporter_export(struct cunvme_test_export __user *arg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct cunvme_test_export req;
	struct exporter_buffer *buf;
	struct dma_buf *dmabuf;
	unsigned long i;
	int fd;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.flags || !req.bytes || !PAGE_ALIGNED(req.bytes) ||
	    req.bytes > CUNVME_TEST_EXPORTER_MAX_BYTES)
		return -EINVAL;
	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	buf->npages = req.bytes >> PAGE_SHIFT;
	buf->pages = kvcalloc(buf->npages, sizeof(*buf->pages), GFP_KERNEL);
	if (!buf->pages) {
		kfree(buf);
		return -ENOMEM;
	}
	for (i = 0; i < buf->npages; i++) {
		buf->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!buf->pages[i]) {
			exporter_free(buf);
			return -ENOMEM;
		}
	}
	info.ops = &exporter_ops;
	info.size = req.bytes;
	info.flags = O_RDWR;
	info.priv = buf;
	dmabuf = dma_buf_export(&info);
	if (IS_ERR(dmabuf)) {
		exporter_free(buf);
		return PTR_ERR(dmabuf);
	}
	fd = dma_buf_fd(dmabuf, O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(dmabuf);	/* release frees buf */
		return fd;
	}
	req.fd = fd;
	/* The fd is installed: user space owns it now, even if this copy fails. */
	return copy_to_user(arg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long exporter_status(struct cunvme_test_status __user *arg, bool revoke)
{
	struct cunvme_test_status req;
	struct exporter_buffer *buf;
	struct dma_buf *dmabuf;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	dmabuf = dma_buf_get(req.fd);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);
	if (dmabuf->ops != &exporter_ops) {
		dma_buf_put(dmabuf);
		return -EINVAL;
	}
	buf = dmabuf->priv;
	dma_resv_lock(dmabuf->resv, NULL);
	if (revoke) {
		buf->revoked = true;
		dma_buf_move_notify(dmabuf);
	}
	req.revoked = buf->revoked;
	dma_resv_unlock(dmabuf->resv);
	req.attachments = atomic_read(&buf->attachments);
	req.mappings = atomic_read(&buf->mappings);
	req.pins = atomic_read(&buf->pins);
	req.reserved = 0;
	dma_buf_put(dmabuf);
	return copy_to_user(arg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long exporter_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case CUNVME_TEST_EXPORT:
		return exporter_export(uarg);
	case CUNVME_TEST_STATUS:
		return exporter_status(uarg, false);
	case CUNVME_TEST_REVOKE:
		return exporter_status(uarg, true);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations exporter_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = exporter_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice exporter_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "cunvme_test_exporter",
	.fops = &exporter_fops,
	.mode = 0600,
};

module_misc_device(exporter_device);

MODULE_DESCRIPTION("dma-buf exporter of host pages with revocation, for testing cunvme's dma-buf import");
MODULE_LICENSE("GPL");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
