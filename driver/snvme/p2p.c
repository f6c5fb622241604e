// SPDX-License-Identifier: GPL-2.0
/*
 * DMA_MAP of GPU memory through NVIDIA's peer-to-peer API (nv-p2p.h).
 * Built only when Kbuild finds nv-p2p.h (SNVME_HAVE_NV_P2P); otherwise
 * DMA_MAP with kind SNVME_DMA_GPU returns -EOPNOTSUPP.
 */
#include "compat.h"
#include "snvme.h"

#ifdef SNVME_HAVE_NV_P2P
#include <nv-p2p.h>

#define SNVME_GPU_PAGE (64u * 1024)	/* NVIDIA_P2P_PAGE_SIZE_64KB */

/*
 * Claims the teardown of a GPU map: sets REVOKED and returns the state
 * before it. Of the free callback and DMA_UNMAP (or the close that unmaps),
 * exactly one finds REVOKED clear, and that one frees the pages. The map
 * itself is always freed by the unmap side, after the callback is done with
 * it (p2p_done, snvme_gpu_callback_done).
 */
static int snvme_p2p_claim(struct snvme_dmamap *m)
{
	return atomic_fetch_or(SNVME_P2P_REVOKED, &m->p2p_state);
}

/*
 * The GPU memory is being freed while mapped (the owner skipped DMA_UNMAP).
 * The controller may still DMA into it, so fail the controller (disable =
 * no DMA) before the pages go; the mapping is then only freed here.
 *
 * A map kept at close (f->dma_kept, snvme_dmamap_release) holds a reference
 * to the controller for this callback (SNVME_P2P_CTRL_REF), since the file
 * whose reference kept the controller is closed: it is dropped last, after
 * every use of the controller, and may be the last one (snvme_ctrl_release:
 * process context, no lock of ours held, so the lock order is unchanged).
 * The claim reads CTRL_REF in the same atomic step that sets REVOKED, so
 * a close racing with this either gave its reference to this callback or
 * kept none.
 */
static void snvme_p2p_free_cb(void *data)
{
	struct snvme_dmamap *m = data;
	struct snvme_ctrl *ctrl = m->ctrl;
	int old = snvme_p2p_claim(m);

	if (old & SNVME_P2P_REVOKED)
		return;
	snvme_ctrl_fail(ctrl, "GPU memory freed while DMA-mapped");
	/*
	 * The disable must finish before the pages can be reused; the callback
	 * runs in process context (GDRCopy and nvidia-peermem sleep in theirs).
	 * Wait for the disable, not for fail_work: another failure may have set
	 * failed and not queued it yet. The pages go when this returns, whatever
	 * it does: past the deadline all it can do is say so.
	 */
	if (!snvme_ctrl_wait_disabled(ctrl))
		dev_err(ctrl->dev, "GPU memory at 0x%llx (%llu bytes) freed while the failed controller, not disabled in time, may still DMA into it\n",
			m->vaddr, m->length);
	if (m->p2p_mapping)
		nvidia_p2p_free_dma_mapping(m->p2p_mapping);
	nvidia_p2p_free_page_table(m->p2p_table);
	/* The last use of m: a DMA_UNMAP or close that lost the claim frees it now. */
	complete_all(&m->p2p_done);
	if (old & SNVME_P2P_CTRL_REF)
		snvme_ctrl_put(ctrl);
}

int snvme_gpu_map(struct snvme_ctrl *ctrl, struct snvme_dmamap *m, u64 vaddr,
		  u64 length)
{
	struct nvidia_p2p_page_table *pt = NULL;
	struct nvidia_p2p_dma_mapping *dm = NULL;
	unsigned long i, k, per = SNVME_GPU_PAGE / PAGE_SIZE;
	int ret;

	if (!IS_ALIGNED(vaddr, SNVME_GPU_PAGE) || !IS_ALIGNED(length, SNVME_GPU_PAGE)) {
		dev_err_ratelimited(ctrl->dev, "DMA_MAP(GPU): vaddr 0x%llx and length %llu must be 64 KiB multiples\n",
				    vaddr, length);
		return -EINVAL;
	}
	m->ctrl = ctrl;
	ret = nvidia_p2p_get_pages(0, 0, vaddr, length, &pt, snvme_p2p_free_cb, m);
	if (ret) {
		dev_err_ratelimited(ctrl->dev, "nvidia_p2p_get_pages(0x%llx, %llu): %d\n",
				    vaddr, length, ret);
		return ret;
	}
	m->p2p_table = pt;
	ret = nvidia_p2p_dma_map_pages(ctrl->pdev, pt, &dm);
	if (ret) {
		dev_err_ratelimited(ctrl->dev, "nvidia_p2p_dma_map_pages: %d\n", ret);
		goto put_pages;
	}
	m->p2p_mapping = dm;
	if (pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB || dm->entries * per != m->nr_pages) {
		dev_err(ctrl->dev, "nv-p2p returned %u entries of size type %u for %lu pages\n",
			dm->entries, pt->page_size, m->nr_pages);
		ret = -EIO;
		goto unmap;
	}
	for (i = 0; i < dm->entries; i++)
		for (k = 0; k < per; k++)
			m->addrs[i * per + k] = dm->dma_addresses[i] + k * PAGE_SIZE;
	return 0;

unmap:
	nvidia_p2p_dma_unmap_pages(ctrl->pdev, pt, dm);
	m->p2p_mapping = NULL;
put_pages:
	nvidia_p2p_put_pages(0, 0, vaddr, pt);
	m->p2p_table = NULL;
	return ret;
}

void snvme_gpu_unmap(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
	if (!m->p2p_table)
		return;
	if (snvme_p2p_claim(m) & SNVME_P2P_REVOKED) {
		/*
		 * The free callback claimed it first (DMA_UNMAP, close and
		 * remove() unmap a map once, under f->lock) and may still be
		 * failing the controller and reading m.
		 */
		m->p2p_callback_owns = true;
		return;
	}
	if (m->p2p_mapping)
		nvidia_p2p_dma_unmap_pages(ctrl->pdev, m->p2p_table, m->p2p_mapping);
	nvidia_p2p_put_pages(0, 0, m->vaddr, m->p2p_table);
}

/*
 * Before a GPU map is freed, with no lock of ours held: when the free
 * callback claimed it (p2p_callback_owns), waits until the callback is done
 * with it. The callback's own waits are bounded (snvme_ctrl_wait_disabled:
 * snvme_ctrl_disable_bound_ms), so this waits at most that long plus
 * SNVME_DISABLED_SLACK_MS; false if the callback is still not done then:
 * the caller must keep the map (leak it) rather than free memory the
 * callback reads.
 */
bool snvme_gpu_callback_done(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
	unsigned long ms = snvme_ctrl_disable_bound_ms(ctrl) +
			   SNVME_DISABLED_SLACK_MS;

	if (!m->p2p_callback_owns)
		return true;
	if (wait_for_completion_timeout(&m->p2p_done, msecs_to_jiffies(ms)))
		return true;
	dev_err(ctrl->dev, "the free callback of GPU map 0x%llx (%llu bytes) did not end within %lu ms: its handle is kept\n",
		m->vaddr, m->length, ms);
	return false;
}

#else /* !SNVME_HAVE_NV_P2P */

int snvme_gpu_map(struct snvme_ctrl *ctrl, struct snvme_dmamap *m, u64 vaddr,
		  u64 length)
{
	dev_err_ratelimited(ctrl->dev, "DMA_MAP(GPU): built without nv-p2p.h\n");
	return -EOPNOTSUPP;
}

void snvme_gpu_unmap(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
}

bool snvme_gpu_callback_done(struct snvme_ctrl *ctrl, struct snvme_dmamap *m)
{
	return true;
}

#endif
