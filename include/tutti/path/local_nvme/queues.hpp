// The local_nvme DataPath's I/O queue pairs: one nvme::QueuePairStorage per pair created on the
// controller (nvme::Controller::create_io_queue_pair), its command credits (depth - 1 commands in
// flight: Base 2.0, 3.3.1.5, a full queue has one empty slot), and the kernels' view of both
// (DeviceQueue, kernels.hpp).
// Units: entries and commands. Thread-safety: created once by create(); the queue memory then
// follows nvme/queue.hpp's rules, credits are nvme::kSubmitterScope atomics.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/placement.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/controller.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/path/local_nvme/kernel_array.hpp>
#include <tutti/path/local_nvme/kernels.hpp>

namespace tutti::local_nvme {

/// One queue pair's credit counter, on its own cache line.
struct alignas(64) Credits {
  std::uint32_t value = 0;
};

/// One I/O queue pair of the DataPath.
struct Queue {
  nvme::QueuePairInfo info;
  std::unique_ptr<nvme::QueuePairStorage> storage;
  std::uint32_t* credits = nullptr;  ///< into the DataPath's credit array (kernel-reachable)
  DeviceQueue device() noexcept { return DeviceQueue{storage->queue(), credits}; }
};

/// Creates `count` I/O queue pairs of `depth` entries on `controller`, appending each to `queues`
/// as soon as it exists (so the caller deletes what was created when a later one fails), with
/// credits[i] = depth - 1. `credits` must hold `count` entries at stable addresses.
/// Errors: create_io_queue_pair's (with the pair's number), RESOURCE_EXHAUSTED (no memory for the
/// queue state), INTERNAL (a depth the queue state rejects).
inline Status create_queue_pairs(nvme::Controller& controller, std::uint32_t count, std::uint32_t depth,
                                 KernelArray<Credits>& credits, std::vector<std::unique_ptr<Queue>>& queues) {
  for (std::uint32_t i = 0; i < count; ++i) {
    auto info = controller.create_io_queue_pair(depth);
    if (!info) return info.status().with_context(fmt::format("local_nvme: creating I/O queue pair {}", i + 1));
    auto q = std::make_unique<Queue>();
    q->info = *info;
    try {
      q->storage = std::make_unique<nvme::QueuePairStorage>(
          info->submission_queue, info->completion_queue, info->submission_queue_tail_doorbell,
          info->completion_queue_head_doorbell, info->controller_status, info->depth, info->qid, 0,
          accel::kKernelReachable);
    } catch (const std::bad_alloc&) {
      (void)controller.delete_io_queue_pair(info->qid);
      return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the state of I/O queue pair {}",
                   info->qid);
    }
    q->credits = &credits[i].value;
    *q->credits = info->depth - 1;
    const bool valid = q->storage->valid();
    queues.push_back(std::move(q));
    if (!valid)
      return error(StatusCode::INTERNAL, "local_nvme: queue pair {} has an invalid depth {}", info->qid, info->depth);
  }
  return Status::success();
}

}  // namespace tutti::local_nvme
