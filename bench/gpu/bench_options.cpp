// CLI11 parsing of the GPU benchmarks' options (bench_options.hpp).
#include "bench_options.hpp"

#include <charconv>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "../support/cli_checks.hpp"

namespace tutti::bench::gpu {
namespace {

using tutti::bench::kDecimal;
using tutti::bench::parse_flags;

/// `text` as a decimal number in [low, high]; false on anything else (sign, space, trailing text).
bool parse_bounded(std::string_view text, std::uint32_t low, std::uint32_t high, std::uint32_t& out) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc{} && end == text.data() + text.size() && !text.empty() && out >= low && out <= high;
}

/// One "W:P" item of --shapes; false (with a message naming the item) when malformed.
bool parse_shape(const std::string& item, std::pair<std::uint32_t, std::uint32_t>& shape) {
  const std::size_t colon = item.find(':');
  const std::string_view view(item);
  const bool ok = colon != std::string::npos && parse_bounded(view.substr(0, colon), 1, 1u << 20, shape.first) &&
                  parse_bounded(view.substr(colon + 1), 1, 32, shape.second) && shape.first % shape.second == 0;
  if (!ok)
    std::fprintf(
        stderr,
        "--shapes: '%s' must be W:P with 1 <= W <= 1048576 warps, 1 <= P <= 32 warps per block, W a multiple of P\n",
        item.c_str());
  return ok;
}

}  // namespace

int parse_submit_rate_options(int argc, char** argv, SubmitRateOptions& o) {
  CLI::App app{
      "tutti-bench-gpu-submit: 4 KiB commands per second through the local_nvme DataPath (public runtime API) "
      "and through the bare warp submission protocol, against a null controller, one run"};
  app.add_option("--commands", o.commands, "commands per measured run and row")
      ->check(kDecimal)
      ->check(CLI::Range(std::uint64_t{1024}, std::uint64_t{1} << 36))
      ->capture_default_str();
  app.add_option("--repeat", o.repeat, "measured runs per row (best reported)")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  app.add_option("--depth", o.depth, "entries per SQ and CQ")
      ->check(kDecimal)
      ->check(CLI::Range(64u, 65536u))
      ->capture_default_str();
  app.add_option("--queues", o.queues, "I/O queue pairs")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  std::vector<std::string> batches, threads;
  app.add_option("--batch-sizes", batches, "B,B,...: requests per runtime submit, one row each (1..65536)")
      ->delimiter(',');
  app.add_option("--submitters", o.submitters, "host threads submitting through the runtime")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--stop-relay", o.stop_relay,
                 "1: relay the GPU controller's stop word into GPU memory; 0: every controller warp polls host memory")
      ->check(kDecimal)
      ->check(CLI::Range(0u, 1u))
      ->capture_default_str();
  app.add_option("--stop-poll-ns", o.stop_poll_ns, "controllers' stop word poll interval, ns")
      ->check(kDecimal)
      ->check(CLI::Range(std::uint64_t{1000}, std::uint64_t{10'000'000'000}))
      ->capture_default_str();
  std::vector<std::string> shapes;
  app.add_option("--shapes", shapes,
                 "W:P,W:P,... GPU raw rows: warps : warps per block (default: --queues warps, 1 and 4 per SM)")
      ->delimiter(',');
  app.add_option("--raw-threads", threads, "T,T,...: host profile raw rows, host threads (1..256)")->delimiter(',');
  app.add_option("--json", o.json, "write the rows as JSON here");
  if (const int status = parse_flags(app, argc, argv); status != -1) return status;
  for (const std::string& item : shapes) {
    std::pair<std::uint32_t, std::uint32_t> shape;
    if (!parse_shape(item, shape)) return 2;
    o.shapes.push_back(shape);
  }
  const auto parse_list = [](const char* flag, const std::vector<std::string>& items, std::uint32_t high,
                             std::vector<std::uint32_t>& out) {
    if (items.empty()) return true;
    out.clear();
    for (const std::string& item : items) {
      std::uint32_t value = 0;
      if (!parse_bounded(item, 1, high, value)) {
        std::fprintf(stderr, "%s: '%s' must be a decimal number in 1..%u\n", flag, item.c_str(), high);
        return false;
      }
      out.push_back(value);
    }
    return true;
  };
  if (!parse_list("--batch-sizes", batches, 65536, o.batch_sizes) ||
      !parse_list("--raw-threads", threads, 256, o.raw_threads))
    return 2;
  return -1;
}

int parse_local_nvme_read_options(int argc, char** argv, LocalNvmeReadOptions& o) {
  CLI::App app{
      "tutti-bench-gpu-local-nvme: reads of a real file into GPU memory through local_nvme (GPU kernels, soft "
      "controller emulation), the uring DataPath, cuFile and pread + cudaMemcpy, every pass verified"};
  app.add_option("--file-mib", o.file_mib, "file size, MiB")
      ->check(kDecimal)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{65536}))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "requests per local_nvme submit")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--queues", o.queues, "I/O queue pairs")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--workers", o.workers, "soft controller workers (and pread threads)")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--repeat", o.repeat, "passes per path and size (best reported)")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  app.add_option("--uring-queue-depth", o.uring_queue_depth, "uring requests in flight")
      ->check(kDecimal)
      ->check(CLI::Range(2u, 32768u))
      ->capture_default_str();
  app.add_option("--cufile-threads", o.cufile_threads, "cuFile reader threads")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--poll-budget-ns", o.poll_budget_ns,
                 "local_nvme Options::poll_kernel_budget_ns (0: one poll pass per launch)")
      ->check(kDecimal)
      ->check(CLI::Range(std::uint64_t{0}, LocalNvmeReadOptions::kMaxPollBudgetNs))
      ->capture_default_str();
  app.add_option("--dir", o.dir, "folder for the file (it must exist)")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  app.add_option("--json", o.json, "write the rows as JSON here");
  return parse_flags(app, argc, argv);
}

}  // namespace tutti::bench::gpu
