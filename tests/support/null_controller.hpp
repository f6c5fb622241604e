// A null NVMe controller that lives where its queues live: in GPU memory, serviced by a persistent
// GPU kernel (CUDA profile), or in host memory, serviced by host threads. It consumes SQEs
// announced through the SQ tail doorbell and posts one successful CQE per command, with the
// command's CID, the Phase Tag of the CQ pass and the SQ Head Pointer, and moves no data. It
// measures the pure cost of the submission path (nvme/queue.hpp driven by warps or threads):
// what it does per command is a few loads and one 16-byte CQE store.
//
// Controller side of the NVMe Base Specification 2.0, 3.3.1 (circular SQ/CQ, the controller
// consumes from SQ Head to the doorbell's SQ Tail; a CQ is full when Tail + 1 == Head, with Head
// from the CQ head doorbell), 4.2 (CQE: SQ Head Pointer, SQ Identifier, CID, Status Field with the
// Phase Tag inverted on every pass, first pass 1), NVMe over PCIe Transport 1.0, 3.1.2 (the
// doorbells hold slot indices, 0..depth-1).
//
// Deviation from a real controller, on purpose: CQE DW0 echoes the SQE's CDW10 (for Read/Write,
// SLBA bits 31:0), so tests check that each completion reached the command that carries it.
//
// Fault injection: NullControllerState::drop_command names one command (by its position in the
// SQ's consumption order, 0-based) whose completion is never posted: a lost completion, which
// the host side must turn into TIMEOUT.
//
// Threading: one NullControllerQueue is serviced by one warp (device) or one thread (host) at a
// time; several queues may share a warp or thread. The submitters share nothing with it but the
// rings and the two doorbells.
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/accel/warp.hpp>

namespace tutti::test {

/// SQEs announced by the SQ tail doorbell value `tail_slot` (< depth) and not yet fetched, after
/// `fetched` SQEs (absolute count) of a ring of `depth` entries (Base 2.0, 3.3.1: the controller
/// consumes from SQ Head up to the doorbell's SQ Tail).
TUTTI_HOST_DEVICE inline std::uint32_t announced_entries(std::uint32_t tail_slot, std::uint64_t fetched,
                                                         std::uint32_t depth) noexcept {
  return (tail_slot + depth - static_cast<std::uint32_t>(fetched % depth)) % depth;
}

/// Free CQ slots after `cq_tail` CQEs posted (absolute count), with the CQ head doorbell value
/// `head_slot` (< depth): a CQ is full when Tail + 1 == Head (Base 2.0, 3.3.1).
TUTTI_HOST_DEVICE inline std::uint32_t free_completion_slots(std::uint64_t cq_tail, std::uint32_t head_slot,
                                                             std::uint32_t depth) noexcept {
  return depth - 1 - (static_cast<std::uint32_t>(cq_tail % depth) + depth - head_slot) % depth;
}

/// Posts the CQE at absolute CQ position `cq_position` of `cq` (depth entries) for the SQE at
/// absolute SQ position `sq_position` of queue `qid` (Base 2.0, 4.2): DW0 = `dw0`, DW1 = 0, the SQ
/// Head Pointer after that SQE, the SQ Identifier, then DW3 (CID, Status Field with `sct`/`sc`,
/// DNR and the Phase Tag of the CQ pass, first pass 1) by one release store at system scope, after
/// dwords 0-2. The caller orders the command's data stores before it.
TUTTI_HOST_DEVICE inline void post_completion(nvme::CompletionQueueEntry* cq, std::uint32_t depth,
                                              std::uint64_t cq_position, std::uint64_t sq_position, std::uint16_t qid,
                                              std::uint16_t cid, std::uint32_t dw0, std::uint8_t sct, std::uint8_t sc,
                                              bool dnr) noexcept {
  nvme::CompletionQueueEntry& cqe = cq[cq_position % depth];
  const std::uint8_t phase = ((cq_position / depth) & 1u) == 0 ? 1 : 0;  // first pass: Phase Tag 1
  cqe.dw0 = dw0;
  cqe.dw1 = 0;
  cqe.sq_head = static_cast<std::uint16_t>((sq_position + 1) % depth);  // SQ Head Pointer after this SQE
  cqe.sq_identifier = qid;
  accel::SystemAtomicRef<std::uint32_t>(cqe.dw3).store(
      nvme::CompletionQueueEntry::make_dw3(cid, nvme::StatusField::make(sct, sc, dnr, phase)),
      accel::MemoryOrder::release);
}

/// Controller-side state of one queue pair, owned by the servicing warp or thread. Zero-initialise,
/// then set drop_command (kNoDrop for none). 8-byte aligned.
struct NullControllerState {
  std::uint64_t sq_head;       ///< SQEs consumed so far (absolute count; slot = sq_head % depth)
  std::uint64_t cq_tail;       ///< CQEs posted so far (absolute count; pass = cq_tail / depth)
  std::uint64_t dropped;       ///< completions deliberately not posted (drop_command hit)
  std::uint64_t drop_command;  ///< absolute index of the consumed SQE whose CQE is dropped; kNoDrop: none
  std::uint64_t tail_updates;  ///< service steps that found a new SQ tail (statistics: doorbell runs seen)
};
inline constexpr std::uint64_t kNoDrop = ~std::uint64_t{0};

/// Host-to-controller control words, in memory both sides reach (mapped pinned host memory for a
/// GPU controller). Zero-initialise.
struct NullControllerControl {
  std::uint32_t stop;            ///< host sets 1: controllers exit once they find no work
  std::uint32_t running_warps;   ///< each servicing warp (thread) adds 1 when it starts
  std::uint32_t deadline_exits;  ///< servicing warps (threads) that left because their budget ran out
  std::uint32_t reserved;
};

/// One queue pair as the null controller sees it. Trivially copyable; pass to kernels by value or
/// in a device array.
struct NullControllerQueue {
  const nvme::SubmissionQueueEntry* sq = nullptr;            ///< depth SQEs
  nvme::CompletionQueueEntry* cq = nullptr;                  ///< depth CQEs, zeroed before first use
  const volatile std::uint32_t* sq_tail_doorbell = nullptr;  ///< SQyTDBL, written by submitters
  const volatile std::uint32_t* cq_head_doorbell = nullptr;  ///< CQyHDBL, written by reapers
  std::uint32_t depth = 0;                                   ///< entries per ring (same for SQ and CQ), 2..65536
  std::uint16_t qid = 0;                                     ///< SQ Identifier put in every CQE
  NullControllerState* state = nullptr;

  /// Work found by one service step: `count` SQEs from absolute position `sq_head`, whose CQEs go
  /// to CQ positions from `cq_tail` (minus one after a dropped command).
  struct Batch {
    std::uint64_t sq_head = 0;
    std::uint64_t cq_tail = 0;
    std::uint32_t count = 0;
    std::uint32_t drop_offset = ~0u;  ///< index in the batch of the dropped command, ~0u: none
  };

  /// Reads both doorbells and returns the SQEs that may be completed now: announced by the SQ
  /// tail doorbell and not yet consumed, at most the free CQ slots and at most `max_count`.
  /// One thread per queue calls it (the servicing lane). Ordering: the acquire fence after the
  /// doorbell read orders the later SQE reads after it (the submitter fenced its SQE stores
  /// before the doorbell store: mmio_store32).
  TUTTI_HOST_DEVICE Batch claim(std::uint32_t max_count) const noexcept {
    Batch batch;
    batch.sq_head = state->sq_head;
    batch.cq_tail = state->cq_tail;
    const std::uint32_t tail_slot = accel::mmio_load32(sq_tail_doorbell);
    const std::uint32_t head_slot = accel::mmio_load32(cq_head_doorbell);
    if (tail_slot >= depth || head_slot >= depth) return batch;  // invalid doorbell value: ignore
    const std::uint32_t announced = announced_entries(tail_slot, batch.sq_head, depth);
    const std::uint32_t cq_free = free_completion_slots(batch.cq_tail, head_slot, depth);
    std::uint32_t count = announced < cq_free ? announced : cq_free;
    if (count > max_count) count = max_count;
    batch.count = count;
    if (count != 0) {
      accel::fence(accel::ThreadScope::system, accel::MemoryOrder::acquire);  // SQE reads after the doorbell read
      if (state->drop_command >= batch.sq_head && state->drop_command - batch.sq_head < count)
        batch.drop_offset = static_cast<std::uint32_t>(state->drop_command - batch.sq_head);
    }
    return batch;
  }

  /// Posts the CQE of entry `index` (< batch.count) of `batch`, unless it is the dropped one.
  /// Any lane may post any entry; entries of one batch may be posted concurrently.
  /// The SQE is read with volatile loads (never from a stale L1 line of an earlier pass), the
  /// CQE dwords 0-2 are stored before dword 3, whose release store publishes the Phase Tag.
  TUTTI_HOST_DEVICE void post(const Batch& batch, std::uint32_t index) const noexcept {
    if (index == batch.drop_offset) return;
    const std::uint64_t position = batch.sq_head + index;
    const volatile nvme::SubmissionQueueEntry& sqe = sq[position % depth];
    const std::uint16_t cid = sqe.command_identifier;
    const std::uint32_t cdw10 = sqe.cdw10;
    const std::uint64_t cq_position = batch.cq_tail + index - (index > batch.drop_offset ? 1 : 0);
    // DW0: the null-controller echo of CDW10 (see the header comment).
    post_completion(cq, depth, cq_position, position, qid, cid, cdw10, 0, 0, false);
  }

  /// Advances the controller state past `batch`. One thread, after every post() of the batch is
  /// done (in a warp: after accel::warp_sync()).
  TUTTI_HOST_DEVICE void retire(const Batch& batch) const noexcept {
    if (batch.count == 0) return;
    const std::uint32_t dropped = batch.drop_offset < batch.count ? 1u : 0u;
    state->sq_head = batch.sq_head + batch.count;
    state->cq_tail = batch.cq_tail + batch.count - dropped;
    state->dropped += dropped;
    state->tail_updates += 1;
  }

  /// One service step by a whole warp (device: 32 lanes post in parallel; host: the thread alone).
  /// Warp-collective (warp.hpp contract). Returns the SQEs consumed (same value in every lane).
  TUTTI_HOST_DEVICE std::uint32_t service(std::uint32_t max_count = 1024) const noexcept {
    const std::uint32_t lane = accel::lane_id();
    const std::uint32_t lanes = accel::warp_lanes();
    Batch batch;
    if (lane == 0) batch = claim(max_count);
    batch.sq_head = accel::warp_broadcast(batch.sq_head, 0);
    batch.cq_tail = accel::warp_broadcast(batch.cq_tail, 0);
    batch.count = accel::warp_broadcast(batch.count, 0);
    batch.drop_offset = accel::warp_broadcast(batch.drop_offset, 0);
    // bar.warp.sync orders lane 0's doorbell read and acquire fence before the other lanes' SQE reads.
    accel::warp_sync();
    for (std::uint32_t i = lane; i < batch.count; i += lanes) post(batch, i);
    accel::warp_sync();  // every post() of the batch done before lane 0 retires it
    if (lane == 0) retire(batch);
    return batch.count;
  }
};

/// Settings of a servicing loop (device kernel or host thread).
struct NullControllerSettings {
  std::uint64_t budget_ns = 10'000'000'000ull;               ///< the loop leaves after this long in any case (10 s)
  std::uint32_t max_batch = 1024;                            ///< SQEs per queue per service step
  accel::Backoff::Settings idle_backoff{16, 16, 256, 2000};  ///< when no queue had work: ns sleeps capped at 2 us
  /// How often an idle loop reads control->stop, ns (100 us). The control words are in mapped
  /// host memory: each read is a PCIe round trip, and 128 idle warps reading it every few us
  /// measurably slowed every submitter on an H200 (docs/gpu.md).
  std::uint64_t stop_poll_interval_ns = 100'000;
  /// Optional relay of control->stop into memory local to the servicing agents (a word in GPU
  /// memory, zeroed before the launch). When set, only the loop with first == 0 reads
  /// control->stop (every stop_poll_interval_ns) and copies it here; every other loop reads this
  /// word instead (an L2 hit on a GPU, no PCIe round trip). Null: every loop reads control->stop.
  std::uint32_t* stop_relay = nullptr;
};

/// The servicing loop of one warp (device) or thread (host): services queues[first],
/// queues[first + stride], ... until `control->stop` is set and no queue has work, or the budget
/// runs out (counted in control->deadline_exits); control->stop is read at most every
/// settings.stop_poll_interval_ns, by every loop or (settings.stop_relay) only by the loop with
/// first == 0, which relays it. Warp-collective on the device.
/// `control` lives in memory the host writes while this runs (mapped pinned memory on a GPU).
TUTTI_HOST_DEVICE inline void run_null_controller(const NullControllerQueue* queues, std::uint32_t queue_count,
                                                  std::uint32_t first, std::uint32_t stride,
                                                  NullControllerControl* control,
                                                  const NullControllerSettings& settings) noexcept {
  const std::uint32_t lane = accel::lane_id();
  if (lane == 0)
    accel::SystemAtomicRef<std::uint32_t>(control->running_warps).fetch_add(1, accel::MemoryOrder::relaxed);
  const std::uint64_t deadline = accel::deadline_after(settings.budget_ns);
  std::uint64_t next_stop_poll = 0;  // lane 0's: when control->stop is read next
  accel::Backoff backoff(settings.idle_backoff);
  for (;;) {
    std::uint32_t work = 0;
    for (std::uint32_t q = first; q < queue_count; q += stride) work += queues[q].service(settings.max_batch);
    if (work != 0) {
      backoff.reset();
      continue;
    }
    std::uint32_t leave = 0;  // 1: stop requested, 2: budget spent
    if (lane == 0) {
      const std::uint64_t now = accel::timer_ns();
      const bool relayed = settings.stop_relay != nullptr && first != 0;
      if (relayed) {
        // A word in GPU memory: cheap to read on every idle step.
        if (accel::DeviceAtomicRef<std::uint32_t>(*settings.stop_relay).load(accel::MemoryOrder::acquire) != 0)
          leave = 1;
      } else if (now >= next_stop_poll) {
        next_stop_poll = now + settings.stop_poll_interval_ns;
        if (accel::SystemAtomicRef<std::uint32_t>(control->stop).load(accel::MemoryOrder::acquire) != 0) {
          leave = 1;
          if (settings.stop_relay != nullptr)
            accel::DeviceAtomicRef<std::uint32_t>(*settings.stop_relay).store(1, accel::MemoryOrder::release);
        }
      }
      if (leave == 0 && now >= deadline) leave = 2;
    }
    leave = accel::warp_broadcast(leave, 0);
    if (leave == 2 && lane == 0)
      accel::SystemAtomicRef<std::uint32_t>(control->deadline_exits).fetch_add(1, accel::MemoryOrder::relaxed);
    if (leave != 0) return;
    backoff.pause();
  }
}

#if defined(TUTTI_ACCELERATOR_CUDA) && defined(__CUDACC__)
/// The persistent GPU null controller: warp w of the grid (w = global warp index) services
/// queues w, w + total warps, ... (run_null_controller). Launch it before the submitters, on its
/// own stream, with few enough blocks to be resident at once, and wait until
/// control->running_warps equals the grid's warp count. blockDim.x: a multiple of 32.
static __global__ void null_controller_kernel(const NullControllerQueue* queues, std::uint32_t queue_count,
                                              NullControllerControl* control, NullControllerSettings settings) {
  const std::uint32_t warps_per_block = blockDim.x / accel::kDeviceWarpSize;
  const std::uint32_t warp = blockIdx.x * warps_per_block + threadIdx.x / accel::kDeviceWarpSize;
  run_null_controller(queues, queue_count, warp, gridDim.x * warps_per_block, control, settings);
}
#endif

}  // namespace tutti::test
