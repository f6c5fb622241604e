// The runtime resource of a tuttid client: an nvme::Controller over the I/O queue pairs of one lease
// (docs/daemon.md, "A runtime over a lease"). The local_nvme DataPath and make_local_nvme_runtime take it
// like any controller:
//
//   auto controller = tutti::daemon::LeasedController::acquire({.controller = "soft0", .queues = 2,
//                                                               .pinned_bytes = 64 << 20});
//   auto path = tutti::local_nvme::LocalNvmeDataPath::create(**controller, {.queue_pairs = 2,
//                                                           .queue_depth = (*controller)->queue_depth()});
//
// What differs from a controller this process owns:
//   - tuttid brought the controller up and created the queue pairs (Base 2.0, 5.4 and 5.5) when it granted
//     the lease. create_io_queue_pair hands out the leased pairs in order, at the lease's depth. A pair its
//     user deletes is retired, never handed out again (its SQ head and CQ phase continue where they
//     stopped), and delete_io_queue_pair says BUSY: only tuttid deletes it (Base 2.0, 5.6 and 5.7), when the
//     lease ends, so a command still in it may complete until then (local_nvme keeps such a command's
//     memory mapped).
//   - Soft mode: the daemon's process runs the soft controller, so the memory it moves data to and from must
//     be shared with it. allocate_host_memory gives such memory: a memfd sealed against shrinking, mapped here
//     and in tuttid, and registered on the lease (charged to its pinned_bytes). dma_map accepts only ranges of
//     that memory and refuses any other address with UNSUPPORTED naming allocate_host_memory. Memory stays
//     mapped and registered until the controller is destroyed, after the lease has ended: the controller never
//     writes memory that is gone.
//   - PCI mode (a controller bound to the snvme driver): the lease's file of /dev/snvme<C> arrives with the
//     answer, sealed by tuttid (no new queue group; DMA maps up to the lease's pinned_bytes). It is adopted by
//     libnvm's SnvmeController (SnvmeController::adopt), whose rings, doorbells and status page the queues
//     use; dma_map, allocate_dma_buffer and abort go to the driver through it (a map past the seal is
//     RESOURCE_EXHAUSTED), and allocate_host_memory is plain anonymous memory of this process (the
//     controller reaches any memory the driver pins). When the lease ends tuttid destroys the queue groups
//     (their ring mappings here are revoked by the driver: touching them then raises SIGBUS), so stop using
//     the queues once the lease is revoked (the CSTS word below says so).
//   - Admin commands stay with tuttid: bring_up, shutdown and submit_admin are UNSUPPORTED; abort is UNSUPPORTED
//     too (protocol version 1 has no abort message), so a command whose completion is lost stays in its
//     queue until the lease ends; local_nvme reports its request TIMEOUT and keeps the memory mapped.
//   - The end of the lease reaches the queues: a watcher thread reads tuttid's connection every 10 ms, and
//     once tuttid has closed it (stopped or crashed) or sent "revoked" for this lease, the CSTS word every
//     leased queue polls (QueuePairInfo::controller_status) reads all ones, "device gone" (Base 2.0,
//     3.1.3.6); until then it is a copy of the controller's CSTS, at most 10 ms old. Every later call to
//     tuttid fails, as does every call after one that failed or timed out (its answer could otherwise be
//     taken for the next call's).
//
// Errors of acquire name tuttid's answer: RESOURCE_EXHAUSTED ("exhausted", "over_limit"), UNSUPPORTED
// ("permission_denied"), NOT_FOUND ("not_found", no socket), NOT_READY ("unavailable", "draining"),
// INVALID_ARGUMENT (an option out of range, "bad_request"), TIMEOUT (no answer within timeout_ns),
// DEVICE_ERROR (the connection closed).
// Thread-safety: every member may be called from any thread; calls to tuttid and the bookkeeping of
// memory and queues serialise on one mutex. The hot path (SQ, CQ, doorbells) never comes here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>

#include "client.hpp"
#include "config.hpp"

namespace tutti::libnvm {
class SnvmeController;
}

namespace tutti::daemon {

/// What LeasedController::acquire asks tuttid for.
struct LeaseOptions {
  std::string socket_path{kDefaultSocketPath};  ///< tuttid's socket
  std::string controller;                       ///< the controller's name in tuttid's configuration (1..32 bytes)
  std::uint32_t queues = 1;                     ///< I/O queue pairs, 1..65535 (tuttid caps it per client)
  /// Bytes of memory the lease may register (allocate_host_memory, allocate_dma_buffer), 1..2^50; tuttid
  /// caps it per client. local_nvme needs its data buffers, and for each registration PRP lists of
  /// 2 x (pages / 511 + 1) pages of 4 KiB (registration.hpp), reused once that registration ends.
  std::uint64_t pinned_bytes = 0;
  std::uint64_t timeout_ns = 10'000'000'000;  ///< the longest any call to tuttid waits, > 0
};

/// A namespace of the leased controller as tuttid reports it in the acquire answer ("namespaces").
struct LeasedNamespace {
  std::uint32_t nsid = 0;
  std::string mount;         ///< where its file system is mounted; empty: no mount point configured
  std::string filesystem;    ///< "ext4" or "xfs"
  std::string block_device;  ///< the block device it is mounted from ("/dev/loop3"); empty when not mounted
  std::string mount_state;   ///< "mounted" (by tuttid), "verified" (found mounted), empty when not mounted
};

class LeasedController final : public nvme::Controller {
 public:
  /// Connects to tuttid, acquires a lease and maps its queues and doorbells (soft mode: BAR0 and the rings
  /// arrive as memfds). Errors: see the file comment; INVALID_ARGUMENT names the option, its value and the
  /// range.
  static Result<std::unique_ptr<LeasedController>> acquire(const LeaseOptions& options);

  /// Releases the lease (tuttid deletes its queues, which ends every command still in them), then unmaps
  /// the queues and the memory. The users of the queue pairs (a DataPath) must be destroyed first.
  ~LeasedController() override;
  LeasedController(const LeasedController&) = delete;
  LeasedController& operator=(const LeasedController&) = delete;

  /// Zeroed host memory the controller can move data to and from: `length` bytes rounded up to 4096,
  /// 4096-byte aligned, registered on the lease. Valid until the controller is destroyed. Errors:
  /// INVALID_ARGUMENT (length 0 or above 1 TiB), RESOURCE_EXHAUSTED (memfd or mmap failed, or tuttid refused:
  /// above the lease's pinned_bytes, with its message), DEVICE_ERROR and TIMEOUT (talking to tuttid).
  Result<void*> allocate_host_memory(std::size_t length);

  std::uint64_t lease_id() const noexcept { return lease_id_; }
  /// The leased queue IDs, in the order create_io_queue_pair hands them out.
  const std::vector<std::uint16_t>& queue_ids() const noexcept { return qids_; }
  /// The controller's namespaces from the acquire answer, with their file systems (docs/daemon.md, "Mounts").
  const std::vector<LeasedNamespace>& namespaces() const noexcept { return namespaces_; }
  /// Entries of every leased SQ and CQ (tuttid's queue_depth): the depth create_io_queue_pair takes.
  std::uint32_t queue_depth() const noexcept { return identity_.max_queue_entries; }

  std::string_view kind() const noexcept override { return "leased"; }
  /// UNSUPPORTED: tuttid brings the controller up; it is up when acquire returns.
  Status bring_up(const nvme::BringUpOptions& options) override;
  /// UNSUPPORTED: tuttid shuts the controller down; the destructor ends the lease.
  Status shutdown(std::uint64_t timeout_ns) override;
  /// From tuttid's acquire answer: nsid, lba_size, namespace_size_lbas, max_data_transfer_bytes,
  /// memory_page_size, doorbell_stride; max_queue_entries is the lease's queue depth and
  /// io_submission_queues_allocated the number of leased pairs. The Identify structures are zero.
  const nvme::ControllerIdentity& identity() const noexcept override { return identity_; }
  /// CSTS as the queues see it: the controller's (from the BAR0 tuttid shares), or all ones once tuttid has
  /// gone or revoked the lease (see the file comment).
  nvme::ControllerStatus controller_status() const noexcept override;
  /// The next leased pair not handed out yet. Errors: INVALID_ARGUMENT (depth is not the lease's depth),
  /// RESOURCE_EXHAUSTED (every leased pair handed out: acquire a lease with more queues).
  Result<nvme::QueuePairInfo> create_io_queue_pair(std::uint32_t depth) override;
  /// Retires a pair handed out by create_io_queue_pair. Returns BUSY for a pair handed out (retired now, or
  /// before): its commands end only when tuttid deletes it at the end of the lease. Errors: NOT_FOUND (not
  /// a pair handed out).
  Status delete_io_queue_pair(std::uint16_t qid) override;
  /// The page table of [host_address, host_address + length) inside memory from allocate_host_memory or
  /// allocate_dma_buffer; both multiples of 4096. Errors: INVALID_ARGUMENT (null, zero, misaligned),
  /// UNSUPPORTED (not inside such memory: the daemon's process cannot reach it). PCI mode: any memory of this
  /// process, pinned by the driver (SnvmeController::dma_map); RESOURCE_EXHAUSTED past the lease's seal.
  Result<nvme::DmaMapping> dma_map(void* host_address, std::size_t length) override;
  /// Forgets a dma_map (the memory stays registered until the controller is destroyed). Errors: NOT_FOUND.
  Status dma_unmap(std::uint64_t mapping_id) override;
  /// Memory as allocate_host_memory's, contiguous in bus space: a freed buffer of the same rounded length is
  /// reused (zeroed), else a new region is registered. Errors: those of allocate_host_memory,
  /// RESOURCE_EXHAUSTED (tuttid gave pages that are not contiguous in bus space).
  Result<nvme::DmaBuffer> allocate_dma_buffer(std::size_t length) override;
  /// Returns a DmaBuffer for reuse by allocate_dma_buffer (its memory stays registered and charged to the
  /// lease until the controller is destroyed). Errors: NOT_FOUND.
  Status free_dma_buffer(std::uint64_t id) override;
  /// UNSUPPORTED: admin commands stay with tuttid.
  Result<nvme::CompletionQueueEntry> submit_admin(const nvme::SubmissionQueueEntry& command,
                                                  std::uint64_t timeout_ns) override;
  /// Soft mode: UNSUPPORTED, protocol version 1 has no abort message (see the file comment). PCI mode: the
  /// driver's ABORT of a command of this lease's queues (SnvmeController::abort).
  Result<bool> abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t timeout_ns) override;

 private:
  /// A memfd mapped here and registered on the lease.
  struct Region {
    std::uint8_t* address = nullptr;
    std::size_t length = 0;
    std::vector<std::uint64_t> bus_addresses;  ///< one per 4096-byte page
    bool dma_buffer = false;                   ///< made by allocate_dma_buffer
    std::uint64_t buffer_id = 0;               ///< its live DmaBuffer's id; 0 once freed (reusable)
  };
  /// A mapped memfd from tuttid (BAR0, a ring).
  struct Shared {
    void* base = nullptr;
    std::size_t length = 0;
  };

  LeasedController(Connection connection, LeaseOptions options);  // in the .cpp: SnvmeController is complete there
  Status map_lease(const nlohmann::json& lease, const std::vector<int>& fds);
  Status map_snvme_lease(const nlohmann::json& snvme, const std::vector<int>& fds);
  /// One request to tuttid (mutex_ held). After a failed or timed-out call every later call fails.
  Result<nlohmann::json> call(const nlohmann::json& request, const std::vector<int>& fds_out, std::vector<int>& fds_in);
  Result<Region*> register_region(std::size_t length);                     // mutex_ held
  const Region* region_of(const void* address, std::size_t length) const;  // mutex_ held
  Status start_watcher();
  void watch();
  void mark_gone(const std::string& why);  // mutex_ held

  mutable std::mutex mutex_;
  Status broken_;  ///< why calls to tuttid fail from now on (mutex_ held); OK while they work
  Connection connection_;
  LeaseOptions options_;
  std::uint64_t lease_id_ = 0;
  nvme::ControllerIdentity identity_;
  std::vector<std::uint16_t> qids_;
  std::vector<LeasedNamespace> namespaces_;
  std::vector<nvme::QueuePairInfo> queues_;
  std::vector<bool> handed_out_;  ///< per queue: create_io_queue_pair gave it (never handed out again)
  std::unique_ptr<libnvm::SnvmeController> snvme_;  ///< PCI mode: the adopted sealed file; null in soft mode
  std::vector<Shared> shared_;
  const volatile std::uint32_t* csts_ = nullptr;  ///< CSTS in the shared BAR0
  /// What the queues poll as CSTS: the watcher's copy of *csts_, all ones once the lease is gone. Written by
  /// the watcher thread, read by pollers as a volatile word (std::atomic<std::uint32_t> is one lock-free
  /// 32-bit word).
  std::atomic<std::uint32_t> queue_csts_{0};
  std::atomic<bool> gone_{false};
  int stop_fd_ = -1;  ///< eventfd that ends the watcher
  std::thread watcher_;
  std::deque<Region> regions_;        ///< stable addresses: register_region and region_of return pointers
  std::set<std::uint64_t> live_ids_;  ///< dma_map ids not yet unmapped
  std::uint64_t next_id_ = 1;
};

}  // namespace tutti::daemon
