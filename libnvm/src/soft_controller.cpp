// The soft controller: an NVMe controller in software (see tutti/libnvm/soft_controller.hpp).
//
// Threads: one controller thread watches CC (enable, disable, shutdown) and serves the admin
// queue; worker threads serve I/O SQs (SQ y goes to the worker of its CQ, so each CQ has exactly
// one writer). Every poller backs off pause -> yield -> sleep (accel::Backoff) when idle.
// Locks: Worker::mutex guards a worker's queue list, its queues' held commands and its CQs'
// tails (taken by the controller thread to create/delete queues and to abort); BusSpace::mutex
// (shared) is held across every DMA so a region cannot be unmapped under a transfer.
#include <tutti/libnvm/soft_controller.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/libnvm/register_controller.hpp>
#include <tutti/nvme/identify.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/status.hpp>

#include "soft_dma.hpp"

namespace tutti::libnvm {
namespace {

using nvme::AdminOpcode;
using nvme::CommandSpecificStatus;
using nvme::GenericStatus;
using nvme::make_status;
using nvme::MediaStatus;
using nvme::NvmOpcode;
using nvme::StatusField;

constexpr std::uint64_t kPage = 4096;  // the only memory page size supported (CAP.MPSMIN = MPSMAX = 0)
constexpr std::uint32_t kBatch = 64;   // SQEs fetched from one SQ before looking at the next
constexpr std::uint64_t kNever = ~std::uint64_t{0};
constexpr StatusField kSuccess{0};

std::uint32_t load32(volatile std::uint32_t* p) { return accel::mmio_load32(p); }
void store32(volatile std::uint32_t* p, std::uint32_t v) {
  std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(p)).store(v, std::memory_order_release);
}

/// Who allocated a region's memory, i.e. how unmap frees it.
enum class MemoryOwner : std::uint8_t {
  caller,       // map / map_device: the caller frees it
  aligned,      // allocate_dma_buffer without accelerator_mode: std::aligned_alloc
  mapped_host,  // allocate_dma_buffer / BAR0 in accelerator_mode: accel::allocate_mapped_host
  shared,       // allocate_dma_buffer / BAR0 in shared_memory mode: a memfd mapped MAP_SHARED (allocate_shared)
};

/// The memfds of shared_memory mode, by mapped address: {fd, length}. One table per process.
struct SharedTable {
  std::mutex mutex;
  std::map<std::uintptr_t, std::pair<int, std::size_t>> regions;
};
SharedTable& shared_table() {
  static SharedTable* table = new SharedTable;  // never destroyed: regions may be freed during exit
  return *table;
}

/// A zeroed memfd of `length` bytes (a multiple of 4096) mapped MAP_SHARED; nullptr on failure.
void* allocate_shared(std::size_t length) {
  const int fd = ::memfd_create("tutti-soft-controller", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  // Sealed at its size: a process the memfd is sent to cannot shrink it under the controller (whose next
  // access would then raise SIGBUS), nor grow it, nor change the seals.
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* memory = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (memory == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  std::lock_guard lock(shared_table().mutex);
  shared_table().regions[reinterpret_cast<std::uintptr_t>(memory)] = {fd, length};
  return memory;
}

void free_shared(void* memory) noexcept {
  std::pair<int, std::size_t> region{-1, 0};
  {
    std::lock_guard lock(shared_table().mutex);
    auto it = shared_table().regions.find(reinterpret_cast<std::uintptr_t>(memory));
    if (it == shared_table().regions.end()) return;
    region = it->second;
    shared_table().regions.erase(it);
  }
  ::munmap(memory, region.second);
  ::close(region.first);
}

void free_owned(void* memory, MemoryOwner owner) noexcept {
  if (owner == MemoryOwner::aligned) std::free(memory);
  if (owner == MemoryOwner::mapped_host) accel::free_mapped_host(memory);
  if (owner == MemoryOwner::shared) free_shared(memory);
}

/// BAR0's memory: aligned host memory, or mapped pinned memory in accelerator mode.
struct BarFree {
  MemoryOwner owner = MemoryOwner::aligned;
  void operator()(std::uint32_t* p) const noexcept { free_owned(p, owner); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Bus address space (the IOMMU).

namespace {

/// One contiguous piece of a transfer: `length` bytes at `host`, which is accelerator memory
/// (moved with accel::copy_to_device / copy_from_device) when `device` is set.
struct HostSpan {
  std::uint8_t* host;
  std::uint64_t length;
  bool device = false;
};

/// Copies `length` bytes from a span's memory to host memory `destination`; false when the
/// accelerator copy failed.
bool copy_from_span(const HostSpan& span, std::uint8_t* destination, std::uint64_t offset, std::uint64_t length) {
  if (!span.device) {
    std::memcpy(destination, span.host + offset, length);
    return true;
  }
  return accel::copy_from_device(destination, span.host + offset, length).is_ok();
}
/// Copies `length` bytes of host memory `source` into a span's memory; false when the
/// accelerator copy failed.
bool copy_to_span(const HostSpan& span, std::uint64_t offset, const std::uint8_t* source, std::uint64_t length) {
  if (!span.device) {
    std::memcpy(span.host + offset, source, length);
    return true;
  }
  return accel::copy_to_device(span.host + offset, source, length).is_ok();
}

struct Region {
  std::uint64_t id = 0;
  std::uint64_t bus_base = 0;
  std::uint64_t pages = 0;
  std::uint8_t* host = nullptr;
  std::vector<std::uint32_t> host_page_of_bus_page;  // empty: identity (contiguous)
  std::vector<std::uint32_t> bus_page_of_host_page;
  std::uint32_t queue_users = 0;            // admin/I/O queues living in this region
  MemoryOwner owner = MemoryOwner::caller;  // how unmap frees the memory
  DmaMemoryKind kind = DmaMemoryKind::host;
};

/// What BusSpace::unmap leaves to free (outside the lock).
struct Unmapped {
  void* memory = nullptr;
  MemoryOwner owner = MemoryOwner::caller;
};

class BusSpace {
 public:
  mutable std::shared_mutex mutex;

  Result<DmaMapping> map(void* host_address, std::size_t length, bool scatter, MemoryOwner owner,
                         DmaMemoryKind kind = DmaMemoryKind::host) {
    const bool device = kind == DmaMemoryKind::device;
    const char* what = device ? "dma_map_device" : "dma_map";
    const char* address_name = device ? "device_address" : "host_address";
    if (host_address == nullptr || length == 0)
      return error(StatusCode::INVALID_ARGUMENT, "{}: {} = {} and length = {} must be non-null and non-zero", what,
                   address_name, host_address, length);
    const auto start = reinterpret_cast<std::uintptr_t>(host_address);
    if (start % kPage != 0 || length % kPage != 0)
      return error(StatusCode::INVALID_ARGUMENT, "{}: {} = {:#x} and length = {} must be multiples of {} bytes", what,
                   address_name, start, length, kPage);
    if (start + length < start)
      return error(StatusCode::INVALID_ARGUMENT, "{}: {} = {:#x} + length = {} wraps around the address space", what,
                   address_name, start, length);
    // The length cannot be checked against the memory behind the address, but a region larger than
    // any allocation accel/ hands out is a caller's bug (a negative length cast to size_t, a size in
    // the wrong unit); accepting it would build a page table of length / 4096 entries and let commands
    // DMA past the real allocation.
    if (length > accel::kMaxAllocationBytes)
      return error(StatusCode::INVALID_ARGUMENT, "{}: length = {} exceeds the limit of {} bytes per mapping", what,
                   length, accel::kMaxAllocationBytes);
    std::unique_lock lock(mutex);
    auto next = host_ranges_.lower_bound(start);
    if ((next != host_ranges_.end() && next->first < start + length) ||
        (next != host_ranges_.begin() && std::prev(next)->second.first > start))
      return error(StatusCode::INVALID_ARGUMENT, "{}: [{:#x}, +{}) overlaps an existing mapping", what, start, length);
    const std::uint64_t pages = length / kPage;
    if (pages > 0xffffffffull || next_bus_ + (pages + 1) * kPage < next_bus_)
      return error(StatusCode::RESOURCE_EXHAUSTED, "{}: bus address space exhausted", what);
    Region region;
    region.id = next_id_++;
    region.bus_base = next_bus_;
    region.pages = pages;
    region.host = static_cast<std::uint8_t*>(host_address);
    region.owner = owner;
    region.kind = kind;
    if (scatter && pages > 1) {
      region.bus_page_of_host_page.resize(pages);
      std::iota(region.bus_page_of_host_page.begin(), region.bus_page_of_host_page.end(), 0u);
      std::mt19937_64 random(region.id * 0x9e3779b97f4a7c15ull);
      std::shuffle(region.bus_page_of_host_page.begin(), region.bus_page_of_host_page.end(), random);
      region.host_page_of_bus_page.resize(pages);
      for (std::uint32_t h = 0; h < pages; ++h) region.host_page_of_bus_page[region.bus_page_of_host_page[h]] = h;
    }
    next_bus_ += (pages + 1) * kPage;  // one unmapped guard page between windows
    DmaMapping mapping;
    mapping.id = region.id;
    mapping.host_address = host_address;
    mapping.length = length;
    mapping.page_size = static_cast<std::uint32_t>(kPage);
    mapping.memory_kind = kind;
    mapping.bus_addresses.resize(pages);
    for (std::uint64_t h = 0; h < pages; ++h)
      mapping.bus_addresses[h] =
          region.bus_base + (region.bus_page_of_host_page.empty() ? h : region.bus_page_of_host_page[h]) * kPage;
    host_ranges_.emplace(start, std::make_pair(start + length, region.bus_base));
    base_of_id_.emplace(region.id, region.bus_base);
    regions_.emplace(region.bus_base, std::move(region));
    return mapping;
  }

  /// Unmaps; returns the memory to free when the region was owned.
  Result<Unmapped> unmap(std::uint64_t id) {
    std::unique_lock lock(mutex);
    auto by_id = base_of_id_.find(id);
    if (by_id == base_of_id_.end()) return error(StatusCode::NOT_FOUND, "dma_unmap: no mapping with id = {}", id);
    auto it = regions_.find(by_id->second);
    if (it->second.queue_users != 0)
      return error(StatusCode::BUSY, "dma_unmap: {} controller queue(s) live in mapping {}", it->second.queue_users,
                   id);
    const Unmapped owned{it->second.owner != MemoryOwner::caller ? it->second.host : nullptr, it->second.owner};
    host_ranges_.erase(reinterpret_cast<std::uintptr_t>(it->second.host));
    base_of_id_.erase(by_id);
    regions_.erase(it);
    return owned;
  }

  /// Appends the host spans of [bus, bus + length) to out; false if any byte is unmapped.
  /// Caller holds `mutex` (shared or unique).
  bool translate_locked(std::uint64_t bus, std::uint64_t length, std::vector<HostSpan>& out) const {
    while (length > 0) {
      const Region* region = find_locked(bus);
      if (region == nullptr) return false;
      const std::uint64_t bus_page = (bus - region->bus_base) / kPage;
      const std::uint64_t host_page =
          region->host_page_of_bus_page.empty() ? bus_page : region->host_page_of_bus_page[bus_page];
      const std::uint64_t offset = bus % kPage;
      const std::uint64_t chunk = std::min(length, kPage - offset);
      std::uint8_t* host = region->host + host_page * kPage + offset;
      const bool device = region->kind == DmaMemoryKind::device;
      if (!out.empty() && out.back().host + out.back().length == host && out.back().device == device)
        out.back().length += chunk;
      else
        out.push_back(HostSpan{host, chunk, device});
      bus += chunk;
      length -= chunk;
    }
    return true;
  }

  /// Address of [bus, bus + length) when it is mapped and contiguous, else nullptr. With
  /// host_only, accelerator memory gives nullptr too (queues must be host-reachable: the
  /// controller's threads read SQEs and write CQEs with plain loads and stores).
  std::uint8_t* contiguous_locked(std::uint64_t bus, std::uint64_t length, bool host_only = true) const {
    std::vector<HostSpan> spans;
    if (length == 0 || !translate_locked(bus, length, spans) || spans.size() != 1) return nullptr;
    if (host_only && spans.front().device) return nullptr;
    return spans.front().host;
  }

  bool read_locked(std::uint64_t bus, void* destination, std::size_t length) const {
    std::vector<HostSpan> spans;
    if (!translate_locked(bus, length, spans)) return false;
    auto* d = static_cast<std::uint8_t*>(destination);
    for (const HostSpan& s : spans) {
      // PRP lists and SGL segments may live in accelerator memory (a device region): copied out.
      if (!copy_from_span(s, d, 0, s.length)) return false;
      d += s.length;
    }
    return true;
  }

  /// Adjusts the queue-user count of the region holding `bus` (caller holds the unique lock).
  void add_queue_user_locked(std::uint64_t bus, int delta) {
    Region* region = const_cast<Region*>(find_locked(bus));
    if (region != nullptr)
      region->queue_users = static_cast<std::uint32_t>(static_cast<int>(region->queue_users) + delta);
  }

  ~BusSpace() {
    for (auto& [base, region] : regions_) free_owned(region.host, region.owner);
  }

 private:
  const Region* find_locked(std::uint64_t bus) const {
    auto it = regions_.upper_bound(bus);
    if (it == regions_.begin()) return nullptr;
    --it;
    if (bus - it->second.bus_base >= it->second.pages * kPage) return nullptr;
    return &it->second;
  }

  std::map<std::uint64_t, Region> regions_;  // by bus base
  std::map<std::uint64_t, std::uint64_t> base_of_id_;
  std::map<std::uintptr_t, std::pair<std::uintptr_t, std::uint64_t>> host_ranges_;  // start -> (end, bus base)
  std::uint64_t next_bus_ = kBusAddressBase;
  std::uint64_t next_id_ = 1;
};

// ---------------------------------------------------------------------------------------------
// Queues as the controller sees them.

struct CompletionQueueState {
  std::uint16_t qid = 0;
  std::uint32_t size = 0;
  nvme::CompletionQueueEntry* base = nullptr;
  std::uint64_t bus = 0;
  std::uint32_t tail = 0;
  std::uint32_t phase = 1;  // Phase Tag of the first pass is 1 (Base 2.0, 4.2.4)
  std::uint32_t head = 0;   // last valid CQ head doorbell value
  std::uint32_t sq_users = 0;
  std::deque<nvme::CompletionQueueEntry> overflow;  // completions waiting for CQ room, in order
  volatile std::uint32_t* head_doorbell = nullptr;
  std::uint32_t last_invalid_head = 0xffffffffu;
  unsigned worker = 0;
};

struct HeldCommand {
  nvme::SubmissionQueueEntry sqe;
  std::uint64_t due_ns;  // kNever: lost
};

struct SubmissionQueueState {
  std::uint16_t qid = 0;
  std::uint32_t size = 0;
  nvme::SubmissionQueueEntry* base = nullptr;
  std::uint64_t bus = 0;
  CompletionQueueState* cq = nullptr;
  std::uint32_t head = 0;
  volatile std::uint32_t* tail_doorbell = nullptr;
  std::uint32_t last_invalid_tail = 0xffffffffu;
  std::deque<HeldCommand> held;
};

/// Host staging memory for transfers to and from accelerator memory (one per worker thread).
struct Staging {
  std::uint8_t* data = nullptr;  // mapped pinned memory (accel::allocate_mapped_host); null outside accelerator mode
  std::uint64_t size = 0;        // bytes
};

struct Worker {
  std::mutex mutex;
  std::vector<SubmissionQueueState*> queues;  // guarded by mutex
  accel::MappedHostBuffer bounce;             // accelerator mode: the pinned bounce buffer, worker thread only
  std::thread thread;
};

struct FaultState {
  SoftFaultRule rule;
  std::uint64_t id = 0;
  std::uint64_t matched = 0;
  std::uint64_t fired = 0;
};

struct Fault {
  bool fire = false;
  SoftFaultRule rule;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct SoftController::Impl {
  SoftControllerConfig config;
  int fd = -1;
  std::uint64_t namespace_size = 0;  // LBAs
  std::unique_ptr<std::uint32_t[], BarFree> bar;
  std::size_t bar_size = 0;
  BusSpace bus;

  std::atomic<bool> stopping{false};
  std::atomic<bool> fatal{false};
  bool enabled = false;  // controller thread only
  std::thread controller_thread;
  std::vector<std::unique_ptr<Worker>> workers;

  // Admin queue and the queue tables: controller thread only.
  SubmissionQueueState admin_sq;
  CompletionQueueState admin_cq;
  std::map<std::uint16_t, std::unique_ptr<SubmissionQueueState>> io_sqs;
  std::map<std::uint16_t, std::unique_ptr<CompletionQueueState>> io_cqs;
  std::uint32_t queues_allocated = 0;  // from Set Features - Number of Queues (0: not set: max)
  bool queues_feature_set = false;

  std::mutex faults_mutex;
  std::vector<FaultState> faults;
  std::atomic<std::size_t> fault_count{0};
  std::uint64_t next_fault_id = 1;

  struct AtomicCounters {
    std::atomic<std::uint64_t> admin_commands{0}, io_commands{0}, read_commands{0}, write_commands{0},
        flush_commands{0}, write_zeroes_commands{0}, dataset_management_commands{0}, bytes_read{0}, bytes_written{0},
        device_bytes_read{0}, device_bytes_written{0}, errors{0}, dma_faults{0}, invalid_doorbell_writes{0},
        injected_faults{0}, aborted_commands{0}, completions_posted{0};
  } counters;
  mutable std::mutex errors_mutex;
  std::map<std::uint16_t, std::uint64_t> errors_by_status;

  std::vector<std::uint8_t> zeroes = std::vector<std::uint8_t>(1u << 20, 0);

  ~Impl() {
    stopping.store(true);
    if (controller_thread.joinable()) controller_thread.join();
    for (auto& w : workers)
      if (w->thread.joinable()) w->thread.join();
    if (fd >= 0) ::close(fd);
  }

  // ----- registers -----------------------------------------------------------------------------
  volatile std::uint32_t* reg(std::size_t byte_offset) { return bar.get() + byte_offset / 4; }
  /// A 64-bit register (CAP, ASQ, ACQ) as two dwords, low dword first (the host writes it so).
  std::uint64_t load_register64(std::size_t byte_offset) {
    return load32(reg(byte_offset)) | (std::uint64_t{load32(reg(byte_offset + 4))} << 32);
  }
  void store_register64(std::size_t byte_offset, std::uint64_t value) {
    store32(reg(byte_offset), static_cast<std::uint32_t>(value));
    store32(reg(byte_offset + 4), static_cast<std::uint32_t>(value >> 32));
  }
  std::uint32_t dstrd() const { return config.doorbell_stride; }
  std::uint32_t lba_size() const { return config.lba_size; }

  void set_csts_bits(std::uint32_t value) { store32(reg(offsetof(nvme::ControllerRegisters, csts)), value); }
  std::uint32_t csts() { return load32(reg(offsetof(nvme::ControllerRegisters, csts))); }

  void set_fatal() {
    fatal.store(true);
    // Read-modify-write as one atomic: another thread may update RDY or SHST at the same time.
    std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(reg(offsetof(nvme::ControllerRegisters, csts))))
        .fetch_or(nvme::ControllerStatus::CFS::encode(0, 1), std::memory_order_acq_rel);
  }

  // ----- counters ------------------------------------------------------------------------------
  void count_status(StatusField status) {
    if (status.success()) return;
    counters.errors.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(errors_mutex);
    ++errors_by_status[status.without_phase()];
  }

  // ----- completion posting (caller owns the CQ: its worker mutex, or the controller thread) -----
  bool cq_full(CompletionQueueState& cq) {
    const std::uint32_t head = load32(cq.head_doorbell);
    if (head < cq.size) {
      cq.head = head;
    } else if (head != cq.last_invalid_head) {
      cq.last_invalid_head = head;  // Invalid Doorbell Write Value: ignored, counted once per value
      counters.invalid_doorbell_writes.fetch_add(1, std::memory_order_relaxed);
    }
    return (cq.tail + 1) % cq.size == cq.head;
  }

  void write_cqe(CompletionQueueState& cq, const nvme::CompletionQueueEntry& entry) {
    nvme::CompletionQueueEntry& slot = cq.base[cq.tail];
    slot.dw0 = entry.dw0;
    slot.dw1 = entry.dw1;
    slot.sq_head = entry.sq_head;
    slot.sq_identifier = entry.sq_identifier;
    StatusField status = entry.status();
    status.raw = StatusField::P::encode(status.raw, static_cast<std::uint16_t>(cq.phase));
    // Release: dwords 0-2 are visible before dword 3 carries the new Phase Tag.
    std::atomic_ref<std::uint32_t>(slot.dw3).store(
        nvme::CompletionQueueEntry::make_dw3(entry.command_identifier(), status), std::memory_order_release);
    if (++cq.tail == cq.size) {
      cq.tail = 0;
      cq.phase ^= 1u;
    }
    counters.completions_posted.fetch_add(1, std::memory_order_relaxed);
  }

  /// Posts what fits of the overflow; true when the overflow is empty afterwards.
  bool drain_overflow(CompletionQueueState& cq) {
    while (!cq.overflow.empty() && !cq_full(cq)) {
      write_cqe(cq, cq.overflow.front());
      cq.overflow.pop_front();
    }
    return cq.overflow.empty();
  }

  void post(SubmissionQueueState& sq, std::uint16_t cid, StatusField status, std::uint32_t dw0 = 0) {
    nvme::CompletionQueueEntry entry{};
    entry.dw0 = dw0;
    entry.sq_head = static_cast<std::uint16_t>(sq.head);
    entry.sq_identifier = sq.qid;
    entry.dw3 = nvme::CompletionQueueEntry::make_dw3(cid, status);
    count_status(status);
    CompletionQueueState& cq = *sq.cq;
    if (!cq.overflow.empty() || cq_full(cq))
      cq.overflow.push_back(entry);
    else
      write_cqe(cq, entry);
  }

  // ----- DMA -----------------------------------------------------------------------------------
  soft::DecodeLimits decode_limits() const {
    soft::DecodeLimits limits;
    limits.page_size = static_cast<std::uint32_t>(kPage);
    limits.sgl_supported = true;
    limits.max_sgl_descriptors = config.max_sgl_descriptors;
    return limits;
  }

  /// Decodes the SQE's data pointer for `length` bytes and translates it to host spans.
  /// Caller holds bus.mutex (shared). Returns the status to complete with on failure.
  StatusField map_data(const nvme::SubmissionQueueEntry& sqe, std::uint64_t length, std::vector<HostSpan>& spans,
                       bool admin) {
    if (admin && sqe.data_pointer_kind() != nvme::DataPointerKind::prp)
      return make_status(GenericStatus::invalid_field_in_command, true);  // admin commands use PRPs (PCIe)
    const soft::DecodeResult decoded = soft::decode_data_pointer(
        sqe, length, decode_limits(), [this](std::uint64_t bus_address, void* destination, std::size_t bytes) {
          return bus.read_locked(bus_address, destination, bytes);
        });
    if (!decoded.status.success()) {
      if (decoded.dma_fault) counters.dma_faults.fetch_add(1, std::memory_order_relaxed);
      return decoded.status;
    }
    for (const soft::BusSegment& segment : decoded.segments) {
      if (!bus.translate_locked(segment.bus_address, segment.length, spans)) {
        // The IOMMU rule: nothing is transferred when any byte is outside every mapped region.
        counters.dma_faults.fetch_add(1, std::memory_order_relaxed);
        spans.clear();
        return make_status(GenericStatus::data_transfer_error, true);
      }
    }
    return kSuccess;
  }

  /// Copies `bytes` of `source` to the command's data buffer (controller -> host).
  StatusField copy_to_host(const nvme::SubmissionQueueEntry& sqe, const void* source, std::uint64_t bytes) {
    std::shared_lock lock(bus.mutex);
    std::vector<HostSpan> spans;
    const StatusField status = map_data(sqe, bytes, spans, true);
    if (!status.success()) return status;
    const auto* s = static_cast<const std::uint8_t*>(source);
    for (const HostSpan& span : spans) {
      if (!copy_to_span(span, 0, s, span.length)) return make_status(GenericStatus::data_transfer_error, true);
      s += span.length;
    }
    return kSuccess;
  }

  // ----- backing store -------------------------------------------------------------------------
  bool pread_all(std::uint8_t* destination, std::uint64_t length, std::uint64_t offset) {
    while (length > 0) {
      const ssize_t n = ::pread(fd, destination, length, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;  // error or end of file: the bytes did not move
      destination += n;
      length -= static_cast<std::uint64_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
    return true;
  }
  bool pwrite_all(const std::uint8_t* source, std::uint64_t length, std::uint64_t offset) {
    while (length > 0) {
      const ssize_t n = ::pwrite(fd, source, length, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      source += n;
      length -= static_cast<std::uint64_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
    return true;
  }
  bool write_zeroes_at(std::uint64_t offset, std::uint64_t length) {
    while (length > 0) {
      const std::uint64_t chunk = std::min<std::uint64_t>(length, zeroes.size());
      if (!pwrite_all(zeroes.data(), chunk, offset)) return false;
      offset += chunk;
      length -= chunk;
    }
    return true;
  }
  bool sync() {
    while (::fdatasync(fd) != 0)
      if (errno != EINTR) return false;
    return true;
  }

  // ----- I/O commands --------------------------------------------------------------------------
  bool lba_range_ok(std::uint64_t slba, std::uint64_t nlb) const {
    return slba < namespace_size && nlb <= namespace_size - slba;
  }

  StatusField execute_io(const nvme::SubmissionQueueEntry& sqe, const Staging& staging) {
    const auto opcode = static_cast<NvmOpcode>(sqe.opcode);
    if (nvme::SubmissionQueueEntry::Fuse::decode(sqe.flags) != 0)
      return make_status(GenericStatus::invalid_field_in_command, true);
    switch (opcode) {
      case NvmOpcode::read:
      case NvmOpcode::write: return execute_read_write(sqe, opcode == NvmOpcode::write, staging);
      case NvmOpcode::flush:
        if (sqe.nsid != 1 && sqe.nsid != 0xffffffffu)
          return make_status(GenericStatus::invalid_namespace_or_format, true);
        if (!config.null_mode && !sync()) return make_status(MediaStatus::write_fault, true);
        counters.flush_commands.fetch_add(1, std::memory_order_relaxed);
        return kSuccess;
      case NvmOpcode::write_zeroes: return execute_write_zeroes(sqe);
      case NvmOpcode::dataset_management: return execute_dataset_management(sqe);
    }
    return make_status(GenericStatus::invalid_command_opcode, true);
  }

  StatusField transfer_host_span(const HostSpan& span, std::uint64_t offset, bool write) {
    const bool ok = write ? pwrite_all(span.host, span.length, offset) : pread_all(span.host, span.length, offset);
    if (!ok)
      return write ? make_status(MediaStatus::write_fault, true)
                   : make_status(MediaStatus::unrecovered_read_error, true);
    return kSuccess;
  }

  /// Moves one span of accelerator memory through the worker's pinned bounce buffer, one chunk
  /// of at most staging.size bytes at a time: pread + copy_to_device (Read), copy_from_device +
  /// pwrite (Write). A failed accelerator copy completes with Data Transfer Error.
  StatusField transfer_device_span(const HostSpan& span, std::uint64_t offset, bool write, const Staging& staging) {
    if (staging.data == nullptr || staging.size == 0) return make_status(GenericStatus::internal_error, true);
    for (std::uint64_t done = 0; done < span.length;) {
      const std::uint64_t chunk = std::min(span.length - done, staging.size);
      if (write) {
        if (!copy_from_span(span, staging.data, done, chunk))
          return make_status(GenericStatus::data_transfer_error, true);
        if (!pwrite_all(staging.data, chunk, offset + done)) return make_status(MediaStatus::write_fault, true);
      } else {
        if (!pread_all(staging.data, chunk, offset + done))
          return make_status(MediaStatus::unrecovered_read_error, true);
        if (!copy_to_span(span, done, staging.data, chunk))
          return make_status(GenericStatus::data_transfer_error, true);
      }
      done += chunk;
    }
    return kSuccess;
  }

  StatusField execute_read_write(const nvme::SubmissionQueueEntry& sqe, bool write, const Staging& staging) {
    if (sqe.nsid != 1) return make_status(GenericStatus::invalid_namespace_or_format, true);
    const std::uint64_t slba = nvme::starting_lba(sqe);
    const std::uint64_t nlb = nvme::number_of_logical_blocks(sqe);
    if (!lba_range_ok(slba, nlb)) return make_status(GenericStatus::lba_out_of_range, true);
    const std::uint64_t bytes = nlb * lba_size();
    if (config.max_data_transfer_bytes != 0 && bytes > config.max_data_transfer_bytes)
      return make_status(GenericStatus::invalid_field_in_command, true);  // exceeds MDTS (Base 2.0, 5.17.2.1 MDTS)
    std::shared_lock lock(bus.mutex);                                     // no unmap while this transfer runs
    std::vector<HostSpan> spans;
    const StatusField mapped = map_data(sqe, bytes, spans, false);
    if (!mapped.success()) return mapped;
    if (!config.null_mode) {
      std::uint64_t offset = slba * lba_size();
      std::uint64_t device_bytes = 0;
      for (const HostSpan& span : spans) {
        const StatusField moved =
            span.device ? transfer_device_span(span, offset, write, staging) : transfer_host_span(span, offset, write);
        if (!moved.success()) return moved;
        if (span.device) device_bytes += span.length;
        offset += span.length;
      }
      if (write && nvme::ReadWriteFields::FUA::decode(sqe.cdw12) != 0 && !sync())
        return make_status(MediaStatus::write_fault, true);
      (write ? counters.bytes_written : counters.bytes_read).fetch_add(bytes, std::memory_order_relaxed);
      (write ? counters.device_bytes_written : counters.device_bytes_read)
          .fetch_add(device_bytes, std::memory_order_relaxed);
    }
    (write ? counters.write_commands : counters.read_commands).fetch_add(1, std::memory_order_relaxed);
    return kSuccess;
  }

  StatusField execute_write_zeroes(const nvme::SubmissionQueueEntry& sqe) {
    if (sqe.nsid != 1) return make_status(GenericStatus::invalid_namespace_or_format, true);
    const std::uint64_t slba = nvme::starting_lba(sqe);
    const std::uint64_t nlb = nvme::number_of_logical_blocks(sqe);
    if (!lba_range_ok(slba, nlb)) return make_status(GenericStatus::lba_out_of_range, true);
    if (!config.null_mode) {
      if (!zero_range(slba * lba_size(), nlb * lba_size())) return make_status(MediaStatus::write_fault, true);
      if (nvme::ReadWriteFields::FUA::decode(sqe.cdw12) != 0 && !sync())
        return make_status(MediaStatus::write_fault, true);
    }
    counters.write_zeroes_commands.fetch_add(1, std::memory_order_relaxed);
    return kSuccess;
  }

  bool zero_range(std::uint64_t offset, std::uint64_t length) {
    if (::fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(length)) == 0)
      return true;
    return write_zeroes_at(offset, length);
  }

  StatusField execute_dataset_management(const nvme::SubmissionQueueEntry& sqe) {
    if (sqe.nsid != 1) return make_status(GenericStatus::invalid_namespace_or_format, true);
    const std::uint32_t ranges = nvme::DatasetManagementFields::NR::decode(sqe.cdw10) + 1;
    std::vector<nvme::DatasetManagementRange> list(ranges);
    {
      std::shared_lock lock(bus.mutex);
      std::vector<HostSpan> spans;
      const StatusField mapped = map_data(sqe, ranges * sizeof(nvme::DatasetManagementRange), spans, false);
      if (!mapped.success()) return mapped;
      auto* d = reinterpret_cast<std::uint8_t*>(list.data());
      for (const HostSpan& span : spans) {
        if (!copy_from_span(span, d, 0, span.length)) return make_status(GenericStatus::data_transfer_error, true);
        d += span.length;
      }
    }
    if (nvme::DatasetManagementFields::AD::decode(sqe.cdw11) != 0) {
      for (const auto& range : list)
        if (range.length_in_logical_blocks != 0 && !lba_range_ok(range.starting_lba, range.length_in_logical_blocks))
          return make_status(GenericStatus::lba_out_of_range, true);
      if (!config.null_mode)
        for (const auto& range : list) {
          if (range.length_in_logical_blocks == 0) continue;
          const auto offset = static_cast<off_t>(range.starting_lba * lba_size());
          const auto length = static_cast<off_t>(std::uint64_t{range.length_in_logical_blocks} * lba_size());
          // Deallocated LBAs read as zeroes (DLFEAT = 001b): punch a hole, or write zeroes.
          if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0 &&
              !write_zeroes_at(static_cast<std::uint64_t>(offset), static_cast<std::uint64_t>(length)))
            return make_status(MediaStatus::write_fault, true);
        }
    }
    counters.dataset_management_commands.fetch_add(1, std::memory_order_relaxed);
    return kSuccess;
  }

  // ----- fault injection -----------------------------------------------------------------------
  Fault match_fault(std::uint16_t sqid, const nvme::SubmissionQueueEntry& sqe) {
    Fault fault;
    if (fault_count.load(std::memory_order_acquire) == 0) return fault;
    std::lock_guard lock(faults_mutex);
    for (FaultState& f : faults) {
      const SoftFaultRule& r = f.rule;
      if (r.max_fires != 0 && f.fired >= r.max_fires) continue;
      if (r.opcode >= 0 && r.opcode != sqe.opcode) continue;
      if (r.sqid != 0 && r.sqid != sqid) continue;
      if (r.lba_range_only) {
        const auto op = static_cast<NvmOpcode>(sqe.opcode);
        if (op != NvmOpcode::read && op != NvmOpcode::write && op != NvmOpcode::write_zeroes) continue;
        const std::uint64_t first = nvme::starting_lba(sqe);
        const std::uint64_t last = first + nvme::number_of_logical_blocks(sqe) - 1;
        if (last < r.first_lba || first > r.last_lba) continue;
      }
      ++f.matched;
      if (r.nth_command != 0 && f.matched != r.nth_command) continue;
      ++f.fired;
      fault.fire = true;
      fault.rule = r;
      counters.injected_faults.fetch_add(1, std::memory_order_relaxed);
      return fault;
    }
    return fault;
  }

  // ----- workers -------------------------------------------------------------------------------
  void handle_io(SubmissionQueueState& sq, const nvme::SubmissionQueueEntry& sqe, const Staging& staging) {
    const Fault fault = match_fault(sq.qid, sqe);
    if (fault.fire) {
      switch (fault.rule.action) {
        case SoftFaultRule::Action::complete_with_status:
          counters.io_commands.fetch_add(1, std::memory_order_relaxed);
          post(sq, sqe.command_identifier, StatusField{fault.rule.status.without_phase()});
          return;
        case SoftFaultRule::Action::delay_completion:
          sq.held.push_back(HeldCommand{sqe, accel::deadline_after(fault.rule.delay_ns)});
          return;
        case SoftFaultRule::Action::lose_completion: sq.held.push_back(HeldCommand{sqe, kNever}); return;
        case SoftFaultRule::Action::controller_fatal: set_fatal(); return;
      }
    }
    const StatusField status = execute_io(sqe, staging);
    counters.io_commands.fetch_add(1, std::memory_order_relaxed);
    post(sq, sqe.command_identifier, status);
  }

  /// Fetches and executes up to kBatch SQEs; true when anything happened.
  bool serve(SubmissionQueueState& sq, const Staging& staging) {
    bool work = false;
    if (!sq.held.empty()) {
      const std::uint64_t now = accel::timer_ns();
      for (auto it = sq.held.begin(); it != sq.held.end();) {
        if (it->due_ns <= now) {
          const nvme::SubmissionQueueEntry sqe = it->sqe;
          it = sq.held.erase(it);
          const StatusField status = execute_io(sqe, staging);
          counters.io_commands.fetch_add(1, std::memory_order_relaxed);
          post(sq, sqe.command_identifier, status);
          work = true;
        } else {
          ++it;
        }
      }
    }
    if (!sq.cq->overflow.empty()) {
      work = true;
      if (!drain_overflow(*sq.cq)) return work;  // no room: fetch nothing more for this CQ
    }
    // Acquire: the SQEs up to the new tail were written before the doorbell.
    const std::uint32_t tail = load32(sq.tail_doorbell);
    if (tail >= sq.size) {
      if (tail != sq.last_invalid_tail) {
        sq.last_invalid_tail = tail;  // Invalid Doorbell Write Value: ignored, counted once per value
        counters.invalid_doorbell_writes.fetch_add(1, std::memory_order_relaxed);
      }
      return work;
    }
    for (std::uint32_t n = 0; n < kBatch && sq.head != tail && !fatal.load(std::memory_order_relaxed); ++n) {
      const nvme::SubmissionQueueEntry sqe = sq.base[sq.head];
      sq.head = (sq.head + 1) % sq.size;
      handle_io(sq, sqe, staging);
      work = true;
    }
    return work;
  }

  accel::Backoff::Settings backoff_settings() const {
    accel::Backoff::Settings s;
    s.max_sleep_ns = std::max<std::uint32_t>(config.idle_sleep_max_ns, 1000);
    s.first_sleep_ns = std::min<std::uint32_t>(1000, s.max_sleep_ns);
    return s;
  }

  void worker_loop(Worker& worker) {
    accel::Backoff backoff(backoff_settings());
    const Staging staging{static_cast<std::uint8_t*>(worker.bounce.data()), worker.bounce.size()};
    while (!stopping.load(std::memory_order_relaxed)) {
      bool work = false;
      {
        std::lock_guard lock(worker.mutex);
        if (!fatal.load(std::memory_order_relaxed))
          for (SubmissionQueueState* sq : worker.queues) work |= serve(*sq, staging);
      }
      if (work)
        backoff.reset();
      else
        backoff.pause();
    }
  }

  // ----- controller thread: CC handshake and the admin queue -----------------------------------
  void controller_loop() {
    accel::Backoff backoff(backoff_settings());
    while (!stopping.load(std::memory_order_relaxed)) {
      bool work = false;
      const nvme::ControllerConfiguration cc{load32(reg(offsetof(nvme::ControllerRegisters, cc)))};
      const bool en = nvme::ControllerConfiguration::EN::decode(cc.raw) != 0;
      if (en && !enabled) {
        enable(cc);
        work = true;
      } else if (!en && enabled) {
        disable();
        work = true;
      } else if (!en && nvme::ControllerStatus::CFS::decode(csts()) != 0) {
        disable();  // CC.EN = 0 clears a fatal status set while disabled (bad enable)
        work = true;
      }
      const std::uint32_t shn = nvme::ControllerConfiguration::SHN::decode(cc.raw);
      const std::uint32_t status = csts();
      if (shn != nvme::kShutdownNone && nvme::ControllerStatus::SHST::decode(status) != nvme::kShutdownStatusComplete) {
        if (fd >= 0) (void)sync();
        set_csts_bits(nvme::ControllerStatus::SHST::encode(status, nvme::kShutdownStatusComplete));
        work = true;
      }
      if (enabled && !fatal.load()) work |= serve_admin();
      if (work)
        backoff.reset();
      else
        backoff.pause();
    }
  }

  void enable(nvme::ControllerConfiguration cc) {
    using CC = nvme::ControllerConfiguration;
    enabled = true;
    const nvme::AdminQueueAttributes aqa{load32(reg(offsetof(nvme::ControllerRegisters, aqa)))};
    const std::uint64_t asq = load_register64(offsetof(nvme::ControllerRegisters, asq));
    const std::uint64_t acq = load_register64(offsetof(nvme::ControllerRegisters, acq));
    const std::uint32_t sq_size = nvme::AdminQueueAttributes::ASQS::decode(aqa.raw) + 1;
    const std::uint32_t cq_size = nvme::AdminQueueAttributes::ACQS::decode(aqa.raw) + 1;
    // A torn or unsupported configuration is a Controller Fatal Status, never a crash.
    bool valid = CC::MPS::decode(cc.raw) == 0 && CC::CSS::decode(cc.raw) == 0 && CC::AMS::decode(cc.raw) == 0 &&
                 sq_size >= 2 && cq_size >= 2 && asq % kPage == 0 && acq % kPage == 0;
    std::unique_lock lock(bus.mutex);
    nvme::SubmissionQueueEntry* sq_base = nullptr;
    nvme::CompletionQueueEntry* cq_base = nullptr;
    if (valid) {
      sq_base = reinterpret_cast<nvme::SubmissionQueueEntry*>(bus.contiguous_locked(asq, std::uint64_t{sq_size} * 64));
      cq_base = reinterpret_cast<nvme::CompletionQueueEntry*>(bus.contiguous_locked(acq, std::uint64_t{cq_size} * 16));
      if (sq_base == nullptr || cq_base == nullptr) {
        counters.dma_faults.fetch_add(1, std::memory_order_relaxed);
        valid = false;
      }
    }
    if (!valid) {
      lock.unlock();
      set_fatal();
      set_csts_bits(nvme::ControllerStatus::RDY::encode(csts(), 1));  // ready, but fatal: the host sees CFS
      return;
    }
    bus.add_queue_user_locked(asq, +1);
    bus.add_queue_user_locked(acq, +1);
    lock.unlock();
    admin_cq = CompletionQueueState{};
    admin_cq.qid = 0;
    admin_cq.size = cq_size;
    admin_cq.base = cq_base;
    admin_cq.bus = acq;
    admin_cq.head_doorbell = reg(nvme::completion_queue_head_doorbell_offset(0, dstrd()));
    admin_sq = SubmissionQueueState{};
    admin_sq.qid = 0;
    admin_sq.size = sq_size;
    admin_sq.base = sq_base;
    admin_sq.bus = asq;
    admin_sq.cq = &admin_cq;
    admin_sq.tail_doorbell = reg(nvme::submission_queue_tail_doorbell_offset(0, dstrd()));
    queues_allocated = config.max_io_queue_pairs;
    queues_feature_set = false;
    set_csts_bits(nvme::ControllerStatus::RDY::encode(0, 1));
  }

  /// Controller reset (CC.EN 1 -> 0): every queue is deleted, held commands are dropped without
  /// completion (Base 2.0, 3.7.2 Controller Reset), registers return to their reset values.
  void disable() {
    for (auto& w : workers) {
      std::lock_guard lock(w->mutex);
      w->queues.clear();
    }
    {
      std::unique_lock lock(bus.mutex);
      for (auto& [qid, sq] : io_sqs) bus.add_queue_user_locked(sq->bus, -1);
      for (auto& [qid, cq] : io_cqs) bus.add_queue_user_locked(cq->bus, -1);
      if (admin_sq.base != nullptr) bus.add_queue_user_locked(admin_sq.bus, -1);
      if (admin_cq.base != nullptr) bus.add_queue_user_locked(admin_cq.bus, -1);
    }
    io_sqs.clear();
    io_cqs.clear();
    admin_sq = SubmissionQueueState{};
    admin_cq = CompletionQueueState{};
    const std::size_t doorbell_words = (bar_size - nvme::kDoorbellOffset) / 4;
    for (std::size_t i = 0; i < doorbell_words; ++i) store32(reg(nvme::kDoorbellOffset) + i, 0);
    fatal.store(false);
    enabled = false;
    set_csts_bits(0);
  }

  bool serve_admin() {
    bool work = false;
    if (!admin_cq.overflow.empty()) {
      work = true;
      if (!drain_overflow(admin_cq)) return work;
    }
    const std::uint32_t tail = load32(admin_sq.tail_doorbell);
    if (tail >= admin_sq.size) {
      if (tail != admin_sq.last_invalid_tail) {
        admin_sq.last_invalid_tail = tail;
        counters.invalid_doorbell_writes.fetch_add(1, std::memory_order_relaxed);
      }
      return work;
    }
    for (std::uint32_t n = 0; n < kBatch && admin_sq.head != tail && !fatal.load(); ++n) {
      const nvme::SubmissionQueueEntry sqe = admin_sq.base[admin_sq.head];
      admin_sq.head = (admin_sq.head + 1) % admin_sq.size;
      std::uint32_t dw0 = 0;
      const StatusField status = execute_admin(sqe, dw0);
      counters.admin_commands.fetch_add(1, std::memory_order_relaxed);
      post(admin_sq, sqe.command_identifier, status, dw0);
      work = true;
    }
    return work;
  }

  StatusField execute_admin(const nvme::SubmissionQueueEntry& sqe, std::uint32_t& dw0) {
    if (nvme::SubmissionQueueEntry::Fuse::decode(sqe.flags) != 0)
      return make_status(GenericStatus::invalid_field_in_command, true);
    switch (static_cast<AdminOpcode>(sqe.opcode)) {
      case AdminOpcode::identify: return identify(sqe);
      case AdminOpcode::set_features: return set_features(sqe, dw0);
      case AdminOpcode::get_features: return get_features(sqe, dw0);
      case AdminOpcode::create_io_completion_queue: return create_cq(sqe);
      case AdminOpcode::create_io_submission_queue: return create_sq(sqe);
      case AdminOpcode::delete_io_submission_queue: return delete_sq(sqe);
      case AdminOpcode::delete_io_completion_queue: return delete_cq(sqe);
      case AdminOpcode::abort: return abort(sqe, dw0);
      case AdminOpcode::get_log_page: return get_log_page(sqe);
    }
    return make_status(GenericStatus::invalid_command_opcode, true);
  }

  nvme::IdentifyController identify_controller_data() const {
    nvme::IdentifyController c{};
    c.vid = 0x1b36;  // the vendor ID QEMU's emulated devices use; there is no PCI device here
    c.ssvid = 0x1af4;
    std::memset(c.sn, ' ', sizeof c.sn);
    std::memset(c.mn, ' ', sizeof c.mn);
    std::memset(c.fr, ' ', sizeof c.fr);
    std::memcpy(c.sn, "TUTTISOFT0001", 13);
    std::memcpy(c.mn, "Tutti soft NVMe controller", 26);
    std::memcpy(c.fr, "0.1.0", 5);
    std::uint32_t mdts = 0;
    if (config.max_data_transfer_bytes != 0)
      while ((kPage << mdts) < config.max_data_transfer_bytes) ++mdts;
    c.mdts = static_cast<std::uint8_t>(mdts);
    c.cntlid = 1;
    c.ver = nvme::kVersion2_0.raw;
    c.acl = 3;  // 4 concurrent Aborts (0's based)
    c.sqes = 0x66;
    c.cqes = 0x44;
    c.nn = 1;
    c.oncs = nvme::IdentifyController::OncsBits::WriteZeroes::encode(
        nvme::IdentifyController::OncsBits::DatasetManagement::encode(0, 1), 1);
    c.vwc = nvme::IdentifyController::VwcBits::Present::encode(
        0, 1);  // the backing file's page cache is a volatile write cache: Flush makes data durable
    c.sgls = nvme::IdentifyController::SglsBits::SglSupport::encode(0, 1);  // SGLs, any byte alignment
    return c;
  }

  nvme::IdentifyNamespace identify_namespace_data() const {
    nvme::IdentifyNamespace n{};
    n.nsze = n.ncap = n.nuse = namespace_size;
    n.nlbaf = 1;  // two formats: 0 = 512 bytes, 1 = 4096 bytes
    n.lbaf[0] = nvme::LbaFormat::make(9);
    n.lbaf[1] = nvme::LbaFormat::make(12);
    n.flbas = nvme::IdentifyNamespace::Flbas::FormatIndexLow::encode(0, config.lba_size == 4096 ? 1 : 0);
    n.dlfeat = nvme::IdentifyNamespace::DeallocatedReadsZeroes::encode(0, 1);
    return n;
  }

  StatusField identify(const nvme::SubmissionQueueEntry& sqe) {
    switch (static_cast<nvme::IdentifyCns>(nvme::IdentifyFields::CNS::decode(sqe.cdw10))) {
      case nvme::IdentifyCns::controller: {
        const nvme::IdentifyController data = identify_controller_data();
        return copy_to_host(sqe, &data, sizeof data);
      }
      case nvme::IdentifyCns::namespace_data: {
        if (sqe.nsid != 1) return make_status(GenericStatus::invalid_namespace_or_format, true);
        const nvme::IdentifyNamespace data = identify_namespace_data();
        return copy_to_host(sqe, &data, sizeof data);
      }
      case nvme::IdentifyCns::active_namespace_list: {
        std::uint32_t list[1024] = {};
        if (sqe.nsid < 1) list[0] = 1;  // NSIDs greater than CDW1.NSID
        if (sqe.nsid >= 0xfffffffeu) return make_status(GenericStatus::invalid_namespace_or_format, true);
        return copy_to_host(sqe, list, sizeof list);
      }
    }
    return make_status(GenericStatus::invalid_field_in_command, true);
  }

  StatusField set_features(const nvme::SubmissionQueueEntry& sqe, std::uint32_t& dw0) {
    if (nvme::FeatureFields::FID::decode(sqe.cdw10) !=
        static_cast<std::uint32_t>(nvme::FeatureIdentifier::number_of_queues))
      return make_status(GenericStatus::invalid_field_in_command, true);
    if (!io_sqs.empty() || !io_cqs.empty()) return make_status(GenericStatus::command_sequence_error, true);
    const std::uint32_t nsqr = nvme::NumberOfQueuesFields::NSQR::decode(sqe.cdw11);
    const std::uint32_t ncqr = nvme::NumberOfQueuesFields::NCQR::decode(sqe.cdw11);
    if (nsqr == 0xffff || ncqr == 0xffff) return make_status(GenericStatus::invalid_field_in_command, true);
    queues_allocated = std::min<std::uint32_t>(std::max(nsqr, ncqr) + 1, config.max_io_queue_pairs);
    queues_feature_set = true;
    dw0 = number_of_queues_dw0();
    return kSuccess;
  }

  std::uint32_t number_of_queues_dw0() const {
    return nvme::NumberOfQueuesFields::NCQR::encode(nvme::NumberOfQueuesFields::NSQR::encode(0, queues_allocated - 1),
                                                    queues_allocated - 1);
  }

  StatusField get_features(const nvme::SubmissionQueueEntry& sqe, std::uint32_t& dw0) {
    if (nvme::FeatureFields::FID::decode(sqe.cdw10) !=
        static_cast<std::uint32_t>(nvme::FeatureIdentifier::number_of_queues))
      return make_status(GenericStatus::invalid_field_in_command, true);
    dw0 = number_of_queues_dw0();
    return kSuccess;
  }

  /// Common checks of Create I/O CQ / SQ; on success `base` is the queue memory.
  StatusField check_create(const nvme::SubmissionQueueEntry& sqe, std::uint64_t entry_size, std::uint16_t& qid,
                           std::uint32_t& size, void*& base) {
    using F = nvme::CreateQueueFields;
    qid = static_cast<std::uint16_t>(F::QID::decode(sqe.cdw10));
    size = F::QSIZE::decode(sqe.cdw10) + 1;
    if (qid == 0 || qid > queues_allocated) return make_status(CommandSpecificStatus::invalid_queue_identifier, true);
    if (size < 2 || size > config.max_queue_entries)
      return make_status(CommandSpecificStatus::invalid_queue_size, true);
    if (F::PC::decode(sqe.cdw11) == 0)
      return make_status(GenericStatus::invalid_field_in_command, true);  // CAP.CQR = 1
    if (sqe.data_pointer_kind() != nvme::DataPointerKind::prp)
      return make_status(GenericStatus::invalid_field_in_command, true);
    const std::uint64_t prp1 = sqe.data_pointer.prp.prp1;
    if (prp1 % kPage != 0) return make_status(GenericStatus::prp_offset_invalid, true);
    std::shared_lock lock(bus.mutex);
    base = bus.contiguous_locked(prp1, size * entry_size);
    if (base == nullptr) {
      counters.dma_faults.fetch_add(1, std::memory_order_relaxed);
      return make_status(GenericStatus::data_transfer_error, true);
    }
    return kSuccess;
  }

  StatusField create_cq(const nvme::SubmissionQueueEntry& sqe) {
    std::uint16_t qid = 0;
    std::uint32_t size = 0;
    void* base = nullptr;
    const StatusField checked = check_create(sqe, sizeof(nvme::CompletionQueueEntry), qid, size, base);
    if (!checked.success()) return checked;
    if (io_cqs.count(qid) != 0) return make_status(CommandSpecificStatus::invalid_queue_identifier, true);
    if (nvme::CreateQueueFields::IEN::decode(sqe.cdw11) != 0 && nvme::CreateQueueFields::IV::decode(sqe.cdw11) != 0)
      return make_status(CommandSpecificStatus::invalid_interrupt_vector, true);  // no interrupts here
    auto cq = std::make_unique<CompletionQueueState>();
    cq->qid = qid;
    cq->size = size;
    cq->base = static_cast<nvme::CompletionQueueEntry*>(base);
    cq->bus = sqe.data_pointer.prp.prp1;
    cq->head_doorbell = reg(nvme::completion_queue_head_doorbell_offset(qid, dstrd()));
    store32(cq->head_doorbell, 0);  // a new queue starts at head 0, whatever an earlier queue left there
    cq->worker = (qid - 1u) % static_cast<unsigned>(workers.size());
    {
      std::unique_lock lock(bus.mutex);
      bus.add_queue_user_locked(cq->bus, +1);
    }
    io_cqs.emplace(qid, std::move(cq));
    return kSuccess;
  }

  StatusField create_sq(const nvme::SubmissionQueueEntry& sqe) {
    std::uint16_t qid = 0;
    std::uint32_t size = 0;
    void* base = nullptr;
    const StatusField checked = check_create(sqe, sizeof(nvme::SubmissionQueueEntry), qid, size, base);
    if (!checked.success()) return checked;
    if (io_sqs.count(qid) != 0) return make_status(CommandSpecificStatus::invalid_queue_identifier, true);
    const nvme::ControllerConfiguration cc{load32(reg(offsetof(nvme::ControllerRegisters, cc)))};
    if (nvme::ControllerConfiguration::IOSQES::decode(cc.raw) != nvme::kSubmissionQueueEntrySizeLog2 ||
        nvme::ControllerConfiguration::IOCQES::decode(cc.raw) != nvme::kCompletionQueueEntrySizeLog2)
      return make_status(GenericStatus::invalid_field_in_command, true);
    const auto cqid = static_cast<std::uint16_t>(nvme::CreateQueueFields::CQID::decode(sqe.cdw11));
    auto cq = io_cqs.find(cqid);
    if (cqid == 0 || cq == io_cqs.end()) return make_status(CommandSpecificStatus::completion_queue_invalid, true);
    auto sq = std::make_unique<SubmissionQueueState>();
    sq->qid = qid;
    sq->size = size;
    sq->base = static_cast<nvme::SubmissionQueueEntry*>(base);
    sq->bus = sqe.data_pointer.prp.prp1;
    sq->cq = cq->second.get();
    sq->tail_doorbell = reg(nvme::submission_queue_tail_doorbell_offset(qid, dstrd()));
    store32(sq->tail_doorbell, 0);  // a new queue starts at tail 0
    {
      std::unique_lock lock(bus.mutex);
      bus.add_queue_user_locked(sq->bus, +1);
    }
    ++cq->second->sq_users;
    Worker& worker = *workers[cq->second->worker];
    {
      std::lock_guard lock(worker.mutex);
      worker.queues.push_back(sq.get());
    }
    io_sqs.emplace(qid, std::move(sq));
    return kSuccess;
  }

  StatusField delete_sq(const nvme::SubmissionQueueEntry& sqe) {
    const auto qid = static_cast<std::uint16_t>(nvme::DeleteQueueFields::QID::decode(sqe.cdw10));
    auto it = io_sqs.find(qid);
    if (qid == 0 || it == io_sqs.end()) return make_status(CommandSpecificStatus::invalid_queue_identifier, true);
    SubmissionQueueState& sq = *it->second;
    Worker& worker = *workers[sq.cq->worker];
    {
      std::lock_guard lock(worker.mutex);
      std::erase(worker.queues, &sq);
      // Commands the controller still holds complete with "Command Aborted due to SQ Deletion".
      for (const HeldCommand& held : sq.held) {
        counters.io_commands.fetch_add(1, std::memory_order_relaxed);
        post(sq, held.sqe.command_identifier, make_status(GenericStatus::aborted_sq_deletion, true));
      }
      sq.held.clear();
      // Commands submitted but not fetched yet are aborted the same way: every command previously
      // submitted to the queue is completed or aborted (NVMe Base Spec 2.0, 5.7 Delete I/O
      // Submission Queue). Without this a command racing the deletion would never complete.
      // Acquire: the SQEs up to the tail were written before the doorbell.
      const std::uint32_t tail = load32(sq.tail_doorbell);
      while (tail < sq.size && sq.head != tail) {
        const std::uint16_t cid = sq.base[sq.head].command_identifier;
        sq.head = (sq.head + 1) % sq.size;
        counters.io_commands.fetch_add(1, std::memory_order_relaxed);
        post(sq, cid, make_status(GenericStatus::aborted_sq_deletion, true));
      }
      --sq.cq->sq_users;
    }
    {
      std::unique_lock lock(bus.mutex);
      bus.add_queue_user_locked(sq.bus, -1);
    }
    io_sqs.erase(it);
    return kSuccess;
  }

  StatusField delete_cq(const nvme::SubmissionQueueEntry& sqe) {
    const auto qid = static_cast<std::uint16_t>(nvme::DeleteQueueFields::QID::decode(sqe.cdw10));
    auto it = io_cqs.find(qid);
    if (qid == 0 || it == io_cqs.end()) return make_status(CommandSpecificStatus::invalid_queue_identifier, true);
    if (it->second->sq_users != 0) return make_status(CommandSpecificStatus::invalid_queue_deletion, true);
    {
      std::unique_lock lock(bus.mutex);
      bus.add_queue_user_locked(it->second->bus, -1);
    }
    io_cqs.erase(it);
    return kSuccess;
  }

  StatusField abort(const nvme::SubmissionQueueEntry& sqe, std::uint32_t& dw0) {
    const auto sqid = static_cast<std::uint16_t>(nvme::AbortFields::SQID::decode(sqe.cdw10));
    const auto cid = static_cast<std::uint16_t>(nvme::AbortFields::CID::decode(sqe.cdw10));
    dw0 = nvme::AbortFields::NotAborted::encode(0, 1);
    auto it = io_sqs.find(sqid);
    if (sqid == 0 || it == io_sqs.end()) return kSuccess;  // admin commands run to completion; unknown SQ: not aborted
    SubmissionQueueState& sq = *it->second;
    Worker& worker = *workers[sq.cq->worker];
    std::lock_guard lock(worker.mutex);
    for (auto held = sq.held.begin(); held != sq.held.end(); ++held) {
      if (held->sqe.command_identifier != cid) continue;
      sq.held.erase(held);
      counters.io_commands.fetch_add(1, std::memory_order_relaxed);
      counters.aborted_commands.fetch_add(1, std::memory_order_relaxed);
      post(sq, cid, make_status(GenericStatus::command_abort_requested, true));
      dw0 = nvme::AbortFields::NotAborted::encode(0, 0);
      break;
    }
    return kSuccess;
  }

  StatusField get_log_page(const nvme::SubmissionQueueEntry& sqe) {
    if (nvme::GetLogPageFields::LID::decode(sqe.cdw10) !=
        static_cast<std::uint32_t>(nvme::LogPageIdentifier::smart_health))
      return make_status(CommandSpecificStatus::invalid_log_page, true);
    const std::uint64_t dwords = ((std::uint64_t{nvme::GetLogPageFields::NUMDU::decode(sqe.cdw11)} << 16) |
                                  nvme::GetLogPageFields::NUMDL::decode(sqe.cdw10)) +
                                 1;
    if (dwords * 4 > 4096) return make_status(GenericStatus::invalid_field_in_command, true);
    std::vector<std::uint8_t> page(dwords * 4, 0);
    nvme::SmartHealthLog log{};
    log.composite_temperature[0] = 300 & 0xff;  // 300 K
    log.composite_temperature[1] = 300 >> 8;
    log.available_spare = 100;
    log.data_units_read[0] = (counters.bytes_read.load() / 512 + 999) / 1000;
    log.data_units_written[0] = (counters.bytes_written.load() / 512 + 999) / 1000;
    log.host_read_commands[0] = counters.read_commands.load();
    log.host_write_commands[0] = counters.write_commands.load();
    std::memcpy(page.data(), &log, std::min<std::size_t>(page.size(), sizeof log));
    return copy_to_host(sqe, page.data(), page.size());
  }
};

// ---------------------------------------------------------------------------------------------
// SoftController

Result<std::shared_ptr<SoftController>> SoftController::create(const SoftControllerConfig& config) {
  if (config.lba_size != 512 && config.lba_size != 4096)
    return error(StatusCode::INVALID_ARGUMENT, "lba_size = {} must be 512 or 4096", config.lba_size);
  if (config.max_queue_entries < 2 || config.max_queue_entries > 65536)
    return error(StatusCode::INVALID_ARGUMENT, "max_queue_entries = {} is outside 2..65536", config.max_queue_entries);
  if (config.max_io_queue_pairs == 0 || config.max_io_queue_pairs == 0xffff)
    return error(StatusCode::INVALID_ARGUMENT, "max_io_queue_pairs = {} is outside 1..65534",
                 config.max_io_queue_pairs);
  const std::uint32_t mdts = config.max_data_transfer_bytes;
  if (mdts != 0 && (mdts < 4096 || (mdts & (mdts - 1)) != 0))
    return error(StatusCode::INVALID_ARGUMENT, "max_data_transfer_bytes = {} must be 0 or a power of two >= 4096",
                 mdts);
  if (config.worker_threads == 0 || config.worker_threads > 64)
    return error(StatusCode::INVALID_ARGUMENT, "worker_threads = {} is outside 1..64", config.worker_threads);
  if (config.doorbell_stride > 15)
    return error(StatusCode::INVALID_ARGUMENT, "doorbell_stride = {} is outside 0..15", config.doorbell_stride);
  if (config.max_sgl_descriptors == 0) return error(StatusCode::INVALID_ARGUMENT, "max_sgl_descriptors must be >= 1");
  if (config.shared_memory && config.accelerator_mode)
    return error(StatusCode::INVALID_ARGUMENT, "shared_memory and accelerator_mode cannot both be set");

  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (config.null_mode || config.backing_path.empty()) {
    impl->config.null_mode = true;
    if (config.namespace_size_lbas == 0)
      return error(StatusCode::INVALID_ARGUMENT, "null mode needs namespace_size_lbas > 0");
    impl->namespace_size = config.namespace_size_lbas;
  } else {
    impl->fd = ::open(config.backing_path.c_str(), O_RDWR | O_CLOEXEC);
    if (impl->fd < 0)
      return error(errno == ENOENT ? StatusCode::NOT_FOUND : StatusCode::UNSUPPORTED, "open {}: {}",
                   config.backing_path, std::strerror(errno));
    struct stat st {};
    if (::fstat(impl->fd, &st) != 0)
      return error(StatusCode::UNSUPPORTED, "fstat {}: {}", config.backing_path, std::strerror(errno));
    std::uint64_t bytes = 0;
    if (S_ISREG(st.st_mode)) {
      bytes = static_cast<std::uint64_t>(st.st_size);
    } else if (S_ISBLK(st.st_mode)) {
      if (::ioctl(impl->fd, BLKGETSIZE64, &bytes) != 0)
        return error(StatusCode::UNSUPPORTED, "BLKGETSIZE64 {}: {}", config.backing_path, std::strerror(errno));
    } else {
      return error(StatusCode::UNSUPPORTED, "{} is neither a regular file nor a block device", config.backing_path);
    }
    const std::uint64_t available = bytes / config.lba_size;
    if (config.namespace_size_lbas > available)
      return error(StatusCode::INVALID_ARGUMENT, "namespace_size_lbas = {} exceeds the {} LBAs of {} ({} bytes)",
                   config.namespace_size_lbas, available, config.backing_path, bytes);
    impl->namespace_size = config.namespace_size_lbas != 0 ? config.namespace_size_lbas : available;
    if (impl->namespace_size == 0)
      return error(StatusCode::INVALID_ARGUMENT, "{} ({} bytes) holds no whole {}-byte LBA", config.backing_path, bytes,
                   config.lba_size);
  }

  // BAR0: registers + doorbells of the admin queue and every I/O queue pair.
  impl->bar_size = nvme::completion_queue_head_doorbell_offset(config.max_io_queue_pairs, config.doorbell_stride) + 4;
  impl->bar_size = (impl->bar_size + kPage - 1) / kPage * kPage;
  if (config.accelerator_mode) {
    // Mapped pinned memory: GPU kernels ring the doorbells at the same address the workers poll.
    auto bar = accel::allocate_mapped_host(impl->bar_size);
    if (!bar) return bar.status().with_context("accelerator_mode BAR0");
    impl->bar =
        std::unique_ptr<std::uint32_t[], BarFree>(static_cast<std::uint32_t*>(*bar), BarFree{MemoryOwner::mapped_host});
    // One pinned bounce buffer per worker, MDTS long (a command never needs more at once).
    const std::uint64_t bounce =
        config.max_data_transfer_bytes != 0 ? config.max_data_transfer_bytes : kSoftDefaultBounceBufferBytes;
    for (std::uint32_t i = 0; i < config.worker_threads; ++i) {
      auto buffer = accel::MappedHostBuffer::allocate(bounce);
      if (!buffer) return buffer.status().with_context("accelerator_mode bounce buffer");
      impl->workers.push_back(std::make_unique<Worker>());
      impl->workers.back()->bounce = std::move(*buffer);
    }
  } else if (config.shared_memory) {
    // A memfd: a client process that receives it rings the doorbells the workers poll (tuttid's soft mode).
    impl->bar = std::unique_ptr<std::uint32_t[], BarFree>(static_cast<std::uint32_t*>(allocate_shared(impl->bar_size)),
                                                          BarFree{MemoryOwner::shared});
    if (!impl->bar)
      return error(StatusCode::RESOURCE_EXHAUSTED, "shared_memory BAR0 memfd of {} bytes failed: {}", impl->bar_size,
                   std::strerror(errno));
  } else {
    impl->bar = std::unique_ptr<std::uint32_t[], BarFree>(
        static_cast<std::uint32_t*>(std::aligned_alloc(kPage, impl->bar_size)), BarFree{MemoryOwner::aligned});
    if (!impl->bar) return error(StatusCode::RESOURCE_EXHAUSTED, "BAR0 allocation of {} bytes failed", impl->bar_size);
    std::memset(impl->bar.get(), 0, impl->bar_size);
  }
  using CAP = nvme::ControllerCapabilities;
  std::uint64_t cap = 0;
  cap = CAP::MQES::encode(cap, config.max_queue_entries - 1);
  cap = CAP::CQR::encode(cap, 1);
  cap = CAP::TO::encode(cap, 4);  // 2 s
  cap = CAP::DSTRD::encode(cap, config.doorbell_stride);
  cap = CAP::CSS::encode(cap, 1);  // NVM command set
  cap = CAP::MPSMIN::encode(cap, 0);
  cap = CAP::MPSMAX::encode(cap, 0);
  impl->store_register64(offsetof(nvme::ControllerRegisters, cap), cap);
  store32(impl->reg(offsetof(nvme::ControllerRegisters, vs)), nvme::kVersion2_0.raw);

  Impl& ref = *impl;
  try {
    while (impl->workers.size() < config.worker_threads) impl->workers.push_back(std::make_unique<Worker>());
    for (auto& w : impl->workers) {
      Worker* worker = w.get();
      w->thread = std::thread([&ref, worker] { ref.worker_loop(*worker); });
    }
    impl->controller_thread = std::thread([&ref] { ref.controller_loop(); });
  } catch (const std::system_error& e) {
    return error(StatusCode::INTERNAL, "starting soft controller threads: {}", e.what());
  }
  return std::shared_ptr<SoftController>(new SoftController(std::move(impl)));
}

SoftController::SoftController(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SoftController::~SoftController() = default;

const SoftControllerConfig& SoftController::config() const noexcept { return impl_->config; }
volatile std::uint32_t* SoftController::bar0() noexcept { return impl_->bar.get(); }
std::size_t SoftController::bar0_size() const noexcept { return impl_->bar_size; }

Result<DmaMapping> SoftController::map(void* host_address, std::size_t length) {
  return impl_->bus.map(host_address, length, impl_->config.scatter_bus_pages, MemoryOwner::caller);
}

Result<DmaMapping> SoftController::map_device(void* device_address, std::size_t length) {
  if (!impl_->config.accelerator_mode)
    return error(StatusCode::UNSUPPORTED,
                 "dma_map_device({}, {} bytes): the soft controller reaches accelerator memory only with "
                 "accelerator_mode = true",
                 device_address, length);
  return impl_->bus.map(device_address, length, impl_->config.scatter_bus_pages, MemoryOwner::caller,
                        DmaMemoryKind::device);
}

Status SoftController::unmap(std::uint64_t mapping_id) {
  auto owned = impl_->bus.unmap(mapping_id);
  if (!owned) return owned.status();
  free_owned(owned->memory, owned->owner);
  return Status::success();
}

Result<DmaBuffer> SoftController::allocate_dma_buffer(std::size_t length) {
  if (length == 0) return error(StatusCode::INVALID_ARGUMENT, "allocate_dma_buffer: length = 0 must be >= 1");
  if (length > accel::kMaxAllocationBytes)
    return error(StatusCode::INVALID_ARGUMENT, "allocate_dma_buffer: length = {} exceeds the limit of {} bytes", length,
                 accel::kMaxAllocationBytes);
  const std::size_t rounded = (length + kPage - 1) / kPage * kPage;
  void* memory = nullptr;
  MemoryOwner owner = MemoryOwner::aligned;
  if (impl_->config.accelerator_mode) {
    // Mapped pinned memory: queues, PRP lists and SGL segments that GPU kernels write.
    auto mapped = accel::allocate_mapped_host(rounded);
    if (!mapped) return mapped.status().with_context("allocate_dma_buffer");
    memory = *mapped;
    owner = MemoryOwner::mapped_host;
  } else if (impl_->config.shared_memory) {
    memory = allocate_shared(rounded);  // zeroed (a new memfd)
    if (memory == nullptr)
      return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_dma_buffer: memfd of {} bytes: {}", rounded,
                   std::strerror(errno));
    owner = MemoryOwner::shared;
  } else {
    memory = std::aligned_alloc(kPage, rounded);
    if (memory == nullptr) return error(StatusCode::RESOURCE_EXHAUSTED, "allocate_dma_buffer: {} bytes", rounded);
    std::memset(memory, 0, rounded);
  }
  auto mapping = impl_->bus.map(memory, rounded, false, owner);
  if (!mapping) {
    free_owned(memory, owner);
    return mapping.status();
  }
  DmaBuffer buffer;
  buffer.host_address = memory;
  buffer.bus_address = mapping->bus_addresses.front();
  buffer.length = rounded;
  buffer.id = mapping->id;
  return buffer;
}

Result<SharedMemoryRange> SoftController::shared_memory_of(const void* address) const {
  if (!impl_->config.shared_memory)
    return error(StatusCode::UNSUPPORTED, "shared_memory_of: the soft controller is not in shared_memory mode");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  std::lock_guard lock(shared_table().mutex);
  auto it = shared_table().regions.upper_bound(a);
  if (it != shared_table().regions.begin()) {
    --it;
    if (a < it->first + it->second.second) return SharedMemoryRange{it->second.first, a - it->first, it->second.second};
  }
  return error(StatusCode::NOT_FOUND, "shared_memory_of({}): not in BAR0 or a DMA buffer of this controller", address);
}

void* SoftController::translate(std::uint64_t bus_address, std::size_t length) const {
  std::shared_lock lock(impl_->bus.mutex);
  return impl_->bus.contiguous_locked(bus_address, length, false);
}

std::uint64_t SoftController::inject_fault(const SoftFaultRule& rule) {
  std::lock_guard lock(impl_->faults_mutex);
  FaultState state;
  state.rule = rule;
  state.id = impl_->next_fault_id++;
  impl_->faults.push_back(state);
  impl_->fault_count.store(impl_->faults.size(), std::memory_order_release);
  return state.id;
}

void SoftController::clear_faults() {
  std::lock_guard lock(impl_->faults_mutex);
  impl_->faults.clear();
  impl_->fault_count.store(0, std::memory_order_release);
}

void SoftController::set_controller_fatal() { impl_->set_fatal(); }

SoftControllerCounters SoftController::counters() const {
  const auto& c = impl_->counters;
  SoftControllerCounters out;
  out.admin_commands = c.admin_commands.load();
  out.io_commands = c.io_commands.load();
  out.read_commands = c.read_commands.load();
  out.write_commands = c.write_commands.load();
  out.flush_commands = c.flush_commands.load();
  out.write_zeroes_commands = c.write_zeroes_commands.load();
  out.dataset_management_commands = c.dataset_management_commands.load();
  out.bytes_read = c.bytes_read.load();
  out.bytes_written = c.bytes_written.load();
  out.device_bytes_read = c.device_bytes_read.load();
  out.device_bytes_written = c.device_bytes_written.load();
  out.errors = c.errors.load();
  out.dma_faults = c.dma_faults.load();
  out.invalid_doorbell_writes = c.invalid_doorbell_writes.load();
  out.injected_faults = c.injected_faults.load();
  out.aborted_commands = c.aborted_commands.load();
  out.completions_posted = c.completions_posted.load();
  std::lock_guard lock(impl_->errors_mutex);
  out.errors_by_status = impl_->errors_by_status;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The register transport of a soft controller, and the libnvm Controller over it.

namespace {

class SoftTransport final : public RegisterTransport {
 public:
  explicit SoftTransport(std::shared_ptr<SoftController> device) : device_(std::move(device)) {}
  std::string_view kind() const noexcept override { return "soft"; }
  volatile std::uint32_t* bar0() noexcept override { return device_->bar0(); }
  std::size_t bar0_size() const noexcept override { return device_->bar0_size(); }
  Result<DmaMapping> dma_map(void* host_address, std::size_t length) override {
    return device_->map(host_address, length);
  }
  Result<DmaMapping> dma_map_device(void* device_address, std::size_t length) override {
    return device_->map_device(device_address, length);
  }
  Status dma_unmap(std::uint64_t mapping_id) override { return device_->unmap(mapping_id); }

  Result<DmaBuffer> allocate_dma_buffer(std::size_t length) override { return device_->allocate_dma_buffer(length); }
  Status free_dma_buffer(std::uint64_t id) override { return device_->unmap(id); }

 private:
  std::shared_ptr<SoftController> device_;
};

}  // namespace

Result<std::unique_ptr<Controller>> open_soft_controller(std::shared_ptr<SoftController> device) {
  if (!device) return error(StatusCode::INVALID_ARGUMENT, "open_soft_controller: device is null");
  return make_register_controller(std::make_unique<SoftTransport>(std::move(device)));
}

}  // namespace tutti::libnvm
