// launch() for translation units of the cuda profile that the host compiler builds (.cpp files).
// Included by accel/primitives.hpp. A kernel can only be launched on the GPU from code nvcc compiles,
// so here launch() refuses instead of silently running the kernel on host threads.
#pragma once

#include <tutti/core/status.hpp>

namespace tutti::accel {

/// Always UNSUPPORTED: in the cuda profile a kernel must be launched from a .cu translation unit
/// (compiled by nvcc). Nothing runs. Thread-safety: trivially safe.
template <class Kernel>
Status launch(const LaunchConfig& config, const Kernel&) {
  return error(StatusCode::UNSUPPORTED,
               "launch of {} x {} threads: in the cuda profile kernels must be launched from code compiled by "
               "nvcc (.cu); this translation unit was compiled by the host compiler",
               config.blocks, config.threads_per_block);
}

/// Nothing was launched from this translation unit, so nothing to wait for: always OK.
inline Status synchronize(void* /*stream*/, std::uint64_t /*timeout_ns*/) { return Status::success(); }

}  // namespace tutti::accel
