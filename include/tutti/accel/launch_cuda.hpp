// launch() for the CUDA profile (nvcc only). Included by accel/primitives.hpp.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <tutti/accel/cuda_shim.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel {

namespace detail {
template <class Kernel>
__global__ void launch_entry(Kernel kernel) {
  kernel(ThreadIndex{blockIdx.x, threadIdx.x, gridDim.x, blockDim.x});
}
}  // namespace detail

/// Enqueues `kernel(ThreadIndex)` as kernel<<<blocks, threads_per_block, 0, stream>>> and returns
/// without waiting (stream order). Kernel: a trivially copyable functor with a __device__
/// operator(). Errors: INVALID_ARGUMENT when blocks or threads_per_block is 0; DEVICE_ERROR with
/// the CUDA error text when the launch is rejected. Thread-safety: as the CUDA runtime.
template <class Kernel>
Status launch(const LaunchConfig& config, const Kernel& kernel) {
  if (config.blocks == 0 || config.threads_per_block == 0)
    return error(StatusCode::INVALID_ARGUMENT, "launch: blocks = {} and threads_per_block = {} must both be >= 1",
                 config.blocks, config.threads_per_block);
  detail::launch_entry<<<config.blocks, config.threads_per_block, 0, static_cast<cudaStream_t>(config.stream)>>>(kernel);
  const cudaError_t result = cudaGetLastError();
  if (result != cudaSuccess)
    return error(StatusCode::DEVICE_ERROR, "launch: {}", cudaGetErrorString(result));
  return Status::success();
}

/// Waits until every launch enqueued on `stream` (a cudaStream_t; nullptr: the legacy default
/// stream) has finished, for at most `timeout_ns` ns: cudaStreamQuery polled with a backoff
/// (never an unbounded cudaStreamSynchronize). Errors: TIMEOUT (work still running: the caller
/// must not free what it uses), DEVICE_ERROR with the CUDA error text (a kernel faulted).
/// Thread-safety: as the CUDA runtime.
inline Status synchronize(void* stream, std::uint64_t timeout_ns) {
  const std::uint64_t deadline = deadline_after(timeout_ns);
  Backoff backoff;
  for (;;) {
    const cudaError_t result = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (result == cudaSuccess) return Status::success();
    if (result != cudaErrorNotReady)
      return error(StatusCode::DEVICE_ERROR, "synchronize: {}", cudaGetErrorString(result));
    if (timer_ns() >= deadline)
      return error(StatusCode::TIMEOUT, "synchronize: the stream's work did not finish within {} ns", timeout_ns);
    backoff.pause();
  }
}

}  // namespace tutti::accel
