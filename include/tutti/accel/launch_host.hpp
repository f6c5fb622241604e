// accel::launch and accel::synchronize for the host profile: their one definition, inline.
// Included by accel/launch.hpp.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>

#include <tutti/accel/config.hpp>
#include <tutti/accel/host_shim.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel {
inline namespace TUTTI_PROFILE_NAMESPACE {

/// Runs `kernel(ThreadIndex)` once for every logical thread of `config` and returns when all have
/// returned (a launch on the host is synchronous: stream order holds trivially).
/// Execution model: blocks run concurrently on the shared HostThreadPool (the caller takes part);
/// the threads of one block run one after the other in increasing thread index on one host thread.
/// So a kernel must not wait for a later thread of its own block (it would wait until its time
/// budget runs out) and must not use block barriers; warp-cooperative code runs lane by lane.
/// Errors: INVALID_ARGUMENT when blocks or threads_per_block is 0; INTERNAL when the kernel threw
/// (kernels must not throw). Thread-safety: may be called from many threads at once.
template <class Kernel>
Status launch(const LaunchConfig& config, const Kernel& kernel) {
  TUTTI_RETURN_IF_ERROR(detail::check_launch(config));
  const std::function<void(std::uint32_t)> run_block = [&](std::uint32_t block) {
    for (std::uint32_t t = 0; t < config.threads_per_block; ++t)
      kernel(ThreadIndex{block, t, config.blocks, config.threads_per_block});
  };
  try {
    shim::HostThreadPool::instance().run(config.blocks, run_block);
  } catch (const std::exception& e) {
    return error(StatusCode::INTERNAL, "launch: a kernel threw: {}", e.what());
  } catch (...) {
    return error(StatusCode::INTERNAL, "launch: a kernel threw a non-standard exception");
  }
  return Status::success();
}

/// Waits for the work of `stream`: nothing to wait for on the host (launch is synchronous), so
/// always OK. Present so DataPaths wait the same way in both profiles. Thread-safety: trivially safe.
inline Status synchronize(void* /*stream*/, std::uint64_t /*timeout_ns*/) { return Status::success(); }

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::accel
