// A data-moving NVMe controller executed by GPU warps, for the GPU suite and the drive-rate
// benchmark (cuda profile only; not library code). It follows the same queue protocol as the null
// controller (tests/support/null_controller.hpp: announced_entries, free_completion_slots,
// post_completion) and shares its nvme::Controller side (test::AgentNvmeController,
// tests/support/agent_nvme_controller.hpp), but each command moves its bytes between a RAM
// namespace and the PRP-described memory and completes after a configurable latency, under a
// bandwidth cap, so that one instance behaves like one PCIe Gen5 x4 drive.
//
//   DriveNvmeController  nvme::Controller: SQ, CQ, doorbells (64 bytes apart), CSTS and the
//                        controller's per-queue state in GPU memory; the namespace (LBA size 4096)
//                        in GPU memory or in mapped pinned host memory (DriveSettings::namespace_
//                        in_host); dma_map / dma_map_device give bus address == the address itself
//                        (GPU memory, or mapped pinned host memory the GPU reaches at the same
//                        address: UVA); PRP list buffers in mapped pinned host memory. Admin
//                        commands succeed at once; Abort finds nothing (a lost completion stays lost).
//   DriveService         one persistent kernel over the I/O queues of N controllers (striping):
//                        block b services queues b, b + B, ... with all its warps (the data of one
//                        queue's commands is split over them); a bounded lifetime (budget_ns) and a
//                        stop word in mapped host memory, read by block 0 alone and relayed to
//                        the others through GPU memory; stop() returns the warps that left because
//                        the budget ran out.
//
// Per command (NVMe Base Specification 2.0: 3.3.1 queues, 4.2 CQE and Phase Tag, 4.3.1 PRP
// entries and lists with chaining; NVM Command Set 1.0, 3.2.4 Read, 3.2.6 Write, 3.2.3 Flush):
//   fetch    warp 0 reads the SQ tail doorbell, takes up to 32 announced SQEs (at most depth - 1
//            fetched and not completed), finds each data command's namespace block (its SLBA itself,
//            or through DriveSettings::lba_map), and gives each a due time: max(fetch + latency_ns, the
//            end of its transfer on the controller's link), the link being reserved at
//            bytes_per_second (0: no cap) by one CAS per fetch step on the controller's busy-until
//            word, for the step's transfers one after the other in SQ order.
//   complete in SQ order, the due commands (as many as the CQ has free slots, from the CQ head
//            doorbell): the block's warps copy the commands' bytes, each warp every W-th PRP
//            segment (16-byte vectors where both sides are 16-byte aligned), then warp 0 posts
//            their CQEs (dwords 0-2, then dword 3 with the Phase Tag by one release store). Read: namespace -> memory;
//            Write: memory -> namespace; Flush: nothing. LBA Out of Range (SCT 0, SC 80h, DNR) beyond the namespace or
//            the map, Invalid Opcode (SC 01h, DNR) for other opcodes, Invalid Field (SC 02h, DNR) for a namespace other
//            than 1 or SGL data pointers.
//   faults   DriveQueueState::fail_command (an absolute SQ position) completes with
//            fail_status (SCT << 8 | SC, DNR set) and moves no data; drop_command is consumed and
//            never completed (a lost completion; the data does not move).
// The controller trusts the PRPs (it writes where they point, as a drive's DMA would): the
// DataPath builds them from its registrations.
// Diagnostics (a batch that is late): DriveNvmeController::debug_dump (doorbells, the controller's
// per-queue state, the commands in flight with their due times against the GPU's clock, the SQEs
// announced and not fetched, the CQ around the next CQE; every read a bounded copy on its own
// stream) and DriveService::describe (the kernel running or not, the control words).
// Threading: one block per queue at a time; the host reads the statistics after stop().
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/concepts.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/resolve/local_file.hpp>

#include "agent_nvme_controller.hpp"  // tests/support
#include "null_controller.hpp"        // tests/support

namespace tutti::gpu_test {

inline constexpr std::uint64_t kDriveNoFault = ~std::uint64_t{0};
inline constexpr std::uint32_t kDriveLbaSize = 4096;

/// One range of the LBA map (DriveSettings::lba_map): `blocks` LBAs from `starting_lba` (as the
/// host addresses them) are held at namespace block `namespace_lba` onward. Units: 4096-byte LBAs.
struct DriveLbaRange {
  std::uint64_t starting_lba = 0;
  std::uint64_t blocks = 0;
  std::uint64_t namespace_lba = 0;
};

/// One drive's behaviour.
struct DriveSettings {
  std::uint64_t namespace_bytes = std::uint64_t{64} << 20;  ///< multiple of 4096
  bool namespace_in_host = false;                           ///< mapped pinned host memory instead of GPU memory
  std::uint64_t latency_ns = 70'000;                        ///< per command, from fetch to completion (0: none)
  std::uint64_t bytes_per_second = 0;                       ///< the controller's link (0: no cap)
  /// Empty: LBA n is namespace block n. Otherwise the drive holds only these LBAs (the ones FIEMAP
  /// gave for a set of files on a real file system: drive_files.hpp), each range at its namespace
  /// block, the way a drive's flash translation layer places LBAs: sorted by starting_lba, not
  /// overlapping, each inside the namespace. A command's LBAs must lie in one range (LBA Out of
  /// Range otherwise), and the reported namespace size (NSZE) reaches the last mapped LBA.
  std::vector<DriveLbaRange> lba_map;
};

/// Per-controller state in GPU memory, shared by the warps of its queues.
struct DriveControllerState {
  std::uint8_t* namespace_data = nullptr;
  std::uint64_t namespace_bytes = 0;
  std::uint64_t latency_ns = 0;
  std::uint64_t bytes_per_second = 0;
  unsigned long long busy_until_ns = 0;    ///< the link's reservation (timer_ns)
  const DriveLbaRange* lba_map = nullptr;  ///< GPU memory, lba_map_ranges of them (none: identity)
  std::uint64_t lba_map_ranges = 0;
};

/// A fetched command (controller-private copy of its SQE's fields).
struct DriveCommand {
  std::uint64_t due_ns;
  std::uint64_t prp1, prp2;
  std::uint64_t starting_lba;  ///< the namespace block (the SQE's SLBA through the LBA map)
  std::uint32_t blocks;        ///< NLB + 1
  std::uint16_t cid;
  std::uint16_t status;  ///< SCT << 8 | SC decided at fetch (0: success so far)
  std::uint8_t opcode;
  std::uint8_t drop;
  std::uint8_t reserved[6];
};

/// Per-queue controller state in GPU memory. Zeroed, then the fault words set (kDriveNoFault: none).
struct DriveQueueState {
  std::uint64_t fetched;    ///< SQEs fetched (absolute)
  std::uint64_t completed;  ///< fetched commands retired (CQE posted or dropped)
  std::uint64_t cq_tail;    ///< CQEs posted (absolute)
  std::uint64_t dropped, failed;
  std::uint64_t bytes_moved;
  std::uint64_t drop_command;  ///< absolute SQ position whose completion is never posted
  std::uint64_t fail_command;  ///< absolute SQ position completed with fail_status
  std::uint32_t fail_status;   ///< SCT << 8 | SC
  std::uint32_t reserved;
};

/// One queue as the service sees it. Trivially copyable.
struct DriveQueueView {
  const nvme::SubmissionQueueEntry* sq = nullptr;
  nvme::CompletionQueueEntry* cq = nullptr;
  const volatile std::uint32_t* sq_tail_doorbell = nullptr;
  const volatile std::uint32_t* cq_head_doorbell = nullptr;
  std::uint32_t depth = 0;
  std::uint16_t qid = 0;
  DriveQueueState* state = nullptr;
  DriveCommand* commands = nullptr;  ///< depth entries, by SQ position % depth
  DriveControllerState* controller = nullptr;
};

/// Host-written control words (mapped pinned host memory).
struct DriveControl {
  std::uint32_t stop;
  std::uint32_t running_warps;
  std::uint32_t deadline_exits;
  std::uint32_t reserved;
};

#if defined(__CUDACC__)
namespace drive_detail {

/// The warp copies `bytes` from `from` to `to` (16-byte vectors when both are 16-byte aligned and
/// bytes is a multiple of 16, else 4-byte words: PRP1 is dword aligned). Warp-collective.
__device__ inline void warp_copy(std::uint8_t* to, const std::uint8_t* from, std::uint64_t bytes) {
  const std::uint32_t lane = threadIdx.x % 32;
  if (((reinterpret_cast<std::uintptr_t>(to) | reinterpret_cast<std::uintptr_t>(from) | bytes) & 15u) == 0) {
    auto* d = reinterpret_cast<uint4*>(to);
    const auto* s = reinterpret_cast<const uint4*>(from);  // loaded with __ldcg: L2, never a stale L1 line
    const std::uint64_t n = bytes / 16;
    std::uint64_t i = lane;
    for (; i + 224 < n; i += 256) {  // eight loads in flight per lane before the stores
      uint4 v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __ldcg(s + i + 32 * k);
#pragma unroll
      for (int k = 0; k < 8; ++k) d[i + 32 * k] = v[k];
    }
    for (; i < n; i += 32) d[i] = __ldcg(s + i);
  } else {
    for (std::uint64_t i = lane * 4; i < bytes; i += 128)
      *reinterpret_cast<unsigned int*>(to + i) = __ldcg(reinterpret_cast<const unsigned int*>(from + i));
  }
}

/// Moves one command's data: `bytes` at namespace byte `at`, memory described by PRP1/PRP2
/// (Base 2.0, 4.3.1: PRP1 may carry an offset; PRP2 is the second page for two pages, else a PRP
/// list whose last entry of each list page chains when more entries remain). Warp-collective.
/// The block's warps split the work by segment (one PRP entry's bytes): every warp walks the same
/// PRPs and counts segments in `segment_number` (carried across the commands of one service step),
/// and warp `worker` of `workers` copies the segments whose number is worker modulo workers.
/// Returns false (the walk stops) on a PRP entry that is zero or not page aligned: every warp reads
/// the same entries, so every warp returns the same verdict.
__device__ inline bool move_data(const DriveCommand& c, std::uint8_t* ns, std::uint64_t at, std::uint64_t bytes,
                                 bool to_memory, std::uint32_t& segment_number, std::uint32_t worker,
                                 std::uint32_t workers) {
  const auto segment = [&](std::uint64_t address, std::uint64_t n) {
    if (segment_number++ % workers == worker) {
      auto* memory = reinterpret_cast<std::uint8_t*>(address);
      if (to_memory)
        warp_copy(memory, ns + at, n);
      else
        warp_copy(ns + at, memory, n);
    }
    at += n;
    bytes -= n;
  };
  const std::uint64_t first = bytes < 4096 - c.prp1 % 4096 ? bytes : 4096 - c.prp1 % 4096;
  if (c.prp1 == 0) return false;
  segment(c.prp1, first);
  if (bytes == 0) return true;
  if (bytes <= 4096) {
    if (c.prp2 == 0 || c.prp2 % 4096 != 0) return false;
    segment(c.prp2, bytes);
    return true;
  }
  std::uint64_t cursor = c.prp2;  // the list, qword aligned
  if (cursor == 0 || cursor % 8 != 0) return false;
  const std::uint32_t lane = threadIdx.x % 32;
  while (bytes != 0) {
    const std::uint64_t pages_left = (bytes + 4095) / 4096;
    const std::uint64_t slots = (4096 - cursor % 4096) / 8;
    const std::uint64_t usable = pages_left > slots ? slots - 1 : pages_left;
    const auto* list = reinterpret_cast<const volatile std::uint64_t*>(cursor);
    for (std::uint64_t base = 0; base < usable; base += 32) {
      const std::uint64_t mine = base + lane < usable ? list[base + lane] : 0;
      const std::uint64_t group = usable - base < 32 ? usable - base : 32;
      for (std::uint32_t k = 0; k < group; ++k) {
        const std::uint64_t page = __shfl_sync(0xffffffffu, mine, k);
        if (page == 0 || page % 4096 != 0) return false;
        segment(page, bytes < 4096 ? bytes : 4096);
      }
    }
    if (bytes != 0) cursor = list[slots - 1];  // chain to the next list page
    if (bytes != 0 && (cursor == 0 || cursor % 8 != 0)) return false;
  }
  return true;
}

/// The namespace block holding LBAs [lba, lba + blocks) under the controller's LBA map (identity
/// without one), or ~0 when a range of the map does not hold them all. A binary search over the
/// sorted ranges: about log2(ranges) loads from L2 per command, at fetch. One lane, one command.
__device__ inline std::uint64_t namespace_block(const DriveControllerState& ctl, std::uint64_t lba,
                                                std::uint32_t blocks) {
  if (ctl.lba_map_ranges == 0) return lba;
  std::uint64_t low = 0, high = ctl.lba_map_ranges;  // the last range starting at or before lba is in [low, high)
  while (high - low > 1) {
    const std::uint64_t middle = low + (high - low) / 2;
    if (ctl.lba_map[middle].starting_lba <= lba)
      low = middle;
    else
      high = middle;
  }
  const DriveLbaRange r = ctl.lba_map[low];
  if (lba < r.starting_lba || lba - r.starting_lba >= r.blocks || blocks > r.blocks - (lba - r.starting_lba))
    return ~std::uint64_t{0};
  return r.namespace_lba + (lba - r.starting_lba);
}

/// What warp 0 decided for one service step, for the block's other warps (shared memory).
struct DriveStep {
  std::uint32_t fetched_now;  ///< SQEs fetched by this step
  std::uint32_t ready;        ///< due commands retired by this step, in SQ order from `completed`
  std::uint64_t completed;    ///< the queue's retired count before this step
};

/// One service step of queue `q` by the whole block (block-collective: every thread calls it):
/// warp 0 fetches and picks the due commands, every warp moves a share of their data (move_data's
/// segment split), then warp 0 posts their CQEs. Returns the commands fetched plus retired (same
/// in every thread).
__device__ inline std::uint32_t service(const DriveQueueView& q, DriveStep& step) {
  const std::uint32_t lane = threadIdx.x % 32;
  const std::uint32_t warp = threadIdx.x / 32;
  const std::uint32_t warps = blockDim.x / 32;
  DriveQueueState& s = *q.state;
  DriveControllerState& ctl = *q.controller;
  if (warp == 0) {
    // --- fetch
    std::uint32_t count = 0;
    std::uint64_t fetched = s.fetched, completed = s.completed;
    if (lane == 0) {
      const std::uint32_t tail = accel::mmio_load32(q.sq_tail_doorbell);
      if (tail < q.depth) {
        const std::uint32_t announced = test::announced_entries(tail, fetched, q.depth);
        const std::uint64_t room = q.depth - 1 - (fetched - completed);
        count = announced < room ? announced : static_cast<std::uint32_t>(room);
        if (count > 32) count = 32;
        if (count != 0) accel::fence(accel::ThreadScope::system, accel::MemoryOrder::acquire);
      }
    }
    count = __shfl_sync(0xffffffffu, count, 0);
    __syncwarp();
    const std::uint64_t now = accel::timer_ns();
    const std::uint64_t position = fetched + lane;
    DriveCommand c{};
    std::uint64_t link_bytes = 0;  // the bytes this lane's command moves over the controller's link
    if (lane < count) {
      const volatile nvme::SubmissionQueueEntry& e = q.sq[position % q.depth];
      c.opcode = e.opcode;
      c.cid = e.command_identifier;
      c.prp1 = e.data_pointer.prp.prp1;
      c.prp2 = e.data_pointer.prp.prp2;
      c.starting_lba = (std::uint64_t{e.cdw11} << 32) | e.cdw10;
      c.blocks = (e.cdw12 & 0xffffu) + 1;
      const std::uint64_t bytes = std::uint64_t{c.blocks} * kDriveLbaSize;
      const bool data = c.opcode == 0x01 || c.opcode == 0x02;
      if (c.opcode != 0x00 && !data)
        c.status = 0x01;  // Invalid Command Opcode
      else if (e.nsid != 1 || (e.flags >> 6) != 0)
        c.status = 0x02;  // Invalid Field in Command
      else if (data) {
        c.starting_lba = namespace_block(ctl, c.starting_lba, c.blocks);  // from here on: the namespace block
        if (c.starting_lba > ctl.namespace_bytes / kDriveLbaSize ||
            c.blocks > ctl.namespace_bytes / kDriveLbaSize - c.starting_lba)
          c.status = 0x80;  // LBA Out of Range (outside the map, or beyond the namespace)
      }
      if (position == s.fail_command) c.status = static_cast<std::uint16_t>(s.fail_status);
      c.drop = position == s.drop_command ? 1 : 0;
      if (data && c.status == 0) link_bytes = bytes;
    }
    // The link: the step's transfers, in SQ order, follow each other and whatever the controller's
    // other queues reserved before (busy_until_ns). One reservation per warp step (lane 0's CAS loop
    // for the sum; each lane ends at its inclusive prefix), not one per command: 32 lanes of each of
    // 16 queues contending for one word capped the controller near 2.5 M commands/s whatever the
    // cap's value (docs/benchmarks.md, "The drive controller's link reservation"). Bytes are summed
    // and rounded up to ns once per prefix, so the link never runs faster than its cap (a step's
    // bytes are at most 32 x 256 MiB: the product with 1e9 fits in 64 bits).
    std::uint64_t link_end = 0;  // when this lane's transfer ends (timer_ns)
    const std::uint64_t bytes_per_second = ctl.bytes_per_second;
    if (count != 0 && bytes_per_second != 0) {  // the same in every lane: the warp stays converged
      const auto link_ns = [bytes_per_second](std::uint64_t b) {
        return (b * 1'000'000'000ull + bytes_per_second - 1) / bytes_per_second;
      };
      const std::uint64_t prefix = accel::warp_inclusive_sum(link_bytes);
      const std::uint64_t step_bytes = __shfl_sync(0xffffffffu, prefix, 31);
      unsigned long long start = 0;
      if (lane == 0 && step_bytes != 0) {
        const unsigned long long reserved = link_ns(step_bytes);
        unsigned long long old = atomicAdd(&ctl.busy_until_ns, 0ull);
        for (;;) {
          start = old > now ? old : now;
          const unsigned long long seen = atomicCAS(&ctl.busy_until_ns, old, start + reserved);
          if (seen == old) break;
          old = seen;
        }
      }
      link_end = __shfl_sync(0xffffffffu, start, 0) + link_ns(prefix);
    }
    if (lane < count) {
      const std::uint64_t due = now + ctl.latency_ns;
      c.due_ns = link_bytes != 0 && link_end > due ? link_end : due;
      q.commands[position % q.depth] = c;
    }
    __syncwarp();
    if (lane == 0) s.fetched = fetched + count;
    fetched += count;
    // --- the due commands, in SQ order, as many as the CQ has free slots
    const std::uint64_t pending = fetched - completed;
    const bool due = lane < pending && q.commands[(completed + lane) % q.depth].due_ns <= accel::timer_ns();
    const std::uint32_t due_mask = __ballot_sync(0xffffffffu, due);
    std::uint32_t ready = due_mask == 0xffffffffu ? 32u : static_cast<std::uint32_t>(__ffs(~due_mask) - 1);
    std::uint32_t cq_free = 0;
    if (lane == 0) {
      const std::uint32_t head = accel::mmio_load32(q.cq_head_doorbell);
      if (head < q.depth) cq_free = test::free_completion_slots(s.cq_tail, head, q.depth);
    }
    cq_free = __shfl_sync(0xffffffffu, cq_free, 0);
    if (ready > cq_free) ready = cq_free;  // a dropped command needs no slot, counted as one: conservative
    if (lane == 0) step = DriveStep{count, ready, completed};
  }
  __syncthreads();
  const DriveStep mine = step;
  // --- move the data, every warp its share of the segments
  std::uint32_t segment_number = 0, bad_prp = 0;  // bad_prp: bit k, command k's PRPs were invalid
  for (std::uint32_t k = 0; k < mine.ready; ++k) {
    const DriveCommand& c = q.commands[(mine.completed + k) % q.depth];
    if (c.status == 0 && !c.drop && (c.opcode == 0x01 || c.opcode == 0x02)) {
      const std::uint64_t bytes = std::uint64_t{c.blocks} * kDriveLbaSize;
      if (!move_data(c, ctl.namespace_data, c.starting_lba * kDriveLbaSize, bytes, c.opcode == 0x02, segment_number,
                     warp, warps))
        bad_prp |= 1u << k;
    }
  }
  // Every thread's data stores before the CQEs: each thread fences its own, the block barrier
  // orders them before warp 0's release stores of dword 3. No fence on an idle step: a system
  // fence in every spinning thread would slow the submitters' kernels beside the service.
  if (mine.ready != 0) __threadfence_system();
  __syncthreads();
  if (warp == 0 && mine.ready != 0) {
    std::uint64_t cq_tail = s.cq_tail, moved = 0, dropped = 0, failed = 0;
    for (std::uint32_t k = 0; k < mine.ready; ++k) {
      const std::uint64_t position = mine.completed + k;
      DriveCommand c = q.commands[position % q.depth];
      const bool data = c.opcode == 0x01 || c.opcode == 0x02;
      if (c.status == 0 && !c.drop && data) {
        if ((bad_prp >> k) & 1u)
          c.status = 0x13;  // PRP Offset Invalid
        else
          moved += std::uint64_t{c.blocks} * kDriveLbaSize;
      }
      if (c.drop) {
        ++dropped;
        continue;
      }
      if (c.status != 0) ++failed;
      if (lane == 0)
        test::post_completion(q.cq, q.depth, cq_tail, position, q.qid, c.cid, 0,
                              static_cast<std::uint8_t>(c.status >> 8), static_cast<std::uint8_t>(c.status & 0xff),
                              c.status != 0);
      ++cq_tail;
    }
    __syncwarp();
    if (lane == 0) {
      s.completed = mine.completed + mine.ready;
      s.cq_tail = cq_tail;
      s.bytes_moved += moved;
      s.dropped += dropped;
      s.failed += failed;
    }
  }
  // The queue's state as warp 0 left it, before any thread reads it or the next step overwrites `step`.
  __syncthreads();
  return mine.fetched_now + mine.ready;
}

}  // namespace drive_detail

/// The persistent service: block b of the grid services queues b, b + B, ... (every warp of the
/// block on one queue at a time, service) until the stop is seen and a whole pass found no work
/// and nothing in flight, or budget_ns has passed (each warp then counts itself in
/// control->deadline_exits). The stop: block 0 reads control->stop (every 20 us) and relays it into
/// *stop_relay (GPU memory, zeroed before the launch: 0 running, kRelayStop, or kRelayGone once
/// block 0 left by its budget, after which every block reads control->stop itself).
/// blockDim.x: a multiple of 32, at most 1024; launch few enough blocks to be resident.
inline constexpr std::uint32_t kRelayStop = 1, kRelayGone = 2;

static __global__ void drive_controller_kernel(const DriveQueueView* queues, std::uint32_t queue_count,
                                               DriveControl* control, std::uint32_t* stop_relay,
                                               std::uint64_t budget_ns) {
  __shared__ drive_detail::DriveStep step;
  __shared__ std::uint32_t leave_word;
  const std::uint32_t lane = threadIdx.x % 32;
  if (lane == 0)
    accel::SystemAtomicRef<std::uint32_t>(control->running_warps).fetch_add(1, accel::MemoryOrder::relaxed);
  const std::uint64_t deadline = accel::timer_ns() + budget_ns;
  std::uint64_t next_stop_poll = 0;
  for (;;) {
    std::uint32_t work = 0;
    std::uint64_t in_flight = 0;
    for (std::uint32_t q = blockIdx.x; q < queue_count; q += gridDim.x) {
      work += drive_detail::service(queues[q], step);
      // Thread 0 alone decides whether the block leaves; warp 0 may already update the state again.
      if (threadIdx.x == 0) in_flight += queues[q].state->fetched - queues[q].state->completed;
    }
    if (work != 0) continue;  // the same in every thread (service returns the block's step)
    if (threadIdx.x == 0) {
      std::uint32_t leave = 0;
      const std::uint64_t now = accel::timer_ns();
      // Block 0 alone reads the host's stop word (mapped pinned memory: a PCIe round trip), every
      // 20 us, and relays it into GPU memory, which the others read (an L2 hit). With every idle
      // block reading it, 128 blocks (8 controllers of 16 queues) made a striped batch of 1024 x
      // 4 KiB 50 times slower on an H200 (docs/benchmarks.md, "striped_nvme"); the null
      // controller's rule, NullControllerSettings::stop_relay.
      accel::DeviceAtomicRef<std::uint32_t> relay(*stop_relay);
      std::uint32_t relayed = relay.load(accel::MemoryOrder::acquire);
      if ((blockIdx.x == 0 || relayed == kRelayGone) && now >= next_stop_poll) {
        next_stop_poll = now + 20'000;
        if (accel::SystemAtomicRef<std::uint32_t>(control->stop).load(accel::MemoryOrder::acquire) != 0) {
          if (blockIdx.x == 0) relay.store(kRelayStop, accel::MemoryOrder::release);
          relayed = kRelayStop;
        }
      }
      if (in_flight == 0 && relayed == kRelayStop) leave = 1;
      if (leave == 0 && now >= deadline) {
        leave = 2;
        // Block 0 leaving by its budget stops relaying: the others then read the host's word.
        if (blockIdx.x == 0) relay.store(kRelayGone, accel::MemoryOrder::release);
      }
      leave_word = leave;
    }
    __syncthreads();
    const std::uint32_t leave = leave_word;
    __syncthreads();  // every thread read it before thread 0 writes it again
    if (leave == 2 && lane == 0)
      accel::SystemAtomicRef<std::uint32_t>(control->deadline_exits).fetch_add(1, accel::MemoryOrder::relaxed);
    if (leave != 0) return;
    if (threadIdx.x == 0 && in_flight == 0) __nanosleep(500);
  }
}

/// The diagnostics' probe (DriveNvmeController::debug_dump): writes the GPU's clock
/// (accel::timer_ns, the clock of every due time) to *out. That it ran at all says that a kernel
/// launched now gets to run beside whatever runs on the device.
static __global__ void drive_clock_probe_kernel(unsigned long long* out) {
  if (threadIdx.x == 0) *out = accel::timer_ns();
}
#endif  // __CUDACC__

/// The data-moving controller behind nvme::Controller (see the file comment). Bring it up, create
/// the DataPath over it, then start a DriveService over its queues; delete nothing and free no
/// device memory while the service runs (cudaFree waits for every kernel, the service included).
class DriveNvmeController final : public test::AgentNvmeController {
 public:
  explicit DriveNvmeController(DriveSettings settings = {})
      : AgentNvmeController("drive controller"), settings_(settings) {}
  ~DriveNvmeController() override {
    if (debug_stream_ != nullptr) (void)cudaStreamDestroy(debug_stream_);
  }
  DriveNvmeController(const DriveNvmeController&) = delete;
  DriveNvmeController& operator=(const DriveNvmeController&) = delete;

  std::string_view kind() const noexcept override { return "drive (GPU-resident, data-moving)"; }

  Status bring_up(const nvme::BringUpOptions& options) override {
    if (settings_.namespace_bytes == 0 || settings_.namespace_bytes % kDriveLbaSize != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "drive controller: namespace_bytes = {} must be a positive multiple of 4096",
                   settings_.namespace_bytes);
    auto ns = settings_.namespace_in_host ? test::AgentBuffer::mapped_host(settings_.namespace_bytes)
                                          : test::AgentBuffer::allocate(settings_.namespace_bytes);
    if (!ns) return ns.status().with_context("drive controller: namespace");
    namespace_ = std::move(*ns);
    auto state = test::AgentBuffer::allocate(sizeof(DriveControllerState));
    if (!state) return state.status().with_context("drive controller: state");
    state_ = std::move(*state);
    std::uint64_t namespace_lbas = settings_.namespace_bytes / kDriveLbaSize;
    if (!settings_.lba_map.empty()) {
      auto mapped = check_lba_map();
      if (!mapped) return mapped.status();
      namespace_lbas = std::max(namespace_lbas, *mapped);
      const std::size_t map_bytes = settings_.lba_map.size() * sizeof(DriveLbaRange);
      auto map = test::AgentBuffer::allocate(map_bytes);
      if (!map) return map.status().with_context("drive controller: LBA map");
      lba_map_ = std::move(*map);
      TUTTI_RETURN_IF_ERROR(accel::copy_to_device(lba_map_.as<void>(), settings_.lba_map.data(), map_bytes));
    }
    TUTTI_RETURN_IF_ERROR(set_timing(settings_.latency_ns, settings_.bytes_per_second));
    // The diagnostics' staging memory and stream, made now: an allocation while a service runs
    // would keep later kernels from running beside it (debug_dump).
    auto staging = test::AgentBuffer::mapped_host(kDebugStagingBytes);
    if (!staging) return staging.status().with_context("drive controller: diagnostics staging");
    debug_staging_ = std::move(*staging);
    if (debug_stream_ == nullptr && cudaStreamCreateWithFlags(&debug_stream_, cudaStreamNonBlocking) != cudaSuccess) {
      debug_stream_ = nullptr;
      return error(StatusCode::DEVICE_ERROR, "drive controller: cudaStreamCreateWithFlags for diagnostics failed");
    }
    set_identity(options.nsid, namespace_lbas, "GPU-resident drive controller (tests and benchmarks)");
    return Status::success();
  }

  /// Changes the latency and the link cap (and resets the link's reservation). Only while no
  /// service runs over this controller. Errors: the copy's.
  Status set_timing(std::uint64_t latency_ns, std::uint64_t bytes_per_second) {
    settings_.latency_ns = latency_ns;
    settings_.bytes_per_second = bytes_per_second;
    DriveControllerState s{};
    s.namespace_data = namespace_.as<std::uint8_t>();
    s.namespace_bytes = settings_.namespace_bytes;
    s.latency_ns = latency_ns;
    s.bytes_per_second = bytes_per_second;
    s.lba_map = lba_map_.as<DriveLbaRange>();
    s.lba_map_ranges = settings_.lba_map.size();
    return accel::copy_to_device(state_.as<void>(), &s, sizeof(s));
  }

  /// The namespace's bytes (GPU memory or mapped pinned host memory, namespace_bytes of them).
  std::uint8_t* namespace_data() const noexcept { return namespace_.as<std::uint8_t>(); }
  const DriveSettings& settings() const noexcept { return settings_; }

  /// The service's views of every I/O queue pair, in qid order.
  std::vector<DriveQueueView> views() const {
    std::scoped_lock lock(mutex_);
    std::vector<DriveQueueView> out;
    for (const auto& [qid, q] : queues_) {
      DriveQueueView v = queue_view<DriveQueueView>(qid, q);
      v.commands = q.commands.as<DriveCommand>();
      v.controller = state_.as<DriveControllerState>();
      out.push_back(v);
    }
    return out;
  }
  /// Queue `qid`'s controller state (copied from GPU memory).
  Result<DriveQueueState> queue_state(std::uint16_t qid) const {
    std::scoped_lock lock(mutex_);
    const auto found = queues_.find(qid);
    if (found == queues_.end()) return error(StatusCode::NOT_FOUND, "drive controller: no queue pair {}", qid);
    DriveQueueState s{};
    TUTTI_RETURN_IF_ERROR(accel::copy_from_device(&s, found->second.state(), sizeof(s)));
    return s;
  }
  /// Sets queue `qid`'s fault words (absolute SQ positions; kDriveNoFault: none). Only while no
  /// service runs over the queue.
  Status inject(std::uint16_t qid, std::uint64_t fail_command, std::uint32_t fail_status, std::uint64_t drop_command) {
    auto s = queue_state(qid);
    if (!s) return s.status();
    s->fail_command = fail_command;
    s->fail_status = fail_status;
    s->drop_command = drop_command;
    std::scoped_lock lock(mutex_);
    return accel::copy_to_device(queues_.at(qid).state(), &s.value(), sizeof(DriveQueueState));
  }

#if defined(__CUDACC__)
  /// Diagnostics for a batch that is late (tests and benchmarks call it on a timeout; never on a
  /// hot path). A text dump of, first, whether a kernel launched now runs (a probe kernel reads the
  /// GPU's clock), then, per I/O queue pair in qid order (at most `max_queues`): the SQ tail and CQ
  /// head doorbells and CSTS as the controller reads them; the controller's state (SQEs fetched,
  /// commands completed, CQEs posted with the CQ slot and Phase Tag of the next one, bytes moved,
  /// failed, dropped, the fault words); the commands fetched and not completed (at most
  /// `max_entries`: SQ position, CID, opcode, SLBA, blocks, PRP1/PRP2, the status decided at fetch,
  /// the due time against the GPU's clock); the SQEs announced by the tail doorbell and not yet
  /// fetched (at most `max_entries`); and the CQ slots before and at the next CQE (dword 3: CID,
  /// status, Phase Tag; SQ head pointer). Every read is one asynchronous copy on the controller's
  /// own non-blocking stream into pinned memory made at bring_up, waited for at most `timeout_ns`:
  /// safe while a service runs (it neither allocates nor touches the legacy default stream), and
  /// bounded when the device is stuck (the dump then says which read did not finish and stops; the
  /// copy may still land later, into the staging memory only). Thread-safety: one caller at a time;
  /// takes the queue mutex.
  std::string debug_dump(std::uint32_t max_queues = 16, std::uint32_t max_entries = 8,
                         std::uint64_t timeout_ns = 1'000'000'000) const {
    if (debug_stream_ == nullptr || debug_staging_.as<void>() == nullptr)
      return "drive controller: not brought up (no diagnostics stream)\n";
    auto* staging = debug_staging_.as<unsigned char>();
    const auto wait = [&](const char* what) -> Status {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
      for (;;) {
        const cudaError_t state = cudaStreamQuery(debug_stream_);
        if (state == cudaSuccess) return Status::success();
        if (state != cudaErrorNotReady)
          return error(StatusCode::DEVICE_ERROR, "{}: {} ({})", what, cudaGetErrorString(state),
                       cudaGetErrorName(state));
        if (std::chrono::steady_clock::now() > deadline)
          return error(StatusCode::TIMEOUT, "{}: not finished after {} ns (the device runs no new work now)", what,
                       timeout_ns);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    };
    // One read of `bytes` at `from` (GPU memory) into the staging memory, bounded.
    const auto read = [&](const void* from, std::size_t bytes, const char* what) -> Status {
      if (bytes > kDebugStagingBytes)
        return error(StatusCode::INVALID_ARGUMENT, "{}: {} bytes > staging {}", what, bytes, kDebugStagingBytes);
      if (const cudaError_t e = cudaMemcpyAsync(staging, from, bytes, cudaMemcpyDefault, debug_stream_);
          e != cudaSuccess)
        return error(StatusCode::DEVICE_ERROR, "{}: cudaMemcpyAsync: {}", what, cudaGetErrorString(e));
      return wait(what);
    };
    std::string out =
        fmt::format("drive controller ({} queue pairs, latency {} ns, link cap {} B/s, namespace in {}):\n",
                    queues_size(), settings_.latency_ns, settings_.bytes_per_second,
                    settings_.namespace_in_host ? "pinned host memory" : "GPU memory");
    // The probe kernel: does new work run at all, and what does the GPU's clock read?
    auto* clock = reinterpret_cast<volatile unsigned long long*>(staging + kDebugStagingBytes - 64);
    *clock = 0;
    drive_clock_probe_kernel<<<1, 32, 0, debug_stream_>>>(
        reinterpret_cast<unsigned long long*>(staging + kDebugStagingBytes - 64));
    const cudaError_t launched = cudaGetLastError();
    const Status probed = launched == cudaSuccess ? wait("probe kernel")
                                                  : error(StatusCode::DEVICE_ERROR, "probe kernel launch: {}",
                                                          cudaGetErrorString(launched));
    if (!probed.is_ok()) return out + "  " + probed.to_string() + "; no further reads\n";
    const std::uint64_t now = *clock;
    out += fmt::format("  a probe kernel launched now ran: GPU clock {} ns\n", now);
    std::scoped_lock lock(mutex_);
    std::uint32_t shown = 0;
    for (const auto& [qid, q] : queues_) {
      if (shown++ == max_queues) {
        out += fmt::format("  ({} more queue pairs not shown)\n", queues_.size() - max_queues);
        break;
      }
      const std::uint32_t depth = q.info.depth;
      if (Status s = read(q.words.as<void>(), kQueueState + sizeof(DriveQueueState), "word page"); !s.is_ok())
        return out + fmt::format("  qid {}: {}; no further reads\n", qid, s.to_string());
      std::uint32_t sq_tail = 0, cq_head = 0, csts = 0;
      std::memcpy(&sq_tail, staging + kSubmissionTailDoorbell, 4);
      std::memcpy(&cq_head, staging + kCompletionHeadDoorbell, 4);
      std::memcpy(&csts, staging + kControllerStatus, 4);
      DriveQueueState st{};
      std::memcpy(&st, staging + kQueueState, sizeof(st));
      const auto fault = [](std::uint64_t p) { return p == kDriveNoFault ? std::string("none") : std::to_string(p); };
      const std::uint32_t announced = sq_tail < depth ? test::announced_entries(sq_tail, st.fetched, depth) : 0;
      out += fmt::format(
          "  qid {} (depth {}): SQ tail doorbell {}{} | CQ head doorbell {}{} | CSTS {:#x} | fetched {} completed {} "
          "(in flight {}) announced-not-fetched {} | CQEs posted {} (next CQ slot {}, Phase Tag {}) free CQ slots {} | "
          "bytes moved {} failed {} dropped {} | fail_command {} drop_command {}\n",
          qid, depth, sq_tail, sq_tail < depth ? "" : " (INVALID: >= depth, ignored)", cq_head,
          cq_head < depth ? "" : " (INVALID: >= depth: no CQE is posted)", csts, st.fetched, st.completed,
          st.fetched - st.completed, announced, st.cq_tail, st.cq_tail % depth,
          ((st.cq_tail / depth) & 1u) == 0 ? 1 : 0,
          cq_head < depth ? test::free_completion_slots(st.cq_tail, cq_head, depth) : 0, st.bytes_moved, st.failed,
          st.dropped, fault(st.fail_command), fault(st.drop_command));
      const std::uint64_t in_flight = st.fetched - st.completed;
      for (std::uint64_t k = 0; k < in_flight && k < max_entries; ++k) {
        const std::uint64_t position = st.completed + k;
        if (Status s = read(q.commands.as<DriveCommand>() + position % depth, sizeof(DriveCommand), "command");
            !s.is_ok())
          return out + fmt::format("    {}; no further reads\n", s.to_string());
        DriveCommand c{};
        std::memcpy(&c, staging, sizeof(c));
        out += fmt::format(
            "    fetched, not completed: SQ position {} CID {:#06x} opcode {:#04x} SLBA {} blocks {} PRP1 {:#x} PRP2 "
            "{:#x} status {:#05x}{} due {} ns ({})\n",
            position, c.cid, c.opcode, c.starting_lba, c.blocks, c.prp1, c.prp2, c.status, c.drop ? " DROP" : "",
            c.due_ns,
            c.due_ns <= now ? fmt::format("{} ns overdue", now - c.due_ns)
                            : fmt::format("due in {} ns", c.due_ns - now));
      }
      if (in_flight > max_entries) out += fmt::format("    ({} more in flight not shown)\n", in_flight - max_entries);
      for (std::uint64_t k = 0; k < announced && k < max_entries; ++k) {
        const std::uint64_t position = st.fetched + k;
        if (Status s = read(q.info.submission_queue + position % depth, sizeof(nvme::SubmissionQueueEntry), "SQE");
            !s.is_ok())
          return out + fmt::format("    {}; no further reads\n", s.to_string());
        nvme::SubmissionQueueEntry e{};
        std::memcpy(&e, staging, sizeof(e));
        out += fmt::format(
            "    announced, not fetched: SQ position {} CID {:#06x} opcode {:#04x} NSID {} PSDT {} SLBA {} blocks {} "
            "PRP1 {:#x} PRP2 {:#x}\n",
            position, e.command_identifier, e.opcode, e.nsid, e.flags >> 6, (std::uint64_t{e.cdw11} << 32) | e.cdw10,
            (e.cdw12 & 0xffffu) + 1, e.data_pointer.prp.prp1, e.data_pointer.prp.prp2);
      }
      for (std::uint64_t position = st.cq_tail >= 2 ? st.cq_tail - 2 : 0; position <= st.cq_tail; ++position) {
        if (Status s = read(q.info.completion_queue + position % depth, sizeof(nvme::CompletionQueueEntry), "CQE");
            !s.is_ok())
          return out + fmt::format("    {}; no further reads\n", s.to_string());
        nvme::CompletionQueueEntry e{};
        std::memcpy(&e, staging, sizeof(e));
        out += fmt::format("    CQ slot {} ({}): CID {:#06x} SCT {:#x} SC {:#04x} Phase Tag {} SQ head {} SQ id {}\n",
                           position % depth, position == st.cq_tail ? "next to post" : "posted", e.command_identifier(),
                           e.status().status_code_type(), e.status().status_code(), e.status().phase(), e.sq_head,
                           e.sq_identifier);
      }
    }
    return out;
  }
#endif  // __CUDACC__

 private:
  std::size_t command_bytes_per_entry() const noexcept override { return sizeof(DriveCommand); }
  Status initialise_queue_state(void* state) override {
    DriveQueueState initial{};
    initial.drop_command = kDriveNoFault;
    initial.fail_command = kDriveNoFault;
    return accel::copy_to_device(state, &initial, sizeof(initial));
  }
  /// GPU memory, or host memory the GPU reaches at the same address (mapped pinned; cudaHostRegister'd
  /// memory with UVA). Anything else is refused.
  Status check_dma_memory(void* address) override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess ||
        (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeHost) ||
        (attributes.type == cudaMemoryTypeHost && attributes.devicePointer != address)) {
      (void)cudaGetLastError();
      return error(StatusCode::UNSUPPORTED,
                   "drive controller: {} is neither GPU memory nor mapped pinned host memory the GPU reaches at the "
                   "same address; register DEVICE memory or cudaHostAlloc'd memory",
                   address);
    }
    return Status::success();
  }
  /// Bus address == address (the GPU reaches both kinds of memory there).
  std::uint64_t bus_address(void* address, std::size_t) override { return reinterpret_cast<std::uint64_t>(address); }
  /// Mapped pinned host memory (the GPU reads PRP lists there).
  Result<test::AgentBuffer> dma_buffer_memory(std::size_t bytes) override {
    return test::AgentBuffer::mapped_host(bytes);
  }

  std::size_t queues_size() const {
    std::scoped_lock lock(mutex_);
    return queues_.size();
  }

  /// Checks DriveSettings::lba_map: no empty range, no range whose LBAs overflow, every range inside
  /// the namespace, sorted by starting_lba without overlap, and no two ranges on the same namespace
  /// blocks (a drive places each LBA in one place); returns the LBA after the last mapped one.
  /// INVALID_ARGUMENT naming the range and the limit.
  Result<std::uint64_t> check_lba_map() const {
    const std::uint64_t namespace_lbas = settings_.namespace_bytes / kDriveLbaSize;
    const auto& map = settings_.lba_map;
    std::uint64_t end = 0;
    for (std::size_t i = 0; i < map.size(); ++i) {
      const DriveLbaRange& r = map[i];
      if (r.blocks == 0)
        return error(StatusCode::INVALID_ARGUMENT, "drive controller: lba_map[{}] has 0 blocks (from LBA {})", i,
                     r.starting_lba);
      if (r.starting_lba > ~std::uint64_t{0} - r.blocks)
        return error(StatusCode::INVALID_ARGUMENT,
                     "drive controller: lba_map[{}] = {} LBAs from {}: its end LBA (start + blocks) exceeds {}", i,
                     r.blocks, r.starting_lba, ~std::uint64_t{0});
      if (r.namespace_lba > namespace_lbas || r.blocks > namespace_lbas - r.namespace_lba)
        return error(StatusCode::INVALID_ARGUMENT,
                     "drive controller: lba_map[{}] = {} LBAs at namespace block {}: beyond the namespace of {} blocks",
                     i, r.blocks, r.namespace_lba, namespace_lbas);
      if (i != 0 && r.starting_lba < end)
        return error(StatusCode::INVALID_ARGUMENT,
                     "drive controller: lba_map[{}] starts at LBA {}, before the end of lba_map[{}] (LBA {}): the "
                     "ranges must be sorted and must not overlap",
                     i, r.starting_lba, i - 1, end);
      end = r.starting_lba + r.blocks;
    }
    std::vector<std::size_t> by_place(map.size());
    for (std::size_t i = 0; i < map.size(); ++i) by_place[i] = i;
    std::sort(by_place.begin(), by_place.end(),
              [&](std::size_t a, std::size_t b) { return map[a].namespace_lba < map[b].namespace_lba; });
    for (std::size_t k = 1; k < by_place.size(); ++k) {
      const DriveLbaRange& before = map[by_place[k - 1]];
      if (map[by_place[k]].namespace_lba < before.namespace_lba + before.blocks)
        return error(StatusCode::INVALID_ARGUMENT,
                     "drive controller: lba_map[{}] starts at namespace block {}, before the end of lba_map[{}] "
                     "(namespace block {}): each LBA must have its own place",
                     by_place[k], map[by_place[k]].namespace_lba, by_place[k - 1],
                     before.namespace_lba + before.blocks);
    }
    return end;
  }

  static constexpr std::size_t kDebugStagingBytes = 8192;  ///< the word page (4096) and the probe's clock
  DriveSettings settings_;
  test::AgentBuffer namespace_, state_, lba_map_;
  test::AgentBuffer debug_staging_;  ///< mapped pinned host memory for debug_dump's reads
  cudaStream_t debug_stream_ = nullptr;
};

#if defined(__CUDACC__)
/// A running drive service over the I/O queues of several controllers (one kernel, its own
/// non-blocking stream). stop() (also the destructor) sets the stop word and waits for the kernel,
/// which leaves once nothing is in flight (or its budget ran out); it returns the warps that left
/// by the budget.
class DriveService {
 public:
  /// Warps per queue when start() is given 0: 8 warps copy 512 KiB from pinned host memory at
  /// more than one Gen5 drive's 14 GB/s, so the link cap, not the copy, paces a controller.
  static constexpr std::uint32_t kDefaultWarpsPerQueue = 8;
  ~DriveService() {
    (void)stop();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  /// Starts one block of `warps_per_queue` warps (0: kDefaultWarpsPerQueue; at most 32) per queue
  /// of `controllers` (at most 264 blocks; beyond that a block services several queues), for at
  /// most budget_ns. Several warps per queue: a drive's commands proceed in parallel whichever
  /// queue carries them, so one queue's data must not be bound by what one warp can copy.
  /// Errors: BUSY (already running), INVALID_ARGUMENT (no queues, warps_per_queue over 32, more blocks than stay
  /// resident with one block's room per multiprocessor left for the DataPath's kernels), DEVICE_ERROR (occupancy query,
  /// launch), TIMEOUT (not running within 5 s).
  Status start(const std::vector<DriveNvmeController*>& controllers, std::uint32_t warps_per_queue,
               std::uint64_t budget_ns) {
    // Its buffers are in use by the running kernel (and cudaFree would wait for it forever).
    if (started_) return error(StatusCode::BUSY, "drive service: already running; stop() it first");
    if (warps_per_queue == 0) warps_per_queue = kDefaultWarpsPerQueue;
    if (warps_per_queue > 32)
      return error(StatusCode::INVALID_ARGUMENT,
                   "drive service: warps_per_queue = {} exceeds 32 (1024 threads a block)", warps_per_queue);
    std::vector<DriveQueueView> all;
    for (DriveNvmeController* c : controllers)
      for (const DriveQueueView& v : c->views()) all.push_back(v);
    if (all.empty()) return error(StatusCode::INVALID_ARGUMENT, "drive service: no queues");
    auto views = test::AgentBuffer::allocate(all.size() * sizeof(DriveQueueView));
    auto control = test::AgentBuffer::mapped_host(sizeof(DriveControl));
    auto relay = test::AgentBuffer::allocate(sizeof(std::uint32_t));
    if (!views || !control || !relay)
      return error(StatusCode::RESOURCE_EXHAUSTED, "drive service: no memory for its views and control words");
    views_ = std::move(*views);
    control_ = std::move(*control);
    stop_relay_ = std::move(*relay);
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(views_.as<void>(), all.data(), all.size() * sizeof(DriveQueueView)));
    const std::uint32_t not_stopped = 0;
    TUTTI_RETURN_IF_ERROR(accel::copy_to_device(stop_relay_.as<void>(), &not_stopped, sizeof(not_stopped)));
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      return error(StatusCode::DEVICE_ERROR, "drive service: cudaStreamCreateWithFlags failed");
    const std::uint32_t blocks = static_cast<std::uint32_t>(all.size() < 264 ? all.size() : 264);
    // Every block must be resident (the kernel is persistent), and a block's worth of room must stay
    // on every multiprocessor for the DataPath's AdmitKernel and PollKernel.
    int per_multiprocessor = 0, multiprocessors = 0, device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, drive_controller_kernel,
                                                      static_cast<int>(warps_per_queue * 32), 0) != cudaSuccess)
      return error(StatusCode::DEVICE_ERROR, "drive service: the device's occupancy query failed");
    const std::uint64_t room =
        per_multiprocessor <= 1 ? 0
                                : std::uint64_t(per_multiprocessor - 1) * static_cast<std::uint64_t>(multiprocessors);
    if (blocks > room)
      return error(StatusCode::INVALID_ARGUMENT,
                   "drive service: {} blocks of {} warps ({} queues) exceed the {} that stay resident beside the "
                   "DataPath's kernels ({} multiprocessors x ({} blocks each - 1)); use fewer warps per queue or "
                   "fewer queues",
                   blocks, warps_per_queue, all.size(), room, multiprocessors, per_multiprocessor);
    warps_ = blocks * warps_per_queue;
    drive_controller_kernel<<<blocks, warps_per_queue * 32, 0, stream_>>>(
        views_.as<DriveQueueView>(), static_cast<std::uint32_t>(all.size()), control_.as<DriveControl>(),
        stop_relay_.as<std::uint32_t>(), budget_ns);
    if (const cudaError_t launched = cudaGetLastError(); launched != cudaSuccess)
      return error(StatusCode::DEVICE_ERROR, "drive service: launch of {} warps: {}", warps_,
                   cudaGetErrorString(launched));
    started_ = true;
    queue_count_ = static_cast<std::uint32_t>(all.size());
    budget_ns_ = budget_ns;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    const volatile DriveControl* c = control_.as<DriveControl>();
    while (c->running_warps < warps_) {
      if (std::chrono::steady_clock::now() > deadline)
        return error(StatusCode::TIMEOUT, "drive service: {} of {} warps running after 5 s", c->running_warps, warps_);
      std::this_thread::yield();
    }
    return Status::success();
  }
  std::uint32_t stop() {
    if (!started_) return deadline_exits_;
    started_ = false;
    volatile DriveControl* c = control_.as<DriveControl>();
    c->stop = 1;
    (void)cudaStreamSynchronize(stream_);
    deadline_exits_ = c->deadline_exits;
    return deadline_exits_;
  }
  std::uint32_t warps() const noexcept { return warps_; }

  /// Diagnostics (never on a hot path): whether the service's kernel still runs (a query of its
  /// stream, which never waits), and its control words: the stop word, the warps that started and
  /// those that left because the budget ran out. Thread-safety: any thread; the words are read
  /// as they are now.
  std::string describe() const {
    if (control_.as<void>() == nullptr) return "drive service: not started";
    const volatile DriveControl* c = control_.as<DriveControl>();
    std::string kernel = "ended";
    if (stream_ != nullptr) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaErrorNotReady)
        kernel = "running";
      else if (state != cudaSuccess)
        kernel = fmt::format("failed: {} ({})", cudaGetErrorString(state), cudaGetErrorName(state));
    }
    return fmt::format(
        "drive service: {} warps over {} queues, budget {} ns, kernel {}, stop word {}, warps started {}, warps that "
        "left because the budget ran out {}{}",
        warps_, queue_count_, budget_ns_, kernel, c->stop, c->running_warps, c->deadline_exits,
        started_ ? "" : " (stop() called)");
  }

 private:
  test::AgentBuffer views_, control_, stop_relay_;  // stop_relay_: control_->stop relayed by block 0 (GPU memory)
  cudaStream_t stream_ = nullptr;
  std::uint32_t queue_count_ = 0;
  std::uint64_t budget_ns_ = 0;
  std::uint32_t warps_ = 0;
  bool started_ = false;
  std::uint32_t deadline_exits_ = 0;
};
#endif  // __CUDACC__

/// Resolves, for DriveNvmeController:
///  - "drive://NAME?bytes=N&at=O" (N > 0 and O multiples of 4096) to one extent of N bytes at
///    namespace byte O of namespace 1, 4096-byte LBAs, no file behind it;
///  - "drive:///ABSOLUTE/PATH" to the extents of a file on a real file system, through the
///    product's FIEMAP resolver (`files`, configured with that file system's block device: it is
///    "file:///ABSOLUTE/PATH" to local_file::LocalFileResolver, every check and error its own);
///    the controller holds those LBAs through its LBA map (DriveSettings::lba_map, drive_files.hpp).
///    INVALID_ARGUMENT when `files` is not set.
struct DriveNamespaceResolver {
  using target_type = local_file::Target;
  static constexpr std::string_view scheme = "drive";
  std::optional<local_file::LocalFileResolver> files;
  Result<local_file::Target> resolve(std::string_view uri, const OpenOptions& options) const {
    if (uri.substr(0, 9) == "drive:///") {
      if (!files)
        return error(StatusCode::INVALID_ARGUMENT,
                     "'{}': a file target needs DriveNamespaceResolver::files (the file system's FIEMAP resolver)",
                     uri);
      return files->resolve(fmt::format("file://{}", uri.substr(8)), options);
    }
    const auto number = [&](std::string_view key, std::uint64_t& out) {
      const std::size_t at = uri.find(key);
      if (at == std::string_view::npos) return false;
      // Decimal digits up to '&' or the end (no <charconv>: nvcc warns about its long double overloads).
      std::size_t i = at + key.size(), digits = 0;
      out = 0;
      for (; i < uri.size() && uri[i] >= '0' && uri[i] <= '9' && digits < 19; ++i, ++digits)
        out = out * 10 + static_cast<std::uint64_t>(uri[i] - '0');
      return digits != 0 && (i == uri.size() || uri[i] == '&');
    };
    std::uint64_t bytes = 0, at = 0;
    if (uri.substr(0, 8) != "drive://" || !number("?bytes=", bytes) || !number("&at=", at) || bytes == 0 ||
        bytes % kDriveLbaSize != 0 || at % kDriveLbaSize != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "'{}': expected drive://NAME?bytes=N&at=O, N > 0 and O multiples of 4096", uri);
    local_file::Target t;
    t.path = std::string(uri);
    t.extents = {local_file::Extent{0, at, bytes}};
    t.file_size = bytes;
    t.lba_size = kDriveLbaSize;
    t.nsid = 1;
    t.writable = options.writable;
    return Result<local_file::Target>(std::move(t));
  }
};
static_assert(Resolver<DriveNamespaceResolver>);

}  // namespace tutti::gpu_test
