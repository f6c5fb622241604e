// Warp-level helpers for the GPU submission path: they live in tutti/accel/warp.hpp (lane
// index, ballot, broadcast, warp barrier, popcount; one-lane warps on the host). This header
// keeps their path::gpu names for the GPU kernels, tests and benchmarks.
#pragma once

#include <tutti/accel/warp.hpp>

namespace tutti::path::gpu {

using accel::kDeviceWarpSize;
using accel::lane_id;
using accel::lanes_below;
using accel::popcount32;
using accel::warp_ballot;
using accel::warp_broadcast;
using accel::warp_lanes;
using accel::warp_sync;

}  // namespace tutti::path::gpu
