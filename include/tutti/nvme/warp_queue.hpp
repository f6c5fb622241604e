// The warp submission protocol: the one way GPU warps (and host threads, as one-lane warps) put
// commands into NVMe queue pairs and take their completions, built from the steps of
// nvme/queue.hpp. The local_nvme DataPath's kernels (path/local_nvme/kernels.hpp) drive queues
// only through it, and so do the GPU tests and the raw-queue row of the submission-rate
// benchmark, so what those measure is the product's protocol.
//
//   warp_submit                    lanes naming the same queue pair form a group; per group ONE
//                                  reservation of SQ slots (reserve_submission_slots), every lane
//                                  writes its own SQEs at its prefix-sum offset in the run, warp
//                                  barrier, ONE SQ tail doorbell write (warp_ring_submission_doorbell)
//   warp_ring_submission_doorbell  the protocol of QueuePair::ring_submission_doorbell, 32 ready
//                                  words read at once
//   warp_reap_completions          the protocol of QueuePair::reap_completions, 32 CQEs read and
//                                  delivered at once (QueuePair's delivery steps), ONE acquire fence
//                                  and ONE release fence per batch, ONE CQ head doorbell write
//   warp_reap                      lanes grouped by queue pair, each group's CQ reaped together
//
// Warp-collective (accel/warp.hpp): all lanes of the warp call these convergently (lanes with
// nothing to do pass count 0 / waiting false); no __syncthreads, other warps are never waited for.
// On the host a warp is one lane and each function is the serial protocol for one thread.
// Spec: NVMe Base Specification 2.0, 3.3.1 (SQ/CQ model: at most depth - 1 entries outstanding,
// the tail doorbell announces every entry before it), 4.2 (CQE, Phase Tag); NVMe over PCIe
// Transport 1.0, 3.1.2 (doorbells).
// Thread-safety: any number of warps and threads may use one QueuePair at once (queue.hpp rules).
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/queue.hpp>

namespace tutti::nvme {

/// Number of consecutive set bits of `bits` from bit 0 (32 when all are set).
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE constexpr std::uint32_t trailing_ones(std::uint32_t bits) noexcept {
  std::uint32_t count = 0;
  while (count < 32 && (bits >> count & 1u) != 0) ++count;
  return count;
}
static_assert(trailing_ones(0) == 0 && trailing_ones(0b0111) == 3 && trailing_ones(0xffffffffu) == 32);

/// Announces every ready SQ entry after the last announced one with ONE SQ tail doorbell write
/// (the protocol of QueuePair::ring_submission_doorbell, whose comment proves that no entry is
/// stranded: the same seq_cst lock, unlock and re-check are kept). Lanes read 32 ready words at
/// once with relaxed loads; the system fence inside mmio_store32 (fence.sc.sys) orders the SQE
/// bytes those words publish before the doorbell store. Returns the entries announced (same value
/// in every lane; 0 when another thread holds the doorbell lock: that thread announces ours).
/// Terminates: every pass that continues announced at least one entry.
TUTTI_HOST_DEVICE inline std::uint32_t warp_ring_submission_doorbell(const QueuePair& queue) noexcept {
  const std::uint32_t lane = accel::lane_id();
  const std::uint32_t lanes = accel::warp_lanes();
  SubmitterAtomic<std::uint32_t> lock(queue.state->sq_doorbell_lock);
  SubmitterAtomic<std::uint64_t> announced_ticket(queue.state->sq_doorbell_ticket);
  std::uint32_t announced = 0;
  for (;;) {
    std::uint32_t locked = 0;
    if (lane == 0) {
      std::uint32_t expected = 0;
      locked = lock.compare_exchange_strong(expected, 1, accel::MemoryOrder::seq_cst) ? 1u : 0u;
    }
    if (accel::warp_broadcast(locked, 0) == 0) return announced;
    std::uint64_t start = 0;
    if (lane == 0) start = announced_ticket.load(accel::MemoryOrder::relaxed);
    start = accel::warp_broadcast(start, 0);
    std::uint64_t end = start;
    for (;;) {
      const std::uint64_t room = queue.depth - 1 - (end - start);
      const std::uint64_t window = room < lanes ? room : lanes;
      if (window == 0) break;
      const std::uint64_t ticket = end + lane;
      const bool ready =
          lane < window &&
          SubmitterAtomic<std::uint64_t>(queue.sq_ready[ticket % queue.depth]).load(accel::MemoryOrder::relaxed) ==
              ticket + 1;
      const std::uint32_t run = trailing_ones(accel::warp_ballot(ready));
      end += run < window ? run : window;
      if (run < window) break;
    }
    if (lane == 0) {
      if (end != start) {
        announced_ticket.store(end, accel::MemoryOrder::relaxed);
        accel::mmio_store32(queue.sq_tail_doorbell,
                            static_cast<std::uint32_t>(end % queue.depth));  // one write for the run
        QueuePair::count(queue.state->doorbell_writes);
      }
      lock.store(0, accel::MemoryOrder::seq_cst);
    }
    announced += static_cast<std::uint32_t>(end - start);
    std::uint32_t again = 0;
    if (lane == 0)
      again = SubmitterAtomic<std::uint64_t>(queue.sq_ready[end % queue.depth]).load(accel::MemoryOrder::seq_cst) ==
              end + 1;
    if (accel::warp_broadcast(again, 0) == 0) return announced;
  }
}

/// Consumes up to `max_entries` new CQEs if lane 0 wins the CQ try-lock (else returns 0), with the
/// lanes reading up to 32 CQEs at once (the protocol of QueuePair::reap_completions, with the same
/// delivery steps). Per batch: lanes load dword 3 of consecutive CQ slots (relaxed) and compare
/// the Phase Tag with the one expected for that slot's pass; the leading run of matches is the
/// batch; ONE acquire fence (system scope: the controller wrote the CQEs) orders the reads of
/// dwords 0-2 after it; each lane checks its CQE's SQ fields and stages it (QueuePair::
/// stage_completion: the completion bytes into its command slot); the newest CQE of the batch
/// advances the SQ head ticket (SQ Head Pointers only grow in CQ order); ONE release fence
/// (device scope: only submitters read the slots) orders all of that before each lane publishes
/// (QueuePair::publish_completion, relaxed CAS in_flight -> completed, or the CID freed when the
/// waiter abandoned it); lane 0 writes the CQ head doorbell once for everything reaped. Returns
/// the CQEs consumed (same value in every lane).
TUTTI_HOST_DEVICE inline std::uint32_t warp_reap_completions(const QueuePair& queue,
                                                             std::uint32_t max_entries = 0xffffffffu) noexcept {
  using accel::MemoryOrder;
  const std::uint32_t lane = accel::lane_id();
  const std::uint32_t lanes = accel::warp_lanes();
  QueuePairState& state = *queue.state;
  std::uint32_t locked = 0, head = 0, phase = 0;
  if (lane == 0) {
    std::uint32_t expected = 0;
    if (SubmitterAtomic<std::uint32_t>(state.cq_lock).compare_exchange_strong(expected, 1, MemoryOrder::acquire)) {
      locked = 1;
      head = state.cq_head;
      phase = state.cq_phase;
    }
  }
  if (accel::warp_broadcast(locked, 0) == 0) return 0;
  head = accel::warp_broadcast(head, 0);
  phase = accel::warp_broadcast(phase, 0);
  std::uint32_t consumed = 0;
  while (consumed < max_entries) {
    std::uint32_t window = queue.depth - 1 < lanes ? queue.depth - 1 : lanes;
    if (max_entries - consumed < window) window = max_entries - consumed;
    const std::uint32_t position = head + lane;  // < 2 * depth
    const std::uint32_t slot = position < queue.depth ? position : position - queue.depth;
    const std::uint32_t expected_phase = position < queue.depth ? phase : phase ^ 1u;  // the tag inverts each pass
    CompletionQueueEntry entry{};
    bool valid = false;
    if (lane < window) {
      entry.dw3 = ControllerAtomic<std::uint32_t>(queue.cq[slot].dw3).load(MemoryOrder::relaxed);
      valid = entry.status().phase() == expected_phase;
    }
    const std::uint32_t run = trailing_ones(accel::warp_ballot(valid));
    const std::uint32_t count = run < window ? run : window;
    if (count == 0) break;
    // Acquire: dwords 0-2 of every CQE of the batch were written before its dword 3.
    accel::fence(kControllerScope, MemoryOrder::acquire);
    QueuePair::Delivery delivery;
    if (lane < count) {
      const CompletionQueueEntry& source = queue.cq[slot];
      entry.dw0 = source.dw0;
      entry.dw1 = source.dw1;
      entry.sq_head = source.sq_head;
      entry.sq_identifier = source.sq_identifier;
      const bool fields_valid = queue.completion_fields_valid(entry);
      if (!fields_valid)
        QueuePair::count(state.invalid_completions);
      else if (lane == count - 1)
        queue.advance_submission_head(entry.sq_head, MemoryOrder::relaxed);  // newest CQE
      delivery = queue.stage_completion(entry);
    }
    // Release, once for the batch: completion bytes (and the SQ head ticket, whose reuse of SQ
    // slots the controller's CQE allowed) before the state words the waiters acquire.
    accel::fence(kSubmitterScope, MemoryOrder::release);
    queue.publish_completion(delivery, MemoryOrder::relaxed);
    consumed += count;
    head += count;
    if (head >= queue.depth) {
      head -= queue.depth;
      phase ^= 1u;
    }
    if (count < window) break;
  }
  accel::warp_sync();  // every lane has read its CQEs before the head doorbell lets the controller reuse them
  if (lane == 0) {
    if (consumed != 0) {
      state.cq_head = head;
      state.cq_phase = phase;
      QueuePair::count(state.completions_reaped, consumed);
      accel::mmio_store32(queue.cq_head_doorbell, head);  // one CQ head doorbell write for the batch
    }
    SubmitterAtomic<std::uint32_t>(state.cq_lock).store(0, MemoryOrder::release);
  }
  return consumed;
}

/// Submits each lane's run of `count` commands (0..depth - 1) to queue_of(queue_index)
/// (warp-collective). Lanes that name the same queue index form a group; per group:
///   1. the group's commands are taken in lane order up to depth - 1 entries (a run; the lanes
///      past it form the next run);
///   2. the run's last lane reserves all of its SQ slots with ONE atomic (reserve_submission_slots);
///   3. each lane of the run calls `write(first_ticket)`, which must write exactly its `count`
///      SQEs, with their CIDs, at tickets [first_ticket, first_ticket + count) (QueuePair::
///      write_submission: the SQE, then its ready word);
///   4. warp barrier, then ONE SQ tail doorbell write for the run (warp_ring_submission_doorbell;
///      the tail doorbell announces every entry before it, Base 2.0, 3.3.1).
/// Nothing blocks: when the SQ lacks room for a run (the controller has not fetched enough
/// entries yet) the lanes of its group submit nothing now and get false; a lane whose count alone
/// exceeds depth - 1 can never be submitted and gets false. `queue_of(i)`: any callable that
/// returns the same `const QueuePair&` view in every lane for the same i. `write` runs in the
/// submitting lanes only (divergently): it must not call warp-collective functions.
/// Returns true in the lanes whose commands were written and announced.
template <class QueueOf, class Write>
TUTTI_HOST_DEVICE inline bool warp_submit(const QueueOf& queue_of, std::uint32_t queue_index, std::uint32_t count,
                                          Write&& write) noexcept {
  const std::uint32_t lane = accel::lane_id();
  bool submitted = false;
  std::uint32_t pending = accel::warp_ballot(count != 0);
  while (pending != 0) {
    const std::uint32_t leader = accel::lowest_lane(pending);
    const std::uint32_t selected = accel::warp_broadcast(queue_index, leader);
    const QueuePair& queue = queue_of(selected);
    const bool member = ((pending >> lane) & 1u) != 0 && queue_index == selected;
    const std::uint32_t group = accel::warp_ballot(member);
    const std::uint32_t inclusive = accel::warp_inclusive_sum(member ? count : 0);
    const bool in_run = member && inclusive <= queue.depth - 1;  // a prefix of the group's lanes
    const std::uint32_t run = accel::warp_ballot(in_run);
    if (run == 0) {  // the leader's count alone exceeds depth - 1: it can never be submitted
      pending &= ~(1u << leader);
      continue;
    }
    const std::uint32_t last = accel::highest_lane(run);
    const std::uint32_t total = accel::warp_broadcast(inclusive, last);
    std::uint64_t ticket = 0;
    std::uint32_t reserved = 0;
    if (lane == last) reserved = queue.reserve_submission_slots(total, ticket) ? 1u : 0u;  // ONE atomic for the run
    reserved = accel::warp_broadcast(reserved, last);
    if (reserved == 0) {  // SQ full: the whole group tries again at the caller's next step
      pending &= ~group;
      continue;
    }
    ticket = accel::warp_broadcast(ticket, last);
    if (in_run) {
      write(ticket + (inclusive - count));
      submitted = true;
    }
    accel::warp_sync();                    // every SQE of the run written (ready words set) before the doorbell
    warp_ring_submission_doorbell(queue);  // ONE SQ tail doorbell write for the run
    pending &= ~run;
  }
  return submitted;
}

/// Reaps the CQs of the warp's lanes (warp-collective): lanes with `waiting` true are grouped by
/// queue index and the warp reaps each group's CQ together (warp_reap_completions: one CQ head
/// doorbell write per reaped batch). `queue_of` as in warp_submit. Returns the CQEs consumed over
/// all groups (same value in every lane).
template <class QueueOf>
TUTTI_HOST_DEVICE inline std::uint32_t warp_reap(const QueueOf& queue_of, std::uint32_t queue_index,
                                                 bool waiting) noexcept {
  std::uint32_t consumed = 0;
  std::uint32_t pending = accel::warp_ballot(waiting);
  while (pending != 0) {
    const std::uint32_t selected = accel::warp_broadcast(queue_index, accel::lowest_lane(pending));
    consumed += warp_reap_completions(queue_of(selected));
    pending &= ~accel::warp_ballot(waiting && queue_index == selected);
  }
  return consumed;
}

}  // namespace tutti::nvme
