// Benchmark support (not library code): the null controller of tests/support/null_controller.hpp
// behind the nvme::Controller interface, so the product's own DataPath (local_nvme) runs against
// it through the public runtime API, and a resolver of synthetic targets on its namespace.
//
//   NullNvmeController   create_io_queue_pair puts the SQ, CQ, doorbells, CSTS and the null
//                        controller's per-queue state in "agent memory": device memory in the cuda
//                        profile (the persistent GPU kernel services them), host memory in the host
//                        profile (host threads service them); null_agent.hpp starts and stops that
//                        service. dma_map / allocate_dma_buffer hand out bus addresses no device
//                        ever uses (no data moves), PRP list buffers in host memory. Admin commands
//                        complete at once with success; Abort finds nothing.
//   NullNamespaceResolver  "null://NAME?bytes=N": one extent of N bytes (a multiple of 4096) at
//                        LBA 0 of namespace 1, no file behind it.
//
// What it measures: the cost of the submission path itself (no data, a completion per command as
// fast as the servicing agent can post it). Errors of the Controller functions follow
// nvme/controller.hpp. Thread-safety: queue creation and DMA calls are serialised by one mutex;
// the queues follow nvme/queue.hpp's rules.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/nvme/registers.hpp>

#include "null_controller.hpp"  // tests/support

namespace tutti::bench::gpu {

/// One allocation in agent memory (accel::allocate_device: device memory in the cuda profile,
/// 4096-aligned host memory in the host profile), zeroed; freed on destruction.
class AgentBuffer {
 public:
  AgentBuffer() = default;
  static Result<AgentBuffer> allocate(std::size_t bytes) {
    auto p = accel::allocate_device(bytes);
    if (!p) return p.status();
    AgentBuffer b;
    b.data_ = *p;
    b.bytes_ = bytes;
    return b;
  }
  AgentBuffer(AgentBuffer&& other) noexcept { *this = std::move(other); }
  AgentBuffer& operator=(AgentBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  AgentBuffer(const AgentBuffer&) = delete;
  AgentBuffer& operator=(const AgentBuffer&) = delete;
  ~AgentBuffer() { accel::free_device(data_); }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class NullNvmeController final : public nvme::Controller {
 public:
  static constexpr std::uint64_t kNamespaceLbas = std::uint64_t{1} << 32;  // 16 TiB of 4 KiB LBAs
  static constexpr std::uint32_t kMaxQueueEntries = 65536;
  static constexpr std::uint16_t kMaxQueuePairs = 1024;

  std::string_view kind() const noexcept override { return "null"; }

  Status bring_up(const nvme::BringUpOptions& options) override {
    identity_ = nvme::ControllerIdentity{};
    identity_.nsid = options.nsid;
    identity_.lba_size = 4096;
    identity_.namespace_size_lbas = kNamespaceLbas;
    identity_.max_data_transfer_bytes = 1u << 20;
    identity_.memory_page_size = 4096;
    identity_.max_queue_entries = kMaxQueueEntries;
    identity_.io_submission_queues_allocated = kMaxQueuePairs;
    identity_.io_completion_queues_allocated = kMaxQueuePairs;
    identity_.number_of_namespaces = 1;
    identity_.model_number = "null controller (benchmark)";
    return Status::success();
  }
  Status shutdown(std::uint64_t) override { return Status::success(); }
  const nvme::ControllerIdentity& identity() const noexcept override { return identity_; }
  nvme::ControllerStatus controller_status() const noexcept override { return nvme::ControllerStatus{1}; }

  /// SQ, CQ, the two doorbells (64 bytes apart), CSTS (reads RDY) and the controller state, in
  /// agent memory. Errors: INVALID_ARGUMENT (depth outside 2..65536), RESOURCE_EXHAUSTED (queue
  /// IDs, memory), the accelerator's allocation and copy errors.
  Result<nvme::QueuePairInfo> create_io_queue_pair(std::uint32_t depth) override {
    if (depth < 2 || depth > kMaxQueueEntries)
      return error(StatusCode::INVALID_ARGUMENT, "null controller: depth = {} outside 2..{}", depth, kMaxQueueEntries);
    std::scoped_lock lock(mutex_);
    std::uint16_t qid = 1;
    while (queues_.count(qid) != 0) ++qid;
    if (qid > kMaxQueuePairs)
      return error(StatusCode::RESOURCE_EXHAUSTED, "null controller: {} queue pairs in use", kMaxQueuePairs);
    Queue q;
    auto rings =
        AgentBuffer::allocate(depth * (sizeof(nvme::SubmissionQueueEntry) + sizeof(nvme::CompletionQueueEntry)));
    if (!rings) return rings.status().with_context("null controller: queue rings");
    auto words = AgentBuffer::allocate(4096);  // doorbells at 0 and 64, CSTS at 128, controller state at 1024
    if (!words) return words.status().with_context("null controller: doorbells");
    q.rings = std::move(*rings);
    q.words = std::move(*words);
    const std::uint32_t ready = 1;  // CSTS.RDY
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(q.words.as<char>() + 128, &ready, sizeof(ready)));
    test::NullControllerState state{};
    state.drop_command = test::kNoDrop;
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(q.words.as<char>() + 1024, &state, sizeof(state)));
    q.info.qid = qid;
    q.info.depth = depth;
    q.info.submission_queue = q.rings.as<nvme::SubmissionQueueEntry>();
    q.info.completion_queue =
        reinterpret_cast<nvme::CompletionQueueEntry*>(q.rings.as<char>() + depth * sizeof(nvme::SubmissionQueueEntry));
    q.info.submission_queue_tail_doorbell = reinterpret_cast<volatile std::uint32_t*>(q.words.as<char>());
    q.info.completion_queue_head_doorbell = reinterpret_cast<volatile std::uint32_t*>(q.words.as<char>() + 64);
    q.info.controller_status = reinterpret_cast<const volatile std::uint32_t*>(q.words.as<char>() + 128);
    q.info.host_accessible = accel::kProfile == accel::Profile::host;  // cuda: device memory
    const nvme::QueuePairInfo info = q.info;
    queues_.emplace(qid, std::move(q));
    return info;
  }
  Status delete_io_queue_pair(std::uint16_t qid) override {
    std::scoped_lock lock(mutex_);
    if (queues_.erase(qid) == 0) return error(StatusCode::NOT_FOUND, "null controller: no queue pair {}", qid);
    return Status::success();
  }

  /// The null controller's view of queue pair `qid` (for the servicing agent), or an empty view.
  test::NullControllerQueue controller_view(std::uint16_t qid) const {
    std::scoped_lock lock(mutex_);
    test::NullControllerQueue view;
    const auto found = queues_.find(qid);
    if (found == queues_.end()) return view;
    const Queue& q = found->second;
    view.sq = q.info.submission_queue;
    view.cq = q.info.completion_queue;
    view.sq_tail_doorbell = q.info.submission_queue_tail_doorbell;
    view.cq_head_doorbell = q.info.completion_queue_head_doorbell;
    view.depth = q.info.depth;
    view.qid = qid;
    view.state = reinterpret_cast<test::NullControllerState*>(q.words.as<char>() + 1024);
    return view;
  }

  Result<nvme::DmaMapping> dma_map(void* host_address, std::size_t length) override {
    return map(host_address, length, nvme::DmaMemoryKind::host);
  }
  Result<nvme::DmaMapping> dma_map_device(void* device_address, std::size_t length) override {
    return map(device_address, length, nvme::DmaMemoryKind::device);
  }
  Status dma_unmap(std::uint64_t id) override {
    std::scoped_lock lock(mutex_);
    return mappings_.erase(id) != 0 ? Status::success()
                                    : error(StatusCode::NOT_FOUND, "null controller: no mapping {}", id);
  }
  Result<nvme::DmaBuffer> allocate_dma_buffer(std::size_t length) override {
    if (length == 0) return error(StatusCode::INVALID_ARGUMENT, "null controller: allocate_dma_buffer of 0 bytes");
    const std::size_t rounded = (length + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) return error(StatusCode::RESOURCE_EXHAUSTED, "null controller: no memory for {} bytes", rounded);
    std::memset(p, 0, rounded);
    std::scoped_lock lock(mutex_);
    nvme::DmaBuffer b{p, take_bus_range(rounded), rounded, ++next_id_};
    buffers_.emplace(b.id, b);
    return b;
  }
  Status free_dma_buffer(std::uint64_t id) override {
    std::scoped_lock lock(mutex_);
    const auto found = buffers_.find(id);
    if (found == buffers_.end()) return error(StatusCode::NOT_FOUND, "null controller: no DMA buffer {}", id);
    std::free(found->second.host_address);
    buffers_.erase(found);
    return Status::success();
  }
  Result<nvme::CompletionQueueEntry> submit_admin(const nvme::SubmissionQueueEntry& command, std::uint64_t) override {
    nvme::CompletionQueueEntry cqe{};
    cqe.dw3 = nvme::CompletionQueueEntry::make_dw3(command.command_identifier, nvme::StatusField::make(0, 0, false, 1));
    return cqe;
  }
  Result<bool> abort(std::uint16_t, std::uint16_t, std::uint64_t) override { return false; }

  ~NullNvmeController() override {
    for (auto& [id, b] : buffers_) std::free(b.host_address);
  }

 private:
  struct Queue {
    nvme::QueuePairInfo info;
    AgentBuffer rings, words;
  };
  Result<nvme::DmaMapping> map(void* address, std::size_t length, nvme::DmaMemoryKind kind) {
    const auto at = reinterpret_cast<std::uintptr_t>(address);
    if (address == nullptr || length == 0 || at % 4096 != 0 || length % 4096 != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "null controller: dma_map({}, {} bytes) needs 4096-aligned, non-empty memory", address, length);
    std::scoped_lock lock(mutex_);
    nvme::DmaMapping m;
    m.id = ++next_id_;
    m.host_address = address;
    m.length = length;
    m.memory_kind = kind;
    const std::uint64_t bus = take_bus_range(length);
    for (std::size_t page = 0; page < length / 4096; ++page) m.bus_addresses.push_back(bus + page * 4096);
    mappings_.emplace(m.id, length);
    return m;
  }
  /// A fresh range of bus addresses (never used by any device: nothing moves data here).
  std::uint64_t take_bus_range(std::size_t bytes) {
    const std::uint64_t at = next_bus_;
    next_bus_ += (bytes + 4095) / 4096 * 4096 + 4096;
    return at;
  }

  mutable std::mutex mutex_;
  nvme::ControllerIdentity identity_;
  std::map<std::uint16_t, Queue> queues_;
  std::map<std::uint64_t, std::size_t> mappings_;
  std::map<std::uint64_t, nvme::DmaBuffer> buffers_;
  std::uint64_t next_id_ = 0;
  std::uint64_t next_bus_ = std::uint64_t{1} << 40;
};

/// Resolves "null://NAME?bytes=N" (N a positive multiple of 4096) to one extent of N bytes at
/// device offset 0 of namespace 1, 4096-byte LBAs, no file (for NullNvmeController).
struct NullNamespaceResolver {
  using target_type = local_file::Target;
  static constexpr std::string_view scheme = "null";
  Result<local_file::Target> resolve(std::string_view uri, const OpenOptions& options) const {
    constexpr std::string_view prefix = "null://";
    const std::size_t query = uri.find("?bytes=");
    std::uint64_t bytes = 0;
    const char* first = query == std::string_view::npos ? nullptr : uri.data() + query + 7;
    const auto [end, ec] = first ? std::from_chars(first, uri.data() + uri.size(), bytes) : std::from_chars_result{};
    if (uri.substr(0, prefix.size()) != prefix || first == nullptr || ec != std::errc{} ||
        end != uri.data() + uri.size() || bytes == 0 || bytes % 4096 != 0)
      return error(StatusCode::INVALID_ARGUMENT, "'{}': expected null://NAME?bytes=N, N a positive multiple of 4096",
                   uri);
    local_file::Target t;
    t.path = std::string(uri);
    t.extents = {local_file::Extent{0, 0, bytes}};
    t.file_size = bytes;
    t.lba_size = 4096;
    t.nsid = 1;
    t.writable = options.writable;
    return t;
  }
};
static_assert(Resolver<NullNamespaceResolver>);

}  // namespace tutti::bench::gpu
