// The local_nvme DataPath class: LocalNvmeDataPath, the tutti::DataPath over one nvme::Controller.
// What it does, step by step, is in path/local_nvme.hpp (the front header) and
// docs/local-nvme.md; this file wires the pieces of path/local_nvme/ together: open and close
// (targets.hpp), register and unregister (registration.hpp), submit (batch_pool.hpp,
// staging.hpp, launch.hpp) and progress (launch.hpp, staging.hpp, zombies.hpp) over the Engine
// (engine.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <tutti/accel/async_copy.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/path/local_nvme/batch_pool.hpp>
#include <tutti/path/local_nvme/engine.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/launch.hpp>
#include <tutti/path/local_nvme/options.hpp>
#include <tutti/path/local_nvme/registration.hpp>
#include <tutti/path/local_nvme/staging.hpp>
#include <tutti/path/local_nvme/target_cache.hpp>
#include <tutti/path/local_nvme/targets.hpp>

namespace tutti::local_nvme {

class LocalNvmeDataPath {
 public:
  using Options = local_nvme::Options;
  using target_type = local_file::Target;
  using open_target = OpenTarget;
  using registered_memory = RegisteredMemory;
  using batch = Batch;

  static constexpr std::string_view name = "local_nvme";
  static constexpr Capabilities capabilities{
      .offset_alignment = 4096,
      .memory_alignment = 4,
      .max_request_bytes = std::uint64_t{1} << 30,
      .max_batch_requests = Options::kMaxBatchRequests,
      .memory_kinds = accel::kProfile == accel::Profile::cuda
                          ? MemoryKindSet{MemoryKind::HOST, MemoryKind::PINNED_HOST, MemoryKind::DEVICE}
                          : MemoryKindSet{MemoryKind::HOST, MemoryKind::PINNED_HOST},
      .unaligned_tail_at_end_of_target = true,
  };

  /// Creates the queue pairs on a brought-up controller. Errors: INVALID_ARGUMENT (options out of
  /// range, controller not brought up, LBA size not 512/4096, memory page size not 4096..65536),
  /// and the controller's create_io_queue_pair errors (queues already created are deleted); the
  /// prepared batch slots' errors ("local_nvme: prepared batch slot i of N": RESOURCE_EXHAUSTED or
  /// the allocator's); cuda profile: DEVICE_ERROR when CUDA cannot load or launch the kernels,
  /// TIMEOUT when their first launch (no request; it grows CUDA's per-thread stack) did not finish
  /// within command_timeout_ns because a kernel running on the device holds it (preload_kernels,
  /// launch.hpp: create the DataPath before starting persistent kernels). All of these come from
  /// Engine::create.
  static Result<LocalNvmeDataPath> create(nvme::Controller& controller) { return create(controller, Options()); }
  static Result<LocalNvmeDataPath> create(nvme::Controller& controller, Options options) {
    auto engine = Engine::create(controller, options);
    if (!engine) return engine.status();
    return LocalNvmeDataPath(std::move(engine.value()));
  }

  LocalNvmeDataPath(LocalNvmeDataPath&&) noexcept = default;
  LocalNvmeDataPath& operator=(LocalNvmeDataPath&&) noexcept = default;

  /// The settings in force and the LBA size / command size limit derived from the controller.
  const Options& options() const noexcept { return engine_->options; }
  std::uint32_t lba_size() const noexcept { return engine_->lba_size; }
  std::uint64_t max_command_bytes() const noexcept { return engine_->max_command_bytes; }
  /// NVMe Abort commands sent so far.
  std::uint64_t aborts_sent() const noexcept { return engine_->aborts_sent.load(); }
  /// Commands sent again after a retryable NVMe status (nvme::classify: retry, DNR clear; at most
  /// kMaxCommandAttempts attempts per command, never past its deadline), over every completed
  /// request so far; each request's share is RequestCompletion::retries. Thread-safe (an atomic).
  std::uint64_t commands_retried() const noexcept { return engine_->commands_retried.load(); }
  /// Progress kernels launched so far by progress() over all batches (one per step; see
  /// Options::poll_kernel_budget_ns). Thread-safe (an atomic counter).
  std::uint64_t poll_kernel_launches() const noexcept { return engine_->poll_kernel_launches.load(); }
  /// The persistent poller's kernel launches and the batches submit handed to it so far (both 0
  /// without Options::persistent_poller_warps). Thread-safe.
  std::uint64_t persistent_poller_launches() const noexcept {
    return engine_->poller ? engine_->poller->launches() : 0;
  }
  std::uint64_t batches_posted_to_poller() const noexcept {
    return engine_->poller ? engine_->poller->batches_posted() : 0;
  }
  /// Batches the persistent poller handed back with requests still in flight (its kernel was
  /// stopping, or a request needed the host's Abort), which progress then polled with poll kernels.
  std::uint64_t batches_returned_unfinished() const noexcept { return engine_->poller_returned_unfinished.load(); }
  /// Where submit's time went, summed over every submit whose reports came back: `staging_ns` on
  /// the host (the batch slot, the RequestStates and their memory mappings, the target cache),
  /// `device_ns` from the kernel gate to the end of the wait for the AdmitKernel and its reports
  /// (copy, launch, kernel, copy back: one host round trip). Units: ns of the host's
  /// monotonic clock. Thread-safe (atomic counters; a snapshot may mix two submits' updates).
  struct SubmitTimeSplit {
    std::uint64_t submits = 0, staging_ns = 0, device_ns = 0;
  };
  SubmitTimeSplit submit_time_split() const noexcept {
    return {engine_->timed_submits.load(), engine_->submit_staging_ns.load(), engine_->submit_device_ns.load()};
  }
  /// Commands that timed out and were never answered, still holding their memory mapping.
  std::size_t zombie_commands() {
    engine_->reap_zombies();
    return engine_->zombies.size();
  }
  /// Batch slots held by live batches (at most Options::max_batches_in_flight), and slots allocated
  /// (held plus idle ones kept for reuse).
  std::uint32_t batches_in_flight() const {
    std::scoped_lock lock(engine_->pool->mutex);
    return engine_->pool->in_use;
  }
  std::size_t batch_slots_allocated() const { return engine_->pool->slots_allocated(); }
  /// The target handle cache's counters (hits, misses, evictions, fallbacks: one lookup per
  /// distinct target per submit; FLUSH requests read no extents and do no lookup) and occupancy.
  /// Thread-safe.
  TargetCacheStatistics target_cache_statistics() const { return engine_->target_cache->statistics(); }
  /// Shared statistics of queue pair `i` (doorbell writes, completions reaped, stale CQEs). For a
  /// pair whose state is in device memory, a synchronous copy from the device (all zero when it fails).
  nvme::QueuePairState queue_statistics(std::size_t i) const { return engine_->queues.at(i)->storage->statistics(); }
  /// Whether queue pair `i`'s state and credits live in device memory (Options::device_queue_state and
  /// QueuePairInfo::host_accessible false; queues.hpp, place_queue_state). std::out_of_range past the pairs.
  bool queue_state_in_device_memory(std::size_t i) const { return engine_->queues.at(i)->storage->in_device_memory(); }

  /// Builds the device-resident handle (targets.hpp, make_open_target): the L2 copy of the extents
  /// (resolved once, by the caller's FIEMAP, never again) that submits copy into L1 and the
  /// submitting threads binary-search. Errors: INVALID_ARGUMENT when the payload's LBA size is
  /// not the controller's, or its invariants (Target::validate) do not hold; RESOURCE_EXHAUSTED
  /// when the open targets' extents would exceed Options::host_target_cache_bytes, or the copy
  /// cannot be allocated.
  Result<open_target> open(local_file::Target&& target, const OpenOptions& options) {
    return make_open_target(std::move(target), options, engine_->lba_size, engine_->target_cache,
                            engine_->change_words);
  }
  /// The file size in bytes.
  std::uint64_t size_bytes(const open_target& t) const noexcept { return t.payload->file_size; }
  /// Ends the lease (closes the fd). Only called with no IO in flight on the target. When the
  /// target was opened with flush_on_close, first issues one NVMe Flush of its namespace and waits
  /// for it (at most command_timeout_ns + abort_timeout_ns); its failure is returned (the lease is
  /// released either way): RESOURCE_EXHAUSTED (queue full), DEVICE_ERROR, TIMEOUT, DATA_LOSS
  /// (the file changed under local_nvme: the Flush is refused). Releases the payload's change
  /// guard: the last guard of the file in the process clears the FS_IMMUTABLE_FL it set, and
  /// DEVICE_ERROR (naming `chattr -i`) is returned if it cannot.
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
        const Options& o = engine_->options;
        Status s = progress(b, std::span<RequestCompletion>(&completion, 1),
                            o.command_timeout_ns + o.abort_timeout_ns + o.admin_timeout_ns);
        if (!s.is_ok()) {
          // Still in flight: keep the batch (and what it references) alive rather than free it.
          leak_on_purpose(new batch(std::move(b)));
          detail::assign(flushed,
                         error(StatusCode::TIMEOUT, "flush on close: the NVMe Flush did not complete in time"));
        } else {
          detail::assign(flushed, completion.status.with_context("flush on close"));
        }
      }
    }
    if (t.payload) {
      // The last guard of the file in this process removes its watch and clears FS_IMMUTABLE_FL.
      const Status released = t.payload->guard.release();
      if (flushed.is_ok() && !released.is_ok()) detail::assign(flushed, released.with_context("close"));
    }
    t.payload.reset();
    t.cache_lease.reset();  // L2 room returns; the L1 entry goes now or with the last batch pinning it
    return flushed;
  }

  /// DMA-maps the pages that hold the region and prebuilds its PRP lists (two variants, see
  /// prp_table.hpp) at registration, so no submit builds a list (registration.hpp,
  /// register_region, has the memory it takes). Errors: register_region's; nothing stays
  /// mapped on error. Thread-safety: safe concurrently with other calls on the DataPath.
  Result<registered_memory> register_memory(const MemoryView& view) {
    return register_region(*engine_->controller, view);
  }

  /// Unmaps the region. BUSY (and the mapping is kept alive until the controller is done) while a
  /// timed-out command that the controller never answered may still transfer into it.
  Status unregister_memory(registered_memory& memory) {
    if (!memory.mapping) return Status::success();
    engine_->reap_zombies();
    if (const auto z = memory.mapping->zombies.load(); z > 0)
      return error(StatusCode::BUSY,
                   "local_nvme: {} timed-out command(s) on this region were never answered by the controller; the "
                   "mapping stays until they complete or the queues are deleted",
                   z);
    memory.mapping.reset();
    return Status::success();
  }

  /// One launch over the batch (see path/local_nvme.hpp). Never blocks beyond the launch (CUDA:
  /// the wait for the submit kernel, bounded by command_timeout_ns). The batch's state comes from
  /// the DataPath's bounded pool (Options::max_batches_in_flight; no allocation once the pool's
  /// slots have grown to the batch sizes in use). States: OK (accepted), the rejections of
  /// staging.hpp's `rejection`, RESOURCE_EXHAUSTED when max_batches_in_flight batches are alive
  /// (backpressure: every request of the submit is rejected, nothing runs) or a slot cannot grow
  /// to n requests, the launch's error (DEVICE_ERROR when CUDA refuses it), or the wait's error (TIMEOUT /
  /// DEVICE_ERROR: the slot is then abandoned to the kernel, never reused or freed, and stays counted in
  /// max_batches_in_flight).
  batch submit(std::span<const PathRequest<LocalNvmeDataPath>> requests, std::span<Status> states) {
    const std::size_t n = requests.size();
    if (n == 0) return batch{};
    const std::uint64_t entered = accel::timer_ns();
    Engine& e = *engine_;
    const std::uint32_t window = e.options.request_window;
    const auto reject_all = [&](const Status& why) {
      for (std::size_t i = 0; i < n; ++i) detail::assign(states[i], why);
    };
    auto acquired = acquire_batch(e.pool);
    if (!acquired) {
      reject_all(acquired.status());
      return batch{};
    }
    batch b = std::move(acquired.value());
    local_file::poll_changes();  // a target whose file changed is refused below, by its kernel thread
    BatchSlot& slot = *b.slot;
    if (Status prepared =
            slot.prepare(n, window, e.pin_capacity(n), e.options.poll_stream_per_batch, e.poller != nullptr);
        !prepared.is_ok()) {
      reject_all(prepared);
      b.slot.reset();  // nothing ran over it: back to the pool
      return b;
    }
    auto* device_requests = static_cast<RequestState*>(slot.device_requests.data());
    auto* device_records = static_cast<CommandRecord*>(slot.device_records.data());
    auto* device_reports = static_cast<RequestReport*>(slot.device_reports.data());
    // One queue pair per warp of requests (round robin over warps; host profile: per request), so
    // a warp's commands share one SQ reservation and one doorbell write.
    const std::uint64_t lanes = accel::kKernelWarpLanes;
    const std::uint64_t base = e.next_queue.fetch_add((n + lanes - 1) / lanes, std::memory_order_relaxed);
    void* stream = e.options.stream.native_handle();
    slot.cache = e.target_cache;  // the slot keeps L1 alive while it pins entries
    bool cache_copied = false;    // a miss enqueued a copy into L1 on the stream
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = requests[i];
      const DeviceTarget target = p.direction == Direction::FLUSH
                                      ? p.target->device_target  // reads no extents
                                      : target_handle(slot, *p.target, stream, cache_copied);
      stage_request(slot.staged[i], p, e, static_cast<std::uint32_t>((base + i / lanes) % e.queues.size()), target,
                    device_records + i * window, slot.mappings[i]);
      slot.signals[i] = p.target->signal.get();
      slot.signals[i]->stage(slot.staged[i].target);
    }
    const std::uint64_t staged = accel::timer_ns();
    std::shared_lock gate(e.kernel_gate);  // no zombie reaping while this batch's kernel may run
    // ONE copy of the staged batch, ONE launch, ONE copy of the reports back, all on the stream,
    // then ONE bounded wait. With Options::submit_poll_budget_ns the kernel also polls (its stop
    // word zeroed first), and counts as a polling kernel in every wait bound meanwhile.
    const std::uint64_t poll_budget = e.options.submit_poll_budget_ns;
    auto* stop_word = static_cast<std::uint64_t*>(slot.device_poll_stop.data());
    Status launched =
        accel::copy_to_device_async(device_requests, slot.staged.data(), n * sizeof(RequestState), stream);
    const bool copy_enqueued = launched.is_ok();  // waited for below, whatever fails after it
    if (launched.is_ok() && poll_budget != 0)
      detail::assign(launched,
                     accel::copy_to_device_async(stop_word, e.zero_word.data(), sizeof(std::uint64_t), stream));
    if (launched.is_ok())
      detail::assign(launched, launch_over(e.options, stream, n,
                                           AdmitKernel{device_requests, e.device_queues(), n, device_reports, stop_word,
                                                       poll_budget}));
    const bool kernel_enqueued = launched.is_ok();
    const std::uint64_t polling_ahead = poll_budget != 0 && kernel_enqueued ? e.poll_launches_in_flight.fetch_add(1) + 1
                                                                            : e.poll_launches_in_flight.load();
    const PollLaunchCount counted{e.poll_launches_in_flight, poll_budget != 0 && kernel_enqueued};
    if (launched.is_ok())
      detail::assign(launched, accel::copy_from_device_async(slot.reports.data(), device_reports,
                                                             n * sizeof(RequestReport), stream));
    if (copy_enqueued || cache_copied) {
      const Status waited = accel::synchronize(stream, kernel_wait_bound_ns(e.options, polling_ahead));
      if (!waited.is_ok()) {
        // The stream may still run the copy or the kernel, which may have commands in flight:
        // abandon the slot to it (never reused or freed; the mappings stay referenced).
        reject_all(waited.with_context("local_nvme: submit kernel"));
        slot.kernel_may_run = true;
        e.kernel_abandoned.store(true);
        b.slot.reset();
        return b;
      }
      e.target_cache->mark_ready(slot.pins);  // the L1 copies have landed
    }
    if (!launched.is_ok()) {
      // A kernel that ran but whose reports cannot come back: its accepted requests are in flight
      // with no way to follow them, so the slot is abandoned (never reused) and all report the error.
      reject_all(launched.with_context("local_nvme: submit"));
      if (kernel_enqueued) {
        slot.kernel_may_run = true;
        e.kernel_abandoned.store(true);
      }
      b.slot.reset();
      return b;
    }
    const std::uint64_t reported = accel::timer_ns();
    bool any_accepted = false;
    for (std::size_t i = 0; i < n; ++i) {
      const RequestReport& report = slot.reports[i];
      detail::assign(states[i], report.accepted ? Status::success()
                                                : rejection(e, slot.staged[i], report, requests[i], *slot.signals[i]));
      if (!report.accepted) slot.reported[i] = 1;
      any_accepted = any_accepted || report.accepted;
    }
    // After the reports are read (the poller rewrites them), and still under the gate: the poller's
    // launch (in post) must not overlap a zombie reaping (reap_zombies).
    if (e.poller && any_accepted && !slot.reports_settled() && !needs_host(slot) &&
        e.poller->post(slot) == PostOutcome::unknown) {
      // The poller was closing and did not leave in time: it may own the batch, so the slot is
      // abandoned to it (progress returns DEVICE_ERROR; never reused or freed).
      slot.kernel_may_run = true;
      e.kernel_abandoned.store(true);
    }
    gate.unlock();
    e.timed_submits.fetch_add(1, std::memory_order_relaxed);
    e.submit_staging_ns.fetch_add(staged - entered, std::memory_order_relaxed);
    e.submit_device_ns.fetch_add(reported - staged, std::memory_order_relaxed);
    if (!any_accepted) b.slot.reset();  // nothing in flight (nothing was posted either): back at once
    return b;
  }

  /// Polls the batch for up to timeout_ns (see the concept): launches poll kernels (each polling on
  /// the accelerator for up to min(Options::poll_kernel_budget_ns, what is left of timeout_ns)),
  /// sends Aborts and hands off zombies between them. OK when every accepted request has
  /// completed, NOT_READY when the budget ran out first; a failed kernel wait or copy (TIMEOUT /
  /// DEVICE_ERROR) abandons the batch to its kernel, and every later progress on it returns
  /// DEVICE_ERROR without launching. Each wait is bounded by command_timeout_ns plus the budget of
  /// this DataPath's polling kernels in flight (kernel_wait_bound_ns). until = ProgressUntil::SOME:
  /// returns after the first step that completed a request (NOT_READY unless it was the last), and
  /// each poll kernel stops polling as soon as one of its requests completes (PollKernel::
  /// stop_at_first_done) instead of polling on for its whole budget; a request that completed at
  /// submit and is not reported yet makes the first launch a one-pass kernel. A batch whose every
  /// accepted request the submit kernel polled to the end (Options::submit_poll_budget_ns) is
  /// taken from submit's reports with no launch at all.
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL) {
    if (!b.slot) return Status::success();  // nothing was accepted
    if (b.slot->kernel_may_run)
      // A wait failed earlier: a kernel may still run over this batch's state; launching another
      // over it (or zeroing its stop word) would race with it. The batch stays abandoned.
      return error(StatusCode::DEVICE_ERROR,
                   "local_nvme: this batch was abandoned after a failed kernel wait; its requests' outcome is unknown");
    Engine& e = *engine_;
    const std::uint64_t deadline = accel::deadline_after(timeout_ns);
    BatchSlot& slot = *b.slot;
    const std::size_t n = slot.size;
    accel::Backoff backoff;
    raise_changed_targets(slot);  // changed files first: their kernel threads issue nothing more
    // Posted to the persistent poller: it owns the batch until it hands it back whole.
    if (slot.poller_sequence != 0) {
      TUTTI_RETURN_IF_ERROR(wait_for_poller(slot, deadline));
      if (!slot.reports_settled())  // handed back by a stopping kernel, or for an Abort: poll kernels go on
        e.poller_returned_unfinished.fetch_add(1, std::memory_order_relaxed);
    }
    const bool some = until == ProgressUntil::SOME;
    bool report_waiting = some && slot.has_unreported_done();
    // A batch its submit kernel polled to the end needs no launch: its reports are final. A request
    // needing the host (its Abort, a zombie to take over) is handled before any kernel runs again.
    bool launch = !slot.reports_settled() && !needs_host(slot);
    for (;;) {
      // ONE launch (polling on the accelerator for up to its budget) and ONE copy of the reports
      // back per step, then ONE bounded wait (poll_step).
      const std::uint64_t now = accel::timer_ns();
      const std::uint64_t budget =
          report_waiting ? 0 : std::min(e.options.poll_kernel_budget_ns, deadline > now ? deadline - now : 0);
      report_waiting = false;
      if (launch) {
        std::shared_lock gate(e.kernel_gate);  // no zombie reaping while this kernel may run
        bool kernel_may_run = false;
        const Status stepped = poll_step(e.options, slot, e.device_queues(), e.zero_word.data(), e.poll_kernel_launches,
                                         e.poll_launches_in_flight, budget, some, &kernel_may_run);
        if (kernel_may_run) {
          // The kernel may still run (or its reports never came back): the slot is abandoned to it
          // (never reused or freed, even after the caller destroys the batch).
          slot.kernel_may_run = true;
          e.kernel_abandoned.store(true);
        }
        TUTTI_RETURN_IF_ERROR(stepped.with_context("local_nvme: poll kernel"));
      }
      bool all_done = true;
      bool any_new = false;
      // A change seen now fails what completed in this step (completion_of), and stops the next
      // launch from issuing commands of its target.
      raise_changed_targets(slot);
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
          e.send_aborts(queue_index, slot.records_copy);
          e.zombies.hand_off(queue_index, slot.records_copy, slot.mappings[i]);
        }
        if (!report.done) {
          all_done = false;
          continue;
        }
        completions[i] = completion_of(e, slot.staged[i], report, i, *slot.signals[i]);
        e.commands_retried.fetch_add(report.retries, std::memory_order_relaxed);
        slot.reported[i] = 1;
        any_new = true;
      }
      e.reap_zombies();
      if (all_done) return Status::success();
      launch = true;
      if ((some && any_new) || accel::timer_ns() >= deadline)
        return Status(StatusCode::NOT_READY, "local_nvme: batch still in flight");
      if (any_new || budget != 0) {
        backoff.reset();  // the kernel itself polled (or something completed): relaunch at once
      } else {
        backoff.pause();
      }
    }
  }

 private:
  explicit LocalNvmeDataPath(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}

  /// Whether a request of the batch needs the host (its Abort) according to the last reports.
  static bool needs_host(const BatchSlot& slot) noexcept {
    for (std::size_t i = 0; i < slot.size; ++i)
      if (slot.reports[i].accepted && !slot.reported[i] && slot.reports[i].needs_host != 0) return true;
    return false;
  }

  /// Waits until the persistent poller hands the batch back (its reports are then final in
  /// slot.reports), reading the slot's released word with a host backoff, raising changed targets
  /// meanwhile. NOT_READY at `deadline`; DEVICE_ERROR when the poller's launch ended without handing
  /// it back (the slot is then abandoned).
  Status wait_for_poller(BatchSlot& slot, std::uint64_t deadline) {
    Engine& e = *engine_;
    // Yields before any sleep: a sleep of the host lasts at least the thread's timer slack (50 us by
    // default on Linux), as long as a 4 KiB read takes; 512 yields cover about half a millisecond.
    accel::Backoff backoff(
        accel::Backoff::Settings{.spin_steps = 64, .yield_steps = 512, .first_sleep_ns = 2000, .max_sleep_ns = 20000});
    for (std::uint32_t step = 1; slot.poller_owns(); ++step) {
      if (e.poller->launch_ended(slot.poller_generation) && slot.poller_owns()) {
        slot.kernel_may_run = true;
        e.kernel_abandoned.store(true);
        return error(StatusCode::DEVICE_ERROR,
                     "local_nvme: the persistent poller ended without handing the batch back; its requests' outcome "
                     "is unknown");
      }
      if (accel::timer_ns() >= deadline)
        return Status(StatusCode::NOT_READY, "local_nvme: batch still in flight (persistent poller)");
      if (step % 256 == 0) raise_changed_targets(slot);
      backoff.pause();
    }
    slot.poller_sequence = 0;
    return Status::success();
  }

  /// Reads the change events (local_file::poll_changes) and raises the signal of every target of
  /// the batch whose file changed, for the requests still in flight.
  static void raise_changed_targets(BatchSlot& slot) {
    local_file::poll_changes();
    for (std::size_t i = 0; i < slot.size; ++i)
      if (slot.reported[i] == 0 && slot.signals[i] != nullptr) (void)slot.signals[i]->raise_if_changed();
  }

  /// The handle the kernels of the batch in `slot` use for `t`: its L1 entry (pinned by the batch)
  /// or its L2 copy (TargetCache::acquire), looked up once per distinct target per submit.
  DeviceTarget target_handle(BatchSlot& slot, const open_target& t, void* stream, bool& copied) {
    if (!t.cache_lease) return t.device_target;
    const std::uint64_t id = t.cache_lease->id;
    if (const auto found = slot.resolved.find(id); found != slot.resolved.end()) return found->second;
    const DeviceTarget handle = engine_->target_cache->acquire(id, t.device_target, stream, slot.pins, copied);
    try {
      slot.resolved.emplace(id, handle);
    } catch (const std::bad_alloc&) {
      // Not remembered: a later request of this target looks it up again (pins it once more).
    }
    return handle;
  }

  /// Request i's records copied back into slot.records_copy (one copy on the slot's polling stream
  /// and a bounded wait; no kernel of the batch runs then).
  Status copy_records_back(BatchSlot& slot, std::size_t i) {
    Engine& e = *engine_;
    const std::uint32_t window = e.options.request_window;
    const auto* device_records = static_cast<const CommandRecord*>(slot.device_records.data());
    void* stream = slot.polling_stream(e.options.stream);
    TUTTI_RETURN_IF_ERROR(accel::copy_from_device_async(slot.records_copy.data(), device_records + i * window,
                                                        window * sizeof(CommandRecord), stream)
                              .with_context("local_nvme: command records"));
    return accel::synchronize(stream, kernel_wait_bound_ns(e.options, e.poll_launches_in_flight.load()))
        .with_context("local_nvme: command records");
  }

  std::unique_ptr<Engine> engine_;
};

static_assert(tutti::DataPath<LocalNvmeDataPath>);

}  // namespace tutti::local_nvme
