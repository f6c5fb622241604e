// tutti::uring::UringDataPath: host-executed IO on plain files (tutti::file::Target) with io_uring
// (liburing), into host memory directly and, in the CUDA profile, into DEVICE memory through a bounded
// ring of pinned staging buffers. docs/uring.md is the long form.
//
// Shape:
//  - One io_uring per DataPath, created by create(): Options::queue_depth SQ entries, twice as
//    many CQ entries, optional SQPOLL. A registered file table (Options::registered_files slots) and a
//    sparse fixed buffer table (Options::fixed_buffers slots) are registered at creation; when the
//    kernel refuses either, the DataPath runs without it (plain fds / plain reads and writes) and says
//    so in stats().
//  - open() puts the file in the registered file table when a slot is free (IOSQE_FIXED_FILE);
//    register_memory() registers a HOST / PINNED_HOST region as a fixed buffer when a slot is free and
//    the region is at most 1 GiB (IORING_OP_READ_FIXED / WRITE_FIXED); otherwise it records why
//    (registered_memory::fixed_buffer_fallback) and IO uses IORING_OP_READ / WRITE.
//  - submit() turns each request into commands (SQEs) of at most Options::max_command_bytes, reserves
//    them against the in-flight budget (queue_depth commands), and calls io_uring_submit once.
//    A request that does not fit the budget is rejected RESOURCE_EXHAUSTED (never blocks).
//  - progress() reaps CQEs for every batch (whichever thread reaps completes other threads' requests
//    too), resubmits short reads and writes for the remainder, and waits with
//    io_uring_wait_cqe_timeout for at most Options::wait_slice_ns at a time, within the caller's budget.
//
// Threading: submit, progress, open, close, register_memory and unregister_memory may be called
// concurrently from several threads. The SQ is guarded by a mutex held only while SQEs are written and
// io_uring_submit runs; the CQ by a timed mutex that progress() takes with the caller's deadline, so no
// call waits past its budget. Lock order: completion -> staging -> submission -> live batches.
//
// Semantics (docs/uring.md, "Errors"):
//  - A CQE error becomes status_code_of_errno(-res) with the errno text (tutti/core/errno.hpp): EIO ->
//    DEVICE_ERROR, EINVAL -> INVALID_ARGUMENT, ENOSPC -> RESOURCE_EXHAUSTED ...; EINTR and EAGAIN are
//    resubmitted up to kMaxRetries times.
//  - A READ that reaches the end of the file before its length (the file shrank since open) fails
//    OUT_OF_RANGE with confirmed_bytes = the bytes that did arrive; it is never reported as success.
//  - The tail rule (capabilities.unaligned_tail_at_end_of_target): a request may end exactly at the end
//    of the target with a length that is not a multiple of 4096. With O_DIRECT, a READ transfers the
//    whole last aligned unit into memory (the runtime checked there is room) and reports `length`; a
//    WRITE writes its last partial unit through the target's tail descriptor (same inode, no O_DIRECT),
//    exactly `length` bytes, so the file never grows past its size. Without a tail descriptor such a
//    WRITE is rejected INVALID_ARGUMENT at submit.
//  - FLUSH is IORING_OP_FSYNC with IORING_FSYNC_DATASYNC (fdatasync: data and the metadata needed to
//    read it back). close() of a target opened with flush_on_close runs the same FLUSH through the ring
//    and waits at most Options::close_flush_timeout_ns; on timeout it returns TIMEOUT and keeps the
//    target open (call close() again to keep waiting; WRITEs submitted meanwhile get a second FLUSH).
//  - DEVICE memory (CUDA profile) may be fenced on a caller's stream (set_completion_stream): staged
//    copies wait for work the caller queued on that stream before the submit, and work it queues
//    after progress() returned OK is ordered after the bytes landed.
//  - Nothing the kernel may still DMA into is released: unregister_memory and close return BUSY while
//    commands using the object are in flight (the runtime already refuses; this is the DataPath's own
//    guard), and a fixed buffer is removed from the table before unregister_memory returns OK.
#pragma once

// The DataPath, file by file (each one concern; read them in this order):
//
//   uring/options.hpp           Options: defaults, TUTTI_URING_* environment variables, normalisation
//   uring/stats.hpp             Stats and the counters behind them
//   uring/staging.hpp           the pinned staging ring and stream fences: the one profile seam
//                               (detail::kStagesDeviceMemory; CUDA types exist only in the CUDA profile)
//   uring/state.hpp             per open target, registered region, request and command
//   uring/ring.hpp              the io_uring: creation, SQ, CQ, timed wait, teardown
//   uring/tables.hpp            the registered file table and the fixed buffer table
//   uring/engine.hpp            the engine: the ring and everything it guards, locks, creation, teardown
//   uring/data_path.hpp         UringDataPath: open, close, register, submit, progress, drain, stats
//   uring/submission.hpp        requests -> commands -> SQEs, the in-flight budget, io_uring_submit
//   uring/completion.hpp        CQEs, short-transfer resubmission, request completion, progress, drain
//   uring/staging_pipeline.hpp  DEVICE memory chunk by chunk through the staging ring (CUDA profile)
//
// Profile differences are written once, as `if constexpr (detail::kStagesDeviceMemory)`.

#include <tutti/path/uring/options.hpp>
#include <tutti/path/uring/stats.hpp>
#include <tutti/path/uring/staging.hpp>
#include <tutti/path/uring/state.hpp>
#include <tutti/path/uring/ring.hpp>
#include <tutti/path/uring/tables.hpp>
#include <tutti/path/uring/engine.hpp>
#include <tutti/path/uring/data_path.hpp>
#include <tutti/path/uring/submission.hpp>
#include <tutti/path/uring/completion.hpp>
#include <tutti/path/uring/staging_pipeline.hpp>

#include <tutti/core/concepts.hpp>

static_assert(tutti::DataPath<tutti::uring::UringDataPath>);
