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
  return Status::ok();
}

}  // namespace tutti::accel
