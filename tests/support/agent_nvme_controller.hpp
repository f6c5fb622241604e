// Test and benchmark support (not library code): what the controllers whose queues live in "agent
// memory" share behind the nvme::Controller interface. Agent memory is where the servicing agent
// runs: device memory in the cuda profile (a persistent GPU kernel services the queues), host
// memory in the host profile (host threads service them). Two controllers derive from it:
// the null controller (bench/gpu/null_nvme_controller.hpp, both profiles) and the GPU-resident
// data-moving drive controller (tests/gpu/support/drive_controller.cuh, cuda profile).
//
//   AgentBuffer          one allocation in agent memory, mapped pinned host memory or 4096-aligned
//                        host memory, zeroed, freed on destruction.
//   AgentNvmeController  queue IDs 1..kMaxQueuePairs; per queue pair the SQ and CQ (one allocation),
//                        a 4096-byte word page (SQ tail doorbell at 0, CQ head doorbell at 64,
//                        CSTS at 128 reading RDY, the controller's per-queue state at 1024) and
//                        optional per-entry command memory, all in agent memory; the DMA mapping
//                        and DMA buffer tables; the identity; Admin commands complete at once with
//                        success; Abort finds nothing (a lost completion stays lost). A derived
//                        controller says how its per-queue state starts, how many bytes of command
//                        memory each entry needs, which memory it accepts for DMA and which bus
//                        address it gives.
//
// Errors follow nvme/controller.hpp; each message starts with the derived controller's name
// ("null controller: ...") and names the value and the limit. Thread-safety: queue creation,
// deletion and the DMA calls are serialised by one mutex (mutex_, which derived classes take for
// their own views of queues_); the queues follow nvme/queue.hpp's rules.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/controller.hpp>

namespace tutti::test {

/// One allocation in agent memory (accel::allocate_device: device memory in the cuda profile,
/// 4096-aligned host memory in the host profile), in mapped pinned host memory
/// (accel::allocate_mapped_host) or in ordinary 4096-aligned host memory; zeroed; freed on
/// destruction. Move-only.
class AgentBuffer {
 public:
  AgentBuffer() = default;
  /// Agent memory. Errors: accel::allocate_device's.
  static Result<AgentBuffer> allocate(std::size_t bytes) { return make(Kind::agent, accel::allocate_device(bytes)); }
  /// Mapped pinned host memory (the GPU reaches it at the same address). Errors: accel::allocate_mapped_host's.
  static Result<AgentBuffer> mapped_host(std::size_t bytes) {
    return make(Kind::mapped_host, accel::allocate_mapped_host(bytes));
  }
  /// Ordinary host memory, rounded up to 4096 bytes. Errors: RESOURCE_EXHAUSTED.
  static Result<AgentBuffer> host(std::size_t bytes) {
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) return error(StatusCode::RESOURCE_EXHAUSTED, "no host memory for {} bytes", rounded);
    std::memset(p, 0, rounded);
    return make(Kind::host, Result<void*>(p));
  }
  AgentBuffer(AgentBuffer&& other) noexcept { *this = std::move(other); }
  AgentBuffer& operator=(AgentBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(kind_, other.kind_);
    return *this;
  }
  AgentBuffer(const AgentBuffer&) = delete;
  AgentBuffer& operator=(const AgentBuffer&) = delete;
  ~AgentBuffer() {
    if (kind_ == Kind::agent)
      accel::free_device(data_);
    else if (kind_ == Kind::mapped_host)
      accel::free_mapped_host(data_);
    else
      std::free(data_);
  }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }

 private:
  enum class Kind { agent, mapped_host, host };
  static Result<AgentBuffer> make(Kind kind, Result<void*> p) {
    if (!p) return p.status();
    AgentBuffer b;
    b.data_ = *p;
    b.kind_ = kind;
    return Result<AgentBuffer>(std::move(b));  // explicit: nvcc's front end does not move implicitly here
  }
  void* data_ = nullptr;
  Kind kind_ = Kind::agent;
};

/// The nvme::Controller side shared by the agent-memory test controllers (see the file comment).
class AgentNvmeController : public nvme::Controller {
 public:
  static constexpr std::uint32_t kMaxQueueEntries = 65536;
  static constexpr std::uint16_t kMaxQueuePairs = 1024;
  /// Byte offsets in a queue pair's word page.
  static constexpr std::size_t kSubmissionTailDoorbell = 0, kCompletionHeadDoorbell = 64, kControllerStatus = 128,
                               kQueueState = 1024, kWordPageBytes = 4096;

  Status shutdown(std::uint64_t) override { return Status::success(); }
  const nvme::ControllerIdentity& identity() const noexcept override { return identity_; }
  nvme::ControllerStatus controller_status() const noexcept override { return nvme::ControllerStatus{1}; }

  /// SQ, CQ, the two doorbells (64 bytes apart), CSTS (reads RDY), the controller's per-queue state
  /// and its command memory, in agent memory (QueuePairInfo::host_accessible only in the host profile). Errors:
  /// INVALID_ARGUMENT (depth outside 2..65536), RESOURCE_EXHAUSTED (queue IDs), the accelerator's allocation and copy
  /// errors.
  Result<nvme::QueuePairInfo> create_io_queue_pair(std::uint32_t depth) override {
    if (depth < 2 || depth > kMaxQueueEntries)
      return error(StatusCode::INVALID_ARGUMENT, "{}: depth = {} outside 2..{}", name_, depth, kMaxQueueEntries);
    std::scoped_lock lock(mutex_);
    std::uint16_t qid = 1;
    while (queues_.count(qid) != 0) ++qid;
    if (qid > kMaxQueuePairs)
      return error(StatusCode::RESOURCE_EXHAUSTED, "{}: {} queue pairs in use", name_, kMaxQueuePairs);
    QueuePair q;
    const std::string context = fmt::format("{}: queue pair of depth {}", name_, depth);
    auto rings =
        AgentBuffer::allocate(depth * (sizeof(nvme::SubmissionQueueEntry) + sizeof(nvme::CompletionQueueEntry)));
    if (!rings) return rings.status().with_context(context);
    auto words = AgentBuffer::allocate(kWordPageBytes);
    if (!words) return words.status().with_context(context);
    q.rings = std::move(*rings);
    q.words = std::move(*words);
    if (const std::size_t per_entry = command_bytes_per_entry(); per_entry != 0) {
      auto commands = AgentBuffer::allocate(depth * per_entry);
      if (!commands) return commands.status().with_context(context);
      q.commands = std::move(*commands);
    }
    const std::uint32_t ready = 1;  // CSTS.RDY
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(q.words.as<char>() + kControllerStatus, &ready, sizeof(ready)));
    TUTTI_RETURN_IF_ERROR(initialise_queue_state(q.state()));
    q.info.qid = qid;
    q.info.depth = depth;
    q.info.submission_queue = q.rings.as<nvme::SubmissionQueueEntry>();
    q.info.completion_queue =
        reinterpret_cast<nvme::CompletionQueueEntry*>(q.rings.as<char>() + depth * sizeof(nvme::SubmissionQueueEntry));
    q.info.submission_queue_tail_doorbell =
        reinterpret_cast<volatile std::uint32_t*>(q.words.as<char>() + kSubmissionTailDoorbell);
    q.info.completion_queue_head_doorbell =
        reinterpret_cast<volatile std::uint32_t*>(q.words.as<char>() + kCompletionHeadDoorbell);
    q.info.controller_status = reinterpret_cast<const volatile std::uint32_t*>(q.words.as<char>() + kControllerStatus);
    q.info.host_accessible = accel::kProfile == accel::Profile::host;  // cuda: device memory
    const nvme::QueuePairInfo info = q.info;
    queues_.emplace(qid, std::move(q));
    return info;
  }
  Status delete_io_queue_pair(std::uint16_t qid) override {
    std::scoped_lock lock(mutex_);
    if (queues_.erase(qid) == 0) return error(StatusCode::NOT_FOUND, "{}: no queue pair {}", name_, qid);
    return Status::success();
  }

  Result<nvme::DmaMapping> dma_map(void* host_address, std::size_t length) override {
    return map(host_address, length, nvme::DmaMemoryKind::host);
  }
  Result<nvme::DmaMapping> dma_map_device(void* device_address, std::size_t length) override {
    return map(device_address, length, nvme::DmaMemoryKind::device);
  }
  Status dma_unmap(std::uint64_t id) override {
    std::scoped_lock lock(mutex_);
    return mappings_.erase(id) != 0 ? Status::success() : error(StatusCode::NOT_FOUND, "{}: no mapping {}", name_, id);
  }
  /// dma_buffer_memory(length rounded up to 4096), at bus_address(). Errors: INVALID_ARGUMENT
  /// (length 0), the allocation's.
  Result<nvme::DmaBuffer> allocate_dma_buffer(std::size_t length) override {
    if (length == 0) return error(StatusCode::INVALID_ARGUMENT, "{}: allocate_dma_buffer of 0 bytes", name_);
    const std::size_t rounded = (length + 4095) / 4096 * 4096;
    auto b = dma_buffer_memory(rounded);
    if (!b) return b.status().with_context(fmt::format("{}: DMA buffer of {} bytes", name_, rounded));
    std::scoped_lock lock(mutex_);
    nvme::DmaBuffer out{b->as<void>(), bus_address(b->as<void>(), rounded), rounded, ++next_id_};
    buffers_.emplace(out.id, std::move(*b));
    return out;
  }
  Status free_dma_buffer(std::uint64_t id) override {
    std::scoped_lock lock(mutex_);
    return buffers_.erase(id) != 0 ? Status::success()
                                   : error(StatusCode::NOT_FOUND, "{}: no DMA buffer {}", name_, id);
  }
  Result<nvme::CompletionQueueEntry> submit_admin(const nvme::SubmissionQueueEntry& command, std::uint64_t) override {
    nvme::CompletionQueueEntry cqe{};
    cqe.dw3 = nvme::CompletionQueueEntry::make_dw3(command.command_identifier, nvme::StatusField::make(0, 0, false, 1));
    return cqe;
  }
  Result<bool> abort(std::uint16_t, std::uint16_t, std::uint64_t) override { return false; }

 protected:
  /// `name` starts every error message ("null controller").
  explicit AgentNvmeController(std::string_view name) : name_(name) {}

  /// The memory of one I/O queue pair.
  struct QueuePair {
    nvme::QueuePairInfo info;
    AgentBuffer rings, words, commands;
    /// The controller's per-queue state (agent memory, kWordPageBytes - kQueueState bytes at most).
    void* state() const noexcept { return words.as<char>() + kQueueState; }
  };

  /// A servicing agent's view of queue pair `qid` (a trivially copyable struct with the members sq,
  /// cq, sq_tail_doorbell, cq_head_doorbell, depth, qid and a `state` pointer to the per-queue state).
  template <class View>
  static View queue_view(std::uint16_t qid, const QueuePair& q) {
    View v;
    v.sq = q.info.submission_queue;
    v.cq = q.info.completion_queue;
    v.sq_tail_doorbell = q.info.submission_queue_tail_doorbell;
    v.cq_head_doorbell = q.info.completion_queue_head_doorbell;
    v.depth = q.info.depth;
    v.qid = qid;
    v.state = static_cast<decltype(v.state)>(q.state());
    return v;
  }

  /// Bytes of controller-private command memory per queue entry (QueuePair::commands; 0: none).
  virtual std::size_t command_bytes_per_entry() const noexcept { return 0; }
  /// Writes a new queue pair's initial per-queue state at `state` (agent memory).
  virtual Status initialise_queue_state(void* state) = 0;
  /// Refuses memory the controller cannot reach (called by dma_map before anything is recorded).
  virtual Status check_dma_memory(void* address) { return (void)address, Status::success(); }
  /// The first bus address of `bytes` at `address` (pages follow at 4096-byte steps). Under mutex_.
  virtual std::uint64_t bus_address(void* address, std::size_t bytes) = 0;
  /// The memory of a DMA buffer of `bytes` (a multiple of 4096).
  virtual Result<AgentBuffer> dma_buffer_memory(std::size_t bytes) = 0;

  /// identity() after bring-up: LBA size 4096, MDTS 1 MiB, MPS 4096, kMaxQueueEntries,
  /// kMaxQueuePairs SQs and CQs, one namespace of `namespace_lbas` LBAs.
  void set_identity(std::uint32_t nsid, std::uint64_t namespace_lbas, std::string model) {
    identity_ = nvme::ControllerIdentity{};
    identity_.nsid = nsid;
    identity_.lba_size = 4096;
    identity_.namespace_size_lbas = namespace_lbas;
    identity_.max_data_transfer_bytes = 1u << 20;
    identity_.memory_page_size = 4096;
    identity_.max_queue_entries = kMaxQueueEntries;
    identity_.io_submission_queues_allocated = kMaxQueuePairs;
    identity_.io_completion_queues_allocated = kMaxQueuePairs;
    identity_.number_of_namespaces = 1;
    identity_.model_number = std::move(model);
  }

  std::string_view name() const noexcept { return name_; }

  mutable std::mutex mutex_;
  std::map<std::uint16_t, QueuePair> queues_;  ///< by qid, under mutex_

 private:
  Result<nvme::DmaMapping> map(void* address, std::size_t length, nvme::DmaMemoryKind kind) {
    const auto at = reinterpret_cast<std::uintptr_t>(address);
    if (address == nullptr || length == 0 || at % 4096 != 0 || length % 4096 != 0)
      return error(StatusCode::INVALID_ARGUMENT, "{}: dma_map({}, {} bytes) needs 4096-aligned, non-empty memory",
                   name_, address, length);
    TUTTI_RETURN_IF_ERROR(check_dma_memory(address));
    std::scoped_lock lock(mutex_);
    nvme::DmaMapping m;
    m.id = ++next_id_;
    m.host_address = address;
    m.length = length;
    m.memory_kind = kind;
    const std::uint64_t bus = bus_address(address, length);
    for (std::size_t page = 0; page < length / 4096; ++page) m.bus_addresses.push_back(bus + page * 4096);
    mappings_.emplace(m.id, length);
    return m;
  }

  std::string_view name_;
  nvme::ControllerIdentity identity_;
  std::map<std::uint64_t, std::size_t> mappings_;
  std::map<std::uint64_t, AgentBuffer> buffers_;
  std::uint64_t next_id_ = 0;
};

}  // namespace tutti::test
