// The controllers tuttid owns: brought up in order at start, shut down at stop, and the I/O queue pairs it
// leases created on them (NVMe Create I/O CQ/SQ, Base 2.0, 5.4 and 5.5) and deleted when a lease ends.
// Soft controllers (libnvm's software NVMe controller, backed by an image file) run inside the daemon.
// Thread-safety: one thread (the daemon's loop) uses a ControllerSlot.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include <tutti/core/status.hpp>
#include <tutti/libnvm/soft_controller.hpp>

#include "config.hpp"
#include "leased_queues.hpp"
#include "mounts.hpp"
#include "pci_controller.hpp"

namespace tutti::daemon {

enum class BringUpState : std::uint8_t { down, up, failed };
std::string_view to_string(BringUpState state) noexcept;

class ControllerSlot {
 public:
  explicit ControllerSlot(ControllerConfig config) : config_(std::move(config)) {}
  ~ControllerSlot();

  /// Brings the controller up: soft: creates the soft controller on its image, brings it up (CC.EN, Identify,
  /// Number of Queues) and creates the kernel_queues queue pairs it keeps for itself (standing for the kernel's
  /// blk-mq queues of an snvme controller). PCI: PciController::bring_up (bind or adopt, nodes, lock, the
  /// revocation of files tuttid does not hold), then libnvm's SnvmeController on /dev/snvme<C> for the identity
  /// (its file holds no queue). On error the state is failed and last_error() says why.
  Status bring_up();
  /// Creates `count` I/O queue pairs of config().queue_depth entries; all or none. Errors: UNAVAILABLE-like
  /// NOT_READY (not up), RESOURCE_EXHAUSTED (fewer than count leasable queues free), the controller's errors.
  Result<std::vector<std::uint16_t>> create_queues(std::uint32_t count);
  /// Deletes the queue pairs (Delete I/O SQ then CQ). Returns the first error; deletes the rest anyway.
  Status delete_queues(const std::vector<std::uint16_t>& qids);
  /// Deletes every leased queue, then shuts the controller down (CC.SHN, bounded); releases the mounts. PCI:
  /// then unbinds, unless a file system of it is still mounted (PciController::shut_down; stop_note() says
  /// so); a failure is returned and kept in last_error().
  Status shut_down();
  /// What shut_down left and why (a PCI controller left bound), empty otherwise.
  const std::string& stop_note() const noexcept { return stop_note_; }
  /// After bring_up: verifies or mounts the file systems of the namespaces with a mount point (mounts.hpp: a
  /// soft controller's image, a PCI controller's /dev/snvme<C>n<nsid>; `index`: the controller's place in the
  /// configuration, for key paths in errors); PCI: then <mount>/accelerator<N> for each of `accelerators`.
  /// On error the controller is shut down, its state is failed and last_error() says why.
  Status mount_namespaces(std::size_t index);
  /// Rechecks the mounts (NamespaceMount::recheck); one that changed since bring-up fails the controller
  /// (state failed, last_error() says why). Nothing when the controller is not up.
  Status recheck_mounts();
  /// Unmounts what mount_namespaces mounted and detaches its loop devices (NamespaceMount::release); a mount
  /// verified at bring-up is left. A failure (e.g. only a lazy unmount) keeps a PCI controller bound at stop.
  Status release_mounts();
  /// The namespaces as the protocol reports them (devices, acquire): namespace_json of each.
  nlohmann::json namespaces_json() const;

  /// PCI controllers: a lease's own sealed file with `count` queue pairs of config().queue_depth (see
  /// PciController::open_lease). Errors: NOT_READY (not up), RESOURCE_EXHAUSTED (fewer leasable queues free),
  /// the driver's.
  bool is_pci() const noexcept { return pci_ != nullptr; }
  Result<PciLease> open_pci_lease(std::uint32_t count, std::uint64_t pinned_bytes);
  /// Destroys the lease's queue groups and closes tuttid's copy of its file; its queues are free again. Counts
  /// the lease's own QIDs out (one entry each), even those its holder destroyed and the driver gave to a
  /// later lease meanwhile; a second call counts nothing out.
  Status end_pci_lease(PciLease& lease);
  /// PCI: the file to poll for POLLPRI (see PciController::watch_fd) while up; -1 otherwise.
  int event_fd() const noexcept { return pci_ && state_ == BringUpState::up ? pci_->watch_fd() : -1; }
  /// PCI, after the driver revoked tuttid's files (POLLPRI): opens new ones (the watched file and the
  /// identity's controller). `lost` (POLLHUP: the controller failed or is gone) marks it failed instead.
  Status recover(bool lost);
  /// The PCI bring-up's steps (bound or adopted, files revoked), empty for soft controllers.
  std::vector<std::string> bring_up_steps() const { return pci_ ? pci_->steps() : std::vector<std::string>{}; }

  const ControllerConfig& config() const noexcept { return config_; }
  BringUpState state() const noexcept { return state_; }
  const std::string& last_error() const noexcept { return error_; }
  /// The queues the live leases were granted, counted per lease (LeasedQueues).
  std::uint32_t queues_in_use() const noexcept { return leased_.size(); }
  std::uint32_t queues_free() const noexcept {
    return queues_in_use() >= config_.leasable_queues() ? 0 : config_.leasable_queues() - queues_in_use();
  }
  std::uint64_t bring_up_errors() const noexcept { return bring_up_errors_; }
  std::uint64_t namespace_size_lbas() const noexcept;
  std::uint32_t lba_size() const noexcept;
  /// The controller's identity (bring_up's Identify), or null before a successful bring-up.
  const nvme::ControllerIdentity* identity() const noexcept;
  const std::vector<std::uint16_t>& kernel_qids() const noexcept { return kernel_qids_; }
  /// A leased queue pair as created (rings and doorbells in the daemon's mappings).
  const nvme::QueuePairInfo* queue_info(std::uint16_t qid) const;
  /// Start of BAR0 (soft controllers).
  const void* bar0() const;
  /// The memfd holding `address` (BAR0, a queue ring) of a soft controller in shared memory mode.
  Result<libnvm::SharedMemoryRange> shared_memory_of(const void* address) const;
  /// DMA-maps a client's memory (mapped by the daemon) / unmaps it.
  Result<nvme::DmaMapping> dma_map(void* address, std::size_t length);
  Status dma_unmap(std::uint64_t mapping_id);

 private:
  Status bring_up_pci();
  /// PCI: libnvm's SnvmeController on /dev/snvme<C> (driver_), brought up for the identity leases report.
  Status open_pci_identity();
  /// Records a failed bring-up (state, error, count) and drops the controller objects; returns `status`.
  Status failed(Status status);

  ControllerConfig config_;
  BringUpState state_ = BringUpState::down;
  std::string error_;
  std::uint64_t bring_up_errors_ = 0;
  std::shared_ptr<libnvm::SoftController> device_;
  std::unique_ptr<nvme::Controller> driver_;
  std::vector<std::uint16_t> kernel_qids_;
  LeasedQueues leased_;  ///< per lease: a QID two leases list counts twice (PCI: see leased_queues.hpp)
  std::map<std::uint16_t, nvme::QueuePairInfo> infos_;
  ImageLock image_lock_;                ///< a soft controller's image, locked while it is up
  std::vector<NamespaceMount> mounts_;  ///< of the namespaces with a mount point, in the configuration's order
  bool mounts_released_ = true;         ///< false once a release failed: a PCI controller then stays bound
  std::string stop_note_;
  std::unique_ptr<PciController> pci_;
};

}  // namespace tutti::daemon
