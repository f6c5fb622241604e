// The raw-queue kernel of the GPU suite and the submission-rate benchmark: every warp of the grid
// picks its queue with test::select_queue and runs its commands through the warp submission
// protocol (tests/support/raw_queue_driver.hpp: nvme::warp_submit, nvme::warp_reap), closed loop,
// RawDriverArgs::per_lane commands in flight per lane. blockDim.x: a multiple of 32.
#pragma once

#include <cstdint>

#include <tutti/accel/warp.hpp>

#include "raw_queue_driver.hpp"

namespace tutti::gpu_test {

using test::RawCommandRecord;
using test::RawDriverArgs;

/// One warp per 32 threads; see raw_queue_driver.hpp.
static __global__ void raw_command_kernel(RawDriverArgs args) {
  const std::uint32_t warp = threadIdx.x / accel::kDeviceWarpSize;
  const std::uint32_t warps_per_block = blockDim.x / accel::kDeviceWarpSize;
  const std::uint64_t global_warp = static_cast<std::uint64_t>(blockIdx.x) * warps_per_block + warp;
  test::drive_raw_commands(args, global_warp, test::select_queue(blockIdx.x, gridDim.x, warp, args.queue_count));
}

}  // namespace tutti::gpu_test
