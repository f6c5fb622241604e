// Warp-cooperative NVMe submission and completion over nvme/queue.hpp, and the choice of queue
// per warp. The building blocks of the GPU submission kernels (CUDA profile); the same code runs
// on host threads as one-lane warps (warp.hpp).
//
//   warp_submit:  each active lane takes a CID; lane 0 reserves the run of SQ slots for all of
//                 them with ONE atomic (reserve_submission_slots); every lane writes its own SQE;
//                 after a warp barrier lane 0 rings the SQ tail doorbell ONCE for the run.
//   warp_wait:    lanes look for their own completion (take_completion); the warp reaps the CQ
//                 by Phase Tag together (warp_reap_completions: lanes read and deliver up to 32
//                 CQEs at once, one CQ head doorbell write per reaped batch); bounded by a
//                 %globaltimer deadline in ns; a lane whose CQE never came gets TIMEOUT and its
//                 CID abandoned.
//   warp_ring_submission_doorbell / warp_reap_completions: generic queue logic, now in
//                 nvme/queue.hpp (names kept here by using-declarations).
//   select_queue: blocks of a grid get disjoint queue sets while there are at least as many
//                 queues as blocks (the reference maps by blockDim and leaves most queues idle).
//
// Spec: NVMe Base Specification 2.0, 3.3.1 (SQ/CQ model), 4.2 (CQE, Phase Tag); NVMe over PCIe
// Transport 1.0, 3.1.2 (doorbells).
//
// Contract of warp_submit and warp_wait: warp-collective (warp.hpp): all 32 lanes call them
// convergently, lanes with nothing to do pass active/waiting = false. No __syncthreads: other
// warps of the block are never waited for. Any number of warps (of any blocks) and host threads
// may use one QueuePair at once: the queue primitives are thread-safe.
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/path/gpu/warp.hpp>

namespace tutti::path::gpu {

using nvme::trailing_ones;
using nvme::warp_reap_completions;
using nvme::warp_ring_submission_doorbell;

/// Outcome of warp_submit for one lane.
struct LaneSubmission {
  StatusCode status = StatusCode::OK;  ///< OK (submitted, or inactive lane), RESOURCE_EXHAUSTED (never ran: resubmit)
  bool submitted = false;              ///< true when the command is in the SQ and announced
  std::uint16_t cid = 0;               ///< the command's CID when submitted
};

/// Polling settings of warp_submit / warp_wait (ns).
struct WarpPollSettings {
  accel::Backoff::Settings backoff{16, 16, 128, 2000};  ///< sleeps from 128 ns, capped at 2 us
};

/// Submits one command per active lane to `queue` (warp-collective). Each active lane passes its
/// SQE without a CID; the CID is allocated here and written into CDW0.
/// Steps: (1) each active lane allocates a CID; a lane that gets none returns RESOURCE_EXHAUSTED
/// at once (it holds nothing and never ran; the caller resubmits it later). (2) lane 0 reserves
/// min(n, depth - 1) consecutive SQ slots for the n lanes that hold a CID with one CAS; while the
/// SQ is full it reaps completions (which advances the SQ head) and backs off, until
/// `deadline_ns` (accel::timer_ns time). (3) lanes write their SQEs into their slots (rank order).
/// (4) warp barrier, then the warp rings the SQ tail doorbell once for the run
/// (warp_ring_submission_doorbell). Steps 2-4 repeat
/// when the run is longer than depth - 1.
/// Errors per lane: RESOURCE_EXHAUSTED when no CID was free, or when the SQ stayed full until the
/// deadline; in the latter case the lane's CID is released (QueuePair::release_command_identifier:
/// its command never reached the SQ).
TUTTI_HOST_DEVICE inline LaneSubmission warp_submit(const nvme::QueuePair& queue, nvme::SubmissionQueueEntry sqe,
                                                    bool active, std::uint64_t deadline_ns,
                                                    const WarpPollSettings& settings = {}) noexcept {
  LaneSubmission result;
  const std::uint32_t lane = lane_id();
  std::uint16_t cid = 0;
  const bool holds_cid = active && queue.allocate_command_identifier(cid);
  if (active && !holds_cid) result.status = StatusCode::RESOURCE_EXHAUSTED;
  const std::uint32_t holders = warp_ballot(holds_cid);
  const std::uint32_t count = popcount32(holders);
  const std::uint32_t rank = popcount32(holders & lanes_below(lane));
  sqe.command_identifier = cid;
  std::uint32_t done = 0;
  while (done < count) {
    const std::uint32_t run = count - done < queue.depth - 1 ? count - done : queue.depth - 1;
    std::uint64_t first_ticket = 0;
    std::uint32_t reserved = 0;
    accel::Backoff backoff(settings.backoff);
    for (;;) {
      std::uint32_t verdict = 0;  // 1: reserved, 2: deadline
      if (lane == 0) {
        if (queue.reserve_submission_slots(run, first_ticket)) verdict = 1;  // ONE atomic for the whole run
        else if (accel::timer_ns() >= deadline_ns) verdict = 2;
      }
      verdict = warp_broadcast(verdict, 0);
      if (verdict != 0) {
        reserved = verdict == 1 ? 1u : 0u;
        break;
      }
      if (warp_reap_completions(queue) != 0) backoff.reset();  // frees SQ slots the controller fetched
      else backoff.pause();
    }
    if (reserved == 0) {  // SQ full until the deadline: the remaining lanes give up
      if (holds_cid && rank >= done) {
        queue.release_command_identifier(cid);
        result.status = StatusCode::RESOURCE_EXHAUSTED;
      }
      return result;
    }
    first_ticket = warp_broadcast(first_ticket, 0);
    if (holds_cid && rank >= done && rank < done + run) {
      queue.write_submission(first_ticket + (rank - done), sqe);
      result.submitted = true;
      result.cid = cid;
    }
    warp_sync();  // every SQE of the run is written (and marked ready) before the doorbell
    warp_ring_submission_doorbell(queue);  // ONE SQ tail doorbell write for the run
    done += run;
  }
  return result;
}

/// Waits (warp-collective) until every lane with `waiting` true has its completion, or until
/// `deadline_ns` (accel::timer_ns time). The warp reaps the CQ (warp_reap_completions); each lane takes its
/// own CID's completion. Per lane: OK with the CQE (whose NVMe status may be an error), TIMEOUT
/// (no CQE by the deadline: the CID is abandoned, so a late CQE is dropped and frees it), or
/// DEVICE_ERROR (CSTS reports Controller Fatal Status or reads all ones). Lanes not waiting get
/// OK with an empty CQE. Deadline decisions are made by lane 0 and broadcast, so the warp leaves
/// together.
TUTTI_HOST_DEVICE inline nvme::WaitResult warp_wait(const nvme::QueuePair& queue, std::uint16_t cid, bool waiting,
                                                    std::uint64_t deadline_ns,
                                                    const WarpPollSettings& settings = {}) noexcept {
  nvme::WaitResult result;
  const std::uint32_t lane = lane_id();
  bool done = !waiting;
  accel::Backoff backoff(settings.backoff);
  for (;;) {
    if (!done && queue.take_completion(cid, result.completion)) done = true;
    if (warp_ballot(!done) == 0) return result;
    if (warp_reap_completions(queue) != 0) {
      backoff.reset();
      continue;
    }
    std::uint32_t verdict = 0;  // 0: keep polling, 2: deadline, 3: controller failed
    if (lane == 0) {
      if (queue.controller_failed()) verdict = 3;
      else if (accel::timer_ns() >= deadline_ns) verdict = 2;
    }
    verdict = warp_broadcast(verdict, 0);
    if (verdict == 2 || verdict == 3) {
      warp_reap_completions(queue);  // last look: a CQE may have landed meanwhile
      if (!done && queue.take_completion(cid, result.completion)) done = true;
      if (!done) {
        queue.abandon(cid);
        result.status = verdict == 2 ? StatusCode::TIMEOUT : StatusCode::DEVICE_ERROR;
      }
      return result;
    }
    backoff.pause();
  }
}

/// The queue of warp `warp` (0..warps_per_block-1) of block `block` (0..grid_blocks-1), among
/// `queue_count` (>= 1) queues. While grid_blocks <= queue_count each block owns the disjoint
/// range [block * Q / G, (block + 1) * Q / G) and its warps go round-robin over it, so no two
/// blocks share a queue and every queue has a block. With more blocks than queues, block b uses
/// queue b % Q for all its warps, so each queue serves ceil(G / Q) blocks at most.
TUTTI_HOST_DEVICE constexpr std::uint32_t select_queue(std::uint32_t block, std::uint32_t grid_blocks, std::uint32_t warp,
                                                       std::uint32_t queue_count) noexcept {
  if (queue_count == 0 || grid_blocks == 0) return 0;
  if (grid_blocks > queue_count) return block % queue_count;
  const std::uint64_t first = static_cast<std::uint64_t>(block) * queue_count / grid_blocks;
  const std::uint64_t end = static_cast<std::uint64_t>(block + 1) * queue_count / grid_blocks;
  return static_cast<std::uint32_t>(first + warp % (end - first));
}
static_assert(select_queue(0, 4, 0, 8) == 0 && select_queue(0, 4, 1, 8) == 1 && select_queue(0, 4, 2, 8) == 0);
static_assert(select_queue(3, 4, 1, 8) == 7);
static_assert(select_queue(9, 16, 0, 8) == 1);

}  // namespace tutti::path::gpu
