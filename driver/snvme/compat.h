/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Differences between the kernel lines snvme builds against: Debian 12's
 * 6.1 and bookworm-backports' 6.12. Each shim names the release that
 * changed the interface.
 */
#ifndef SNVME_COMPAT_H
#define SNVME_COMPAT_H

#include <linux/version.h>
#include <linux/blk-mq.h>
#include <linux/device.h>
#include <linux/mm.h>

/* 6.4: class_create() lost its owner argument. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
#define snvme_class_create(name) class_create(name)
#else
#define snvme_class_create(name) class_create(THIS_MODULE, name)
#endif

/* 6.2: class devnode callbacks take a const struct device. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
#define SNVME_DEVNODE_CONST const
#else
#define SNVME_DEVNODE_CONST
#endif

/* 6.3: vma->vm_flags became read-only behind vm_flags_set() and vm_flags_clear(). */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 3, 0)
static inline void vm_flags_set(struct vm_area_struct *vma, unsigned long flags)
{
	vma->vm_flags |= flags;
}

static inline void vm_flags_clear(struct vm_area_struct *vma, unsigned long flags)
{
	vma->vm_flags &= ~flags;
}
#endif

/* 6.14 made merging the default and removed BLK_MQ_F_SHOULD_MERGE. */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 14, 0)
#define SNVME_MQ_F_MERGE BLK_MQ_F_SHOULD_MERGE
#else
#define SNVME_MQ_F_MERGE 0
#endif

/*
 * Request queue limits of one namespace, applied by snvme_alloc_disk().
 * 6.9: blk_mq_alloc_disk() takes struct queue_limits; 6.11: the write
 * cache and FUA moved from blk_queue_write_cache() into limits.features.
 */
struct snvme_limits {
	unsigned int lba_size;		/* bytes */
	unsigned int max_hw_sectors;	/* 512-byte units */
	unsigned short max_segments;
	unsigned long virt_boundary_mask;
	bool write_cache;
	bool fua;
};

static inline struct gendisk *snvme_alloc_disk(struct blk_mq_tag_set *set,
					       const struct snvme_limits *l,
					       void *queuedata)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 9, 0)
	struct queue_limits lim = {
		.logical_block_size = l->lba_size,
		.physical_block_size = l->lba_size,
		.io_min = l->lba_size,
		.max_hw_sectors = l->max_hw_sectors,
		.max_segments = l->max_segments,
		.virt_boundary_mask = l->virt_boundary_mask,
	};
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
	if (l->write_cache)
		lim.features |= BLK_FEAT_WRITE_CACHE;
	if (l->fua)
		lim.features |= BLK_FEAT_FUA;
#endif
	return blk_mq_alloc_disk(set, &lim, queuedata);
#else
	struct gendisk *disk = blk_mq_alloc_disk(set, queuedata);
	struct request_queue *q;

	if (IS_ERR(disk))
		return disk;
	q = disk->queue;
	blk_queue_logical_block_size(q, l->lba_size);
	blk_queue_physical_block_size(q, l->lba_size);
	blk_queue_io_min(q, l->lba_size);
	blk_queue_max_hw_sectors(q, l->max_hw_sectors);
	blk_queue_max_segments(q, l->max_segments);
	blk_queue_virt_boundary(q, l->virt_boundary_mask);
	blk_queue_write_cache(q, l->write_cache, l->fua);
	return disk;
#endif
}

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 9, 0) && \
	LINUX_VERSION_CODE < KERNEL_VERSION(6, 11, 0)
#error "6.9 and 6.10 are not supported: write cache limits changed twice there"
#endif

/*
 * driver_override: newer kernels (and Debian's 6.12 through a stable
 * backport, so this is detected by Kbuild, not by version) keep it in
 * struct device behind device_set_driver_override(); 6.1 keeps it in
 * struct pci_dev. An empty name clears the override.
 */
#include <linux/pci.h>
static inline int snvme_set_driver_override(struct pci_dev *pdev, const char *name)
{
#ifdef SNVME_HAVE_DEVICE_DRIVER_OVERRIDE
	return __device_set_driver_override(&pdev->dev, name, strlen(name));
#else
	return driver_set_override(&pdev->dev, &pdev->driver_override, name,
				   strlen(name));
#endif
}

/*
 * Pinning: snvme uses pin_user_pages_fast(), whose signature is the same on
 * both lines (6.5 removed the vmas argument of pin_user_pages(), which we
 * therefore do not call).
 */

#endif /* SNVME_COMPAT_H */
