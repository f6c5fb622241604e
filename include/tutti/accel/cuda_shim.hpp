// CUDA profile shim: the accel primitives on NVIDIA GPUs (sm_70 and newer; built for sm_90).
//
// Included by accel/primitives.hpp when TUTTI_ACCELERATOR_CUDA is defined; the only file above
// which vendor headers may not appear. Atomics are libcu++'s cuda::atomic_ref with the scope in the
// type; fences are cuda::atomic_thread_fence; the timer reads %globaltimer; backoff uses
// __nanosleep (sm_70+). In nvcc's host pass every primitive falls back to its host meaning, so
// host code of a .cu file (the soft controller's CUDA mode, launch) compiles against the same API.
#pragma once

#include <cstdint>
#include <thread>
#include <chrono>
#include <type_traits>

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <tutti/accel/config.hpp>
#include <tutti/accel/scope.hpp>
#include <tutti/core/clock.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel::shim {

template <ThreadScope Scope>
struct CudaScope;
template <>
struct CudaScope<ThreadScope::thread> {
  static constexpr auto value = cuda::thread_scope_thread;
};
template <>
struct CudaScope<ThreadScope::block> {
  static constexpr auto value = cuda::thread_scope_block;
};
template <>
struct CudaScope<ThreadScope::device> {
  static constexpr auto value = cuda::thread_scope_device;
};
template <>
struct CudaScope<ThreadScope::system> {
  static constexpr auto value = cuda::thread_scope_system;
};

TUTTI_HOST_DEVICE constexpr cuda::std::memory_order to_cuda(MemoryOrder order) noexcept {
  switch (order) {
    case MemoryOrder::relaxed: return cuda::std::memory_order_relaxed;
    case MemoryOrder::acquire: return cuda::std::memory_order_acquire;
    case MemoryOrder::release: return cuda::std::memory_order_release;
    case MemoryOrder::acq_rel: return cuda::std::memory_order_acq_rel;
    case MemoryOrder::seq_cst: return cuda::std::memory_order_seq_cst;
  }
  return cuda::std::memory_order_seq_cst;
}
TUTTI_HOST_DEVICE constexpr cuda::std::memory_order load_order(MemoryOrder order) noexcept {
  if (order == MemoryOrder::release || order == MemoryOrder::relaxed) return cuda::std::memory_order_relaxed;
  if (order == MemoryOrder::acq_rel || order == MemoryOrder::acquire) return cuda::std::memory_order_acquire;
  return cuda::std::memory_order_seq_cst;
}
TUTTI_HOST_DEVICE constexpr cuda::std::memory_order store_order(MemoryOrder order) noexcept {
  if (order == MemoryOrder::acquire || order == MemoryOrder::relaxed) return cuda::std::memory_order_relaxed;
  if (order == MemoryOrder::acq_rel || order == MemoryOrder::release) return cuda::std::memory_order_release;
  return cuda::std::memory_order_seq_cst;
}

/// cuda::atomic_ref<T, scope>: PTX ld/st/atom with .acquire/.release/.relaxed and .cta/.gpu/.sys.
template <class T, ThreadScope Scope>
class AtomicRef {
  static_assert(std::is_trivially_copyable_v<T>, "AtomicRef needs a trivially copyable T");

 public:
  TUTTI_HOST_DEVICE explicit AtomicRef(T& object) noexcept : ref_(object) {}
  TUTTI_HOST_DEVICE T load(MemoryOrder order) const noexcept { return ref_.load(load_order(order)); }
  TUTTI_HOST_DEVICE void store(T value, MemoryOrder order) noexcept { ref_.store(value, store_order(order)); }
  TUTTI_HOST_DEVICE T exchange(T value, MemoryOrder order) noexcept { return ref_.exchange(value, to_cuda(order)); }
  TUTTI_HOST_DEVICE bool compare_exchange_strong(T& expected, T desired, MemoryOrder order) noexcept {
    return ref_.compare_exchange_strong(expected, desired, to_cuda(order), load_order(order));
  }
  TUTTI_HOST_DEVICE T fetch_add(T value, MemoryOrder order) noexcept { return ref_.fetch_add(value, to_cuda(order)); }
  TUTTI_HOST_DEVICE T fetch_sub(T value, MemoryOrder order) noexcept { return ref_.fetch_sub(value, to_cuda(order)); }
  TUTTI_HOST_DEVICE T fetch_or(T value, MemoryOrder order) noexcept { return ref_.fetch_or(value, to_cuda(order)); }
  TUTTI_HOST_DEVICE T fetch_and(T value, MemoryOrder order) noexcept { return ref_.fetch_and(value, to_cuda(order)); }

 private:
  cuda::atomic_ref<T, CudaScope<Scope>::value> ref_;
};

/// fence.{sc,acq_rel}.{cta,gpu,sys} (PTX ISA, "membar/fence", sm_70+).
TUTTI_HOST_DEVICE inline void fence(ThreadScope scope, MemoryOrder order) noexcept {
  switch (scope) {
    case ThreadScope::thread: cuda::atomic_thread_fence(to_cuda(order), cuda::thread_scope_thread); break;
    case ThreadScope::block: cuda::atomic_thread_fence(to_cuda(order), cuda::thread_scope_block); break;
    case ThreadScope::device: cuda::atomic_thread_fence(to_cuda(order), cuda::thread_scope_device); break;
    case ThreadScope::system: cuda::atomic_thread_fence(to_cuda(order), cuda::thread_scope_system); break;
  }
}

/// Device: `st.volatile.global.u32` after the caller's system fence (primitives.hpp issues
/// fence.sc.sys first); a volatile store is not merged or reordered with other volatile
/// accesses and goes to the mapped BAR or pinned page. Host pass: a relaxed system-scope store.
TUTTI_HOST_DEVICE inline void mmio_store32(volatile std::uint32_t* reg, std::uint32_t value) noexcept {
  TUTTI_IF_DEVICE((*reg = value;),
                  (cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(*const_cast<std::uint32_t*>(reg))
                       .store(value, cuda::std::memory_order_release);));
}
/// Device: `ld.volatile` (followed by the caller's acquire fence where needed). Host: acquire load.
TUTTI_HOST_DEVICE inline std::uint32_t mmio_load32(const volatile std::uint32_t* reg) noexcept {
  std::uint32_t value = 0;
  TUTTI_IF_DEVICE((value = *reg;),
                  (value = cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(*const_cast<std::uint32_t*>(reg))
                               .load(cuda::std::memory_order_acquire);));
  return value;
}

/// Device: `mov.u64 %0, %globaltimer;` (ns, PTX ISA "Special Registers: %globaltimer"; updated
/// about every microsecond on recent GPUs). Host pass: monotonic_ns (core/clock.hpp).
TUTTI_HOST_DEVICE inline std::uint64_t timer_ns() noexcept {
  std::uint64_t now = 0;
  TUTTI_IF_DEVICE((asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));), (now = monotonic_ns();));
  return now;
}

/// Device: nothing (a spin iteration). Host pass: the CPU pause hint.
TUTTI_HOST_DEVICE inline void cpu_pause() noexcept {
#if !defined(__CUDA_ARCH__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_ia32_pause();
#endif
}
/// Device: __nanosleep(32). Host pass: std::this_thread::yield.
TUTTI_HOST_DEVICE inline void yield_thread() noexcept {
  TUTTI_IF_DEVICE((__nanosleep(32);), (std::this_thread::yield();));
}
/// Device: __nanosleep(ns) (sm_70+, the hardware caps one sleep at about 1 ms). Host: sleep_for.
TUTTI_HOST_DEVICE inline void sleep_ns(std::uint64_t ns) noexcept {
  TUTTI_IF_DEVICE((__nanosleep(static_cast<unsigned>(ns > 1000000u ? 1000000u : ns));),
                  (std::this_thread::sleep_for(std::chrono::nanoseconds(ns));));
}

}  // namespace tutti::accel::shim
