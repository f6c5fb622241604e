// SnvmeController: libnvm's Controller over the snvme kernel driver's character device
// (/dev/snvme<C>, ABI in driver/snvme/include/uapi/snvme.h, design in docs/driver.md).
//
// The kernel driver owns the controller: it resets and enables it, runs the admin queue and
// serves the namespaces as block devices on its own I/O queues. This class gets the I/O queue
// IDs the driver reserves for userspace (queue groups), maps their rings and the doorbell page,
// and DMA-maps host memory, so tutti/nvme/queue.hpp drives the queues directly.
//
// Differences from the Controller contract, all reported, never silent:
//  - bring_up does not reset the controller (the kernel did); it validates the driver's ABI and
//    capabilities, reads Identify Controller / Namespace through the driver, maps the doorbells,
//    and deletes the queue pairs and mappings this object held before. Its register time budgets
//    are unused. io_queue_pairs_requested larger than the driver's user queue budget is
//    INVALID_ARGUMENT.
//  - QIDs are the driver's user QIDs (ControllerIdentity::io_submission_queues_allocated counts
//    them; they start at snvme_info.user_qid_first, not at 1).
//  - shutdown deletes this object's queue pairs and mappings; the controller stays up.
//  - controller_status() is synthesised: the driver does not map the register page to userspace,
//    but each open file has a status page (SNVME_CAP_STATUS) whose CSTS word reads RDY while this
//    object's queues are valid and all ones once the driver revoked them (controller reset,
//    failure or removal). QueuePairInfo::controller_status points at that word, so pollers
//    (QueuePair::wait_for_completion, the local_nvme kernels) stop with DEVICE_ERROR when their
//    backoff reaches its sleeping stage, well within their deadline. Without the status page (an
//    older driver) it is null, and controller_status() asks GET_INFO. The bus addresses of the
//    rings are 0 (the driver does not expose them).
//  - After a revocation every call that reaches the driver fails with DEVICE_ERROR (ESTALE after a
//    reset, ENODEV after a failure or removal); DMA maps stay pinned until this object is
//    destroyed (closing the file releases them). Open a new SnvmeController to go on.
//  - submit_admin is UNSUPPORTED: admin commands belong to the kernel; Identify and Abort are
//    offered through bring_up and abort().
//  - allocate_dma_buffer maps anonymous memory and returns RESOURCE_EXHAUSTED if its bus
//    addresses are not contiguous (possible without an IOMMU for more than one page).
//
// Thread-safety: all member functions may be called concurrently; they serialise on one mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <tutti/libnvm/controller.hpp>

namespace tutti::libnvm {

class SnvmeController final : public Controller {
 public:
  /// Default character device of the first controller snvme bound.
  static constexpr std::string_view kDefaultDevice = "/dev/snvme0";

  /// Opens the character device and checks the ABI version and the capabilities libnvm needs
  /// (queue groups, host DMA maps, Identify, Abort) before anything else.
  /// Errors: NOT_FOUND (no such node), DEVICE_ERROR (open or GET_INFO failed: errno text),
  /// UNSUPPORTED (ABI version mismatch or a capability missing: message names it).
  static Result<std::unique_ptr<SnvmeController>> open(std::string_view device_path = kDefaultDevice);

  /// A queue pair of a group that another process (the broker, tuttid) created on an open file of
  /// /dev/snvme<C> and handed over with it (snvme_queue_desc, plus its group's id).
  struct AdoptedQueue {
    std::uint32_t group_id = 0;
    std::uint16_t qid = 0;
    std::uint32_t entries = 0;
    std::uint32_t sq_doorbell = 0, cq_doorbell = 0;
    std::uint64_t sq_offset = 0, cq_offset = 0;
    std::uint32_t sq_bytes = 0, cq_bytes = 0;
  };
  /// Takes an open file of /dev/snvme<C> (it owns `fd` from here on, also on error) whose queue groups were
  /// created by another process, e.g. a sealed file tuttid sent with SCM_RIGHTS. The file is checked as
  /// open() checks it. After bring_up, create_io_queue_pair hands out `queues` in order instead of creating
  /// groups (their depth must be the `entries` of the next one); delete_io_queue_pair and shutdown destroy
  /// the groups as for groups of its own. A sealed file refuses new groups (EPERM) and DMA maps past its
  /// seal (EDQUOT: RESOURCE_EXHAUSTED). `name` names the file in messages.
  /// Errors: those of open; INVALID_ARGUMENT (fd < 0, no queues).
  static Result<std::unique_ptr<SnvmeController>> adopt(int fd, std::string_view name,
                                                        std::vector<AdoptedQueue> queues);

  ~SnvmeController() override;
  SnvmeController(const SnvmeController&) = delete;
  SnvmeController& operator=(const SnvmeController&) = delete;

  std::string_view kind() const noexcept override { return "snvme"; }
  Status bring_up(const BringUpOptions& options) override;
  Status shutdown(std::uint64_t timeout_ns) override;
  const ControllerIdentity& identity() const noexcept override { return identity_; }
  nvme::ControllerStatus controller_status() const noexcept override;
  Result<QueuePairInfo> create_io_queue_pair(std::uint32_t depth) override;
  Status delete_io_queue_pair(std::uint16_t qid) override;
  Result<DmaMapping> dma_map(void* host_address, std::size_t length) override;
  Status dma_unmap(std::uint64_t mapping_id) override;
  Result<DmaBuffer> allocate_dma_buffer(std::size_t length) override;
  Status free_dma_buffer(std::uint64_t id) override;
  Result<nvme::CompletionQueueEntry> submit_admin(const nvme::SubmissionQueueEntry& command,
                                                  std::uint64_t timeout_ns) override;
  Result<bool> abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t timeout_ns) override;

  /// The driver's leak counters and queue budget (snvme_info), fresh from GET_INFO.
  struct DriverCounters {
    std::uint64_t pinned_pages = 0;
    std::uint32_t dma_maps = 0;
    std::uint32_t queue_groups = 0;
    std::uint16_t user_queues = 0;
    std::uint16_t user_queues_free = 0;
  };
  Result<DriverCounters> driver_counters() const;

 private:
  struct Ring {
    std::uint32_t group_id = 0;
    void* sq = nullptr;
    void* cq = nullptr;
    std::size_t sq_bytes = 0;
    std::size_t cq_bytes = 0;
  };
  struct Buffer {
    void* host = nullptr;
    std::size_t length = 0;
    std::uint32_t map_id = 0;
  };

  SnvmeController(int fd, std::string path);
  static Status check_file(int fd, const std::string& path);
  Status release_all_locked();
  Status destroy_ring_locked(std::uint16_t qid, Ring& ring);
  Result<DmaMapping> dma_map_locked(void* host_address, std::size_t length);

  int fd_ = -1;
  std::string path_;
  mutable std::mutex mutex_;
  ControllerIdentity identity_{};
  volatile std::uint8_t* doorbells_ = nullptr;
  std::size_t doorbell_bytes_ = 0;
  const void* status_page_ = nullptr;        // snvme_status, read-only; null without SNVME_CAP_STATUS
  std::map<std::uint16_t, Ring> rings_;      // by QID
  std::map<std::uint64_t, Buffer> buffers_;  // allocate_dma_buffer, by map id
  std::vector<AdoptedQueue> adopted_;        // adopt: queues not handed out yet, in order
  bool adopting_ = false;                    // adopt: create_io_queue_pair hands out adopted_ only
};

}  // namespace tutti::libnvm
