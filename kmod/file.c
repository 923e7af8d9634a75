// SPDX-License-Identifier: GPL-2.0
/*
 * /dev/cunvme/<BDF>: one open file per controller. Open turns bus mastering on (after a reset
 * the last release could not do); release stops the controller and takes its DMA away before
 * any pin is let go. The ioctls and mmaps are dispatched from here to bar.c, pin.c, dmabuf.c
 * and p2p.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "cunvme.h"

/* NVMe registers the module touches itself (NVMe Base Specification 2.0, 3.1.3) */
#define NVME_REG_CAP 0x00
#define NVME_REG_CC 0x14
#define NVME_REG_CSTS 0x1c
#define NVME_CC_EN 0x1
#define NVME_CSTS_RDY 0x1
#define NVME_CAP_TO(cap_lo) (((cap_lo) >> 24) & 0xff) /* in 500 ms units */
/* Release waits at most this long for CSTS.RDY to clear; bus mastering goes off anyway. */
#define CUNVME_DISABLE_WAIT_MS 5000

/* ---- ioctls: INFO here, the others in pin.c and dmabuf.c ----------------------------- */

static long cunvme_ioctl_info(struct cunvme_file *f, void __user *arg)
{
	struct pci_dev *pdev = f->cd->pdev;
	struct cunvme_device_info info = {
		.abi_version = CUNVME_ABI_VERSION,
		.flags = (cunvme_gpu_pinning() ?
			  CUNVME_INFO_GPU_PINNING | CUNVME_INFO_GPU_MAPPING : 0) |
			 (cunvme_dma_buf_import() ? CUNVME_INFO_DMA_BUF : 0) |
			 (READ_ONCE(f->dma_revoked) ? CUNVME_INFO_DMA_REVOKED : 0),
		.max_pinned_bytes = cunvme_max_pinned_bytes(),
	};
	int i;

	for (i = 0; i < CUNVME_BAR_COUNT; i++) {
		if (!(pci_resource_flags(pdev, i) & IORESOURCE_MEM))
			continue;
		info.bar_size[i] = pci_resource_len(pdev, i);
		info.bar_bus_address[i] = pci_bus_address(pdev, i);
	}
	return copy_to_user(arg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long cunvme_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct cunvme_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case CUNVME_IOCTL_INFO:
		return cunvme_ioctl_info(f, uarg);
	case CUNVME_IOCTL_PIN:
		return cunvme_ioctl_pin(f, uarg);
	case CUNVME_IOCTL_UNPIN:
		return cunvme_ioctl_unpin(f, uarg);
	case CUNVME_IOCTL_MAP_DMA_BUF:
		return cunvme_ioctl_map_dma_buf(f, uarg);
	default:
		return -ENOTTY;
	}
}

/* ---- mmap: a BAR (bar.c) or a GPU pin (pin.c, p2p.c) --------------------------------- */

static int cunvme_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct cunvme_file *f = file->private_data;

	/* A private mapping would be copy-on-write over device registers. */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	/* No overflow: the core checked that vm_pgoff + the length fits in a file offset. */
	if ((u64)vma->vm_pgoff << PAGE_SHIFT >= CUNVME_GPU_MMAP_BASE)
		return cunvme_mmap_gpu(f, vma, (u64)vma->vm_pgoff << PAGE_SHIFT);
	return cunvme_mmap_bar(f, vma);
}

/* ---- open and release ---------------------------------------------------------------- */

static int cunvme_open(struct inode *inode, struct file *file)
{
	struct cunvme_dev *cd = container_of(inode->i_cdev, struct cunvme_dev, cdev);
	struct cunvme_file *f;
	bool needs_reset;
	int ret = 0;

	/* Registers are written through the mapping: the node's write permission decides. */
	if ((file->f_mode & (FMODE_READ | FMODE_WRITE)) != (FMODE_READ | FMODE_WRITE))
		return -EACCES;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->cd = cd;
	f->mapping = file->f_mapping;
	mutex_init(&f->lock);
	xa_init(&f->pins);

	mutex_lock(&cd->lock);
	if (cd->removed)
		ret = -ENODEV;
	else if (cd->open)
		ret = -EBUSY;
	if (ret) {
		mutex_unlock(&cd->lock);
		kfree(f);
		return ret;
	}
	cd->open = true;
	needs_reset = cd->needs_reset;
	mutex_unlock(&cd->lock);

	/*
	 * Before bus mastering comes on: a controller the last close could not reset must not
	 * resume old commands into pages no longer pinned. Only tried, and not under cd->lock:
	 * unbind holds the device lock while it takes cd->lock and waits for the file to close.
	 */
	if (needs_reset) {
		ret = cunvme_reset(cd, false);
		mutex_lock(&cd->lock);
		if (ret)
			cd->open = false;
		else
			cd->needs_reset = false;
		mutex_unlock(&cd->lock);
		if (ret) {
			wake_up(&cd->closed);
			kfree(f);
			return ret == -EAGAIN ? -EAGAIN : -EIO;
		}
	}
	get_device(&cd->dev);
	pci_set_master(cd->pdev);

	file->private_data = f;
	return nonseekable_open(inode, file);
}

/*
 * Stops the controller from reaching memory before its pins go: clears CC.EN, waits a bounded
 * time for CSTS.RDY to follow, then clears bus mastering, which blocks its DMA whatever state
 * it is in. Returns whether it stopped: CSTS.RDY=0 is a finished controller reset (NVMe Base
 * 2.0, 3.7.2), which ends every command. One still ready (or reading all ones) may resume its
 * commands once bus mastering is on again.
 */
static bool cunvme_quiesce(struct cunvme_dev *cd)
{
	u32 cc = readl(cd->bar0 + NVME_REG_CC);
	u32 timeout_ms = NVME_CAP_TO(readl(cd->bar0 + NVME_REG_CAP)) * 500;
	unsigned long deadline = jiffies +
		msecs_to_jiffies(min_t(u32, timeout_ms, CUNVME_DISABLE_WAIT_MS));
	bool stopped = false;

	if (cc != U32_MAX && (cc & NVME_CC_EN))
		writel(cc & ~NVME_CC_EN, cd->bar0 + NVME_REG_CC);
	while (cc != U32_MAX) {
		u32 csts = readl(cd->bar0 + NVME_REG_CSTS);

		if (csts == U32_MAX)
			break;
		if (!(csts & NVME_CSTS_RDY)) {
			stopped = true;
			break;
		}
		if (time_after(jiffies, deadline)) {
			dev_warn(&cd->pdev->dev, "controller still ready after CC.EN=0; turning bus mastering off anyway\n");
			break;
		}
		msleep(10);
	}
	pci_clear_master(cd->pdev);
	return stopped;
}

static int cunvme_release(struct inode *inode, struct file *file)
{
	struct cunvme_file *f = file->private_data;
	struct cunvme_dev *cd = f->cd;
	bool stopped = cunvme_quiesce(cd);
	/* A revoke cut the controller's DMA off with commands in flight. */
	bool needs_reset = !stopped || READ_ONCE(f->dma_revoked);
	struct cunvme_pin *pin;
	unsigned long handle;
	bool leak;

	/*
	 * Reset while every pin still stands, so that nothing from before can land in a page
	 * after it is unpinned. Only tried: unbind holds the device lock while it waits for this
	 * release, and resets there instead (cunvme_remove); else the next open does.
	 */
	if (needs_reset && !cunvme_reset(cd, false)) {
		needs_reset = false;
		stopped = true;
	}
	leak = !stopped && !xa_empty(&f->pins);
	if (!leak) {
		mutex_lock(&f->lock);
		xa_for_each(&f->pins, handle, pin) {
			xa_erase(&f->pins, handle);
			cunvme_release_pin(f, pin);
		}
		mutex_unlock(&f->lock);
		xa_destroy(&f->pins);
		kfree(f);
	} else {
		/*
		 * The controller may still write any page this file pinned: unpinning would hand
		 * them back to their owners under its DMA. Leak the pins instead, and keep what
		 * an exporter's or NVIDIA's callback on them reaches: this file, its inode, the
		 * device and this module.
		 */
		dev_warn(&cd->pdev->dev, "controller neither stopped nor reset: leaking %llu pinned bytes rather than freeing memory it may still write\n",
			 f->pinned_bytes);
		ihold(inode);
		pci_dev_get(cd->pdev);
		__module_get(THIS_MODULE);
	}

	mutex_lock(&cd->lock);
	cd->needs_reset = needs_reset;
	cd->open = false;
	mutex_unlock(&cd->lock);
	wake_up(&cd->closed);
	if (!leak)
		put_device(&cd->dev);
	return 0;
}

const struct file_operations cunvme_fops = {
	.owner = THIS_MODULE,
	.open = cunvme_open,
	.release = cunvme_release,
	.unlocked_ioctl = cunvme_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = cunvme_mmap,
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
	.llseek = no_llseek,	/* 6.12 dropped it: nonseekable_open() is enough there */
#endif
};
