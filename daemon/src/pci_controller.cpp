// tuttid's PCI controllers: see pci_controller.hpp.
#include "pci_controller.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>
#include <tutti/core/counted.hpp>
#include <uapi/snvme.h>  // the driver's ABI (libnvm's include directories reach driver/snvme/include)

#include "mounts.hpp"          // mount_table: the one mountinfo parser; ImageLock
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

/// The snvme driver's namespaces per controller (uapi SNVME_MAX_NAMESPACES): the block devices checked for
/// mounts at stop.
constexpr std::uint32_t kMaxNamespaces = SNVME_MAX_NAMESPACES;

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
  // Not bound_ yet, even after a BIND of this tuttid's own: only the holder of the flock unbinds (bring_up).
  return Status::success();
}

std::string PciController::block_device(std::uint32_t nsid) const {
  return fmt::format("/dev/snvme{}n{}", instance_, nsid);
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

Status PciController::check_driver_and_revoke_others() {
  // The lock's file of /dev/snvme<C> asks the driver (it holds no queue): GET_INFO's checks, then the
  // revocation of every other open file.
  const int fd = lock_.fd();
  auto info = libnvm::snvme_argument<snvme_info>();
  if (::ioctl(fd, SNVME_IOC_GET_INFO, &info) != 0)
    return errno_error(StatusCode::DEVICE_ERROR, fmt::format("{}: GET_INFO", char_device_), errno);
  // The driver must seal files (a lease's file must not grow past it), revoke them (a lease must end even
  // while its holder runs) and have the queues to lease.
  if ((info.caps & SNVME_CAP_SEAL) == 0)
    return error(StatusCode::UNSUPPORTED, "controller {}: {} lacks SNVME_CAP_SEAL: a lease's file could not be sealed",
                 config_.name, char_device_);
  if ((info.caps & SNVME_CAP_REVOKE) == 0)
    return error(StatusCode::UNSUPPORTED,
                 "controller {}: {} lacks SNVME_CAP_REVOKE (caps {:#x}): a lease could not be ended while its holder "
                 "runs; load the snvme module of this tree",
                 config_.name, char_device_, info.caps);
  if (info.user_queues < config_.leasable_queues())
    return error(StatusCode::UNSUPPORTED,
                 "controller {}: io_queue_pairs - kernel_queues = {} leasable queues, but {} reserves {} for userspace "
                 "(the snvme module's user_queues)",
                 config_.name, config_.leasable_queues(), char_device_, info.user_queues);
  page_size_ = info.page_size;
  kernel_qids_.clear();
  for (std::uint16_t q = 1; q <= info.kernel_queues; ++q) kernel_qids_.push_back(q);
  // Restart policy "revoke all": the files of a previous tuttid's leases whose holders still run hold queue
  // groups that no tuttid can reach any more. They end here, before this tuttid counts its free queues.
  auto revoke = libnvm::snvme_argument<snvme_revoke>();
  revoke.scope = SNVME_REVOKE_OTHERS;
  if (::ioctl(fd, SNVME_IOC_REVOKE, &revoke) != 0)
    return errno_error(StatusCode::DEVICE_ERROR,
                       fmt::format("controller {}: REVOKE of the other open files of {}", config_.name, char_device_),
                       errno);
  if (revoke.files != 0 || adopted_)
    steps_.push_back(fmt::format(
        "revoked {} open file(s) of {} that this tuttid does not hold, with {} queue group(s) of {} queue pair(s) "
        "(leases of a previous tuttid whose holders still run)",
        revoke.files, char_device_, revoke.queue_groups, revoke.queues));
  return Status::success();
}

Status PciController::bring_up() {
  TUTTI_RETURN_IF_ERROR(bind());
  TUTTI_RETURN_IF_ERROR(wait_for_nodes());
  // One tuttid per controller: a second one (another configuration, another socket) stops here, before it
  // revokes the first one's leases or unbinds the controller under it at its stop. That holds whether the
  // second one adopted the controller or bound it itself (two tuttids starting at once: its BIND came first,
  // the other one adopted and locked first): bound_ is set only below, once the flock is held, so a tuttid
  // that lost it never UNBINDs.
  auto lock = ImageLock::acquire(
      char_device_, fmt::format("controller {}: {} (PCI {})", config_.name, char_device_, *config_.pci_address));
  if (!lock) return lock.status();
  lock_ = std::move(lock.value());
  bound_ = true;  // locked: this tuttid serves the controller and UNBINDs it at its stop
  TUTTI_RETURN_IF_ERROR(check_driver_and_revoke_others());
  // The file stays open: tuttid polls it for the driver's reset and failure events.
  return reopen_watch();
}

Status PciController::shut_down(bool file_systems_released) {
  if (watch_fd_ >= 0) ::close(watch_fd_);
  watch_fd_ = -1;
  stop_note_.clear();
  Status result;
  if (!bound_ && !char_device_.empty())
    stop_note_ = fmt::format(
        "left {} bound: this tuttid never held the flock of {} (another tuttid serves it, or "
        "the bring-up stopped before the lock)",
        *config_.pci_address, char_device_);
  if (bound_ && lock_.fd() >= 0) {  // only the holder of the flock unbinds: never under another tuttid's leases
    // A file system of the controller still mounted needs its block device: the controller stays bound.
    std::string mounted;
    for (std::uint32_t nsid = 1; nsid <= kMaxNamespaces && mounted.empty(); ++nsid) {
      struct stat st {};
      if (::stat(block_device(nsid).c_str(), &st) != 0 || !S_ISBLK(st.st_mode)) continue;
      for (const auto& entry : mount_table())
        if (entry.device == st.st_rdev) {
          mounted = fmt::format("{} is mounted at {} (a mount this tuttid found there and verified, or not its own)",
                                block_device(nsid), entry.point);
          break;
        }
    }
    if (!file_systems_released)
      stop_note_ = fmt::format(
          "left {} bound: a file system tuttid mounted was still busy and is only detached "
          "lazily",
          *config_.pci_address);
    else if (!mounted.empty())
      stop_note_ = fmt::format("left {} bound: {}", *config_.pci_address, mounted);
    else {
      const int control = ::open(kControlDevice, O_RDWR | O_CLOEXEC);
      if (control < 0) {
        result = errno_error(StatusCode::DEVICE_ERROR, fmt::format("open {}", kControlDevice), errno);
      } else {
        auto b = libnvm::snvme_argument<snvme_bind>();
        std::snprintf(b.pci_addr, sizeof b.pci_addr, "%s", config_.pci_address->c_str());
        const int unbound = ::ioctl(control, SNVME_IOC_UNBIND, &b);
        const int err = errno;
        ::close(control);
        if (unbound != 0)
          result = errno_error(StatusCode::DEVICE_ERROR,
                               fmt::format("controller {}: UNBIND of PCI {}", config_.name, *config_.pci_address), err);
      }
    }
  }
  bound_ = false;
  lock_ = ImageLock();  // last: no other tuttid takes the controller while this one still unbinds it
  return result;
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
    if (::ioctl(lease.fd, SNVME_IOC_CREATE_QUEUE_GROUP, &g) != 0) {
      const int err = errno;
      if (err == ENOSPC) {
        // The driver has fewer free user queues than tuttid counts: another process holds queue groups of
        // this controller (it opened /dev/snvme<C> itself). The queues of this lease made so far count as free.
        auto info = libnvm::snvme_argument<snvme_info>();
        const bool known = ::ioctl(lease.fd, SNVME_IOC_GET_INFO, &info) == 0;
        return fail(error(StatusCode::RESOURCE_EXHAUSTED,
                          "{} asked, but {} has {} of its {} user queues free (queue groups of files "
                          "tuttid does not hold: a process that opened {} itself)",
                          counted(queues, "queue"), char_device_,
                          known ? fmt::format("{}", info.user_queues_free + i) : std::string("an unknown number"),
                          known ? fmt::format("{}", info.user_queues) : std::string("?"), char_device_));
      }
      return fail(errno_error(StatusCode::DEVICE_ERROR,
                              fmt::format("{}: CREATE_QUEUE_GROUP of 1 pair x {} entries (queue {} of {})",
                                          char_device_, depth, i + 1, queues),
                              err));
    }
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
  Status result;
  if (lease.fd >= 0) {
    // The whole file, whatever the holder still does with it: its groups deleted (a reset's revocation
    // deleted them on the controller already; this frees their QIDs), stand-ins under its mappings.
    auto revoke = libnvm::snvme_argument<snvme_revoke>();
    revoke.scope = SNVME_REVOKE_FILE;
    // ENODEV: the controller failed or is gone; its queues are gone with it.
    if (::ioctl(lease.fd, SNVME_IOC_REVOKE, &revoke) != 0 && errno != ENODEV)
      result = errno_error(
          StatusCode::DEVICE_ERROR,
          fmt::format("{}: REVOKE of the lease's file (queues {})", char_device_, fmt::join(lease.qids(), ",")), errno);
    ::close(lease.fd);
  }
  lease.queues.clear();
  lease.fd = -1;
  return result;
}

}  // namespace tutti::daemon
