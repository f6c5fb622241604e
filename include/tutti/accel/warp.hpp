// Warp-level helpers for the GPU submission path: lane index, ballot, broadcast, warp barrier.
//
// One source for both profiles. CUDA device code: a warp is 32 lanes and every helper maps to one
// PTX instruction or intrinsic (listed per function). Host profile and nvcc's host pass: a "warp"
// is the calling thread alone (warp_lanes() == 1, lane_id() == 0), so warp-collective code written
// with these helpers runs unchanged on host threads.
//
// Contract of every collective here (ballot, broadcast, sync): all 32 lanes of the warp call it
// convergently (full mask 0xffffffff); there is no partial-mask variant. None of them touches
// other warps of the block: there is no __syncthreads anywhere in path/gpu.
//
// Used by nvme/queue.hpp (the warp-parallel reap and doorbell) and path/gpu/ (warp_submit).
#pragma once

#include <cstdint>

#include <tutti/accel/config.hpp>

namespace tutti::accel {

/// Lanes per warp in device code (32 on every NVIDIA GPU since sm_30).
inline constexpr std::uint32_t kDeviceWarpSize = 32;

/// Lanes per warp of this profile's kernels: 32 in the CUDA profile, 1 in the host profile (its
/// kernels are host threads). Host code uses it to lay out work per warp.
inline constexpr std::uint32_t kKernelWarpLanes = kProfile == Profile::cuda ? kDeviceWarpSize : 1;

/// Lanes of the calling warp: 32 in device code, 1 on the host.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t warp_lanes() noexcept {
  std::uint32_t lanes = 1;
  TUTTI_IF_DEVICE((lanes = kDeviceWarpSize;), (lanes = 1;));
  return lanes;
}

/// Index of the calling lane in its warp, 0..warp_lanes()-1. Device: `mov.u32 %0, %laneid;`.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t lane_id() noexcept {
  std::uint32_t lane = 0;
  TUTTI_IF_DEVICE((asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));), (lane = 0;));
  return lane;
}

/// Bit i set when lane i passed `predicate` true. Collective. Device: `vote.sync.ballot.b32`.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t warp_ballot(bool predicate) noexcept {
  std::uint32_t bits = 0;
  TUTTI_IF_DEVICE((bits = __ballot_sync(0xffffffffu, predicate);), (bits = predicate ? 1u : 0u;));
  return bits;
}

/// `value` of lane `source` (0..31), to every lane. Collective. T: a 4- or 8-byte integer.
/// Device: `shfl.sync.idx.b32` (twice for 8 bytes).
template <class T>
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE T warp_broadcast(T value, std::uint32_t source) noexcept {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp_broadcast takes 4- or 8-byte integers");
  T out = value;
  TUTTI_IF_DEVICE((out = __shfl_sync(0xffffffffu, value, static_cast<int>(source));), ((void)source;));
  return out;
}

/// Warp barrier with memory ordering among the warp's lanes (every lane's earlier accesses are
/// visible to the other lanes after it). Collective. Device: `bar.warp.sync 0xffffffff`. Host: no-op.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE void warp_sync() noexcept { TUTTI_IF_DEVICE((__syncwarp();), ()); }

/// Number of set bits. Device: `popc.b32`.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t popcount32(std::uint32_t bits) noexcept {
  std::uint32_t count = 0;
  TUTTI_IF_DEVICE((count = static_cast<std::uint32_t>(__popc(bits));),
                  (count = static_cast<std::uint32_t>(__builtin_popcount(bits));));
  return count;
}

/// Sum of `value` over lanes 0..lane_id() (inclusive prefix sum). Collective. T: a 4-byte integer
/// (counts) or an 8-byte one (byte counts). Device: five `shfl.sync.up` steps (Kogge-Stone; twice each
/// for 8 bytes). Host: `value`.
template <class T>
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE T warp_inclusive_sum(T value) noexcept {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp_inclusive_sum takes 4- or 8-byte integers");
  T sum = value;
  TUTTI_IF_DEVICE(
      (const std::uint32_t lane = lane_id(); for (std::uint32_t offset = 1; offset < kDeviceWarpSize; offset *= 2) {
        const T below = __shfl_up_sync(0xffffffffu, sum, offset);
        if (lane >= offset) sum += below;
      }),
      ());
  return sum;
}

/// Index of the lowest / highest set bit of a non-zero ballot. Device: `brev` + `bfind` / `bfind`.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t lowest_lane(std::uint32_t bits) noexcept {
  std::uint32_t lane = 0;
  TUTTI_IF_DEVICE((lane = static_cast<std::uint32_t>(__ffs(static_cast<int>(bits)) - 1);),
                  (lane = static_cast<std::uint32_t>(__builtin_ctz(bits));));
  return lane;
}
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t highest_lane(std::uint32_t bits) noexcept {
  std::uint32_t lane = 0;
  TUTTI_IF_DEVICE((lane = 31u - static_cast<std::uint32_t>(__clz(static_cast<int>(bits)));),
                  (lane = 31u - static_cast<std::uint32_t>(__builtin_clz(bits));));
  return lane;
}

/// Bits of lanes below `lane` (lane 0: none): the rank of a lane among the set lanes of a ballot
/// is popcount32(ballot & lanes_below(lane)).
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE constexpr std::uint32_t lanes_below(std::uint32_t lane) noexcept {
  return lane >= 32 ? 0xffffffffu : (1u << lane) - 1u;
}

}  // namespace tutti::accel
