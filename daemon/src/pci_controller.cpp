// tuttid's PCI controllers: see pci_controller.hpp.
#include "pci_controller.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>
#include <uapi/snvme.h>  // the driver's ABI (libnvm's include directories reach driver/snvme/include)

#include "mounts.hpp"          // mounted_at: the one mountinfo parser
#include "snvme_argument.hpp"  // libnvm/snvme: the ioctl header filled in one place

namespace tutti::daemon {
namespace {

constexpr const char* kControlDevice = "/dev/snvme-control";

Status errno_error(StatusCode code, std::string what, int err) {
  return error(code, "{}: {} (errno {})", what, std::strerror(err), err);
}

void sleep_ns(std::uint64_t ns) {
  timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::nanosleep(&t, nullptr);
}

/// A mount point as the kernel lists it: symbolic links resolved, no "." or "..", no trailing slash.
std::string kernel_path(const std::string& p) {
  std::error_code ec;
  std::string s = std::filesystem::weakly_canonical(p, ec).string();
  if (ec) s = std::filesystem::path(p).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

std::vector<std::uint16_t> PciLease::qids() const {
  std::vector<std::uint16_t> q;
  for (const auto& p : queues) q.push_back(p.qid);
  return q;
}

nlohmann::json PciLease::to_json(std::size_t fd_index) const {
  nlohmann::json q = nlohmann::json::array();
  for (const auto& p : queues)
    q.push_back({{"qid", p.qid},
                 {"group_id", p.group_id},
                 {"entries", p.entries},
                 {"sq_doorbell", p.sq_doorbell},
                 {"cq_doorbell", p.cq_doorbell},
                 {"sq_offset", p.sq_offset},
                 {"sq_bytes", p.sq_bytes},
                 {"cq_offset", p.cq_offset},
                 {"cq_bytes", p.cq_bytes}});
  return {{"fd", fd_index}, {"sealed_bytes", sealed_bytes}, {"queues", std::move(q)}};
}

PciController::~PciController() {
  if (watch_fd_ >= 0) ::close(watch_fd_);
}

Status PciController::reopen_watch() {
  if (watch_fd_ >= 0) ::close(watch_fd_);
  watch_fd_ = ::open(char_device_.c_str(), O_RDWR | O_CLOEXEC);
  if (watch_fd_ < 0) return errno_error(StatusCode::DEVICE_ERROR, fmt::format("open {}", char_device_), errno);
  return Status::success();
}

Status PciController::bind() {
  const std::string& address = *config_.pci_address;
  const int control = ::open(kControlDevice, O_RDWR | O_CLOEXEC);
  if (control < 0)
    return errno_error(
        errno == ENOENT ? StatusCode::NOT_FOUND : StatusCode::DEVICE_ERROR,
        fmt::format("controller {}: open {} (is the snvme module loaded?)", config_.name, kControlDevice), errno);
  auto b = libnvm::snvme_argument<snvme_bind>();
  std::snprintf(b.pci_addr, sizeof b.pci_addr, "%s", address.c_str());
  const int bound = ::ioctl(control, SNVME_IOC_BIND, &b);
  const int err = errno;
  ::close(control);
  if (bound == 0) {
    instance_ = b.instance;
    steps_.push_back(fmt::format("bound PCI {} to snvme", address));
  } else if (err == EALREADY) {
    // Bound already (a previous tuttid, or by hand): adopted. Its instance is the snvme<C> child of the
    // PCI device in sysfs (the driver's class device, chr.c).
    adopted_ = true;
    const std::string dir = fmt::format("/sys/bus/pci/devices/{}/snvme", address);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("snvme") && name.size() > 5) instance_ = std::atoi(name.c_str() + 5);
    }
    if (instance_ < 0)
      return error(StatusCode::DEVICE_ERROR,
                   "controller {}: PCI {} is bound to snvme (EALREADY) but {} names no "
                   "snvme<C> device",
                   config_.name, address, dir);
    steps_.push_back(fmt::format("adopted PCI {}: bound to snvme already (a previous tuttid)", address));
  } else {
    return errno_error(err == ENODEV ? StatusCode::NOT_FOUND : StatusCode::DEVICE_ERROR,
                       fmt::format("controller {}: BIND of PCI {} through {}", config_.name, address, kControlDevice),
                       err);
  }
  if (instance_ < 0)
    return error(StatusCode::DEVICE_ERROR, "controller {}: BIND of PCI {} returned no instance", config_.name, address);
  char_device_ = fmt::format("/dev/snvme{}", instance_);
  bound_ = true;
  return Status::success();
}

std::string PciController::block_device(std::uint32_t nsid) const {
  return fmt::format("/dev/snvme{}n{}", instance_, nsid);
}

nlohmann::json PciController::namespace_json(const NamespaceConfig& n) const {
  nlohmann::json j{{"nsid", n.nsid}, {"mount", n.mount}, {"filesystem", n.filesystem}};
  for (const auto& [nsid, state] : mount_states_)
    if (nsid == n.nsid) {
      j["mount"] = kernel_path(n.mount);
      j["block_device"] = block_device(n.nsid);
      j["mount_state"] = state;
    }
  return j;
}

Status PciController::wait_for_nodes() {
  std::vector<std::string> nodes{char_device_};
  for (const auto& n : config_.namespaces) nodes.push_back(block_device(n.nsid));
  const std::uint64_t deadline = deadline_after_ns(kPciNodeTimeoutNs);
  for (const auto& node : nodes) {
    struct stat st {};
    while (::stat(node.c_str(), &st) != 0) {
      if (remaining_ns(deadline) == 0)
        return error(StatusCode::TIMEOUT, "controller {}: {} did not appear within {} ms of BIND", config_.name, node,
                     kPciNodeTimeoutNs / 1'000'000);
      sleep_ns(10'000'000);
    }
  }
  return Status::success();
}

Status PciController::mount_namespaces() {
  for (std::size_t j = 0; j < config_.namespaces.size(); ++j) {
    const NamespaceConfig& n = config_.namespaces[j];
    if (n.mount.empty()) continue;
    const std::string point = kernel_path(n.mount);
    const std::string device = block_device(n.nsid);
    struct stat st {};
    if (::stat(device.c_str(), &st) != 0 || !S_ISBLK(st.st_mode))
      return error(StatusCode::DEVICE_ERROR, "controller {}: {} is not a block device", config_.name, device);
    if (auto there = mounted_at(point)) {
      // Mounted already (a previous tuttid): adopted only when it is this namespace with this file system.
      if (there->device != st.st_rdev || there->filesystem != n.filesystem)
        return error(StatusCode::INVALID_ARGUMENT,
                     "controller {}: namespaces[{}].mount {} holds device {}:{} ({}); expected {} ({}:{}, {})",
                     config_.name, j, point, major(there->device), minor(there->device), there->filesystem, device,
                     major(st.st_rdev), minor(st.st_rdev), n.filesystem);
      steps_.push_back(fmt::format("verified the mount of {} on {} ({})", device, point, n.filesystem));
      mount_states_.emplace_back(n.nsid, "verified");
    } else {
      std::error_code ec;
      std::filesystem::create_directories(point, ec);
      if (ec) return error(StatusCode::DEVICE_ERROR, "controller {}: mkdir {}: {}", config_.name, point, ec.message());
      if (::mount(device.c_str(), point.c_str(), n.filesystem.c_str(), MS_NOATIME, nullptr) != 0)
        return errno_error(
            StatusCode::DEVICE_ERROR,
            fmt::format("controller {}: mount {} on {} as {}", config_.name, device, point, n.filesystem), errno);
      steps_.push_back(fmt::format("mounted {} on {} ({})", device, point, n.filesystem));
      mount_states_.emplace_back(n.nsid, "mounted");
    }
    mounted_.push_back(point);
    // Per-accelerator directories: <mount>/accelerator<N> for each configured accelerator ordinal.
    for (std::uint32_t a : config_.accelerators) {
      const std::string dir = fmt::format("{}/accelerator{}", point, a);
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
        return errno_error(StatusCode::DEVICE_ERROR, fmt::format("controller {}: mkdir {}", config_.name, dir), errno);
    }
  }
  return Status::success();
}

Status PciController::bring_up() {
  TUTTI_RETURN_IF_ERROR(bind());
  TUTTI_RETURN_IF_ERROR(wait_for_nodes());
  // The driver must seal files (a lease's file must not grow past it) and have the queues to lease. The file
  // stays open: tuttid polls it for the driver's reset and failure events.
  TUTTI_RETURN_IF_ERROR(reopen_watch());
  auto info = libnvm::snvme_argument<snvme_info>();
  if (::ioctl(watch_fd_, SNVME_IOC_GET_INFO, &info) != 0)
    return errno_error(StatusCode::DEVICE_ERROR, fmt::format("{}: GET_INFO", char_device_), errno);
  if ((info.caps & SNVME_CAP_SEAL) == 0)
    return error(StatusCode::UNSUPPORTED, "controller {}: {} lacks SNVME_CAP_SEAL: a lease's file could not be sealed",
                 config_.name, char_device_);
  if (info.user_queues < config_.leasable_queues())
    return error(StatusCode::UNSUPPORTED,
                 "controller {}: io_queue_pairs - kernel_queues = {} leasable queues, but {} reserves {} for userspace "
                 "(the snvme module's user_queues)",
                 config_.name, config_.leasable_queues(), char_device_, info.user_queues);
  page_size_ = info.page_size;
  kernel_qids_.clear();
  for (std::uint16_t q = 1; q <= info.kernel_queues; ++q) kernel_qids_.push_back(q);
  return mount_namespaces();
}

Status PciController::shut_down() {
  if (watch_fd_ >= 0) ::close(watch_fd_);
  watch_fd_ = -1;
  Status first;
  bool all_unmounted = true;
  for (const auto& point : mounted_) {
    int tries = 0;
    while (::umount2(point.c_str(), 0) != 0) {
      if (errno == EINVAL) break;  // not mounted (any more)
      if (errno != EBUSY || ++tries >= kUnmountTries) {
        if (first.is_ok())
          first =
              errno_error(StatusCode::BUSY,
                          fmt::format("controller {}: umount {} ({} tries)", config_.name, point, tries + 1), errno);
        all_unmounted = false;
        break;
      }
      sleep_ns(kUnmountRetryNs);
    }
  }
  mounted_.clear();
  mount_states_.clear();
  if (!all_unmounted) return first.with_context("the controller stays bound");
  if (!bound_) return first;  // BIND failed: nothing to unbind
  const int control = ::open(kControlDevice, O_RDWR | O_CLOEXEC);
  if (control < 0) return errno_error(StatusCode::DEVICE_ERROR, fmt::format("open {}", kControlDevice), errno);
  auto b = libnvm::snvme_argument<snvme_bind>();
  std::snprintf(b.pci_addr, sizeof b.pci_addr, "%s", config_.pci_address->c_str());
  const int unbound = ::ioctl(control, SNVME_IOC_UNBIND, &b);
  const int err = errno;
  ::close(control);
  if (unbound != 0 && first.is_ok())
    first = errno_error(StatusCode::DEVICE_ERROR,
                        fmt::format("controller {}: UNBIND of PCI {}", config_.name, *config_.pci_address), err);
  return first;
}

Result<PciLease> PciController::open_lease(std::uint32_t queues, std::uint32_t depth, std::uint64_t pinned_bytes) {
  PciLease lease;
  lease.fd = ::open(char_device_.c_str(), O_RDWR | O_CLOEXEC);
  if (lease.fd < 0) return errno_error(StatusCode::DEVICE_ERROR, fmt::format("open {}", char_device_), errno);
  auto fail = [&lease, this](Status status) {
    (void)end_lease(lease);
    return status;
  };
  for (std::uint32_t i = 0; i < queues; ++i) {
    auto g = libnvm::snvme_argument<snvme_queue_group>();
    g.nr_queues = 1;
    g.entries = depth;
    if (::ioctl(lease.fd, SNVME_IOC_CREATE_QUEUE_GROUP, &g) != 0)
      return fail(errno_error(errno == ENOSPC ? StatusCode::RESOURCE_EXHAUSTED : StatusCode::DEVICE_ERROR,
                              fmt::format("{}: CREATE_QUEUE_GROUP of 1 pair x {} entries (queue {} of {})",
                                          char_device_, depth, i + 1, queues),
                              errno));
    const snvme_queue_desc& d = g.queues[0];
    lease.queues.push_back(
        {g.group_id, d.qid, d.entries, d.sq_doorbell, d.cq_doorbell, d.sq_offset, d.cq_offset, d.sq_bytes, d.cq_bytes});
  }
  auto seal = libnvm::snvme_argument<snvme_seal>();
  seal.max_dma_bytes = pinned_bytes / page_size_ * page_size_;
  if (::ioctl(lease.fd, SNVME_IOC_SEAL, &seal) != 0)
    return fail(errno_error(StatusCode::DEVICE_ERROR,
                            fmt::format("{}: SEAL with max_dma_bytes {}", char_device_, seal.max_dma_bytes), errno));
  lease.sealed_bytes = seal.max_dma_bytes;
  return lease;
}

Status PciController::end_lease(PciLease& lease) {
  Status first;
  for (const auto& q : lease.queues) {
    auto arg = libnvm::snvme_argument<snvme_group_id>();
    arg.group_id = q.group_id;
    // ENOENT: the holder destroyed it; ESTALE, ENODEV: a reset, failure or removal deleted it already.
    if (lease.fd >= 0 && ::ioctl(lease.fd, SNVME_IOC_DESTROY_QUEUE_GROUP, &arg) != 0 && errno != ENOENT &&
        errno != ESTALE && errno != ENODEV && first.is_ok())
      first = errno_error(StatusCode::DEVICE_ERROR,
                          fmt::format("{}: DESTROY_QUEUE_GROUP of queue {}", char_device_, q.qid), errno);
  }
  lease.queues.clear();
  if (lease.fd >= 0) ::close(lease.fd);
  lease.fd = -1;
  return first;
}

}  // namespace tutti::daemon
