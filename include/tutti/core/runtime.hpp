// StorageRuntime<Backends...>: the one public surface applications use.
//
//   using Runtime = tutti::StorageRuntime<tutti::Backend<LocalFile, Uring>>;
//   Runtime rt;
//   auto target = rt.open("file:///mnt/nvme0/kv/layer17", {.writable = true});
//   auto memory = rt.register_memory({buffer, bytes, tutti::MemoryKind::HOST});
//   auto outcome = rt.submit(requests);          // per-request initial state (partial commit)
//   auto result = rt.wait(outcome.io, 1'000'000'000);  // bounded by nanoseconds
//   rt.release(outcome.io);
//
// Composition is static: each Backend<Resolver, DataPath> is a template argument, a runtime with one
// backend has no dispatch at all, and with several the target handle's entry carries the backend
// index and submit() buckets requests per backend under one IO handle.
//
// Semantics (each has a test in tests/core/):
//  - Partial commit: submit() returns one initial state per request; requests rejected by validation
//    or backpressure (RESOURCE_EXHAUSTED) never ran and are not covered by the IO handle.
//  - Backpressure never blocks.
//  - close() and unregister_memory() return BUSY while IO that uses the object is in flight.
//  - shutdown(drain) never frees what a device may still write: when IO does not drain in time it
//    returns TIMEOUT and the runtime keeps every registration and DataPath alive, also past its
//    destructor (they are leaked on purpose rather than freed under DMA).
//  - Thread-safety: every member function may be called from any thread. One mutex guards the handle
//    tables for a few lookups; it is never held across a DataPath's open, submit or progress.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/handles.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>

namespace tutti {

/// Settings of a StorageRuntime. Defaults are the constants below; docs/api.md lists them.
struct RuntimeOptions {
  static constexpr std::uint32_t kDefaultOpenBatchThreads = 8;
  static constexpr std::uint64_t kDefaultDrainTimeoutNs = 5'000'000'000;  // 5 s

  /// Threads that resolve URIs in parallel in open_batch (>= 1).
  std::uint32_t open_batch_threads = kDefaultOpenBatchThreads;
  /// Drain budget the destructor gives in-flight IO when shutdown() was not called, in ns.
  std::uint64_t destructor_drain_timeout_ns = kDefaultDrainTimeoutNs;
};

namespace detail {

/// Calls f(std::integral_constant<std::size_t, I>{}) for I in [0, N).
template <std::size_t N, class F>
constexpr void for_each_index(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::integral_constant<std::size_t, I>{}), ...); }
  (std::make_index_sequence<N>{});
}

/// Something IO pins: close/unregister are refused while in_flight > 0.
struct Pinnable {
  std::atomic<std::uint64_t> in_flight{0};
};

/// A request field named in a message, "requests[3].target": formatted only when a message is built,
/// so submit formats nothing for a request that passes validation.
struct RequestField {
  std::size_t index;
  std::string_view member;
};

}  // namespace detail
}  // namespace tutti

template <>
struct fmt::formatter<tutti::detail::RequestField> {
  constexpr auto parse(fmt::format_parse_context& context) { return context.begin(); }
  template <class Context>
  auto format(const tutti::detail::RequestField& field, Context& context) const {
    return fmt::format_to(context.out(), "requests[{}].{}", field.index, field.member);
  }
};

namespace tutti {

template <class... Backends>
class StorageRuntime {
  static_assert(sizeof...(Backends) >= 1, "tutti::StorageRuntime needs at least one Backend<Resolver, DataPath>");

  static constexpr std::size_t kBackends = sizeof...(Backends);
  /// wait() and wait_some() on an IO with several unfinished backends wait on each in turn (advance):
  /// the first turn, and the longest a turn grows to while nothing arrives, in ns. An IO on one
  /// backend never takes turns: its DataPath's progress waits for the whole budget.
  static constexpr std::uint64_t kFirstTurnNs = 50'000;
  static constexpr std::uint64_t kLongestTurnNs = 1'000'000;
  template <std::size_t I>
  using backend_at = std::tuple_element_t<I, std::tuple<Backends...>>;
  template <std::size_t I>
  using datapath_at = typename backend_at<I>::datapath_type;

 public:
  /// Builds a runtime from its backends (moved in). Never fails; backends validate their own
  /// configuration in their constructors.
  explicit StorageRuntime(Backends&&... backends, RuntimeOptions options = {})
      : state_(std::make_unique<State>(options, std::move(backends)...)) {}

  /// Default-constructs every backend (when they allow it).
  StorageRuntime() requires(std::default_initializable<Backends>&&...)
      : state_(std::make_unique<State>(RuntimeOptions{}, Backends{}...)) {}

  StorageRuntime(const StorageRuntime&) = delete;
  StorageRuntime& operator=(const StorageRuntime&) = delete;
  /// Moves the whole state (handles stay valid: they name the state, which does not move). The
  /// moved-from runtime may only be destroyed. Not thread-safe against calls on `other`.
  StorageRuntime(StorageRuntime&& other) noexcept = default;
  StorageRuntime& operator=(StorageRuntime&&) = delete;  // would have to shut the old state down

  /// Calls shutdown(options.destructor_drain_timeout_ns) unless shutdown succeeded before. When IO
  /// is still in flight after that, every DataPath, registration and open target is leaked on
  /// purpose: freeing them could free memory a device still writes.
  ~StorageRuntime() {
    if (!state_) return;
    if (!state_->shut_down) (void)shutdown(state_->options.destructor_drain_timeout_ns);
    if (!state_->shut_down) leak_on_purpose(state_.release());
  }

  // ---------------------------------------------------------------------------------------------
  // Targets

  /// Resolves `uri` with the first backend whose resolver serves its scheme and opens it.
  /// Errors: INVALID_ARGUMENT (malformed URI, unknown scheme, options a backend refuses), whatever
  /// the resolver or DataPath returns (NOT_FOUND, UNSUPPORTED, DATA_LOSS ...), BUSY after shutdown.
  Result<TargetHandle> open(std::string_view uri, const OpenOptions& options = {}) {
    auto backend = backend_for(uri);
    if (!backend) return backend.status();
    Result<TargetHandle> out = error(StatusCode::INTERNAL, "no backend ran");
    detail::for_each_index<kBackends>([&](auto I) {
      if (I != *backend) return;
      auto payload = std::get<I>(state_->backends)->resolver.resolve(uri, options);
      out = payload ? open_resolved<I>(uri, std::move(payload.value()), options)
                    : Result<TargetHandle>(payload.status().with_context(fmt::format("open '{}'", uri)));
    });
    return out;
  }

  /// Resolves many URIs in parallel (options.open_batch_threads resolver threads), then opens them.
  /// Returns one result per URI, in input order; a failure does not stop the others.
  std::vector<Result<TargetHandle>> open_batch(std::span<const std::string> uris, const OpenOptions& options = {}) {
    // Per URI: the resolution status, and the payload in the slot of the backend that resolved it.
    std::vector<Status> resolved(uris.size());
    std::tuple<std::vector<std::optional<typename Backends::resolver_type::target_type>>...> payloads;
    std::apply([&](auto&... slots) { (slots.resize(uris.size()), ...); }, payloads);
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t i = next.fetch_add(1); i < uris.size(); i = next.fetch_add(1)) {
        auto backend = backend_for(uris[i]);
        if (!backend) {
          resolved[i] = backend.status();
          continue;
        }
        detail::for_each_index<kBackends>([&](auto I) {
          if (I != *backend) return;
          auto payload = std::get<I>(state_->backends)->resolver.resolve(uris[i], options);
          if (payload)
            std::get<I>(payloads)[i].emplace(std::move(payload.value()));
          else
            resolved[i] = payload.status().with_context(fmt::format("open '{}'", uris[i]));
        });
      }
    };
    const std::size_t threads =
        std::clamp<std::size_t>(state_->options.open_batch_threads, 1, std::max<std::size_t>(uris.size(), 1));
    {
      std::vector<std::jthread> pool;
      for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
      worker();
    }  // joins
    std::vector<Result<TargetHandle>> out;
    out.reserve(uris.size());
    for (std::size_t i = 0; i < uris.size(); ++i) {
      Result<TargetHandle> opened =
          resolved[i].is_ok() ? error(StatusCode::INTERNAL, "unresolved payload") : Result<TargetHandle>(resolved[i]);
      detail::for_each_index<kBackends>([&](auto I) {
        if (auto& payload = std::get<I>(payloads)[i]) opened = open_resolved<I>(uris[i], std::move(*payload), options);
      });
      out.push_back(std::move(opened));
    }
    return out;
  }

  /// Closes a target (flushing first when it was opened with flush_on_close).
  /// Errors: INVALID_ARGUMENT / NOT_FOUND for bad handles; BUSY while IO on it is in flight or while
  /// another thread closes it; TIMEOUT or BUSY from the DataPath (its flush did not finish in time:
  /// the handle stays valid and open, submit refuses it while the close runs, call close again
  /// later); any other DataPath error (the target is released).
  Status close(TargetHandle handle) {
    TargetEntry* entry = nullptr;
    {
      std::scoped_lock lock(state_->tables_mutex);
      auto found = state_->targets.find(handle, "target");
      if (!found) return found.status();
      if ((*found)->closing)
        return error(StatusCode::BUSY, "target {} is being closed by another thread", handle.to_string());
      if (const auto n = (*found)->in_flight.load(); n > 0)
        return error(StatusCode::BUSY, "target {} has {} request(s) in flight; wait for them before close",
                     handle.to_string(), n);
      entry = *found;
      entry->closing = true;  // submit refuses it from now on; the entry stays alive
    }
    Status s = close_entry(*entry);
    std::scoped_lock lock(state_->tables_mutex);
    state_->drained.notify_all();  // shutdown waits for targets being closed
    if (s.code() == StatusCode::TIMEOUT || s.code() == StatusCode::BUSY) {
      entry->closing = false;  // keep the handle: the flush may still be running
      return s;
    }
    (void)state_->targets.erase(handle);  // still ours: shutdown skips entries being closed
    return s;
  }

  /// The size in bytes of an open target.
  Result<std::uint64_t> target_size(TargetHandle handle) const {
    std::scoped_lock lock(state_->tables_mutex);
    auto found = state_->targets.find(handle, "target");
    if (!found) return found.status();
    return (*found)->size;
  }

  // ---------------------------------------------------------------------------------------------
  // Memory

  /// Registers a memory region with every backend that supports its kind (DMA mapping and PRP
  /// tables are built here, never in submit). The caller keeps the memory alive until
  /// unregister_memory returns OK.
  /// Errors: INVALID_ARGUMENT (null address, zero size, address + size wraps, DEVICE without an
  /// accelerator id), UNSUPPORTED (no backend takes this kind), a DataPath's registration error
  /// (registrations already made are rolled back), BUSY after shutdown.
  Result<MemoryHandle> register_memory(const MemoryView& view) {
    if (view.address == nullptr) return error(StatusCode::INVALID_ARGUMENT, "memory.address is null");
    if (view.size == 0) return error(StatusCode::INVALID_ARGUMENT, "memory.size is 0; a region needs at least 1 byte");
    if (reinterpret_cast<std::uintptr_t>(view.address) > UINTPTR_MAX - view.size)
      return error(StatusCode::INVALID_ARGUMENT, "memory.address {} + memory.size {} wraps around the address space",
                   view.address, view.size);
    if (static_cast<unsigned>(view.kind) > static_cast<unsigned>(MemoryKind::DEVICE))
      return error(StatusCode::INVALID_ARGUMENT, "memory.kind = {} is not HOST (0), PINNED_HOST (1) or DEVICE (2)",
                   static_cast<unsigned>(view.kind));
    if (view.kind == MemoryKind::DEVICE && view.accelerator_id < 0)
      return error(StatusCode::INVALID_ARGUMENT, "memory.accelerator_id = {} must be >= 0 for DEVICE memory",
                   view.accelerator_id);
    if (state_->shutting_down.load()) return shutting_down_error("register_memory");

    auto entry = std::make_unique<MemoryEntry>();
    entry->view = view;
    Status failure;
    bool any = false;
    detail::for_each_index<kBackends>([&](auto I) {
      using D = datapath_at<I>;
      if (!failure.is_ok() || !D::capabilities.memory_kinds.contains(view.kind)) return;
      auto registered = std::get<I>(state_->backends)->datapath.register_memory(view);
      if (!registered) {
        failure = registered.status().with_context(fmt::format("register_memory with backend '{}'", D::name));
        return;
      }
      std::get<I>(entry->registrations).emplace(std::move(registered.value()));
      any = true;
    });
    if (!failure.is_ok() || !any) {
      (void)unregister_entry(*entry);
      if (!failure.is_ok()) return failure;
      return error(StatusCode::UNSUPPORTED, "memory.kind = {} is not supported by any backend of this runtime",
                   to_string(view.kind));
    }
    {
      std::scoped_lock lock(state_->tables_mutex);
      if (!state_->shutting_down.load()) return state_->memory.insert(std::move(entry));
    }
    (void)unregister_entry(*entry);  // shutdown began while the DataPaths registered it: roll back
    return shutting_down_error("register_memory");
  }

  /// Unregisters a region. Errors: INVALID_ARGUMENT / NOT_FOUND for bad handles, BUSY while IO that
  /// uses it is in flight or while a DataPath still waits for its device to finish with it (the handle
  /// then stays valid: call again later), a DataPath's unmap error (the handle is released).
  Status unregister_memory(MemoryHandle handle) {
    MemoryEntry* entry = nullptr;
    {
      std::scoped_lock lock(state_->tables_mutex);
      auto found = state_->memory.find(handle, "memory");
      if (!found) return found.status();
      if ((*found)->unregistering)
        return error(StatusCode::BUSY, "memory {} is being unregistered by another thread", handle.to_string());
      if (const auto n = (*found)->in_flight.load(); n > 0)
        return error(StatusCode::BUSY, "memory {} has {} request(s) in flight; wait for them before unregister",
                     handle.to_string(), n);
      entry = *found;
      entry->unregistering = true;  // submit refuses it from now on; the entry stays alive
    }
    Status s = unregister_entry(*entry);
    std::scoped_lock lock(state_->tables_mutex);
    state_->drained.notify_all();  // shutdown waits for regions being unregistered
    if (s.code() == StatusCode::BUSY) {
      entry->unregistering = false;  // keep the handle: the device may still use the memory
      return s.with_context(fmt::format("unregister_memory {}", handle.to_string()));
    }
    (void)state_->memory.erase(handle);  // still ours: shutdown skips entries being unregistered
    return s;
  }

  // ---------------------------------------------------------------------------------------------
  // IO

  /// Validates each request and hands the valid ones, bucketed per backend, to their DataPaths.
  /// Never blocks. See SubmitOutcome for the per-request initial states.
  /// Cost: on the success path no message is formatted and nothing is allocated per request: the
  /// runtime allocates the outcome's vector and the IO entry (one shared object and one arena that
  /// holds its per-request arrays), besides what each DataPath's submit allocates for its batch.
  SubmitOutcome submit(std::span<const IoRequest> requests) {
    SubmitOutcome outcome;
    outcome.initial_states.resize(requests.size());
    auto io = std::make_shared<IoEntry>(requests.size());
    std::tuple<Bucket<Backends>...>& buckets = io->parts;

    {
      std::scoped_lock lock(state_->tables_mutex);
      if (state_->shutting_down.load()) {
        for (auto& s : outcome.initial_states) s = shutting_down_error("submit");
        return outcome;
      }
      for (std::size_t i = 0; i < requests.size(); ++i)
        outcome.initial_states[i] = stage(requests[i], i, requests.size(), buckets);
      ++state_->submits_in_progress;  // shutdown waits for this submit too
    }

    // Outside the lock: each DataPath gets its bucket in one call (one launch per backend).
    detail::for_each_index<kBackends>([&](auto I) {
      auto& bucket = std::get<I>(buckets);
      if (bucket.requests.empty()) return;
      bucket.states.resize(bucket.requests.size());
      bucket.batch.emplace(std::get<I>(state_->backends)
                               ->datapath.submit(std::span<const PathRequest<datapath_at<I>>>(bucket.requests),
                                                 std::span<Status>(bucket.states)));
      bucket.completions.resize(bucket.requests.size());
      for (std::size_t k = 0; k < bucket.states.size(); ++k) {
        Staged& staged = bucket.staged[k];
        bucket.completions[k].request_index = staged.input_index;
        if (bucket.states[k].is_ok()) {
          staged.accepted = true;
          ++bucket.accepted;
          ++io->requests;
          io->requested_bytes += bucket.requests[k].length;
        } else {
          unpin(staged.pins);
          staged.pins = {};
          outcome.initial_states[staged.input_index] = std::move(bucket.states[k]);
        }
      }
    });

    std::scoped_lock lock(state_->tables_mutex);
    --state_->submits_in_progress;
    outcome.accepted = io->requests;
    if (io->requests > 0) {
      auto handle = state_->ios.insert(io);
      if (handle) {
        outcome.io = *handle;
      } else {
        // Cannot track it: keep the IO alive (never free under DMA) and report the failure.
        state_->orphans.push_back(io);
        for (auto& s : outcome.initial_states)
          if (s.is_ok()) s = error(StatusCode::INTERNAL, "accepted but not trackable: {}", handle.status().message());
      }
    }
    state_->drained.notify_all();
    return outcome;
  }

  /// A non-blocking snapshot of an IO's progress. Errors: bad handle, BUSY while another thread is
  /// inside wait() on the same IO, or a DataPath progress error.
  Result<IoProgress> query(IoHandle handle) {
    auto io = find_io(handle);
    if (!io) return io.status();
    std::unique_lock guard((*io)->mutex, std::try_to_lock);
    if (!guard.owns_lock())
      return error(StatusCode::BUSY, "{} is being waited on by another thread; query again later", handle.to_string());
    Status s = advance(**io, 0);
    if (!s.is_ok() && s.code() != StatusCode::TIMEOUT) return s;
    IoProgress progress{(*io)->complete, (*io)->requests, 0};
    detail::for_each_index<kBackends>([&](auto I) {
      const auto& bucket = std::get<I>((*io)->parts);
      for (std::size_t k = 0; k < bucket.staged.size(); ++k)
        progress.completed_requests += bucket.staged[k].accepted && bucket.completions[k].done ? 1 : 0;
    });
    return progress;
  }

  /// Waits up to timeout_ns nanoseconds for an IO to complete and returns its result. The handle stays
  /// valid until release(). Errors: INVALID_ARGUMENT / NOT_FOUND for bad handles, TIMEOUT when the IO
  /// is not complete in time (wait again later), a DataPath progress error (the IO stays in flight).
  Result<IoResult> wait(IoHandle handle, std::uint64_t timeout_ns) {
    auto io = find_io(handle);
    if (!io) return io.status();
    const std::uint64_t deadline = deadline_after_ns(timeout_ns);
    std::unique_lock guard((*io)->mutex, std::defer_lock);
    if (!guard.try_lock_for(as_duration(timeout_ns)))
      return error(StatusCode::TIMEOUT, "{} is being waited on by another thread; not complete after {} ns",
                   handle.to_string(), timeout_ns);
    Status s = advance(**io, remaining_ns(deadline));
    if (!s.is_ok()) return s.code() == StatusCode::TIMEOUT ? s.with_context(handle.to_string()) : s;
    return (*io)->result;
  }

  /// Waits up to timeout_ns nanoseconds for requests of an IO to complete and returns the completions
  /// that no earlier wait_some() returned, each request once, as soon as at least one is there (or
  /// empty when the timeout passes first). It lets a caller use a request's bytes, e.g. check their
  /// checksum, while the IO's other requests are still in flight. A completion's status is judged as
  /// wait() judges it (success means every byte moved); `request_index` is the position in submit()'s
  /// input. The buffers of returned requests are no longer written by the device; those of the others
  /// may be. wait() still returns the whole IoResult, and release() is still needed. It does not
  /// slice its wait: each DataPath waits in progress(ProgressUntil::SOME), which returns at the first
  /// new completion; an IO on several backends waits on them in turns (see advance).
  /// Errors: bad handle, BUSY while another thread waits on the same IO, a DataPath progress error
  /// (the IO stays in flight). Thread-safe.
  Result<std::vector<RequestCompletion>> wait_some(IoHandle handle, std::uint64_t timeout_ns) {
    auto io = find_io(handle);
    if (!io) return io.status();
    const std::uint64_t deadline = deadline_after_ns(timeout_ns);
    std::unique_lock guard((*io)->mutex, std::defer_lock);
    if (!guard.try_lock_for(as_duration(timeout_ns)))
      return error(StatusCode::BUSY, "{} is being waited on by another thread", handle.to_string());
    Status s = advance(**io, remaining_ns(deadline), ProgressUntil::SOME);
    if (!s.is_ok() && s.code() != StatusCode::TIMEOUT) return s;
    std::vector<RequestCompletion> out;
    detail::for_each_index<kBackends>([&](auto I) {
      auto& bucket = std::get<I>((*io)->parts);
      for (std::size_t k = 0; k < bucket.staged.size(); ++k) {
        Staged& staged = bucket.staged[k];
        if (!staged.accepted || staged.handed_out || !bucket.completions[k].done) continue;
        staged.handed_out = true;
        out.push_back(judged<I>(bucket, k));
      }
    });
    return out;
  }

  /// Frees a completed IO's handle. Errors: bad handle, BUSY while its requests are in flight.
  Status release(IoHandle handle) {
    auto io = find_io(handle);
    if (!io) return io.status();
    {
      std::unique_lock guard((*io)->mutex, std::try_to_lock);
      if (!guard.owns_lock())
        return error(StatusCode::BUSY, "{} is being waited on by another thread", handle.to_string());
      Status s = advance(**io, 0);
      if (!s.is_ok())
        return error(StatusCode::BUSY, "{} still has requests in flight; wait() for it before release ({})",
                     handle.to_string(), s.message());
    }
    std::scoped_lock lock(state_->tables_mutex);
    if (state_->ios.find(handle, "io")) (void)state_->ios.erase(handle);
    return Status::success();
  }

  /// Stops accepting work, waits up to drain_timeout_ns for in-flight IO, then closes every target
  /// and unregisters every region. Errors: TIMEOUT when IO did not drain, or a close() /
  /// unregister_memory() of another thread is still running or started meanwhile (nothing is freed;
  /// call again later); TIMEOUT when a DataPath's close of a target returned TIMEOUT or BUSY (its
  /// flush did not finish: that target stays open, off the handle table, and the next shutdown closes
  /// it again); BUSY when a DataPath still uses a region (kept for the next shutdown); else the first
  /// close/unregister error. Calling it again after OK returns OK. Thread-safety: one shutdown at a
  /// time; any other call may run concurrently.
  Status shutdown(std::uint64_t drain_timeout_ns) {
    state_->shutting_down.store(true);
    const std::uint64_t deadline = deadline_after_ns(drain_timeout_ns);
    {  // Let submits that already passed validation finish handing their buckets to the DataPaths.
      std::unique_lock lock(state_->tables_mutex);
      state_->drained.wait_for(lock, as_duration(drain_timeout_ns), [&] { return state_->submits_in_progress == 0; });
      if (state_->submits_in_progress != 0)
        return error(StatusCode::TIMEOUT, "shutdown: {} submit call(s) still running after {} ns",
                     state_->submits_in_progress, drain_timeout_ns);
    }
    std::vector<std::shared_ptr<IoEntry>> ios;
    {
      std::scoped_lock lock(state_->tables_mutex);
      std::vector<IoHandle> handles;
      state_->ios.for_each([&](IoHandle h, IoEntry&) { handles.push_back(h); });
      for (IoHandle h : handles) ios.push_back(*state_->ios.owner(h, "io"));
      for (auto& orphan : state_->orphans) ios.push_back(orphan);
    }
    std::size_t pending = 0;
    for (auto& io : ios) {
      std::unique_lock guard(io->mutex, std::defer_lock);
      if (!guard.try_lock_for(as_duration(remaining_ns(deadline))) || !advance(*io, remaining_ns(deadline)).is_ok())
        ++pending;
    }
    {  // A region being unregistered or a target being closed by another thread belongs to that thread: wait.
      std::unique_lock lock(state_->tables_mutex);
      auto unregistering = [&] {
        std::size_t n = 0;
        state_->memory.for_each([&](MemoryHandle, MemoryEntry& e) { n += e.unregistering ? 1 : 0; });
        state_->targets.for_each([&](TargetHandle, TargetEntry& e) { n += e.closing ? 1 : 0; });
        return n;
      };
      state_->drained.wait_for(lock, as_duration(remaining_ns(deadline)), [&] { return unregistering() == 0; });
      pending += unregistering();
    }
    if (pending > 0)
      return error(StatusCode::TIMEOUT,
                   "shutdown: {} IO(s) still in flight after {} ns; every registration and target stays alive "
                   "until they complete",
                   pending, drain_timeout_ns);

    Status first;
    std::vector<std::unique_ptr<TargetEntry>> targets;
    std::vector<std::unique_ptr<MemoryEntry>> regions;
    {
      std::scoped_lock lock(state_->tables_mutex);
      // close() and unregister_memory() do not check shutting_down: one may have started on another
      // thread after the wait above released the lock. Its entry belongs to that thread (it touches the
      // entry again when its DataPath call returns): erasing it here would free it under that thread.
      std::size_t owned_elsewhere = 0;
      state_->memory.for_each([&](MemoryHandle, MemoryEntry& e) { owned_elsewhere += e.unregistering ? 1 : 0; });
      state_->targets.for_each([&](TargetHandle, TargetEntry& e) { owned_elsewhere += e.closing ? 1 : 0; });
      if (owned_elsewhere > 0)
        return error(StatusCode::TIMEOUT,
                     "shutdown: {} close / unregister_memory call(s) started on other threads while shutdown ran; "
                     "nothing was released: call shutdown again",
                     owned_elsewhere);
      std::vector<TargetHandle> th;
      std::vector<MemoryHandle> mh;
      std::vector<IoHandle> ih;
      state_->targets.for_each([&](TargetHandle h, TargetEntry&) { th.push_back(h); });
      state_->memory.for_each([&](MemoryHandle h, MemoryEntry&) { mh.push_back(h); });
      state_->ios.for_each([&](IoHandle h, IoEntry&) { ih.push_back(h); });
      for (auto h : th) targets.push_back(state_->targets.erase(h));
      for (auto h : mh) regions.push_back(state_->memory.erase(h));
      for (auto h : ih) (void)state_->ios.erase(h);
      state_->orphans.clear();
    }
    for (auto& t : state_->retained_targets) targets.push_back(std::move(t));
    state_->retained_targets.clear();
    for (auto& t : targets) {
      Status s = close_entry(*t);
      // TIMEOUT / BUSY: the DataPath kept the target open (its close flush is still running, as close()
      // reports): keep it for the next shutdown instead of dropping a flush nobody confirmed.
      if (s.code() == StatusCode::TIMEOUT || s.code() == StatusCode::BUSY)
        state_->retained_targets.push_back(std::move(t));
      if (first.is_ok() && !s.is_ok()) first = s;
    }
    for (auto& m : state_->retained_memory) regions.push_back(std::move(m));
    state_->retained_memory.clear();
    for (auto& m : regions) {
      Status s = unregister_entry(*m);
      if (s.code() == StatusCode::BUSY) state_->retained_memory.push_back(std::move(m));  // device not done
      if (first.is_ok() && !s.is_ok()) first = s;
    }
    if (!state_->retained_targets.empty())
      return error(StatusCode::TIMEOUT,
                   "shutdown: the close of {} target(s) did not finish (their flush is still running); they stay open "
                   "until a later shutdown closes them ({})",
                   state_->retained_targets.size(), first.message());
    if (!state_->retained_memory.empty())
      return error(StatusCode::BUSY,
                   "shutdown: {} memory registration(s) are still in use by a device and stay registered; call "
                   "shutdown again later ({})",
                   state_->retained_memory.size(), first.message());
    state_->shut_down = true;
    return first;
  }

  /// The DataPath of backend I, for its own statistics and settings. Thread-safety is the DataPath's.
  template <std::size_t I = 0>
  datapath_at<I>& datapath() noexcept {
    return std::get<I>(state_->backends)->datapath;
  }

 private:
  // --- per-target, per-region and per-IO state ---------------------------------------------------
  template <class B>
  struct OpenTarget {
    typename B::datapath_type::open_target target;
  };
  struct TargetEntry : detail::Pinnable {
    std::uint64_t size = 0;
    OpenOptions options;
    std::string uri;
    std::variant<std::monostate, OpenTarget<Backends>...> state;  // backend I at index I + 1
    std::size_t backend = 0;
    bool closing = false;  // guarded by tables_mutex
  };
  struct MemoryEntry : detail::Pinnable {
    bool unregistering = false;  // guarded by tables_mutex
    MemoryView view;
    std::tuple<std::optional<typename Backends::datapath_type::registered_memory>...> registrations;
  };
  struct Pins {
    detail::Pinnable* target = nullptr;
    detail::Pinnable* memory = nullptr;
  };
  /// The runtime's side of one request handed to a DataPath.
  struct Staged {
    Pins pins;
    std::size_t input_index = 0;  // the request is submit input input_index
    bool accepted = false;        // the DataPath accepted it (its completion counts)
    bool handed_out = false;      // wait_some() returned its completion
  };
  /// One backend's part of an IO: parallel arrays indexed by the position k in the DataPath's span,
  /// allocated from the IO entry's arena.
  template <class B>
  struct Bucket {
    using D = typename B::datapath_type;
    /// Bytes of the arena one request of this backend may use (every array, with alignment room).
    static constexpr std::size_t kArenaBytesPerRequest =
        sizeof(PathRequest<D>) + sizeof(Staged) + sizeof(Status) + sizeof(RequestCompletion);
    explicit Bucket(std::pmr::memory_resource* arena)
        : requests(arena), staged(arena), states(arena), completions(arena) {}
    std::pmr::vector<PathRequest<D>> requests;
    std::pmr::vector<Staged> staged;
    std::pmr::vector<Status> states;  // the DataPath's answer at submit
    std::pmr::vector<RequestCompletion> completions;
    std::size_t accepted = 0;  // staged entries with accepted set
    std::optional<typename D::batch> batch;
    bool complete = false;
  };
  struct IoEntry {
    /// An IO of `requests` requests: the arena is sized so that every bucket's arrays fit in its first
    /// block, which it allocates on first use (an IO of no request allocates nothing there).
    /// Each bucket is built in place from the arena (no Bucket is moved: moving one moves its empty
    /// std::optional batch, which GCC 12 under -O2 with ASan flags as maybe-uninitialized).
    explicit IoEntry(std::size_t requests) : arena(arena_bytes(requests)), parts(arena_for<Backends>(&arena)...) {}
    template <class>
    static std::pmr::memory_resource* arena_for(std::pmr::memory_resource* resource) {
      return resource;
    }
    static std::size_t arena_bytes(std::size_t requests) {
      constexpr std::size_t kAlignmentRoom = 4 * kBackends * alignof(std::max_align_t) + 256;  // + the block header
      return (... + (std::min<std::size_t>(requests, Backends::datapath_type::capabilities.max_batch_requests) *
                     Bucket<Backends>::kArenaBytesPerRequest)) +
             kAlignmentRoom;
    }
    std::timed_mutex mutex;  // one thread advances an IO at a time; others never block past their budget
    std::pmr::monotonic_buffer_resource arena;  // before parts: destroyed after them
    std::tuple<Bucket<Backends>...> parts;
    std::size_t requests = 0;
    std::uint64_t requested_bytes = 0;
    bool complete = false;
    IoResult result;
  };

  struct State {
    template <class... Bs>
    explicit State(RuntimeOptions o, Bs&&... bs)
        : options(o), backends(std::make_unique<Backends>(std::forward<Bs>(bs))...) {}
    RuntimeOptions options;
    std::tuple<std::unique_ptr<Backends>...> backends;
    std::uint64_t instance = next_instance_id();
    mutable std::mutex tables_mutex;
    std::condition_variable drained;
    HandleTable<TargetTag, TargetEntry> targets{instance};
    HandleTable<MemoryTag, MemoryEntry> memory{instance};
    HandleTable<IoTag, IoEntry, std::shared_ptr<IoEntry>> ios{instance};
    std::vector<std::shared_ptr<IoEntry>> orphans;
    std::vector<std::unique_ptr<MemoryEntry>> retained_memory;   // a DataPath said BUSY at shutdown
    std::vector<std::unique_ptr<TargetEntry>> retained_targets;  // a DataPath's close said TIMEOUT / BUSY at shutdown
    std::size_t submits_in_progress = 0;
    std::atomic<bool> shutting_down{false};
    bool shut_down = false;
  };

  static Status shutting_down_error(std::string_view operation) {
    return error(StatusCode::BUSY, "{}: the runtime is shutting down", operation);
  }

  /// Index of the backend whose resolver serves the URI's scheme.
  Result<std::size_t> backend_for(std::string_view uri) const {
    const std::size_t marker = uri.find("://");
    if (uri.empty()) return error(StatusCode::INVALID_ARGUMENT, "uri is empty; expected scheme://...");
    if (marker == std::string_view::npos || marker == 0)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has no scheme followed by '://'", uri);
    std::string scheme(uri.substr(0, marker));
    for (char& c : scheme) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    std::optional<std::size_t> found;
    std::string served;
    detail::for_each_index<kBackends>([&](auto I) {
      constexpr std::string_view s = backend_at<I>::resolver_type::scheme;
      if (!found && s == scheme) found = I;
      served += (served.empty() ? "" : ", ") + std::string(s);
    });
    if (!found)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has scheme '{}', which no backend serves (served: {})", uri,
                   scheme, served);
    return *found;
  }

  template <std::size_t I, class Payload>
  Result<TargetHandle> open_resolved(std::string_view uri, Payload&& payload, const OpenOptions& options) {
    if (state_->shutting_down.load()) return shutting_down_error("open");
    auto& datapath = std::get<I>(state_->backends)->datapath;
    auto opened = datapath.open(std::forward<Payload>(payload), options);
    if (!opened) return opened.status().with_context(fmt::format("open '{}'", uri));
    auto entry = std::make_unique<TargetEntry>();
    entry->size = datapath.size_bytes(opened.value());
    entry->options = options;
    entry->uri = std::string(uri);
    entry->backend = I;
    entry->state.template emplace<I + 1>(OpenTarget<backend_at<I>>{std::move(opened.value())});
    {
      std::scoped_lock lock(state_->tables_mutex);
      if (!state_->shutting_down.load()) return state_->targets.insert(std::move(entry));
    }
    (void)close_entry(*entry);  // shutdown began while the DataPath opened it: roll back
    return shutting_down_error("open");
  }

  Status close_entry(TargetEntry& entry) {
    Status out;
    detail::for_each_index<kBackends>([&](auto I) {
      if (entry.state.index() == I + 1)
        out = std::get<I>(state_->backends)->datapath.close(std::get<I + 1>(entry.state).target);
    });
    if (out.is_ok()) return out;
    return out.with_context(fmt::format("close '{}'", entry.uri));
  }

  Status unregister_entry(MemoryEntry& entry) {
    Status out;
    detail::for_each_index<kBackends>([&](auto I) {
      auto& registration = std::get<I>(entry.registrations);
      if (!registration) return;
      Status s = std::get<I>(state_->backends)->datapath.unregister_memory(*registration);
      if (s.code() != StatusCode::BUSY) registration.reset();  // BUSY: the device may still use it
      if (!s.is_ok() && (out.is_ok() || s.code() == StatusCode::BUSY)) out = s;
    });
    return out;
  }

  static void unpin(Pins pins) {
    if (pins.target) pins.target->in_flight.fetch_sub(1);
    if (pins.memory) pins.memory->in_flight.fetch_sub(1);
  }

  /// Validates request i of n (tables locked) and, when valid, pins its target and memory and appends
  /// it to its backend's bucket. Returns OK or the reason it is rejected. Checks are overflow-safe;
  /// messages are formatted only for a rejection.
  Status stage(const IoRequest& r, std::size_t i, std::size_t n, std::tuple<Bucket<Backends>...>& buckets) {
    if (r.direction != Direction::READ && r.direction != Direction::WRITE && r.direction != Direction::FLUSH)
      return error(StatusCode::INVALID_ARGUMENT, "requests[{}].direction = {} is not READ, WRITE or FLUSH", i,
                   static_cast<unsigned>(r.direction));
    auto target_found = state_->targets.find(r.target, detail::RequestField{i, "target"});
    if (!target_found) return target_found.status();
    TargetEntry& target = **target_found;
    if (target.closing)
      return error(StatusCode::BUSY, "requests[{}].target = {} is being closed", i, r.target.to_string());

    Status out;
    detail::for_each_index<kBackends>([&](auto I) {
      if (target.state.index() == I + 1) out = stage_for<I>(r, i, n, target, std::get<I>(buckets));
    });
    return out;
  }

  template <std::size_t I>
  Status stage_for(const IoRequest& r, std::size_t i, std::size_t n, TargetEntry& target,
                   Bucket<backend_at<I>>& bucket) {
    using D = datapath_at<I>;
    constexpr Capabilities caps = D::capabilities;
    PathRequest<D> request{r.direction,     nullptr, MemoryView{}, 0, &std::get<I + 1>(target.state).target,
                           r.target_offset, r.length};
    if (bucket.requests.size() >= caps.max_batch_requests)
      return error(StatusCode::RESOURCE_EXHAUSTED,
                   "requests[{}]: backend '{}' takes at most {} requests per submit; resubmit the rest", i, D::name,
                   caps.max_batch_requests);
    MemoryEntry* memory = nullptr;
    if (r.direction == Direction::FLUSH) {
      if (!r.memory.is_null() || r.length != 0 || r.memory_offset != 0 || r.target_offset != 0)
        return error(StatusCode::INVALID_ARGUMENT,
                     "requests[{}] is a FLUSH: memory must be null and memory_offset, target_offset and length 0 "
                     "(got length = {})",
                     i, r.length);
    } else {
      if (r.direction == Direction::WRITE && !target.options.writable)
        return error(StatusCode::INVALID_ARGUMENT,
                     "requests[{}] is a WRITE but {} ('{}') was opened read-only (OpenOptions::writable = false)", i,
                     r.target.to_string(), target.uri);
      auto memory_found = state_->memory.find(r.memory, detail::RequestField{i, "memory"});
      if (!memory_found) return memory_found.status();
      memory = *memory_found;
      if (memory->unregistering)
        return error(StatusCode::BUSY, "requests[{}].memory = {} is being unregistered", i, r.memory.to_string());
      auto& registration = std::get<I>(memory->registrations);
      if (!registration)
        return error(StatusCode::INVALID_ARGUMENT,
                     "requests[{}].memory ({} memory) is not registered with backend '{}', which does not support "
                     "that memory kind",
                     i, to_string(memory->view.kind), D::name);
      TUTTI_RETURN_IF_ERROR(check_bounds<caps>(r, i, memory->view, target.size));
      request.memory = &*registration;
      request.memory_view = memory->view;
      request.memory_offset = r.memory_offset;
    }
    if (bucket.requests.empty()) {  // sized once, for every request left in this submit
      const std::size_t most = std::min<std::size_t>(n - i, caps.max_batch_requests);
      bucket.requests.reserve(most);
      bucket.staged.reserve(most);
    }
    target.in_flight.fetch_add(1);
    if (memory) memory->in_flight.fetch_add(1);
    bucket.requests.push_back(request);
    bucket.staged.push_back(Staged{Pins{&target, memory}, i, false});
    return Status::success();
  }

  template <Capabilities caps>
  static Status check_bounds(const IoRequest& r, std::size_t i, const MemoryView& view, std::uint64_t target_size) {
    if (r.length == 0)
      return error(StatusCode::INVALID_ARGUMENT, "requests[{}].length is 0; READ and WRITE move at least 1 byte", i);
    if (r.length > caps.max_request_bytes)
      return error(StatusCode::INVALID_ARGUMENT, "requests[{}].length = {} exceeds the backend limit of {} bytes", i,
                   r.length, caps.max_request_bytes);
    if (r.target_offset > target_size || r.length > target_size - r.target_offset)
      return error(StatusCode::OUT_OF_RANGE,
                   "requests[{}]: target_offset = {} + length = {} reaches past the target size of {} bytes", i,
                   r.target_offset, r.length, target_size);
    if (r.target_offset % caps.offset_alignment != 0)
      return error(StatusCode::INVALID_ARGUMENT, "requests[{}].target_offset = {} is not a multiple of {} bytes", i,
                   r.target_offset, caps.offset_alignment);
    std::uint64_t span = r.length;  // bytes of memory the transfer touches
    if (r.length % caps.offset_alignment != 0) {
      const bool tail = caps.unaligned_tail_at_end_of_target && r.target_offset + r.length == target_size;
      if (!tail)
        return error(StatusCode::INVALID_ARGUMENT, "requests[{}].length = {} is not a multiple of {} bytes{}", i,
                     r.length, caps.offset_alignment,
                     caps.unaligned_tail_at_end_of_target ? " and does not end at the end of the target" : "");
      span = r.length + (caps.offset_alignment - r.length % caps.offset_alignment);
    }
    if (r.memory_offset > view.size || span > view.size - r.memory_offset)
      return error(StatusCode::OUT_OF_RANGE,
                   "requests[{}]: memory_offset = {} + {} bytes reaches past the registered region of {} bytes{}", i,
                   r.memory_offset, span, view.size,
                   span != r.length ? " (the unaligned tail is transferred as a whole aligned unit)" : "");
    const auto address = reinterpret_cast<std::uintptr_t>(view.address) + r.memory_offset;
    if (address % caps.memory_alignment != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "requests[{}]: memory address + memory_offset = {:#x} is not a multiple of {} bytes", i, address,
                   caps.memory_alignment);
    return Status::success();
  }

  Result<std::shared_ptr<IoEntry>> find_io(IoHandle handle) const {
    std::scoped_lock lock(state_->tables_mutex);
    return state_->ios.owner(handle, "io");
  }

  /// Drives an IO's DataPath batches for up to budget_ns (io->mutex held). until = ALL: OK once the
  /// IO is complete. until = SOME (wait_some): OK once it is complete or a completion that wait_some
  /// has not handed out is there. TIMEOUT when neither happened in time; a DataPath's progress error
  /// otherwise (other backends' completions reaped before it stay recorded).
  ///
  /// An IO that spans several backends: no single DataPath call can wait on two devices, so each
  /// round first asks every unfinished backend for what is ready without waiting (timeout 0), so a
  /// later backend's completions are reaped however long an earlier one takes; then it waits:
  ///  - with one backend unfinished, on that backend for the whole remaining budget;
  ///  - with several unfinished, on each in turn for a turn that starts at kFirstTurnNs and doubles up
  ///    to kLongestTurnNs while nothing arrives, each call capped by the deadline. Taking turns also
  ///    for until = ALL matters: a DataPath whose progress drives its IO (local_nvme issues commands
  ///    past request_window, Aborts and deferred admissions only inside progress) would stall while
  ///    another backend is waited on for the whole budget. A completion on any backend is handed out
  ///    within about (backends x kLongestTurnNs), and an idle wait costs at most a few wake-ups per
  ///    millisecond.
  /// A runtime with one backend, or an IO on one backend, never slices: one progress call waits.
  Status advance(IoEntry& io, std::uint64_t budget_ns, ProgressUntil until = ProgressUntil::ALL) {
    if (io.complete) return Status::success();
    const std::uint64_t deadline = deadline_after_ns(budget_ns);
    std::uint64_t turn_ns = kFirstTurnNs;
    const auto nothing_yet = [] { return false; };
    for (bool waited = false;; waited = true) {
      std::size_t unfinished = unfinished_backends(io);
      const bool polled_every_backend = unfinished > 1;
      if (polled_every_backend) {
        TUTTI_RETURN_IF_ERROR(progress_backends(io, kBackends, 0, deadline, until, nothing_yet));
        unfinished = unfinished_backends(io);
      }
      if (unfinished == 0) {
        finish(io);
        return Status::success();
      }
      if (until == ProgressUntil::SOME && has_unhanded_completion(io)) return Status::success();
      const std::uint64_t left = remaining_ns(deadline);
      // No time left: one look was all a zero budget asked for (the zero-timeout round above, or the
      // single backend's call below on the first pass).
      if (left == 0 && (waited || polled_every_backend))
        return error(StatusCode::TIMEOUT, "IO not complete after {} ns", budget_ns);
      if (unfinished == 1) {
        TUTTI_RETURN_IF_ERROR(progress_backends(io, first_unfinished_backend(io), left, deadline, until, nothing_yet));
      } else {
        // Each unfinished backend in turn; with SOME, stop the round as soon as one has something to hand out.
        TUTTI_RETURN_IF_ERROR(progress_backends(io, kBackends, turn_ns, deadline, until, [&] {
          return until == ProgressUntil::SOME && has_unhanded_completion(io);
        }));
        turn_ns = std::min(turn_ns * 2, kLongestTurnNs);
      }
    }
  }

  /// Calls progress(min(timeout_ns, what is left until deadline), until) on backend `which` of the IO
  /// (kBackends: on every unfinished backend in order, each call capped anew, stopping once
  /// `enough()`), marking the buckets that complete. OK, or the first progress error other than
  /// NOT_READY.
  template <class Enough>
  Status progress_backends(IoEntry& io, std::size_t which, std::uint64_t timeout_ns, std::uint64_t deadline,
                           ProgressUntil until, Enough&& enough) {
    Status failure;
    bool stop = false;
    detail::for_each_index<kBackends>([&](auto I) {
      auto& bucket = std::get<I>(io.parts);
      if (bucket.accepted == 0) bucket.complete = true;
      if (stop || bucket.complete || (which != kBackends && which != I)) return;
      const std::uint64_t capped = std::min(timeout_ns, remaining_ns(deadline));
      Status s =
          std::get<I>(state_->backends)
              ->datapath.progress(*bucket.batch, std::span<RequestCompletion>(bucket.completions), capped, until);
      if (s.is_ok()) {
        bucket.complete = true;
      } else if (s.code() != StatusCode::NOT_READY) {
        failure = s.with_context(fmt::format("progress of backend '{}'", datapath_at<I>::name));
        stop = true;
        return;
      }
      stop = enough();
    });
    return failure;
  }

  /// Backends of the IO whose part has not completed (a backend with no accepted request counts as complete).
  std::size_t unfinished_backends(const IoEntry& io) const {
    std::size_t n = 0;
    detail::for_each_index<kBackends>([&](auto I) {
      const auto& bucket = std::get<I>(io.parts);
      n += bucket.accepted != 0 && !bucket.complete ? 1 : 0;
    });
    return n;
  }
  std::size_t first_unfinished_backend(const IoEntry& io) const {
    std::size_t first = kBackends;
    detail::for_each_index<kBackends>([&](auto I) {
      const auto& bucket = std::get<I>(io.parts);
      if (first == kBackends && bucket.accepted != 0 && !bucket.complete) first = I;
    });
    return first;
  }

  /// True when a request of the IO completed and wait_some has not handed it out yet.
  static bool has_unhanded_completion(const IoEntry& io) {
    bool found = false;
    detail::for_each_index<kBackends>([&](auto I) {
      const auto& bucket = std::get<I>(io.parts);
      for (std::size_t k = 0; !found && k < bucket.staged.size(); ++k)
        found = bucket.staged[k].accepted && !bucket.staged[k].handed_out && bucket.completions[k].done;
    });
    return found;
  }

  /// Request k of backend I's bucket as the caller sees it: its submit() index, and success only
  /// when the DataPath confirmed every byte.
  template <std::size_t I, class BucketType>
  static RequestCompletion judged(const BucketType& bucket, std::size_t k) {
    RequestCompletion c = bucket.completions[k];
    c.request_index = bucket.staged[k].input_index;
    if (!c.done)  // a DataPath that reports completion must fill every entry; never claim bytes moved
      c.status = error(StatusCode::INTERNAL, "DataPath '{}' completed without a status", datapath_at<I>::name);
    if (c.status.is_ok() && c.confirmed_bytes != bucket.requests[k].length &&
        bucket.requests[k].direction != Direction::FLUSH)  // fail closed: success means every byte moved
      c.status = error(StatusCode::DATA_LOSS, "DataPath '{}' reported success for {} of {} bytes", datapath_at<I>::name,
                       c.confirmed_bytes, bucket.requests[k].length);
    if (!c.status.is_ok()) c.confirmed_bytes = std::min(c.confirmed_bytes, bucket.requests[k].length);
    return c;
  }

  /// Marks a completed IO: unpins its targets and regions and builds its IoResult.
  void finish(IoEntry& io) {
    IoResult& result = io.result;
    result.requests = io.requests;
    result.requested_bytes = io.requested_bytes;
    result.completions.reserve(io.requests);
    detail::for_each_index<kBackends>([&](auto I) {
      auto& bucket = std::get<I>(io.parts);
      for (std::size_t k = 0; k < bucket.staged.size(); ++k) {
        if (!bucket.staged[k].accepted) continue;
        RequestCompletion c = judged<I>(bucket, k);
        result.confirmed_bytes += c.confirmed_bytes;
        result.commands += c.commands;
        result.completions.push_back(std::move(c));
        unpin(bucket.staged[k].pins);
      }
    });
    std::sort(result.completions.begin(), result.completions.end(),
              [](const RequestCompletion& a, const RequestCompletion& b) { return a.request_index < b.request_index; });
    for (const RequestCompletion& c : result.completions) {
      if (c.status.is_ok()) continue;
      result.failed_requests.push_back(c.request_index);
      if (!result.first_failed_request) {
        result.first_failed_request = c.request_index;
        result.failure_kind = c.status.code();
        result.device_status = c.device_status;
        result.status = c.status.with_context(fmt::format("requests[{}]", c.request_index));
      }
    }
    io.complete = true;
  }

  std::unique_ptr<State> state_;
};

}  // namespace tutti
