// The pinned staging ring of the uring DataPath: a bounded set of page-locked host buffers
// (cudaHostAlloc) through which file data reaches DEVICE memory. Part of tutti/path/uring.hpp.
//
// READ into DEVICE memory, per chunk of at most buffer_bytes:
//     acquire a buffer -> io_uring READ file -> buffer -> cudaMemcpyAsync(H2D) + event -> event done ->
//     release the buffer.
// WRITE from DEVICE memory: acquire -> cudaMemcpyAsync(D2H) + event -> event done -> io_uring WRITE
//     buffer -> file -> release.
// While one chunk's copy runs on the ring's stream, other chunks' disk reads run in the kernel, so disk
// reads and host-to-device copies overlap. Staging memory is bounded: buffers x buffer_bytes bytes,
// allocated once when the first DEVICE region is registered. The DataPath's side of the pipeline
// (which chunk waits, which copy is done) is in staging_pipeline.hpp.
//
// Fencing on a caller's stream (StreamFence, DataPath::set_completion_stream): each fenced copy waits
// for an event the submit recorded on the caller's stream, and the caller's stream waits for the
// copy's event.
//
// The profile seam. DEVICE memory, CUDA streams and events exist only in the CUDA profile, and this
// file is the one place in path/ where that shows (it is also the only file in path/ that includes
// <cuda_runtime.h>, a known exception to the accel/ rule). kStagesDeviceMemory says which profile
// this is; the DataPath guards every use of the two classes below with
// `if constexpr (detail::kStagesDeviceMemory)`. In the host profile the classes are declared with
// the same interface and never defined: the host build discards every branch that names them, and a
// use outside such a branch fails to link instead of running a stub.
//
// Thread-safety: not synchronised; the DataPath guards the ring with its staging mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/config.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/core/status.hpp>

#if defined(TUTTI_ACCELERATOR_CUDA)
#include <cuda_runtime.h>
#endif

namespace tutti::uring::detail {

/// Whether this profile moves DEVICE memory through a staging ring (the CUDA profile).
inline constexpr bool kStagesDeviceMemory = accel::kProfile == accel::Profile::cuda;

/// What starting a copy reports. `status` is OK or the CUDA error. `in_flight`: the copy is queued
/// and tracked by the slot's event whatever `status` says (a failed fence on the caller's stream
/// comes after the copy was queued): the caller keeps the slot until copy_done says true, so no
/// other request reuses a buffer a copy still reads or writes. `abandoned`: the copy was queued but
/// its event could not be recorded, so its end cannot be observed: the slot is retired for good
/// (never handed out again) rather than risk reuse under a running copy.
struct CopyStart {
  Status status;
  bool in_flight = false;
  bool abandoned = false;
};

#if defined(TUTTI_ACCELERATOR_CUDA)

/// A Status for a CUDA runtime error: DEVICE_ERROR with the call and cudaGetErrorString's text.
inline Status cuda_status(cudaError_t code, const char* call) {
  if (code == cudaSuccess) return Status::success();
  return error(StatusCode::DEVICE_ERROR, "{} failed: {} ({})", call, cudaGetErrorString(code), cudaGetErrorName(code));
}

/// The caller's side of staged requests that are fenced on a caller's stream (DataPath::
/// set_completion_stream): an event recorded on that stream when the request is submitted. The
/// staging copies wait for it (cudaStreamWaitEvent on the ring's stream), so work the caller queued
/// on its stream before the submit (a kernel still reading the old contents, or producing the data
/// of a WRITE) finishes before a copy touches the device memory; and after each copy the caller's
/// stream waits for the copy's event, so work queued on it afterwards sees the bytes. One fence
/// serves every request of one submit on that stream.
class StreamFence {
 public:
  /// Creates the event and records it on `caller`. Errors: DEVICE_ERROR naming the CUDA call.
  static Result<std::shared_ptr<StreamFence>> record(accel::StreamRef caller) {
    auto fence = std::shared_ptr<StreamFence>(new StreamFence());
    fence->stream_ = caller;
    TUTTI_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&fence->entry_, cudaEventDisableTiming),
                                      "cudaEventCreateWithFlags (stream fence)"));
    TUTTI_RETURN_IF_ERROR(
        cuda_status(cudaEventRecord(fence->entry_, caller.cuda()), "cudaEventRecord on the caller's stream"));
    return Result<std::shared_ptr<StreamFence>>(std::move(fence));
  }
  StreamFence(const StreamFence&) = delete;
  StreamFence& operator=(const StreamFence&) = delete;
  /// cudaEventDestroy; CUDA defers the release while streams still wait on the event.
  ~StreamFence() {
    if (entry_) (void)cudaEventDestroy(entry_);
  }
  /// The caller's stream the fence was recorded on.
  accel::StreamRef stream() const noexcept { return stream_; }
  cudaStream_t caller() const noexcept { return stream_.cuda(); }
  cudaEvent_t entry() const noexcept { return entry_; }

 private:
  StreamFence() = default;
  accel::StreamRef stream_;
  cudaEvent_t entry_ = nullptr;
};

class StagingRing {
 public:
  /// Allocates `buffers` pinned buffers of `buffer_bytes` bytes (4096-aligned; cudaHostAlloc returns
  /// page-aligned memory), one event per buffer and one non-blocking stream, on accelerator `device`.
  /// Errors: DEVICE_ERROR naming the failing CUDA call (no device, out of pinned memory ...).
  static Result<std::unique_ptr<StagingRing>> create(std::uint32_t buffers, std::uint64_t buffer_bytes, int device) {
    auto ring = std::unique_ptr<StagingRing>(new StagingRing());
    ring->device_ = device;
    ring->buffer_bytes_ = buffer_bytes;
    TUTTI_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
    TUTTI_RETURN_IF_ERROR(
        cuda_status(cudaStreamCreateWithFlags(&ring->stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    for (std::uint32_t i = 0; i < buffers; ++i) {
      void* memory = nullptr;
      TUTTI_RETURN_IF_ERROR(cuda_status(cudaHostAlloc(&memory, buffer_bytes, cudaHostAllocPortable), "cudaHostAlloc"));
      ring->buffers_.push_back(static_cast<std::byte*>(memory));
      cudaEvent_t event = nullptr;
      TUTTI_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
      ring->events_.push_back(event);
      ring->free_.push_back(static_cast<int>(i));
    }
    return Result<std::unique_ptr<StagingRing>>(std::move(ring));
  }

  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  /// Waits for the stream (the DataPath only destroys the ring with no copy in flight), then frees.
  ~StagingRing() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    for (std::byte* b : buffers_) (void)cudaFreeHost(b);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  int device() const noexcept { return device_; }
  std::uint64_t buffer_bytes() const noexcept { return buffer_bytes_; }
  std::size_t buffers() const noexcept { return buffers_.size(); }

  /// A free buffer's slot, or -1 when every buffer is in use.
  int acquire() {
    if (free_.empty()) return -1;
    const int slot = free_.back();
    free_.pop_back();
    return slot;
  }
  void release(int slot) { free_.push_back(slot); }
  std::byte* buffer(int slot) const noexcept { return buffers_[static_cast<std::size_t>(slot)]; }

  /// Starts copying `bytes` from the slot's buffer to `device_destination` and records the slot's
  /// event. With a fence: the copy first waits for the fence's entry event, and the caller's stream
  /// then waits for the slot's event (see StreamFence). Note the ring's stream is in order, so a
  /// fenced copy also holds back the copies queued after it.
  CopyStart copy_to_device(int slot, void* device_destination, std::uint64_t bytes,
                           const StreamFence* fence = nullptr) {
    return copy(slot, device_destination, buffer(slot), bytes, cudaMemcpyHostToDevice, fence);
  }
  /// Starts copying `bytes` from `device_source` into the slot's buffer and records the slot's event,
  /// fenced like copy_to_device.
  CopyStart copy_to_host(int slot, const void* device_source, std::uint64_t bytes, const StreamFence* fence = nullptr) {
    return copy(slot, buffer(slot), device_source, bytes, cudaMemcpyDeviceToHost, fence);
  }
  /// Slots retired by an abandoned copy (see CopyStart); the ring has that many fewer buffers.
  std::size_t abandoned_slots() const noexcept { return abandoned_; }
  /// Whether the slot's last copy finished (cudaEventQuery; never blocks): true, false, or the CUDA error.
  Result<bool> copy_done(int slot) const {
    const cudaError_t code = cudaEventQuery(events_[static_cast<std::size_t>(slot)]);
    if (code == cudaSuccess) return true;
    if (code == cudaErrorNotReady) return false;
    return cuda_status(code, "cudaEventQuery");
  }

 private:
  StagingRing() = default;
  CopyStart copy(int slot, void* destination, const void* source, std::uint64_t bytes, cudaMemcpyKind kind,
                 const StreamFence* fence) {
    cudaEvent_t done = events_[static_cast<std::size_t>(slot)];
    // Work the caller queued on its stream before the submit comes first (read-after-write and
    // write-after-read on the device memory).
    if (fence) {
      if (Status s = cuda_status(cudaStreamWaitEvent(stream_, fence->entry(), 0), "cudaStreamWaitEvent (entry fence)");
          !s.is_ok())
        return {std::move(s)};  // nothing queued
    }
    if (Status s = cuda_status(cudaMemcpyAsync(destination, source, bytes, kind, stream_), "cudaMemcpyAsync");
        !s.is_ok())
      return {std::move(s)};  // nothing queued
    if (Status s = cuda_status(cudaEventRecord(done, stream_), "cudaEventRecord"); !s.is_ok()) {
      ++abandoned_;  // the copy is queued but cannot be observed: never reuse this buffer
      return {s.with_context("the copy was queued and may still run; staging buffer retired"), false, true};
    }
    // Work the caller queues on its stream from now on comes after this copy.
    if (fence)
      return {cuda_status(cudaStreamWaitEvent(fence->caller(), done, 0), "cudaStreamWaitEvent (caller's stream)"),
              true};
    return {Status::success(), true};
  }
  int device_ = 0;
  std::uint64_t buffer_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<std::byte*> buffers_;
  std::vector<cudaEvent_t> events_;
  std::vector<int> free_;
  std::size_t abandoned_ = 0;
};

#else  // the host profile: no DEVICE memory, nothing to stage (see the file comment)

class StreamFence {
 public:
  static Result<std::shared_ptr<StreamFence>> record(accel::StreamRef caller);
  accel::StreamRef stream() const noexcept;
};

class StagingRing {
 public:
  static Result<std::unique_ptr<StagingRing>> create(std::uint32_t buffers, std::uint64_t buffer_bytes, int device);
  int device() const noexcept;
  std::uint64_t buffer_bytes() const noexcept;
  int acquire();
  void release(int slot);
  std::byte* buffer(int slot) const noexcept;
  CopyStart copy_to_device(int slot, void* device_destination, std::uint64_t bytes, const StreamFence* fence);
  CopyStart copy_to_host(int slot, const void* device_source, std::uint64_t bytes, const StreamFence* fence);
  Result<bool> copy_done(int slot) const;
};

#endif  // TUTTI_ACCELERATOR_CUDA

}  // namespace tutti::uring::detail
