// The local_nvme DataPath's I/O queue pairs: one nvme::QueuePairStorage per pair created on the
// controller (nvme::Controller::create_io_queue_pair), its command credits (depth - 1 commands in
// flight: Base 2.0, 3.3.1.5, a full queue has one empty slot), and the kernels' view of both
// (DeviceQueue, kernels.hpp).
// Where their state lives: mapped pinned host memory (accel::kKernelReachable) when the host can
// reach the rings too (the soft controller, host-profile controllers: the host reaps zombies
// there), device memory when only kernels can (place_queue_state).
// Units: entries and commands. Thread-safety: created once by create(); the queue memory then
// follows nvme/queue.hpp's rules, credits are nvme::kSubmitterScope atomics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>
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
  /// Into the DataPath's credit array (kernel-reachable), or into device_credits for a pair whose
  /// queue state is in device memory.
  std::uint32_t* credits = nullptr;
  accel::DeviceBuffer device_credits;  ///< the credit word of a pair whose state is in device memory
  DeviceQueue device() noexcept { return DeviceQueue{storage->queue(), credits}; }
};

/// Moves a pair's queue state and credit word into device memory (QueuePairStorage::move_to_device)
/// when only kernels reach its rings (QueuePairInfo::host_accessible false, e.g. rings in GPU
/// memory): the host then has no use for them (zombies on such pairs are never reaped by the host,
/// zombies.hpp), and the kernels' atomics on them stay on the GPU instead of crossing PCIe. Errors:
/// move_to_device's, allocate_device's and copy_to_device's, naming the pair.
inline Status place_queue_state(Queue& q) {
  if (q.info.host_accessible) return Status::success();
  const auto named = [&](Status s) {
    return s.with_context(fmt::format("local_nvme: queue pair {}'s state into device memory", q.info.qid));
  };
  if (Status moved = q.storage->move_to_device(); !moved.is_ok()) return named(moved);
  auto word = accel::DeviceBuffer::allocate(sizeof(std::uint32_t));
  if (!word) return named(word.status());
  if (Status copied = accel::copy_to_device(word->data(), q.credits, sizeof(std::uint32_t)); !copied.is_ok())
    return named(copied);
  q.device_credits = std::move(word.value());
  q.credits = static_cast<std::uint32_t*>(q.device_credits.data());
  return Status::success();
}

/// The kernels' table of queue views (DeviceQueue, one per pair) copied into device memory
/// (accel::allocate_device): every kernel pass reads its request's entry, which in mapped host
/// memory would be a PCIe round trip per read. The table is written once, before any kernel runs,
/// and never changes. Errors: allocate_device's and copy_to_device's.
inline Result<accel::DeviceBuffer> upload_queue_table(const std::vector<DeviceQueue>& views) {
  auto table = accel::DeviceBuffer::allocate(std::max<std::size_t>(1, views.size()) * sizeof(DeviceQueue));
  if (!table) return table.status().with_context("local_nvme: the kernels' queue table");
  if (Status copied = accel::copy_to_device(table->data(), views.data(), views.size() * sizeof(DeviceQueue));
      !copied.is_ok())
    return copied.with_context("local_nvme: the kernels' queue table");
  return Result<accel::DeviceBuffer>(std::move(table.value()));
}

/// Creates `count` I/O queue pairs of `depth` entries on `controller`, appending each to `queues`
/// as soon as it exists (so the caller deletes what was created when a later one fails), with
/// credits[i] = depth - 1. `credits` must hold `count` entries at stable addresses.
/// `device_queue_state` (Options::device_queue_state): place_queue_state for each pair.
/// Errors: create_io_queue_pair's (with the pair's number), RESOURCE_EXHAUSTED (no memory for the
/// queue state), INTERNAL (a depth the queue state rejects).
inline Status create_queue_pairs(nvme::Controller& controller, std::uint32_t count, std::uint32_t depth,
                                 bool device_queue_state, KernelArray<Credits>& credits,
                                 std::vector<std::unique_ptr<Queue>>& queues) {
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
    Queue& created = *q;
    queues.push_back(std::move(q));
    if (!valid)
      return error(StatusCode::INTERNAL, "local_nvme: queue pair {} has an invalid depth {}", info->qid, info->depth);
    if (device_queue_state) TUTTI_RETURN_IF_ERROR(place_queue_state(created));
  }
  return Status::success();
}

}  // namespace tutti::local_nvme
