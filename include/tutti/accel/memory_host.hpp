// Host profile implementation of accel/memory.hpp: "mapped host" and "device" memory are both
// ordinary 4096-byte aligned, zeroed host memory, and copies are memcpy. Included by
// accel/memory.hpp; do not include it directly. The callers have validated the arguments and
// rounded sizes up to 4096 bytes (accel/memory.hpp). Thread-safety: as malloc and memcpy.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include <tutti/core/status.hpp>

namespace tutti::accel::shim {

/// 4096-byte aligned, zeroed host memory of `bytes` (a multiple of 4096). RESOURCE_EXHAUSTED
/// when aligned_alloc fails.
inline Result<void*> allocate_aligned_zeroed(const char* what, std::size_t bytes) {
  void* memory = std::aligned_alloc(4096, bytes);
  if (memory == nullptr)
    return error(StatusCode::RESOURCE_EXHAUSTED, "{}: aligned_alloc of {} bytes failed", what, bytes);
  std::memset(memory, 0, bytes);
  return memory;
}

inline Result<void*> allocate_mapped_host(std::size_t bytes) {
  return allocate_aligned_zeroed("allocate_mapped_host", bytes);
}
inline void free_mapped_host(void* address) noexcept { std::free(address); }
inline Result<void*> allocate_device(std::size_t bytes) { return allocate_aligned_zeroed("allocate_device", bytes); }
inline void free_device(void* address) noexcept { std::free(address); }

/// memcpy of `bytes` (> 0). The null check repeats accel/memory.hpp's so that memcpy is never
/// reached with a null pointer on any path the compiler can see (-Wnonnull under sanitizers).
inline Status copy_bytes(const char* what, void* destination, const void* source, std::size_t bytes) {
  if (destination == nullptr || source == nullptr)
    return error(StatusCode::INVALID_ARGUMENT, "{}: destination = {} and source = {} must be non-null for bytes = {}",
                 what, destination, source, bytes);
  std::memcpy(destination, source, bytes);
  return Status::success();
}
inline Status copy_to_device(void* device_destination, const void* host_source, std::size_t bytes) {
  return copy_bytes("copy_to_device", device_destination, host_source, bytes);
}
inline Status copy_from_device(void* host_destination, const void* device_source, std::size_t bytes) {
  return copy_bytes("copy_from_device", host_destination, device_source, bytes);
}

}  // namespace tutti::accel::shim
