// Command-line options of the two GPU benchmarks (tutti-bench-gpu-submit: submit_rate.cpp;
// tutti-bench-gpu-local-nvme: local_nvme_read.cu), parsed with CLI11 in bench_options.cpp, a
// host-compiled translation unit, so nvcc never sees CLI11. Every number is checked against its
// range before use; errors name the flag, the value and the range.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#if defined(TUTTI_ACCELERATOR_CUDA)
#define TUTTI_BENCH_CUDA_PROFILE true
#else
#define TUTTI_BENCH_CUDA_PROFILE false
#endif

namespace tutti::bench::gpu {

/// tutti-bench-gpu-submit's settings (submit_rate.cpp's file comment says what each row measures).
/// Defaults depend on the profile (a GPU wants large batches and many queues; the 2-core host
/// profile machine small ones).
struct SubmitRateOptions {
  static constexpr bool kCuda = TUTTI_BENCH_CUDA_PROFILE;
  std::uint64_t commands = kCuda ? 1u << 22 : 1u << 18;  ///< commands per measured run and row, split over the agents
  std::uint32_t repeat = 3;               ///< measured runs per row (best is reported), after one warm-up
  std::uint32_t depth = 1024;             ///< entries per SQ and CQ
  std::uint32_t queues = kCuda ? 64 : 2;  ///< I/O queue pairs of the DataPath; the raw rows use min(queues, agents)
  /// --batch-sizes: requests per runtime submit, one runtime row each.
  std::vector<std::uint32_t> batch_sizes =
      kCuda ? std::vector<std::uint32_t>{256, 1024, 4096, 16384} : std::vector<std::uint32_t>{32, 256, 1024};
  std::uint32_t submitters = 1;  ///< host threads submitting batches through the runtime
  std::uint32_t stop_relay = 1;  ///< 1: the GPU controller's stop word relayed into GPU memory; 0: polled by every warp
  std::uint64_t stop_poll_ns = 100'000;  ///< NullControllerSettings::stop_poll_interval_ns
  /// --shapes "W:P,W:P,...": the GPU raw rows' (warps, warps per block), W a multiple of P,
  /// 1 <= P <= 32, W <= 2^20; empty: queues warps, 1 and 4 warps per SM.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> shapes;
  /// --raw-threads: the host profile's raw rows, host threads (each on its own queue pair).
  std::vector<std::uint32_t> raw_threads = {1, 2};
  std::string json;  ///< write the rows as JSON here (empty: no file)
};

/// tutti-bench-gpu-local-nvme's settings (local_nvme_read.cu's file comment says what each measures).
struct LocalNvmeReadOptions {
  std::uint64_t file_mib = 512;           ///< size of the file read, MiB
  std::uint32_t batch = 1024;             ///< requests per local_nvme submit
  std::uint32_t queues = 16;              ///< I/O queue pairs
  std::uint32_t workers = 8;              ///< soft controller worker threads (and pread threads)
  std::uint32_t repeat = 3;               ///< passes per path and size (best is reported)
  std::uint32_t uring_queue_depth = 256;  ///< uring requests in flight
  std::uint32_t cufile_threads = 16;      ///< cuFile reader threads
  static constexpr std::uint64_t kMaxPollBudgetNs = 1'000'000'000;  ///< local_nvme's kMaxPollKernelBudgetNs
  std::uint64_t poll_budget_ns = 1'000'000;  ///< local_nvme Options::poll_kernel_budget_ns (0: one pass per launch)
  std::string dir = "/var/tmp";              ///< folder for the file
  std::string json;                          ///< write the rows as JSON here (empty: no file)
};

/// Parses argv into `options` (defaults as above). Returns -1 to run; otherwise the process exit
/// status: 0 after --help (printed), 2 on a bad flag (the message, naming the flag and its limit,
/// is printed to stderr). Thread-safety: call from main, once.
int parse_submit_rate_options(int argc, char** argv, SubmitRateOptions& options);
/// As parse_submit_rate_options, for tutti-bench-gpu-local-nvme.
int parse_local_nvme_read_options(int argc, char** argv, LocalNvmeReadOptions& options);

}  // namespace tutti::bench::gpu
