// The accelerator primitives: the only API that queue code, DataPaths and kernels use to touch
// memory shared with other threads, GPUs or an NVMe controller.
//
// Contracts (both profiles; the CUDA column gives the PTX the shim emits):
//
//  primitive                      | host profile                 | CUDA profile (device code)
//  -------------------------------+------------------------------+-----------------------------------
//  AtomicRef<T, Scope>            | std::atomic_ref<T>           | cuda::atomic_ref<T, thread_scope_X>
//  fence(scope, order)            | std::atomic_thread_fence     | fence.{sc,acq_rel}.{cta,gpu,sys}
//  fence_system()                 | seq_cst thread fence         | fence.sc.sys
//  mmio_store32(reg, v)           | fence + atomic release store | fence.sc.sys; st.volatile.u32
//  mmio_load32(reg)               | atomic acquire load          | ld.volatile.u32
//  timer_ns()                     | steady_clock, ns             | %globaltimer, ns (~1 us resolution)
//  Backoff::pause()               | pause -> yield -> sleep      | __nanosleep, doubling to a cap
//  launch(grid, kernel)           | HostThreadPool, synchronous  | kernel<<<grid, block, 0, stream>>> (.cu only)
//  synchronize(stream, timeout)   | OK (launch was synchronous)  | cudaStreamQuery polled (libtutti_cuda)
//
// Alignment: an AtomicRef<T> needs T aligned to sizeof(T) (4 or 8 bytes for the queue state).
// Thread-safety: all primitives may be called concurrently from any number of threads.
// Nothing here allocates on the device path or throws.
#pragma once

#include <cstdint>
#include <functional>

#include <tutti/accel/config.hpp>
#include <tutti/accel/scope.hpp>
#include <tutti/core/clock.hpp>

#if defined(TUTTI_ACCELERATOR_CUDA)
#include <tutti/accel/cuda_shim.hpp>
#else
#include <tutti/accel/host_shim.hpp>
#endif

namespace tutti::accel {

/// An atomic view of an object T that lives in memory shared at scope Scope.
/// T: trivially copyable, 4 or 8 bytes for lock-free operation on every target; aligned to its
/// size. Operations take an explicit MemoryOrder; there are no defaults, so every call site says
/// which reordering it prevents.
template <class T, ThreadScope Scope>
using AtomicRef = shim::AtomicRef<T, Scope>;

/// Shorthands for the two scopes queue code uses.
template <class T>
using SystemAtomicRef = AtomicRef<T, ThreadScope::system>;
template <class T>
using DeviceAtomicRef = AtomicRef<T, ThreadScope::device>;

/// A fence of the given scope and order.
TUTTI_HOST_DEVICE inline void fence(ThreadScope scope, MemoryOrder order) noexcept { shim::fence(scope, order); }

/// A sequentially consistent fence at system scope: orders every earlier memory access of this
/// thread before every later one as seen by any agent, including a device doing DMA.
TUTTI_HOST_DEVICE inline void fence_system() noexcept { shim::fence(ThreadScope::system, MemoryOrder::seq_cst); }

/// Writes a 32-bit device register (an NVMe doorbell) at `reg` (4-byte aligned, in a mapped BAR
/// or, for the soft controller, ordinary memory polled by the controller).
/// Ordering: every store this thread made before the call (SQEs, PRP lists), and every store it
/// observed through an acquire, is visible to the device before the register write lands; the
/// system fence here prevents the doorbell from overtaking the SQE it announces.
TUTTI_HOST_DEVICE inline void mmio_store32(volatile std::uint32_t* reg, std::uint32_t value) noexcept {
  fence_system();  // SQE and PRP-list stores before the doorbell (NVMe PCIe Transport 1.0, 3.1.2)
  shim::mmio_store32(reg, value);
}

/// Reads a 32-bit device register (CSTS) at `reg` (4-byte aligned). An all-ones value means the
/// device is gone (surprise removal); callers check for it.
TUTTI_HOST_DEVICE inline std::uint32_t mmio_load32(const volatile std::uint32_t* reg) noexcept {
  return shim::mmio_load32(reg);
}

/// Monotonic time in nanoseconds. Host: monotonic_ns() (core/clock.hpp). CUDA device: %globaltimer,
/// which is not the host clock: compare only values read on the same side.
TUTTI_HOST_DEVICE inline std::uint64_t timer_ns() noexcept { return shim::timer_ns(); }

/// The deadline `budget_ns` from now, saturating instead of wrapping.
TUTTI_HOST_DEVICE inline std::uint64_t deadline_after(std::uint64_t budget_ns) noexcept {
  return saturating_add(timer_ns(), budget_ns);
}

/// Backoff for polling loops, so pollers do not starve their neighbours on small machines.
/// Host: `spin_steps` pause instructions, then `yield_steps` sched_yield calls, then sleeps that
/// double from `first_sleep_ns` to `max_sleep_ns`. CUDA: __nanosleep doubling from
/// `first_sleep_ns` to `max_sleep_ns` (pause and yield steps are spins). reset() after useful work.
/// A Backoff never decides when to stop: callers bound their loops with timer_ns() deadlines.
/// Thread-safety: one Backoff per polling thread.
class Backoff {
 public:
  struct Settings {
    std::uint32_t spin_steps = 64;        ///< pause steps before yielding
    std::uint32_t yield_steps = 64;       ///< yield steps before sleeping
    std::uint32_t first_sleep_ns = 1000;  ///< first sleep, ns
    std::uint32_t max_sleep_ns = 100000;  ///< sleep cap, ns (100 us)
  };
  TUTTI_HOST_DEVICE Backoff() noexcept : Backoff(Settings{}) {}
  TUTTI_HOST_DEVICE explicit Backoff(Settings settings) noexcept : settings_(settings) {}

  /// One backoff step; see the class comment.
  TUTTI_HOST_DEVICE void pause() noexcept {
    if (step_ < settings_.spin_steps) {
      ++step_;
      shim::cpu_pause();
    } else if (step_ < settings_.spin_steps + settings_.yield_steps) {
      ++step_;
      shim::yield_thread();
    } else {
      shim::sleep_ns(sleep_ns_);
      sleep_ns_ = sleep_ns_ * 2 > settings_.max_sleep_ns ? settings_.max_sleep_ns : sleep_ns_ * 2;
    }
  }
  /// Back to the spinning stage.
  TUTTI_HOST_DEVICE void reset() noexcept {
    step_ = 0;
    sleep_ns_ = settings_.first_sleep_ns;
  }
  /// True once the backoff sleeps between steps.
  TUTTI_HOST_DEVICE bool sleeping() const noexcept { return step_ >= settings_.spin_steps + settings_.yield_steps; }

 private:
  Settings settings_;
  std::uint32_t step_ = 0;
  std::uint32_t sleep_ns_ = settings_.first_sleep_ns;
};

/// The index of one logical thread of a launch (1-D grids of 1-D blocks).
struct ThreadIndex {
  std::uint32_t block;      ///< blockIdx.x
  std::uint32_t thread;     ///< threadIdx.x
  std::uint32_t grid_dim;   ///< gridDim.x, blocks
  std::uint32_t block_dim;  ///< blockDim.x, threads per block
  TUTTI_HOST_DEVICE std::uint32_t global() const noexcept { return block * block_dim + thread; }
};

/// Shape of a launch: `blocks` blocks of `threads_per_block` threads (both >= 1).
struct LaunchConfig {
  std::uint32_t blocks = 1;
  std::uint32_t threads_per_block = 1;
  void* stream = nullptr;  ///< CUDA: a cudaStream_t (nullptr: the default stream). Host: ignored.
};

}  // namespace tutti::accel

#include <tutti/accel/launch.hpp>
