// tutti::uring::UringDataPath: host-executed IO on plain files (tutti::file::Target) with io_uring
// (liburing), into host memory directly and, in the CUDA profile, into DEVICE memory through a bounded
// ring of pinned staging buffers (tutti/path/uring/staging.hpp). docs/uring.md is the long form.
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
//  - A CQE error becomes status_code_of_errno(-res) with the errno text (uring/errors.hpp): EIO ->
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

#include <fcntl.h>
#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/config.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/bind/file.hpp>
#include <tutti/core/clock.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/uring/errors.hpp>
#include <tutti/path/uring/staging.hpp>

namespace tutti::uring {

namespace detail {
class StreamFence;  // tutti/path/uring/staging.hpp (CUDA profile)
}  // namespace detail

/// Settings of a uring DataPath. Every field has a default constant; docs/uring.md lists them and
/// tests/uring/resolver_test.cpp pins them.
struct Options {
  static constexpr std::uint32_t kDefaultQueueDepth = 256;
  static constexpr bool kDefaultSqpoll = false;
  static constexpr std::uint32_t kDefaultSqpollIdleMs = 1000;
  static constexpr std::uint32_t kDefaultRegisteredFiles = 256;
  static constexpr std::uint32_t kDefaultFixedBuffers = 64;
  static constexpr std::uint64_t kDefaultMaxCommandBytes = std::uint64_t{1} << 20;  // 1 MiB
  static constexpr std::uint64_t kDefaultWaitSliceNs = 1'000'000;                   // 1 ms
  static constexpr std::uint32_t kDefaultStagingBuffers = 8;
  static constexpr std::uint64_t kDefaultStagingBufferBytes = std::uint64_t{4} << 20;  // 4 MiB
  static constexpr std::uint64_t kDefaultDrainTimeoutNs = 5'000'000'000;              // 5 s
  static constexpr std::uint64_t kDefaultCloseFlushTimeoutNs = 30'000'000'000;        // 30 s

  /// SQ entries of the ring and the in-flight budget in commands (SQEs), 1..32768 (clamped). A submit
  /// whose request does not fit the remaining budget rejects it RESOURCE_EXHAUSTED. The CQ has twice
  /// as many entries, so it cannot overflow.
  std::uint32_t queue_depth = kDefaultQueueDepth;
  /// IORING_SETUP_SQPOLL: a kernel thread polls the SQ, so submit() usually makes no system call.
  bool sqpoll = kDefaultSqpoll;
  /// Milliseconds the SQPOLL thread spins idle before it sleeps (sq_thread_idle).
  std::uint32_t sqpoll_idle_ms = kDefaultSqpollIdleMs;
  /// Slots of the registered file table (0: no registered files, plain fds).
  std::uint32_t registered_files = kDefaultRegisteredFiles;
  /// Slots of the fixed buffer table (0: no fixed buffers, plain reads and writes).
  std::uint32_t fixed_buffers = kDefaultFixedBuffers;
  /// Bytes per command (SQE) for host memory, a multiple of 4096 (rounded up); larger requests are
  /// split. Raised when needed so that a request of capabilities.max_request_bytes fits queue_depth.
  std::uint64_t max_command_bytes = kDefaultMaxCommandBytes;
  /// Longest single wait on the CQ in ns (io_uring_wait_cqe_timeout), so concurrent progress() callers
  /// take turns reaping. Never longer than the caller's budget.
  std::uint64_t wait_slice_ns = kDefaultWaitSliceNs;
  /// CUDA profile: pinned staging buffers for DEVICE memory (>= 1).
  std::uint32_t staging_buffers = kDefaultStagingBuffers;
  /// CUDA profile: bytes per staging buffer, a multiple of 4096 (rounded up). The staging budget is
  /// staging_buffers x staging_buffer_bytes bytes of pinned host memory.
  std::uint64_t staging_buffer_bytes = kDefaultStagingBufferBytes;
  /// Budget in ns the destructor gives in-flight commands before it tears the ring down.
  std::uint64_t drain_timeout_ns = kDefaultDrainTimeoutNs;
  /// Budget in ns close() waits for the FLUSH (fdatasync) of a target opened with flush_on_close.
  /// When it runs out, close() returns TIMEOUT and the target stays open with the flush in flight;
  /// 0 checks once without waiting.
  std::uint64_t close_flush_timeout_ns = kDefaultCloseFlushTimeoutNs;

  /// The defaults overridden by environment variables, one per field: TUTTI_URING_QUEUE_DEPTH,
  /// TUTTI_URING_SQPOLL (0/1), TUTTI_URING_SQPOLL_IDLE_MS, TUTTI_URING_REGISTERED_FILES,
  /// TUTTI_URING_FIXED_BUFFERS, TUTTI_URING_MAX_COMMAND_BYTES, TUTTI_URING_WAIT_SLICE_NS,
  /// TUTTI_URING_STAGING_BUFFERS, TUTTI_URING_STAGING_BUFFER_BYTES, TUTTI_URING_DRAIN_TIMEOUT_NS,
  /// TUTTI_URING_CLOSE_FLUSH_TIMEOUT_NS.
  /// Errors: INVALID_ARGUMENT naming the variable when a value is not a decimal number in range.
  /// Thread-safety: reads the environment (getenv); do not call while another thread sets it.
  static Result<Options> from_environment() {
    Options o;
    Status failure;
    auto read = [&](const char* variable, auto& field, std::uint64_t max) {
      const char* text = std::getenv(variable);
      if (text == nullptr || !failure.is_ok()) return;
      const std::string_view value(text);
      std::uint64_t parsed = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size() || parsed > max) {
        failure = error(StatusCode::INVALID_ARGUMENT, "{} = '{}' is not a decimal number in 0..{}", variable, value, max);
        return;
      }
      field = static_cast<std::remove_reference_t<decltype(field)>>(parsed);
    };
    read("TUTTI_URING_QUEUE_DEPTH", o.queue_depth, 32768);
    read("TUTTI_URING_SQPOLL", o.sqpoll, 1);
    read("TUTTI_URING_SQPOLL_IDLE_MS", o.sqpoll_idle_ms, UINT32_MAX);
    read("TUTTI_URING_REGISTERED_FILES", o.registered_files, 1u << 20);
    read("TUTTI_URING_FIXED_BUFFERS", o.fixed_buffers, 16384);
    read("TUTTI_URING_MAX_COMMAND_BYTES", o.max_command_bytes, std::uint64_t{64} << 20);
    read("TUTTI_URING_WAIT_SLICE_NS", o.wait_slice_ns, UINT64_MAX);
    read("TUTTI_URING_STAGING_BUFFERS", o.staging_buffers, 4096);
    read("TUTTI_URING_STAGING_BUFFER_BYTES", o.staging_buffer_bytes, std::uint64_t{1} << 30);
    read("TUTTI_URING_DRAIN_TIMEOUT_NS", o.drain_timeout_ns, UINT64_MAX);
    read("TUTTI_URING_CLOSE_FLUSH_TIMEOUT_NS", o.close_flush_timeout_ns, UINT64_MAX);
    if (!failure.is_ok()) return failure;
    return o;
  }
};

/// Counters of one DataPath (monotonic unless noted). Read with DataPath::stats().
struct Stats {
  std::uint64_t submit_calls = 0;                ///< submit() calls that queued at least one command.
  std::uint64_t io_uring_submits = 0;            ///< io_uring_submit calls (one per submit(), plus resubmissions).
  std::uint64_t commands = 0;                    ///< SQEs prepared, resubmissions included.
  std::uint64_t short_transfer_resubmissions = 0;///< SQEs issued for the remainder of a short read or write.
  std::uint64_t rejected_backpressure = 0;       ///< Requests rejected RESOURCE_EXHAUSTED (budget full).
  std::uint64_t fixed_buffer_registrations = 0;  ///< Regions registered as fixed buffers.
  std::uint64_t fixed_buffer_fallbacks = 0;      ///< Regions that use plain reads and writes instead.
  std::uint64_t registered_file_fallbacks = 0;   ///< Targets that use a plain fd instead of a registered file.
  std::uint64_t staged_chunks = 0;               ///< Chunks moved through the staging ring (CUDA profile).
  std::uint32_t in_flight_commands = 0;          ///< Commands accepted and not completed (a gauge).
  bool sqpoll_active = false;                    ///< The ring runs with IORING_SETUP_SQPOLL.
  bool registered_file_table = false;           ///< The registered file table exists.
  bool fixed_buffer_table = false;               ///< The sparse fixed buffer table exists.
  std::string fixed_buffer_table_error;          ///< Why the fixed buffer table is missing (empty when present).
};

class UringDataPath {
 public:
  /// EINTR / EAGAIN results resubmitted before the request fails.
  static constexpr std::uint32_t kMaxRetries = 16;
  /// The kernel's limit on one fixed buffer (io_uring: 1 GiB per registered iovec).
  static constexpr std::uint64_t kMaxFixedBufferBytes = std::uint64_t{1} << 30;
  /// The offset, length and memory alignment every request must have: 4096 bytes, the largest logical
  /// block size in common use (4Kn drives), so a request valid here is valid for O_DIRECT on any file
  /// system whose alignment divides it. Files that need more are refused at open (UNSUPPORTED).
  static constexpr std::uint64_t kAlignment = 4096;

  using target_type = file::Target;

 private:
  struct BatchState;

 public:
  /// An open target. The payload's descriptors are closed when it is destroyed.
  struct open_target {
    file::Target file;
    int registered_file_index = -1;  ///< Slot in the registered file table; -1: plain fd (see fallback).
    std::string registered_file_fallback;  ///< Why the file is not registered (empty when it is).
    bool flush_on_close = false;
    std::unique_ptr<std::atomic<std::uint64_t>> in_flight = std::make_unique<std::atomic<std::uint64_t>>(0);
    /// The FLUSH a close() started and that has not completed (close() returned TIMEOUT); the next
    /// close() keeps waiting for it. It references nothing of this object, so destroying the target
    /// instead leaves the flush to finish in the kernel.
    std::shared_ptr<BatchState> pending_close_flush;
    RequestCompletion close_flush_completion{};
    /// WRITE requests submitted on this target so far (a counter, never decremented).
    std::unique_ptr<std::atomic<std::uint64_t>> writes_submitted = std::make_unique<std::atomic<std::uint64_t>>(0);
    /// writes_submitted when pending_close_flush was submitted: a WRITE submitted after a close()
    /// returned TIMEOUT is not covered by that flush, so the next close() flushes again.
    std::uint64_t close_flush_writes = 0;
  };

  /// The caller's stream a DEVICE registration is fenced on (set_completion_stream); shared with the
  /// DataPath's lookup table, guarded by its own mutex.
  struct CompletionStream {
    std::mutex mutex;
    accel::StreamRef stream;
  };

  /// A registration.
  struct registered_memory {
    MemoryView view;
    int fixed_buffer_index = -1;        ///< Slot in the fixed buffer table; -1: plain reads and writes.
    std::string fixed_buffer_fallback;  ///< Why the region is not a fixed buffer (empty when it is).
    std::unique_ptr<std::atomic<std::uint64_t>> in_flight = std::make_unique<std::atomic<std::uint64_t>>(0);
    /// DEVICE memory: the caller's stream staged copies are fenced on (none by default).
    std::shared_ptr<CompletionStream> completion_stream = std::make_shared<CompletionStream>();
  };

  static constexpr std::string_view name = "uring";
  static constexpr Capabilities capabilities{
      .offset_alignment = kAlignment,
      .memory_alignment = kAlignment,
      .max_request_bytes = std::uint64_t{64} << 20,  // 64 MiB, split into commands of max_command_bytes
      .max_batch_requests = 8192,
#if defined(TUTTI_ACCELERATOR_CUDA)
      .memory_kinds = {MemoryKind::HOST, MemoryKind::PINNED_HOST, MemoryKind::DEVICE},
#else
      .memory_kinds = {MemoryKind::HOST, MemoryKind::PINNED_HOST},
#endif
      .unaligned_tail_at_end_of_target = true,
  };

 private:
  enum class Stage : std::uint8_t {
    disk,                 ///< The SQE is in the kernel (or about to be).
    waiting_for_staging,  ///< DEVICE memory: waiting for a free staging buffer.
    copy,                 ///< DEVICE memory: a cudaMemcpyAsync into or out of the staging buffer runs.
    done,
  };
  struct RequestState {
    std::size_t position = 0;  // index into the submitted span
    Direction direction = Direction::READ;
    std::uint64_t length = 0;
    std::uint64_t confirmed = 0;
    std::uint32_t commands_left = 0;
    std::uint32_t sqes = 0;
    Status status;
    bool done = false;
    std::atomic<std::uint64_t>* target_in_flight = nullptr;
    std::atomic<std::uint64_t>* memory_in_flight = nullptr;
    const std::string* path = nullptr;
  };
  /// One command: a contiguous piece of one request, one SQE at a time (resubmitted when short).
  struct Command {
    BatchState* batch = nullptr;
    std::uint32_t request = 0;
    Direction direction = Direction::READ;
    Stage stage = Stage::disk;
    int fd = -1;
    bool fixed_file = false;
    int buffer_index = -1;              // fixed buffer slot, -1 for plain IO
    std::uint32_t alignment = 1;        // O_DIRECT unit of the fd used; 1 when buffered
    std::uint32_t retries = 0;
    std::byte* address = nullptr;       // host memory of the next SQE (staging buffer for DEVICE memory)
    std::uint64_t target_offset = 0;    // file offset of the next SQE
    std::uint64_t remaining = 0;        // bytes this command still has to move
    std::byte* device_address = nullptr;  // DEVICE memory: destination / source of the chunk
    std::uint64_t chunk_bytes = 0;        // DEVICE memory: the chunk's bytes
    std::uint64_t chunk_target_offset = 0;
    int staging_slot = -1;
    detail::StreamFence* fence = nullptr;  // DEVICE memory fenced on a caller's stream (owned by the batch)
  };
  struct BatchState {
    std::vector<RequestState> requests;
    std::vector<Command> commands;       // reserved once: pointers stay valid (SQE user_data)
    std::size_t remaining_requests = 0;  // guarded by the completion mutex
    std::vector<std::uint32_t> finished; // requests done and not yet reported to progress()
    std::vector<std::shared_ptr<detail::StreamFence>> fences;  // CUDA profile: one per caller's stream
    bool close_flush = false;            // the FLUSH of close(): counts on no target, owns its path
    std::string owned_path;              // the path in messages when close_flush
  };

  struct Engine;

 public:
  /// One submit's in-flight state.
  struct batch {
    std::shared_ptr<BatchState> state;
  };

  /// Creates the ring (io_uring_queue_init_params with Options::queue_depth SQ entries and twice as
  /// many CQ entries, SQPOLL when asked) and its registered file and fixed buffer tables (a table the
  /// kernel refuses is not an error: the DataPath then uses plain descriptors and buffers, and says
  /// why in open_target / registered_memory). Options are normalised first (see options()).
  /// Errors: the kernel's refusal of the ring, from its errno: RESOURCE_EXHAUSTED (ENOMEM, EMFILE,
  /// ENFILE), UNSUPPORTED (ENOSYS: io_uring disabled; EPERM for SQPOLL without privilege), as
  /// status_from_errno maps them. Thread-safety: any thread.
  static Result<UringDataPath> create(Options options = {}) {
    auto engine = std::make_unique<Engine>(normalized(options));
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
    if (payload.direct && (payload.direct_io_alignment > kAlignment || kAlignment % payload.direct_io_alignment != 0 ||
                           payload.direct_io_memory_alignment > kAlignment ||
                           kAlignment % payload.direct_io_memory_alignment != 0))
      return error(StatusCode::UNSUPPORTED,
                   "'{}' on {} needs O_DIRECT alignment of {} bytes (memory {}), which does not divide the uring "
                   "DataPath's {}-byte alignment",
                   payload.path, payload.filesystem, payload.direct_io_alignment, payload.direct_io_memory_alignment,
                   kAlignment);
    open_target target;
    target.flush_on_close = options.flush_on_close;
    target.file = std::move(payload);
    engine_->register_file(target);
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
        if (!accepted.is_ok()) return accepted.with_context(fmt::format("FLUSH (fdatasync) of '{}' on close", target.file.path));
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
    if (engine_) engine_->unregister_file(target);
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
  /// a WRITE, after they were read out of it; work queued before a copy was issued is not). Completion is still reported only once the copies finished. A default
  /// StreamRef removes the fence. Requests already submitted keep what they had. The stream must stay
  /// alive while requests fenced on it are in flight.
  /// Errors: INVALID_ARGUMENT for HOST / PINNED_HOST memory (it is read and written by the kernel
  /// directly; nothing to fence); UNSUPPORTED in the host profile.
  /// Thread-safety: may run concurrently with submit() and progress().
  Status set_completion_stream(registered_memory& memory, accel::StreamRef stream) {
#if defined(TUTTI_ACCELERATOR_CUDA)
    if (memory.view.kind != MemoryKind::DEVICE)
      return error(StatusCode::INVALID_ARGUMENT,
                   "set_completion_stream: memory at {} is {} memory; only DEVICE memory moves through the staging ring "
                   "and can be fenced on a stream",
                   memory.view.address, memory.view.kind == MemoryKind::HOST ? "HOST" : "PINNED_HOST");
    std::scoped_lock lock(memory.completion_stream->mutex);
    memory.completion_stream->stream = stream;
    return Status::success();
#else
    (void)memory;
    (void)stream;
    return error(StatusCode::UNSUPPORTED, "set_completion_stream: accelerator streams exist only in the CUDA profile");
#endif
  }

  /// The same for every DEVICE registration of this DataPath whose region starts at `address`, for
  /// callers that hold only the runtime's handle (runtime.datapath().set_completion_stream(ptr, s)).
  /// Errors: NOT_FOUND when no DEVICE region registered here starts at `address` (or the DataPath was
  /// moved from); UNSUPPORTED in the
  /// host profile. Thread-safety: as above.
  Status set_completion_stream(const void* address, accel::StreamRef stream) {
#if defined(TUTTI_ACCELERATOR_CUDA)
    if (!engine_) return error(StatusCode::NOT_FOUND, "set_completion_stream: this DataPath was moved from");
    std::size_t found = 0;
    {
      std::scoped_lock lock(engine_->device_regions_mutex);
      auto [begin, end] = engine_->device_regions.equal_range(address);
      for (auto it = begin; it != end; ++it) {
        std::scoped_lock slot_lock(it->second->mutex);
        it->second->stream = stream;
        ++found;
      }
    }
    if (found == 0)
      return error(StatusCode::NOT_FOUND, "set_completion_stream: no DEVICE memory region registered with the uring "
                                          "DataPath starts at address {}", address);
    return Status::success();
#else
    (void)address;
    (void)stream;
    return error(StatusCode::UNSUPPORTED, "set_completion_stream: accelerator streams exist only in the CUDA profile");
#endif
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
#if defined(TUTTI_ACCELERATOR_CUDA)
      TUTTI_RETURN_IF_ERROR(engine_->ensure_staging(view.accelerator_id));
      memory.fixed_buffer_fallback = "DEVICE memory moves through the pinned staging ring";
      {
        std::scoped_lock lock(engine_->device_regions_mutex);
        engine_->device_regions.emplace(view.address, memory.completion_stream);
      }
      return Result<registered_memory>(std::move(memory));
#else
      return error(StatusCode::UNSUPPORTED, "the uring DataPath moves DEVICE memory only in the CUDA profile");
#endif
    }
    engine_->register_buffer(memory);
    return Result<registered_memory>(std::move(memory));
  }

  /// Removes the region's fixed buffer from the table. BUSY while commands using it are in flight.
  /// Errors: DEVICE_ERROR when the kernel refuses the removal (the slot is then never reused).
  Status unregister_memory(registered_memory& memory) {
    if (const auto n = memory.in_flight->load(); n > 0)
      return error(StatusCode::BUSY, "memory region at {} has {} command(s) in flight", memory.view.address, n);
    if (!engine_) return Status::success();
#if defined(TUTTI_ACCELERATOR_CUDA)
    if (memory.view.kind == MemoryKind::DEVICE) {
      std::scoped_lock lock(engine_->device_regions_mutex);
      auto [begin, end] = engine_->device_regions.equal_range(memory.view.address);
      for (auto it = begin; it != end; ++it)
        if (it->second == memory.completion_stream) {
          engine_->device_regions.erase(it);
          break;
        }
    }
#endif
    return engine_->unregister_buffer(memory);
  }

  /// Queues the requests as SQEs and calls io_uring_submit once. Never blocks beyond the submission
  /// mutex (held for the enqueue). states[i]: OK (accepted), RESOURCE_EXHAUSTED (in-flight budget of
  /// queue_depth commands full; resubmit later), INVALID_ARGUMENT (an unaligned tail WRITE on an O_DIRECT
  /// target without a tail descriptor), or the ring's creation error.
  batch submit(std::span<const PathRequest<UringDataPath>> requests, std::span<Status> states) {
    return batch{engine_->submit(requests, states)};
  }

  /// Reaps completions until every accepted request of `b` completed (OK) or timeout_ns ran out
  /// (NOT_READY). Fills completions[i] for each request i of `b` that completed since the last call.
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns) {
    return engine_->progress(*b.state, completions, timeout_ns);
  }

 private:
  static Options normalized(Options o) {
    o.queue_depth = std::clamp<std::uint32_t>(o.queue_depth, 1, 32768);
    auto round_up = [](std::uint64_t v) { return std::max<std::uint64_t>(kAlignment, (v + kAlignment - 1) / kAlignment * kAlignment); };
    o.max_command_bytes = round_up(o.max_command_bytes);
    const std::uint64_t needed = round_up((capabilities.max_request_bytes + o.queue_depth - 1) / o.queue_depth);
    o.max_command_bytes = std::max(o.max_command_bytes, needed);
    o.staging_buffers = std::max<std::uint32_t>(o.staging_buffers, 1);
    o.staging_buffer_bytes = round_up(o.staging_buffer_bytes);
    o.wait_slice_ns = std::max<std::uint64_t>(o.wait_slice_ns, 1000);
    return o;
  }

  // ---------------------------------------------------------------------------------------------
  // The ring and everything it guards. Heap-allocated so the DataPath moves without moving a ring.
  struct Engine {
    Options options;
    Status init_status;
    io_uring ring{};
    bool ring_ready = false;
    bool ext_arg = false;  // IORING_FEAT_EXT_ARG: io_uring_wait_cqe_timeout needs no SQE

    std::mutex submission_mutex;     // the SQ: io_uring_get_sqe .. io_uring_submit
    std::timed_mutex completion_mutex;  // the CQ and every BatchState's completion fields
    std::atomic<std::uint32_t> waiting_reapers{0};
    std::atomic<std::uint32_t> in_flight_commands{0};
    std::atomic<bool> submit_pending{false};  // io_uring_submit failed; progress retries it
    std::atomic<bool> has_orphans{false};     // orphan_failures is not empty

    std::mutex table_mutex;          // free lists of the file and buffer tables
    std::vector<int> free_file_slots, free_buffer_slots;
    bool file_table = false, buffer_table = false;
    std::string buffer_table_error;

    std::mutex live_mutex;           // batches with commands in flight (kept alive for user_data)
    std::unordered_map<BatchState*, std::shared_ptr<BatchState>> live;

    std::atomic<std::uint64_t> submit_calls{0}, io_uring_submits{0}, commands{0}, short_resubmissions{0},
        rejected_backpressure{0}, fixed_buffer_registrations{0}, fixed_buffer_fallbacks{0},
        registered_file_fallbacks{0}, staged_chunks{0};

#if defined(TUTTI_ACCELERATOR_CUDA)
    std::mutex staging_mutex;  // the staging ring, its waiting queue and its copying list
    std::unique_ptr<detail::StagingRing> staging;
    std::deque<Command*> staging_queue;
    std::vector<Command*> copying;
    std::mutex device_regions_mutex;  // DEVICE registrations by start address (set_completion_stream)
    std::unordered_multimap<const void*, std::shared_ptr<CompletionStream>> device_regions;
#endif

    explicit Engine(Options o) : options(o) {
      io_uring_params params{};
      params.flags = IORING_SETUP_CQSIZE;
      params.cq_entries = options.queue_depth * 2;
      if (options.sqpoll) {
        params.flags |= IORING_SETUP_SQPOLL;
        params.sq_thread_idle = options.sqpoll_idle_ms;
      }
      const int rc = io_uring_queue_init_params(options.queue_depth, &ring, &params);
      if (rc < 0) {
        init_status = status_from_errno(-rc, fmt::format("io_uring_queue_init_params(entries = {}{})",
                                                         options.queue_depth, options.sqpoll ? ", SQPOLL" : ""));
        return;
      }
      ring_ready = true;
      ext_arg = (params.features & IORING_FEAT_EXT_ARG) != 0;
      if (options.registered_files > 0 && io_uring_register_files_sparse(&ring, options.registered_files) == 0) {
        file_table = true;
        for (int i = static_cast<int>(options.registered_files) - 1; i >= 0; --i) free_file_slots.push_back(i);
      }
      if (options.fixed_buffers > 0) {
        const int b = io_uring_register_buffers_sparse(&ring, options.fixed_buffers);
        if (b == 0) {
          buffer_table = true;
          for (int i = static_cast<int>(options.fixed_buffers) - 1; i >= 0; --i) free_buffer_slots.push_back(i);
        } else {
          buffer_table_error = fmt::format("io_uring_register_buffers_sparse: {}", file::errno_text(-b));
        }
      } else {
        buffer_table_error = "Options::fixed_buffers = 0";
      }
    }

    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    /// Drains in-flight commands for up to drain_timeout_ns, then tears the ring down. Commands still
    /// in flight after that are cancelled by the kernel when the ring closes (it waits for them); their
    /// batches are leaked on purpose so a late CQE never meets freed memory.
    ~Engine() {
      if (!ring_ready) return;
      if (!drain(options.drain_timeout_ns)) {
        std::scoped_lock lock(live_mutex);
        for (auto& [raw, owner] : live) leak_on_purpose(new std::shared_ptr<BatchState>(owner));
      }
      io_uring_queue_exit(&ring);
    }

    /// Reaps until no command is in flight or `timeout_ns` passed; true when none is left.
    bool drain(std::uint64_t timeout_ns) {
      // Saturating: drain_timeout_ns = UINT64_MAX ("forever", which the environment accepts) must not
      // wrap into a deadline in the past, which would end the drain at once.
      const std::uint64_t deadline = deadline_after_ns(timeout_ns);
      while (in_flight_commands.load() > 0 && monotonic_ns() < deadline) {
        std::unique_lock lock(completion_mutex);
        reap();
#if defined(TUTTI_ACCELERATOR_CUDA)
        pump_staging();
#endif
        wait_for_cqe(std::min<std::uint64_t>(options.wait_slice_ns, remaining_ns(deadline)));
      }
      return in_flight_commands.load() == 0;
    }

    Stats snapshot() {
      Stats s;
      s.submit_calls = submit_calls.load();
      s.io_uring_submits = io_uring_submits.load();
      s.commands = commands.load();
      s.short_transfer_resubmissions = short_resubmissions.load();
      s.rejected_backpressure = rejected_backpressure.load();
      s.fixed_buffer_registrations = fixed_buffer_registrations.load();
      s.fixed_buffer_fallbacks = fixed_buffer_fallbacks.load();
      s.registered_file_fallbacks = registered_file_fallbacks.load();
      s.staged_chunks = staged_chunks.load();
      s.in_flight_commands = in_flight_commands.load();
      s.sqpoll_active = ring_ready && (ring.flags & IORING_SETUP_SQPOLL) != 0;
      s.registered_file_table = file_table;
      s.fixed_buffer_table = buffer_table;
      s.fixed_buffer_table_error = buffer_table_error;
      return s;
    }

    // --- registered files and fixed buffers ------------------------------------------------------
    void register_file(open_target& target) {
      int slot = -1;
      {
        std::scoped_lock lock(table_mutex);
        if (!file_table) {
          target.registered_file_fallback = "no registered file table (Options::registered_files = 0 or refused)";
        } else if (free_file_slots.empty()) {
          target.registered_file_fallback = fmt::format("registered file table full ({} slots)", options.registered_files);
        } else {
          slot = free_file_slots.back();
          free_file_slots.pop_back();
        }
      }
      if (slot >= 0) {
        int fd = target.file.fd.get();
        const int rc = io_uring_register_files_update(&ring, static_cast<unsigned>(slot), &fd, 1);
        if (rc == 1) {
          target.registered_file_index = slot;
          return;
        }
        target.registered_file_fallback = fmt::format("io_uring_register_files_update: {}", file::errno_text(rc < 0 ? -rc : EIO));
        std::scoped_lock lock(table_mutex);
        free_file_slots.push_back(slot);
      }
      registered_file_fallbacks.fetch_add(1);
    }

    void unregister_file(open_target& target) {
      if (target.registered_file_index < 0) return;
      int none = -1;
      const int rc = io_uring_register_files_update(&ring, static_cast<unsigned>(target.registered_file_index), &none, 1);
      if (rc == 1) {  // a slot the kernel still holds is never handed out again
        std::scoped_lock lock(table_mutex);
        free_file_slots.push_back(target.registered_file_index);
      }
      target.registered_file_index = -1;
    }

    void register_buffer(registered_memory& memory) {
      int slot = -1;
      {
        std::scoped_lock lock(table_mutex);
        if (!buffer_table)
          memory.fixed_buffer_fallback = fmt::format("no fixed buffer table ({})", buffer_table_error);
        else if (memory.view.size > kMaxFixedBufferBytes)
          memory.fixed_buffer_fallback =
              fmt::format("region of {} bytes exceeds the {}-byte fixed buffer limit", memory.view.size, kMaxFixedBufferBytes);
        else if (free_buffer_slots.empty())
          memory.fixed_buffer_fallback = fmt::format("fixed buffer table full ({} slots)", options.fixed_buffers);
        else {
          slot = free_buffer_slots.back();
          free_buffer_slots.pop_back();
        }
      }
      if (slot >= 0) {
        iovec vector{memory.view.address, static_cast<std::size_t>(memory.view.size)};
        __u64 tag = 0;
        const int rc = io_uring_register_buffers_update_tag(&ring, static_cast<unsigned>(slot), &vector, &tag, 1);
        if (rc == 1) {
          memory.fixed_buffer_index = slot;
          fixed_buffer_registrations.fetch_add(1);
          return;
        }
        memory.fixed_buffer_fallback =
            fmt::format("io_uring_register_buffers_update_tag: {}", file::errno_text(rc < 0 ? -rc : EIO));
        std::scoped_lock lock(table_mutex);
        free_buffer_slots.push_back(slot);
      }
      fixed_buffer_fallbacks.fetch_add(1);
    }

    Status unregister_buffer(registered_memory& memory) {
      if (memory.fixed_buffer_index < 0) return Status::success();
      iovec empty{nullptr, 0};
      __u64 tag = 0;
      const int rc = io_uring_register_buffers_update_tag(&ring, static_cast<unsigned>(memory.fixed_buffer_index),
                                                          &empty, &tag, 1);
      if (rc != 1)
        return status_from_errno(rc < 0 ? -rc : EIO,
                                 fmt::format("removing fixed buffer {} ({} bytes at {})", memory.fixed_buffer_index,
                                             memory.view.size, memory.view.address));
      std::scoped_lock lock(table_mutex);
      free_buffer_slots.push_back(memory.fixed_buffer_index);
      memory.fixed_buffer_index = -1;
      return Status::success();
    }

    // --- submission ------------------------------------------------------------------------------
    /// Commands a request needs, or an error that rejects it.
    Result<std::uint32_t> plan(const PathRequest<UringDataPath>& r) const {
      if (r.direction == Direction::FLUSH) return 1u;
      if (r.direction == Direction::WRITE && r.target->file.direct && r.length % r.target->file.direct_io_alignment != 0 &&
          !r.target->file.tail_fd.valid())
        return error(StatusCode::INVALID_ARGUMENT,
                     "WRITE of an unaligned tail ({} bytes at offset {}) to '{}' needs the tail descriptor, which "
                     "could not be opened (/proc not mounted?)",
                     r.length, r.target_offset, r.target->file.path);
      std::uint64_t unit = options.max_command_bytes;
#if defined(TUTTI_ACCELERATOR_CUDA)
      if (r.memory_view.kind == MemoryKind::DEVICE) {
        if (!staging) return error(StatusCode::INTERNAL, "DEVICE memory registered without a staging ring");
        unit = staging->buffer_bytes();
      }
#endif
      return static_cast<std::uint32_t>((r.length + unit - 1) / unit);
    }

    /// close_flush: the FLUSH of close(), which counts on no target's in-flight gauge and owns its
    /// path, so the target may be destroyed while it is in flight.
    std::shared_ptr<BatchState> submit(std::span<const PathRequest<UringDataPath>> requests, std::span<Status> states,
                                       bool close_flush = false) {
      auto state = std::make_shared<BatchState>();
      state->close_flush = close_flush;
      if (!init_status.is_ok()) {
        for (auto& s : states) s = init_status;
        return state;
      }
      std::vector<std::uint32_t> planned(requests.size(), 0);
      std::vector<detail::StreamFence*> fences(requests.size(), nullptr);
      std::size_t total = 0;
      for (std::size_t k = 0; k < requests.size(); ++k) {
        auto p = plan(requests[k]);
        if (!p) {
          states[k] = p.status();
          continue;
        }
#if defined(TUTTI_ACCELERATOR_CUDA)
        if (auto f = fence_for(requests[k], *state); !f) {
          states[k] = f.status();
          continue;
        } else {
          fences[k] = *f;
        }
#endif
        planned[k] = *p;
        total += *p;
      }
      state->commands.reserve(total);
      state->requests.reserve(requests.size());

      std::vector<Command*> staged;
      {
        std::scoped_lock lock(submission_mutex);
        std::uint32_t host_commands = 0;
        for (std::size_t k = 0; k < requests.size(); ++k) {
          if (planned[k] == 0) continue;
          const std::uint32_t in_flight = in_flight_commands.load();
          if (planned[k] > options.queue_depth - std::min(in_flight, options.queue_depth)) {
            states[k] = error(StatusCode::RESOURCE_EXHAUSTED,
                              "uring queue full: request needs {} command(s), {} of {} in flight; resubmit later",
                              planned[k], in_flight, options.queue_depth);
            rejected_backpressure.fetch_add(1);
            continue;
          }
          in_flight_commands.fetch_add(planned[k]);
          states[k] = Status::success();
          build(*state, requests[k], k, planned[k], fences[k], staged, host_commands);
        }
        state->remaining_requests = state->requests.size();
        if (state->commands.empty()) return state;
        {
          std::scoped_lock live_lock(live_mutex);
          live.emplace(state.get(), state);
        }
        submit_calls.fetch_add(1);
        for (Command& c : state->commands)
          if (c.stage == Stage::disk) prepare_sqe(c);
        if (host_commands > 0) submit_locked();
      }
#if defined(TUTTI_ACCELERATOR_CUDA)
      if (!staged.empty()) {
        std::scoped_lock lock(staging_mutex);
        for (Command* c : staged) staging_queue.push_back(c);
      }
#endif
      return state;
    }

#if defined(TUTTI_ACCELERATOR_CUDA)
    /// The fence of a DEVICE request whose registration is fenced on a caller's stream: one per stream
    /// and batch, recorded on that stream now. Null when there is none.
    Result<detail::StreamFence*> fence_for(const PathRequest<UringDataPath>& r, BatchState& state) {
      if (r.memory_view.kind != MemoryKind::DEVICE || r.memory == nullptr) return static_cast<detail::StreamFence*>(nullptr);
      accel::StreamRef stream;
      {
        std::scoped_lock lock(r.memory->completion_stream->mutex);
        stream = r.memory->completion_stream->stream;
      }
      if (!stream.has_value()) return static_cast<detail::StreamFence*>(nullptr);
      for (auto& f : state.fences)
        if (f->caller() == stream.cuda()) return f.get();
      auto created = detail::StreamFence::record(stream.cuda());
      if (!created) return created.status().with_context(fmt::format("fencing on the caller's stream {}", stream.native_handle()));
      state.fences.push_back(std::move(created.value()));
      return state.fences.back().get();
    }
#endif

    /// Appends request k's state and its commands (submission mutex held).
    void build(BatchState& state, const PathRequest<UringDataPath>& r, std::size_t k, std::uint32_t count,
               detail::StreamFence* fence, std::vector<Command*>& staged, std::uint32_t& host_commands) {
      const auto request_index = static_cast<std::uint32_t>(state.requests.size());
      RequestState& rs = state.requests.emplace_back();
      rs.position = k;
      rs.direction = r.direction;
      rs.length = r.length;
      rs.commands_left = count;
      if (state.close_flush) {  // close()'s FLUSH outlives no pointer into the target
        state.owned_path = r.target->file.path;
        rs.path = &state.owned_path;
      } else {
        rs.path = &r.target->file.path;
        rs.target_in_flight = r.target->in_flight.get();
        rs.target_in_flight->fetch_add(1);
        if (r.direction == Direction::WRITE) r.target->writes_submitted->fetch_add(1);
      }
      if (r.memory) {
        rs.memory_in_flight = r.memory->in_flight.get();
        rs.memory_in_flight->fetch_add(1);
      }
      const file::Target& f = r.target->file;
      const bool staged_memory = r.memory_view.kind == MemoryKind::DEVICE;
      const std::uint64_t unit = count > 1 ? (r.length + count - 1) / count : r.length;
      // Pieces are multiples of kAlignment except the last one.
      const std::uint64_t piece = count > 1 ? (unit + kAlignment - 1) / kAlignment * kAlignment : r.length;
      for (std::uint32_t i = 0; i < count; ++i) {
        Command& c = state.commands.emplace_back();
        c.batch = &state;
        c.request = request_index;
        c.direction = r.direction;
        c.fd = r.target->registered_file_index >= 0 ? r.target->registered_file_index : f.fd.get();
        c.fixed_file = r.target->registered_file_index >= 0;
        c.alignment = f.direct ? f.direct_io_alignment : 1;
        if (r.direction == Direction::FLUSH) {
          ++host_commands;
          break;
        }
        const std::uint64_t begin = std::uint64_t{i} * piece;
        const std::uint64_t bytes = std::min(piece, r.length - begin);
        c.target_offset = r.target_offset + begin;
        c.remaining = bytes;
        std::byte* memory = static_cast<std::byte*>(r.memory_view.address) + r.memory_offset + begin;
        if (r.direction == Direction::WRITE && f.direct && bytes % f.direct_io_alignment != 0) {
            // The last command of an unaligned tail WRITE goes through the tail descriptor (same inode,
          // page cache): exactly `bytes` bytes, so the file never grows past its size.
          c.fd = f.tail_fd.get();
          c.fixed_file = false;
          c.alignment = 1;
        }
        if (staged_memory) {
          c.fence = fence;
          c.device_address = memory;
          c.chunk_bytes = bytes;
          c.chunk_target_offset = c.target_offset;
          c.stage = Stage::waiting_for_staging;
          staged.push_back(&c);
          continue;
        }
        c.address = memory;
        c.buffer_index = r.memory ? r.memory->fixed_buffer_index : -1;
        ++host_commands;
      }
    }

    /// Writes the SQE of a command in stage DISK (submission mutex held). Never fails: the in-flight
    /// budget guarantees a free SQ entry; if the SQ is full anyway the command fails INTERNAL.
    void prepare_sqe(Command& c) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) {
        // Cannot happen while in_flight_commands <= queue_depth = SQ entries; fail closed if it does.
        orphan_failures.push_back(&c);
        has_orphans.store(true);
        return;
      }
      commands.fetch_add(1);
      ++c.batch->requests[c.request].sqes;
      if (c.direction == Direction::FLUSH) {
        io_uring_prep_fsync(sqe, c.fd, IORING_FSYNC_DATASYNC);
      } else {
        std::uint64_t bytes = c.remaining;
        // O_DIRECT tail read: ask for the whole last aligned unit; the memory has room for it.
        if (c.direction == Direction::READ && c.alignment > 1 && bytes % c.alignment != 0)
          bytes += c.alignment - bytes % c.alignment;
        const auto length = static_cast<unsigned>(bytes);
        if (c.direction == Direction::READ) {
          if (c.buffer_index >= 0)
            io_uring_prep_read_fixed(sqe, c.fd, c.address, length, c.target_offset, c.buffer_index);
          else
            io_uring_prep_read(sqe, c.fd, c.address, length, c.target_offset);
        } else {
          if (c.buffer_index >= 0)
            io_uring_prep_write_fixed(sqe, c.fd, c.address, length, c.target_offset, c.buffer_index);
          else
            io_uring_prep_write(sqe, c.fd, c.address, length, c.target_offset);
        }
      }
      if (c.fixed_file) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
      io_uring_sqe_set_data(sqe, &c);
    }

    /// io_uring_submit (submission mutex held). On failure the SQEs stay in the SQ and progress retries.
    void submit_locked() {
      io_uring_submits.fetch_add(1);
      const int rc = io_uring_submit(&ring);
      submit_pending.store(rc < 0);
    }

    // --- completion ------------------------------------------------------------------------------
    std::vector<Command*> orphan_failures;  // commands that got no SQE (submission mutex)

    /// Waits for a CQE for up to `ns` (completion mutex held). Consumes nothing.
    void wait_for_cqe(std::uint64_t ns) {
      if (ns == 0) return;
      if (!ext_arg) {  // older kernels: a timed wait would need an SQE; sleep a slice instead
        std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(ns, 50'000)));
        return;
      }
      __kernel_timespec timeout{};
      timeout.tv_sec = static_cast<long long>(ns / 1'000'000'000);
      timeout.tv_nsec = static_cast<long long>(ns % 1'000'000'000);
      io_uring_cqe* cqe = nullptr;
      (void)io_uring_wait_cqe_timeout(&ring, &cqe, &timeout);
    }

    /// Handles every available CQE (completion mutex held); resubmits short transfers.
    void reap() {
      std::vector<Command*> resubmit;
      std::vector<std::shared_ptr<BatchState>> retired;
      if (submit_pending.load(std::memory_order_relaxed) || has_orphans.load(std::memory_order_relaxed)) {
        std::scoped_lock lock(submission_mutex);
        if (submit_pending.load()) submit_locked();
        for (Command* c : orphan_failures) {
          fail(*c, error(StatusCode::INTERNAL, "no SQ entry was free for a command within the in-flight budget"));
          finish(*c, retired);
        }
        orphan_failures.clear();
        has_orphans.store(false);
      }
      // Batches of CQEs through io_uring_peek_batch_cqe rather than the io_uring_for_each_cqe macro, whose
      // assignment in its loop condition GCC 13 flags under -Werror=parentheses.
      std::array<io_uring_cqe*, 64> cqes{};
      while (unsigned seen = io_uring_peek_batch_cqe(&ring, cqes.data(), cqes.size())) {
        for (unsigned i = 0; i < seen; ++i) {
          auto* c = static_cast<Command*>(io_uring_cqe_get_data(cqes[i]));
          if (c != nullptr) complete(*c, cqes[i]->res, resubmit, retired);
        }
        io_uring_cq_advance(&ring, seen);
      }
      if (!resubmit.empty()) {
        std::scoped_lock lock(submission_mutex);
        for (Command* c : resubmit) prepare_sqe(*c);
        submit_locked();
      }
    }

    static std::string describe(const Command& c) {
      const RequestState& r = c.batch->requests[c.request];
      if (c.direction == Direction::FLUSH) return fmt::format("FLUSH (fdatasync) of '{}'", *r.path);
      return fmt::format("{} of {} bytes at offset {} of '{}'", to_string(c.direction), c.remaining, c.target_offset,
                         *r.path);
    }

    static void fail(Command& c, Status status) {
      RequestState& r = c.batch->requests[c.request];
      if (r.status.is_ok()) r.status = std::move(status);
    }

    /// One CQE of command c with result res.
    void complete(Command& c, int res, std::vector<Command*>& resubmit,
                  std::vector<std::shared_ptr<BatchState>>& retired) {
      RequestState& r = c.batch->requests[c.request];
      if (res < 0) {
        const int err = -res;
        if ((err == EINTR || err == EAGAIN) && c.retries < kMaxRetries) {
          ++c.retries;
          resubmit.push_back(&c);
          return;
        }
        fail(c, status_from_errno(err, describe(c)));
        finish(c, retired);
        return;
      }
      if (c.direction == Direction::FLUSH) {
        finish(c, retired);
        return;
      }
      const auto bytes = static_cast<std::uint64_t>(res);
      const std::uint64_t moved = std::min(bytes, c.remaining);
      r.confirmed += moved;
      if (bytes >= c.remaining) {
        c.remaining = 0;
        chunk_transferred(c, retired);
        return;
      }
      const std::uint64_t reached = c.target_offset + bytes;
      if (bytes == 0 || bytes % c.alignment != 0) {
        // The file ended before the range did (a read), or an O_DIRECT write stopped mid-unit.
        if (c.direction == Direction::READ)
          fail(c, error(StatusCode::OUT_OF_RANGE,
                        "{}: the file ends at byte {}, before the requested range (it shrank since it was opened); "
                        "{} bytes arrived",
                        describe(c), reached, r.confirmed));
        else
          fail(c, error(bytes == 0 ? StatusCode::DEVICE_ERROR : StatusCode::DATA_LOSS,
                        "{}: the kernel wrote {} bytes and stopped", describe(c), bytes));
        finish(c, retired);
        return;
      }
      c.address += bytes;
      c.target_offset += bytes;
      c.remaining -= bytes;
      short_resubmissions.fetch_add(1);
      resubmit.push_back(&c);
    }

    /// A command's disk transfer finished: host memory is done; DEVICE reads go on to their H2D copy.
    void chunk_transferred(Command& c, std::vector<std::shared_ptr<BatchState>>& retired) {
#if defined(TUTTI_ACCELERATOR_CUDA)
      if (c.staging_slot >= 0) {
        std::scoped_lock lock(staging_mutex);
        if (c.direction == Direction::READ) {
          auto started = staging->copy_to_device(c.staging_slot, c.device_address, c.chunk_bytes, c.fence);
          if (!started.status.is_ok()) fail(c, started.status.with_context(describe(c)));
          if (started.in_flight) {  // the slot stays ours until the copy is seen done, even when it failed
            c.stage = Stage::copy;
            copying.push_back(&c);
            return;
          }
          if (started.abandoned) {  // queued but unobservable: the ring retired the slot
            c.staging_slot = -1;
            finish(c, retired);
            return;
          }
        }
        staging->release(c.staging_slot);
        c.staging_slot = -1;
        staged_chunks.fetch_add(1);
      }
#endif
      finish(c, retired);
    }

    /// Retires command c: its request completes when it was the last command.
    void finish(Command& c, std::vector<std::shared_ptr<BatchState>>& retired) {
      c.stage = Stage::done;
      BatchState& b = *c.batch;
      RequestState& r = b.requests[c.request];
      in_flight_commands.fetch_sub(1);
      if (--r.commands_left > 0) return;
      r.done = true;
      if (r.target_in_flight) r.target_in_flight->fetch_sub(1);
      if (r.memory_in_flight) r.memory_in_flight->fetch_sub(1);
      b.finished.push_back(c.request);
      if (--b.remaining_requests == 0) {
        std::scoped_lock lock(live_mutex);
        if (auto it = live.find(&b); it != live.end()) {
          retired.push_back(std::move(it->second));  // freed after the CQ loop
          live.erase(it);
        }
      }
    }

#if defined(TUTTI_ACCELERATOR_CUDA)
    Status ensure_staging(int device) {
      std::scoped_lock lock(staging_mutex);
      if (staging) {
        if (staging->device() != device)
          return error(StatusCode::UNSUPPORTED,
                       "the uring DataPath stages through accelerator {}; memory on accelerator {} needs its own "
                       "DataPath",
                       staging->device(), device);
        return Status::success();
      }
      auto created = detail::StagingRing::create(options.staging_buffers, options.staging_buffer_bytes, device);
      if (!created) return created.status().with_context("allocating the uring staging ring");
      staging = std::move(created.value());
      return Status::success();
    }

    /// Advances staged commands (completion mutex held): finished copies, then free buffers to waiting
    /// chunks. Returns whether staged work remains.
    bool pump_staging() {
      std::vector<Command*> to_disk;
      std::vector<std::shared_ptr<BatchState>> retired;
      bool pending = false;
      {
        std::scoped_lock lock(staging_mutex);
        if (!staging) return false;
        for (std::size_t i = 0; i < copying.size();) {
          Command& c = *copying[i];
          auto done = staging->copy_done(c.staging_slot);
          if (done && !*done) {
            ++i;
            continue;
          }
          copying[i] = copying.back();
          copying.pop_back();
          if (!done) fail(c, done.status().with_context(describe(c)));
          if (done && c.direction == Direction::WRITE) {  // D2H finished: write the buffer to the file
            c.stage = Stage::disk;
            to_disk.push_back(&c);
            continue;
          }
          staging->release(c.staging_slot);
          c.staging_slot = -1;
          staged_chunks.fetch_add(1);
          finish(c, retired);
        }
        while (!staging_queue.empty()) {
          const int slot = staging->acquire();
          if (slot < 0) break;
          Command& c = *staging_queue.front();
          staging_queue.pop_front();
          c.staging_slot = slot;
          c.address = staging->buffer(slot);
          c.buffer_index = -1;
          if (c.direction == Direction::READ) {
            c.stage = Stage::disk;
            to_disk.push_back(&c);
            continue;
          }
          auto started = staging->copy_to_host(slot, c.device_address, c.chunk_bytes, c.fence);
          if (!started.status.is_ok()) fail(c, started.status.with_context(describe(c)));
          if (!started.in_flight) {  // nothing queued (slot free again), or queued unobservably (slot retired)
            if (!started.abandoned) staging->release(slot);
            c.staging_slot = -1;
            finish(c, retired);
            continue;
          }
          c.stage = Stage::copy;  // the slot stays ours until the copy is seen done, even when it failed
          copying.push_back(&c);
        }
        pending = !copying.empty() || !staging_queue.empty();
      }
      if (!to_disk.empty()) {
        std::scoped_lock lock(submission_mutex);
        for (Command* c : to_disk) prepare_sqe(*c);
        submit_locked();
      }
      return pending;
    }
#endif

    /// Copies the finished requests of `b` into completions (completion mutex held).
    static void report(BatchState& b, std::span<RequestCompletion> completions) {
      for (std::uint32_t index : b.finished) {
        const RequestState& r = b.requests[index];
        RequestCompletion& c = completions[r.position];
        c.status = r.status;
        c.confirmed_bytes = r.status.is_ok() ? r.length : std::min(r.confirmed, r.length);
        c.commands = r.sqes;
        c.device_status = 0;
        c.done = true;
      }
      b.finished.clear();
    }

    Status progress(BatchState& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns) {
      const std::uint64_t deadline = deadline_after_ns(timeout_ns);
      for (;;) {
        std::unique_lock lock(completion_mutex, std::defer_lock);
        waiting_reapers.fetch_add(1);
        const bool locked = lock.try_lock_for(as_duration(remaining_ns(deadline)));
        waiting_reapers.fetch_sub(1);
        if (!locked) return Status(StatusCode::NOT_READY, "uring batch in flight (another thread is reaping)");
        bool staged_pending = false;
        reap();
#if defined(TUTTI_ACCELERATOR_CUDA)
        staged_pending = pump_staging();
#endif
        report(b, completions);
        if (b.remaining_requests == 0) return Status::success();
        const std::uint64_t now = monotonic_ns();
        if (now >= deadline) return Status(StatusCode::NOT_READY, "uring batch in flight");
        std::uint64_t slice = std::min(deadline - now, options.wait_slice_ns);
        if (staged_pending) slice = std::min<std::uint64_t>(slice, 20'000);  // copies complete without CQEs
        wait_for_cqe(slice);
        reap();
        report(b, completions);
        if (b.remaining_requests == 0) return Status::success();
        lock.unlock();
        if (waiting_reapers.load() > 0) std::this_thread::yield();  // let another batch's caller reap
      }
    }
  };

  explicit UringDataPath(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}

  std::unique_ptr<Engine> engine_;
};

static_assert(tutti::DataPath<UringDataPath>);

}  // namespace tutti::uring
