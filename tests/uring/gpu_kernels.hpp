// Kernels of the uring GPU suite (gpu_kernels.cu), callable from host-compiled test code.
// All launch on the given stream and return the launch's cudaError_t (cudaGetLastError).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tutti::testing::gpu {

/// Waits `spin_ns` nanoseconds on the GPU (%globaltimer), then sets `bytes` bytes at `device` to
/// `value`: stands for a kernel still using (or producing) a KV region when IO on it is submitted.
cudaError_t spin_then_fill(void* device, std::uint64_t bytes, std::uint8_t value, std::uint64_t spin_ns,
                           cudaStream_t stream);

/// Counts the bytes of [device, device + bytes) that differ from the test pattern of the file region
/// starting at `file_offset` with `seed` (pattern_byte in uring_test_support.hpp) into *mismatches
/// (device memory, zeroed by the caller).
cudaError_t count_pattern_mismatches(const void* device, std::uint64_t bytes, std::uint64_t file_offset,
                                     std::uint32_t seed, unsigned long long* mismatches, cudaStream_t stream);

}  // namespace tutti::testing::gpu
