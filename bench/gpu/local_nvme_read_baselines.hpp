// The baselines of tutti-bench-gpu-local-nvme (bench/gpu/local_nvme_read.cu) that run on host
// threads only: the uring DataPath and cuFile reading the benchmark's file into its GPU memory.
// They live in a C++ translation unit (local_nvme_read_baselines.cpp, compiled by the host
// compiler) so that nvcc never compiles liburing's macros or the runtime's templates; the .cu file
// keeps the GPU kernels (local_nvme's submit/poll, the poison and verification kernels).
//
// Shapes and units: `file` holds file_bytes bytes (a multiple of request_bytes) followed by slack;
// `device` is cudaMalloc'ed GPU memory of at least file_bytes bytes; request k reads file bytes
// [k x request_bytes, (k + 1) x request_bytes) into device + k x request_bytes. Rates in GiB/s
// (2^30 bytes per second). Thread-safety: call from one thread; each measurement uses its own
// threads and joins them before it returns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace tutti::bench::gpu_read {

/// The best pass of one path at one request size; errors and mismatched_bytes add up every pass.
struct Row {
  std::string path;
  std::uint64_t request_bytes = 0;
  std::uint64_t bytes = 0;             ///< Bytes confirmed moved in the best pass.
  std::uint64_t requests = 0;          ///< Requests completed in the best pass.
  double seconds = 0;                  ///< Wall time of the best pass.
  std::uint64_t errors = 0;            ///< Failed, refused or short requests, all passes.
  std::uint64_t mismatched_bytes = 0;  ///< GPU bytes that differed from the file after a pass, all passes.
  std::string note;                    ///< How the path ran (cuFile's buffer registration, a setup failure).
  double gib_per_second() const { return seconds > 0 ? bytes / seconds / (1024.0 * 1024 * 1024) : 0; }
  double requests_per_second() const { return seconds > 0 ? requests / seconds : 0; }
};

/// How every pass is framed: `repeat` passes (>= 1), each after poison() (fills the GPU memory with
/// bytes that differ from the file's; false on a CUDA error, counted as an error) and followed by
/// mismatches(label) (the number of GPU bytes that differ from the file, byte for byte).
struct PassFrame {
  std::uint32_t repeat = 1;
  std::function<bool()> poison;
  std::function<std::uint64_t(const std::string& label)> mismatches;
};

/// Best of frame.repeat passes of pass(row): pass fills bytes, requests, seconds and errors.
template <class Pass>
Row best_of(std::string name, std::uint64_t request_bytes, const PassFrame& frame, Pass&& pass) {
  Row best;
  best.path = std::move(name);
  best.request_bytes = request_bytes;
  std::uint64_t errors = 0, mismatched = 0;
  for (std::uint32_t p = 0; p < frame.repeat; ++p) {
    Row row;
    row.path = best.path;
    row.request_bytes = request_bytes;
    if (!frame.poison()) ++row.errors;
    pass(row);
    row.mismatched_bytes = frame.mismatches(row.path + " request=" + std::to_string(request_bytes));
    errors += row.errors;
    mismatched += row.mismatched_bytes;
    if (p == 0 || row.gib_per_second() > best.gib_per_second()) best = row;
  }
  best.errors = errors;
  best.mismatched_bytes = mismatched;
  return best;
}

/// The uring DataPath (O_DIRECT io_uring reads into its pinned staging ring sized by
/// bench/support/uring_device_staging.hpp, then cudaMemcpyAsync) reading the whole file in
/// request_bytes requests, two submits of queue_depth / 2 requests in flight, every wait bounded
/// by 60 s. A setup failure (io_uring refused, open, register_memory) is one error and a note. A
/// wait that times out ends the process (exit 1) without freeing memory the reads may still target.
Row measure_uring(const std::string& file, void* device, std::uint64_t file_bytes, std::uint64_t request_bytes,
                  std::uint32_t queue_depth, const PassFrame& frame);

/// cuFile's driver and the GPU memory described to it (cuFileBufRegister where it accepts it), for
/// the whole run. Opaque; exists only where libcufile was found (TUTTI_HAVE_CUFILE).
class CufileSession;

/// Opens the cuFile driver (compat mode allowed; forced without nvidia-fs) and registers
/// [device, device + bytes). Null when cuFile cannot be used; `description` then says why, and
/// otherwise which mode cuFile runs in (DriverInfo::describe()). Without TUTTI_HAVE_CUFILE: null,
/// "not built ...".
std::unique_ptr<CufileSession, void (*)(CufileSession*)> open_cufile(void* device, std::uint64_t bytes,
                                                                     std::string& description);

/// cuFile reading the whole file in request_bytes ranges with `threads` synchronous cuFileRead
/// calls in flight (bench/support/cufile_reader.hpp; O_DIRECT, or a page-cache descriptor when
/// cuFile refuses O_DIRECT, said in the note). cufile::read returns only after every read it
/// started has returned. A file cuFile refuses is one error and a note.
Row measure_cufile(CufileSession& session, const std::string& file, std::uint64_t file_bytes,
                   std::uint64_t request_bytes, std::uint32_t threads, const PassFrame& frame);

}  // namespace tutti::bench::gpu_read
