// The soft controller: an NVMe controller implemented in software, per the NVMe Base
// Specification 2.0 and the NVM Command Set Specification 1.0, so the whole queue path runs and
// is tested on any machine (DESIGN.md section 5).
//
// Two objects:
//  - SoftController is the *device*: BAR0 registers and doorbells in ordinary memory, an
//    IOMMU-like bus address space, a controller thread (CC/CSTS handshake and the admin queue)
//    and worker threads that poll I/O SQ tail doorbells, decode PRPs/SGLs and move data with
//    pread/pwrite on a backing file or block device (or nothing, in null mode).
//  - open_soft_controller() returns the libnvm Controller (the *host driver*) that drives such a
//    device through its registers exactly as it would drive a PCIe one (tutti/libnvm/controller.hpp).
//
// Bus address space: bus addresses are not host addresses. Every DMA-mapped region gets a window
// at kBusAddressBase and above (far from any host virtual address, so a host pointer used as a
// bus address always faults); with scatter_bus_pages each page of a region lands at an unrelated
// bus page, so builders that assume contiguity are caught. The address space knows the memory
// kind of each region: host memory (map, allocate_dma_buffer) or accelerator memory (map_device).
//
// Accelerator mode (SoftControllerConfig::accelerator_mode, the GPU mode of the soft controller):
// BAR0 (registers and doorbells) and every allocate_dma_buffer allocation (queues, PRP lists, SGL
// segments) come from accel::allocate_mapped_host (CUDA: cudaHostAlloc mapped, one address for
// host and GPU), so GPU kernels write SQEs and ring doorbells that the worker threads poll, and
// poll the CQEs the workers post. map_device adds accelerator (GPU) memory to the bus address
// space; the workers move data between the backing file and such regions through a pinned bounce
// buffer per worker (accel::allocate_mapped_host, max_data_transfer_bytes or
// kSoftDefaultBounceBufferBytes long) and accel::copy_to_device / copy_from_device, chunk by
// chunk. PRP lists and SGL segments inside device regions are read with copy_from_device too.
// In the host profile the same code runs with accel's host implementation (ordinary memory,
// memcpy), so the path is tested on every machine.
//
// Thread-safety: every member function may be called from any thread. Doorbell and queue
// memory follow the NVMe rules (one writer per doorbell value, see tutti/nvme/queue.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <tutti/core/status.hpp>
#include <tutti/libnvm/controller.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/registers.hpp>

namespace tutti::libnvm {

/// First bus address of the soft controller's DMA windows (bit 60 set: never a user-space VA).
inline constexpr std::uint64_t kBusAddressBase = 0x1000'0000'0000'0000ull;

/// Default settings (each SoftControllerConfig field below defaults to one of these; a test pins them).
inline constexpr std::uint32_t kSoftDefaultLbaSize = 4096;
inline constexpr std::uint32_t kSoftDefaultMaxQueueEntries = 1024;
inline constexpr std::uint16_t kSoftDefaultMaxIoQueuePairs = 64;
inline constexpr std::uint32_t kSoftDefaultMaxDataTransferBytes = 1u << 20;
inline constexpr std::uint32_t kSoftDefaultWorkerThreads = 1;
inline constexpr std::uint32_t kSoftDefaultIdleSleepMaxNs = 100'000;
inline constexpr std::uint32_t kSoftDefaultMaxSglDescriptors = 8192;
inline constexpr bool kSoftDefaultAcceleratorMode = false;
inline constexpr bool kSoftDefaultSharedMemory = false;
/// Bounce buffer per worker in accelerator mode when max_data_transfer_bytes is 0 (no MDTS), bytes.
inline constexpr std::uint32_t kSoftDefaultBounceBufferBytes = 1u << 20;

/// Configuration of a SoftController.
struct SoftControllerConfig {
  /// Backing file or block device, opened read-write with pread/pwrite. Empty: null mode.
  std::string backing_path;
  /// Null mode: commands complete successfully after full validation (PRP/SGL decoding, IOMMU
  /// checks, LBA range) but move no data; reads leave host memory untouched. For measuring
  /// submission cost only: never use it to verify data.
  bool null_mode = false;
  /// Namespace size in LBAs. 0 with a backing file: file size / lba_size (rounded down).
  /// Required (> 0) in null mode.
  std::uint64_t namespace_size_lbas = 0;
  /// LBA format in use: 512 (LBA format 0) or 4096 (LBA format 1). Both are reported (NLBAF = 1).
  std::uint32_t lba_size = kSoftDefaultLbaSize;
  /// CAP.MQES + 1: deepest queue accepted (2..65536).
  std::uint32_t max_queue_entries = kSoftDefaultMaxQueueEntries;
  /// I/O queue pairs the controller can allocate (Number of Queues feature), 1..65535.
  std::uint16_t max_io_queue_pairs = kSoftDefaultMaxIoQueuePairs;
  /// MDTS in bytes: a power of two times 4096, or 0 for no limit.
  std::uint32_t max_data_transfer_bytes = kSoftDefaultMaxDataTransferBytes;
  /// Worker threads polling I/O SQs (I/O queue y is served by worker (y - 1) % worker_threads).
  std::uint32_t worker_threads = kSoftDefaultWorkerThreads;
  /// Longest sleep of an idle poller, ns (pause -> yield -> sleep doubling up to this).
  std::uint32_t idle_sleep_max_ns = kSoftDefaultIdleSleepMaxNs;
  /// Give each page of a mapped region an unrelated bus page (tests PRP/SGL builders).
  bool scatter_bus_pages = false;
  /// Upper bound on SGL descriptors walked per command (loops in segment chains end here with
  /// "Invalid Number of SGL Descriptors").
  std::uint32_t max_sgl_descriptors = kSoftDefaultMaxSglDescriptors;
  /// CAP.DSTRD (doorbell stride 4 << DSTRD bytes), 0..15.
  std::uint32_t doorbell_stride = 0;
  /// Accelerator (GPU) mode: BAR0 and allocate_dma_buffer memory from accel::allocate_mapped_host,
  /// map_device enabled, a pinned bounce buffer per worker (see the header comment). create fails
  /// with the accelerator's error (UNSUPPORTED without a usable device in the cuda profile) when
  /// that memory cannot be allocated.
  bool accelerator_mode = kSoftDefaultAcceleratorMode;
  /// Shared memory mode (tuttid's soft mode): BAR0 and every allocate_dma_buffer region are memfds mapped
  /// MAP_SHARED, so another process that receives the memfd (shared_memory_of) drives the queues and rings the
  /// doorbells. Not with accelerator_mode (create fails with INVALID_ARGUMENT).
  bool shared_memory = kSoftDefaultSharedMemory;
};

/// Where an address of a shared_memory soft controller lives: [offset, offset + length) of memfd `fd`. The fd
/// belongs to the controller (valid until the region is unmapped); send it with SCM_RIGHTS, never close it.
struct SharedMemoryRange {
  int fd = -1;
  std::size_t offset = 0;  ///< of the address inside the memfd, bytes
  std::size_t length = 0;  ///< of the whole memfd, bytes (a multiple of 4096)
};

/// A fault to inject into I/O commands. A rule fires on a command when all its filters match;
/// it fires at most max_fires times (0: unlimited).
struct SoftFaultRule {
  enum class Action : std::uint8_t {
    complete_with_status,  ///< do not execute; complete with `status` (SCT/SC/DNR)
    delay_completion,      ///< execute when delay_ns has passed, then complete normally
    lose_completion,       ///< hold the command unexecuted forever: only Abort or SQ deletion ends it
    controller_fatal,      ///< set CSTS.CFS and stop processing every queue until reset
  };
  Action action = Action::complete_with_status;
  /// Fire on the nth matching I/O command (1-based, counted from the time the rule is added);
  /// 0: every matching command.
  std::uint64_t nth_command = 0;
  /// Match only commands whose LBA range intersects [first_lba, last_lba] (when lba_range_only).
  bool lba_range_only = false;
  std::uint64_t first_lba = 0;
  std::uint64_t last_lba = 0;
  /// Match only this opcode (-1: any).
  int opcode = -1;
  /// Match only this SQ (0: any I/O SQ).
  std::uint16_t sqid = 0;
  /// Status for complete_with_status (default: Unrecovered Read Error, DNR 1).
  nvme::StatusField status = nvme::StatusField::make(2, 0x81, true);
  /// Delay for delay_completion, ns.
  std::uint64_t delay_ns = 0;
  /// Fire at most this many times (0: unlimited).
  std::uint64_t max_fires = 1;
};

/// Counters of a SoftController (snapshot). All counts since creation.
struct SoftControllerCounters {
  std::uint64_t admin_commands = 0;  ///< admin commands completed
  std::uint64_t io_commands = 0;     ///< I/O commands completed (any status)
  std::uint64_t read_commands = 0, write_commands = 0, flush_commands = 0, write_zeroes_commands = 0,
                dataset_management_commands = 0;  ///< successful I/O commands by opcode
  std::uint64_t bytes_read =
      0;  ///< bytes moved backing store -> memory by successful Reads (host and accelerator memory)
  std::uint64_t bytes_written =
      0;  ///< bytes moved memory -> backing store by successful Writes (host and accelerator memory)
  std::uint64_t device_bytes_read = 0;     ///< the part of bytes_read that landed in map_device regions
  std::uint64_t device_bytes_written = 0;  ///< the part of bytes_written that came from map_device regions
  std::uint64_t errors = 0;                ///< completions with a non-success status (admin and I/O)
  std::map<std::uint16_t, std::uint64_t> errors_by_status;  ///< key: StatusField::without_phase()
  std::uint64_t dma_faults = 0;               ///< accesses outside every mapped region (IOMMU rule), memory untouched
  std::uint64_t invalid_doorbell_writes = 0;  ///< doorbell values out of range or for missing queues
  std::uint64_t injected_faults = 0;          ///< fault rules fired
  std::uint64_t aborted_commands = 0;         ///< commands completed with Command Abort Requested
  std::uint64_t completions_posted = 0;       ///< CQEs written (admin and I/O)
};

/// The software NVMe device. Create with SoftController::create; owned by shared_ptr so the
/// driver (open_soft_controller) and a test injecting faults can both hold it.
class SoftController {
 public:
  /// Validates the config, opens the backing file, starts the controller thread and the workers.
  /// The controller starts disabled (CC.EN = 0, CSTS.RDY = 0). Errors: INVALID_ARGUMENT (a field
  /// out of range: message names it), NOT_FOUND / UNSUPPORTED (backing file cannot be opened or
  /// sized), INTERNAL (threads could not start).
  static Result<std::shared_ptr<SoftController>> create(const SoftControllerConfig& config);

  ~SoftController();
  SoftController(const SoftController&) = delete;
  SoftController& operator=(const SoftController&) = delete;

  const SoftControllerConfig& config() const noexcept;

  /// BAR0: the register file followed by the doorbells (kDoorbellOffset). Host code writes CC,
  /// AQA, ASQ, ACQ and doorbells here with accel::mmio_store32 (64-bit ASQ/ACQ as two 32-bit
  /// halves, low first); the controller polls them. Valid for the lifetime of the object. In
  /// accelerator_mode it is mapped pinned memory: GPU kernels ring doorbells at the same address.
  volatile std::uint32_t* bar0() noexcept;
  /// Size of bar0() in bytes (registers + doorbells of the admin queue and every I/O queue pair).
  std::size_t bar0_size() const noexcept;

  /// DMA-maps host memory (the IOMMU rule). host_address and length multiples of 4096.
  /// Errors: INVALID_ARGUMENT (null, 0, misaligned, above accel::kMaxAllocationBytes (1 TiB),
  /// overlaps an existing mapping), RESOURCE_EXHAUSTED (bus space exhausted).
  Result<DmaMapping> map(void* host_address, std::size_t length);
  /// DMA-maps accelerator (GPU) memory, e.g. from accel::allocate_device / cudaMalloc, as a region
  /// of kind device (DmaMapping::memory_kind == DmaMemoryKind::device): [device_address,
  /// device_address + length) with device_address and length multiples of 4096. PRPs and SGLs
  /// pointing into it are decoded exactly as for host memory and the IOMMU rule (dma_faults)
  /// applies; Reads and Writes move the data through the worker's bounce buffer with
  /// accel::copy_to_device / copy_from_device. The memory must stay allocated until unmap.
  /// Errors: UNSUPPORTED (accelerator_mode is false), INVALID_ARGUMENT (null, 0, misaligned, above
  /// accel::kMaxAllocationBytes (1 TiB), overlaps an existing mapping), RESOURCE_EXHAUSTED (bus
  /// space exhausted).
  Result<DmaMapping> map_device(void* device_address, std::size_t length);
  /// Unmaps a region of either kind (and frees memory from allocate_dma_buffer). Waits for
  /// transfers in progress on the region to finish. Errors: NOT_FOUND, BUSY (an admin or I/O
  /// queue of this controller lives in it).
  Status unmap(std::uint64_t mapping_id);
  /// Allocates zeroed page-aligned host memory of `length` bytes rounded up to 4096 and maps it
  /// bus-contiguously (even with scatter_bus_pages), for queues, PRP lists and SGL segments.
  /// In accelerator_mode the memory comes from accel::allocate_mapped_host (GPU kernels reach it
  /// at host_address). Free with unmap(buffer.id). Errors: INVALID_ARGUMENT (0 or above
  /// accel::kMaxAllocationBytes), RESOURCE_EXHAUSTED, and in accelerator_mode the accelerator's
  /// UNSUPPORTED / DEVICE_ERROR.
  Result<DmaBuffer> allocate_dma_buffer(std::size_t length);
  /// Address of [bus_address, bus_address + length) if it lies in one mapped page run of one
  /// region, else nullptr (for tests and tools; the data path uses it internally). For a device
  /// region the address is accelerator memory: do not dereference it on the host.
  void* translate(std::uint64_t bus_address, std::size_t length) const;
  /// The memfd holding `address` (BAR0 or an allocate_dma_buffer region) in shared_memory mode.
  /// Errors: UNSUPPORTED (shared_memory is false), NOT_FOUND (not in such memory).
  Result<SharedMemoryRange> shared_memory_of(const void* address) const;

  /// Adds a fault rule; returns its id. Clear with clear_faults().
  std::uint64_t inject_fault(const SoftFaultRule& rule);
  /// Removes all fault rules (held commands stay held until Abort, SQ deletion or reset).
  void clear_faults();
  /// Sets CSTS.CFS now (as a controller_fatal rule would).
  void set_controller_fatal();

  /// A consistent snapshot of the counters.
  SoftControllerCounters counters() const;

  struct Impl;

 private:
  explicit SoftController(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The libnvm Controller (host driver) for a soft controller device. Not yet brought up: call
/// bring_up. Errors: INVALID_ARGUMENT (null device).
Result<std::unique_ptr<Controller>> open_soft_controller(std::shared_ptr<SoftController> device);

}  // namespace tutti::libnvm
