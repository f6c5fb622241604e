// The accelerator profile and the one macro family for host/device annotations.
//
// Exactly one profile is active per build, chosen by meson (`-Daccelerator=host|cuda`), which
// defines TUTTI_ACCELERATOR_HOST or TUTTI_ACCELERATOR_CUDA on every compile line:
//
//   profile | shim header         | kernels run on        | vendor headers
//   --------+---------------------+-----------------------+-------------------------------
//   host    | accel/host_shim.hpp | a host thread pool    | none (std:: only)
//   cuda    | accel/cuda_shim.hpp | the GPU (nvcc)        | <cuda/atomic>, <cuda_runtime.h>
//
// Annotations (never redefine __device__ and friends; use these):
//   TUTTI_HOST_DEVICE  function callable from host and device code
//   TUTTI_DEVICE       device-only function (host profile: an ordinary host function)
//   TUTTI_HOST         host-only function
//   TUTTI_GLOBAL       kernel entry point (host profile: an ordinary function)
//   TUTTI_FORCEINLINE  always inline (hot path steps)
// In the host profile all of them are empty except TUTTI_FORCEINLINE.
//
// Host/device differences inside one function go through TUTTI_IF_DEVICE(device_code, host_code)
// (one dispatch construct, as CCCL's NV_IF_TARGET), never through #ifdef __CUDA_ARCH__ scattered
// in callers. Everything above accel/ includes only tutti/accel/... headers.
#pragma once

#if defined(TUTTI_ACCELERATOR_HOST) && defined(TUTTI_ACCELERATOR_CUDA)
#error "define exactly one of TUTTI_ACCELERATOR_HOST and TUTTI_ACCELERATOR_CUDA (meson -Daccelerator=...)"
#endif
#if !defined(TUTTI_ACCELERATOR_HOST) && !defined(TUTTI_ACCELERATOR_CUDA)
// A consumer that includes the headers without meson's compile arguments gets the host profile.
#define TUTTI_ACCELERATOR_HOST 1
#endif

// {fmt} 9 disables constexpr under nvcc, which then breaks its own C++20 consteval format-string
// checks (used by tutti/core/status.hpp). Re-enabling it compiles cleanly with nvcc 12/13. The
// CUDA meson profile should also pass -DFMT_USE_CONSTEXPR=1 so include order does not matter.
#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif

#if defined(TUTTI_ACCELERATOR_CUDA) && defined(__CUDACC__)
#define TUTTI_HOST_DEVICE __host__ __device__
#define TUTTI_DEVICE __device__
#define TUTTI_HOST __host__
#define TUTTI_GLOBAL __global__
#define TUTTI_FORCEINLINE __forceinline__
#else
#define TUTTI_HOST_DEVICE
#define TUTTI_DEVICE
#define TUTTI_HOST
#define TUTTI_GLOBAL
#if defined(__GNUC__) || defined(__clang__)
#define TUTTI_FORCEINLINE inline __attribute__((always_inline))
#else
#define TUTTI_FORCEINLINE inline
#endif
#endif

// TUTTI_IF_DEVICE(device_code, host_code): device_code when compiled for the device (nvcc's
// device pass), host_code otherwise. Arguments are statement lists in parentheses.
#define TUTTI_DETAIL_UNPAREN(...) __VA_ARGS__
#if defined(__CUDA_ARCH__)
#define TUTTI_IF_DEVICE(device_code, host_code) \
  do {                                          \
    TUTTI_DETAIL_UNPAREN device_code            \
  } while (0)
#else
#define TUTTI_IF_DEVICE(device_code, host_code) \
  do {                                          \
    TUTTI_DETAIL_UNPAREN host_code              \
  } while (0)
#endif

// TUTTI_PROFILE_NAMESPACE: the inline namespace of the few functions whose definition depends on
// the profile (accel::launch, accel::synchronize, local_nvme::launch_admit / launch_poll), as CUB
// names an inline namespace after its target: their symbols carry the profile (e.g.
// tutti::accel::cuda_profile::synchronize), so objects built for two profiles cannot be linked into
// one program and silently call each other's definitions. Within one profile each of them has ONE
// definition: inline in a header (host profile), or compiled once in libtutti_cuda (cuda profile).
#if defined(TUTTI_ACCELERATOR_CUDA)
#define TUTTI_PROFILE_NAMESPACE cuda_profile
#else
#define TUTTI_PROFILE_NAMESPACE host_profile
#endif

namespace tutti::accel {

/// The profile this translation unit was compiled for.
enum class Profile { host, cuda };

#if defined(TUTTI_ACCELERATOR_CUDA)
inline constexpr Profile kProfile = Profile::cuda;
#else
inline constexpr Profile kProfile = Profile::host;
#endif

}  // namespace tutti::accel
