// The local_nvme DataPath's settings (docs/local-nvme.md, "Settings"): one struct with a
// kDefault* constant per field (tests pin them; the docs list them), and the checks create()
// makes of them against the controller's identity.
// Units: bytes and nanoseconds unless the name says otherwise. Thread-safety: plain values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/path/local_nvme/kernels.hpp>

namespace tutti::local_nvme {

/// Settings; each default is a kDefault* constant (tests pin them; docs/local-nvme.md lists them).
struct Options {
  static constexpr std::uint32_t kDefaultQueuePairs = 2;
  static constexpr std::uint32_t kDefaultQueueDepth = 256;
  static constexpr std::uint64_t kDefaultCommandTimeoutNs = 5'000'000'000;  // 5 s
  static constexpr std::uint64_t kDefaultAbortTimeoutNs = 1'000'000'000;    // 1 s
  static constexpr std::uint64_t kDefaultAdminTimeoutNs = 1'000'000'000;    // 1 s
  static constexpr std::uint32_t kDefaultRequestWindow = 16;
  static constexpr std::uint32_t kDefaultThreadsPerBlock = 32;
  static constexpr std::uint32_t kDefaultMaxBatchesInFlight = 256;
  static constexpr std::uint32_t kMaxBatchesInFlightLimit = 65536;
  static constexpr std::uint32_t kMaxBatchRequests = 65536;  ///< requests per submit (capabilities.max_batch_requests)
  static constexpr std::uint32_t kDefaultDeviceTargetCacheEntries = 256;
  static constexpr std::uint32_t kMaxDeviceTargetCacheEntries = 65536;
  static constexpr std::uint32_t kDefaultDeviceTargetCacheEntryExtents = 256;
  static constexpr std::uint32_t kMaxDeviceTargetCacheEntryExtents = 65536;
  static constexpr std::uint64_t kDefaultHostTargetCacheBytes = std::uint64_t{256} << 20;  // 256 MiB
  /// 1 ms in the cuda profile; 0 in the host profile, where the threads of a block run one after
  /// another (accel/launch_host.hpp), so a polling thread would hold the later requests of its block.
  static constexpr std::uint64_t kDefaultPollKernelBudgetNs = accel::kProfile == accel::Profile::cuda ? 1'000'000 : 0;
  static constexpr std::uint64_t kMaxPollKernelBudgetNs = 1'000'000'000;  // 1 s
  static constexpr std::uint32_t kMaxPersistentPollerWarps = 1024;
  static constexpr std::uint64_t kDefaultPersistentPollerLifetimeNs = 100'000'000;  // 100 ms
  static constexpr std::uint64_t kDefaultPersistentPollerIdleNs = 1'000'000;        // 1 ms
  /// I/O queue pairs to create (1..the controller's allocated queues). Requests of a batch are
  /// spread round robin over them, one queue pair per warp of 32 requests (CUDA profile; per
  /// request on the host). Warps that share a queue pair contend on its SQ, CQ and credits: give
  /// at least batch size / 32 queue pairs (docs/benchmarks.md measured 2.5x at 4 KiB for it).
  std::uint32_t queue_pairs = kDefaultQueuePairs;
  /// Entries per SQ and CQ (2..CAP.MQES + 1); depth - 1 commands in flight per queue pair.
  std::uint32_t queue_depth = kDefaultQueueDepth;
  /// A command not completed within this many ns is aborted.
  std::uint64_t command_timeout_ns = kDefaultCommandTimeoutNs;
  /// After an Abort, how long to wait for the command's completion before declaring it a zombie, ns.
  std::uint64_t abort_timeout_ns = kDefaultAbortTimeoutNs;
  /// Budget of each admin command (Abort), ns.
  std::uint64_t admin_timeout_ns = kDefaultAdminTimeoutNs;
  /// Commands one request keeps in flight at once (1..kMaxWindow); more are issued as they complete.
  /// A request takes this many queue credits at once (or fewer when it needs fewer commands), and a
  /// queue pair has depth - 1 credits in all: create lowers a larger value to the smallest created
  /// queue's depth - 1, so every request can be admitted on an idle queue pair (docs/local-nvme.md,
  /// "Admission"); options() then reports the lowered value.
  std::uint32_t request_window = kDefaultRequestWindow;
  /// Logical threads (requests) per block of the submit and poll launches; in the CUDA profile a
  /// multiple of 32 (whole warps).
  std::uint32_t threads_per_block = kDefaultThreadsPerBlock;
  /// Largest command in bytes (0: the controller's MDTS, or 65536 LBAs when it reports none).
  std::uint64_t max_command_bytes = 0;
  /// CUDA profile: the caller's stream (accel::StreamRef::from_cuda) the batch copies and the
  /// submit kernels (and the poll kernels unless poll_stream_per_batch) are enqueued on and
  /// waited for; no stream set: the legacy default stream. Host profile: ignored. The same type
  /// orders the uring DataPath's staging copies.
  accel::StreamRef stream{};
  /// CUDA profile: each batch slot owns a non-blocking stream (accel::OwnedStream, made with the
  /// slot, on the device current then; none when CUDA cannot make one) that its poll kernels and
  /// their report copies run on, so a batch's polling does not hold `stream` and another batch's
  /// submit kernel queues behind it only when their streams share a hardware queue
  /// (CUDA_DEVICE_MAX_CONNECTIONS; docs/local-nvme.md, "Poll streams"). Work the caller enqueues
  /// on `stream` is then not ordered with poll kernels: order after a batch by progress/wait. A poll kernel is launched
  /// only after its batch's submit returned, which waited for the submit kernel and the copies before it on `stream`,
  /// so it is ordered after them without an event; progress's own bounded wait orders the caller after it. false: poll
  /// kernels share `stream`, as submits do. Host profile: ignored (no streams).
  bool poll_stream_per_batch = true;
  /// Batches (submit results) alive at once (1..kMaxBatchesInFlightLimit): the size of the pool
  /// of batch state (request states, command records: kernel-reachable memory) that submits
  /// reuse. A submit while this many batches are alive rejects every request with
  /// RESOURCE_EXHAUSTED (backpressure; destroy a finished batch, e.g. release its IO, and
  /// resubmit). A slot keeps the capacity of the largest batch it served (no allocation per
  /// submit once warm); memory held at most, per slot and request of the largest batch: device
  /// memory sizeof(RequestState) + request_window x sizeof(CommandRecord) + sizeof(RequestReport)
  /// bytes, pinned memory sizeof(RequestState) + sizeof(RequestReport) bytes.
  std::uint32_t max_batches_in_flight = kDefaultMaxBatchesInFlight;
  /// Batch slots create makes ahead, each with room for prepared_batch_requests requests
  /// (0..max_batches_in_flight; 0: every slot is made by the submit that first needs it). In the
  /// cuda profile a device or pinned allocation keeps kernels enqueued after it from running
  /// concurrently with kernels launched before it (CUDA Programming Guide, "Implicit
  /// Synchronization"), so a submit that allocates waits for whatever runs on the device: behind a
  /// persistent kernel, until it ends. Slots prepared at create keep every allocation off the submit
  /// path for up to this many batches of up to prepared_batch_requests requests each. Memory: as
  /// max_batches_in_flight says, per prepared slot and request.
  std::uint32_t prepared_batches = 0;
  /// Requests each prepared slot has room for (1..kMaxBatchRequests when prepared_batches
  /// is not 0; ignored otherwise).
  std::uint32_t prepared_batch_requests = 0;
  /// L1 of the target handle cache (path/local_nvme/target_cache.hpp; docs/local-nvme.md, "The
  /// target handle cache"): targets whose extents are resident at once in accelerator memory
  /// (0..kMaxDeviceTargetCacheEntries; 0 disables L1: every submit reads the L2 copy). L1 is one
  /// allocation of device_target_cache_entries x device_target_cache_entry_extents x 24 bytes
  /// made by create (default 256 x 256 x 24 = 1.5 MiB).
  std::uint32_t device_target_cache_entries = kDefaultDeviceTargetCacheEntries;
  /// Extents one L1 entry holds (1..kMaxDeviceTargetCacheEntryExtents); a target with more is
  /// always served from its L2 copy (counted as a fallback).
  std::uint32_t device_target_cache_entry_extents = kDefaultDeviceTargetCacheEntryExtents;
  /// How long one progress kernel keeps polling on the accelerator before it returns to the
  /// host, ns (0..kMaxPollKernelBudgetNs, and at most command_timeout_ns / 2 since the host waits
  /// command_timeout_ns for a kernel): the kernel's warps reap, issue and finish requests in
  /// passes, on the accelerator's clock, until their requests are done, one needs the host (an
  /// Abort to send), or the budget is spent; progress() then copies the reports back. Each
  /// launch also stops at progress()'s own timeout. 0: one pass per launch (a host round trip
  /// per step). Longer budgets mean fewer launches and round trips, but completions reach the
  /// caller only when a kernel returns and the stream is busy meanwhile. When batches share a
  /// stream (poll_stream_per_batch false, or submit kernels on Options::stream), a kernel may
  /// queue behind other batches' polling kernels: every wait for a kernel is bounded by
  /// command_timeout_ns plus this budget per polling kernel in flight.
  /// Host profile: a block's threads run one after another, so the first request of a block
  /// polls and the others get one pass each (default 0 there).
  std::uint64_t poll_kernel_budget_ns = kDefaultPollKernelBudgetNs;
  /// How long the submit kernel keeps polling the batch it just admitted, ns (0..
  /// kMaxPollKernelBudgetNs, and at most command_timeout_ns / 2; default 0: it does not). With a
  /// budget, each warp of the submit kernel polls its requests as a progress kernel would
  /// (kernels.hpp, AdmitKernel) until they are done, one needs the host, or the budget is spent,
  /// so submit returns up to this much later, but a batch that completed meanwhile comes back
  /// done and progress/wait launch nothing: one kernel launch and one host round trip per batch
  /// instead of two. For callers that submit and then wait (a layer's restore before its
  /// attention), not for those that overlap work between submit and wait. Host profile: as
  /// poll_kernel_budget_ns there (a block's threads run one after another).
  std::uint64_t submit_poll_budget_ns = 0;
  /// Warps of the persistent poller (path/local_nvme/persistent_poller.hpp; docs/local-nvme.md, "The
  /// persistent poller"), 0..kMaxPersistentPollerWarps; 0 (default): none. CUDA profile only. With
  /// warps, submit hands each batch it leaves in flight to one long-lived kernel whose warps poll
  /// every such batch (the 32-request chunks of a batch spread over them), and progress/wait read a
  /// word in mapped pinned memory instead of launching a poll kernel, copying the reports back and
  /// waiting for a stream. A batch comes back whole: once all its requests are done, one needs the
  /// host (its Abort), or the kernel ends; progress then goes on with poll kernels as without the
  /// poller. ProgressUntil::SOME therefore waits for the whole batch. While the kernel runs the host
  /// reaps no zombie commands (zombie_commands counts them until it ends), and CUDA calls that wait
  /// for the device (cudaFree, cudaMalloc, cudaHostAlloc in any thread of the process) wait for it
  /// to end: persistent_poller_idle_ns after the last batch (under a steady flow of submits it is
  /// launched again at once, so they wait for such a gap).
  std::uint32_t persistent_poller_warps = 0;
  /// The persistent poller's kernel ends by itself this long after it starts running, ns (1..
  /// kMaxPollKernelBudgetNs and at most command_timeout_ns / 2); the next submit launches it again.
  std::uint64_t persistent_poller_lifetime_ns = kDefaultPersistentPollerLifetimeNs;
  /// ... or once it had no batch for this long, ns (1..persistent_poller_lifetime_ns).
  std::uint64_t persistent_poller_idle_ns = kDefaultPersistentPollerIdleNs;
  /// L2 bound: bytes of extents (24 per extent) of all open targets together, held in
  /// kernel-reachable memory (CUDA profile: mapped pinned host memory) from open to close
  /// (1..accel::kMaxAllocationBytes). open beyond it returns RESOURCE_EXHAUSTED naming this field.
  std::uint64_t host_target_cache_bytes = kDefaultHostTargetCacheBytes;
  /// Where the state of a queue pair whose rings only kernels reach (QueuePairInfo::host_accessible
  /// false: a GPU-resident controller, or a drive's queues in GPU memory) lives: true (default),
  /// device memory, where the kernels' atomics on SQ reservations, doorbell and CQ try-locks, CID
  /// slots and credits stay on the GPU; false, mapped pinned host memory, where each is a PCIe round
  /// trip (kept to measure the difference: docs/benchmarks.md, "Drive rate"). Pairs the host can
  /// reach keep their state in mapped pinned host memory either way (the host reaps their zombies).
  bool device_queue_state = true;
};

/// Checks `options` against the controller's identity `id` (brought up) and returns the largest
/// command in bytes: the smallest of the NLB limit (65536 LBAs), MDTS and
/// Options::max_command_bytes, in whole LBAs. Errors: INVALID_ARGUMENT naming the field, its
/// value and its range (LBA size not 512/4096, memory page size not a power of two >= 4096, and
/// every Options field out of range).
inline Result<std::uint64_t> validate_options(const Options& options, const nvme::ControllerIdentity& id) {
  if (id.lba_size != 512 && id.lba_size != 4096)
    return error(StatusCode::INVALID_ARGUMENT,
                 "local_nvme: controller LBA size is {} (bring_up must succeed; 512 or 4096 supported)", id.lba_size);
  if (id.memory_page_size < 4096 || (id.memory_page_size & (id.memory_page_size - 1)) != 0)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: memory page size {} unsupported", id.memory_page_size);
  if (options.queue_pairs == 0 || options.queue_pairs > std::max<std::uint32_t>(1, id.io_submission_queues_allocated))
    return error(StatusCode::INVALID_ARGUMENT,
                 "local_nvme: queue_pairs = {} outside 1..{} (allocated by the controller)", options.queue_pairs,
                 id.io_submission_queues_allocated);
  if (options.queue_depth < 2 || (id.max_queue_entries != 0 && options.queue_depth > id.max_queue_entries))
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: queue_depth = {} outside 2..{} (CAP.MQES + 1)",
                 options.queue_depth, id.max_queue_entries);
  if (options.request_window == 0 || options.request_window > kMaxWindow)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: request_window = {} outside 1..{}", options.request_window,
                 kMaxWindow);
  if (options.threads_per_block == 0 || options.threads_per_block % accel::kKernelWarpLanes != 0)
    return error(StatusCode::INVALID_ARGUMENT,
                 "local_nvme: threads_per_block = {} must be a positive multiple of {} (whole warps: the kernels are "
                 "warp-collective)",
                 options.threads_per_block, accel::kKernelWarpLanes);
  if (options.command_timeout_ns == 0 || options.abort_timeout_ns == 0 || options.admin_timeout_ns == 0)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: timeouts must be > 0 ns");
  // Both polling budgets: the host waits command_timeout_ns for a kernel, so at most half of it.
  const std::uint64_t budget_limit = std::min(Options::kMaxPollKernelBudgetNs, options.command_timeout_ns / 2);
  for (const auto& [field, budget] :
       {std::pair<std::string_view, std::uint64_t>{"poll_kernel_budget_ns", options.poll_kernel_budget_ns},
        {"submit_poll_budget_ns", options.submit_poll_budget_ns}})
    if (budget > budget_limit)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: {} = {} outside 0..{} (at most {} ns and command_timeout_ns / 2 = {} ns): lower {} or "
                   "raise command_timeout_ns",
                   field, budget, budget_limit, Options::kMaxPollKernelBudgetNs, options.command_timeout_ns / 2, field);
  if (options.persistent_poller_warps != 0) {
    if (accel::kProfile != accel::Profile::cuda)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: persistent_poller_warps = {} needs the cuda profile (0 in the host profile, whose "
                   "kernels run their threads one after another)",
                   options.persistent_poller_warps);
    if (options.persistent_poller_warps > Options::kMaxPersistentPollerWarps)
      return error(StatusCode::INVALID_ARGUMENT, "local_nvme: persistent_poller_warps = {} outside 0..{}",
                   options.persistent_poller_warps, Options::kMaxPersistentPollerWarps);
    if (options.persistent_poller_lifetime_ns == 0 || options.persistent_poller_lifetime_ns > budget_limit)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: persistent_poller_lifetime_ns = {} outside 1..{} (at most {} ns and "
                   "command_timeout_ns / 2 = {} ns)",
                   options.persistent_poller_lifetime_ns, budget_limit, Options::kMaxPollKernelBudgetNs,
                   options.command_timeout_ns / 2);
    if (options.persistent_poller_idle_ns == 0 ||
        options.persistent_poller_idle_ns > options.persistent_poller_lifetime_ns)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: persistent_poller_idle_ns = {} outside 1..{} (persistent_poller_lifetime_ns)",
                   options.persistent_poller_idle_ns, options.persistent_poller_lifetime_ns);
  }
  if (options.max_batches_in_flight == 0 || options.max_batches_in_flight > Options::kMaxBatchesInFlightLimit)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: max_batches_in_flight = {} outside 1..{}",
                 options.max_batches_in_flight, Options::kMaxBatchesInFlightLimit);
  if (options.prepared_batches > options.max_batches_in_flight)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: prepared_batches = {} above max_batches_in_flight = {}",
                 options.prepared_batches, options.max_batches_in_flight);
  if (options.prepared_batches != 0 &&
      (options.prepared_batch_requests == 0 || options.prepared_batch_requests > Options::kMaxBatchRequests))
    return error(StatusCode::INVALID_ARGUMENT,
                 "local_nvme: prepared_batch_requests = {} outside 1..{} (prepared_batches = {})",
                 options.prepared_batch_requests, Options::kMaxBatchRequests, options.prepared_batches);
  if (options.device_target_cache_entries > Options::kMaxDeviceTargetCacheEntries)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: device_target_cache_entries = {} outside 0..{}",
                 options.device_target_cache_entries, Options::kMaxDeviceTargetCacheEntries);
  if (options.device_target_cache_entry_extents == 0 ||
      options.device_target_cache_entry_extents > Options::kMaxDeviceTargetCacheEntryExtents)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: device_target_cache_entry_extents = {} outside 1..{}",
                 options.device_target_cache_entry_extents, Options::kMaxDeviceTargetCacheEntryExtents);
  if (options.host_target_cache_bytes == 0 || options.host_target_cache_bytes > accel::kMaxAllocationBytes)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: host_target_cache_bytes = {} outside 1..{}",
                 options.host_target_cache_bytes, accel::kMaxAllocationBytes);
  std::uint64_t max_bytes = std::uint64_t{65536} * id.lba_size;  // NLB is 16 bits, 0's based
  if (id.max_data_transfer_bytes != 0) max_bytes = std::min(max_bytes, id.max_data_transfer_bytes);
  if (options.max_command_bytes != 0) max_bytes = std::min(max_bytes, options.max_command_bytes);
  max_bytes = max_bytes / id.lba_size * id.lba_size;
  if (max_bytes == 0)
    return error(StatusCode::INVALID_ARGUMENT, "local_nvme: max_command_bytes is smaller than one LBA");
  return max_bytes;
}

}  // namespace tutti::local_nvme
