/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * The test exporter's user interface: /dev/cunvme_test_exporter exports dma-bufs of zeroed
 * host pages (what udmabuf would give, which Debian's kernel lacks), revokes them and
 * reports what importers hold. For cunvme's guest test of dma-buf import only.
 */
#ifndef CUNVME_TEST_EXPORTER_H
#define CUNVME_TEST_EXPORTER_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define CUNVME_TEST_EXPORTER_MAX_BYTES (64u << 20)

/* EXPORT: a new dma-buf of `bytes` (whole pages, at most MAX_BYTES); its fd comes back. */
struct cunvme_test_export {
	__u64 bytes; /* in */
	__s32 fd;    /* out: O_RDWR | O_CLOEXEC; mmap gives the pages */
	__u32 flags; /* in: 0 */
};

/* STATUS / REVOKE: `fd` names one of this exporter's dma-bufs. */
struct cunvme_test_status {
	__s32 fd;          /* in */
	__u32 attachments; /* out: importers attached */
	__u32 mappings;    /* out: live map_dma_buf mappings */
	__u32 pins;        /* out: pin calls not yet unpinned */
	__u32 revoked;     /* out: 1 once revoked */
	__u32 reserved;
};

#define CUNVME_TEST_EXPORTER_MAGIC 'E'
#define CUNVME_TEST_EXPORT _IOWR(CUNVME_TEST_EXPORTER_MAGIC, 1, struct cunvme_test_export)
#define CUNVME_TEST_STATUS _IOWR(CUNVME_TEST_EXPORTER_MAGIC, 2, struct cunvme_test_status)
/*
 * REVOKE: marks the buffer revoked (new mappings fail with ENODEV) and calls
 * dma_buf_move_notify() for every attachment, as an exporter whose memory goes away does;
 * then reports the status (importers that honour move_notify have unmapped by then).
 */
#define CUNVME_TEST_REVOKE _IOWR(CUNVME_TEST_EXPORTER_MAGIC, 3, struct cunvme_test_status)

#endif /* CUNVME_TEST_EXPORTER_H */
