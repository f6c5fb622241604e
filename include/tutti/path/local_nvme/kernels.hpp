// The local_nvme DataPath's per-request device work, written as kernel functions over
// tutti/accel/ primitives and the warp submission protocol (tutti/nvme/warp_queue.hpp), so the
// same code runs on host threads (host profile, accel::launch on the HostThreadPool) and on GPU
// threads (CUDA profile, launched by libtutti_cuda: path/local_nvme/launch.hpp; the batch's
// RequestState, CommandRecord and RequestReport arrays then live in device memory, as do the
// registration's page tables, the target handle cache's L1, the table of queue views and, for
// queue pairs only kernels reach, the queue state and credits; the extents' L2 copy and the state
// of queue pairs the host reaches too are in mapped pinned host memory: queues.hpp).
//
// One logical thread owns one request; the queue work is warp-collective (accel/warp.hpp; on the
// host a warp is one lane):
//  - AdmitKernel (the submit kernel): admission_need resolves the request's first LBAs by binary
//    search over the target's extents and counts the commands it needs up to its window (at most
//    the queue's depth - 1: create adapts it); warp_take_credits takes that many credits from its
//    queue, one CAS per queue pair and warp (backpressure: RESOURCE_EXHAUSTED when other requests
//    hold them), and admit_request records the outcome; then warp_issue_commands issues the warp's
//    first commands through nvme::warp_submit (one SQ reservation and one doorbell write per queue
//    pair and warp). The target's change word (device memory: change_words.hpp) is read once, at
//    admission; the first plan, microseconds later in the same thread, does not read it again;
//  - PollKernel (the progress kernel): warp_reap (nvme::warp_reap) reaps the warp's CQs by Phase
//    Tag; poll_request takes the request's completions, sends a command whose status is retryable
//    (nvme::classify, DNR clear) again while it has attempts and time left (may_retry), fails the
//    request on any other error, and marks commands past their deadline as timed out (the host
//    then sends NVMe Abort); warp_issue_commands issues retries and further commands while bytes
//    remain; finish_if_idle marks the request done when nothing of it is in flight.
// Clocks: every deadline is set and compared by the kernels with accel::timer_ns() (on a GPU,
// %globaltimer, which is not the host's clock); the host never writes the kernels' state: it
// reads each request's RequestReport after a kernel, sends the Abort for records marked
// timed_out, and the next poll sets them to abort_sent and starts the abort timer
// (abort_timeout_ns) on the kernels' clock.
// Splitting: a command never crosses an extent boundary, never exceeds max_command_bytes (MDTS,
// NLB 16-bit limit), and its PRPs come from the registration's prebuilt PRP table.
// Units: bytes unless named *_lba; time in ns from accel::timer_ns().
// Thread-safety: one thread per RequestState at a time; queues are shared (queue.hpp rules).
// Warp-collective functions must be called by all 32 lanes convergently (launch whole warps).
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/status.hpp>
#include <tutti/nvme/warp_queue.hpp>
#include <tutti/path/local_nvme/prp_table.hpp>

namespace tutti::local_nvme {

/// Most commands one request keeps in flight at once (its window), and thus credits it holds.
inline constexpr std::uint32_t kMaxWindow = 64;
/// Most SQEs one command is sent as: the first attempt and at most two retries (docs/local-nvme.md,
/// "Retries"). A command completed with a status nvme::classify calls retry (DNR clear) is sent
/// again while it has attempts left and its deadline has not passed.
inline constexpr std::uint32_t kMaxCommandAttempts = 3;

/// The device-resident target handle: what a submitting thread needs of an open file.
struct DeviceTarget {
  const local_file::Extent* extents = nullptr;  ///< sorted, gap-free (bind/local_file.hpp)
  std::uint64_t extent_count = 0;
  std::uint64_t file_size = 0;  ///< bytes
  std::uint32_t lba_size = 0;   ///< bytes: 512 or 4096
  std::uint32_t nsid = 0;       ///< NVMe namespace of the extents' device offsets
  /// The open target's "changed under local_nvme" word (a ChangeWords word: device memory in the
  /// CUDA profile; the host sets it to 1 when the file changed, targets.hpp): once set, no command
  /// of the target is issued. Null: none.
  std::uint32_t* changed = nullptr;
};

/// One queue pair as the kernels see it: the ring view and its credit counter.
struct DeviceQueue {
  nvme::QueuePair queue;             ///< rings, doorbells, CID slots (nvme/queue.hpp)
  std::uint32_t* credits = nullptr;  ///< free command credits (<= depth - 1); nvme::kSubmitterScope atomic
};

/// Per-command bookkeeping inside a request's window.
enum class CommandPhase : std::uint8_t {
  free = 0,        ///< record unused
  in_flight = 1,   ///< SQE submitted, completion pending, deadline = issue time + command timeout
  timed_out = 2,   ///< deadline passed: the host sends an NVMe Abort (Base 2.0, 5.1) before the next poll
  abort_sent = 3,  ///< Abort sent (set by the next poll); deadline = that poll's time + abort timeout
  zombie = 4,      ///< no completion even after Abort: handed to the DataPath's zombie list
  retry = 5,       ///< completed with a retryable status (DNR clear): sent again by the next issue step
};

/// One NVMe command of a request: where it reads or writes, its CID, deadline and attempts. 40
/// bytes, trivially copyable; `max_window` of them per request live in the batch.
struct CommandRecord {
  std::uint64_t deadline_ns = 0;   ///< accel::timer_ns() value after which the command is late (kept across retries)
  std::uint64_t starting_lba = 0;  ///< SLBA (CDW10-11), LBAs of the namespace
  std::uint64_t bytes = 0;         ///< bytes the command transfers (NLB + 1 LBAs; 0 for Flush)
  std::uint64_t file_offset = 0;   ///< file byte the command starts at (for messages)
  std::uint16_t cid = 0;           ///< Command Identifier with generation of the latest attempt (nvme/queue.hpp)
  std::uint8_t attempts = 0;       ///< SQEs sent for this command so far (1..kMaxCommandAttempts)
  CommandPhase phase = CommandPhase::free;
  std::uint16_t last_status = 0;  ///< SCT << 8 | SC of the latest attempt's completion (0 before one)
};
static_assert(sizeof(CommandRecord) == 40);

/// Outcome codes a kernel records (the host turns them into Status messages).
enum class RequestOutcome : std::uint32_t {
  ok = 0,
  rejected_backpressure = 1,     ///< not accepted: queue credits exhausted
  rejected_alignment = 2,        ///< not accepted: offset/length not LBA aligned (and not the tail)
  rejected_memory_room = 3,      ///< not accepted: the tail's whole last LBA does not fit in memory
  nvme_error = 5,                ///< a command completed with an NVMe error status
  timed_out = 6,                 ///< a command missed its deadline (aborted, or zombie)
  controller_fatal = 7,          ///< CSTS.CFS or device gone while commands were in flight
  no_extent = 8,                 ///< an offset maps to no extent (cannot happen for a valid target)
  prp_error = 9,                 ///< the memory range is outside the registration
  rejected_target_changed = 10,  ///< not accepted: the file changed under local_nvme (DeviceTarget::changed)
  target_changed = 11,           ///< the file changed under local_nvme while the request was in flight
};

/// One request's state, shared by the submit and progress kernels and the host.
struct RequestState {
  // --- inputs (host, before the submit kernel)
  nvme::NvmOpcode opcode = nvme::NvmOpcode::read;
  std::uint32_t queue_index = 0;
  DeviceTarget target{};
  PrpTable memory{};
  std::uint64_t memory_offset = 0;      ///< bytes into the DMA mapping (not the user region)
  std::uint64_t memory_room = 0;        ///< bytes from memory_offset to the end of the user region
  std::uint64_t target_offset = 0;      ///< bytes into the file
  std::uint64_t length = 0;             ///< bytes requested
  std::uint64_t max_command_bytes = 0;  ///< MDTS and NLB limit, multiple of lba_size
  std::uint64_t command_timeout_ns = 0;
  std::uint64_t abort_timeout_ns = 0;  ///< after an Abort, how long the command may still complete
  std::uint32_t max_window = 1;        ///< 1..kMaxWindow
  CommandRecord* records = nullptr;    ///< max_window records
  // --- progress (kernels)
  std::uint64_t transfer_length = 0;  ///< length rounded up to the LBA size at the tail
  std::uint64_t issued_bytes = 0;
  std::uint64_t confirmed_bytes = 0;  ///< bytes of successfully completed commands
  std::uint32_t window = 0;           ///< credits held
  std::uint32_t in_flight = 0;
  std::uint32_t commands = 0;         ///< commands issued so far
  std::uint32_t zombies = 0;          ///< commands handed off without a completion
  std::uint32_t retries = 0;          ///< SQEs sent again after a retryable status (kMaxCommandAttempts)
  std::uint32_t pending_retries = 0;  ///< records in phase retry (sent by the next issue step)
  std::uint16_t nvme_status = 0;      ///< SCT << 8 | SC of the first failed command
  bool flush_issued = false;
  bool accepted = false;
  bool done = false;
  RequestOutcome outcome = RequestOutcome::ok;
  std::uint64_t failed_lba = 0;  ///< first failed command's SLBA
  std::uint64_t failed_file_offset = 0;
};

/// What the host needs of a request after each kernel (submit or poll): its outcome so far and
/// whether any of its commands needs host action. The kernels write one per request into device
/// memory; the host copies the batch's reports back with ONE copy per step (accel/async_copy.hpp).
/// 56 bytes, trivially copyable. Units: bytes.
struct RequestReport {
  std::uint64_t transfer_length = 0;     ///< RequestState::transfer_length
  std::uint64_t confirmed_bytes = 0;     ///< RequestState::confirmed_bytes
  std::uint64_t failed_lba = 0;          ///< RequestState::failed_lba
  std::uint64_t failed_file_offset = 0;  ///< RequestState::failed_file_offset
  std::uint32_t commands = 0;            ///< RequestState::commands
  std::uint32_t zombies = 0;             ///< RequestState::zombies
  std::uint32_t retries = 0;             ///< RequestState::retries
  /// Records in phase timed_out (the host sends NVMe Abort) or zombie (the host takes them over):
  /// when non-zero the host copies this request's records back. The next poll kernel takes both
  /// phases as handled (timed_out -> abort_sent, zombie -> free): the host handles every such
  /// record between two kernels of a batch.
  std::uint32_t needs_host = 0;
  RequestOutcome outcome = RequestOutcome::ok;
  std::uint16_t nvme_status = 0;  ///< RequestState::nvme_status
  bool accepted = false;
  bool done = false;
};
static_assert(sizeof(RequestReport) == 56);

namespace detail {

/// Takes each lane's `needed` command credits from its queue pair, all or nothing per lane
/// (warp-collective: every lane calls it convergently; needed 0: nothing to take). Returns true in
/// the lanes whose credits were taken. Lanes naming the same queue pair form a group; the group's
/// leader takes the credits of the longest prefix of its lanes (in lane order) that the queue
/// pair's credits cover, with ONE compare-and-swap, retried only when another warp changed the
/// word meanwhile. Why: with each lane looping on its own CAS, the lanes of a batch that share a
/// queue pair serialise on one word with O(lanes^2) failed CASes. A lane after the prefix is
/// refused (backpressure) even if its smaller need would fit: first come, first served within the
/// warp; a leader whose own need is not covered is refused alone and the group's next lane leads
/// (as warp_submit drops a leader whose count can never fit). Host profile: a warp is one lane,
/// so this is one CAS loop for one request.
TUTTI_HOST_DEVICE inline bool warp_take_credits(const DeviceQueue* queues, std::uint32_t queue_index,
                                                std::uint32_t needed) noexcept {
  const std::uint32_t lane = accel::lane_id();
  bool granted = false;
  std::uint32_t pending = accel::warp_ballot(needed != 0);
  while (pending != 0) {
    const std::uint32_t leader = accel::lowest_lane(pending);
    const std::uint32_t selected = accel::warp_broadcast(queue_index, leader);
    const bool member = ((pending >> lane) & 1u) != 0 && queue_index == selected;
    std::uint32_t settled = accel::warp_ballot(member);                              // the lanes this round decides
    const std::uint32_t inclusive = accel::warp_inclusive_sum(member ? needed : 0);  // monotone over members
    nvme::SubmitterAtomic<std::uint32_t> credits(*queues[selected].credits);  // shared only by the queue's submitters
    std::uint32_t current = 0;
    if (lane == leader) current = credits.load(accel::MemoryOrder::relaxed);
    current = accel::warp_broadcast(current, leader);
    for (;;) {
      const bool fits = member && inclusive <= current;
      const std::uint32_t run = accel::warp_ballot(fits);
      if (run == 0) {  // the leader's own need is not covered: it alone is refused
        settled = 1u << leader;
        break;
      }
      const std::uint32_t take = accel::warp_broadcast(inclusive, accel::highest_lane(run));
      std::uint32_t taken = 0;
      if (lane == leader) {
        std::uint32_t expected = current;
        taken = credits.compare_exchange_strong(expected, current - take, accel::MemoryOrder::acq_rel) ? 1u : 0u;
        current = expected;  // on failure: the value another warp left
      }
      current = accel::warp_broadcast(current, leader);
      if (accel::warp_broadcast(taken, leader) != 0) {
        if (fits) granted = true;  // lanes settled in an earlier round keep their verdict
        break;
      }
    }
    pending &= ~settled;
  }
  return granted;
}
/// Gives n credits back (completed commands, or a zombie whose completion finally arrived).
TUTTI_HOST_DEVICE inline void return_credits(std::uint32_t* credits, std::uint32_t n) noexcept {
  nvme::SubmitterAtomic<std::uint32_t>(*credits).fetch_add(n, accel::MemoryOrder::acq_rel);
}

/// The target's file changed under local_nvme (the host set DeviceTarget::changed): issue nothing
/// more. The word is device memory (change_words.hpp), which the host writes with a copy it waits
/// for: a device-scope load reads it from L2, never from a stale L1 line.
TUTTI_HOST_DEVICE inline bool target_changed(const DeviceTarget& t) noexcept {
  return t.changed != nullptr &&
         accel::DeviceAtomicRef<std::uint32_t>(*t.changed).load(accel::MemoryOrder::relaxed) != 0;
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
  if (bytes > e.length - within) bytes = e.length - within;      // split at the extent boundary
  if (bytes > r.max_command_bytes) bytes = r.max_command_bytes;  // split at MDTS / NLB limit
  slba = (e.device_offset + within) / r.target.lba_size;
  return true;
}

/// The SQE of a read or write piece: `bytes` at file byte `offset` (memory at the same distance
/// from the request's start), SLBA `slba`. Returns false, with r.outcome set, when the memory
/// range lies outside the registration (prp_error).
/// SQEs: Read (NVM Command Set 1.0, 3.2.4) / Write (3.2.6) with SLBA in CDW10-11, NLB 0's based in
/// CDW12 15:0, PRP1/PRP2 (Base 2.0, 4.3.1); Flush (NVM 1.0, 3.2.2; Base 2.0, 7.1) has no data.
TUTTI_HOST_DEVICE inline bool build_sqe(RequestState& r, std::uint64_t offset, std::uint64_t bytes, std::uint64_t slba,
                                        nvme::SubmissionQueueEntry& sqe) noexcept {
  sqe = nvme::SubmissionQueueEntry{};
  sqe.opcode = static_cast<std::uint8_t>(r.opcode);
  sqe.nsid = r.target.nsid;
  if (r.opcode == nvme::NvmOpcode::flush) return true;
  const nvme::PrpBuild prp = r.memory.lookup(r.memory_offset + (offset - r.target_offset), bytes);
  if (prp.status != StatusCode::OK) {
    r.outcome = RequestOutcome::prp_error;
    r.failed_file_offset = offset;
    return false;
  }
  sqe.set_data_pointer_kind(nvme::DataPointerKind::prp);
  sqe.data_pointer.prp.prp1 = prp.prp1;
  sqe.data_pointer.prp.prp2 = prp.prp2;
  sqe.cdw10 = static_cast<std::uint32_t>(slba);
  sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
  sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, static_cast<std::uint32_t>(bytes / r.target.lba_size - 1));
  return true;
}

/// The commands a request can issue now: first every command waiting for a retry (phase retry,
/// its SQE rebuilt from its record), then new pieces, as many as free records and remaining bytes
/// allow. Fills `sqes` (CID not yet set) and `record_of` (the record of each) and returns their
/// count; nothing of the request changes except r.outcome on a planning error (no_extent,
/// prp_error: the commands planned before it are still returned) or when its target changed
/// (target_changed: nothing is planned), and the fields of free records (their phase stays free
/// until commit_commands). Nothing to issue for a request that is done, not accepted or failed.
/// `admitting`: the submit kernel's first plan, microseconds after admission_need read
/// DeviceTarget::changed in the same thread, so the word is not read again.
TUTTI_HOST_DEVICE inline std::uint32_t plan_commands(RequestState& r, nvme::SubmissionQueueEntry* sqes,
                                                     std::uint32_t* record_of, std::uint64_t& planned_bytes,
                                                     bool admitting = false) noexcept {
  planned_bytes = r.issued_bytes;
  if (r.done || !r.accepted || r.outcome != RequestOutcome::ok) return 0;
  std::uint32_t n = 0;
  if (r.pending_retries != 0 && target_changed(r.target)) {
    r.outcome = RequestOutcome::target_changed;  // no retry either: what is in flight drains
    return 0;
  }
  for (std::uint32_t k = 0; k < r.window && r.pending_retries != 0; ++k) {
    CommandRecord& rec = r.records[k];
    if (rec.phase != CommandPhase::retry) continue;
    if (!build_sqe(r, rec.file_offset, rec.bytes, rec.starting_lba, sqes[n])) return n;
    record_of[n++] = k;
  }
  std::uint64_t planned = r.issued_bytes;
  const bool is_flush = r.opcode == nvme::NvmOpcode::flush;
  for (std::uint32_t k = 0; k < r.window && n < kMaxWindow; ++k) {
    if (r.records[k].phase != CommandPhase::free) continue;
    if (is_flush ? r.flush_issued || n > 0 : planned >= r.transfer_length) break;
    // Read only when there is a command to plan: one dependent load less on the submit kernel's
    // path (when the word was mapped host memory, leaving this read out of the first plan took a
    // 1024-request kernel from 98-105 to 68 us on the H200: docs/benchmarks.md, "Where submit's
    // time goes").
    if (n == 0 && !admitting && target_changed(r.target)) {
      r.outcome = RequestOutcome::target_changed;  // what is in flight drains; finish_if_idle ends the request
      return 0;
    }
    CommandRecord& rec = r.records[k];
    rec = CommandRecord{};
    std::uint64_t bytes = 0, slba = 0;
    const std::uint64_t offset = r.target_offset + planned;
    if (!is_flush && !split_at(r, offset, r.transfer_length - planned, bytes, slba)) {
      r.outcome = RequestOutcome::no_extent;
      r.failed_file_offset = offset;
      break;
    }
    if (!build_sqe(r, offset, bytes, slba, sqes[n])) break;
    rec.starting_lba = slba;
    rec.bytes = bytes;
    rec.file_offset = is_flush ? 0 : offset;
    planned += bytes;
    record_of[n++] = k;
  }
  planned_bytes = planned;
  return n;
}

/// Puts n planned commands into the SQ slots [ticket, ticket + n) reserved for them: a CID each,
/// the SQE written (its slot's ready word set), the record in flight. A new command's deadline
/// starts now; a retried one keeps its first attempt's deadline. The caller rings the SQ tail
/// doorbell afterwards.
TUTTI_HOST_DEVICE inline void commit_commands(RequestState& r, const DeviceQueue& q, nvme::SubmissionQueueEntry* sqes,
                                              const std::uint32_t* record_of, std::uint32_t n, std::uint64_t ticket,
                                              std::uint64_t planned_bytes) noexcept {
  const std::uint64_t now = accel::timer_ns();
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint16_t cid = 0;
    // Cannot fail: cid_capacity == depth > credits held by all requests of the queue.
    (void)q.queue.allocate_command_identifier(cid);
    sqes[i].command_identifier = cid;
    CommandRecord& rec = r.records[record_of[i]];
    if (rec.phase == CommandPhase::retry) {
      --r.pending_retries;
      ++r.retries;
    } else {
      rec.deadline_ns = now + r.command_timeout_ns;
      ++r.commands;
    }
    rec.cid = cid;
    ++rec.attempts;
    rec.phase = CommandPhase::in_flight;
    q.queue.write_submission(ticket + i, sqes[i]);
  }
  r.in_flight += n;
  r.issued_bytes = planned_bytes;
  if (r.opcode == nvme::NvmOpcode::flush) r.flush_issued = true;
}

/// The kernels' view of queue pair i, for the warp protocol (nvme/warp_queue.hpp).
struct QueueOfDeviceQueues {
  const DeviceQueue* queues;
  TUTTI_HOST_DEVICE const nvme::QueuePair& operator()(std::uint32_t i) const noexcept { return queues[i].queue; }
};

/// Issues what plan_commands allows through the one warp submission protocol (nvme::warp_submit;
/// warp-collective: every lane of the warp calls it convergently, with its request or nullptr):
/// lanes whose requests use the same queue pair share ONE SQ reservation and ONE SQ tail doorbell
/// write; each lane's commands get their CIDs and SQEs at its prefix-sum offset (commit_commands).
/// When the SQ lacks room for the run (credits make this rare: they bound the commands of every
/// request on a queue pair by depth - 1), the lanes issue nothing now and the next poll plans
/// again. Host profile: a warp is one lane, so this is reserve, write, ring for one request.
/// `admitting`: as plan_commands' (the submit kernel's first issue step).
TUTTI_HOST_DEVICE inline void warp_issue_commands(RequestState* r, const DeviceQueue* queues,
                                                  bool admitting = false) noexcept {
  nvme::SubmissionQueueEntry sqes[kMaxWindow];
  std::uint32_t record_of[kMaxWindow];
  std::uint64_t planned_bytes = 0;
  const std::uint32_t n = r != nullptr ? plan_commands(*r, sqes, record_of, planned_bytes, admitting) : 0;
  const std::uint32_t queue_index = r != nullptr ? r->queue_index : 0;
  nvme::warp_submit(QueueOfDeviceQueues{queues}, queue_index, n, [&](std::uint64_t first_ticket) {
    commit_commands(*r, queues[queue_index], sqes, record_of, n, first_ticket, planned_bytes);
  });
}

/// Marks the request done when nothing of it is in flight and it issued everything (or failed),
/// returning its credits except those of zombie commands. A failed request drops the retries it
/// has not sent (it issues nothing more).
TUTTI_HOST_DEVICE inline void finish_if_idle(RequestState& r, const DeviceQueue& q) noexcept {
  if (r.in_flight != 0 || r.done) return;
  if (r.outcome == RequestOutcome::ok) {
    const bool all_issued = r.opcode == nvme::NvmOpcode::flush ? r.flush_issued : r.issued_bytes >= r.transfer_length;
    if (!all_issued || r.pending_retries != 0) return;
  } else if (r.pending_retries != 0) {
    for (std::uint32_t k = 0; k < r.window; ++k)
      if (r.records[k].phase == CommandPhase::retry) r.records[k].phase = CommandPhase::free;
    r.pending_retries = 0;
  }
  // Zombie commands keep their credit until their completion arrives (the DataPath returns it).
  return_credits(q.credits, r.window - r.zombies);
  r.window = 0;
  r.done = true;
}

}  // namespace detail

/// The submit kernel's per-request checks (thread = request): the file did not change, the
/// range is LBA aligned and fits its memory. Returns the command credits the request needs (its
/// window: the commands it needs, counted up to max_window), or 0 when it is refused (an outcome
/// rejected_* set, done). admit_request then records what warp_take_credits granted.
TUTTI_HOST_DEVICE inline std::uint32_t admission_need(RequestState& r) noexcept {
  // The batch's records come from a reused pool slot: every record starts free here.
  for (std::uint32_t k = 0; k < r.max_window; ++k) r.records[k] = CommandRecord{};
  const auto refuse = [&](RequestOutcome why) {
    r.outcome = why;
    r.done = true;
    return 0u;
  };
  if (detail::target_changed(r.target)) return refuse(RequestOutcome::rejected_target_changed);
  const std::uint64_t lba = r.target.lba_size;
  if (r.opcode != nvme::NvmOpcode::flush) {
    const bool tail = r.target_offset + r.length == r.target.file_size;
    if (r.target_offset % lba != 0 || (r.length % lba != 0 && !tail)) return refuse(RequestOutcome::rejected_alignment);
    r.transfer_length = (r.length + lba - 1) / lba * lba;
    if (r.transfer_length > r.memory_room) return refuse(RequestOutcome::rejected_memory_room);
  }
  // Commands needed, counted up to the window (extent walk by binary search).
  if (r.opcode == nvme::NvmOpcode::flush) return 1;
  std::uint32_t needed = 0;
  for (std::uint64_t planned = 0; planned < r.transfer_length && needed < r.max_window; ++needed) {
    std::uint64_t bytes = 0, slba = 0;
    if (!detail::split_at(r, r.target_offset + planned, r.transfer_length - planned, bytes, slba)) break;
    planned += bytes;
  }
  return needed == 0 ? 1 : needed;
}

/// Records the admission of a request whose admission_need was `needed` (> 0): accepted with a
/// window of `needed` commands when its credits were `granted`, else refused (backpressure).
TUTTI_HOST_DEVICE inline void admit_request(RequestState& r, std::uint32_t needed, bool granted) noexcept {
  if (!granted) {
    r.outcome = RequestOutcome::rejected_backpressure;
    r.done = true;
    return;
  }
  r.window = needed;
  r.accepted = true;
}

/// Whether a command that completed with `status` is sent again (NVMe Base 2.0, 4.2.3 "Status
/// Field": a status with DNR clear may succeed if the same command is resubmitted): nvme::classify
/// says retry (a transient status, DNR clear), the command was not aborted by us (an Abort's
/// answer ends it), it has attempts left (kMaxCommandAttempts in all) and its deadline (first
/// attempt + command_timeout_ns) has not passed, and the request has not failed. CRD (Command
/// Retry Delay) is always 00b here: the host never enables Advanced Command Retry (Host Behavior
/// Support, Base 2.0, 5.27.1.18), so the retry goes out at once.
TUTTI_HOST_DEVICE inline bool may_retry(const RequestState& r, const CommandRecord& rec, nvme::StatusField status,
                                        std::uint64_t now) noexcept {
  return nvme::classify(status) == nvme::StatusDisposition::retry && rec.phase == CommandPhase::in_flight &&
         rec.attempts < kMaxCommandAttempts && now < rec.deadline_ns && r.outcome == RequestOutcome::ok;
}

/// The progress kernel's per-request step, after the warp reaped the CQ: takes this request's
/// completions, marks commands past their deadline. `now` from accel::timer_ns() on the side the
/// kernel runs (the clock the deadlines were set with). `check_controller`: also read CSTS (an
/// uncached MMIO read on a PCIe drive) to fail the request if the controller stopped; callers
/// polling in a loop pass it only once the loop backs off to sleeping and on its last pass.
/// Further commands are issued by warp_issue_commands after it.
TUTTI_HOST_DEVICE inline void poll_request(RequestState& r, const DeviceQueue& q, std::uint64_t now,
                                           bool check_controller = true) noexcept {
  if (!r.accepted) return;
  // The host handled every timed_out and zombie record it saw after the previous kernel (it sent
  // the Abort, it took the zombie over): the abort timer starts below (deadline 0), the record of
  // a zombie is free again.
  for (std::uint32_t k = 0; k < r.max_window; ++k) {
    CommandRecord& rec = r.records[k];
    if (rec.phase == CommandPhase::timed_out) {
      rec.phase = CommandPhase::abort_sent;
      rec.deadline_ns = 0;
    } else if (rec.phase == CommandPhase::zombie) {
      rec.phase = CommandPhase::free;
    }
  }
  if (r.done) return;
  for (std::uint32_t k = 0; k < r.window; ++k) {
    CommandRecord& rec = r.records[k];
    if (rec.phase == CommandPhase::free || rec.phase == CommandPhase::zombie) continue;
    if (rec.phase == CommandPhase::retry) {
      // Waiting to be sent again (the SQ had no room in the last issue step). Past its deadline it
      // fails with the status that asked for the retry: a retry never outlives the deadline.
      if (now >= rec.deadline_ns) {
        rec.phase = CommandPhase::free;
        --r.pending_retries;
        if (r.outcome == RequestOutcome::ok) {
          r.outcome = RequestOutcome::nvme_error;
          r.nvme_status = rec.last_status;
          r.failed_lba = rec.starting_lba;
          r.failed_file_offset = rec.file_offset;
        }
      }
      continue;
    }
    nvme::CompletionQueueEntry cqe{};
    if (q.queue.take_completion(rec.cid, cqe)) {
      const nvme::StatusField status = cqe.status();
      rec.last_status = static_cast<std::uint16_t>(status.status_code_type() << 8 | status.status_code());
      --r.in_flight;
      if (status.success()) {
        r.confirmed_bytes += rec.bytes;
      } else if (may_retry(r, rec, status, now)) {
        rec.phase = CommandPhase::retry;  // the issue step of this pass sends it again
        ++r.pending_retries;
        continue;
      } else if (r.outcome == RequestOutcome::ok) {
        r.outcome = rec.phase == CommandPhase::abort_sent ? RequestOutcome::timed_out : RequestOutcome::nvme_error;
        r.nvme_status = rec.last_status;
        r.failed_lba = rec.starting_lba;
        r.failed_file_offset = rec.file_offset;
      }
      rec.phase = CommandPhase::free;
      continue;
    }
    if (rec.phase == CommandPhase::in_flight && now >= rec.deadline_ns) {
      rec.phase = CommandPhase::timed_out;  // the host sends the Abort
    } else if (rec.phase == CommandPhase::abort_sent && rec.deadline_ns == 0) {
      rec.deadline_ns = now + r.abort_timeout_ns;  // the abort timer starts on the kernels' clock
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
  if (check_controller && r.in_flight != 0 && q.queue.controller_failed()) {
    // The controller stopped: nothing will complete. Every command becomes a zombie (its memory
    // stays mapped until the queue is deleted) and the request fails.
    for (std::uint32_t k = 0; k < r.window; ++k) {
      CommandRecord& rec = r.records[k];
      if (rec.phase == CommandPhase::free || rec.phase == CommandPhase::zombie || rec.phase == CommandPhase::retry)
        continue;
      rec.phase = CommandPhase::zombie;
      --r.in_flight;
      ++r.zombies;
    }
    if (r.outcome == RequestOutcome::ok) r.outcome = RequestOutcome::controller_fatal;
  }
}

/// Records of the request the host must act on before the kernels may touch them again: timed_out
/// (the host sends the Abort) and zombie (the host takes it over). 0 for a request not accepted.
TUTTI_HOST_DEVICE inline std::uint32_t records_needing_host(const RequestState& r) noexcept {
  std::uint32_t count = 0;
  if (r.accepted)
    for (std::uint32_t k = 0; k < r.max_window; ++k)
      if (r.records[k].phase == CommandPhase::timed_out || r.records[k].phase == CommandPhase::zombie) ++count;
  return count;
}

/// The request's report for the host (see RequestReport).
TUTTI_HOST_DEVICE inline void write_report(const RequestState& r, RequestReport& out) noexcept {
  RequestReport report;
  report.transfer_length = r.transfer_length;
  report.confirmed_bytes = r.confirmed_bytes;
  report.failed_lba = r.failed_lba;
  report.failed_file_offset = r.failed_file_offset;
  report.commands = r.commands;
  report.zombies = r.zombies;
  report.retries = r.retries;
  report.needs_host = records_needing_host(r);
  report.outcome = r.outcome;
  report.nvme_status = r.nvme_status;
  report.accepted = r.accepted;
  report.done = r.done;
  out = report;
}

/// Reaps the CQs of the warp's requests (warp-collective; `r` null for lanes without a pending
/// request): nvme::warp_reap, lanes grouped by queue pair, ONE CQ head doorbell write per reaped
/// batch.
TUTTI_HOST_DEVICE inline void warp_reap(const RequestState* r, const DeviceQueue* queues) noexcept {
  const bool waiting = r != nullptr && r->accepted && !r->done;
  (void)nvme::warp_reap(detail::QueueOfDeviceQueues{queues}, waiting ? r->queue_index : 0, waiting);
}

/// The kernel-wide time at which PollKernel's polling stops: the first warp to arrive sets it to
/// its clock + budget_ns (compare-and-swap from 0 on `stop_word`, which the host zeroes before
/// each launch); the others read it. Lane 0 does it, every lane gets the value (collective). A
/// kernel-wide stop bounds the whole launch by budget_ns plus one pass per wave of blocks, even
/// when blocks cannot all be resident at once (or run one after another: the host profile).
TUTTI_HOST_DEVICE inline std::uint64_t warp_poll_stop(std::uint64_t* stop_word, std::uint64_t budget_ns) noexcept {
  std::uint64_t stop = 0;
  if (accel::lane_id() == 0) {
    accel::DeviceAtomicRef<std::uint64_t> word(*stop_word);
    stop = word.load(accel::MemoryOrder::relaxed);
    if (stop == 0) {
      const std::uint64_t mine = accel::deadline_after(budget_ns);
      std::uint64_t expected = 0;
      stop = word.compare_exchange_strong(expected, mine, accel::MemoryOrder::relaxed) ? mine : expected;
    }
  }
  return accel::warp_broadcast(stop, 0);
}

namespace detail {
/// The polling of PollKernel, and of AdmitKernel given a budget (warp-collective; `r` null for
/// lanes without a request): the warp polls its requests in passes (reap its CQs, poll_request with
/// the clock read where it runs, issue further commands, finish idle requests) until none of them
/// is waiting, or one needs the host (a record timed_out or zombie: the Abort and the zombie
/// hand-off are the host's), or the kernel-wide stop time (warp_poll_stop) has passed.
/// stop_at_first_done and budget_ns as PollKernel's fields (budget_ns = 0: one pass).
TUTTI_HOST_DEVICE inline void warp_poll_requests(RequestState* r, const DeviceQueue* queues, std::uint64_t* stop_word,
                                                 std::uint64_t budget_ns, bool stop_at_first_done) noexcept {
  std::uint64_t stop = budget_ns == 0 ? 0 : warp_poll_stop(stop_word, budget_ns);
  const bool waiting_at_launch = r != nullptr && r->accepted && !r->done;
  accel::Backoff backoff(
      accel::Backoff::Settings{.spin_steps = 4, .yield_steps = 4, .first_sleep_ns = 256, .max_sleep_ns = 8192});
  for (;;) {
    warp_reap(r, queues);
    const std::uint64_t now = accel::timer_ns();
    // CSTS (uncached MMIO on a PCIe drive) is read only once the loop sleeps between passes
    // (after 8 passes) and when the stop time has passed; a one-pass kernel reads it every time.
    const bool check_controller = budget_ns == 0 || backoff.sleeping() || now >= stop;
    if (r != nullptr) poll_request(*r, queues[r->queue_index], now, check_controller);
    detail::warp_issue_commands(r, queues);
    if (r != nullptr) detail::finish_if_idle(*r, queues[r->queue_index]);
    const bool host = r != nullptr && records_needing_host(*r) != 0;
    const bool waiting = r != nullptr && r->accepted && !r->done;
    // A request of this warp finished in this pass: with stop_at_first_done it ends every warp's
    // polling (the stop word becomes 1, a time long past), also when this warp leaves because it has
    // nothing left to wait for. The condition before the ballot is the same in every lane.
    const bool first_done =
        stop_at_first_done && budget_ns != 0 && accel::warp_ballot(waiting_at_launch && !waiting) != 0;
    if (first_done && accel::lane_id() == 0)
      accel::DeviceAtomicRef<std::uint64_t>(*stop_word).store(1, accel::MemoryOrder::relaxed);
    if (first_done || accel::warp_ballot(waiting) == 0 || accel::warp_ballot(host) != 0 ||
        accel::warp_ballot(now >= stop) != 0)
      break;
    if (stop_at_first_done && budget_ns != 0) {
      std::uint64_t seen = 0;  // another warp's first completion ends this warp's polling too
      if (accel::lane_id() == 0)
        seen = accel::DeviceAtomicRef<std::uint64_t>(*stop_word).load(accel::MemoryOrder::relaxed);
      stop = accel::warp_broadcast(seen, 0);
      if (now >= stop) break;
    }
    backoff.pause();
  }
}
}  // namespace detail

/// The submit kernel: logical thread i admits request i of `requests` (count entries) on
/// queues[requests[i].queue_index] and writes reports[i]. Trivially copyable (passed by value to
/// the GPU); every pointer must be reachable by the threads that run it: `requests`, their
/// records and `reports` in device memory (accel::allocate_device), `queues` and what they point
/// to in accel::kKernelReachable memory. Every lane of a warp runs the warp-collective steps,
/// also lanes past `count` (with no request). With poll_budget_ns != 0 (Options::
/// submit_poll_budget_ns) each warp then polls its requests as PollKernel does
/// (detail::warp_poll_requests, until done, needing the host, or the kernel-wide stop time), so a
/// batch that completes within the budget comes back done from submit and progress launches
/// nothing: one launch and one host round trip per batch instead of two.
struct AdmitKernel {
  RequestState* requests = nullptr;
  const DeviceQueue* queues = nullptr;
  std::uint64_t count = 0;
  RequestReport* reports = nullptr;  ///< count entries
  std::uint64_t* stop_word =
      nullptr;                       ///< with poll_budget_ns: as PollKernel's (device memory, zeroed before the launch)
  std::uint64_t poll_budget_ns = 0;  ///< how long the warps poll after admission, ns (0: they do not)
  TUTTI_HOST_DEVICE void operator()(accel::ThreadIndex t) const noexcept {
    const std::uint64_t i = t.global();
    RequestState* r = i < count ? &requests[i] : nullptr;
    const std::uint32_t needed = r != nullptr ? admission_need(*r) : 0;
    const bool granted = detail::warp_take_credits(queues, r != nullptr ? r->queue_index : 0, needed);
    if (needed != 0) admit_request(*r, needed, granted);
    detail::warp_issue_commands(r, queues, /*admitting=*/true);
    if (r != nullptr) detail::finish_if_idle(*r, queues[r->queue_index]);
    if (poll_budget_ns != 0) detail::warp_poll_requests(r, queues, stop_word, poll_budget_ns, false);
    if (r != nullptr) write_report(*r, reports[i]);
  }
};

/// The progress kernel. Each warp polls its requests (detail::warp_poll_requests) and then writes
/// the reports. With stop_at_first_done (ProgressUntil::SOME), a warp in which a request
/// that was waiting at launch is now done stops, and sets the stop word to 1 (a time that has
/// passed), which the other warps read on every pass: the kernel returns about one pass after the
/// first completion instead of polling on for its budget. budget_ns = 0: one pass, no stop word
/// read. Between passes the warp backs
/// off with accel::Backoff (__nanosleep on a GPU). Every loop condition is a warp ballot, so the
/// lanes stay convergent for the warp-collective steps. Same memory rules as AdmitKernel;
/// `stop_word` in device memory (8 bytes, zeroed by the host before each launch with a budget).
struct PollKernel {
  RequestState* requests = nullptr;
  const DeviceQueue* queues = nullptr;
  std::uint64_t count = 0;
  RequestReport* reports = nullptr;  ///< count entries
  std::uint64_t* stop_word = nullptr;
  std::uint64_t budget_ns = 0;      ///< how long the kernel may poll, ns on the kernels' clock
  bool stop_at_first_done = false;  ///< end every warp's polling once one request completes
  TUTTI_HOST_DEVICE void operator()(accel::ThreadIndex t) const noexcept {
    const std::uint64_t i = t.global();
    RequestState* r = i < count ? &requests[i] : nullptr;
    detail::warp_poll_requests(r, queues, stop_word, budget_ns, stop_at_first_done);
    if (r != nullptr) write_report(*r, reports[i]);
  }
};

}  // namespace tutti::local_nvme
