// The abstract NVMe controller as the layers above see it (the local_nvme DataPath, presets,
// tests), whatever implements it: libnvm's soft controller and register-level driver, its snvme
// driver backend, later others. Header-only: the header-only tree (include/tutti/) reaches a
// controller through this interface and never includes libnvm's headers; libnvm implements it.
//
// The per-IO hot path never goes through this class: create_io_queue_pair returns the raw queue
// memory and doorbell pointers, which tutti/nvme/queue.hpp drives directly (from host threads or
// GPU threads). Controller covers the slow path: bring-up, queue creation, DMA mapping and admin
// commands, so virtual dispatch is fine here.
//
// Units: bytes for lengths and sizes unless the name says LBAs; time budgets in nanoseconds.
// Errors: every function returns Status / Result; NVMe status codes of admin commands are
// reported in the returned CompletionQueueEntry (submit_admin) or as DEVICE_ERROR with the
// decoded status text (the convenience functions), never thrown.
// Thread-safety: all member functions may be called concurrently from several threads unless
// noted; they serialise internally (the admin queue has one submitter at a time).
//
// STABILITY: this interface is used by the local_nvme DataPath and the snvme backend; changes
// are additive only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/identify.hpp>
#include <tutti/nvme/page_table.hpp>
#include <tutti/nvme/registers.hpp>

namespace tutti::nvme {

/// Options of Controller::bring_up (defaults as initialised below).
struct BringUpOptions {
  /// I/O submission/completion queue pairs to request with Set Features - Number of Queues
  /// (Base 2.0, 5.27.1.5); the controller may allocate fewer (see ControllerIdentity).
  std::uint16_t io_queue_pairs_requested = 8;
  /// Admin queue depth in entries (2..4096), both SQ and CQ (AQA, Base 2.0, 3.1.3.8).
  std::uint32_t admin_queue_depth = 32;
  /// Time budget for each register handshake (CSTS.RDY after CC.EN changes); 0 uses CAP.TO.
  std::uint64_t ready_timeout_ns = 0;
  /// Time budget for each admin command of the bring-up (Identify, Set Features), ns.
  std::uint64_t admin_timeout_ns = 2'000'000'000;
  /// Namespace to use (the identity describes this one), 1-based NSID.
  std::uint32_t nsid = 1;
};

/// What the layers above need to know about the controller and its namespace, read during
/// bring_up from Identify Controller / Identify Namespace (Base 2.0, 5.17).
struct ControllerIdentity {
  std::uint32_t nsid = 0;                            ///< namespace described below
  std::uint32_t lba_size = 0;                        ///< bytes per LBA (512 or 4096 typically), from FLBAS/LBAF
  std::uint64_t namespace_size_lbas = 0;             ///< NSZE, LBAs
  std::uint64_t max_data_transfer_bytes = 0;         ///< from MDTS and CAP.MPSMIN; 0 = no limit reported
  std::uint32_t memory_page_size = 4096;             ///< CC.MPS in bytes (PRP page size)
  std::uint32_t max_queue_entries = 0;               ///< CAP.MQES + 1: deepest I/O queue allowed
  std::uint32_t doorbell_stride = 0;                 ///< CAP.DSTRD (raw: doorbells are 4 << DSTRD bytes apart)
  std::uint16_t io_submission_queues_allocated = 0;  ///< from Set Features - Number of Queues (decoded, not 0's based)
  std::uint16_t io_completion_queues_allocated = 0;
  std::uint32_t number_of_namespaces = 0;     ///< NN
  bool sgl_supported = false;                 ///< SGLS bits 1:0 != 0
  bool write_zeroes_supported = false;        ///< ONCS bit 3
  bool dataset_management_supported = false;  ///< ONCS bit 2
  bool volatile_write_cache = false;          ///< VWC bit 0
  std::string serial_number;                  ///< SN, trailing spaces removed
  std::string model_number;                   ///< MN, trailing spaces removed
  std::string firmware_revision;              ///< FR, trailing spaces removed
  IdentifyController controller{};            ///< the full Identify Controller data
  IdentifyNamespace namespace_data{};         ///< the full Identify Namespace data of nsid

  /// The fields that come from the Identify data alone (nsid, lba_size, namespace_size_lbas,
  /// number_of_namespaces, the support bits, SN/MN/FR and both structures); every implementation
  /// decodes them here and fills the transport's fields (max_data_transfer_bytes,
  /// memory_page_size, max_queue_entries, doorbell_stride, queues allocated) itself.
  /// lba_size is 0 when FLBAS names no valid LBA format (the caller reports it).
  static ControllerIdentity from_identify(const IdentifyController& c, const IdentifyNamespace& n, std::uint32_t nsid) {
    ControllerIdentity id;
    id.nsid = nsid;
    id.lba_size = static_cast<std::uint32_t>(n.lba_size_bytes());
    id.namespace_size_lbas = n.nsze;
    id.number_of_namespaces = c.nn;
    id.sgl_supported = c.sgl_supported();
    id.write_zeroes_supported = c.write_zeroes_supported();
    id.dataset_management_supported = c.dataset_management_supported();
    id.volatile_write_cache = c.volatile_write_cache_present();
    id.serial_number = identify_text(c.sn);
    id.model_number = identify_text(c.mn);
    id.firmware_revision = identify_text(c.fr);
    id.controller = c;
    id.namespace_data = n;
    return id;
  }

  /// An ASCII Identify field (SN, MN, FR: space padded, Base 2.0, Figure 275) without its
  /// trailing spaces (and NULs, which some devices pad with).
  template <std::size_t N>
  static std::string identify_text(const char (&field)[N]) {
    std::string s(field, ::strnlen(field, N));
    while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
    return s;
  }
};

/// The kind of memory a DmaMapping covers.
enum class DmaMemoryKind : std::uint8_t {
  host,    ///< host memory (Controller::dma_map, allocate_dma_buffer)
  device,  ///< accelerator (GPU) memory (Controller::dma_map_device); not dereferenceable on the host
};

/// A memory region DMA-mapped for one controller (Controller::dma_map, dma_map_device).
/// The region is [host_address, host_address + length), page aligned, and stays mapped until
/// dma_unmap(id). bus_addresses[i] is what the device uses for page i (may be non-contiguous).
/// For memory_kind == device, host_address is the accelerator address of the region.
struct DmaMapping {
  std::uint64_t id = 0;                             ///< handle for dma_unmap; never 0 for a live mapping
  void* host_address = nullptr;                     ///< start of the region, page_size aligned
  std::size_t length = 0;                           ///< bytes, a multiple of page_size
  std::uint32_t page_size = 4096;                   ///< bytes per page table entry (controller memory page size)
  std::vector<std::uint64_t> bus_addresses;         ///< one bus address per page, each page_size aligned
  DmaMemoryKind memory_kind = DmaMemoryKind::host;  ///< host memory or accelerator memory

  /// The view the PRP / SGL builders take. Valid while this object lives and is not modified.
  PageTableView page_table() const noexcept {
    return PageTableView{bus_addresses.data(), bus_addresses.size(), page_size};
  }
};

/// Memory allocated by the controller for the device to read or write (queues, PRP lists, SGL
/// segments, Identify buffers): contiguous in host and in bus space, page aligned, zeroed.
/// Freed with Controller::free_dma_buffer (or when the controller is destroyed).
struct DmaBuffer {
  void* host_address = nullptr;   ///< page aligned
  std::uint64_t bus_address = 0;  ///< page aligned, contiguous for `length` bytes
  std::size_t length = 0;         ///< bytes, a multiple of the memory page size
  std::uint64_t id = 0;           ///< handle for free_dma_buffer
  /// The buffer as a descriptor area for the PRP / SGL builders.
  DescriptorArea descriptor_area() const noexcept { return DescriptorArea{host_address, bus_address, length}; }
};

/// An I/O queue pair as created on the controller: what tutti/nvme/queue.hpp needs.
/// SQ and CQ have the same depth and the same QID (SQ y uses CQ y). Pointers stay valid until
/// delete_io_queue_pair(qid) or the controller is destroyed.
struct QueuePairInfo {
  std::uint16_t qid = 0;    ///< 1..io_submission_queues_allocated
  std::uint32_t depth = 0;  ///< entries in SQ and in CQ (2..MQES+1); at most depth-1 outstanding SQEs
  SubmissionQueueEntry* submission_queue = nullptr;                  ///< depth entries, 64 B each, page aligned
  CompletionQueueEntry* completion_queue = nullptr;                  ///< depth entries, 16 B each, page aligned
  volatile std::uint32_t* submission_queue_tail_doorbell = nullptr;  ///< SQyTDBL
  volatile std::uint32_t* completion_queue_head_doorbell = nullptr;  ///< CQyHDBL
  const volatile std::uint32_t* controller_status = nullptr;  ///< CSTS, for CFS / device-gone checks while polling
  std::uint32_t doorbell_stride = 0;                          ///< CAP.DSTRD (raw)
  std::uint64_t submission_queue_bus_address = 0;
  std::uint64_t completion_queue_bus_address = 0;
  /// Host threads may read and write the SQ, the CQ and the doorbells. False for a pair whose queue
  /// memory only GPU threads reach (device memory: a CPU load of it faults); a DataPath then
  /// touches that pair from kernels only (local_nvme leaves its zombie commands to queue deletion,
  /// docs/local-nvme.md "Timeouts").
  bool host_accessible = true;
};

/// One NVMe controller. See the header comment for threading and error conventions.
class Controller {
 public:
  virtual ~Controller() = default;

  /// Implementation name: "soft" (software controller) or "snvme".
  virtual std::string_view kind() const noexcept = 0;

  /// Resets the controller (CC.EN = 0, wait CSTS.RDY = 0), sets up the admin queue (AQA, ASQ,
  /// ACQ), enables it (CC.EN = 1 with MPS, IOSQES = 6, IOCQES = 4; wait CSTS.RDY = 1), reads
  /// Identify Controller and Identify Namespace (options.nsid), and sets Number of Queues.
  /// Any previous queues are gone afterwards. Base 2.0, 3.5.1 "Memory-based Controller
  /// Initialization". Errors: TIMEOUT (RDY did not change within the budget), DEVICE_ERROR
  /// (CSTS.CFS set, device gone, or an admin command failed: message has the NVMe status text),
  /// INVALID_ARGUMENT (options out of range, namespace not active), RESOURCE_EXHAUSTED (no DMA memory).
  virtual Status bring_up(const BringUpOptions& options) = 0;

  /// Normal shutdown (CC.SHN = 01b, wait CSTS.SHST = 10b) within timeout_ns; queues are deleted.
  /// Errors: TIMEOUT, DEVICE_ERROR.
  virtual Status shutdown(std::uint64_t timeout_ns) = 0;

  /// Identity read by the last successful bring_up. Precondition: bring_up succeeded (otherwise
  /// a default identity with lba_size 0 is returned).
  virtual const ControllerIdentity& identity() const noexcept = 0;

  /// Current CSTS (Base 2.0, 3.1.3.6); all ones when the device is gone.
  virtual ControllerStatus controller_status() const noexcept = 0;

  /// Creates I/O CQ y and I/O SQ y (Base 2.0, 5.4, 5.5) of `depth` entries (2..max_queue_entries)
  /// on controller-allocated DMA memory, y = the lowest free QID. Errors: INVALID_ARGUMENT (depth
  /// out of range), RESOURCE_EXHAUSTED (all allocated queue IDs in use, or no DMA memory),
  /// DEVICE_ERROR (the Create command failed; message has the NVMe status), TIMEOUT.
  virtual Result<QueuePairInfo> create_io_queue_pair(std::uint32_t depth) = 0;

  /// Deletes I/O SQ qid then I/O CQ qid (Base 2.0, 5.6, 5.7) and frees their memory. Commands
  /// still in the SQ complete with "Command Aborted due to SQ Deletion" on the controller side;
  /// the caller must stop using the QueuePairInfo first. Errors: NOT_FOUND (no such pair),
  /// DEVICE_ERROR, TIMEOUT.
  virtual Status delete_io_queue_pair(std::uint16_t qid) = 0;

  /// DMA-maps [host_address, host_address + length) for the device (the IOMMU rule: the device
  /// may only touch mapped regions). host_address and length must be multiples of the memory
  /// page size (4096). Returns the page table. Errors: INVALID_ARGUMENT (null, zero length,
  /// misaligned), RESOURCE_EXHAUSTED (out of bus address space), UNSUPPORTED (memory kind).
  virtual Result<DmaMapping> dma_map(void* host_address, std::size_t length) = 0;

  /// DMA-maps accelerator (GPU) memory [device_address, device_address + length), e.g. from
  /// accel::allocate_device / cudaMalloc, so commands can read into and write from it directly;
  /// both multiples of the memory page size (4096). Returns a mapping with memory_kind == device.
  /// Unmap with dma_unmap. Errors: UNSUPPORTED (this controller cannot reach accelerator memory;
  /// the default implementation always returns it; the soft controller needs accelerator_mode),
  /// INVALID_ARGUMENT (null, zero length, misaligned, overlapping), RESOURCE_EXHAUSTED.
  virtual Result<DmaMapping> dma_map_device(void* device_address, std::size_t length) {
    return error(StatusCode::UNSUPPORTED,
                 "dma_map_device({}, {} bytes): the {} controller cannot DMA-map accelerator memory", device_address,
                 length, kind());
  }

  /// Unmaps a region of either kind (dma_map or dma_map_device). Errors: NOT_FOUND (unknown
  /// id), BUSY (a queue of the controller lives in it).
  virtual Status dma_unmap(std::uint64_t mapping_id) = 0;

  /// Allocates zeroed DMA memory, contiguous in bus space, rounded up to the memory page size.
  /// Errors: INVALID_ARGUMENT (length 0), RESOURCE_EXHAUSTED.
  virtual Result<DmaBuffer> allocate_dma_buffer(std::size_t length) = 0;
  /// Frees a DmaBuffer. Errors: NOT_FOUND, BUSY (a queue lives in it).
  virtual Status free_dma_buffer(std::uint64_t id) = 0;

  /// Submits one admin command and waits for its completion for at most timeout_ns. The caller
  /// fills everything but the CID. Returns the CQE whatever its NVMe status (check
  /// cqe.status.success()); errors are transport-level only: TIMEOUT (no completion in time; the
  /// CID stays reserved until the controller answers or is reset), DEVICE_ERROR (CSTS.CFS set or
  /// device gone), NOT_READY (bring_up has not succeeded).
  virtual Result<CompletionQueueEntry> submit_admin(const SubmissionQueueEntry& command, std::uint64_t timeout_ns) = 0;

  /// Aborts command `cid` of I/O SQ `sqid` (Base 2.0, 5.1). Returns true when the controller
  /// aborted it (its own CQE then carries "Command Abort Requested"), false when the command was
  /// not found (already completed). Errors: as submit_admin, DEVICE_ERROR on a failed Abort.
  virtual Result<bool> abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t timeout_ns) = 0;
};

}  // namespace tutti::nvme
