/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * snvme userspace ABI: the per-controller character device /dev/snvme<C>
 * and the control device /dev/snvme-control.
 *
 * Rules every caller follows (libnvm does, see docs/driver.md):
 *  1. Call SNVME_IOC_GET_INFO first with hdr.abi_version = SNVME_ABI_VERSION
 *     and hdr.argsz = sizeof(struct snvme_info); refuse to go on unless the
 *     driver's abi_version equals SNVME_ABI_VERSION and every capability bit
 *     the caller needs is set in caps.
 *  2. Every ioctl argument starts with struct snvme_hdr; the driver rejects a
 *     foreign abi_version with EPROTO and a wrong argsz with EINVAL.
 *  3. All structures have the same layout on LP64 and ILP32 (explicit padding,
 *     __u64 for pointers); sizes are asserted at the bottom of this file.
 *  4. CREATE/DESTROY_QUEUE_GROUP, DMA_MAP/UNMAP, ABORT and SEAL need the
 *     file open for writing (O_RDWR): EBADF otherwise. GET_INFO and
 *     IDENTIFY only read; REVOKE only ends leases (SNVME_REVOKE_OTHERS
 *     needs CAP_SYS_ADMIN), and works on a file open read-only.
 *
 * Memory map of /dev/snvme<C> (mmap offsets in bytes):
 *  SNVME_MMAP_DOORBELLS        the controller's doorbell registers only
 *                              (SQ0TDBL at BAR0 + 1000h, NVMe Base Spec 2.0, 3.1.3),
 *                              info.doorbell_bytes long, never the rest of BAR0
 *  SNVME_MMAP_STATUS           this file's status page, read-only,
 *                              SNVME_STATUS_BYTES long (struct snvme_status)
 *  snvme_queue_desc.sq_offset  one SQ ring, DMA-coherent, sq_bytes long
 *  snvme_queue_desc.cq_offset  one CQ ring, DMA-coherent, cq_bytes long
 *
 * Revocation: a controller reset, a controller failure or the removal of
 * the controller revokes every file open at that moment (docs/driver.md,
 * "What a reset does to userspace"), and SNVME_IOC_REVOKE revokes the
 * files a lease broker names. Its queue groups no longer exist on the
 * controller; its later ioctls and mmaps fail with ESTALE (reset, REVOKE) or
 * ENODEV (failure, removal); its status page reads csts = all ones; poll()
 * reports EPOLLPRI | EPOLLERR, plus EPOLLHUP once the controller is failed
 * or gone. Its DMA maps stay pinned until the file is closed; its QIDs stay
 * reserved until then after a reset or failure, and are freed at once by
 * REVOKE and removal, whose revoked mappings fault in stand-ins instead of
 * SIGBUS. A new open() after a reset or REVOKE gets a working file.
 */
#ifndef _UAPI_LINUX_SNVME_H
#define _UAPI_LINUX_SNVME_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define SNVME_ABI_VERSION 1u

/* Capability bits in snvme_info.caps. */
#define SNVME_CAP_QUEUE_GROUPS (1ull << 0) /* CREATE/DESTROY_QUEUE_GROUP */
#define SNVME_CAP_DMA_HOST (1ull << 1)	   /* DMA_MAP of user host memory */
#define SNVME_CAP_DMA_GPU (1ull << 2)	   /* DMA_MAP of GPU memory (nv-p2p) */
#define SNVME_CAP_IOMMU (1ull << 3)	   /* bus addresses are IOMMU IOVAs */
#define SNVME_CAP_SGL (1ull << 4)	   /* controller supports SGLs for NVM I/O */
#define SNVME_CAP_VWC (1ull << 5)	   /* volatile write cache present */
#define SNVME_CAP_IDENTIFY (1ull << 6)	   /* SNVME_IOC_IDENTIFY */
#define SNVME_CAP_ABORT (1ull << 7)	   /* SNVME_IOC_ABORT */
#define SNVME_CAP_STATUS (1ull << 8)	   /* status page, poll() and ESTALE on revocation */
#define SNVME_CAP_SEAL (1ull << 9)	   /* SNVME_IOC_SEAL */
#define SNVME_CAP_REVOKE (1ull << 10)	   /* SNVME_IOC_REVOKE, stand-ins on revoked mappings */

/* Header of every ioctl argument. */
struct snvme_hdr {
	__u32 abi_version; /* in: SNVME_ABI_VERSION; out: the driver's */
	__u32 argsz;	   /* in: sizeof the whole argument structure */
};

/* LBA Format Data Structure (NVM Command Set Spec 1.0, Figure 98), decoded. */
struct snvme_lba_format {
	__u16 metadata_bytes; /* MS */
	__u8 lba_shift;	      /* LBADS: LBA size is 1 << lba_shift bytes */
	__u8 relative_perf;   /* RP, 0 = best */
};

#define SNVME_MAX_LBA_FORMATS 16

/* Per-namespace facts from Identify Namespace (NVMe Command Set Spec 1.0, 4.1.5.1). */
struct snvme_ns_info {
	__u32 nsid;		/* 0 = slot unused */
	__u8 flbas_index;	/* index of the formatted LBA format */
	__u8 nlbaf;		/* number of LBA formats (1's based here) */
	__u8 lba_shift;		/* of the formatted format */
	__u8 pad0;
	__u64 nsze;		/* namespace size in logical blocks */
	__u64 ncap;		/* namespace capacity in logical blocks */
	struct snvme_lba_format lbaf[SNVME_MAX_LBA_FORMATS];
};

#define SNVME_MAX_NAMESPACES 4 /* namespaces reported in snvme_info */

/* SNVME_IOC_GET_INFO: controller facts, queue budget and leak counters. */
struct snvme_info {
	struct snvme_hdr hdr;
	__u64 caps;		 /* SNVME_CAP_* */
	__u64 cap;		 /* CAP register, NVMe Base Spec 2.0, 3.1.3.1 */
	__u32 vs;		 /* VS register */
	__u32 instance;		 /* <C> in /dev/snvme<C> */
	__u16 vid;		 /* PCI vendor ID (Identify Controller VID) */
	__u16 ssvid;		 /* PCI subsystem vendor ID */
	__u32 max_queue_entries; /* CAP.MQES + 1, entries per SQ or CQ */
	__u32 doorbell_stride;	 /* bytes between doorbells, 4 << CAP.DSTRD */
	__u32 doorbell_bytes;	 /* length of the SNVME_MMAP_DOORBELLS window */
	__u32 page_size;	 /* memory page size the controller runs with (CC.MPS), bytes */
	__u32 max_transfer;	 /* MDTS in bytes, 0 = no limit reported */
	__u32 sgls;		 /* Identify Controller SGLS, Figure 275 */
	__u32 nn;		 /* Identify Controller NN: highest NSID */
	char serial[20];	 /* SN, space padded, not NUL terminated */
	char model[40];		 /* MN, space padded, not NUL terminated */
	char firmware[8];	 /* FR, space padded, not NUL terminated */
	/* Queue budget: I/O queue IDs granted by Set Features Number of Queues. */
	__u16 kernel_queues;	 /* I/O queue pairs the block device uses, QIDs 1..k */
	__u16 user_qid_first;	 /* first QID reserved for userspace */
	__u16 user_queues;	 /* I/O queue pairs reserved for userspace */
	__u16 user_queues_free;	 /* of which not currently in a queue group */
	__u16 max_group_queues;	 /* most queue pairs in one group: SNVME_MAX_GROUP_QUEUES */
	__u16 pad0;
	/* Leak counters of this controller, live values. */
	__u64 pinned_pages;	 /* user pages pinned by DMA_MAP */
	__u32 dma_maps;		 /* live DMA_MAP handles */
	__u32 queue_groups;	 /* live queue groups */
	__u32 nr_namespaces;	 /* valid entries in ns[] */
	__u32 pad1;
	struct snvme_ns_info ns[SNVME_MAX_NAMESPACES];
};

/* One queue pair of a group. Offsets are for mmap() on the same fd. */
struct snvme_queue_desc {
	__u16 qid;	    /* SQ and CQ identifier, same for both */
	__u16 pad0;
	__u32 entries;	    /* entries in the SQ and in the CQ (1's based) */
	__u32 sq_doorbell;  /* byte offset of the SQ tail doorbell in the doorbell window */
	__u32 cq_doorbell;  /* byte offset of the CQ head doorbell in the doorbell window */
	__u64 sq_offset;    /* mmap offset of the SQ ring (64-byte SQEs) */
	__u64 cq_offset;    /* mmap offset of the CQ ring (16-byte CQEs) */
	__u32 sq_bytes;	    /* mmap length of the SQ ring, page multiple */
	__u32 cq_bytes;	    /* mmap length of the CQ ring, page multiple */
};

#define SNVME_MAX_GROUP_QUEUES 16

/*
 * SNVME_IOC_CREATE_QUEUE_GROUP: creates nr_queues I/O queue pairs on the
 * controller, physically contiguous, interrupts disabled (callers poll the
 * CQ phase tag). Queues are deleted on DESTROY_QUEUE_GROUP, on close of the
 * last reference to the file, or when the controller is unbound.
 */
struct snvme_queue_group {
	struct snvme_hdr hdr;
	__u32 nr_queues;   /* in: 1..SNVME_MAX_GROUP_QUEUES and <= user_queues_free */
	__u32 entries;	   /* in: 2..max_queue_entries, entries per SQ and CQ */
	__u32 flags;	   /* in: must be 0 */
	__u32 group_id;	   /* out: handle for DESTROY_QUEUE_GROUP */
	struct snvme_queue_desc queues[SNVME_MAX_GROUP_QUEUES]; /* out */
};

struct snvme_group_id {
	struct snvme_hdr hdr;
	__u32 group_id;
	__u32 pad0;
};

#define SNVME_DMA_HOST 0u /* vaddr is host memory of the calling process */
#define SNVME_DMA_GPU 1u  /* vaddr is a CUDA device pointer (nv-p2p) */

/*
 * SNVME_IOC_DMA_MAP: pins [vaddr, vaddr + length) and maps it for the
 * controller. bus_addrs receives one bus address per page_size page
 * (info.page_size), in order; the device may DMA to them until DMA_UNMAP,
 * close, or unbind (queues are deleted before pages are unpinned).
 */
struct snvme_dma_map {
	struct snvme_hdr hdr;
	__u32 kind;	    /* in: SNVME_DMA_HOST or SNVME_DMA_GPU */
	__u32 flags;	    /* in: must be 0 */
	__u64 vaddr;	    /* in: page_size aligned */
	__u64 length;	    /* in: bytes, page_size multiple, 1..max_dma_map_mib MiB */
	__u64 bus_addrs;    /* in: user pointer to __u64[max_addrs] */
	__u64 max_addrs;    /* in: capacity of bus_addrs, >= length / page_size */
	__u32 map_id;	    /* out: handle for DMA_UNMAP */
	__u32 nr_pages;	    /* out: entries written to bus_addrs */
};

struct snvme_dma_unmap {
	struct snvme_hdr hdr;
	__u32 map_id;
	__u32 pad0;
};

/*
 * SNVME_IOC_IDENTIFY: the raw Identify data structure (NVMe Base Spec 2.0,
 * 5.17), read-only: CNS 00h, Identify Namespace for an active nsid (NVM
 * Command Set Spec 1.0, Figure 97), or CNS 01h, Identify Controller (NVMe
 * Base Spec 2.0, Figure 275).
 */
#define SNVME_IDENTIFY_CNS_NS 0u
#define SNVME_IDENTIFY_CNS_CTRL 1u
#define SNVME_IDENTIFY_BYTES 4096u

struct snvme_identify {
	struct snvme_hdr hdr;
	__u32 cns;	/* in: SNVME_IDENTIFY_CNS_NS or SNVME_IDENTIFY_CNS_CTRL */
	__u32 nsid;	/* in: for CNS 00h, 1..nn; else 0 */
	__u64 data;	/* in: user pointer to SNVME_IDENTIFY_BYTES bytes */
};

/*
 * SNVME_IOC_ABORT: Abort (NVMe Base Spec 2.0, 5.1) command cid of I/O SQ
 * sqid, which must belong to one of this file's queue groups. The aborted
 * command still completes on its own CQ (status "Command Abort Requested").
 */
struct snvme_abort {
	struct snvme_hdr hdr;
	__u16 sqid;	/* in */
	__u16 cid;	/* in */
	__u32 result;	/* out: Abort completion dword 0; bit 0 clear = aborted */
};

/*
 * SNVME_IOC_SEAL: seals this file to what it holds, for good. It is meant
 * for a broker (tuttid, docs/daemon.md) that creates a lease's queue group
 * on a file and seals it before handing it to the lease holder with
 * SCM_RIGHTS. From then on
 * CREATE_QUEUE_GROUP fails with EPERM and DMA_MAP fails with EDQUOT when the
 * bytes this file has mapped would exceed max_dma_bytes; a second SEAL fails
 * with EPERM. DESTROY_QUEUE_GROUP, DMA_UNMAP, ABORT and I/O still work:
 * the seal bounds what the file holds from above, and giving back queues
 * or pins only lowers it (destroyed queues go back to the controller's
 * pool, and the holder cannot create them again). The seal belongs to the
 * open file, so every descriptor of it (dup, fork, SCM_RIGHTS) is sealed.
 */
struct snvme_seal {
	struct snvme_hdr hdr;
	__u64 max_dma_bytes;	/* in: page_size multiple, >= bytes mapped now */
	__u32 flags;		/* in: must be 0 */
	__u32 pad0;		/* in: must be 0 */
};

/*
 * SNVME_IOC_REVOKE (SNVME_CAP_REVOKE): revokes open files for good, as a
 * lease broker (tuttid, docs/daemon.md) ends a lease while its holder may
 * still use it. scope SNVME_REVOKE_FILE revokes this open file (every
 * descriptor of it, in every process); scope SNVME_REVOKE_OTHERS revokes
 * every other open file of the controller (an unsealed file opened with
 * CAP_SYS_ADMIN by a caller that still has it, both in the initial user
 * namespace, else EPERM): a broker that starts again ends the leases its
 * predecessor granted. It waits for no lease holder: no ioctl holds a
 * file's lock while it touches user memory (a DMA_MAP whose pages are
 * still coming finds its file revoked afterwards and fails with ESTALE).
 * A revoked file:
 *  - status page: revoked = SNVME_REVOKED_LEASE, then csts = all ones;
 *    poll() reports EPOLLPRI | EPOLLERR;
 *  - its queue groups are deleted on the controller (Delete I/O SQ, then
 *    CQ) and their QIDs freed at once;
 *  - its mappings of the doorbells and rings stay valid memory: from then
 *    on the doorbell window is one page per file that reads all ones until
 *    the holder writes it and keeps what is written (a doorbell rung reads
 *    back its own value), and each ring a copy of it as the controller left it
 *    (no completion lost or invented), so a holder that still writes SQEs
 *    and rings doorbells gets no SIGBUS, reaches no queue (its QIDs may
 *    belong to another file by then), and reads csts all ones;
 *  - its later ioctls and mmaps fail with ESTALE, except REVOKE itself;
 *    its DMA maps stay pinned until it is closed (no queue reaches them).
 * A file revoked by a reset may be revoked this way too: its QIDs are then
 * freed. files, queue_groups and queues count what this call revoked.
 */
#define SNVME_REVOKE_FILE 0u
#define SNVME_REVOKE_OTHERS 1u

struct snvme_revoke {
	struct snvme_hdr hdr;
	__u32 scope;		/* in: SNVME_REVOKE_FILE or SNVME_REVOKE_OTHERS */
	__u32 flags;		/* in: must be 0 */
	__u32 files;		/* out: files revoked by this call */
	__u32 queue_groups;	/* out: their queue groups deleted */
	__u32 queues;		/* out: their queue pairs deleted, QIDs freed */
	__u32 pad0;		/* in: must be 0 */
};

/*
 * /dev/snvme-control: CAP_SYS_ADMIN only. pci_addr is "DDDD:BB:DD.F",
 * NUL terminated. BIND detaches whatever driver holds the device, sets
 * driver_override to "snvme" and probes; UNBIND releases it (files that
 * are still open see ENODEV from then on).
 */
struct snvme_bind {
	struct snvme_hdr hdr;
	char pci_addr[32];
	__s32 instance; /* out of BIND: <C> of /dev/snvme<C>; -1 if unknown */
	__u32 pad0;
};

#define SNVME_IOC_MAGIC 0xE5

#define SNVME_IOC_GET_INFO _IOWR(SNVME_IOC_MAGIC, 0x00, struct snvme_info)
#define SNVME_IOC_CREATE_QUEUE_GROUP _IOWR(SNVME_IOC_MAGIC, 0x01, struct snvme_queue_group)
#define SNVME_IOC_DESTROY_QUEUE_GROUP _IOW(SNVME_IOC_MAGIC, 0x02, struct snvme_group_id)
#define SNVME_IOC_DMA_MAP _IOWR(SNVME_IOC_MAGIC, 0x03, struct snvme_dma_map)
#define SNVME_IOC_DMA_UNMAP _IOW(SNVME_IOC_MAGIC, 0x04, struct snvme_dma_unmap)
#define SNVME_IOC_IDENTIFY _IOW(SNVME_IOC_MAGIC, 0x05, struct snvme_identify)
#define SNVME_IOC_ABORT _IOWR(SNVME_IOC_MAGIC, 0x06, struct snvme_abort)
#define SNVME_IOC_SEAL _IOW(SNVME_IOC_MAGIC, 0x07, struct snvme_seal)
#define SNVME_IOC_REVOKE _IOWR(SNVME_IOC_MAGIC, 0x08, struct snvme_revoke)
#define SNVME_IOC_BIND _IOWR(SNVME_IOC_MAGIC, 0x10, struct snvme_bind)
#define SNVME_IOC_UNBIND _IOW(SNVME_IOC_MAGIC, 0x11, struct snvme_bind)

/*
 * mmap offset of the doorbell window, mapped whole (info.doorbell_bytes) or
 * not at all; queue rings sit above it. The driver tells the window's
 * mappings by this offset, never by a literal 0.
 */
#define SNVME_MMAP_DOORBELLS 0ull

/*
 * The status page of an open file (mmap offset SNVME_MMAP_STATUS, PROT_READ
 * and MAP_SHARED only, SNVME_STATUS_BYTES long). It lets pollers that make
 * no system calls (GPU threads, busy host loops) learn that their queues
 * were revoked: read csts like the CSTS register. The driver writes revoked
 * before csts.
 */
#define SNVME_MMAP_STATUS (4ull << 20)	/* never a ring: that would be QID 0's CQ */
#define SNVME_STATUS_BYTES 4096u

#define SNVME_REVOKED_RESET 1u	 /* the controller was reset: queues deleted, it works again */
#define SNVME_REVOKED_FAILED 2u	 /* the controller failed and is disabled */
#define SNVME_REVOKED_REMOVED 3u /* the controller was unbound or removed */
#define SNVME_REVOKED_LEASE 4u	 /* SNVME_IOC_REVOKE: the broker ended the lease */

struct snvme_status {
	/*
	 * CSTS as this file's queues see the controller: 1 (RDY) while they
	 * are valid, 0xffffffff once revoked, the value a controller that is
	 * gone reads (NVMe Base Spec 2.0, 3.1.3.6).
	 */
	__u32 csts;
	/*
	 * 0, or SNVME_REVOKED_*: the gravest reason so far, in the order
	 * RESET < LEASE < FAILED < REMOVED.
	 */
	__u32 revoked;
	__u32 pad0[2];
};

/* LP64 == ILP32 layout checks. */
#ifdef __cplusplus
#define SNVME_STATIC_ASSERT static_assert
#else
#define SNVME_STATIC_ASSERT _Static_assert
#endif
SNVME_STATIC_ASSERT(sizeof(struct snvme_hdr) == 8, "snvme_hdr");
SNVME_STATIC_ASSERT(sizeof(struct snvme_lba_format) == 4, "snvme_lba_format");
SNVME_STATIC_ASSERT(sizeof(struct snvme_ns_info) == 88, "snvme_ns_info");
SNVME_STATIC_ASSERT(sizeof(struct snvme_info) == 520, "snvme_info");
SNVME_STATIC_ASSERT(sizeof(struct snvme_queue_desc) == 40, "snvme_queue_desc");
SNVME_STATIC_ASSERT(sizeof(struct snvme_queue_group) == 664, "snvme_queue_group");
SNVME_STATIC_ASSERT(sizeof(struct snvme_group_id) == 16, "snvme_group_id");
SNVME_STATIC_ASSERT(sizeof(struct snvme_dma_map) == 56, "snvme_dma_map");
SNVME_STATIC_ASSERT(sizeof(struct snvme_dma_unmap) == 16, "snvme_dma_unmap");
SNVME_STATIC_ASSERT(sizeof(struct snvme_identify) == 24, "snvme_identify");
SNVME_STATIC_ASSERT(sizeof(struct snvme_abort) == 16, "snvme_abort");
SNVME_STATIC_ASSERT(sizeof(struct snvme_seal) == 24, "snvme_seal");
SNVME_STATIC_ASSERT(sizeof(struct snvme_revoke) == 32, "snvme_revoke");
SNVME_STATIC_ASSERT(sizeof(struct snvme_bind) == 48, "snvme_bind");
SNVME_STATIC_ASSERT(sizeof(struct snvme_status) == 16, "snvme_status");
#undef SNVME_STATIC_ASSERT

#endif /* _UAPI_LINUX_SNVME_H */
