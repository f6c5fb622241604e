// The persistent poller (Options::persistent_poller_warps; docs/local-nvme.md, "The persistent
// poller"): the host side of PersistentPollKernel (persistent_poll_kernel.hpp, which states the
// protocol). A submit hands its batch over (post); from then on the kernel polls it, and progress
// waits for the batch's released word in mapped pinned memory instead of launching a poll kernel,
// copying the reports back and waiting for a stream: no launch, no copy and no stream wait per
// batch. The kernel ends by itself when idle for Options::persistent_poller_idle_ns or after
// Options::persistent_poller_lifetime_ns; the next post launches it again.
// CUDA profile only (validate_options refuses the setting in the host profile, whose launches run
// their threads one after another).
// Thread-safety: post, may_run and the counters may be called from any thread (one mutex); stop
// from the owner's destructor only.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/batch_pool.hpp>
#include <tutti/path/local_nvme/launch.hpp>
#include <tutti/path/local_nvme/options.hpp>
#include <tutti/path/local_nvme/persistent_poll_kernel.hpp>

namespace tutti::local_nvme {

/// What a post did with a batch.
enum class PostOutcome {
  taken,      ///< the kernel owns the batch until it stores the post's sequence into the slot's released word
  not_taken,  ///< the kernel will never see it (no room, not running, closing): the caller polls it itself
  unknown,    ///< the kernel was closing and did not leave in time: it may own the batch (abandon the slot)
};

class PersistentPoller {
 public:
  /// Posts not yet taken by the kernel at once; a post beyond them is not taken (the caller polls).
  static constexpr std::uint64_t kRingSize = 1024;

  /// Allocates the ring, the words and the table (one entry per batch slot: `table_capacity` =
  /// Options::max_batches_in_flight) and the kernel's stream; launches nothing. Errors:
  /// RESOURCE_EXHAUSTED / the allocator's (naming what), DEVICE_ERROR (no stream).
  static Result<std::unique_ptr<PersistentPoller>> create(const Options& options, const DeviceQueue* queues) {
    auto poller = std::unique_ptr<PersistentPoller>(new (std::nothrow) PersistentPoller());
    if (!poller) return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the persistent poller");
    Storage& s = *poller->storage_;
    s.capacity = options.max_batches_in_flight;
    auto host = accel::MappedHostBuffer::allocate(sizeof(PollerHostWords) + kRingSize * sizeof(PollerPost));
    if (!host) return host.status().with_context("local_nvme: the persistent poller's ring (mapped pinned memory)");
    s.host_memory = std::move(host.value());
    auto table = accel::DeviceBuffer::allocate(s.capacity * (sizeof(PollerEntry) + sizeof(std::uint64_t)) +
                                               sizeof(PollerDeviceWords));
    if (!table)
      return table.status().with_context(
          fmt::format("local_nvme: the persistent poller's table of {} entries (device memory)", s.capacity));
    s.device_memory = std::move(table.value());
    // The kernel relies on a zero table and zero device words at its first launch (it leaves them so).
    const std::vector<std::uint8_t> zeros(s.device_memory.size(), 0);
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(s.device_memory.data(), zeros.data(), zeros.size())
                              .with_context("local_nvme: zeroing the persistent poller's table"));
    *poller->words() = PollerHostWords{};
    auto stream = accel::OwnedStream::create();
    if (!stream) return stream.status().with_context("local_nvme: the persistent poller's stream");
    s.stream = std::move(stream.value());
    poller->options_ = options;
    poller->queues_ = queues;
    return Result<std::unique_ptr<PersistentPoller>>(std::move(poller));
  }

  PersistentPoller(const PersistentPoller&) = delete;
  PersistentPoller& operator=(const PersistentPoller&) = delete;
  ~PersistentPoller() {
    if (!stop().is_ok()) leak_on_purpose(storage_.release());  // the kernel may still read and write it
  }

  /// Hands the batch held by `slot` (submitted: its RequestStates in device memory, its accepted
  /// requests not all done, none needing the host) to the kernel, launching it when it is not running.
  /// The slot must have been prepared with the poller (BatchSlot::poller_released, poller_chunk_bits).
  PostOutcome post(BatchSlot& slot) {
    std::scoped_lock lock(mutex_);
    Storage& s = *storage_;
    if (broken_ || slot.poller_index >= s.capacity || slot.poller_released.empty()) return PostOutcome::not_taken;
    if (!ensure_running()) return PostOutcome::not_taken;
    PollerHostWords& w = *words();
    if (tail_ - std::atomic_ref<std::uint64_t>(w.taken).load(std::memory_order_acquire) >= kRingSize)
      return PostOutcome::not_taken;  // the kernel is behind: the caller polls this batch itself
    const std::uint64_t sequence = next_sequence_++;
    posts()[tail_ % kRingSize] = PollerPost{static_cast<RequestState*>(slot.device_requests.data()),
                                            slot.reports.data(),
                                            slot.poller_released.data(),
                                            static_cast<std::uint64_t*>(slot.poller_chunk_bits.data()),
                                            slot.size,
                                            sequence,
                                            slot.poller_index};
    const std::uint64_t index = tail_++;
    // Dekker with the kernel's close: tail, a full fence, then closing (the kernel: closing, fence, tail).
    std::atomic_ref<std::uint64_t>(w.tail).store(tail_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (std::atomic_ref<std::uint64_t>(w.closing).load(std::memory_order_seq_cst) == 0) {
      slot.poller_sequence = sequence;
      slot.poller_generation = generation_;
      posted_.fetch_add(1, std::memory_order_relaxed);
      return PostOutcome::taken;
    }
    // Closing: whether it took this post is known once it has left (exited = 1 + posts taken).
    const std::uint64_t exited = wait_exited();
    if (exited == 0) {
      broken_ = true;
      return PostOutcome::unknown;
    }
    running_.store(false);
    if (index + 1 >= exited) return PostOutcome::not_taken;
    slot.poller_sequence = sequence;  // taken, and released by the kernel's last pass
    slot.poller_generation = generation_;
    posted_.fetch_add(1, std::memory_order_relaxed);
    return PostOutcome::taken;
  }

  /// Whether the launch that took a post of generation `generation` has ended (so a batch it did
  /// not release never will be). Reads one word; thread-safe.
  /// Also true once the launch is past the latest time it can run (launch_deadline_): a kernel that
  /// faulted, or never became resident, is given up rather than waited for forever.
  bool launch_ended(std::uint64_t generation) const noexcept {
    if (generation != generation_seen_.load()) return true;
    return std::atomic_ref<std::uint64_t>(words()->exited).load(std::memory_order_acquire) != 0 ||
           accel::timer_ns() >= launch_deadline_.load();
  }

  /// Whether the kernel may be running (launched and not seen leaving): the host must not touch the
  /// queue words then (Engine::reap_zombies). Thread-safe.
  bool may_run() const noexcept {
    return running_.load() && std::atomic_ref<std::uint64_t>(words()->exited).load(std::memory_order_acquire) == 0;
  }

  /// Kernel launches and batches taken so far. Thread-safe.
  std::uint64_t launches() const noexcept { return launches_.load(std::memory_order_relaxed); }
  std::uint64_t batches_posted() const noexcept { return posted_.load(std::memory_order_relaxed); }

  /// Asks the kernel to end and waits for it (its last pass hands every batch back), at most
  /// Options::command_timeout_ns. Errors: TIMEOUT / DEVICE_ERROR (the kernel may still run: the
  /// caller must keep the queues and this poller's memory alive).
  Status stop() {
    std::scoped_lock lock(mutex_);
    if (broken_ && running_.load())
      return error(StatusCode::DEVICE_ERROR, "local_nvme: the persistent poller's kernel was given up earlier");
    if (!running_.load()) return Status::success();
    std::atomic_ref<std::uint64_t>(words()->stop).store(1, std::memory_order_seq_cst);
    if (wait_exited() == 0) {
      broken_ = true;
      return error(StatusCode::TIMEOUT, "local_nvme: the persistent poller did not stop within {} ns",
                   options_.command_timeout_ns);
    }
    running_.store(false);
    return accel::synchronize(storage_->stream.ref().native_handle(), options_.command_timeout_ns)
        .with_context("local_nvme: the persistent poller's stream");
  }

 private:
  /// What the kernel may touch: leaked on purpose when it may outlive the poller.
  struct Storage {
    accel::MappedHostBuffer host_memory;  ///< PollerHostWords, then kRingSize PollerPosts
    accel::DeviceBuffer device_memory;    ///< capacity PollerEntries, capacity states, PollerDeviceWords
    accel::OwnedStream stream;
    std::uint64_t capacity = 0;
  };

  PersistentPoller() = default;

  PollerHostWords* words() const noexcept { return static_cast<PollerHostWords*>(storage_->host_memory.data()); }
  PollerPost* posts() const noexcept { return reinterpret_cast<PollerPost*>(words() + 1); }

  /// The kernel's exited word once it is non-zero, waited for at most until the launch's latest end
  /// (launch_deadline_); 0 when it stayed zero (the kernel did not leave in time). Caller holds mutex_.
  std::uint64_t wait_exited() {
    const std::uint64_t deadline = launch_deadline_.load();
    accel::Backoff backoff(
        accel::Backoff::Settings{.spin_steps = 64, .yield_steps = 64, .first_sleep_ns = 1000, .max_sleep_ns = 100000});
    for (;;) {
      const std::uint64_t exited = std::atomic_ref<std::uint64_t>(words()->exited).load(std::memory_order_acquire);
      if (exited != 0) return exited;
      if (accel::timer_ns() >= deadline) return 0;
      backoff.pause();
    }
  }

  /// A running kernel, launching one when the last has left. False when it cannot (the caller polls
  /// the batch itself; a failed wait or launch marks the poller broken: it posts nothing more).
  /// Caller holds mutex_.
  bool ensure_running() {
    PollerHostWords& w = *words();
    if (running_.load()) {
      if (std::atomic_ref<std::uint64_t>(w.exited).load(std::memory_order_acquire) == 0) {
        if (accel::timer_ns() < launch_deadline_.load()) return true;
        broken_ = true;  // past its latest end without leaving: faulted or never resident (it may still run)
        return false;
      }
      running_.store(false);  // it ended by itself (idle or lifetime)
    }
    Storage& s = *storage_;
    void* stream = s.stream.ref().native_handle();
    // The last launch has stored exited, its last act: its stream is idle within a moment.
    if (launches_.load() != 0 && !accel::synchronize(stream, options_.command_timeout_ns).is_ok()) {
      broken_ = true;
      return false;
    }
    // No kernel reads the words now (the last one stored exited, its last act); atomic stores all the
    // same, as may_run and launch_ended read them from other threads.
    for (std::uint64_t* word : {&w.tail, &w.taken, &w.closing, &w.exited, &w.stop})
      std::atomic_ref<std::uint64_t>(*word).store(0, std::memory_order_relaxed);
    tail_ = 0;
    ++generation_;
    auto* device = static_cast<std::uint8_t*>(s.device_memory.data());
    const std::uint64_t warps = options_.persistent_poller_warps;
    const PersistentPollKernel kernel{
        .host = &w,
        .posts = posts(),
        .ring_size = kRingSize,
        .entries = reinterpret_cast<PollerEntry*>(device),
        .entry_state = reinterpret_cast<std::uint64_t*>(device + s.capacity * sizeof(PollerEntry)),
        .table_capacity = s.capacity,
        .device_words = reinterpret_cast<PollerDeviceWords*>(device + s.capacity * (sizeof(PollerEntry) + 8)),
        .queues = queues_,
        .warps = warps,
        .generation = generation_,
        .lifetime_ns = options_.persistent_poller_lifetime_ns,
        .idle_ns = options_.persistent_poller_idle_ns};
    // Exactly `warps` warps, one per block (a chunk has one owner: warp index mod warps). Its latest end:
    // the lifetime from when it starts (it may queue first: one command timeout of slack), and as long
    // again for a worker whose dispatcher was lost.
    const accel::LaunchConfig config{static_cast<std::uint32_t>(warps), accel::kDeviceWarpSize, stream};
    launch_deadline_.store(
        accel::deadline_after(2 * options_.persistent_poller_lifetime_ns + options_.command_timeout_ns));
    running_.store(true);  // before the launch: may_run keeps the host off the queue words from now on
    generation_seen_.store(generation_);
    if (!launch_grid(config, kernel).is_ok()) {
      broken_ = true;
      running_.store(false);
      return false;
    }
    launches_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  std::unique_ptr<Storage> storage_ = std::make_unique<Storage>();
  Options options_;
  const DeviceQueue* queues_ = nullptr;
  std::mutex mutex_;
  std::uint64_t tail_ = 0;           ///< posts made to the running launch
  std::uint64_t next_sequence_ = 1;  ///< unique over the poller's life
  std::uint64_t generation_ = 0;     ///< launches made (the running one's generation)
  std::atomic<std::uint64_t> generation_seen_{0};
  std::atomic<std::uint64_t> launch_deadline_{0};  ///< accel::timer_ns() past which the running launch is given up
  std::atomic<bool> running_{false};
  bool broken_ = false;  ///< a wait or launch failed: no more posts
  std::atomic<std::uint64_t> launches_{0}, posted_{0};
};

}  // namespace tutti::local_nvme
