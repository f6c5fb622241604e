// SPDX-License-Identifier: GPL-2.0
/*
 * snvme character device /dev/snvme<C>: controller info, queue groups whose
 * rings and doorbells userspace maps, and DMA mappings of user memory.
 *
 * Lifetime rule: a queue is deleted on the controller (Delete I/O SQ, then
 * Delete I/O CQ) before its ring memory is freed and before any page mapped
 * through the same file is unpinned. If a delete fails, the controller is
 * disabled first (which deletes every queue) and only then is memory freed.
 *
 * Revocation: a reset, a failure or the removal of the controller revokes
 * every open file (snvme_chr_revoke), and SNVME_IOC_REVOKE the files a
 * lease broker names: its status page and poll() say so, its ioctls and
 * mmaps fail, and what it holds is released at close (REVOKE and removal
 * release its queues at once and put stand-ins under its mappings).
 *
 * Lock order, outer first:
 *
 *   ctrl->lifecycle  >  ctrl->files_lock  >  f->lock  >  f->map_sem
 *   a process's mmap lock  >  f->map_sem
 *
 * with ctrl->admin_lock, files_spin and uq_lock innermost. lifecycle is
 * read by opens and ioctls and written by remove() and the reset (core.c);
 * files_lock serialises teardown and REVOKE of other files; f->lock guards
 * what one file holds; map_sem orders the fault handler's choices against
 * revocation. The kernel holds the mmap lock around ->mmap and ->fault,
 * which therefore take map_sem only (snvme_mmap argues why that is enough).
 * A teardown on a failed controller waits for its disable with files_lock
 * and f->lock held, and lifecycle read in an ioctl (snvme_ctrl_wait_disabled):
 * fail_work, which completes it, takes admin_lock only, so the wait adds no
 * edge to this order; its deadline is the controller's, so all the waits
 * under these locks together last at most one of it.
 *
 * Nothing touches user memory while holding lifecycle, files_lock, f->lock
 * or map_sem: no copy_{from,to}_user, no pin or unpin of user pages, no
 * account_locked_vm. Each of them may take the mmap lock, which would
 * invert the order above (DMA_MAP pinning under f->lock against an mmap
 * that took f->lock under the mmap lock was an ABBA deadlock), and may
 * wait as long as the memory's owner likes (userfaultfd, FUSE, a page
 * locked for IO), and whoever waits for the lock held would wait as long:
 * REVOKE of the other files takes every f->lock, the reset takes lifecycle
 * for writing and stops new readers behind it. So DMA_MAP pins before it
 * takes its locks and checks the file again after (snvme_ioc_dma_map), maps
 * are unpinned after the locks are dropped (snvme_dmamap_put), and ioctls
 * copy their results out last (snvme_copy_out).
 */
#include <linux/fs.h>
#include <linux/highmem.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

#include "compat.h"
#include "snvme.h"

static dev_t snvme_devt;
static struct class *snvme_class;

/* One queue pair of a group. */
struct snvme_uq {
	u16 qid;
	u32 entries;
	void *sq;
	dma_addr_t sq_dma;
	u32 sq_bytes;
	void *cq;
	dma_addr_t cq_dma;
	u32 cq_bytes;
	bool cq_created;
	bool sq_created;
};

struct snvme_qgroup {
	u32 id;
	u32 nr;
	u64 serial;			/* snvme_file.serial when published */
	struct snvme_uq q[SNVME_MAX_GROUP_QUEUES];
};

/*
 * What an ioctl made under the locks and hands to userspace only once it
 * has dropped them (the lock order at the top): the bus addresses of a
 * DMA_MAP, an Identify data structure; and the handle of a queue group or
 * DMA map to undo if that copy fails. The serial tells the handle apart
 * from a later one that reuses its number.
 */
struct snvme_made {
	u32 id;			/* group or map handle, 0 = none */
	u64 serial;
	dma_addr_t *addrs;	/* DMA_MAP: map.nr_pages bus addresses, kvfree'd */
	void *identify;		/* IDENTIFY: SNVME_IDENTIFY_BYTES, kfree'd */
};

static u64 snvme_sq_offset(u16 qid)
{
	return 2ull * qid * SNVME_MMAP_RING_STRIDE;
}

static u64 snvme_cq_offset(u16 qid)
{
	return (2ull * qid + 1) * SNVME_MMAP_RING_STRIDE;
}

static void snvme_count(struct snvme_ctrl *ctrl, long pages, int maps, int groups)
{
	atomic64_add(pages, &ctrl->cnt.pinned_pages);
	atomic64_add(pages, &snvme_totals.pinned_pages);
	atomic_add(maps, &ctrl->cnt.dma_maps);
	atomic_add(maps, &snvme_totals.dma_maps);
	atomic_add(groups, &ctrl->cnt.queue_groups);
	atomic_add(groups, &snvme_totals.queue_groups);
}

/*
 * ENODEV once the controller is unbound or failed, ESTALE once the file is
 * revoked (a reset or REVOKE: its queue groups are gone; a new open gets a
 * working file), else 0. With lifecycle held the answer holds until it is
 * dropped; snvme_mmap, which may not take lifecycle, argues why a stale
 * answer does no harm there.
 */
static int snvme_file_usable(struct snvme_file *f)
{
	if (READ_ONCE(f->ctrl->dead) || READ_ONCE(f->ctrl->failed))
		return -ENODEV;
	if (READ_ONCE(f->revoked))
		return -ESTALE;
	return 0;
}

/* ---- queue groups ----------------------------------------------------- */

static void snvme_zap(struct snvme_file *f, u64 off, u64 len)
{
	unmap_mapping_range(f->filp->f_mapping, off, len, 1);
}

/*
 * REVOKE and removal free the rings while processes may still poll them and
 * write SQEs. So that they get an error rather than SIGBUS, the pages of
 * [off, off + bytes) fault in stand-ins afterwards (snvme_vm_fault): a copy
 * of the ring as the controller left it (its queue was deleted first, so no
 * completion is lost or invented). A poller then sees no new completion,
 * reads csts = all ones in its status page and stops. Called with map_sem
 * held for writing, in the same hold that takes the ring's group out of
 * f->groups, so that no fault finds neither; a page that cannot be
 * allocated faults with SIGBUS.
 */
static void snvme_freeze(struct snvme_file *f, u64 off, const void *src, u64 bytes)
{
	unsigned long i;
	struct page *p;
	void *old;

	lockdep_assert_held_write(&f->map_sem);
	for (i = 0; i < bytes >> PAGE_SHIFT; i++) {
		p = alloc_page(GFP_KERNEL);
		if (!p)
			break;
		memcpy(page_address(p), src + i * PAGE_SIZE, PAGE_SIZE);
		old = xa_store(&f->frozen, (off >> PAGE_SHIFT) + i, p, GFP_KERNEL);
		if (xa_is_err(old)) {
			__free_page(p);
			break;
		}
		if (old)
			__free_page(old);
	}
}

static void snvme_free_frozen(struct snvme_file *f)
{
	unsigned long index;
	struct page *p;

	xa_for_each(&f->frozen, index, p)
		__free_page(p);
	xa_destroy(&f->frozen);
	__free_page(f->sink_page);
}

/*
 * From now on the file's doorbell window faults in its sink page, and the
 * rings of the groups it destroys their copies (snvme_freeze). Then the
 * window is zapped: in every file, since all share the device's mapping;
 * the others fault their live doorbells back in (snvme_vm_fault).
 */
static void snvme_stand_ins(struct snvme_file *f)
{
	down_write(&f->map_sem);
	f->stand_ins = true;
	up_write(&f->map_sem);
	if (f->ctrl->db_bytes)
		snvme_zap(f, SNVME_MMAP_DOORBELLS, f->ctrl->db_bytes);
}

static void snvme_release_qid(struct snvme_ctrl *ctrl, u16 qid)
{
	spin_lock(&ctrl->uq_lock);
	clear_bit(qid - ctrl->user_qid_first, ctrl->user_qid_map);
	spin_unlock(&ctrl->uq_lock);
}

/*
 * Deletes the group's queues on the controller, then revokes userspace
 * mappings of the rings, frees them and returns the QIDs. If the controller
 * failed and was not disabled in time (snvme_ctrl_wait_disabled), it may
 * still DMA into the rings and into the file's DMA maps: the rings are then
 * kept, never freed, and so are the maps from now on (f->dma_kept).
 */
static void snvme_group_destroy(struct snvme_file *f, struct snvme_qgroup *g)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	bool bad = false, dma_off = true;
	int i, ret;

	/*
	 * A failed controller is disabled (or about to be), and a reset deleted
	 * the queues of every file it revoked, with a disable that succeeded:
	 * then there is nothing to delete.
	 */
	for (i = 0; i < g->nr && !READ_ONCE(ctrl->failed) && !f->queues_gone; i++) {
		struct snvme_uq *uq = &g->q[i];

		if (uq->sq_created) {
			ret = snvme_delete_queue(ctrl, nvme_admin_delete_sq, uq->qid);
			if (ret) {
				dev_err(ctrl->dev, "Delete I/O SQ %u failed: %d\n", uq->qid, ret);
				bad = true;
			}
		}
		if (uq->cq_created) {
			ret = snvme_delete_queue(ctrl, nvme_admin_delete_cq, uq->qid);
			if (ret) {
				dev_err(ctrl->dev, "Delete I/O CQ %u failed: %d\n", uq->qid, ret);
				bad = true;
			}
		}
	}
	if (bad)
		snvme_ctrl_fail(ctrl, "queue delete failed");
	/*
	 * failed is set before fail_work is queued (snvme_ctrl_fail), so wait
	 * for the disable itself: a flush_work() may find nothing queued yet
	 * and return while the controller still runs these queues.
	 */
	if (READ_ONCE(ctrl->failed) && !snvme_ctrl_wait_disabled(ctrl)) {
		dev_warn(ctrl->dev, "the failed controller was not disabled in time: the rings of queue group %u (%u queue pair(s), QID %u first) and the DMA maps of its file are kept, never freed\n",
			 g->id, g->nr, g->q[0].qid);
		dma_off = false;
		f->dma_kept = true;
	}

	/*
	 * From here on neither snvme_mmap nor snvme_vm_fault finds the rings it
	 * frees; a fault finds their copies instead once the file has
	 * stand-ins (stored in the same hold of map_sem, so none finds
	 * neither). The zap that follows then removes every page table entry
	 * of the rings (the argument is at snvme_vm_fault).
	 */
	down_write(&f->map_sem);
	if (g->id)
		idr_remove(&f->groups, g->id);
	for (i = 0; i < g->nr && f->stand_ins; i++) {
		struct snvme_uq *uq = &g->q[i];

		if (uq->sq)
			snvme_freeze(f, snvme_sq_offset(uq->qid), uq->sq, uq->sq_bytes);
		if (uq->cq)
			snvme_freeze(f, snvme_cq_offset(uq->qid), uq->cq, uq->cq_bytes);
	}
	up_write(&f->map_sem);
	if (g->id)
		snvme_count(ctrl, 0, 0, -1);
	for (i = 0; i < g->nr; i++) {
		struct snvme_uq *uq = &g->q[i];

		snvme_zap(f, snvme_sq_offset(uq->qid), uq->sq_bytes);
		snvme_zap(f, snvme_cq_offset(uq->qid), uq->cq_bytes);
		if (uq->sq && dma_off)
			dma_free_coherent(ctrl->dev, uq->sq_bytes, uq->sq, uq->sq_dma);
		if (uq->cq && dma_off)
			dma_free_coherent(ctrl->dev, uq->cq_bytes, uq->cq, uq->cq_dma);
		snvme_release_qid(ctrl, uq->qid);
	}
	kfree(g);
}

static u16 snvme_user_queues_free(struct snvme_ctrl *ctrl)
{
	u16 used;

	spin_lock(&ctrl->uq_lock);
	used = bitmap_weight(ctrl->user_qid_map, ctrl->user_queues);
	spin_unlock(&ctrl->uq_lock);
	return ctrl->user_queues - used;
}

static int snvme_ioc_create_group(struct snvme_file *f, struct snvme_queue_group *a,
				   struct snvme_made *made)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	u32 mqes = NVME_CAP_MQES(ctrl->cap) + 1;
	struct snvme_qgroup *g;
	int i, ret, id;
	u16 avail;

	if (f->sealed) {
		dev_err_ratelimited(ctrl->dev, "CREATE_QUEUE_GROUP: the file is sealed to its queue groups\n");
		return -EPERM;
	}
	if (a->flags) {
		dev_err_ratelimited(ctrl->dev, "CREATE_QUEUE_GROUP: flags 0x%x, must be 0\n",
				    a->flags);
		return -EINVAL;
	}
	if (a->nr_queues < 1 || a->nr_queues > SNVME_MAX_GROUP_QUEUES) {
		dev_err_ratelimited(ctrl->dev, "CREATE_QUEUE_GROUP: nr_queues %u, must be 1..%u\n",
				    a->nr_queues, SNVME_MAX_GROUP_QUEUES);
		return -EINVAL;
	}
	if (a->entries < 2 || a->entries > mqes) {
		dev_err_ratelimited(ctrl->dev, "CREATE_QUEUE_GROUP: entries %u, must be 2..%u (CAP.MQES + 1)\n",
				    a->entries, mqes);
		return -EINVAL;
	}
	g = kzalloc(sizeof(*g), GFP_KERNEL);
	if (!g)
		return -ENOMEM;

	/* Reserve QIDs. */
	spin_lock(&ctrl->uq_lock);
	avail = ctrl->user_queues - bitmap_weight(ctrl->user_qid_map, ctrl->user_queues);
	if (a->nr_queues > avail) {
		spin_unlock(&ctrl->uq_lock);
		kfree(g);
		dev_err_ratelimited(ctrl->dev, "CREATE_QUEUE_GROUP: nr_queues %u exceeds the %u free user queues (budget %u)\n",
				    a->nr_queues, avail, ctrl->user_queues);
		return -ENOSPC;
	}
	for (i = 0; i < a->nr_queues; i++) {
		unsigned long bit = find_first_zero_bit(ctrl->user_qid_map, ctrl->user_queues);

		set_bit(bit, ctrl->user_qid_map);
		g->q[i].qid = ctrl->user_qid_first + bit;
	}
	g->nr = a->nr_queues;
	spin_unlock(&ctrl->uq_lock);

	for (i = 0; i < g->nr; i++) {
		struct snvme_uq *uq = &g->q[i];

		uq->entries = a->entries;
		uq->sq_bytes = PAGE_ALIGN(a->entries * sizeof(struct nvme_command));
		uq->cq_bytes = PAGE_ALIGN(a->entries * sizeof(struct nvme_completion));
		uq->sq = dma_alloc_coherent(ctrl->dev, uq->sq_bytes, &uq->sq_dma, GFP_KERNEL);
		uq->cq = dma_alloc_coherent(ctrl->dev, uq->cq_bytes, &uq->cq_dma, GFP_KERNEL);
		if (!uq->sq || !uq->cq) {
			ret = -ENOMEM;
			goto destroy;
		}
		ret = snvme_create_cq(ctrl, uq->qid, uq->cq_dma, a->entries, -1);
		if (ret) {
			dev_err(ctrl->dev, "Create I/O CQ %u (%u entries) failed: %d\n",
				uq->qid, a->entries, ret);
			ret = ret > 0 ? -EIO : ret;
			goto destroy;
		}
		uq->cq_created = true;
		ret = snvme_create_sq(ctrl, uq->qid, uq->sq_dma, a->entries);
		if (ret) {
			dev_err(ctrl->dev, "Create I/O SQ %u (%u entries) failed: %d\n",
				uq->qid, a->entries, ret);
			ret = ret > 0 ? -EIO : ret;
			goto destroy;
		}
		uq->sq_created = true;
	}
	g->serial = ++f->serial;
	down_write(&f->map_sem);
	id = idr_alloc(&f->groups, g, 1, 0, GFP_KERNEL);
	if (id >= 0)
		g->id = id;
	up_write(&f->map_sem);
	if (id < 0) {
		ret = id;
		goto destroy;
	}
	snvme_count(ctrl, 0, 0, 1);
	made->id = id;
	made->serial = g->serial;

	a->group_id = id;
	memset(a->queues, 0, sizeof(a->queues));
	for (i = 0; i < g->nr; i++) {
		struct snvme_queue_desc *d = &a->queues[i];
		struct snvme_uq *uq = &g->q[i];

		d->qid = uq->qid;
		d->entries = uq->entries;
		d->sq_doorbell = 2 * uq->qid * ctrl->db_stride;
		d->cq_doorbell = (2 * uq->qid + 1) * ctrl->db_stride;
		d->sq_offset = snvme_sq_offset(uq->qid);
		d->cq_offset = snvme_cq_offset(uq->qid);
		d->sq_bytes = uq->sq_bytes;
		d->cq_bytes = uq->cq_bytes;
	}
	return 0;

destroy:
	snvme_group_destroy(f, g);
	return ret;
}

/* ---- DMA maps ---------------------------------------------------------- */

/*
 * A host map is taken down in two halves. Under f->lock the device loses
 * it: DMA unmapped, the handle and its bytes gone from the file. Then, with
 * no lock held, its pages are unpinned (dirtying takes page locks, which IO
 * may hold for long) and uncharged (account_locked_vm takes the mmap lock):
 * snvme_dmamap_put. Callers that hold f->lock collect the maps on a list
 * for after (snvme_dmamap_put_list).
 */
static void snvme_dmamap_unmap(struct snvme_file *f, struct snvme_dmamap *m)
{
	struct snvme_ctrl *ctrl = f->ctrl;

	if (m->kind == SNVME_DMA_GPU) {
		snvme_gpu_unmap(ctrl, m);
	} else {
		if (m->sgt_mapped)
			dma_unmap_sgtable(ctrl->dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
		m->sgt_mapped = false;
		if (m->sgt.sgl)
			sg_free_table(&m->sgt);
		m->sgt.sgl = NULL;
	}
	if (m->id) {
		idr_remove(&f->maps, m->id);
		f->dma_bytes -= m->length;
		snvme_count(ctrl, 0, -1, 0);
		m->id = 0;
	}
}

/*
 * The second half, with no lock held: the pins and the RLIMIT_MEMLOCK
 * charge; for a GPU map whose free callback claimed it, the end of the
 * callback (it reads m until then).
 */
static void snvme_dmamap_put(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
	if (m->kind == SNVME_DMA_GPU && !snvme_gpu_callback_done(ctrl, m))
		return;	/* kept: the callback may still read it */
	if (m->kind == SNVME_DMA_HOST) {
		if (m->pages && m->nr_pinned) {
			/* The device may have written any page. */
			unpin_user_pages_dirty_lock(m->pages, m->nr_pinned, true);
			snvme_count(ctrl, -(long)m->nr_pinned, 0, 0);
		}
		kvfree(m->pages);
		if (m->mm) {
			/* An exiting mm (process death) has nothing to uncharge. */
			if (m->locked && mmget_not_zero(m->mm)) {
				account_locked_vm(m->mm, m->locked, false);
				mmput(m->mm);
			}
			mmdrop(m->mm);
		}
	}
	kvfree(m->addrs);
	kfree(m);
}

static void snvme_dmamap_release(struct snvme_file *f, struct snvme_dmamap *m,
				 struct list_head *later)
{
	if (f->dma_kept) {
		/*
		 * The controller may still DMA into it (snvme_group_destroy): it
		 * stays pinned and mapped for good, and its counters say so. A
		 * GPU map's free callback may still run after this file and the
		 * controller are gone, and uses m->ctrl: the map holds a reference
		 * to the controller for it, which the callback drops
		 * (snvme_p2p_free_cb). Only if the callback has not claimed the
		 * map yet: the cmpxchg and the callback's claim are one atomic
		 * word, so either the callback sees CTRL_REF and puts it, or this
		 * sees REVOKED (it ran or runs now) and puts its own at once.
		 * That put is never the last: this file holds one until
		 * snvme_release ends. No lock is taken, the order is unchanged.
		 */
		idr_remove(&f->maps, m->id);
		m->id = 0;
		if (m->kind == SNVME_DMA_GPU) {
			kref_get(&f->ctrl->ref);
			if (atomic_cmpxchg(&m->p2p_state, 0, SNVME_P2P_CTRL_REF))
				snvme_ctrl_put(f->ctrl);
		}
		return;
	}
	snvme_dmamap_unmap(f, m);
	list_add_tail(&m->later, later);
}

static void snvme_dmamap_put_list(struct snvme_ctrl *ctrl, struct list_head *later)
{
	struct snvme_dmamap *m, *next;

	list_for_each_entry_safe(m, next, later, later) {
		list_del(&m->later);
		snvme_dmamap_put(ctrl, m);
	}
}

/*
 * Charges and pins the pages of a host map, with no lock of ours held (the
 * lock order at the top): the pin may fault pages in and so take the mmap
 * lock, and may wait as long as the memory's owner wants (userfaultfd,
 * FUSE). What it did is undone by snvme_dmamap_put.
 */
static int snvme_pin_host(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
	int ret;

	m->pages = kvmalloc_array(m->nr_pages, sizeof(*m->pages), GFP_KERNEL);
	if (!m->pages)
		return -ENOMEM;
	/* Long-term pins count against RLIMIT_MEMLOCK unless CAP_IPC_LOCK. */
	ret = account_locked_vm(current->mm, m->nr_pages, true);
	if (ret) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: %lu pages exceed RLIMIT_MEMLOCK\n",
				    m->nr_pages);
		return ret;
	}
	m->mm = current->mm;
	mmgrab(m->mm);
	m->locked = m->nr_pages;
	while (m->nr_pinned < m->nr_pages) {
		ret = pin_user_pages_fast(m->vaddr + m->nr_pinned * PAGE_SIZE,
					  min_t(unsigned long, m->nr_pages - m->nr_pinned, INT_MAX),
					  FOLL_WRITE | FOLL_LONGTERM, m->pages + m->nr_pinned);
		if (ret <= 0) {
			dev_err_ratelimited(ctrl->dev, "DMA_MAP: cannot pin vaddr 0x%llx + %lu pages: %d\n",
					    m->vaddr, m->nr_pinned, ret);
			return ret ? ret : -EFAULT;
		}
		m->nr_pinned += ret;
		snvme_count(ctrl, ret, 0, 0);
	}
	return 0;
}

/* Maps the pinned pages for the device, under f->lock, and fills m->addrs. */
static int snvme_map_host(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
	struct sg_dma_page_iter it;
	unsigned long i = 0;
	int ret;

	ret = sg_alloc_table_from_pages(&m->sgt, m->pages, m->nr_pages, 0,
					m->length, GFP_KERNEL);
	if (ret)
		return ret;
	ret = dma_map_sgtable(ctrl->dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		return ret;
	m->sgt_mapped = true;
	for_each_sgtable_dma_page(&m->sgt, &it, 0) {
		if (WARN_ON_ONCE(i >= m->nr_pages))
			return -EIO;
		m->addrs[i++] = sg_page_iter_dma_address(&it);
	}
	return i == m->nr_pages ? 0 : -EIO;
}

/* Whether a map of length bytes fits under the file's seal; f->lock held. */
static bool snvme_seal_fits(struct snvme_file *f, u64 length)
{
	return !f->sealed || (length <= f->max_dma_bytes &&
			      f->dma_bytes <= f->max_dma_bytes - length);
}

/* DMA_MAP's checks of its argument and of the seal, under f->lock. */
static int snvme_dma_map_check(struct snvme_file *f, const struct snvme_dma_map *a)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	u64 limit = (u64)snvme_max_dma_map_mib << 20;

	if (a->flags) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: flags 0x%x, must be 0\n", a->flags);
		return -EINVAL;
	}
	if (a->kind != SNVME_DMA_HOST && a->kind != SNVME_DMA_GPU) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: kind %u unknown\n", a->kind);
		return -EINVAL;
	}
	if (!IS_ALIGNED(a->vaddr, PAGE_SIZE) || !a->vaddr) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: vaddr 0x%llx not %lu-byte aligned or NULL\n",
				    a->vaddr, PAGE_SIZE);
		return -EINVAL;
	}
	if (!a->length || !IS_ALIGNED(a->length, PAGE_SIZE) || a->length > limit) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: length %llu must be a non-zero multiple of %lu up to %llu (max_dma_map_mib)\n",
				    a->length, PAGE_SIZE, limit);
		return -EINVAL;
	}
	if (a->vaddr + a->length < a->vaddr || a->vaddr + a->length > TASK_SIZE) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: vaddr + length overflows the address space\n");
		return -EINVAL;
	}
	if (!snvme_seal_fits(f, a->length)) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: %llu bytes on top of %llu mapped exceed the seal's %llu\n",
				    a->length, f->dma_bytes, f->max_dma_bytes);
		return -EDQUOT;
	}
	if (a->max_addrs < a->length / PAGE_SIZE || !a->bus_addrs) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: bus_addrs holds %llu entries, need %llu\n",
				    a->max_addrs, a->length / PAGE_SIZE);
		return -EINVAL;
	}
	return 0;
}

/*
 * SNVME_IOC_DMA_MAP, in three steps so that no lock of ours is held while
 * user memory is touched (the lock order at the top):
 *  1. under lifecycle and f->lock: the file is usable, the argument valid,
 *     the seal has room (the errors a caller got before, in that order);
 *  2. no lock: charge RLIMIT_MEMLOCK and pin the pages (snvme_pin_host);
 *  3. under lifecycle and f->lock again: the file may have been revoked,
 *     torn down or filled up to its seal meanwhile, so check again and
 *     give back the pins if so (the same ESTALE, ENODEV or EDQUOT); else
 *     map for the device and publish the handle.
 * The caller copies the bus addresses out afterwards, with no lock held,
 * and undoes the map if that fails (snvme_undo). GPU memory (nv-p2p) is not the process's:
 * it is mapped in step 3.
 */
static int snvme_ioc_dma_map(struct snvme_file *f, struct snvme_dma_map *a,
			     struct snvme_made *made)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	struct snvme_dmamap *m;
	int ret, id;

	down_read(&ctrl->lifecycle);
	mutex_lock(&f->lock);
	ret = snvme_file_usable(f);
	if (!ret)
		ret = snvme_dma_map_check(f, a);
	mutex_unlock(&f->lock);
	up_read(&ctrl->lifecycle);
	if (ret)
		return ret;

	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->kind = a->kind;
	init_completion(&m->p2p_done);
	m->vaddr = a->vaddr;
	m->length = a->length;
	m->nr_pages = a->length / PAGE_SIZE;
	m->addrs = kvmalloc_array(m->nr_pages, sizeof(*m->addrs), GFP_KERNEL);
	if (!m->addrs) {
		kfree(m);
		return -ENOMEM;
	}
	if (a->kind == SNVME_DMA_HOST) {
		ret = snvme_pin_host(ctrl, m);
		if (ret)
			goto put;
	}

	down_read(&ctrl->lifecycle);
	mutex_lock(&f->lock);
	ret = snvme_file_usable(f);
	if (!ret && f->torn_down)
		ret = -ENODEV;
	if (!ret && !snvme_seal_fits(f, a->length)) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP: %llu bytes on top of %llu mapped exceed the seal's %llu\n",
				    a->length, f->dma_bytes, f->max_dma_bytes);
		ret = -EDQUOT;
	}
	if (!ret)
		ret = a->kind == SNVME_DMA_GPU ? snvme_gpu_map(ctrl, m, a->vaddr, a->length)
					       : snvme_map_host(ctrl, m);
	if (!ret) {
		id = idr_alloc(&f->maps, m, 1, SNVME_MAX_MAPS_PER_FILE + 1, GFP_KERNEL);
		ret = id == -ENOSPC ? -EMFILE : min(id, 0);
	}
	if (!ret) {
		m->id = id;
		m->serial = ++f->serial;
		f->dma_bytes += m->length;
		snvme_count(ctrl, 0, 1, 0);
		a->map_id = id;
		a->nr_pages = m->nr_pages;
		/*
		 * Published: another thread may DMA_UNMAP it from now on, so
		 * the addresses to copy out leave the map with the caller.
		 */
		made->id = id;
		made->serial = m->serial;
		made->addrs = m->addrs;
		m->addrs = NULL;
		m = NULL;
	} else {
		snvme_dmamap_unmap(f, m);
	}
	mutex_unlock(&f->lock);
	up_read(&ctrl->lifecycle);
	if (!m)
		return 0;
put:
	snvme_dmamap_put(ctrl, m);
	return ret;
}

static int snvme_ioc_seal(struct snvme_file *f, struct snvme_seal *a)
{
	struct snvme_ctrl *ctrl = f->ctrl;

	if (f->sealed) {
		dev_err_ratelimited(ctrl->dev, "SEAL: the file is sealed already\n");
		return -EPERM;
	}
	if (a->flags || a->pad0) {
		dev_err_ratelimited(ctrl->dev, "SEAL: flags 0x%x and pad0 0x%x, both must be 0\n",
				    a->flags, a->pad0);
		return -EINVAL;
	}
	if (!IS_ALIGNED(a->max_dma_bytes, PAGE_SIZE) || a->max_dma_bytes < f->dma_bytes) {
		dev_err_ratelimited(ctrl->dev, "SEAL: max_dma_bytes %llu must be a multiple of %lu and >= the %llu bytes mapped\n",
				    a->max_dma_bytes, PAGE_SIZE, f->dma_bytes);
		return -EINVAL;
	}
	f->max_dma_bytes = a->max_dma_bytes;
	f->sealed = true;
	return 0;
}

/* ---- identify, abort ---------------------------------------------------- */

/* IDENTIFY into a kernel copy, made->identify, which the caller copies out. */
static int snvme_ioc_identify(struct snvme_file *f, struct snvme_identify *a,
			      struct snvme_made *made)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	struct nvme_command c = { };
	dma_addr_t dma;
	void *buf;
	int ret;

	if (a->cns == SNVME_IDENTIFY_CNS_NS ? !a->nsid || a->nsid > ctrl->nn
					    : a->cns != SNVME_IDENTIFY_CNS_CTRL || a->nsid) {
		dev_err_ratelimited(ctrl->dev, "IDENTIFY: cns %u nsid %u: need cns 0 with nsid 1..%u or cns 1 with nsid 0\n",
				    a->cns, a->nsid, ctrl->nn);
		return -EINVAL;
	}
	buf = dma_alloc_coherent(ctrl->dev, SNVME_IDENTIFY_BYTES, &dma, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	c.identify.opcode = nvme_admin_identify;
	c.identify.nsid = cpu_to_le32(a->nsid);
	c.identify.cns = a->cns;
	c.identify.dptr.prp1 = cpu_to_le64(dma);
	ret = snvme_admin_cmd(ctrl, &c, NULL);
	if (ret > 0) {
		dev_err_ratelimited(ctrl->dev, "IDENTIFY cns %u nsid %u: NVMe status 0x%x\n",
				    a->cns, a->nsid, ret);
		ret = -EIO;
	}
	if (!ret) {
		made->identify = kmemdup(buf, SNVME_IDENTIFY_BYTES, GFP_KERNEL);
		if (!made->identify)
			ret = -ENOMEM;
	}
	dma_free_coherent(ctrl->dev, SNVME_IDENTIFY_BYTES, buf, dma);
	return ret;
}

static bool snvme_file_owns_qid(struct snvme_file *f, u16 qid)
{
	struct snvme_qgroup *g;
	int id, i;

	idr_for_each_entry(&f->groups, g, id)
		for (i = 0; i < g->nr; i++)
			if (g->q[i].qid == qid && g->q[i].sq_created)
				return true;
	return false;
}

static int snvme_ioc_abort(struct snvme_file *f, struct snvme_abort *a)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	u32 result = 0;
	int ret;

	if (!snvme_file_owns_qid(f, a->sqid)) {
		dev_err_ratelimited(ctrl->dev, "ABORT: SQ %u is not in a queue group of this file\n",
				    a->sqid);
		return -ENOENT;
	}
	ret = snvme_abort_cmd(ctrl, a->sqid, a->cid, &result);
	if (ret > 0) {
		/* Abort Command Limit Exceeded (SCT 1h, SC 03h): try again later. */
		dev_dbg(ctrl->dev, "ABORT SQ %u CID 0x%x: NVMe status 0x%x\n",
			a->sqid, a->cid, ret);
		ret = ret == NVME_SC_ABORT_LIMIT ? -EBUSY : -EIO;
	}
	a->result = result;
	return ret;
}

/* ---- file operations --------------------------------------------------- */

/*
 * Everything a file holds, in the safe order: queues first, then DMA maps
 * (their pins go on later, to unpin once f->lock is dropped). On removal
 * its mappings get stand-ins first (at close it has none left).
 */
static void snvme_file_teardown(struct snvme_file *f, struct list_head *later)
{
	struct snvme_qgroup *g;
	struct snvme_dmamap *m;
	int id;

	if (f->revoked == SNVME_REVOKED_REMOVED && !f->stand_ins)
		snvme_stand_ins(f);
	idr_for_each_entry(&f->groups, g, id)
		snvme_group_destroy(f, g);
	idr_for_each_entry(&f->maps, m, id)
		snvme_dmamap_release(f, m, later);
	f->torn_down = true;
}

/* How grave a revocation is: RESET < LEASE < FAILED < REMOVED (uapi). */
static int snvme_revoke_rank(u32 why)
{
	switch (why) {
	case SNVME_REVOKED_RESET:
		return 1;
	case SNVME_REVOKED_LEASE:
		return 2;
	case SNVME_REVOKED_FAILED:
		return 3;
	case SNVME_REVOKED_REMOVED:
		return 4;
	}
	return 0;
}

/* Publishes a revocation in the status page: revoked first, then CSTS all ones. */
static void snvme_status_revoke(struct snvme_file *f, u32 why)
{
	struct snvme_status *st = page_address(f->status_page);

	WRITE_ONCE(f->revoked, why);
	WRITE_ONCE(st->revoked, why);
	/* A poller that reads csts as all ones also reads revoked. */
	smp_wmb();
	WRITE_ONCE(st->csts, ~0u);
}

/*
 * Revokes every open file of the controller: a reset is deleting its
 * queues, a failure disabled the controller, or it is being removed. A
 * later, graver reason replaces an earlier one (snvme_revoke_rank). Takes no
 * sleeping lock, so fail_work may call it while ioctls and release hold
 * theirs; a reset calls it with files_lock held, so no teardown runs then,
 * before its disable: that the queues are gone it says only once the disable
 * succeeded (snvme_chr_queues_gone).
 */
void snvme_chr_revoke(struct snvme_ctrl *ctrl, u32 why)
{
	struct snvme_file *f;
	int n = 0;

	spin_lock(&ctrl->files_spin);
	list_for_each_entry(f, &ctrl->files, node) {
		if (snvme_revoke_rank(f->revoked) >= snvme_revoke_rank(why))
			continue;
		snvme_status_revoke(f, why);
		n++;
	}
	spin_unlock(&ctrl->files_spin);
	if (n)
		dev_info(ctrl->dev, "%d open file(s) of /dev/snvme%d revoked (%s)\n", n,
			 ctrl->instance, why == SNVME_REVOKED_RESET ? "reset" :
			 why == SNVME_REVOKED_FAILED ? "controller failed" : "removed");
	wake_up_all(&ctrl->revoke_wait);
}

/*
 * A reset's disable succeeded (CSTS.RDY = 0): the controller deleted every
 * queue, so the files open now (all revoked, RESET) need no Delete at
 * close. Called by the reset with lifecycle (write) and files_lock held,
 * which every reader of queues_gone holds one of, so no teardown runs
 * between the disable and this. Never called after a disable that failed:
 * then the queues may still run, and the reset fails the controller instead.
 */
void snvme_chr_queues_gone(struct snvme_ctrl *ctrl)
{
	struct snvme_file *f;

	lockdep_assert_held(&ctrl->files_lock);
	spin_lock(&ctrl->files_spin);
	list_for_each_entry(f, &ctrl->files, node)
		f->queues_gone = true;
	spin_unlock(&ctrl->files_spin);
}

/*
 * SNVME_IOC_REVOKE of one file, with f->lock held: its status page first
 * (pollers stop), then stand-ins under its doorbells (no write reaches a
 * queue from here on), then its groups deleted on the controller, their
 * rings copied for the stand-ins and their QIDs freed. Adds what it revoked
 * to a's counters.
 */
static void snvme_file_revoke(struct snvme_file *f, struct snvme_revoke *a)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	struct snvme_qgroup *g;
	int id;

	if (!f->stand_ins)
		a->files++;
	spin_lock(&ctrl->files_spin);
	if (snvme_revoke_rank(f->revoked) < snvme_revoke_rank(SNVME_REVOKED_LEASE))
		snvme_status_revoke(f, SNVME_REVOKED_LEASE);
	spin_unlock(&ctrl->files_spin);
	wake_up_all(&ctrl->revoke_wait);
	if (!f->stand_ins)
		snvme_stand_ins(f);
	idr_for_each_entry(&f->groups, g, id) {
		a->queue_groups++;
		a->queues += g->nr;
		snvme_group_destroy(f, g);
	}
}

/*
 * SNVME_REVOKE_OTHERS: every open file of the controller but self, under
 * files_lock (no open or close meanwhile), each under its own lock. No one
 * holds an f->lock while touching user memory (the lock order at the top),
 * so each wait here is bounded by admin commands' deadlines.
 */
static int snvme_ioc_revoke_others(struct snvme_file *self, struct snvme_revoke *a)
{
	struct snvme_ctrl *ctrl = self->ctrl;
	struct snvme_file *f;
	bool sealed;

	/*
	 * The controller is the host's, so the initial user namespace's
	 * CAP_SYS_ADMIN, both at open (file_ns_capable: the opener's
	 * credentials) and now (a descriptor passed to a process without it,
	 * as a lease is, or kept after dropping it, does not carry it).
	 */
	if (!file_ns_capable(self->filp, &init_user_ns, CAP_SYS_ADMIN) ||
	    !capable(CAP_SYS_ADMIN)) {
		dev_err_ratelimited(ctrl->dev, "REVOKE of the other files: needs CAP_SYS_ADMIN, at open and now\n");
		return -EPERM;
	}
	mutex_lock(&self->lock);
	sealed = self->sealed;
	mutex_unlock(&self->lock);
	if (sealed) {
		dev_err_ratelimited(ctrl->dev, "REVOKE of the other files: refused on a sealed file\n");
		return -EPERM;
	}
	mutex_lock(&ctrl->files_lock);
	list_for_each_entry(f, &ctrl->files, node) {
		if (f == self)
			continue;
		mutex_lock(&f->lock);
		if (!f->torn_down)
			snvme_file_revoke(f, a);
		mutex_unlock(&f->lock);
	}
	mutex_unlock(&ctrl->files_lock);
	if (a->files)
		dev_info(ctrl->dev, "REVOKE: %u other open file(s) of /dev/snvme%d revoked, %u queue group(s) of %u queue pair(s) deleted\n",
			 a->files, ctrl->instance, a->queue_groups, a->queues);
	return 0;
}

static int snvme_open(struct inode *inode, struct file *filp)
{
	struct snvme_ctrl *ctrl = container_of(inode->i_cdev, struct snvme_ctrl, cdev);
	struct snvme_status *st;
	struct snvme_file *f;
	int ret = 0;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->status_page = alloc_page(GFP_KERNEL | __GFP_ZERO);
	f->sink_page = alloc_page(GFP_KERNEL);
	if (!f->status_page || !f->sink_page) {
		if (f->status_page)
			__free_page(f->status_page);
		if (f->sink_page)
			__free_page(f->sink_page);
		kfree(f);
		return -ENOMEM;
	}
	/* What a controller that is gone reads: all ones. */
	memset(page_address(f->sink_page), 0xff, PAGE_SIZE);
	init_rwsem(&f->map_sem);
	st = page_address(f->status_page);
	st->csts = NVME_CSTS_RDY;
	down_read(&ctrl->lifecycle);
	if (ctrl->dead || READ_ONCE(ctrl->failed)) {
		ret = -ENODEV;
		goto out;
	}
	kref_get(&ctrl->ref);
	f->ctrl = ctrl;
	f->filp = filp;
	mutex_init(&f->lock);
	idr_init(&f->groups);
	idr_init(&f->maps);
	xa_init(&f->frozen);
	mutex_lock(&ctrl->files_lock);
	spin_lock(&ctrl->files_spin);
	list_add(&f->node, &ctrl->files);
	/* A failure after the check above: its revocation may have missed us. */
	if (READ_ONCE(ctrl->failed))
		snvme_status_revoke(f, SNVME_REVOKED_FAILED);
	spin_unlock(&ctrl->files_spin);
	mutex_unlock(&ctrl->files_lock);
	filp->private_data = f;
out:
	up_read(&ctrl->lifecycle);
	if (ret) {
		__free_page(f->status_page);
		__free_page(f->sink_page);
		kfree(f);
	}
	return ret;
}

static int snvme_release(struct inode *inode, struct file *filp)
{
	struct snvme_file *f = filp->private_data;
	struct snvme_ctrl *ctrl = f->ctrl;
	LIST_HEAD(later);

	mutex_lock(&ctrl->files_lock);
	spin_lock(&ctrl->files_spin);
	list_del(&f->node);
	spin_unlock(&ctrl->files_spin);
	mutex_lock(&f->lock);
	if (!f->torn_down)
		snvme_file_teardown(f, &later);
	mutex_unlock(&f->lock);
	mutex_unlock(&ctrl->files_lock);
	snvme_dmamap_put_list(ctrl, &later);
	idr_destroy(&f->groups);
	idr_destroy(&f->maps);
	/* Its mappings are gone: release runs after the last munmap. */
	snvme_free_frozen(f);
	__free_page(f->status_page);
	kfree(f);
	snvme_ctrl_put(ctrl);
	return 0;
}

static void snvme_fill_info(struct snvme_ctrl *ctrl, struct snvme_info *in)
{
	int i;

	memset(in, 0, sizeof(*in));
	in->hdr.abi_version = SNVME_ABI_VERSION;
	in->hdr.argsz = sizeof(*in);
	in->caps = SNVME_CAP_QUEUE_GROUPS | SNVME_CAP_DMA_HOST | SNVME_CAP_IDENTIFY |
		   SNVME_CAP_ABORT | SNVME_CAP_STATUS | SNVME_CAP_SEAL | SNVME_CAP_REVOKE;
	if (IS_ENABLED(SNVME_HAVE_NV_P2P))
		in->caps |= SNVME_CAP_DMA_GPU;
	if (device_iommu_mapped(ctrl->dev))
		in->caps |= SNVME_CAP_IOMMU;
	if (ctrl->sgls & 0x3)	/* SGLS bits 1:0: SGLs supported */
		in->caps |= SNVME_CAP_SGL;
	if (ctrl->vwc)
		in->caps |= SNVME_CAP_VWC;
	in->cap = ctrl->cap;
	in->vs = ctrl->vs;
	in->instance = ctrl->instance;
	in->vid = ctrl->vid;
	in->ssvid = ctrl->ssvid;
	in->max_queue_entries = NVME_CAP_MQES(ctrl->cap) + 1;
	in->doorbell_stride = ctrl->db_stride;
	in->doorbell_bytes = ctrl->db_bytes;
	in->page_size = SNVME_NVME_PAGE;
	in->max_transfer = ctrl->max_xfer;
	in->sgls = ctrl->sgls;
	in->nn = ctrl->nn;
	memcpy(in->serial, ctrl->serial, sizeof(in->serial));
	memcpy(in->model, ctrl->model, sizeof(in->model));
	memcpy(in->firmware, ctrl->firmware, sizeof(in->firmware));
	in->kernel_queues = ctrl->kernel_queues;
	in->user_qid_first = ctrl->user_qid_first;
	in->user_queues = ctrl->user_queues;
	in->user_queues_free = snvme_user_queues_free(ctrl);
	in->max_group_queues = SNVME_MAX_GROUP_QUEUES;
	in->pinned_pages = atomic64_read(&ctrl->cnt.pinned_pages);
	in->dma_maps = atomic_read(&ctrl->cnt.dma_maps);
	in->queue_groups = atomic_read(&ctrl->cnt.queue_groups);
	in->nr_namespaces = ctrl->nr_ns;
	for (i = 0; i < ctrl->nr_ns; i++) {
		struct snvme_ns *ns = ctrl->ns[i];
		struct snvme_ns_info *ni = &in->ns[i];

		ni->nsid = ns->nsid;
		ni->flbas_index = ns->flbas_index;
		ni->nlbaf = ns->nlbaf;
		ni->lba_shift = ns->lba_shift;
		ni->nsze = ns->nsze;
		ni->ncap = ns->ncap;
		memcpy(ni->lbaf, ns->lbaf, sizeof(ni->lbaf));
	}
}

union snvme_ioc_arg {
	struct snvme_hdr hdr;
	struct snvme_info info;
	struct snvme_queue_group group;
	struct snvme_group_id gid;
	struct snvme_dma_map map;
	struct snvme_dma_unmap unmap;
	struct snvme_identify identify;
	struct snvme_abort abort;
	struct snvme_seal seal;
	struct snvme_revoke revoke;
};

/*
 * The ioctls that make or give back what the controller or the file holds
 * need a file opened for writing. GET_INFO and IDENTIFY only read. REVOKE
 * only ends things: of this file, or (CAP_SYS_ADMIN at open and now) of the
 * others, which tuttid does through the file it holds its flock on, opened
 * read-only.
 */
static bool snvme_ioc_needs_write(unsigned int cmd)
{
	return cmd != SNVME_IOC_GET_INFO && cmd != SNVME_IOC_IDENTIFY && cmd != SNVME_IOC_REVOKE;
}

/* Undoes a queue group or DMA map whose handle could not be copied out. */
static void snvme_undo(struct snvme_file *f, unsigned int cmd, const struct snvme_made *made)
{
	struct snvme_ctrl *ctrl = f->ctrl;
	struct snvme_qgroup *g;
	struct snvme_dmamap *m;
	LIST_HEAD(later);

	down_read(&ctrl->lifecycle);
	mutex_lock(&f->lock);
	if (f->torn_down) {
		/* remove() released it already. */
	} else if (cmd == SNVME_IOC_CREATE_QUEUE_GROUP) {
		g = idr_find(&f->groups, made->id);
		if (g && g->serial == made->serial)
			snvme_group_destroy(f, g);
	} else {
		m = idr_find(&f->maps, made->id);
		if (m && m->serial == made->serial)
			snvme_dmamap_release(f, m, &later);
	}
	mutex_unlock(&f->lock);
	up_read(&ctrl->lifecycle);
	snvme_dmamap_put_list(ctrl, &later);
}

/*
 * Copies an ioctl's results to userspace, with no lock held (the lock
 * order at the top). A handle the caller cannot learn is undone.
 */
static int snvme_copy_out(struct snvme_file *f, unsigned int cmd, void __user *uarg,
			  const union snvme_ioc_arg *a, unsigned int size,
			  const struct snvme_made *made)
{
	if (made->identify &&
	    copy_to_user(u64_to_user_ptr(a->identify.data), made->identify, SNVME_IDENTIFY_BYTES))
		return -EFAULT;
	if (made->addrs &&
	    copy_to_user(u64_to_user_ptr(a->map.bus_addrs), made->addrs,
			 (u64)a->map.nr_pages * sizeof(u64)))
		goto undo;
	if ((_IOC_DIR(cmd) & _IOC_READ) && copy_to_user(uarg, a, size))
		goto undo;
	return 0;
undo:
	if (made->id)
		snvme_undo(f, cmd, made);
	return -EFAULT;
}

static long snvme_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct snvme_file *f = filp->private_data;
	struct snvme_ctrl *ctrl = f->ctrl;
	void __user *uarg = (void __user *)arg;
	unsigned int size = _IOC_SIZE(cmd);
	struct snvme_made made = { };
	union snvme_ioc_arg *a;
	LIST_HEAD(later);
	long ret;

	switch (cmd) {
	case SNVME_IOC_GET_INFO:
	case SNVME_IOC_CREATE_QUEUE_GROUP:
	case SNVME_IOC_DESTROY_QUEUE_GROUP:
	case SNVME_IOC_DMA_MAP:
	case SNVME_IOC_DMA_UNMAP:
	case SNVME_IOC_IDENTIFY:
	case SNVME_IOC_ABORT:
	case SNVME_IOC_SEAL:
	case SNVME_IOC_REVOKE:
		break;
	default:
		/* Also a known command with the wrong size (another ABI). */
		return -ENOTTY;
	}
	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	if (copy_from_user(a, uarg, size)) {
		ret = -EFAULT;
		goto free;
	}
	if (a->hdr.abi_version != SNVME_ABI_VERSION) {
		dev_err_ratelimited(ctrl->dev, "ioctl 0x%x: abi_version %u unsupported (driver speaks %u)\n",
				    cmd, a->hdr.abi_version, SNVME_ABI_VERSION);
		ret = -EPROTO;
		goto free;
	}
	if (a->hdr.argsz != size) {
		dev_err_ratelimited(ctrl->dev, "ioctl 0x%x: argsz %u, expected %u\n",
				    cmd, a->hdr.argsz, size);
		ret = -EINVAL;
		goto free;
	}
	if (snvme_ioc_needs_write(cmd) && !(filp->f_mode & FMODE_WRITE)) {
		dev_err_ratelimited(ctrl->dev, "ioctl 0x%x: needs the file open for writing\n", cmd);
		ret = -EBADF;
		goto free;
	}
	if (cmd == SNVME_IOC_REVOKE) {
		struct snvme_revoke *r = &a->revoke;

		if (r->scope > SNVME_REVOKE_OTHERS || r->flags || r->pad0) {
			dev_err_ratelimited(ctrl->dev, "REVOKE: scope %u (must be %u or %u), flags 0x%x and pad0 0x%x (both must be 0)\n",
					    r->scope, SNVME_REVOKE_FILE, SNVME_REVOKE_OTHERS, r->flags, r->pad0);
			ret = -EINVAL;
			goto free;
		}
		r->files = r->queue_groups = r->queues = 0;
	}
	if (cmd == SNVME_IOC_DMA_MAP) {
		/* Pins user memory: takes its locks itself, around the pin. */
		ret = snvme_ioc_dma_map(f, &a->map, &made);
		goto out;
	}
	down_read(&ctrl->lifecycle);
	ret = snvme_file_usable(f);
	/* A file a reset revoked may be revoked for good: that frees its QIDs. */
	if (ret == -ESTALE && cmd == SNVME_IOC_REVOKE)
		ret = 0;
	if (ret)
		goto unlock;
	if (cmd == SNVME_IOC_REVOKE && a->revoke.scope == SNVME_REVOKE_OTHERS) {
		ret = snvme_ioc_revoke_others(f, &a->revoke);
		goto unlock;
	}
	mutex_lock(&f->lock);
	switch (cmd) {
	case SNVME_IOC_GET_INFO:
		snvme_fill_info(ctrl, &a->info);
		ret = 0;
		break;
	case SNVME_IOC_CREATE_QUEUE_GROUP:
		ret = snvme_ioc_create_group(f, &a->group, &made);
		break;
	case SNVME_IOC_DESTROY_QUEUE_GROUP: {
		struct snvme_qgroup *g = idr_find(&f->groups, a->gid.group_id);

		ret = g ? 0 : -ENOENT;
		if (g)
			snvme_group_destroy(f, g);
		break;
	}
	case SNVME_IOC_DMA_UNMAP: {
		struct snvme_dmamap *m = idr_find(&f->maps, a->unmap.map_id);

		ret = m ? 0 : -ENOENT;
		if (m)
			snvme_dmamap_release(f, m, &later);
		break;
	}
	case SNVME_IOC_IDENTIFY:
		ret = snvme_ioc_identify(f, &a->identify, &made);
		break;
	case SNVME_IOC_ABORT:
		ret = snvme_ioc_abort(f, &a->abort);
		break;
	case SNVME_IOC_SEAL:
		ret = snvme_ioc_seal(f, &a->seal);
		break;
	case SNVME_IOC_REVOKE:
		snvme_file_revoke(f, &a->revoke);
		ret = 0;
		break;
	}
	mutex_unlock(&f->lock);
unlock:
	up_read(&ctrl->lifecycle);
out:
	snvme_dmamap_put_list(ctrl, &later);
	if (!ret)
		ret = snvme_copy_out(f, cmd, uarg, a, size, &made);
	kvfree(made.addrs);
	kfree(made.identify);
free:
	kfree(a);
	return ret;
}

/*
 * The page frame of the ring page at file offset off, if the group a ring
 * VMA was mapped from (its serial, in vm_private_data) still holds that
 * ring; with map_sem held. The serial keeps a mapping of a destroyed group
 * from reaching a later group's ring at the same offset (QIDs are reused).
 * The rings are coherent allocations: in the linear map, or pages vmapped
 * by the IOMMU's allocator.
 */
static bool snvme_ring_pfn(struct snvme_file *f, struct vm_area_struct *vma, u64 off,
			   unsigned long *pfn)
{
	struct snvme_qgroup *g;
	const void *va;
	int id, i;

	idr_for_each_entry(&f->groups, g, id) {
		if ((unsigned long)g->serial != (unsigned long)vma->vm_private_data)
			continue;
		for (i = 0; i < g->nr; i++) {
			struct snvme_uq *uq = &g->q[i];
			u64 sq = snvme_sq_offset(uq->qid), cq = snvme_cq_offset(uq->qid);

			if (off >= sq && off < sq + uq->sq_bytes)
				va = uq->sq + (off - sq);
			else if (off >= cq && off < cq + uq->cq_bytes)
				va = uq->cq + (off - cq);
			else
				continue;
			*pfn = is_vmalloc_addr(va) ? vmalloc_to_pfn(va) :
						     page_to_pfn(virt_to_page(va));
			return true;
		}
	}
	return false;
}

/*
 * Every mapping but the status page is filled in here, page by page, as
 * vfio-pci maps BARs: the doorbell window gets the real doorbells while the
 * file is live and its sink page once it has stand-ins or the controller is
 * gone; a ring gets its pages while its group is in f->groups, then its
 * stand-in (REVOKE, removal: snvme_freeze), or SIGBUS after
 * DESTROY_QUEUE_GROUP (the process asked for it).
 *
 * Why no page table entry outlives a ring: ->mmap installs none, so every
 * entry of a ring page is made here, with map_sem held for reading and the
 * ring found in f->groups. A fault runs on a VMA the kernel has already
 * linked into the file's address_space (it does so under the mmap lock held
 * for writing, before any fault can see the VMA), so the unmap_mapping_range
 * of snvme_group_destroy, which comes after the group left f->groups with
 * map_sem held for writing, finds every entry a fault made before that, and
 * every fault after it finds no ring. Only then are the rings freed. (Once
 * ->mmap itself mapped the rings, and a destroy or REVOKE between ->mmap
 * and that linking freed them under a VMA the zap could not see.)
 */
static vm_fault_t snvme_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct snvme_file *f = vma->vm_file->private_data;
	struct snvme_ctrl *ctrl = f->ctrl;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	unsigned long pfn;
	struct page *p;

	down_read(&f->map_sem);
	p = xa_load(&f->frozen, vmf->pgoff);
	if (p) {
		ret = vmf_insert_pfn(vma, vmf->address, page_to_pfn(p));
	} else if (vma->vm_pgoff == SNVME_MMAP_DOORBELLS >> PAGE_SHIFT) {
		/* snvme_mmap maps the doorbell window only whole, at its offset. */
		unsigned long page = vmf->pgoff - vma->vm_pgoff;
		phys_addr_t db = pci_resource_start(ctrl->pdev, 0) + SNVME_DB_OFFSET;

		if (f->stand_ins || READ_ONCE(ctrl->dead))
			pfn = page_to_pfn(f->sink_page);
		else
			pfn = (db >> PAGE_SHIFT) + page;
		if (page < (ctrl->db_bytes >> PAGE_SHIFT))
			ret = vmf_insert_pfn(vma, vmf->address, pfn);
	} else if (snvme_ring_pfn(f, vma, (u64)vmf->pgoff << PAGE_SHIFT, &pfn)) {
		ret = vmf_insert_pfn(vma, vmf->address, pfn);
	}
	up_read(&f->map_sem);
	return ret;
}

static const struct vm_operations_struct snvme_vm_ops = {
	.fault = snvme_vm_fault,
};

/*
 * The kernel calls ->mmap with the caller's mmap lock held for writing, so
 * it takes neither lifecycle nor f->lock (the lock order at the top), only
 * map_sem for reading, as the fault handler does under the mmap lock too.
 * Whether the file is usable is read without lifecycle, after map_sem is
 * taken; a revocation that comes after the check does no more harm here
 * than to the mappings the file already has:
 *  - the status page is the file's for its whole life;
 *  - the doorbell window and the rings map nothing here: their faults
 *    choose under map_sem (snvme_vm_fault), and REVOKE and removal set
 *    stand_ins, take groups out of f->groups and store the rings' copies
 *    with map_sem held for writing (after publishing revoked, so a check
 *    after that reads it);
 *  - a ring VMA records which group it maps (its serial), found in
 *    f->groups under map_sem: a destroy after that leaves it faulting into
 *    the copy or SIGBUS, never into freed memory or a later group's ring;
 *    a reset keeps the rings of a file it revoked in f->groups anyway.
 * Every refusal is what it was with lifecycle held: ENODEV once the
 * controller is gone or failed, ESTALE once the file is revoked.
 */
static int snvme_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct snvme_file *f = filp->private_data;
	struct snvme_ctrl *ctrl = f->ctrl;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	unsigned long len = vma->vm_end - vma->vm_start;
	struct snvme_qgroup *g;
	int ret = -EINVAL, id, i;

	if (!(vma->vm_flags & VM_SHARED)) {
		dev_err_ratelimited(ctrl->dev, "mmap: MAP_SHARED required\n");
		return -EINVAL;
	}
	down_read(&f->map_sem);
	ret = snvme_file_usable(f);
	if (ret)
		goto out;
	ret = -EINVAL;
	vma->vm_ops = &snvme_vm_ops;
	vm_flags_set(vma, VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP);
	if (off == SNVME_MMAP_STATUS) {
		/* The file's own page, read-only: it outlives the controller. */
		if (len != SNVME_STATUS_BYTES || (vma->vm_flags & VM_WRITE)) {
			dev_err_ratelimited(ctrl->dev, "mmap: the status page is %u bytes and read-only\n",
					    SNVME_STATUS_BYTES);
			goto out;
		}
		vm_flags_clear(vma, VM_MAYWRITE);
		ret = vm_insert_page(vma, vma->vm_start, f->status_page);
		goto out;
	}
	if (off == SNVME_MMAP_DOORBELLS) {
		if (!ctrl->db_bytes || len != ctrl->db_bytes) {
			dev_err_ratelimited(ctrl->dev, "mmap: doorbell window is %u bytes, asked %lu\n",
					    ctrl->db_bytes, len);
			goto out;
		}
		/* Faulted in page by page (snvme_vm_fault), uncached. */
		vm_flags_set(vma, VM_IO | VM_PFNMAP);
		vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
		ret = 0;
		goto out;
	}
	idr_for_each_entry(&f->groups, g, id) {
		for (i = 0; i < g->nr; i++) {
			struct snvme_uq *uq = &g->q[i];
			bool is_sq = off == snvme_sq_offset(uq->qid);
			bool is_cq = off == snvme_cq_offset(uq->qid);
			u32 bytes = is_sq ? uq->sq_bytes : uq->cq_bytes;

			if (!is_sq && !is_cq)
				continue;
			if (len != bytes) {
				dev_err_ratelimited(ctrl->dev, "mmap: ring at 0x%llx is %u bytes, asked %lu\n",
						    off, bytes, len);
				goto out;
			}
			/* Faulted in page by page (snvme_vm_fault), cached like the ring. */
			vm_flags_set(vma, VM_IO | VM_PFNMAP);
			vma->vm_private_data = (void *)(unsigned long)g->serial;
			ret = 0;
			goto out;
		}
	}
	dev_err_ratelimited(ctrl->dev, "mmap: no ring of this file at offset 0x%llx\n", off);
out:
	up_read(&f->map_sem);
	return ret;
}

/*
 * EPOLLPRI | EPOLLERR once the file is revoked (the hook of a lease broker:
 * revoke the clients' leases, close, open again), plus EPOLLHUP when the
 * controller failed or is gone, which no new open can cure.
 */
static __poll_t snvme_poll(struct file *filp, poll_table *wait)
{
	struct snvme_file *f = filp->private_data;
	__poll_t mask = 0;
	u32 why;

	poll_wait(filp, &f->ctrl->revoke_wait, wait);
	why = READ_ONCE(f->revoked);
	if (why)
		mask |= EPOLLPRI | EPOLLERR;
	if (why == SNVME_REVOKED_FAILED || why == SNVME_REVOKED_REMOVED)
		mask |= EPOLLHUP;
	return mask;
}

static const struct file_operations snvme_fops = {
	.owner = THIS_MODULE,
	.open = snvme_open,
	.release = snvme_release,
	.unlocked_ioctl = snvme_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = snvme_mmap,
	.poll = snvme_poll,
	.llseek = noop_llseek,
};

/* ---- per-controller node ------------------------------------------------ */

static void snvme_cdev_dev_release(struct device *dev)
{
	struct snvme_ctrl *ctrl = container_of(dev, struct snvme_ctrl, cdev_dev);

	snvme_ctrl_put(ctrl);
}

int snvme_chr_add(struct snvme_ctrl *ctrl)
{
	int ret;

	cdev_init(&ctrl->cdev, &snvme_fops);
	ctrl->cdev.owner = THIS_MODULE;
	device_initialize(&ctrl->cdev_dev);
	kref_get(&ctrl->ref);	/* dropped by snvme_cdev_dev_release */
	ctrl->cdev_dev.devt = MKDEV(MAJOR(snvme_devt), ctrl->instance);
	ctrl->cdev_dev.class = snvme_class;
	ctrl->cdev_dev.parent = ctrl->dev;
	ctrl->cdev_dev.release = snvme_cdev_dev_release;
	ret = dev_set_name(&ctrl->cdev_dev, SNVME_NAME "%d", ctrl->instance);
	if (!ret)
		ret = cdev_device_add(&ctrl->cdev, &ctrl->cdev_dev);
	if (ret) {
		put_device(&ctrl->cdev_dev);
		return ret;
	}
	ctrl->cdev_added = true;
	return 0;
}

/*
 * Called from remove() with the controller still running: stops new
 * opens and ioctls, then tears down every open file's queues and pins.
 */
void snvme_chr_remove(struct snvme_ctrl *ctrl)
{
	struct snvme_file *f;
	LIST_HEAD(later);

	down_write(&ctrl->lifecycle);
	WRITE_ONCE(ctrl->dead, true);
	up_write(&ctrl->lifecycle);
	if (!ctrl->cdev_added)
		return;
	snvme_chr_revoke(ctrl, SNVME_REVOKED_REMOVED);
	cdev_device_del(&ctrl->cdev, &ctrl->cdev_dev);
	mutex_lock(&ctrl->files_lock);
	list_for_each_entry(f, &ctrl->files, node) {
		mutex_lock(&f->lock);
		if (!f->torn_down)
			snvme_file_teardown(f, &later);
		mutex_unlock(&f->lock);
	}
	mutex_unlock(&ctrl->files_lock);
	snvme_dmamap_put_list(ctrl, &later);
	ctrl->cdev_added = false;
	put_device(&ctrl->cdev_dev);
}

static char *snvme_devnode(SNVME_DEVNODE_CONST struct device *dev, umode_t *mode)
{
	if (mode)
		*mode = 0600;	/* queue holders can address every LBA */
	return NULL;
}

int snvme_chr_module_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&snvme_devt, 0, SNVME_MAX_CTRLS, SNVME_NAME);
	if (ret)
		return ret;
	snvme_class = snvme_class_create(SNVME_NAME);
	if (IS_ERR(snvme_class)) {
		unregister_chrdev_region(snvme_devt, SNVME_MAX_CTRLS);
		return PTR_ERR(snvme_class);
	}
	snvme_class->devnode = snvme_devnode;
	return 0;
}

void snvme_chr_module_exit(void)
{
	class_destroy(snvme_class);
	unregister_chrdev_region(snvme_devt, SNVME_MAX_CTRLS);
}
