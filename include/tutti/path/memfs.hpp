// The memfs DataPath: executes IO on memfs files (host memory) on a background worker thread.
//
// It is the sample DataPath (docs/extending.md) and the vehicle of the runtime contract tests, so it
// behaves like a real asynchronous device: submit() only queues work, completions arrive later on
// another thread, and a bounded number of requests may be in flight (queue_depth); requests past that
// bound are rejected with RESOURCE_EXHAUSTED (backpressure, never blocking).
//
// Limits: byte-granular offsets and lengths, requests up to 1 GiB, 65536 requests per submit,
// HOST and PINNED_HOST memory. FLUSH completes at once (memory is as durable as it gets).
// Thread-safety: submit and progress may be called concurrently from several threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include <tutti/bind/memfs.hpp>
#include <tutti/core/clock.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>

namespace tutti::memfs {

class MemfsDataPath {
 public:
  struct Options {
    static constexpr std::uint32_t kDefaultQueueDepth = 4096;
    /// Requests in flight at once across all batches (>= 1); beyond it submit rejects with RESOURCE_EXHAUSTED.
    std::uint32_t queue_depth = kDefaultQueueDepth;
  };

  using target_type = Target;
  struct open_target {
    std::shared_ptr<File> file;
    bool writable = false;
  };
  struct registered_memory {};  // host memory needs no mapping

  static constexpr std::string_view name = "memfs";
  static constexpr Capabilities capabilities{
      .offset_alignment = 1,
      .memory_alignment = 1,
      .max_request_bytes = std::uint64_t{1} << 30,
      .max_batch_requests = 65536,
      .memory_kinds = {MemoryKind::HOST, MemoryKind::PINNED_HOST},
      .unaligned_tail_at_end_of_target = false,
  };

 private:
  struct Work {
    Direction direction;
    std::byte* memory;
    std::uint64_t target_offset;
    std::uint64_t length;
    File* file;
    std::size_t position;  // index into the submitted span
  };
  struct BatchState {
    std::vector<Work> work;
    std::mutex mutex;
    std::condition_variable done_cv;
    std::size_t remaining = 0;
    std::vector<std::size_t> finished;  // indices into work completed, not yet reported to progress()
  };
  struct Worker {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::shared_ptr<BatchState>> queue;
    bool stop = false;
    std::atomic<std::uint32_t> in_flight{0};
    std::thread thread;
  };

 public:
  /// One submit's in-flight state.
  struct batch {
    std::shared_ptr<BatchState> state;
  };

  /// Starts the worker thread that executes requests. A queue_depth of 0 is raised to 1.
  /// Errors: RESOURCE_EXHAUSTED when the thread cannot be started. Thread-safety: any thread.
  static Result<MemfsDataPath> create() { return create(Options{}); }
  static Result<MemfsDataPath> create(Options options) {
    try {
      return MemfsDataPath(options);
    } catch (const std::system_error& e) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "memfs DataPath: its worker thread could not be started: {}",
                   e.what());
    }
  }
  MemfsDataPath(MemfsDataPath&&) noexcept = default;
  MemfsDataPath& operator=(MemfsDataPath&&) = delete;  // would drop a running worker thread
  /// Finishes queued work, then joins the worker.
  ~MemfsDataPath() {
    if (!worker_) return;
    {
      std::scoped_lock lock(worker_->mutex);
      worker_->stop = true;
    }
    worker_->cv.notify_all();
    worker_->thread.join();
  }

  Result<open_target> open(Target&& target, const OpenOptions& options) {
    return open_target{std::move(target.file), options.writable};
  }
  std::uint64_t size_bytes(const open_target& t) const noexcept { return t.file->size; }
  Status close(open_target&) { return Status::success(); }
  Result<registered_memory> register_memory(const MemoryView&) { return registered_memory{}; }
  Status unregister_memory(registered_memory&) { return Status::success(); }

  /// Queues the accepted requests; rejects with RESOURCE_EXHAUSTED past queue_depth in flight.
  batch submit(std::span<const PathRequest<MemfsDataPath>> requests, std::span<Status> states) {
    auto state = std::make_shared<BatchState>();
    for (std::size_t k = 0; k < requests.size(); ++k) {
      const auto& r = requests[k];
      std::uint32_t current = worker_->in_flight.load();
      bool reserved = false;
      while (current < options_.queue_depth && !reserved)
        reserved = worker_->in_flight.compare_exchange_weak(current, current + 1);
      if (!reserved) {
        states[k] = error(StatusCode::RESOURCE_EXHAUSTED, "memfs queue is full ({} requests in flight, depth {})",
                          current, options_.queue_depth);
        continue;
      }
      states[k] = Status::success();
      auto* memory = r.memory_view.address ? static_cast<std::byte*>(r.memory_view.address) + r.memory_offset : nullptr;
      state->work.push_back(Work{r.direction, memory, r.target_offset, r.length, r.target->file.get(), k});
    }
    state->remaining = state->work.size();
    if (!state->work.empty()) {
      {
        std::scoped_lock lock(worker_->mutex);
        worker_->queue.push_back(state);
      }
      worker_->cv.notify_one();
    }
    return batch{std::move(state)};
  }

  /// Waits up to timeout_ns for the batch (until = ALL) or for at least one request not reported
  /// before (until = SOME; the worker signals each request as it finishes); OK when all accepted
  /// requests completed, else NOT_READY.
  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL) {
    BatchState& s = *b.state;
    std::unique_lock lock(s.mutex);
    s.done_cv.wait_for(lock, as_duration(timeout_ns),
                       [&] { return s.remaining == 0 || (until == ProgressUntil::SOME && !s.finished.empty()); });
    for (std::size_t j : s.finished) {
      const Work& w = s.work[j];
      RequestCompletion& c = completions[w.position];
      c.status = Status::success();
      c.confirmed_bytes = w.length;
      c.commands = 1;
      c.done = true;
    }
    s.finished.clear();
    return s.remaining == 0 ? Status::success() : Status(StatusCode::NOT_READY, "memfs batch in flight");
  }

 private:
  explicit MemfsDataPath(Options options) : options_(options), worker_(std::make_unique<Worker>()) {
    if (options_.queue_depth == 0) options_.queue_depth = 1;
    worker_->thread = std::thread([w = worker_.get()] { run(*w); });
  }

  static void run(Worker& w) {
    for (;;) {
      std::shared_ptr<BatchState> next;
      {
        std::unique_lock lock(w.mutex);
        w.cv.wait(lock, [&] { return w.stop || !w.queue.empty(); });
        if (w.queue.empty()) return;  // stop requested and nothing left
        next = std::move(w.queue.front());
        w.queue.pop_front();
      }
      for (std::size_t j = 0; j < next->work.size(); ++j) {
        const Work& work = next->work[j];
        if (work.direction == Direction::READ)
          std::memcpy(work.memory, work.file->bytes.get() + work.target_offset, work.length);
        else if (work.direction == Direction::WRITE)
          std::memcpy(work.file->bytes.get() + work.target_offset, work.memory, work.length);
        {
          std::scoped_lock lock(next->mutex);
          next->finished.push_back(j);
          --next->remaining;
        }
        w.in_flight.fetch_sub(1);
        next->done_cv.notify_all();
      }
    }
  }

  Options options_;
  std::unique_ptr<Worker> worker_;
};

static_assert(tutti::DataPath<MemfsDataPath>);

}  // namespace tutti::memfs
