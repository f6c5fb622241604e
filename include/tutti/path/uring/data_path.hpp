// tutti::uring::UringDataPath: the DataPath class, the public face of the engine. Part of
// tutti/path/uring.hpp (include that); the file comment there describes the DataPath as a whole.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <tutti/accel/stream.hpp>
#include <tutti/bind/file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/uring/engine.hpp>
#include <tutti/path/uring/options.hpp>
#include <tutti/path/uring/staging.hpp>
#include <tutti/path/uring/state.hpp>
#include <tutti/path/uring/stats.hpp>
#include <tutti/path/uring/tables.hpp>

namespace tutti::uring {

class UringDataPath {
 public:
  /// EINTR / EAGAIN results resubmitted before the request fails.
  static constexpr std::uint32_t kMaxRetries = detail::kMaxRetries;
  /// The kernel's limit on one fixed buffer (io_uring: 1 GiB per registered iovec).
  static constexpr std::uint64_t kMaxFixedBufferBytes = detail::kMaxFixedBufferBytes;
  /// The offset, length and memory alignment every request must have (uring::kAlignment: 4096 bytes).
  static constexpr std::uint64_t kAlignment = uring::kAlignment;

  using target_type = file::Target;
  /// An open target (state.hpp).
  using open_target = OpenTarget;
  /// A registration (state.hpp).
  using registered_memory = RegisteredMemory;
  using CompletionStream = uring::CompletionStream;

  /// One submit's in-flight state.
  struct batch {
    std::shared_ptr<detail::BatchState> state;
  };

  static constexpr std::string_view name = "uring";
  static constexpr Capabilities capabilities{
      .offset_alignment = kAlignment,
      .memory_alignment = kAlignment,
      .max_request_bytes = kMaxRequestBytes,  // split into commands of max_command_bytes
      .max_batch_requests = 8192,
      .memory_kinds = detail::kStagesDeviceMemory
                          ? MemoryKindSet{MemoryKind::HOST, MemoryKind::PINNED_HOST, MemoryKind::DEVICE}
                          : MemoryKindSet{MemoryKind::HOST, MemoryKind::PINNED_HOST},
      .unaligned_tail_at_end_of_target = true,
  };

  /// Creates the ring (io_uring_queue_init_params with Options::queue_depth SQ entries and twice as
  /// many CQ entries, SQPOLL when asked) and its registered file and fixed buffer tables (a table the
  /// kernel refuses is not an error: the DataPath then uses plain descriptors and buffers, and says
  /// why in open_target / registered_memory). Options are normalised first (see options()).
  /// Errors: the kernel's refusal of the ring, from its errno: RESOURCE_EXHAUSTED (ENOMEM, EMFILE,
  /// ENFILE), UNSUPPORTED (ENOSYS: io_uring disabled; EPERM for SQPOLL without privilege), as
  /// status_from_errno maps them. Thread-safety: any thread.
  static Result<UringDataPath> create(Options options = {}) {
    auto engine = std::make_unique<detail::Engine>(detail::normalized(options));
    if (!engine->init_status.is_ok()) return engine->init_status;
    return UringDataPath(std::move(engine));
  }
  UringDataPath(UringDataPath&&) noexcept = default;
  UringDataPath& operator=(UringDataPath&&) noexcept = default;
  UringDataPath(const UringDataPath&) = delete;
  UringDataPath& operator=(const UringDataPath&) = delete;
  ~UringDataPath() = default;

  /// OK, or INTERNAL for a moved-from DataPath (create() refuses a ring the kernel refused).
  Status status() const { return engine_ ? Status::success() : Status(StatusCode::INTERNAL, "moved-from DataPath"); }
  /// The options in force (after normalisation: clamped queue depth, rounded sizes).
  const Options& options() const noexcept { return engine_->options; }
  /// A snapshot of the counters. Thread-safe.
  Stats stats() const { return engine_->snapshot(); }
  /// Waits up to `timeout_ns` ns (UINT64_MAX: no limit) until no command of any batch is in flight,
  /// reaping completions for their batches (their progress() then reports them). The destructor does
  /// this with Options::drain_timeout_ns. Errors: TIMEOUT when commands are still in flight; the
  /// ring's creation error. Thread-safety: may run concurrently with submit() and progress().
  Status drain(std::uint64_t timeout_ns) {
    TUTTI_RETURN_IF_ERROR(status());
    if (engine_->drain(timeout_ns)) return Status::success();
    return error(StatusCode::TIMEOUT, "{} command(s) still in flight after {} ns", engine_->in_flight_commands.load(),
                 timeout_ns);
  }

  /// Opens a payload: checks its alignment against capabilities and registers the file.
  /// Errors: the ring's creation error; UNSUPPORTED when the file system needs an O_DIRECT alignment
  /// larger than 4096 bytes (offset or memory).
  Result<open_target> open(file::Target&& payload, const OpenOptions& options) {
    TUTTI_RETURN_IF_ERROR(status());
    if (payload.direct &&
        (payload.direct_io_alignment > kAlignment || kAlignment % payload.direct_io_alignment != 0 ||
         payload.direct_io_memory_alignment > kAlignment || kAlignment % payload.direct_io_memory_alignment != 0))
      return error(StatusCode::UNSUPPORTED,
                   "'{}' on {} needs O_DIRECT alignment of {} bytes (memory {}), which does not divide the uring "
                   "DataPath's {}-byte alignment",
                   payload.path, payload.filesystem, payload.direct_io_alignment, payload.direct_io_memory_alignment,
                   kAlignment);
    open_target target;
    target.flush_on_close = options.flush_on_close;
    target.file = std::move(payload);
    engine_->tables.register_file(engine_->ring, target, engine_->counters);
    return Result<open_target>(std::move(target));
  }

  /// The file's size in bytes at open time.
  std::uint64_t size_bytes(const open_target& target) const noexcept { return target.file.size; }

  /// Flushes (when opened with flush_on_close and writable: a FLUSH, IORING_OP_FSYNC with
  /// IORING_FSYNC_DATASYNC, through the ring), removes the file from the registered file table and
  /// closes its descriptors. The flush is waited for at most Options::close_flush_timeout_ns.
  /// Errors: BUSY while other commands on the target are in flight (nothing released);
  /// TIMEOUT when the flush did not complete in the budget: nothing is released, the flush stays in
  /// flight, and the next close() keeps waiting for it, then flushes again when WRITEs were submitted
  /// on the target after that flush (durability is not confirmed until a close() returns OK or the
  /// flush's error); RESOURCE_EXHAUSTED when the in-flight budget has no room for
  /// the flush (nothing released; retry); the flush's own error (DEVICE_ERROR ... with errno text),
  /// after which the target is released anyway.
  /// Thread-safety: one close() per target at a time.
  Status close(open_target& target) {
    // The close FLUSH counts on no gauge, so this sees only the caller's own requests.
    if (const auto n = target.in_flight->load(); n > 0)
      return error(StatusCode::BUSY, "'{}' has {} command(s) in flight", target.file.path, n);
    if (!target.pending_close_flush) {
      if (target.flush_on_close && target.file.writable && engine_ && engine_->init_status.is_ok()) {
        const PathRequest<UringDataPath> flush{Direction::FLUSH, nullptr, {}, 0, &target, 0, 0};
        Status accepted;
        auto state = engine_->submit(std::span(&flush, 1), std::span(&accepted, 1), /*close_flush=*/true);
        if (!accepted.is_ok())
          return accepted.with_context(fmt::format("FLUSH (fdatasync) of '{}' on close", target.file.path));
        target.pending_close_flush = std::move(state);
        target.close_flush_completion = {};
        target.close_flush_writes = target.writes_submitted->load();
      }
    }
    Status out;
    if (target.pending_close_flush) {
      const Status waited = engine_->progress(*target.pending_close_flush, std::span(&target.close_flush_completion, 1),
                                              options().close_flush_timeout_ns);
      if (!waited.is_ok())
        return error(StatusCode::TIMEOUT,
                     "FLUSH (fdatasync) of '{}' on close did not complete within close_flush_timeout_ns = {} ns; the "
                     "target stays open with the flush in flight: call close() again to keep waiting ({})",
                     target.file.path, options().close_flush_timeout_ns, waited.to_string());
      out = target.close_flush_completion.status;
      target.pending_close_flush.reset();
      // WRITEs submitted after that flush (between a TIMEOUT and this call) are not covered by it:
      // flush again, under a fresh budget, before reporting the target durable.
      if (out.is_ok() && target.writes_submitted->load() != target.close_flush_writes) return close(target);
    }
    if (engine_) engine_->tables.unregister_file(engine_->ring, target);
    target.file.tail_fd.reset();
    target.file.fd.reset();
    return out;
  }

  /// Fences staged copies of a DEVICE registration on the caller's stream `stream` (CUDA profile):
  /// every request submitted afterwards with this memory records an event on `stream` at submit;
  /// its staging copies wait for that event (work queued on `stream` before the submit, such as a
  /// kernel still reading the old contents or producing the data of a WRITE, comes first), and
  /// `stream` waits for each copy's event from the moment progress() issues that copy (so work queued
  /// on it after progress() returned OK is ordered after the bytes landed in device memory, or, for
  /// a WRITE, after they were read out of it; work queued before a copy was issued is not).
  /// Completion is still reported only once the copies finished. A default StreamRef removes the
  /// fence. Requests already submitted keep what they had. The stream must stay alive while requests
  /// fenced on it are in flight.
  /// Errors: INVALID_ARGUMENT for HOST / PINNED_HOST memory (it is read and written by the kernel
  /// directly; nothing to fence); UNSUPPORTED in the host profile.
  /// Thread-safety: may run concurrently with submit() and progress().
  Status set_completion_stream(registered_memory& memory, accel::StreamRef stream) {
    if constexpr (!detail::kStagesDeviceMemory) return streams_unsupported();
    if (memory.view.kind != MemoryKind::DEVICE)
      return error(StatusCode::INVALID_ARGUMENT,
                   "set_completion_stream: memory at {} is {} memory; only DEVICE memory moves through the staging "
                   "ring and can be fenced on a stream",
                   memory.view.address, memory.view.kind == MemoryKind::HOST ? "HOST" : "PINNED_HOST");
    std::scoped_lock lock(memory.completion_stream->mutex);
    memory.completion_stream->stream = stream;
    return Status::success();
  }

  /// The same for every DEVICE registration of this DataPath whose region starts at `address`, for
  /// callers that hold only the runtime's handle (runtime.datapath().set_completion_stream(ptr, s)).
  /// Errors: NOT_FOUND when no DEVICE region registered here starts at `address` (or the DataPath was
  /// moved from); UNSUPPORTED in the host profile. Thread-safety: as above.
  Status set_completion_stream(const void* address, accel::StreamRef stream) {
    if constexpr (!detail::kStagesDeviceMemory) return streams_unsupported();
    if (!engine_) return error(StatusCode::NOT_FOUND, "set_completion_stream: this DataPath was moved from");
    if (engine_->set_stream_at(address, stream) == 0)
      return error(StatusCode::NOT_FOUND,
                   "set_completion_stream: no DEVICE memory region registered with the uring "
                   "DataPath starts at address {}",
                   address);
    return Status::success();
  }

  /// Registers a region: a fixed buffer when possible (HOST / PINNED_HOST, at most 1 GiB, a free slot),
  /// else plain IO with the reason recorded. DEVICE memory (CUDA profile) allocates the staging ring on
  /// first use. Errors: the ring's creation error; UNSUPPORTED for DEVICE memory in the host profile or
  /// on a second accelerator; DEVICE_ERROR when the staging ring cannot be allocated.
  Result<registered_memory> register_memory(const MemoryView& view) {
    TUTTI_RETURN_IF_ERROR(status());
    registered_memory memory;
    memory.view = view;
    if (view.kind == MemoryKind::DEVICE) {
      if constexpr (!detail::kStagesDeviceMemory)
        return error(StatusCode::UNSUPPORTED, "the uring DataPath moves DEVICE memory only in the CUDA profile");
      TUTTI_RETURN_IF_ERROR(engine_->ensure_staging(view.accelerator_id));
      memory.fixed_buffer_fallback = "DEVICE memory moves through the pinned staging ring";
      engine_->add_device_region(memory);
      return Result<registered_memory>(std::move(memory));
    }
    engine_->tables.register_buffer(engine_->ring, memory, engine_->counters);
    return Result<registered_memory>(std::move(memory));
  }

  /// Removes the region's fixed buffer from the table. BUSY while commands using it are in flight.
  /// Errors: DEVICE_ERROR when the kernel refuses the removal (the slot is then never reused).
  Status unregister_memory(registered_memory& memory) {
    if (const auto n = memory.in_flight->load(); n > 0)
      return error(StatusCode::BUSY, "memory region at {} has {} command(s) in flight", memory.view.address, n);
    if (!engine_) return Status::success();
    if constexpr (detail::kStagesDeviceMemory) {
      if (memory.view.kind == MemoryKind::DEVICE) engine_->remove_device_region(memory);
    }
    return engine_->tables.unregister_buffer(engine_->ring, memory);
  }

  /// Queues the requests as SQEs and calls io_uring_submit once. Never blocks beyond the submission
  /// mutex (held for the enqueue). states[i]: OK (accepted), RESOURCE_EXHAUSTED (in-flight budget of
  /// queue_depth commands full; resubmit later), INVALID_ARGUMENT (an unaligned tail WRITE on an O_DIRECT
  /// target without a tail descriptor), or the ring's creation error.
  batch submit(std::span<const PathRequest<UringDataPath>> requests, std::span<Status> states) {
    return batch{engine_->submit(requests, states)};
  }

  /// Reaps completions until every accepted request of `b` completed (OK), or timeout_ns ran out
  /// (NOT_READY), or, with until = ProgressUntil::SOME, at least one request of `b` completed since
  /// the last call (NOT_READY unless that was the last one): it waits on the CQ
  /// (io_uring_wait_cqe_timeout) for the next CQE and then drains every CQE that is ready. Fills
  /// completions[i] for each request i of `b` that completed since the last call.
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL) {
    return engine_->progress(*b.state, completions, timeout_ns, until);
  }

 private:
  explicit UringDataPath(std::unique_ptr<detail::Engine> engine) : engine_(std::move(engine)) {}

  static Status streams_unsupported() {
    return error(StatusCode::UNSUPPORTED, "set_completion_stream: accelerator streams exist only in the CUDA profile");
  }

  std::unique_ptr<detail::Engine> engine_;
};

}  // namespace tutti::uring
