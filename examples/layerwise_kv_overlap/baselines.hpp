// The host profile's baselines: the cached tensors of every layer read without Tutti, with pread(2) and
// O_DIRECT, into the same memory (the pipeline's read slot), from the same files, in the same run.
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

#include <tutti/core/file_descriptor.hpp>
#include <tutti/core/errno.hpp>

#include "dataset.hpp"
#include "pipeline.hpp"

namespace layerwise {

/// Most threads the queue-depth-matched baseline starts.
inline constexpr std::uint32_t kMaxPreadThreads = 256;

namespace detail {

/// Opens every layer file O_RDONLY | O_DIRECT.
inline tutti::Result<std::vector<tutti::FileDescriptor>> open_layer_files(const Shape& shape,
                                                                          const std::filesystem::path& dir) {
  std::vector<tutti::FileDescriptor> fds;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const auto path = dir / shape.layer_file_name(l);
    tutti::FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
    if (!fd.valid()) return tutti::status_from_errno(errno, fmt::format("open '{}'", path.string()));
    fds.push_back(std::move(fd));
  }
  return tutti::Result<std::vector<tutti::FileDescriptor>>(std::move(fds));
}

/// Reads cached tensor `index` (chunk index / 2, K or V by index % 2) of a layer file into `slot`.
inline tutti::Status pread_tensor(int fd, std::byte* slot, std::uint32_t index, const Shape& shape,
                                  std::uint32_t layer) {
  const std::uint64_t offset = shape.tensor_offset(index / 2, index % 2);
  const ssize_t n =
      ::pread(fd, slot + std::uint64_t{index} * shape.tensor_bytes, shape.tensor_bytes, static_cast<off_t>(offset));
  if (n < 0) return tutti::status_from_errno(errno, fmt::format("pread layer {} offset {}", layer, offset));
  if (n != static_cast<ssize_t>(shape.tensor_bytes))
    return tutti::error(tutti::StatusCode::DATA_LOSS, "pread of layer {} offset {} returned {} of {} bytes", layer,
                        offset, n, shape.tensor_bytes);
  return tutti::Status::success();
}

}  // namespace detail

/// One thread, one tensor at a time, into report.pread_baseline.
template <class Runtime>
tutti::Status pread_baseline(const Settings& settings, const std::filesystem::path& dir, Pipeline<Runtime>& pipeline,
                             const Checksums& sums, Report& report) {
  const Shape& shape = settings.shape;
  auto fds = detail::open_layer_files(shape, dir);
  if (!fds) return fds.status();
  const std::uint32_t tensors = shape.hit_chunks() * 2;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    std::byte* slot = pipeline.read_slot(l);
    std::memset(slot, 0xa5, std::uint64_t{tensors} * shape.tensor_bytes);  // a read that moves nothing fails
    for (std::uint32_t i = 0; i < tensors; ++i) {
      const auto t = Clock::now();
      tutti::Status s = detail::pread_tensor((*fds)[l].get(), slot, i, shape, l);
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
tutti::Status pread_parallel_baseline(const Settings& settings, const std::filesystem::path& dir,
                                      Pipeline<Runtime>& pipeline, const Checksums& sums, std::uint32_t threads,
                                      Report& report) {
  const Shape& shape = settings.shape;
  const std::uint32_t tensors = shape.hit_chunks() * 2;
  threads = std::clamp<std::uint32_t>(threads, 1, kMaxPreadThreads);
  report.pread_parallel_threads = threads;
  if (tensors == 0) return tutti::Status::success();
  auto fds = detail::open_layer_files(shape, dir);
  if (!fds) return fds.status();

  // One layer at a time: the driving thread publishes the layer, releases the workers through `start`
  // and waits for them at `done`; the barriers order the publication and the reads.
  struct Shared {
    int fd = -1;
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
          tutti::Status s = detail::pread_tensor(shared.fd, shared.slot, i, shape, shared.layer);
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
    shared.fd = (*fds)[l].get();
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
