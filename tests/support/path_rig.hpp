// What the DataPath test rigs share (local_nvme, striped_nvme, the GPU suite's local_nvme rig; the
// soft controller they run on is soft_drive.hpp):
//
//   register_or_fail     DataPath::register_memory, REQUIREd to succeed.
//   PathRig<Path>        the Path of a rig with open_or_fail, map, request and run (the steps above).
//   submit_and_progress  DataPath::submit, then progress() until done or the budget (ns) runs out,
//                        REQUIREd to succeed; returns the per-request states and completions.
//   run_to_completion    StorageRuntime::submit, wait (budget in ns) and release, every step
//                        REQUIREd to succeed; returns the IoResult.
//
// Failures stop the test case (doctest REQUIRE) with the Status's message. Not thread-safe: one
// test thread per rig.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>

namespace tutti::testing {

/// path.register_memory(view), which must succeed.
template <class Path>
typename Path::registered_memory register_or_fail(Path& path, const MemoryView& view) {
  auto m = path.register_memory(view);
  REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
  return std::move(m.value());
}

/// Submits `requests` to `path` and runs progress() for at most `budget_ns`, which must succeed.
/// Returns the initial states and the completions, one each per request, in request order.
template <class Path>
std::pair<std::vector<Status>, std::vector<RequestCompletion>> submit_and_progress(
    Path& path, const std::vector<PathRequest<Path>>& requests, std::uint64_t budget_ns) {
  std::vector<Status> states(requests.size());
  auto b = path.submit(requests, states);
  std::vector<RequestCompletion> completions(requests.size());
  const Status s = path.progress(b, completions, budget_ns);
  REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  return {states, completions};
}

/// The DataPath half of a test rig: the Path (emplaced by the rig's constructor, reset first when a
/// rig derives from this after the controller's owner) and the steps every rig test takes.
/// `Memory` is anything with `MemoryView view() const` (a host buffer, a device buffer).
template <class Path>
struct PathRig {
  /// `budget_ns`: run()'s progress budget when none is given.
  explicit PathRig(std::uint64_t budget_ns) : default_budget_ns(budget_ns) {}

  /// path->open(target), which must succeed.
  typename Path::open_target open_or_fail(typename Path::target_type target) {
    auto o = path->open(std::move(target), {});
    REQUIRE_MESSAGE(o.is_ok(), o.status().to_string());
    return std::move(o.value());
  }
  /// Registers all of `m`, which must succeed.
  template <class Memory>
  typename Path::registered_memory map(const Memory& m) {
    return register_or_fail(*path, m.view());
  }
  /// A request over `m` registered as `r`.
  template <class Memory>
  static PathRequest<Path> request(Direction d, typename Path::registered_memory& r, const Memory& m,
                                   std::uint64_t memory_offset, typename Path::open_target& t, std::uint64_t offset,
                                   std::uint64_t length) {
    return PathRequest<Path>{d, &r, m.view(), memory_offset, &t, offset, length};
  }
  /// submit_and_progress within `budget_ns` (default_budget_ns when omitted).
  std::pair<std::vector<Status>, std::vector<RequestCompletion>> run(const std::vector<PathRequest<Path>>& rs) {
    return submit_and_progress(*path, rs, default_budget_ns);
  }
  std::pair<std::vector<Status>, std::vector<RequestCompletion>> run(const std::vector<PathRequest<Path>>& rs,
                                                                     std::uint64_t budget_ns) {
    return submit_and_progress(*path, rs, budget_ns);
  }

  std::uint64_t default_budget_ns;
  std::optional<Path> path;
};

/// Submits `requests` to the runtime, waits at most `budget_ns` and releases the IO; every request
/// must be accepted and the wait and the release must succeed. Returns the IO's result.
template <class Runtime>
IoResult run_to_completion(Runtime& rt, const std::vector<IoRequest>& requests, std::uint64_t budget_ns) {
  auto outcome = rt.submit(requests);
  for (std::size_t i = 0; i < requests.size(); ++i)
    REQUIRE_MESSAGE(outcome.initial_states[i].is_ok(), outcome.initial_states[i].to_string());
  auto result = rt.wait(outcome.io, budget_ns);
  REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
  IoResult r = result.value();
  REQUIRE(rt.release(outcome.io).is_ok());
  return r;
}

}  // namespace tutti::testing
