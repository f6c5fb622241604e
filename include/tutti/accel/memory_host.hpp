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
  if (memory == nullptr) return error(StatusCode::RESOURCE_EXHAUSTED, "{}: aligned_alloc of {} bytes failed", what, bytes);
  std::memset(memory, 0, bytes);
  return memory;
}

inline Result<void*> allocate_mapped_host(std::size_t bytes) { return allocate_aligned_zeroed("allocate_mapped_host", bytes); }
inline void free_mapped_host(void* address) noexcept { std::free(address); }
inline Result<void*> allocate_device(std::size_t bytes) { return allocate_aligned_zeroed("allocate_device", bytes); }
inline void free_device(void* address) noexcept { std::free(address); }

inline Status copy_to_device(void* device_destination, const void* host_source, std::size_t bytes) {
  std::memcpy(device_destination, host_source, bytes);
  return Status::ok();
}
inline Status copy_from_device(void* host_destination, const void* device_source, std::size_t bytes) {
  std::memcpy(host_destination, device_source, bytes);
  return Status::ok();
}

}  // namespace tutti::accel::shim
