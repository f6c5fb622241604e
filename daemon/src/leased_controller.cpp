// An nvme::Controller over the queue pairs of one tuttid lease: see leased_controller.hpp.
#include "leased_controller.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <system_error>

#include <fmt/format.h>

#include <tutti/core/counted.hpp>

#include "protocol.hpp"
#include "snvme_controller.hpp"  // libnvm's controller over /dev/snvme<C> (PCI leases)

namespace tutti::daemon {

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMaxHostMemoryBytes = std::size_t{1} << 40;  // protocol.cpp's limit on "length"
constexpr std::uint64_t kMaxPinnedBytes = std::uint64_t{1} << 50;  // protocol.cpp's limit on "pinned_bytes"
constexpr int kWatchIntervalMs = 10;                               // how old the queues' CSTS copy may be

/// tuttid's error answer {"ok": false, "error": {"code", "message"}} as a Status of the matching code.
Status refused(std::string_view what, const nlohmann::json& response) {
  const nlohmann::json& e = response.value("error", nlohmann::json::object());
  const std::string code = e.value("code", std::string("internal"));
  const std::string message = e.value("message", response.dump());
  StatusCode status = StatusCode::INTERNAL;
  if (code == errors::kExhausted || code == errors::kOverLimit) status = StatusCode::RESOURCE_EXHAUSTED;
  if (code == errors::kPermissionDenied) status = StatusCode::UNSUPPORTED;
  if (code == errors::kNotFound) status = StatusCode::NOT_FOUND;
  if (code == errors::kUnavailable || code == errors::kDraining) status = StatusCode::NOT_READY;
  if (code == errors::kBadRequest || code == errors::kUnsupportedVersion) status = StatusCode::INVALID_ARGUMENT;
  return error(status, "{}: tuttid answered {}: {}", what, code, message);
}

/// A JSON field of tuttid's answer that must be an unsigned number.
Result<std::uint64_t> field(const nlohmann::json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  if (it == object.end() || !it->is_number_unsigned())
    return error(StatusCode::INTERNAL, "tuttid's acquire answer has no unsigned \"{}\" (it has {})", key,
                 object.dump());
  return it->get<std::uint64_t>();
}

}  // namespace

LeasedController::LeasedController(Connection connection, LeaseOptions options)
    : connection_(std::move(connection)), options_(std::move(options)) {}

Result<std::unique_ptr<LeasedController>> LeasedController::acquire(const LeaseOptions& options) {
  if (options.controller.empty() || options.controller.size() > 32)
    return error(StatusCode::INVALID_ARGUMENT, "LeaseOptions::controller = \"{}\": expected a name of 1 to 32 bytes",
                 options.controller);
  if (options.queues == 0 || options.queues > 65535)
    return error(StatusCode::INVALID_ARGUMENT, "LeaseOptions::queues = {} outside 1..65535", options.queues);
  if (options.pinned_bytes == 0 || options.pinned_bytes > kMaxPinnedBytes)
    return error(StatusCode::INVALID_ARGUMENT, "LeaseOptions::pinned_bytes = {} outside 1..{}", options.pinned_bytes,
                 kMaxPinnedBytes);
  if (options.timeout_ns == 0)
    return error(StatusCode::INVALID_ARGUMENT, "LeaseOptions::timeout_ns = 0: every call to tuttid needs a bound");
  auto connection = Connection::connect(options.socket_path);
  if (!connection) return connection.status();
  std::unique_ptr<LeasedController> c(new (std::nothrow) LeasedController(std::move(connection.value()), options));
  if (!c) return error(StatusCode::RESOURCE_EXHAUSTED, "LeasedController: no memory");
  const nlohmann::json request{{"tutti", kProtocolVersion},
                               {"op", "acquire"},
                               {"controller", options.controller},
                               {"queues", options.queues},
                               {"pinned_bytes", options.pinned_bytes}};
  std::vector<int> fds;
  auto answer = c->connection_.call(request, options.timeout_ns, {}, fds);
  if (!answer) {
    for (int fd : fds) ::close(fd);
    return answer.status().with_context(fmt::format("acquire {}", options.controller));
  }
  if (answer->value("ok", false) != true) {
    for (int fd : fds) ::close(fd);
    return refused(fmt::format("acquire {} ({}, {} pinned bytes)", options.controller, counted(options.queues, "queue"),
                               options.pinned_bytes),
                   *answer);
  }
  if (!(*answer).contains("lease") || !(*answer)["lease"].is_object()) {
    for (int fd : fds) ::close(fd);
    return error(StatusCode::INTERNAL, "tuttid's acquire answer has no lease: {}", answer->dump());
  }
  c->lease_id_ = (*answer)["lease"].value("id", std::uint64_t{0});
  // From here on the destructor releases the lease, whatever fails below.
  Status mapped = c->map_lease((*answer)["lease"], fds);
  for (int fd : fds) ::close(fd);  // the mappings keep the memfds alive
  if (mapped.is_ok()) mapped = c->start_watcher();
  if (!mapped.is_ok()) return mapped.with_context(fmt::format("lease {} on {}", c->lease_id_, options.controller));
  return Result<std::unique_ptr<LeasedController>>(std::move(c));
}

Status LeasedController::map_lease(const nlohmann::json& lease, const std::vector<int>& fds) {
  if (lease_id_ == 0) return error(StatusCode::INTERNAL, "tuttid's acquire answer has no lease id: {}", lease.dump());
  auto nsid = field(lease, "nsid");
  auto lba_size = field(lease, "lba_size");
  auto lbas = field(lease, "namespace_size_lbas");
  auto mdts = field(lease, "max_data_transfer_bytes");
  auto page = field(lease, "memory_page_size");
  auto stride = field(lease, "doorbell_stride");
  auto depth = field(lease, "queue_depth");
  for (const auto* f : {&nsid, &lba_size, &lbas, &mdts, &page, &stride, &depth})
    if (!f->is_ok()) return f->status();
  // 32-bit fields refused, not truncated, when tuttid's answer does not fit them.
  for (const auto& [key, value] :
       {std::pair{"nsid", *nsid}, std::pair{"lba_size", *lba_size}, std::pair{"memory_page_size", *page},
        std::pair{"doorbell_stride", *stride}, std::pair{"queue_depth", *depth}})
    if (value > 0xFFFFFFFFu)
      return error(StatusCode::INTERNAL, "tuttid's acquire answer has \"{}\": {}, above 2^32-1 (4294967295)", key,
                   value);
  identity_.nsid = static_cast<std::uint32_t>(*nsid);
  identity_.lba_size = static_cast<std::uint32_t>(*lba_size);
  identity_.namespace_size_lbas = *lbas;
  identity_.max_data_transfer_bytes = *mdts;
  identity_.memory_page_size = static_cast<std::uint32_t>(*page);
  identity_.doorbell_stride = static_cast<std::uint32_t>(*stride);
  identity_.max_queue_entries = static_cast<std::uint32_t>(*depth);
  identity_.number_of_namespaces = 1;
  const nlohmann::json namespaces = lease.value("namespaces", nlohmann::json::array());
  if (!namespaces.is_array())
    return error(StatusCode::INTERNAL, "tuttid's acquire answer has \"namespaces\": {}; expected an array",
                 namespaces.dump());
  for (const nlohmann::json& n : namespaces) {
    // A string field of the namespace, empty when absent; nullopt when it is there but not a string.
    auto text = [&n](const char* key) -> std::optional<std::string> {
      if (!n.contains(key)) return std::string();
      if (!n[key].is_string()) return std::nullopt;
      return n[key].get<std::string>();
    };
    const auto mount = text("mount"), filesystem = text("filesystem"), device = text("block_device"),
               state = text("mount_state");
    if (!n.contains("nsid") || !n["nsid"].is_number_unsigned() || n["nsid"].get<std::uint64_t>() > 0xFFFFFFFFu ||
        !mount || !filesystem || !device || !state)
      return error(StatusCode::INTERNAL,
                   "tuttid's namespace {} is not {{nsid (at most 2^32-1), mount, filesystem, ...}}", n.dump());
    namespaces_.push_back({n["nsid"].get<std::uint32_t>(), *mount, *filesystem, *device, *state});
  }
  if (lease.contains("snvme")) return map_snvme_lease(lease["snvme"], fds);
  // Soft mode: BAR0 and the rings are memfds that came with the answer; "fd" indexes `fds`. Every range,
  // ring and doorbell is checked against what was mapped: the answer decides where this process writes.
  const nlohmann::json shared = lease.value("shared_memory", nlohmann::json());
  if (!shared.is_object() || !shared.contains("bar0") || !shared["bar0"].is_object())
    return error(StatusCode::UNSUPPORTED,
                 "tuttid's lease has neither shared memory (soft controller) nor an snvme file (PCI controller): {}",
                 lease.dump());
  // Maps range {fd, offset, length} and returns its bytes [offset, length) of the memfd.
  auto map = [&](const nlohmann::json& range, const char* what) -> Result<std::span<std::uint8_t>> {
    if (!range.is_object()) return error(StatusCode::INTERNAL, "tuttid's {} is not a range: {}", what, range.dump());
    const std::uint64_t index = range.value("fd", std::numeric_limits<std::uint64_t>::max());
    const std::uint64_t offset = range.value("offset", std::numeric_limits<std::uint64_t>::max());
    const std::uint64_t length = range.value("length", std::uint64_t{0});
    if (index >= fds.size() || length == 0 || offset >= length)
      return error(StatusCode::INTERNAL, "tuttid's {} range {} does not fit the {} descriptors sent", what,
                   range.dump(), fds.size());
    void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fds[index], 0);
    if (base == MAP_FAILED)
      return error(StatusCode::RESOURCE_EXHAUSTED, "mmap of tuttid's {} ({} bytes): {}", what, length,
                   std::strerror(errno));
    shared_.push_back({base, length});
    return std::span<std::uint8_t>(static_cast<std::uint8_t*>(base) + offset, length - offset);
  };
  auto bar = map(shared["bar0"], "BAR0");
  if (!bar) return bar.status();
  // A 4-byte register at `offset` of BAR0, or null when it lies outside the mapping.
  auto bar_word = [&bar](std::uint64_t offset) -> volatile std::uint32_t* {
    if (offset % 4 != 0 || offset > bar->size() - 4) return nullptr;
    return reinterpret_cast<volatile std::uint32_t*>(bar->data() + offset);
  };
  csts_ = bar_word(shared.value("csts_offset", std::uint64_t{0x1c}));
  if (csts_ == nullptr) return error(StatusCode::INTERNAL, "tuttid's csts_offset lies outside BAR0");
  queue_csts_.store(*csts_, std::memory_order_relaxed);
  const nlohmann::json queues = shared.value("queues", nlohmann::json::array());
  if (!queues.is_array()) return error(StatusCode::INTERNAL, "tuttid's queues are not a list: {}", queues.dump());
  for (const nlohmann::json& q : queues) {
    if (!q.is_object()) return error(StatusCode::INTERNAL, "tuttid's queue is not an object: {}", q.dump());
    nvme::QueuePairInfo info;
    info.qid = q.value("qid", std::uint16_t{0});
    info.depth = q.value("depth", std::uint32_t{0});
    if (info.qid == 0 || info.depth != identity_.max_queue_entries)
      return error(StatusCode::INTERNAL, "tuttid's queue {} does not match the lease's depth {}", q.dump(),
                   identity_.max_queue_entries);
    auto sq = map(q.value("sq", nlohmann::json()), "submission queue");
    if (!sq) return sq.status();
    auto cq = map(q.value("cq", nlohmann::json()), "completion queue");
    if (!cq) return cq.status();
    if (sq->size() < std::size_t{info.depth} * sizeof(nvme::SubmissionQueueEntry) ||
        cq->size() < std::size_t{info.depth} * sizeof(nvme::CompletionQueueEntry))
      return error(StatusCode::INTERNAL, "tuttid's rings of queue {} hold fewer than its {} entries", info.qid,
                   info.depth);
    info.submission_queue = reinterpret_cast<nvme::SubmissionQueueEntry*>(sq->data());
    info.completion_queue = reinterpret_cast<nvme::CompletionQueueEntry*>(cq->data());
    info.submission_queue_tail_doorbell = bar_word(q.value("sq_tail_doorbell_offset", std::uint64_t{1}));
    info.completion_queue_head_doorbell = bar_word(q.value("cq_head_doorbell_offset", std::uint64_t{1}));
    if (info.submission_queue_tail_doorbell == nullptr || info.completion_queue_head_doorbell == nullptr)
      return error(StatusCode::INTERNAL, "tuttid's doorbells of queue {} lie outside BAR0", info.qid);
    // The word the watcher keeps: the controller's CSTS, or all ones once the lease is gone.
    info.controller_status = reinterpret_cast<const volatile std::uint32_t*>(&queue_csts_);
    info.doorbell_stride = identity_.doorbell_stride;
    queues_.push_back(info);
    qids_.push_back(info.qid);
  }
  if (queues_.size() != options_.queues)
    return error(StatusCode::INTERNAL, "tuttid granted {} queues with memory, {} asked", queues_.size(),
                 options_.queues);
  handed_out_.assign(queues_.size(), false);
  identity_.io_submission_queues_allocated = static_cast<std::uint16_t>(queues_.size());
  identity_.io_completion_queues_allocated = static_cast<std::uint16_t>(queues_.size());
  return Status::success();
}

Status LeasedController::map_snvme_lease(const nlohmann::json& snvme, const std::vector<int>& fds) {
  const std::uint64_t index = snvme.is_object() ? snvme.value("fd", std::uint64_t{fds.size()}) : fds.size();
  const nlohmann::json queues = snvme.is_object() ? snvme.value("queues", nlohmann::json()) : nlohmann::json();
  if (index >= fds.size() || !queues.is_array() || queues.size() != options_.queues)
    return error(StatusCode::INTERNAL, "tuttid's snvme lease {} does not fit the {} descriptors sent and {} queues",
                 snvme.dump(), fds.size(), options_.queues);
  std::vector<libnvm::SnvmeController::AdoptedQueue> adopted;
  for (const nlohmann::json& q : queues) {
    libnvm::SnvmeController::AdoptedQueue a;
    try {
      a.group_id = q.at("group_id").get<std::uint32_t>();
      a.qid = q.at("qid").get<std::uint16_t>();
      a.entries = q.at("entries").get<std::uint32_t>();
      a.sq_doorbell = q.at("sq_doorbell").get<std::uint32_t>();
      a.cq_doorbell = q.at("cq_doorbell").get<std::uint32_t>();
      a.sq_offset = q.at("sq_offset").get<std::uint64_t>();
      a.cq_offset = q.at("cq_offset").get<std::uint64_t>();
      a.sq_bytes = q.at("sq_bytes").get<std::uint32_t>();
      a.cq_bytes = q.at("cq_bytes").get<std::uint32_t>();
    } catch (const nlohmann::json::exception& e) {
      return error(StatusCode::INTERNAL, "tuttid's snvme queue {}: {}", q.dump(), e.what());
    }
    if (a.entries != identity_.max_queue_entries)
      return error(StatusCode::INTERNAL, "tuttid's snvme queue {} does not match the lease's depth {}", q.dump(),
                   identity_.max_queue_entries);
    adopted.push_back(a);
  }
  // The answer's descriptors are closed by acquire: the adopted controller owns a copy of the file.
  const int fd = ::fcntl(fds[index], F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return error(StatusCode::RESOURCE_EXHAUSTED, "dup of the lease's file: {}", std::strerror(errno));
  auto adopted_controller = libnvm::SnvmeController::adopt(
      fd, fmt::format("the sealed file of lease {} on {}", lease_id_, options_.controller), std::move(adopted));
  if (!adopted_controller) return adopted_controller.status();
  snvme_ = std::move(adopted_controller.value());
  nvme::BringUpOptions up;
  up.nsid = identity_.nsid;
  up.io_queue_pairs_requested = static_cast<std::uint16_t>(options_.queues);
  TUTTI_RETURN_IF_ERROR(snvme_->bring_up(up));
  for (std::uint32_t i = 0; i < options_.queues; ++i) {
    auto pair = snvme_->create_io_queue_pair(identity_.max_queue_entries);
    if (!pair) return pair.status();
    if (pair->controller_status == nullptr)
      return error(StatusCode::UNSUPPORTED, "{}: the driver has no status page (SNVME_CAP_STATUS)",
                   options_.controller);
    csts_ = pair->controller_status;
    // The word the watcher keeps: the driver's CSTS of this file, or all ones once the lease is gone.
    pair->controller_status = reinterpret_cast<const volatile std::uint32_t*>(&queue_csts_);
    queues_.push_back(*pair);
    qids_.push_back(pair->qid);
  }
  queue_csts_.store(*csts_, std::memory_order_relaxed);
  handed_out_.assign(queues_.size(), false);
  identity_.io_submission_queues_allocated = static_cast<std::uint16_t>(queues_.size());
  identity_.io_completion_queues_allocated = static_cast<std::uint16_t>(queues_.size());
  return Status::success();
}

Status LeasedController::start_watcher() {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0)
    return error(StatusCode::RESOURCE_EXHAUSTED, "eventfd for the lease watcher: {}", std::strerror(errno));
  try {
    watcher_ = std::thread([this] { watch(); });
  } catch (const std::system_error& e) {
    return error(StatusCode::RESOURCE_EXHAUSTED, "the lease watcher thread: {}", e.what());
  }
  return Status::success();
}

void LeasedController::mark_gone(const std::string& why) {
  if (broken_.is_ok()) broken_ = error(StatusCode::DEVICE_ERROR, "lease {}: {}", lease_id_, why);
  gone_.store(true, std::memory_order_relaxed);
  queue_csts_.store(0xffffffffu, std::memory_order_relaxed);  // "device gone" to every leased queue
}

void LeasedController::watch() {
  bool readable = true;  // false once a call failed: nothing reads the socket then, only hang-up counts
  for (;;) {
    if (!gone_.load(std::memory_order_relaxed)) queue_csts_.store(*csts_, std::memory_order_relaxed);
    pollfd p[2] = {{stop_fd_, POLLIN, 0}, {connection_.fd(), static_cast<short>(readable ? POLLIN : 0), 0}};
    const int ready = ::poll(p, gone_.load(std::memory_order_relaxed) ? 1 : 2, kWatchIntervalMs);
    if (ready > 0 && (p[0].revents & POLLIN)) return;
    if (gone_.load(std::memory_order_relaxed)) continue;
    // Events (and a closed connection) are read only while no call is in flight: a call keeps the events it
    // meets for next_event, and any message that arrives outside a call is an event. A busy mutex (a call in
    // flight) waits for the next interval.
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) continue;
    if (!broken_.is_ok()) {
      // A call failed: no event can be read any more. The lease is gone when the connection is (closed by
      // tuttid, or garbage from it); after a timeout it may live on, so the queues keep working until tuttid
      // closes the connection.
      readable = false;
      if (broken_.code() == StatusCode::DEVICE_ERROR || (p[1].revents & (POLLHUP | POLLERR)) != 0)
        mark_gone(broken_.message());
      continue;
    }
    for (;;) {
      auto event = connection_.next_event((p[1].revents & (POLLIN | POLLHUP | POLLERR)) ? 1'000'000 : 0);
      if (!event) {
        if (event.code() != StatusCode::TIMEOUT) mark_gone(event.status().message());
        break;
      }
      if (event->value("event", std::string()) == "revoked" && event->value("lease", std::uint64_t{0}) == lease_id_)
        mark_gone("revoked by tuttid: " + event->value("reason", std::string("no reason given")));
    }
  }
}

LeasedController::~LeasedController() {
  if (watcher_.joinable()) {
    const std::uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    watcher_.join();
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
  if (lease_id_ != 0) {
    // tuttid deletes the queues before it answers (Delete I/O SQ ends every command in them), so once the
    // answer is here no command can touch the memory unmapped below. Without an answer (tuttid gone or slow)
    // the lease ends when this process does; the daemon keeps its own mappings of the memfds until then.
    std::lock_guard lock(mutex_);
    std::vector<int> fds;
    (void)call(nlohmann::json{{"tutti", kProtocolVersion}, {"op", "release"}, {"lease", lease_id_}}, {}, fds);
    for (int fd : fds) ::close(fd);
  }
  // PCI: the driver unmaps and unpins this process's DMA maps (the queues are deleted by now, or are deleted
  // first when this copy of the file is the last one) before the memory below goes.
  snvme_.reset();
  for (const Region& r : regions_) ::munmap(r.address, r.length);
  for (const Shared& s : shared_) ::munmap(s.base, s.length);
}

Result<nlohmann::json> LeasedController::call(const nlohmann::json& request, const std::vector<int>& fds_out,
                                              std::vector<int>& fds_in) {
  if (!broken_.is_ok()) return broken_;
  auto answer = connection_.call(request, options_.timeout_ns, fds_out, fds_in);
  if (!answer) {
    // A late answer to this request would be read as the next one's: no call may follow.
    broken_ = answer.status().with_context(fmt::format("lease {}: the connection to tuttid is unusable after \"{}\"",
                                                       lease_id_, request.value("op", std::string())));
    return broken_;
  }
  return answer;
}

Result<void*> LeasedController::allocate_host_memory(std::size_t length) {
  std::lock_guard lock(mutex_);
  if (snvme_) {
    // PCI: the driver pins any memory of this process; dma_map (the DataPath's registration) maps it.
    if (length == 0 || length > kMaxHostMemoryBytes)
      return error(StatusCode::INVALID_ARGUMENT, "LeasedController::allocate_host_memory: length = {} outside 1..{}",
                   length, kMaxHostMemoryBytes);
    const std::size_t bytes = (length + kPage - 1) / kPage * kPage;
    void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED)
      return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_host_memory: mmap of {} bytes: {}", bytes,
                   std::strerror(errno));
    Region region;
    region.address = static_cast<std::uint8_t*>(address);
    region.length = bytes;
    regions_.push_back(std::move(region));
    return address;
  }
  auto region = register_region(length);
  if (!region) return region.status();
  return static_cast<void*>((*region)->address);
}

Result<LeasedController::Region*> LeasedController::register_region(std::size_t length) {
  if (length == 0 || length > kMaxHostMemoryBytes)
    return error(StatusCode::INVALID_ARGUMENT, "LeasedController::allocate_host_memory: length = {} outside 1..{}",
                 length, kMaxHostMemoryBytes);
  const std::size_t bytes = (length + kPage - 1) / kPage * kPage;
  const int memfd = ::memfd_create("tutti-leased-memory", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0)
    return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_host_memory: memfd_create: {}", std::strerror(errno));
  // Sealed against shrinking: tuttid maps it and the controller may DMA into it (a shrink would raise SIGBUS
  // in the daemon).
  if (::ftruncate(memfd, static_cast<off_t>(bytes)) != 0 || ::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    const int e = errno;
    ::close(memfd);
    return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_host_memory: {} bytes of memfd: {}", bytes,
                 std::strerror(e));
  }
  void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (address == MAP_FAILED) {
    const int e = errno;
    ::close(memfd);
    return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_host_memory: mmap of {} bytes: {}", bytes, std::strerror(e));
  }
  std::vector<int> fds;
  auto answer =
      call(nlohmann::json{{"tutti", kProtocolVersion}, {"op", "register"}, {"lease", lease_id_}, {"length", bytes}},
           {memfd}, fds);
  ::close(memfd);  // tuttid mapped its own copy; ours is `address`
  for (int fd : fds) ::close(fd);
  if (!answer || answer->value("ok", false) != true) {
    ::munmap(address, bytes);
    if (!answer) return answer.status().with_context(fmt::format("register {} bytes on lease {}", bytes, lease_id_));
    return refused(fmt::format("register {} bytes on lease {}", bytes, lease_id_), *answer);
  }
  // The page table comes as runs [first bus address, pages] (server.cpp): expand it to one address per page.
  Region region;
  region.address = static_cast<std::uint8_t*>(address);
  region.length = bytes;
  const nlohmann::json r = answer->value("region", nlohmann::json());
  const nlohmann::json runs = r.is_object() ? r.value("bus_runs", nlohmann::json()) : nlohmann::json();
  bool well_formed = r.is_object() && r.value("page_size", std::uint32_t{0}) == kPage && runs.is_array();
  for (std::size_t i = 0; well_formed && i < runs.size(); ++i) {
    const nlohmann::json& run = runs[i];
    well_formed = run.is_array() && run.size() == 2 && run[0].is_number_unsigned() && run[1].is_number_unsigned() &&
                  run[1].get<std::uint64_t>() <= bytes / kPage - region.bus_addresses.size();
    for (std::uint64_t k = 0; well_formed && k < run[1].get<std::uint64_t>(); ++k)
      region.bus_addresses.push_back(run[0].get<std::uint64_t>() + k * kPage);
  }
  if (!well_formed || region.bus_addresses.size() != bytes / kPage) {
    ::munmap(address, bytes);  // tuttid keeps it registered until the lease ends; nothing here uses it
    return error(StatusCode::INTERNAL, "tuttid's region for {} bytes is not a page table of {} pages of 4096: {}",
                 bytes, bytes / kPage, r.dump());
  }
  regions_.push_back(std::move(region));
  return &regions_.back();
}

const LeasedController::Region* LeasedController::region_of(const void* address, std::size_t length) const {
  const auto* p = static_cast<const std::uint8_t*>(address);
  for (const Region& r : regions_)
    if (p >= r.address && p <= r.address + r.length && length <= static_cast<std::size_t>(r.address + r.length - p))
      return &r;
  return nullptr;
}

Status LeasedController::bring_up(const nvme::BringUpOptions&) {
  return error(StatusCode::UNSUPPORTED, "bring_up: tuttid brings controller {} up; lease {} is ready as acquired",
               options_.controller, lease_id_);
}

Status LeasedController::shutdown(std::uint64_t) {
  return error(StatusCode::UNSUPPORTED,
               "shutdown: tuttid shuts controller {} down; destroy the LeasedController to end lease {}",
               options_.controller, lease_id_);
}

nvme::ControllerStatus LeasedController::controller_status() const noexcept {
  if (csts_ == nullptr || gone_.load(std::memory_order_relaxed)) return nvme::ControllerStatus{0xffffffffu};
  return nvme::ControllerStatus{*csts_};
}

Result<nvme::QueuePairInfo> LeasedController::create_io_queue_pair(std::uint32_t depth) {
  std::lock_guard lock(mutex_);
  if (depth != identity_.max_queue_entries)
    return error(StatusCode::INVALID_ARGUMENT,
                 "create_io_queue_pair: depth = {}, but lease {} has queues of {} entries (tuttid's queue_depth)",
                 depth, lease_id_, identity_.max_queue_entries);
  for (std::size_t i = 0; i < queues_.size(); ++i) {
    if (handed_out_[i]) continue;
    handed_out_[i] = true;
    return queues_[i];
  }
  return error(StatusCode::RESOURCE_EXHAUSTED,
               "create_io_queue_pair: all {} queue pairs of lease {} are handed out (acquire a lease with more "
               "queues)",
               queues_.size(), lease_id_);
}

Status LeasedController::delete_io_queue_pair(std::uint16_t qid) {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < queues_.size(); ++i) {
    if (queues_[i].qid != qid || !handed_out_[i]) continue;  // handed out once, retired for good
    return error(StatusCode::BUSY,
                 "delete_io_queue_pair({}): queue {} of lease {} is retired; tuttid deletes it, ending its commands, "
                 "when the lease ends",
                 qid, qid, lease_id_);
  }
  return error(StatusCode::NOT_FOUND, "delete_io_queue_pair: queue {} is not a handed-out queue of lease {}", qid,
               lease_id_);
}

Result<nvme::DmaMapping> LeasedController::dma_map(void* host_address, std::size_t length) {
  const auto start = reinterpret_cast<std::uintptr_t>(host_address);
  if (host_address == nullptr || length == 0 || start % kPage != 0 || length % kPage != 0)
    return error(StatusCode::INVALID_ARGUMENT,
                 "dma_map({}, {} bytes): the address and the length must be non-zero multiples of {}", host_address,
                 length, kPage);
  if (snvme_) return snvme_->dma_map(host_address, length);
  std::lock_guard lock(mutex_);
  const Region* r = region_of(host_address, length);
  if (r == nullptr)
    return error(StatusCode::UNSUPPORTED,
                 "dma_map({}, {} bytes): not memory of LeasedController::allocate_host_memory; controller {} runs "
                 "in tuttid's process, which reaches only memory shared with it",
                 host_address, length, options_.controller);
  const std::size_t first = static_cast<std::size_t>(static_cast<std::uint8_t*>(host_address) - r->address) / kPage;
  nvme::DmaMapping m;
  m.id = next_id_++;
  m.host_address = host_address;
  m.length = length;
  m.page_size = static_cast<std::uint32_t>(kPage);
  m.bus_addresses.assign(r->bus_addresses.begin() + static_cast<std::ptrdiff_t>(first),
                         r->bus_addresses.begin() + static_cast<std::ptrdiff_t>(first + length / kPage));
  live_ids_.insert(m.id);
  return m;
}

Status LeasedController::dma_unmap(std::uint64_t mapping_id) {
  if (snvme_) return snvme_->dma_unmap(mapping_id);
  std::lock_guard lock(mutex_);
  if (live_ids_.erase(mapping_id) == 0)
    return error(StatusCode::NOT_FOUND, "dma_unmap: no mapping with id = {}", mapping_id);
  return Status::success();
}

Result<nvme::DmaBuffer> LeasedController::allocate_dma_buffer(std::size_t length) {
  if (snvme_) return snvme_->allocate_dma_buffer(length);
  std::lock_guard lock(mutex_);
  const std::size_t bytes = (length + kPage - 1) / kPage * kPage;
  Region* reused = nullptr;
  for (Region& r : regions_)
    if (r.dma_buffer && r.buffer_id == 0 && r.length == bytes && length != 0) {
      reused = &r;
      std::memset(r.address, 0, r.length);  // as zeroed as a new one
      break;
    }
  if (reused == nullptr) {
    auto region = register_region(length);
    if (!region) return region.status();
    reused = *region;
    reused->dma_buffer = true;
    for (std::size_t i = 1; i < reused->bus_addresses.size(); ++i)
      if (reused->bus_addresses[i] != reused->bus_addresses[0] + i * kPage)
        return error(StatusCode::RESOURCE_EXHAUSTED,
                     "allocate_dma_buffer({} bytes): tuttid mapped page {} at bus {:#x}, not contiguous after {:#x}",
                     length, i, reused->bus_addresses[i], reused->bus_addresses[0]);
  }
  reused->buffer_id = next_id_++;
  nvme::DmaBuffer b;
  b.host_address = reused->address;
  b.bus_address = reused->bus_addresses[0];
  b.length = reused->length;
  b.id = reused->buffer_id;
  return b;
}

Status LeasedController::free_dma_buffer(std::uint64_t id) {
  if (snvme_) return snvme_->free_dma_buffer(id);
  std::lock_guard lock(mutex_);
  for (Region& r : regions_)
    if (r.dma_buffer && id != 0 && r.buffer_id == id) {
      r.buffer_id = 0;  // reusable by the next allocate_dma_buffer of its length
      return Status::success();
    }
  return error(StatusCode::NOT_FOUND, "free_dma_buffer: no buffer with id = {}", id);
}

Result<nvme::CompletionQueueEntry> LeasedController::submit_admin(const nvme::SubmissionQueueEntry& command,
                                                                  std::uint64_t) {
  return error(StatusCode::UNSUPPORTED, "submit_admin(opcode {:#x}): admin commands of controller {} stay with tuttid",
               command.opcode, options_.controller);
}

Result<bool> LeasedController::abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t timeout_ns) {
  if (snvme_) return snvme_->abort(sqid, cid, timeout_ns);  // PCI: the driver's ABORT, for this file's queues
  return error(StatusCode::UNSUPPORTED,
               "abort(queue {}, command {}): tuttid's protocol version 1 has no abort; the command ends when lease {} "
               "does",
               sqid, cid, lease_id_);
}

}  // namespace tutti::daemon
