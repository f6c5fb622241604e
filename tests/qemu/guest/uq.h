/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Minimal userspace NVMe queue helpers for the snvme guest tests: SQE/CQE
 * layouts, a queue pair driven through the snvme character device, and
 * DMA-mapped host buffers. Deliberately independent of libnvm so that the
 * driver is tested by a second implementation of the protocol.
 */
#ifndef TUTTI_QEMU_UQ_H
#define TUTTI_QEMU_UQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uapi/snvme.h> /* -I driver/snvme/include (tests/qemu/run.sh) */

/* Submission Queue Entry, NVMe Base Spec 2.0, Figure 88 (64 bytes). */
struct uq_sqe {
	uint8_t opc;
	uint8_t flags;		/* bits 7:6 PSDT: 00b PRP, 01b SGL (Figure 87) */
	uint16_t cid;
	uint32_t nsid;
	uint32_t cdw2, cdw3;
	uint64_t mptr;
	uint64_t dptr[2];	/* PRP1, PRP2 or one SGL descriptor */
	uint32_t cdw10;		/* Read/Write: SLBA bits 31:0 */
	uint32_t cdw11;		/* Read/Write: SLBA bits 63:32 */
	uint32_t cdw12;		/* Read/Write: NLB (0's based) bits 15:0, FUA bit 30 */
	uint32_t cdw13, cdw14, cdw15;
};
_Static_assert(sizeof(struct uq_sqe) == 64, "SQE is 64 bytes");

/* Completion Queue Entry, NVMe Base Spec 2.0, Figure 90 (16 bytes). */
struct uq_cqe {
	uint32_t dw0;
	uint32_t dw1;
	uint16_t sq_head;
	uint16_t sq_id;
	uint16_t cid;
	uint16_t status;	/* bit 0 phase tag; bits 15:1 status field */
};
_Static_assert(sizeof(struct uq_cqe) == 16, "CQE is 16 bytes");

/* SGL descriptor, NVMe Base Spec 2.0, 4.3.2, Figure 114 (16 bytes). */
struct uq_sgl {
	uint64_t addr;
	uint32_t length;
	uint8_t rsvd[3];
	uint8_t type;		/* bits 7:4 descriptor type, 3:0 subtype */
};
_Static_assert(sizeof(struct uq_sgl) == 16, "SGL descriptor is 16 bytes");

#define UQ_SGL_DATA_BLOCK 0x00
#define UQ_SGL_LAST_SEGMENT 0x30

enum { UQ_OPC_FLUSH = 0x00, UQ_OPC_WRITE = 0x01, UQ_OPC_READ = 0x02 };

/* An open controller: fd, info, doorbell window. */
struct uq_ctrl {
	int fd;
	struct snvme_info info;
	volatile uint8_t *doorbells;	/* info.doorbell_bytes */
	uint32_t lba_size;
	uint32_t max_xfer;		/* bytes per command we use */
};

/* One queue pair of a group, driven by one thread. */
struct uq_queue {
	struct uq_ctrl *c;
	struct snvme_queue_desc d;
	volatile struct uq_sqe *sq;
	volatile struct uq_cqe *cq;
	volatile uint32_t *sq_db, *cq_db;
	uint32_t tail, head;
	uint8_t phase;
	uint16_t next_cid;
	uint32_t outstanding;
};

/* A DMA-mapped host buffer. */
struct uq_buf {
	uint8_t *va;
	size_t len;
	uint64_t *bus;		/* one per 4 KiB page */
	uint32_t map_id;
	size_t npages;
};

int uq_open(struct uq_ctrl *c, const char *path);
void uq_close(struct uq_ctrl *c);
int uq_get_info(int fd, struct snvme_info *info);
int uq_group_create(struct uq_ctrl *c, uint32_t nr, uint32_t entries,
		    struct snvme_queue_group *g, struct uq_queue *qs);
void uq_group_unmap(struct uq_queue *qs, uint32_t nr);
int uq_group_destroy(struct uq_ctrl *c, uint32_t group_id);
int uq_buf_alloc(struct uq_ctrl *c, struct uq_buf *b, size_t len);
void uq_buf_free(struct uq_ctrl *c, struct uq_buf *b);

/* Fills the data pointer of sqe for [off, off + len) of b: PRPs or one SGL segment. */
int uq_set_dptr(struct uq_sqe *sqe, const struct uq_buf *b, size_t off, size_t len,
		const struct uq_buf *list, bool sgl);
/* Appends sqe (CID assigned) without ringing; returns the CID or -1 if full. */
int uq_push(struct uq_queue *q, struct uq_sqe *sqe);
void uq_ring(struct uq_queue *q);
/* Reaps one CQE within timeout_ms; returns 0, -ETIMEDOUT. */
int uq_reap(struct uq_queue *q, struct uq_cqe *out, int timeout_ms);
/* Read/write nlb blocks at slba to/from b+off and wait; returns the NVMe status or -errno. */
int uq_rw_sync(struct uq_queue *q, uint8_t opc, uint64_t slba, uint32_t nlb,
	       const struct uq_buf *b, size_t off, const struct uq_buf *list, bool sgl);
int uq_flush_sync(struct uq_queue *q);

uint64_t uq_now_ns(void);
void uq_drop_caches(void);

#endif
