// The local_nvme DataPath's shared state: the controller, the I/O queue pairs with their credits
// and the kernels' view of them, the bounded batch pool, the target handle cache, the zombie
// commands, the counters, and the gate that keeps the host off the queue words while a kernel
// runs. One Engine per DataPath (held by unique_ptr, so the DataPath moves cheaply); the pool
// and the cache are shared with live batches and open targets, which may outlive it.
// Lifetime: the controller must outlive the Engine; the Engine deletes its queue pairs in its
// destructor, then frees zombie mappings (or leaks them on purpose when the controller did not
// confirm the deletion).
// Thread-safety: the counters are atomics; see each member.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <vector>

#include <tutti/accel/async_copy.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/path/local_nvme/batch_pool.hpp>
#include <tutti/path/local_nvme/change_words.hpp>
#include <tutti/path/local_nvme/kernel_array.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/launch.hpp>
#include <tutti/path/local_nvme/options.hpp>
#include <tutti/path/local_nvme/persistent_poller.hpp>
#include <tutti/path/local_nvme/queues.hpp>
#include <tutti/path/local_nvme/target_cache.hpp>
#include <tutti/path/local_nvme/zombies.hpp>

namespace tutti::local_nvme {

struct Engine {
  nvme::Controller* controller = nullptr;
  Options options;
  std::uint32_t lba_size = 0;
  std::uint64_t max_command_bytes = 0;
  std::vector<std::unique_ptr<Queue>> queues;
  KernelArray<Credits> credits;          ///< one per queue pair, sized once (stable addresses)
  std::vector<DeviceQueue> queue_views;  ///< the kernels' view of `queues` (host copy)
  accel::DeviceBuffer queue_table;       ///< queue_views in device memory (upload_queue_table)
  /// The table the kernels read (device memory; not dereferenceable on the host in the CUDA profile).
  const DeviceQueue* device_queues() const noexcept { return static_cast<const DeviceQueue*>(queue_table.data()); }
  /// The source of the copy that zeroes a batch's poll stop word before each polling launch (poll
  /// kernels, and submit kernels with Options::submit_poll_budget_ns; one word, pinned).
  KernelArray<std::uint64_t> zero_word;
  /// Polling kernels (poll kernels, and submit kernels that poll) launched and not yet waited for,
  /// over all batches and streams (a wait may sit behind all of them: kernel_wait_bound_ns).
  std::atomic<std::uint64_t> poll_launches_in_flight{0};
  std::atomic<std::uint64_t> next_queue{0};
  ZombieList zombies;
  std::atomic<std::uint64_t> aborts_sent{0};
  /// Commands sent again after a retryable status (kernels.hpp, may_retry), counted when their
  /// request's completion is reported.
  std::atomic<std::uint64_t> commands_retried{0};
  std::atomic<std::uint64_t> poll_kernel_launches{0};
  std::atomic<std::uint64_t> poller_returned_unfinished{0};  ///< LocalNvmeDataPath::batches_returned_unfinished
  /// Where submit's time goes (SubmitTimeSplit): submits whose reports came back, their host
  /// staging (entry to the kernel gate) and their device part (copy, AdmitKernel, copy of the
  /// reports back and the host's wait for them), ns of accel::timer_ns on the host.
  std::atomic<std::uint64_t> timed_submits{0}, submit_staging_ns{0}, submit_device_ns{0};
  std::shared_ptr<BatchPool> pool = std::make_shared<BatchPool>();
  std::shared_ptr<TargetCache> target_cache;  ///< shared with open targets and live batches
  /// The open targets' change words (device memory in the CUDA profile), shared with them.
  std::shared_ptr<ChangeWords> change_words;
  /// Held shared by every submit and progress step from its launch to the end of its wait, taken
  /// exclusively (try only, never waiting) by the host's zombie reaping: the host touches the
  /// queue words the kernels update (CQ head, CID slots, credits) only while no kernel of any
  /// batch of this DataPath runs, because host and GPU atomics on one word are not atomic with
  /// respect to each other over PCIe on x86 (cudaDevAttrHostNativeAtomicSupported = 0).
  std::shared_mutex kernel_gate;
  /// A kernel wait failed (the kernel may run forever): the host never reaps zombies again; the
  /// queues' deletion in the destructor ends them.
  std::atomic<bool> kernel_abandoned{false};
  /// Options::persistent_poller_warps != 0: the persistent poller; the destructor stops its kernel
  /// first, while the queues it polls still exist.
  std::unique_ptr<PersistentPoller> poller;

  /// Validates `options` (validate_options), creates the target handle cache and the queue
  /// pairs. Errors: validate_options', TargetCache::create's, RESOURCE_EXHAUSTED (host memory),
  /// create_queue_pairs' (the queues already created are deleted).
  static Result<std::unique_ptr<Engine>> create(nvme::Controller& controller, const Options& options) {
    auto max_bytes = validate_options(options, controller.identity());
    if (!max_bytes) return max_bytes.status();
    if constexpr (accel::kProfile == accel::Profile::cuda) {
      // Load the kernels and grow the per-thread stack to theirs before the first submit
      // (launch.hpp: either, at a submit, may wait for every kernel running on the device, a
      // persistent one until it ends). Every DataPath over engines (local_nvme, striped_nvme) gets it.
      if (Status loaded = preload_kernels(options.command_timeout_ns); !loaded.is_ok())
        return loaded.with_context("local_nvme: create");
    }
    auto engine = std::make_unique<Engine>();
    engine->controller = &controller;
    engine->options = options;
    engine->lba_size = controller.identity().lba_size;
    engine->max_command_bytes = *max_bytes;
    engine->pool->limit = options.max_batches_in_flight;
    auto cache = TargetCache::create(TargetCacheLimits{options.device_target_cache_entries,
                                                       options.device_target_cache_entry_extents,
                                                       options.host_target_cache_bytes});
    if (!cache) return cache.status().with_context("local_nvme: device_target_cache_entries");
    engine->target_cache = std::move(cache.value());
    auto words = ChangeWords::create(options.command_timeout_ns);
    if (!words) return words.status().with_context("local_nvme: create");
    engine->change_words = std::move(words.value());
    try {
      engine->credits = kernel_array<Credits>(options.queue_pairs);
      engine->zero_word = kernel_array<std::uint64_t>(1, 0);
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the credits of {} queue pairs",
                   options.queue_pairs);
    }
    TUTTI_RETURN_IF_ERROR(create_queue_pairs(controller, options.queue_pairs, options.queue_depth,
                                             options.device_queue_state, engine->credits, engine->queues));
    try {
      for (const auto& q : engine->queues) engine->queue_views.push_back(q->device());
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the kernels' queue views");
    }
    auto table = upload_queue_table(engine->queue_views);
    if (!table) return table.status();
    engine->queue_table = std::move(table.value());
    // Admission (docs/local-nvme.md): a request takes min(its commands, request_window) credits in
    // one step and a queue pair never has more than depth - 1, so a larger window could never be
    // admitted ("resubmit later" forever). The window adapts to what the queues can ever give.
    for (const auto& q : engine->queues)
      engine->options.request_window = std::min(engine->options.request_window, q->info.depth - 1);
    if (options.persistent_poller_warps != 0) {
      auto poller = PersistentPoller::create(engine->options, engine->device_queues());
      if (!poller) return poller.status();
      engine->poller = std::move(poller.value());
      // A destroyed batch the poller still owns is handed back by the time its requests time out.
      engine->pool->poller_release_bound_ns =
          options.command_timeout_ns + options.abort_timeout_ns + options.persistent_poller_lifetime_ns;
    }
    TUTTI_RETURN_IF_ERROR(engine->prepare_batches());
    return Result<std::unique_ptr<Engine>>(std::move(engine));
  }

  /// L1 entries of the target handle cache a batch of n requests may pin (BatchSlot::prepare).
  std::size_t pin_capacity(std::size_t n) const noexcept {
    return std::min<std::size_t>(n, options.device_target_cache_entries);
  }

  /// Makes Options::prepared_batches idle slots of the pool, each sized for
  /// Options::prepared_batch_requests requests (before any kernel of this DataPath runs). Errors:
  /// BatchSlot::prepare's, naming the slot.
  Status prepare_batches() {
    const std::size_t n = options.prepared_batch_requests;
    return prepare_idle_slots(*pool, options.prepared_batches, n, options.request_window, pin_capacity(n),
                              options.poll_stream_per_batch, "local_nvme", poller != nullptr);
  }

  /// Frees zombies whose completion finally arrived (ZombieList::reap). Never waits: skipped
  /// while a kernel of any batch may run (kernel_gate), and for good once a kernel was
  /// abandoned; the next progress, zombie_commands or unregister_memory retries.
  void reap_zombies() {
    if (kernel_abandoned.load()) return;
    std::unique_lock gate(kernel_gate, std::try_to_lock);
    if (!gate.owns_lock()) return;  // a kernel's threads own the queue words now
    // Checked under the gate: the poller is launched only by a submit holding the gate shared.
    if (poller && poller->may_run()) return;  // its warps own the queue words while it runs
    zombies.reap(queues);
  }

  /// Host step between poll kernels: NVMe Abort for every command the kernel marked timed out
  /// (`records`: one request's records as copied back; the next poll kernel starts their abort
  /// timer).
  void send_aborts(std::uint32_t queue_index, const std::vector<CommandRecord>& records) {
    const Queue& q = *queues[queue_index];
    for (const CommandRecord& rec : records) {
      if (rec.phase != CommandPhase::timed_out) continue;
      // The answer (aborted or not found) does not change what follows: the command's own CQE,
      // or its absence until abort_timeout_ns, decides.
      (void)controller->abort(q.info.qid, rec.cid, options.admin_timeout_ns);
      aborts_sent.fetch_add(1);
    }
  }

  ~Engine() {
    // The poller's last pass hands every batch back. A kernel that does not stop keeps its own
    // memory (~PersistentPoller) and the queues' memory it polls (leaked below, after the deletion).
    const bool poller_stopped = !poller || poller->stop().is_ok();
    poller.reset();
    bool all_deleted = true;
    for (auto& q : queues)
      if (q && !controller->delete_io_queue_pair(q->info.qid).is_ok()) all_deleted = false;  // ends its commands
    if (!poller_stopped) {
      // Everything the kernel may still read or write: the queues, their table, the credits, the zero
      // word and the change words.
      for (auto& q : queues) leak_on_purpose(q.release());
      leak_on_purpose(new std::shared_ptr<ChangeWords>(change_words));
      leak_on_purpose(new accel::DeviceBuffer(std::move(queue_table)));
      leak_on_purpose(new KernelArray<Credits>(std::move(credits)));
      leak_on_purpose(new KernelArray<std::uint64_t>(std::move(zero_word)));
    }
    zombies.release(all_deleted);
  }
};

/// One poll step over a batch slot, the step LocalNvmeDataPath::progress and
/// StripedNvmeDataPath::progress both repeat: zeroes the slot's stop word when the kernel may poll
/// (budget_ns != 0), makes ONE PollKernel launch over the slot's `slot.size` requests against
/// `queues` (the kernels' device queue table), ONE copy of their reports back into slot.reports,
/// and ONE wait bounded by kernel_wait_bound_ns, all on the slot's poll stream when it has one
/// (Options::poll_stream_per_batch), else on Options::stream. `launches` counts launches;
/// `in_flight` counts the DataPath's polling kernels in flight (this one is taken off again when
/// the step returns). The caller holds its kernel gate(s) across the call. Units: ns.
/// Errors: a failed zeroing or launch returns its status and leaves nothing running over the slot;
/// a failed copy or wait returns its status with `*kernel_may_run` set: the kernel may still run
/// over the slot, which the caller must then abandon (never reuse or free).
inline Status poll_step(const Options& options, BatchSlot& slot, const DeviceQueue* queues, const void* zero_word,
                        std::atomic<std::uint64_t>& launches, std::atomic<std::uint64_t>& in_flight,
                        std::uint64_t budget_ns, bool stop_at_first_done, bool* kernel_may_run) {
  *kernel_may_run = false;
  // The batch's own stream: its submit returned after waiting for its submit kernel, so this
  // launch is ordered after it without an event, and no other batch's work queues behind it.
  void* stream = slot.polling_stream(options.stream);
  const std::size_t n = slot.size;
  auto* device_reports = static_cast<RequestReport*>(slot.device_reports.data());
  auto* stop_word = static_cast<std::uint64_t*>(slot.device_poll_stop.data());
  if (budget_ns != 0)
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device_async(stop_word, zero_word, sizeof(std::uint64_t), stream)
                              .with_context("zeroing the poll kernel's stop word"));
  TUTTI_RETURN_IF_ERROR(launch_over(options, stream, n,
                                    PollKernel{static_cast<RequestState*>(slot.device_requests.data()), queues, n,
                                               device_reports, stop_word, budget_ns, stop_at_first_done}));
  launches.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t queued = in_flight.fetch_add(1) + 1;  // this one and those ahead of it on the stream
  const PollLaunchCount counted{in_flight};
  const Status copied =
      accel::copy_from_device_async(slot.reports.data(), device_reports, n * sizeof(RequestReport), stream);
  const Status waited = accel::synchronize(stream, kernel_wait_bound_ns(options, queued));
  if (copied.is_ok() && waited.is_ok()) return Status::success();
  *kernel_may_run = true;
  return copied.is_ok() ? waited : copied;
}

}  // namespace tutti::local_nvme
