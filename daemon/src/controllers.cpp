// tuttid's controllers: see controllers.hpp.
#include "controllers.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "snvme_controller.hpp"  // libnvm's controller over /dev/snvme<C> (libnvm/snvme)

namespace tutti::daemon {

std::string_view to_string(BringUpState state) noexcept {
  switch (state) {
    case BringUpState::down: return "down";
    case BringUpState::up: return "up";
    case BringUpState::failed: return "failed";
  }
  return "unknown";
}

ControllerSlot::~ControllerSlot() { (void)shut_down(); }

Status ControllerSlot::failed(Status status) {
  state_ = BringUpState::failed;
  error_ = status.to_string();
  ++bring_up_errors_;
  driver_.reset();
  device_.reset();
  image_lock_ = ImageLock();
  return status;  // pci_ stays: shut_down unmounts, and unbinds if the bring-up got the flock (never without it)
}

Status ControllerSlot::bring_up() {
  auto fail = [this](Status status) { return failed(std::move(status)); };
  if (config_.pci_address) return bring_up_pci();
  auto lock = ImageLock::acquire(config_.soft->image, fmt::format("controller {}: soft.image", config_.name));
  if (!lock) return fail(lock.status());
  image_lock_ = std::move(lock.value());  // held until shut_down: one tuttid per image
  libnvm::SoftControllerConfig soft;
  soft.backing_path = config_.soft->image;
  soft.lba_size = config_.soft->lba_size;
  soft.max_queue_entries = config_.soft->max_queue_entries;
  soft.max_io_queue_pairs = static_cast<std::uint16_t>(config_.io_queue_pairs);
  soft.shared_memory = true;  // clients map BAR0 and their queues' rings (memfds sent with SCM_RIGHTS)
  auto device = libnvm::SoftController::create(soft);
  if (!device) return fail(device.status().with_context(fmt::format("controller {}: soft controller", config_.name)));
  device_ = *device;
  auto driver = libnvm::open_soft_controller(device_);
  if (!driver) return fail(driver.status().with_context(fmt::format("controller {}: driver", config_.name)));
  driver_ = std::move(driver.value());
  nvme::BringUpOptions options;
  options.io_queue_pairs_requested = static_cast<std::uint16_t>(config_.io_queue_pairs);
  Status up = driver_->bring_up(options);
  if (!up.is_ok()) return fail(up.with_context(fmt::format("controller {}: bring_up", config_.name)));
  const auto allocated =
      std::min(driver_->identity().io_submission_queues_allocated, driver_->identity().io_completion_queues_allocated);
  if (allocated < config_.io_queue_pairs)
    return fail(error(StatusCode::RESOURCE_EXHAUSTED,
                      "controller {}: allocated {} I/O queue pairs, fewer than io_queue_pairs {}", config_.name,
                      allocated, config_.io_queue_pairs));
  for (std::uint32_t i = 0; i < config_.kernel_queues; ++i) {
    auto pair = driver_->create_io_queue_pair(config_.queue_depth);
    if (!pair) return fail(pair.status().with_context(fmt::format("controller {}: kernel queue {}", config_.name, i)));
    kernel_qids_.push_back(pair->qid);
  }
  state_ = BringUpState::up;
  error_.clear();
  return Status::success();
}

Status ControllerSlot::open_pci_identity() {
  auto driver = libnvm::SnvmeController::open(pci_->char_device());
  if (!driver) return driver.status().with_context(fmt::format("controller {}: driver", config_.name));
  driver_ = std::move(driver.value());
  nvme::BringUpOptions options;
  options.io_queue_pairs_requested = static_cast<std::uint16_t>(config_.leasable_queues());
  options.nsid = config_.namespaces.empty() ? 1 : config_.namespaces.front().nsid;
  Status up = driver_->bring_up(options);
  return up.is_ok() ? up : up.with_context(fmt::format("controller {}: bring_up", config_.name));
}

Status ControllerSlot::bring_up_pci() {
  pci_ = std::make_unique<PciController>(config_);
  Status up = pci_->bring_up();
  if (up.is_ok()) up = open_pci_identity();
  if (!up.is_ok()) return failed(up);
  kernel_qids_ = pci_->kernel_qids();
  state_ = BringUpState::up;
  error_.clear();
  return Status::success();
}

Status ControllerSlot::recover(bool lost) {
  if (!pci_) return Status::success();
  driver_.reset();
  if (lost)
    return failed(error(StatusCode::DEVICE_ERROR,
                        "controller {}: {} reports the controller failed or removed (POLLHUP)", config_.name,
                        pci_->char_device()));
  Status s = pci_->reopen_watch();
  if (s.is_ok()) s = open_pci_identity();
  return s.is_ok() ? s : failed(s.with_context("after a reset"));
}

Result<PciLease> ControllerSlot::open_pci_lease(std::uint32_t count, std::uint64_t pinned_bytes) {
  if (state_ != BringUpState::up || !pci_)
    return error(StatusCode::NOT_READY, "controller {} is {}: {}", config_.name, to_string(state_), error_);
  if (count > queues_free())
    return error(StatusCode::RESOURCE_EXHAUSTED, "controller {} has {} of {} leasable queues free; {} asked",
                 config_.name, queues_free(), config_.leasable_queues(), count);
  auto lease = pci_->open_lease(count, config_.queue_depth, pinned_bytes);
  if (!lease) return lease.status().with_context(fmt::format("controller {}: lease", config_.name));
  // Counted per lease: a holder may have destroyed its own groups (DESTROY_QUEUE_GROUP on its sealed file), so
  // the driver may hand out a QID another live lease still lists.
  leased_.add(lease->qids());
  return lease;
}

Status ControllerSlot::end_pci_lease(PciLease& lease) {
  (void)leased_.remove(lease.qids());  // this lease's entries only; lease.queues is cleared below
  if (!pci_) {
    lease.queues.clear();
    return Status::success();
  }
  return pci_->end_lease(lease);
}

Result<std::vector<std::uint16_t>> ControllerSlot::create_queues(std::uint32_t count) {
  if (state_ != BringUpState::up)
    return error(StatusCode::NOT_READY, "controller {} is {}: {}", config_.name, to_string(state_), error_);
  if (count > queues_free())
    return error(StatusCode::RESOURCE_EXHAUSTED, "controller {} has {} of {} leasable queues free; {} asked",
                 config_.name, queues_free(), config_.leasable_queues(), count);
  std::vector<std::uint16_t> qids;
  for (std::uint32_t i = 0; i < count; ++i) {
    auto pair = driver_->create_io_queue_pair(config_.queue_depth);
    if (!pair) {
      (void)delete_queues(qids);
      return pair.status().with_context(fmt::format("controller {}: create I/O queue pair", config_.name));
    }
    qids.push_back(pair->qid);
    leased_.add({pair->qid});
    infos_[pair->qid] = *pair;
  }
  return qids;
}

Status ControllerSlot::delete_queues(const std::vector<std::uint16_t>& qids) {
  Status first;
  for (auto qid : qids) {
    if (!leased_.remove_one(qid)) continue;  // soft: tuttid's own driver gives out and deletes every QID
    infos_.erase(qid);
    Status s = driver_ ? driver_->delete_io_queue_pair(qid) : Status::success();
    if (!s.is_ok() && first.is_ok())
      first = s.with_context(fmt::format("controller {}: delete queue {}", config_.name, qid));
  }
  return first;
}

Status ControllerSlot::shut_down() {
  (void)release_mounts();
  mounts_.clear();
  stop_note_.clear();
  if (!driver_ && !pci_) return Status::success();
  infos_.clear();
  if (!pci_) (void)delete_queues(leased_.distinct());
  if (driver_) (void)driver_->shutdown(2'000'000'000);
  driver_.reset();
  device_.reset();
  kernel_qids_.clear();
  leased_.clear();
  image_lock_ = ImageLock();
  state_ = BringUpState::down;
  Status stopped;
  if (pci_) {
    // The leases' files are closed by now (the server ends every lease first), and the mounts released.
    stopped = pci_->shut_down(mounts_released_);
    stop_note_ = pci_->stop_note();
    pci_.reset();
    if (!stopped.is_ok()) error_ = stopped.to_string();
  }
  mounts_released_ = true;
  return stopped;
}

const nvme::QueuePairInfo* ControllerSlot::queue_info(std::uint16_t qid) const {
  auto it = infos_.find(qid);
  return it == infos_.end() ? nullptr : &it->second;
}

const void* ControllerSlot::bar0() const {
  // BAR0 is register memory (volatile for the controller's accesses); the daemon only takes its address.
  return device_ ? const_cast<const std::uint32_t*>(device_->bar0()) : nullptr;
}

Result<libnvm::SharedMemoryRange> ControllerSlot::shared_memory_of(const void* address) const {
  if (!device_) return error(StatusCode::NOT_READY, "controller {} is not a running soft controller", config_.name);
  return device_->shared_memory_of(address);
}

Result<nvme::DmaMapping> ControllerSlot::dma_map(void* address, std::size_t length) {
  if (!driver_) return error(StatusCode::NOT_READY, "controller {} is not up", config_.name);
  return driver_->dma_map(address, length);
}

Status ControllerSlot::dma_unmap(std::uint64_t mapping_id) {
  if (!driver_) return Status::success();
  return driver_->dma_unmap(mapping_id);
}

std::uint64_t ControllerSlot::namespace_size_lbas() const noexcept {
  return driver_ ? driver_->identity().namespace_size_lbas : 0;
}
std::uint32_t ControllerSlot::lba_size() const noexcept { return driver_ ? driver_->identity().lba_size : 0; }
const nvme::ControllerIdentity* ControllerSlot::identity() const noexcept {
  return driver_ ? &driver_->identity() : nullptr;
}

Status ControllerSlot::mount_namespaces(std::size_t index) {
  if (state_ != BringUpState::up) return Status::success();  // a failed bring-up mounts nothing
  auto fail = [&](const Status& status) {
    (void)shut_down();
    state_ = BringUpState::failed;
    error_ = status.to_string();
    ++bring_up_errors_;
    return status;
  };
  auto mounts =
      daemon::mount_namespaces(config_, index, [&](std::uint32_t nsid) -> Result<std::pair<std::string, std::string>> {
        if (pci_)  // the namespace's block device, as the snvme driver serves it
          return std::pair<std::string, std::string>(
              pci_->block_device(nsid),
              fmt::format("controllers[{}].pci_address {} namespace {}", index, *config_.pci_address, nsid));
        if (nsid != 1)
          return error(StatusCode::INVALID_ARGUMENT, "nsid {}: a soft controller has one namespace, NSID 1", nsid);
        return std::pair<std::string, std::string>(config_.soft->image,
                                                   fmt::format("controllers[{}].soft.image", index));
      });
  if (!mounts) return fail(mounts.status());
  mounts_ = std::move(mounts.value());
  if (pci_) {
    // Per-accelerator folders: <mount>/accelerator<N> for each configured accelerator ordinal.
    for (const auto& m : mounts_)
      for (std::size_t a = 0; a < config_.accelerators.size(); ++a) {
        const std::string dir = fmt::format("{}/accelerator{}", m.mount_point(), config_.accelerators[a]);
        if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
          return fail(error(StatusCode::DEVICE_ERROR, "controllers[{}].accelerators[{}]: mkdir '{}': {}", index, a, dir,
                            std::strerror(errno)));
      }
  }
  return Status::success();
}

Status ControllerSlot::recheck_mounts() {
  if (state_ != BringUpState::up) return Status::success();
  for (const auto& m : mounts_) {
    Status same = m.recheck();
    if (same.is_ok()) continue;
    state_ = BringUpState::failed;  // devices reports it; acquires are refused with the reason
    error_ = same.to_string();
    return same;
  }
  return Status::success();
}

Status ControllerSlot::release_mounts() {
  Status first;
  for (auto it = mounts_.rbegin(); it != mounts_.rend(); ++it) {
    Status s = it->release();
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  if (!first.is_ok()) mounts_released_ = false;
  return first;
}

nlohmann::json ControllerSlot::namespaces_json() const {
  nlohmann::json namespaces = nlohmann::json::array();
  for (const auto& n : config_.namespaces) {
    const NamespaceMount* mount = nullptr;
    for (const auto& m : mounts_)
      if (m.nsid() == n.nsid) mount = &m;
    namespaces.push_back(namespace_json(n, mount));
  }
  return namespaces;
}

}  // namespace tutti::daemon
