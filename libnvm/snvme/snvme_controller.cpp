// SnvmeController: see snvme_controller.hpp.
#include "snvme_controller.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <uapi/snvme.h>  // the driver's ABI, through libnvm's include directories (driver/snvme/include)

#include "snvme_argument.hpp"

namespace tutti::libnvm {
namespace {

constexpr std::uint64_t kRequiredCaps =
    SNVME_CAP_QUEUE_GROUPS | SNVME_CAP_DMA_HOST | SNVME_CAP_IDENTIFY | SNVME_CAP_ABORT;
constexpr std::size_t kPage = 4096;

StatusCode code_of(int err) {
  switch (err) {
    case EINVAL:
    case EFAULT: return StatusCode::INVALID_ARGUMENT;
    case ENOENT: return StatusCode::NOT_FOUND;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case EDQUOT: return StatusCode::RESOURCE_EXHAUSTED;  // EDQUOT: DMA_MAP past a sealed file's budget
    case EBUSY: return StatusCode::BUSY;
    case ETIMEDOUT: return StatusCode::TIMEOUT;
    case EOPNOTSUPP:
    case EPROTO:
    case ENOTTY: return StatusCode::UNSUPPORTED;
    default: return StatusCode::DEVICE_ERROR;
  }
}

Status errno_status(std::string_view what, int err) {
  return error(code_of(err), "{}: {} (errno {})", what, std::strerror(err), err);
}

}  // namespace

Result<std::unique_ptr<SnvmeController>> SnvmeController::open(std::string_view device_path) {
  std::string path(device_path);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return error(StatusCode::NOT_FOUND, "{}: no such device node (is snvme bound?)", path);
    return errno_status(fmt::format("open {}", path), err);
  }
  Status checked = check_file(fd, path);
  if (!checked.is_ok()) {
    ::close(fd);
    return checked;
  }
  return std::unique_ptr<SnvmeController>(new SnvmeController(fd, std::move(path)));
}

Status SnvmeController::check_file(int fd, const std::string& path) {
  auto info = snvme_argument<snvme_info>();
  if (::ioctl(fd, SNVME_IOC_GET_INFO, &info) != 0) return errno_status(fmt::format("{}: GET_INFO", path), errno);
  // ABI version and capabilities first: nothing else is trusted before these match.
  if (info.hdr.abi_version != SNVME_ABI_VERSION)
    return error(StatusCode::UNSUPPORTED, "{}: driver ABI version {} but libnvm speaks {}", path, info.hdr.abi_version,
                 SNVME_ABI_VERSION);
  if ((info.caps & kRequiredCaps) != kRequiredCaps)
    return error(StatusCode::UNSUPPORTED, "{}: driver capabilities {:#x} lack {:#x}", path, info.caps,
                 kRequiredCaps & ~info.caps);
  return Status::success();
}

Result<std::unique_ptr<SnvmeController>> SnvmeController::adopt(int fd, std::string_view name,
                                                                std::vector<AdoptedQueue> queues) {
  std::string path(name);
  if (fd < 0) return error(StatusCode::INVALID_ARGUMENT, "adopt {}: fd = {} is not an open file", path, fd);
  if (queues.empty()) {
    ::close(fd);
    return error(StatusCode::INVALID_ARGUMENT, "adopt {}: no queues to adopt", path);
  }
  Status checked = check_file(fd, path);
  if (!checked.is_ok()) {
    ::close(fd);
    return checked;
  }
  std::unique_ptr<SnvmeController> c(new SnvmeController(fd, std::move(path)));
  c->adopted_ = std::move(queues);
  c->adopting_ = true;
  return c;
}

SnvmeController::SnvmeController(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

SnvmeController::~SnvmeController() {
  {
    std::lock_guard lock(mutex_);
    (void)release_all_locked();
    if (doorbells_ != nullptr) ::munmap(const_cast<std::uint8_t*>(doorbells_), doorbell_bytes_);
    doorbells_ = nullptr;
    if (status_page_ != nullptr) ::munmap(const_cast<void*>(status_page_), SNVME_STATUS_BYTES);
    status_page_ = nullptr;
  }
  // Closing the fd deletes any queue still on the controller before unpinning (driver rule).
  if (fd_ >= 0) ::close(fd_);
}

Status SnvmeController::bring_up(const BringUpOptions& options) {
  std::lock_guard lock(mutex_);
  TUTTI_RETURN_IF_ERROR(release_all_locked());
  auto info = snvme_argument<snvme_info>();
  if (::ioctl(fd_, SNVME_IOC_GET_INFO, &info) != 0) return errno_status(fmt::format("{}: GET_INFO", path_), errno);
  if (options.io_queue_pairs_requested > info.user_queues)
    return error(StatusCode::INVALID_ARGUMENT,
                 "io_queue_pairs_requested = {} exceeds the driver's user queue budget of {} (snvme user_queues)",
                 options.io_queue_pairs_requested, info.user_queues);
  const snvme_ns_info* ns = nullptr;
  for (std::uint32_t i = 0; i < info.nr_namespaces && i < SNVME_MAX_NAMESPACES; ++i)
    if (info.ns[i].nsid == options.nsid) ns = &info.ns[i];
  if (ns == nullptr)
    return error(StatusCode::INVALID_ARGUMENT, "nsid = {} is not a namespace snvme serves ({} served)", options.nsid,
                 info.nr_namespaces);

  nvme::IdentifyController controller{};
  nvme::IdentifyNamespace namespace_data{};
  auto ident = snvme_argument<snvme_identify>();
  ident.cns = SNVME_IDENTIFY_CNS_CTRL;
  ident.data = reinterpret_cast<std::uintptr_t>(&controller);
  static_assert(sizeof(controller) == SNVME_IDENTIFY_BYTES);
  if (::ioctl(fd_, SNVME_IOC_IDENTIFY, &ident) != 0) return errno_status("Identify Controller", errno);
  ident.cns = SNVME_IDENTIFY_CNS_NS;
  ident.nsid = options.nsid;
  ident.data = reinterpret_cast<std::uintptr_t>(&namespace_data);
  static_assert(sizeof(namespace_data) == SNVME_IDENTIFY_BYTES);
  if (::ioctl(fd_, SNVME_IOC_IDENTIFY, &ident) != 0) return errno_status("Identify Namespace", errno);

  ControllerIdentity id = ControllerIdentity::from_identify(controller, namespace_data, options.nsid);
  if (id.lba_size != (1u << ns->lba_shift) || id.namespace_size_lbas != ns->nsze)
    return error(StatusCode::DEVICE_ERROR,
                 "Identify Namespace {} (LBA {} bytes, NSZE {}) disagrees with the driver's (LBA {}, NSZE {})",
                 options.nsid, id.lba_size, id.namespace_size_lbas, 1u << ns->lba_shift, ns->nsze);
  id.max_data_transfer_bytes = info.max_transfer;
  id.memory_page_size = info.page_size;
  id.max_queue_entries = info.max_queue_entries;
  id.doorbell_stride = static_cast<std::uint32_t>(nvme::ControllerCapabilities::DSTRD::decode(info.cap));  // raw
  id.io_submission_queues_allocated = info.user_queues;
  id.io_completion_queues_allocated = info.user_queues;

  if (doorbells_ == nullptr) {
    void* db = ::mmap(nullptr, info.doorbell_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, SNVME_MMAP_DOORBELLS);
    if (db == MAP_FAILED) return errno_status("mmap of the doorbell window", errno);
    doorbells_ = static_cast<volatile std::uint8_t*>(db);
    doorbell_bytes_ = info.doorbell_bytes;
  }
  if (status_page_ == nullptr && (info.caps & SNVME_CAP_STATUS) != 0) {
    void* page = ::mmap(nullptr, SNVME_STATUS_BYTES, PROT_READ, MAP_SHARED, fd_, SNVME_MMAP_STATUS);
    if (page == MAP_FAILED) return errno_status("mmap of the status page", errno);
    status_page_ = page;
  }
  identity_ = std::move(id);
  return Status::success();
}

Status SnvmeController::shutdown(std::uint64_t /*timeout_ns*/) {
  std::lock_guard lock(mutex_);
  return release_all_locked();
}

nvme::ControllerStatus SnvmeController::controller_status() const noexcept {
  if (status_page_ != nullptr)
    return nvme::ControllerStatus{static_cast<const volatile snvme_status*>(status_page_)->csts};
  auto info = snvme_argument<snvme_info>();
  if (::ioctl(fd_, SNVME_IOC_GET_INFO, &info) != 0) return nvme::ControllerStatus{0xffffffffu};
  return nvme::ControllerStatus{nvme::ControllerStatus::RDY::encode(0u, 1u)};
}

Result<QueuePairInfo> SnvmeController::create_io_queue_pair(std::uint32_t depth) {
  std::lock_guard lock(mutex_);
  if (doorbells_ == nullptr) return error(StatusCode::NOT_READY, "create_io_queue_pair before bring_up");
  if (depth < 2 || depth > identity_.max_queue_entries)
    return error(StatusCode::INVALID_ARGUMENT, "depth = {} is outside 2..{} (CAP.MQES + 1)", depth,
                 identity_.max_queue_entries);
  auto g = snvme_argument<snvme_queue_group>();
  if (adopting_) {
    // The groups exist already (created by the process that handed the file over): the next one, as it is.
    if (adopted_.empty())
      return error(StatusCode::RESOURCE_EXHAUSTED, "{}: every adopted queue pair is handed out", path_);
    const AdoptedQueue a = adopted_.front();
    if (a.entries != depth)
      return error(StatusCode::INVALID_ARGUMENT, "depth = {}, but the adopted queue pair {} has {} entries", depth,
                   a.qid, a.entries);
    adopted_.erase(adopted_.begin());
    g.group_id = a.group_id;
    g.queues[0] = snvme_queue_desc{a.qid,       0,           a.entries,  a.sq_doorbell, a.cq_doorbell,
                                   a.sq_offset, a.cq_offset, a.sq_bytes, a.cq_bytes};
    if (a.sq_doorbell + 4 > doorbell_bytes_ || a.cq_doorbell + 4 > doorbell_bytes_)
      return error(StatusCode::INVALID_ARGUMENT,
                   "adopted queue pair {}: doorbells {:#x}, {:#x} outside the {}-byte window", a.qid, a.sq_doorbell,
                   a.cq_doorbell, doorbell_bytes_);
  } else {
    g.nr_queues = 1;
    g.entries = depth;
    if (::ioctl(fd_, SNVME_IOC_CREATE_QUEUE_GROUP, &g) != 0)
      return errno_status(fmt::format("CREATE_QUEUE_GROUP of 1 pair x {} entries", depth), errno);
  }
  const snvme_queue_desc& d = g.queues[0];
  Ring ring{g.group_id, nullptr, nullptr, d.sq_bytes, d.cq_bytes};
  void* sq = ::mmap(nullptr, d.sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(d.sq_offset));
  void* cq = ::mmap(nullptr, d.cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(d.cq_offset));
  ring.sq = sq == MAP_FAILED ? nullptr : sq;
  ring.cq = cq == MAP_FAILED ? nullptr : cq;
  if (ring.sq == nullptr || ring.cq == nullptr) {
    int err = errno;
    (void)destroy_ring_locked(d.qid, ring);
    return errno_status("mmap of a queue ring", err);
  }
  rings_[d.qid] = ring;

  QueuePairInfo q;
  q.qid = d.qid;
  q.depth = d.entries;
  q.submission_queue = static_cast<nvme::SubmissionQueueEntry*>(ring.sq);
  q.completion_queue = static_cast<nvme::CompletionQueueEntry*>(ring.cq);
  q.submission_queue_tail_doorbell = reinterpret_cast<volatile std::uint32_t*>(doorbells_ + d.sq_doorbell);
  q.completion_queue_head_doorbell = reinterpret_cast<volatile std::uint32_t*>(doorbells_ + d.cq_doorbell);
  q.controller_status =
      status_page_ != nullptr ? &static_cast<const volatile snvme_status*>(status_page_)->csts : nullptr;
  q.doorbell_stride = identity_.doorbell_stride;
  return q;
}

Status SnvmeController::destroy_ring_locked(std::uint16_t qid, Ring& ring) {
  if (ring.sq != nullptr) ::munmap(ring.sq, ring.sq_bytes);
  if (ring.cq != nullptr) ::munmap(ring.cq, ring.cq_bytes);
  ring.sq = ring.cq = nullptr;
  auto arg = snvme_argument<snvme_group_id>();
  arg.group_id = ring.group_id;
  if (::ioctl(fd_, SNVME_IOC_DESTROY_QUEUE_GROUP, &arg) != 0)
    return errno_status(fmt::format("DESTROY_QUEUE_GROUP of QID {}", qid), errno);
  return Status::success();
}

Status SnvmeController::delete_io_queue_pair(std::uint16_t qid) {
  std::lock_guard lock(mutex_);
  auto it = rings_.find(qid);
  if (it == rings_.end())
    return error(StatusCode::NOT_FOUND, "qid = {} is not a queue pair of this controller object", qid);
  Status st = destroy_ring_locked(qid, it->second);
  rings_.erase(it);
  return st;
}

Result<DmaMapping> SnvmeController::dma_map_locked(void* host_address, std::size_t length) {
  const auto addr = reinterpret_cast<std::uintptr_t>(host_address);
  if (host_address == nullptr || length == 0 || addr % kPage != 0 || length % kPage != 0)
    return error(StatusCode::INVALID_ARGUMENT,
                 "host_address = {:#x}, length = {}: both must be non-zero multiples of {}", addr, length, kPage);
  DmaMapping m;
  m.bus_addresses.resize(length / kPage);
  auto arg = snvme_argument<snvme_dma_map>();
  arg.kind = SNVME_DMA_HOST;
  arg.vaddr = addr;
  arg.length = length;
  arg.bus_addrs = reinterpret_cast<std::uintptr_t>(m.bus_addresses.data());
  arg.max_addrs = m.bus_addresses.size();
  if (::ioctl(fd_, SNVME_IOC_DMA_MAP, &arg) != 0)
    return errno_status(fmt::format("DMA_MAP of {} bytes at {:#x}", length, addr), errno);
  m.id = arg.map_id;
  m.host_address = host_address;
  m.length = length;
  m.page_size = static_cast<std::uint32_t>(kPage);
  return m;
}

Result<DmaMapping> SnvmeController::dma_map(void* host_address, std::size_t length) {
  std::lock_guard lock(mutex_);
  return dma_map_locked(host_address, length);
}

Status SnvmeController::dma_unmap(std::uint64_t mapping_id) {
  std::lock_guard lock(mutex_);
  if (buffers_.count(mapping_id) != 0)
    return error(StatusCode::BUSY, "mapping_id = {} belongs to a DmaBuffer: use free_dma_buffer", mapping_id);
  auto arg = snvme_argument<snvme_dma_unmap>();
  arg.map_id = static_cast<std::uint32_t>(mapping_id);
  if (mapping_id == 0 || mapping_id > UINT32_MAX || ::ioctl(fd_, SNVME_IOC_DMA_UNMAP, &arg) != 0)
    return errno_status(fmt::format("DMA_UNMAP of mapping {}", mapping_id), mapping_id == 0 ? ENOENT : errno);
  return Status::success();
}

Result<DmaBuffer> SnvmeController::allocate_dma_buffer(std::size_t length) {
  std::lock_guard lock(mutex_);
  if (length == 0) return error(StatusCode::INVALID_ARGUMENT, "length = 0");
  const std::size_t bytes = (length + kPage - 1) / kPage * kPage;
  void* host = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (host == MAP_FAILED) return errno_status("mmap of a DMA buffer", errno);
  auto mapped = dma_map_locked(host, bytes);
  if (!mapped) {
    ::munmap(host, bytes);
    return mapped.status();
  }
  const DmaMapping& m = mapped.value();
  for (std::size_t i = 1; i < m.bus_addresses.size(); ++i) {
    if (m.bus_addresses[i] != m.bus_addresses[0] + i * kPage) {
      auto arg = snvme_argument<snvme_dma_unmap>();
      arg.map_id = static_cast<std::uint32_t>(m.id);
      (void)::ioctl(fd_, SNVME_IOC_DMA_UNMAP, &arg);
      ::munmap(host, bytes);
      return error(StatusCode::RESOURCE_EXHAUSTED,
                   "DMA buffer of {} bytes is not contiguous in bus space (page {} breaks it; no IOMMU?)", bytes, i);
    }
  }
  buffers_[m.id] = Buffer{host, bytes, static_cast<std::uint32_t>(m.id)};
  return DmaBuffer{host, m.bus_addresses[0], bytes, m.id};
}

Status SnvmeController::free_dma_buffer(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = buffers_.find(id);
  if (it == buffers_.end())
    return error(StatusCode::NOT_FOUND, "id = {} is not a DmaBuffer of this controller object", id);
  auto arg = snvme_argument<snvme_dma_unmap>();
  arg.map_id = it->second.map_id;
  Status st;
  if (::ioctl(fd_, SNVME_IOC_DMA_UNMAP, &arg) != 0) st = errno_status("DMA_UNMAP of a DMA buffer", errno);
  ::munmap(it->second.host, it->second.length);
  buffers_.erase(it);
  return st;
}

Result<nvme::CompletionQueueEntry> SnvmeController::submit_admin(const nvme::SubmissionQueueEntry& command,
                                                                 std::uint64_t /*timeout_ns*/) {
  return error(StatusCode::UNSUPPORTED,
               "admin opcode {:#04x}: the snvme kernel driver owns the admin queue (Identify and Abort are "
               "available through bring_up/identity and abort)",
               command.opcode);
}

Result<bool> SnvmeController::abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t /*timeout_ns*/) {
  std::lock_guard lock(mutex_);
  auto arg = snvme_argument<snvme_abort>();
  arg.sqid = sqid;
  arg.cid = cid;
  if (::ioctl(fd_, SNVME_IOC_ABORT, &arg) != 0)
    return errno_status(fmt::format("ABORT of CID {:#x} on SQ {}", cid, sqid), errno);
  return nvme::AbortFields::NotAborted::decode(arg.result) == 0;  // Abort DW0 bit 0 clear: the command was aborted
}

Result<SnvmeController::DriverCounters> SnvmeController::driver_counters() const {
  auto info = snvme_argument<snvme_info>();
  if (::ioctl(fd_, SNVME_IOC_GET_INFO, &info) != 0) return errno_status("GET_INFO", errno);
  return DriverCounters{info.pinned_pages, info.dma_maps, info.queue_groups, info.user_queues, info.user_queues_free};
}

Status SnvmeController::release_all_locked() {
  Status first;
  for (auto& [qid, ring] : rings_) {
    Status st = destroy_ring_locked(qid, ring);
    if (first.is_ok() && !st.is_ok()) first = st;
  }
  rings_.clear();
  for (auto& [id, buffer] : buffers_) {
    auto arg = snvme_argument<snvme_dma_unmap>();
    arg.map_id = buffer.map_id;
    if (::ioctl(fd_, SNVME_IOC_DMA_UNMAP, &arg) != 0 && first.is_ok()) first = errno_status("DMA_UNMAP", errno);
    ::munmap(buffer.host, buffer.length);
  }
  buffers_.clear();
  return first;
}

}  // namespace tutti::libnvm
