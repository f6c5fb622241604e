// The command driver kernel of the GPU suite and the GPU benchmark: every warp of the grid picks
// its queue with path::gpu::select_queue and runs `commands_per_warp` 4 KiB Read commands through
// it, closed loop, 32 at a time (one per lane): warp_submit, then warp_wait. A lane whose command
// was refused (RESOURCE_EXHAUSTED: no CID free) submits it again in the next round.
//
// Command c (global index, warp-major) is a Read of one 4 KiB logical block (NLB = 0, LBA format
// of 4096 bytes) at SLBA c, PRP1 = kFakeBusBase + c * 4096 (the null controller moves no data).
// Results per command go to `records` when it is not null.
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/path/gpu/warp.hpp>
#include <tutti/path/gpu/warp_queue.hpp>

namespace tutti::gpu_test {

inline constexpr std::uint64_t kFakeBusBase = 0x100000000ull;

/// What happened to one command.
struct CommandRecord {
  std::uint32_t status;       ///< StatusCode of the wait (OK, TIMEOUT, DEVICE_ERROR); kNotRun if never submitted
  std::uint32_t completions;  ///< completions this command received (must be exactly 1, or 0 after TIMEOUT)
  std::uint32_t echo_ok;      ///< 1 when the CQE's CID is the command's and DW0 echoes its SLBA
  std::uint32_t refusals;     ///< RESOURCE_EXHAUSTED answers before it was submitted
  std::uint64_t wait_ns;      ///< %globaltimer ns spent in warp_wait for it
  std::uint32_t queue;        ///< index of the queue it went to
  std::uint32_t cid;          ///< its CID
};
inline constexpr std::uint32_t kNotRun = 0xffffffffu;

struct CommandKernelArgs {
  const nvme::QueuePair* queues = nullptr;  ///< device array of queue_count views
  std::uint32_t queue_count = 1;
  std::uint32_t commands_per_warp = 32;
  CommandRecord* records = nullptr;         ///< warps * commands_per_warp records, or null
  std::uint32_t* warp_queue = nullptr;      ///< per global warp: its queue, or null
  unsigned long long* completed = nullptr;  ///< total commands completed OK (one atomic per warp)
  unsigned long long* unfinished = nullptr; ///< commands never completed because the kernel budget ran out
  std::uint64_t budget_ns = 5'000'000'000ull;    ///< per warp, whole run
  std::uint64_t wait_budget_ns = 100'000'000ull; ///< per warp_wait
};

/// One warp per 32 threads; blockDim.x must be a multiple of 32. See the header comment.
static __global__ void command_kernel(CommandKernelArgs args) {
  using namespace tutti::path::gpu;
  const std::uint32_t lane = lane_id();
  const std::uint32_t warp = threadIdx.x / kDeviceWarpSize;
  const std::uint32_t warps_per_block = blockDim.x / kDeviceWarpSize;
  const std::uint64_t global_warp = static_cast<std::uint64_t>(blockIdx.x) * warps_per_block + warp;
  const std::uint32_t q = select_queue(blockIdx.x, gridDim.x, warp, args.queue_count);
  const nvme::QueuePair queue = args.queues[q];
  if (lane == 0 && args.warp_queue != nullptr) args.warp_queue[global_warp] = q;
  const std::uint64_t deadline = accel::deadline_after(args.budget_ns);
  std::uint32_t next = lane;  // this lane's commands: lane, lane + 32, ...
  std::uint32_t refusals = 0;
  unsigned long long completed = 0;
  for (;;) {
    const bool pending = next < args.commands_per_warp;
    if (warp_ballot(pending) == 0) break;
    if (warp_broadcast(accel::timer_ns() >= deadline ? 1u : 0u, 0) != 0) break;  // lane 0's clock decides for the warp
    const std::uint64_t command = global_warp * args.commands_per_warp + next;
    nvme::SubmissionQueueEntry sqe{};
    sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::read);
    sqe.nsid = 1;
    sqe.data_pointer.prp.prp1 = kFakeBusBase + command * 4096;
    sqe.cdw10 = static_cast<std::uint32_t>(command);        // SLBA 31:0
    sqe.cdw11 = static_cast<std::uint32_t>(command >> 32);  // SLBA 63:32
    sqe.cdw12 = 0;                                          // NLB 0's based: one 4 KiB block
    const LaneSubmission submission = warp_submit(queue, sqe, pending, deadline);
    const std::uint64_t wait_start = accel::timer_ns();
    const std::uint64_t wait_deadline = accel::deadline_after(args.wait_budget_ns);
    const nvme::WaitResult result = warp_wait(queue, submission.cid, submission.submitted,
                                              wait_deadline < deadline ? wait_deadline : deadline);
    const std::uint64_t waited = accel::timer_ns() - wait_start;
    if (submission.submitted) {
      if (result.status == StatusCode::OK) ++completed;
      if (args.records != nullptr) {
        CommandRecord& r = args.records[command];
        r.status = static_cast<std::uint32_t>(result.status);
        r.completions += result.status == StatusCode::OK ? 1u : 0u;
        r.echo_ok = result.status == StatusCode::OK && result.completion.command_identifier() == submission.cid &&
                    result.completion.dw0 == sqe.cdw10;
        r.refusals = refusals;
        r.wait_ns = waited;
        r.queue = q;
        r.cid = submission.cid;
      }
      next += kDeviceWarpSize;
      refusals = 0;
    } else if (pending) {
      ++refusals;
    }
  }
  // Commands of this lane that never ran (kernel budget spent).
  unsigned long long unfinished = next < args.commands_per_warp ? (args.commands_per_warp - next + kDeviceWarpSize - 1) / kDeviceWarpSize : 0;
  for (int offset = 16; offset > 0; offset /= 2) {
    completed += __shfl_down_sync(0xffffffffu, completed, offset);
    unfinished += __shfl_down_sync(0xffffffffu, unfinished, offset);
  }
  if (lane == 0) {
    if (args.completed != nullptr) atomicAdd(args.completed, completed);
    if (args.unfinished != nullptr && unfinished != 0) atomicAdd(args.unfinished, unfinished);
  }
}

}  // namespace tutti::gpu_test
