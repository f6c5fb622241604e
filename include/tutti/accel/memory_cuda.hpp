// CUDA profile implementation of accel/memory.hpp (CUDA Runtime API: cudaHostAlloc,
// cudaHostGetDevicePointer, cudaMalloc, cudaMemcpyAsync, cudaStreamCreateWithFlags). Included
// by accel/memory.hpp; do not include it directly. Compiles with nvcc and with the host compiler
// (libnvm is built by g++ in the cuda profile and links cudart). The callers have validated the
// arguments and rounded sizes up to 4096 bytes.
//
// Error mapping: cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED; cudaErrorNoDevice,
// cudaErrorInsufficientDriver and cudaErrorNotSupported -> UNSUPPORTED; anything else ->
// DEVICE_ERROR. Messages name the call, the size and carry cudaGetErrorString's text.
// Thread-safety: every function may be called from any thread; copies use a stream of the
// calling thread (thread_local, created on first use, destroyed when the thread exits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

#include <limits>
#include <mutex>
#include <new>
#include <unordered_map>

#include <tutti/core/status.hpp>

namespace tutti::accel::shim {

/// The Status of a failed CUDA call `what` (see the header comment for the code mapping).
inline Status cuda_error(cudaError_t result, const char* what, std::size_t bytes) {
  StatusCode code = StatusCode::DEVICE_ERROR;
  if (result == cudaErrorMemoryAllocation) code = StatusCode::RESOURCE_EXHAUSTED;
  if (result == cudaErrorNoDevice || result == cudaErrorInsufficientDriver || result == cudaErrorNotSupported)
    code = StatusCode::UNSUPPORTED;
  return error(code, "{} of {} bytes: {} ({})", what, bytes, cudaGetErrorString(result), cudaGetErrorName(result));
}

/// cudaHostAlloc sub-allocates small pinned allocations: after a small one (a few bytes, as a
/// program's own control word), the next allocation may start inside a page even when its size is
/// a multiple of 4096 (the cuda profile's batch pool then failed every submit, each refused as "no
/// memory"). allocate_mapped_host therefore always allocates one page more and hands out the first
/// 4096-aligned address; this table maps such an address back to cudaHostAlloc's pointer for
/// free_mapped_host. It never frees on the allocation path: cudaFreeHost waits for the whole device
/// (every stream), so a free there stalls behind any kernel that runs meanwhile (a persistent
/// kernel: until it ends).
struct MappedHostAllocations {
  std::mutex mutex;
  std::unordered_map<void*, void*> base_of;  ///< aligned address -> cudaHostAlloc's pointer
  static MappedHostAllocations& instance() {
    static MappedHostAllocations* table = new MappedHostAllocations();  // never destroyed: frees may run at exit
    return *table;
  }
};

/// One cudaHostAlloc(Mapped | Portable) of `bytes`, checked to be mapped at the same address on
/// the device (UVA). Returns cudaHostAlloc's pointer (any alignment).
inline Result<void*> host_alloc_mapped(std::size_t bytes) {
  void* host = nullptr;
  if (const cudaError_t result = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
      result != cudaSuccess)
    return cuda_error(result, "allocate_mapped_host: cudaHostAlloc(cudaHostAllocMapped | cudaHostAllocPortable)",
                      bytes);
  void* device = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&device, host, 0);
  if (mapped != cudaSuccess || device != host) {
    cudaFreeHost(host);
    if (mapped != cudaSuccess) return cuda_error(mapped, "allocate_mapped_host: cudaHostGetDevicePointer", bytes);
    return error(
        StatusCode::UNSUPPORTED,
        "allocate_mapped_host: device address {} differs from host address {} (no unified virtual addressing); "
        "kernels and host threads must share one address",
        device, host);
  }
  return host;
}

inline Result<void*> allocate_mapped_host(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  if (bytes > std::numeric_limits<std::size_t>::max() - kPage)
    return error(StatusCode::INVALID_ARGUMENT, "allocate_mapped_host: {} bytes plus one page of alignment overflow",
                 bytes);
  auto padded = host_alloc_mapped(bytes + kPage);  // see MappedHostAllocations
  if (!padded) return padded;
  void* base = padded.value();
  void* host =
      reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(base) + kPage - 1) & ~std::uintptr_t{kPage - 1});
  if (host != base) {
    auto& table = MappedHostAllocations::instance();
    try {
      std::scoped_lock lock(table.mutex);
      table.base_of[host] = base;
    } catch (const std::bad_alloc&) {
      cudaFreeHost(base);  // an error path: waiting for the device is acceptable here
      return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_mapped_host: no host memory to record {} bytes", bytes);
    }
  }
  std::memset(host, 0, bytes);
  return host;
}

inline void free_mapped_host(void* address) noexcept {
  if (address == nullptr) return;
  void* base = address;  // not padded: free as given
  {
    auto& table = MappedHostAllocations::instance();
    std::scoped_lock lock(table.mutex);
    if (auto it = table.base_of.find(address); it != table.base_of.end()) {
      base = it->second;
      table.base_of.erase(it);
    }
  }
  (void)cudaFreeHost(base);
}

/// The calling thread's copy stream (cudaStreamNonBlocking: no implicit synchronisation with the
/// legacy default stream), created on first use.
class ThreadCopyStream {
 public:
  ~ThreadCopyStream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);  // fails harmlessly during CUDA's own teardown
  }
  Result<cudaStream_t> get() {
    if (stream_ == nullptr) {
      if (const cudaError_t result = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
          result != cudaSuccess) {
        stream_ = nullptr;
        return cuda_error(result, "cudaStreamCreateWithFlags(cudaStreamNonBlocking) for copies", 0);
      }
    }
    return stream_;
  }

 private:
  cudaStream_t stream_ = nullptr;
};

/// The calling thread's stream for copies and memsets.
inline Result<cudaStream_t> thread_copy_stream() {
  thread_local ThreadCopyStream thread_stream;
  return thread_stream.get();
}

inline Status copy_synchronous(void* destination, const void* source, std::size_t bytes, const char* what) {
  auto stream = thread_copy_stream();
  if (!stream) return stream.status();
  cudaError_t result = cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, *stream);
  if (result == cudaSuccess) result = cudaStreamSynchronize(*stream);
  if (result != cudaSuccess) return cuda_error(result, what, bytes);
  return Status::success();
}

/// cudaMalloc guarantees 256-byte alignment only (a small earlier allocation makes the next one start
/// 0x200 into a page): allocate_device over-allocates by one page and hands out the first 4096-byte
/// aligned address; this table maps it back to cudaMalloc's pointer for free_device.
struct DeviceAllocations {
  std::mutex mutex;
  std::unordered_map<void*, void*> base_of;  ///< aligned address -> cudaMalloc's pointer
  static DeviceAllocations& instance() {
    static DeviceAllocations* table = new DeviceAllocations();  // never destroyed: frees may run at exit
    return *table;
  }
};

inline Result<void*> allocate_device(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  void* base = nullptr;
  if (const cudaError_t result = cudaMalloc(&base, bytes + kPage); result != cudaSuccess)
    return cuda_error(result, "allocate_device: cudaMalloc", bytes + kPage);
  const std::uintptr_t raw = reinterpret_cast<std::uintptr_t>(base);
  void* device = reinterpret_cast<void*>((raw + kPage - 1) & ~std::uintptr_t{kPage - 1});
  // Zeroed on the calling thread's non-blocking stream: no wait for kernels on other streams.
  auto stream = thread_copy_stream();
  cudaError_t result = stream ? cudaMemsetAsync(device, 0, bytes, *stream) : cudaSuccess;
  if (result == cudaSuccess && stream) result = cudaStreamSynchronize(*stream);
  if (!stream || result != cudaSuccess) {
    cudaFree(base);
    if (!stream) return stream.status();
    return cuda_error(result, "allocate_device: cudaMemsetAsync", bytes);
  }
  auto& table = DeviceAllocations::instance();
  std::scoped_lock lock(table.mutex);
  table.base_of[device] = base;
  return device;
}

inline void free_device(void* address) noexcept {
  if (address == nullptr) return;
  void* base = address;  // not from allocate_device: free as given
  {
    auto& table = DeviceAllocations::instance();
    std::scoped_lock lock(table.mutex);
    if (auto it = table.base_of.find(address); it != table.base_of.end()) {
      base = it->second;
      table.base_of.erase(it);
    }
  }
  (void)cudaFree(base);
}

inline Status copy_to_device(void* device_destination, const void* host_source, std::size_t bytes) {
  return copy_synchronous(device_destination, host_source, bytes, "copy_to_device: cudaMemcpyAsync");
}
inline Status copy_from_device(void* host_destination, const void* device_source, std::size_t bytes) {
  return copy_synchronous(host_destination, device_source, bytes, "copy_from_device: cudaMemcpyAsync");
}

}  // namespace tutti::accel::shim
