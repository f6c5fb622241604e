// tutti-bench-gpu-submit: submission rate of the GPU path against the GPU-resident null
// controller, and of host threads through the same queue primitives against the same null
// controller on host memory, in one run, with ratios.
//
// GPU: command_kernel (tests/gpu/support/command_kernel.cuh): every warp runs 4 KiB Read commands
// closed loop, 32 in flight per warp (warp_submit: one CAS reserves the run, one doorbell write;
// warp_wait: lane 0 reaps by Phase Tag, one CQ head doorbell write per reaped batch), on queues
// chosen by select_queue; null_controller_kernel services every queue with one warp. Rate =
// commands completed / kernel time (CUDA events), best of --repeat runs.
// Host: T submitter threads, each on its own queue, 32 commands per batch (32 CIDs, one
// reserve_submission_slots(32), 32 write_submission, one ring_submission_doorbell), then
// reap_completions/take_completion until all 32 are back; T host threads run the same
// NullControllerQueue::service loop over host memory. Same nvme/queue.hpp code, host pass.
//
// Usage: tutti-bench-gpu-submit [--help] [--commands N] [--repeat R] [--depth D] [--max-queues Q] [--json FILE]
//          [--stop-relay 0|1] [--stop-poll-ns NS] [--shapes W:P,...] [--host 0|1]
// (--stop-relay 0 restores the controllers' old stop poll, for before/after figures in one build.)
// Exits 77 when no CUDA device is present.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <tutti/nvme/queue.hpp>
#include "null_controller.hpp"

#include "bench_options.hpp"
#include "command_kernel.cuh"
#include "gpu_queues.hpp"

namespace {

using tutti::gpu_test::MemoryKind;
using tutti::gpu_test::QueueSet;
using tutti::gpu_test::QueueSetConfig;

using Options = tutti::bench::gpu::SubmitRateOptions;

struct Row {
  std::string path;          ///< "gpu" or "host"
  std::uint32_t agents = 0;  ///< warps (gpu) or submitter threads (host)
  std::uint32_t queues = 0;
  std::uint64_t commands = 0;
  double seconds = 0;
  double commands_per_second = 0;
  double doorbells_per_command = 0;
  std::uint64_t errors = 0;
};

Row run_gpu(const Options& options, std::uint32_t warps, std::uint32_t warps_per_block) {
  const std::uint32_t queues = std::min(options.max_queues, warps);
  const std::uint32_t blocks = warps / warps_per_block;
  std::uint32_t per_warp = static_cast<std::uint32_t>(std::max<std::uint64_t>(1024, options.commands / warps));
  per_warp = (per_warp + 31) / 32 * 32;
  Row best;
  best.path = "gpu";
  best.agents = warps;
  best.queues = queues;
  for (std::uint32_t r = 0; r < options.repeat + 1; ++r) {  // the first run warms up and is not counted
    QueueSet set(QueueSetConfig{queues, options.depth, options.depth, MemoryKind::device});
    tutti::gpu_test::Buffer totals(MemoryKind::device, 2 * sizeof(unsigned long long));
    tutti::test::NullControllerSettings controller_settings;
    controller_settings.stop_poll_interval_ns = options.stop_poll_ns;
    tutti::gpu_test::GpuNullController controller(set, 0, controller_settings, options.stop_relay != 0);
    tutti::gpu_test::RawDriverArgs args;
    args.queues = set.queues();
    args.queue_count = queues;
    args.commands_per_warp = r == 0 ? 256 : per_warp;
    args.completed = totals.as<unsigned long long>();
    args.unfinished = totals.as<unsigned long long>() + 1;
    args.budget_ns = 20'000'000'000ull;
    args.wait_budget_ns = 1'000'000'000ull;
    cudaEvent_t start, stop;
    TUTTI_CUDA_CHECK(cudaEventCreate(&start));
    TUTTI_CUDA_CHECK(cudaEventCreate(&stop));
    TUTTI_CUDA_CHECK(cudaEventRecord(start));
    tutti::gpu_test::raw_command_kernel<<<blocks, warps_per_block * 32>>>(args);
    TUTTI_CUDA_CHECK(cudaGetLastError());
    TUTTI_CUDA_CHECK(cudaEventRecord(stop));
    TUTTI_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TUTTI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    const std::uint32_t controller_deadline_exits = controller.stop();
    unsigned long long t[2];
    totals.download(t, sizeof(t));
    if (r == 0) continue;
    std::uint64_t doorbells = 0;
    for (const auto& s : set.queue_states()) doorbells += s.doorbell_writes;
    const std::uint64_t expected = static_cast<std::uint64_t>(warps) * per_warp;
    Row row = best;
    row.commands = t[0];
    row.seconds = ms / 1e3;
    row.commands_per_second = t[0] / row.seconds;
    row.doorbells_per_command = t[0] == 0 ? 0 : static_cast<double>(doorbells) / t[0];
    row.errors = (expected - t[0]) + t[1] + controller_deadline_exits;
    if (row.commands_per_second > best.commands_per_second) best = row;
  }
  return best;
}

Row run_host(const Options& options, std::uint32_t threads) {
  using tutti::test::NullControllerControl;
  const std::uint64_t per_thread = std::max<std::uint64_t>(32 * 1024, options.commands / threads) / 32 * 32;
  Row best;
  best.path = "host";
  best.agents = threads;
  best.queues = threads;
  for (std::uint32_t r = 0; r < options.repeat; ++r) {
    QueueSet set(QueueSetConfig{threads, options.depth, options.depth, MemoryKind::host});
    NullControllerControl control{};
    tutti::test::NullControllerSettings settings;
    settings.budget_ns = 60'000'000'000ull;
    std::vector<std::thread> controllers;
    for (std::uint32_t i = 0; i < threads; ++i)
      controllers.emplace_back([&, i] {
        tutti::test::run_null_controller(set.host_controllers().data(), threads, i, threads, &control, settings);
      });
    std::vector<std::uint64_t> completed(threads, 0), errors(threads, 0);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> submitters;
    for (std::uint32_t i = 0; i < threads; ++i)
      submitters.emplace_back([&, i] {
        const tutti::nvme::QueuePair queue = set.host_queues()[i];
        const std::uint64_t deadline = tutti::accel::deadline_after(60'000'000'000ull);
        std::uint16_t cids[32];
        for (std::uint64_t base = 0; base < per_thread; base += 32) {
          std::uint32_t n = 0;
          while (n < 32 && queue.allocate_command_identifier(cids[n])) ++n;
          std::uint64_t first = 0;
          tutti::accel::Backoff backoff;
          while (!queue.reserve_submission_slots(n, first)) {  // ONE reservation for the batch
            if (tutti::accel::timer_ns() > deadline) { ++errors[i]; return; }
            queue.reap_completions();
          }
          for (std::uint32_t k = 0; k < n; ++k) {
            tutti::nvme::SubmissionQueueEntry sqe{};
            const std::uint64_t command = static_cast<std::uint64_t>(i) * per_thread + base + k;
            sqe.opcode = static_cast<std::uint8_t>(tutti::nvme::NvmOpcode::read);
            sqe.command_identifier = cids[k];
            sqe.nsid = 1;
            sqe.data_pointer.prp.prp1 = tutti::test::kFakeBusBase + command * 4096;
            sqe.cdw10 = static_cast<std::uint32_t>(command);
            sqe.cdw11 = static_cast<std::uint32_t>(command >> 32);
            queue.write_submission(first + k, sqe);
          }
          queue.ring_submission_doorbell();  // ONE doorbell write for the batch
          std::uint32_t done_mask_count = 0;
          bool done[32] = {};
          while (done_mask_count < n) {
            tutti::nvme::CompletionQueueEntry cqe;
            bool progress = false;
            for (std::uint32_t k = 0; k < n; ++k)
              if (!done[k] && queue.take_completion(cids[k], cqe)) {
                done[k] = true;
                ++done_mask_count;
                progress = true;
              }
            if (done_mask_count == n) break;
            if (queue.reap_completions() != 0 || progress) { backoff.reset(); continue; }
            if (tutti::accel::timer_ns() > deadline) { errors[i] += n - done_mask_count; return; }
            backoff.pause();
          }
          completed[i] += n;
        }
      });
    for (auto& t : submitters) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tutti::accel::SystemAtomicRef<std::uint32_t>(control.stop).store(1, tutti::accel::MemoryOrder::release);
    for (auto& t : controllers) t.join();
    std::uint64_t total = 0, bad = control.deadline_exits, doorbells = 0;
    for (std::uint32_t i = 0; i < threads; ++i) {
      total += completed[i];
      bad += errors[i];
    }
    for (const auto& s : set.queue_states()) doorbells += s.doorbell_writes;
    Row row = best;
    row.commands = total;
    row.seconds = seconds;
    row.commands_per_second = total / seconds;
    row.doorbells_per_command = total == 0 ? 0 : static_cast<double>(doorbells) / total;
    row.errors = bad;
    if (row.commands_per_second > best.commands_per_second) best = row;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const int status = tutti::bench::gpu::parse_submit_rate_options(argc, argv, options); status != -1) return status;
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);  // see tests/gpu/gpu_main.cpp: lazy loading stalls behind the controller
  if (!tutti::gpu_test::cuda_device_present()) {
    std::fprintf(stderr, "no CUDA device: skipping (exit 77)\n");
    return 77;
  }
  cudaDeviceProp properties{};
  TUTTI_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const std::uint32_t sms = static_cast<std::uint32_t>(properties.multiProcessorCount);
  std::printf("GPU: %s, %u SMs, sm_%d%d; CUDA driver API %d, runtime %d\n", properties.name, sms, properties.major,
              properties.minor, driver, runtime);
  std::printf("4 KiB Read commands, closed loop, 32 in flight per warp / per host thread; queue depth %u; "
              "%llu commands per run, best of %u\n",
              options.depth, static_cast<unsigned long long>(options.commands), options.repeat);

  std::vector<Row> rows;
  struct Shape { std::uint32_t warps, per_block; const char* label; };
  std::vector<Shape> shapes = {{1, 1, "1 warp"},        {8, 1, "8 warps"},           {32, 1, "32 warps"},
                               {sms, 1, "1 warp/SM"},   {sms * 4, 4, "4 warps/SM"}, {sms * 16, 8, "16 warps/SM"}};
  if (!options.shapes.empty()) {
    shapes.clear();
    for (const auto& [warps, per_block] : options.shapes) shapes.push_back({warps, per_block, "custom"});
  }

  std::printf("controller stop word: %s, read every %llu ns; max queues %u\n",
              options.stop_relay != 0 ? "relayed into GPU memory by warp 0" : "read from mapped host memory by every warp",
              static_cast<unsigned long long>(options.stop_poll_ns), options.max_queues);
  for (const Shape& s : shapes) {
    rows.push_back(run_gpu(options, s.warps, s.per_block));
    const Row& r = rows.back();
    std::printf("gpu  %-12s warps=%-5u queues=%-4u commands=%-9llu %8.3f s  %10.3f M commands/s  doorbells/cmd=%.3f errors=%llu\n",
                s.label, r.agents, r.queues, static_cast<unsigned long long>(r.commands), r.seconds,
                r.commands_per_second / 1e6, r.doorbells_per_command, static_cast<unsigned long long>(r.errors));
    std::fflush(stdout);
  }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  for (std::uint32_t threads : {1u, 2u, 4u, 8u}) {
    if (!options.host || threads * 2 > hw) break;  // a controller thread per submitter thread
    rows.push_back(run_host(options, threads));
    const Row& r = rows.back();
    std::printf("host threads=%-3u        queues=%-4u commands=%-9llu %8.3f s  %10.3f M commands/s  doorbells/cmd=%.3f errors=%llu\n",
                r.agents, r.queues, static_cast<unsigned long long>(r.commands), r.seconds, r.commands_per_second / 1e6,
                r.doorbells_per_command, static_cast<unsigned long long>(r.errors));
    std::fflush(stdout);
  }
  double best_gpu = 0, best_host = 0, host_one = 0;
  for (const Row& r : rows) {
    if (r.path == "gpu") best_gpu = std::max(best_gpu, r.commands_per_second);
    else best_host = std::max(best_host, r.commands_per_second);
    if (r.path == "host" && r.agents == 1) host_one = r.commands_per_second;
  }
  constexpr double kFourGen5Drives = 13e6, kBamPerGen4Drive = 0.8e6;
  std::printf("ratios: best GPU / best host = %.2f; best GPU / 1 host thread = %.2f; "
              "best GPU / 13 M IOPS (4 Gen5 drives) = %.2f; best GPU / 0.8 M IOPS (BaM, one Gen4 drive) = %.1f\n",
              best_host > 0 ? best_gpu / best_host : 0.0, host_one > 0 ? best_gpu / host_one : 0.0,
              best_gpu / kFourGen5Drives, best_gpu / kBamPerGen4Drive);
  std::uint64_t errors = 0;
  for (const Row& r : rows) errors += r.errors;
  if (!options.json.empty()) {
    if (FILE* f = std::fopen(options.json.c_str(), "w")) {
      std::fprintf(f, "{\"gpu\": \"%s\", \"sms\": %u, \"driver_api\": %d, \"runtime\": %d, \"depth\": %u, \"rows\": [\n",
                   properties.name, sms, driver, runtime, options.depth);
      for (std::size_t i = 0; i < rows.size(); ++i)
        std::fprintf(f, "  {\"path\": \"%s\", \"agents\": %u, \"queues\": %u, \"commands\": %llu, \"seconds\": %.6f, "
                        "\"commands_per_second\": %.1f, \"doorbells_per_command\": %.4f, \"errors\": %llu}%s\n",
                     rows[i].path.c_str(), rows[i].agents, rows[i].queues, static_cast<unsigned long long>(rows[i].commands),
                     rows[i].seconds, rows[i].commands_per_second, rows[i].doorbells_per_command,
                     static_cast<unsigned long long>(rows[i].errors), i + 1 < rows.size() ? "," : "");
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  return errors == 0 ? 0 : 1;
}
