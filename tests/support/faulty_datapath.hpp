// A fault-injecting DataPath for the runtime contract tests. It wraps the memfs DataPath (same
// payload, so it binds with the memfs resolver) and can:
//   - reject the request at a chosen position of every submit (RESOURCE_EXHAUSTED),
//   - fail progress() itself (DEVICE_ERROR: outcome unknown, IO stays in flight),
//   - hold every completion behind a gate until the test opens it (IO stays in flight),
//   - meter completions: pass on one completed request per credit the test releases, so requests
//     complete one at a time, when the test says (release_completions),
//   - fail a request after N bytes (DATA_LOSS with confirmed_bytes = N, as a short transfer),
//   - refuse unregister_memory with BUSY (a device that has not let go of the memory yet),
//   - answer close() with TIMEOUT a number of times (a flush that did not finish in its budget).
// Faults are set through a shared Faults object that tests keep after moving the DataPath into a
// runtime. Thread-safe like memfs::MemfsDataPath.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include <tutti/path/memfs.hpp>
#include <tutti/resolve/memfs.hpp>

#include "require_ok.hpp"

namespace tutti::testing {

struct Faults {
  std::atomic<long> reject_at_position{-1};      ///< Position in each submit's span to reject; -1 none.
  std::atomic<bool> fail_progress{false};        ///< progress() returns DEVICE_ERROR.
  std::atomic<long long> fail_after_bytes{-1};   ///< Requests longer than this fail with DATA_LOSS; -1 none.
  std::atomic<std::uint32_t> device_status{0};   ///< Raw device status reported with injected failures.
  std::atomic<bool> unregister_busy{false};      ///< unregister_memory says the device still uses the memory.
  std::atomic<int> close_timeouts{0};            ///< The next N close() calls return TIMEOUT, target left open.
  std::atomic<int> closes{0};                    ///< close() calls that reached the inner DataPath (released a target).
  std::atomic<bool> metered{false};              ///< progress() passes on one completion per credit (below).
  std::atomic<std::uint64_t> progress_calls{0};  ///< progress() calls so far (every mode, every batch).

  /// Metered mode: lets progress() pass on n more completed requests (it waits for a credit within
  /// its budget when it has a completion to pass on and none is left).
  void release_completions(std::uint32_t n) {
    {
      std::scoped_lock lock(mutex);
      credits += n;
    }
    cv.notify_all();
  }
  bool take_credit(std::uint64_t timeout_ns) {
    std::unique_lock lock(mutex);
    const std::uint64_t budget = std::min<std::uint64_t>(timeout_ns, std::uint64_t{1} << 62);  // no chrono overflow
    if (!cv.wait_for(lock, std::chrono::nanoseconds(budget), [&] { return credits > 0; })) return false;
    --credits;
    return true;
  }

  /// Holds completions back until open_gate(); progress honours its time budget meanwhile.
  void close_gate() {
    std::scoped_lock lock(mutex);
    gate_open = false;
  }
  void open_gate() {
    {
      std::scoped_lock lock(mutex);
      gate_open = true;
    }
    cv.notify_all();
  }
  bool wait_gate(std::uint64_t timeout_ns) {
    std::unique_lock lock(mutex);
    const std::uint64_t budget = std::min<std::uint64_t>(timeout_ns, std::uint64_t{1} << 62);  // no chrono overflow
    return cv.wait_for(lock, std::chrono::nanoseconds(budget), [&] { return gate_open; });
  }

  std::mutex mutex;
  std::condition_variable cv;
  bool gate_open = true;
  std::uint64_t credits = 0;
};

class FaultyDataPath {
 public:
  using inner_type = memfs::MemfsDataPath;
  using target_type = memfs::Target;
  using open_target = inner_type::open_target;
  using registered_memory = inner_type::registered_memory;
  struct batch {
    inner_type::batch inner;
    std::vector<std::size_t> inner_to_outer;  // inner span position -> our span position
    std::vector<std::uint64_t> lengths;       // per inner position
    std::vector<RequestCompletion> scratch;
    std::vector<bool> passed;  // per inner position: copied into the caller's completions
    std::size_t passed_count = 0;
    std::size_t accepted = 0;  // requests the inner DataPath accepted
  };
  static constexpr std::string_view name = "faulty";
  static constexpr Capabilities capabilities = [] {
    Capabilities c = inner_type::capabilities;
    c.offset_alignment = 512;  // so alignment rules are testable
    c.memory_alignment = 8;
    c.max_request_bytes = 1 << 20;
    c.max_batch_requests = 64;
    c.unaligned_tail_at_end_of_target = true;
    return c;
  }();

  explicit FaultyDataPath(std::shared_ptr<Faults> faults, inner_type::Options options = {})
      : faults_(std::move(faults)), inner_(require_ok(inner_type::create(options))) {}

  Result<open_target> open(target_type&& t, const OpenOptions& o) { return inner_.open(std::move(t), o); }
  std::uint64_t size_bytes(const open_target& t) const { return inner_.size_bytes(t); }
  Status close(open_target& t) {
    if (faults_->close_timeouts.load() > 0) {
      faults_->close_timeouts.fetch_sub(1);
      return Status(StatusCode::TIMEOUT, "flush on close did not finish in its budget");
    }
    faults_->closes.fetch_add(1);
    return inner_.close(t);
  }
  Result<registered_memory> register_memory(const MemoryView& v) { return inner_.register_memory(v); }
  Status unregister_memory(registered_memory& m) {
    if (faults_->unregister_busy.load()) return Status(StatusCode::BUSY, "injected: device still uses the memory");
    return inner_.unregister_memory(m);
  }

  batch submit(std::span<const PathRequest<FaultyDataPath>> requests, std::span<Status> states) {
    batch b;
    std::vector<PathRequest<inner_type>> forwarded;
    for (std::size_t k = 0; k < requests.size(); ++k) {
      if (static_cast<long>(k) == faults_->reject_at_position.load()) {
        states[k] = Status(StatusCode::RESOURCE_EXHAUSTED, "injected rejection");
        continue;
      }
      const auto& r = requests[k];
      forwarded.push_back({r.direction, r.memory, r.memory_view, r.memory_offset, r.target, r.target_offset, r.length});
      b.inner_to_outer.push_back(k);
      b.lengths.push_back(r.length);
    }
    std::vector<Status> inner_states(forwarded.size());
    b.inner = inner_.submit(forwarded, inner_states);
    for (std::size_t j = 0; j < forwarded.size(); ++j) {
      states[b.inner_to_outer[j]] = inner_states[j];
      b.accepted += inner_states[j].is_ok() ? 1 : 0;
    }
    b.scratch.resize(forwarded.size());
    b.passed.resize(forwarded.size());
    return b;
  }

  Status progress(batch& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                  ProgressUntil until = ProgressUntil::ALL) {
    faults_->progress_calls.fetch_add(1);
    if (faults_->fail_progress.load()) return Status(StatusCode::DEVICE_ERROR, "injected progress failure");
    const std::uint64_t deadline = deadline_after_ns(timeout_ns);
    if (!faults_->wait_gate(timeout_ns)) return Status(StatusCode::NOT_READY, "gate closed");
    const bool metered = faults_->metered.load();
    // Metered: the inner DataPath (a memory copy) finishes everything it can within the budget; what
    // it finished is then passed on one credit at a time.
    Status s = inner_.progress(b.inner, b.scratch, remaining_ns(deadline), metered ? ProgressUntil::ALL : until);
    if (!s.is_ok() && s.code() != StatusCode::NOT_READY) return s;
    std::size_t passed_now = 0;
    for (std::size_t j = 0; j < b.scratch.size(); ++j) {
      if (!b.scratch[j].done || b.passed[j]) continue;
      if (metered) {
        if (until == ProgressUntil::SOME && passed_now > 0) break;  // SOME: one new completion is enough
        if (!faults_->take_credit(remaining_ns(deadline))) break;
      }
      RequestCompletion c = b.scratch[j];
      const long long limit = faults_->fail_after_bytes.load();
      if (limit >= 0 && b.lengths[j] > static_cast<std::uint64_t>(limit)) {
        c.status = Status(StatusCode::DATA_LOSS, "injected failure after " + std::to_string(limit) + " bytes");
        c.confirmed_bytes = static_cast<std::uint64_t>(limit);
        c.device_status = faults_->device_status.load();
      }
      completions[b.inner_to_outer[j]] = c;
      b.passed[j] = true;
      ++b.passed_count;
      ++passed_now;
    }
    return b.passed_count == b.accepted ? Status::success() : Status(StatusCode::NOT_READY, "batch in flight");
  }

 private:
  std::shared_ptr<Faults> faults_;
  inner_type inner_;
};

static_assert(tutti::DataPath<FaultyDataPath>);

using FaultyBackend = Backend<memfs::MemfsResolver, FaultyDataPath>;

}  // namespace tutti::testing
