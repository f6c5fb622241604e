// An accelerator stream the caller owns, carried above accel/ without vendor types.
//
// Code above accel/ may not include vendor headers, yet some of it must order its work with a
// caller's stream (the uring DataPath fences staged copies on it: docs/uring.md). StreamRef holds
// the stream as an opaque handle; only the CUDA profile can make one from a cudaStream_t and turn it
// back (from_cuda / cuda), and only code that already includes the vendor headers does so.
//
//   profile | what a StreamRef holds                    | has_value()
//   --------+-------------------------------------------+-------------------------------------------
//   host    | nothing (no accelerator streams exist)    | false; from_native_handle makes one that
//           |                                           | every user refuses as UNSUPPORTED
//   cuda    | a cudaStream_t (CUstream_st*), not owned; | true once set; a null handle is the legacy
//           | the caller keeps it alive while in use    | default stream (cudaStreamLegacy semantics)
//
// Thread-safety: a value type; copying is free. The stream itself follows CUDA's rules.
#pragma once

#include <tutti/accel/config.hpp>

#if defined(TUTTI_ACCELERATOR_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace tutti::accel {

/// A caller's accelerator stream, or none. Not owning: destroying the stream while a StreamRef to
/// it is in use (e.g. set on a uring registration with IO in flight) is the caller's bug.
class StreamRef {
 public:
  /// No stream: nothing is ordered with any stream.
  constexpr StreamRef() noexcept = default;

  /// A stream from its vendor handle (a cudaStream_t converted to void*; nullptr is the legacy
  /// default stream). Prefer from_cuda in CUDA code.
  static constexpr StreamRef from_native_handle(void* handle) noexcept { return StreamRef(handle); }

  /// Whether a stream is set.
  constexpr bool has_value() const noexcept { return set_; }
  /// The vendor handle (meaningful only when has_value()).
  constexpr void* native_handle() const noexcept { return handle_; }

#if defined(TUTTI_ACCELERATOR_CUDA)
  /// A CUDA stream (any stream of the current process; 0 is the legacy default stream).
  static StreamRef from_cuda(cudaStream_t stream) noexcept { return StreamRef(static_cast<void*>(stream)); }
  /// The CUDA stream (meaningful only when has_value()).
  cudaStream_t cuda() const noexcept { return static_cast<cudaStream_t>(handle_); }
#endif

  friend constexpr bool operator==(const StreamRef&, const StreamRef&) noexcept = default;

 private:
  constexpr explicit StreamRef(void* handle) noexcept : handle_(handle), set_(true) {}
  void* handle_ = nullptr;
  bool set_ = false;
};

}  // namespace tutti::accel
