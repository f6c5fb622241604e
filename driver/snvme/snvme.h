/* SPDX-License-Identifier: GPL-2.0 */
/*
 * snvme: a compact NVMe PCI driver that serves a blk-mq block device on the
 * kernel's I/O queues and exports the remaining I/O queue IDs to userspace
 * (docs/driver.md).
 */
#ifndef SNVME_H
#define SNVME_H

#include <linux/blk-mq.h>
#include <linux/cdev.h>
#include <linux/completion.h>
#include <linux/idr.h>
#include <linux/kref.h>
#include <linux/mutex.h>
#include <linux/nvme.h>
#include <linux/pci.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "include/uapi/snvme.h"

#define SNVME_NAME "snvme"
#define SNVME_MAX_CTRLS 64		/* character device minors */
#define SNVME_MAX_KERNEL_QUEUES 64
#define SNVME_MAX_USER_QUEUES 1024
#define SNVME_ADMIN_DEPTH 32		/* admin SQ/CQ entries */
#define SNVME_NVME_PAGE 4096u		/* CC.MPS = 0: NVMe Base Spec 2.0, 3.1.3.5 */
/*
 * Slack on top of the admin and CAP.TO deadlines for fail_work to be
 * scheduled and print (snvme_ctrl_wait_disabled); a guess, generous for a
 * console at 115200 baud.
 */
#define SNVME_DISABLED_SLACK_MS 5000u
#define SNVME_DB_OFFSET 0x1000		/* SQ0TDBL, NVMe Base Spec 2.0, 3.1.3 (Figure 33) */
#define SNVME_MAX_KERNEL_XFER (128u * 1024) /* bytes per block-layer request */
#define SNVME_MAX_SEGS (SNVME_MAX_KERNEL_XFER / SNVME_NVME_PAGE + 1)
#define SNVME_CID_TAG_BITS 12		/* CID = generation << 12 | tag */
#define SNVME_MAX_MAPS_PER_FILE 4096
/* mmap windows: doorbells at 0, SQ of QID q at 2q * stride, its CQ at (2q + 1) * stride. */
#define SNVME_MMAP_RING_STRIDE (4ull << 20)	/* >= 65536 entries * 64 bytes */

/* Module parameters (core.c), range-checked on load. */
extern unsigned int snvme_kernel_queues;
extern unsigned int snvme_user_queues;
extern unsigned int snvme_io_queue_depth;
extern unsigned int snvme_admin_timeout_ms;
extern unsigned int snvme_io_timeout_ms;
extern unsigned int snvme_max_retries;
extern unsigned int snvme_max_dma_map_mib;

/* One SQ/CQ pair owned by the kernel (admin or block I/O). */
struct snvme_queue {
	struct snvme_ctrl *ctrl;
	u16 qid;
	u16 depth;			/* entries in SQ and CQ */
	struct nvme_command *sqes;
	dma_addr_t sq_dma;
	struct nvme_completion *cqes;
	dma_addr_t cq_dma;
	u32 __iomem *sq_db;
	u32 __iomem *cq_db;
	spinlock_t sq_lock;		/* sq_tail and SQ slots */
	spinlock_t cq_lock;		/* cq_head, cq_phase */
	u16 sq_tail;
	u16 last_sq_tail;		/* value last written to the SQ tail doorbell */
	u16 cq_head;
	u8 cq_phase;
	bool created;			/* exists on the controller */
	bool irq_requested;
	int vector;			/* MSI-X/MSI index */
};

/* A namespace served as /dev/snvme<C>n<N>. */
struct snvme_ns {
	struct snvme_ctrl *ctrl;
	struct gendisk *disk;
	u32 nsid;
	u8 lba_shift;
	u8 flbas_index;
	u8 nlbaf;			/* 1's based */
	u64 nsze;			/* logical blocks */
	u64 ncap;			/* logical blocks */
	struct snvme_lba_format lbaf[SNVME_MAX_LBA_FORMATS];
	bool added;
};

/* Leak counters, per controller; module-wide totals are in debugfs. */
struct snvme_counters {
	atomic64_t pinned_pages;
	atomic_t dma_maps;
	atomic_t queue_groups;
};

/* What the timeout ladder did, per controller: <debugfs>/snvme/snvme<C>/recovery. */
struct snvme_recovery_counters {
	atomic_t timeouts;		/* block requests that timed out (each expiry) */
	atomic_t polled;		/* ... found complete by polling the CQ */
	atomic_t aborts;		/* Abort commands sent */
	atomic_t aborts_not_aborted;	/* ... answered "not aborted" (CDW0 bit 0 set) or failed */
	atomic_t resets;		/* controller resets completed */
	atomic_t retries;		/* requests requeued after a reset or an Abort */
	atomic_t failed_requests;	/* requests ended with an error after their last retry */
};

struct snvme_ctrl {
	struct kref ref;
	struct pci_dev *pdev;
	struct device *dev;		/* &pdev->dev */
	int instance;
	void __iomem *bar;
	resource_size_t bar_len;
	u64 cap;
	u32 vs;
	u32 db_stride;			/* bytes, 4 << CAP.DSTRD */
	u32 timeout_ms;			/* CAP.TO in ms */
	int nr_vecs;

	/*
	 * lifecycle: readers are opens, ioctls and mmaps of files; the writers
	 * are remove(), which sets dead and then tears down userspace state,
	 * and the reset, which revokes every open file.
	 */
	struct rw_semaphore lifecycle;
	bool dead;			/* unbound or failed: no more commands */
	bool failed;			/* failed after an error; disabled once disabled completes */
	struct work_struct fail_work;
	/*
	 * Completed (for good) once a failed controller can DMA no more: CC.EN
	 * written 0 and bus mastering off, by fail_work, by remove() after its
	 * shutdown, or by probe's unwinding. failed is set before fail_work is
	 * even queued, so whoever frees memory the controller may reach
	 * because failed is set waits for this, never for fail_work
	 * (snvme_ctrl_wait_disabled).
	 */
	struct completion disabled;
	bool disable_overdue;		/* a wait for disabled ran out: later ones only look */

	/*
	 * Reset (the timeout ladder's third step, or debugfs): resetting is
	 * set when reset_work is queued and cleared when it ends;
	 * reset_allowed holds from the end of probe until remove() begins (a
	 * timeout outside that fails the controller). All three fields below
	 * under state_lock.
	 */
	spinlock_t state_lock;
	bool resetting;
	bool reset_allowed;
	/*
	 * Set (under state_lock) by remove() or probe's unwind right before
	 * their last cancel of fail_work: snvme_ctrl_fail() queues it no more.
	 */
	bool fail_work_retired;
	const char *reset_why;
	struct work_struct reset_work;
	struct snvme_recovery_counters recovery;
#ifdef SNVME_FAULT_INJECTION
	atomic_t inject_drop_cqes;	/* I/O completions still to discard */
	atomic_t inject_skip_irqs;	/* I/O interrupts still to ignore */
	atomic_t inject_stuck_disables;	/* disables still to leave CC.EN = 1 */
	atomic_t inject_fail_delay_ms;	/* the next failure's wait before fail_work */
	atomic_t inject_prefail_delay_ms; /* the next failure's wait before failed is set */
#endif

	/* Admin queue: one command in flight, serialised by admin_lock. */
	struct snvme_queue adminq;
	struct mutex admin_lock;
	struct completion admin_done;
	u16 admin_cid;
	struct nvme_completion admin_cqe;

	/* Identify Controller facts. */
	u32 max_xfer;			/* MDTS in bytes, 0 = none */
	u32 nn;
	u32 sgls;
	bool vwc;
	u16 vid, ssvid;
	char serial[20], model[40], firmware[8];

	/* Queue budget. */
	u16 kernel_queues;
	u16 user_qid_first;
	u16 user_queues;
	unsigned long *user_qid_map;	/* bit i: QID user_qid_first + i in use */
	spinlock_t uq_lock;
	u32 db_bytes;			/* userspace doorbell window, page multiple */

	struct snvme_queue *ioqs;	/* [kernel_queues], QIDs 1..k */
	struct blk_mq_tag_set tagset;
	struct dma_pool *prp_pool;	/* PRP list pages of block requests */
	bool tagset_alloced;
	struct snvme_ns *ns[SNVME_MAX_NAMESPACES];
	int nr_ns;

	/* Character device. */
	struct cdev cdev;
	struct device cdev_dev;
	bool cdev_added;
	/*
	 * files_lock serialises the teardown of files (release, remove, the
	 * reset); files_spin guards the list for revocation, which fail_work
	 * does without sleeping locks. Both are held to add or delete.
	 */
	struct mutex files_lock;
	spinlock_t files_spin;
	struct list_head files;		/* struct snvme_file */
	wait_queue_head_t revoke_wait;	/* poll() of every open file */

	struct snvme_counters cnt;
	struct dentry *debugfs;		/* <debugfs>/snvme/snvme<C>/ */
};

/* One open file of /dev/snvme<C>. */
struct snvme_file {
	struct snvme_ctrl *ctrl;
	struct file *filp;
	struct list_head node;		/* ctrl->files */
	struct mutex lock;		/* groups, maps, seal, serial */
	struct idr groups;		/* changed under lock and map_sem (snvme_mmap) */
	struct idr maps;
	u64 serial;			/* counts the groups and maps made, under lock */
	bool torn_down;			/* remove() has released everything */
	u32 revoked;			/* 0 or SNVME_REVOKED_*, the gravest so far */
	bool queues_gone;		/* a reset's disable deleted its queues (it succeeded) */
	bool dma_kept;			/* the controller may still reach its memory: never unpin */
	bool sealed;			/* SNVME_IOC_SEAL: no new groups, DMA capped */
	u64 max_dma_bytes;		/* the seal's cap on dma_bytes */
	u64 dma_bytes;			/* bytes of the maps in maps */
	struct page *status_page;	/* struct snvme_status, mapped read-only */
	/*
	 * Stand-ins (REVOKE, removal): once stand_ins is set, the doorbell
	 * window faults in sink_page and each ring of a group destroyed from
	 * then on a copy of it (frozen). map_sem orders the decision against
	 * faults: held for reading by snvme_vm_fault, for writing while
	 * stand_ins is set, a group enters or leaves groups or a copy is
	 * stored, so that the zap that follows removes every mapping of the
	 * real pages. Rings and doorbells are only ever mapped by faults,
	 * never by snvme_mmap, which holds map_sem for reading too, instead
	 * of lock (chr.c, the lock order), to find the group it records.
	 */
	struct rw_semaphore map_sem;
	bool stand_ins;
	struct xarray frozen;		/* mmap pgoff -> a ring's stand-in page */
	struct page *sink_page;		/* the doorbells' stand-in: all ones until written */
};

/* core.c */
int snvme_admin_cmd(struct snvme_ctrl *ctrl, struct nvme_command *cmd,
		    u32 *result);
int snvme_create_cq(struct snvme_ctrl *ctrl, u16 qid, dma_addr_t dma,
		    u16 entries, int vector);
int snvme_create_sq(struct snvme_ctrl *ctrl, u16 qid, dma_addr_t dma,
		    u16 entries);
int snvme_delete_queue(struct snvme_ctrl *ctrl, u8 opcode, u16 qid);
int snvme_abort_cmd(struct snvme_ctrl *ctrl, u16 sqid, u16 cid, u32 *result);
void snvme_ctrl_fail(struct snvme_ctrl *ctrl, const char *why);
unsigned long snvme_ctrl_disable_bound_ms(struct snvme_ctrl *ctrl);
bool snvme_ctrl_wait_disabled(struct snvme_ctrl *ctrl);
bool snvme_ctrl_schedule_reset(struct snvme_ctrl *ctrl, const char *why);
bool snvme_ctrl_resetting(struct snvme_ctrl *ctrl);
void snvme_ctrl_put(struct snvme_ctrl *ctrl);
void snvme_ring_cq_doorbell(struct snvme_queue *q);
extern struct snvme_counters snvme_totals;

/* blk.c */
int snvme_blk_init(struct snvme_ctrl *ctrl);
void snvme_blk_remove(struct snvme_ctrl *ctrl);
void snvme_blk_free(struct snvme_ctrl *ctrl);
void snvme_blk_cancel_all(struct snvme_ctrl *ctrl);
void snvme_blk_quiesce(struct snvme_ctrl *ctrl);
void snvme_blk_unquiesce(struct snvme_ctrl *ctrl);
irqreturn_t snvme_io_irq(int irq, void *data);

/* chr.c */
int snvme_chr_module_init(void);
void snvme_chr_module_exit(void);
int snvme_chr_add(struct snvme_ctrl *ctrl);
void snvme_chr_remove(struct snvme_ctrl *ctrl);
void snvme_chr_revoke(struct snvme_ctrl *ctrl, u32 why);
void snvme_chr_queues_gone(struct snvme_ctrl *ctrl);

/* p2p.c (nv-p2p builds) or stubs */
struct snvme_dmamap;
int snvme_gpu_map(struct snvme_ctrl *ctrl, struct snvme_dmamap *m, u64 vaddr,
		  u64 length);
void snvme_gpu_unmap(struct snvme_ctrl *ctrl, struct snvme_dmamap *m);
bool snvme_gpu_callback_done(struct snvme_ctrl *ctrl, struct snvme_dmamap *m);

/* A DMA_MAP handle. */
struct snvme_dmamap {
	u32 id;
	u32 kind;			/* SNVME_DMA_HOST or SNVME_DMA_GPU */
	u64 vaddr, length;
	unsigned long nr_pages;		/* 4 KiB pages */
	dma_addr_t *addrs;		/* [nr_pages], until DMA_MAP copies them out */
	u64 serial;			/* snvme_file.serial when published */
	struct list_head later;		/* to unpin once f->lock is dropped */
	/* host */
	struct mm_struct *mm;		/* charged for RLIMIT_MEMLOCK, mmgrab'ed */
	unsigned long locked;		/* pages charged to mm->locked_vm */
	unsigned long nr_pinned;	/* pages[0..nr_pinned) are pinned */
	struct page **pages;
	struct sg_table sgt;
	bool sgt_mapped;
	/* gpu */
	struct snvme_ctrl *ctrl;
	void *p2p_table;
	void *p2p_mapping;
	atomic_t p2p_state;		/* SNVME_P2P_*, changed atomically (p2p.c) */
	/*
	 * The unmap found the map claimed by the free callback, which may
	 * still read it: the map is freed only once p2p_done says the
	 * callback is done with it (snvme_gpu_callback_done).
	 */
	bool p2p_callback_owns;
	struct completion p2p_done;
};

/*
 * snvme_dmamap.p2p_state. REVOKED: the free callback or DMA_UNMAP has
 * claimed the mapping (only the first does anything). CTRL_REF: the map was
 * kept at close (f->dma_kept) before the callback claimed it, and holds a
 * reference to the controller for the callback, which drops it when done.
 */
#define SNVME_P2P_REVOKED	0x1
#define SNVME_P2P_CTRL_REF	0x2

#endif /* SNVME_H */
