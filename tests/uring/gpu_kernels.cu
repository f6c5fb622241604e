// Kernels of the uring GPU suite; see gpu_kernels.hpp.
#include "gpu_kernels.hpp"

namespace tutti::testing::gpu {
namespace {

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));  // PTX ISA: %globaltimer, ns, sm_30+
  return t;
}

__global__ void spin_then_fill_kernel(std::uint8_t* device, std::uint64_t bytes, std::uint8_t value,
                                      std::uint64_t spin_ns) {
  if (threadIdx.x == 0) {
    const std::uint64_t start = global_timer_ns();
    while (global_timer_ns() - start < spin_ns) {
    }
  }
  __syncthreads();
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < bytes;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    device[i] = value;
}

// The same formula as pattern_byte() in uring_test_support.hpp.
__device__ std::uint8_t pattern_byte(std::uint64_t offset, std::uint32_t seed) {
  std::uint64_t x = offset * 0x9E3779B97F4A7C15ull + seed * 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x & 0xff);
}

__global__ void count_kernel(const std::uint8_t* device, std::uint64_t bytes, std::uint64_t file_offset,
                             std::uint32_t seed, unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < bytes;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    local += device[i] != pattern_byte(file_offset + i, seed) ? 1 : 0;
  if (local) atomicAdd(mismatches, local);
}

}  // namespace

cudaError_t spin_then_fill(void* device, std::uint64_t bytes, std::uint8_t value, std::uint64_t spin_ns,
                           cudaStream_t stream) {
  spin_then_fill_kernel<<<128, 256, 0, stream>>>(static_cast<std::uint8_t*>(device), bytes, value, spin_ns);
  return cudaGetLastError();
}

cudaError_t count_pattern_mismatches(const void* device, std::uint64_t bytes, std::uint64_t file_offset,
                                     std::uint32_t seed, unsigned long long* mismatches, cudaStream_t stream) {
  count_kernel<<<256, 256, 0, stream>>>(static_cast<const std::uint8_t*>(device), bytes, file_offset, seed, mismatches);
  return cudaGetLastError();
}

}  // namespace tutti::testing::gpu
