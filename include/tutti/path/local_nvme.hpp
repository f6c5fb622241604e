// The local_nvme DataPath: reads, writes and flushes of local files (local_file::Target: extents
// on one NVMe namespace) issued as NVMe commands on I/O queue pairs of one libnvm Controller.
//
// Execution model (docs/local-nvme.md): submit() takes a slot of the bounded batch pool
// (Options::max_batches_in_flight; RESOURCE_EXHAUSTED beyond it), stages one RequestState per
// request in the slot's pinned memory and enqueues on Options::stream ONE copy of them into the
// slot's device memory, ONE accel::launch over them (one logical thread per request; host threads
// in the host profile, GPU threads in the CUDA profile when the DataPath is used from code nvcc
// compiles) and ONE copy of the kernels' RequestReports back, then waits once
// (accel::synchronize, bounded by command_timeout_ns): each thread resolves its LBAs by binary search over the
// target's extents, splits the request at extent boundaries and at the command size limit
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
// (accel::Placement::mapped_host),
// the queues and doorbells must be GPU-writable (the soft controller in accelerator_mode; for a
// PCIe controller the BAR's doorbell page registered with cudaHostRegister(IoMemory)), and
// MemoryKind::DEVICE regions are mapped with Controller::dma_map_device. A host-compiled (.cpp)
// translation unit of the CUDA profile gets UNSUPPORTED from submit and progress
// (accel/launch_unavailable.hpp).
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
// memory, and DEVICE memory in the CUDA profile. Writes of the tail write the whole last LBA: the bytes past end of file come from the
// caller's memory, are invisible through the file system, and are documented in
// docs/local-nvme.md ("The tail rule").
//
// Thread-safety: submit and progress may run concurrently from many threads on different
// batches (one batch: one thread at a time); open/close/register/unregister may run concurrently
// with them. A batch may outlive its DataPath only to be destroyed.
// Lifetime: the Controller must outlive the DataPath; the DataPath deletes its queue pairs in its
// destructor, then frees zombie mappings.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/async_copy.hpp>
#include <tutti/accel/memory.hpp>
#include <tutti/accel/placement.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/libnvm/controller.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/status.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/prp_table.hpp>
#include <tutti/path/local_nvme/target_cache.hpp>

namespace tutti::local_nvme {

namespace detail {
/// `to = value` with the result of the assignment explicitly discarded (Status is [[nodiscard]],
/// and nvcc's front end warns about the discarded Status& of operator=).
inline void assign(Status& to, Status value) { (void)(to = std::move(value)); }
}  // namespace detail

class LocalNvmeDataPath {
 public:
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
    static constexpr std::uint32_t kDefaultDeviceTargetCacheEntries = 256;
    static constexpr std::uint32_t kMaxDeviceTargetCacheEntries = 65536;
    static constexpr std::uint32_t kDefaultDeviceTargetCacheEntryExtents = 256;
    static constexpr std::uint32_t kMaxDeviceTargetCacheEntryExtents = 65536;
    static constexpr std::uint64_t kDefaultHostTargetCacheBytes = std::uint64_t{256} << 20;  // 256 MiB
    /// 1 ms in the cuda profile; 0 in the host profile, where the threads of a block run one after
    /// another (accel/launch_host.hpp), so a polling thread would hold the later requests of its block.
    static constexpr std::uint64_t kDefaultPollKernelBudgetNs = accel::kProfile == accel::Profile::cuda ? 1'000'000 : 0;
    static constexpr std::uint64_t kMaxPollKernelBudgetNs = 1'000'000'000;  // 1 s
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
    std::uint32_t request_window = kDefaultRequestWindow;
    /// Logical threads (requests) per block of the submit and poll launches; in the CUDA profile a
    /// multiple of 32 (whole warps).
    std::uint32_t threads_per_block = kDefaultThreadsPerBlock;
    /// Largest command in bytes (0: the controller's MDTS, or 65536 LBAs when it reports none).
    std::uint64_t max_command_bytes = 0;
    /// CUDA profile: the caller's stream (accel::StreamRef::from_cuda) the batch copies and the
    /// submit and poll kernels are enqueued on and waited for; no stream set: the legacy default
    /// stream. Host profile: ignored. The same type orders the uring DataPath's staging copies.
    accel::StreamRef stream{};
    /// Batches (submit results) alive at once (1..kMaxBatchesInFlightLimit): the size of the pool
    /// of batch state (request states, command records: kernel-reachable memory) that submits
    /// reuse. A submit while this many batches are alive rejects every request with
    /// RESOURCE_EXHAUSTED (backpressure; destroy a finished batch, e.g. release its IO, and
    /// resubmit). A slot keeps the capacity of the largest batch it served (no allocation per
    /// submit once warm); memory held at most, per slot and request of the largest batch: device
    /// memory sizeof(RequestState) + request_window x sizeof(CommandRecord) + sizeof(RequestReport)
    /// bytes, pinned memory sizeof(RequestState) + sizeof(RequestReport) bytes.
    std::uint32_t max_batches_in_flight = kDefaultMaxBatchesInFlight;
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
    /// caller only when a kernel returns and the stream is busy meanwhile. All batches share
    /// Options::stream, so a kernel may queue behind other batches' poll kernels: every wait for a
    /// kernel is bounded by command_timeout_ns plus this budget per poll kernel in flight.
    /// Host profile: a block's threads run one after another, so the first request of a block
    /// polls and the others get one pass each (default 0 there).
    std::uint64_t poll_kernel_budget_ns = kDefaultPollKernelBudgetNs;
    /// L2 bound: bytes of extents (24 per extent) of all open targets together, held in
    /// kernel-reachable memory (CUDA profile: mapped pinned host memory) from open to close
    /// (1..accel::kMaxAllocationBytes). open beyond it returns RESOURCE_EXHAUSTED naming this field.
    std::uint64_t host_target_cache_bytes = kDefaultHostTargetCacheBytes;
  };

  using target_type = local_file::Target;

  /// Arrays the kernels read or write outside the batch (L2 extents, queue views, credits), and
  /// the batch's pinned staging and report arrays: host memory in the host profile, mapped pinned
  /// host memory in the CUDA profile (accel/placement.hpp).
  template <class T>
  using KernelArray = std::vector<T, accel::PlacementAllocator<T>>;
  template <class T>
  static KernelArray<T> kernel_array(std::size_t n, const T& value = T{}) {
    return KernelArray<T>(n, value, accel::PlacementAllocator<T>(accel::kKernelReachable));
  }

  /// A target's registration with the target handle cache: its id and L2 room, released (and its
  /// L1 entry dropped) when the target is closed or destroyed. Movable through its unique_ptr.
  struct CacheLease {
    std::shared_ptr<TargetCache> cache;
    std::uint64_t id = 0;            ///< TargetCache::admit's id (never reused)
    std::uint64_t extent_count = 0;  ///< extents held in L2
    CacheLease() = default;
    CacheLease(const CacheLease&) = delete;
    CacheLease& operator=(const CacheLease&) = delete;
    ~CacheLease() {
      if (cache) cache->release(id, extent_count);
    }
  };

  /// The open target: the payload (its lease and extents) plus the device-resident handle.
  struct open_target {
    std::unique_ptr<local_file::Target> payload;  ///< the lease and the host copy of the extents
    /// L2 of the target handle cache: the kernels' home copy (mapped pinned host memory in the
    /// CUDA profile); device_target points into it; submits copy it into L1 (never re-resolved).
    KernelArray<local_file::Extent> extents;
    DeviceTarget device_target;
    std::unique_ptr<CacheLease> cache_lease;  ///< the id the cache knows the target by
    bool flush_on_close = false;  ///< OpenOptions::flush_on_close: close() issues an NVMe Flush first
  };

 private:
  /// A DMA mapping and its prebuilt PRP lists. Shared by the registration and any zombie command
  /// that may still make the controller touch it; the last owner unmaps (before the members'
  /// memory is freed: the destructor body runs first).
  struct Mapping {
    libnvm::Controller* controller = nullptr;
    libnvm::DmaMapping mapping;
    /// The PRP list pages (both variants): a controller DMA buffer, whatever the region's kind.
    libnvm::DmaBuffer lists;
    /// table.pages and table.lists: the bus address of every region page, then of every list
    /// page, in accelerator memory (CUDA profile: device memory; read per command by the kernels).
    accel::DeviceBuffer page_tables;
    PrpTable table;
    std::uintptr_t user_address = 0;  ///< first byte of the user region
    std::uint64_t user_size = 0;
    std::atomic<std::uint32_t> zombies{0};
    ~Mapping() {
      if (controller == nullptr) return;
      if (lists.id != 0) (void)controller->free_dma_buffer(lists.id);
      if (mapping.id != 0) (void)controller->dma_unmap(mapping.id);
    }
  };
  /// One queue pair's credit counter, on its own cache line.
  struct alignas(64) Credits {
    std::uint32_t value = 0;
  };
  struct Queue {
    libnvm::QueuePairInfo info;
    std::unique_ptr<nvme::QueuePairStorage> storage;
    std::uint32_t* credits = nullptr;  ///< into State::credits (kernel-reachable)
    DeviceQueue device() noexcept { return DeviceQueue{storage->queue(), credits}; }
  };
  struct Zombie {
    std::uint32_t queue_index;
    std::uint16_t cid;
    std::shared_ptr<Mapping> mapping;  ///< null for Flush
  };
  /// One pooled batch's state. The kernel-reachable arrays keep their capacity across submits;
  /// `size` requests of them belong to the batch that holds the slot.
  struct BatchSlot {
    /// The requests as staged by the host (pinned: the source of the ONE host-to-device copy).
    KernelArray<RequestState> staged{accel::PlacementAllocator<RequestState>(accel::kKernelReachable)};
    /// The kernels' reports as copied back after each kernel (pinned: the ONE device-to-host copy).
    KernelArray<RequestReport> reports{accel::PlacementAllocator<RequestReport>(accel::kKernelReachable)};
    accel::DeviceBuffer device_requests;  ///< size x RequestState: what the kernels update
    accel::DeviceBuffer device_records;   ///< size x request_window x CommandRecord
    accel::DeviceBuffer device_reports;   ///< size x RequestReport
    accel::DeviceBuffer device_poll_stop; ///< PollKernel's stop word (8 bytes, zeroed before each launch)
    std::vector<CommandRecord> records_copy;         ///< one request's records, copied back on demand
    std::vector<std::shared_ptr<Mapping>> mappings;  ///< per request (zombie hand-off)
    std::vector<std::uint8_t> reported;              ///< completion already reported
    /// The target handle cache's L1 entries this batch pins (until it is destroyed) and the
    /// handle each distinct target of the batch resolved to (by cache id).
    std::shared_ptr<TargetCache> cache;
    std::vector<std::uint32_t> pins;
    std::unordered_map<std::uint64_t, DeviceTarget> resolved;
    std::size_t size = 0;                            ///< requests of the current batch
    /// A wait for a kernel over this slot failed: the kernel may still run, so the slot is never
    /// reused or freed (kept alive forever, and it stays counted as in use).
    bool kernel_may_run = false;
  };
  /// The bounded pool of batch slots (Options::max_batches_in_flight). Shared by the DataPath and
  /// every live batch, so a batch may outlive its DataPath. Thread-safe (one mutex).
  struct BatchPool {
    std::mutex mutex;
    std::vector<std::unique_ptr<BatchSlot>> idle;  ///< slots ready for reuse (LIFO: warm memory first)
    std::uint32_t in_use = 0;                      ///< slots held by batches (or abandoned to a kernel)
    std::uint32_t limit = 0;
  };
  /// Returns a batch's slot to its pool when the batch is destroyed.
  struct SlotReturn {
    std::shared_ptr<BatchPool> pool;
    void operator()(BatchSlot* slot) const noexcept {
      if (slot == nullptr) return;
      if (slot->kernel_may_run) {
        // Never free or reuse memory a kernel may still write: keep it forever, counted in use.
        leak_on_purpose(slot);
        return;
      }
      slot->mappings.clear();  // registrations may be unmapped now (zombies hold their own reference)
      if (slot->cache) slot->cache->unpin(slot->pins);  // no kernel reads its L1 entries any more
      slot->pins.clear();
      slot->cache.reset();
      std::scoped_lock lock(pool->mutex);
      --pool->in_use;
      try {
        pool->idle.emplace_back(slot);
      } catch (const std::bad_alloc&) {
        delete slot;  // no kernel runs over it (kernel_may_run is false)
      }
    }
  };
  struct State {
    libnvm::Controller* controller = nullptr;
    Options options;
    std::uint32_t lba_size = 0;
    std::uint64_t max_command_bytes = 0;
    std::vector<std::unique_ptr<Queue>> queues;
    KernelArray<Credits> credits;             ///< one per queue pair, sized once (stable addresses)
    KernelArray<DeviceQueue> device_queues;   ///< the kernels' view of `queues`
    /// The source of the copy that zeroes a batch's poll stop word before each poll launch (one
    /// word, pinned; allocated by create).
    KernelArray<std::uint64_t> zero_word;
    /// Poll kernels launched and not yet waited for, over all batches (they share the stream, so
    /// a wait may sit behind all of them: kernel_wait_bound_ns).
    std::atomic<std::uint64_t> poll_launches_in_flight{0};
    std::atomic<std::uint64_t> next_queue{0};
    std::mutex zombie_mutex;
    std::vector<Zombie> zombies;
    std::atomic<std::uint64_t> aborts_sent{0};
    std::atomic<std::uint64_t> poll_kernel_launches{0};
    std::shared_ptr<BatchPool> pool = std::make_shared<BatchPool>();
    std::shared_ptr<TargetCache> target_cache;  ///< shared with open targets and live batches
    /// Held shared by every submit and progress step from its launch to the end of its wait, taken
    /// exclusively (try only, never waiting) by the host's zombie reaping: the host touches the
    /// queue words the kernels update (CQ head, CID slots, credits) only while no kernel of any
    /// batch of this DataPath runs, because host and GPU atomics on one word are not atomic with
    /// respect to each other over PCIe on x86 (cudaDevAttrHostNativeAtomicSupported = 0).
    std::shared_mutex kernel_gate;
    /// A kernel wait failed (the kernel may run forever): the host never reaps zombies again; the
    /// queues' deletion in the destructor ends them.
    std::atomic<bool> kernel_abandoned{false};
    ~State() {
      bool all_deleted = true;
      for (auto& q : queues)
        if (q && !controller->delete_io_queue_pair(q->info.qid).is_ok()) all_deleted = false;  // ends its commands
      if (!all_deleted) {
        // The controller did not confirm the queues are gone (e.g. CSTS.CFS): it might still DMA
        // for a zombie command, so its mapping is leaked on purpose rather than unmapped.
        for (Zombie& z : zombies)
          if (z.mapping) leak_on_purpose(new std::shared_ptr<Mapping>(std::move(z.mapping)));
      }
      zombies.clear();  // the mappings may go now
    }
  };

 public:
  /// One registration (register_memory).
  struct registered_memory {
    std::shared_ptr<Mapping> mapping;
    /// The registration's PRP table as the kernels read it (prp_table.hpp): page tables in
    /// accelerator memory (CUDA profile: device memory, not dereferenceable on the host). For
    /// inspection (tests, diagnostics); nullptr when this object holds no registration (default
    /// constructed, or after unregister_memory). Thread-safety: as a plain value.
    const PrpTable* prp_table() const noexcept { return mapping ? &mapping->table : nullptr; }
  };

  /// One submit's in-flight state: a slot of the DataPath's batch pool, returned to the pool when
  /// the batch is destroyed (never while a kernel may still run over it). No slot: no request of
  /// the submit was accepted, progress has nothing to do. Movable, not copyable.
  struct batch {
    std::unique_ptr<BatchSlot, SlotReturn> slot;
  };

  static constexpr std::string_view name = "local_nvme";
  static constexpr Capabilities capabilities{
      .offset_alignment = 4096,
      .memory_alignment = 4,
      .max_request_bytes = std::uint64_t{1} << 30,
      .max_batch_requests = 65536,
      .memory_kinds = accel::kProfile == accel::Profile::cuda
                          ? MemoryKindSet{MemoryKind::HOST, MemoryKind::PINNED_HOST, MemoryKind::DEVICE}
                          : MemoryKindSet{MemoryKind::HOST, MemoryKind::PINNED_HOST},
      .unaligned_tail_at_end_of_target = true,
  };

  /// Creates the queue pairs on a brought-up controller. Errors: INVALID_ARGUMENT (options out of
  /// range, controller not brought up, LBA size not 512/4096, memory page size not 4096..65536),
  /// and the controller's create_io_queue_pair errors (queues already created are deleted).
  static Result<LocalNvmeDataPath> create(libnvm::Controller& controller) { return create(controller, Options()); }
  static Result<LocalNvmeDataPath> create(libnvm::Controller& controller, Options options) {
    const libnvm::ControllerIdentity& id = controller.identity();
    if (id.lba_size != 512 && id.lba_size != 4096)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: controller LBA size is {} (bring_up must succeed; 512 or 4096 supported)", id.lba_size);
    if (id.memory_page_size < 4096 || (id.memory_page_size & (id.memory_page_size - 1)) != 0)
      return error(StatusCode::INVALID_ARGUMENT, "local_nvme: memory page size {} unsupported", id.memory_page_size);
    if (options.queue_pairs == 0 || options.queue_pairs > std::max<std::uint32_t>(1, id.io_submission_queues_allocated))
      return error(StatusCode::INVALID_ARGUMENT, "local_nvme: queue_pairs = {} outside 1..{} (allocated by the controller)",
                   options.queue_pairs, id.io_submission_queues_allocated);
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
    if (const std::uint64_t limit = std::min(Options::kMaxPollKernelBudgetNs, options.command_timeout_ns / 2);
        options.poll_kernel_budget_ns > limit)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: poll_kernel_budget_ns = {} outside 0..{} (at most {} ns and command_timeout_ns / 2 = {} ns): "
                   "lower poll_kernel_budget_ns or raise command_timeout_ns",
                   options.poll_kernel_budget_ns, limit, Options::kMaxPollKernelBudgetNs, options.command_timeout_ns / 2);
    if (options.max_batches_in_flight == 0 || options.max_batches_in_flight > Options::kMaxBatchesInFlightLimit)
      return error(StatusCode::INVALID_ARGUMENT, "local_nvme: max_batches_in_flight = {} outside 1..{}",
                   options.max_batches_in_flight, Options::kMaxBatchesInFlightLimit);
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

    auto state = std::make_unique<State>();
    state->controller = &controller;
    state->options = options;
    state->lba_size = id.lba_size;
    state->max_command_bytes = max_bytes;
    state->pool->limit = options.max_batches_in_flight;
    auto cache = TargetCache::create(TargetCacheLimits{options.device_target_cache_entries,
                                                       options.device_target_cache_entry_extents,
                                                       options.host_target_cache_bytes});
    if (!cache) return cache.status().with_context("local_nvme: device_target_cache_entries");
    state->target_cache = std::move(cache.value());
    try {
      state->credits = kernel_array<Credits>(options.queue_pairs);
      state->zero_word = kernel_array<std::uint64_t>(1, 0);
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the credits of {} queue pairs",
                   options.queue_pairs);
    }
    for (std::uint32_t i = 0; i < options.queue_pairs; ++i) {
      auto info = controller.create_io_queue_pair(options.queue_depth);
      if (!info) return info.status().with_context(fmt::format("local_nvme: creating I/O queue pair {}", i + 1));
      auto q = std::make_unique<Queue>();
      q->info = *info;
      try {
        q->storage = std::make_unique<nvme::QueuePairStorage>(
            info->submission_queue, info->completion_queue, info->submission_queue_tail_doorbell,
            info->completion_queue_head_doorbell, info->controller_status, info->depth, info->qid, 0,
            accel::kKernelReachable);
      } catch (const std::bad_alloc&) {
        (void)controller.delete_io_queue_pair(info->qid);
        return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the state of I/O queue pair {}",
                     info->qid);
      }
      q->credits = &state->credits[i].value;
      *q->credits = info->depth - 1;
      const bool valid = q->storage->valid();
      state->queues.push_back(std::move(q));
      if (!valid) return error(StatusCode::INTERNAL, "local_nvme: queue pair {} has an invalid depth {}", info->qid, info->depth);
    }
    try {
      state->device_queues = kernel_array<DeviceQueue>(state->queues.size());
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the kernels' queue views");
    }
    for (std::size_t i = 0; i < state->queues.size(); ++i) state->device_queues[i] = state->queues[i]->device();
    return LocalNvmeDataPath(std::move(state));
  }

  LocalNvmeDataPath(LocalNvmeDataPath&&) noexcept = default;
  LocalNvmeDataPath& operator=(LocalNvmeDataPath&&) noexcept = default;

  /// The settings in force and the LBA size / command size limit derived from the controller.
  const Options& options() const noexcept { return state_->options; }
  std::uint32_t lba_size() const noexcept { return state_->lba_size; }
  std::uint64_t max_command_bytes() const noexcept { return state_->max_command_bytes; }
  /// NVMe Abort commands sent so far.
  std::uint64_t aborts_sent() const noexcept { return state_->aborts_sent.load(); }
  /// Progress kernels launched so far by progress() over all batches (one per step; see
  /// Options::poll_kernel_budget_ns). Thread-safe (an atomic counter).
  std::uint64_t poll_kernel_launches() const noexcept { return state_->poll_kernel_launches.load(); }
  /// Commands that timed out and were never answered, still holding their memory mapping.
  std::size_t zombie_commands() {
    reap_zombies();
    std::scoped_lock lock(state_->zombie_mutex);
    return state_->zombies.size();
  }
  /// Batch slots held by live batches (at most Options::max_batches_in_flight), and slots allocated
  /// (held plus idle ones kept for reuse).
  std::uint32_t batches_in_flight() const {
    std::scoped_lock lock(state_->pool->mutex);
    return state_->pool->in_use;
  }
  std::size_t batch_slots_allocated() const {
    std::scoped_lock lock(state_->pool->mutex);
    return state_->pool->in_use + state_->pool->idle.size();
  }
  /// The target handle cache's counters (hits, misses, evictions, fallbacks: one lookup per
  /// distinct target per submit; FLUSH requests read no extents and do no lookup) and occupancy.
  /// Thread-safe.
  TargetCacheStatistics target_cache_statistics() const { return state_->target_cache->statistics(); }
  /// Shared statistics of queue pair `i` (doorbell writes, completions reaped, stale CQEs).
  nvme::QueuePairState queue_statistics(std::size_t i) const { return state_->queues.at(i)->storage->statistics(); }

  /// Builds the device-resident handle: the L2 copy of the extents (resolved once, by the
  /// caller's FIEMAP, never again) in kernel-reachable memory (host profile: host memory) that
  /// submits copy into L1 and the submitting threads binary-search. Errors: INVALID_ARGUMENT
  /// when the payload's LBA size is not the controller's, or its invariants (Target::validate) do
  /// not hold; RESOURCE_EXHAUSTED when the open targets' extents would exceed
  /// Options::host_target_cache_bytes, or the copy cannot be allocated.
  Result<open_target> open(local_file::Target&& target, const OpenOptions& options) {
    if (target.lba_size != state_->lba_size)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: '{}' was resolved for {}-byte LBAs but the namespace uses {}-byte LBAs", target.path,
                   target.lba_size, state_->lba_size);
    TUTTI_RETURN_IF_ERROR(target.validate());
    open_target t;
    t.flush_on_close = options.flush_on_close;
    t.payload = std::make_unique<local_file::Target>(std::move(target));
    auto id = state_->target_cache->admit(t.payload->extents.size(), t.payload->path);
    if (!id) return id.status();
    t.cache_lease = std::make_unique<CacheLease>();
    t.cache_lease->cache = state_->target_cache;
    t.cache_lease->id = *id;
    t.cache_lease->extent_count = t.payload->extents.size();
    try {
      t.extents = KernelArray<local_file::Extent>(t.payload->extents.begin(), t.payload->extents.end(),
                                                  accel::PlacementAllocator<local_file::Extent>(accel::kKernelReachable));
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the {} extents of '{}'",
                   t.payload->extents.size(), t.payload->path);
    }
    t.device_target = DeviceTarget{t.extents.data(), t.extents.size(), t.payload->file_size, t.payload->lba_size,
                                   t.payload->nsid};
    return Result<open_target>(std::move(t));  // explicit: nvcc's front end does not move implicitly here
  }
  /// The file size in bytes.
  std::uint64_t size_bytes(const open_target& t) const noexcept { return t.payload->file_size; }
  /// Ends the lease (closes the fd). Only called with no IO in flight on the target. When the
  /// target was opened with flush_on_close, first issues one NVMe Flush of its namespace and waits
  /// for it (at most command_timeout_ns + abort_timeout_ns); its failure is returned (the lease is
  /// released either way): RESOURCE_EXHAUSTED (queue full), DEVICE_ERROR, TIMEOUT.
  Status close(open_target& t) {
    Status flushed;
    if (t.flush_on_close && t.payload) {
      const PathRequest<LocalNvmeDataPath> flush{Direction::FLUSH, nullptr, MemoryView{}, 0, &t, 0, 0};
      Status state;
      batch b = submit(std::span<const PathRequest<LocalNvmeDataPath>>(&flush, 1), std::span<Status>(&state, 1));
      if (!state.is_ok()) {
        detail::assign(flushed, state.with_context("flush on close"));
      } else {
        RequestCompletion completion;
        Status s = progress(b, std::span<RequestCompletion>(&completion, 1),
                            state_->options.command_timeout_ns + state_->options.abort_timeout_ns + state_->options.admin_timeout_ns);
        if (!s.is_ok()) {
          // Still in flight: keep the batch (and what it references) alive rather than free it.
          leak_on_purpose(new batch(std::move(b)));
          detail::assign(flushed, error(StatusCode::TIMEOUT, "flush on close: the NVMe Flush did not complete in time"));
        } else {
          detail::assign(flushed, completion.status.with_context("flush on close"));
        }
      }
    }
    t.payload.reset();
    t.cache_lease.reset();  // L2 room returns; the L1 entry goes now or with the last batch pinning it
    return flushed;
  }

  /// DMA-maps the pages that hold the region and prebuilds its PRP lists (two variants, see
  /// prp_table.hpp) at registration, so no submit builds a list. HOST / PINNED_HOST regions go
  /// through Controller::dma_map, DEVICE regions (CUDA profile; a cudaMalloc address) through
  /// Controller::dma_map_device. The list pages are read by the controller and live in a
  /// controller DMA buffer (host memory; for a GPU region they hold GPU bus addresses, as the
  /// Linux NVMe driver's lists do under GPUDirect Storage: a drive reads them from host memory and
  /// writes the data peer-to-peer). The page tables the kernels read per command (region pages and
  /// list pages, 8 bytes each) go into accelerator memory (accel::DeviceBuffer: device memory in
  /// the CUDA profile). Memory per registration: about 0.8 % of the region in list pages (host),
  /// 0.2 % in page tables (device memory in the CUDA profile), at 4 KiB pages.
  /// Errors: the controller's dma_map / dma_map_device / allocate_dma_buffer errors (e.g.
  /// INVALID_ARGUMENT when a page of the region is already mapped by another registration,
  /// UNSUPPORTED when the controller cannot map device memory), accel::allocate_device's
  /// RESOURCE_EXHAUSTED, or a failed copy into device memory (DEVICE_ERROR); nothing stays mapped
  /// on error. Thread-safety: safe concurrently with other calls on the DataPath.
  Result<registered_memory> register_memory(const MemoryView& view) {
    auto m = std::make_shared<Mapping>();
    const std::uint64_t page = 4096;
    const auto address = reinterpret_cast<std::uintptr_t>(view.address);
    const std::uintptr_t first = address / page * page;
    const std::uint64_t length = (address + view.size - first + page - 1) / page * page;
    const bool device = view.kind == MemoryKind::DEVICE;
    auto mapped = device ? state_->controller->dma_map_device(reinterpret_cast<void*>(first), length)
                         : state_->controller->dma_map(reinterpret_cast<void*>(first), length);
    if (!mapped)
      return mapped.status().with_context(device ? "local_nvme: register_memory: dma_map_device"
                                                 : "local_nvme: register_memory: dma_map");
    m->controller = state_->controller;
    m->mapping = std::move(mapped.value());
    m->user_address = address;
    m->user_size = view.size;
    if (Status built = build_prp_table(*m); !built) return built.with_context("local_nvme: register_memory");
    return registered_memory{std::move(m)};
  }

  /// Allocates and fills the list pages of `m` (a controller DMA buffer) and places the page
  /// tables the kernels read (see register_memory). Errors as register_memory; `m`'s destructor
  /// releases whatever was set up.
  Status build_prp_table(Mapping& m) {
    const std::uint32_t page_size = m.mapping.page_size;
    const std::uint64_t region_pages = m.mapping.bus_addresses.size();
    const std::uint64_t list_pages = PrpTable::list_pages_for(region_pages, page_size);
    auto lists = m.controller->allocate_dma_buffer(2 * list_pages * page_size);
    if (!lists) return lists.status().with_context("PRP list buffer");
    m.lists = *lists;
    std::vector<std::uint64_t> list_bus_addresses;
    try {
      list_bus_addresses.resize(2 * list_pages);
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "no host memory for the bus addresses of {} PRP list pages", 2 * list_pages);
    }
    for (std::uint64_t i = 0; i < 2 * list_pages; ++i) list_bus_addresses[i] = m.lists.bus_address + i * page_size;
    // Fill from host copies of both page tables, then move the tables to accelerator memory.
    m.table.pages = nvme::PageTableView{m.mapping.bus_addresses.data(), region_pages, page_size};
    m.table.lists = nvme::PageTableView{list_bus_addresses.data(), 2 * list_pages, page_size};
    m.table.list_pages = list_pages;
    m.table.fill(static_cast<std::uint64_t*>(m.lists.host_address));
    const std::uint64_t table_bytes = (region_pages + 2 * list_pages) * sizeof(std::uint64_t);
    auto tables = accel::DeviceBuffer::allocate(table_bytes);
    if (!tables) return tables.status().with_context("page tables in accelerator memory");
    m.page_tables = std::move(*tables);
    auto* home = static_cast<std::uint64_t*>(m.page_tables.data());
    if (Status copied = accel::copy_to_device(home, m.mapping.bus_addresses.data(), region_pages * sizeof(std::uint64_t)); !copied)
      return copied.with_context("region page table into accelerator memory");
    if (Status copied = accel::copy_to_device(home + region_pages, list_bus_addresses.data(), 2 * list_pages * sizeof(std::uint64_t));
        !copied)
      return copied.with_context("PRP list page table into accelerator memory");
    m.table.pages.bus_addresses = home;
    m.table.lists.bus_addresses = home + region_pages;
    return Status::success();
  }

  /// Unmaps the region. BUSY (and the mapping is kept alive until the controller is done) while a
  /// timed-out command that the controller never answered may still transfer into it.
  Status unregister_memory(registered_memory& memory) {
    if (!memory.mapping) return Status::success();
    reap_zombies();
    if (const auto z = memory.mapping->zombies.load(); z > 0)
      return error(StatusCode::BUSY,
                   "local_nvme: {} timed-out command(s) on this region were never answered by the controller; the "
                   "mapping stays until they complete or the queues are deleted",
                   z);
    memory.mapping.reset();
    return Status::success();
  }

  /// One launch over the batch (see the file comment). Never blocks beyond the launch (CUDA: the
  /// wait for the submit kernel, bounded by command_timeout_ns). The batch's state comes from the
  /// DataPath's bounded pool (Options::max_batches_in_flight; no allocation once the pool's slots
  /// have grown to the batch sizes in use). States: OK (accepted), the rejections of `rejection`,
  /// RESOURCE_EXHAUSTED when max_batches_in_flight batches are alive (backpressure: every request
  /// of the submit is rejected, nothing runs) or a slot cannot grow to n requests, the launch's
  /// error (UNSUPPORTED from a host-compiled translation unit of the CUDA profile), or the wait's
  /// error (TIMEOUT / DEVICE_ERROR: the slot is then abandoned to the kernel, never reused or
  /// freed, and stays counted in max_batches_in_flight).
  batch submit(std::span<const PathRequest<LocalNvmeDataPath>> requests, std::span<Status> states) {
    batch b;
    const std::size_t n = requests.size();
    if (n == 0) return b;
    const std::uint32_t window = state_->options.request_window;
    const auto reject_all = [&](const Status& why) {
      for (std::size_t i = 0; i < n; ++i) detail::assign(states[i], why);
    };
    {
      BatchPool& pool = *state_->pool;
      std::scoped_lock lock(pool.mutex);
      if (pool.in_use >= pool.limit) {
        reject_all(error(StatusCode::RESOURCE_EXHAUSTED,
                         "local_nvme: {} batches are alive, the limit set by Options::max_batches_in_flight = {}; "
                         "destroy a finished batch (release its IO) and resubmit",
                         pool.in_use, pool.limit));
        return b;
      }
      BatchSlot* slot = nullptr;
      if (!pool.idle.empty()) {
        slot = pool.idle.back().release();
        pool.idle.pop_back();
      } else {
        slot = new (std::nothrow) BatchSlot();
        if (slot == nullptr) {
          reject_all(error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for a batch slot"));
          return b;
        }
      }
      ++pool.in_use;
      b.slot = std::unique_ptr<BatchSlot, SlotReturn>(slot, SlotReturn{state_->pool});
    }
    BatchSlot& slot = *b.slot;
    try {
      // Reuses the slot's capacity: allocates only when n exceeds the largest batch it served.
      slot.staged.assign(n, RequestState{});
      slot.reports.assign(n, RequestReport{});
      slot.records_copy.assign(window, CommandRecord{});
      slot.mappings.assign(n, nullptr);
      slot.reported.assign(n, 0);
      slot.pins.clear();
      slot.pins.reserve(std::min<std::size_t>(n, state_->options.device_target_cache_entries));
      slot.resolved.clear();
    } catch (const std::bad_alloc&) {
      reject_all(error(StatusCode::RESOURCE_EXHAUSTED,
                       "local_nvme: no memory for the state of a batch of {} requests (request_window = {})", n, window));
      b.slot.reset();  // nothing ran over it: back to the pool
      return b;
    }
    for (auto [buffer, bytes, what] : {std::tuple{&slot.device_requests, n * sizeof(RequestState), "request states"},
                                       std::tuple{&slot.device_records, n * window * sizeof(CommandRecord), "command records"},
                                       std::tuple{&slot.device_reports, n * sizeof(RequestReport), "request reports"},
                                       std::tuple{&slot.device_poll_stop, sizeof(std::uint64_t), "poll kernel's stop word"}}) {
      if (buffer->size() >= bytes) continue;
      *buffer = accel::DeviceBuffer();  // no kernel runs over an idle slot
      auto grown = accel::DeviceBuffer::allocate(bytes);
      if (!grown) {
        reject_all(grown.status().with_context(
            fmt::format("local_nvme: device memory for the {} of a batch of {} requests", what, n)));
        b.slot.reset();
        return b;
      }
      *buffer = std::move(grown.value());
    }
    slot.size = n;
    auto* device_requests = static_cast<RequestState*>(slot.device_requests.data());
    auto* device_records = static_cast<CommandRecord*>(slot.device_records.data());
    auto* device_reports = static_cast<RequestReport*>(slot.device_reports.data());
    // One queue pair per warp of requests (round robin over warps; host profile: per request), so
    // a warp's commands share one SQ reservation and one doorbell write.
    const std::uint64_t lanes = accel::kKernelWarpLanes;
    const std::uint64_t base = state_->next_queue.fetch_add((n + lanes - 1) / lanes, std::memory_order_relaxed);
    void* stream = state_->options.stream.native_handle();
    slot.cache = state_->target_cache;  // the slot keeps L1 alive while it pins entries
    bool cache_copied = false;          // a miss enqueued a copy into L1 on the stream
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = requests[i];
      RequestState& r = slot.staged[i];
      r.opcode = p.direction == Direction::READ    ? nvme::NvmOpcode::read
                 : p.direction == Direction::WRITE ? nvme::NvmOpcode::write
                                                   : nvme::NvmOpcode::flush;
      r.queue_index = static_cast<std::uint32_t>((base + i / lanes) % state_->queues.size());
      r.target = p.direction == Direction::FLUSH ? p.target->device_target  // reads no extents
                                                 : target_handle(slot, *p.target, stream, cache_copied);
      r.target_offset = p.target_offset;
      r.length = p.length;
      r.max_command_bytes = state_->max_command_bytes;
      r.command_timeout_ns = state_->options.command_timeout_ns;
      r.abort_timeout_ns = state_->options.abort_timeout_ns;
      r.max_window = window;
      r.records = device_records + i * window;  // the submit kernel sets them free
      if (p.memory != nullptr && p.memory->mapping) {
        const Mapping& m = *p.memory->mapping;
        r.memory = m.table;
        // The mapping starts at the page that holds the region's first byte.
        r.memory_offset = (m.user_address - reinterpret_cast<std::uintptr_t>(m.mapping.host_address)) + p.memory_offset;
        r.memory_room = p.memory_offset <= p.memory_view.size ? p.memory_view.size - p.memory_offset : 0;
        slot.mappings[i] = p.memory->mapping;
      }
    }
    std::shared_lock gate(state_->kernel_gate);  // no zombie reaping while this batch's kernel may run
    // ONE copy of the staged batch, ONE launch, ONE copy of the reports back, all on the stream,
    // then ONE bounded wait.
    Status launched = accel::copy_to_device_async(device_requests, slot.staged.data(), n * sizeof(RequestState), stream);
    const bool copy_enqueued = launched.is_ok();
    if (launched.is_ok())
      detail::assign(launched, launch_over(n, AdmitKernel{device_requests, state_->device_queues.data(), n, device_reports}));
    const bool kernel_enqueued = launched.is_ok();
    if (launched.is_ok())
      detail::assign(launched,
                     accel::copy_from_device_async(slot.reports.data(), device_reports, n * sizeof(RequestReport), stream));
    if (copy_enqueued || cache_copied) {
      const Status waited = accel::synchronize(stream, kernel_wait_bound_ns(state_->poll_launches_in_flight.load()));
      if (!waited.is_ok()) {
        // The stream may still run the copy or the kernel, which may have commands in flight:
        // abandon the slot to it (never reused or freed; the mappings stay referenced).
        reject_all(waited.with_context("local_nvme: submit kernel"));
        slot.kernel_may_run = true;
        state_->kernel_abandoned.store(true);
        b.slot.reset();
        return b;
      }
      state_->target_cache->mark_ready(slot.pins);  // the L1 copies have landed
    }
    if (!launched.is_ok()) {
      // A kernel that ran but whose reports cannot come back: its accepted requests are in flight
      // with no way to follow them, so the slot is abandoned (never reused) and all report the error.
      reject_all(launched.with_context("local_nvme: submit"));
      if (kernel_enqueued) {
        slot.kernel_may_run = true;
        state_->kernel_abandoned.store(true);
      }
      b.slot.reset();
      return b;
    }
    gate.unlock();
    bool any_accepted = false;
    for (std::size_t i = 0; i < n; ++i) {
      const RequestReport& report = slot.reports[i];
      detail::assign(states[i], report.accepted ? Status::success() : rejection(slot.staged[i], report, requests[i]));
      if (!report.accepted) slot.reported[i] = 1;
      any_accepted = any_accepted || report.accepted;
    }
    if (!any_accepted) b.slot.reset();  // nothing in flight: the slot goes back at once
    return b;
  }

  /// Polls the batch for up to timeout_ns (see the concept): launches poll kernels (each polling on
  /// the accelerator for up to min(Options::poll_kernel_budget_ns, what is left of timeout_ns)),
  /// sends Aborts and hands off zombies between them. OK when every accepted request has
  /// completed, NOT_READY when the budget ran out first; a failed kernel wait or copy (TIMEOUT /
  /// DEVICE_ERROR) abandons the batch to its kernel, and every later progress on it returns
  /// DEVICE_ERROR without launching. Each wait is bounded by command_timeout_ns plus the budget of
  /// this DataPath's poll kernels queued ahead on the shared stream.
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns) {
    if (!b.slot) return Status::success();  // nothing was accepted
    if (b.slot->kernel_may_run)
      // A wait failed earlier: a kernel may still run over this batch's state; launching another
      // over it (or zeroing its stop word) would race with it. The batch stays abandoned.
      return error(StatusCode::DEVICE_ERROR, "local_nvme: this batch was abandoned after a failed kernel wait; its requests' "
                                        "outcome is unknown");
    const std::uint64_t deadline = accel::deadline_after(timeout_ns);
    BatchSlot& slot = *b.slot;
    const std::size_t n = slot.size;
    void* stream = state_->options.stream.native_handle();
    auto* device_requests = static_cast<RequestState*>(slot.device_requests.data());
    auto* device_reports = static_cast<RequestReport*>(slot.device_reports.data());
    auto* stop_word = static_cast<std::uint64_t*>(slot.device_poll_stop.data());
    accel::Backoff backoff;
    for (;;) {
      // ONE launch (polling on the accelerator for up to its budget) and ONE copy of the reports
      // back per step, then ONE bounded wait.
      const std::uint64_t now = accel::timer_ns();
      const std::uint64_t budget = std::min(state_->options.poll_kernel_budget_ns, deadline > now ? deadline - now : 0);
      {
        std::shared_lock gate(state_->kernel_gate);  // no zombie reaping while this kernel may run
        if (budget != 0)
          TUTTI_RETURN_IF_ERROR(accel::copy_to_device_async(stop_word, state_->zero_word.data(), sizeof(std::uint64_t), stream)
                                    .with_context("local_nvme: zeroing the poll kernel's stop word"));
        TUTTI_RETURN_IF_ERROR(launch_over(
            n, PollKernel{device_requests, state_->device_queues.data(), n, device_reports, stop_word, budget}));
        state_->poll_kernel_launches.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t in_flight = state_->poll_launches_in_flight.fetch_add(1) + 1;  // this one and those ahead
        const PollLaunchCount counted{state_->poll_launches_in_flight};
        Status copied = accel::copy_from_device_async(slot.reports.data(), device_reports, n * sizeof(RequestReport), stream);
        Status waited = accel::synchronize(stream, kernel_wait_bound_ns(in_flight));
        if (!copied.is_ok() || !waited.is_ok()) {
          // The kernel may still run (or its reports never came back): the slot is abandoned to it
          // (never reused or freed, even after the caller destroys the batch).
          slot.kernel_may_run = true;
          state_->kernel_abandoned.store(true);
          return (copied.is_ok() ? waited : copied).with_context("local_nvme: poll kernel");
        }
      }
      bool all_done = true;
      bool any_new = false;
      for (std::size_t i = 0; i < n; ++i) {
        const RequestReport& report = slot.reports[i];
        if (!report.accepted || slot.reported[i]) continue;
        if (report.needs_host != 0) {
          // Rare (timeouts): this request's records come back so the host can act on them.
          const Status records = copy_records_back(slot, i);
          if (!records.is_ok()) {
            slot.kernel_may_run = true;  // the copy may still be running into records_copy
            return records;
          }
          const std::uint32_t queue_index = slot.staged[i].queue_index;
          send_aborts(queue_index, slot.records_copy);
          hand_off_zombies(queue_index, slot.records_copy, slot.mappings[i]);
        }
        if (!report.done) {
          all_done = false;
          continue;
        }
        completions[i] = completion_of(slot.staged[i], report, i);
        slot.reported[i] = 1;
        any_new = true;
      }
      reap_zombies();
      if (all_done) return Status::success();
      if (accel::timer_ns() >= deadline)
        return Status(StatusCode::NOT_READY, "local_nvme: batch still in flight");
      if (any_new || budget != 0) {
        backoff.reset();  // the kernel itself polled (or something completed): relaunch at once
      } else {
        backoff.pause();
      }
    }
  }

 private:
  explicit LocalNvmeDataPath(std::unique_ptr<State> state) : state_(std::move(state)) {}

  /// Takes one poll launch off State::poll_launches_in_flight when its wait is over.
  struct PollLaunchCount {
    std::atomic<std::uint64_t>& count;
    ~PollLaunchCount() { count.fetch_sub(1); }
  };

  /// How long a wait for work just enqueued on Options::stream may take, ns: command_timeout_ns
  /// plus the polling budget of `poll_kernels` poll kernels of this DataPath queued ahead of it
  /// (all batches share the stream; each may poll for its whole budget). Saturating.
  std::uint64_t kernel_wait_bound_ns(std::uint64_t poll_kernels) const noexcept {
    const std::uint64_t budget = state_->options.poll_kernel_budget_ns, limit = ~std::uint64_t{0};
    const std::uint64_t extra = budget == 0 ? 0 : (poll_kernels > limit / budget ? limit : poll_kernels * budget);
    const std::uint64_t timeout = state_->options.command_timeout_ns;
    return extra > limit - timeout ? limit : timeout + extra;
  }

  /// One launch of `kernel` (AdmitKernel / PollKernel: they skip threads at or past n) over n
  /// logical threads, on Options::stream.
  template <class Kernel>
  Status launch_over(std::size_t n, const Kernel& kernel) {
    if (n == 0) return Status::success();
    const std::uint32_t tpb = state_->options.threads_per_block;
    const accel::LaunchConfig config{static_cast<std::uint32_t>((n + tpb - 1) / tpb), tpb, state_->options.stream.native_handle()};
    return accel::launch(config, kernel);
  }

  /// The handle the kernels of the batch in `slot` use for `t`: its L1 entry (pinned by the batch)
  /// or its L2 copy (TargetCache::acquire), looked up once per distinct target per submit.
  DeviceTarget target_handle(BatchSlot& slot, const open_target& t, void* stream, bool& copied) {
    if (!t.cache_lease) return t.device_target;
    const std::uint64_t id = t.cache_lease->id;
    if (const auto found = slot.resolved.find(id); found != slot.resolved.end()) return found->second;
    const DeviceTarget handle = state_->target_cache->acquire(id, t.device_target, stream, slot.pins, copied);
    try {
      slot.resolved.emplace(id, handle);
    } catch (const std::bad_alloc&) {
      // Not remembered: a later request of this target looks it up again (pins it once more).
    }
    return handle;
  }

  /// Request i's records copied back into slot.records_copy (one copy on the stream and a bounded
  /// wait; no kernel of the batch runs then).
  Status copy_records_back(BatchSlot& slot, std::size_t i) {
    const std::uint32_t window = state_->options.request_window;
    const auto* device_records = static_cast<const CommandRecord*>(slot.device_records.data());
    void* stream = state_->options.stream.native_handle();
    TUTTI_RETURN_IF_ERROR(accel::copy_from_device_async(slot.records_copy.data(), device_records + i * window,
                                                        window * sizeof(CommandRecord), stream)
                              .with_context("local_nvme: command records"));
    return accel::synchronize(stream, kernel_wait_bound_ns(state_->poll_launches_in_flight.load()))
        .with_context("local_nvme: command records");
  }

  /// The Status of a request the submit kernel did not accept: `r` as staged, `report` from the kernel.
  Status rejection(const RequestState& r, const RequestReport& report, const PathRequest<LocalNvmeDataPath>& p) const {
    const Queue& q = *state_->queues[r.queue_index];
    switch (report.outcome) {
      case RequestOutcome::rejected_backpressure:
        return error(StatusCode::RESOURCE_EXHAUSTED,
                     "local_nvme: I/O queue {} has no free command slots (depth {}); resubmit later", q.info.qid,
                     q.info.depth);
      case RequestOutcome::rejected_alignment:
        return error(StatusCode::INVALID_ARGUMENT,
                     "local_nvme: target_offset = {} and length = {} must be multiples of the {}-byte LBA size unless "
                     "the request ends at end of file ({})",
                     p.target_offset, p.length, r.target.lba_size, r.target.file_size);
      case RequestOutcome::rejected_memory_room:
        return error(StatusCode::OUT_OF_RANGE,
                     "local_nvme: length = {} needs {} bytes of memory (whole {}-byte LBAs: a tail is transferred "
                     "rounded up) but only {} bytes follow memory_offset = {}",
                     p.length, report.transfer_length, r.target.lba_size, r.memory_room, p.memory_offset);
      default:
        return error(StatusCode::INTERNAL, "local_nvme: request not accepted (outcome {})",
                     static_cast<unsigned>(report.outcome));
    }
  }

  /// The completion of request i: `r` as staged, `report` from the last kernel (done).
  RequestCompletion completion_of(const RequestState& r, const RequestReport& report, std::size_t i) const {
    RequestCompletion c;
    c.request_index = i;
    c.done = true;
    c.commands = report.commands;
    c.device_status = report.nvme_status;
    c.confirmed_bytes = std::min(report.confirmed_bytes, r.length);
    const Queue& q = *state_->queues[r.queue_index];
    const nvme::StatusField field = nvme::StatusField::make(static_cast<std::uint8_t>(report.nvme_status >> 8),
                                                            static_cast<std::uint8_t>(report.nvme_status & 0xff), false);
    switch (report.outcome) {
      case RequestOutcome::ok:
        detail::assign(c.status, Status::success());
        break;
      case RequestOutcome::nvme_error:
        detail::assign(c.status, error(StatusCode::DEVICE_ERROR,
                         "local_nvme: command at file offset {} (SLBA {}, I/O queue {}) failed: {}; {} of {} bytes confirmed",
                         report.failed_file_offset, report.failed_lba, q.info.qid, nvme::describe_status(field),
                         c.confirmed_bytes, r.length));
        break;
      case RequestOutcome::timed_out:
        detail::assign(c.status, error(StatusCode::TIMEOUT,
                         "local_nvme: a command at file offset {} (SLBA {}, I/O queue {}) did not complete within {} ns "
                         "and was aborted{}; {} of {} bytes confirmed",
                         report.failed_file_offset, report.failed_lba, q.info.qid, state_->options.command_timeout_ns,
                         report.zombies > 0 ? " (no answer: its memory stays mapped)" : "", c.confirmed_bytes, r.length));
        break;
      case RequestOutcome::controller_fatal:
        detail::assign(c.status, error(StatusCode::DEVICE_ERROR,
                         "local_nvme: controller fatal status (CSTS.CFS) or device gone with I/O queue {} busy; {} of {} "
                         "bytes confirmed",
                         q.info.qid, c.confirmed_bytes, r.length));
        break;
      case RequestOutcome::no_extent:
        detail::assign(c.status, error(StatusCode::DATA_LOSS, "local_nvme: no extent maps file offset {}", report.failed_file_offset));
        break;
      case RequestOutcome::prp_error:
        detail::assign(c.status, error(StatusCode::OUT_OF_RANGE,
                         "local_nvme: memory for file offset {} lies outside the registered region", report.failed_file_offset));
        break;
      default:
        detail::assign(c.status, error(StatusCode::INTERNAL, "local_nvme: unexpected outcome {}", static_cast<unsigned>(report.outcome)));
    }
    return c;
  }

  /// Host step between poll kernels: NVMe Abort for every command the kernel marked timed out
  /// (`records`: one request's records as copied back; the next poll kernel starts their abort timer).
  void send_aborts(std::uint32_t queue_index, const std::vector<CommandRecord>& records) {
    const Queue& q = *state_->queues[queue_index];
    for (const CommandRecord& rec : records) {
      if (rec.phase != CommandPhase::timed_out) continue;
      // The answer (aborted or not found) does not change what follows: the command's own CQE,
      // or its absence until abort_timeout_ns, decides.
      (void)state_->controller->abort(q.info.qid, rec.cid, state_->options.admin_timeout_ns);
      state_->aborts_sent.fetch_add(1);
    }
  }

  /// Moves zombie commands of a request to the DataPath's list (they keep the mapping alive); the
  /// next poll kernel frees their records.
  void hand_off_zombies(std::uint32_t queue_index, const std::vector<CommandRecord>& records,
                        const std::shared_ptr<Mapping>& mapping) {
    for (const CommandRecord& rec : records) {
      if (rec.phase != CommandPhase::zombie) continue;
      if (mapping) mapping->zombies.fetch_add(1);
      std::scoped_lock lock(state_->zombie_mutex);
      state_->zombies.push_back(Zombie{queue_index, rec.cid, mapping});
    }
  }

  /// Frees zombies whose completion finally arrived: their credit returns, their mapping may go.
  /// Never waits: skipped while a kernel of any batch may run (State::kernel_gate), and for good
  /// once a kernel was abandoned; the next progress, zombie_commands or unregister_memory retries.
  void reap_zombies() {
    if (state_->kernel_abandoned.load()) return;
    std::unique_lock gate(state_->kernel_gate, std::try_to_lock);
    if (!gate.owns_lock()) return;  // a kernel's threads own the queue words now
    std::scoped_lock lock(state_->zombie_mutex);
    auto& z = state_->zombies;
    for (std::size_t i = 0; i < z.size();) {
      Queue& q = *state_->queues[z[i].queue_index];
      q.storage->queue().reap_completions();
      nvme::CompletionQueueEntry cqe{};
      if (q.storage->queue().take_completion(z[i].cid, cqe)) {
        detail::return_credits(q.credits, 1);
        if (z[i].mapping) z[i].mapping->zombies.fetch_sub(1);
        z[i] = std::move(z.back());
        z.pop_back();
      } else {
        ++i;
      }
    }
  }

  std::unique_ptr<State> state_;
};

static_assert(tutti::DataPath<LocalNvmeDataPath>);

}  // namespace tutti::local_nvme
