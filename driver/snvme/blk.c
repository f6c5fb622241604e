// SPDX-License-Identifier: GPL-2.0
/*
 * snvme block devices: one blk-mq disk per namespace on the kernel's I/O
 * queues (QIDs 1..kernel_queues). Read, Write (with FUA) and Flush, and the
 * timeout ladder of Linux's nvme_timeout: poll, Abort, reset, fail.
 */
#include <linux/dmapool.h>
#include <linux/interrupt.h>
#include <linux/scatterlist.h>

#include "compat.h"
#include "snvme.h"

/* Per-request driver data (blk_mq_rq_to_pdu). */
struct snvme_iod {
	struct snvme_queue *q;
	u16 status;			/* NVMe status field: DNR, More, SCT << 8 | SC */
	u8 gen;				/* CID generation, 4 bits used */
	u8 retries;			/* times requeued (set while RQF_DONTPREP) */
	bool aborted;			/* this attempt's Abort was sent */
	int nents;			/* mapped sg entries, 0 = none */
	__le64 *prp_list;
	dma_addr_t prp_dma;
	struct scatterlist sg[SNVME_MAX_SEGS];
};

static struct dma_pool *snvme_prp_pool(struct snvme_ctrl *ctrl)
{
	return ctrl->prp_pool;
}

static blk_status_t snvme_status_to_blk(u16 status)
{
	switch (status & 0x7ff) {
	case NVME_SC_SUCCESS:
		return BLK_STS_OK;
	case NVME_SC_LBA_RANGE:
	case NVME_SC_CAP_EXCEEDED:
		return BLK_STS_NOSPC;
	case NVME_SC_INVALID_OPCODE:
	case NVME_SC_INVALID_FIELD:
		return BLK_STS_NOTSUPP;
	case NVME_SC_ABORT_REQ:
		return BLK_STS_IOERR;
	default:
		return BLK_STS_IOERR;
	}
}

/*
 * Builds PRP1/PRP2 and, for more than two pages, one PRP list page
 * (NVMe Base Spec 2.0, 4.3.1). The queue limits (virt boundary 4 KiB,
 * at most SNVME_MAX_KERNEL_XFER bytes) guarantee one list page suffices.
 */
static blk_status_t snvme_setup_prps(struct snvme_ctrl *ctrl, struct request *rq,
				     struct snvme_iod *iod, struct nvme_command *cmd)
{
	const int page = SNVME_NVME_PAGE;
	struct scatterlist *sg = iod->sg;
	int length = blk_rq_payload_bytes(rq);
	u64 dma_addr = sg_dma_address(sg);
	int dma_len = sg_dma_len(sg);
	int offset = dma_addr & (page - 1);
	int i = 0;

	cmd->rw.dptr.prp1 = cpu_to_le64(dma_addr);
	length -= page - offset;
	if (length <= 0)
		return BLK_STS_OK;
	dma_len -= page - offset;
	if (dma_len) {
		dma_addr += page - offset;
	} else {
		sg = sg_next(sg);
		dma_addr = sg_dma_address(sg);
		dma_len = sg_dma_len(sg);
	}
	if (length <= page) {
		cmd->rw.dptr.prp2 = cpu_to_le64(dma_addr);
		return BLK_STS_OK;
	}
	iod->prp_list = dma_pool_alloc(snvme_prp_pool(ctrl), GFP_ATOMIC, &iod->prp_dma);
	if (!iod->prp_list)
		return BLK_STS_RESOURCE;
	cmd->rw.dptr.prp2 = cpu_to_le64(iod->prp_dma);
	for (;;) {
		if (WARN_ON_ONCE(i >= page / 8))
			return BLK_STS_IOERR;
		iod->prp_list[i++] = cpu_to_le64(dma_addr);
		dma_len -= page;
		dma_addr += page;
		length -= page;
		if (length <= 0)
			break;
		if (dma_len > 0)
			continue;
		if (WARN_ON_ONCE(dma_len < 0))
			return BLK_STS_IOERR;
		sg = sg_next(sg);
		dma_addr = sg_dma_address(sg);
		dma_len = sg_dma_len(sg);
	}
	return BLK_STS_OK;
}

static void snvme_unmap_data(struct snvme_ctrl *ctrl, struct request *rq)
{
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);

	if (iod->prp_list) {
		dma_pool_free(snvme_prp_pool(ctrl), iod->prp_list, iod->prp_dma);
		iod->prp_list = NULL;
	}
	if (iod->nents) {
		dma_unmap_sg(ctrl->dev, iod->sg, iod->nents, rq_dma_dir(rq));
		iod->nents = 0;
	}
}

static blk_status_t snvme_map_data(struct snvme_ctrl *ctrl, struct request *rq,
				   struct nvme_command *cmd)
{
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);
	int nents;
	blk_status_t st;

	sg_init_table(iod->sg, SNVME_MAX_SEGS);
	nents = blk_rq_map_sg(rq->q, rq, iod->sg);
	if (!nents)
		return BLK_STS_IOERR;
	iod->nents = dma_map_sg_attrs(ctrl->dev, iod->sg, nents, rq_dma_dir(rq),
				      DMA_ATTR_NO_WARN);
	if (!iod->nents)
		return BLK_STS_RESOURCE;
	/* dma_unmap_sg takes the original count. */
	st = snvme_setup_prps(ctrl, rq, iod, cmd);
	iod->nents = nents;
	if (st)
		snvme_unmap_data(ctrl, rq);
	return st;
}

/*
 * Copies one SQE into the ring. The tail doorbell is written only for the
 * last request of a batch (bd->last) or from commit_rqs: one MMIO write per
 * batch instead of one per command.
 */
static void snvme_submit(struct snvme_queue *q, struct nvme_command *cmd, bool last)
{
	unsigned long flags;

	spin_lock_irqsave(&q->sq_lock, flags);
	memcpy(&q->sqes[q->sq_tail], cmd, sizeof(*cmd));
	if (++q->sq_tail == q->depth)
		q->sq_tail = 0;
	if (last && q->sq_tail != q->last_sq_tail) {
		/* writel orders the SQE stores before the doorbell store. */
		writel(q->sq_tail, q->sq_db);
		q->last_sq_tail = q->sq_tail;
	}
	spin_unlock_irqrestore(&q->sq_lock, flags);
}

static void snvme_commit_rqs(struct blk_mq_hw_ctx *hctx)
{
	struct snvme_queue *q = hctx->driver_data;
	unsigned long flags;

	spin_lock_irqsave(&q->sq_lock, flags);
	if (q->sq_tail != q->last_sq_tail) {
		writel(q->sq_tail, q->sq_db);
		q->last_sq_tail = q->sq_tail;
	}
	spin_unlock_irqrestore(&q->sq_lock, flags);
}

static blk_status_t snvme_queue_rq(struct blk_mq_hw_ctx *hctx,
				   const struct blk_mq_queue_data *bd)
{
	struct snvme_ns *ns = hctx->queue->queuedata;
	struct snvme_ctrl *ctrl = ns->ctrl;
	struct snvme_queue *q = hctx->driver_data;
	struct request *rq = bd->rq;
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);
	struct nvme_command cmd = { };
	blk_status_t st;

	if (unlikely(READ_ONCE(ctrl->failed)))
		return BLK_STS_IOERR;
	/* A requeued request keeps RQF_DONTPREP, and with it its retry count. */
	if (!(rq->rq_flags & RQF_DONTPREP)) {
		iod->retries = 0;
		rq->rq_flags |= RQF_DONTPREP;
	}
	iod->aborted = false;
	iod->q = q;
	iod->status = 0;
	iod->nents = 0;
	iod->prp_list = NULL;
	switch (req_op(rq)) {
	case REQ_OP_FLUSH:
		cmd.common.opcode = nvme_cmd_flush;
		cmd.common.nsid = cpu_to_le32(ns->nsid);
		break;
	case REQ_OP_READ:
	case REQ_OP_WRITE:
		cmd.rw.opcode = req_op(rq) == REQ_OP_READ ? nvme_cmd_read : nvme_cmd_write;
		cmd.rw.nsid = cpu_to_le32(ns->nsid);
		cmd.rw.slba = cpu_to_le64(blk_rq_pos(rq) >> (ns->lba_shift - SECTOR_SHIFT));
		/* NLB is 0's based. */
		cmd.rw.length = cpu_to_le16((blk_rq_bytes(rq) >> ns->lba_shift) - 1);
		if (rq->cmd_flags & REQ_FUA)
			cmd.rw.control = cpu_to_le16(NVME_RW_FUA);
		st = snvme_map_data(ctrl, rq, &cmd);
		if (st)
			return st;
		break;
	default:
		return BLK_STS_NOTSUPP;
	}
	iod->gen = (iod->gen + 1) & 0xf;
	cmd.common.command_id = (iod->gen << SNVME_CID_TAG_BITS) | rq->tag;
	blk_mq_start_request(rq);
	snvme_submit(q, &cmd, bd->last);
	return BLK_STS_OK;
}

/*
 * A request that our own recovery ended, and that may run again: the reset
 * cancelled it (Host Aborted Command, set by snvme_cancel_rq) or our Abort
 * did (Command Abort Requested, without DNR), within max_retries, on a
 * controller that still works, and not marked fail-fast by its submitter.
 */
static bool snvme_should_retry(struct snvme_ctrl *ctrl, struct request *rq)
{
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);
	u16 sc = iod->status & 0x7ff;

	if (sc != NVME_SC_HOST_ABORTED_CMD && sc != NVME_SC_ABORT_REQ)
		return false;
	return !(iod->status & NVME_STATUS_DNR) && !READ_ONCE(ctrl->failed) &&
	       !blk_noretry_request(rq) && iod->retries < snvme_max_retries;
}

static void snvme_complete_rq(struct request *rq)
{
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);
	struct snvme_ctrl *ctrl = iod->q->ctrl;
	u16 sc = iod->status & 0x7ff;

	/* The command is over (completed, aborted, or the controller disabled). */
	snvme_unmap_data(ctrl, rq);
	if (unlikely(sc == NVME_SC_HOST_ABORTED_CMD || sc == NVME_SC_ABORT_REQ)) {
		if (snvme_should_retry(ctrl, rq)) {
			iod->retries++;
			atomic_inc(&ctrl->recovery.retries);
			/* Dispatched again once the queue runs (after the reset). */
			blk_mq_requeue_request(rq, true);
			return;
		}
		atomic_inc(&ctrl->recovery.failed_requests);
		dev_err_ratelimited(ctrl->dev, "QID %u tag %u: %s, %u retries spent: I/O error\n",
				    iod->q->qid, rq->tag,
				    READ_ONCE(ctrl->failed) ? "controller failed" :
				    sc == NVME_SC_ABORT_REQ ? "aborted" : "ended by a reset",
				    iod->retries);
	}
	blk_mq_end_request(rq, snvme_status_to_blk(iod->status));
}

static void snvme_handle_cqe(struct snvme_queue *q, struct nvme_completion *cqe)
{
	struct snvme_ctrl *ctrl = q->ctrl;
	u16 cid = cqe->command_id;
	u16 tag = cid & ((1 << SNVME_CID_TAG_BITS) - 1);
	struct request *rq;
	struct snvme_iod *iod;

	rq = blk_mq_tag_to_rq(ctrl->tagset.tags[q->qid - 1], tag);
	if (unlikely(!rq)) {
		dev_warn(ctrl->dev, "QID %u: completion for unknown CID 0x%x\n", q->qid, cid);
		return;
	}
	iod = blk_mq_rq_to_pdu(rq);
	if (unlikely((cid >> SNVME_CID_TAG_BITS) != iod->gen)) {
		dev_warn(ctrl->dev, "QID %u: stale completion, CID 0x%x generation %u, expected %u\n",
			 q->qid, cid, cid >> SNVME_CID_TAG_BITS, iod->gen);
		return;
	}
#ifdef SNVME_FAULT_INJECTION
	if (unlikely(atomic_dec_if_positive(&ctrl->inject_drop_cqes) >= 0)) {
		dev_warn(ctrl->dev, "QID %u CID 0x%x: completion dropped (fault injection)\n",
			 q->qid, cid);
		return;
	}
#endif
	iod->status = le16_to_cpu(cqe->status) >> 1;
	if (unlikely(iod->status))
		dev_dbg(ctrl->dev, "QID %u CID 0x%x: status 0x%x\n", q->qid, cid, iod->status);
	if (!blk_mq_complete_request_remote(rq))
		snvme_complete_rq(rq);
}

static bool snvme_cqe_pending(struct snvme_queue *q)
{
	return (le16_to_cpu(READ_ONCE(q->cqes[q->cq_head].status)) & 1) == q->cq_phase;
}

/* Consumes every CQE whose phase tag is current; returns the count. */
static int snvme_process_cq(struct snvme_queue *q)
{
	int n = 0;

	while (snvme_cqe_pending(q)) {
		/* Read the CQE body only after its phase tag matched. */
		dma_rmb();
		snvme_handle_cqe(q, &q->cqes[q->cq_head]);
		if (++q->cq_head == q->depth) {
			q->cq_head = 0;
			q->cq_phase ^= 1;
		}
		n++;
	}
	/* One head doorbell write for the whole batch. */
	if (n)
		snvme_ring_cq_doorbell(q);
	return n;
}

irqreturn_t snvme_io_irq(int irq, void *data)
{
	struct snvme_queue *q = data;
	int n;

	spin_lock(&q->cq_lock);
#ifdef SNVME_FAULT_INJECTION
	if (snvme_cqe_pending(q) && atomic_dec_if_positive(&q->ctrl->inject_skip_irqs) >= 0) {
		spin_unlock(&q->cq_lock);
		dev_warn(q->ctrl->dev, "QID %u: interrupt ignored, completion left in the CQ (fault injection)\n",
			 q->qid);
		return IRQ_HANDLED;
	}
#endif
	n = snvme_process_cq(q);
	spin_unlock(&q->cq_lock);
	return n ? IRQ_HANDLED : IRQ_NONE;
}

/*
 * The timeout ladder, after Linux's nvme_timeout. Steps 1 and 2 run at the
 * first expiry of the request's deadline (the queue's io_timeout), steps 1
 * and 3 at the second:
 *  0. CSTS all ones: the device is gone, fail the controller. CSTS.CFS:
 *     go straight to the reset.
 *  1. Poll the CQ: a lost interrupt completes the request here.
 *  2. Abort the command (once per attempt). "Aborted": its own completion
 *     comes with Command Abort Requested and snvme_complete_rq retries it.
 *     "Not aborted" (the command is done or the controller would not):
 *     wait one more deadline.
 *  3. Reset the controller: it is disabled, which ends every command and
 *     all DMA, and each request it held is retried (up to max_retries) or
 *     failed with an I/O error. A reset that fails fails the controller.
 * The block layer keeps the request meanwhile (BLK_EH_RESET_TIMER), so
 * every step is bounded by a deadline and nothing hangs.
 */
static enum blk_eh_timer_return snvme_timeout(struct request *rq)
{
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);
	struct snvme_queue *q = iod->q;
	struct snvme_ctrl *ctrl = q->ctrl;
	u16 cid = (iod->gen << SNVME_CID_TAG_BITS) | rq->tag;
	unsigned int ms = jiffies_to_msecs(rq->timeout);
	unsigned long flags;
	u32 csts, result = 0;
	int ret;

	atomic_inc(&ctrl->recovery.timeouts);
	if (READ_ONCE(ctrl->failed))
		return BLK_EH_RESET_TIMER;	/* fail_work ends it */
	csts = readl(ctrl->bar + NVME_REG_CSTS);
	if (csts == ~0u) {
		dev_err(ctrl->dev, "QID %u tag %u: timeout, and CSTS reads all ones\n",
			q->qid, rq->tag);
		snvme_ctrl_fail(ctrl, "device gone");
		return BLK_EH_RESET_TIMER;
	}
	if (!(csts & NVME_CSTS_CFS)) {
		spin_lock_irqsave(&q->cq_lock, flags);
		snvme_process_cq(q);
		spin_unlock_irqrestore(&q->cq_lock, flags);
		if (blk_mq_rq_state(rq) != MQ_RQ_IN_FLIGHT) {
			atomic_inc(&ctrl->recovery.polled);
			dev_warn(ctrl->dev, "QID %u tag %u: completion found by polling (lost interrupt?)\n",
				 q->qid, rq->tag);
			return BLK_EH_DONE;
		}
	}
	if (snvme_ctrl_resetting(ctrl))
		return BLK_EH_RESET_TIMER;	/* the reset under way ends it */
	if (!(csts & NVME_CSTS_CFS) && !iod->aborted) {
		iod->aborted = true;
		atomic_inc(&ctrl->recovery.aborts);
		dev_warn(ctrl->dev, "QID %u tag %u CID 0x%x: timeout after %u ms, sending Abort\n",
			 q->qid, rq->tag, cid, ms);
		ret = snvme_abort_cmd(ctrl, q->qid, cid, &result);
		if (ret || (result & 1)) {
			atomic_inc(&ctrl->recovery.aborts_not_aborted);
			dev_warn(ctrl->dev, "QID %u CID 0x%x: not aborted (%s %d, dword 0 0x%x)\n",
				 q->qid, cid, ret < 0 ? "errno" : "status", ret, result);
		} else {
			dev_warn(ctrl->dev, "QID %u CID 0x%x: aborted\n", q->qid, cid);
		}
		return BLK_EH_RESET_TIMER;
	}
	dev_warn(ctrl->dev, "QID %u tag %u CID 0x%x: %s, resetting the controller\n",
		 q->qid, rq->tag, cid,
		 csts & NVME_CSTS_CFS ? "CSTS.CFS" : "still outstanding after Abort");
	if (!snvme_ctrl_schedule_reset(ctrl, "I/O timeout"))
		snvme_ctrl_fail(ctrl, "I/O timeout, no reset possible (probe or remove)");
	return BLK_EH_RESET_TIMER;
}

static int snvme_init_hctx(struct blk_mq_hw_ctx *hctx, void *data, unsigned int idx)
{
	struct snvme_ctrl *ctrl = data;

	hctx->driver_data = &ctrl->ioqs[idx];
	return 0;
}

static const struct blk_mq_ops snvme_mq_ops = {
	.queue_rq = snvme_queue_rq,
	.commit_rqs = snvme_commit_rqs,
	.complete = snvme_complete_rq,
	.init_hctx = snvme_init_hctx,
	.timeout = snvme_timeout,
};

static const struct block_device_operations snvme_bdev_ops = {
	.owner = THIS_MODULE,
};

static bool snvme_cancel_rq(struct request *rq, void *data)
{
	struct snvme_iod *iod = blk_mq_rq_to_pdu(rq);

	if (blk_mq_request_completed(rq))
		return true;
	iod->status = NVME_SC_HOST_ABORTED_CMD;
	blk_mq_complete_request(rq);
	return true;
}

/*
 * Called once the controller is disabled: no CQE can arrive any more. Each
 * request in flight is retried or failed (snvme_complete_rq); returns once
 * all of them are through their completion.
 */
void snvme_blk_cancel_all(struct snvme_ctrl *ctrl)
{
	if (!ctrl->tagset_alloced)
		return;
	blk_mq_tagset_busy_iter(&ctrl->tagset, snvme_cancel_rq, NULL);
	blk_mq_tagset_wait_completed_request(&ctrl->tagset);
}

/* Holds every disk's dispatch (queue_rq) for a reset; 6.1 has no tagset-wide call. */
void snvme_blk_quiesce(struct snvme_ctrl *ctrl)
{
	int i;

	for (i = 0; i < ctrl->nr_ns; i++)
		blk_mq_quiesce_queue(ctrl->ns[i]->disk->queue);
}

void snvme_blk_unquiesce(struct snvme_ctrl *ctrl)
{
	int i;

	for (i = 0; i < ctrl->nr_ns; i++) {
		blk_mq_unquiesce_queue(ctrl->ns[i]->disk->queue);
		blk_mq_kick_requeue_list(ctrl->ns[i]->disk->queue);
	}
}

static int snvme_identify_ns(struct snvme_ctrl *ctrl, u32 nsid, struct nvme_id_ns *id,
			     dma_addr_t dma)
{
	struct nvme_command c = { };
	int ret;

	c.identify.opcode = nvme_admin_identify;
	c.identify.nsid = cpu_to_le32(nsid);
	c.identify.cns = NVME_ID_CNS_NS;
	c.identify.dptr.prp1 = cpu_to_le64(dma);
	ret = snvme_admin_cmd(ctrl, &c, NULL);
	if (ret)
		dev_err(ctrl->dev, "Identify Namespace %u failed: %d\n", nsid, ret);
	return ret > 0 ? -EIO : ret;
}

static int snvme_add_ns(struct snvme_ctrl *ctrl, u32 nsid, struct nvme_id_ns *id)
{
	struct snvme_limits lim = { };
	struct snvme_ns *ns;
	struct gendisk *disk;
	u8 lbaf = id->flbas & NVME_NS_FLBAS_LBA_MASK;
	u8 shift = id->lbaf[lbaf].ds;
	u32 xfer = SNVME_MAX_KERNEL_XFER;
	int ret, i;

	if (shift < 9 || shift > PAGE_SHIFT || id->lbaf[lbaf].ms) {
		dev_warn(ctrl->dev, "namespace %u: LBA format %u (2^%u bytes, %u metadata) unsupported, skipped\n",
			 nsid, lbaf, shift, le16_to_cpu(id->lbaf[lbaf].ms));
		return 0;
	}
	ns = kzalloc(sizeof(*ns), GFP_KERNEL);
	if (!ns)
		return -ENOMEM;
	ns->ctrl = ctrl;
	ns->nsid = nsid;
	ns->lba_shift = shift;
	ns->nsze = le64_to_cpu(id->nsze);
	ns->ncap = le64_to_cpu(id->ncap);
	ns->flbas_index = lbaf;
	ns->nlbaf = min(id->nlbaf + 1, SNVME_MAX_LBA_FORMATS);
	for (i = 0; i < ns->nlbaf; i++) {
		ns->lbaf[i].metadata_bytes = le16_to_cpu(id->lbaf[i].ms);
		ns->lbaf[i].lba_shift = id->lbaf[i].ds;
		ns->lbaf[i].relative_perf = id->lbaf[i].rp;
	}
	if (ctrl->max_xfer)
		xfer = min(xfer, ctrl->max_xfer);
	lim.lba_size = 1u << shift;
	lim.max_hw_sectors = xfer >> SECTOR_SHIFT;
	lim.max_segments = SNVME_MAX_SEGS;
	lim.virt_boundary_mask = SNVME_NVME_PAGE - 1;
	lim.write_cache = ctrl->vwc;
	lim.fua = true;
	disk = snvme_alloc_disk(&ctrl->tagset, &lim, ns);
	if (IS_ERR(disk)) {
		kfree(ns);
		return PTR_ERR(disk);
	}
	disk->fops = &snvme_bdev_ops;
	disk->private_data = ns;
	snprintf(disk->disk_name, DISK_NAME_LEN, "snvme%dn%u", ctrl->instance, nsid);
	set_capacity(disk, ns->nsze << (shift - SECTOR_SHIFT));
	ns->disk = disk;
	ctrl->ns[ctrl->nr_ns++] = ns;
	ret = add_disk(disk);
	if (ret)
		return ret;
	ns->added = true;
	return 0;
}

int snvme_blk_init(struct snvme_ctrl *ctrl)
{
	struct blk_mq_tag_set *set = &ctrl->tagset;
	struct nvme_id_ns *id;
	struct dma_pool *pool;
	dma_addr_t dma;
	u32 nsid, last;
	int ret;

	pool = dma_pool_create("snvme-prp", ctrl->dev, SNVME_NVME_PAGE, SNVME_NVME_PAGE, 0);
	if (!pool)
		return -ENOMEM;
	ctrl->prp_pool = pool;
	set->ops = &snvme_mq_ops;
	set->nr_hw_queues = ctrl->kernel_queues;
	set->queue_depth = ctrl->ioqs[0].depth - 1;	/* one slot stays empty */
	set->numa_node = dev_to_node(ctrl->dev);
	set->cmd_size = sizeof(struct snvme_iod);
	set->flags = SNVME_MQ_F_MERGE;
	set->timeout = msecs_to_jiffies(snvme_io_timeout_ms);
	set->driver_data = ctrl;
	ret = blk_mq_alloc_tag_set(set);
	if (ret)
		return ret;
	ctrl->tagset_alloced = true;

	id = dma_alloc_coherent(ctrl->dev, SNVME_NVME_PAGE, &dma, GFP_KERNEL);
	if (!id)
		return -ENOMEM;
	last = min_t(u32, ctrl->nn, SNVME_MAX_NAMESPACES);
	for (nsid = 1, ret = 0; nsid <= last && !ret; nsid++) {
		ret = snvme_identify_ns(ctrl, nsid, id, dma);
		if (ret)
			break;
		if (!le64_to_cpu(id->nsze))
			continue;	/* inactive NSID */
		ret = snvme_add_ns(ctrl, nsid, id);
	}
	dma_free_coherent(ctrl->dev, SNVME_NVME_PAGE, id, dma);
	return ret;
}

void snvme_blk_remove(struct snvme_ctrl *ctrl)
{
	int i;

	for (i = 0; i < ctrl->nr_ns; i++) {
		struct snvme_ns *ns = ctrl->ns[i];

		if (ns->added)
			del_gendisk(ns->disk);
		put_disk(ns->disk);
		kfree(ns);
		ctrl->ns[i] = NULL;
	}
	ctrl->nr_ns = 0;
}

/* After the controller is disabled and fail_work is idle. */
void snvme_blk_free(struct snvme_ctrl *ctrl)
{
	if (ctrl->tagset_alloced) {
		blk_mq_free_tag_set(&ctrl->tagset);
		ctrl->tagset_alloced = false;
	}
	dma_pool_destroy(ctrl->prp_pool);
	ctrl->prp_pool = NULL;
}
