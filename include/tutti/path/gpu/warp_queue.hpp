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
//   warp_ring_submission_doorbell / warp_reap_completions: the protocols of
//                 QueuePair::ring_submission_doorbell / reap_completions (same locks, same state,
//                 same statistics, interoperable with threads using those), with the per-entry
//                 scan done by 32 lanes at once and ONE memory fence per batch instead of one or
//                 more system-scope release/acquire operations per entry. Measured on an H200,
//                 the per-entry serial path of queue.hpp costs about 3 us per CQE (each
//                 system-scope release is a MEMBAR.SYS): see docs/gpu.md. These belong in
//                 nvme/queue.hpp; they live here until its owner takes them.
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

/// Number of consecutive set bits of `bits` from bit 0 (32 when all are set).
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE constexpr std::uint32_t trailing_ones(std::uint32_t bits) noexcept {
  std::uint32_t count = 0;
  while (count < 32 && (bits >> count & 1u) != 0) ++count;
  return count;
}

/// Announces every ready SQ entry after the last announced one with ONE SQ tail doorbell write
/// (warp-collective; the protocol of QueuePair::ring_submission_doorbell, whose comment proves
/// that no entry is stranded: the same seq_cst lock, unlock and re-check are kept). Lanes read
/// 32 ready words at once with relaxed loads; the system fence inside mmio_store32 (fence.sc.sys)
/// orders the SQE bytes those words publish before the doorbell store. Returns the entries
/// announced (same value in every lane; 0 when another thread holds the doorbell lock: that
/// thread announces ours). Terminates: every pass that continues announced at least one entry.
TUTTI_HOST_DEVICE inline std::uint32_t warp_ring_submission_doorbell(const nvme::QueuePair& queue) noexcept {
  const std::uint32_t lane = lane_id();
  const std::uint32_t lanes = warp_lanes();
  nvme::QueueAtomic<std::uint32_t> lock(queue.state->sq_doorbell_lock);
  nvme::QueueAtomic<std::uint64_t> announced_ticket(queue.state->sq_doorbell_ticket);
  std::uint32_t announced = 0;
  for (;;) {
    std::uint32_t locked = 0;
    if (lane == 0) {
      std::uint32_t expected = 0;
      locked = lock.compare_exchange_strong(expected, 1, accel::MemoryOrder::seq_cst) ? 1u : 0u;
    }
    if (warp_broadcast(locked, 0) == 0) return announced;
    std::uint64_t start = 0;
    if (lane == 0) start = announced_ticket.load(accel::MemoryOrder::relaxed);
    start = warp_broadcast(start, 0);
    std::uint64_t end = start;
    for (;;) {
      const std::uint64_t room = queue.depth - 1 - (end - start);
      const std::uint64_t window = room < lanes ? room : lanes;
      if (window == 0) break;
      const std::uint64_t ticket = end + lane;
      const bool ready = lane < window &&
          nvme::QueueAtomic<std::uint64_t>(queue.sq_ready[ticket % queue.depth]).load(accel::MemoryOrder::relaxed) == ticket + 1;
      const std::uint32_t run = trailing_ones(warp_ballot(ready));
      end += run < window ? run : window;
      if (run < window) break;
    }
    if (lane == 0) {
      if (end != start) {
        announced_ticket.store(end, accel::MemoryOrder::relaxed);
        accel::mmio_store32(queue.sq_tail_doorbell, static_cast<std::uint32_t>(end % queue.depth));  // one write for the run
        nvme::QueueAtomic<std::uint64_t>(queue.state->doorbell_writes).fetch_add(1, accel::MemoryOrder::relaxed);
      }
      lock.store(0, accel::MemoryOrder::seq_cst);
    }
    announced += static_cast<std::uint32_t>(end - start);
    std::uint32_t again = 0;
    if (lane == 0)
      again = nvme::QueueAtomic<std::uint64_t>(queue.sq_ready[end % queue.depth]).load(accel::MemoryOrder::seq_cst) == end + 1;
    if (warp_broadcast(again, 0) == 0) return announced;
  }
}

/// Consumes up to `max_entries` new CQEs if lane 0 wins the CQ try-lock (else returns 0), with
/// the 32 lanes reading 32 CQEs at once (warp-collective; the protocol of
/// QueuePair::reap_completions). Per batch: lanes load dword 3 of consecutive CQ slots (relaxed)
/// and compare the Phase Tag with the one expected for that slot's pass; the leading run of
/// matches is the batch; ONE acquire fence (system scope) orders the reads of dwords 0-2 after
/// it; each lane delivers its CQE to its command slot by CID and generation (completion bytes,
/// then ONE release fence for the batch, then a relaxed CAS in_flight -> completed), stale and
/// abandoned CIDs handled as QueuePair::deliver does; the SQ head ticket is advanced from the
/// newest CQE of the batch (SQ Head Pointers only grow in CQ order); lane 0 writes the CQ head
/// doorbell once for everything reaped. Returns the CQEs consumed (same value in every lane).
TUTTI_HOST_DEVICE inline std::uint32_t warp_reap_completions(const nvme::QueuePair& queue,
                                                              std::uint32_t max_entries = 0xffffffffu) noexcept {
  using accel::MemoryOrder;
  const std::uint32_t lane = lane_id();
  const std::uint32_t lanes = warp_lanes();
  nvme::QueuePairState& state = *queue.state;
  std::uint32_t locked = 0, head = 0, phase = 0;
  if (lane == 0) {
    std::uint32_t expected = 0;
    if (nvme::QueueAtomic<std::uint32_t>(state.cq_lock).compare_exchange_strong(expected, 1, MemoryOrder::acquire)) {
      locked = 1;
      head = state.cq_head;
      phase = state.cq_phase;
    }
  }
  if (warp_broadcast(locked, 0) == 0) return 0;
  head = warp_broadcast(head, 0);
  phase = warp_broadcast(phase, 0);
  std::uint32_t consumed = 0;
  while (consumed < max_entries) {
    std::uint32_t window = queue.depth - 1 < lanes ? queue.depth - 1 : lanes;
    if (max_entries - consumed < window) window = max_entries - consumed;
    const std::uint32_t position = head + lane;  // < 2 * depth
    const std::uint32_t slot = position < queue.depth ? position : position - queue.depth;
    const std::uint32_t expected_phase = position < queue.depth ? phase : phase ^ 1u;  // the tag inverts each pass
    nvme::CompletionQueueEntry entry{};
    bool valid = false;
    if (lane < window) {
      entry.dw3 = nvme::QueueAtomic<std::uint32_t>(queue.cq[slot].dw3).load(MemoryOrder::relaxed);
      valid = entry.status().phase() == expected_phase;
    }
    const std::uint32_t run = trailing_ones(warp_ballot(valid));
    const std::uint32_t count = run < window ? run : window;
    if (count == 0) break;
    // Acquire: dwords 0-2 of every CQE of the batch were written before its dword 3.
    accel::fence(accel::ThreadScope::system, MemoryOrder::acquire);
    const bool mine = lane < count;
    bool publish = false;
    std::uint32_t index = 0, generation = 0;
    if (mine) {
      const nvme::CompletionQueueEntry& source = queue.cq[slot];
      entry.dw0 = source.dw0;
      entry.dw1 = source.dw1;
      entry.sq_head = source.sq_head;
      entry.sq_identifier = source.sq_identifier;
      const bool sq_fields_ok = entry.sq_identifier == queue.qid && entry.sq_head < queue.depth;
      if (!sq_fields_ok)
        nvme::QueueAtomic<std::uint64_t>(state.invalid_completions).fetch_add(1, MemoryOrder::relaxed);
      if (lane == count - 1 && sq_fields_ok) {  // newest CQE: advance the SQ head ticket
        nvme::QueueAtomic<std::uint64_t> sq_head(state.sq_head_ticket);
        const std::uint64_t old_head = sq_head.load(MemoryOrder::relaxed);
        const std::uint64_t advance = (entry.sq_head + queue.depth - old_head % queue.depth) % queue.depth;
        const std::uint64_t announced =
            nvme::QueueAtomic<std::uint64_t>(state.sq_doorbell_ticket).load(MemoryOrder::relaxed);
        if (old_head + advance <= announced) sq_head.store(old_head + advance, MemoryOrder::relaxed);
        else nvme::QueueAtomic<std::uint64_t>(state.invalid_completions).fetch_add(1, MemoryOrder::relaxed);
      }
      const std::uint16_t cid = entry.command_identifier();
      index = queue.cid_index(cid);
      generation = queue.cid_generation(cid);
      if (index >= queue.cid_capacity) {
        nvme::QueueAtomic<std::uint64_t>(state.stale_completions).fetch_add(1, MemoryOrder::relaxed);
      } else {
        const std::uint32_t current = nvme::QueueAtomic<std::uint32_t>(queue.slots[index].state).load(MemoryOrder::relaxed);
        if (current == nvme::QueuePair::encode_state(generation, nvme::CommandState::in_flight)) {
          queue.slots[index].completion = entry;
          publish = true;
        } else if (current == nvme::QueuePair::encode_state(generation, nvme::CommandState::abandoned)) {
          publish = true;  // the CAS below fails and frees the CID
        } else {
          nvme::QueueAtomic<std::uint64_t>(state.stale_completions).fetch_add(1, MemoryOrder::relaxed);
        }
      }
    }
    // Release, once for the batch: completion bytes (and the SQ head ticket, whose reuse of SQ
    // slots the controller's CQE allowed) before the state words the waiters acquire.
    accel::fence(accel::ThreadScope::system, MemoryOrder::release);
    if (publish) {
      nvme::QueueAtomic<std::uint32_t> slot_state(queue.slots[index].state);
      std::uint32_t expected = nvme::QueuePair::encode_state(generation, nvme::CommandState::in_flight);
      if (!slot_state.compare_exchange_strong(expected, nvme::QueuePair::encode_state(generation, nvme::CommandState::completed),
                                              MemoryOrder::relaxed)) {
        if (expected == nvme::QueuePair::encode_state(generation, nvme::CommandState::abandoned)) {
          // The waiter gave up: free the CID (state first, keeping the generation, then the bitmap bit).
          nvme::QueueAtomic<std::uint64_t>(state.abandoned_completions).fetch_add(1, MemoryOrder::relaxed);
          slot_state.store(nvme::QueuePair::encode_state(generation, nvme::CommandState::free), MemoryOrder::release);
          nvme::QueueAtomic<std::uint32_t>(queue.cid_bitmap[index / 32]).fetch_and(~(1u << (index % 32)), MemoryOrder::release);
        } else {
          nvme::QueueAtomic<std::uint64_t>(state.stale_completions).fetch_add(1, MemoryOrder::relaxed);
        }
      }
    }
    consumed += count;
    head += count;
    if (head >= queue.depth) {
      head -= queue.depth;
      phase ^= 1u;
    }
    if (count < window) break;
  }
  warp_sync();  // every lane has read its CQEs before the head doorbell lets the controller reuse them
  if (lane == 0) {
    if (consumed != 0) {
      state.cq_head = head;
      state.cq_phase = phase;
      nvme::QueueAtomic<std::uint64_t>(state.completions_reaped).fetch_add(consumed, MemoryOrder::relaxed);
      accel::mmio_store32(queue.cq_head_doorbell, head);  // one CQ head doorbell write for the batch
    }
    nvme::QueueAtomic<std::uint32_t>(state.cq_lock).store(0, MemoryOrder::release);
  }
  return consumed;
}

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
/// deadline; in the latter case the lane's CID is abandoned (nvme/queue.hpp has no call that frees
/// a CID whose command never reached the SQ; the CID stays unusable: see docs/gpu.md).
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
        queue.abandon(cid);
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
