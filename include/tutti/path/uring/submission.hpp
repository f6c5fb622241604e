// Submission in the uring DataPath: a submit's requests become commands (SQEs) of at most
// Options::max_command_bytes, are reserved against the in-flight budget and queued with one
// io_uring_submit. Part of tutti/path/uring.hpp (include that).
//
// A request is accepted only when all its commands fit the budget (queue_depth commands); otherwise
// it is rejected RESOURCE_EXHAUSTED and never ran (backpressure, never blocking). Commands of DEVICE
// memory (CUDA profile) wait for a staging buffer instead of going to the SQ (staging_pipeline.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <fmt/format.h>

#include <tutti/path/uring/data_path.hpp>
#include <tutti/path/uring/engine.hpp>

namespace tutti::uring::detail {

/// Commands a request needs, or an error that rejects it.
inline Result<std::uint32_t> Engine::plan(const Request& r) const {
  if (r.direction == Direction::FLUSH) return 1u;
  if (r.direction == Direction::WRITE && r.target->file.direct && r.length % r.target->file.direct_io_alignment != 0 &&
      !r.target->file.tail_fd.valid())
    return error(StatusCode::INVALID_ARGUMENT,
                 "WRITE of an unaligned tail ({} bytes at offset {}) to '{}' needs the tail descriptor, which "
                 "could not be opened: {}",
                 r.length, r.target_offset, r.target->file.path,
                 r.target->file.tail_fd_error.empty() ? "no cause recorded" : r.target->file.tail_fd_error);
  std::uint64_t unit = options.max_command_bytes;
  if constexpr (kStagesDeviceMemory) {
    if (r.memory_view.kind == MemoryKind::DEVICE) {
      if (!staging) return error(StatusCode::INTERNAL, "DEVICE memory registered without a staging ring");
      unit = staging->buffer_bytes();
    }
  }
  return static_cast<std::uint32_t>((r.length + unit - 1) / unit);
}

/// close_flush: the FLUSH of close(), which counts on no target's in-flight gauge and owns its
/// path, so the target may be destroyed while it is in flight.
inline std::shared_ptr<BatchState> Engine::submit(std::span<const Request> requests, std::span<Status> states,
                                                  bool close_flush) {
  auto state = std::make_shared<BatchState>();
  state->close_flush = close_flush;
  if (!init_status.is_ok()) {
    for (auto& s : states) s = init_status;
    return state;
  }
  std::vector<std::uint32_t> planned(requests.size(), 0);
  std::vector<StreamFence*> fences(requests.size(), nullptr);
  std::size_t total = 0;
  for (std::size_t k = 0; k < requests.size(); ++k) {
    auto p = plan(requests[k]);
    if (!p) {
      states[k] = p.status();
      continue;
    }
    if constexpr (kStagesDeviceMemory) {
      auto f = fence_for(requests[k], *state);
      if (!f) {
        states[k] = f.status();
        continue;
      }
      fences[k] = *f;
    }
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
        counters.rejected_backpressure.fetch_add(1);
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
    counters.submit_calls.fetch_add(1);
    for (Command& c : state->commands)
      if (c.stage == Stage::disk) prepare_sqe(c);
    if (host_commands > 0) submit_locked();
  }
  if constexpr (kStagesDeviceMemory) {
    if (!staged.empty()) queue_for_staging(staged);
  }
  return state;
}

/// Appends request k's state and its commands (submission mutex held).
inline void Engine::build(BatchState& state, const Request& r, std::size_t k, std::uint32_t count, StreamFence* fence,
                          std::vector<Command*>& staged, std::uint32_t& host_commands) {
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

/// Writes the SQE of a command in stage disk (submission mutex held). Never fails: the in-flight
/// budget guarantees a free SQ entry; if the SQ is full anyway the command fails INTERNAL.
inline void Engine::prepare_sqe(Command& c) {
  io_uring_sqe* sqe = ring.get_sqe();
  if (sqe == nullptr) {
    // Cannot happen while in_flight_commands <= queue_depth = SQ entries; fail closed if it does.
    orphan_failures.push_back(&c);
    has_orphans.store(true);
    return;
  }
  counters.commands.fetch_add(1);
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
inline void Engine::submit_locked() {
  counters.io_uring_submits.fetch_add(1);
  const int rc = ring.submit();
  submit_pending.store(rc < 0);
}

}  // namespace tutti::uring::detail
