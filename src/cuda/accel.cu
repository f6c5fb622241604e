// accel::synchronize for the cuda profile: its one definition (declared in accel/launch.hpp).
#include <cstdint>

#include <cuda_runtime.h>

#include <tutti/accel/primitives.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel {
inline namespace TUTTI_PROFILE_NAMESPACE {

Status synchronize(void* stream, std::uint64_t timeout_ns) {
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

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::accel
