// IO vocabulary: memory views, requests, capabilities, open options, submit outcomes and results.
//
// Units: every offset, length and size is in bytes; every time budget is in nanoseconds.
// Thread-safety: all types here are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <tutti/core/handles.hpp>
#include <tutti/core/status.hpp>

namespace tutti {

/// Where a memory region lives.
enum class MemoryKind : std::uint8_t {
  HOST = 0,         ///< Pageable host memory.
  PINNED_HOST = 1,  ///< Page-locked host memory (cudaHostAlloc / cudaHostRegister or mlock'ed).
  DEVICE = 2,       ///< Accelerator memory (cudaMalloc); `accelerator_id` says which device.
};

constexpr std::string_view to_string(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::HOST: return "HOST";
    case MemoryKind::PINNED_HOST: return "PINNED_HOST";
    case MemoryKind::DEVICE: return "DEVICE";
  }
  return "UNKNOWN_MEMORY_KIND";
}

/// A set of MemoryKinds, as a bit mask (bit i = MemoryKind value i).
struct MemoryKindSet {
  std::uint8_t bits = 0;
  constexpr MemoryKindSet() noexcept = default;
  constexpr MemoryKindSet(std::initializer_list<MemoryKind> kinds) noexcept {
    for (MemoryKind k : kinds) bits = static_cast<std::uint8_t>(bits | (1u << static_cast<unsigned>(k)));
  }
  constexpr bool contains(MemoryKind k) const noexcept {
    return static_cast<unsigned>(k) < 8 && ((bits >> static_cast<unsigned>(k)) & 1u);
  }
};

/// A memory region handed to register_memory. The caller owns the memory and must keep it alive
/// until unregister_memory returns OK. `address` must not be null and `size` must be > 0.
struct MemoryView {
  void* address = nullptr;  ///< First byte of the region (host or device virtual address).
  std::uint64_t size = 0;   ///< Region size in bytes.
  MemoryKind kind = MemoryKind::HOST;
  int accelerator_id = -1;  ///< Device ordinal for DEVICE memory; -1 for host memory.
};

/// What a request does.
enum class Direction : std::uint8_t {
  READ = 0,   ///< Target -> memory.
  WRITE = 1,  ///< Memory -> target.
  FLUSH = 2,  ///< Make completed writes to the target durable (NVMe Flush, fdatasync). No memory, length 0.
};

constexpr std::string_view to_string(Direction d) noexcept {
  switch (d) {
    case Direction::READ: return "READ";
    case Direction::WRITE: return "WRITE";
    case Direction::FLUSH: return "FLUSH";
  }
  return "UNKNOWN_DIRECTION";
}

/// One IO request. READ and WRITE move `length` bytes between memory[memory_offset, +length) and
/// target[target_offset, +length). FLUSH takes only `target` (memory null, offsets and length 0).
struct IoRequest {
  Direction direction = Direction::READ;
  MemoryHandle memory;
  std::uint64_t memory_offset = 0;  ///< Bytes from the start of the registered region.
  TargetHandle target;
  std::uint64_t target_offset = 0;  ///< Bytes from the start of the target.
  std::uint64_t length = 0;         ///< Bytes; > 0 for READ and WRITE.
};

/// How a target is opened.
struct OpenOptions {
  bool writable = false;        ///< Allow WRITE requests (the file is opened read-write).
  bool flush_on_close = false;  ///< close() flushes the target before releasing it.
  bool allow_buffered = false;  ///< Backends that prefer O_DIRECT may fall back to the page cache only when set.
};

/// A DataPath's limits, known at compile time (`static constexpr Capabilities capabilities`), so
/// the runtime's validation folds into constants.
struct Capabilities {
  std::uint64_t offset_alignment = 1;    ///< Bytes; target_offset and length must be multiples.
  std::uint64_t memory_alignment = 1;    ///< Bytes; address + memory_offset must be a multiple.
  std::uint64_t max_request_bytes = 0;   ///< Bytes per request (the DataPath splits into commands below this).
  std::uint32_t max_batch_requests = 0;  ///< Requests per submit call; the excess is rejected RESOURCE_EXHAUSTED.
  MemoryKindSet memory_kinds{};          ///< Memory kinds the DataPath can move data to and from.
  /// Tail rule: a length that is not a multiple of offset_alignment is allowed when the request ends
  /// exactly at the end of the target; the DataPath then transfers the last aligned unit whole, so the
  /// memory must have room for the length rounded up to offset_alignment.
  bool unaligned_tail_at_end_of_target = false;
};

/// The outcome of submit(): one initial state per input request, in input order (partial commit).
/// OK means accepted and covered by `io`; any other code means the request never ran:
/// RESOURCE_EXHAUSTED is backpressure (resubmit it later), other codes are validation errors.
struct SubmitOutcome {
  IoHandle io;                         ///< Null when no request was accepted.
  std::vector<Status> initial_states;  ///< Same size and order as the submitted requests.
  std::size_t accepted = 0;            ///< Number of OK entries in initial_states.
};

/// The completion of one accepted request, filled by the DataPath.
struct RequestCompletion {
  std::size_t request_index = 0;      ///< Index into the submit() input.
  Status status;                      ///< OK, or why the request failed.
  std::uint64_t confirmed_bytes = 0;  ///< Bytes the device confirmed moved (never more than requested).
  std::uint32_t device_status = 0;    ///< Raw device status (NVMe: SCT << 8 | SC, CQE DW3 bits 24:17); 0 if none.
  std::uint32_t commands = 0;         ///< Device commands the request was split into (NVMe commands, SQEs).
  /// Commands sent again after a retryable device status (NVMe: nvme::classify says retry and DNR
  /// is clear; local_nvme sends a command at most 3 times, never past its deadline). Not counted in
  /// `commands`. 0 for DataPaths that never retry.
  std::uint32_t retries = 0;
  bool done = false;  ///< Set once the request completed (successfully or not).
};

/// A snapshot of an IO's progress (query()).
struct IoProgress {
  bool complete = false;     ///< All accepted requests completed.
  std::size_t requests = 0;  ///< Accepted requests covered by the IO handle.
  std::size_t completed_requests = 0;
};

/// The result of a completed IO (wait()).
struct IoResult {
  Status status;                             ///< OK when every accepted request succeeded, else the first failure.
  std::size_t requests = 0;                  ///< Accepted requests covered by the IO handle.
  std::uint64_t requested_bytes = 0;         ///< Sum of the accepted requests' lengths.
  std::uint64_t confirmed_bytes = 0;         ///< Sum of bytes confirmed moved.
  StatusCode failure_kind = StatusCode::OK;  ///< Code of the first failed request.
  std::optional<std::size_t> first_failed_request;  ///< Its index into the submit() input.
  std::vector<std::size_t> failed_requests;         ///< Indices of every failed request, ascending.
  std::uint32_t device_status = 0;                  ///< Raw device status of the first failed request; 0 if none.
  std::uint64_t commands = 0;                       ///< Device commands issued for the whole IO.
  std::vector<RequestCompletion> completions;       ///< One per accepted request, ordered by request_index.
  /// Device commands sent again after a retryable status, over the whole IO (the sum of the
  /// completions' `retries`).
  std::uint64_t retries() const noexcept {
    std::uint64_t sum = 0;
    for (const RequestCompletion& c : completions) sum += c.retries;
    return sum;
  }
};

}  // namespace tutti
