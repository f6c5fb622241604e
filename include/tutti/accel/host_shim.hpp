// Host profile shim: the accel primitives implemented with the C++ standard library only.
//
// Included by accel/primitives.hpp when TUTTI_ACCELERATOR_HOST is defined; do not include it
// directly. Every scope maps to the same coherent host memory model, so scope is accepted and
// ignored; order maps one to one onto std::memory_order.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <tutti/accel/config.hpp>
#include <tutti/accel/scope.hpp>
#include <tutti/core/clock.hpp>
#include <tutti/core/status.hpp>

namespace tutti::accel::shim {

constexpr std::memory_order to_std(MemoryOrder order) noexcept {
  switch (order) {
    case MemoryOrder::relaxed: return std::memory_order_relaxed;
    case MemoryOrder::acquire: return std::memory_order_acquire;
    case MemoryOrder::release: return std::memory_order_release;
    case MemoryOrder::acq_rel: return std::memory_order_acq_rel;
    case MemoryOrder::seq_cst: return std::memory_order_seq_cst;
  }
  return std::memory_order_seq_cst;
}

/// The order a load may use: release/acq_rel on a load is not allowed by C++, it becomes acquire
/// (release) or seq_cst.
constexpr std::memory_order load_order(MemoryOrder order) noexcept {
  if (order == MemoryOrder::release || order == MemoryOrder::relaxed) return std::memory_order_relaxed;
  if (order == MemoryOrder::acq_rel || order == MemoryOrder::acquire) return std::memory_order_acquire;
  return std::memory_order_seq_cst;
}
/// The order a store may use: acquire on a store becomes relaxed, acq_rel becomes release.
constexpr std::memory_order store_order(MemoryOrder order) noexcept {
  if (order == MemoryOrder::acquire || order == MemoryOrder::relaxed) return std::memory_order_relaxed;
  if (order == MemoryOrder::acq_rel || order == MemoryOrder::release) return std::memory_order_release;
  return std::memory_order_seq_cst;
}
/// The failure order of a compare-exchange: no release component.
constexpr std::memory_order failure_order(MemoryOrder order) noexcept { return load_order(order); }

/// std::atomic_ref over an object that is suitably aligned (alignof(std::atomic_ref<T>)).
template <class T, ThreadScope Scope>
class AtomicRef {
  static_assert(std::is_trivially_copyable_v<T>, "AtomicRef needs a trivially copyable T");

 public:
  explicit AtomicRef(T& object) noexcept : ref_(object) {}
  T load(MemoryOrder order) const noexcept { return ref_.load(load_order(order)); }
  void store(T value, MemoryOrder order) noexcept { ref_.store(value, store_order(order)); }
  T exchange(T value, MemoryOrder order) noexcept { return ref_.exchange(value, to_std(order)); }
  bool compare_exchange_strong(T& expected, T desired, MemoryOrder order) noexcept {
    return ref_.compare_exchange_strong(expected, desired, to_std(order), failure_order(order));
  }
  T fetch_add(T value, MemoryOrder order) noexcept { return ref_.fetch_add(value, to_std(order)); }
  T fetch_sub(T value, MemoryOrder order) noexcept { return ref_.fetch_sub(value, to_std(order)); }
  T fetch_or(T value, MemoryOrder order) noexcept { return ref_.fetch_or(value, to_std(order)); }
  T fetch_and(T value, MemoryOrder order) noexcept { return ref_.fetch_and(value, to_std(order)); }

 private:
  std::atomic_ref<T> ref_;
};

inline void fence(ThreadScope scope, MemoryOrder order) noexcept {
  if (scope == ThreadScope::thread)
    std::atomic_signal_fence(to_std(order));
  else
    std::atomic_thread_fence(to_std(order));
}

/// Host MMIO store: an atomic release store of 32 bits. On x86-64 and AArch64 this is one
/// aligned store instruction, which is what a PCIe BAR needs; making it atomic keeps the
/// soft controller's concurrent read of the same word defined behaviour.
inline void mmio_store32(volatile std::uint32_t* reg, std::uint32_t value) noexcept {
  std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(reg)).store(value, std::memory_order_release);
}
/// Host MMIO load: an atomic acquire load of 32 bits (see mmio_store32).
inline std::uint32_t mmio_load32(const volatile std::uint32_t* reg) noexcept {
  return std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(reg)).load(std::memory_order_acquire);
}

inline std::uint64_t timer_ns() noexcept { return monotonic_ns(); }

inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

inline void yield_thread() noexcept { std::this_thread::yield(); }
inline void sleep_ns(std::uint64_t ns) noexcept { std::this_thread::sleep_for(std::chrono::nanoseconds(ns)); }

/// A small persistent pool that runs kernel-like functors over a 1-D grid of blocks.
/// Blocks are handed out through an atomic counter; the launching thread takes part, so a launch
/// progresses even when every worker is busy with another launch. Threads of one block run one
/// after the other, in increasing thread index, on the same host thread.
class HostThreadPool {
 public:
  explicit HostThreadPool(unsigned workers) {
    threads_.reserve(workers);
    for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  }
  ~HostThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  HostThreadPool(const HostThreadPool&) = delete;
  HostThreadPool& operator=(const HostThreadPool&) = delete;

  /// Runs run_block(b) for every b in [0, blocks) and returns when all have returned.
  /// An exception thrown by run_block is rethrown here (the first one).
  void run(std::uint32_t blocks, const std::function<void(std::uint32_t)>& run_block) {
    auto job = std::make_shared<Job>();
    job->blocks = blocks;
    job->run_block = &run_block;
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(job);
    }
    wake_.notify_all();
    work_on(*job);
    std::unique_lock lock(job->done_mutex);
    job->done_cv.wait(lock, [&] { return job->finished == job->blocks; });
    {
      std::lock_guard queue_lock(mutex_);
      std::erase(jobs_, job);
    }
    if (job->error) std::rethrow_exception(job->error);
  }

  /// The pool used by launch(): max(1, min(hardware threads, 8)) - 1 workers plus the caller.
  static HostThreadPool& instance() {
    static HostThreadPool pool(std::max(1u, std::min(std::thread::hardware_concurrency(), 8u)) - 1u);
    return pool;
  }

 private:
  struct Job {
    std::uint32_t blocks = 0;
    const std::function<void(std::uint32_t)>* run_block = nullptr;
    std::atomic<std::uint32_t> next{0};
    std::mutex done_mutex;
    std::condition_variable done_cv;
    std::uint32_t finished = 0;  // guarded by done_mutex
    std::exception_ptr error;    // guarded by done_mutex
  };

  static void work_on(Job& job) {
    for (;;) {
      const std::uint32_t b = job.next.fetch_add(1, std::memory_order_relaxed);
      if (b >= job.blocks) return;
      std::exception_ptr error;
      try {
        (*job.run_block)(b);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(job.done_mutex);
      if (error && !job.error) job.error = error;
      if (++job.finished == job.blocks) job.done_cv.notify_all();
    }
  }

  void worker_loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] {
          if (stopping_) return true;
          for (auto& j : jobs_)
            if (j->next.load(std::memory_order_relaxed) < j->blocks) return true;
          return false;
        });
        if (stopping_) return;
        for (auto& j : jobs_)
          if (j->next.load(std::memory_order_relaxed) < j->blocks) {
            job = j;
            break;
          }
      }
      if (job) work_on(*job);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tutti::accel::shim
