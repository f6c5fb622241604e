// striped_nvme benchmarks, null mode (no root, no data moved):
//   build-striped/bench/striped_nvme/bench_striped_nvme
// BM_StripedSubmitNull/<controllers>: submit -> completion of a batch of 64 reads of one 64 KiB
// unit each (64 pieces, round robin over the controllers) through StripedNvmeDataPath, against
// <controllers> soft controllers in null mode (one worker thread each). items_per_second is unit
// pieces (NVMe commands) per second, bytes_per_second the bytes the controllers confirmed. After
// the run, the aggregate rate of each controller count is printed as the ratio to one controller.
// Checked in the timed loop: every request completes OK with all its bytes confirmed; after it,
// every controller's read command counter equals the pieces placed on it (no piece lost or sent
// to the wrong controller). With 2 cores the ratio measures the CPU (each soft controller is a
// host thread), not drives: see docs/benchmarks.md. CUDA profile: the kernels run on the GPU and
// the soft controllers are in accelerator_mode.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/path/striped_nvme.hpp>

using namespace tutti;
using Path = striped_nvme::StripedNvmeDataPath;

namespace {

constexpr std::uint64_t kUnit = 64 << 10;
constexpr std::size_t kBatch = 64;
constexpr std::uint64_t kShardBytes = 64 << 20;
constexpr std::uint64_t kSecond = 1'000'000'000;

std::map<int, double> rates;  // controllers -> pieces per second

void BM_StripedSubmitNull(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  std::vector<std::shared_ptr<libnvm::SoftController>> devices;
  std::vector<std::unique_ptr<nvme::Controller>> controllers;
  std::vector<nvme::Controller*> raw;
  for (std::uint32_t d = 0; d < n; ++d) {
    libnvm::SoftControllerConfig config;
    config.null_mode = true;
    config.namespace_size_lbas = kShardBytes / 4096;
    config.accelerator_mode = accel::kProfile == accel::Profile::cuda;  // GPU threads ring the doorbells
    auto device = libnvm::SoftController::create(config);
    if (!device) return state.SkipWithError(device.status().to_string().c_str());
    devices.push_back(*device);
    auto c = libnvm::open_soft_controller(devices.back());
    if (!c || !c.value()->bring_up({}).is_ok()) return state.SkipWithError("soft controller bring-up failed");
    controllers.push_back(std::move(c.value()));
    raw.push_back(controllers.back().get());
  }
  std::optional<Path> path;
  {
    auto p = Path::create(raw, {});
    if (!p) return state.SkipWithError(p.status().to_string().c_str());
    path.emplace(std::move(p.value()));
  }
  striped_file::Target t;
  t.name = "bench";
  t.unit_bytes = kUnit;
  for (std::uint32_t d = 0; d < n; ++d) {
    local_file::Target s;
    s.path = "shard" + std::to_string(d);
    s.extents = {{0, 0, kShardBytes}};
    s.file_size = kShardBytes;
    s.lba_size = 4096;
    t.shards.push_back(std::move(s));
  }
  t.logical_size = kShardBytes * n;
  auto target = path->open(std::move(t), {});
  if (!target) return state.SkipWithError(target.status().to_string().c_str());
  std::vector<std::byte> buffer(kBatch * kUnit);
  auto memory = path->register_memory({buffer.data(), buffer.size(), MemoryKind::HOST, -1});
  if (!memory) return state.SkipWithError(memory.status().to_string().c_str());
  std::vector<PathRequest<Path>> requests;
  for (std::size_t i = 0; i < kBatch; ++i)
    requests.push_back(PathRequest<Path>{Direction::READ, &*memory,
                                         MemoryView{buffer.data(), buffer.size(), MemoryKind::HOST, -1}, i * kUnit,
                                         &*target, i * kUnit, kUnit});
  std::vector<Status> states(kBatch);
  std::vector<RequestCompletion> done(kBatch);
  std::uint64_t batches = 0;
  for (auto _ : state) {
    auto b = path->submit(requests, states);
    const Status s = path->progress(b, done, 10 * kSecond);
    for (std::size_t i = 0; i < kBatch; ++i)
      if (!s.is_ok() || !states[i].is_ok() || !done[i].status.is_ok() || done[i].confirmed_bytes != kUnit)
        return state.SkipWithError("a request failed or confirmed fewer bytes than requested");
    ++batches;
  }
  for (std::uint32_t d = 0; d < n; ++d) {
    const std::uint64_t expected = batches * ((kBatch + n - 1 - d) / n);  // units d, d + n, ... of 0..63
    if (devices[d]->counters().read_commands != expected)
      return state.SkipWithError("a controller's read count differs from the pieces placed on it");
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(batches * kBatch));
  state.SetBytesProcessed(static_cast<std::int64_t>(batches * kBatch * kUnit));
  state.counters["controllers"] = n;
  (void)path->close(*target);
  (void)path->unregister_memory(*memory);
}
BENCHMARK(BM_StripedSubmitNull)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(8)->UseRealTime()->MinTime(0.5);

/// Prints the runs and, at the end, each controller count's rate as the ratio to one controller.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const auto found = run.counters.find("items_per_second");
      const auto controllers = run.counters.find("controllers");
      if (found != run.counters.end() && controllers != run.counters.end())
        rates[static_cast<int>(controllers->second.value)] = found->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    if (rates.count(1) == 0) return;
    for (const auto& [n, rate] : rates)
      std::printf("striped null mode: %d controller(s): %.0f pieces/s, %.2fx one controller\n", n, rate,
                  rate / rates[1]);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
