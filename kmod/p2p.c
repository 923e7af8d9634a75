// SPDX-License-Identifier: GPL-2.0
/*
 * GPU memory through NVIDIA's nvidia_p2p interface: pins of cudaMalloc memory in 64 KiB GPU
 * pages mapped for the controller (CUNVME_PIN_GPU_MEMORY), the NVIDIA driver's free callback
 * that revokes them, and their write-combined CPU mapping (what gdrcopy does). Built only with
 * NVIDIA_SRC, whose nv-p2p.h this object alone includes (Kbuild); without it cunvme.h's stubs
 * answer EOPNOTSUPP and INFO reports no GPU pinning.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/io.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "cunvme.h"

#include "nv-p2p.h"

/* ---- Pinning GPU memory -------------------------------------------------------------- */

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
 * Takes the pin's tables, leaving NULL: of the free callback and the release, whichever comes
 * second finds nothing and leaves the pages to the other.
 */
static struct nvidia_p2p_page_table *cunvme_gpu_take_tables(struct cunvme_pin *pin,
							     struct nvidia_p2p_dma_mapping **mapping)
{
	struct nvidia_p2p_page_table *page_table;

	mutex_lock(&pin->gpu_lock);
	page_table = pin->page_table;
	*mapping = pin->mapping;
	pin->page_table = NULL;
	pin->mapping = NULL;
	mutex_unlock(&pin->gpu_lock);
	return page_table;
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

	page_table = cunvme_gpu_take_tables(pin, &mapping);
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

void cunvme_release_gpu_pin(struct cunvme_dev *cd, struct cunvme_pin *pin)
{
	struct nvidia_p2p_page_table *page_table;
	struct nvidia_p2p_dma_mapping *mapping;

	page_table = cunvme_gpu_take_tables(pin, &mapping);
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

int cunvme_pin_gpu(struct cunvme_file *f, struct cunvme_pin *pin, u64 address, u64 __user *out)
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

/* ---- mmap of pinned GPU memory (the CPU side of gdrcopy) ----------------------------- */

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
int cunvme_gpu_mmap_pin(struct cunvme_pin *pin, struct vm_area_struct *vma)
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
