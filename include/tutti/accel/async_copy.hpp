// Copies between host and accelerator memory ordered on a caller's stream, vendor-neutral.
//
// accel/memory.hpp's copies are synchronous and run on a stream of the calling thread; these are
// enqueued on the stream the caller names (the stream its kernels run on), so a copy, a kernel
// launch and a copy back form one ordered sequence that the caller waits for once
// (accel::synchronize). The local_nvme DataPath stages a batch this way (docs/local-nvme.md).
//
//  function                            | host profile        | CUDA profile
//  ------------------------------------+---------------------+----------------------------------------
//  copy_to_device_async(d, s, n, st)   | memcpy (done on     | cudaMemcpyAsync(cudaMemcpyHostToDevice)
//  copy_from_device_async(d, s, n, st) | return)             | / (DeviceToHost) on stream st
//
// Arguments: `stream` is a cudaStream_t as void* (nullptr: the legacy default stream; ignored in
// the host profile, where kernels launched by accel::launch have finished when it returns).
// Host memory should be pinned (accel::allocate_mapped_host) for the copy to be asynchronous;
// the source must stay unchanged and the destination untouched until the stream reaches the copy
// (accel::synchronize on `stream`). Units: bytes; no alignment required; bytes == 0 does nothing.
// Errors: INVALID_ARGUMENT (a null pointer with bytes > 0), DEVICE_ERROR (the vendor refused to
// enqueue the copy; the message names the function, the size and the vendor's text). A copy that
// fails while running is reported by the stream's next synchronize.
// Thread-safety: any thread; ordering is that of the stream.
#pragma once

#include <cstddef>
#include <cstring>

#include <tutti/accel/config.hpp>
#include <tutti/accel/memory.hpp>
#include <tutti/core/status.hpp>

#if defined(TUTTI_ACCELERATOR_CUDA)
#include <cuda_runtime.h>
#endif

namespace tutti::accel {

/// Enqueues a copy of `bytes` from host memory to accelerator memory on `stream` (see the header).
inline Status copy_to_device_async(void* device_destination, const void* host_source, std::size_t bytes, void* stream) {
  if (Status checked = detail::check_copy("copy_to_device_async", device_destination, host_source, bytes); !checked)
    return checked;
  if (bytes == 0) return Status::success();
#if defined(TUTTI_ACCELERATOR_CUDA)
  if (const cudaError_t result = cudaMemcpyAsync(device_destination, host_source, bytes, cudaMemcpyHostToDevice,
                                                 static_cast<cudaStream_t>(stream));
      result != cudaSuccess)
    return shim::cuda_error(result, "copy_to_device_async: cudaMemcpyAsync(cudaMemcpyHostToDevice)", bytes);
  return Status::success();
#else
  (void)stream;
  return shim::copy_bytes("copy_to_device_async", device_destination, host_source, bytes);
#endif
}

/// Enqueues a copy of `bytes` from accelerator memory to host memory on `stream` (see the header).
inline Status copy_from_device_async(void* host_destination, const void* device_source, std::size_t bytes,
                                     void* stream) {
  if (Status checked = detail::check_copy("copy_from_device_async", host_destination, device_source, bytes); !checked)
    return checked;
  if (bytes == 0) return Status::success();
#if defined(TUTTI_ACCELERATOR_CUDA)
  if (const cudaError_t result = cudaMemcpyAsync(host_destination, device_source, bytes, cudaMemcpyDeviceToHost,
                                                 static_cast<cudaStream_t>(stream));
      result != cudaSuccess)
    return shim::cuda_error(result, "copy_from_device_async: cudaMemcpyAsync(cudaMemcpyDeviceToHost)", bytes);
  return Status::success();
#else
  (void)stream;
  return shim::copy_bytes("copy_from_device_async", host_destination, device_source, bytes);
#endif
}

}  // namespace tutti::accel
