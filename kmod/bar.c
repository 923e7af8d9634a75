// SPDX-License-Identifier: GPL-2.0
/*
 * mmap of a memory BAR of the controller, uncached: the user-space driver's register (and
 * CMB) access. Offset bar << CUNVME_BAR_MMAP_SHIFT, plus a page-aligned offset into the BAR.
 */
#include <linux/mm.h>
#include <linux/pci.h>

#include "cunvme.h"

int cunvme_mmap_bar(struct cunvme_file *f, struct vm_area_struct *vma)
{
	struct pci_dev *pdev = f->cd->pdev;
	unsigned long len = vma->vm_end - vma->vm_start;
	u64 offset, within, size;
	resource_size_t start;
	unsigned int bar;

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
