// SPDX-License-Identifier: Apache-2.0
/*
 * Guest-side tests of the snvme driver. One binary, one subcommand per
 * behaviour; tests/qemu/guest/suite.sh runs them. Each prints what it
 * checked and exits 0 on success, 1 on a failed check, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/capability.h>
#include <unistd.h>

#include "uq.h"

#define CTRL_PATH "/dev/snvme0"
#define BDEV_PATH "/dev/snvme0n1"
#define CONTROL_PATH "/dev/snvme-control"
#define DEBUGFS_CTRL "/sys/kernel/debug/snvme/snvme0/"
#define SNVME_MAX_USER_QUEUES_GUESS 128

static int failures;

static int revoke_call(int fd, uint32_t scope, struct snvme_revoke *r);

static void check(bool ok, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("%s: ", ok ? "ok" : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	if (!ok)
		failures++;
}

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("FAIL: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	exit(1);
}

static void must_open(struct uq_ctrl *c)
{
	int ret = uq_open(c, CTRL_PATH);

	if (ret)
		die("open %s: %s", CTRL_PATH, strerror(-ret));
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
	size_t i;

	for (i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = seed >> 16;
	}
}

/* ---- control device ---------------------------------------------------- */

static int control(unsigned long cmd, const char *addr, uint32_t abi, int *instance)
{
	struct snvme_bind b = { .hdr = { abi, sizeof(b) } };
	int fd, ret = 0;

	fd = open(CONTROL_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	snprintf(b.pci_addr, sizeof(b.pci_addr), "%s", addr);
	if (ioctl(fd, cmd, &b))
		ret = -errno;
	else if (instance)
		*instance = b.instance;
	close(fd);
	return ret;
}

static int wait_node(const char *path, bool present, int timeout_ms)
{
	uint64_t deadline = uq_now_ns() + timeout_ms * 1000000ull;

	while ((access(path, F_OK) == 0) != present) {
		if (uq_now_ns() > deadline)
			return -ETIMEDOUT;
		usleep(10000);
	}
	return 0;
}

static int cmd_bind(const char *addr)
{
	int inst = -2, ret = control(SNVME_IOC_BIND, addr, SNVME_ABI_VERSION, &inst);

	check(ret == 0, "BIND %s: %s, instance %d", addr, ret ? strerror(-ret) : "bound", inst);
	check(inst == 0, "instance is 0");
	check(wait_node(CTRL_PATH, true, 5000) == 0, "%s appeared", CTRL_PATH);
	check(wait_node(BDEV_PATH, true, 5000) == 0, "%s appeared", BDEV_PATH);
	ret = control(SNVME_IOC_BIND, addr, SNVME_ABI_VERSION, NULL);
	check(ret == -EALREADY, "second BIND returns EALREADY (%s)", strerror(-ret));
	return failures ? 1 : 0;
}

/* ---- info and permissions -------------------------------------------- */

static int cmd_info(uint32_t lba_size, const char *serial)
{
	struct uq_ctrl c;
	struct snvme_info *in = &c.info;
	uint64_t bytes = 0;
	int fd, ssz = 0;
	struct snvme_ns_info *ns;

	must_open(&c);
	ns = &in->ns[0];
	printf("model %.40s serial %.20s fw %.8s vid 0x%04x\n", in->model, in->serial,
	       in->firmware, in->vid);
	printf("caps 0x%llx MQES+1 %u DSTRD %u bytes MDTS %u bytes SGLS 0x%x NN %u\n",
	       (unsigned long long)in->caps, in->max_queue_entries, in->doorbell_stride,
	       in->max_transfer, in->sgls, in->nn);
	printf("queues: kernel %u, user %u (QIDs %u..%u), free %u, doorbell window %u bytes\n",
	       in->kernel_queues, in->user_queues, in->user_qid_first,
	       in->user_qid_first + in->user_queues - 1, in->user_queues_free, in->doorbell_bytes);
	printf("ns %u: nsze %llu ncap %llu lba_shift %u flbas %u nlbaf %u\n", ns->nsid,
	       (unsigned long long)ns->nsze, (unsigned long long)ns->ncap, ns->lba_shift,
	       ns->flbas_index, ns->nlbaf);
	check(in->hdr.abi_version == SNVME_ABI_VERSION, "abi_version %u", in->hdr.abi_version);
	check((in->caps & (SNVME_CAP_QUEUE_GROUPS | SNVME_CAP_DMA_HOST)) ==
	      (SNVME_CAP_QUEUE_GROUPS | SNVME_CAP_DMA_HOST), "caps has QUEUE_GROUPS and DMA_HOST");
	check(in->caps & SNVME_CAP_IOMMU, "caps has IOMMU (guest runs with intel-iommu)");
	check(!(in->caps & SNVME_CAP_DMA_GPU), "no GPU DMA without nv-p2p");
	check(strncmp(in->serial, serial, strlen(serial)) == 0, "Identify serial starts with %s", serial);
	check(in->max_queue_entries >= 2 && in->max_queue_entries <= 65536,
	      "MQES+1 %u in 2..65536", in->max_queue_entries);
	check(in->max_queue_entries == ((in->cap & 0xffff) + 1), "MQES matches CAP");
	check(in->doorbell_stride == 4u << ((in->cap >> 32) & 0xf), "DSTRD matches CAP");
	check(in->doorbell_bytes && in->doorbell_bytes % 4096 == 0 &&
	      in->doorbell_bytes >= 2u * (in->user_qid_first + in->user_queues) * in->doorbell_stride,
	      "doorbell window %u covers the user QIDs", in->doorbell_bytes);
	check(in->kernel_queues >= 1 && in->user_qid_first == in->kernel_queues + 1,
	      "kernel QIDs 1..%u, user from %u", in->kernel_queues, in->user_qid_first);
	check(in->user_queues >= 1 && in->user_queues_free == in->user_queues,
	      "user queue budget %u, all free", in->user_queues);
	check(in->pinned_pages == 0 && in->dma_maps == 0 && in->queue_groups == 0,
	      "leak counters zero (pins %llu maps %u groups %u)",
	      (unsigned long long)in->pinned_pages, in->dma_maps, in->queue_groups);
	check(in->nr_namespaces >= 1 && ns->nsid == 1, "namespace 1 present");
	check((1u << ns->lba_shift) == lba_size, "LBA size %u, expected %u", 1u << ns->lba_shift,
	      lba_size);
	check(ns->nlbaf >= 1 && ns->lbaf[ns->flbas_index].lba_shift == ns->lba_shift,
	      "LBA format table agrees with FLBAS");
	fd = open(BDEV_PATH, O_RDONLY);
	if (fd < 0 || ioctl(fd, BLKGETSIZE64, &bytes) || ioctl(fd, BLKSSZGET, &ssz))
		die("%s: %s", BDEV_PATH, strerror(errno));
	close(fd);
	check(bytes == ns->nsze << ns->lba_shift, "block device size %llu = NSZE * LBA size",
	      (unsigned long long)bytes);
	check((uint32_t)ssz == lba_size, "block device logical block size %d", ssz);
	uq_close(&c);
	return failures ? 1 : 0;
}

static int mode_of(const char *p)
{
	struct stat st;

	return stat(p, &st) ? -1 : (int)(st.st_mode & 07777);
}

static int drop_cap(int cap)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	if (syscall(SYS_capget, &h, d))
		return -1;
	d[cap / 32].effective &= ~(1u << (cap % 32));
	d[cap / 32].permitted &= ~(1u << (cap % 32));
	return syscall(SYS_capset, &h, d);
}

static int cmd_perms(const char *addr)
{
	const char *nodes[] = { CTRL_PATH, BDEV_PATH, CONTROL_PATH };
	int i, st;
	pid_t pid;

	for (i = 0; i < 3; i++)
		check(mode_of(nodes[i]) == 0600, "%s mode %o", nodes[i], mode_of(nodes[i]));
	/* An unprivileged user cannot open the nodes. */
	pid = fork();
	if (pid == 0) {
		if (setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
			_exit(3);
		_exit(open(CTRL_PATH, O_RDWR) < 0 && errno == EACCES &&
		      open(CONTROL_PATH, O_RDWR) < 0 && errno == EACCES ? 0 : 1);
	}
	waitpid(pid, &st, 0);
	check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uid 65534 gets EACCES on %s and %s",
	      CTRL_PATH, CONTROL_PATH);
	/* Root without CAP_SYS_ADMIN cannot bind or unbind. */
	pid = fork();
	if (pid == 0) {
		int r;

		if (drop_cap(CAP_SYS_ADMIN))
			_exit(3);
		r = control(SNVME_IOC_UNBIND, addr, SNVME_ABI_VERSION, NULL);
		_exit(r == -EPERM ? 0 : 1);
	}
	waitpid(pid, &st, 0);
	check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "UNBIND without CAP_SYS_ADMIN gets EPERM");
	check(access(CTRL_PATH, F_OK) == 0, "controller still bound");
	return failures ? 1 : 0;
}

/* ---- FIEMAP-resolved IO -------------------------------------------- */

struct extent {
	uint64_t logical, physical, length;
};

static int file_extents(const char *path, struct extent *ext, int max)
{
	size_t sz = sizeof(struct fiemap) + max * sizeof(struct fiemap_extent);
	struct fiemap *fm = calloc(1, sz);
	int fd = open(path, O_RDONLY), n = 0;
	uint32_t i;

	if (fd < 0 || !fm)
		die("open %s: %s", path, strerror(errno));
	fsync(fd);
	fm->fm_start = 0;
	fm->fm_length = FIEMAP_MAX_OFFSET;
	fm->fm_flags = FIEMAP_FLAG_SYNC;
	fm->fm_extent_count = max;
	if (ioctl(fd, FS_IOC_FIEMAP, fm))
		die("FIEMAP %s: %s", path, strerror(errno));
	for (i = 0; i < fm->fm_mapped_extents; i++) {
		struct fiemap_extent *e = &fm->fm_extents[i];

		if (e->fe_flags & (FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC |
				   FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_NOT_ALIGNED |
				   FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_UNWRITTEN))
			die("%s: extent %u flags 0x%x cannot be read raw", path, i, e->fe_flags);
		ext[n].logical = e->fe_logical;
		ext[n].physical = e->fe_physical;
		ext[n].length = e->fe_length;
		n++;
	}
	close(fd);
	free(fm);
	return n;
}

static uint8_t *read_file(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	uint8_t *p;
	size_t got = 0;

	if (fd < 0 || fstat(fd, &st))
		die("open %s: %s", path, strerror(errno));
	p = malloc(st.st_size + 1);
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, p + got, st.st_size - got);

		if (r <= 0)
			die("read %s: %s", path, strerror(errno));
		got += r;
	}
	close(fd);
	*len = got;
	return p;
}

/*
 * Reads (or writes) [e.physical, +len) through queue q, in commands of at
 * most chunk bytes, into (from) b at offset 0.
 */
static int extent_io(struct uq_queue *q, uint8_t opc, uint64_t phys, size_t len,
		     struct uq_buf *b, size_t boff, struct uq_buf *list, bool sgl, size_t chunk)
{
	uint32_t lba = q->c->lba_size;
	size_t done = 0;

	while (done < len) {
		size_t n = len - done < chunk ? len - done : chunk;
		int st = uq_rw_sync(q, opc, (phys + done) / lba, n / lba, b, boff + done, list, sgl);

		if (st) {
			printf("  %s at byte %llu + %zu: status 0x%x (%d)\n",
			       opc == UQ_OPC_READ ? "read" : "write",
			       (unsigned long long)(phys + done), n, st, st);
			return -EIO;
		}
		done += n;
	}
	return 0;
}

/* Reads each file's extents through a user queue and compares with read(2). */
static int cmd_fiemap_read(int argc, char **argv)
{
	struct snvme_queue_group g;
	struct uq_queue q[1];
	struct uq_buf buf, list;
	struct uq_ctrl c;
	struct extent ext[64];
	size_t chunks[] = { 4096, 8192, 0 /* max_xfer */, 3 * 4096 + 0 };
	int f, i, k, n, ret;
	bool sgl_ok;

	must_open(&c);
	sgl_ok = c.info.caps & SNVME_CAP_SGL;
	ret = uq_group_create(&c, 1, 64, &g, q);
	if (ret)
		die("CREATE_QUEUE_GROUP: %s", strerror(-ret));
	if (uq_buf_alloc(&c, &buf, 4u << 20) || uq_buf_alloc(&c, &list, 4096))
		die("DMA_MAP: %s", strerror(errno));
	chunks[2] = c.max_xfer;
	printf("QID %u, %zu-page buffer, PRP list page at 0x%llx, max transfer %u, SGL %s\n",
	       q[0].d.qid, buf.npages, (unsigned long long)list.bus[0], c.max_xfer,
	       sgl_ok ? "yes" : "no");
	for (f = 0; f < argc; f++) {
		size_t flen, covered = 0;
		uint8_t *want;

		n = file_extents(argv[f], ext, 64);
		uq_drop_caches();
		want = read_file(argv[f], &flen);
		for (i = 0; i < n; i++) {
			size_t len = ext[i].length;
			size_t valid = ext[i].logical + len > flen ? flen - ext[i].logical : len;

			if (len > buf.len)
				die("extent of %zu bytes exceeds the test buffer", len);
			for (k = 0; k < 4 + (sgl_ok ? 1 : 0); k++) {
				bool sgl = k == 4;
				size_t chunk = sgl ? 64 * 1024 : chunks[k];

				memset(buf.va, 0xa5, len);
				ret = extent_io(&q[0], UQ_OPC_READ, ext[i].physical, len, &buf, 0,
						&list, sgl, chunk);
				check(ret == 0 && memcmp(buf.va, want + ext[i].logical, valid) == 0,
				      "%s extent %d (LBA %llu, %zu bytes) via %s in %zu-byte commands matches read(2)",
				      argv[f], i, (unsigned long long)(ext[i].physical / c.lba_size),
				      len, sgl ? "SGL" : "PRP", chunk);
			}
			/* PRP1 with an in-page offset: a 3-page transfer needs PRP1 + a 3-entry list. */
			if (len >= 3 * 4096 && len + 4096 <= buf.len) {
				memset(buf.va, 0xa5, buf.len);
				ret = extent_io(&q[0], UQ_OPC_READ, ext[i].physical, 3 * 4096, &buf, 512,
						&list, false, 3 * 4096);
				check(ret == 0 && memcmp(buf.va + 512, want + ext[i].logical, 3 * 4096) == 0 &&
				      buf.va[511] == 0xa5 && buf.va[512 + 3 * 4096] == 0xa5,
				      "%s extent %d: 12 KiB into buffer offset 512 (PRP1 offset, PRP list) matches, no overrun",
				      argv[f], i);
			}
			covered += valid;
		}
		check(covered == flen, "%s: extents cover all %zu bytes", argv[f], flen);
		free(want);
	}
	uq_buf_free(&c, &buf);
	uq_buf_free(&c, &list);
	uq_group_unmap(q, 1);
	check(uq_group_destroy(&c, g.group_id) == 0, "DESTROY_QUEUE_GROUP");
	uq_close(&c);
	return failures ? 1 : 0;
}

/* Overwrites a file's blocks through a user queue, then reads them through the fs. */
static int cmd_fiemap_write(const char *path)
{
	struct snvme_queue_group g;
	struct uq_queue q[1];
	struct uq_buf buf, list;
	struct uq_ctrl c;
	struct extent ext[64];
	size_t flen;
	uint8_t *got;
	int i, n, ret;

	must_open(&c);
	ret = uq_group_create(&c, 1, 16, &g, q);
	if (ret)
		die("CREATE_QUEUE_GROUP: %s", strerror(-ret));
	if (uq_buf_alloc(&c, &buf, 4u << 20) || uq_buf_alloc(&c, &list, 4096))
		die("DMA_MAP: %s", strerror(errno));
	n = file_extents(path, ext, 64);
	for (i = 0; i < n; i++) {
		fill_pattern(buf.va, ext[i].length, 0x5eed0000u + i);
		ret = extent_io(&q[0], UQ_OPC_WRITE, ext[i].physical, ext[i].length, &buf, 0,
				&list, false, c.max_xfer);
		check(ret == 0, "wrote extent %d (%llu bytes) through QID %u", i,
		      (unsigned long long)ext[i].length, q[0].d.qid);
	}
	check(uq_flush_sync(&q[0]) == 0, "Flush through the user queue");
	uq_drop_caches();
	got = read_file(path, &flen);
	for (i = 0; i < n; i++) {
		size_t valid = ext[i].logical + ext[i].length > flen ? flen - ext[i].logical
								      : ext[i].length;

		fill_pattern(buf.va, ext[i].length, 0x5eed0000u + i);
		check(memcmp(buf.va, got + ext[i].logical, valid) == 0,
		      "read(2) after drop_caches sees the queue's bytes in extent %d", i);
	}
	free(got);
	uq_buf_free(&c, &buf);
	uq_buf_free(&c, &list);
	uq_group_unmap(q, 1);
	check(uq_group_destroy(&c, g.group_id) == 0, "DESTROY_QUEUE_GROUP");
	uq_close(&c);
	return failures ? 1 : 0;
}

/* ---- SQ wrap ------------------------------------------------------------- */

static int cmd_wrap(void)
{
	struct snvme_queue_group g;
	struct uq_queue q[1];
	struct uq_buf buf, list;
	struct uq_ctrl c;
	uint8_t *want;
	int fd, i, ret, rounds = 0;
	uint32_t lba;

	must_open(&c);
	lba = c.lba_size;
	ret = uq_group_create(&c, 1, 4, &g, q);
	if (ret)
		die("CREATE_QUEUE_GROUP(4 entries): %s", strerror(-ret));
	if (uq_buf_alloc(&c, &buf, 64 * 4096) || uq_buf_alloc(&c, &list, 4096))
		die("DMA_MAP: %s", strerror(errno));
	want = aligned_alloc(4096, 64 * 4096);
	fd = open(BDEV_PATH, O_RDONLY | O_DIRECT);
	if (fd < 0 || pread(fd, want, 64 * 4096, 0) != 64 * 4096)
		die("pread %s: %s", BDEV_PATH, strerror(errno));
	close(fd);
	memset(buf.va, 0, buf.len);
	/* 3 outstanding at a time on a 4-entry ring: tail and phase wrap every few commands. */
	for (i = 0; i < 64 * 4096 / (int)lba;) {
		int k, cids[3], burst = 0;

		for (k = 0; k < 3 && i + k < 64 * 4096 / (int)lba; k++) {
			struct uq_sqe s = { .opc = UQ_OPC_READ, .nsid = 1 };

			uq_set_dptr(&s, &buf, (size_t)(i + k) * lba, lba, &list, false);
			s.cdw10 = i + k;
			s.cdw12 = 0;
			cids[k] = uq_push(&q[0], &s);
			if (cids[k] < 0)
				die("SQ full with %u outstanding", q[0].outstanding);
			burst++;
		}
		uq_ring(&q[0]);
		for (k = 0; k < burst; k++) {
			struct uq_cqe e;

			if (uq_reap(&q[0], &e, 10000))
				die("no completion within 10 s");
			if (e.status >> 1)
				die("status 0x%x", e.status >> 1);
		}
		i += burst;
		rounds++;
	}
	check(memcmp(buf.va, want, 64 * 4096) == 0,
	      "%d reads in %d bursts on a 4-entry SQ (wrapped %d times) match O_DIRECT reads",
	      64 * 4096 / lba, rounds, 64 * 4096 / lba / 4);
	check(q[0].tail == (64u * 4096 / lba) % 4, "SQ tail %u after the wraps", q[0].tail);
	free(want);
	uq_buf_free(&c, &buf);
	uq_buf_free(&c, &list);
	uq_group_unmap(q, 1);
	check(uq_group_destroy(&c, g.group_id) == 0, "DESTROY_QUEUE_GROUP");
	uq_close(&c);
	return failures ? 1 : 0;
}

/* ---- lifetime: kill, close with queues live, leaks ------------------ */

/* Keeps reads in flight on two queues until killed; touches argv path when busy. */
static __attribute__((noreturn)) void cmd_hold_io(const char *ready)
{
	struct snvme_queue_group g;
	struct uq_queue q[2];
	struct uq_buf buf, list;
	struct uq_ctrl c;
	uint64_t n = 0;
	int ret, k;

	must_open(&c);
	ret = uq_group_create(&c, 2, 32, &g, q);
	if (ret)
		die("CREATE_QUEUE_GROUP: %s", strerror(-ret));
	if (uq_buf_alloc(&c, &buf, 1u << 20) || uq_buf_alloc(&c, &list, 4096))
		die("DMA_MAP: %s", strerror(errno));
	for (;;) {
		for (k = 0; k < 2; k++) {
			struct uq_cqe e;

			while (q[k].outstanding + 1 < q[k].d.entries) {
				struct uq_sqe s = { .opc = UQ_OPC_READ, .nsid = 1 };

				uq_set_dptr(&s, &buf, (n % 8) * 128 * 1024, 8192, &list, false);
				s.cdw10 = (n * 16) % 4096;
				s.cdw12 = 8192 / c.lba_size - 1;
				uq_push(&q[k], &s);
				n++;
			}
			uq_ring(&q[k]);
			if (uq_reap(&q[k], &e, 10000))
				die("no completion within 10 s");
		}
		if (n > 256 && ready) {
			close(open(ready, O_CREAT | O_WRONLY, 0600));
			ready = NULL;
		}
	}
}

static int read_stat(const char *key)
{
	char line[128], k[64];
	long long v;
	FILE *f = fopen("/sys/kernel/debug/snvme/stats", "r");
	int ret = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %lld", k, &v) == 2 && !strcmp(k, key))
			ret = (int)v;
	fclose(f);
	return ret;
}

static int cmd_leaks(void)
{
	struct snvme_queue_group g[4];
	struct uq_queue q[SNVME_MAX_GROUP_QUEUES];
	struct uq_ctrl c;
	int i, ng = 0, ret;
	uint32_t left;

	must_open(&c);
	check(c.info.pinned_pages == 0 && c.info.dma_maps == 0 && c.info.queue_groups == 0,
	      "controller counters zero: pins %llu maps %u groups %u",
	      (unsigned long long)c.info.pinned_pages, c.info.dma_maps, c.info.queue_groups);
	check(c.info.user_queues_free == c.info.user_queues, "all %u user queues free (%u)",
	      c.info.user_queues, c.info.user_queues_free);
	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 &&
	      read_stat("queue_groups") == 0, "debugfs module totals zero");
	/*
	 * Recreate every user QID: Create I/O CQ/SQ fails on the controller if a
	 * queue with that ID still exists there, so success proves deletion.
	 */
	for (left = c.info.user_queues; left; ng++) {
		uint32_t nr = left > SNVME_MAX_GROUP_QUEUES ? SNVME_MAX_GROUP_QUEUES : left;

		ret = uq_group_create(&c, nr, 8, &g[ng], q);
		check(ret == 0, "recreated %u queues on the controller: %s", nr,
		      ret ? strerror(-ret) : "ok");
		if (ret)
			break;
		uq_group_unmap(q, nr);
		left -= nr;
	}
	for (i = 0; i < ng; i++)
		uq_group_destroy(&c, g[i].group_id);
	uq_get_info(c.fd, &c.info);
	check(c.info.user_queues_free == c.info.user_queues && c.info.queue_groups == 0,
	      "budget restored after destroy");
	uq_close(&c);
	return failures ? 1 : 0;
}

/* Close the fd with queues live and rings still mapped, then unmap. */
static int cmd_close_live(void)
{
	struct snvme_queue_group g;
	struct uq_queue q[3];
	struct uq_buf buf, list;
	struct uq_ctrl c, w;
	struct snvme_info in;
	int k, ret;

	must_open(&c);
	must_open(&w);
	ret = uq_group_create(&c, 3, 16, &g, q);
	if (ret)
		die("CREATE_QUEUE_GROUP: %s", strerror(-ret));
	if (uq_buf_alloc(&c, &buf, 256 * 1024) || uq_buf_alloc(&c, &list, 4096))
		die("DMA_MAP: %s", strerror(errno));
	/* Commands submitted and never reaped. */
	for (k = 0; k < 3; k++) {
		struct uq_sqe s = { .opc = UQ_OPC_READ, .nsid = 1 };

		uq_set_dptr(&s, &buf, 0, 16384, &list, false);
		s.cdw12 = 16384 / c.lba_size - 1;
		uq_push(&q[k], &s);
		uq_push(&q[k], &s);
		uq_ring(&q[k]);
	}
	close(c.fd);	/* the rings' mmaps still hold the file */
	uq_get_info(w.fd, &in);
	check(in.queue_groups == 1 && in.dma_maps == 2, "after close(fd) with live mmaps: %u group, %u maps",
	      in.queue_groups, in.dma_maps);
	munmap((void *)c.doorbells, c.info.doorbell_bytes);
	uq_group_unmap(q, 3);	/* last reference: release() runs */
	uq_get_info(w.fd, &in);
	check(in.queue_groups == 0 && in.dma_maps == 0 && in.pinned_pages == 0,
	      "after the last munmap: groups %u maps %u pins %llu", in.queue_groups, in.dma_maps,
	      (unsigned long long)in.pinned_pages);
	check(in.user_queues_free == in.user_queues, "QIDs returned (%u free)", in.user_queues_free);
	munmap(buf.va, buf.len);
	munmap(list.va, list.len);
	uq_close(&w);
	return failures ? 1 : 0;
}

/* ---- bad arguments --------------------------------------------------- */

#define EXPECT(call, err, what) do {					\
	int r_ = (call) ? errno : 0;					\
	check(r_ == (err), "%s -> %s (want %s)", what, r_ ? strerror(r_) : "success", \
	      strerror(err));						\
} while (0)

static int cmd_bad_ioctl(void)
{
	struct uq_ctrl c;
	struct snvme_info in;
	struct snvme_queue_group g;
	struct snvme_dma_map m;
	struct snvme_dma_unmap u = { .hdr = { SNVME_ABI_VERSION, sizeof(u) }, .map_id = 999 };
	struct snvme_group_id gi = { .hdr = { SNVME_ABI_VERSION, sizeof(gi) }, .group_id = 999 };
	uint64_t addrs[64];
	uint8_t *mem, *ro, *gone;
	char small[8] = { 0 };
	int ret;
	void *p;

	must_open(&c);
	/* Header checks. */
	memset(&in, 0, sizeof(in));
	in.hdr.abi_version = 0;
	in.hdr.argsz = sizeof(in);
	EXPECT(ioctl(c.fd, SNVME_IOC_GET_INFO, &in), EPROTO, "GET_INFO with stale abi_version 0");
	in.hdr.abi_version = SNVME_ABI_VERSION + 1;
	EXPECT(ioctl(c.fd, SNVME_IOC_GET_INFO, &in), EPROTO, "GET_INFO with future abi_version");
	in.hdr.abi_version = SNVME_ABI_VERSION;
	in.hdr.argsz = sizeof(in) - 8;
	EXPECT(ioctl(c.fd, SNVME_IOC_GET_INFO, &in), EINVAL, "GET_INFO with argsz - 8");
	EXPECT(ioctl(c.fd, _IOWR(SNVME_IOC_MAGIC, 0x00, char[8]), small), ENOTTY,
	       "GET_INFO number with an 8-byte size");
	EXPECT(ioctl(c.fd, _IO(SNVME_IOC_MAGIC, 0x7f)), ENOTTY, "unknown ioctl");
	EXPECT(ioctl(c.fd, SNVME_IOC_GET_INFO, NULL), EFAULT, "GET_INFO with NULL");
	EXPECT(ioctl(c.fd, SNVME_IOC_GET_INFO, (void *)16), EFAULT, "GET_INFO with address 16");

	/* Queue groups. */
#define GROUP(nr_, ent_, flags_) (memset(&g, 0, sizeof(g)), g.hdr.abi_version = SNVME_ABI_VERSION, \
	g.hdr.argsz = sizeof(g), g.nr_queues = (nr_), g.entries = (ent_), g.flags = (flags_), \
	ioctl(c.fd, SNVME_IOC_CREATE_QUEUE_GROUP, &g))
	EXPECT(GROUP(0, 16, 0), EINVAL, "CREATE_QUEUE_GROUP nr_queues 0");
	EXPECT(GROUP(SNVME_MAX_GROUP_QUEUES + 1, 16, 0), EINVAL, "CREATE_QUEUE_GROUP nr_queues 17");
	{
		/* Use up all but < 16 queues, then ask for one more than is left. */
		uint32_t held[SNVME_MAX_USER_QUEUES_GUESS], nh = 0, left = c.info.user_queues_free, i;

		while (left >= SNVME_MAX_GROUP_QUEUES && nh < SNVME_MAX_USER_QUEUES_GUESS &&
		       GROUP(SNVME_MAX_GROUP_QUEUES, 4, 0) == 0) {
			held[nh++] = g.group_id;
			left -= SNVME_MAX_GROUP_QUEUES;
		}
		EXPECT(GROUP(left + 1, 16, 0), ENOSPC, "CREATE_QUEUE_GROUP one queue past the budget");
		for (i = 0; i < nh; i++)
			uq_group_destroy(&c, held[i]);
	}
	EXPECT(GROUP(1, 1, 0), EINVAL, "CREATE_QUEUE_GROUP entries 1");
	EXPECT(GROUP(1, c.info.max_queue_entries + 1, 0), EINVAL, "CREATE_QUEUE_GROUP entries MQES+2");
	EXPECT(GROUP(1, 16, 1), EINVAL, "CREATE_QUEUE_GROUP flags 1");
	EXPECT(ioctl(c.fd, SNVME_IOC_DESTROY_QUEUE_GROUP, &gi), ENOENT, "DESTROY unknown group");

	/* DMA maps. */
	mem = mmap(NULL, 64 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ro = mmap(NULL, 4 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gone = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(gone, 4 * 4096);
#define MAP(va_, len_, kind_, addrs_, max_) (memset(&m, 0, sizeof(m)), \
	m.hdr.abi_version = SNVME_ABI_VERSION, m.hdr.argsz = sizeof(m), m.kind = (kind_), \
	m.vaddr = (uintptr_t)(va_), m.length = (len_), m.bus_addrs = (uintptr_t)(addrs_), \
	m.max_addrs = (max_), ioctl(c.fd, SNVME_IOC_DMA_MAP, &m))
	EXPECT(MAP(mem + 512, 4096, SNVME_DMA_HOST, addrs, 64), EINVAL, "DMA_MAP unaligned vaddr");
	EXPECT(MAP(mem, 0, SNVME_DMA_HOST, addrs, 64), EINVAL, "DMA_MAP length 0");
	EXPECT(MAP(mem, 4096 + 512, SNVME_DMA_HOST, addrs, 64), EINVAL, "DMA_MAP unaligned length");
	EXPECT(MAP(mem, 64 * 4096, SNVME_DMA_HOST, addrs, 63), EINVAL, "DMA_MAP max_addrs too small");
	EXPECT(MAP(mem, 4096, 7, addrs, 64), EINVAL, "DMA_MAP kind 7");
	EXPECT(MAP(mem, 4096, SNVME_DMA_GPU, addrs, 64), EOPNOTSUPP, "DMA_MAP GPU without nv-p2p");
	EXPECT(MAP(mem, 1ull << 40, SNVME_DMA_HOST, addrs, 64), EINVAL, "DMA_MAP 1 TiB");
	EXPECT(MAP(0xfffffffffffff000ull, 8192, SNVME_DMA_HOST, addrs, 64), EINVAL,
	       "DMA_MAP wrapping range");
	EXPECT(MAP(gone, 4 * 4096, SNVME_DMA_HOST, addrs, 64), EFAULT, "DMA_MAP unmapped memory");
	EXPECT(MAP(ro, 4 * 4096, SNVME_DMA_HOST, addrs, 64), EFAULT, "DMA_MAP read-only memory");
	EXPECT(MAP(mem, 4 * 4096, SNVME_DMA_HOST, (void *)16, 64), EFAULT,
	       "DMA_MAP with bus_addrs at address 16");
	EXPECT(MAP(mem, 4 * 4096, SNVME_DMA_HOST, NULL, 64), EINVAL, "DMA_MAP with bus_addrs NULL");
	EXPECT(ioctl(c.fd, SNVME_IOC_DMA_UNMAP, &u), ENOENT, "DMA_UNMAP unknown id");
	{
		/* Without CAP_IPC_LOCK, pins are charged to RLIMIT_MEMLOCK. */
		pid_t pid = fork();
		int st;

		if (pid == 0) {
			struct rlimit rl = { 64 * 1024, 64 * 1024 };
			struct uq_ctrl cc;
			struct uq_buf b;
			int r1, r2;

			if (drop_cap(CAP_IPC_LOCK) || setrlimit(RLIMIT_MEMLOCK, &rl) ||
			    uq_open(&cc, CTRL_PATH))
				_exit(3);
			r1 = uq_buf_alloc(&cc, &b, 1 << 20);
			uq_buf_free(&cc, &b);
			r2 = uq_buf_alloc(&cc, &b, 32 * 1024);
			uq_buf_free(&cc, &b);
			uq_close(&cc);
			_exit(r1 == -ENOMEM && r2 == 0 ? 0 : 1);
		}
		waitpid(pid, &st, 0);
		check(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "without CAP_IPC_LOCK: 1 MiB DMA_MAP over a 64 KiB RLIMIT_MEMLOCK gets ENOMEM, 32 KiB works");
	}
	{
		struct snvme_identify id = { .hdr = { SNVME_ABI_VERSION, sizeof(id) } };
		struct snvme_abort ab = { .hdr = { SNVME_ABI_VERSION, sizeof(ab) }, .sqid = 1 };

		id.data = (uintptr_t)mem;
		id.cns = 2;
		EXPECT(ioctl(c.fd, SNVME_IOC_IDENTIFY, &id), EINVAL, "IDENTIFY cns 2 (only 0 and 1 allowed)");
		id.cns = SNVME_IDENTIFY_CNS_NS;
		id.nsid = 0;
		EXPECT(ioctl(c.fd, SNVME_IOC_IDENTIFY, &id), EINVAL, "IDENTIFY namespace 0");
		id.nsid = 0xffffffff;
		EXPECT(ioctl(c.fd, SNVME_IOC_IDENTIFY, &id), EINVAL, "IDENTIFY namespace FFFFFFFFh");
		id.nsid = 1;
		id.data = 16;
		EXPECT(ioctl(c.fd, SNVME_IOC_IDENTIFY, &id), EFAULT, "IDENTIFY into address 16");
		id.cns = SNVME_IDENTIFY_CNS_CTRL;
		id.nsid = 0;
		id.data = (uintptr_t)mem;
		EXPECT(ioctl(c.fd, SNVME_IOC_IDENTIFY, &id), 0, "IDENTIFY controller");
		check(memcmp(mem + 4, c.info.serial, 20) == 0, "IDENTIFY controller SN matches GET_INFO");
		EXPECT(ioctl(c.fd, SNVME_IOC_ABORT, &ab), ENOENT, "ABORT on the kernel's SQ 1");
		ab.sqid = 0;
		EXPECT(ioctl(c.fd, SNVME_IOC_ABORT, &ab), ENOENT, "ABORT on the admin SQ");
	}
	uq_get_info(c.fd, &in);
	check(in.pinned_pages == 0 && in.dma_maps == 0 && in.queue_groups == 0,
	      "no pins, maps or groups left by the failed calls");
	check(in.user_queues_free == in.user_queues, "no QIDs leaked by the failed calls");

	/* mmap. */
	p = mmap(NULL, c.info.doorbell_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, c.fd, 0);
	check(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE of the doorbells refused");
	p = mmap(NULL, c.info.doorbell_bytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, 0);
	check(p == MAP_FAILED && errno == EINVAL, "doorbell window + 1 page refused (rest of BAR0)");
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, 8ull << 20);
	check(p == MAP_FAILED && errno == EINVAL, "ring offset of a group this file does not own refused");
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, 4096);
	check(p == MAP_FAILED && errno == EINVAL, "unknown offset refused");

	/* Control device. */
	ret = control(SNVME_IOC_BIND, "zz", SNVME_ABI_VERSION, NULL);
	check(ret == -EINVAL, "BIND \"zz\" -> %s", strerror(-ret));
	ret = control(SNVME_IOC_BIND, "0000:00:00.0x", SNVME_ABI_VERSION, NULL);
	check(ret == -EINVAL, "BIND with trailing junk -> %s", strerror(-ret));
	ret = control(SNVME_IOC_BIND, "0000:05:1f.7", SNVME_ABI_VERSION, NULL);
	check(ret == -ENODEV, "BIND absent device -> %s", strerror(-ret));
	ret = control(SNVME_IOC_BIND, "0000:00:00.0", SNVME_ABI_VERSION, NULL);
	check(ret == -ENODEV, "BIND host bridge (not NVMe) -> %s", strerror(-ret));
	ret = control(SNVME_IOC_BIND, "0000:00:00.0", 0, NULL);
	check(ret == -EPROTO, "BIND with stale abi_version -> %s", strerror(-ret));
	uq_close(&c);

	/* A file open read-only reads, and changes nothing. */
	{
		struct snvme_identify id = { .hdr = { SNVME_ABI_VERSION, sizeof(id) },
					     .cns = SNVME_IDENTIFY_CNS_CTRL };
		struct snvme_seal seal = { .hdr = { SNVME_ABI_VERSION, sizeof(seal) } };
		struct snvme_abort ab = { .hdr = { SNVME_ABI_VERSION, sizeof(ab) } };
		struct snvme_revoke rv;
		int fd = open(CTRL_PATH, O_RDONLY | O_CLOEXEC);

		mem = aligned_alloc(4096, 4096);
		id.data = (uintptr_t)mem;
		memset(&in, 0, sizeof(in));
		in.hdr.abi_version = SNVME_ABI_VERSION;
		in.hdr.argsz = sizeof(in);
		EXPECT(ioctl(fd, SNVME_IOC_GET_INFO, &in), 0, "GET_INFO on a file open read-only");
		EXPECT(ioctl(fd, SNVME_IOC_IDENTIFY, &id), 0, "IDENTIFY on a file open read-only");
		memset(&g, 0, sizeof(g));
		g.hdr.abi_version = SNVME_ABI_VERSION;
		g.hdr.argsz = sizeof(g);
		g.nr_queues = 1;
		g.entries = 8;
		EXPECT(ioctl(fd, SNVME_IOC_CREATE_QUEUE_GROUP, &g), EBADF, "CREATE_QUEUE_GROUP on a file open read-only");
		EXPECT(ioctl(fd, SNVME_IOC_DESTROY_QUEUE_GROUP, &gi), EBADF, "DESTROY_QUEUE_GROUP on a file open read-only");
		memset(&m, 0, sizeof(m));
		m.hdr.abi_version = SNVME_ABI_VERSION;
		m.hdr.argsz = sizeof(m);
		m.kind = SNVME_DMA_HOST;
		m.vaddr = (uintptr_t)mem;
		m.length = 4096;
		m.bus_addrs = (uintptr_t)addrs;
		m.max_addrs = 1;
		EXPECT(ioctl(fd, SNVME_IOC_DMA_MAP, &m), EBADF, "DMA_MAP on a file open read-only");
		EXPECT(ioctl(fd, SNVME_IOC_DMA_UNMAP, &u), EBADF, "DMA_UNMAP on a file open read-only");
		EXPECT(ioctl(fd, SNVME_IOC_ABORT, &ab), EBADF, "ABORT on a file open read-only");
		seal.max_dma_bytes = 4096;
		EXPECT(ioctl(fd, SNVME_IOC_SEAL, &seal), EBADF, "SEAL on a file open read-only");
		p = mmap(NULL, c.info.doorbell_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, SNVME_MMAP_DOORBELLS);
		check(p == MAP_FAILED && errno == EACCES, "a writable mapping of the doorbells of a file open read-only -> %s",
		      p == MAP_FAILED ? strerror(errno) : "mapped");
		/* REVOKE only ends things: tuttid revokes through its read-only flock file. */
		ret = revoke_call(fd, SNVME_REVOKE_FILE, &rv);
		check(ret == 0 && rv.files == 1, "REVOKE of itself on a file open read-only -> %s, %u file(s)",
		      ret ? strerror(ret) : "success", rv.files);
		close(fd);
		free(mem);
	}
	return failures ? 1 : 0;
}

/* ---- rebind ------------------------------------------------------------ */

static int cmd_rebind(const char *addr, int rounds)
{
	struct snvme_queue_group g;
	struct uq_queue q[2];
	struct uq_buf buf;
	struct uq_ctrl c;
	struct snvme_info in;
	int i, ret, inst, bad = 0;

	for (i = 0; i < rounds; i++) {
		bool hold = i % 10 == 0;

		if (hold) {
			/* Keep an fd with live queues and pins across the unbind. */
			must_open(&c);
			if (uq_group_create(&c, 2, 8, &g, q) || uq_buf_alloc(&c, &buf, 64 * 1024))
				die("setup before unbind %d failed", i);
		}
		ret = control(SNVME_IOC_UNBIND, addr, SNVME_ABI_VERSION, NULL);
		if (ret || wait_node(CTRL_PATH, false, 5000)) {
			printf("round %d: UNBIND: %s\n", i, strerror(-ret));
			bad++;
			break;
		}
		if (hold) {
			ret = uq_get_info(c.fd, &in);
			if (ret != -ENODEV) {
				printf("round %d: GET_INFO on an unbound controller: %d\n", i, ret);
				bad++;
			}
			if (*(volatile uint32_t *)buf.va != 0)	/* memory stays usable */
				bad++;
			uq_group_unmap(q, 2);
			munmap(buf.va, buf.len);
			free(buf.bus);
			uq_close(&c);
		}
		ret = control(SNVME_IOC_BIND, addr, SNVME_ABI_VERSION, &inst);
		if (ret || wait_node(CTRL_PATH, true, 5000) || wait_node(BDEV_PATH, true, 5000)) {
			printf("round %d: BIND: %s\n", i, strerror(-ret));
			bad++;
			break;
		}
	}
	check(!bad && i == rounds, "%d unbind/bind rounds (every 10th with live queues and pins)", i);
	must_open(&c);
	check(c.info.pinned_pages == 0 && c.info.queue_groups == 0 && c.info.dma_maps == 0,
	      "controller works after the rounds, counters zero");
	uq_close(&c);
	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 &&
	      read_stat("queue_groups") == 0, "debugfs module totals zero after the rounds");
	return failures ? 1 : 0;
}

/* ---- controller failure (the timeout escalation) ------------------------ */

static int write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY), ok;

	if (fd < 0)
		return -errno;
	ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
	close(fd);
	return ok ? 0 : -EIO;
}

/* The file's status page (SNVME_MMAP_STATUS), read-only. */
static volatile struct snvme_status *map_status(int fd)
{
	void *p = mmap(NULL, SNVME_STATUS_BYTES, PROT_READ, MAP_SHARED, fd, SNVME_MMAP_STATUS);

	if (p == MAP_FAILED)
		die("mmap of the status page: %s", strerror(errno));
	return p;
}

/* poll() of fd without waiting: the revents it reports now. */
static int poll_revents(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLPRI };

	return poll(&p, 1, 0) < 0 ? -errno : p.revents;
}

/*
 * After every file of a failed controller closed: no pin, DMA map or queue
 * group is left, and UNBIND then BIND bring the controller back with its
 * whole queue budget.
 */
static void expect_released_and_rebound(const char *addr)
{
	struct uq_ctrl c;
	int ret, inst = -1;

	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 &&
	      read_stat("queue_groups") == 0, "the closes released pins, maps and groups of the failed controller");
	ret = control(SNVME_IOC_UNBIND, addr, SNVME_ABI_VERSION, NULL);
	check(ret == 0 && wait_node(CTRL_PATH, false, 5000) == 0, "UNBIND of the failed controller");
	ret = control(SNVME_IOC_BIND, addr, SNVME_ABI_VERSION, &inst);
	check(ret == 0 && wait_node(CTRL_PATH, true, 5000) == 0, "BIND brings it back (instance %d)", inst);
	must_open(&c);
	check(c.info.user_queues_free == c.info.user_queues, "fresh controller has its whole budget");
	uq_close(&c);
}

static int cmd_fail(const char *addr)
{
	volatile struct snvme_status *st;
	struct snvme_queue_group g;
	struct uq_queue q[2];
	struct uq_buf buf;
	struct uq_ctrl c;
	struct snvme_info in;
	uint64_t t0;
	void *p, *blk;
	int fd, ret;

	must_open(&c);
	if (uq_group_create(&c, 2, 8, &g, q) || uq_buf_alloc(&c, &buf, 64 * 1024))
		die("setup: %s", strerror(errno));
	st = map_status(c.fd);
	t0 = uq_now_ns();
	ret = write_file(DEBUGFS_CTRL "fail", "1\n");
	check(ret == 0, "failure injected through debugfs (%s), %llu ms", strerror(-ret),
	      (unsigned long long)((uq_now_ns() - t0) / 1000000));
	check(st->csts == 0xffffffffu && st->revoked == SNVME_REVOKED_FAILED,
	      "status page: csts 0x%x, revoked %u (FAILED)", st->csts, st->revoked);
	check(poll_revents(c.fd) == (POLLPRI | POLLERR | POLLHUP),
	      "poll() reports POLLPRI | POLLERR | POLLHUP (0x%x)", poll_revents(c.fd));
	ret = open(CTRL_PATH, O_RDWR);
	check(ret < 0 && errno == ENODEV, "open of a failed controller is ENODEV");
	if (ret >= 0)
		close(ret);
	check(uq_get_info(c.fd, &in) == -ENODEV, "GET_INFO on a failed controller is ENODEV");
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, q[0].d.sq_offset);
	check(p == MAP_FAILED && errno == ENODEV, "mmap on a failed controller is ENODEV");
	blk = aligned_alloc(4096, 4096);
	fd = open(BDEV_PATH, O_RDONLY | O_DIRECT);
	t0 = uq_now_ns();
	ret = fd >= 0 && pread(fd, blk, 4096, 0) < 0 ? errno : 0;
	check(ret == EIO, "O_DIRECT read of the disk fails with EIO (%s) in %llu ms, no hang",
	      strerror(ret), (unsigned long long)((uq_now_ns() - t0) / 1000000));
	if (fd >= 0)
		close(fd);
	free(blk);
	uq_group_unmap(q, 2);
	uq_buf_free(&c, &buf);	/* DMA_UNMAP fails with ENODEV; the pages go at close */
	munmap((void *)st, SNVME_STATUS_BYTES);
	uq_close(&c);
	expect_released_and_rebound(addr);
	return failures ? 1 : 0;
}

/* ---- the timeout ladder, resets, hot removal ------------------------------ */

/* <debugfs>/snvme/snvme0/recovery (struct snvme_recovery_counters). */
struct recovery {
	long timeouts, polled, aborts, aborts_not_aborted, resets, retries, failed_requests;
};

static void read_recovery(struct recovery *r)
{
	char line[128], k[64];
	long v;
	FILE *f = fopen(DEBUGFS_CTRL "recovery", "r");

	memset(r, 0, sizeof(*r));
	if (!f)
		die("open " DEBUGFS_CTRL "recovery: %s", strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%63s %ld", k, &v) != 2)
			continue;
		if (!strcmp(k, "timeouts"))
			r->timeouts = v;
		else if (!strcmp(k, "polled"))
			r->polled = v;
		else if (!strcmp(k, "aborts"))
			r->aborts = v;
		else if (!strcmp(k, "aborts_not_aborted"))
			r->aborts_not_aborted = v;
		else if (!strcmp(k, "resets"))
			r->resets = v;
		else if (!strcmp(k, "retries"))
			r->retries = v;
		else if (!strcmp(k, "failed_requests"))
			r->failed_requests = v;
	}
	fclose(f);
}

static void print_recovery(const char *when, const struct recovery *a, const struct recovery *b)
{
	printf("recovery %s: timeouts +%ld polled +%ld aborts +%ld (not aborted +%ld) resets +%ld "
	       "retries +%ld failed_requests +%ld\n", when, b->timeouts - a->timeouts,
	       b->polled - a->polled, b->aborts - a->aborts,
	       b->aborts_not_aborted - a->aborts_not_aborted, b->resets - a->resets,
	       b->retries - a->retries, b->failed_requests - a->failed_requests);
}

static long read_long(const char *path)
{
	char buf[32] = { 0 };
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		die("read %s", path);
	return strtol(buf, NULL, 0);
}

static void set_knob(const char *name, long value)
{
	char path[128], text[32];
	int ret;

	snprintf(path, sizeof(path), DEBUGFS_CTRL "%s", name);
	snprintf(text, sizeof(text), "%ld\n", value);
	ret = write_file(path, text);
	if (ret)
		die("write %s to %s: %s", text, path, strerror(-ret));
}

/*
 * A close that frees what a failed controller may still run must wait for
 * its disable. A test-build delay of DISABLE_RACE_MS holds open the window
 * of the bug; how names the failure:
 *  "fail"   through debugfs fail, with fail_delay_ms: the failure sets
 *           failed, then waits before it queues the work that disables the
 *           controller. The bug: the close saw failed, skipped the Deletes,
 *           found no work queued to flush, and freed the rings.
 *  "reset"  a debugfs reset whose disable is stuck (stuck_disables 1: CC.EN
 *           stays 1, the queues run), with prefail_delay_ms: the reset has
 *           decided to fail the controller and waits before failed is set.
 *           The bug: the reset marked the queues gone before its disable and
 *           failed the controller only after it dropped files_lock, so a close
 *           waiting for that lock ran in this window, saw the queues gone and
 *           failed not set, skipped the Deletes, did not wait, and freed the
 *           rings. Fixed, the reset fails the controller before it drops
 *           files_lock, so the close stays blocked through the delay and then
 *           waits for the disable. (fail_delay_ms would not do here: it runs
 *           after failed is set, which the close almost always saw.)
 * The file A is closed (its last reference, so the close frees its rings and
 * pins) as soon as the failure or the reset has begun; the close must take
 * about DISABLE_RACE_MS. Then an SQE left in A's freed SQ is rung through the
 * doorbell window of another file B: a controller still running that queue
 * would fetch it from freed memory, which the IOMMU faults and the rig rejects
 * ("DMAR: [DMA"); a disabled one does nothing. Unbind and bind recover.
 */
#define DISABLE_RACE_MS 1000

struct disable_race {
	const char *knob;
	int ret;
};

static void *disable_race_trigger(void *arg)
{
	struct disable_race *r = arg;
	char path[128];

	snprintf(path, sizeof(path), DEBUGFS_CTRL "%s", r->knob);
	r->ret = write_file(path, "1\n");
	return NULL;
}

static int cmd_close_waits_for_disable(const char *addr, const char *how)
{
	bool reset = !strcmp(how, "reset");
	struct disable_race r = { .knob = reset ? "reset" : "fail" };
	struct uq_sqe sqe = { .opc = UQ_OPC_READ, .nsid = 1 };
	volatile struct snvme_status *st, *stb;
	struct snvme_queue_group g;
	struct uq_queue q[2];
	struct uq_ctrl a, b;
	struct snvme_info in;
	struct uq_buf buf;
	uint32_t db_off, tail;
	uint64_t t0, ms;
	pthread_t th;

	if (!reset && strcmp(how, "fail"))
		die("close-waits-for-disable: how is fail or reset, not %s", how);
	must_open(&a);
	must_open(&b);
	if (uq_group_create(&a, 2, 8, &g, q) || uq_buf_alloc(&a, &buf, 64 * 1024))
		die("setup: %s", strerror(errno));
	st = map_status(a.fd);
	stb = map_status(b.fd);
	(void)b.doorbells[0];	/* B's doorbell page is mapped now, before the failure */
	uq_set_dptr(&sqe, &buf, 0, 4096, NULL, false);
	sqe.cdw12 = 4096 / a.lba_size - 1;
	uq_push(&q[0], &sqe);	/* in A's SQ, never rung by A */
	db_off = q[0].d.sq_doorbell;
	tail = q[0].tail;

	if (reset) {
		set_knob("stuck_disables", 1);
		set_knob("prefail_delay_ms", DISABLE_RACE_MS);
	} else {
		set_knob("fail_delay_ms", DISABLE_RACE_MS);
	}
	if (pthread_create(&th, NULL, disable_race_trigger, &r))
		die("pthread_create");
	/* Begun: the reset revoked A (under files_lock), or failed is set. No ioctl
	 * in the reset case: the reset holds lifecycle, and the wait would be the ioctl's. */
	t0 = uq_now_ns();
	while (reset ? !st->revoked : uq_get_info(a.fd, &in) != -ENODEV) {
		if (uq_now_ns() - t0 > 10000000000ull)
			die("the %s did not begin within 10 s", how);
		usleep(1000);
	}
	munmap((void *)st, SNVME_STATUS_BYTES);
	uq_group_unmap(q, 2);
	t0 = uq_now_ns();
	uq_close(&a);	/* the last reference: release frees A's rings and pins */
	ms = (uq_now_ns() - t0) / 1000000;
	check(ms >= DISABLE_RACE_MS / 2 && ms < 60000,
	      "%s: the close of a file with live queues returned after %llu ms, once the controller was disabled (%s held %d ms)",
	      how, (unsigned long long)ms, reset ? "the failure was" : "its disable was",
	      DISABLE_RACE_MS);
	*(volatile uint32_t *)(b.doorbells + db_off) = tail;	/* A's QID, rung through B */
	usleep(300 * 1000);
	pthread_join(th, NULL);
	check(r.ret == (reset ? -EIO : 0), "the debugfs %s returned %s (%s expected)", r.knob,
	      r.ret ? strerror(-r.ret) : "0", reset ? "EIO: the reset failed the controller" : "0");
	t0 = uq_now_ns();
	while (stb->revoked != SNVME_REVOKED_FAILED && uq_now_ns() - t0 < 10000000000ull)
		usleep(1000);
	check(stb->csts == 0xffffffffu && stb->revoked == SNVME_REVOKED_FAILED,
	      "the other file's status page: csts 0x%x, revoked %u (FAILED)", stb->csts, stb->revoked);
	munmap((void *)stb, SNVME_STATUS_BYTES);
	uq_close(&b);
	munmap(buf.va, buf.len);
	free(buf.bus);
	expect_released_and_rebound(addr);
	return failures ? 1 : 0;
}

#define LADDER_FILE_BYTES (1u << 20)
#define LADDER_SEED 0x1add3au

/* The pattern file the ladder tests read: created here, written back, cache dropped. */
static void ladder_file(const char *path)
{
	uint8_t *p = malloc(LADDER_FILE_BYTES);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (!p || fd < 0)
		die("create %s: %s", path, strerror(errno));
	fill_pattern(p, LADDER_FILE_BYTES, LADDER_SEED);
	if (write(fd, p, LADDER_FILE_BYTES) != LADDER_FILE_BYTES || fsync(fd))
		die("write %s: %s", path, strerror(errno));
	close(fd);
	free(p);
	uq_drop_caches();
}

/*
 * One O_DIRECT read of 4 KiB of the pattern file: returns 0 when it read
 * the pattern's bytes, else the errno (EILSEQ for wrong bytes); *ms is how
 * long it took.
 */
static int ladder_read(const char *path, off_t off, uint64_t *ms)
{
	uint8_t *want = malloc(LADDER_FILE_BYTES), *got = aligned_alloc(4096, 4096);
	int fd = open(path, O_RDONLY | O_DIRECT), ret = 0;
	uint64_t t0 = uq_now_ns();
	ssize_t n;

	if (!want || !got || fd < 0)
		die("open %s: %s", path, strerror(errno));
	fill_pattern(want, LADDER_FILE_BYTES, LADDER_SEED);
	memset(got, 0xa5, 4096);
	n = pread(fd, got, 4096, off);
	if (n < 0)
		ret = errno;
	else if (n != 4096 || memcmp(got, want + off, 4096))
		ret = EILSEQ;
	*ms = (uq_now_ns() - t0) / 1000000;
	close(fd);
	free(want);
	free(got);
	return ret;
}

/* The whole pattern file through the page cache (dropped first) still verifies. */
static bool ladder_file_verifies(const char *path)
{
	uint8_t *want = malloc(LADDER_FILE_BYTES), *got;
	size_t len;
	bool ok;

	uq_drop_caches();
	got = read_file(path, &len);
	fill_pattern(want, LADDER_FILE_BYTES, LADDER_SEED);
	ok = len == LADDER_FILE_BYTES && !memcmp(got, want, len);
	free(want);
	free(got);
	return ok;
}

/* The file system is still mounted read-write: a new file goes through it and back. */
static bool fs_still_works(const char *dir, const char *name)
{
	char path[256];
	uint8_t buf[8192], *got;
	size_t len;
	int fd;
	bool ok;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fill_pattern(buf, sizeof(buf), 0xf5f5u);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf) || fsync(fd)) {
		printf("  write %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return false;
	}
	close(fd);
	uq_drop_caches();
	got = read_file(path, &len);
	ok = len == sizeof(buf) && !memcmp(got, buf, len);
	free(got);
	return ok;
}

/*
 * Step 1 of the ladder: a lost interrupt. The next I/O interrupt leaves its
 * completion in the CQ; the request times out and the handler's poll of the
 * CQ completes it, with no Abort and no reset.
 */
static int cmd_timeout_poll(const char *path, const char *dir)
{
	long timeout_ms = read_long("/sys/block/snvme0n1/queue/io_timeout");
	struct recovery r0, r1;
	uint64_t ms;
	int ret;

	ladder_file(path);
	/*
	 * Another I/O on the same queue (jbd2, writeback) can end its
	 * interrupt before our deadline and reap the completion left in the
	 * CQ: recovered correctly, but not by the poll under test. Then the
	 * counters show no timeout; try again, at most three times.
	 */
	for (int attempt = 1; attempt <= 3; attempt++) {
		sync();
		read_recovery(&r0);
		set_knob("skip_interrupts", 1);
		ret = ladder_read(path, 64 * 1024, &ms);
		/*
		 * The handler counts "polled" after its poll of the CQ has
		 * completed the request, so the reader can wake before the
		 * counter moves: give the handler up to a second to finish
		 * before reading the counters.
		 */
		for (int i = 0; i < 100; i++) {
			read_recovery(&r1);
			if (r1.timeouts != r0.timeouts && r1.polled - r0.polled >= r1.timeouts - r0.timeouts)
				break;
			usleep(10 * 1000);
		}
		if (ret || r1.timeouts != r0.timeouts || r1.polled != r0.polled ||
		    read_long(DEBUGFS_CTRL "skip_interrupts") != 0)
			break;
		printf("  attempt %d: another interrupt on the queue reaped the completion after %llu ms; again\n",
		       attempt, (unsigned long long)ms);
	}
	print_recovery("after a lost interrupt", &r0, &r1);
	check(ret == 0, "O_DIRECT read of 4 KiB returns the file's bytes (%s) after %llu ms (io_timeout %ld ms)",
	      ret ? strerror(ret) : "ok", (unsigned long long)ms, timeout_ms);
	check(read_long(DEBUGFS_CTRL "skip_interrupts") == 0, "the interrupt was skipped");
	check(r1.polled == r0.polled + 1 && r1.timeouts == r0.timeouts + 1,
	      "one timeout, completed by the handler's poll of the CQ");
	check(r1.aborts == r0.aborts && r1.resets == r0.resets && r1.failed_requests == r0.failed_requests,
	      "no Abort, no reset, no failed request");
	check(ms + 50 >= (uint64_t)timeout_ms, "the read waited for its deadline (%llu ms)",
	      (unsigned long long)ms);
	check(ladder_file_verifies(path), "the whole file verifies");
	check(fs_still_works(dir, "after-poll"), "the file system is mounted and writable");
	return failures ? 1 : 0;
}

/*
 * Steps 2 and 3: a lost completion. The command is done in the device, so
 * its Abort answers "not aborted"; one deadline later the controller is
 * reset and the request retried, and the read returns the right bytes. A
 * queue group open across the reset is revoked (ESTALE).
 */
static int cmd_timeout_abort_reset(const char *path, const char *dir)
{
	long timeout_ms = read_long("/sys/block/snvme0n1/queue/io_timeout");
	struct snvme_queue_group g;
	struct recovery r0, r1;
	struct snvme_info in;
	struct uq_queue q[1];
	struct uq_buf buf;
	struct uq_ctrl c;
	uint64_t ms;
	int ret;

	ladder_file(path);
	must_open(&c);
	if (uq_group_create(&c, 1, 8, &g, q) || uq_buf_alloc(&c, &buf, 64 * 1024))
		die("setup: %s", strerror(errno));
	read_recovery(&r0);
	set_knob("drop_completions", 1);
	ret = ladder_read(path, 128 * 1024, &ms);
	read_recovery(&r1);
	print_recovery("after a lost completion", &r0, &r1);
	check(ret == 0, "O_DIRECT read of 4 KiB returns the file's bytes (%s) after %llu ms (io_timeout %ld ms)",
	      ret ? strerror(ret) : "ok", (unsigned long long)ms, timeout_ms);
	check(read_long(DEBUGFS_CTRL "drop_completions") == 0, "the completion was dropped");
	check(r1.polled == r0.polled, "polling found nothing");
	check(r1.aborts == r0.aborts + 1 && r1.aborts_not_aborted == r0.aborts_not_aborted + 1,
	      "one Abort, answered \"not aborted\"");
	check(r1.resets == r0.resets + 1 && r1.retries >= r0.retries + 1 &&
	      r1.failed_requests == r0.failed_requests, "one reset, the request retried, none failed");
	check(ms + 50 >= 2 * (uint64_t)timeout_ms, "two deadlines passed (%llu ms)", (unsigned long long)ms);
	ret = uq_get_info(c.fd, &in);
	check(ret == -ESTALE, "GET_INFO on a file open across the reset: %s", strerror(-ret));
	check(ladder_file_verifies(path), "the whole file verifies");
	check(fs_still_works(dir, "after-reset"), "the file system is mounted and writable");
	uq_group_unmap(q, 1);
	uq_buf_free(&c, &buf);
	uq_close(&c);
	check(read_stat("pinned_pages") == 0 && read_stat("queue_groups") == 0,
	      "close of the revoked file released its pins and group");
	return failures ? 1 : 0;
}

/*
 * Step 4: a completion lost on every try. Each try ends in a reset; after
 * max_retries retries the read fails with EIO, and only that read: the file
 * system stays mounted and every byte of the file still verifies.
 */
static int cmd_timeout_fail(const char *path, const char *dir)
{
	long retries = read_long("/sys/module/snvme/parameters/max_retries");
	long timeout_ms = read_long("/sys/block/snvme0n1/queue/io_timeout");
	struct recovery r0, r1;
	struct uq_ctrl c;
	uint64_t ms;
	int ret, k;

	ladder_file(path);
	read_recovery(&r0);
	set_knob("drop_completions", retries + 1);
	ret = ladder_read(path, 192 * 1024, &ms);
	/* The read fails inside the last reset, which is counted when it ends. */
	for (k = 0; k < 100; k++) {
		read_recovery(&r1);
		if (r1.resets >= r0.resets + retries + 1)
			break;
		usleep(100000);
	}
	print_recovery("after a completion lost on every try", &r0, &r1);
	check(ret == EIO, "O_DIRECT read fails with EIO (%s) after %llu ms: %ld tries, io_timeout %ld ms",
	      ret ? strerror(ret) : "success", (unsigned long long)ms, retries + 1, timeout_ms);
	check(read_long(DEBUGFS_CTRL "drop_completions") == 0, "every try's completion was dropped");
	check(r1.resets == r0.resets + retries + 1 && r1.retries == r0.retries + retries &&
	      r1.failed_requests == r0.failed_requests + 1,
	      "%ld resets, %ld retries, one failed request", retries + 1, retries);
	check(ms < (uint64_t)(retries + 1) * 2 * timeout_ms + 30000, "bounded: no hang");
	check(ladder_file_verifies(path), "the whole file verifies");
	check(fs_still_works(dir, "after-fail"), "the file system is mounted and writable");
	must_open(&c);
	check(c.info.user_queues_free == c.info.user_queues, "the controller works: GET_INFO, budget free");
	uq_close(&c);
	return failures ? 1 : 0;
}

/*
 * What a reset does to a file open across it: its status page and poll()
 * say so, every ioctl and mmap is ESTALE, its rings stay readable (no
 * SIGBUS) and its doorbells are ignored, its pins and QIDs stay until
 * close, and a new open works.
 */
static int cmd_reset_revoke(void)
{
	volatile struct snvme_status *st;
	struct snvme_queue_group g, g2;
	struct snvme_dma_map m = { .hdr = { SNVME_ABI_VERSION, sizeof(m) } };
	struct snvme_dma_unmap u = { .hdr = { SNVME_ABI_VERSION, sizeof(u) } };
	struct snvme_group_id gi = { .hdr = { SNVME_ABI_VERSION, sizeof(gi) } };
	struct snvme_identify id = { .hdr = { SNVME_ABI_VERSION, sizeof(id) } };
	struct snvme_abort ab = { .hdr = { SNVME_ABI_VERSION, sizeof(ab) } };
	struct uq_queue q[2], q2[1];
	struct uq_buf buf, list, buf2;
	struct uq_ctrl c, w;
	struct snvme_info in;
	struct uq_sqe sqe = { .opc = UQ_OPC_READ, .nsid = 1 };
	struct uq_cqe cqe;
	uint8_t *want, *idbuf;
	uint32_t lbas;
	int ret, fd;
	void *p;

	must_open(&c);
	if (uq_group_create(&c, 2, 8, &g, q) || uq_buf_alloc(&c, &buf, 64 * 1024) ||
	    uq_buf_alloc(&c, &list, 4096))
		die("setup: %s", strerror(errno));
	st = map_status(c.fd);
	lbas = 8192 / c.lba_size;
	check(st->csts == 1 && st->revoked == 0, "status page before: csts 0x%x (RDY), revoked %u",
	      st->csts, st->revoked);
	check(poll_revents(c.fd) == 0, "poll() reports nothing before");
	check(uq_rw_sync(&q[0], UQ_OPC_READ, 0, lbas, &buf, 0, &list, false) == 0,
	      "a read through QID %u works before", q[0].d.qid);

	ret = write_file(DEBUGFS_CTRL "reset", "1\n");
	check(ret == 0, "reset through debugfs: %s", ret ? strerror(-ret) : "done");
	check(st->csts == 0xffffffffu && st->revoked == SNVME_REVOKED_RESET,
	      "status page after: csts 0x%x, revoked %u (RESET)", st->csts, st->revoked);
	check(poll_revents(c.fd) == (POLLPRI | POLLERR), "poll() reports POLLPRI | POLLERR, no POLLHUP (0x%x)",
	      poll_revents(c.fd));

	memset(&in, 0, sizeof(in));
	in.hdr.abi_version = SNVME_ABI_VERSION;
	in.hdr.argsz = sizeof(in);
	EXPECT(ioctl(c.fd, SNVME_IOC_GET_INFO, &in), ESTALE, "GET_INFO");
	memset(&g2, 0, sizeof(g2));
	g2.hdr.abi_version = SNVME_ABI_VERSION;
	g2.hdr.argsz = sizeof(g2);
	g2.nr_queues = 1;
	g2.entries = 8;
	EXPECT(ioctl(c.fd, SNVME_IOC_CREATE_QUEUE_GROUP, &g2), ESTALE, "CREATE_QUEUE_GROUP");
	gi.group_id = g.group_id;
	EXPECT(ioctl(c.fd, SNVME_IOC_DESTROY_QUEUE_GROUP, &gi), ESTALE, "DESTROY_QUEUE_GROUP");
	m.kind = SNVME_DMA_HOST;
	m.vaddr = (uintptr_t)buf.va;
	m.length = 4096;
	m.bus_addrs = (uintptr_t)buf.bus;
	m.max_addrs = 1;
	EXPECT(ioctl(c.fd, SNVME_IOC_DMA_MAP, &m), ESTALE, "DMA_MAP");
	u.map_id = buf.map_id;
	EXPECT(ioctl(c.fd, SNVME_IOC_DMA_UNMAP, &u), ESTALE, "DMA_UNMAP");
	idbuf = malloc(SNVME_IDENTIFY_BYTES);
	id.cns = SNVME_IDENTIFY_CNS_CTRL;
	id.data = (uintptr_t)idbuf;
	EXPECT(ioctl(c.fd, SNVME_IOC_IDENTIFY, &id), ESTALE, "IDENTIFY");
	ab.sqid = q[0].d.qid;
	EXPECT(ioctl(c.fd, SNVME_IOC_ABORT, &ab), ESTALE, "ABORT");
	p = mmap(NULL, q[0].d.sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, q[0].d.sq_offset);
	check(p == MAP_FAILED && errno == ESTALE, "mmap of a ring is ESTALE");
	free(idbuf);

	/* The rings stay mapped and readable; the queue no longer exists on the controller. */
	check(q[0].cq[0].cid == (((q[0].next_cid - 1) & 0x0fff) | ((q[0].d.qid & 0xf) << 12)),
	      "the CQ ring is still mapped and holds the read's completion (no SIGBUS)");
	uq_set_dptr(&sqe, &buf, 0, 4096, &list, false);
	sqe.cdw12 = 4096 / c.lba_size - 1;
	memset(buf.va, 0x5a, 4096);
	uq_push(&q[1], &sqe);
	uq_ring(&q[1]);
	ret = uq_reap(&q[1], &cqe, 300);
	check(ret == -ETIMEDOUT && buf.va[0] == 0x5a && buf.va[4095] == 0x5a,
	      "a command rung on the revoked QID %u is ignored: no completion, no DMA", q[1].d.qid);
	check(read_stat("pinned_pages") >= 17 && read_stat("dma_maps") == 2 &&
	      read_stat("queue_groups") == 1, "the revoked file still holds its pins, maps and group");

	/* A new open gets a working file; the revoked file's QIDs stay reserved. */
	must_open(&w);
	check(w.info.user_queues_free == w.info.user_queues - 2,
	      "new file: %u of %u user queues free (2 held by the revoked file)",
	      w.info.user_queues_free, w.info.user_queues);
	if (uq_group_create(&w, 1, 8, &g2, q2) || uq_buf_alloc(&w, &buf2, 64 * 1024))
		die("setup after the reset: %s", strerror(errno));
	want = aligned_alloc(4096, 8192);
	fd = open(BDEV_PATH, O_RDONLY | O_DIRECT);
	if (fd < 0 || pread(fd, want, 8192, 0) != 8192)
		die("pread %s: %s", BDEV_PATH, strerror(errno));
	close(fd);
	check(uq_rw_sync(&q2[0], UQ_OPC_READ, 0, lbas, &buf2, 0, NULL, false) == 0 &&
	      memcmp(buf2.va, want, 8192) == 0, "a read through a new queue group matches O_DIRECT");
	free(want);

	uq_group_unmap(q, 2);
	uq_buf_free(&c, &buf);
	uq_buf_free(&c, &list);
	munmap((void *)st, SNVME_STATUS_BYTES);
	uq_close(&c);
	uq_get_info(w.fd, &in);
	check(in.user_queues_free == in.user_queues - 1, "close of the revoked file returned its QIDs");
	uq_group_unmap(q2, 1);
	check(uq_group_destroy(&w, g2.group_id) == 0, "DESTROY_QUEUE_GROUP on the new file");
	uq_buf_free(&w, &buf2);
	uq_close(&w);
	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 &&
	      read_stat("queue_groups") == 0, "debugfs module totals zero");
	return failures ? 1 : 0;
}

static sigjmp_buf removal_jmp;
static uint64_t removal_completed;
static int removal_stand_ins;	/* checks of the rings after the teardown that passed */

static void removal_sigbus(int sig)
{
	(void)sig;
	siglongjmp(removal_jmp, 1);
}

/*
 * Keeps reads in flight on two queues, touching READY once busy, until the
 * status page reports the revocation, as a poller that makes no system call
 * would. Then, once remove() has freed the rings (the module's queue group
 * count is 0), touches what a poller touches: the CQs, whose last consumed
 * entry must read as before (the stand-in is a copy) and whose new entries
 * must be completions of this queue, and both doorbells. Bounded: 250 s.
 */
static void removal_poll(struct uq_ctrl *c, struct uq_queue *q, struct uq_buf *buf,
			 struct uq_buf *list, volatile struct snvme_status *st, const char *ready)
{
	uint64_t n = 0, deadline = uq_now_ns() + 240ull * 1000000000;
	struct uq_cqe last[2], e;
	int k, i;

	while (st->csts != 0xffffffffu) {
		for (k = 0; k < 2 && st->csts != 0xffffffffu; k++) {
			struct uq_cqe e;

			while (q[k].outstanding + 1 < q[k].d.entries) {
				struct uq_sqe s = { .opc = UQ_OPC_READ, .nsid = 1 };

				uq_set_dptr(&s, buf, (n % 8) * 128 * 1024, 8192, list, false);
				s.cdw10 = (n * 16) % 4096;
				s.cdw12 = 8192 / c->lba_size - 1;
				uq_push(&q[k], &s);
				n++;
			}
			uq_ring(&q[k]);
			if (uq_reap(&q[k], &e, 100) == 0)
				removal_completed++;
		}
		if (removal_completed > 256 && ready) {
			close(open(ready, O_CREAT | O_WRONLY, 0600));
			ready = NULL;
		}
		if (uq_now_ns() > deadline)
			die("no revocation within 240 s (%llu completions)",
			    (unsigned long long)removal_completed);
	}
	for (k = 0; k < 2; k++)
		memcpy(&last[k], (void *)&q[k].cq[(q[k].head + q[k].d.entries - 1) % q[k].d.entries],
		       sizeof(last[k]));
	for (i = 0; i < 100 && read_stat("queue_groups") != 0; i++)
		usleep(100000);
	check(read_stat("queue_groups") == 0, "remove() freed the rings");
	for (k = 0; k < 2; k++) {
		bool same = !memcmp(&last[k], (void *)&q[k].cq[(q[k].head + q[k].d.entries - 1) %
							 q[k].d.entries], sizeof(last[k]));
		bool own = true;
		int got = 0;

		while (q[k].outstanding && uq_reap(&q[k], &e, 0) == 0) {
			own = own && e.sq_id == q[k].d.qid;
			got++;
		}
		uq_ring(&q[k]);
		check(same && own, "QID %u after the teardown: last consumed CQE unchanged, %d more "
		      "completions of this queue, doorbells written", q[k].d.qid, got);
		removal_stand_ins += same && own;
	}
}

/*
 * Hot removal, the queue group's side: polls (removal_poll) until the
 * removal revokes the file, then checks that its ioctls fail with ENODEV,
 * poll() reports it, and the rings and doorbells were touched after the
 * removal without SIGBUS.
 */
static int cmd_removal_holder(const char *ready)
{
	volatile struct snvme_status *st;
	struct snvme_queue_group g;
	struct uq_queue q[2];
	struct uq_buf buf, list;
	struct uq_ctrl c;
	struct snvme_info in;
	volatile bool sigbus = false;
	int ret;

	must_open(&c);
	if (uq_group_create(&c, 2, 32, &g, q) || uq_buf_alloc(&c, &buf, 1u << 20) ||
	    uq_buf_alloc(&c, &list, 4096))
		die("setup: %s", strerror(errno));
	st = map_status(c.fd);
	signal(SIGBUS, removal_sigbus);
	if (sigsetjmp(removal_jmp, 1))
		sigbus = true;
	else
		removal_poll(&c, q, &buf, &list, st, ready);
	signal(SIGBUS, SIG_DFL);
	printf("revoked after %llu completions: status page csts 0x%x, revoked %u\n",
	       (unsigned long long)removal_completed, st->csts, st->revoked);
	check(st->revoked == SNVME_REVOKED_REMOVED, "status page says REMOVED (%u)", st->revoked);
	check(!sigbus && removal_stand_ins == 2,
	      "rings and doorbells touched after the removal without SIGBUS");
	ret = uq_get_info(c.fd, &in);
	check(ret == -ENODEV, "GET_INFO after the removal: %s", strerror(-ret));
	check(poll_revents(c.fd) == (POLLPRI | POLLERR | POLLHUP),
	      "poll() reports POLLPRI | POLLERR | POLLHUP");
	uq_group_unmap(q, 2);
	uq_buf_free(&c, &buf);
	uq_buf_free(&c, &list);
	munmap((void *)st, SNVME_STATUS_BYTES);
	uq_close(&c);
	return failures ? 1 : 0;
}

/*
 * Hot removal, the block side: O_DIRECT reads (and, on a regular file,
 * writes) of 64 KiB until one fails, touching READY once busy. Passes when
 * the loop ended within 240 s with EIO, ENXIO, ENODEV or EROFS, or, on the
 * disk itself, with a read past its end: a removed disk has capacity 0.
 */
static int cmd_io_until_error(const char *path, const char *ready)
{
	uint64_t deadline = uq_now_ns() + 240ull * 1000000000, n = 0;
	uint8_t *buf = aligned_alloc(4096, 65536);
	struct stat sb;
	bool file;
	int fd, err = 0;
	ssize_t got;

	fd = open(path, O_RDWR | O_DIRECT | O_CREAT, 0600);
	if (fd < 0 || fstat(fd, &sb) || !buf)
		die("open %s: %s", path, strerror(errno));
	file = S_ISREG(sb.st_mode);
	fill_pattern(buf, 65536, 0x10adu);
	while (!err && uq_now_ns() < deadline) {
		off_t off = (off_t)(n % 16) * 65536;

		errno = 0;
		if (file && pwrite(fd, buf, 65536, off) != 65536) {
			err = errno ? errno : EIO;
			break;
		}
		got = pread(fd, buf, 65536, off);
		if (got < 0)
			err = errno;
		else if (got != 65536 && !file)
			err = ESPIPE;	/* short read: past the end of the disk */
		if (++n == 64 && ready)
			close(open(ready, O_CREAT | O_WRONLY, 0600));
	}
	close(fd);
	free(buf);
	printf("%s: %llu rounds, then %s\n", path, (unsigned long long)n,
	       err == ESPIPE ? "a read past the end (capacity 0)" :
	       err ? strerror(err) : "no error within 240 s");
	return err == EIO || err == ENXIO || err == ENODEV || err == EROFS || err == ESPIPE ? 0 : 1;
}

/* ---- negative control: a DMA the IOMMU must stop -------------------- */

static int cmd_bad_dma(void)
{
	struct snvme_queue_group g;
	struct uq_queue q[1];
	struct uq_buf buf, list;
	struct uq_ctrl c;
	uint64_t stale;
	struct snvme_dma_unmap u = { .hdr = { SNVME_ABI_VERSION, sizeof(u) } };
	int st;

	must_open(&c);
	if (uq_group_create(&c, 1, 8, &g, q) || uq_buf_alloc(&c, &buf, 64 * 1024) ||
	    uq_buf_alloc(&c, &list, 4096))
		die("setup: %s", strerror(errno));
	/* Unmap the buffer but keep using its bus addresses: a use-after-unmap bug. */
	stale = buf.bus[0];
	u.map_id = buf.map_id;
	if (ioctl(c.fd, SNVME_IOC_DMA_UNMAP, &u))
		die("DMA_UNMAP: %s", strerror(errno));
	buf.map_id = 0;
	st = uq_rw_sync(&q[0], UQ_OPC_READ, 0, 8192 / c.lba_size, &buf, 0, &list, false);
	printf("read of 8 KiB into unmapped IOVA 0x%llx completed with status 0x%x: "
	       "only the IOMMU log can tell\n", (unsigned long long)stale, st);
	uq_buf_free(&c, &list);
	uq_group_unmap(q, 1);
	uq_group_destroy(&c, g.group_id);
	uq_close(&c);
	return 0;
}

/*
 * SNVME_IOC_SEAL (tuttid seals a lease's file before handing it over): a
 * sealed file creates no queue group and maps at most max_dma_bytes at once,
 * in every process that holds it; its queues keep moving data.
 */
static int cmd_seal(void)
{
	struct snvme_seal seal = { .hdr = { SNVME_ABI_VERSION, sizeof(seal) } };
	struct snvme_queue_group g, g2;
	struct uq_queue q[1], q2[1];
	struct uq_buf one, two, three, list;
	struct uq_ctrl c;
	uint64_t slba;
	int st, status;
	pid_t pid;

	must_open(&c);
	check(c.info.caps & SNVME_CAP_SEAL, "GET_INFO announces SNVME_CAP_SEAL (caps 0x%llx)",
	      (unsigned long long)c.info.caps);
	if (uq_group_create(&c, 1, 8, &g, q) || uq_buf_alloc(&c, &one, 4096) ||
	    uq_buf_alloc(&c, &list, 4096))
		die("setup: %s", strerror(errno));
	seal.max_dma_bytes = 4 * 4096;	/* valid: only the field under test is wrong */
	seal.flags = 1;
	EXPECT(ioctl(c.fd, SNVME_IOC_SEAL, &seal), EINVAL, "SEAL with flags 1");
	seal.flags = 0;
	seal.pad0 = 1;
	EXPECT(ioctl(c.fd, SNVME_IOC_SEAL, &seal), EINVAL, "SEAL with pad0 1");
	seal.pad0 = 0;
	seal.max_dma_bytes = 4096;
	EXPECT(ioctl(c.fd, SNVME_IOC_SEAL, &seal), EINVAL, "SEAL below the 8192 bytes mapped");
	seal.max_dma_bytes = 4 * 4096 + 1;
	EXPECT(ioctl(c.fd, SNVME_IOC_SEAL, &seal), EINVAL, "SEAL with max_dma_bytes not a page multiple");
	seal.max_dma_bytes = 4 * 4096;
	EXPECT(ioctl(c.fd, SNVME_IOC_SEAL, &seal), 0, "SEAL at 16384 bytes with 8192 mapped");
	EXPECT(ioctl(c.fd, SNVME_IOC_SEAL, &seal), EPERM, "a second SEAL");
	EXPECT(uq_group_create(&c, 1, 8, &g2, q2), EPERM, "CREATE_QUEUE_GROUP on the sealed file");
	st = uq_buf_alloc(&c, &three, 3 * 4096);
	check(st == -EDQUOT, "DMA_MAP of 12288 bytes over the seal -> %s (want %s)",
	      st ? strerror(-st) : "success", strerror(EDQUOT));
	uq_buf_free(&c, &three);
	st = uq_buf_alloc(&c, &two, 2 * 4096);
	check(st == 0, "DMA_MAP of 8192 bytes up to the seal -> %s", st ? strerror(-st) : "success");
	/* The queue still moves data: 4 KiB at 250 MiB, past the file system's 240 MiB. */
	slba = (250ull << 20) / c.lba_size;
	fill_pattern(one.va, 4096, 0x5ea1);
	st = uq_rw_sync(&q[0], UQ_OPC_WRITE, slba, 4096 / c.lba_size, &one, 0, &list, false);
	check(st == 0, "a WRITE through the sealed file's queue: status 0x%x", st);
	memset(two.va, 0, 4096);
	st = uq_rw_sync(&q[0], UQ_OPC_READ, slba, 4096 / c.lba_size, &two, 0, &list, false);
	check(st == 0 && !memcmp(one.va, two.va, 4096), "its READ returns the bytes written (status 0x%x)", st);
	/* Unmapping makes room again; the seal stays. */
	uq_buf_free(&c, &two);
	st = uq_buf_alloc(&c, &two, 2 * 4096);
	check(st == 0, "DMA_MAP of 8192 bytes after DMA_UNMAP of 8192 -> %s", st ? strerror(-st) : "success");
	/* A child holding the same open file is sealed too (tuttid's SCM_RIGHTS case). */
	pid = fork();
	if (pid == 0) {
		struct snvme_queue_group gc;
		struct uq_queue qc[1];

		struct uq_buf more;
		bool refused_group = uq_group_create(&c, 1, 8, &gc, qc) && errno == EPERM;
		bool refused_map = uq_buf_alloc(&c, &more, 4096) == -EDQUOT;

		_exit(refused_group && refused_map ? 0 : 1);
	}
	check(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
	      WEXITSTATUS(status) == 0,
	      "a forked holder of the sealed file gets EPERM for CREATE_QUEUE_GROUP and EDQUOT for DMA_MAP over the seal");
	uq_buf_free(&c, &two);
	uq_buf_free(&c, &one);
	uq_buf_free(&c, &list);
	uq_group_unmap(q, 1);
	uq_group_destroy(&c, g.group_id);
	uq_close(&c);
	/* A new open is not sealed. */
	must_open(&c);
	EXPECT(uq_group_create(&c, 1, 8, &g, q), 0, "CREATE_QUEUE_GROUP on a new open of the device");
	uq_group_unmap(q, 1);
	uq_group_destroy(&c, g.group_id);
	uq_close(&c);
	return failures ? 1 : 0;
}

/* ---- REVOKE ------------------------------------------------------------ */

static sigjmp_buf revoke_jmp;

static void revoke_sigbus(int sig)
{
	(void)sig;
	siglongjmp(revoke_jmp, 1);
}

/* SNVME_IOC_REVOKE of scope on fd; 0 or the errno. */
static int revoke_call(int fd, uint32_t scope, struct snvme_revoke *r)
{
	memset(r, 0, sizeof(*r));
	r->hdr.abi_version = SNVME_ABI_VERSION;
	r->hdr.argsz = sizeof(*r);
	r->scope = scope;
	return ioctl(fd, SNVME_IOC_REVOKE, r) ? errno : 0;
}

/* A revoked file's buffer: its map cannot be undone before close (ESTALE), only the memory goes. */
static void drop_buf(struct uq_buf *b)
{
	b->map_id = 0;
	uq_buf_free(NULL, b);
}

/* A 4 KiB READ of LBA 0 through q into b matches want. */
static bool reads_lba0(struct uq_queue *q, struct uq_buf *b, struct uq_buf *list, const uint8_t *want)
{
	memset(b->va, 0, 4096);
	return uq_rw_sync(q, UQ_OPC_READ, 0, 4096 / q->c->lba_size, b, 0, list, false) == 0 &&
	       !memcmp(b->va, want, 4096);
}

/*
 * SNVME_IOC_REVOKE, as tuttid ends a lease whose holder still runs (scope
 * FILE) and revokes a dead tuttid's leases when it starts again (scope
 * OTHERS): the status page, poll() and ESTALE say so, the QIDs are free at
 * once, and the holder's rings and doorbells stay valid memory that reaches
 * nothing (no SIGBUS); the other files' doorbells, zapped with the revoked
 * file's (one mapping of the device), and a close, leave them working.
 */
static int cmd_revoke(void)
{
	volatile struct snvme_status *sa, *sb, *sr;
	struct snvme_seal seal = { .hdr = { SNVME_ABI_VERSION, sizeof(seal) } };
	struct snvme_queue_group ga, gb, gc, gd, gr;
	struct uq_queue qa[1], qb[1], qc[2], qd[1], qr[1];
	struct uq_buf bufa, lista, bufb, listb, bufd, listd;
	struct uq_ctrl a, b, c, d, e, rr, n;
	struct uq_sqe sqe = { .opc = UQ_OPC_READ, .nsid = 1 };
	struct snvme_revoke r;
	struct snvme_info in;
	struct uq_cqe cqe, last;
	volatile bool sigbus = false;
	uint32_t budget, before;
	int fd, ret, status;
	uint8_t *want;
	pid_t pid;
	void *p;

	must_open(&a);
	must_open(&b);
	check(a.info.caps & SNVME_CAP_REVOKE, "GET_INFO announces SNVME_CAP_REVOKE (caps 0x%llx)",
	      (unsigned long long)a.info.caps);
	budget = a.info.user_queues;
	if (uq_group_create(&a, 1, 8, &ga, qa) || uq_buf_alloc(&a, &bufa, 4096) ||
	    uq_buf_alloc(&a, &lista, 4096) || uq_group_create(&b, 1, 8, &gb, qb) ||
	    uq_buf_alloc(&b, &bufb, 4096) || uq_buf_alloc(&b, &listb, 4096))
		die("setup: %s", strerror(errno));
	sa = map_status(a.fd);
	sb = map_status(b.fd);
	want = aligned_alloc(4096, 4096);
	fd = open(BDEV_PATH, O_RDONLY | O_DIRECT);
	if (fd < 0 || pread(fd, want, 4096, 0) != 4096)
		die("pread %s: %s", BDEV_PATH, strerror(errno));
	close(fd);
	check(reads_lba0(&qa[0], &bufa, &lista, want) && reads_lba0(&qb[0], &bufb, &listb, want),
	      "reads through files A and B match O_DIRECT");
	before = *(volatile uint32_t *)a.doorbells;
	check(before != 0xffffffffu, "A's doorbell window is the controller's: SQ0TDBL reads 0x%x", before);

	/* Refused arguments revoke nothing. */
	memset(&r, 0, sizeof(r));
	r.hdr.abi_version = SNVME_ABI_VERSION;
	r.hdr.argsz = sizeof(r);
	r.scope = 2;
	EXPECT(ioctl(a.fd, SNVME_IOC_REVOKE, &r), EINVAL, "REVOKE with scope 2");
	r.scope = SNVME_REVOKE_FILE;
	r.flags = 1;
	EXPECT(ioctl(a.fd, SNVME_IOC_REVOKE, &r), EINVAL, "REVOKE with flags 1");
	r.flags = 0;
	r.pad0 = 1;
	EXPECT(ioctl(a.fd, SNVME_IOC_REVOKE, &r), EINVAL, "REVOKE with pad0 1");
	check(sa->csts == 1 && sa->revoked == 0, "A is live after the refusals");

	ret = revoke_call(a.fd, SNVME_REVOKE_FILE, &r);
	check(ret == 0 && r.files == 1 && r.queue_groups == 1 && r.queues == 1,
	      "REVOKE of file A: %s, %u file, %u group, %u queue", ret ? strerror(ret) : "done",
	      r.files, r.queue_groups, r.queues);
	check(sa->csts == 0xffffffffu && sa->revoked == SNVME_REVOKED_LEASE,
	      "A's status page: csts 0x%x, revoked %u (LEASE)", sa->csts, sa->revoked);
	check(poll_revents(a.fd) == (POLLPRI | POLLERR), "poll() of A reports POLLPRI | POLLERR, no POLLHUP (0x%x)",
	      poll_revents(a.fd));
	check(sb->csts == 1 && sb->revoked == 0 && poll_revents(b.fd) == 0, "B is untouched");
	ret = uq_get_info(a.fd, &in);
	check(ret == -ESTALE, "GET_INFO on A: %s", strerror(-ret));
	p = mmap(NULL, qa[0].d.sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, qa[0].d.sq_offset);
	check(p == MAP_FAILED && errno == ESTALE, "mmap of A's ring is ESTALE");
	ret = uq_get_info(b.fd, &in);
	check(ret == 0 && in.user_queues_free == budget - 1 && in.queue_groups == 1,
	      "A's QID is free at once, A still open: %u of %u user queues free, %u group(s) live",
	      in.user_queues_free, budget, in.queue_groups);

	/* A's holder goes on as if nothing happened: no SIGBUS, no completion, no DMA, no queue reached. */
	signal(SIGBUS, revoke_sigbus);
	if (sigsetjmp(revoke_jmp, 1)) {
		sigbus = true;
	} else {
		memcpy(&last, (void *)&qa[0].cq[(qa[0].head + qa[0].d.entries - 1) % qa[0].d.entries],
		       sizeof(last));
		memset(bufa.va, 0x5a, 4096);
		uq_set_dptr(&sqe, &bufa, 0, 4096, &lista, false);
		sqe.cdw12 = 4096 / a.lba_size - 1;
		uq_push(&qa[0], &sqe);
		uq_ring(&qa[0]);
		ret = uq_reap(&qa[0], &cqe, 300);
		check(ret == -ETIMEDOUT && bufa.va[0] == 0x5a && bufa.va[4095] == 0x5a,
		      "an SQE written and rung on A's revoked queue: no completion, no DMA");
		check(!memcmp(&last, (void *)&qa[0].cq[(qa[0].head + qa[0].d.entries - 1) % qa[0].d.entries],
			      sizeof(last)), "A's CQ still holds its last completion (a copy of the ring)");
		check(*(volatile uint32_t *)a.doorbells == 0xffffffffu,
		      "A's doorbell window reads all ones: its stand-in, not the controller's");
	}
	signal(SIGBUS, SIG_DFL);
	check(!sigbus, "A's rings and doorbells touched after REVOKE without SIGBUS");

	/* B's doorbells, zapped with A's (one mapping of the device), fault back in. */
	check(reads_lba0(&qb[0], &bufb, &listb, want), "a read through B after A's REVOKE matches O_DIRECT");
	ret = revoke_call(a.fd, SNVME_REVOKE_FILE, &r);
	check(ret == 0 && r.files == 0 && r.queue_groups == 0, "REVOKE of A again: %s, nothing left (%u, %u)",
	      ret ? strerror(ret) : "done", r.files, r.queue_groups);
	uq_group_unmap(qa, 1);
	drop_buf(&bufa);
	drop_buf(&lista);
	munmap((void *)sa, SNVME_STATUS_BYTES);
	uq_close(&a);
	check(reads_lba0(&qb[0], &bufb, &listb, want), "a read through B after A's close matches O_DIRECT");

	/* REVOKE_OTHERS from a new file D: B, a new C with a group of 2, a sealed E. */
	must_open(&c);
	must_open(&d);
	must_open(&e);
	if (uq_group_create(&c, 2, 8, &gc, qc))
		die("setup of C: %s", strerror(errno));
	seal.max_dma_bytes = 0;
	EXPECT(ioctl(e.fd, SNVME_IOC_SEAL, &seal), 0, "SEAL of E");
	EXPECT(revoke_call(e.fd, SNVME_REVOKE_OTHERS, &r), EPERM, "REVOKE of the other files from the sealed E");
	pid = fork();
	if (pid == 0)
		_exit(drop_cap(CAP_SYS_ADMIN) == 0 && revoke_call(d.fd, SNVME_REVOKE_OTHERS, &r) == EPERM ? 0 : 1);
	check(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "REVOKE of the other files without CAP_SYS_ADMIN is EPERM");
	check(sb->revoked == 0, "B is live after the refusals");
	ret = revoke_call(d.fd, SNVME_REVOKE_OTHERS, &r);
	check(ret == 0 && r.files == 3 && r.queue_groups == 2 && r.queues == 3,
	      "REVOKE of the other files from D: %s, %u files (B, C, E), %u groups, %u queues",
	      ret ? strerror(ret) : "done", r.files, r.queue_groups, r.queues);
	check(sb->csts == 0xffffffffu && sb->revoked == SNVME_REVOKED_LEASE && poll_revents(b.fd) == (POLLPRI | POLLERR),
	      "B's status page reads LEASE, poll() POLLPRI | POLLERR");
	ret = uq_get_info(d.fd, &in);
	check(ret == 0 && in.user_queues_free == budget && in.queue_groups == 0,
	      "every user queue is free while B and C are open: %u of %u, %u group(s)", in.user_queues_free, budget,
	      in.queue_groups);
	if (uq_group_create(&d, 1, 8, &gd, qd) || uq_buf_alloc(&d, &bufd, 4096) || uq_buf_alloc(&d, &listd, 4096))
		die("setup of D: %s", strerror(errno));
	check(reads_lba0(&qd[0], &bufd, &listd, want), "D, the caller, is live: a read through a new group on it matches");

	/* A file a reset revoked keeps its QIDs until it is closed, or until REVOKE frees them. */
	must_open(&rr);
	if (uq_group_create(&rr, 1, 8, &gr, qr))
		die("setup of R: %s", strerror(errno));
	sr = map_status(rr.fd);
	ret = write_file(DEBUGFS_CTRL "reset", "1\n");
	check(ret == 0 && sr->revoked == SNVME_REVOKED_RESET, "reset through debugfs: %s, R revoked %u (RESET)",
	      ret ? strerror(-ret) : "done", sr->revoked);
	must_open(&n);
	check(n.info.user_queues_free == budget - 2, "after the reset %u of %u user queues are free (R's and D's held)",
	      n.info.user_queues_free, budget);
	ret = revoke_call(rr.fd, SNVME_REVOKE_FILE, &r);
	check(ret == 0 && r.files == 1 && r.queues == 1 && sr->revoked == SNVME_REVOKED_LEASE,
	      "REVOKE of the reset-revoked R: %s, %u queue, revoked %u (LEASE)", ret ? strerror(ret) : "done", r.queues,
	      sr->revoked);
	ret = revoke_call(d.fd, SNVME_REVOKE_FILE, &r);
	uq_get_info(n.fd, &in);
	check(ret == 0 && in.user_queues_free == budget, "REVOKE of D too: %u of %u user queues free",
	      in.user_queues_free, budget);

	uq_group_unmap(qb, 1);
	drop_buf(&bufb);
	drop_buf(&listb);
	munmap((void *)sb, SNVME_STATUS_BYTES);
	uq_close(&b);
	uq_group_unmap(qc, 2);
	uq_close(&c);
	uq_group_unmap(qd, 1);
	drop_buf(&bufd);
	drop_buf(&listd);
	uq_close(&d);
	uq_close(&e);
	uq_group_unmap(qr, 1);
	munmap((void *)sr, SNVME_STATUS_BYTES);
	uq_close(&rr);
	uq_close(&n);
	free(want);
	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 && read_stat("queue_groups") == 0,
	      "after the closes: debugfs module totals zero");
	return failures ? 1 : 0;
}

/* ---- DMA_MAP and mmap while another process revokes (lock order) ------- */

/*
 * DMA_MAP once pinned pages and charged them to RLIMIT_MEMLOCK with the
 * file's lock held, which takes the process's mmap lock, while mmap of a
 * ring took the file's lock with the mmap lock held (the kernel holds it
 * around ->mmap): two threads of one process could deadlock each other,
 * and REVOKE of the other files, which takes every file's lock, waited
 * behind them. The guest kernels have no lockdep, so these tests run the
 * orders against each other and bound every wait.
 */
struct race {
	struct uq_ctrl *c;
	struct snvme_queue_desc d;	/* a ring of c to map */
	volatile bool stop;
	volatile bool saw_estale;
	volatile long ops;		/* calls that returned */
	volatile int bad_errno;		/* a refusal other than ESTALE */
	volatile bool done;
};

/* One refusal: ESTALE once the file is revoked, nothing else. */
static void race_refused(struct race *r, int err)
{
	if (err == ESTALE)
		r->saw_estale = true;
	else if (!r->bad_errno)
		r->bad_errno = err;
}

/* DMA_MAP of memory not yet faulted in (the pin takes the mmap lock), then DMA_UNMAP. */
static void *race_dma_map(void *arg)
{
	struct race *r = arg;
	size_t len = 64 * 4096;
	uint64_t bus[64];

	while (!r->stop) {
		struct snvme_dma_map m = { .hdr = { SNVME_ABI_VERSION, sizeof(m) } };
		struct snvme_dma_unmap u = { .hdr = { SNVME_ABI_VERSION, sizeof(u) } };
		void *va = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (va == MAP_FAILED) {
			race_refused(r, errno);
			break;
		}
		m.kind = SNVME_DMA_HOST;
		m.vaddr = (uintptr_t)va;
		m.length = len;
		m.bus_addrs = (uintptr_t)bus;
		m.max_addrs = 64;
		if (ioctl(r->c->fd, SNVME_IOC_DMA_MAP, &m)) {
			race_refused(r, errno);
		} else {
			u.map_id = m.map_id;
			/* Revoked in between: the pins stay until close. */
			if (ioctl(r->c->fd, SNVME_IOC_DMA_UNMAP, &u))
				race_refused(r, errno);
		}
		munmap(va, len);
		r->ops++;
	}
	r->done = true;
	return NULL;
}

/* mmap and munmap of the status page, the doorbell window and a ring, in turn. */
static void *race_mmap(void *arg)
{
	struct race *r = arg;

	while (!r->stop) {
		const struct { uint64_t off; size_t len; int prot; } w[] = {
			{ SNVME_MMAP_STATUS, SNVME_STATUS_BYTES, PROT_READ },
			{ SNVME_MMAP_DOORBELLS, r->c->info.doorbell_bytes, PROT_READ | PROT_WRITE },
			{ r->d.sq_offset, r->d.sq_bytes, PROT_READ | PROT_WRITE },
			{ r->d.cq_offset, r->d.cq_bytes, PROT_READ | PROT_WRITE },
		};
		size_t i;

		for (i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
			void *p = mmap(NULL, w[i].len, w[i].prot, MAP_SHARED, r->c->fd, w[i].off);

			if (p == MAP_FAILED)
				race_refused(r, errno);
			else
				munmap(p, w[i].len);
		}
		r->ops++;
	}
	r->done = true;
	return NULL;
}

/* In a child with a file of its own: REVOKE of the other files; exits 0 if it revoked at least one. */
static pid_t revoke_others_child(void)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct snvme_revoke rv;
		struct uq_ctrl o;

		if (uq_open(&o, CTRL_PATH))
			_exit(2);
		_exit(revoke_call(o.fd, SNVME_REVOKE_OTHERS, &rv) == 0 && rv.files >= 1 ? 0 : 1);
	}
	return pid;
}

/* waitpid with a deadline: the child's exit status, or -1 if it has not exited in time (then it is killed). */
static int wait_child(pid_t pid, int timeout_ms, uint64_t *ms)
{
	uint64_t t0 = uq_now_ns();
	int status;

	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);

		*ms = (uq_now_ns() - t0) / 1000000;
		if (w == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		if (w < 0 || *ms > (uint64_t)timeout_ms) {
			kill(pid, SIGKILL);
			return -1;
		}
		usleep(1000);
	}
}

/* Polls cond every ms up to timeout_ms. */
static bool wait_until(volatile bool *cond, int timeout_ms)
{
	uint64_t t0 = uq_now_ns();

	while (!*cond) {
		if ((uq_now_ns() - t0) / 1000000 > (uint64_t)timeout_ms)
			return false;
		usleep(1000);
	}
	return true;
}

/*
 * Round after round: a fresh file with a queue group, one thread in a
 * DMA_MAP/DMA_UNMAP loop and one in an mmap/munmap loop of all of the
 * file's windows, then another process REVOKEs the other files. Every
 * call returns (bounded), refusals are ESTALE and nothing else, both
 * threads see ESTALE after the REVOKE, and nothing is left pinned.
 */
static bool race_round(int round)
{
	struct race rm = { 0 }, rd = { 0 };
	struct snvme_queue_group g;
	struct uq_queue q[1];
	pthread_t tm, td;
	struct uq_ctrl c;
	uint64_t ms;
	int ex, before = failures;
	bool ok;

	must_open(&c);
	if (uq_group_create(&c, 1, 8, &g, q))
		die("setup: CREATE_QUEUE_GROUP: %s", strerror(errno));
	uq_group_unmap(q, 1);
	rm.c = rd.c = &c;
	rm.d = rd.d = g.queues[0];
	if (pthread_create(&tm, NULL, race_mmap, &rm) || pthread_create(&td, NULL, race_dma_map, &rd))
		die("pthread_create");
	usleep(200000);	/* both loops under way: hundreds of mmaps, tens of DMA_MAPs */
	ex = wait_child(revoke_others_child(), 10000, &ms);
	check(ex == 0, "round %d: REVOKE of the other files from another process returns (exit %d) in %llu ms, bounded by 10 s",
	      round, ex, (unsigned long long)ms);
	ok = wait_until(&rm.saw_estale, 10000) & wait_until(&rd.saw_estale, 10000);
	rm.stop = rd.stop = true;
	ok &= wait_until(&rm.done, 10000) & wait_until(&rd.done, 10000);
	check(ok, "round %d: the mmap thread (%ld rounds) and the DMA_MAP thread (%ld rounds) both got ESTALE and stopped within 10 s",
	      round, rm.ops, rd.ops);
	if (!ok)
		die("a thread is stuck in the driver: not joining it");
	pthread_join(tm, NULL);
	pthread_join(td, NULL);
	check(!rm.bad_errno && !rd.bad_errno, "round %d: no refusal but ESTALE (mmap: %s, DMA_MAP: %s)", round,
	      rm.bad_errno ? strerror(rm.bad_errno) : "none", rd.bad_errno ? strerror(rd.bad_errno) : "none");
	uq_close(&c);
	return failures == before;
}

struct uffd_map {
	struct uq_ctrl *c;
	void *va;
	size_t len;
	volatile int err;		/* DMA_MAP's errno, 0 on success */
	volatile bool done;
};

static void *uffd_dma_map(void *arg)
{
	struct uffd_map *u = arg;
	struct snvme_dma_map m = { .hdr = { SNVME_ABI_VERSION, sizeof(m) } };
	uint64_t bus[16];

	m.kind = SNVME_DMA_HOST;
	m.vaddr = (uintptr_t)u->va;
	m.length = u->len;
	m.bus_addrs = (uintptr_t)bus;
	m.max_addrs = 16;
	u->err = ioctl(u->c->fd, SNVME_IOC_DMA_MAP, &m) ? errno : 0;
	u->done = true;
	return NULL;
}

/*
 * A pin that waits as long as the memory's owner wants (userfaultfd, a page
 * nobody supplies) holds no lock of the driver: REVOKE of the other files
 * returns while it waits, and the DMA_MAP, once its pages come, finds its
 * file revoked and gives them back (ESTALE). On a kernel whose long-term
 * pin does not wait for userfaultfd (6.1: EFAULT at once) there is nothing
 * to hold up, and the test says so.
 */
static void uffd_case(void)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };
	struct uffdio_zeropage zp = { .mode = 0 };
	struct pollfd pfd = { .events = POLLIN };
	struct uffd_msg msg;
	struct uffd_map u = { 0 };
	pthread_t t;
	struct uq_ctrl c;
	bool returned;
	uint64_t ms;
	int uffd, ex;

	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		printf("skip: userfaultfd: %s\n", strerror(errno));
		return;
	}
	must_open(&c);
	u.c = &c;
	u.len = 16 * 4096;
	u.va = mmap(NULL, u.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	reg.range.start = (uintptr_t)u.va;
	reg.range.len = u.len;
	if (u.va == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg))
		die("userfaultfd register: %s", strerror(errno));
	if (pthread_create(&t, NULL, uffd_dma_map, &u))
		die("pthread_create");
	pfd.fd = uffd;
	if (poll(&pfd, 1, 3000) != 1 || read(uffd, &msg, sizeof(msg)) != sizeof(msg) ||
	    msg.event != UFFD_EVENT_PAGEFAULT) {
		returned = wait_until(&u.done, 5000);
		check(returned && u.err == EFAULT,
		      "a DMA_MAP of userfaultfd memory no one supplies: the pin does not wait on this kernel, EFAULT (got %s)",
		      returned ? strerror(u.err) : "no return within 5 s");
		pthread_join(t, NULL);
		goto out;
	}
	printf("the DMA_MAP waits in its pin (userfaultfd fault at 0x%llx)\n",
	       (unsigned long long)msg.arg.pagefault.address);
	ex = wait_child(revoke_others_child(), 5000, &ms);
	check(ex == 0 && !u.done,
	      "REVOKE of the other files returns (exit %d) in %llu ms while that DMA_MAP still waits in its pin",
	      ex, (unsigned long long)ms);
	zp.range.start = (uintptr_t)u.va;
	zp.range.len = u.len;
	if (ioctl(uffd, UFFDIO_ZEROPAGE, &zp))
		die("UFFDIO_ZEROPAGE: %s", strerror(errno));
	returned = wait_until(&u.done, 5000);
	check(returned && u.err == ESTALE,
	      "once its pages come, the DMA_MAP finds its file revoked: %s (want %s)",
	      returned ? strerror(u.err) : "no return within 5 s", strerror(ESTALE));
	if (!returned)
		die("the DMA_MAP thread is stuck: not joining it");
	pthread_join(t, NULL);
out:
	uq_close(&c);
	munmap(u.va, u.len);
	close(uffd);
}

static int cmd_dma_map_mmap_revoke(void)
{
	int round;

	for (round = 0; round < 20; round++)
		if (!race_round(round))
			break;
	uffd_case();
	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 && read_stat("queue_groups") == 0,
	      "after the closes: debugfs module totals zero (pinned_pages %d, dma_maps %d, queue_groups %d)",
	      read_stat("pinned_pages"), read_stat("dma_maps"), read_stat("queue_groups"));
	return failures ? 1 : 0;
}

/* ---- mmap of a ring against the end of its group ----------------------- */

/*
 * ->mmap once mapped a ring's pages itself, and DESTROY_QUEUE_GROUP or a
 * REVOKE between its return and the kernel linking the new mapping to the
 * file freed the ring under a mapping its zap could not see: the process
 * kept page table entries to freed pages, which the next group's ring could
 * reuse. These cases race mmaps of a ring against the end of its group,
 * round after round, then touch every mapping that succeeded: after a
 * DESTROY each access is SIGBUS, after a REVOKE each reaches the ring's
 * copy (no SIGBUS), and neither ever reaches the ring of a group made after.
 */
#define RING_RACE_MAPS 8
#define RING_RACE_ENTRIES 256	/* a 16 KiB SQ, a 4 KiB CQ */

struct ring_race {
	int fd;
	struct snvme_queue_desc d;
	volatile bool stop;
	volatile bool done;
	volatile unsigned int n;	/* mmaps that succeeded */
	void *map[RING_RACE_MAPS];	/* the latest of them, still mapped */
	size_t len[RING_RACE_MAPS];
	int bad_errno;			/* a refusal other than EINVAL (no such ring) or ESTALE */
};

/* mmap of the SQ and the CQ in turn, until one is refused or stop. */
static void *ring_race_mmap(void *arg)
{
	struct ring_race *r = arg;

	while (!r->stop) {
		bool sq = r->n % 2 == 0;
		size_t len = sq ? r->d.sq_bytes : r->d.cq_bytes;
		unsigned int slot = r->n % RING_RACE_MAPS;
		void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd,
			       sq ? r->d.sq_offset : r->d.cq_offset);

		if (p == MAP_FAILED) {
			if (errno != EINVAL && errno != ESTALE)
				r->bad_errno = errno;
			break;
		}
		if (r->map[slot])
			munmap(r->map[slot], r->len[slot]);
		r->map[slot] = p;
		r->len[slot] = len;
		r->n++;
	}
	r->done = true;
	return NULL;
}

static sigjmp_buf ring_jmp;

static void ring_sigbus(int sig)
{
	(void)sig;
	siglongjmp(ring_jmp, 1);
}

/* Reads, then writes pattern to, every word of p; true if all returned, false on SIGBUS. */
static bool ring_touch(void *p, size_t len, uint32_t pattern)
{
	volatile uint32_t *w = p;
	uint32_t sum = 0;
	size_t i;

	if (sigsetjmp(ring_jmp, 1))
		return false;
	for (i = 0; i < len / 4; i++)
		sum += w[i];
	for (i = 0; i < len / 4; i++)
		w[i] = pattern;
	(void)sum;
	return true;
}

/* Words of the queue's SQ and CQ equal to pattern. */
static size_t ring_count(const struct uq_queue *q, uint32_t pattern)
{
	const volatile uint32_t *sq = (const volatile uint32_t *)q->sq;
	const volatile uint32_t *cq = (const volatile uint32_t *)q->cq;
	size_t i, n = 0;

	for (i = 0; i < q->d.sq_bytes / 4; i++)
		n += sq[i] == pattern;
	for (i = 0; i < q->d.cq_bytes / 4; i++)
		n += cq[i] == pattern;
	return n;
}

struct ring_tally {
	int rounds;
	long maps;		/* mappings made before the group's end, touched after */
	long sigbus;		/* of those, touches that got SIGBUS */
	long aliased;		/* words of a later group's rings written through them */
	long copy_lost;		/* REVOKE: copies that did not keep what was written */
	int bad_errno;
	int revoke_failed;	/* REVOKE rounds whose child did not revoke in time */
	bool stuck;
};

/* Starts the mmap thread on the group's first queue and waits (bounded) for its first mapping. */
static void ring_race_start(struct ring_race *r, pthread_t *t, int fd, const struct snvme_queue_group *g)
{
	uint64_t t0 = uq_now_ns();

	memset(r, 0, sizeof(*r));
	r->fd = fd;
	r->d = g->queues[0];
	if (pthread_create(t, NULL, ring_race_mmap, r))
		die("pthread_create");
	while (!r->n && !r->done && uq_now_ns() - t0 < 5000000000ull)
		usleep(10);
}

/* Stops the mmap thread, bounded; false if it did not stop within 5 s (then it is not joined). */
static bool ring_race_stop(struct ring_race *r, pthread_t t, struct ring_tally *tl)
{
	r->stop = true;
	if (!wait_until(&r->done, 5000)) {
		tl->stuck = true;
		return false;
	}
	pthread_join(t, NULL);
	if (r->bad_errno && !tl->bad_errno)
		tl->bad_errno = r->bad_errno;
	return true;
}

static void ring_race_unmap(struct ring_race *r)
{
	int i;

	for (i = 0; i < RING_RACE_MAPS; i++)
		if (r->map[i])
			munmap(r->map[i], r->len[i]);
}

/* Touches the race's mappings with pattern; adds them and their SIGBUSes to tl. */
static void ring_race_touch(struct ring_race *r, uint32_t pattern, struct ring_tally *tl)
{
	int i;

	for (i = 0; i < RING_RACE_MAPS; i++) {
		if (!r->map[i])
			continue;
		tl->maps++;
		tl->sigbus += !ring_touch(r->map[i], r->len[i], pattern);
	}
}

/* A new group (on c) right after the race: the old mappings, written with pattern, must not reach its rings. */
static void ring_race_alias(struct ring_race *r, struct uq_ctrl *c, uint32_t pattern, struct ring_tally *tl)
{
	struct snvme_queue_group g;
	struct uq_queue q[1];
	int i, ret;

	ret = uq_group_create(c, 1, RING_RACE_ENTRIES, &g, q);
	if (ret)
		die("a group after the race: CREATE_QUEUE_GROUP: %s", strerror(-ret));
	tl->aliased -= ring_count(q, pattern);	/* what it held before (none: rings are zeroed) */
	for (i = 0; i < RING_RACE_MAPS; i++)
		if (r->map[i])
			ring_touch(r->map[i], r->len[i], pattern);
	tl->aliased += ring_count(q, pattern);
	uq_group_unmap(q, 1);
	uq_group_destroy(c, g.group_id);
}

/* DESTROY_QUEUE_GROUP while another thread maps its rings, in the same file. */
static void ring_destroy_round(struct uq_ctrl *c, int round, struct ring_tally *tl)
{
	struct snvme_queue_group g;
	struct ring_race r;
	struct uq_queue q[1];
	pthread_t t;
	int ret;

	ret = uq_group_create(c, 1, RING_RACE_ENTRIES, &g, q);
	if (ret)
		die("round %d: CREATE_QUEUE_GROUP: %s", round, strerror(-ret));
	uq_group_unmap(q, 1);
	ring_race_start(&r, &t, c->fd, &g);
	usleep(round % 16 * 25);	/* the destroy lands at varying points of an mmap */
	ret = uq_group_destroy(c, g.group_id);
	if (ret)
		die("round %d: DESTROY_QUEUE_GROUP: %s", round, strerror(-ret));
	if (!ring_race_stop(&r, t, tl))
		return;
	ring_race_touch(&r, 0x5a5a0000u | round, tl);
	ring_race_alias(&r, c, 0xa5a50000u | round, tl);
	ring_race_unmap(&r);
	tl->rounds++;
}

/* REVOKE of the other files, from another process, while a thread of this one maps a ring of its own file. */
static void ring_revoke_round(int round, struct ring_tally *tl)
{
	struct snvme_queue_group g;
	struct uq_ctrl c, c2;
	struct ring_race r;
	struct uq_queue q[1];
	uint32_t pattern = 0xc3c30000u | round;
	pthread_t t;
	uint64_t ms;
	int i, ret, ex;

	must_open(&c);
	ret = uq_group_create(&c, 1, RING_RACE_ENTRIES, &g, q);
	if (ret)
		die("round %d: CREATE_QUEUE_GROUP: %s", round, strerror(-ret));
	uq_group_unmap(q, 1);
	ring_race_start(&r, &t, c.fd, &g);
	usleep(round % 8 * 50);
	ex = wait_child(revoke_others_child(), 10000, &ms);
	if (ex)
		tl->revoke_failed++;
	if (!ring_race_stop(&r, t, tl))
		return;
	ring_race_touch(&r, pattern, tl);
	/* The copies are the file's: each keeps what was written through it. */
	for (i = 0; i < RING_RACE_MAPS; i++)
		if (r.map[i] && *(volatile uint32_t *)r.map[i] != pattern)
			tl->copy_lost++;
	must_open(&c2);
	ring_race_alias(&r, &c2, pattern ^ 0xffffu, tl);
	uq_close(&c2);
	ring_race_unmap(&r);
	uq_close(&c);
	tl->rounds++;
}

static int cmd_ring_mmap_destroy_revoke(void)
{
	struct ring_tally d = { 0 }, v = { 0 };
	struct uq_ctrl c;
	uint64_t t0 = uq_now_ns();
	int round;

	signal(SIGBUS, ring_sigbus);
	must_open(&c);
	for (round = 0; round < 300 && !d.stuck; round++)
		ring_destroy_round(&c, round, &d);
	uq_close(&c);
	check(!d.stuck, "DESTROY: the mmap thread stopped within 5 s of every destroy");
	check(d.rounds == 300 && d.maps >= d.rounds && d.sigbus == d.maps,
	      "DESTROY_QUEUE_GROUP against mmap of its rings, %d rounds: each of the %ld mappings made before the destroy is SIGBUS after it (%ld)",
	      d.rounds, d.maps, d.sigbus);
	check(d.aliased == 0, "DESTROY: the rings of a group made after are not reached through the old mappings (%ld words written)",
	      d.aliased);
	check(!d.bad_errno, "DESTROY: mmaps refused with EINVAL once the group is gone, nothing else (%s)",
	      d.bad_errno ? strerror(d.bad_errno) : "none");

	for (round = 0; round < 100 && !v.stuck; round++)
		ring_revoke_round(round, &v);
	signal(SIGBUS, SIG_DFL);
	check(!v.stuck && v.revoke_failed == 0,
	      "REVOKE: the other process revoked within 10 s each round (%d did not) and the mmap thread stopped",
	      v.revoke_failed);
	check(v.rounds == 100 && v.maps >= v.rounds && v.sigbus == 0 && v.copy_lost == 0,
	      "REVOKE of the other files against mmap of a ring, %d rounds: the %ld mappings made before it read and write the ring's copy, no SIGBUS (%ld), each keeps what was written (%ld did not)",
	      v.rounds, v.maps, v.sigbus, v.copy_lost);
	check(v.aliased == 0, "REVOKE: the rings of a group made after, in a new file, are not reached through the old mappings (%ld words written)",
	      v.aliased);
	check(!v.bad_errno, "REVOKE: mmaps refused with ESTALE once the file is revoked, nothing else (%s)",
	      v.bad_errno ? strerror(v.bad_errno) : "none");

	must_open(&c);
	check(c.info.queue_groups == 0 && c.info.user_queues_free == c.info.user_queues,
	      "after the closes: no group left, all %u user queues free (%u)", c.info.user_queues,
	      c.info.user_queues_free);
	uq_close(&c);
	check(read_stat("pinned_pages") == 0 && read_stat("dma_maps") == 0 && read_stat("queue_groups") == 0,
	      "after the closes: debugfs module totals zero (pinned_pages %d, dma_maps %d, queue_groups %d)",
	      read_stat("pinned_pages"), read_stat("dma_maps"), read_stat("queue_groups"));
	printf("%llu ms\n", (unsigned long long)((uq_now_ns() - t0) / 1000000));
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "bind"))
		return cmd_bind(argv[2]);
	if (argc >= 4 && !strcmp(argv[1], "info"))
		return cmd_info(atoi(argv[2]), argv[3]);
	if (argc >= 3 && !strcmp(argv[1], "perms"))
		return cmd_perms(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "fiemap-read"))
		return cmd_fiemap_read(argc - 2, argv + 2);
	if (argc >= 3 && !strcmp(argv[1], "fiemap-write"))
		return cmd_fiemap_write(argv[2]);
	if (argc >= 2 && !strcmp(argv[1], "wrap"))
		return cmd_wrap();
	if (argc >= 2 && !strcmp(argv[1], "hold-io"))
		cmd_hold_io(argc >= 3 ? argv[2] : NULL);
	if (argc >= 2 && !strcmp(argv[1], "leaks"))
		return cmd_leaks();
	if (argc >= 2 && !strcmp(argv[1], "close-live"))
		return cmd_close_live();
	if (argc >= 2 && !strcmp(argv[1], "bad-ioctl"))
		return cmd_bad_ioctl();
	if (argc >= 4 && !strcmp(argv[1], "rebind"))
		return cmd_rebind(argv[2], atoi(argv[3]));
	if (argc >= 3 && !strcmp(argv[1], "fail"))
		return cmd_fail(argv[2]);
	if (argc >= 4 && !strcmp(argv[1], "close-waits-for-disable"))
		return cmd_close_waits_for_disable(argv[2], argv[3]);
	if (argc >= 4 && !strcmp(argv[1], "timeout-poll"))
		return cmd_timeout_poll(argv[2], argv[3]);
	if (argc >= 4 && !strcmp(argv[1], "timeout-abort-reset"))
		return cmd_timeout_abort_reset(argv[2], argv[3]);
	if (argc >= 4 && !strcmp(argv[1], "timeout-fail"))
		return cmd_timeout_fail(argv[2], argv[3]);
	if (argc >= 2 && !strcmp(argv[1], "reset-revoke"))
		return cmd_reset_revoke();
	if (argc >= 2 && !strcmp(argv[1], "removal-holder"))
		return cmd_removal_holder(argc >= 3 ? argv[2] : NULL);
	if (argc >= 3 && !strcmp(argv[1], "io-until-error"))
		return cmd_io_until_error(argv[2], argc >= 4 ? argv[3] : NULL);
	if (argc >= 2 && !strcmp(argv[1], "bad-dma"))
		return cmd_bad_dma();
	if (argc >= 2 && !strcmp(argv[1], "seal"))
		return cmd_seal();
	if (argc >= 2 && !strcmp(argv[1], "revoke"))
		return cmd_revoke();
	if (argc >= 2 && !strcmp(argv[1], "dma-map-mmap-revoke"))
		return cmd_dma_map_mmap_revoke();
	if (argc >= 2 && !strcmp(argv[1], "ring-mmap-destroy-revoke"))
		return cmd_ring_mmap_destroy_revoke();
	fprintf(stderr, "usage: %s bind ADDR | info LBA SERIAL | perms ADDR | fiemap-read FILE... |\n"
		"  fiemap-write FILE | wrap | hold-io [READY] | leaks | close-live | bad-ioctl |\n"
		"  rebind ADDR N | fail ADDR | close-waits-for-disable ADDR fail|reset |\n"
		"  timeout-poll FILE DIR | timeout-abort-reset FILE DIR |\n"
		"  timeout-fail FILE DIR | reset-revoke | removal-holder [READY] |\n"
		"  io-until-error PATH [READY] | bad-dma | seal | revoke | dma-map-mmap-revoke |\n"
		"  ring-mmap-destroy-revoke\n", argv[0]);
	return 2;
}
