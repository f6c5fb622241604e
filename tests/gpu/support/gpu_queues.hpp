// Test and benchmark support for the GPU suite (CUDA profile, host code of .cu files):
//   - CUDA error checks;
//   - QueueSet: N NVMe queue pairs (rings, doorbells, nvme::QueuePair shared state, command
//     slots, CID bitmaps) plus the null controller's per-queue state, all in device memory
//     (cudaMalloc) or all in host memory, initialised as nvme::QueuePairStorage does;
//   - GpuNullController: launches test::null_controller_kernel (tests/support/null_controller.hpp) on its own stream
//   with its
//     control words in mapped pinned host memory, waits until it runs, stops it.
// Not library code: the DataPath owns its queues through libnvm. Errors throw std::runtime_error
// (tests and benchmarks only).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include <tutti/nvme/queue.hpp>
#include "null_controller.hpp"  // tests/support

namespace tutti::gpu_test {

inline void cuda_check(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}
#define TUTTI_CUDA_CHECK(call) ::tutti::gpu_test::cuda_check((call), #call)

/// True when at least one CUDA device is usable (the suite exits 77 otherwise).
inline bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

enum class MemoryKind { device, host };

/// One allocation of `bytes`, zeroed: cudaMalloc'd (device) or 4096-byte aligned host memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryKind kind, std::size_t bytes) : kind_(kind), bytes_(bytes) {
    if (bytes == 0) return;
    if (kind == MemoryKind::device) {
      TUTTI_CUDA_CHECK(cudaMalloc(&data_, bytes));
      TUTTI_CUDA_CHECK(cudaMemset(data_, 0, bytes));
    } else {
      data_ = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
      if (data_ == nullptr) throw std::runtime_error("aligned_alloc failed");
      std::memset(data_, 0, bytes);
    }
  }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(kind_, other.kind_);
    std::swap(bytes_, other.bytes_);
    std::swap(data_, other.data_);
    return *this;
  }
  ~Buffer() {
    if (data_ == nullptr) return;
    if (kind_ == MemoryKind::device)
      cudaFree(data_);
    else
      std::free(data_);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  /// Copies `bytes` from host memory `source` into this buffer at byte `offset`.
  void upload(const void* source, std::size_t bytes, std::size_t offset = 0) {
    if (kind_ == MemoryKind::device)
      TUTTI_CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, source, bytes, cudaMemcpyHostToDevice));
    else
      std::memcpy(static_cast<char*>(data_) + offset, source, bytes);
  }
  /// Copies `bytes` at byte `offset` of this buffer to host memory `target`.
  void download(void* target, std::size_t bytes, std::size_t offset = 0) const {
    if (kind_ == MemoryKind::device)
      TUTTI_CUDA_CHECK(cudaMemcpy(target, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
    else
      std::memcpy(target, static_cast<const char*>(data_) + offset, bytes);
  }

 private:
  MemoryKind kind_ = MemoryKind::host;
  std::size_t bytes_ = 0;
  void* data_ = nullptr;
};

struct QueueSetConfig {
  std::uint32_t queue_count = 1;
  std::uint32_t depth = 1024;      ///< entries per SQ and CQ
  std::uint32_t cid_capacity = 0;  ///< command slots per queue; 0: depth
  MemoryKind memory = MemoryKind::device;
};

/// queue_count queue pairs with qids 1..queue_count and their null-controller views.
/// queues() / controllers(): arrays in `memory` (device arrays for kernels); host_queues(): the
/// same views in host memory (for host threads when memory is host).
class QueueSet {
 public:
  explicit QueueSet(const QueueSetConfig& config) : config_(config) {
    const std::uint32_t q = config.queue_count, depth = config.depth;
    cid_capacity_ = config.cid_capacity == 0 ? depth : config.cid_capacity;
    if (q == 0 || depth < 2 || depth > 65536 || cid_capacity_ > 32768) throw std::runtime_error("QueueSet: bad config");
    words_ = (cid_capacity_ + 31) / 32;
    const MemoryKind m = config.memory;
    sq_ = Buffer(m, sizeof(nvme::SubmissionQueueEntry) * q * depth);
    cq_ = Buffer(m, sizeof(nvme::CompletionQueueEntry) * q * depth);
    doorbells_ = Buffer(m, kDoorbellStride * 2 * q);  // SQ tail and CQ head doorbells, 64 B apart
    state_ = Buffer(m, sizeof(nvme::QueuePairState) * q);
    ready_ = Buffer(m, sizeof(std::uint64_t) * q * depth);
    slots_ = Buffer(m, sizeof(nvme::CommandSlot) * q * cid_capacity_);
    bitmap_ = Buffer(m, sizeof(std::uint32_t) * q * words_);
    controller_state_ = Buffer(m, sizeof(test::NullControllerState) * q);
    std::vector<nvme::QueuePairState> states(q);
    for (auto& s : states) s.cq_phase = 1;  // first pass expects Phase Tag 1
    state_.upload(states.data(), sizeof(nvme::QueuePairState) * q);
    std::vector<std::uint32_t> bitmap(static_cast<std::size_t>(q) * words_, 0);
    for (std::uint32_t i = 0; i < q; ++i)
      for (std::uint32_t bit = cid_capacity_; bit < words_ * 32; ++bit)
        bitmap[i * words_ + bit / 32] |= 1u << (bit % 32);
    bitmap_.upload(bitmap.data(), bitmap.size() * sizeof(std::uint32_t));
    std::vector<test::NullControllerState> cstates(q);
    for (auto& s : cstates) s.drop_command = test::kNoDrop;
    controller_state_.upload(cstates.data(), sizeof(test::NullControllerState) * q);

    host_queues_.resize(q);
    host_controllers_.resize(q);
    auto* doorbell_base = doorbells_.as<char>();
    for (std::uint32_t i = 0; i < q; ++i) {
      nvme::QueuePair& v = host_queues_[i];
      v.sq = sq_.as<nvme::SubmissionQueueEntry>() + static_cast<std::size_t>(i) * depth;
      v.cq = cq_.as<nvme::CompletionQueueEntry>() + static_cast<std::size_t>(i) * depth;
      v.sq_tail_doorbell = reinterpret_cast<volatile std::uint32_t*>(doorbell_base + (2 * i) * kDoorbellStride);
      v.cq_head_doorbell = reinterpret_cast<volatile std::uint32_t*>(doorbell_base + (2 * i + 1) * kDoorbellStride);
      v.controller_status = nullptr;
      v.depth = depth;
      v.qid = static_cast<std::uint16_t>(i + 1);
      v.cid_capacity = cid_capacity_;
      v.cid_index_bits = nvme::cid_index_bits_for(cid_capacity_);
      v.state = state_.as<nvme::QueuePairState>() + i;
      v.sq_ready = ready_.as<std::uint64_t>() + static_cast<std::size_t>(i) * depth;
      v.slots = slots_.as<nvme::CommandSlot>() + static_cast<std::size_t>(i) * cid_capacity_;
      v.cid_bitmap = bitmap_.as<std::uint32_t>() + static_cast<std::size_t>(i) * words_;
      test::NullControllerQueue& c = host_controllers_[i];
      c.sq = v.sq;
      c.cq = v.cq;
      c.sq_tail_doorbell = v.sq_tail_doorbell;
      c.cq_head_doorbell = v.cq_head_doorbell;
      c.depth = depth;
      c.qid = v.qid;
      c.state = controller_state_.as<test::NullControllerState>() + i;
    }
    queue_views_ = Buffer(m, sizeof(nvme::QueuePair) * q);
    queue_views_.upload(host_queues_.data(), sizeof(nvme::QueuePair) * q);
    controller_views_ = Buffer(m, sizeof(test::NullControllerQueue) * q);
    controller_views_.upload(host_controllers_.data(), sizeof(test::NullControllerQueue) * q);
  }

  std::uint32_t queue_count() const { return config_.queue_count; }
  std::uint32_t depth() const { return config_.depth; }
  std::uint32_t cid_capacity() const { return cid_capacity_; }
  /// Queue views in the set's memory (a device array for kernels).
  const nvme::QueuePair* queues() const { return queue_views_.as<const nvme::QueuePair>(); }
  const test::NullControllerQueue* controllers() const {
    return controller_views_.as<const test::NullControllerQueue>();
  }
  /// The views themselves, in host memory (they point into the set's memory).
  const std::vector<nvme::QueuePair>& host_queues() const { return host_queues_; }
  const std::vector<test::NullControllerQueue>& host_controllers() const { return host_controllers_; }

  /// Makes the controller of queue `index` drop the completion of the `command`-th SQE it consumes.
  void drop_completion(std::uint32_t index, std::uint64_t command) {
    controller_state_.upload(
        &command, sizeof(command),
        sizeof(test::NullControllerState) * index + offsetof(test::NullControllerState, drop_command));
  }
  /// Snapshots (call while nothing runs on the set).
  std::vector<nvme::QueuePairState> queue_states() const {
    std::vector<nvme::QueuePairState> out(config_.queue_count);
    state_.download(out.data(), sizeof(nvme::QueuePairState) * out.size());
    return out;
  }
  std::vector<test::NullControllerState> controller_states() const {
    std::vector<test::NullControllerState> out(config_.queue_count);
    controller_state_.download(out.data(), sizeof(test::NullControllerState) * out.size());
    return out;
  }

 private:
  static constexpr std::size_t kDoorbellStride = 64;
  QueueSetConfig config_;
  std::uint32_t cid_capacity_ = 0;
  std::uint32_t words_ = 0;
  Buffer sq_, cq_, doorbells_, state_, ready_, slots_, bitmap_, controller_state_, queue_views_, controller_views_;
  std::vector<nvme::QueuePair> host_queues_;
  std::vector<test::NullControllerQueue> host_controllers_;
};

/// The GPU-resident null controller of a QueueSet (device memory): a persistent kernel of
/// `warps` warps (one warp per queue by default) on its own non-blocking stream.
class GpuNullController {
 public:
  /// relay_stop: the stop word is relayed into GPU memory by warp 0 (NullControllerSettings::
  /// stop_relay) instead of read from mapped host memory by every warp.
  GpuNullController(const QueueSet& set, std::uint32_t warps = 0, test::NullControllerSettings settings = {},
                    bool relay_stop = true) {
    if (relay_stop && settings.stop_relay == nullptr) {
      TUTTI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&relay_), sizeof(std::uint32_t)));
      TUTTI_CUDA_CHECK(cudaMemset(relay_, 0, sizeof(std::uint32_t)));
      settings.stop_relay = relay_;
    }
    TUTTI_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&control_), sizeof(*control_), cudaHostAllocMapped));
    std::memset(control_, 0, sizeof(*control_));
    TUTTI_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_control_), control_, 0));
    TUTTI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (warps == 0) warps = set.queue_count();
    constexpr std::uint32_t kWarpsPerBlock = 4;
    const std::uint32_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const std::uint32_t threads = (warps < kWarpsPerBlock ? warps : kWarpsPerBlock) * 32;
    warps_ = blocks * (threads / 32);
    test::null_controller_kernel<<<blocks, threads, 0, stream_>>>(set.controllers(), set.queue_count(), device_control_,
                                                                  settings);
    TUTTI_CUDA_CHECK(cudaGetLastError());
    // Wait (bounded: 5 s) until every controller warp is resident and polling.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (reinterpret_cast<volatile std::uint32_t*>(control_)[1] < warps_) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("null controller did not start within 5 s");
      std::this_thread::yield();
    }
  }
  GpuNullController(const GpuNullController&) = delete;
  GpuNullController& operator=(const GpuNullController&) = delete;
  ~GpuNullController() {
    try {
      stop();
    } catch (...) {
    }
    cudaStreamDestroy(stream_);
    cudaFreeHost(control_);
    if (relay_ != nullptr) cudaFree(relay_);
  }
  /// Asks the controller to leave once idle and waits for it. Returns the warps that left because
  /// their budget ran out instead (0 when all went well).
  std::uint32_t stop() {
    if (stopped_) return deadline_exits_;
    stopped_ = true;
    reinterpret_cast<volatile std::uint32_t*>(control_)[0] = 1;
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(stream_));
    deadline_exits_ = reinterpret_cast<volatile std::uint32_t*>(control_)[2];
    return deadline_exits_;
  }
  std::uint32_t warps() const { return warps_; }

 private:
  test::NullControllerControl* control_ = nullptr;
  test::NullControllerControl* device_control_ = nullptr;
  std::uint32_t* relay_ = nullptr;  ///< the relayed stop word in GPU memory, or null
  cudaStream_t stream_ = nullptr;
  std::uint32_t warps_ = 0;
  bool stopped_ = false;
  std::uint32_t deadline_exits_ = 0;
};

}  // namespace tutti::gpu_test
