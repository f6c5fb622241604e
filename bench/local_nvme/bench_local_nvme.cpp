// local_file + local_nvme benchmarks. Run as root (ext4 image on a loop device):
//   build-lnvme/bench/local_nvme/bench_local_nvme
// Benchmarks:
//  - BM_OpenBatch / BM_OpenSerial /0 and /1: open (resolve with FIEMAP + build the target) and
//    close 500 files of 4 KiB on ext4, with open_batch vs one open() at a time, read-only (/0,
//    no fsync under the default FsyncPolicy) and writable (/1, one fsync per file); the ratios
//    are printed at the end ("open_batch speedup").
//  - BM_RequestCostNull/<bytes>/<batch>: host cost of submit -> completion per request through
//    the DataPath against a soft controller in null mode (no data moved), 4 KiB and 512 KiB.
//  - BM_RuntimeSubmitNull/<batch>: wall time of StorageRuntime::submit per request (validation,
//    handle lookups, pins, bucketing and the DataPath's submit) over the same null-mode controller,
//    4 KiB reads; the wait for completion is not timed. Run against two builds of the library, it
//    gives the runtime's submit cost before and after a change (docs/benchmarks.md).
//  - BM_ReadFilesNvme vs BM_ReadFilesFio: MB/s reading the same 4 x 64 MiB ext4 files, through
//    the soft controller (512 KiB requests, 32 per batch) and through fio (--ioengine=io_uring
//    --direct=1 --bs=512k --iodepth=32) on the loop-mounted file system, same run. Both read the
//    image through the host page cache: this measures the emulation, not an NVMe drive.
//
// --verify (the default; --no-verify to turn it off, given before Google Benchmark's flags): the big
// files hold the self-checking pattern of bench/support/verify_pattern.hpp, BM_ReadFilesNvme poisons
// its memory before every batch and checks every 4096-byte block it read (the check is part of the
// timed loop), so its MB/s is of checked bytes; a mismatch stops it with "VERIFY FAILED". The null-mode
// benchmarks move no data and have nothing to check; fio's reads are not checked.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <scratch_filesystem.hpp>
#include <tutti/libnvm/soft_local_nvme.hpp>

#include "../support/verify_pattern.hpp"

using namespace tutti;
using tutti::testing::ScratchFilesystem;

namespace {

constexpr int kSmallFiles = 500;
constexpr int kBigFiles = 4;
constexpr std::uint64_t kBigFileBytes = 64ull << 20;
constexpr std::uint64_t kSecond = 1'000'000'000;

bool verify = true;  // --verify / --no-verify

struct Image {
  std::unique_ptr<ScratchFilesystem> fs;
  std::vector<std::string> small_uris;
  std::vector<std::string> big_paths;
  std::unique_ptr<SoftLocalNvme> stack;
  bool ok = false;
};

Image& image() {
  static Image img = [] {
    Image i;
    ScratchFilesystem::Options o;
    o.size_bytes = 512ull << 20;
    auto fs = ScratchFilesystem::create(o);
    if (!fs) return i;
    i.fs = std::move(fs.value());
    std::vector<char> block(4096, 'k');
    for (int f = 0; f < kSmallFiles; ++f) {
      const std::string path = i.fs->path("small" + std::to_string(f));
      FILE* out = std::fopen(path.c_str(), "w");
      std::fwrite(block.data(), 1, block.size(), out);
      std::fclose(out);
      i.small_uris.push_back("file://" + path);
    }
    std::vector<std::byte> chunk(8 << 20);
    for (int f = 0; f < kBigFiles; ++f) {  // the verification pattern of file f
      const std::string path = i.fs->path("big" + std::to_string(f));
      FILE* out = std::fopen(path.c_str(), "w");
      for (std::uint64_t at = 0; at < kBigFileBytes; at += chunk.size()) {
        tutti::bench::fill_pattern(chunk.data(), static_cast<std::uint64_t>(f), at, chunk.size(), 0);
        std::fwrite(chunk.data(), 1, chunk.size(), out);
      }
      std::fflush(out);
      ::fsync(fileno(out));
      std::fclose(out);
      i.big_paths.push_back(path);
    }
    (void)tutti::testing::run_command("sync");
    SoftLocalNvmeOptions so;
    so.backing_path = i.fs->image_path();
    so.block_device_path = i.fs->loop_device();
    so.soft.worker_threads = 1;
    so.datapath.queue_pairs = 1;
    so.datapath.queue_depth = 256;
    auto stack = make_soft_local_nvme(so);
    if (!stack) {
      std::fprintf(stderr, "soft stack: %s\n", stack.status().to_string().c_str());
      return i;
    }
    i.stack = std::move(stack.value());
    i.ok = true;
    return i;
  }();
  return img;
}

void BM_OpenBatch(benchmark::State& state) {
  Image& img = image();
  if (!img.ok) return state.SkipWithError("needs root (ext4 image on a loop device)");
  auto& rt = *img.stack->runtime;
  const OpenOptions options{state.range(0) != 0, false, false};
  for (auto _ : state) {
    auto opened = rt.open_batch(img.small_uris, options);
    for (auto& t : opened) {
      if (!t) return state.SkipWithError(t.status().to_string().c_str());
      (void)rt.close(*t);
    }
  }
  state.counters["files"] = kSmallFiles;
}
// Arg: 0 read-only opens (no fsync under the default policy), 1 writable opens (fsync each file).
BENCHMARK(BM_OpenBatch)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_OpenSerial(benchmark::State& state) {
  Image& img = image();
  if (!img.ok) return state.SkipWithError("needs root (ext4 image on a loop device)");
  auto& rt = *img.stack->runtime;
  const OpenOptions options{state.range(0) != 0, false, false};
  for (auto _ : state) {
    for (const auto& uri : img.small_uris) {
      auto t = rt.open(uri, options);
      if (!t) return state.SkipWithError(t.status().to_string().c_str());
      (void)rt.close(*t);
    }
  }
  state.counters["files"] = kSmallFiles;
}
BENCHMARK(BM_OpenSerial)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

/// A soft controller in null mode (every command validated, no data moved), brought up, and the
/// local_nvme DataPath over it (one queue pair of depth 1024).
struct NullController {
  NullController() {
    libnvm::SoftControllerConfig c;
    c.null_mode = true;
    c.namespace_size_lbas = 1 << 20;
    device = *libnvm::SoftController::create(c);
    controller = libnvm::open_soft_controller(device).value();
    if (!controller->bring_up({}).is_ok()) std::abort();
  }
  local_nvme::LocalNvmeDataPath datapath() const {
    local_nvme::LocalNvmeDataPath::Options o;
    o.queue_pairs = 1;
    o.queue_depth = 1024;
    return local_nvme::LocalNvmeDataPath::create(*controller, o).value();
  }
  std::shared_ptr<libnvm::SoftController> device;
  std::unique_ptr<nvme::Controller> controller;
};

struct NullRig {
  NullRig() {
    path = std::make_unique<local_nvme::LocalNvmeDataPath>(null.datapath());
    local_file::Target t;
    t.path = "null";
    t.extents = {{0, 0, 1ull << 32}};
    t.file_size = 1ull << 32;
    t.lba_size = 4096;
    target = std::make_unique<local_nvme::LocalNvmeDataPath::open_target>(path->open(std::move(t), {}).value());
    buffer = std::aligned_alloc(4096, 64 << 20);
    memory = std::make_unique<local_nvme::LocalNvmeDataPath::registered_memory>(
        path->register_memory({buffer, 64 << 20, MemoryKind::HOST, -1}).value());
  }
  NullController null;
  std::unique_ptr<local_nvme::LocalNvmeDataPath> path;
  std::unique_ptr<local_nvme::LocalNvmeDataPath::open_target> target;
  void* buffer = nullptr;
  std::unique_ptr<local_nvme::LocalNvmeDataPath::registered_memory> memory;
};

void BM_RequestCostNull(benchmark::State& state) {
  static NullRig rig;
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0));
  const std::size_t batch = static_cast<std::size_t>(state.range(1));
  std::vector<PathRequest<local_nvme::LocalNvmeDataPath>> rs;
  for (std::size_t i = 0; i < batch; ++i)
    rs.push_back({Direction::READ, rig.memory.get(), MemoryView{rig.buffer, 64 << 20, MemoryKind::HOST, -1},
                  (i * bytes) % (64 << 20), rig.target.get(), i * bytes, bytes});
  std::vector<Status> states(batch);
  std::vector<RequestCompletion> completions(batch);
  for (auto _ : state) {
    auto b = rig.path->submit(rs, states);
    if (!rig.path->progress(b, completions, 10 * kSecond).is_ok()) return state.SkipWithError("progress failed");
    for (auto& c : completions)
      if (!c.status.is_ok()) return state.SkipWithError(c.status.to_string().c_str());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
  state.counters["ns_per_request"] = benchmark::Counter(
      static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RequestCostNull)->Args({4096, 1})->Args({4096, 64})->Args({524288, 1})->Args({524288, 64})->UseRealTime();

/// Resolves any "null://" URI to a 4 GiB target mapped 1:1 onto the null controller's namespace.
struct NullExtentResolver {
  using target_type = local_file::Target;
  static constexpr std::string_view scheme = "null";
  Result<local_file::Target> resolve(std::string_view uri, const OpenOptions&) const {
    local_file::Target t;
    t.path = std::string(uri);
    t.extents = {{0, 0, 1ull << 32}};
    t.file_size = 1ull << 32;
    t.lba_size = 4096;
    return t;
  }
};
using NullRuntime = StorageRuntime<Backend<NullExtentResolver, local_nvme::LocalNvmeDataPath>>;

/// A runtime over a null-mode soft controller (validation and queues run, no data moves).
struct NullRuntimeRig {
  NullRuntimeRig() {
    runtime = std::make_unique<NullRuntime>(
        Backend<NullExtentResolver, local_nvme::LocalNvmeDataPath>{NullExtentResolver{}, null.datapath()});
    target = runtime->open("null://namespace").value();
    buffer = std::aligned_alloc(4096, 64 << 20);
    memory = runtime->register_memory({buffer, 64 << 20, MemoryKind::HOST, -1}).value();
  }
  NullController null;
  std::unique_ptr<NullRuntime> runtime;
  TargetHandle target;
  void* buffer = nullptr;
  MemoryHandle memory;
};

void BM_RuntimeSubmitNull(benchmark::State& state) {
  static NullRuntimeRig rig;
  const std::size_t batch = static_cast<std::size_t>(state.range(0));
  std::vector<IoRequest> requests;
  for (std::size_t i = 0; i < batch; ++i)
    requests.push_back({Direction::READ, rig.memory, (i * 4096) % (64 << 20), rig.target, i * 4096, 4096});
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    auto outcome = rig.runtime->submit(requests);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (outcome.accepted != batch) return state.SkipWithError(outcome.initial_states.back().to_string().c_str());
    auto result = rig.runtime->wait(outcome.io, 10 * kSecond);
    if (!result || !result->status.is_ok()) return state.SkipWithError("wait failed");
    (void)rig.runtime->release(outcome.io);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
  state.counters["submit_ns_per_request"] = benchmark::Counter(
      static_cast<double>(batch) / 1e9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RuntimeSubmitNull)->Arg(1)->Arg(64)->UseManualTime();

void BM_ReadFilesNvme(benchmark::State& state) {
  Image& img = image();
  if (!img.ok) return state.SkipWithError("needs root (ext4 image on a loop device)");
  auto& rt = *img.stack->runtime;
  constexpr std::uint64_t kRequest = 512 << 10;
  constexpr std::size_t kBatch = 32;
  auto* buffer = static_cast<std::byte*>(std::aligned_alloc(4096, kRequest * kBatch));
  auto m = rt.register_memory({buffer, kRequest * kBatch, MemoryKind::HOST, -1});
  std::vector<TargetHandle> targets;
  for (const auto& p : img.big_paths) targets.push_back(rt.open("file://" + p).value());
  std::uint64_t verified_bytes = 0, mismatched_blocks = 0;
  for (auto _ : state) {
    for (std::size_t f = 0; f < targets.size(); ++f) {
      for (std::uint64_t offset = 0; offset < kBigFileBytes; offset += kRequest * kBatch) {
        if (verify) std::memset(buffer, tutti::bench::kPoisonByte, kRequest * kBatch);
        std::vector<IoRequest> rs;
        for (std::size_t i = 0; i < kBatch; ++i)
          rs.push_back(IoRequest{Direction::READ, *m, i * kRequest, targets[f], offset + i * kRequest, kRequest});
        auto outcome = rt.submit(rs);
        if (outcome.accepted != kBatch) return state.SkipWithError("backpressure in the benchmark");
        auto r = rt.wait(outcome.io, 30 * kSecond);
        if (!r || !r->status.is_ok()) return state.SkipWithError("read failed");
        (void)rt.release(outcome.io);
        if (!verify) continue;
        const std::uint64_t bad = tutti::bench::count_bad_blocks(buffer, f, offset, kRequest * kBatch);
        mismatched_blocks += bad;
        verified_bytes += kRequest * kBatch - bad * tutti::bench::kPatternBlockBytes;
        if (bad > 0)
          return state.SkipWithError("VERIFY FAILED: bytes read through the soft controller differ from the file");
      }
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBigFiles * kBigFileBytes));
  state.counters["verified_bytes"] = static_cast<double>(verified_bytes);
  state.counters["mismatched_blocks"] = static_cast<double>(mismatched_blocks);
  for (TargetHandle t : targets) (void)rt.close(t);
  (void)rt.unregister_memory(*m);
  std::free(buffer);
}
BENCHMARK(BM_ReadFilesNvme)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

void BM_ReadFilesFio(benchmark::State& state) {
  Image& img = image();
  if (!img.ok) return state.SkipWithError("needs root (ext4 image on a loop device)");
  std::string files;
  for (const auto& p : img.big_paths) files += (files.empty() ? "" : ":") + p;
  const std::string command =
      "fio --name=read --ioengine=io_uring --direct=1 --rw=read --bs=512k --iodepth=32 "
      "--numjobs=1 --size=" +
      std::to_string(kBigFiles * kBigFileBytes) + " --filename=" + files + " --output-format=json 2>/dev/null";
  for (auto _ : state) {
    FILE* p = popen(command.c_str(), "r");
    std::string out;
    char chunk[4096];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, p)) > 0;) out.append(chunk, n);
    pclose(p);
    auto json = nlohmann::json::parse(out, nullptr, false);
    if (json.is_discarded()) return state.SkipWithError("fio output is not JSON (is fio installed?)");
    const auto& read = json["jobs"][0]["read"];
    const double bw = read["bw_bytes"].get<double>();  // fio's own bandwidth, bytes/s
    if (bw <= 0) return state.SkipWithError("fio reported no bandwidth");
    state.SetIterationTime(static_cast<double>(kBigFiles * kBigFileBytes) / bw);
    state.counters["fio_bw_MBps"] = bw / 1e6;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBigFiles * kBigFileBytes));
  state.SetLabel(command.substr(0, command.find(" --filename")));
}
BENCHMARK(BM_ReadFilesFio)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(3);

/// Console output plus the ratios the issue asks for.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      times_[r.benchmark_name()] = r.GetAdjustedRealTime();
      if (r.counters.count("bytes_per_second")) rates_[r.benchmark_name()] = r.counters.at("bytes_per_second");
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    for (const char* arg : {"0", "1"}) {
      const auto serial = times_.find(std::string("BM_OpenSerial/") + arg + "/real_time");
      const auto batch = times_.find(std::string("BM_OpenBatch/") + arg + "/real_time");
      if (serial != times_.end() && batch != times_.end() && batch->second > 0)
        std::printf("open_batch speedup over serial open (500 files, %s): %.2fx (%.2f ms vs %.2f ms)\n",
                    arg[0] == '0' ? "read-only, no fsync" : "writable, fsync each", serial->second / batch->second,
                    batch->second, serial->second);
    }
    const auto nvme = rates_.find("BM_ReadFilesNvme/min_time:2.000/real_time");
    const auto fio = rates_.find("BM_ReadFilesFio/iterations:3/manual_time");
    if (nvme != rates_.end() && fio != rates_.end() && fio->second > 0)
      std::printf("soft-controller NVMe path vs fio io_uring O_DIRECT: %.1f MB/s vs %.1f MB/s (ratio %.2f)\n",
                  nvme->second / 1e6, fio->second / 1e6, nvme->second / fio->second);
    std::printf("verify: %s\n", verify ? "on: BM_ReadFilesNvme checked every 4096-byte block it read against the "
                                         "files' pattern (verified_bytes, mismatched_blocks above); fio's reads "
                                         "and the null-mode benchmarks are not checked"
                                       : "off (--no-verify): MB/s counts bytes the runtime confirmed");
  }

 private:
  std::map<std::string, double> times_, rates_;
};

}  // namespace

int main(int argc, char** argv) {
  // --verify / --no-verify are ours; Google Benchmark parses the rest.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--verify" || arg == "--no-verify")
      verify = arg == "--verify";
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
