// The host profile's baselines: the cached tensors of every layer read without Tutti, with pread(2) and
// O_DIRECT, into the same memory (the pipeline's read slot), from the same files, in the same run
// (striped: from the shard file each tensor lies on, at its shard offset).
//
//   pread_baseline           one thread, one tensor at a time;
//   pread_parallel_baseline  as many threads as Tutti kept requests in flight in the restore
//                            (Report::restore_max_in_flight): the same queue depth, so the ratio
//                            compares the two ways of keeping the disk busy, not one request against many.
//
// Both time the reads alone: each layer's tensors are verified after its reads, untimed, and counted
// under their own source ("pread", "pread xN").
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <tutti/bind/striped_file.hpp>
#include <tutti/core/file_descriptor.hpp>
#include <tutti/core/errno.hpp>

#include "dataset.hpp"
#include "pipeline.hpp"

namespace layerwise {

/// Most threads the queue-depth-matched baseline starts.
inline constexpr std::uint32_t kMaxPreadThreads = 256;

namespace detail {

/// One layer's files, opened O_RDONLY | O_DIRECT: its layer file, or its shard files in shard order.
using LayerFiles = std::vector<tutti::FileDescriptor>;

/// Opens every layer file O_RDONLY | O_DIRECT: in `dirs[0]`, or (striped, shape.stripe_devices = N) the
/// layer's shard i in `dirs[i]` for i < N. INVALID_ARGUMENT when `dirs` does not list N folders.
inline tutti::Result<std::vector<LayerFiles>> open_layer_files(const Shape& shape,
                                                               const std::vector<std::filesystem::path>& dirs) {
  const std::uint32_t devices = std::max(1u, shape.stripe_devices);
  if (dirs.size() != devices)
    return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "pread baseline: {} for {} per layer",
                        counted(dirs.size(), "folder"), counted(devices, "shard file"));
  std::vector<LayerFiles> files(shape.layers);
  for (std::uint32_t l = 0; l < shape.layers; ++l)
    for (const auto& dir : dirs) {
      const auto path = dir / shape.layer_file_name(l);
      tutti::FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
      if (!fd.valid()) return tutti::status_from_errno(errno, fmt::format("open '{}'", path.string()));
      files[l].push_back(std::move(fd));
    }
  return tutti::Result<std::vector<LayerFiles>>(std::move(files));
}

/// Reads cached tensor `index` (chunk index / 2, K or V by index % 2) of a layer into `destination`
/// (tensor_bytes of host memory, 4096-byte aligned for O_DIRECT): from its layer file, or from the shard
/// file striped_file::place puts it on, at its shard offset.
inline tutti::Status pread_tensor(const LayerFiles& files, std::byte* destination, std::uint32_t index,
                                  const Shape& shape, std::uint32_t layer) {
  const std::uint64_t logical = shape.tensor_offset(index / 2, index % 2);
  const auto at = tutti::striped_file::place(logical, shape.tensor_bytes, static_cast<std::uint32_t>(files.size()));
  const std::uint64_t offset = at.shard_offset;
  const ssize_t n = ::pread(files[at.shard].get(), destination, shape.tensor_bytes, static_cast<off_t>(offset));
  if (n == static_cast<ssize_t>(shape.tensor_bytes)) return tutti::Status::success();
  const int err = errno;  // formatted on failure only: the reads are timed
  const std::string where =
      files.size() == 1 ? fmt::format("layer {} offset {}", layer, offset)
                        : fmt::format("layer {} offset {} (shard {} offset {})", layer, logical, at.shard, offset);
  if (n < 0) return tutti::status_from_errno(err, fmt::format("pread {}", where));
  return tutti::error(tutti::StatusCode::DATA_LOSS, "pread of {} returned {} of {} bytes", where, n,
                      shape.tensor_bytes);
}

}  // namespace detail

/// One thread, one tensor at a time, into report.pread_baseline.
template <class Runtime>
tutti::Status pread_baseline(const Settings& settings, const std::vector<std::filesystem::path>& dirs,
                             Pipeline<Runtime>& pipeline, const Checksums& sums, Report& report) {
  const Shape& shape = settings.shape;
  auto fds = detail::open_layer_files(shape, dirs);
  if (!fds) return fds.status();
  const std::uint32_t tensors = shape.hit_chunks() * 2;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    std::byte* slot = pipeline.read_slot(l);
    std::memset(slot, 0xa5, std::uint64_t{tensors} * shape.tensor_bytes);  // a read that moves nothing fails
    for (std::uint32_t i = 0; i < tensors; ++i) {
      const auto t = Clock::now();
      tutti::Status s = detail::pread_tensor((*fds)[l], slot + std::uint64_t{i} * shape.tensor_bytes, i, shape, l);
      report.pread_baseline.ns += elapsed_ns(t);
      TUTTI_RETURN_IF_ERROR(s);
      report.pread_baseline.bytes += shape.tensor_bytes;
      ++report.pread_baseline.requests;
    }
    if (settings.verify) check_cached_layer(slot, l, shape, sums, "pread", report);
  }
  return tutti::Status::success();
}

/// `threads` threads (1..kMaxPreadThreads) read each layer's cached tensors (each takes the next tensor
/// until none is left; the layer ends when all are read, as Tutti's restore drains a layer), into
/// report.pread_parallel. Checks are counted under "pread x<threads>".
template <class Runtime>
tutti::Status pread_parallel_baseline(const Settings& settings, const std::vector<std::filesystem::path>& dirs,
                                      Pipeline<Runtime>& pipeline, const Checksums& sums, std::uint32_t threads,
                                      Report& report) {
  const Shape& shape = settings.shape;
  const std::uint32_t tensors = shape.hit_chunks() * 2;
  threads = std::clamp<std::uint32_t>(threads, 1, kMaxPreadThreads);
  report.pread_parallel_threads = threads;
  if (tensors == 0) return tutti::Status::success();
  auto fds = detail::open_layer_files(shape, dirs);
  if (!fds) return fds.status();

  // One layer at a time: the driving thread publishes the layer, releases the workers through `start`
  // and waits for them at `done`; the barriers order the publication and the reads.
  struct Shared {
    const detail::LayerFiles* files = nullptr;
    std::byte* slot = nullptr;
    std::uint32_t layer = 0;
    bool stop = false;
    std::atomic<std::uint32_t> next{0};
    std::mutex mutex;
    tutti::Status first_error;
  } shared;
  std::barrier start(static_cast<std::ptrdiff_t>(threads) + 1);
  std::barrier done(static_cast<std::ptrdiff_t>(threads) + 1);
  std::vector<std::jthread> workers;
  for (std::uint32_t t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      for (;;) {
        start.arrive_and_wait();
        if (shared.stop) return;
        for (std::uint32_t i; (i = shared.next.fetch_add(1, std::memory_order_relaxed)) < tensors;) {
          tutti::Status s = detail::pread_tensor(*shared.files, shared.slot + std::uint64_t{i} * shape.tensor_bytes, i,
                                                 shape, shared.layer);
          if (!s.is_ok()) {
            std::lock_guard lock(shared.mutex);
            if (shared.first_error.is_ok()) shared.first_error = std::move(s);
          }
        }
        done.arrive_and_wait();
      }
    });
  const std::string source = fmt::format("pread x{}", threads);
  tutti::Status status;
  for (std::uint32_t l = 0; l < shape.layers && status.is_ok(); ++l) {
    shared.files = &(*fds)[l];
    shared.slot = pipeline.read_slot(l);
    shared.layer = l;
    shared.next.store(0, std::memory_order_relaxed);
    std::memset(shared.slot, 0xa5, std::uint64_t{tensors} * shape.tensor_bytes);
    const auto t = Clock::now();
    start.arrive_and_wait();
    done.arrive_and_wait();
    report.pread_parallel.ns += elapsed_ns(t);
    {
      std::lock_guard lock(shared.mutex);
      status = shared.first_error;
    }
    if (!status.is_ok()) break;
    report.pread_parallel.bytes += std::uint64_t{tensors} * shape.tensor_bytes;
    report.pread_parallel.requests += tensors;
    if (settings.verify) check_cached_layer(shared.slot, l, shape, sums, source, report);
  }
  shared.stop = true;
  start.arrive_and_wait();  // the workers see stop and return; the jthreads join
  return status;
}

}  // namespace layerwise
