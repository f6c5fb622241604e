// The definition of accel::launch for the cuda profile, in code nvcc compiles (declared in
// accel/launch.hpp, which includes this file only under nvcc). One body for every .cu file: the
// template's instantiations are identical wherever they are made.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <tutti/accel/cuda_shim.hpp>
#include <tutti/core/status.hpp>

#if !defined(__CUDACC__)
#error "accel/launch_cuda.hpp is for code nvcc compiles; include tutti/accel/primitives.hpp instead"
#endif

namespace tutti::accel {

namespace detail {
/// The kernel entry of accel::launch: one thread runs kernel(ThreadIndex).
template <class Kernel>
__global__ void launch_entry(Kernel kernel) {
  kernel(ThreadIndex{blockIdx.x, threadIdx.x, gridDim.x, blockDim.x});
}
}  // namespace detail

inline namespace TUTTI_PROFILE_NAMESPACE {

/// Loads the GPU code of accel::launch's entry for Kernel now. Under CUDA's lazy module loading (the
/// default since CUDA 12.2, CUDA_MODULE_LOADING=LAZY) the first launch of a kernel loads it, and the
/// load may wait for every kernel running on the device: behind a kernel that runs until another
/// kernel does something (a persistent GPU-resident controller, a persistent poller, NCCL), that first
/// launch stalls until the running kernel ends. Calling this before such kernels start avoids it
/// (CUDA Programming Guide, "Lazy Loading": "Concurrent execution"). Errors: DEVICE_ERROR with CUDA's
/// text. Thread-safe.
template <class Kernel>
Status preload() {
  cudaFuncAttributes attributes{};
  const cudaError_t result = cudaFuncGetAttributes(&attributes, detail::launch_entry<Kernel>);
  if (result != cudaSuccess) return error(StatusCode::DEVICE_ERROR, "preload: {}", cudaGetErrorString(result));
  return Status::success();
}

template <class Kernel>
Status launch(const LaunchConfig& config, const Kernel& kernel) {
  TUTTI_RETURN_IF_ERROR(detail::check_launch(config));
  detail::launch_entry<<<config.blocks, config.threads_per_block, 0, static_cast<cudaStream_t>(config.stream)>>>(
      kernel);
  const cudaError_t result = cudaGetLastError();
  if (result != cudaSuccess) return error(StatusCode::DEVICE_ERROR, "launch: {}", cudaGetErrorString(result));
  return Status::success();
}

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::accel
