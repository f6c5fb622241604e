// Statistics of the uring DataPath: the public snapshot (tutti::uring::Stats, read with
// UringDataPath::stats()) and the atomic counters it is taken from. Part of tutti/path/uring.hpp.
//
// Thread-safety: Counters are updated with relaxed-or-stronger atomics from any thread; a snapshot
// is not atomic across fields (each field is a consistent value of its own counter).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace tutti::uring {

/// Counters of one DataPath (monotonic unless noted). Read with DataPath::stats().
struct Stats {
  std::uint64_t submit_calls = 0;                  ///< submit() calls that queued at least one command.
  std::uint64_t io_uring_submits = 0;              ///< io_uring_submit calls (one per submit(), plus resubmissions).
  std::uint64_t commands = 0;                      ///< SQEs prepared, resubmissions included.
  std::uint64_t short_transfer_resubmissions = 0;  ///< SQEs issued for the remainder of a short read or write.
  std::uint64_t rejected_backpressure = 0;         ///< Requests rejected RESOURCE_EXHAUSTED (budget full).
  std::uint64_t fixed_buffer_registrations = 0;    ///< Regions registered as fixed buffers.
  std::uint64_t fixed_buffer_fallbacks = 0;        ///< Regions that use plain reads and writes instead.
  std::uint64_t registered_file_fallbacks = 0;     ///< Targets that use a plain fd instead of a registered file.
  std::uint64_t staged_chunks = 0;                 ///< Chunks moved through the staging ring (CUDA profile).
  std::uint32_t in_flight_commands = 0;            ///< Commands accepted and not completed (a gauge).
  bool sqpoll_active = false;                      ///< The ring runs with IORING_SETUP_SQPOLL.
  bool registered_file_table = false;              ///< The registered file table exists.
  bool fixed_buffer_table = false;                 ///< The sparse fixed buffer table exists.
  std::string fixed_buffer_table_error;            ///< Why the fixed buffer table is missing (empty when present).
};

namespace detail {

/// The monotonic counters behind Stats (the in-flight gauge and the table flags live with what they
/// describe: Engine::in_flight_commands, Ring, RegisteredTables).
struct Counters {
  std::atomic<std::uint64_t> submit_calls{0}, io_uring_submits{0}, commands{0}, short_resubmissions{0},
      rejected_backpressure{0}, fixed_buffer_registrations{0}, fixed_buffer_fallbacks{0}, registered_file_fallbacks{0},
      staged_chunks{0};

  /// Copies the counters into `s` (the other fields are left as they are).
  void copy_to(Stats& s) const {
    s.submit_calls = submit_calls.load();
    s.io_uring_submits = io_uring_submits.load();
    s.commands = commands.load();
    s.short_transfer_resubmissions = short_resubmissions.load();
    s.rejected_backpressure = rejected_backpressure.load();
    s.fixed_buffer_registrations = fixed_buffer_registrations.load();
    s.fixed_buffer_fallbacks = fixed_buffer_fallbacks.load();
    s.registered_file_fallbacks = registered_file_fallbacks.load();
    s.staged_chunks = staged_chunks.load();
  }
};

}  // namespace detail
}  // namespace tutti::uring
