// The local_nvme DataPath: reads, writes and flushes of local files (local_file::Target: extents
// on one NVMe namespace) issued as NVMe commands on I/O queue pairs of one nvme::Controller
// (tutti/nvme/controller.hpp; libnvm implements it).
//
// Execution model (docs/local-nvme.md): submit() takes a slot of the bounded batch pool
// (Options::max_batches_in_flight; RESOURCE_EXHAUSTED beyond it), stages one RequestState per
// request in the slot's pinned memory and enqueues on Options::stream ONE copy of them into the
// slot's device memory, ONE launch over them (one logical thread per request; host threads in the
// host profile, GPU threads in the CUDA profile, from host-compiled and nvcc-compiled callers
// alike: launch.hpp) and ONE copy of the kernels' RequestReports back, then waits once
// (accel::synchronize, bounded by command_timeout_ns): each thread resolves its LBAs by binary
// search over the target's extents, splits the request at extent boundaries and at the command size limit
// (MDTS, 65536 LBAs), takes queue credits (backpressure: RESOURCE_EXHAUSTED, never blocking),
// writes SQEs with PRPs looked up in the registration's prebuilt PRP table, and rings the SQ tail
// doorbell once for its commands. progress() launches the poll kernel over the batch (and copies
// the reports back) until every accepted request completed or the budget ran out; between
// launches the host sends NVMe Abort for commands past their deadline (admin commands are
// host-only).
//
// CUDA profile (docs/gpu.md, "local_nvme on the GPU"): the batch state the kernels update
// (RequestState, CommandRecord, RequestReport arrays) lives in device memory, as do the
// registration's page tables and the target handle cache's L1; the rest they touch (the targets'
// L2 extents, the queues' shared state and credits) lives in mapped pinned host memory
// (accel::Placement::mapped_host), the queues and doorbells must be GPU-writable (the soft controller in
// accelerator_mode; for a PCIe controller the BAR's doorbell page registered with cudaHostRegister(IoMemory)), and
// MemoryKind::DEVICE regions are mapped with Controller::dma_map_device. The launches are compiled
// once, in libtutti_cuda (path/local_nvme/launch.hpp), so .cpp and .cu users of the DataPath in one
// program run the same GPU kernels.
//
// Retries: a command that completes with a status nvme::classify calls retry (DNR clear) is sent
// again, at most kMaxCommandAttempts times in all and never past its deadline (NVMe Base 2.0,
// 4.2.3); every other error status fails its request. RequestCompletion::retries and
// commands_retried() count them.
//
// Timeouts and memory safety: a command not completed within Options::command_timeout_ns is
// aborted (Base 2.0, 5.1); its request completes with TIMEOUT once the controller answers, or
// after Options::abort_timeout_ns without an answer. A command the controller never answered is a
// "zombie": its credit, CID and DMA mapping stay reserved (unregister_memory returns BUSY and
// the mapping outlives the runtime's registration object) until its completion arrives or the
// DataPath deletes its queues (Base 2.0, 5.6: SQ deletion ends every command in it).
//
// Limits (capabilities): target offsets and lengths multiples of 4096 bytes (the largest LBA
// size; 512-byte LBA namespaces still get 4096-aligned requests), except a request that ends at
// end of file (the tail rule: the last LBA is transferred whole; the memory must have room for
// the length rounded up to the LBA size); memory addresses dword (4-byte) aligned (PRP1 rule,
// Base 2.0, 4.3.1); up to 1 GiB per request and 65536 requests per submit; HOST and PINNED_HOST
// memory, and DEVICE memory in the CUDA profile. Writes of the tail write the whole last LBA: the
// bytes past end of file come from the caller's memory, are invisible through the file system,
// and are documented in docs/local-nvme.md ("The tail rule").
//
// Thread-safety: submit and progress may run concurrently from many threads on different
// batches (one batch: one thread at a time); open/close/register/unregister may run concurrently
// with them. A batch may outlive its DataPath only to be destroyed.
// Lifetime: the Controller must outlive the DataPath; the DataPath deletes its queue pairs in its
// destructor, then frees zombie mappings.
#pragma once

// The pieces, one concern each (path/local_nvme/):
#include <tutti/path/local_nvme/options.hpp>       // Options: settings, defaults, validate_options
#include <tutti/path/local_nvme/kernels.hpp>       // the per-request device work: AdmitKernel, PollKernel
#include <tutti/path/local_nvme/prp_table.hpp>     // PrpTable: a registration's prebuilt PRP lists
#include <tutti/path/local_nvme/kernel_array.hpp>  // KernelArray: kernel-reachable host arrays
#include <tutti/path/local_nvme/queues.hpp>        // Queue: the I/O queue pairs and their credits
#include <tutti/path/local_nvme/registration.hpp>  // Mapping, RegisteredMemory: DMA map + PRP lists
#include <tutti/path/local_nvme/target_cache.hpp>  // TargetCache: L1/L2 of the targets' extents
#include <tutti/path/local_nvme/change_words.hpp>  // ChangeWords: the targets' change words (device memory)
#include <tutti/path/local_nvme/targets.hpp>       // OpenTarget: payload + device-resident handle
#include <tutti/path/local_nvme/zombies.hpp>       // ZombieList: commands never answered
#include <tutti/path/local_nvme/batch_pool.hpp>    // BatchSlot, BatchPool, Batch: bounded batch state
#include <tutti/path/local_nvme/engine.hpp>        // Engine: the state one DataPath shares
#include <tutti/path/local_nvme/launch.hpp>        // launch_over, kernel_wait_bound_ns
#include <tutti/path/local_nvme/staging.hpp>       // requests -> RequestState, reports -> Status
#include <tutti/path/local_nvme/data_path.hpp>     // LocalNvmeDataPath: the tutti::DataPath
