// What the uring DataPath keeps per open target, per registered region, per request and per command.
// Part of tutti/path/uring.hpp (include that).
//
// Lifetimes: an OpenTarget and a RegisteredMemory belong to the runtime (the DataPath's open and
// register_memory return them); a BatchState belongs to its batch and, while any of its commands is
// in flight, also to the DataPath's live table (Engine::live), so a late CQE never meets freed memory.
// A Command's address is the SQE's user_data: BatchState::commands is reserved once and never grows.
//
// Thread-safety: the in-flight gauges are atomics; every other field of a BatchState, RequestState and
// Command is guarded by the Engine's completion mutex once the batch is submitted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tutti/accel/stream.hpp>
#include <tutti/bind/file.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/uring/staging.hpp>

namespace tutti::uring {

namespace detail {
struct BatchState;
}  // namespace detail

/// The caller's stream a DEVICE registration is fenced on (set_completion_stream); shared with the
/// DataPath's lookup table, guarded by its own mutex.
struct CompletionStream {
  std::mutex mutex;
  accel::StreamRef stream;
};

/// An open target (UringDataPath::open_target). The payload's descriptors are closed when it is destroyed.
struct OpenTarget {
  file::Target file;
  int registered_file_index = -1;        ///< Slot in the registered file table; -1: plain fd (see fallback).
  std::string registered_file_fallback;  ///< Why the file is not registered (empty when it is).
  bool flush_on_close = false;
  std::unique_ptr<std::atomic<std::uint64_t>> in_flight = std::make_unique<std::atomic<std::uint64_t>>(0);
  /// The FLUSH a close() started and that has not completed (close() returned TIMEOUT); the next
  /// close() keeps waiting for it. It references nothing of this object, so destroying the target
  /// instead leaves the flush to finish in the kernel.
  std::shared_ptr<detail::BatchState> pending_close_flush;
  RequestCompletion close_flush_completion{};
  /// WRITE requests submitted on this target so far (a counter, never decremented).
  std::unique_ptr<std::atomic<std::uint64_t>> writes_submitted = std::make_unique<std::atomic<std::uint64_t>>(0);
  /// writes_submitted when pending_close_flush was submitted: a WRITE submitted after a close()
  /// returned TIMEOUT is not covered by that flush, so the next close() flushes again.
  std::uint64_t close_flush_writes = 0;
};

/// A registration (UringDataPath::registered_memory).
struct RegisteredMemory {
  MemoryView view;
  int fixed_buffer_index = -1;        ///< Slot in the fixed buffer table; -1: plain reads and writes.
  std::string fixed_buffer_fallback;  ///< Why the region is not a fixed buffer (empty when it is).
  std::unique_ptr<std::atomic<std::uint64_t>> in_flight = std::make_unique<std::atomic<std::uint64_t>>(0);
  /// DEVICE memory: the caller's stream staged copies are fenced on (none by default).
  std::shared_ptr<CompletionStream> completion_stream = std::make_shared<CompletionStream>();
};

namespace detail {

/// Where a command is.
enum class Stage : std::uint8_t {
  disk,                 ///< The SQE is in the kernel (or about to be).
  waiting_for_staging,  ///< DEVICE memory: waiting for a free staging buffer.
  copy,                 ///< DEVICE memory: a cudaMemcpyAsync into or out of the staging buffer runs.
  done,
};

/// One accepted request of a batch.
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
  int buffer_index = -1;        // fixed buffer slot, -1 for plain IO
  std::uint32_t alignment = 1;  // O_DIRECT unit of the fd used; 1 when buffered
  std::uint32_t retries = 0;
  std::byte* address = nullptr;         // host memory of the next SQE (staging buffer for DEVICE memory)
  std::uint64_t target_offset = 0;      // file offset of the next SQE
  std::uint64_t remaining = 0;          // bytes this command still has to move
  std::byte* device_address = nullptr;  // DEVICE memory: destination / source of the chunk
  std::uint64_t chunk_bytes = 0;        // DEVICE memory: the chunk's bytes
  std::uint64_t chunk_target_offset = 0;
  int staging_slot = -1;
  StreamFence* fence = nullptr;  // DEVICE memory fenced on a caller's stream (owned by the batch)
};

/// One submit's requests and commands.
struct BatchState {
  std::vector<RequestState> requests;
  std::vector<Command> commands;                     // reserved once: pointers stay valid (SQE user_data)
  std::size_t remaining_requests = 0;                // guarded by the completion mutex
  std::vector<std::uint32_t> finished;               // requests done and not yet reported to progress()
  std::vector<std::shared_ptr<StreamFence>> fences;  // CUDA profile: one per caller's stream
  bool close_flush = false;                          // the FLUSH of close(): counts on no target, owns its path
  std::string owned_path;                            // the path in messages when close_flush
};

}  // namespace detail
}  // namespace tutti::uring
