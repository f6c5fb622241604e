// SPDX-License-Identifier: Apache-2.0
#include "uq.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

uint64_t uq_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

void uq_drop_caches(void)
{
	int fd;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd >= 0) {
		if (write(fd, "3\n", 2) != 2)
			perror("drop_caches");
		close(fd);
	}
}

int uq_get_info(int fd, struct snvme_info *info)
{
	memset(info, 0, sizeof(*info));
	info->hdr.abi_version = SNVME_ABI_VERSION;
	info->hdr.argsz = sizeof(*info);
	return ioctl(fd, SNVME_IOC_GET_INFO, info) ? -errno : 0;
}

int uq_open(struct uq_ctrl *c, const char *path)
{
	uint64_t need = SNVME_CAP_QUEUE_GROUPS | SNVME_CAP_DMA_HOST;
	void *db;
	int ret;

	memset(c, 0, sizeof(*c));
	c->fd = open(path, O_RDWR | O_CLOEXEC);
	if (c->fd < 0)
		return -errno;
	ret = uq_get_info(c->fd, &c->info);
	if (ret)
		goto fail;
	/* ABI version and capabilities first (uapi rule 1). */
	if (c->info.hdr.abi_version != SNVME_ABI_VERSION || (c->info.caps & need) != need) {
		fprintf(stderr, "abi %u caps 0x%llx unsupported\n", c->info.hdr.abi_version,
			(unsigned long long)c->info.caps);
		ret = -EPROTO;
		goto fail;
	}
	db = mmap(NULL, c->info.doorbell_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd,
		  SNVME_MMAP_DOORBELLS);
	if (db == MAP_FAILED) {
		ret = -errno;
		goto fail;
	}
	c->doorbells = db;
	c->lba_size = 1u << c->info.ns[0].lba_shift;
	c->max_xfer = c->info.max_transfer ? c->info.max_transfer : 1u << 20;
	if (c->max_xfer > (1u << 20))
		c->max_xfer = 1u << 20;
	return 0;
fail:
	close(c->fd);
	c->fd = -1;
	return ret;
}

void uq_close(struct uq_ctrl *c)
{
	if (c->doorbells)
		munmap((void *)c->doorbells, c->info.doorbell_bytes);
	if (c->fd >= 0)
		close(c->fd);
	c->doorbells = NULL;
	c->fd = -1;
}

int uq_group_create(struct uq_ctrl *c, uint32_t nr, uint32_t entries,
		    struct snvme_queue_group *g, struct uq_queue *qs)
{
	uint32_t i;

	memset(g, 0, sizeof(*g));
	g->hdr.abi_version = SNVME_ABI_VERSION;
	g->hdr.argsz = sizeof(*g);
	g->nr_queues = nr;
	g->entries = entries;
	if (ioctl(c->fd, SNVME_IOC_CREATE_QUEUE_GROUP, g))
		return -errno;
	for (i = 0; i < nr; i++) {
		struct uq_queue *q = &qs[i];
		void *sq, *cq;

		memset(q, 0, sizeof(*q));
		q->c = c;
		q->d = g->queues[i];
		sq = mmap(NULL, q->d.sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd,
			  q->d.sq_offset);
		cq = mmap(NULL, q->d.cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd,
			  q->d.cq_offset);
		if (sq == MAP_FAILED || cq == MAP_FAILED)
			return -errno;
		q->sq = sq;
		q->cq = cq;
		q->sq_db = (volatile uint32_t *)(c->doorbells + q->d.sq_doorbell);
		q->cq_db = (volatile uint32_t *)(c->doorbells + q->d.cq_doorbell);
		q->phase = 1;
	}
	return 0;
}

void uq_group_unmap(struct uq_queue *qs, uint32_t nr)
{
	uint32_t i;

	for (i = 0; i < nr; i++) {
		if (qs[i].sq)
			munmap((void *)qs[i].sq, qs[i].d.sq_bytes);
		if (qs[i].cq)
			munmap((void *)qs[i].cq, qs[i].d.cq_bytes);
		qs[i].sq = NULL;
		qs[i].cq = NULL;
	}
}

int uq_group_destroy(struct uq_ctrl *c, uint32_t group_id)
{
	struct snvme_group_id a = { .hdr = { SNVME_ABI_VERSION, sizeof(a) },
				    .group_id = group_id };

	return ioctl(c->fd, SNVME_IOC_DESTROY_QUEUE_GROUP, &a) ? -errno : 0;
}

int uq_buf_alloc(struct uq_ctrl *c, struct uq_buf *b, size_t len)
{
	struct snvme_dma_map m = { .hdr = { SNVME_ABI_VERSION, sizeof(m) } };
	void *va;

	memset(b, 0, sizeof(*b));
	va = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
		  -1, 0);
	if (va == MAP_FAILED)
		return -errno;
	b->va = va;
	b->len = len;
	b->npages = len / 4096;
	b->bus = calloc(b->npages, sizeof(uint64_t));
	if (!b->bus)
		return -ENOMEM;
	m.kind = SNVME_DMA_HOST;
	m.vaddr = (uintptr_t)va;
	m.length = len;
	m.bus_addrs = (uintptr_t)b->bus;
	m.max_addrs = b->npages;
	if (ioctl(c->fd, SNVME_IOC_DMA_MAP, &m))
		return -errno;
	if (m.nr_pages != b->npages)
		return -EIO;
	b->map_id = m.map_id;
	return 0;
}

void uq_buf_free(struct uq_ctrl *c, struct uq_buf *b)
{
	struct snvme_dma_unmap u = { .hdr = { SNVME_ABI_VERSION, sizeof(u) },
				     .map_id = b->map_id };

	if (b->map_id && ioctl(c->fd, SNVME_IOC_DMA_UNMAP, &u))
		perror("DMA_UNMAP");
	if (b->va)
		munmap(b->va, b->len);
	free(b->bus);
	memset(b, 0, sizeof(*b));
}

int uq_set_dptr(struct uq_sqe *sqe, const struct uq_buf *b, size_t off, size_t len,
		const struct uq_buf *list, bool sgl)
{
	size_t first = off / 4096, last = (off + len - 1) / 4096, n = last - first + 1, i;
	uint64_t *prp;

	if (off % 4 || off + len > b->len)
		return -EINVAL;
	if (sgl) {
		/* One Last Segment descriptor pointing at one Data Block per page. */
		struct uq_sgl *d = (struct uq_sgl *)list->va;
		size_t pos = off, left = len;

		if (n > list->len / sizeof(*d))
			return -E2BIG;
		for (i = 0; i < n; i++) {
			size_t chunk = 4096 - pos % 4096;

			if (chunk > left)
				chunk = left;
			d[i].addr = b->bus[pos / 4096] + pos % 4096;
			d[i].length = chunk;
			memset(d[i].rsvd, 0, sizeof(d[i].rsvd));
			d[i].type = UQ_SGL_DATA_BLOCK;
			pos += chunk;
			left -= chunk;
		}
		sqe->flags = 1 << 6;	/* PSDT 01b: SGL, MPTR a single buffer */
		sqe->dptr[0] = list->bus[0];
		sqe->dptr[1] = (uint64_t)(n * sizeof(*d)) | ((uint64_t)UQ_SGL_LAST_SEGMENT << 56);
		return 0;
	}
	sqe->flags = 0;
	sqe->dptr[0] = b->bus[first] + off % 4096;
	if (n == 1) {
		sqe->dptr[1] = 0;
	} else if (n == 2) {
		sqe->dptr[1] = b->bus[first + 1];
	} else {
		/* PRP list: entries 2..n, one 4 KiB list page (NVMe Base Spec 2.0, 4.3.1). */
		if (n - 1 > list->len / 8 || n - 1 > 512)
			return -E2BIG;
		prp = (uint64_t *)list->va;
		for (i = 1; i < n; i++)
			prp[i - 1] = b->bus[first + i];
		sqe->dptr[1] = list->bus[0];
	}
	return 0;
}

/*
 * At most entries - 1 commands are outstanding, so neither the SQ (a slot
 * frees when fetched, before it completes) nor the CQ (same size) can fill.
 */
int uq_push(struct uq_queue *q, struct uq_sqe *sqe)
{
	if (q->outstanding + 1 >= q->d.entries)
		return -1;
	/* CID: low 12 bits a counter, top 4 bits the QID's low bits, never 0xffff. */
	sqe->cid = (q->next_cid++ & 0x0fff) | ((q->d.qid & 0xf) << 12);
	memcpy((void *)&q->sq[q->tail], sqe, sizeof(*sqe));
	q->tail = (q->tail + 1) % q->d.entries;
	q->outstanding++;
	return sqe->cid;
}

/* One doorbell write for every SQE pushed since the last ring. */
void uq_ring(struct uq_queue *q)
{
	/* The SQE stores must be visible to the device before the tail store. */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	*q->sq_db = q->tail;
}

int uq_reap(struct uq_queue *q, struct uq_cqe *out, int timeout_ms)
{
	uint64_t deadline = uq_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	volatile struct uq_cqe *cqe = &q->cq[q->head];

	while ((cqe->status & 1) != q->phase) {
		if (uq_now_ns() > deadline)
			return -ETIMEDOUT;
		__builtin_ia32_pause();
	}
	/* Read the CQE body only after its phase tag matched. */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	memcpy(out, (const void *)cqe, sizeof(*out));
	if (++q->head == q->d.entries) {
		q->head = 0;
		q->phase ^= 1;
	}
	*q->cq_db = q->head;
	q->outstanding--;
	return 0;
}

static int uq_wait_cid(struct uq_queue *q, int cid)
{
	struct uq_cqe cqe;
	int ret = uq_reap(q, &cqe, 10000);

	if (ret) {
		fprintf(stderr, "QID %u: no completion for CID 0x%x within 10 s\n", q->d.qid, cid);
		return ret;
	}
	if (cqe.cid != cid) {
		fprintf(stderr, "QID %u: completion for CID 0x%x, expected 0x%x\n", q->d.qid,
			cqe.cid, cid);
		return -EIO;
	}
	if (cqe.sq_id != q->d.qid) {
		fprintf(stderr, "CQE SQID %u, expected %u\n", cqe.sq_id, q->d.qid);
		return -EIO;
	}
	return cqe.status >> 1;
}

int uq_rw_sync(struct uq_queue *q, uint8_t opc, uint64_t slba, uint32_t nlb,
	       const struct uq_buf *b, size_t off, const struct uq_buf *list, bool sgl)
{
	struct uq_sqe sqe = { .opc = opc, .nsid = q->c->info.ns[0].nsid };
	int cid, ret;

	ret = uq_set_dptr(&sqe, b, off, (size_t)nlb * q->c->lba_size, list, sgl);
	if (ret)
		return ret;
	sqe.cdw10 = (uint32_t)slba;
	sqe.cdw11 = (uint32_t)(slba >> 32);
	sqe.cdw12 = nlb - 1;	/* 0's based */
	cid = uq_push(q, &sqe);
	if (cid < 0)
		return -EBUSY;
	uq_ring(q);
	return uq_wait_cid(q, cid);
}

int uq_flush_sync(struct uq_queue *q)
{
	struct uq_sqe sqe = { .opc = UQ_OPC_FLUSH, .nsid = q->c->info.ns[0].nsid };
	int cid = uq_push(q, &sqe);

	if (cid < 0)
		return -EBUSY;
	uq_ring(q);
	return uq_wait_cid(q, cid);
}
