// The bounded pool of batch state of the local_nvme DataPath (Options::max_batches_in_flight):
// each submit takes a slot (RESOURCE_EXHAUSTED beyond the limit: backpressure, never blocking)
// and its batch returns it when destroyed. A slot holds one batch's kernel-reachable state (the
// staged RequestStates, their CommandRecords and RequestReports in device memory, the pinned
// staging and report arrays) and keeps the capacity of the largest batch it served, so a warm
// pool allocates nothing per submit. A slot never frees on the submit path: arrays it outgrows are
// kept until the slot is destroyed with the pool (in the cuda profile cudaFree and cudaFreeHost wait
// for every stream of the device, so a free there would stall each submit behind whatever kernels
// run: the model's, or a persistent one until it ends), and capacity grows at least twofold, so
// what is kept is never more than what is in use.
// A slot over which a kernel may still run (a wait for it failed) is never reused or freed: it
// is kept forever and stays counted in use (core/leak.hpp).
// Thread-safety: the pool has one mutex; a slot belongs to one batch, used by one thread at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/placement.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/kernel_array.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/registration.hpp>
#include <tutti/path/local_nvme/target_cache.hpp>
#include <tutti/path/local_nvme/targets.hpp>

namespace tutti::local_nvme {

/// One pooled batch's state. The kernel-reachable arrays keep their capacity across submits;
/// `size` requests of them belong to the batch that holds the slot.
struct BatchSlot {
  /// The requests as staged by the host (pinned: the source of the ONE host-to-device copy).
  KernelArray<RequestState> staged{accel::PlacementAllocator<RequestState>(accel::kKernelReachable)};
  /// The kernels' reports as copied back after each kernel (pinned: the ONE device-to-host copy).
  KernelArray<RequestReport> reports{accel::PlacementAllocator<RequestReport>(accel::kKernelReachable)};
  accel::DeviceBuffer device_requests;   ///< size x RequestState: what the kernels update
  accel::DeviceBuffer device_records;    ///< size x request_window x CommandRecord
  accel::DeviceBuffer device_reports;    ///< size x RequestReport
  accel::DeviceBuffer device_poll_stop;  ///< the polling kernel's stop word (8 bytes, zeroed before each)
  /// The stream of this slot's poll kernels and their copies (Options::poll_stream_per_batch;
  /// none: they run on Options::stream). Made once, by the first prepare that asks for it, on the
  /// device current then; when CUDA cannot make one, the slot polls on Options::stream.
  accel::OwnedStream poll_stream;
  /// The native handle of the stream this slot's poll kernels and copies back run on: its poll
  /// stream, or `shared` (Options::stream) when it has none.
  void* polling_stream(const accel::StreamRef& shared) const noexcept {
    return poll_stream.has_value() ? poll_stream.ref().native_handle() : shared.native_handle();
  }
  std::vector<CommandRecord> records_copy;         ///< one request's records, copied back on demand
  std::vector<std::shared_ptr<Mapping>> mappings;  ///< per request (zombie hand-off)
  std::vector<std::uint8_t> reported;              ///< completion already reported
  /// Per request, its target's change signal (targets.hpp; valid while the request is in flight:
  /// a target is closed only with no IO in flight).
  std::vector<ChangeSignal*> signals;
  /// The target handle cache's L1 entries this batch pins (until it is destroyed) and the
  /// handle each distinct target of the batch resolved to (by cache id).
  std::shared_ptr<TargetCache> cache;
  std::vector<std::uint32_t> pins;
  std::unordered_map<std::uint64_t, DeviceTarget> resolved;
  std::size_t size = 0;  ///< requests of the current batch
  /// Arrays the slot outgrew, freed with the slot (see the file comment).
  std::vector<KernelArray<RequestState>> outgrown_staged;
  std::vector<KernelArray<RequestReport>> outgrown_reports;
  std::vector<accel::DeviceBuffer> outgrown_device;
  /// A wait for a kernel over this slot failed: the kernel may still run, so the slot is never
  /// reused or freed (kept alive forever, and it stays counted as in use).
  bool kernel_may_run = false;
  /// The persistent poller's view of the slot (persistent_poller.hpp): its table entry (the slot's
  /// index in its pool, fixed), the word the kernel stores a post's sequence into when it hands the
  /// batch back (mapped pinned), the kernel's bitmap of released chunks (device memory), and the
  /// sequence and launch of the post that owns the batch now (0: the host owns it).
  std::uint32_t poller_index = 0;
  KernelArray<std::uint64_t> poller_released{accel::PlacementAllocator<std::uint64_t>(accel::kKernelReachable)};
  accel::DeviceBuffer poller_chunk_bits;
  std::uint64_t poller_sequence = 0;
  std::uint64_t poller_generation = 0;
  /// Whether the persistent poller still owns the batch (posted and not handed back). Reads one
  /// word the kernel writes (acquire: the reports it wrote before are visible after).
  bool poller_owns() const noexcept {
    return poller_sequence != 0 && std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(poller_released[0]))
                                           .load(std::memory_order_acquire) != poller_sequence;
  }

  /// True when the last reports copied back show an accepted request done that progress has not
  /// reported yet (it completed at submit, or in a step of a call that returned before handling it).
  bool has_unreported_done() const {
    for (std::size_t i = 0; i < size; ++i)
      if (reports[i].accepted && reports[i].done && !reported[i]) return true;
    return false;
  }

  /// True when the last reports copied back leave no kernel anything to do: every accepted request
  /// progress has not reported yet is done (a submit kernel that polled it to the end, Options::
  /// submit_poll_budget_ns). progress then takes them from these reports without a launch.
  bool reports_settled() const {
    for (std::size_t i = 0; i < size; ++i)
      if (reports[i].accepted && !reported[i] && !reports[i].done) return false;
    return true;
  }

  /// Sizes the slot for `n` requests with `window` records each, reusing its capacity (allocates
  /// only when n exceeds the largest batch it served); `pin_capacity`: L1 entries the batch may
  /// pin. Only while no kernel runs over the slot. Errors, each naming the batch size, the array
  /// and the bytes requested: the kernel-reachable allocator's (accel::allocation_failure: in the
  /// cuda profile allocate_mapped_host's code and CUDA's text; RESOURCE_EXHAUSTED for host
  /// memory), accel::DeviceBuffer::allocate's (device memory). `own_poll_stream`: make the
  /// slot's poll stream if it has none (a failure to make one is not an error: the slot then
  /// polls on Options::stream, as with Options::poll_stream_per_batch false).
  Status prepare(std::size_t n, std::uint32_t window, std::size_t pin_capacity, bool own_poll_stream,
                 bool persistent_poller = false) {
    if (own_poll_stream && !poll_stream.has_value())
      if (auto made = accel::OwnedStream::create(); made) poll_stream = std::move(made.value());
    const char* what = "request states (pinned staging)";
    std::size_t bytes = n * sizeof(RequestState);
    try {
      outgrown_device.reserve(outgrown_device.size() + 4);  // the pushes below never throw
      grow_without_freeing(staged, outgrown_staged, n);
      staged.assign(n, RequestState{});
      what = "request reports (pinned)";
      bytes = n * sizeof(RequestReport);
      grow_without_freeing(reports, outgrown_reports, n);
      reports.assign(n, RequestReport{});
      what = "host bookkeeping";
      bytes = window * sizeof(CommandRecord) + n * (sizeof(std::shared_ptr<Mapping>) + 1 + sizeof(ChangeSignal*)) +
              pin_capacity * sizeof(std::uint32_t);
      records_copy.assign(window, CommandRecord{});
      mappings.assign(n, nullptr);
      reported.assign(n, 0);
      signals.assign(n, nullptr);
      pins.clear();
      pins.reserve(pin_capacity);
      resolved.clear();
      what = "the persistent poller's released word (pinned)";
      bytes = sizeof(std::uint64_t);
      if (persistent_poller && poller_released.empty()) poller_released.assign(1, 0);
    } catch (const std::bad_alloc& failure) {
      return accel::allocation_failure(
          failure, fmt::format("local_nvme: no memory for the state of a batch of {} requests (request_window = {}): "
                               "{} bytes of {}",
                               n, window, bytes, what));
    }
    for (auto [buffer, bytes, what] :
         {std::tuple{&device_requests, n * sizeof(RequestState), "request states"},
          std::tuple{&device_records, n * window * sizeof(CommandRecord), "command records"},
          std::tuple{&device_reports, n * sizeof(RequestReport), "request reports"},
          std::tuple{&device_poll_stop, sizeof(std::uint64_t), "poll kernel's stop word"},
          std::tuple{&poller_chunk_bits, persistent_poller ? ((n + 31) / 32 + 63) / 64 * sizeof(std::uint64_t) : 0,
                     "persistent poller's chunk bitmap"}}) {
      if (buffer->size() >= bytes) continue;
      auto grown = accel::DeviceBuffer::allocate(std::max(bytes, 2 * buffer->size()));
      if (!grown)
        return grown.status().with_context(
            fmt::format("local_nvme: device memory for the {} of a batch of {} requests", what, n));
      if (buffer->size() != 0) outgrown_device.push_back(std::move(*buffer));  // reserved above
      *buffer = std::move(grown.value());
    }
    size = n;
    return Status::success();
  }

 private:
  /// Gives `array` room for n elements, at least twice its capacity, without freeing its old storage
  /// (kept in `outgrown`; see the file comment). Throws std::bad_alloc.
  template <class T>
  static void grow_without_freeing(KernelArray<T>& array, std::vector<KernelArray<T>>& outgrown, std::size_t n) {
    if (n <= array.capacity()) return;
    outgrown.reserve(outgrown.size() + 1);
    KernelArray<T> bigger(array.get_allocator());
    bigger.reserve(std::max(n, 2 * array.capacity()));
    array.swap(bigger);
    if (bigger.capacity() != 0) outgrown.push_back(std::move(bigger));
  }
};

/// The bounded pool of batch slots. Shared by the DataPath and every live batch, so a batch may
/// outlive its DataPath. Thread-safe (one mutex).
struct BatchPool {
  std::mutex mutex;
  std::vector<std::unique_ptr<BatchSlot>> idle;  ///< slots ready for reuse (LIFO: warm memory first)
  std::uint32_t in_use = 0;                      ///< slots held by batches (or abandoned to a kernel)
  std::uint32_t limit = 0;
  std::uint32_t slots_made = 0;  ///< slots ever made: the next one's poller_index
  /// How long a returning slot waits for the persistent poller to hand its batch back before it is
  /// kept forever instead, ns (the Engine sets it; 0 without a poller).
  std::uint64_t poller_release_bound_ns = 0;

  /// Slots allocated: held by batches plus idle ones kept for reuse.
  std::size_t slots_allocated() {
    std::scoped_lock lock(mutex);
    return in_use + idle.size();
  }
};

/// Makes `count` idle slots of `pool` (Options::prepared_batches), each prepared for `requests`
/// requests (or pieces) of `window` records and `pin_capacity` L1 pins, before any kernel runs, so
/// submits up to that size allocate nothing; `own_poll_stream`: each gets its poll stream
/// (Options::poll_stream_per_batch). `owner` names the DataPath in errors. Errors:
/// BatchSlot::prepare's, naming the slot; RESOURCE_EXHAUSTED (host memory for a slot).
inline Status prepare_idle_slots(BatchPool& pool, std::uint32_t count, std::size_t requests, std::uint32_t window,
                                 std::size_t pin_capacity, bool own_poll_stream, std::string_view owner,
                                 bool persistent_poller = false) {
  for (std::uint32_t i = 0; i < count; ++i) {
    auto slot = std::unique_ptr<BatchSlot>(new (std::nothrow) BatchSlot());
    if (!slot) return error(StatusCode::RESOURCE_EXHAUSTED, "{}: no memory for prepared batch slot {}", owner, i);
    {
      std::scoped_lock lock(pool.mutex);
      slot->poller_index = pool.slots_made++;
    }
    if (Status s = slot->prepare(requests, window, pin_capacity, own_poll_stream, persistent_poller); !s.is_ok())
      return s.with_context(fmt::format("{}: prepared batch slot {} of {}", owner, i, count));
    try {
      std::scoped_lock lock(pool.mutex);
      pool.idle.push_back(std::move(slot));
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "{}: no memory for prepared batch slot {}", owner, i);
    }
  }
  return Status::success();
}

/// Returns a batch's slot to its pool when the batch is destroyed.
struct SlotReturn {
  std::shared_ptr<BatchPool> pool;
  /// Waits, at most pool->poller_release_bound_ns, for the persistent poller to hand the slot's
  /// batch back (a batch destroyed while in flight: the kernel's last pass at the latest).
  bool poller_handed_back(const BatchSlot& slot) const noexcept {
    const std::uint64_t deadline = accel::deadline_after(pool->poller_release_bound_ns);
    accel::Backoff backoff;
    while (slot.poller_owns()) {
      if (accel::timer_ns() >= deadline) return false;
      backoff.pause();
    }
    return true;
  }
  void operator()(BatchSlot* slot) const noexcept {
    if (slot == nullptr) return;
    if (slot->kernel_may_run || (slot->poller_sequence != 0 && !poller_handed_back(*slot))) {
      leak_on_purpose(slot);  // the persistent poller may still write its reports and bitmap
      return;
    }
    slot->poller_sequence = 0;
    if (slot->kernel_may_run || !slot->poll_stream.idle()) {
      // Never free or reuse memory a kernel may still write: keep it forever, counted in use. A
      // poll stream with work still queued (an error path that enqueued and then failed) counts:
      // its work is ordered with nothing a later batch of this slot would enqueue.
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

/// One submit's in-flight state (LocalNvmeDataPath::batch): a slot of the DataPath's batch pool,
/// returned to the pool when the batch is destroyed (never while a kernel may still run over it).
/// No slot: no request of the submit was accepted, progress has nothing to do. Movable, not
/// copyable.
struct Batch {
  std::unique_ptr<BatchSlot, SlotReturn> slot;
};

/// A batch holding a slot of `pool` (an idle one, or a new one below the limit). Errors:
/// RESOURCE_EXHAUSTED when `limit` batches are alive (backpressure: destroy a finished batch and
/// resubmit) or no memory for a new slot.
inline Result<Batch> acquire_batch(const std::shared_ptr<BatchPool>& pool) {
  std::scoped_lock lock(pool->mutex);
  if (pool->in_use >= pool->limit)
    return error(StatusCode::RESOURCE_EXHAUSTED,
                 "local_nvme: {} batches are alive, the limit set by Options::max_batches_in_flight = {}; destroy a "
                 "finished batch (release its IO) and resubmit",
                 pool->in_use, pool->limit);
  BatchSlot* slot = nullptr;
  if (!pool->idle.empty()) {
    slot = pool->idle.back().release();
    pool->idle.pop_back();
  } else {
    slot = new (std::nothrow) BatchSlot();
    if (slot == nullptr) return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for a batch slot");
    slot->poller_index = pool->slots_made++;
  }
  ++pool->in_use;
  Batch b;
  b.slot = std::unique_ptr<BatchSlot, SlotReturn>(slot, SlotReturn{pool});
  return Result<Batch>(std::move(b));  // explicit: nvcc's front end does not move implicitly here
}

}  // namespace tutti::local_nvme
