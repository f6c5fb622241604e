// The register-level NVMe host driver (see tutti/libnvm/register_controller.hpp).
//
// Bring-up follows NVMe Base Specification 2.0, 3.5.1 "Memory-based Controller Initialization":
// disable (CC.EN = 0, wait CSTS.RDY = 0), program AQA/ASQ/ACQ, enable with CC.MPS/IOSQES/IOCQES,
// wait CSTS.RDY = 1, Identify Controller, Identify Namespace, Set Features - Number of Queues.
// Every wait is bounded by a deadline from accel::timer_ns(); a CSTS read of all ones means the
// device is gone, CSTS.CFS means it failed; both end waits with DEVICE_ERROR.
#include <tutti/libnvm/register_controller.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <tutti/accel/primitives.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/status.hpp>

namespace tutti::libnvm {
namespace {

using nvme::AdminOpcode;
using nvme::ControllerCapabilities;
using nvme::ControllerConfiguration;
using nvme::ControllerStatus;

/// Dword index in BAR0 of a register of nvme::ControllerRegisters (Base 2.0, Figure 33).
constexpr std::size_t register_index(std::size_t byte_offset) noexcept { return byte_offset / sizeof(std::uint32_t); }
constexpr std::size_t kRegisterCap = register_index(offsetof(nvme::ControllerRegisters, cap)),
                      kRegisterCc = register_index(offsetof(nvme::ControllerRegisters, cc)),
                      kRegisterCsts = register_index(offsetof(nvme::ControllerRegisters, csts)),
                      kRegisterAqa = register_index(offsetof(nvme::ControllerRegisters, aqa)),
                      kRegisterAsq = register_index(offsetof(nvme::ControllerRegisters, asq)),
                      kRegisterAcq = register_index(offsetof(nvme::ControllerRegisters, acq));
constexpr std::uint64_t kDisableOnDestroyTimeoutNs = 1'000'000'000;

struct IoQueuePair {
  QueuePairInfo info;
  DmaBuffer sq_memory;
  DmaBuffer cq_memory;
};

class RegisterController final : public Controller {
 public:
  explicit RegisterController(std::unique_ptr<RegisterTransport> transport) : transport_(std::move(transport)) {}

  ~RegisterController() override {
    std::lock_guard lock(mutex_);
    if (bar0() != nullptr && !controller_status_locked().device_gone()) {
      write_register(kRegisterCc, ControllerConfiguration::EN::encode(read_register(kRegisterCc), 0));
      if (!wait_ready_locked(false, kDisableOnDestroyTimeoutNs).is_ok()) return;  // device may still DMA: keep memory
    }
    release_all_locked();
  }

  std::string_view kind() const noexcept override { return transport_->kind(); }

  Status bring_up(const BringUpOptions& options) override {
    std::lock_guard lock(mutex_);
    if (options.admin_queue_depth < 2 || options.admin_queue_depth > 4096)
      return error(StatusCode::INVALID_ARGUMENT, "admin_queue_depth = {} is outside 2..4096",
                   options.admin_queue_depth);
    if (options.io_queue_pairs_requested == 0 || options.io_queue_pairs_requested == 0xffff)
      return error(StatusCode::INVALID_ARGUMENT, "io_queue_pairs_requested = {} is outside 1..65534",
                   options.io_queue_pairs_requested);
    if (options.nsid == 0 || options.nsid == 0xffffffffu)
      return error(StatusCode::INVALID_ARGUMENT, "nsid = {} is not a valid namespace identifier", options.nsid);
    if (controller_status_locked().device_gone())
      return error(StatusCode::DEVICE_ERROR, "CSTS reads all ones: device gone");
    brought_up_ = false;
    const ControllerCapabilities cap = read_capabilities();
    const std::uint64_t ready_timeout = options.ready_timeout_ns != 0
                                            ? options.ready_timeout_ns
                                            : std::max<std::uint64_t>(cap.timeout_ns(), 500'000'000);

    // 1. Disable and wait for CSTS.RDY = 0 (this also clears a fatal status).
    write_register(kRegisterCc, 0);
    TUTTI_RETURN_IF_ERROR(wait_ready_locked(false, ready_timeout).with_context("reset (CC.EN = 0)"));
    release_all_locked();

    // 2. Admin queue.
    const std::uint32_t depth = std::min<std::uint32_t>(options.admin_queue_depth, cap.max_queue_entries());
    auto asq = transport_->allocate_dma_buffer(depth * sizeof(nvme::SubmissionQueueEntry));
    if (!asq) return asq.status().with_context("admin submission queue memory");
    admin_sq_memory_ = *asq;
    auto acq = transport_->allocate_dma_buffer(depth * sizeof(nvme::CompletionQueueEntry));
    if (!acq) return acq.status().with_context("admin completion queue memory");
    admin_cq_memory_ = *acq;
    std::uint32_t aqa = 0;
    aqa = nvme::AdminQueueAttributes::ASQS::encode(aqa, depth - 1);
    aqa = nvme::AdminQueueAttributes::ACQS::encode(aqa, depth - 1);
    write_register(kRegisterAqa, aqa);
    write_register64(kRegisterAsq, admin_sq_memory_.bus_address);
    write_register64(kRegisterAcq, admin_cq_memory_.bus_address);

    // 3. Enable: 4 KiB pages (MPS 0), NVM command set, round robin, 64-byte SQEs, 16-byte CQEs.
    std::uint32_t cc = 0;
    cc = ControllerConfiguration::IOSQES::encode(cc, nvme::kSubmissionQueueEntrySizeLog2);
    cc = ControllerConfiguration::IOCQES::encode(cc, nvme::kCompletionQueueEntrySizeLog2);
    cc = ControllerConfiguration::EN::encode(cc, 1);
    write_register(kRegisterCc, cc);
    TUTTI_RETURN_IF_ERROR(wait_ready_locked(true, ready_timeout).with_context("enable (CC.EN = 1)"));

    const std::uint32_t dstrd = static_cast<std::uint32_t>(ControllerCapabilities::DSTRD::decode(cap.raw));
    admin_ = std::make_unique<nvme::QueuePairStorage>(
        static_cast<nvme::SubmissionQueueEntry*>(admin_sq_memory_.host_address),
        static_cast<nvme::CompletionQueueEntry*>(admin_cq_memory_.host_address),
        doorbell(nvme::submission_queue_tail_doorbell_offset(0, dstrd)),
        doorbell(nvme::completion_queue_head_doorbell_offset(0, dstrd)), bar0() + kRegisterCsts, depth, 0);
    brought_up_ = true;  // the admin queue works from here

    // 4. Identify Controller and Namespace.
    auto buffer = transport_->allocate_dma_buffer(4096);
    if (!buffer) return buffer.status().with_context("identify buffer");
    const DmaBuffer identify_buffer = *buffer;
    Status status = identify_locked(identify_buffer, options);
    const Status freed = transport_->free_dma_buffer(identify_buffer.id);
    if (!status.is_ok()) {
      brought_up_ = false;
      return status;
    }
    if (!freed.is_ok()) return freed.with_context("free identify buffer");
    identity_.memory_page_size = 4096;
    identity_.max_queue_entries = cap.max_queue_entries();
    identity_.doorbell_stride = dstrd;
    io_qid_in_use_.assign(identity_.io_submission_queues_allocated + 1u, false);
    return Status::success();
  }

  Status shutdown(std::uint64_t timeout_ns) override {
    std::lock_guard lock(mutex_);
    for (auto it = io_queues_.begin(); it != io_queues_.end();) {
      const std::uint16_t qid = it->first;
      ++it;
      TUTTI_RETURN_IF_ERROR(delete_io_queue_pair_locked(qid));
    }
    std::uint32_t cc = read_register(kRegisterCc);
    cc = ControllerConfiguration::SHN::encode(cc, nvme::kShutdownNormal);
    write_register(kRegisterCc, cc);
    const std::uint64_t deadline = accel::deadline_after(timeout_ns);
    accel::Backoff backoff;
    for (;;) {
      const ControllerStatus csts = controller_status_locked();
      if (csts.device_gone()) return error(StatusCode::DEVICE_ERROR, "shutdown: CSTS reads all ones: device gone");
      if (ControllerStatus::SHST::decode(csts.raw) == nvme::kShutdownStatusComplete) break;
      if (accel::timer_ns() >= deadline)
        return error(StatusCode::TIMEOUT, "shutdown: CSTS.SHST did not report completion within {} ns", timeout_ns);
      backoff.pause();
    }
    brought_up_ = false;
    return Status::success();
  }

  const ControllerIdentity& identity() const noexcept override { return identity_; }

  nvme::ControllerStatus controller_status() const noexcept override {
    return ControllerStatus{accel::mmio_load32(const_cast<RegisterController*>(this)->bar0() + kRegisterCsts)};
  }

  Result<QueuePairInfo> create_io_queue_pair(std::uint32_t depth) override {
    std::lock_guard lock(mutex_);
    if (!brought_up_) return error(StatusCode::NOT_READY, "create_io_queue_pair: controller not brought up");
    if (depth < 2 || depth > identity_.max_queue_entries)
      return error(StatusCode::INVALID_ARGUMENT, "depth = {} is outside 2..{} (CAP.MQES + 1)", depth,
                   identity_.max_queue_entries);
    std::uint16_t qid = 0;
    for (std::size_t i = 1; i < io_qid_in_use_.size(); ++i)
      if (!io_qid_in_use_[i]) {
        qid = static_cast<std::uint16_t>(i);
        break;
      }
    if (qid == 0)
      return error(StatusCode::RESOURCE_EXHAUSTED, "all {} allocated I/O queue pairs are in use",
                   identity_.io_submission_queues_allocated);
    if (nvme::completion_queue_head_doorbell_offset(qid, identity_.doorbell_stride) + 4 > transport_->bar0_size())
      return error(StatusCode::RESOURCE_EXHAUSTED, "queue {} has no doorbell inside BAR0", qid);

    IoQueuePair pair;
    auto cq_memory = transport_->allocate_dma_buffer(std::size_t{depth} * sizeof(nvme::CompletionQueueEntry));
    if (!cq_memory) return cq_memory.status().with_context("I/O completion queue memory");
    pair.cq_memory = *cq_memory;
    auto sq_memory = transport_->allocate_dma_buffer(std::size_t{depth} * sizeof(nvme::SubmissionQueueEntry));
    if (!sq_memory) {
      (void)transport_->free_dma_buffer(pair.cq_memory.id);
      return sq_memory.status().with_context("I/O submission queue memory");
    }
    pair.sq_memory = *sq_memory;

    nvme::SubmissionQueueEntry create_cq{};
    create_cq.opcode = static_cast<std::uint8_t>(AdminOpcode::create_io_completion_queue);
    create_cq.data_pointer.prp.prp1 = pair.cq_memory.bus_address;
    create_cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, qid), depth - 1);
    create_cq.cdw11 = nvme::CreateQueueFields::PC::encode(0, 1);
    auto cq_done = submit_admin_locked(create_cq, admin_timeout_ns_);
    Status status =
        cq_done ? check_completion(*cq_done, fmt::format("Create I/O Completion Queue {}", qid)) : cq_done.status();
    if (!status.is_ok()) {
      (void)transport_->free_dma_buffer(pair.sq_memory.id);
      (void)transport_->free_dma_buffer(pair.cq_memory.id);
      return status;
    }
    nvme::SubmissionQueueEntry create_sq{};
    create_sq.opcode = static_cast<std::uint8_t>(AdminOpcode::create_io_submission_queue);
    create_sq.data_pointer.prp.prp1 = pair.sq_memory.bus_address;
    create_sq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, qid), depth - 1);
    create_sq.cdw11 = nvme::CreateQueueFields::CQID::encode(nvme::CreateQueueFields::PC::encode(0, 1), qid);
    auto sq_done = submit_admin_locked(create_sq, admin_timeout_ns_);
    status =
        sq_done ? check_completion(*sq_done, fmt::format("Create I/O Submission Queue {}", qid)) : sq_done.status();
    if (!status.is_ok()) {
      (void)delete_queue_locked(AdminOpcode::delete_io_completion_queue, qid);
      (void)transport_->free_dma_buffer(pair.sq_memory.id);
      (void)transport_->free_dma_buffer(pair.cq_memory.id);
      return status;
    }
    QueuePairInfo& info = pair.info;
    info.qid = qid;
    info.depth = depth;
    info.submission_queue = static_cast<nvme::SubmissionQueueEntry*>(pair.sq_memory.host_address);
    info.completion_queue = static_cast<nvme::CompletionQueueEntry*>(pair.cq_memory.host_address);
    info.submission_queue_tail_doorbell =
        doorbell(nvme::submission_queue_tail_doorbell_offset(qid, identity_.doorbell_stride));
    info.completion_queue_head_doorbell =
        doorbell(nvme::completion_queue_head_doorbell_offset(qid, identity_.doorbell_stride));
    info.controller_status = bar0() + kRegisterCsts;
    info.doorbell_stride = identity_.doorbell_stride;
    info.submission_queue_bus_address = pair.sq_memory.bus_address;
    info.completion_queue_bus_address = pair.cq_memory.bus_address;
    io_qid_in_use_[qid] = true;
    io_queues_.emplace(qid, pair);
    return info;
  }

  Status delete_io_queue_pair(std::uint16_t qid) override {
    std::lock_guard lock(mutex_);
    return delete_io_queue_pair_locked(qid);
  }

  Result<DmaMapping> dma_map(void* host_address, std::size_t length) override {
    return transport_->dma_map(host_address, length);
  }
  Result<DmaMapping> dma_map_device(void* device_address, std::size_t length) override {
    return transport_->dma_map_device(device_address, length);
  }
  Status dma_unmap(std::uint64_t mapping_id) override { return transport_->dma_unmap(mapping_id); }
  Result<DmaBuffer> allocate_dma_buffer(std::size_t length) override { return transport_->allocate_dma_buffer(length); }
  Status free_dma_buffer(std::uint64_t id) override { return transport_->free_dma_buffer(id); }

  Result<nvme::CompletionQueueEntry> submit_admin(const nvme::SubmissionQueueEntry& command,
                                                  std::uint64_t timeout_ns) override {
    std::lock_guard lock(mutex_);
    return submit_admin_locked(command, timeout_ns);
  }

  Result<bool> abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t timeout_ns) override {
    nvme::SubmissionQueueEntry command{};
    command.opcode = static_cast<std::uint8_t>(AdminOpcode::abort);
    command.cdw10 = nvme::AbortFields::CID::encode(nvme::AbortFields::SQID::encode(0, sqid), cid);
    auto done = submit_admin(command, timeout_ns);
    if (!done) return done.status();
    TUTTI_RETURN_IF_ERROR(check_completion(*done, fmt::format("Abort of SQ {} CID {}", sqid, cid)));
    return nvme::AbortFields::NotAborted::decode(done->dw0) == 0;
  }

 private:
  volatile std::uint32_t* bar0() noexcept { return transport_->bar0(); }
  volatile std::uint32_t* doorbell(std::size_t byte_offset) noexcept { return bar0() + byte_offset / 4; }
  std::uint32_t read_register(std::size_t index) noexcept { return accel::mmio_load32(bar0() + index); }
  void write_register(std::size_t index, std::uint32_t value) noexcept { accel::mmio_store32(bar0() + index, value); }
  /// 64-bit registers are written as two 32-bit halves, low dword first.
  void write_register64(std::size_t index, std::uint64_t value) noexcept {
    write_register(index, static_cast<std::uint32_t>(value));
    write_register(index + 1, static_cast<std::uint32_t>(value >> 32));
  }
  ControllerCapabilities read_capabilities() noexcept {
    const std::uint64_t low = read_register(kRegisterCap);
    const std::uint64_t high = read_register(kRegisterCap + 1);
    return ControllerCapabilities{low | (high << 32)};
  }
  ControllerStatus controller_status_locked() noexcept { return ControllerStatus{read_register(kRegisterCsts)}; }

  /// Waits until CSTS.RDY == ready within timeout_ns (Base 2.0, 3.5.1 steps 2 and 6).
  Status wait_ready_locked(bool ready, std::uint64_t timeout_ns) {
    const std::uint64_t deadline = accel::deadline_after(timeout_ns);
    accel::Backoff backoff;
    for (;;) {
      const ControllerStatus csts = controller_status_locked();
      if (csts.device_gone()) return error(StatusCode::DEVICE_ERROR, "CSTS reads all ones: device gone");
      if (ready && ControllerStatus::CFS::decode(csts.raw) != 0)
        return error(StatusCode::DEVICE_ERROR, "CSTS.CFS (Controller Fatal Status) is set");
      if ((ControllerStatus::RDY::decode(csts.raw) != 0) == ready) return Status::success();
      if (accel::timer_ns() >= deadline)
        return error(StatusCode::TIMEOUT, "CSTS.RDY did not become {} within {} ns", ready ? 1 : 0, timeout_ns);
      backoff.pause();
    }
  }

  Result<nvme::CompletionQueueEntry> submit_admin_locked(const nvme::SubmissionQueueEntry& request,
                                                         std::uint64_t timeout_ns) {
    nvme::SubmissionQueueEntry command = request;
    if (!brought_up_ || !admin_) return error(StatusCode::NOT_READY, "admin command before a successful bring_up");
    const nvme::QueuePair& queue = admin_->queue();
    std::uint16_t cid = 0;
    if (!queue.allocate_command_identifier(cid))
      return error(StatusCode::RESOURCE_EXHAUSTED, "no free admin command identifier (earlier commands timed out)");
    command.command_identifier = cid;
    if (queue.submit(command) != StatusCode::OK) {
      queue.abandon(cid);
      queue.reap_completions();
      return error(StatusCode::RESOURCE_EXHAUSTED, "admin submission queue full");
    }
    const nvme::WaitResult waited = queue.wait_for_completion(cid, timeout_ns);
    if (waited.status == StatusCode::OK) return waited.completion;
    queue.abandon(cid);
    const std::string_view name = nvme::admin_opcode_name(command.opcode);
    if (waited.status == StatusCode::TIMEOUT)
      return error(StatusCode::TIMEOUT, "admin command {} (CID {}) did not complete within {} ns", name, cid,
                   timeout_ns);
    return error(StatusCode::DEVICE_ERROR, "admin command {} (CID {}): controller fatal status or device gone", name,
                 cid);
  }

  Status identify_locked(const DmaBuffer& buffer, const BringUpOptions& options) {
    admin_timeout_ns_ = options.admin_timeout_ns;
    nvme::SubmissionQueueEntry identify{};
    identify.opcode = static_cast<std::uint8_t>(AdminOpcode::identify);
    identify.data_pointer.prp.prp1 = buffer.bus_address;
    identify.cdw10 = nvme::IdentifyFields::CNS::encode(0, static_cast<std::uint32_t>(nvme::IdentifyCns::controller));
    auto done = submit_admin_locked(identify, options.admin_timeout_ns);
    if (!done) return done.status().with_context("Identify Controller");
    TUTTI_RETURN_IF_ERROR(check_completion(*done, "Identify Controller"));
    nvme::IdentifyController controller{};
    std::memcpy(&controller, buffer.host_address, sizeof controller);

    std::memset(buffer.host_address, 0, 4096);
    identify.nsid = options.nsid;
    identify.cdw10 =
        nvme::IdentifyFields::CNS::encode(0, static_cast<std::uint32_t>(nvme::IdentifyCns::namespace_data));
    done = submit_admin_locked(identify, options.admin_timeout_ns);
    if (!done) return done.status().with_context("Identify Namespace");
    if (nvme::is(done->status(), nvme::GenericStatus::invalid_namespace_or_format))
      return error(StatusCode::INVALID_ARGUMENT, "nsid = {} is not an active namespace ({})", options.nsid,
                   nvme::describe_status(done->status()));
    TUTTI_RETURN_IF_ERROR(check_completion(*done, "Identify Namespace"));
    nvme::IdentifyNamespace namespace_data{};
    std::memcpy(&namespace_data, buffer.host_address, sizeof namespace_data);

    nvme::SubmissionQueueEntry features{};
    features.opcode = static_cast<std::uint8_t>(AdminOpcode::set_features);
    features.cdw10 =
        nvme::FeatureFields::FID::encode(0, static_cast<std::uint32_t>(nvme::FeatureIdentifier::number_of_queues));
    const std::uint32_t requested = options.io_queue_pairs_requested - 1u;  // 0's based
    features.cdw11 =
        nvme::NumberOfQueuesFields::NCQR::encode(nvme::NumberOfQueuesFields::NSQR::encode(0, requested), requested);
    done = submit_admin_locked(features, options.admin_timeout_ns);
    if (!done) return done.status().with_context("Set Features - Number of Queues");
    TUTTI_RETURN_IF_ERROR(check_completion(*done, "Set Features - Number of Queues"));

    ControllerIdentity identity = ControllerIdentity::from_identify(controller, namespace_data, options.nsid);
    if (identity.lba_size == 0 || identity.namespace_size_lbas == 0)
      return error(StatusCode::DEVICE_ERROR,
                   "Identify Namespace {}: no usable LBA format (FLBAS {:#x}, NLBAF {}) or NSZE 0", options.nsid,
                   namespace_data.flbas, namespace_data.nlbaf);
    identity.max_data_transfer_bytes =
        controller.max_data_transfer_bytes(read_capabilities().memory_page_size_minimum());
    identity.io_submission_queues_allocated = static_cast<std::uint16_t>(std::min<std::uint32_t>(
        nvme::NumberOfQueuesFields::NSQR::decode(done->dw0) + 1u, options.io_queue_pairs_requested));
    identity.io_completion_queues_allocated = static_cast<std::uint16_t>(std::min<std::uint32_t>(
        nvme::NumberOfQueuesFields::NCQR::decode(done->dw0) + 1u, options.io_queue_pairs_requested));
    identity_ = std::move(identity);
    return Status::success();
  }

  Status delete_queue_locked(AdminOpcode opcode, std::uint16_t qid) {
    nvme::SubmissionQueueEntry command{};
    command.opcode = static_cast<std::uint8_t>(opcode);
    command.cdw10 = nvme::DeleteQueueFields::QID::encode(0, qid);
    auto done = submit_admin_locked(command, admin_timeout_ns_);
    if (!done) return done.status();
    return check_completion(*done, fmt::format("{} {}", nvme::admin_opcode_name(command.opcode), qid));
  }

  Status delete_io_queue_pair_locked(std::uint16_t qid) {
    auto it = io_queues_.find(qid);
    if (it == io_queues_.end()) return error(StatusCode::NOT_FOUND, "no I/O queue pair with qid = {}", qid);
    TUTTI_RETURN_IF_ERROR(delete_queue_locked(AdminOpcode::delete_io_submission_queue, qid));
    TUTTI_RETURN_IF_ERROR(delete_queue_locked(AdminOpcode::delete_io_completion_queue, qid));
    TUTTI_RETURN_IF_ERROR(transport_->free_dma_buffer(it->second.sq_memory.id));
    TUTTI_RETURN_IF_ERROR(transport_->free_dma_buffer(it->second.cq_memory.id));
    io_qid_in_use_[qid] = false;
    io_queues_.erase(it);
    return Status::success();
  }

  /// Frees every queue buffer after a reset (the controller no longer references them).
  void release_all_locked() {
    for (auto& [qid, pair] : io_queues_) {
      (void)transport_->free_dma_buffer(pair.sq_memory.id);
      (void)transport_->free_dma_buffer(pair.cq_memory.id);
    }
    io_queues_.clear();
    admin_.reset();
    if (admin_sq_memory_.id != 0) (void)transport_->free_dma_buffer(admin_sq_memory_.id);
    if (admin_cq_memory_.id != 0) (void)transport_->free_dma_buffer(admin_cq_memory_.id);
    admin_sq_memory_ = {};
    admin_cq_memory_ = {};
    std::fill(io_qid_in_use_.begin(), io_qid_in_use_.end(), false);
  }

  std::unique_ptr<RegisterTransport> transport_;
  std::mutex mutex_;  // serialises admin commands, bring-up and queue table changes
  bool brought_up_ = false;
  std::uint64_t admin_timeout_ns_ = 2'000'000'000;
  ControllerIdentity identity_;
  DmaBuffer admin_sq_memory_, admin_cq_memory_;
  std::unique_ptr<nvme::QueuePairStorage> admin_;
  std::map<std::uint16_t, IoQueuePair> io_queues_;
  std::vector<bool> io_qid_in_use_;
};

}  // namespace

std::unique_ptr<Controller> make_register_controller(std::unique_ptr<RegisterTransport> transport) {
  return std::make_unique<RegisterController>(std::move(transport));
}

}  // namespace tutti::libnvm
