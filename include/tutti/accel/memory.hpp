// Accelerator memory: mapped pinned host memory, device memory and synchronous copies between
// host and device memory, vendor-neutral. The profile's implementation lives in
// accel/memory_cuda.hpp (cudaHostAlloc, cudaMalloc, cudaMemcpyAsync) or accel/memory_host.hpp
// (aligned host memory and memcpy), selected like the primitives' shims; callers include only
// this header.
//
//  function                   | host profile                 | CUDA profile
//  ---------------------------+------------------------------+------------------------------------------
//  allocate_mapped_host(n)    | aligned_alloc(4096), zeroed  | cudaHostAlloc(Mapped|Portable), zeroed,
//                             |                              | device pointer == host pointer (UVA)
//  free_mapped_host(p)        | free                         | cudaFreeHost (waits for the device)
//  allocate_device(n)         | aligned_alloc(4096), zeroed  | cudaMalloc, zeroed with cudaMemsetAsync on
//                             |                              | the calling thread's copy stream
//  free_device(p)             | free                         | cudaFree (waits for the device)
//  copy_to_device(d, s, n)    | memcpy                       | cudaMemcpyAsync(cudaMemcpyDefault) on the
//  copy_from_device(d, s, n)  | memcpy                       | calling thread's non-blocking stream +
//                             |                              | cudaStreamSynchronize
//
// Why the copies use a per-thread non-blocking stream: the soft controller's worker threads copy
// while a kernel that submits NVMe commands and polls for their completions is running; a copy on
// the legacy default stream would wait for that kernel, which waits for the copy (deadlock).
// cudaStreamNonBlocking streams do not synchronise with the legacy default stream.
//
// Units: bytes. Alignment: every allocation starts on a 4096-byte boundary (kMemoryAlignment) and
// is rounded up to a multiple of 4096 bytes. Errors (Status / Result, never exceptions):
// INVALID_ARGUMENT (a size of 0 or above kMaxAllocationBytes, a null pointer with a non-zero
// size), RESOURCE_EXHAUSTED (out of host or device memory), UNSUPPORTED (no usable device, or
// mapped memory whose device address differs from its host address), DEVICE_ERROR (any other
// vendor error; the message carries the vendor's text, e.g. cudaGetErrorString).
// Thread-safety: every function may be called from any thread concurrently; distinct buffers are
// independent. Freeing memory that a device or another thread still uses is the caller's bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include <tutti/accel/config.hpp>
#include <tutti/core/status.hpp>

#if defined(TUTTI_ACCELERATOR_CUDA)
#include <tutti/accel/memory_cuda.hpp>
#else
#include <tutti/accel/memory_host.hpp>
#endif

namespace tutti::accel {

/// Alignment of every allocation below, bytes (the NVMe memory page size CC.MPS = 0).
inline constexpr std::size_t kMemoryAlignment = 4096;
/// Largest single allocation accepted, bytes (1 TiB): a larger request is a caller's bug
/// (a negative length cast to size_t), reported as INVALID_ARGUMENT instead of attempted.
inline constexpr std::size_t kMaxAllocationBytes = std::size_t{1} << 40;

namespace detail {
inline Status check_allocation(const char* what, std::size_t bytes) {
  if (bytes == 0) return error(StatusCode::INVALID_ARGUMENT, "{}: bytes = 0 must be >= 1", what);
  if (bytes > kMaxAllocationBytes)
    return error(StatusCode::INVALID_ARGUMENT, "{}: bytes = {} exceeds the limit of {} bytes", what, bytes,
                 kMaxAllocationBytes);
  return Status::success();
}
inline std::size_t round_to_alignment(std::size_t bytes) {
  return (bytes + kMemoryAlignment - 1) / kMemoryAlignment * kMemoryAlignment;
}
inline Status check_copy(const char* what, const void* destination, const void* source, std::size_t bytes) {
  if (bytes != 0 && (destination == nullptr || source == nullptr))
    return error(StatusCode::INVALID_ARGUMENT, "{}: destination = {} and source = {} must be non-null for bytes = {}",
                 what, destination, source, bytes);
  return Status::success();
}
}  // namespace detail

/// Allocates `bytes` (1..kMaxAllocationBytes, rounded up to 4096) of zeroed, 4096-byte aligned
/// host memory that host threads and accelerator kernels both access at the returned address
/// (CUDA: pinned, mapped, portable to every device, UVA; host profile: ordinary memory). This is
/// where queues, PRP lists, SGL segments and the soft controller's BAR0 live in accelerator mode.
/// Accesses from both sides are coherent at system scope (use accel::AtomicRef<T, system> and
/// mmio_store32/mmio_load32 for words both sides write or poll).
/// Errors: INVALID_ARGUMENT (bytes), RESOURCE_EXHAUSTED, UNSUPPORTED (no device, or the device
/// address of the mapping differs from the host address: no unified addressing), DEVICE_ERROR.
inline Result<void*> allocate_mapped_host(std::size_t bytes) {
  if (Status checked = detail::check_allocation("allocate_mapped_host", bytes); !checked) return checked;
  return shim::allocate_mapped_host(detail::round_to_alignment(bytes));
}

/// Frees memory of allocate_mapped_host; nullptr is ignored. CUDA: cudaFreeHost, which waits for
/// all work of the device, so never call it while a kernel that only ends after this thread acts
/// (a persistent poller) is running.
inline void free_mapped_host(void* address) noexcept { shim::free_mapped_host(address); }

/// Allocates `bytes` (1..kMaxAllocationBytes, rounded up to 4096) of zeroed accelerator memory,
/// 4096-byte aligned (CUDA: cudaMalloc, zeroed on the calling thread's copy stream; host profile:
/// ordinary host memory standing in for device memory). Host code must not dereference it;
/// move data with copy_to_device / copy_from_device.
/// Errors: INVALID_ARGUMENT (bytes), RESOURCE_EXHAUSTED, UNSUPPORTED (no device), DEVICE_ERROR.
inline Result<void*> allocate_device(std::size_t bytes) {
  if (Status checked = detail::check_allocation("allocate_device", bytes); !checked) return checked;
  return shim::allocate_device(detail::round_to_alignment(bytes));
}

/// Frees memory of allocate_device; nullptr is ignored. CUDA: cudaFree (waits for the device).
inline void free_device(void* address) noexcept { shim::free_device(address); }

/// Copies `bytes` from host memory (pageable or mapped) to accelerator memory and returns when
/// the bytes have landed. bytes == 0 does nothing. No alignment required. CUDA: cudaMemcpyAsync
/// (cudaMemcpyDefault) on the calling thread's own non-blocking stream, then
/// cudaStreamSynchronize on it, so it neither waits for nor is waited on by kernels on other
/// streams. Errors: INVALID_ARGUMENT (a null pointer with bytes > 0), DEVICE_ERROR (the copy
/// failed: the message has the vendor's text; destination contents are then unspecified).
inline Status copy_to_device(void* device_destination, const void* host_source, std::size_t bytes) {
  if (Status checked = detail::check_copy("copy_to_device", device_destination, host_source, bytes); !checked)
    return checked;
  if (bytes == 0) return Status::success();
  return shim::copy_to_device(device_destination, host_source, bytes);
}

/// Copies `bytes` from accelerator memory to host memory and returns when they have landed;
/// as copy_to_device in the other direction (same stream rule, same errors).
inline Status copy_from_device(void* host_destination, const void* device_source, std::size_t bytes) {
  if (Status checked = detail::check_copy("copy_from_device", host_destination, device_source, bytes); !checked)
    return checked;
  if (bytes == 0) return Status::success();
  return shim::copy_from_device(host_destination, device_source, bytes);
}

/// Owner of one allocate_mapped_host allocation: movable, not copyable; frees on destruction.
/// Thread-safety: as a plain value (one object is not synchronised).
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  /// Allocates; errors as allocate_mapped_host.
  static Result<MappedHostBuffer> allocate(std::size_t bytes) {
    auto memory = allocate_mapped_host(bytes);
    if (!memory) return memory.status();
    return MappedHostBuffer(*memory, detail::round_to_alignment(bytes));
  }
  MappedHostBuffer(MappedHostBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedHostBuffer& operator=(MappedHostBuffer&& other) noexcept {
    if (this != &other) {
      free_mapped_host(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
  ~MappedHostBuffer() { free_mapped_host(data_); }

  /// Start of the memory (host and device address), 4096-byte aligned; nullptr when empty.
  void* data() const noexcept { return data_; }
  /// Bytes owned (the request rounded up to 4096); 0 when empty.
  std::size_t size() const noexcept { return size_; }

 private:
  MappedHostBuffer(void* data, std::size_t size) noexcept : data_(data), size_(size) {}
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Owner of one allocate_device allocation: movable, not copyable; frees on destruction.
/// Thread-safety: as a plain value (one object is not synchronised).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates; errors as allocate_device.
  static Result<DeviceBuffer> allocate(std::size_t bytes) {
    auto memory = allocate_device(bytes);
    if (!memory) return memory.status();
    return DeviceBuffer(*memory, detail::round_to_alignment(bytes));
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      free_device(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { free_device(data_); }

  /// Start of the device memory, 4096-byte aligned; nullptr when empty. Not dereferenceable on
  /// the host in the CUDA profile.
  void* data() const noexcept { return data_; }
  /// Bytes owned (the request rounded up to 4096); 0 when empty.
  std::size_t size() const noexcept { return size_; }

 private:
  DeviceBuffer(void* data, std::size_t size) noexcept : data_(data), size_(size) {}
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tutti::accel
