// The staging pipeline of the uring DataPath (CUDA profile): DEVICE memory moves through the pinned
// staging ring (staging.hpp), chunk by chunk. Part of tutti/path/uring.hpp (include that).
//
//   READ  chunk: wait for a free buffer -> io_uring READ file->buffer -> cudaMemcpyAsync H2D + event
//                -> event done -> release buffer -> chunk done
//   WRITE chunk: wait for a free buffer -> cudaMemcpyAsync D2H + event -> event done
//                -> io_uring WRITE buffer->file -> release buffer -> chunk done
//
// Chunks beyond the ring wait in a FIFO (staging_queue: accepted requests; the in-flight budget still
// bounds them). The pump runs inside progress() and drain(); copy completions produce no CQE, so with
// copies pending progress() waits in 20 us slices. A copy's buffer is never released under the GPU:
// a buffer whose copy was queued stays taken until the copy's event says it finished, and a buffer
// whose copy cannot be observed is retired by the ring.
//
// Profiles: every step that touches the staging ring or a stream fence holds its body in
// `if constexpr (kStagesDeviceMemory)`, and every caller guards its call the same way, so the host
// profile names the seam's classes only in discarded statements (they are declared there, never defined).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <tutti/path/uring/data_path.hpp>
#include <tutti/path/uring/engine.hpp>

namespace tutti::uring::detail {

/// Allocates the staging ring on the first DEVICE registration, on that region's accelerator.
/// Errors: UNSUPPORTED for a second accelerator; the ring's DEVICE_ERROR.
inline Status Engine::ensure_staging(int device) {
  if constexpr (!kStagesDeviceMemory) {
    (void)device;
    return error(StatusCode::UNSUPPORTED, "the uring DataPath moves DEVICE memory only in the CUDA profile");
  } else {
    std::scoped_lock lock(staging_mutex);
    if (staging) {
      if (staging->device() != device)
        return error(StatusCode::UNSUPPORTED,
                     "the uring DataPath stages through accelerator {}; memory on accelerator {} needs its own "
                     "DataPath",
                     staging->device(), device);
      return Status::success();
    }
    auto created = StagingRing::create(options.staging_buffers, options.staging_buffer_bytes, device);
    if (!created) return created.status().with_context("allocating the uring staging ring");
    staging = std::move(created.value());
    return Status::success();
  }
}

/// The fence of a DEVICE request whose registration is fenced on a caller's stream: one per stream
/// and batch, recorded on that stream now. Null when there is none.
inline Result<StreamFence*> Engine::fence_for(const Request& r, BatchState& state) {
  if constexpr (!kStagesDeviceMemory) {
    (void)r;
    (void)state;
    return static_cast<StreamFence*>(nullptr);
  } else {
    if (r.memory_view.kind != MemoryKind::DEVICE || r.memory == nullptr) return static_cast<StreamFence*>(nullptr);
    accel::StreamRef stream;
    {
      std::scoped_lock lock(r.memory->completion_stream->mutex);
      stream = r.memory->completion_stream->stream;
    }
    if (!stream.has_value()) return static_cast<StreamFence*>(nullptr);
    for (auto& f : state.fences)
      if (f->stream() == stream) return f.get();
    auto created = StreamFence::record(stream);
    if (!created)
      return created.status().with_context(fmt::format("fencing on the caller's stream {}", stream.native_handle()));
    state.fences.push_back(std::move(created.value()));
    return state.fences.back().get();
  }
}

/// Puts a submit's DEVICE chunks at the end of the waiting FIFO.
inline void Engine::queue_for_staging(const std::vector<Command*>& staged) {
  std::scoped_lock lock(staging_mutex);
  for (Command* c : staged) staging_queue.push_back(c);
}

/// A staged chunk's disk transfer finished (completion mutex held). Returns false for host memory
/// (nothing to do here). A READ goes on to its host-to-device copy; a WRITE's buffer is released.
inline bool Engine::staged_chunk_transferred(Command& c, Retired& retired) {
  if constexpr (!kStagesDeviceMemory) {
    (void)c;
    (void)retired;
    return false;
  } else {
    if (c.staging_slot < 0) return false;
    std::scoped_lock lock(staging_mutex);
    if (c.direction == Direction::READ) {
      auto started = staging->copy_to_device(c.staging_slot, c.device_address, c.chunk_bytes, c.fence);
      if (!started.status.is_ok()) fail(c, started.status.with_context(describe(c)));
      if (started.in_flight) {  // the slot stays ours until the copy is seen done, even when it failed
        c.stage = Stage::copy;
        copying.push_back(&c);
        return true;
      }
      if (started.abandoned) {  // queued but unobservable: the ring retired the slot
        c.staging_slot = -1;
        finish(c, retired);
        return true;
      }
    }
    staging->release(c.staging_slot);
    c.staging_slot = -1;
    counters.staged_chunks.fetch_add(1);
    return false;  // the caller finishes the command
  }
}

/// Advances staged commands (completion mutex held): finished copies, then free buffers to waiting
/// chunks. Returns whether staged work remains.
inline bool Engine::pump_staging() {
  if constexpr (!kStagesDeviceMemory) {
    return false;
  } else {
    std::vector<Command*> to_disk;
    Retired retired;
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
        counters.staged_chunks.fetch_add(1);
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
}

/// Records a DEVICE registration by its start address (set_completion_stream(address, stream)).
inline void Engine::add_device_region(const RegisteredMemory& memory) {
  std::scoped_lock lock(device_regions_mutex);
  device_regions.emplace(memory.view.address, memory.completion_stream);
}

inline void Engine::remove_device_region(const RegisteredMemory& memory) {
  std::scoped_lock lock(device_regions_mutex);
  auto [begin, end] = device_regions.equal_range(memory.view.address);
  for (auto it = begin; it != end; ++it)
    if (it->second == memory.completion_stream) {
      device_regions.erase(it);
      break;
    }
}

/// Sets `stream` on every DEVICE registration that starts at `address`; returns how many.
inline std::size_t Engine::set_stream_at(const void* address, accel::StreamRef stream) {
  std::size_t found = 0;
  std::scoped_lock lock(device_regions_mutex);
  auto [begin, end] = device_regions.equal_range(address);
  for (auto it = begin; it != end; ++it) {
    std::scoped_lock slot_lock(it->second->mutex);
    it->second->stream = stream;
    ++found;
  }
  return found;
}

}  // namespace tutti::uring::detail
