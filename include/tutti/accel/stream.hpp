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
//
// OwnedStream is a stream Tutti makes and destroys itself (the local_nvme DataPath's poll stream of
// each batch slot, Options::poll_stream_per_batch): CUDA profile cudaStreamCreateWithFlags(
// cudaStreamNonBlocking) on the current device, destroyed with the object (CUDA releases it once
// the work queued on it is done); host profile: no stream at all.
#pragma once

#include <utility>

#include <tutti/accel/config.hpp>
#include <tutti/core/status.hpp>

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

// OwnedStream's definition depends on the profile: one per profile in a program that links both
// (accel/config.hpp, TUTTI_PROFILE_NAMESPACE).
inline namespace TUTTI_PROFILE_NAMESPACE {

/// A non-blocking accelerator stream this object owns (see the header), on the device current
/// when create ran. Movable, not copyable. Thread-safety: as a plain value; work on the stream
/// follows CUDA's rules.
class OwnedStream {
 public:
  /// No stream (ref() has no value).
  OwnedStream() noexcept = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  OwnedStream(OwnedStream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  OwnedStream& operator=(OwnedStream&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~OwnedStream() { reset(); }

  /// A new stream on the current device (CUDA profile); the host profile makes none and succeeds.
  /// Errors: DEVICE_ERROR with CUDA's text (e.g. no device).
  static Result<OwnedStream> create() {
    OwnedStream made;
#if defined(TUTTI_ACCELERATOR_CUDA)
    cudaStream_t stream = nullptr;
    if (const cudaError_t result = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); result != cudaSuccess)
      return error(StatusCode::DEVICE_ERROR, "cudaStreamCreateWithFlags(cudaStreamNonBlocking): {}",
                   cudaGetErrorString(result));
    made.handle_ = static_cast<void*>(stream);
#endif
    return Result<OwnedStream>(std::move(made));
  }

  /// Whether a stream is held.
  bool has_value() const noexcept { return handle_ != nullptr; }
  /// The stream as a StreamRef (no value when none is held).
  StreamRef ref() const noexcept { return handle_ != nullptr ? StreamRef::from_native_handle(handle_) : StreamRef{}; }
  /// Whether nothing enqueued on the stream is still pending (one cudaStreamQuery; an error the
  /// query reports counts as not idle). True when none is held.
  bool idle() const noexcept {
#if defined(TUTTI_ACCELERATOR_CUDA)
    if (handle_ != nullptr) return cudaStreamQuery(static_cast<cudaStream_t>(handle_)) == cudaSuccess;
#endif
    return true;
  }

 private:
  void reset() noexcept {
#if defined(TUTTI_ACCELERATOR_CUDA)
    if (handle_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
#endif
    handle_ = nullptr;
  }
  void* handle_ = nullptr;
};

}  // namespace TUTTI_PROFILE_NAMESPACE

}  // namespace tutti::accel
