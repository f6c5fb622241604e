// Settings of the uring DataPath: tutti::uring::Options, their environment variables and the
// normalisation create() applies. Part of tutti/path/uring.hpp (include that).
//
// Every field has a kDefault... constant, a TUTTI_URING_* environment variable, the getter
// UringDataPath::options() (after normalisation) and a line in docs/uring.md;
// tests/uring/resolver_test.cpp pins the defaults.
//
// Thread-safety: plain values; from_environment() reads the environment (getenv).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include <tutti/core/decimal.hpp>
#include <tutti/core/status.hpp>

namespace tutti::uring {

/// The offset, length and memory alignment every request must have: 4096 bytes, the largest logical
/// block size in common use (4Kn drives), so a request valid here is valid for O_DIRECT on any file
/// system whose alignment divides it. Files that need more are refused at open (UNSUPPORTED).
inline constexpr std::uint64_t kAlignment = 4096;
/// Bytes per request (capabilities.max_request_bytes): 64 MiB, split into commands of
/// Options::max_command_bytes.
inline constexpr std::uint64_t kMaxRequestBytes = std::uint64_t{64} << 20;

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
  static constexpr std::uint64_t kDefaultDrainTimeoutNs = 5'000'000'000;               // 5 s
  static constexpr std::uint64_t kDefaultCloseFlushTimeoutNs = 30'000'000'000;         // 30 s

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
      const std::optional<std::uint64_t> parsed = parse_decimal(value, max);
      if (!parsed) {
        failure =
            error(StatusCode::INVALID_ARGUMENT, "{} = '{}' is not a decimal number in 0..{}", variable, value, max);
        return;
      }
      field = static_cast<std::remove_reference_t<decltype(field)>>(*parsed);
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

namespace detail {

/// The options in force (UringDataPath::options()): queue depth clamped to 1..32768, sizes rounded up
/// to kAlignment, max_command_bytes raised so that a request of kMaxRequestBytes fits queue_depth
/// commands, at least one staging buffer, a wait slice of at least 1 us.
inline Options normalized(Options o) {
  o.queue_depth = std::clamp<std::uint32_t>(o.queue_depth, 1, 32768);
  auto round_up = [](std::uint64_t v) {
    return std::max<std::uint64_t>(kAlignment, (v + kAlignment - 1) / kAlignment * kAlignment);
  };
  o.max_command_bytes = round_up(o.max_command_bytes);
  const std::uint64_t needed = round_up((kMaxRequestBytes + o.queue_depth - 1) / o.queue_depth);
  o.max_command_bytes = std::max(o.max_command_bytes, needed);
  o.staging_buffers = std::max<std::uint32_t>(o.staging_buffers, 1);
  o.staging_buffer_bytes = round_up(o.staging_buffer_bytes);
  o.wait_slice_ns = std::max<std::uint64_t>(o.wait_slice_ns, 1000);
  return o;
}

}  // namespace detail
}  // namespace tutti::uring
