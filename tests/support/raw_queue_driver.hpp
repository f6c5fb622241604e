// Test and benchmark support: NVMe commands driven straight through the warp submission protocol
// (nvme/warp_queue.hpp), without a DataPath, against any controller of the queues (the null
// controller of null_controller.hpp in the GPU suite and the submission-rate benchmark).
// Not library code.
//
// drive_raw_commands: one warp (one host thread in the host profile: a one-lane warp) runs
// `commands_per_warp` 4 KiB Read commands through one queue pair, closed loop, `per_lane` commands
// in flight per lane (a round: every lane allocates its CIDs, nvme::warp_submit puts the warp's
// round into the SQ with ONE reservation and ONE doorbell write per queue pair, then the warp
// reaps with nvme::warp_reap until every lane took its completions or the wait deadline passed).
// A lane that gets no CID, or whose run finds the SQ full, releases what it holds and tries again
// in the next round (counted in `refusals`).
//
// Command c (global index, warp-major) is a Read of one 4 KiB logical block (NLB = 0, LBA format
// of 4096 bytes) at SLBA c, PRP1 = kFakeBusBase + c * 4096 (the null controller moves no data and
// echoes CDW10 in DW0, so each completion is checked to be its own command's).
// Warp-collective; all lanes call it convergently. Host and device code (TUTTI_HOST_DEVICE).
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/warp_queue.hpp>

namespace tutti::test {

inline constexpr std::uint64_t kFakeBusBase = 0x100000000ull;
inline constexpr std::uint32_t kNotRun = 0xffffffffu;
/// Most commands one lane keeps in flight (32 on a one-lane host warp: the same 32 per warp).
inline constexpr std::uint32_t kMaxPerLane = 32;

/// What happened to one command.
struct RawCommandRecord {
  std::uint32_t status;       ///< StatusCode of the wait (OK, TIMEOUT, DEVICE_ERROR); kNotRun if never submitted
  std::uint32_t completions;  ///< completions this command received (must be exactly 1, or 0 after TIMEOUT)
  std::uint32_t echo_ok;      ///< 1 when the CQE's CID is the command's and DW0 echoes its SLBA
  std::uint32_t refusals;     ///< rounds in which it could not be submitted (no CID, SQ full)
  std::uint64_t wait_ns;      ///< accel::timer_ns ns from its submission to its completion or TIMEOUT
  std::uint32_t queue;        ///< index of the queue it went to
  std::uint32_t cid;          ///< its CID
};

/// Settings and outputs of drive_raw_commands (pointers in memory the driving threads reach).
struct RawDriverArgs {
  const nvme::QueuePair* queues = nullptr;  ///< queue_count views
  std::uint32_t queue_count = 1;
  std::uint32_t commands_per_warp = 32;           ///< a multiple of the warp's lanes
  std::uint32_t per_lane = 1;                     ///< commands in flight per lane, 1..kMaxPerLane
  RawCommandRecord* records = nullptr;            ///< warps x commands_per_warp records, or null
  std::uint32_t* warp_queue = nullptr;            ///< per global warp: its queue, or null
  unsigned long long* completed = nullptr;        ///< commands completed OK (one relaxed add per lane)
  unsigned long long* unfinished = nullptr;       ///< commands never run because the budget ran out
  std::uint64_t budget_ns = 5'000'000'000ull;     ///< per warp, whole run
  std::uint64_t wait_budget_ns = 100'000'000ull;  ///< per round's wait
};

/// The queue of warp `warp` (0..warps_per_block-1) of block `block` (0..grid_blocks-1), among
/// `queue_count` (>= 1) queues. While grid_blocks <= queue_count each block owns the disjoint
/// range [block * Q / G, (block + 1) * Q / G) and its warps go round-robin over it, so no two
/// blocks share a queue and every queue has a block. With more blocks than queues, block b uses
/// queue b % Q for all its warps, so each queue serves ceil(G / Q) blocks at most.
TUTTI_HOST_DEVICE constexpr std::uint32_t select_queue(std::uint32_t block, std::uint32_t grid_blocks,
                                                       std::uint32_t warp, std::uint32_t queue_count) noexcept {
  if (queue_count == 0 || grid_blocks == 0) return 0;
  if (grid_blocks > queue_count) return block % queue_count;
  const std::uint64_t first = static_cast<std::uint64_t>(block) * queue_count / grid_blocks;
  const std::uint64_t end = static_cast<std::uint64_t>(block + 1) * queue_count / grid_blocks;
  return static_cast<std::uint32_t>(first + warp % (end - first));
}
static_assert(select_queue(0, 4, 0, 8) == 0 && select_queue(0, 4, 1, 8) == 1 && select_queue(0, 4, 2, 8) == 0);
static_assert(select_queue(3, 4, 1, 8) == 7);
static_assert(select_queue(9, 16, 0, 8) == 1);

/// The queue views as warp_submit / warp_reap take them.
struct QueueOfArray {
  const nvme::QueuePair* queues;
  TUTTI_HOST_DEVICE const nvme::QueuePair& operator()(std::uint32_t i) const noexcept { return queues[i]; }
};

/// Writes Read command `command` with CID `cid` into SQ ticket `ticket` (see the file comment).
TUTTI_HOST_DEVICE inline void write_raw_read(const nvme::QueuePair& q, std::uint64_t ticket, std::uint64_t command,
                                             std::uint16_t cid) noexcept {
  nvme::SubmissionQueueEntry sqe{};
  sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::read);
  sqe.command_identifier = cid;
  sqe.nsid = 1;
  sqe.data_pointer.prp.prp1 = kFakeBusBase + command * 4096;
  sqe.cdw10 = static_cast<std::uint32_t>(command);        // SLBA 31:0
  sqe.cdw11 = static_cast<std::uint32_t>(command >> 32);  // SLBA 63:32
  sqe.cdw12 = 0;                                          // NLB 0's based: one 4 KiB block
  q.write_submission(ticket, sqe);
}

/// Runs warp `global_warp`'s commands through queue `queue` (see the file comment). Lane l owns
/// commands [l x commands_per_lane, (l + 1) x commands_per_lane) of the warp and puts them in
/// chunks of per_lane; lanes advance independently (a refused lane retries while the others go on).
TUTTI_HOST_DEVICE inline void drive_raw_commands(const RawDriverArgs& args, std::uint64_t global_warp,
                                                 std::uint32_t queue) noexcept {
  const std::uint32_t lane = accel::lane_id();
  const std::uint32_t lanes = accel::warp_lanes();
  const QueueOfArray queue_of{args.queues};
  const nvme::QueuePair& q = args.queues[queue];
  const std::uint32_t per_lane = args.per_lane == 0 ? 1 : args.per_lane < kMaxPerLane ? args.per_lane : kMaxPerLane;
  const std::uint32_t commands_per_lane = args.commands_per_warp / lanes;
  const std::uint64_t lane_base =
      global_warp * args.commands_per_warp + static_cast<std::uint64_t>(lane) * commands_per_lane;
  if (lane == 0 && args.warp_queue != nullptr) args.warp_queue[global_warp] = queue;
  const std::uint64_t deadline = accel::deadline_after(args.budget_ns);
  const accel::Backoff::Settings backoff_settings{16, 16, 128, 2000};  // sleeps from 128 ns to 2 us
  std::uint32_t next = 0;                                              // this lane's next command, 0..commands_per_lane
  std::uint32_t refusals = 0;
  unsigned long long completed = 0;
  std::uint16_t cids[kMaxPerLane];
  nvme::CompletionQueueEntry cqes[kMaxPerLane];
  for (;;) {
    const bool pending = next < commands_per_lane;
    if (accel::warp_ballot(pending) == 0) break;
    if (accel::warp_broadcast(accel::timer_ns() >= deadline ? 1u : 0u, 0) != 0) break;  // lane 0's clock decides
    const std::uint32_t chunk =
        pending ? (commands_per_lane - next < per_lane ? commands_per_lane - next : per_lane) : 0;
    std::uint32_t held = 0;
    while (held < chunk && q.allocate_command_identifier(cids[held])) ++held;
    const std::uint64_t first_command = lane_base + next;
    const bool submitted = nvme::warp_submit(queue_of, queue, held == chunk ? chunk : 0, [&](std::uint64_t ticket) {
      for (std::uint32_t k = 0; k < chunk; ++k) write_raw_read(q, ticket + k, first_command + k, cids[k]);
    });
    if (pending && !submitted) {  // no CID or no SQ room: give back what this lane holds, retry
      for (std::uint32_t k = 0; k < held; ++k) (void)q.release_command_identifier(cids[k]);
      ++refusals;
    }
    // Wait (warp-collective reaping) until every submitted command of the warp completed, or the
    // round's deadline: then what is missing is abandoned (a late CQE frees its CID) and TIMEOUT.
    const std::uint64_t submit_time = accel::timer_ns();
    const std::uint64_t wait_deadline = accel::deadline_after(args.wait_budget_ns);
    const std::uint64_t round_deadline = wait_deadline < deadline ? wait_deadline : deadline;
    bool done[kMaxPerLane] = {};
    std::uint32_t remaining = submitted ? chunk : 0;
    accel::Backoff backoff(backoff_settings);
    for (;;) {
      for (std::uint32_t k = 0; k < chunk && remaining != 0; ++k)
        if (!done[k] && q.take_completion(cids[k], cqes[k])) {
          done[k] = true;
          --remaining;
        }
      if (accel::warp_ballot(remaining != 0) == 0) break;
      if (nvme::warp_reap(queue_of, queue, true) != 0) {
        backoff.reset();
        continue;
      }
      if (accel::warp_broadcast(lane == 0 && accel::timer_ns() >= round_deadline ? 1u : 0u, 0) != 0) {
        (void)nvme::warp_reap(queue_of, queue, true);  // last look: a CQE may have landed meanwhile
        for (std::uint32_t k = 0; k < chunk && remaining != 0; ++k) {
          if (done[k]) continue;
          if (q.take_completion(cids[k], cqes[k])) {
            done[k] = true;
            --remaining;
          } else {
            q.abandon(cids[k]);
          }
        }
        break;
      }
      backoff.pause();
    }
    const std::uint64_t waited = accel::timer_ns() - submit_time;
    if (submitted) {
      for (std::uint32_t k = 0; k < chunk; ++k) {
        const std::uint64_t command = first_command + k;
        completed += done[k] ? 1u : 0u;
        if (args.records == nullptr) continue;
        RawCommandRecord& r = args.records[command];
        r.status = static_cast<std::uint32_t>(done[k] ? StatusCode::OK : StatusCode::TIMEOUT);
        r.completions += done[k] ? 1u : 0u;
        r.echo_ok =
            done[k] && cqes[k].command_identifier() == cids[k] && cqes[k].dw0 == static_cast<std::uint32_t>(command);
        r.refusals = refusals;
        r.wait_ns = waited;
        r.queue = queue;
        r.cid = cids[k];
      }
      next += chunk;
      refusals = 0;
    }
  }
  const unsigned long long unfinished = commands_per_lane - next;
  if (args.completed != nullptr && completed != 0)
    accel::DeviceAtomicRef<unsigned long long>(*args.completed).fetch_add(completed, accel::MemoryOrder::relaxed);
  if (args.unfinished != nullptr && unfinished != 0)
    accel::DeviceAtomicRef<unsigned long long>(*args.unfinished).fetch_add(unfinished, accel::MemoryOrder::relaxed);
}

}  // namespace tutti::test
