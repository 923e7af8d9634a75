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
 * The ioctl ABI is cunvme_ioctl.h; errnos are listed in kmod/README.md.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/build_bug.h>
#include <linux/capability.h>
#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/pci.h>
#include <linux/refcount.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/wait.h>
#include <linux/xarray.h>

#include "cunvme_ioctl.h"

#ifdef CUNVME_NV_P2P
#include "nv-p2p.h"
#endif

#define CUNVME_MAX_DEVICES 64
#define CUNVME_GPU_PAGE_SHIFT 16 /* nvidia_p2p works in 64 KiB GPU pages */
#define CUNVME_GPU_PAGE_SIZE (1ULL << CUNVME_GPU_PAGE_SHIFT)
#define CUNVME_MAX_BDFS 16

/* NVMe registers the module touches itself (NVMe Base Specification 2.0, 3.1.3) */
#define NVME_REG_CAP 0x00
#define NVME_REG_CC 0x14
#define NVME_REG_CSTS 0x1c
#define NVME_CC_EN 0x1
#define NVME_CSTS_RDY 0x1
#define NVME_CAP_TO(cap_lo) (((cap_lo) >> 24) & 0xff) /* in 500 ms units */
/* Release waits at most this long for CSTS.RDY to clear; bus mastering goes off anyway. */
#define CUNVME_DISABLE_WAIT_MS 5000

static unsigned int max_pinned_mb = 16384;
module_param(max_pinned_mb, uint, 0644);
MODULE_PARM_DESC(max_pinned_mb,
		 "MiB one open device file may have pinned at a time (default 16384); processes without CAP_IPC_LOCK are also held to RLIMIT_MEMLOCK");

static ushort node_mode = 0600;
module_param(node_mode, ushort, 0444);
MODULE_PARM_DESC(node_mode, "permissions of /dev/cunvme/<BDF> (default 0600; udev rules may change owner and group)");

static char *bdf[CUNVME_MAX_BDFS];
static int bdf_count;
module_param_array(bdf, charp, &bdf_count, 0444);
MODULE_PARM_DESC(bdf, "PCI addresses (0000:01:00.0,...) of unbound NVMe controllers to take at load time");

static dev_t cunvme_devt;
static DEFINE_IDA(cunvme_minors);
static atomic64_t cunvme_pinned_pages = ATOMIC64_INIT(0);	/* host pages, all devices */
static atomic64_t cunvme_pinned_gpu_pages = ATOMIC64_INIT(0);	/* 64 KiB GPU pages */
static atomic64_t cunvme_dma_buf_pages = ATOMIC64_INIT(0);	/* mapped dma-buf pages */
static atomic64_t cunvme_next_handle = ATOMIC64_INIT(0);

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

struct cunvme_pin {
	u64 handle;
	/* the file's reference, plus one per CPU mapping (vma) of a GPU pin */
	refcount_t refs;
	u64 bytes;
	enum cunvme_pin_kind kind;
	/* host memory */
	unsigned long npages;
	struct page **pages;
	struct sg_table sgt;
	struct mm_struct *mm;	/* charged with npages of locked_vm */
#ifdef CUNVME_NV_P2P
	/* GPU memory; page_table and mapping are NULL once revoked or released */
	u64 gpu_address;
	struct mutex gpu_lock;	/* page_table, mapping; against the free callback */
	bool counted;		/* in cunvme_pinned_gpu_pages */
	struct nvidia_p2p_page_table *page_table;
	struct nvidia_p2p_dma_mapping *mapping;
	struct address_space *file_mapping;	/* the file's, for CPU mappings of the pin */
	bool wc_reserved;	/* write-combining reserved for the pages (x86 PAT); gpu_lock */
#endif
	/*
	 * dma-buf; under dmabuf->resv: dma_sgt is NULL once revoked or released, dma_pinned is
	 * cleared at UNPIN/close only (never in move_notify: see there)
	 */
	struct cunvme_file *file;
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *dma_sgt;
	bool dma_pinned;
};

static bool cunvme_gpu_pinning(void)
{
	return IS_ENABLED(CUNVME_NV_P2P);
}

/* ---- Pinning host memory -------------------------------------------------------------- */

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

/* ---- Pinning GPU memory (nvidia_p2p) -------------------------------------------------- */

#ifdef CUNVME_NV_P2P
/*
 * Removes the pin's pages from every CPU mapping of it (see cunvme_mmap_gpu) and drops the
 * memory-type reservation, before the GPU memory goes. Called once, after page_table was
 * cleared under gpu_lock, so no fault can map a page again.
 */
static void cunvme_gpu_unmap_cpu(struct cunvme_pin *pin, struct nvidia_p2p_page_table *page_table)
{
	u32 i;

	unmap_mapping_range(pin->file_mapping, CUNVME_GPU_MMAP_OFFSET(pin->handle), pin->bytes, 1);
	if (!pin->wc_reserved)
		return;
	for (i = 0; i < page_table->entries; i++)
		arch_io_free_memtype_wc(page_table->pages[i]->physical_address, CUNVME_GPU_PAGE_SIZE);
	pin->wc_reserved = false;
}

/*
 * The NVIDIA driver calls this when the GPU memory goes away under a pin (cudaFree, process
 * exit). It has already revoked the mapping: free the tables and never call put_pages for it
 * (NVIDIA's GPUDirect RDMA guide, "Handling the free callback"). It may come while the pin
 * ioctl is still using the tables, hence the mutex held there (as gdrdrv does).
 */
static void cunvme_gpu_free_callback(void *data)
{
	struct cunvme_pin *pin = data;
	struct nvidia_p2p_page_table *page_table;
	struct nvidia_p2p_dma_mapping *mapping;

	mutex_lock(&pin->gpu_lock);
	page_table = pin->page_table;
	mapping = pin->mapping;
	pin->page_table = NULL;
	pin->mapping = NULL;
	mutex_unlock(&pin->gpu_lock);
	if (!page_table)
		return;	/* unpin got there first and is putting the pages */
	/* The memory is going: no process may touch it through a mapping of ours after this. */
	cunvme_gpu_unmap_cpu(pin, page_table);
	if (mapping)
		nvidia_p2p_free_dma_mapping(mapping);
	nvidia_p2p_free_page_table(page_table);
	if (pin->counted)
		atomic64_sub(pin->bytes >> CUNVME_GPU_PAGE_SHIFT, &cunvme_pinned_gpu_pages);
}

static void cunvme_release_gpu_pin(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
	struct nvidia_p2p_page_table *page_table;
	struct nvidia_p2p_dma_mapping *mapping;

	mutex_lock(&pin->gpu_lock);
	page_table = pin->page_table;
	mapping = pin->mapping;
	pin->page_table = NULL;
	pin->mapping = NULL;
	mutex_unlock(&pin->gpu_lock);
	if (!page_table)
		return;	/* revoked by the free callback */
	/*
	 * nvidia_p2p_put_pages() waits for a free callback already under way, so once it
	 * returns none runs and the pin may be freed. Not under gpu_lock: that callback takes it.
	 */
	cunvme_gpu_unmap_cpu(pin, page_table);
	if (mapping)
		nvidia_p2p_dma_unmap_pages(cd->pdev, page_table, mapping);
	nvidia_p2p_put_pages(0, 0, pin->gpu_address, page_table);
	if (pin->counted)
		atomic64_sub(pin->bytes >> CUNVME_GPU_PAGE_SHIFT, &cunvme_pinned_gpu_pages);
}

static int cunvme_pin_gpu(struct cunvme_file *f, struct cunvme_pin *pin,
			  u64 address, u64 __user *out)
{
	u32 entries = pin->bytes >> CUNVME_GPU_PAGE_SHIFT;
	u64 *addresses;
	u32 i;
	int ret;

	addresses = kvmalloc_array(entries, sizeof(*addresses), GFP_KERNEL_ACCOUNT);
	if (!addresses)
		return -ENOMEM;
	mutex_init(&pin->gpu_lock);
	pin->gpu_address = address;
	pin->file_mapping = f->mapping;
	mutex_lock(&pin->gpu_lock);
	ret = nvidia_p2p_get_pages(0, 0, address, pin->bytes, &pin->page_table,
				   cunvme_gpu_free_callback, pin);
	if (ret) {
		pin->page_table = NULL;
		mutex_unlock(&pin->gpu_lock);
		kvfree(addresses);
		return ret;
	}
	ret = -EOPNOTSUPP;
	if (!NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(pin->page_table) ||
	    pin->page_table->page_size != NVIDIA_P2P_PAGE_SIZE_64KB ||
	    pin->page_table->entries != entries)
		goto release;
	ret = nvidia_p2p_dma_map_pages(f->cd->pdev, pin->page_table, &pin->mapping);
	if (ret) {
		pin->mapping = NULL;
		goto release;
	}
	ret = -EOPNOTSUPP;
	if (!NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(pin->mapping) ||
	    pin->mapping->entries != entries)
		goto release;
	for (i = 0; i < entries; i++)
		addresses[i] = pin->mapping->dma_addresses[i];
	pin->counted = true;
	atomic64_add(entries, &cunvme_pinned_gpu_pages);
	mutex_unlock(&pin->gpu_lock);
	/*
	 * Copied out after gpu_lock is dropped: a fault on `out` takes mmap_lock, which the mmap
	 * and fault paths of GPU mappings hold while they take gpu_lock.
	 */
	ret = copy_to_user(out, addresses, (size_t)entries * sizeof(*addresses)) ? -EFAULT : 0;
	kvfree(addresses);
	if (ret)
		cunvme_release_gpu_pin(f->cd, pin);
	return ret;

release:
	mutex_unlock(&pin->gpu_lock);
	cunvme_release_gpu_pin(f->cd, pin);
	kvfree(addresses);
	return ret;
}
#else
static void cunvme_release_gpu_pin(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
}

static int cunvme_pin_gpu(struct cunvme_file *f, struct cunvme_pin *pin,
			  u64 address, u64 __user *out)
{
	return -EOPNOTSUPP;
}
#endif

/* ---- Mapping dma-bufs ----------------------------------------------------------------- */

static bool cunvme_dma_buf_import(void)
{
	return IS_ENABLED(CONFIG_DMA_SHARED_BUFFER);
}

#if IS_ENABLED(CONFIG_DMA_SHARED_BUFFER)
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

static void cunvme_release_dma_buf(struct cunvme_dev *cd, struct cunvme_pin *pin)
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
#else
static void cunvme_release_dma_buf(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
}

static int cunvme_map_dma_buf(struct cunvme_file *f, struct cunvme_pin *pin, int fd,
			      u64 offset, u64 *out)
{
	return -EOPNOTSUPP;
}
#endif

/* A GPU pin's struct outlives its unpinning while a CPU mapping (vma) of it remains. */
static void cunvme_pin_put(struct cunvme_pin *pin)
{
	if (refcount_dec_and_test(&pin->refs))
		kfree(pin);
}

static void cunvme_release_pin(struct cunvme_file *f, struct cunvme_pin *pin)
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

/* ---- ioctls --------------------------------------------------------------------------- */

static u64 cunvme_max_pinned_bytes(void)
{
	u64 limit = (u64)READ_ONCE(max_pinned_mb) << 20;

	if (!capable(CAP_IPC_LOCK))
		limit = min_t(u64, limit, rlimit(RLIMIT_MEMLOCK));
	return limit;
}

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

/*
 * Whether this file may pin @bytes more (called with f->lock held): not after a revoke of one
 * of its dma-bufs (-ENOLINK), and within max_pinned_mb (-ENOMEM).
 */
static int cunvme_may_pin(struct cunvme_file *f, u64 bytes)
{
	lockdep_assert_held(&f->lock);
	if (READ_ONCE(f->dma_revoked))
		return -ENOLINK;
	if (bytes > cunvme_max_pinned_bytes() ||
	    f->pinned_bytes > cunvme_max_pinned_bytes() - bytes)
		return -ENOMEM;
	return 0;
}

static long cunvme_ioctl_pin(struct cunvme_file *f, void __user *arg)
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

static long cunvme_ioctl_unpin(struct cunvme_file *f, void __user *arg)
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

static long cunvme_ioctl_map_dma_buf(struct cunvme_file *f, void __user *arg)
{
	struct cunvme_dma_buf_request req;
	struct cunvme_pin *pin;
	u64 end, *addresses;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.flags || req.reserved)
		return -EINVAL;
	if (!cunvme_dma_buf_import())
		return -EOPNOTSUPP;
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

/* ---- mmap of pinned GPU memory (the CPU side of gdrcopy) ----------------------------- */

#ifdef CUNVME_NV_P2P
/*
 * Maps the whole 64 KiB GPU page under the fault (as far as the vma reaches): one fault per
 * GPU page. Under gpu_lock, so that a page is mapped only while the pin holds it; whoever
 * clears page_table zaps afterwards (cunvme_gpu_unmap_cpu). Pages are mapped here rather than
 * in mmap because only here is the vma already in the file's mapping, where that zap finds it.
 */
static vm_fault_t cunvme_gpu_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct cunvme_pin *pin = vma->vm_private_data;
	unsigned long first = CUNVME_GPU_MMAP_OFFSET(pin->handle) >> PAGE_SHIFT;
	unsigned long page_start, start, end, addr;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	u64 within, physical;

	if (vmf->pgoff < first)
		return VM_FAULT_SIGBUS;
	within = (u64)(vmf->pgoff - first) << PAGE_SHIFT;
	if (within >= pin->bytes)
		return VM_FAULT_SIGBUS;
	mutex_lock(&pin->gpu_lock);
	if (!pin->page_table)
		goto unlock;	/* unpinned, or revoked by the NVIDIA driver */
	physical = pin->page_table->pages[within >> CUNVME_GPU_PAGE_SHIFT]->physical_address;
	if (!IS_ALIGNED(physical, CUNVME_GPU_PAGE_SIZE))
		goto unlock;
	page_start = (vmf->address & PAGE_MASK) - (within & (CUNVME_GPU_PAGE_SIZE - 1));
	start = max(page_start, vma->vm_start);
	end = min(page_start + (unsigned long)CUNVME_GPU_PAGE_SIZE, vma->vm_end);
	for (addr = start; addr < end; addr += PAGE_SIZE) {
		ret = vmf_insert_pfn_prot(vma, addr, (physical + (addr - page_start)) >> PAGE_SHIFT,
					  vma->vm_page_prot);
		if (ret != VM_FAULT_NOPAGE)
			break;
	}
unlock:
	mutex_unlock(&pin->gpu_lock);
	return ret;
}

/* A vma split off (munmap of a part, mremap) holds the pin as its original does. */
static void cunvme_gpu_vma_open(struct vm_area_struct *vma)
{
	struct cunvme_pin *pin = vma->vm_private_data;

	refcount_inc(&pin->refs);
}

static void cunvme_gpu_vma_close(struct vm_area_struct *vma)
{
	cunvme_pin_put(vma->vm_private_data);
}

static const struct vm_operations_struct cunvme_gpu_vm_ops = {
	.open = cunvme_gpu_vma_open,
	.close = cunvme_gpu_vma_close,
	.fault = cunvme_gpu_fault,
};

/*
 * Sets the vma up for GPU pin `pin` (the caller's reference passes to the vma). The pages are
 * mapped write-combined: on x86 with PAT the type of a pfn mapped at fault time is the one
 * reserved for its physical range (uncached where none is), so the pin's pages are reserved
 * write-combining once, here, and released when the pin goes.
 */
static int cunvme_gpu_mmap_pin(struct cunvme_pin *pin, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	u32 i;
	int ret = 0;

	if (!IS_ALIGNED(len, CUNVME_GPU_PAGE_SIZE) || CUNVME_GPU_PAGE_SIZE % PAGE_SIZE)
		return -EINVAL;
	if (len > pin->bytes)
		return -ERANGE;
	mutex_lock(&pin->gpu_lock);
	if (!pin->page_table) {
		ret = -ENOLINK;	/* the NVIDIA driver revoked the memory */
		goto unlock;
	}
	for (i = 0; !pin->wc_reserved && i < pin->page_table->entries; i++) {
		ret = arch_io_reserve_memtype_wc(pin->page_table->pages[i]->physical_address,
						 CUNVME_GPU_PAGE_SIZE);
		if (ret) {
			while (i--)
				arch_io_free_memtype_wc(pin->page_table->pages[i]->physical_address,
							CUNVME_GPU_PAGE_SIZE);
			goto unlock;
		}
	}
	pin->wc_reserved = true;
	/* Not copied into a child: the NVIDIA driver does not share GPU memory across fork. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
#else
	vma->vm_flags |= VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY;
#endif
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	vma->vm_private_data = pin;
	vma->vm_ops = &cunvme_gpu_vm_ops;
unlock:
	mutex_unlock(&pin->gpu_lock);
	return ret;
}
#else
static int cunvme_gpu_mmap_pin(struct cunvme_pin *pin, struct vm_area_struct *vma)
{
	return -EOPNOTSUPP;	/* no GPU pins exist without nvidia_p2p */
}
#endif

/*
 * mmap at CUNVME_GPU_MMAP_OFFSET(handle). The pin is looked up under the xarray's lock, not
 * f->lock: PIN holds f->lock while it faults user pages in (mmap_lock), and mmap runs under
 * mmap_lock.
 */
static int cunvme_mmap_gpu(struct cunvme_file *f, struct vm_area_struct *vma, u64 offset)
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

/* ---- mmap of a BAR -------------------------------------------------------------------- */

static int cunvme_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct cunvme_file *f = file->private_data;
	struct pci_dev *pdev = f->cd->pdev;
	unsigned long len = vma->vm_end - vma->vm_start;
	u64 offset, within, size;
	resource_size_t start;
	unsigned int bar;

	/* A private mapping would be copy-on-write over device registers. */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	/* No overflow: the core checked that vm_pgoff + the length fits in a file offset. */
	if ((u64)vma->vm_pgoff << PAGE_SHIFT >= CUNVME_GPU_MMAP_BASE)
		return cunvme_mmap_gpu(f, vma, (u64)vma->vm_pgoff << PAGE_SHIFT);
	if (vma->vm_pgoff >= ((u64)CUNVME_BAR_COUNT << CUNVME_BAR_MMAP_SHIFT) >> PAGE_SHIFT)
		return -EINVAL;
	offset = (u64)vma->vm_pgoff << PAGE_SHIFT;
	bar = offset >> CUNVME_BAR_MMAP_SHIFT;
	within = offset & ((1ULL << CUNVME_BAR_MMAP_SHIFT) - 1);
	if (!(pci_resource_flags(pdev, bar) & IORESOURCE_MEM))
		return -EINVAL;
	start = pci_resource_start(pdev, bar);
	/* A BAR smaller than a page is mapped as its whole page, as sysfs resourceN does. */
	size = round_up((u64)pci_resource_len(pdev, bar), PAGE_SIZE);
	if (!PAGE_ALIGNED(start) || within >= size || len > size - within)
		return -EINVAL;

	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	return io_remap_pfn_range(vma, vma->vm_start, (start + within) >> PAGE_SHIFT, len,
				  vma->vm_page_prot);
}

/* ---- open and release ----------------------------------------------------------------- */

/*
 * Resets the PCI function (FLR where it has one; the PCI core picks from
 * /sys/bus/pci/devices/<BDF>/reset_method), which ends every command the controller had and
 * returns it to its power-on state. The core saves and restores config space around it, bus
 * mastering included (off here). `device_locked`: the caller holds the device lock (unbind);
 * otherwise it is only tried, never waited for (see the callers).
 */
static int cunvme_reset(struct cunvme_dev *cd, bool device_locked)
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

static const struct file_operations cunvme_fops = {
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

/* ---- sysfs: pinned-page counters ------------------------------------------------------ */

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

/* ---- PCI driver ----------------------------------------------------------------------- */

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

/* ---- module --------------------------------------------------------------------------- */

/* The layout cunvme's user-space side (host/kmod_abi.cuh) was written against. */
static void __init cunvme_check_abi(void)
{
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
#if IS_ENABLED(CONFIG_DMA_SHARED_BUFFER)
/* dma_buf_* are exported in the DMA_BUF namespace (since 5.16); 6.13 made the name a string. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
#endif
