// How the local_nvme DataPath launches its kernels (AdmitKernel, PollKernel: kernels.hpp) and
// bounds its waits for them. Every launch is enqueued on Options::stream (accel::launch:
// accel/launch_host.hpp in the host profile, accel/launch_cuda.hpp from code nvcc compiles in the
// CUDA profile); every wait for it is accel::synchronize with kernel_wait_bound_ns.
// Units: ns. Thread-safety: reentrant (the stream orders the work).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/options.hpp>

namespace tutti::local_nvme {

/// How long a wait for work just enqueued on Options::stream may take, ns: command_timeout_ns
/// plus the polling budget of `poll_kernels` poll kernels of this DataPath queued ahead of it
/// (all batches share the stream; each may poll for its whole budget). Saturating.
inline std::uint64_t kernel_wait_bound_ns(const Options& options, std::uint64_t poll_kernels) noexcept {
  const std::uint64_t budget = options.poll_kernel_budget_ns, limit = ~std::uint64_t{0};
  const std::uint64_t extra = budget == 0 ? 0 : (poll_kernels > limit / budget ? limit : poll_kernels * budget);
  const std::uint64_t timeout = options.command_timeout_ns;
  return extra > limit - timeout ? limit : timeout + extra;
}

/// One launch of `kernel` (AdmitKernel / PollKernel: they skip threads at or past n) over n
/// logical threads, Options::threads_per_block per block, on Options::stream. Errors: the
/// launch's (UNSUPPORTED from a host-compiled translation unit of the CUDA profile,
/// DEVICE_ERROR).
template <class Kernel>
Status launch_over(const Options& options, std::size_t n, const Kernel& kernel) {
  if (n == 0) return Status::success();
  const std::uint32_t tpb = options.threads_per_block;
  const accel::LaunchConfig config{static_cast<std::uint32_t>((n + tpb - 1) / tpb), tpb,
                                   options.stream.native_handle()};
  return accel::launch(config, kernel);
}

/// Takes one poll launch off the DataPath's count of poll kernels in flight when its wait is over.
struct PollLaunchCount {
  std::atomic<std::uint64_t>& count;
  ~PollLaunchCount() { count.fetch_sub(1); }
};

}  // namespace tutti::local_nvme
