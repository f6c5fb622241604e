// Completion in the uring DataPath: CQEs are reaped, short transfers resubmitted for the remainder,
// requests completed and reported to progress(), and drain() waits for every command. Part of
// tutti/path/uring.hpp (include that).
//
// Whichever thread holds the completion mutex reaps *all* CQEs and completes other threads' requests
// too, then releases the mutex between wait slices (Options::wait_slice_ns) so concurrent waiters take
// turns. No wait is unbounded: the ring's timed wait and the mutex's try_lock_for both use what
// remains of the caller's budget.
//
// Results (docs/uring.md, "Errors"): a negative CQE result becomes status_from_errno(-res) with the
// errno text; EINTR and EAGAIN are resubmitted up to kMaxRetries times. A read that reaches the end of
// the file early fails OUT_OF_RANGE with the bytes that did arrive; an O_DIRECT write that stops
// mid-unit fails DATA_LOSS (a write of 0 bytes DEVICE_ERROR). A failed request is never reported as
// success.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>
#include <tutti/core/errno.hpp>
#include <tutti/path/uring/data_path.hpp>
#include <tutti/path/uring/engine.hpp>

namespace tutti::uring::detail {

/// Handles every available CQE (completion mutex held); resubmits short transfers.
inline void Engine::reap() {
  std::vector<Command*> resubmit;
  Retired retired;
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
  ring.for_each_cqe([&](void* user_data, int res) {
    if (auto* c = static_cast<Command*>(user_data)) complete(*c, res, resubmit, retired);
  });
  if (!resubmit.empty()) {
    std::scoped_lock lock(submission_mutex);
    for (Command* c : resubmit) prepare_sqe(*c);
    submit_locked();
  }
}

inline std::string Engine::describe(const Command& c) {
  const RequestState& r = c.batch->requests[c.request];
  if (c.direction == Direction::FLUSH) return fmt::format("FLUSH (fdatasync) of '{}'", *r.path);
  return fmt::format("{} of {} bytes at offset {} of '{}'", to_string(c.direction), c.remaining, c.target_offset,
                     *r.path);
}

inline void Engine::fail(Command& c, Status status) {
  RequestState& r = c.batch->requests[c.request];
  if (r.status.is_ok()) r.status = std::move(status);
}

/// One CQE of command c with result res.
inline void Engine::complete(Command& c, int res, std::vector<Command*>& resubmit, Retired& retired) {
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
  counters.short_resubmissions.fetch_add(1);
  resubmit.push_back(&c);
}

/// A command's disk transfer finished: host memory is done; DEVICE reads go on to their H2D copy.
inline void Engine::chunk_transferred(Command& c, Retired& retired) {
  if constexpr (kStagesDeviceMemory) {
    if (staged_chunk_transferred(c, retired)) return;
  }
  finish(c, retired);
}

/// Retires command c: its request completes when it was the last command.
inline void Engine::finish(Command& c, Retired& retired) {
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

/// Copies the finished requests of `b` into completions (completion mutex held); returns how many.
inline std::size_t Engine::report(BatchState& b, std::span<RequestCompletion> completions) {
  const std::size_t reported = b.finished.size();
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
  return reported;
}

inline Status Engine::progress(BatchState& b, std::span<RequestCompletion> completions, std::uint64_t timeout_ns,
                               ProgressUntil until) {
  const std::uint64_t deadline = deadline_after_ns(timeout_ns);
  const auto in_flight = [&] { return Status(StatusCode::NOT_READY, "uring batch in flight"); };
  // Reports what finished; the status to return now, if any. SOME: requests another thread's reaping
  // completed count too (they are new to this caller).
  const auto reported = [&]() -> std::optional<Status> {
    const bool some = report(b, completions) > 0 && until == ProgressUntil::SOME;
    if (b.remaining_requests == 0) return Status::success();
    if (some) return in_flight();
    return std::nullopt;
  };
  for (;;) {
    std::unique_lock lock(completion_mutex, std::defer_lock);
    waiting_reapers.fetch_add(1);
    const bool locked = lock.try_lock_for(as_duration(remaining_ns(deadline)));
    waiting_reapers.fetch_sub(1);
    if (!locked) return Status(StatusCode::NOT_READY, "uring batch in flight (another thread is reaping)");
    bool staged_pending = false;
    reap();
    if constexpr (kStagesDeviceMemory) staged_pending = pump_staging();
    if (auto now_status = reported()) return *now_status;
    const std::uint64_t now = monotonic_ns();
    if (now >= deadline) return in_flight();
    std::uint64_t slice = std::min(deadline - now, options.wait_slice_ns);
    if (staged_pending) slice = std::min<std::uint64_t>(slice, 20'000);  // copies complete without CQEs
    ring.wait_for_cqe(slice);
    reap();
    if (auto now_status = reported()) return *now_status;
    lock.unlock();
    if (waiting_reapers.load() > 0) std::this_thread::yield();  // let another batch's caller reap
  }
}

/// Reaps until no command is in flight or `timeout_ns` passed; true when none is left.
inline bool Engine::drain(std::uint64_t timeout_ns) {
  // Saturating: drain_timeout_ns = UINT64_MAX ("forever", which the environment accepts) must not
  // wrap into a deadline in the past, which would end the drain at once.
  const std::uint64_t deadline = deadline_after_ns(timeout_ns);
  while (in_flight_commands.load() > 0 && monotonic_ns() < deadline) {
    std::unique_lock lock(completion_mutex);
    reap();
    if constexpr (kStagesDeviceMemory) (void)pump_staging();
    ring.wait_for_cqe(std::min<std::uint64_t>(options.wait_slice_ns, remaining_ns(deadline)));
  }
  return in_flight_commands.load() == 0;
}

}  // namespace tutti::uring::detail
