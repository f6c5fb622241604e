// How the local_nvme DataPath launches its kernels (AdmitKernel, PollKernel: kernels.hpp) and
// bounds its waits for them. Submit kernels are enqueued on Options::stream, poll kernels on their
// batch slot's polling stream (BatchSlot::polling_stream); every wait for one is
// accel::synchronize with kernel_wait_bound_ns.
//
// ONE definition of each launch per program (accel/config.hpp, TUTTI_PROFILE_NAMESPACE), whichever
// compiler builds the caller, chosen by accel::kProfile in launch_over:
//   host profile  accel::launch on the HostThreadPool (inline, header-only);
//   cuda profile  launch_kernel, declared here and defined once in libtutti_cuda
//                 (src/cuda/local_nvme_launch.cu, compiled by nvcc), so host-compiled (.cpp) and
//                 nvcc-compiled (.cu) users of the DataPath in one program launch the same GPU
//                 kernels (as liburing keeps its slow paths in queue.c and its fast paths inline in
//                 liburing.h). The host profile never calls (or defines) launch_kernel.
// Units: ns. Thread-safety: reentrant (the stream orders the work).
#pragma once

#include <algorithm>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <tutti/accel/config.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/options.hpp>
#include <tutti/path/local_nvme/persistent_poll_kernel.hpp>

namespace tutti::local_nvme {
inline namespace TUTTI_PROFILE_NAMESPACE {

/// cuda profile: one launch of the submit kernel (AdmitKernel) or the progress kernel (PollKernel)
/// over config.blocks x config.threads_per_block logical threads, on config.stream, asynchronous
/// (wait with accel::synchronize). Errors: INVALID_ARGUMENT for an empty grid, DEVICE_ERROR when
/// CUDA refuses the launch (with its error text). Defined in libtutti_cuda only.
Status launch_kernel(const accel::LaunchConfig& config, const AdmitKernel& kernel);
Status launch_kernel(const accel::LaunchConfig& config, const PollKernel& kernel);
/// cuda profile: the persistent poller's launch (persistent_poller.hpp), asynchronous, on config.stream.
Status launch_kernel(const accel::LaunchConfig& config, const PersistentPollKernel& kernel);

/// cuda profile: makes the DataPath's first launches run beside kernels already running on the
/// device (a persistent GPU-resident controller, or a serving engine's persistent kernel, would
/// otherwise hold them until it ends). Two things a first launch may wait for, done now:
///  - the module load (accel::preload of both kernels; a lazy load waits for running kernels);
///  - the per-thread stack: both kernels keep a request's planned SQEs on their stack (about
///    4.4 KiB per thread at sm_90, ptxas "stack frame"; CUDA's default cudaLimitStackSize is
///    1 KiB), and CUDA grows the stack at the first launch that needs more, only once the device is
///    idle (cuCtxSetLimit, CU_LIMIT_STACK_SIZE: the size is never reset afterwards). One launch of
///    each kernel with no request, on a private non-blocking stream, waited for at most timeout_ns,
///    grows it here, once per device (the current one, cudaGetDevice) and process: later calls
///    launch nothing.
/// Engine::create calls it (with command_timeout_ns), so create the first DataPath of a device
/// before starting persistent kernels on it: with one already running, CUDA may hold the launch
/// call itself until that kernel ends, which no timeout here can bound. Errors: DEVICE_ERROR with
/// CUDA's text; TIMEOUT when the launches did not finish within timeout_ns (nothing recorded: the
/// next call launches again). Thread-safe. Defined in libtutti_cuda only.
Status preload_kernels(std::uint64_t timeout_ns);

}  // namespace TUTTI_PROFILE_NAMESPACE

/// How long a wait for work just enqueued on a stream of this DataPath may take, ns:
/// command_timeout_ns plus a polling budget (the larger of poll_kernel_budget_ns and
/// submit_poll_budget_ns) for each of `poll_kernels` polling kernels of this DataPath in flight, and
/// persistent_poller_lifetime_ns when the persistent poller is on,
/// the waited one included when it polls. Counted over all its streams, not only the waited one:
/// streams alias onto a few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), so a kernel may queue
/// behind any of them, each polling for up to its whole budget. Saturating.
inline std::uint64_t kernel_wait_bound_ns(const Options& options, std::uint64_t poll_kernels) noexcept {
  const std::uint64_t budget = std::max(options.poll_kernel_budget_ns, options.submit_poll_budget_ns);
  const std::uint64_t limit = ~std::uint64_t{0};
  const std::uint64_t extra = budget == 0 ? 0 : (poll_kernels > limit / budget ? limit : poll_kernels * budget);
  // The persistent poller's kernel may sit ahead of it too, for its whole lifetime.
  const std::uint64_t timeout =
      options.command_timeout_ns + (options.persistent_poller_warps != 0 ? options.persistent_poller_lifetime_ns : 0);
  return extra > limit - timeout ? limit : timeout + extra;
}

/// One launch of `kernel` over `config` (a template, so the host profile never names launch_kernel).
template <class Kernel>
Status launch_grid(const accel::LaunchConfig& config, const Kernel& kernel) {
  if constexpr (accel::kProfile == accel::Profile::cuda) {
    return launch_kernel(config, kernel);  // libtutti_cuda
  } else {
    return accel::launch(config, kernel);  // the host profile's inline launch
  }
}

/// One launch of `kernel` (AdmitKernel / PollKernel: they skip threads at or past n) over n
/// logical threads, Options::threads_per_block per block, on `stream` (a native handle: Options::
/// stream for submit kernels, the batch slot's polling stream for poll kernels and the admissions
/// progress makes, BatchSlot::polling_stream). Errors: the launch's (INVALID_ARGUMENT for an empty
/// grid; DEVICE_ERROR when CUDA refuses it).
template <class Kernel>
Status launch_over(const Options& options, void* stream, std::size_t n, const Kernel& kernel) {
  if (n == 0) return Status::success();
  const std::uint32_t tpb = options.threads_per_block;
  return launch_grid(accel::LaunchConfig{static_cast<std::uint32_t>((n + tpb - 1) / tpb), tpb, stream}, kernel);
}

/// Takes one polling launch off the DataPath's count of polling kernels in flight when its wait is
/// over (counted: whether the launch was counted at all).
struct PollLaunchCount {
  std::atomic<std::uint64_t>& count;
  bool counted = true;
  ~PollLaunchCount() {
    if (counted) count.fetch_sub(1);
  }
};

}  // namespace tutti::local_nvme
