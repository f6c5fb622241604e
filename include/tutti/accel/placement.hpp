// Where shared state lives, as a standard allocator: ordinary host memory, or mapped pinned host
// memory that host threads, the GPU's kernels and a DMA engine all reach at the same address.
//
//   placement    | host profile                 | CUDA profile
//   -------------+------------------------------+---------------------------------------------
//   host         | std::allocator               | std::allocator (GPU kernels cannot reach it)
//   mapped_host  | accel::allocate_mapped_host  | accel::allocate_mapped_host (cudaHostAlloc,
//                | (aligned host memory)        | mapped + portable: same address on host and GPU)
//
// PlacementAllocator<T> carries the placement at run time, so one container type
// (std::vector<T, PlacementAllocator<T>>) serves both; the queue storage (nvme/queue.hpp) and the
// local_nvme DataPath's request state use it. Allocation failure throws std::bad_alloc (as
// std::allocator does); for mapped_host it is a PlacementAllocationError, a std::bad_alloc that
// carries the allocator's Status (size, CUDA error), so a caller can say why instead of "no
// memory". Callers that must not throw allocate through accel/memory.hpp directly.
// Thread-safety: stateless apart from the placement; any thread may allocate and free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include <tutti/accel/config.hpp>
#include <tutti/accel/memory.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel {

/// Where an allocation lives; see the file comment.
enum class Placement : std::uint8_t {
  host = 0,         ///< ordinary host memory: host threads only (and host-profile kernels)
  mapped_host = 1,  ///< mapped pinned host memory: host threads, GPU kernels, DMA
};

/// The placement whose memory the kernels of this profile reach: host in the host profile (its
/// kernels are host threads), mapped_host in the CUDA profile.
inline constexpr Placement kKernelReachable = kProfile == Profile::cuda ? Placement::mapped_host : Placement::host;

/// What PlacementAllocator<T>::allocate throws when allocate_mapped_host fails: a std::bad_alloc
/// (containers and callers that catch bad_alloc keep working) carrying allocate_mapped_host's
/// Status, whose message names the bytes requested and the vendor's error (e.g. CUDA's). Copying
/// it shares the Status (no allocation, as exceptions require).
class PlacementAllocationError : public std::bad_alloc {
 public:
  explicit PlacementAllocationError(Status status) : status_(std::make_shared<const Status>(std::move(status))) {}
  const char* what() const noexcept override { return "accel::PlacementAllocator: allocate_mapped_host failed"; }
  /// allocate_mapped_host's error.
  const Status& status() const noexcept { return *status_; }

 private:
  std::shared_ptr<const Status> status_;
};

/// The Status of an allocation failure caught as std::bad_alloc: the allocator's own when it is
/// a PlacementAllocationError, else RESOURCE_EXHAUSTED ("out of host memory"), prefixed with
/// `context`.
inline Status allocation_failure(const std::bad_alloc& failure, std::string_view context) {
  if (const auto* placed = dynamic_cast<const PlacementAllocationError*>(&failure); placed != nullptr)
    return placed->status().with_context(context);
  return Status(StatusCode::RESOURCE_EXHAUSTED, std::string(context) + ": out of host memory (std::bad_alloc)");
}

/// A standard allocator (C++20 [allocator.requirements]) over `placement`. Alignment: that of T
/// for host; 4096 bytes (a page) for mapped_host. Two allocators compare equal when their
/// placements do; the placement propagates with the container on copy, move and swap.
template <class T>
struct PlacementAllocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  Placement placement = Placement::host;

  constexpr PlacementAllocator() noexcept = default;
  constexpr explicit PlacementAllocator(Placement p) noexcept : placement(p) {}
  template <class U>
  constexpr PlacementAllocator(const PlacementAllocator<U>& other) noexcept : placement(other.placement) {}

  /// n objects' worth of uninitialised memory. Throws std::bad_alloc when the placement's
  /// allocator fails; for mapped_host a PlacementAllocationError carrying allocate_mapped_host's
  /// Status (INVALID_ARGUMENT for n x sizeof(T) above kMaxAllocationBytes, cudaHostAlloc's error).
  T* allocate(std::size_t n) {
    if (placement == Placement::host) return std::allocator<T>().allocate(n);
    if (n > static_cast<std::size_t>(-1) / sizeof(T))
      throw PlacementAllocationError(error(StatusCode::INVALID_ARGUMENT,
                                           "PlacementAllocator: {} objects of {} bytes overflow size_t", n, sizeof(T)));
    auto memory = allocate_mapped_host(n * sizeof(T) == 0 ? 1 : n * sizeof(T));
    if (!memory.is_ok()) throw PlacementAllocationError(memory.status());
    return static_cast<T*>(memory.value());
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (p == nullptr) return;
    if (placement == Placement::host) {
      std::allocator<T>().deallocate(p, n);
      return;
    }
    (void)free_mapped_host(p);
  }
  template <class U>
  friend constexpr bool operator==(const PlacementAllocator& a, const PlacementAllocator<U>& b) noexcept {
    return a.placement == b.placement;
  }
};

}  // namespace tutti::accel
