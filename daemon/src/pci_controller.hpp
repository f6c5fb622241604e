// A PCI controller of tuttid: bound to the snvme driver through /dev/snvme-control, its leases opened on
// /dev/snvme<C> (docs/daemon.md, "PCI controllers"; the driver's ABI in driver/snvme/include/uapi/snvme.h and
// docs/driver.md). Its namespaces' file systems are mounted or verified by mounts.hpp, as for every kind of
// controller (ControllerSlot::mount_namespaces, with block_device() as the source).
//
// Bring-up, in order, every wait bounded: BIND (EALREADY: the controller is bound already, by a previous
// tuttid, and is adopted), wait for /dev/snvme<C> and /dev/snvme<C>n<nsid> of every configured namespace, an
// flock on /dev/snvme<C> (one tuttid per controller), GET_INFO's checks, then SNVME_IOC_REVOKE of every other
// open file of the controller: the leases of a previous tuttid whose holders still run end here (restart
// policy "revoke all"). Stop: UNBIND, unless a file system of the controller is still mounted, and only while
// this tuttid holds the flock: a tuttid that never got it (another one serves the controller) leaves it bound,
// whether it adopted the controller or bound it itself.
// A lease is an open file of /dev/snvme<C> of its own: CREATE_QUEUE_GROUP (one group of one pair per
// leased queue), then SNVME_IOC_SEAL with the lease's pinned bytes, so the copy the client receives can
// neither create queues nor map more. tuttid keeps its own copy of the file to end the lease: SNVME_IOC_REVOKE
// through it deletes the groups (Delete I/O SQ, then CQ, on the controller) and puts stand-ins under the
// holder's mappings, whether the client still holds the file or not; then tuttid closes it.
// Thread-safety: one thread (the daemon's loop) uses a PciController.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <tutti/core/status.hpp>

#include "config.hpp"
#include "mounts.hpp"  // ImageLock

namespace tutti::daemon {

/// Longest wait for the nodes after BIND (udev or devtmpfs creates them).
inline constexpr std::uint64_t kPciNodeTimeoutNs = 10'000'000'000;

/// One leased queue pair: a queue group of one pair on the lease's file (snvme_queue_desc).
struct PciLeaseQueue {
  std::uint32_t group_id = 0;
  std::uint16_t qid = 0;
  std::uint32_t entries = 0;
  std::uint32_t sq_doorbell = 0, cq_doorbell = 0;  ///< byte offsets in the doorbell window (mmap offset 0)
  std::uint64_t sq_offset = 0, cq_offset = 0;      ///< mmap offsets of the rings
  std::uint32_t sq_bytes = 0, cq_bytes = 0;
};

/// The open file of a lease (tuttid's copy) and its queues.
struct PciLease {
  int fd = -1;
  std::uint64_t sealed_bytes = 0;  ///< SNVME_IOC_SEAL's max_dma_bytes: pinned_bytes rounded down to pages
  std::vector<PciLeaseQueue> queues;
  std::vector<std::uint16_t> qids() const;
  /// The acquire answer's "snvme" object; the file goes out as SCM_RIGHTS descriptor `fd_index`.
  nlohmann::json to_json(std::size_t fd_index) const;
};

class PciController {
 public:
  explicit PciController(const ControllerConfig& config) : config_(config) {}
  ~PciController();
  PciController(const PciController&) = delete;
  PciController& operator=(const PciController&) = delete;

  /// Binds (or adopts), waits for the nodes, locks the controller, checks the driver, revokes every open file
  /// of the controller that this tuttid does not hold. Errors name the step, the path or PCI address and the
  /// errno text: NOT_FOUND (no /dev/snvme-control: snvme is not loaded; no such PCI device), TIMEOUT (a node
  /// did not appear within kPciNodeTimeoutNs), BUSY (another process holds the flock of /dev/snvme<C>: another
  /// tuttid serves the controller), UNSUPPORTED (the driver lacks SNVME_CAP_SEAL or SNVME_CAP_REVOKE, or has
  /// fewer user queues than leasable), DEVICE_ERROR (BIND, GET_INFO or REVOKE failed).
  Status bring_up();
  /// UNBINDs, unless `file_systems_released` is false (a mount tuttid made could only be detached lazily) or a
  /// namespace of the controller is still mounted (a mount tuttid verified and left), or bring_up never got
  /// the flock (another tuttid serves the controller: it is never unbound under it): then the controller
  /// stays bound, and stop_note() says why. Releases the flock last.
  Status shut_down(bool file_systems_released);
  /// What shut_down left and why ("left bound: ..."), empty when it unbound or had nothing to do.
  const std::string& stop_note() const noexcept { return stop_note_; }

  /// /dev/snvme<C>, known once bring_up bound or adopted the controller.
  const std::string& char_device() const noexcept { return char_device_; }
  /// /dev/snvme<C>n<nsid>: where namespace `nsid`'s file system lives.
  std::string block_device(std::uint32_t nsid) const;
  bool adopted() const noexcept { return adopted_; }
  /// What bring_up did, one line per step (bound or adopted, revoked), for tuttid's log.
  const std::vector<std::string>& steps() const noexcept { return steps_; }
  /// tuttid's own open file of /dev/snvme<C> (no queue on it), polled for POLLPRI: the driver revokes every
  /// open file on a controller reset (POLLPRI | POLLERR) and on a failure or removal (POLLHUP too); -1
  /// before bring_up.
  int watch_fd() const noexcept { return watch_fd_; }
  /// After a reset: a new file to watch (the revoked one would report POLLPRI for good).
  Status reopen_watch();
  /// The driver's kernel queue IDs (1..kernel_queues), from GET_INFO.
  const std::vector<std::uint16_t>& kernel_qids() const noexcept { return kernel_qids_; }

  /// Opens a file for a lease: `queues` groups of one pair of `depth` entries, sealed to `pinned_bytes`
  /// rounded down to the driver's page size. Errors: RESOURCE_EXHAUSTED when the driver has fewer free user
  /// queues than asked (ENOSPC: queue groups of files tuttid does not hold), naming the controller, the
  /// queues asked and the queues free; the driver's others (DEVICE_ERROR).
  Result<PciLease> open_lease(std::uint32_t queues, std::uint32_t depth, std::uint64_t pinned_bytes);
  /// Revokes tuttid's copy of the lease's file (SNVME_IOC_REVOKE: its groups deleted, stand-ins under the
  /// holder's mappings, its status page all ones), closes it. Returns the driver's error; ENODEV (the
  /// controller failed or is gone: nothing left to delete) is none.
  Status end_lease(PciLease& lease);

 private:
  Status bind();
  Status wait_for_nodes();
  Status check_driver_and_revoke_others();

  const ControllerConfig& config_;
  std::string char_device_;
  int instance_ = -1;
  int watch_fd_ = -1;
  bool adopted_ = false;
  bool bound_ = false;  ///< bound or adopted, and locked (set only once lock_ is held): UNBIND at stop
  ImageLock lock_;      ///< flock on /dev/snvme<C> while this tuttid serves the controller
  std::uint32_t page_size_ = 4096;
  std::vector<std::string> steps_;
  std::string stop_note_;
  std::vector<std::uint16_t> kernel_qids_;
};

}  // namespace tutti::daemon
