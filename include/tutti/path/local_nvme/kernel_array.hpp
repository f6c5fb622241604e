// Arrays the local_nvme kernels read or write outside a batch's device memory (the targets' L2
// extents, the credits of queue pairs the host reaches too), and a batch's pinned staging and report arrays: host
// memory in the host profile, mapped pinned host memory in the CUDA profile
// (accel::kKernelReachable, accel/placement.hpp).
// Thread-safety: as std::vector.
#pragma once

#include <cstddef>
#include <vector>

#include <tutti/accel/placement.hpp>

namespace tutti::local_nvme {

/// A std::vector in kernel-reachable memory. Allocation failure throws std::bad_alloc (callers
/// turn it into RESOURCE_EXHAUSTED).
template <class T>
using KernelArray = std::vector<T, accel::PlacementAllocator<T>>;

/// `n` copies of `value` in kernel-reachable memory.
template <class T>
KernelArray<T> kernel_array(std::size_t n, const T& value = T{}) {
  return KernelArray<T>(n, value, accel::PlacementAllocator<T>(accel::kKernelReachable));
}

}  // namespace tutti::local_nvme
