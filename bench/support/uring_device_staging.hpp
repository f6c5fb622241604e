// uring_device_read_options: how the GPU read benchmarks (bench/uring/gpu_kv_read.cpp,
// bench/gpu/local_nvme_read.cu) size the uring DataPath's pinned staging ring for reads into
// DEVICE memory (O_DIRECT io_uring reads into staging buffers, then cudaMemcpyAsync host-to-device;
// docs/uring.md). One place, so both benchmarks measure the same configuration.
#pragma once

#include <algorithm>
#include <cstdint>

#include <tutti/path/uring.hpp>

namespace tutti::bench {

/// uring::Options for reads of `request_bytes` each (bytes, > 0, a multiple of 4096 for O_DIRECT)
/// into DEVICE memory with `queue_depth` SQ entries:
///  - requests of 256 KiB or more: staging buffers of request_bytes, as many as fit 64 MiB of pinned
///    memory, clamped to 8..256 buffers;
///  - smaller requests: one staging buffer of request_bytes per request, 256 of them (small blocks
///    need many buffers in flight, not large ones).
/// Pure computation: no error, no allocation (the DataPath validates the result when it is built).
/// Thread-safe.
inline uring::Options uring_device_read_options(std::uint64_t request_bytes, std::uint32_t queue_depth) {
  uring::Options options;
  options.queue_depth = queue_depth;
  options.staging_buffer_bytes = std::max<std::uint64_t>(request_bytes, 256 << 10);
  options.staging_buffers =
      static_cast<std::uint32_t>(std::clamp<std::uint64_t>((64u << 20) / options.staging_buffer_bytes, 8, 256));
  if (request_bytes < options.staging_buffer_bytes) {  // small blocks: one buffer per block, many of them
    options.staging_buffer_bytes = request_bytes;
    options.staging_buffers = 256;
  }
  return options;
}

}  // namespace tutti::bench
