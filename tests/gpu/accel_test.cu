// The accel primitives on the GPU (CUDA profile): scoped atomics, fences, the MMIO store/load
// pair, %globaltimer in ns, bounded backoff, launch, aligned device and mapped host memory. Suite
// gpu; exits 77 without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/path/local_nvme/batch_pool.hpp>

#include "gpu_queues.hpp"

namespace accel = tutti::accel;
using accel::MemoryOrder;
using accel::ThreadScope;

namespace {

// ----- scoped atomics -------------------------------------------------------------------------

struct AtomicCounters {
  std::uint32_t device_sum;     ///< device scope, every thread adds 1
  std::uint32_t block_sums_ok;  ///< blocks whose block-scope counter reached blockDim.x
  std::uint32_t cas_winners;    ///< threads that won the one CAS 0 -> 1
  std::uint32_t cas_flag;
  unsigned long long exchange_sum;  ///< sum of values returned by exchange (a permutation check)
  unsigned long long exchange_cell;
};

static __global__ void atomics_kernel(AtomicCounters* counters, std::uint32_t* system_counter) {
  __shared__ std::uint32_t block_counter;
  if (threadIdx.x == 0) block_counter = 0;
  __syncthreads();
  accel::AtomicRef<std::uint32_t, ThreadScope::block>(block_counter).fetch_add(1, MemoryOrder::relaxed);
  accel::DeviceAtomicRef<std::uint32_t>(counters->device_sum).fetch_add(1, MemoryOrder::relaxed);
  accel::SystemAtomicRef<std::uint32_t>(*system_counter).fetch_add(1, MemoryOrder::relaxed);
  std::uint32_t expected = 0;
  if (accel::DeviceAtomicRef<std::uint32_t>(counters->cas_flag)
          .compare_exchange_strong(expected, 1, MemoryOrder::acq_rel))
    accel::DeviceAtomicRef<std::uint32_t>(counters->cas_winners).fetch_add(1, MemoryOrder::relaxed);
  const unsigned long long mine = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x + 1;
  const unsigned long long previous =
      accel::DeviceAtomicRef<unsigned long long>(counters->exchange_cell).exchange(mine, MemoryOrder::acq_rel);
  accel::DeviceAtomicRef<unsigned long long>(counters->exchange_sum).fetch_add(previous, MemoryOrder::relaxed);
  __syncthreads();
  if (threadIdx.x == 0 &&
      accel::AtomicRef<std::uint32_t, ThreadScope::block>(block_counter).load(MemoryOrder::acquire) == blockDim.x)
    accel::DeviceAtomicRef<std::uint32_t>(counters->block_sums_ok).fetch_add(1, MemoryOrder::relaxed);
}

// ----- fences: message passing between blocks ---------------------------------------------------

struct Mailbox {
  std::uint32_t data[64];
  std::uint32_t sequence;  ///< flag: round number published
  std::uint32_t consumed;  ///< round number acknowledged
  std::uint32_t mismatches;
  std::uint32_t timeouts;
};

/// Block 0 publishes 64 words per round with plain stores, fence(scope, release) and a relaxed
/// flag store; block 1 polls the flag (relaxed, bounded by %globaltimer), fence(scope, acquire),
/// and checks the words. `rounds` rounds, each acknowledged before the next.
static __global__ void message_passing_kernel(Mailbox* box, std::uint32_t rounds, int scope_index) {
  if (threadIdx.x != 0) return;
  const ThreadScope scope = scope_index == 0 ? ThreadScope::device : ThreadScope::system;
  const std::uint64_t deadline = accel::deadline_after(2'000'000'000ull);
  accel::DeviceAtomicRef<std::uint32_t> sequence(box->sequence);
  accel::DeviceAtomicRef<std::uint32_t> consumed(box->consumed);
  for (std::uint32_t round = 1; round <= rounds; ++round) {
    if (blockIdx.x == 0) {
      while (consumed.load(MemoryOrder::relaxed) != round - 1) {
        if (accel::timer_ns() > deadline) {
          ++box->timeouts;
          return;
        }
      }
      accel::fence(scope, MemoryOrder::acquire);
      volatile std::uint32_t* data = box->data;  // volatile: one store per word, in program order
      for (std::uint32_t i = 0; i < 64; ++i) data[i] = round * 64 + i;
      accel::fence(scope, MemoryOrder::release);
      sequence.store(round, MemoryOrder::relaxed);
    } else {
      while (sequence.load(MemoryOrder::relaxed) != round) {
        if (accel::timer_ns() > deadline) {
          ++box->timeouts;
          return;
        }
      }
      accel::fence(scope, MemoryOrder::acquire);
      for (std::uint32_t i = 0; i < 64; ++i)
        if (accel::DeviceAtomicRef<std::uint32_t>(box->data[i]).load(MemoryOrder::relaxed) != round * 64 + i)
          ++box->mismatches;
      accel::fence(scope, MemoryOrder::release);
      consumed.store(round, MemoryOrder::relaxed);
    }
  }
}

// ----- timer -----------------------------------------------------------------------------------

struct TimerReport {
  unsigned long long backwards;  ///< consecutive reads that went backwards (must be 0)
  unsigned long long start_ns, end_ns;
  unsigned long long distinct;  ///< distinct values seen by thread 0 (resolution)
};

static __global__ void timer_kernel(TimerReport* report, std::uint64_t spin_ns) {
  std::uint64_t previous = accel::timer_ns();
  const std::uint64_t start = previous;
  unsigned long long backwards = 0, distinct = 0;
  for (;;) {
    const std::uint64_t now = accel::timer_ns();
    if (now < previous) ++backwards;
    if (now != previous) ++distinct;
    previous = now;
    if (now - start >= spin_ns) break;  // bounded by the timer itself
  }
  atomicAdd(&report->backwards, backwards);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    report->start_ns = start;
    report->end_ns = previous;
    report->distinct = distinct;
  }
}

// ----- backoff ---------------------------------------------------------------------------------

struct BackoffReport {
  unsigned long long pauses_ns;  ///< time for `pauses` Backoff::pause() calls
  unsigned long long poll_ns;    ///< time a deadline-bounded poll of a flag that never changes took
  std::uint32_t sleeping_after;  ///< pause() calls until sleeping() became true
  std::uint32_t flag;            ///< never set
};

static __global__ void backoff_kernel(BackoffReport* report, accel::Backoff::Settings settings, std::uint32_t pauses,
                                      std::uint64_t poll_budget_ns) {
  accel::Backoff backoff(settings);
  const std::uint64_t start = accel::timer_ns();
  std::uint32_t sleeping_after = 0;
  for (std::uint32_t i = 0; i < pauses; ++i) {
    backoff.pause();
    if (sleeping_after == 0 && backoff.sleeping()) sleeping_after = i + 1;
  }
  report->pauses_ns = accel::timer_ns() - start;
  report->sleeping_after = sleeping_after;
  // The polling pattern every loop in Tutti uses: a deadline from the timer, backoff between looks.
  accel::Backoff poll_backoff;
  const std::uint64_t poll_start = accel::timer_ns();
  const std::uint64_t deadline = accel::deadline_after(poll_budget_ns);
  while (accel::DeviceAtomicRef<std::uint32_t>(report->flag).load(MemoryOrder::acquire) == 0) {
    if (accel::timer_ns() >= deadline) break;
    poll_backoff.pause();
  }
  report->poll_ns = accel::timer_ns() - poll_start;
}

// ----- mmio ------------------------------------------------------------------------------------

static __global__ void mmio_kernel(volatile std::uint32_t* doorbell, const volatile std::uint32_t* status,
                                   std::uint32_t* seen) {
  *seen = accel::mmio_load32(status);
  accel::mmio_store32(doorbell, 0xC0FFEEu);
}

struct FillFunctor {
  std::uint32_t* out;
  __device__ void operator()(accel::ThreadIndex index) const {
    out[index.global()] = index.block * 1000 + index.thread;
  }
};

struct MappedIncrement {
  std::uint32_t* word;  ///< in mapped pinned host memory
  __device__ void operator()(accel::ThreadIndex) const {
    accel::SystemAtomicRef<std::uint32_t>(*word).fetch_add(1, MemoryOrder::relaxed);
  }
};

template <class T>
struct Pinned {
  T* host = nullptr;
  T* device = nullptr;
  explicit Pinned(std::size_t count = 1) {
    TUTTI_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(T) * count, cudaHostAllocMapped));
    std::memset(static_cast<void*>(host), 0, sizeof(T) * count);
    TUTTI_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0));
  }
  ~Pinned() { cudaFreeHost(host); }
};

}  // namespace

TEST_CASE("scoped atomics count every thread at block, device and system scope, and CAS has one winner") {
  constexpr std::uint32_t kBlocks = 264, kThreads = 256;
  tutti::gpu_test::Buffer counters(tutti::gpu_test::MemoryKind::device, sizeof(AtomicCounters));
  Pinned<std::uint32_t> system_counter;
  atomics_kernel<<<kBlocks, kThreads>>>(counters.as<AtomicCounters>(), system_counter.device);
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  AtomicCounters result{};
  counters.download(&result, sizeof(result));
  const unsigned long long total = static_cast<unsigned long long>(kBlocks) * kThreads;
  CHECK(result.device_sum == total);
  CHECK(result.block_sums_ok == kBlocks);
  CHECK(result.cas_winners == 1);
  CHECK(*system_counter.host == total);  // system scope on mapped pinned host memory
  // exchange hands each value on exactly once: the returned values are 0 and all but the last one.
  CHECK(result.exchange_sum + result.exchange_cell == total * (total + 1) / 2);
}

TEST_CASE("release and acquire fences order plain stores between blocks (message passing)") {
  for (int scope = 0; scope < 2; ++scope) {
    CAPTURE(scope);
    tutti::gpu_test::Buffer box(tutti::gpu_test::MemoryKind::device, sizeof(Mailbox));
    message_passing_kernel<<<2, 32>>>(box.as<Mailbox>(), 20000, scope);
    TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
    Mailbox result{};
    box.download(&result, sizeof(result));
    CHECK(result.timeouts == 0);
    CHECK(result.mismatches == 0);
    CHECK(result.consumed == 20000);
  }
}

TEST_CASE("timer_ns (%globaltimer) never goes backwards and counts nanoseconds of wall time") {
  constexpr std::uint64_t kSpinNs = 50'000'000;  // 50 ms
  tutti::gpu_test::Buffer report(tutti::gpu_test::MemoryKind::device, sizeof(TimerReport));
  timer_kernel<<<132, 128>>>(report.as<TimerReport>(), 1'000'000);  // warm-up
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  report = tutti::gpu_test::Buffer(tutti::gpu_test::MemoryKind::device, sizeof(TimerReport));
  const auto host_start = std::chrono::steady_clock::now();
  timer_kernel<<<132, 128>>>(report.as<TimerReport>(), kSpinNs);
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  const double host_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - host_start).count();
  TimerReport result{};
  report.download(&result, sizeof(result));
  const double device_ns = static_cast<double>(result.end_ns - result.start_ns);
  MESSAGE("device elapsed ", device_ns, " ns, host elapsed ", host_ns, " ns, distinct timer values ", result.distinct);
  CHECK(result.backwards == 0);
  CHECK(device_ns >= kSpinNs);
  CHECK(device_ns < kSpinNs + 1'000'000);  // the loop stops within a tick (~1 us) of 50 ms
  // ns of wall time: the host saw at least the device's 50 ms, and not wildly more.
  CHECK(host_ns >= 0.98 * device_ns);
  CHECK(host_ns < device_ns + 500'000'000.0);
  CHECK(result.distinct > 1000);  // resolution finer than 50 us
}

TEST_CASE("Backoff sleeps are bounded by their cap and a deadline-bounded poll ends on time") {
  const accel::Backoff::Settings settings{4, 4, 1000, 8000};
  constexpr std::uint32_t kPauses = 40;
  constexpr std::uint64_t kPollBudgetNs = 1'000'000;  // 1 ms
  tutti::gpu_test::Buffer report(tutti::gpu_test::MemoryKind::device, sizeof(BackoffReport));
  backoff_kernel<<<1, 1>>>(report.as<BackoffReport>(), settings, kPauses, kPollBudgetNs);
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  BackoffReport result{};
  report.download(&result, sizeof(result));
  MESSAGE("40 pauses: ", result.pauses_ns, " ns; 1 ms poll: ", result.poll_ns, " ns");
  CHECK(result.sleeping_after == 8);  // sleeping() once the 4 spin and 4 yield steps are done
  // Sleeps: 1, 2, 4, then 8 us (the cap) 29 times = 239 us; __nanosleep sleeps at most twice its
  // argument (PTX ISA, nanosleep), the 4 yield steps 32 ns each.
  CHECK(result.pauses_ns <= 2 * 239'000 + 4 * 64 + 50'000);
  CHECK(result.poll_ns >= kPollBudgetNs);
  CHECK(result.poll_ns <= kPollBudgetNs + 2 * 100'000 + 100'000);  // default cap 100 us, doubled, plus slack
}

TEST_CASE("mmio_store32 and mmio_load32 reach mapped pinned host memory") {
  Pinned<std::uint32_t> registers(2);
  Pinned<std::uint32_t> seen;
  registers.host[1] = 0x12345678u;
  mmio_kernel<<<1, 1>>>(registers.device, registers.device + 1, seen.device);
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(*reinterpret_cast<volatile std::uint32_t*>(registers.host) == 0xC0FFEEu);
  CHECK(*seen.host == 0x12345678u);
}

TEST_CASE("launch runs a functor on every thread and rejects an empty grid") {
  tutti::gpu_test::Buffer out(tutti::gpu_test::MemoryKind::device, sizeof(std::uint32_t) * 4 * 64);
  REQUIRE(accel::launch(accel::LaunchConfig{4, 64, nullptr}, FillFunctor{out.as<std::uint32_t>()}).is_ok());
  TUTTI_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::uint32_t> values(4 * 64);
  out.download(values.data(), values.size() * sizeof(std::uint32_t));
  for (std::uint32_t i = 0; i < values.size(); ++i) CHECK(values[i] == (i / 64) * 1000 + i % 64);
  const tutti::Status empty = accel::launch(accel::LaunchConfig{0, 64, nullptr}, FillFunctor{out.as<std::uint32_t>()});
  CHECK(empty.code() == tutti::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("allocate_device returns zeroed 4096-byte aligned memory even after small cudaMalloc calls") {
  // cudaMalloc aligns to 256 bytes only: a 16-byte allocation first makes the next one start
  // 0x200 into a page, which PRP-based mappings (map_device) cannot take.
  std::vector<void*> small(3, nullptr);
  for (auto& p : small) REQUIRE(cudaMalloc(&p, 16) == cudaSuccess);
  std::vector<void*> blocks;
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{12288}, std::size_t{1} << 20}) {
    auto allocated = tutti::accel::allocate_device(bytes);
    REQUIRE(allocated.is_ok());
    void* device = *allocated;
    CHECK(reinterpret_cast<std::uintptr_t>(device) % 4096 == 0);
    std::vector<unsigned char> back(bytes, 0xff);
    REQUIRE(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::count(back.begin(), back.end(), 0) == static_cast<std::ptrdiff_t>(bytes));
    // The whole requested range is writable (no overrun into the padding of the next one).
    REQUIRE(cudaMemset(device, 0x5a, bytes) == cudaSuccess);
    blocks.push_back(device);
    void* spacer = nullptr;
    REQUIRE(cudaMalloc(&spacer, 16) == cudaSuccess);
    small.push_back(spacer);
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (void* b : blocks) tutti::accel::free_device(b);
  for (void* p : small) CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("allocate_mapped_host returns zeroed 4096-byte aligned mapped memory even after small cudaHostAlloc calls") {
  // The cuda profile's batch pool (local_nvme) failed every submit of tutti-bench-gpu-submit as
  // "no memory": its pinned staging arrays came from allocate_mapped_host after the benchmark's own
  // small cudaHostAlloc (the null controller's control word). Small pinned allocations are
  // sub-allocated, so the next one may start inside a page; allocate_mapped_host must still hand out
  // a page-aligned, device-mapped address, and the PlacementAllocator and BatchSlot::prepare on it.
  std::vector<void*> small;
  void* first = nullptr;
  REQUIRE(cudaHostAlloc(&first, 12, cudaHostAllocMapped) == cudaSuccess);
  small.push_back(first);
  std::vector<void*> blocks;
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{53248}, std::size_t{1} << 20}) {
    auto allocated = tutti::accel::allocate_mapped_host(bytes);
    REQUIRE_MESSAGE(allocated.is_ok(), allocated.status().to_string());
    auto* host = static_cast<unsigned char*>(*allocated);
    CHECK(reinterpret_cast<std::uintptr_t>(host) % 4096 == 0);
    CHECK(std::count(host, host + bytes, 0) == static_cast<std::ptrdiff_t>(bytes));
    std::memset(host, 0x5a, bytes);  // the whole range is ours
    blocks.push_back(host);
    void* spacer = nullptr;
    REQUIRE(cudaHostAlloc(&spacer, 24, cudaHostAllocMapped) == cudaSuccess);
    small.push_back(spacer);
  }
  // A kernel reaches the aligned address (the device maps it at the same address).
  std::uint32_t* word = reinterpret_cast<std::uint32_t*>(blocks[0]);
  word[0] = 0;
  REQUIRE(accel::launch(accel::LaunchConfig{1, 32, nullptr}, MappedIncrement{word}).is_ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(word[0] == 32);
  {
    tutti::local_nvme::BatchSlot slot;
    const tutti::Status prepared = slot.prepare(256, 16, 16, true);
    CHECK_MESSAGE(prepared.is_ok(), prepared.to_string());
    CHECK(slot.poll_stream.has_value());  // Options::poll_stream_per_batch's stream, made once
    CHECK(slot.polling_stream(tutti::accel::StreamRef{}) == slot.poll_stream.ref().native_handle());
    CHECK(reinterpret_cast<std::uintptr_t>(slot.staged.data()) % 4096 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(slot.reports.data()) % 4096 == 0);
  }
  for (void* b : blocks) tutti::accel::free_mapped_host(b);
  for (void* p : small) CHECK(cudaFreeHost(p) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}
