// The engine of the uring DataPath: the ring and everything it guards, in one heap object so the
// DataPath moves without moving a ring. Part of tutti/path/uring.hpp (include that).
//
// This file holds the engine's state, its creation and teardown and its statistics. Its steps are
// defined by concern in the files that follow it in tutti/path/uring.hpp:
//   submission.hpp         plan, build and queue the commands of a submit (the SQ side);
//   completion.hpp         reap CQEs, resubmit short transfers, complete requests, progress, drain;
//   staging_pipeline.hpp   DEVICE memory through the pinned staging ring (CUDA profile).
//
// Threading: submit, progress, open, close, register_memory and unregister_memory may run concurrently
// from several threads. The SQ is guarded by submission_mutex, held only while SQEs are written and
// io_uring_submit runs; the CQ and every submitted BatchState by completion_mutex, a timed mutex that
// progress() takes with the caller's deadline, so no call waits past its budget.
// Lock order: completion -> staging -> submission -> live.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/leak.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/uring/options.hpp>
#include <tutti/path/uring/ring.hpp>
#include <tutti/path/uring/staging.hpp>
#include <tutti/path/uring/state.hpp>
#include <tutti/path/uring/stats.hpp>
#include <tutti/path/uring/tables.hpp>

namespace tutti::uring {

class UringDataPath;

namespace detail {

/// A request as the runtime hands it to the DataPath.
using Request = PathRequest<UringDataPath>;
/// Batches whose last request completed during a reap; freed after the CQ loop.
using Retired = std::vector<std::shared_ptr<BatchState>>;

/// EINTR / EAGAIN results resubmitted before the request fails.
inline constexpr std::uint32_t kMaxRetries = 16;

struct Engine {
  /// Creates the ring and its tables. A refused ring is not thrown: it is init_status, which create()
  /// returns.
  explicit Engine(Options o) : options(o) {
    init_status = ring.open(options);
    if (init_status.is_ok()) tables.create(ring, options);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Drains in-flight commands for up to drain_timeout_ns, then tears the ring down. Commands still
  /// in flight after that are cancelled by the kernel when the ring closes (it waits for them); their
  /// batches are leaked on purpose so a late CQE never meets freed memory. The ring closes before the
  /// staging ring (a member declared earlier) frees its pinned buffers.
  ~Engine() {
    if (!ring.ready()) return;
    if (!drain(options.drain_timeout_ns)) {
      std::scoped_lock lock(live_mutex);
      for (auto& [raw, owner] : live) leak_on_purpose(new std::shared_ptr<BatchState>(owner));
    }
    ring.close();
  }

  Stats snapshot() const {
    Stats s;
    counters.copy_to(s);
    tables.copy_to(s);
    s.in_flight_commands = in_flight_commands.load();
    s.sqpoll_active = ring.sqpoll_active();
    return s;
  }

  // --- submission.hpp ---------------------------------------------------------------------------
  Result<std::uint32_t> plan(const Request& r) const;
  std::shared_ptr<BatchState> submit(std::span<const Request> requests, std::span<Status> states,
                                     bool close_flush = false);
  void build(BatchState& state, const Request& r, std::size_t k, std::uint32_t count, StreamFence* fence,
             std::vector<Command*>& staged, std::uint32_t& host_commands);
  void prepare_sqe(Command& c);
  void submit_locked();

  // --- completion.hpp ---------------------------------------------------------------------------
  void reap();
  static std::string describe(const Command& c);
  static void fail(Command& c, Status status);
  void complete(Command& c, int res, std::vector<Command*>& resubmit, Retired& retired);
  void chunk_transferred(Command& c, Retired& retired);
  void finish(Command& c, Retired& retired);
  static std::size_t report(BatchState& b, std::span<RequestCompletion> completions);
  Status progress(BatchState& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL);
  bool drain(std::uint64_t timeout_ns);

  // --- staging_pipeline.hpp (every caller guards these with if constexpr (kStagesDeviceMemory)) --
  Status ensure_staging(int device);
  Result<StreamFence*> fence_for(const Request& r, BatchState& state);
  void queue_for_staging(const std::vector<Command*>& staged);
  bool staged_chunk_transferred(Command& c, Retired& retired);
  bool pump_staging();
  void add_device_region(const RegisteredMemory& memory);
  void remove_device_region(const RegisteredMemory& memory);
  std::size_t set_stream_at(const void* address, accel::StreamRef stream);

  Options options;
  Status init_status;

  // The staging ring and its queues (staging_mutex); declared before the ring so they outlive it.
  std::mutex staging_mutex;
  std::unique_ptr<StagingRing> staging;
  std::deque<Command*> staging_queue;
  std::vector<Command*> copying;
  std::mutex device_regions_mutex;  // DEVICE registrations by start address (set_completion_stream)
  std::unordered_multimap<const void*, std::shared_ptr<CompletionStream>> device_regions;

  Ring ring;
  RegisteredTables tables;
  Counters counters;

  std::mutex submission_mutex;        // the SQ: get_sqe .. io_uring_submit, and orphan_failures
  std::timed_mutex completion_mutex;  // the CQ and every BatchState's completion fields
  std::atomic<std::uint32_t> waiting_reapers{0};
  std::atomic<std::uint32_t> in_flight_commands{0};
  std::atomic<bool> submit_pending{false};  // io_uring_submit failed; progress retries it
  std::atomic<bool> has_orphans{false};     // orphan_failures is not empty
  std::vector<Command*> orphan_failures;    // commands that got no SQE (submission mutex)

  std::mutex live_mutex;  // batches with commands in flight (kept alive for user_data)
  std::unordered_map<BatchState*, std::shared_ptr<BatchState>> live;
};

}  // namespace detail
}  // namespace tutti::uring
