// accel::launch and accel::synchronize: ONE definition of each per program (accel/config.hpp,
// TUTTI_PROFILE_NAMESPACE). Included by accel/primitives.hpp.
//
//   profile | launch<Kernel>                                   | synchronize
//   --------+--------------------------------------------------+------------------------------------
//   host    | inline here (launch_host.hpp): HostThreadPool    | inline here: OK (launches are synchronous)
//   cuda    | a template defined in code nvcc compiles only    | defined once in libtutti_cuda
//           | (launch_cuda.hpp); declared, not defined, in     | (src/cuda/accel.cu): cudaStreamQuery
//           | host-compiled (.cpp) files                       | polled to a deadline
//
// A kernel can only be launched on the GPU from a translation unit nvcc compiles. A host-compiled
// file of the cuda profile that needs a launch calls a function compiled in a .cu file instead (the
// local_nvme DataPath calls local_nvme::launch_admit / launch_poll, compiled once in
// libtutti_cuda); a call to accel::launch<K> from such a file links only against an explicit
// instantiation of launch<K> in some .cu file, and otherwise fails to link (never runs a stub).
#pragma once

#include <cstdint>

#include <tutti/accel/config.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel::detail {
/// The shape check of every accel::launch (one body for all profiles): INVALID_ARGUMENT when
/// blocks or threads_per_block is 0.
inline Status check_launch(const LaunchConfig& config) {
  if (config.blocks == 0 || config.threads_per_block == 0)
    return error(StatusCode::INVALID_ARGUMENT, "launch: blocks = {} and threads_per_block = {} must both be >= 1",
                 config.blocks, config.threads_per_block);
  return Status::success();
}
}  // namespace tutti::accel::detail

#if defined(TUTTI_ACCELERATOR_CUDA)

namespace tutti::accel {
inline namespace TUTTI_PROFILE_NAMESPACE {

/// Enqueues `kernel(ThreadIndex)` as kernel<<<config.blocks, config.threads_per_block, 0,
/// config.stream>>> and returns without waiting (stream order). Kernel: a trivially copyable functor
/// with a __device__ operator(). Errors: INVALID_ARGUMENT when blocks or threads_per_block is 0;
/// DEVICE_ERROR with the CUDA error text when the launch is rejected. Thread-safety: as the CUDA
/// runtime. Defined in launch_cuda.hpp, for code nvcc compiles (see the file comment).
template <class Kernel>
Status launch(const LaunchConfig& config, const Kernel& kernel);

/// Waits until every launch and copy enqueued on `stream` (a cudaStream_t; nullptr: the legacy
/// default stream) has finished, for at most `timeout_ns` ns: cudaStreamQuery polled with a
/// backoff (never an unbounded cudaStreamSynchronize). Errors: TIMEOUT (work still running: the
/// caller must not free what it uses), DEVICE_ERROR with the CUDA error text (a kernel faulted).
/// Thread-safety: as the CUDA runtime. Defined once, in libtutti_cuda (src/cuda/accel.cu).
Status synchronize(void* stream, std::uint64_t timeout_ns);

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::accel

#if defined(__CUDACC__)
#include <tutti/accel/launch_cuda.hpp>
#endif

#else
#include <tutti/accel/launch_host.hpp>
#endif
