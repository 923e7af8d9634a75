// SPDX-License-Identifier: GPL-2.0
/*
 * cunvme: gives a user-space (or GPU) NVMe driver what only the kernel can give it safely.
 *
 * For each NVMe controller the user hands it (driver_override + bind, or the `bdf` parameter)
 * the module creates /dev/cunvme/<BDF>. One process at a time opens it and then
 *  - maps the controller's memory BARs (uncached) with mmap,
 *  - pins ranges of its memory (host pages, or GPU pages through nvidia_p2p where built with
 *    it) and gets their DMA addresses as this controller sees them (dma_map_* against the
 *    controller's struct device: IOVAs with an IOMMU, physical addresses without),
 *  - maps dma-bufs (GPU memory exported by the NVIDIA driver, or any exporter's) for the
 *    controller and gets the DMA addresses of a range of their pages,
 *  - maps pinned GPU memory into the process (write-combined) for CPU copies, as gdrcopy does,
 *  - unpins them again.
 * When the file goes away (close, process death), the controller is disabled, bus mastering
 * is turned off so it can no longer reach memory, and every pin is released. A controller that
 * did not stop, or whose DMA a dma-buf revoke cut off mid-command, is reset (FLR) before bus
 * mastering is ever on again; its pins are kept (leaked) if it neither stops nor resets.
 *
 * This file: the PCI driver that takes those controllers, the class with its device nodes and
 * sysfs counters, and module load and unload. The objects by role are listed in cunvme.h; the
 * ioctl ABI is <cunvme/kmod/cunvme_ioctl.h> (include/ of the library); kmod/README.md has
 * how to build and load it and the errno of each refusal.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/build_bug.h>
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/sysfs.h>
#include <linux/version.h>

#include "cunvme.h"

#define CUNVME_MAX_DEVICES 64
#define CUNVME_MAX_BDFS 16

static ushort node_mode = 0600;
module_param(node_mode, ushort, 0444);
MODULE_PARM_DESC(node_mode, "permissions of /dev/cunvme/<BDF> (default 0600; udev rules may change owner and group)");

static char *bdf[CUNVME_MAX_BDFS];
static int bdf_count;
module_param_array(bdf, charp, &bdf_count, 0444);
MODULE_PARM_DESC(bdf, "PCI addresses (0000:01:00.0,...) of unbound NVMe controllers to take at load time");

static dev_t cunvme_devt;
static DEFINE_IDA(cunvme_minors);
atomic64_t cunvme_pinned_pages = ATOMIC64_INIT(0);
atomic64_t cunvme_pinned_gpu_pages = ATOMIC64_INIT(0);
atomic64_t cunvme_dma_buf_pages = ATOMIC64_INIT(0);

/* ---- Function reset ------------------------------------------------------------------ */

/*
 * Resets the PCI function (FLR where it has one; the PCI core picks from
 * /sys/bus/pci/devices/<BDF>/reset_method), which ends every command the controller had and
 * returns it to its power-on state. The core saves and restores config space around it, bus
 * mastering included (off here). `device_locked`: the caller holds the device lock (unbind);
 * otherwise it is only tried, never waited for (see the callers).
 */
int cunvme_reset(struct cunvme_dev *cd, bool device_locked)
{
	int ret = device_locked ? pci_reset_function_locked(cd->pdev) :
				  pci_try_reset_function(cd->pdev);

	if (ret) {
		dev_warn(&cd->pdev->dev, "function reset failed (%d)\n", ret);
		return ret;
	}
	atomic_inc(&cd->resets);
	dev_info(&cd->pdev->dev, "function reset: no command from before can reach memory\n");
	return 0;
}

/* ---- sysfs: pinned-page counters ----------------------------------------------------- */

static ssize_t pinned_pages_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct cunvme_dev *cd = container_of(dev, struct cunvme_dev, dev);

	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&cd->pinned_pages));
}
static DEVICE_ATTR_RO(pinned_pages);

static ssize_t dma_buf_pages_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct cunvme_dev *cd = container_of(dev, struct cunvme_dev, dev);

	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&cd->dma_buf_pages));
}
static DEVICE_ATTR_RO(dma_buf_pages);

static ssize_t resets_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct cunvme_dev *cd = container_of(dev, struct cunvme_dev, dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&cd->resets));
}
static DEVICE_ATTR_RO(resets);

static struct attribute *cunvme_dev_attrs[] = {
	&dev_attr_pinned_pages.attr,
	&dev_attr_dma_buf_pages.attr,
	&dev_attr_resets.attr,
	NULL,
};
ATTRIBUTE_GROUPS(cunvme_dev);

/* /sys/bus/pci/drivers/cunvme/{pinned_pages,pinned_gpu_pages,dma_buf_pages}: all devices */
static ssize_t pinned_pages_driver_show(struct device_driver *drv, char *buf)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&cunvme_pinned_pages));
}

static ssize_t pinned_gpu_pages_show(struct device_driver *drv, char *buf)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&cunvme_pinned_gpu_pages));
}

static ssize_t dma_buf_pages_driver_show(struct device_driver *drv, char *buf)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&cunvme_dma_buf_pages));
}

static struct driver_attribute driver_attr_pinned_pages =
	__ATTR(pinned_pages, 0444, pinned_pages_driver_show, NULL);
static DRIVER_ATTR_RO(pinned_gpu_pages);
static struct driver_attribute driver_attr_dma_buf_pages =
	__ATTR(dma_buf_pages, 0444, dma_buf_pages_driver_show, NULL);

static struct attribute *cunvme_driver_attrs[] = {
	&driver_attr_pinned_pages.attr,
	&driver_attr_pinned_gpu_pages.attr,
	&driver_attr_dma_buf_pages.attr,
	NULL,
};
ATTRIBUTE_GROUPS(cunvme_driver);

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
static char *cunvme_devnode(const struct device *dev, umode_t *mode)
#else
static char *cunvme_devnode(struct device *dev, umode_t *mode)
#endif
{
	if (mode)
		*mode = node_mode & 0777;
	return kasprintf(GFP_KERNEL, "cunvme/%s", dev_name(dev));
}

static struct class cunvme_class = {
	.name = "cunvme",
	.devnode = cunvme_devnode,
	.dev_groups = cunvme_dev_groups,
};

/* ---- PCI driver ---------------------------------------------------------------------- */

static bool cunvme_wanted(struct pci_dev *pdev)
{
	int i;

	if (pdev->driver_override && sysfs_streq(pdev->driver_override, KBUILD_MODNAME))
		return true;
	for (i = 0; i < bdf_count; i++)
		if (bdf[i] && sysfs_streq(bdf[i], pci_name(pdev)))
			return true;
	return false;
}

static void cunvme_dev_release(struct device *dev)
{
	struct cunvme_dev *cd = container_of(dev, struct cunvme_dev, dev);

	ida_free(&cunvme_minors, cd->minor);
	kfree(cd);
}

static int cunvme_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct cunvme_dev *cd;
	int ret;

	/* Only NVMe controllers, and only those the user handed to this module. */
	if (pdev->class != PCI_CLASS_STORAGE_EXPRESS || !cunvme_wanted(pdev))
		return -ENODEV;
	if (!(pci_resource_flags(pdev, 0) & IORESOURCE_MEM)) {
		dev_err(&pdev->dev, "BAR0 is not a memory BAR\n");
		return -ENODEV;
	}

	cd = kzalloc(sizeof(*cd), GFP_KERNEL);
	if (!cd)
		return -ENOMEM;
	ret = ida_alloc_max(&cunvme_minors, CUNVME_MAX_DEVICES - 1, GFP_KERNEL);
	if (ret < 0) {
		kfree(cd);
		return ret;
	}
	cd->minor = ret;
	cd->pdev = pdev;
	mutex_init(&cd->lock);
	init_waitqueue_head(&cd->closed);
	atomic64_set(&cd->pinned_pages, 0);
	atomic64_set(&cd->dma_buf_pages, 0);
	atomic_set(&cd->resets, 0);
	device_initialize(&cd->dev);
	cd->dev.class = &cunvme_class;
	cd->dev.parent = &pdev->dev;
	cd->dev.devt = MKDEV(MAJOR(cunvme_devt), cd->minor);
	cd->dev.release = cunvme_dev_release;
	ret = dev_set_name(&cd->dev, "%s", pci_name(pdev));
	if (ret)
		goto put;

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto put;
	ret = pci_request_mem_regions(pdev, KBUILD_MODNAME);
	if (ret)
		goto disable;
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(32));
	if (ret)
		goto release_regions;
	cd->bar0 = pci_iomap(pdev, 0, 0);
	if (!cd->bar0) {
		ret = -ENOMEM;
		goto release_regions;
	}
	/* No interrupt handler here: user space polls. Keep INTx quiet and DMA off until open. */
	pci_intx(pdev, 0);
	pci_clear_master(pdev);

	cdev_init(&cd->cdev, &cunvme_fops);
	cd->cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&cd->cdev, &cd->dev);
	if (ret)
		goto unmap;
	pci_set_drvdata(pdev, cd);
	dev_info(&pdev->dev, "bound: /dev/cunvme/%s\n", pci_name(pdev));
	return 0;

unmap:
	pci_iounmap(pdev, cd->bar0);
release_regions:
	pci_release_mem_regions(pdev);
disable:
	pci_disable_device(pdev);
put:
	put_device(&cd->dev);
	return ret;
}

static void cunvme_remove(struct pci_dev *pdev)
{
	struct cunvme_dev *cd = pci_get_drvdata(pdev);

	mutex_lock(&cd->lock);
	cd->removed = true;
	mutex_unlock(&cd->lock);
	cdev_device_del(&cd->cdev, &cd->dev);
	/*
	 * An open file still has the BAR mapped and pages mapped for DMA: the resources stay
	 * ours until it is closed (as VFIO does). rmmod cannot get here with a file open.
	 */
	while (!wait_event_timeout(cd->closed, !READ_ONCE(cd->open), 10 * HZ))
		dev_warn(&pdev->dev, "unbind waits for the process using /dev/cunvme/%s to close it\n",
			 pci_name(pdev));
	/* The next driver turns bus mastering on: reset what the last release could not. */
	mutex_lock(&cd->lock);
	if (cd->needs_reset && !cunvme_reset(cd, true))
		cd->needs_reset = false;
	mutex_unlock(&cd->lock);

	pci_iounmap(pdev, cd->bar0);
	pci_release_mem_regions(pdev);
	pci_disable_device(pdev);
	put_device(&cd->dev);
}

static const struct pci_device_id cunvme_ids[] = {
	/* Matched here, then narrowed by cunvme_wanted(); no MODULE_DEVICE_TABLE, no autoload. */
	{ PCI_DEVICE_CLASS(PCI_CLASS_STORAGE_EXPRESS, 0xffffff) },
	{ }
};

static struct pci_driver cunvme_driver = {
	.name = KBUILD_MODNAME,
	.id_table = cunvme_ids,
	.probe = cunvme_probe,
	.remove = cunvme_remove,
	.groups = cunvme_driver_groups,	/* driver attributes; PCI copies them to .driver */
};

/* ---- module -------------------------------------------------------------------------- */

/*
 * The layout this module was written against. The header is shared with user space, so a
 * change to it reaches both sides at once; these make it a deliberate one (a new
 * CUNVME_ABI_VERSION), as host/backend/kmod_abi.cuh's static_asserts do on the library's side.
 */
static void __init cunvme_check_abi(void)
{
	BUILD_BUG_ON(CUNVME_ABI_VERSION != 1);
	BUILD_BUG_ON(sizeof(struct cunvme_device_info) != 112);
	BUILD_BUG_ON(offsetof(struct cunvme_device_info, flags) != 4);
	BUILD_BUG_ON(offsetof(struct cunvme_device_info, bar_size) != 8);
	BUILD_BUG_ON(offsetof(struct cunvme_device_info, bar_bus_address) != 56);
	BUILD_BUG_ON(offsetof(struct cunvme_device_info, max_pinned_bytes) != 104);
	BUILD_BUG_ON(sizeof(struct cunvme_pin_request) != 48);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, bytes) != 8);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, addresses) != 16);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, max_addresses) != 24);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, flags) != 28);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, handle) != 32);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, count) != 40);
	BUILD_BUG_ON(offsetof(struct cunvme_pin_request, page_shift) != 44);
	BUILD_BUG_ON(sizeof(struct cunvme_unpin_request) != 8);
	BUILD_BUG_ON(sizeof(struct cunvme_dma_buf_request) != 56);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, flags) != 4);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, offset) != 8);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, bytes) != 16);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, addresses) != 24);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, max_addresses) != 32);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, page_shift) != 36);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, handle) != 40);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, count) != 48);
	BUILD_BUG_ON(offsetof(struct cunvme_dma_buf_request, reserved) != 52);
	BUILD_BUG_ON(CUNVME_IOCTL_INFO != 0x80704301u);
	BUILD_BUG_ON(CUNVME_IOCTL_PIN != 0xc0304302u);
	BUILD_BUG_ON(CUNVME_IOCTL_UNPIN != 0x40084303u);
	BUILD_BUG_ON(CUNVME_IOCTL_MAP_DMA_BUF != 0xc0384304u);
	/* GPU pins' mmap offsets lie above every BAR's, and one handle step is one GPU page. */
	BUILD_BUG_ON(CUNVME_GPU_MMAP_BASE <= ((u64)CUNVME_BAR_COUNT << CUNVME_BAR_MMAP_SHIFT));
	BUILD_BUG_ON(CUNVME_GPU_MMAP_SHIFT != CUNVME_GPU_PAGE_SHIFT);
	BUILD_BUG_ON(CUNVME_GPU_MMAP_OFFSET(1) != 0x0100000000010000ULL);
}

static void __init cunvme_check_bdfs(void)
{
	int i;

	for (i = 0; i < bdf_count; i++) {
		unsigned int domain, bus, slot, fn;
		struct pci_dev *pdev;

		if (sscanf(bdf[i], "%x:%x:%x.%x", &domain, &bus, &slot, &fn) != 4) {
			pr_warn("bdf=%s is not a PCI address of the form 0000:01:00.0\n", bdf[i]);
			continue;
		}
		pdev = pci_get_domain_bus_and_slot(domain, bus, PCI_DEVFN(slot, fn));
		if (!pdev) {
			pr_warn("bdf=%s: no such PCI device\n", bdf[i]);
			continue;
		}
		if (pdev->class != PCI_CLASS_STORAGE_EXPRESS)
			pr_warn("bdf=%s is not an NVMe controller\n", bdf[i]);
		else if (pdev->dev.driver && pdev->dev.driver != &cunvme_driver.driver)
			pr_warn("bdf=%s is bound to %s: unbind it, then write it to /sys/bus/pci/drivers/cunvme/bind\n",
				bdf[i], pdev->dev.driver->name);
		pci_dev_put(pdev);
	}
}

static int __init cunvme_init(void)
{
	int ret;

	cunvme_check_abi();
	ret = alloc_chrdev_region(&cunvme_devt, 0, CUNVME_MAX_DEVICES, KBUILD_MODNAME);
	if (ret)
		return ret;
	ret = class_register(&cunvme_class);
	if (ret)
		goto unregister_region;
	ret = pci_register_driver(&cunvme_driver);
	if (ret)
		goto unregister_class;
	cunvme_check_bdfs();
	pr_info("loaded (GPU pinning %s; dma-buf import %s)\n",
		cunvme_gpu_pinning() ? "through nvidia_p2p" : "not built in",
		cunvme_dma_buf_import() ? "on" : "off (no CONFIG_DMA_SHARED_BUFFER)");
	return 0;

unregister_class:
	class_unregister(&cunvme_class);
unregister_region:
	unregister_chrdev_region(cunvme_devt, CUNVME_MAX_DEVICES);
	return ret;
}

static void __exit cunvme_exit(void)
{
	pci_unregister_driver(&cunvme_driver);
	class_unregister(&cunvme_class);
	unregister_chrdev_region(cunvme_devt, CUNVME_MAX_DEVICES);
	ida_destroy(&cunvme_minors);
}

module_init(cunvme_init);
module_exit(cunvme_exit);

MODULE_DESCRIPTION("cunvme: pinned memory with DMA addresses and BAR mappings for user-space NVMe drivers");
MODULE_LICENSE("GPL");
