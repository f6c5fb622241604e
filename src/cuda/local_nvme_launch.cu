// The local_nvme kernels' launches for the cuda profile: their one definition (declared in
// path/local_nvme/launch.hpp), compiled by nvcc, so every user of the DataPath, host-compiled or
// not, launches the same GPU kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <set>

#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/launch.hpp>

namespace tutti::local_nvme {
inline namespace TUTTI_PROFILE_NAMESPACE {

Status launch_kernel(const accel::LaunchConfig& config, const AdmitKernel& kernel) {
  return accel::launch(config, kernel);
}

Status launch_kernel(const accel::LaunchConfig& config, const PollKernel& kernel) {
  return accel::launch(config, kernel);
}

Status launch_kernel(const accel::LaunchConfig& config, const PersistentPollKernel& kernel) {
  return accel::launch(config, kernel);
}

Status preload_kernels(std::uint64_t timeout_ns) {
  TUTTI_RETURN_IF_ERROR(accel::preload<AdmitKernel>());
  TUTTI_RETURN_IF_ERROR(accel::preload<PollKernel>());
  TUTTI_RETURN_IF_ERROR(accel::preload<PersistentPollKernel>());
  // The stack never shrinks, so one growing launch per device and process is enough: later DataPaths
  // (a second engine, every engine of a striped DataPath) launch nothing here, and so cannot be
  // delayed by kernels that fill the device.
  int device = 0;
  if (const cudaError_t got = cudaGetDevice(&device); got != cudaSuccess)
    return error(StatusCode::DEVICE_ERROR, "preload_kernels: cudaGetDevice: {}", cudaGetErrorString(got));
  static std::mutex mutex;
  static std::set<int> grown;  // devices whose stack the launch below already grew
  std::lock_guard lock(mutex);
  if (grown.count(device) != 0) return Status::success();
  // One launch of each with no request (every lane finds no request and touches nothing), on a
  // private stream, so that CUDA grows the per-thread stack to what they need now (see launch.hpp).
  cudaStream_t stream = nullptr;
  if (const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); made != cudaSuccess)
    return error(StatusCode::DEVICE_ERROR, "preload_kernels: cudaStreamCreateWithFlags: {}", cudaGetErrorString(made));
  const accel::LaunchConfig config{1, accel::kKernelWarpLanes, stream};
  Status s = accel::launch(config, AdmitKernel{});
  if (s.is_ok()) s = accel::launch(config, PollKernel{});
  if (s.is_ok()) s = accel::launch(config, PersistentPollKernel{});  // no words: returns at once
  if (s.is_ok()) s = accel::synchronize(stream, timeout_ns);
  (void)cudaStreamDestroy(stream);  // with work still queued, CUDA releases it once that work is done
  if (!s.is_ok())
    return s.with_context(
        "preload_kernels: the first launch of the submit and progress kernels (no request) did not finish: CUDA "
        "grows the per-thread stack they need (above its 1 KiB default) only once the device is idle, so a kernel "
        "running on the device (a persistent one) holds it; create the DataPath before starting such kernels");
  grown.insert(device);
  return Status::success();
}

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::local_nvme
