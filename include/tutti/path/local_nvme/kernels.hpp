// The local_nvme DataPath's per-request device work, written as kernel functions over
// tutti/accel/ primitives and tutti/nvme/queue.hpp, so the same code runs on host threads (host
// profile, accel::launch on the HostThreadPool) and later on GPU threads (CUDA profile).
//
// One logical thread owns one request:
//  - admit_request (the submit kernel): resolves the request's first LBAs by binary search over
//    the target's extents, counts the commands it needs up to its window, takes that many
//    credits from its queue (backpressure: RESOURCE_EXHAUSTED when the queue lacks them), then
//    issues its first commands;
//  - poll_request (the progress kernel): reaps the CQ, takes its commands' completions, marks
//    commands past their deadline as timed out (the host then sends NVMe Abort), issues further
//    commands while bytes remain, and marks the request done when nothing of it is in flight.
// Splitting: a command never crosses an extent boundary, never exceeds max_command_bytes (MDTS,
// NLB 16-bit limit), and its PRPs come from the registration's prebuilt PRP table.
// Units: bytes unless named *_lba; time in ns from accel::timer_ns().
// Thread-safety: one thread per RequestState at a time; queues are shared (queue.hpp rules).
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/bind/extents.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/path/local_nvme/prp_table.hpp>

namespace tutti::local_nvme {

/// Most commands one request keeps in flight at once (its window), and thus credits it holds.
inline constexpr std::uint32_t kMaxWindow = 64;

/// The device-resident target handle: what a submitting thread needs of an open file.
struct DeviceTarget {
  const local_file::Extent* extents = nullptr;  ///< sorted, gap-free (bind/extents.hpp)
  std::uint64_t extent_count = 0;
  std::uint64_t file_size = 0;  ///< bytes
  std::uint32_t lba_size = 0;   ///< bytes: 512 or 4096
  std::uint32_t nsid = 0;       ///< NVMe namespace of the extents' device offsets
};

/// One queue pair as the kernels see it: the ring view and its credit counter.
struct DeviceQueue {
  nvme::QueuePair queue;          ///< rings, doorbells, CID slots (nvme/queue.hpp)
  std::uint32_t* credits = nullptr;  ///< free command credits (<= depth - 1); system-scope atomic
};

/// Per-command bookkeeping inside a request's window.
enum class CommandPhase : std::uint32_t {
  free = 0,        ///< record unused
  in_flight = 1,   ///< SQE submitted, completion pending, deadline = issue time + command timeout
  timed_out = 2,   ///< deadline passed: the host must send an NVMe Abort (Base 2.0, 5.1)
  abort_sent = 3,  ///< Abort sent; deadline = abort time + abort timeout
  zombie = 4,      ///< no completion even after Abort: handed to the DataPath's zombie list
};

/// One NVMe command of a request: where it reads or writes, its CID and deadline. 40 bytes,
/// trivially copyable; `max_window` of them per request live in the batch.
struct CommandRecord {
  std::uint64_t deadline_ns = 0;   ///< accel::timer_ns() value after which the command is late
  std::uint64_t starting_lba = 0;  ///< SLBA (CDW10-11), LBAs of the namespace
  std::uint64_t bytes = 0;         ///< bytes the command transfers (NLB + 1 LBAs; 0 for Flush)
  std::uint64_t file_offset = 0;   ///< file byte the command starts at (for messages)
  std::uint16_t cid = 0;           ///< Command Identifier with generation (nvme/queue.hpp)
  CommandPhase phase = CommandPhase::free;
};

/// Outcome codes a kernel records (the host turns them into Status messages).
enum class RequestOutcome : std::uint32_t {
  ok = 0,
  rejected_backpressure = 1,  ///< not accepted: queue credits exhausted
  rejected_alignment = 2,     ///< not accepted: offset/length not LBA aligned (and not the tail)
  rejected_memory_room = 3,   ///< not accepted: the tail's whole last LBA does not fit in memory
  rejected_window = 4,        ///< not accepted: queue too shallow for even one command
  nvme_error = 5,             ///< a command completed with an NVMe error status
  timed_out = 6,              ///< a command missed its deadline (aborted, or zombie)
  controller_fatal = 7,       ///< CSTS.CFS or device gone while commands were in flight
  no_extent = 8,              ///< an offset maps to no extent (cannot happen for a valid target)
  prp_error = 9,              ///< the memory range is outside the registration
};

/// One request's state, shared by the submit and progress kernels and the host.
struct RequestState {
  // --- inputs (host, before the submit kernel)
  nvme::NvmOpcode opcode = nvme::NvmOpcode::read;
  std::uint32_t queue_index = 0;
  DeviceTarget target{};
  PrpTable memory{};
  std::uint64_t memory_offset = 0;  ///< bytes into the DMA mapping (not the user region)
  std::uint64_t memory_room = 0;    ///< bytes from memory_offset to the end of the user region
  std::uint64_t target_offset = 0;  ///< bytes into the file
  std::uint64_t length = 0;         ///< bytes requested
  std::uint64_t max_command_bytes = 0;  ///< MDTS and NLB limit, multiple of lba_size
  std::uint64_t command_timeout_ns = 0;
  std::uint32_t max_window = 1;     ///< 1..kMaxWindow
  CommandRecord* records = nullptr; ///< max_window records
  // --- progress (kernels)
  std::uint64_t transfer_length = 0;  ///< length rounded up to the LBA size at the tail
  std::uint64_t issued_bytes = 0;
  std::uint64_t confirmed_bytes = 0;  ///< bytes of successfully completed commands
  std::uint32_t window = 0;           ///< credits held
  std::uint32_t in_flight = 0;
  std::uint32_t commands = 0;         ///< commands issued so far
  std::uint32_t zombies = 0;          ///< commands handed off without a completion
  std::uint16_t nvme_status = 0;      ///< SCT << 8 | SC of the first failed command
  bool flush_issued = false;
  bool accepted = false;
  bool done = false;
  RequestOutcome outcome = RequestOutcome::ok;
  std::uint64_t failed_lba = 0;       ///< first failed command's SLBA
  std::uint64_t failed_file_offset = 0;
};

namespace detail {

/// Takes n command credits of a queue pair with one CAS loop; false (nothing taken) when fewer remain.
TUTTI_HOST_DEVICE inline bool take_credits(std::uint32_t* credits, std::uint32_t n) noexcept {
  accel::SystemAtomicRef<std::uint32_t> c(*credits);
  std::uint32_t current = c.load(accel::MemoryOrder::relaxed);
  while (current >= n)
    if (c.compare_exchange_strong(current, current - n, accel::MemoryOrder::acq_rel)) return true;
  return false;
}
/// Gives n credits back (completed commands, or a zombie whose completion finally arrived).
TUTTI_HOST_DEVICE inline void return_credits(std::uint32_t* credits, std::uint32_t n) noexcept {
  accel::SystemAtomicRef<std::uint32_t>(*credits).fetch_add(n, accel::MemoryOrder::acq_rel);
}

/// One command's extent-bounded piece starting at file byte `offset` with `remaining` bytes
/// left: its length, SLBA and extent. Returns false when no extent maps `offset`.
TUTTI_HOST_DEVICE inline bool split_at(const RequestState& r, std::uint64_t offset, std::uint64_t remaining,
                                       std::uint64_t& bytes, std::uint64_t& slba) noexcept {
  const std::size_t i = local_file::find_extent(r.target.extents, r.target.extent_count, offset);
  if (i == r.target.extent_count) return false;
  const local_file::Extent& e = r.target.extents[i];
  const std::uint64_t within = offset - e.file_offset;
  bytes = remaining;
  if (bytes > e.length - within) bytes = e.length - within;  // split at the extent boundary
  if (bytes > r.max_command_bytes) bytes = r.max_command_bytes;  // split at MDTS / NLB limit
  slba = (e.device_offset + within) / r.target.lba_size;
  return true;
}

/// Issues as many commands as free records and remaining bytes allow, with one SQ tail doorbell
/// write for all of them (NVMe Base 2.0, 3.3.1: the tail doorbell announces every entry before it).
/// SQEs: Read (NVM Command Set 1.0, 3.2.4) / Write (3.2.6) with SLBA in CDW10-11, NLB 0's based in
/// CDW12 15:0, PRP1/PRP2 (Base 2.0, 4.3.1); Flush (NVM 1.0, 3.2.2; Base 2.0, 7.1) has no data.
TUTTI_HOST_DEVICE inline void issue_commands(RequestState& r, const DeviceQueue& q) noexcept {
  if (r.outcome != RequestOutcome::ok) return;
  nvme::SubmissionQueueEntry sqes[kMaxWindow];
  std::uint32_t record_of[kMaxWindow];
  std::uint32_t n = 0;
  std::uint64_t planned = r.issued_bytes;
  const bool is_flush = r.opcode == nvme::NvmOpcode::flush;
  for (std::uint32_t k = 0; k < r.window && n < kMaxWindow; ++k) {
    if (r.records[k].phase != CommandPhase::free) continue;
    if (is_flush ? r.flush_issued || n > 0 : planned >= r.transfer_length) break;
    nvme::SubmissionQueueEntry sqe{};
    sqe.opcode = static_cast<std::uint8_t>(r.opcode);
    sqe.nsid = r.target.nsid;
    CommandRecord& rec = r.records[k];
    rec = CommandRecord{};
    if (!is_flush) {
      std::uint64_t bytes = 0, slba = 0;
      const std::uint64_t offset = r.target_offset + planned;
      if (!split_at(r, offset, r.transfer_length - planned, bytes, slba)) {
        r.outcome = RequestOutcome::no_extent;
        r.failed_file_offset = offset;
        break;
      }
      const nvme::PrpBuild prp = r.memory.lookup(r.memory_offset + planned, bytes);
      if (prp.status != StatusCode::OK) {
        r.outcome = RequestOutcome::prp_error;
        r.failed_file_offset = offset;
        break;
      }
      sqe.set_data_pointer_kind(nvme::DataPointerKind::prp);
      sqe.data_pointer.prp.prp1 = prp.prp1;
      sqe.data_pointer.prp.prp2 = prp.prp2;
      sqe.cdw10 = static_cast<std::uint32_t>(slba);
      sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
      sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, static_cast<std::uint32_t>(bytes / r.target.lba_size - 1));
      rec.starting_lba = slba;
      rec.bytes = bytes;
      rec.file_offset = offset;
      planned += bytes;
    }
    sqes[n] = sqe;
    record_of[n] = k;
    ++n;
  }
  if (n == 0) return;
  std::uint64_t ticket = 0;
  if (!q.queue.reserve_submission_slots(n, ticket)) return;  // credits make this rare: retried by the next poll
  const std::uint64_t now = accel::timer_ns();
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint16_t cid = 0;
    // Cannot fail: cid_capacity == depth > credits held by all requests of the queue.
    (void)q.queue.allocate_command_identifier(cid);
    sqes[i].command_identifier = cid;
    CommandRecord& rec = r.records[record_of[i]];
    rec.cid = cid;
    rec.deadline_ns = now + r.command_timeout_ns;
    rec.phase = CommandPhase::in_flight;
    q.queue.write_submission(ticket + i, sqes[i]);
  }
  q.queue.ring_submission_doorbell();  // one doorbell write for the run
  r.in_flight += n;
  r.commands += n;
  r.issued_bytes = planned;
  if (is_flush) r.flush_issued = true;
}

/// Marks the request done when nothing of it is in flight and it issued everything (or failed),
/// returning its credits except those of zombie commands.
TUTTI_HOST_DEVICE inline void finish_if_idle(RequestState& r, const DeviceQueue& q) noexcept {
  if (r.in_flight != 0 || r.done) return;
  const bool all_issued = r.opcode == nvme::NvmOpcode::flush ? r.flush_issued : r.issued_bytes >= r.transfer_length;
  if (r.outcome == RequestOutcome::ok && !all_issued) return;
  // Zombie commands keep their credit until their completion arrives (the DataPath returns it).
  return_credits(q.credits, r.window - r.zombies);
  r.window = 0;
  r.done = true;
}

}  // namespace detail

/// The submit kernel's body for one request (thread = request). Sets r.accepted or an outcome
/// rejected_*; an accepted request has its first commands in the SQ.
TUTTI_HOST_DEVICE inline void admit_request(RequestState& r, const DeviceQueue& q) noexcept {
  const std::uint64_t lba = r.target.lba_size;
  if (r.opcode != nvme::NvmOpcode::flush) {
    const bool tail = r.target_offset + r.length == r.target.file_size;
    if (r.target_offset % lba != 0 || (r.length % lba != 0 && !tail)) {
      r.outcome = RequestOutcome::rejected_alignment;
      r.done = true;
      return;
    }
    r.transfer_length = (r.length + lba - 1) / lba * lba;
    if (r.transfer_length > r.memory_room) {
      r.outcome = RequestOutcome::rejected_memory_room;
      r.done = true;
      return;
    }
  }
  // Commands needed, counted up to the window (extent walk by binary search).
  std::uint32_t needed = 0;
  if (r.opcode == nvme::NvmOpcode::flush) {
    needed = 1;
  } else {
    for (std::uint64_t planned = 0; planned < r.transfer_length && needed < r.max_window; ++needed) {
      std::uint64_t bytes = 0, slba = 0;
      if (!detail::split_at(r, r.target_offset + planned, r.transfer_length - planned, bytes, slba)) break;
      planned += bytes;
    }
    if (needed == 0) needed = 1;
  }
  if (!detail::take_credits(q.credits, needed)) {
    r.outcome = RequestOutcome::rejected_backpressure;
    r.done = true;
    return;
  }
  r.window = needed;
  r.accepted = true;
  detail::issue_commands(r, q);
  detail::finish_if_idle(r, q);
}

/// The progress kernel's body for one request. `now` from accel::timer_ns().
TUTTI_HOST_DEVICE inline void poll_request(RequestState& r, const DeviceQueue& q, std::uint64_t now) noexcept {
  if (r.done || !r.accepted) return;
  q.queue.reap_completions();
  for (std::uint32_t k = 0; k < r.window; ++k) {
    CommandRecord& rec = r.records[k];
    if (rec.phase == CommandPhase::free || rec.phase == CommandPhase::zombie) continue;
    nvme::CompletionQueueEntry cqe{};
    if (q.queue.take_completion(rec.cid, cqe)) {
      const nvme::StatusField status = cqe.status();
      if (status.success()) {
        r.confirmed_bytes += rec.bytes;
      } else if (r.outcome == RequestOutcome::ok) {
        r.outcome = rec.phase == CommandPhase::abort_sent ? RequestOutcome::timed_out : RequestOutcome::nvme_error;
        r.nvme_status = static_cast<std::uint16_t>(status.status_code_type() << 8 | status.status_code());
        r.failed_lba = rec.starting_lba;
        r.failed_file_offset = rec.file_offset;
      }
      rec.phase = CommandPhase::free;
      --r.in_flight;
      continue;
    }
    if (rec.phase == CommandPhase::in_flight && now >= rec.deadline_ns) {
      rec.phase = CommandPhase::timed_out;  // the host sends the Abort
    } else if (rec.phase == CommandPhase::abort_sent && now >= rec.deadline_ns) {
      rec.phase = CommandPhase::zombie;  // the host moves it to the zombie list
      --r.in_flight;
      ++r.zombies;
      if (r.outcome == RequestOutcome::ok) {
        r.outcome = RequestOutcome::timed_out;
        r.failed_lba = rec.starting_lba;
        r.failed_file_offset = rec.file_offset;
      }
    }
  }
  if (r.in_flight != 0 && q.queue.controller_failed()) {
    // The controller stopped: nothing will complete. Every command becomes a zombie (its memory
    // stays mapped until the queue is deleted) and the request fails.
    for (std::uint32_t k = 0; k < r.window; ++k) {
      CommandRecord& rec = r.records[k];
      if (rec.phase == CommandPhase::free || rec.phase == CommandPhase::zombie) continue;
      rec.phase = CommandPhase::zombie;
      --r.in_flight;
      ++r.zombies;
    }
    if (r.outcome == RequestOutcome::ok) r.outcome = RequestOutcome::controller_fatal;
  }
  detail::issue_commands(r, q);
  detail::finish_if_idle(r, q);
}

}  // namespace tutti::local_nvme
