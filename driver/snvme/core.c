// SPDX-License-Identifier: GPL-2.0
/*
 * snvme core: module parameters, controller bring-up and teardown, the
 * admin queue, and the root-only control device /dev/snvme-control.
 *
 * Bring-up order (NVMe Base Spec 2.0, 3.5.1 "Memory-based Controller
 * Initialization"): reset (CC.EN = 0, wait CSTS.RDY = 0 within CAP.TO),
 * admin queue (AQA/ASQ/ACQ), enable (CC.EN = 1, wait CSTS.RDY = 1),
 * Identify Controller, Set Features Number of Queues, I/O queues for the
 * kernel, Identify Namespace per namespace, block devices, character device.
 */
#include <linux/ctype.h>
#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/interrupt.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/seq_file.h>

#include "compat.h"
#include "snvme.h"

/* ---- module parameters ------------------------------------------------- */

unsigned int snvme_kernel_queues = 2;
unsigned int snvme_user_queues = 32;
unsigned int snvme_io_queue_depth = 256;
unsigned int snvme_admin_timeout_ms = 10000;
unsigned int snvme_io_timeout_ms = 30000;
unsigned int snvme_max_retries = 5;	/* Linux's nvme_core.max_retries default */
unsigned int snvme_max_dma_map_mib = 1024;

#define SNVME_UINT_PARAM(name, var, lo, hi, desc)			\
static int name##_set(const char *val, const struct kernel_param *kp)	\
{									\
	int ret = param_set_uint_minmax(val, kp, lo, hi);		\
	if (ret)							\
		pr_err(SNVME_NAME ": " #name "=%s rejected: must be %u..%u\n", \
		       val, lo, hi);					\
	return ret;							\
}									\
static const struct kernel_param_ops name##_ops = {			\
	.set = name##_set,						\
	.get = param_get_uint,						\
};									\
module_param_cb(name, &name##_ops, &var, 0444);			\
MODULE_PARM_DESC(name, desc " (" #lo ".." #hi ")")

SNVME_UINT_PARAM(kernel_queues, snvme_kernel_queues, 1, SNVME_MAX_KERNEL_QUEUES,
		 "I/O queue pairs for the block device, QIDs 1..n");
SNVME_UINT_PARAM(user_queues, snvme_user_queues, 0, SNVME_MAX_USER_QUEUES,
		 "I/O queue pairs reserved for userspace queue groups");
SNVME_UINT_PARAM(io_queue_depth, snvme_io_queue_depth, 2, 1024,
		 "entries per kernel I/O queue, capped by CAP.MQES + 1");
SNVME_UINT_PARAM(admin_timeout_ms, snvme_admin_timeout_ms, 100, 600000,
		 "admin command deadline in ms");
SNVME_UINT_PARAM(io_timeout_ms, snvme_io_timeout_ms, 1000, 600000,
		 "block I/O deadline in ms before each step of the timeout ladder (poll, Abort, reset)");
SNVME_UINT_PARAM(max_retries, snvme_max_retries, 0, 16,
		 "times a block request is retried after a reset or an Abort ended it");
SNVME_UINT_PARAM(max_dma_map_mib, snvme_max_dma_map_mib, 1, 65536,
		 "largest DMA_MAP in MiB");

struct snvme_counters snvme_totals;
static DEFINE_IDA(snvme_instance_ida);
static struct dentry *snvme_debugfs;
/* Resets and failures: on the memory-reclaim path, since writeback waits for them. */
static struct workqueue_struct *snvme_wq;

/* ---- register helpers ------------------------------------------------- */

static u32 snvme_readl(struct snvme_ctrl *ctrl, u32 off)
{
	return readl(ctrl->bar + off);
}

static void snvme_writel(struct snvme_ctrl *ctrl, u32 val, u32 off)
{
	writel(val, ctrl->bar + off);
}

/*
 * Waits until (CSTS & mask) == want, within CAP.TO. An all-ones read means
 * the device is gone; CSTS.CFS means it has failed.
 */
static int snvme_wait_csts(struct snvme_ctrl *ctrl, u32 mask, u32 want,
			   const char *what)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(ctrl->timeout_ms);
	u32 csts;

	for (;;) {
		csts = snvme_readl(ctrl, NVME_REG_CSTS);
		if (csts == ~0u) {
			dev_err(ctrl->dev, "device gone while waiting for %s\n", what);
			return -ENODEV;
		}
		if ((csts & mask) == want)
			return 0;
		if (csts & NVME_CSTS_CFS) {
			dev_err(ctrl->dev, "controller fatal status while waiting for %s\n", what);
			return -EIO;
		}
		if (time_after(jiffies, deadline)) {
			dev_err(ctrl->dev, "timeout (CAP.TO %u ms) waiting for %s, CSTS 0x%x\n",
				ctrl->timeout_ms, what, csts);
			return -ETIMEDOUT;
		}
		usleep_range(1000, 2000);
	}
}

#ifdef SNVME_FAULT_INJECTION
/*
 * stuck_disables (debugfs): the next N disables leave CC.EN at 1 and fail
 * as a controller whose CSTS.RDY stays 1 past CAP.TO makes them fail, at
 * once: its queues keep running.
 */
static bool snvme_inject_stuck_disable(struct snvme_ctrl *ctrl)
{
	if (!atomic_add_unless(&ctrl->inject_stuck_disables, -1, 0))
		return false;
	dev_err(ctrl->dev, "injected: CC.EN left 1, as if CSTS.RDY stayed 1 past CAP.TO\n");
	return true;
}

/* Sleeps for a delay knob's milliseconds, once: the knob is cleared. */
static void snvme_inject_sleep(atomic_t *delay_ms)
{
	int ms = atomic_xchg(delay_ms, 0);

	if (ms > 0)
		msleep(ms);
}

/*
 * fail_delay_ms (debugfs): the next failure waits that long between setting
 * failed and queueing fail_work, as a slow console does in its dev_err.
 */
static void snvme_inject_fail_delay(struct snvme_ctrl *ctrl)
{
	snvme_inject_sleep(&ctrl->inject_fail_delay_ms);
}

/*
 * prefail_delay_ms (debugfs): the next failure of a controller not failed
 * yet waits that long before it sets failed: its caller has decided to
 * fail the controller (a reset whose disable is stuck), and nobody can see
 * that yet. Whatever the caller still holds is held as long, so a close
 * that runs in this window, outside those locks, finds a controller still
 * running its queues with failed false.
 */
static void snvme_inject_prefail_delay(struct snvme_ctrl *ctrl)
{
	if (!READ_ONCE(ctrl->failed))
		snvme_inject_sleep(&ctrl->inject_prefail_delay_ms);
}
#else
static bool snvme_inject_stuck_disable(struct snvme_ctrl *ctrl)
{
	return false;
}

static void snvme_inject_fail_delay(struct snvme_ctrl *ctrl)
{
}

static void snvme_inject_prefail_delay(struct snvme_ctrl *ctrl)
{
}
#endif

static int snvme_disable(struct snvme_ctrl *ctrl)
{
	u32 cc = snvme_readl(ctrl, NVME_REG_CC);

	if (cc == ~0u)
		return -ENODEV;
	if (snvme_inject_stuck_disable(ctrl))
		return -ETIMEDOUT;
	if (cc & NVME_CC_ENABLE)
		snvme_writel(ctrl, cc & ~NVME_CC_ENABLE, NVME_REG_CC);
	return snvme_wait_csts(ctrl, NVME_CSTS_RDY, 0, "CSTS.RDY=0");
}

/* Normal shutdown (CC.SHN = 01b), then disable; best effort. */
static void snvme_shutdown(struct snvme_ctrl *ctrl)
{
	u32 cc = snvme_readl(ctrl, NVME_REG_CC);

	if (cc == ~0u)
		return;
	if (cc & NVME_CC_ENABLE) {
		cc = (cc & ~NVME_CC_SHN_MASK) | NVME_CC_SHN_NORMAL;
		snvme_writel(ctrl, cc, NVME_REG_CC);
		snvme_wait_csts(ctrl, NVME_CSTS_SHST_MASK, NVME_CSTS_SHST_CMPLT,
				"shutdown complete");
	}
	snvme_disable(ctrl);
}

/* ---- queues ------------------------------------------------------------- */

void snvme_ring_cq_doorbell(struct snvme_queue *q)
{
	writel(q->cq_head, q->cq_db);
}

/*
 * A queue's host state as the controller expects it after Create I/O SQ/CQ
 * or enable: both rings empty, Phase Tag 1. The CQ is zeroed so that no
 * entry of an earlier life carries the Phase Tag the host now waits for.
 */
static void snvme_init_queue_state(struct snvme_queue *q)
{
	unsigned long flags;

	spin_lock_irqsave(&q->sq_lock, flags);
	q->sq_tail = 0;
	q->last_sq_tail = 0;
	spin_unlock_irqrestore(&q->sq_lock, flags);
	spin_lock_irqsave(&q->cq_lock, flags);
	memset(q->cqes, 0, q->depth * sizeof(struct nvme_completion));
	q->cq_head = 0;
	q->cq_phase = 1;
	spin_unlock_irqrestore(&q->cq_lock, flags);
}

static int snvme_alloc_queue(struct snvme_ctrl *ctrl, struct snvme_queue *q,
			     u16 qid, u16 depth)
{
	q->ctrl = ctrl;
	q->qid = qid;
	q->depth = depth;
	q->sqes = dma_alloc_coherent(ctrl->dev, depth * sizeof(struct nvme_command),
				     &q->sq_dma, GFP_KERNEL);
	if (!q->sqes)
		return -ENOMEM;
	q->cqes = dma_alloc_coherent(ctrl->dev, depth * sizeof(struct nvme_completion),
				     &q->cq_dma, GFP_KERNEL);
	if (!q->cqes) {
		dma_free_coherent(ctrl->dev, depth * sizeof(struct nvme_command),
				  q->sqes, q->sq_dma);
		q->sqes = NULL;
		return -ENOMEM;
	}
	spin_lock_init(&q->sq_lock);
	spin_lock_init(&q->cq_lock);
	snvme_init_queue_state(q);
	q->sq_db = ctrl->bar + SNVME_DB_OFFSET + (2 * qid) * ctrl->db_stride;
	q->cq_db = ctrl->bar + SNVME_DB_OFFSET + (2 * qid + 1) * ctrl->db_stride;
	return 0;
}

static void snvme_free_queue(struct snvme_ctrl *ctrl, struct snvme_queue *q)
{
	if (q->cqes)
		dma_free_coherent(ctrl->dev, q->depth * sizeof(struct nvme_completion),
				  q->cqes, q->cq_dma);
	if (q->sqes)
		dma_free_coherent(ctrl->dev, q->depth * sizeof(struct nvme_command),
				  q->sqes, q->sq_dma);
	q->cqes = NULL;
	q->sqes = NULL;
}

/* ---- admin commands ---------------------------------------------------- */

static irqreturn_t snvme_admin_irq(int irq, void *data)
{
	struct snvme_ctrl *ctrl = data;
	struct snvme_queue *q = &ctrl->adminq;
	irqreturn_t ret = IRQ_NONE;
	unsigned long flags;

	spin_lock_irqsave(&q->cq_lock, flags);
	while ((le16_to_cpu(READ_ONCE(q->cqes[q->cq_head].status)) & 1) == q->cq_phase) {
		struct nvme_completion *cqe = &q->cqes[q->cq_head];

		/* Read the CQE body only after its phase tag matched. */
		dma_rmb();
		if (cqe->command_id == ctrl->admin_cid) {
			ctrl->admin_cqe = *cqe;
			complete(&ctrl->admin_done);
		} else {
			dev_warn(ctrl->dev, "stale admin completion, CID %u (waiting for %u)\n",
				 cqe->command_id, ctrl->admin_cid);
		}
		if (++q->cq_head == q->depth) {
			q->cq_head = 0;
			q->cq_phase ^= 1;
		}
		ret = IRQ_HANDLED;
	}
	if (ret == IRQ_HANDLED)
		snvme_ring_cq_doorbell(q);
	spin_unlock_irqrestore(&q->cq_lock, flags);
	return ret;
}

/*
 * Runs one admin command, with admin_lock held, and waits for it with the
 * admin_timeout_ms deadline. Returns 0, -ETIMEDOUT, or a positive NVMe
 * status (SCT << 8 | SC).
 */
static int snvme_admin_exec(struct snvme_ctrl *ctrl, struct nvme_command *cmd,
			    u32 *result)
{
	struct snvme_queue *q = &ctrl->adminq;
	unsigned long left;
	u16 status;
	int ret;

	lockdep_assert_held(&ctrl->admin_lock);
	reinit_completion(&ctrl->admin_done);
	/* CID FFFFh is reserved (it means "no command" in the Error log). */
	if (++ctrl->admin_cid == 0xffff)
		ctrl->admin_cid = 0;
	cmd->common.command_id = ctrl->admin_cid;

	spin_lock_irq(&q->sq_lock);
	memcpy(&q->sqes[q->sq_tail], cmd, sizeof(*cmd));
	if (++q->sq_tail == q->depth)
		q->sq_tail = 0;
	/* writel orders the SQE stores before the doorbell store. */
	writel(q->sq_tail, q->sq_db);
	spin_unlock_irq(&q->sq_lock);

	left = wait_for_completion_timeout(&ctrl->admin_done,
					   msecs_to_jiffies(snvme_admin_timeout_ms));
	if (!left) {
		/* Maybe the interrupt was lost: poll once before giving up. */
		snvme_admin_irq(0, ctrl);
		if (!completion_done(&ctrl->admin_done)) {
			dev_err(ctrl->dev, "admin opcode 0x%02x timed out after %u ms\n",
				cmd->common.opcode, snvme_admin_timeout_ms);
			return -ETIMEDOUT;
		}
	}
	status = le16_to_cpu(ctrl->admin_cqe.status) >> 1;
	if (result)
		*result = le32_to_cpu(ctrl->admin_cqe.result.u32);
	ret = status & 0x7ff;	/* SCT and SC, without More and DNR */
	if (ret)
		dev_dbg(ctrl->dev, "admin opcode 0x%02x: status 0x%x\n",
			cmd->common.opcode, ret);
	return ret;
}

/*
 * Runs one admin command. Returns 0, a negative errno, or a positive NVMe
 * status (SCT << 8 | SC). A timeout fails the controller: the command may
 * still be executing, so nothing it references may be freed unless the
 * controller is disabled first, which snvme_ctrl_fail() does.
 */
int snvme_admin_cmd(struct snvme_ctrl *ctrl, struct nvme_command *cmd,
		    u32 *result)
{
	int ret = -ENODEV;

	mutex_lock(&ctrl->admin_lock);
	if (!ctrl->failed)
		ret = snvme_admin_exec(ctrl, cmd, result);
	mutex_unlock(&ctrl->admin_lock);
	if (ret == -ETIMEDOUT)
		snvme_ctrl_fail(ctrl, "admin timeout");
	return ret;
}

/*
 * Abort (NVMe Base Spec 2.0, 5.1) of command cid in SQ sqid. Returns 0 with
 * the completion's dword 0 in *result (bit 0 clear: the command was
 * aborted), a positive NVMe status, -ENODEV on a failed controller, or
 * -EAGAIN while a reset is in progress: the reset ends every command, and
 * only its own admin commands may run then.
 */
int snvme_abort_cmd(struct snvme_ctrl *ctrl, u16 sqid, u16 cid, u32 *result)
{
	struct nvme_command c = { };
	int ret;

	c.abort.opcode = nvme_admin_abort_cmd;
	c.abort.sqid = cpu_to_le16(sqid);
	c.abort.cid = cid;
	mutex_lock(&ctrl->admin_lock);
	if (ctrl->failed)
		ret = -ENODEV;
	else if (snvme_ctrl_resetting(ctrl))
		ret = -EAGAIN;
	else
		ret = snvme_admin_exec(ctrl, &c, result);
	mutex_unlock(&ctrl->admin_lock);
	if (ret == -ETIMEDOUT)
		snvme_ctrl_fail(ctrl, "admin timeout");
	return ret;
}

static int snvme_identify(struct snvme_ctrl *ctrl, u8 cns, u32 nsid,
			  dma_addr_t dma)
{
	struct nvme_command c = { };

	c.identify.opcode = nvme_admin_identify;
	c.identify.nsid = cpu_to_le32(nsid);
	c.identify.cns = cns;
	c.identify.dptr.prp1 = cpu_to_le64(dma);
	return snvme_admin_cmd(ctrl, &c, NULL);
}

/* Create I/O Completion Queue, NVMe Base Spec 2.0, 5.4. vector < 0: no interrupts. */
int snvme_create_cq(struct snvme_ctrl *ctrl, u16 qid, dma_addr_t dma,
		    u16 entries, int vector)
{
	struct nvme_command c = { };
	u16 flags = NVME_QUEUE_PHYS_CONTIG;

	if (vector >= 0)
		flags |= NVME_CQ_IRQ_ENABLED;
	c.create_cq.opcode = nvme_admin_create_cq;
	c.create_cq.prp1 = cpu_to_le64(dma);
	c.create_cq.cqid = cpu_to_le16(qid);
	c.create_cq.qsize = cpu_to_le16(entries - 1);	/* 0's based */
	c.create_cq.cq_flags = cpu_to_le16(flags);
	c.create_cq.irq_vector = cpu_to_le16(vector >= 0 ? vector : 0);
	return snvme_admin_cmd(ctrl, &c, NULL);
}

/* Create I/O Submission Queue, NVMe Base Spec 2.0, 5.5; CQID = SQID. */
int snvme_create_sq(struct snvme_ctrl *ctrl, u16 qid, dma_addr_t dma,
		    u16 entries)
{
	struct nvme_command c = { };

	c.create_sq.opcode = nvme_admin_create_sq;
	c.create_sq.prp1 = cpu_to_le64(dma);
	c.create_sq.sqid = cpu_to_le16(qid);
	c.create_sq.qsize = cpu_to_le16(entries - 1);	/* 0's based */
	c.create_sq.sq_flags = cpu_to_le16(NVME_QUEUE_PHYS_CONTIG | NVME_SQ_PRIO_MEDIUM);
	c.create_sq.cqid = cpu_to_le16(qid);
	return snvme_admin_cmd(ctrl, &c, NULL);
}

/* Delete I/O SQ (opcode 0x00) or CQ (0x04), NVMe Base Spec 2.0, 5.6/5.7. */
int snvme_delete_queue(struct snvme_ctrl *ctrl, u8 opcode, u16 qid)
{
	struct nvme_command c = { };

	c.delete_queue.opcode = opcode;
	c.delete_queue.qid = cpu_to_le16(qid);
	return snvme_admin_cmd(ctrl, &c, NULL);
}

/* ---- failure ------------------------------------------------------------ */

static void snvme_sync_irqs(struct snvme_ctrl *ctrl)
{
	int i;

	for (i = 0; i < ctrl->nr_vecs; i++)
		synchronize_irq(pci_irq_vector(ctrl->pdev, i));
}

/*
 * Once the controller stopped (snvme_stop_dma, admin_lock released): waits
 * for running interrupt handlers, revokes every open file and fails the
 * block requests in flight, so that nobody waits for a completion that
 * cannot come.
 */
static void snvme_release_users(struct snvme_ctrl *ctrl)
{
	snvme_sync_irqs(ctrl);
	snvme_chr_revoke(ctrl, SNVME_REVOKED_FAILED);
	snvme_blk_cancel_all(ctrl);
}

/*
 * After a disable (CC.EN = 0), with admin_lock held: turns bus mastering
 * off, so that even a controller that ignored CC.EN (the wait for
 * CSTS.RDY = 0 may have timed out) cannot DMA any more, as Linux's
 * nvme_dev_disable does with pci_disable_device(); then lets go whoever
 * waits to free memory the controller could reach (ctrl->disabled).
 */
static void snvme_stop_dma(struct snvme_ctrl *ctrl)
{
	lockdep_assert_held(&ctrl->admin_lock);
	pci_clear_master(ctrl->pdev);
	complete_all(&ctrl->disabled);
}

/*
 * Takes the controller out of service: disables it (which deletes every
 * queue and stops its DMA) and turns its bus mastering off
 * (snvme_stop_dma). Then it revokes every open file and fails all block
 * requests in flight. Userspace queue groups stay allocated until their
 * owners close; their pages stay pinned until then, which is safe because
 * the controller no longer runs. Bind sets bus mastering again.
 */
static void snvme_fail_work(struct work_struct *work)
{
	struct snvme_ctrl *ctrl = container_of(work, struct snvme_ctrl, fail_work);

	mutex_lock(&ctrl->admin_lock);
	snvme_disable(ctrl);
	snvme_stop_dma(ctrl);
	mutex_unlock(&ctrl->admin_lock);
	snvme_release_users(ctrl);
}

/*
 * Fails the controller: sets failed at once, then queues fail_work, which
 * disables it, unless remove() or probe's unwind retired it
 * (snvme_retire_fail_work). Takes state_lock with a plain spin_lock: every
 * caller runs in process context and none holds state_lock (an interrupt
 * context caller would need it irqsave). Does not sleep (but in the test
 * build's prefail_delay_ms and fail_delay_ms); a reset calls it with its
 * locks held. Between
 * the two, and until fail_work has run, failed is set while the controller
 * still runs: so whoever frees memory because failed is set (no Delete
 * needed) waits for snvme_ctrl_wait_disabled(), not for fail_work, which a
 * flush_work() may find not queued yet.
 */
void snvme_ctrl_fail(struct snvme_ctrl *ctrl, const char *why)
{
	snvme_inject_prefail_delay(ctrl);
	if (xchg(&ctrl->failed, true))
		return;
	dev_err(ctrl->dev, "controller failed (%s): disabled; unbind and bind to recover\n",
		why);
	snvme_inject_fail_delay(ctrl);
	spin_lock(&ctrl->state_lock);
	if (!ctrl->fail_work_retired)
		queue_work(snvme_wq, &ctrl->fail_work);
	spin_unlock(&ctrl->state_lock);
}

/*
 * For remove() and probe's unwind, once they disabled the controller
 * themselves: fail_work never runs again. A failure that set failed before
 * they did may still be on its way to queue_work (its dev_err, the test
 * build's fail_delay_ms; the nv-p2p free callback takes no lock of ours):
 * the flag, set under the lock that queue_work is called under, makes that
 * a no-op, so this cancel is the last word and fail_work cannot run on an
 * unmapped BAR.
 */
static void snvme_retire_fail_work(struct snvme_ctrl *ctrl)
{
	spin_lock(&ctrl->state_lock);
	ctrl->fail_work_retired = true;
	spin_unlock(&ctrl->state_lock);
	cancel_work_sync(&ctrl->fail_work);
}

/*
 * The controller's last stop, for remove() and the shutdown hook once no
 * reset can run: a normal shutdown and disable under admin_lock (no admin
 * command, reset or fail_work interleaves its register writes), bus
 * mastering off even if the disable timed out, failed set (later
 * submissions fail at once), then fail_work retired. The cancel may take
 * fail_work before it disabled the controller: this has done it instead.
 */
static void snvme_ctrl_stop(struct snvme_ctrl *ctrl)
{
	mutex_lock(&ctrl->admin_lock);
	snvme_shutdown(ctrl);
	snvme_stop_dma(ctrl);
	WRITE_ONCE(ctrl->failed, true);
	mutex_unlock(&ctrl->admin_lock);
	snvme_retire_fail_work(ctrl);
}

/*
 * The longest fail_work can take to disable a failed controller, in ms:
 * admin_lock may be held by an admin command (admin_timeout_ms) or by a
 * disable or remove()'s shutdown (CAP.TO each for shutdown and disable),
 * then fail_work's own disable waits up to CAP.TO, plus
 * SNVME_DISABLED_SLACK_MS for the workqueue and the console.
 */
unsigned long snvme_ctrl_disable_bound_ms(struct snvme_ctrl *ctrl)
{
	return snvme_admin_timeout_ms + 3ul * ctrl->timeout_ms +
	       SNVME_DISABLED_SLACK_MS;
}

/*
 * Waits until a failed controller can DMA no more (ctrl->disabled) and
 * returns true; false if that did not happen within the longest fail_work
 * can take (snvme_ctrl_disable_bound_ms). On false the controller may still
 * DMA into what its queues name: the caller must keep that memory (leak it,
 * and say so) instead of freeing it. Sleeps; the caller may hold any lock
 * but admin_lock (fail_work takes only that).
 *
 * The deadline is the controller's, not each caller's: a teardown waits
 * once per queue group with files_lock held, and every close, REVOKE and
 * remove() of the controller queues behind that lock, so a wait per group
 * would hold them all for as many deadlines as there are groups. Once one
 * wait ran out (fail_work is stuck past its own bound), later ones only
 * look: they free what a disable that came late made safe, and keep the rest.
 */
bool snvme_ctrl_wait_disabled(struct snvme_ctrl *ctrl)
{
	unsigned long ms = snvme_ctrl_disable_bound_ms(ctrl);

	if (READ_ONCE(ctrl->disable_overdue))
		return completion_done(&ctrl->disabled);
	if (wait_for_completion_timeout(&ctrl->disabled, msecs_to_jiffies(ms)))
		return true;
	WRITE_ONCE(ctrl->disable_overdue, true);
	dev_err(ctrl->dev, "the failed controller was not disabled within %lu ms: what it may still reach is kept from now on\n",
		ms);
	return false;
}

/* ---- bring-up ---------------------------------------------------------- */

/*
 * The userspace doorbell window: doorbells of QIDs 0..last user QID, rounded
 * up to whole pages, and refused if that page would reach the MSI-X table or
 * PBA when they live in BAR0 (QEMU puts them right after the doorbells).
 */
static u32 snvme_db_window(struct snvme_ctrl *ctrl, u16 last_qid)
{
	u32 bytes = PAGE_ALIGN(2u * (last_qid + 1) * ctrl->db_stride);
	u32 end = SNVME_DB_OFFSET + bytes;
	u32 tbl, off;
	int i;

	if (end > ctrl->bar_len || bytes > SNVME_MMAP_RING_STRIDE)
		return 0;
	if (!ctrl->pdev->msix_cap)
		return bytes;
	for (i = 0; i < 2; i++) {
		pci_read_config_dword(ctrl->pdev, ctrl->pdev->msix_cap +
				      (i ? PCI_MSIX_PBA : PCI_MSIX_TABLE), &tbl);
		off = tbl & PCI_MSIX_TABLE_OFFSET;
		if ((tbl & PCI_MSIX_TABLE_BIR) == 0 && off < end && off >= SNVME_DB_OFFSET)
			return 0;
	}
	return bytes;
}

static void snvme_copy_str(char *dst, const char *src, size_t n)
{
	memcpy(dst, src, n);
}

static int snvme_enable(struct snvme_ctrl *ctrl)
{
	struct snvme_queue *aq = &ctrl->adminq;
	u32 aqa = (aq->depth - 1) | ((aq->depth - 1) << 16);	/* 0's based */
	u32 cc;

	snvme_writel(ctrl, aqa, NVME_REG_AQA);
	lo_hi_writeq(aq->sq_dma, ctrl->bar + NVME_REG_ASQ);
	lo_hi_writeq(aq->cq_dma, ctrl->bar + NVME_REG_ACQ);
	cc = NVME_CC_CSS_NVM | ((ilog2(SNVME_NVME_PAGE) - 12) << NVME_CC_MPS_SHIFT) |
	     NVME_CC_AMS_RR | NVME_CC_SHN_NONE | NVME_CC_IOSQES | NVME_CC_IOCQES |
	     NVME_CC_ENABLE;
	snvme_writel(ctrl, cc, NVME_REG_CC);
	return snvme_wait_csts(ctrl, NVME_CSTS_RDY, NVME_CSTS_RDY, "CSTS.RDY=1");
}

static int snvme_identify_ctrl(struct snvme_ctrl *ctrl)
{
	struct nvme_id_ctrl *id;
	dma_addr_t dma;
	int ret;

	id = dma_alloc_coherent(ctrl->dev, SNVME_NVME_PAGE, &dma, GFP_KERNEL);
	if (!id)
		return -ENOMEM;
	ret = snvme_identify(ctrl, NVME_ID_CNS_CTRL, 0, dma);
	if (ret) {
		dev_err(ctrl->dev, "Identify Controller failed: %d\n", ret);
		ret = ret > 0 ? -EIO : ret;
		goto out;
	}
	ctrl->vid = le16_to_cpu(id->vid);
	ctrl->ssvid = le16_to_cpu(id->ssvid);
	snvme_copy_str(ctrl->serial, id->sn, sizeof(ctrl->serial));
	snvme_copy_str(ctrl->model, id->mn, sizeof(ctrl->model));
	snvme_copy_str(ctrl->firmware, id->fr, sizeof(ctrl->firmware));
	ctrl->nn = le32_to_cpu(id->nn);
	ctrl->sgls = le32_to_cpu(id->sgls);
	ctrl->vwc = id->vwc & NVME_CTRL_VWC_PRESENT;
	/* MDTS: 2^n units of CAP.MPSMIN, 0 = no limit (Figure 275). */
	if (id->mdts)
		ctrl->max_xfer = min_t(u64, U32_MAX,
			(u64)(1u << (12 + NVME_CAP_MPSMIN(ctrl->cap))) << id->mdts);
out:
	dma_free_coherent(ctrl->dev, SNVME_NVME_PAGE, id, dma);
	return ret;
}

/*
 * Set Features, Number of Queues (FID 07h), NVMe Base Spec 2.0, 5.27.1.5:
 * asks for want I/O queue pairs, returns how many were granted in *granted.
 */
static int snvme_request_queues(struct snvme_ctrl *ctrl, u32 want, u32 *granted)
{
	struct nvme_command c = { };
	u32 result = 0;
	int ret;

	want = min_t(u32, want, 65535);
	c.features.opcode = nvme_admin_set_features;
	c.features.fid = cpu_to_le32(NVME_FEAT_NUM_QUEUES);
	c.features.dword11 = cpu_to_le32((want - 1) | ((want - 1) << 16));
	ret = snvme_admin_cmd(ctrl, &c, &result);
	if (ret) {
		dev_err(ctrl->dev, "Set Features Number of Queues failed: %d\n", ret);
		return ret > 0 ? -EIO : ret;
	}
	/* NSQA and NCQA are 0's based. */
	*granted = min(result & 0xffff, result >> 16) + 1;
	return 0;
}

static int snvme_set_queue_count(struct snvme_ctrl *ctrl)
{
	u32 granted, k, u;
	int ret;

	ret = snvme_request_queues(ctrl, snvme_kernel_queues + snvme_user_queues, &granted);
	if (ret)
		return ret;
	k = min(snvme_kernel_queues, granted);
	k = min_t(u32, k, ctrl->nr_vecs > 1 ? ctrl->nr_vecs - 1 : 1);
	u = min(snvme_user_queues, granted - k);
	if (u) {
		/* Shrink until the doorbell window is safe to hand out. */
		while (u && !snvme_db_window(ctrl, k + u))
			u--;
		if (u < min(snvme_user_queues, granted - k))
			dev_warn(ctrl->dev, "user queues limited to %u by the BAR0 layout\n", u);
	}
	ctrl->kernel_queues = k;
	ctrl->user_qid_first = k + 1;
	ctrl->user_queues = u;
	ctrl->db_bytes = u ? snvme_db_window(ctrl, k + u) : 0;
	dev_info(ctrl->dev, "queues: %u granted, %u kernel (QIDs 1..%u), %u user (QIDs %u..%u)\n",
		 granted, k, k, u, k + 1, k + u);
	return 0;
}

/* Create I/O CQ (interrupts on) then SQ of one kernel queue on the controller. */
static int snvme_create_io_queue_hw(struct snvme_ctrl *ctrl, struct snvme_queue *q)
{
	int ret;

	ret = snvme_create_cq(ctrl, q->qid, q->cq_dma, q->depth, q->vector);
	if (ret) {
		dev_err(ctrl->dev, "Create I/O CQ %u failed: %d\n", q->qid, ret);
		return ret > 0 ? -EIO : ret;
	}
	ret = snvme_create_sq(ctrl, q->qid, q->sq_dma, q->depth);
	if (ret) {
		dev_err(ctrl->dev, "Create I/O SQ %u failed: %d\n", q->qid, ret);
		snvme_delete_queue(ctrl, nvme_admin_delete_cq, q->qid);
		return ret > 0 ? -EIO : ret;
	}
	q->created = true;
	return 0;
}

static int snvme_create_io_queues(struct snvme_ctrl *ctrl)
{
	u16 depth = min_t(u32, snvme_io_queue_depth, NVME_CAP_MQES(ctrl->cap) + 1);
	int i, ret;

	ctrl->ioqs = kcalloc(ctrl->kernel_queues, sizeof(*ctrl->ioqs), GFP_KERNEL);
	if (!ctrl->ioqs)
		return -ENOMEM;
	for (i = 0; i < ctrl->kernel_queues; i++) {
		struct snvme_queue *q = &ctrl->ioqs[i];
		u16 qid = i + 1;

		ret = snvme_alloc_queue(ctrl, q, qid, depth);
		if (ret)
			return ret;
		q->vector = ctrl->nr_vecs > 1 ? 1 + i % (ctrl->nr_vecs - 1) : 0;
		ret = request_irq(pci_irq_vector(ctrl->pdev, q->vector), snvme_io_irq,
				  IRQF_SHARED, SNVME_NAME "-io", q);
		if (ret)
			return ret;
		q->irq_requested = true;
		ret = snvme_create_io_queue_hw(ctrl, q);
		if (ret)
			return ret;
	}
	return 0;
}

static void snvme_delete_io_queues(struct snvme_ctrl *ctrl)
{
	int i;

	if (!ctrl->ioqs)
		return;
	for (i = 0; i < ctrl->kernel_queues; i++) {
		struct snvme_queue *q = &ctrl->ioqs[i];

		if (q->created && !ctrl->failed) {
			snvme_delete_queue(ctrl, nvme_admin_delete_sq, q->qid);
			snvme_delete_queue(ctrl, nvme_admin_delete_cq, q->qid);
		}
		q->created = false;
	}
}

static void snvme_free_io_queues(struct snvme_ctrl *ctrl)
{
	int i;

	if (!ctrl->ioqs)
		return;
	for (i = 0; i < ctrl->kernel_queues; i++) {
		struct snvme_queue *q = &ctrl->ioqs[i];

		if (q->irq_requested)
			free_irq(pci_irq_vector(ctrl->pdev, q->vector), q);
		snvme_free_queue(ctrl, q);
	}
	kfree(ctrl->ioqs);
	ctrl->ioqs = NULL;
}

/* ---- reset ---------------------------------------------------------------- */

bool snvme_ctrl_resetting(struct snvme_ctrl *ctrl)
{
	bool ret;

	spin_lock(&ctrl->state_lock);
	ret = ctrl->resetting;
	spin_unlock(&ctrl->state_lock);
	return ret;
}

/*
 * Queues a reset unless one is queued or running, the controller failed, or
 * it is being probed or removed. Returns whether a reset is (now) pending.
 */
bool snvme_ctrl_schedule_reset(struct snvme_ctrl *ctrl, const char *why)
{
	bool ok;

	spin_lock(&ctrl->state_lock);
	ok = ctrl->reset_allowed && !READ_ONCE(ctrl->failed);
	if (ok && !ctrl->resetting) {
		ctrl->resetting = true;
		ctrl->reset_why = why;
		queue_work(snvme_wq, &ctrl->reset_work);
	}
	spin_unlock(&ctrl->state_lock);
	return ok;
}

/*
 * Brings a disabled controller back with the same queues: admin queue,
 * enable, Number of Queues (the grant must still cover the split made at
 * probe), then the kernel's I/O queues. User QIDs are not recreated: their
 * groups belong to revoked files.
 */
static int snvme_restart(struct snvme_ctrl *ctrl)
{
	u32 granted;
	int i, ret;

	snvme_init_queue_state(&ctrl->adminq);
	ret = snvme_enable(ctrl);
	if (ret)
		return ret;
	ret = snvme_request_queues(ctrl, ctrl->kernel_queues + ctrl->user_queues, &granted);
	if (ret)
		return ret;
	if (granted < ctrl->kernel_queues + ctrl->user_queues) {
		dev_err(ctrl->dev, "after the reset the controller grants %u I/O queues, %u are in use\n",
			granted, ctrl->kernel_queues + ctrl->user_queues);
		return -EIO;
	}
	for (i = 0; i < ctrl->kernel_queues; i++) {
		struct snvme_queue *q = &ctrl->ioqs[i];

		q->created = false;
		snvme_init_queue_state(q);
		ret = snvme_create_io_queue_hw(ctrl, q);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * The reset (Linux's nvme_reset_work after nvme_dev_disable, in one step):
 * hold the block queues, revoke every open file, disable the controller
 * (CC.EN = 0 deletes every queue and stops all DMA), end the block requests
 * it held (each is retried or failed by snvme_complete_rq), restart, and
 * release the block queues. Only then may the retried requests be issued.
 * Lock order: lifecycle, files_lock, admin_lock (as ioctls and release).
 * A reset that fails fails the controller, before it drops files_lock: a
 * close waiting for that lock must find either its queues gone (the disable
 * succeeded: snvme_chr_queues_gone) or the controller failed (and then waits
 * for the failure's disable), never a controller still running its queues
 * and neither flag.
 */
static void snvme_reset_work(struct work_struct *work)
{
	struct snvme_ctrl *ctrl = container_of(work, struct snvme_ctrl, reset_work);
	int ret;

	dev_warn(ctrl->dev, "resetting the controller (%s)\n", ctrl->reset_why);
	snvme_blk_quiesce(ctrl);
	down_write(&ctrl->lifecycle);
	mutex_lock(&ctrl->files_lock);
	snvme_chr_revoke(ctrl, SNVME_REVOKED_RESET);
	mutex_lock(&ctrl->admin_lock);
	ret = ctrl->failed ? -ENODEV : snvme_disable(ctrl);
	mutex_unlock(&ctrl->admin_lock);
	if (!ret) {
		/* Only now are the user queues gone: CSTS.RDY = 0 (the disable). */
		snvme_chr_queues_gone(ctrl);
		snvme_sync_irqs(ctrl);
		snvme_blk_cancel_all(ctrl);
		ret = snvme_restart(ctrl);
	}
	/*
	 * Before the block queues run again (what they hold must fail, not
	 * retry), and before files_lock is dropped (the comment above). It does
	 * not sleep (but for the test build's delays, these locks held);
	 * fail_work takes none of the locks held here.
	 */
	if (ret)
		snvme_ctrl_fail(ctrl, "reset failed");
	mutex_unlock(&ctrl->files_lock);
	up_write(&ctrl->lifecycle);
	if (!ret) {
		atomic_inc(&ctrl->recovery.resets);
		dev_warn(ctrl->dev, "reset complete\n");
	}
	spin_lock(&ctrl->state_lock);
	ctrl->resetting = false;
	spin_unlock(&ctrl->state_lock);
	snvme_blk_unquiesce(ctrl);
}

/* ---- debugfs: reset, recovery counters, fault injection ------------------ */

/*
 * <debugfs>/snvme/snvme<C>/reset: writing 1 resets the controller as the
 * timeout ladder does (Linux has /sys/class/nvme/nvme<N>/reset_controller)
 * and returns once the reset is over: 0, or EIO if it failed the controller.
 */
static int snvme_debugfs_reset_set(void *data, u64 val)
{
	struct snvme_ctrl *ctrl = data;

	if (val != 1)
		return -EINVAL;
	if (!snvme_ctrl_schedule_reset(ctrl, "requested through debugfs"))
		return -ENODEV;
	flush_work(&ctrl->reset_work);
	return READ_ONCE(ctrl->failed) ? -EIO : 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(snvme_debugfs_reset_fops, NULL, snvme_debugfs_reset_set, "%llu\n");

static int snvme_recovery_show(struct seq_file *m, void *unused)
{
	struct snvme_recovery_counters *r = &((struct snvme_ctrl *)m->private)->recovery;

	seq_printf(m, "timeouts %d\n", atomic_read(&r->timeouts));
	seq_printf(m, "polled %d\n", atomic_read(&r->polled));
	seq_printf(m, "aborts %d\n", atomic_read(&r->aborts));
	seq_printf(m, "aborts_not_aborted %d\n", atomic_read(&r->aborts_not_aborted));
	seq_printf(m, "resets %d\n", atomic_read(&r->resets));
	seq_printf(m, "retries %d\n", atomic_read(&r->retries));
	seq_printf(m, "failed_requests %d\n", atomic_read(&r->failed_requests));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(snvme_recovery);

#ifdef SNVME_FAULT_INJECTION
/*
 * Fault injection, built only with SNVME_FAULT_INJECTION=1 (the QEMU rig
 * sets it; production builds have none of these files). QEMU's controller
 * completes every command at once, so these make the failures it never has:
 *  fail              writing 1 fails the controller (snvme_ctrl_fail)
 *  drop_completions  the next N completions of block requests are discarded
 *                    as if lost: the request times out, its Abort answers
 *                    "not aborted" (the command is done), and the ladder
 *                    goes on to a reset (Linux's fail_io_timeout, in the
 *                    driver because the block layer's needs a debug kernel)
 *  skip_interrupts   the next N I/O interrupts that find a completion leave
 *                    it in the CQ: a lost interrupt, which the ladder's poll
 *                    finds
 *  stuck_disables    the next N disables leave CC.EN = 1 and fail as if
 *                    CSTS.RDY stayed 1 (snvme_inject_stuck_disable)
 *  fail_delay_ms     the next failure sleeps that long between setting
 *                    failed and queueing fail_work (snvme_inject_fail_delay)
 *  prefail_delay_ms  the next failure sleeps that long before it sets
 *                    failed, its caller's locks held
 *                    (snvme_inject_prefail_delay)
 */
static int snvme_debugfs_fail_set(void *data, u64 val)
{
	struct snvme_ctrl *ctrl = data;

	if (val != 1)
		return -EINVAL;
	snvme_ctrl_fail(ctrl, "injected through debugfs");
	/* Another failure may have set failed and not queued fail_work yet. */
	if (!snvme_ctrl_wait_disabled(ctrl))
		return -ETIMEDOUT;
	flush_work(&ctrl->fail_work);	/* and its revocation after the disable */
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(snvme_debugfs_fail_fops, NULL, snvme_debugfs_fail_set, "%llu\n");

static int snvme_debugfs_drop_get(void *data, u64 *val)
{
	*val = atomic_read(&((struct snvme_ctrl *)data)->inject_drop_cqes);
	return 0;
}

static int snvme_debugfs_drop_set(void *data, u64 val)
{
	if (val > INT_MAX)
		return -EINVAL;
	atomic_set(&((struct snvme_ctrl *)data)->inject_drop_cqes, val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(snvme_debugfs_drop_fops, snvme_debugfs_drop_get,
			 snvme_debugfs_drop_set, "%llu\n");

static int snvme_debugfs_skip_get(void *data, u64 *val)
{
	*val = atomic_read(&((struct snvme_ctrl *)data)->inject_skip_irqs);
	return 0;
}

static int snvme_debugfs_skip_set(void *data, u64 val)
{
	if (val > INT_MAX)
		return -EINVAL;
	atomic_set(&((struct snvme_ctrl *)data)->inject_skip_irqs, val);
	return 0;
}
DEFINE_DEBUGFS_ATTRIBUTE(snvme_debugfs_skip_fops, snvme_debugfs_skip_get,
			 snvme_debugfs_skip_set, "%llu\n");

/* A counter knob of 0..INT_MAX over an atomic_t of struct snvme_ctrl. */
#define SNVME_INJECT_KNOB(name, field)					\
static int snvme_debugfs_##name##_get(void *data, u64 *val)		\
{									\
	*val = atomic_read(&((struct snvme_ctrl *)data)->field);	\
	return 0;							\
}									\
static int snvme_debugfs_##name##_set(void *data, u64 val)		\
{									\
	if (val > INT_MAX)						\
		return -EINVAL;						\
	atomic_set(&((struct snvme_ctrl *)data)->field, val);		\
	return 0;							\
}									\
DEFINE_DEBUGFS_ATTRIBUTE(snvme_debugfs_##name##_fops, snvme_debugfs_##name##_get, \
			 snvme_debugfs_##name##_set, "%llu\n")

SNVME_INJECT_KNOB(stuck, inject_stuck_disables);
SNVME_INJECT_KNOB(fail_delay, inject_fail_delay_ms);
SNVME_INJECT_KNOB(prefail_delay, inject_prefail_delay_ms);

static void snvme_debugfs_add_injection(struct snvme_ctrl *ctrl)
{
	debugfs_create_file_unsafe("fail", 0200, ctrl->debugfs, ctrl,
				   &snvme_debugfs_fail_fops);
	debugfs_create_file_unsafe("drop_completions", 0600, ctrl->debugfs, ctrl,
				   &snvme_debugfs_drop_fops);
	debugfs_create_file_unsafe("skip_interrupts", 0600, ctrl->debugfs, ctrl,
				   &snvme_debugfs_skip_fops);
	debugfs_create_file_unsafe("stuck_disables", 0600, ctrl->debugfs, ctrl,
				   &snvme_debugfs_stuck_fops);
	debugfs_create_file_unsafe("fail_delay_ms", 0600, ctrl->debugfs, ctrl,
				   &snvme_debugfs_fail_delay_fops);
	debugfs_create_file_unsafe("prefail_delay_ms", 0600, ctrl->debugfs, ctrl,
				   &snvme_debugfs_prefail_delay_fops);
}
#else
static void snvme_debugfs_add_injection(struct snvme_ctrl *ctrl)
{
}
#endif

static void snvme_debugfs_add(struct snvme_ctrl *ctrl)
{
	char name[16];

	snprintf(name, sizeof(name), SNVME_NAME "%d", ctrl->instance);
	ctrl->debugfs = debugfs_create_dir(name, snvme_debugfs);
	debugfs_create_file_unsafe("reset", 0200, ctrl->debugfs, ctrl,
				   &snvme_debugfs_reset_fops);
	debugfs_create_file("recovery", 0400, ctrl->debugfs, ctrl, &snvme_recovery_fops);
	snvme_debugfs_add_injection(ctrl);
}

static void snvme_ctrl_release(struct kref *ref)
{
	struct snvme_ctrl *ctrl = container_of(ref, struct snvme_ctrl, ref);

	ida_free(&snvme_instance_ida, ctrl->instance);
	bitmap_free(ctrl->user_qid_map);
	pci_dev_put(ctrl->pdev);
	kfree(ctrl);
}

void snvme_ctrl_put(struct snvme_ctrl *ctrl)
{
	kref_put(&ctrl->ref, snvme_ctrl_release);
}

static int snvme_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct snvme_ctrl *ctrl;
	int ret;

	ctrl = kzalloc(sizeof(*ctrl), GFP_KERNEL);
	if (!ctrl)
		return -ENOMEM;
	kref_init(&ctrl->ref);
	ctrl->pdev = pci_dev_get(pdev);
	ctrl->dev = &pdev->dev;
	init_rwsem(&ctrl->lifecycle);
	mutex_init(&ctrl->admin_lock);
	init_completion(&ctrl->admin_done);
	init_completion(&ctrl->disabled);
	mutex_init(&ctrl->files_lock);
	spin_lock_init(&ctrl->files_spin);
	INIT_LIST_HEAD(&ctrl->files);
	init_waitqueue_head(&ctrl->revoke_wait);
	spin_lock_init(&ctrl->uq_lock);
	spin_lock_init(&ctrl->state_lock);
	INIT_WORK(&ctrl->fail_work, snvme_fail_work);
	INIT_WORK(&ctrl->reset_work, snvme_reset_work);
	ret = ida_alloc_max(&snvme_instance_ida, SNVME_MAX_CTRLS - 1, GFP_KERNEL);
	if (ret < 0) {
		pci_dev_put(pdev);
		kfree(ctrl);
		return ret;
	}
	ctrl->instance = ret;
	pci_set_drvdata(pdev, ctrl);

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto put_ctrl;
	pci_set_master(pdev);
	ret = dma_set_mask_and_coherent(ctrl->dev, DMA_BIT_MASK(64));
	if (ret)
		goto disable_pci;
	ret = pci_request_mem_regions(pdev, SNVME_NAME);
	if (ret)
		goto disable_pci;
	ctrl->bar_len = pci_resource_len(pdev, 0);
	if (ctrl->bar_len < SNVME_DB_OFFSET + PAGE_SIZE) {
		dev_err(ctrl->dev, "BAR0 is %llu bytes, need at least %lu\n",
			(u64)ctrl->bar_len, SNVME_DB_OFFSET + PAGE_SIZE);
		ret = -ENODEV;
		goto release_regions;
	}
	ctrl->bar = pci_iomap(pdev, 0, 0);
	if (!ctrl->bar) {
		ret = -ENOMEM;
		goto release_regions;
	}
	ctrl->cap = lo_hi_readq(ctrl->bar + NVME_REG_CAP);
	if (ctrl->cap == ~0ull) {
		dev_err(ctrl->dev, "CAP reads all ones: device not responding\n");
		ret = -ENODEV;
		goto unmap_bar;
	}
	ctrl->vs = snvme_readl(ctrl, NVME_REG_VS);
	ctrl->db_stride = 4u << NVME_CAP_STRIDE(ctrl->cap);
	/* CAP.TO is in 500 ms units (NVMe Base Spec 2.0, 3.1.3.1). */
	ctrl->timeout_ms = (NVME_CAP_TIMEOUT(ctrl->cap) + 1) * 500;
	if (!(NVME_CAP_CSS(ctrl->cap) & NVME_CAP_CSS_NVM)) {
		dev_err(ctrl->dev, "CAP.CSS 0x%llx lacks the NVM command set\n",
			NVME_CAP_CSS(ctrl->cap));
		ret = -ENODEV;
		goto unmap_bar;
	}
	if (NVME_CAP_MPSMIN(ctrl->cap) > 0) {
		dev_err(ctrl->dev, "CAP.MPSMIN %llu: 4 KiB pages unsupported\n",
			NVME_CAP_MPSMIN(ctrl->cap));
		ret = -ENODEV;
		goto unmap_bar;
	}

	/* 1. reset */
	ret = snvme_disable(ctrl);
	if (ret)
		goto unmap_bar;
	/* 2. admin queue and interrupts */
	ret = snvme_alloc_queue(ctrl, &ctrl->adminq, 0, SNVME_ADMIN_DEPTH);
	if (ret)
		goto unmap_bar;
	ret = pci_alloc_irq_vectors(pdev, 1, 1 + snvme_kernel_queues, PCI_IRQ_ALL_TYPES);
	if (ret < 0)
		goto free_adminq;
	ctrl->nr_vecs = ret;
	ret = request_irq(pci_irq_vector(pdev, 0), snvme_admin_irq, IRQF_SHARED,
			  SNVME_NAME "-admin", ctrl);
	if (ret)
		goto free_vecs;
	/* 3. enable */
	ret = snvme_enable(ctrl);
	if (ret)
		goto free_admin_irq;
	/* 4. identify, queue count, kernel I/O queues */
	ret = snvme_identify_ctrl(ctrl);
	if (ret)
		goto disable_ctrl;
	ret = snvme_set_queue_count(ctrl);
	if (ret)
		goto disable_ctrl;
	ctrl->user_qid_map = bitmap_zalloc(max_t(u16, ctrl->user_queues, 1), GFP_KERNEL);
	if (!ctrl->user_qid_map) {
		ret = -ENOMEM;
		goto disable_ctrl;
	}
	ret = snvme_create_io_queues(ctrl);
	if (ret)
		goto delete_io_queues;
	/* 5. namespaces and block devices */
	ret = snvme_blk_init(ctrl);
	if (ret)
		goto remove_blk;
	/* 6. character device for userspace */
	ret = snvme_chr_add(ctrl);
	if (ret)
		goto remove_blk;
	snvme_debugfs_add(ctrl);
	spin_lock(&ctrl->state_lock);
	ctrl->reset_allowed = true;
	spin_unlock(&ctrl->state_lock);
	dev_info(ctrl->dev, "snvme%d: %.40s, %d namespace(s), MDTS %u bytes, DSTRD %u bytes\n",
		 ctrl->instance, ctrl->model, ctrl->nr_ns, ctrl->max_xfer, ctrl->db_stride);
	return 0;

remove_blk:
	snvme_blk_remove(ctrl);
delete_io_queues:
	snvme_delete_io_queues(ctrl);
disable_ctrl:
	mutex_lock(&ctrl->admin_lock);
	snvme_disable(ctrl);
	snvme_stop_dma(ctrl);
	ctrl->failed = true;
	mutex_unlock(&ctrl->admin_lock);
	snvme_retire_fail_work(ctrl);
	snvme_blk_free(ctrl);
	snvme_free_io_queues(ctrl);
free_admin_irq:
	free_irq(pci_irq_vector(pdev, 0), ctrl);
free_vecs:
	pci_free_irq_vectors(pdev);
free_adminq:
	snvme_free_queue(ctrl, &ctrl->adminq);
unmap_bar:
	pci_iounmap(pdev, ctrl->bar);
release_regions:
	pci_release_mem_regions(pdev);
disable_pci:
	pci_clear_master(pdev);
	pci_disable_device(pdev);
put_ctrl:
	pci_set_drvdata(pdev, NULL);
	snvme_ctrl_put(ctrl);
	return ret;
}

/*
 * Teardown order: block devices first (flushes dirty data through the
 * kernel's queues), then userspace state (delete user queues on the
 * controller, then unmap and unpin), then the kernel's queues, then
 * shutdown and disable the controller, then release interrupts and memory.
 */
static void snvme_remove(struct pci_dev *pdev)
{
	struct snvme_ctrl *ctrl = pci_get_drvdata(pdev);

	/* No reset from now on (a timeout then fails the controller instead). */
	spin_lock(&ctrl->state_lock);
	ctrl->reset_allowed = false;
	spin_unlock(&ctrl->state_lock);
	/* Waits for running debugfs writes; none can start afterwards. */
	debugfs_remove_recursive(ctrl->debugfs);
	flush_work(&ctrl->reset_work);
	snvme_blk_remove(ctrl);
	snvme_chr_remove(ctrl);
	snvme_delete_io_queues(ctrl);
	snvme_ctrl_stop(ctrl);
	snvme_blk_free(ctrl);
	snvme_free_io_queues(ctrl);
	free_irq(pci_irq_vector(pdev, 0), ctrl);
	pci_free_irq_vectors(pdev);
	snvme_free_queue(ctrl, &ctrl->adminq);
	pci_iounmap(pdev, ctrl->bar);
	ctrl->bar = NULL;
	pci_release_mem_regions(pdev);
	pci_clear_master(pdev);
	pci_disable_device(pdev);
	pci_set_drvdata(pdev, NULL);
	dev_info(&pdev->dev, "snvme%d: unbound\n", ctrl->instance);
	snvme_ctrl_put(ctrl);
}

/*
 * System shutdown, reboot and kexec (device_shutdown() calls it under the
 * device lock, so never beside remove()): the controller must not DMA once
 * the next kernel or the firmware owns memory. Nothing is freed. No reset
 * from now on, and a running one finishes first; then the controller's last
 * stop, as in remove() (snvme_ctrl_stop); then open files are revoked and
 * block requests in flight failed, as fail_work would.
 */
static void snvme_pci_shutdown(struct pci_dev *pdev)
{
	struct snvme_ctrl *ctrl = pci_get_drvdata(pdev);

	if (!ctrl)
		return;
	spin_lock(&ctrl->state_lock);
	ctrl->reset_allowed = false;
	spin_unlock(&ctrl->state_lock);
	flush_work(&ctrl->reset_work);
	snvme_ctrl_stop(ctrl);
	snvme_release_users(ctrl);
	/* The QEMU rig's shutdown boot looks for this line (docs/driver.md). */
	dev_info(&pdev->dev,
		 "snvme%d: stopped for system shutdown: CSTS.RDY %u, bus mastering off, users released\n",
		 ctrl->instance, snvme_readl(ctrl, NVME_REG_CSTS) & NVME_CSTS_RDY);
}

/* Empty: snvme binds only devices whose driver_override names it. */
static const struct pci_device_id snvme_ids[] = {
	{ 0, }
};

static struct pci_driver snvme_pci_driver = {
	.name = SNVME_NAME,
	.id_table = snvme_ids,
	.probe = snvme_probe,
	.remove = snvme_remove,
	.shutdown = snvme_pci_shutdown,
};

/* ---- /dev/snvme-control -------------------------------------------------- */

static DEFINE_MUTEX(snvme_control_lock);

/* Parses exactly "DDDD:BB:DD.F" (hex), the form sysfs uses. */
static struct pci_dev *snvme_lookup_pci(const char *addr)
{
	unsigned int domain, bus, slot, fn;
	int i;

	for (i = 0; i < 12; i++) {
		bool sep = i == 4 || i == 7 || i == 10;

		if (sep ? addr[i] != (i == 10 ? '.' : ':') : !isxdigit(addr[i]))
			break;
	}
	if (i != 12 || addr[12] ||
	    sscanf(addr, "%4x:%2x:%2x.%1x", &domain, &bus, &slot, &fn) != 4 ||
	    slot > 0x1f || fn > 7) {
		pr_err(SNVME_NAME ": pci_addr \"%.31s\" is not DDDD:BB:DD.F\n", addr);
		return ERR_PTR(-EINVAL);
	}
	return pci_get_domain_bus_and_slot(domain, bus, PCI_DEVFN(slot, fn)) ?:
	       ERR_PTR(-ENODEV);
}

static int snvme_control_bind(struct snvme_bind *b, bool bind)
{
	struct pci_dev *pdev;
	int ret = 0;

	b->pci_addr[sizeof(b->pci_addr) - 1] = '\0';
	pdev = snvme_lookup_pci(b->pci_addr);
	if (IS_ERR(pdev))
		return PTR_ERR(pdev);
	if (pdev->class != PCI_CLASS_STORAGE_EXPRESS) {
		pci_err(pdev, "class 0x%06x is not NVMe (0x010802): refusing\n", pdev->class);
		ret = -ENODEV;
		goto out;
	}
	b->instance = -1;
	if (!bind) {
		if (pdev->dev.driver != &snvme_pci_driver.driver) {
			ret = -ENODEV;
			goto out;
		}
		device_release_driver(&pdev->dev);
		snvme_set_driver_override(pdev, "");
		goto out;
	}
	if (pdev->dev.driver == &snvme_pci_driver.driver) {
		ret = -EALREADY;
		goto out;
	}
	if (pdev->dev.driver) {
		pci_info(pdev, "detaching from %s\n", pdev->dev.driver->name);
		device_release_driver(&pdev->dev);
	}
	ret = snvme_set_driver_override(pdev, SNVME_NAME);
	if (ret)
		goto out;
	ret = device_attach(&pdev->dev);
	if (ret <= 0) {
		pci_err(pdev, "snvme probe failed (%d)\n", ret);
		snvme_set_driver_override(pdev, "");
		ret = ret ?: -EIO;
		goto out;
	}
	ret = 0;
	device_lock(&pdev->dev);
	if (pdev->dev.driver == &snvme_pci_driver.driver && pci_get_drvdata(pdev))
		b->instance = ((struct snvme_ctrl *)pci_get_drvdata(pdev))->instance;
	device_unlock(&pdev->dev);
out:
	pci_dev_put(pdev);
	return ret;
}

static long snvme_control_ioctl(struct file *filp, unsigned int cmd,
				unsigned long arg)
{
	struct snvme_bind b;
	int ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (cmd != SNVME_IOC_BIND && cmd != SNVME_IOC_UNBIND)
		return -ENOTTY;
	if (copy_from_user(&b, (void __user *)arg, sizeof(b)))
		return -EFAULT;
	if (b.hdr.abi_version != SNVME_ABI_VERSION) {
		pr_err(SNVME_NAME ": control: abi_version %u unsupported (driver speaks %u)\n",
		       b.hdr.abi_version, SNVME_ABI_VERSION);
		return -EPROTO;
	}
	if (b.hdr.argsz != sizeof(b)) {
		pr_err(SNVME_NAME ": control: argsz %u, expected %zu\n", b.hdr.argsz, sizeof(b));
		return -EINVAL;
	}
	mutex_lock(&snvme_control_lock);
	ret = snvme_control_bind(&b, cmd == SNVME_IOC_BIND);
	mutex_unlock(&snvme_control_lock);
	if (ret)
		return ret;
	return copy_to_user((void __user *)arg, &b, sizeof(b)) ? -EFAULT : 0;
}

static const struct file_operations snvme_control_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = snvme_control_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice snvme_control = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "snvme-control",
	.fops = &snvme_control_fops,
	.mode = 0600,
};

/* ---- debugfs: module-wide leak counters -------------------------------- */

static int snvme_stats_show(struct seq_file *m, void *unused)
{
	seq_printf(m, "pinned_pages %lld\n", atomic64_read(&snvme_totals.pinned_pages));
	seq_printf(m, "dma_maps %d\n", atomic_read(&snvme_totals.dma_maps));
	seq_printf(m, "queue_groups %d\n", atomic_read(&snvme_totals.queue_groups));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(snvme_stats);

static int __init snvme_init(void)
{
	int ret;

	/*
	 * CPU pages are used as NVMe memory pages (CC.MPS = 0, 4 KiB): a DMA
	 * map's addrs[] holds one PRP entry per CPU page, and the rings and the
	 * doorbell window are mapped to userspace a CPU page at a time. A
	 * kernel with larger pages (arm64 64K, ppc64) would need them split.
	 */
	BUILD_BUG_ON(PAGE_SIZE != SNVME_NVME_PAGE);

	snvme_wq = alloc_workqueue(SNVME_NAME, WQ_UNBOUND | WQ_MEM_RECLAIM, 0);
	if (!snvme_wq)
		return -ENOMEM;
	snvme_debugfs = debugfs_create_dir(SNVME_NAME, NULL);
	debugfs_create_file("stats", 0400, snvme_debugfs, NULL, &snvme_stats_fops);
	ret = snvme_chr_module_init();
	if (ret)
		goto remove_debugfs;
	ret = pci_register_driver(&snvme_pci_driver);
	if (ret)
		goto chr_exit;
	ret = misc_register(&snvme_control);
	if (ret)
		goto unregister_pci;
	return 0;

unregister_pci:
	pci_unregister_driver(&snvme_pci_driver);
chr_exit:
	snvme_chr_module_exit();
remove_debugfs:
	debugfs_remove_recursive(snvme_debugfs);
	destroy_workqueue(snvme_wq);
	return ret;
}

static void __exit snvme_exit(void)
{
	misc_deregister(&snvme_control);
	pci_unregister_driver(&snvme_pci_driver);
	snvme_chr_module_exit();
	debugfs_remove_recursive(snvme_debugfs);
	ida_destroy(&snvme_instance_ida);
	destroy_workqueue(snvme_wq);
}

module_init(snvme_init);
module_exit(snvme_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("NVMe driver with a block device and userspace queue groups");
MODULE_VERSION("0.1");
