// Honest byte counts for benchmarks that keep several IOs in flight and wait for them oldest first
// (bench/uring/gpu_kv_read.cpp): a pass counts only the bytes an IoResult confirmed, and the first
// wait that fails (TIMEOUT, a progress error) or IO that failed ends the pass with its reason. Bytes
// of IOs still in flight then, or never waited for, are not counted.
// Header-only; needs nothing beyond tutti_dep. Thread-safety: as the runtime's wait and release.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include <tutti/core/handles.hpp>
#include <tutti/core/io.hpp>

namespace tutti::bench {

/// What a pass of ordered waits confirmed.
struct OrderedWaits {
  std::uint64_t confirmed_bytes = 0;  ///< Sum of IoResult::confirmed_bytes (a failed IO's partial bytes included).
  std::uint64_t completed_ios = 0;    ///< IOs that completed with every request OK.
  std::string error;                  ///< Why the pass stopped early; empty when every IO completed OK.
};

/// Waits for the IOs in `in_flight` front to back, each for at most `timeout_ns` ns. After each IO
/// that completed OK it is released and `after_each()` runs (it may push more IOs to the back). Stops
/// at the first failed wait or failed IO: that IO's confirmed bytes are counted, it and every IO
/// behind it stay in `in_flight` (still in flight or unreleased; the runtime's shutdown drains them).
template <class Runtime, class AfterEach>
OrderedWaits wait_in_order(Runtime& runtime, std::deque<IoHandle>& in_flight, std::uint64_t timeout_ns,
                           AfterEach&& after_each) {
  OrderedWaits out;
  while (!in_flight.empty()) {
    auto result = runtime.wait(in_flight.front(), timeout_ns);
    if (!result) {
      out.error = "wait: " + result.status().to_string();
      return out;
    }
    out.confirmed_bytes += result->confirmed_bytes;
    if (!result->status.is_ok()) {
      out.error = "IO failed: " + result->status.to_string();
      return out;
    }
    ++out.completed_ios;
    (void)runtime.release(in_flight.front());
    in_flight.pop_front();
    after_each();
  }
  return out;
}

}  // namespace tutti::bench
