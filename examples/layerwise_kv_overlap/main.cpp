// layerwise_kv_overlap: restore a long prefix's KV cache from files, layer by layer, while the model
// computes: read(L+1) || compute(L) || write(L-1). Verifies every tensor it reads and writes and exits
// non-zero on any mismatch. See docs/kv-cache.md for the layout, the summary and the exit codes, and
// README.md for how to run it.
// The CUDA build with cuBLAS (LAYERWISE_GPU) keeps the KV slots in GPU memory and computes on the GPU
// (gpu_pipeline.hpp, gpu_compute.cu), with pread + cudaMemcpy and cuFile baselines in the same run.
//
// Exit codes: 0 every tensor verified (or --help, or --prepare-only done); 1 a tensor did not match its
// checksum; 2 refused before the run (the command line, the shape, the data folder: the message names
// the option); 3 the run failed (an IO error, a timeout, a device: the message names the phase).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <tutti/core/uri.hpp>
#include <tutti/libnvm/soft_local_nvme.hpp>
#include <tutti/libnvm/soft_striped_nvme.hpp>
#include <tutti/tutti.hpp>

#include "baselines.hpp"
#include "cli_checks.hpp"
#include "data_files.hpp"
#include "dataset.hpp"
#include "model_shapes.hpp"
#include "pipeline.hpp"
#include "progress.hpp"
#include "spread.hpp"
#if defined(LAYERWISE_GPU)
#include "gpu_pipeline.hpp"
#endif
#if defined(LAYERWISE_TUTTID)
#include "leased_nvme.hpp"
#endif

namespace fs = std::filesystem;
using namespace layerwise;

namespace {

/// The exit codes (docs/kv-cache.md#exit-codes).
constexpr int kExitVerified = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitRefused = 2;
constexpr int kExitFailed = 3;

/// Most devices --backend nvme-soft-striped stripes over (--stripe-devices): one ext4 image, loop
/// device and soft NVMe controller each, plus the plain targets' controller.
constexpr std::uint32_t kMaxStripeDevices = 8;

struct Options {
  Settings settings;
  ModelShape model;
  std::string backend = "uring";
  std::uint32_t stripe_devices = 2;  ///< --stripe-devices: the nvme-soft-striped backend's devices
#if defined(LAYERWISE_TUTTID)
  LeaseChoice lease;  ///< --tuttid-socket, --controller, --lease-queues: the nvme backend's lease
#endif
  std::string data_dir;
  std::string json_path;
  std::uint32_t repeat = 3;
  bool prepare_only = false;
  bool drop_caches = geteuid() == 0;
  bool pread_baseline = true;
  double compute_ms = 2.0;
  /// The one-thread baseline's name and what it does, for the summary (the GPU build's adds a copy).
  std::string pread_label = "pread 1 thread";
  std::string pread_note = "O_DIRECT, one request at a time, same tensors, same memory";
#if defined(LAYERWISE_GPU)
  std::string memory =
      "auto";  ///< device: KV slots in GPU memory; host: the host profile's pipeline; auto: see --memory
  std::string compute = "gemm";  ///< gemm (cuBLAS) or sleep (a kernel spinning compute_ms)
  std::uint32_t gemm_tokens = 1024;
  std::uint32_t hidden = 8192;
  int accelerator = 0;
  bool cufile_baseline = true;
#endif
};

/// file:// URI of an absolute path, each segment percent-encoded.
std::string file_uri(const fs::path& path) { return "file://" + tutti::escape_path(path); }

/// striped:// URI of layer file `name` striped over `shard_dirs` (shard i is `shard_dirs[i] / name`) in
/// units of `unit_bytes` (docs/striping.md): "striped://layer-00000?devs=/d0/layer-00000.kv,...&unit=...".
std::string striped_uri(const std::string& name, const std::vector<fs::path>& shard_dirs, std::uint64_t unit_bytes) {
  std::string devs;
  for (const auto& dir : shard_dirs) devs += (devs.empty() ? "" : ",") + tutti::escape_path(dir / name);
  return fmt::format("striped://{}?devs={}&unit={}", fs::path(name).stem().string(), devs, unit_bytes);
}

/// Whether the backend is one of the soft NVMe controller's (nvme-soft, nvme-soft-striped).
bool soft_nvme_backend(const std::string& backend) { return backend == "nvme-soft" || backend == "nvme-soft-striped"; }

/// Prints "error: CODE: message" to stderr and returns `exit_code`.
int fail_with(const tutti::Status& s, int exit_code, std::string_view context = {}) {
  fmt::print(stderr, "error: {}\n", context.empty() ? s.to_string() : s.with_context(std::string(context)).to_string());
  return exit_code;
}

void drop_page_cache(const Options& o) {
  if (!o.drop_caches) return;
  ::sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("3\n", f);
    std::fclose(f);
  }
}

double ms(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }
double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

/// Where the data lives, for the summary's header.
struct DataPlace {
  fs::path dir;
  FileSystemInfo filesystem;  ///< Unset for memfs.
  std::string controller;     ///< nvme: the leased controller
  std::uint32_t nsid = 0;     ///< nvme: the namespace holding dir
};

/// The summary's header, printed before the run: the backend, the repetitions, the model, the shape,
/// the tensor and data-set sizes, the data folder and its file system (with a warning when that keeps
/// its files in RAM).
void print_header(const Options& o, const DataPlace& place) {
  const Shape& s = o.settings.shape;
  fmt::print("layerwise_kv_overlap  backend={}  {}\n", o.backend,
             o.repeat == 1 ? std::string("1 run (--repeat 1)")
                           : fmt::format("{} runs (--repeat {}): figures are median [min-max] over the runs", o.repeat,
                                         o.repeat));
  if (o.backend == "nvme-soft")
    fmt::print(
        "  note           : nvme-soft is the software NVMe controller (pread/pwrite on an image file): its "
        "figures measure the emulation, not an NVMe drive\n");
  if (o.backend == "nvme-soft-striped")
    fmt::print(
        "  note           : nvme-soft-striped is {} (pread/pwrite on an image file each): "
        "its figures measure the emulation, not NVMe drives\n",
        counted(s.stripe_devices, "software NVMe controller"));
  if (o.backend == "nvme")
    fmt::print(
        "  note           : nvme moves the KV through NVMe queues leased from tuttid on its controller {}; on a soft "
        "controller its figures measure the emulation, not an NVMe drive\n",
        place.controller);
  if (o.model.kv_heads)
    fmt::print("  model          : {}: {}\n", o.model.name, o.model.describe());
  else
    fmt::print("  model          : {}; tensor size given directly (--tensor-bytes)\n", counted(s.layers, "layer"));
  auto chunks = [](std::uint32_t n) { return counted(n, "chunk"); };
  fmt::print(
      "  shape          : {}-token prefix in {} of {} tokens, {}% cached ({}); one K or V tensor of one chunk "
      "and layer: {}{}\n",
      s.context_tokens, chunks(s.chunks()), s.chunk_tokens, s.hit_percent, chunks(s.hit_chunks()),
      format_bytes(s.tensor_bytes),
      o.model.kv_heads
          ? fmt::format(" ({} x {} x {} x {})", counted(s.chunk_tokens, "token"), counted(o.model.kv_heads, "KV head"),
                        o.model.head_dim, counted(o.model.dtype_bytes, "byte"))
          : std::string());
  if (o.backend == "memfs") {
    fmt::print("  data           : {} in host memory (memfs), {} per layer\n", format_bytes(data_set_bytes(s)),
               format_bytes(s.layer_file_bytes()));
    std::fflush(stdout);
    return;
  }
  std::string inside;
  if (o.backend == "nvme-soft") inside = ", inside an ext4 image under nvme-soft/";
  if (o.backend == "nvme") inside = fmt::format(", on namespace {} of controller {}", place.nsid, place.controller);
  if (o.backend == "nvme-soft-striped")
    inside = fmt::format(
        ", each striped over {} under nvme-soft-striped/ in units of one K or V tensor ({}): "
        "{} of {}",
        counted(s.stripe_devices, "ext4 image"), format_bytes(s.tensor_bytes),
        counted(std::uint64_t{s.layers} * s.stripe_devices, "shard file"), format_bytes(s.shard_file_bytes()));
  fmt::print("  data           : {} in {} of {} in '{}' ({}){}\n", format_bytes(data_set_bytes(s)),
             counted(s.layers, "layer file"), format_bytes(s.layer_file_bytes()), place.dir.string(),
             place.filesystem.describe(), inside);
  if (!place.filesystem.ram_backed.empty())
    fmt::print(
        "  warning        : '{}' is on {}: {}, so the figures below measure memory, not a disk; pick a folder "
        "on a disk with --data-dir\n",
        place.dir.string(), place.filesystem.describe(), place.filesystem.ram_backed);
  std::fflush(stdout);  // before the progress lines on stderr, also when stdout is a file or a pipe
}

/// The host profile's verdict figures: the compute thread computes, verifies, or waits for reads or
/// writes, so its waits are both what compute waited for and which IO it waited for.
BoundFigures host_bound_figures(const Options& o, const Report& r) {
  BoundFigures f;
  f.layers = o.settings.shape.layers;
  f.pipeline_ns = r.pipeline_ns;
  f.compute_ns = r.compute_ns;
  f.compute_waited_ns = r.read_stall_ns + r.write_stall_ns;
  f.read_wait_ns = r.read_stall_ns;
  f.write_wait_ns = r.write_stall_ns;
  f.restore_alone_ns = r.restore_only.ns;
  return f;
}

/// A figure of every run, as a spread.
template <class F>
Spread spread_over(const std::vector<Report>& runs, F figure) {
  std::vector<double> values;
  for (const Report& r : runs) values.push_back(figure(r));
  return spread_of(std::move(values));
}

/// tutti/baseline per run, over the runs where both were measured.
Spread ratio_over(const std::vector<Report>& runs, PhaseStats Report::*baseline) {
  std::vector<double> values;
  for (const Report& r : runs)
    if ((r.*baseline).ns && r.restore_only.ns && (r.*baseline).gigabytes_per_second() > 0)
      values.push_back(r.restore_only.gigabytes_per_second() / (r.*baseline).gigabytes_per_second());
  return spread_of(std::move(values));
}

/// The run whose pipeline time is the median: its time split, overlap and verdict stand for all runs.
std::size_t median_run(const std::vector<Report>& runs) {
  std::vector<double> keys;
  for (const Report& r : runs) keys.push_back(static_cast<double>(r.pipeline_ns));
  return median_index(keys);
}

/// Every tensor check of every run, as one Report's counts.
Report all_checks(const std::vector<Report>& runs) {
  Report total;
  for (const Report& r : runs) total.merge_checks(r);
  return total;
}

/// The summary's figures (stdout), after the header. `bound` carries the figures of the "per layer"
/// verdict of the median run (host_bound_figures, or the CUDA build's gpu_bound_figures).
void print_report(const Options& o, const std::vector<Report>& runs, const BoundFigures& bound) {
  const Shape& s = o.settings.shape;
  const Report& r = runs[median_run(runs)];
  const Report checks = all_checks(runs);
  if (runs.size() > 1)
    fmt::print(
        "  (GB/s, ms and ratios: median [min-max] over {} runs; time split, overlap and per layer: the run with "
        "the median pipeline time)\n",
        runs.size());
  fmt::print(
      "  restore only   : {} GB/s, {:.1f} MiB in {} ms  ({}, {}{})\n",
      format_spread(spread_over(runs, [](const Report& x) { return x.restore_only.gigabytes_per_second(); }), 2),
      mib(r.restore_only.bytes),
      format_spread(spread_over(runs, [](const Report& x) { return ms(x.restore_only.ns); }), 2),
      counted(r.restore_only.requests, "request"), counted(r.restore_only.commands, "device command"),
      r.restore_max_in_flight ? fmt::format("; up to {} in flight", counted(r.restore_max_in_flight, "request")) : "");
  if (r.pread_baseline.ns && r.restore_only.ns)
    fmt::print(
        "  {:<15}: {} GB/s  ({})  -> tutti/pread = {}\n", o.pread_label,
        format_spread(spread_over(runs, [](const Report& x) { return x.pread_baseline.gigabytes_per_second(); }), 2),
        o.pread_note, format_spread(ratio_over(runs, &Report::pread_baseline), 2, "x"));
  if (r.pread_parallel.ns && r.restore_only.ns)
    fmt::print(
        "  {:<15}: {} GB/s  (O_DIRECT, {}: the requests Tutti kept in flight)  -> tutti/pread = {}\n",
        fmt::format("pread {} thr", r.pread_parallel_threads),
        format_spread(spread_over(runs, [](const Report& x) { return x.pread_parallel.gigabytes_per_second(); }), 2),
        counted(r.pread_parallel_threads, "thread"), format_spread(ratio_over(runs, &Report::pread_parallel), 2, "x"));
  fmt::print(
      "  pipeline       : {} ms for {}: read {:.2f} GB/s, write {:.2f} GB/s ({} + {} requests, {} + {} "
      "commands)\n",
      format_spread(spread_over(runs, [](const Report& x) { return ms(x.pipeline_ns); }), 2),
      counted(s.layers, "layer"),
      static_cast<double>(r.pipeline_reads.bytes) / static_cast<double>(std::max<std::uint64_t>(1, r.pipeline_ns)),
      static_cast<double>(r.pipeline_writes.bytes) / static_cast<double>(std::max<std::uint64_t>(1, r.pipeline_ns)),
      r.pipeline_reads.requests, r.pipeline_writes.requests, r.pipeline_reads.commands, r.pipeline_writes.commands);
  if (bound.compute_name == std::string_view("compute")) {  // the host profile's simulated compute
    const double asked = o.compute_ms, took = ms(r.compute_ns) / s.layers,
                 produce = ms(r.compute_produce_ns) / s.layers;
    fmt::print(
        "  compute        : simulated on the host, per layer: produce the missed chunks' K/V ({}, {:.2f} ms), "
        "then sleep until --compute-ms {:.2f} has passed: took {:.2f} ms{}\n",
        format_bytes(std::uint64_t{s.miss_chunks()} * 2 * s.tensor_bytes), produce, asked, took,
        compute_note(asked, produce, took));
  }
  fmt::print(
      "  time split     : compute {:.2f} ms, waiting for reads {:.2f} ms, waiting for writes {:.2f} ms, verify "
      "{:.2f} ms\n",
      ms(r.compute_ns), ms(r.read_stall_ns), ms(r.write_stall_ns), ms(r.verify_ns));
  // Share of the read time hidden: restore alone takes R; inside the pipeline compute waited S for reads.
  const double hidden =
      r.restore_only.ns ? 1.0 - static_cast<double>(r.read_stall_ns) / static_cast<double>(r.restore_only.ns) : 0.0;
  if (r.restore_only.bytes == 0)
    fmt::print("  overlap        : n/a (no cached chunks to read: --hit-percent 0)\n");
  else
    fmt::print(
        "  overlap        : compute waited {:.2f} ms for reads that take {:.2f} ms alone: {:.0f}% of the read "
        "time was hidden behind compute and writes\n",
        ms(r.read_stall_ns), ms(r.restore_only.ns), 100.0 * std::clamp(hidden, 0.0, 1.0));
  fmt::print("  per layer      : {}\n", layer_bound_line(bound));
  if (o.settings.verify)
    fmt::print(
        "  verify         : {} checked{} ({}; XXH3 per tensor read, byte compare per tensor written), {} "
        "mismatched -> {}\n",
        counted(checks.verified_tensors, "tensor"),
        runs.size() > 1 ? fmt::format(" over {} runs", runs.size()) : std::string(), checks.checks_by_source(),
        checks.mismatched_tensors, checks.mismatched_tensors == 0 ? "VERIFIED" : "FAILED");
  else
    fmt::print("  verify         : off (--no-verify)\n");
}

/// The summary's last line, one sentence: the restore against each pread baseline (the spread of the ratio
/// of tutti's GB/s to the baseline's: "beat", "slower than", "matched", or "inconclusive" when the runs'
/// range crosses 1x: compare_ratio), what bounded the pipeline, and whether every tensor was verified.
std::string verdict_sentence(const Options& o, const std::vector<Report>& runs, const BoundFigures& bound) {
  const Report& r = runs[median_run(runs)];
  const Report checks = all_checks(runs);
  std::vector<std::string> parts;
  if (r.pread_baseline.ns && r.restore_only.ns)
    parts.push_back(comparison_words(ratio_over(runs, &Report::pread_baseline), o.pread_label));
  if (r.pread_parallel.ns && r.restore_only.ns)
    parts.push_back(comparison_words(ratio_over(runs, &Report::pread_parallel),
                                     fmt::format("pread from {}", counted(r.pread_parallel_threads, "thread"))));
  parts.push_back(fmt::format("the pipeline was {}-bound", bound_name(pipeline_bound(bound))));
  if (!o.settings.verify)
    parts.push_back("tensors NOT verified (--no-verify)");
  else if (checks.mismatched_tensors != 0)
    parts.push_back(fmt::format("{} of {} tensors MISMATCHED", checks.mismatched_tensors, checks.verified_tensors));
  else
    parts.push_back(fmt::format("every tensor verified ({})", checks.verified_tensors));
  std::string sentence;
  for (const auto& part : parts) sentence += (sentence.empty() ? "" : "; ") + part;
  return sentence;
}

nlohmann::json phase_json(const PhaseStats& p) {
  return nlohmann::json{{"bytes", p.bytes},
                        {"requests", p.requests},
                        {"commands", p.commands},
                        {"ns", p.ns},
                        {"gb_per_s", p.gigabytes_per_second()}};
}

nlohmann::json spread_json(const Spread& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", s.runs}};
}

/// A ratio's spread with the verdict drawn from it (compare_ratio): "beat", "slower", "matched",
/// "inconclusive", or null when the baseline was not measured.
nlohmann::json ratio_json(const Spread& s) {
  nlohmann::json j = spread_json(s);
  j["verdict"] = s.runs ? nlohmann::json(comparison_name(compare_ratio(s))) : nlohmann::json(nullptr);
  return j;
}

/// One run's figures as JSON.
nlohmann::json run_json(const Report& r, const BoundFigures& bound) {
  nlohmann::json j = {{"restore_only", phase_json(r.restore_only)},
                      {"restore_max_in_flight", r.restore_max_in_flight},
                      {"pread_baseline", phase_json(r.pread_baseline)},
                      {"pipeline_reads", phase_json(r.pipeline_reads)},
                      {"pipeline_writes", phase_json(r.pipeline_writes)},
                      {"pipeline_ns", r.pipeline_ns},
                      {"compute_ns", r.compute_ns},
                      {"compute_produce_ns", r.compute_produce_ns},
                      {"read_stall_ns", r.read_stall_ns},
                      {"write_stall_ns", r.write_stall_ns},
                      {"bound", bound_name(pipeline_bound(bound))}};
  if (r.pread_parallel_threads) {
    j["pread_parallel"] = phase_json(r.pread_parallel);
    j["pread_parallel"]["threads"] = r.pread_parallel_threads;
  }
  return j;
}

/// Writes the figures as JSON: the median run's at the top level, every run under "runs", the spreads,
/// and the checks of all runs. `bounds[i]` gives run i's verdict; `extra` (an object) adds the GPU
/// build's fields.
void write_json(const Options& o, const std::vector<Report>& runs, const std::vector<BoundFigures>& bounds,
                const DataPlace& place, const nlohmann::json& extra = nlohmann::json::object()) {
  if (o.json_path.empty()) return;
  const std::size_t median = median_run(runs);
  const Report checks = all_checks(runs);
  nlohmann::json by_source = nlohmann::json::object();
  for (const auto& [source, count] : checks.verified_by_source) by_source[source] = count;
  nlohmann::json j = run_json(runs[median], bounds[median]);
  j.update({{"backend", o.backend},
            {"shape", shape_json(o.settings.shape)},
            {"model", o.model.kv_heads ? nlohmann::json{{"name", o.model.name},
                                                        {"layers", o.model.layers},
                                                        {"kv_heads", o.model.kv_heads},
                                                        {"head_dim", o.model.head_dim},
                                                        {"dtype", o.model.dtype}}
                                       : nlohmann::json(nullptr)},
            {"data_dir", o.backend == "memfs" ? nlohmann::json(nullptr)
                                              : nlohmann::json{{"path", place.dir.string()},
                                                               {"filesystem", place.filesystem.type},
                                                               {"source", place.filesystem.source},
                                                               {"ram_backed", !place.filesystem.ram_backed.empty()}}},
            {"repeat", runs.size()},
            {"median_run", median},
            {"verified_tensors", checks.verified_tensors},
            {"verified_tensors_by_source", by_source},
            {"mismatched_tensors", checks.mismatched_tensors}});
  if (o.backend == "nvme") j["tuttid"] = {{"controller", place.controller}, {"nsid", place.nsid}};
  j["spread"] = {
      {"restore_gb_per_s",
       spread_json(spread_over(runs, [](const Report& x) { return x.restore_only.gigabytes_per_second(); }))},
      {"pread_gb_per_s",
       spread_json(spread_over(runs, [](const Report& x) { return x.pread_baseline.gigabytes_per_second(); }))},
      {"tutti_over_pread", ratio_json(ratio_over(runs, &Report::pread_baseline))},
      {"pread_parallel_gb_per_s",
       spread_json(spread_over(runs, [](const Report& x) { return x.pread_parallel.gigabytes_per_second(); }))},
      {"tutti_over_pread_parallel", ratio_json(ratio_over(runs, &Report::pread_parallel))},
      {"pipeline_ms", spread_json(spread_over(runs, [](const Report& x) { return ms(x.pipeline_ns); }))}};
  j["runs"] = nlohmann::json::array();
  for (std::size_t i = 0; i < runs.size(); ++i) j["runs"].push_back(run_json(runs[i], bounds[i]));
  j.update(extra);
  std::ofstream out(o.json_path);
  out << j.dump(2) << "\n";
  if (!out.good()) fmt::print(stderr, "error: --json '{}': could not write the report\n", o.json_path);
}

/// The salt of run `index`'s recomputed tensors: nonzero (differs from the prepared content) and
/// different for every run, so a run's written-tensor check cannot pass on an earlier run's bytes.
std::uint64_t run_salt(const Options& o, std::uint32_t index) { return o.settings.run_salt + 2 * std::uint64_t{index}; }

/// "run 2 of 3: restore 0.95 GB/s, pipeline 1490 ms" on stderr, one line per run.
void say_run_done(const Options& o, std::uint32_t index, const Report& r) {
  fmt::print(stderr, "run {} of {}: restore {:.2f} GB/s, pipeline {:.0f} ms\n", index + 1, o.repeat,
             r.restore_only.gigabytes_per_second(), ms(r.pipeline_ns));
}

/// Ends a run: the summary (then `more_lines`, the CUDA build's), the JSON, and the exit code.
int finish(const Options& o, const std::vector<Report>& runs, const std::vector<BoundFigures>& bounds,
           const DataPlace& place, const nlohmann::json& extra = nlohmann::json::object(),
           const std::function<void()>& more_lines = {}) {
  print_report(o, runs, bounds[median_run(runs)]);
  if (more_lines) more_lines();
  fmt::print("  verdict        : {}\n", verdict_sentence(o, runs, bounds[median_run(runs)]));
  write_json(o, runs, bounds, place, extra);
  const Report checks = all_checks(runs);
  if (checks.mismatched_tensors != 0) {
    fmt::print(
        stderr, "error: {} not match {}, first: {}\n",
        checks.mismatched_tensors == 1 ? "1 tensor did" : fmt::format("{} tensors did", checks.mismatched_tensors),
        checks.mismatched_tensors == 1 ? "its checksum" : "their checksums",
        checks.mismatches.empty() ? "" : checks.mismatches.front());
    return kExitMismatch;
  }
  return kExitVerified;
}

/// Runs every phase on one runtime, o.repeat times. `uris[l]` names layer l's target; `dirs` hold the
/// layer files when `file_backed` (the pread baselines read them): one folder, or (striped) shard i's
/// folder at i. `memory`: where the KV slots come from (null: aligned_alloc).
template <class Runtime>
int run(Runtime& runtime, const Options& o, const DataPlace& place, const std::vector<fs::path>& dirs,
        const std::vector<std::string>& uris, bool file_backed,
        const std::function<tutti::Status(Runtime&)>& prepare_in_runtime, HostMemorySource* memory = nullptr) {
  const Checksums sums = expected_checksums(o.settings.shape);
  if (prepare_in_runtime)
    if (auto s = prepare_in_runtime(runtime); !s.is_ok()) return fail_with(s, kExitFailed, "preparing data");
  std::vector<Report> runs;
  std::vector<BoundFigures> bounds;
  for (std::uint32_t index = 0; index < o.repeat; ++index) {
    Settings settings = o.settings;
    settings.run_salt = run_salt(o, index);
    Report report;
    Pipeline<Runtime> pipeline(runtime, settings, sums, memory);
    if (auto s = pipeline.open(uris); !s.is_ok()) return fail_with(s, kExitFailed, "open");
    drop_page_cache(o);
    if (auto s = pipeline.restore_only(report); !s.is_ok()) return fail_with(s, kExitFailed, "restore");
    if (file_backed && o.pread_baseline) {
      drop_page_cache(o);
      if (auto s = pread_baseline(settings, dirs, pipeline, sums, report); !s.is_ok())
        return fail_with(s, kExitFailed, "pread baseline");
      drop_page_cache(o);
      const auto threads =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(report.restore_max_in_flight, kMaxPreadThreads));
      if (auto s = pread_parallel_baseline(settings, dirs, pipeline, sums, threads, report); !s.is_ok())
        return fail_with(s, kExitFailed, "parallel pread baseline");
    }
    drop_page_cache(o);
    if (auto s = pipeline.run(report); !s.is_ok()) return fail_with(s, kExitFailed, "pipeline");
    if (o.settings.verify)
      if (auto s = pipeline.verify_written(report); !s.is_ok())
        return fail_with(s, kExitFailed, "verify written tensors");
    if (o.repeat > 1) say_run_done(o, index, report);
    bounds.push_back(host_bound_figures(o, report));
    runs.push_back(std::move(report));
  }
  return finish(o, runs, bounds, place);
}

/// Runs a shell command quietly; false on a non-zero exit.
bool shell(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

#if defined(LAYERWISE_GPU)
/// The CUDA build's verdict figures: the compute stream's time and its idle time before each layer
/// (CUDA events: what compute waited for IO), and the host thread's waits, which say which IO it was.
BoundFigures gpu_bound_figures(const Options& o, const Report& r, const GpuReport& g) {
  BoundFigures f;
  f.layers = o.settings.shape.layers;
  f.compute_name = "GPU compute";
  f.pipeline_ns = r.pipeline_ns;
  f.compute_ns = g.gpu_compute_ns;
  f.compute_waited_ns = r.read_stall_ns;  // the compute stream's idle time before each layer
  f.read_wait_ns = g.host_read_wait_ns;
  f.write_wait_ns = r.write_stall_ns;
  f.restore_alone_ns = r.restore_only.ns;
  return f;
}

/// The GPU build's lines of the summary: the device, the compute, the cuFile baseline.
void print_gpu_report(const Options& o, const Report& r, const GpuReport& g) {
  const Shape& s = o.settings.shape;
  fmt::print("  device         : {}, accelerator {}; KV slots in device memory (accel::allocate_device)\n", g.device,
             o.accelerator);
  if (g.use_gemm) {
    fmt::print(
        "  compute        : per layer {}{} x GEMM [{} x {}] x [{} x {}] fp16 (fp32 accumulate, cuBLAS); one GEMM "
        "{:.3f} ms = {:.0f} TFLOP/s\n",
        g.gemm.head_elements
            ? fmt::format("attention over {} cached K tensors ([{} x {}] x [{} x {}]^T) + ", s.hit_chunks(),
                          o.gemm_tokens, g.gemm.head_elements, s.chunk_tokens, g.gemm.head_elements)
            : std::string(),
        g.gemm.repetitions, o.gemm_tokens, o.hidden, o.hidden, o.hidden, g.gemm.mlp_gemm_ms, g.gemm.mlp_tflops);
    const double achieved = g.gpu_compute_ns ? static_cast<double>(g.gemm.flops_per_layer) * s.layers /
                                                   static_cast<double>(g.gpu_compute_ns) / 1e3
                                             : 0.0;
    fmt::print(
        "  GPU compute    : {:.2f} ms on the compute stream over {} layers ({:.3f} ms per layer, {:.0f} TFLOP/s "
        "in the pipeline), GPU busy {:.0f}% of the pipeline\n",
        ms(g.gpu_compute_ns), s.layers, ms(g.gpu_compute_ns) / s.layers, achieved,
        r.pipeline_ns ? 100.0 * static_cast<double>(g.gpu_compute_ns) / static_cast<double>(r.pipeline_ns) : 0.0);
  } else {
    fmt::print("  GPU compute    : {:.2f} ms of a spin kernel over {} layers (--compute sleep, {:.2f} ms per layer)\n",
               ms(g.gpu_compute_ns), s.layers, o.compute_ms);
  }
  fmt::print(
      "  waits          : 'waiting for reads' is the compute stream's idle time before each layer (CUDA events); "
      "the host thread spent {:.2f} ms waiting for reads to complete\n",
      ms(g.host_read_wait_ns));
  for (const auto& run : g.cufile_runs)
    if (run.stats.ns && r.restore_only.ns)
      fmt::print(
          "  {:<15}: {:8.1f} MiB in {:8.2f} ms = {:6.2f} GB/s  (cuFileRead, {} in flight, same tensors, same device "
          "slots)  -> tutti/cuFile = {:.2f}x\n",
          fmt::format("cuFile {} thr", run.threads), static_cast<double>(run.stats.bytes) / (1 << 20), ms(run.stats.ns),
          run.stats.gigabytes_per_second(), run.threads,
          r.restore_only.gigabytes_per_second() / run.stats.gigabytes_per_second());
  if (!g.cufile_mode.empty()) fmt::print("  cuFile mode    : {}\n", g.cufile_mode);
  if (!g.cufile_error.empty())
    fmt::print("  cuFile         : {}: {}\n", g.cufile_runs.empty() ? "not measured" : "stopped", g.cufile_error);
}

nlohmann::json gpu_json(const Options& o, const Report& r, const GpuReport& g) {
  nlohmann::json compute = {{"mode", g.use_gemm ? "gemm" : "sleep"},
                            {"gpu_compute_ns", g.gpu_compute_ns},
                            {"host_read_wait_ns", g.host_read_wait_ns}};
  if (g.use_gemm)
    compute.update(
        {{"tokens", o.gemm_tokens},
         {"hidden", o.hidden},
         {"head_elements", g.gemm.head_elements},
         {"mlp_gemms_per_layer", g.gemm.repetitions},
         {"mlp_gemm_ms", g.gemm.mlp_gemm_ms},
         {"mlp_tflops", g.gemm.mlp_tflops},
         {"flops_per_layer", g.gemm.flops_per_layer},
         {"pipeline_tflops", g.gpu_compute_ns ? static_cast<double>(g.gemm.flops_per_layer) * o.settings.shape.layers /
                                                    static_cast<double>(g.gpu_compute_ns) / 1e3
                                              : 0.0}});
  nlohmann::json cufile = {{"mode", g.cufile_mode}, {"runs", nlohmann::json::array()}};
  if (!g.cufile_error.empty()) cufile["error"] = g.cufile_error;
  for (const auto& run : g.cufile_runs) {
    nlohmann::json j = phase_json(run.stats);
    j["threads"] = run.threads;
    cufile["runs"].push_back(j);
  }
  return {{"memory", "DEVICE"},
          {"gpu", {{"device", g.device}, {"accelerator", o.accelerator}, {"compute", compute}}},
          {"pread_cuda_memcpy_baseline", phase_json(r.pread_baseline)},
          {"cufile_baseline", cufile}};
}

/// Opens the GPU, its compute and its calibration (the figures go to `report`); errors are printed.
tutti::Result<std::unique_ptr<gpu::Gpu>> open_gpu(const Options& o, GpuReport& report) {
  const Shape& shape = o.settings.shape;
  gpu::ComputeConfig config;
  config.use_gemm = o.compute == "gemm";
  config.compute_ns = o.settings.compute_ns_per_layer;
  config.tokens = o.gemm_tokens;
  config.hidden = o.hidden;
  config.chunk_tokens = shape.chunk_tokens;
  config.tensor_bytes = shape.tensor_bytes;
  auto opened = gpu::Gpu::open(o.accelerator, config, shape.layers);
  if (!opened) {
    fmt::print(stderr, "error: GPU: {}\n", opened.status().to_string());
    return opened.status();
  }
  report.device = opened.value()->description();
  report.use_gemm = config.use_gemm;
  auto figures = opened.value()->calibrate(shape.hit_chunks());
  if (!figures) {
    fmt::print(stderr, "error: GEMM calibration: {}\n", figures.status().to_string());
    return figures.status();
  }
  report.gemm = *figures;
  return std::move(opened.value());
}

/// `o` with the GPU pipeline's pread baseline named "pread+memcpy" and described by `note` in the summary
/// (by default that of a layer file read one tensor at a time).
Options with_gpu_pread_note(
    Options o,
    std::string note = "pread O_DIRECT into a pinned buffer + cudaMemcpy, same tensors, same device slots, 1 thread") {
  o.pread_label = "pread+memcpy";
  o.pread_note = std::move(note);
  return o;
}

/// With --memory device, opens the GPU the KV slots live on into `device` (declare it before the runtime, so
/// it outlives it); false when that fails (open_gpu printed why). Nothing to do for host slots.
bool open_gpu_for_slots(const Options& o, GpuReport& report, std::unique_ptr<gpu::Gpu>& device) {
  if (o.memory != "device") return true;
  auto opened = open_gpu(o, report);
  if (!opened) return false;
  device = std::move(*opened);
  return true;
}

/// The pipeline with the KV slots in GPU memory and the compute on the GPU (gpu_pipeline.hpp), over
/// `runtime` (uring, local_nvme over the soft controller, or striped_nvme over N of them), on the layer
/// targets `uris`, whose files the baselines read in `dirs` (one folder, or striped one per shard),
/// --repeat times; the summary names `place`. `device` was opened before the runtime and outlives it.
template <class Runtime>
int run_gpu_pipeline(const Options& o, const DataPlace& place, const std::vector<std::string>& uris,
                     const std::vector<fs::path>& dirs, gpu::Gpu& device, GpuReport& gpu_report, Runtime& runtime) {
  const Checksums sums = expected_checksums(o.settings.shape);
  // One pipeline per run (--repeat): each run writes its recomputed tensors with its own salt.
  std::vector<Report> runs;
  std::vector<GpuReport> gpu_runs;
  std::vector<BoundFigures> bounds;
  const GpuReport gpu_start = gpu_report;
  for (std::uint32_t index = 0; index < o.repeat; ++index) {
    Settings settings = o.settings;
    settings.run_salt = run_salt(o, index);
    Report report;
    gpu_report = gpu_start;
    GpuPipeline<Runtime> pipeline(runtime, device, settings, sums);
    auto fail = [&](const tutti::Status& s, const char* phase) { return fail_with(s, kExitFailed, phase); };
    if (auto s = pipeline.open(uris); !s.is_ok()) return fail(s, "open");
    drop_page_cache(o);
    if (auto s = pipeline.restore_only(report); !s.is_ok()) return fail(s, "restore");
    if (o.pread_baseline) {
      drop_page_cache(o);
      if (auto s = pipeline.pread_baseline(dirs, report); !s.is_ok()) return fail(s, "pread + cudaMemcpy baseline");
    }
    if (o.cufile_baseline) {
      drop_page_cache(o);
      if (auto s = pipeline.cufile_baseline(dirs, report, gpu_report); !s.is_ok()) return fail(s, "cuFile baseline");
    } else {
      gpu_report.cufile_error = "off (--no-cufile-baseline)";
    }
    drop_page_cache(o);
    if (auto s = pipeline.run(report, gpu_report); !s.is_ok()) return fail(s, "pipeline");
    if (o.settings.verify)
      if (auto s = pipeline.verify_written(report); !s.is_ok()) return fail(s, "verify written tensors");
    if (o.repeat > 1) say_run_done(o, index, report);
    bounds.push_back(gpu_bound_figures(o, report, gpu_report));
    runs.push_back(std::move(report));
    gpu_runs.push_back(gpu_report);
  }
  const std::size_t median = median_run(runs);
  return finish(o, runs, bounds, place, gpu_json(o, runs[median], gpu_runs[median]),
                [&] { print_gpu_report(o, runs[median], gpu_runs[median]); });
}

/// The uring backend with the KV slots in GPU memory and the compute on the GPU (see gpu_pipeline.hpp).
int run_gpu(Options o, const DataPlace& place) {
  const fs::path& dir = place.dir;
  const Shape& shape = o.settings.shape;
  o = with_gpu_pread_note(o);
  if (auto s = prepare_files(shape, dir); !s.is_ok()) return fail_with(s, kExitFailed, "preparing data files");
  std::vector<std::string> uris;
  for (std::uint32_t l = 0; l < shape.layers; ++l) uris.push_back(file_uri(dir / shape.layer_file_name(l)));
  GpuReport gpu_report;
  auto device = open_gpu(o, gpu_report);  // outlives the runtime below
  if (!device) return kExitFailed;
  auto created = tutti::make_uring_runtime();
  if (!created) return fail_with(created.status(), kExitFailed);
  return run_gpu_pipeline<tutti::UringRuntime>(o, place, uris, {dir}, *device.value(), gpu_report, *created);
}
#endif  // LAYERWISE_GPU

/// An ext4 image (4096-byte blocks) attached to a loop device and mounted; unmounted and detached on
/// destruction. Made by mount_image.
struct LoopMount {
  fs::path image, mount_point;
  std::string loop;  ///< the loop device, "/dev/loopN"
  LoopMount() = default;
  LoopMount(const LoopMount&) = delete;
  LoopMount& operator=(const LoopMount&) = delete;
  ~LoopMount() {
    shell(fmt::format("umount '{}'", mount_point.string()));
    shell("losetup -d " + loop);
  }
};

/// Creates the ext4 image `image` of `bytes` bytes (kept when one of that size is there from an earlier
/// run: its files are reused when complete), attaches it to a free loop device and mounts it at
/// `mount_point` (created). Needs root. nullptr after printing what failed (truncate, mkfs.ext4,
/// losetup, mount).
std::unique_ptr<LoopMount> mount_image(const fs::path& image, const fs::path& mount_point, std::uint64_t bytes) {
  std::error_code ec;
  fs::create_directories(mount_point, ec);
  if (!fs::exists(image, ec) || fs::file_size(image, ec) != bytes) {  // error_code forms: never throw
    fs::remove(image, ec);
    if (!shell(
            fmt::format("truncate -s {} '{}' && mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 '{}'",
                        bytes, image.string(), image.string()))) {
      fmt::print(stderr, "error: could not create the ext4 image '{}' (truncate, mkfs.ext4)\n", image.string());
      return nullptr;
    }
  }
  std::string loop;
  if (FILE* p = popen(fmt::format("losetup --find --show '{}'", image.string()).c_str(), "r")) {
    char line[128] = {};
    if (std::fgets(line, sizeof line, p)) loop = line;
    pclose(p);
  }
  while (!loop.empty() && (loop.back() == '\n' || loop.back() == ' ')) loop.pop_back();
  if (loop.empty() || !shell(fmt::format("mount '{}' '{}'", loop, mount_point.string()))) {
    if (!loop.empty()) shell("losetup -d " + loop);
    fmt::print(stderr, "error: could not loop-mount '{}' (losetup, mount)\n", image.string());
    return nullptr;
  }
  auto mounted = std::make_unique<LoopMount>();
  mounted->image = image;
  mounted->mount_point = mount_point;
  mounted->loop = loop;
  return mounted;
}

/// local_nvme's retry counters as one summary line.
template <class DataPath>
void print_local_nvme_counters(const DataPath& datapath) {
  fmt::print("  local_nvme     : {} sent again after a retryable status, {} sent\n",
             counted(datapath.commands_retried(), "NVMe command"), counted(datapath.aborts_sent(), "Abort"));
}

/// The soft controller's counters as one summary line, labelled `label`.
void print_soft_counters(const std::string& label, const tutti::libnvm::SoftController& device) {
  const auto counters = device.counters();
  fmt::print("  {:<15}: {}, {} MiB read, {} MiB written, {}, {}\n", label,
             counted(counters.io_commands, "NVMe I/O command"), counters.bytes_read >> 20, counters.bytes_written >> 20,
             counted(counters.errors, "error"), counted(counters.dma_faults, "DMA fault"));
}

/// nvme-soft-striped on its stack: one striped:// target per layer over the shard files in `dirs`
/// (shard i on device i), every IO an NVMe command on the N soft controllers, one launch per submit
/// (striped_nvme). CUDA build: the kernels drive the queues from the GPU, and with --memory device the KV
/// slots are GPU memory, which every controller reaches with map_device (one registration each).
int run_striped_stack(const Options& o, const DataPlace& place, const std::vector<fs::path>& dirs,
                      const std::vector<std::unique_ptr<LoopMount>>& mounts) {
  const Shape& shape = o.settings.shape;
#if defined(LAYERWISE_GPU)
  std::unique_ptr<gpu::Gpu> device;  // declared before the stack: it outlives the runtime
  GpuReport gpu_report;
  if (!open_gpu_for_slots(o, gpu_report, device)) return kExitFailed;
#endif
  tutti::SoftStripedNvmeOptions nvme;
  for (const auto& m : mounts) {
    tutti::SoftStripedDevice device;
    device.backing_path = m->image.string();
    device.block_device_path = m->loop;
    device.soft.worker_threads = 1;  // N controllers on a machine of a few cores: one poller each
    nvme.devices.push_back(std::move(device));
  }
  auto stack = tutti::make_soft_striped_nvme(nvme);
  if (!stack) return fail_with(stack.status(), kExitFailed, "soft striped NVMe controllers");
  tutti::StripedMixedRuntime& runtime = *stack.value()->runtime;
  const auto& datapath = runtime.datapath<0>();
  // The stripe unit is one K or V tensor: it must be a whole number of every device's LBAs (NVMe Base
  // Specification 2.0, 5.17.2.1). Tensors are multiples of 4096 bytes and the soft controllers'
  // LBAs 4096 bytes, so this holds; refuse clearly should either change.
  for (std::size_t d = 0; d < datapath.controller_count(); ++d)
    if (shape.tensor_bytes % datapath.lba_size(d) != 0) {
      fmt::print(stderr,
                 "error: INVALID_ARGUMENT: the stripe unit, one K or V tensor of {} bytes, is not a multiple of "
                 "device {}'s LBA size of {} bytes: change --tokens-per-block or --tensor-bytes\n",
                 shape.tensor_bytes, d, datapath.lba_size(d));
      return kExitRefused;
    }
  std::vector<std::string> uris;
  for (std::uint32_t l = 0; l < shape.layers; ++l)
    uris.push_back(striped_uri(shape.layer_file_name(l), dirs, shape.tensor_bytes));
  int rc = kExitVerified;
#if defined(LAYERWISE_GPU)
  if (device) {
    const Options gpu_options = with_gpu_pread_note(
        o,
        "pread O_DIRECT of each tensor from its shard into a pinned buffer + cudaMemcpy, same device slots, 1 thread");
    rc = run_gpu_pipeline<tutti::StripedMixedRuntime>(gpu_options, place, uris, dirs, *device, gpu_report, runtime);
  } else
#endif
    rc = run<tutti::StripedMixedRuntime>(runtime, o, place, dirs, uris, true, {});
  fmt::print("  striped_nvme   : {}, unit {}, {}, {} sent\n", counted(datapath.controller_count(), "controller"),
             format_bytes(shape.tensor_bytes), counted(datapath.launches(), "launch", "launches"),
             counted(datapath.aborts_sent(), "Abort"));
  for (std::size_t d = 0; d < stack.value()->devices.size(); ++d)
    print_soft_counters(fmt::format("soft device {}", d), *stack.value()->devices[d]);
  return rc;
}

/// Bytes of each ext4 image of the soft NVMe backends: the device's share of the data set and a quarter
/// more, plus 64 MiB for ext4's own metadata and journal, in whole 4096-byte blocks.
std::uint64_t soft_image_bytes(const Shape& shape) {
  return (shape.layers * shape.shard_file_bytes() * 5 / 4 + (std::uint64_t{64} << 20)) / 4096 * 4096;
}

/// The ext4 image of soft NVMe device `i` under `base` (the data folder's nvme-soft or nvme-soft-striped).
fs::path soft_image_path(const fs::path& base, bool striped, std::uint32_t i) {
  return striped ? base / fmt::format("disk-{}.img", i) : base / "disk.img";
}

/// nvme-soft: the layer files live on an ext4 image (4096-byte blocks) loop-mounted under the data
/// directory; a software NVMe controller is backed by the same image, files are resolved to LBAs with
/// FIEMAP and every IO is an NVMe command on its queues. Needs root (losetup, mount).
/// nvme-soft-striped: the same with --stripe-devices N images, N soft controllers, and each layer a
/// striped:// target of N shard files, one per image, in units of one K or V tensor (run_striped_stack).
/// CUDA build: GPU threads run local_nvme's submit and poll kernels (compiled once in libtutti_cuda,
/// so this host-compiled file launches them too) against the soft controller in accelerator_mode;
/// with --memory device (nvme-soft) the KV slots are GPU memory, which the controller reaches with
/// map_device.
int run_nvme_soft(const Options& o, const DataPlace& place) {
  const fs::path& dir = place.dir;
  if (geteuid() != 0) {
    fmt::print(stderr, "error: --backend {} loop-mounts {} and needs root\n", o.backend,
               o.backend == "nvme-soft" ? "an ext4 image" : "ext4 images");
    return kExitRefused;
  }
  const Shape& shape = o.settings.shape;
  const bool striped = o.backend == "nvme-soft-striped";
  const std::uint32_t devices = striped ? shape.stripe_devices : 1;
  const fs::path base = dir / o.backend;
  const std::uint64_t image_bytes = soft_image_bytes(shape);
  std::vector<std::unique_ptr<LoopMount>> mounts;  // unmounted in reverse order on return
  std::vector<fs::path> dirs;
  for (std::uint32_t i = 0; i < devices; ++i) {
    auto mounted = mount_image(soft_image_path(base, striped, i),
                               striped ? base / fmt::format("mnt-{}", i) : base / "mnt", image_bytes);
    if (!mounted) return kExitFailed;
    dirs.push_back(mounted->mount_point);
    mounts.push_back(std::move(mounted));
  }
  for (std::uint32_t i = 0; i < devices; ++i)
    if (auto s = prepare_files(shape, dirs[i], i); !s.is_ok()) return fail_with(s, kExitFailed, "preparing data files");
  ::sync();
  if (striped) return run_striped_stack(o, place, dirs, mounts);

  const fs::path& mount_point = dirs.front();
  std::vector<std::string> uris;
  for (std::uint32_t l = 0; l < shape.layers; ++l) uris.push_back(file_uri(mount_point / shape.layer_file_name(l)));
#if defined(LAYERWISE_GPU)
  std::unique_ptr<gpu::Gpu> device;  // declared before the stack: it outlives the runtime
  GpuReport gpu_report;
  if (!open_gpu_for_slots(o, gpu_report, device)) return kExitFailed;
#endif
  tutti::SoftLocalNvmeOptions nvme;
  nvme.backing_path = mounts.front()->image.string();
  nvme.block_device_path = mounts.front()->loop;
  nvme.soft.worker_threads = 2;
  auto stack = tutti::make_soft_local_nvme(nvme);
  if (!stack) return fail_with(stack.status(), kExitFailed, "soft NVMe controller");
  int rc = kExitVerified;
#if defined(LAYERWISE_GPU)
  if (device) {
    const Options gpu_options = with_gpu_pread_note(o);
    rc = run_gpu_pipeline<tutti::LocalNvmeRuntime>(gpu_options, place, uris, dirs, *device, gpu_report,
                                                   *stack.value()->runtime);
  } else
#endif
    rc = run<tutti::LocalNvmeRuntime>(*stack.value()->runtime, o, place, dirs, uris, true, {});
  print_local_nvme_counters(stack.value()->runtime->datapath());
  print_soft_counters("soft controller", *stack.value()->device);
  return rc;
}

#if defined(LAYERWISE_TUTTID)
/// A refusal of --backend nvme on stderr, naming the controller and the socket: "error: CODE: --backend nvme
/// (--controller C, --tuttid-socket S): what: hint". Returns kExitRefused.
int refuse_nvme(const Options& o, const tutti::Status& s, const std::string& hint = {}) {
  fmt::print(stderr, "error: {}: --backend nvme (--controller {}, --tuttid-socket {}): {}{}\n",
             tutti::to_string(s.code()), o.lease.controller, o.lease.socket, s.message(),
             hint.empty() ? "" : ": " + hint);
  return kExitRefused;
}

/// --backend nvme, before the lease: the namespace of --controller as tuttid's `devices` lists it (no queue
/// taken), and the data folder (default <mount point>/tutti-layerwise-kv) resolved and checked to lie on its
/// file system, so that the folder's lock is taken before queues are leased (a run refused for the lock then
/// holds no queue another run needs). `placed`: whether it could. A --data-dir off the namespace is refused
/// here, before any queue is leased (the exit code, after printing why); when tuttid, the controller or its
/// namespace does not fit, `placed` is false and lease_for_run refuses with the reason.
std::optional<int> place_before_lease(const Options& o, DataPlace& place, bool& placed) {
  placed = false;
  auto connection = tutti::daemon::Connection::connect(o.lease.socket);
  if (!connection) return std::nullopt;
  auto devices = connection->call({{"tutti", 1}, {"op", "devices"}}, 10'000'000'000ull);
  if (!devices || !(*devices)["devices"].is_array()) return std::nullopt;
  for (const auto& d : (*devices)["devices"]) {
    if (d.value("name", "") != o.lease.controller || !d["namespaces"].is_array()) continue;
    for (const auto& n : d["namespaces"]) {
      if (!n.contains("block_device") || !n["block_device"].is_string()) continue;
      tutti::daemon::LeasedNamespace ns;
      ns.nsid = n.value("nsid", 0u);
      ns.mount = n.value("mount", "");
      ns.filesystem = n.value("filesystem", "");
      ns.block_device = n["block_device"].get<std::string>();
      if (o.data_dir.empty()) place.dir = fs::path(ns.mount) / "tutti-layerwise-kv";
      std::error_code ec;
      if (fs::path resolved = fs::weakly_canonical(fs::absolute(place.dir, ec), ec); !ec) place.dir = resolved;
      const tutti::Status on = check_on_namespace(place.dir, ns, o.lease.controller);   // lease_for_run checks again
      if (on.code() == tutti::StatusCode::INVALID_ARGUMENT) return refuse_nvme(o, on);  // --data-dir off the namespace
      placed = on.is_ok();
      return std::nullopt;
    }
  }
  return std::nullopt;
}

/// --backend nvme, before the data folder is checked: a lease from tuttid (`leased`; pinned bytes sized for the
/// shape), the file system of its namespace as tuttid mounted or verified it, and the data folder on it (the
/// default: <mount point>/tutti-layerwise-kv). Returns the exit code after printing why, on refusal.
std::optional<int> lease_for_run(const Options& o, DataPlace& place,
                                 std::unique_ptr<tutti::daemon::LeasedController>& leased) {
  const Shape& shape = o.settings.shape;
  const std::uint64_t pinned = lease_pinned_bytes(shape);
  auto refuse = [&o](const tutti::Status& s, const std::string& hint) { return refuse_nvme(o, s, hint); };
  // A path that is there but no socket (a regular file, a folder) says so, not "connection refused".
  if (struct stat st{}; ::stat(o.lease.socket.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode))
    return refuse(
        tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "--tuttid-socket '{}' is not a socket", o.lease.socket),
        "point --tuttid-socket at tuttid's socket (socket.path of its configuration)");
  auto acquired = tutti::daemon::LeasedController::acquire({.socket_path = o.lease.socket,
                                                            .controller = o.lease.controller,
                                                            .queues = static_cast<std::uint32_t>(o.lease.queues),
                                                            .pinned_bytes = pinned});
  if (!acquired) {
    const tutti::Status& s = acquired.status();
    const bool no_daemon = s.message().find("connect to tuttid") != std::string::npos;
    std::string hint;
    if (no_daemon)
      hint = "is tuttid running? Start it (docs/daemon.md) or point --tuttid-socket at its socket";
    else if (s.code() == tutti::StatusCode::NOT_FOUND)
      hint = "--controller must name a controller of tuttid's configuration (`tuttictl devices` lists them)";
    else if (s.message().find("client.max_queues") != std::string::npos)
      hint = fmt::format(
          "lower --lease-queues {} to at most client.max_queues of controller {} (less the queues this process "
          "holds), or raise client.max_queues in tuttid's configuration",
          o.lease.queues, o.lease.controller);
    else if (s.message().find("leasable queues free") != std::string::npos)
      hint = fmt::format(
          "other clients hold controller {}'s queues (`tuttictl leases` lists them): lower --lease-queues {}, or "
          "run when they are done",
          o.lease.controller, o.lease.queues);
    else if (s.code() == tutti::StatusCode::RESOURCE_EXHAUSTED)
      hint = fmt::format(
          "this shape needs a lease of {} pinned bytes (KV slots of {} and {} bytes and local_nvme's PRP lists) and "
          "--lease-queues {}: shrink the shape (--context-tokens, --tokens-per-block, --hit-percent), lower "
          "--lease-queues, or raise client.max_pinned_bytes / client.max_queues of controller {} in tuttid's "
          "configuration",
          pinned, read_slot_bytes(shape), write_slot_bytes(shape), o.lease.queues, o.lease.controller);
    else if (s.code() == tutti::StatusCode::UNSUPPORTED)
      hint = "the user must be on the controller's allow list (allow.users, allow.groups) and in the socket's group";
    else if (s.code() == tutti::StatusCode::NOT_READY)
      hint = "`tuttictl devices` says why the controller is not up (or tuttid is draining)";
    return refuse(s, hint);
  }
  leased = std::move(acquired.value());
  auto ns = lease_namespace(*leased, o.lease.controller);
  if (!ns) return refuse(ns.status(), "");
  place.controller = o.lease.controller;
  place.nsid = ns->nsid;
  if (o.data_dir.empty()) place.dir = fs::path(ns->mount) / "tutti-layerwise-kv";
  // Resolved first (symlinks, and ".." after the part that exists): the check walks the path's parents, and
  // MNT/missing/../../elsewhere is not on the namespace. Nothing is created before it passes.
  std::error_code ec;
  if (fs::path resolved = fs::weakly_canonical(fs::absolute(place.dir, ec), ec); !ec) place.dir = resolved;
  if (auto on = check_on_namespace(place.dir, *ns, o.lease.controller); !on.is_ok()) return refuse(on, "");
  return std::nullopt;
}

/// --backend nvme: the local_nvme runtime over the leased queues (LeasedController), the layer files on the
/// namespace's file system resolved with FIEMAP against the block device tuttid reports, the KV slots in
/// memory of the lease (the soft controller runs in tuttid's process and reaches only that). The files'
/// pages are dropped from the page cache before and after the run (drop_file_pages): the controller moves
/// their bytes behind the file system's back. The pread baselines read the same files with O_DIRECT.
int run_nvme_leased(const Options& o, const DataPlace& place, tutti::daemon::LeasedController& leased) {
  const Shape& shape = o.settings.shape;
  const fs::path& dir = place.dir;
  if (auto s = prepare_files(shape, dir); !s.is_ok()) return fail_with(s, kExitFailed, "preparing data files");
  if (auto s = drop_file_pages(shape, dir); !s.is_ok()) return fail_with(s, kExitFailed, "the layer files' pages");
  std::vector<std::string> uris;
  for (std::uint32_t l = 0; l < shape.layers; ++l) uris.push_back(file_uri(dir / shape.layer_file_name(l)));
  const tutti::daemon::LeasedNamespace* ns = nullptr;
  for (const auto& n : leased.namespaces())
    if (n.nsid == place.nsid) ns = &n;
  tutti::local_file::LocalFileResolver::Options resolver;
  resolver.block_device_path = ns->block_device;
  tutti::local_nvme::Options datapath;
  datapath.queue_pairs = static_cast<std::uint32_t>(leased.queue_ids().size());
  datapath.queue_depth = leased.queue_depth();
  int rc = kExitVerified;
  {
    auto runtime = tutti::make_local_nvme_runtime(leased, std::move(resolver), datapath);
    if (!runtime) return fail_with(runtime.status(), kExitFailed, "local_nvme runtime over the leased queues");
    LeasedMemory memory(leased);  // the KV slots; registered on the lease until it ends
    rc = run<tutti::LocalNvmeRuntime>(*runtime, o, place, {dir}, uris, true, {}, &memory);
    print_local_nvme_counters(runtime->datapath());
  }
  // "2 queues (IDs 3,4) of depth 64": how many, then which (the QIDs tuttid's log and `tuttictl leases` name).
  const auto& ids = leased.queue_ids();
  fmt::print(
      "  lease          : lease {} of tuttid on controller {}: {} ({} {}) of depth {}, namespace {} ({} on {})\n",
      leased.lease_id(), place.controller, counted(ids.size(), "queue"), ids.size() == 1 ? "ID" : "IDs",
      fmt::join(ids, ","), leased.queue_depth(), place.nsid, ns->block_device, ns->mount);
  if (auto s = drop_file_pages(shape, dir); !s.is_ok() && rc == kExitVerified)
    return fail_with(s, kExitFailed, "the layer files' pages after the run");
  return rc;
}
#endif  // LAYERWISE_TUTTID

/// The data folder's checks, in the order that gives the clearest message: the folder itself (not a
/// file, creatable), the lock (one run per folder), O_DIRECT on its file system (uring backend), then
/// the free space (for the soft NVMe backends, of their ext4 images, after removing the images of devices
/// this run does not use). Fills place.filesystem; takes `lock`. Returns the exit code on refusal.
std::optional<int> check_data_dir(const Options& o, DataPlace& place, DataDirLock& lock) {
  const Shape& shape = o.settings.shape;
  const fs::path& dir = place.dir;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    fmt::print(stderr,
               "error: INVALID_ARGUMENT: --data-dir '{}' is not a directory: give a folder (created when "
               "missing) for the layer files\n",
               dir.string());
    return kExitRefused;
  }
  fs::create_directories(dir, ec);
  if (ec)
    return fail_with(tutti::status_from_errno(ec.value(), fmt::format("--data-dir '{}': cannot create the "
                                                                      "folder",
                                                                      dir.string())),
                     kExitRefused);
  if (auto s = lock.acquire(dir); !s.is_ok()) return fail_with(s, kExitRefused);
  place.filesystem = describe_filesystem(dir);
  if (o.backend == "uring") {  // the files are read and written with O_DIRECT: say so before anything else
    auto probe = tutti::file::FileResolver{}.resolve(file_uri(dir / DataDirLock::kFileName), {});
    if (!probe && probe.code() == tutti::StatusCode::UNSUPPORTED) {
      fmt::print(stderr,
                 "error: UNSUPPORTED: --data-dir '{}' is on {}, which does not support O_DIRECT; the uring "
                 "backend reads and writes the layer files with O_DIRECT: pick a folder on a disk file system "
                 "(ext4, xfs, btrfs) with --data-dir\n",
                 dir.string(), place.filesystem.describe());
      return kExitRefused;
    }
  }
  const std::uint64_t data_bytes = data_set_bytes(shape);
  std::uint64_t needed = data_bytes + data_bytes / 4;
  std::uint64_t reusable = fs::exists(dir / "manifest.json", ec) ? data_bytes : 0;  // rewritten in place
  std::string what =
      fmt::format("the data set needs about {} ({} bytes and a quarter more)", format_bytes(needed), data_bytes);
  if (soft_nvme_backend(o.backend)) {
    // The layer files live inside ext4 images, each of soft_image_bytes. An image of that size from an
    // earlier run is reused: the blocks it has allocated are taken already (images are sparse). Images of
    // devices this run does not use (an earlier --stripe-devices was larger) are removed before the free
    // space is measured, so they neither hold space nor linger.
    const bool striped = o.backend == "nvme-soft-striped";
    const std::uint32_t devices = striped ? shape.stripe_devices : 1;
    const fs::path base = dir / o.backend;
    for (std::uint32_t i = striped ? devices : kMaxStripeDevices; i < kMaxStripeDevices; ++i)
      fs::remove(soft_image_path(base, true, i), ec);
    const std::uint64_t image = soft_image_bytes(shape);
    needed = devices * image;
    reusable = 0;
    for (std::uint32_t i = 0; i < devices; ++i) {
      const fs::path p = soft_image_path(base, striped, i);
      struct stat st {};
      if (::stat(p.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) == image)
        reusable += std::min<std::uint64_t>(image, static_cast<std::uint64_t>(st.st_blocks) * 512);
    }
    what = fmt::format(
        "the ext4 image{} of --backend {} need{} about {} ({}{} bytes{}: the device's share of the data set, a "
        "quarter more, and 64 MiB for ext4)",
        devices > 1 ? "s" : "", o.backend, devices > 1 ? "" : "s", format_bytes(needed),
        devices > 1 ? fmt::format("{} of ", devices) : std::string(), image, devices > 1 ? " each" : "");
  }
  const auto space = fs::space(dir, ec);
  if (ec)
    return fail_with(tutti::status_from_errno(ec.value(), fmt::format("--data-dir '{}': statvfs", dir.string())),
                     kExitRefused);
  if (needed > space.available + reusable) {
    fmt::print(stderr,
               "error: RESOURCE_EXHAUSTED: {} in --data-dir '{}', which has {} available: free space there, pick "
               "another folder with --data-dir, or shrink the data set (--model, --layers, --context-tokens)\n",
               what, dir.string(), format_bytes(space.available));
    return kExitRefused;
  }
  return std::nullopt;
}

/// "llama-3-70b, llama-3-8b, ...".
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  Shape& shape = o.settings.shape;
  const ModelShapes& models = ModelShapes::built_in();
  std::string model_name = "llama-3-70b";
  std::uint32_t kv_heads = 0, head_dim = 0;
  std::string dtype;
  CLI::App app{
      "Restore a prefix's KV cache from files layer by layer, overlapped with compute: "
      "read(L+1) || compute(L) || write(L-1). Every tensor read and written is verified."};
  app.footer(
      "Exit codes: 0 every tensor verified (or --prepare-only done); 1 a tensor did not match its checksum; 2 "
      "refused before the run (a bad option, shape or data folder: the message names it); 3 the run failed (an "
      "IO error, a timeout). docs/kv-cache.md explains the summary.");
  using tutti::bench::kDecimal;
  app.add_option(
         "--model", model_name,
         fmt::format("Model whose KV shape to use (layers, KV heads, head dim, dtype; data/model_shapes.json): {}",
                     joined(models.model_names())))
      ->check(CLI::IsMember(models.model_names()))
      ->capture_default_str();
  CLI::Option* layers_option = app.add_option("--layers", shape.layers, "Model layers (default: the model's)")
                                   ->check(kDecimal)
                                   ->check(CLI::Range(1u, 1024u));
  CLI::Option* kv_heads_option = app.add_option("--kv-heads", kv_heads, "KV heads per layer (default: the model's)")
                                     ->check(kDecimal)
                                     ->check(CLI::Range(1u, 4096u));
  CLI::Option* head_dim_option = app.add_option("--head-dim", head_dim, "Elements per head (default: the model's)")
                                     ->check(kDecimal)
                                     ->check(CLI::Range(1u, 65536u));
  CLI::Option* dtype_option =
      app.add_option("--dtype", dtype,
                     fmt::format("KV element type (default: the model's): {}", joined(models.dtype_names())))
          ->check(CLI::IsMember(models.dtype_names()));
  app.add_option("--context-tokens", shape.context_tokens, "Prefix length in tokens")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 1u << 24))
      ->capture_default_str();
  app.add_option("--tokens-per-block,--chunk-tokens", shape.chunk_tokens,
                 "Tokens per KV block: the unit stored and restored (one K and one V tensor per layer), a chunk in "
                 "the summary")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--hit-percent", shape.hit_percent, "Share of the prefix's chunks found in the cache")
      ->check(kDecimal)
      ->check(CLI::Range(0u, 100u))
      ->capture_default_str();
  app.add_option("--tensor-bytes", shape.tensor_bytes,
                 "Bytes of one K or V tensor of one chunk and layer, given directly instead of tokens per block x KV "
                 "heads x head dim x dtype bytes (multiple of 4096)")
      ->check(kDecimal)
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 30))
      ->excludes(kv_heads_option)
      ->excludes(head_dim_option)
      ->excludes(dtype_option);
  app.add_option(
         "--compute-ms", o.compute_ms,
         "Compute time per layer in milliseconds. Host: produce the missed chunks' K/V, then sleep out the "
         "rest (a layer takes longer when producing them alone does); CUDA build: the GEMMs' target or the spin")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  app.add_option("--repeat", o.repeat,
                 "Runs of the measured phases (restore, baselines, pipeline); figures print as median [min-max]")
      ->check(kDecimal)
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  std::vector<std::string> backends = {"uring", "nvme-soft", "nvme-soft-striped", "memfs"};
#if defined(LAYERWISE_TUTTID)
  backends.push_back("nvme");
#endif
  app.add_option("--backend", o.backend,
                 "Backend: uring (io_uring + O_DIRECT, any file system), nvme-soft (FIEMAP + NVMe queues of the "
                 "software NVMe controller, on an ext4 image it loop-mounts; root), nvme-soft-striped (each layer "
                 "striped over --stripe-devices ext4 images and soft controllers, one K or V tensor per unit; root), "
                 "memfs (host memory)"
#if defined(LAYERWISE_TUTTID)
                 " or nvme (FIEMAP + NVMe queues leased from tuttid on --controller, files on its namespace's file "
                 "system)"
#endif
                 )
      ->check(CLI::IsMember(backends))
      ->capture_default_str();
#if defined(LAYERWISE_TUTTID)
  CLI::Option* socket_option =
      app.add_option("--tuttid-socket", o.lease.socket, "tuttid's socket (--backend nvme)")->capture_default_str();
  CLI::Option* controller_option = app.add_option(
      "--controller", o.lease.controller,
      "The controller of tuttid's configuration whose queues --backend nvme leases (`tuttictl devices` lists them)");
  CLI::Option* lease_queues_option =
      app.add_option("--lease-queues", o.lease.queues,
                     fmt::format("NVMe queue pairs --backend nvme leases, 1 to {} (tuttid caps them per process: "
                                 "client.max_queues)",
                                 kMaxLeaseQueues))
          ->check(kDecimal)
          ->capture_default_str();
#endif
  CLI::Option* stripe_option =
      app.add_option("--stripe-devices", o.stripe_devices,
                     fmt::format("Devices to stripe every layer over with --backend nvme-soft-striped (an ext4 "
                                 "image and a soft NVMe controller each), 1 to {}",
                                 kMaxStripeDevices))
          ->check(kDecimal)
          ->capture_default_str();
  app.add_option("--data-dir", o.data_dir,
                 "Folder of the layer files, created when missing (default: $TMPDIR/tutti-layerwise-kv, or "
                 "/var/tmp/tutti-layerwise-kv without TMPDIR; --backend nvme: tutti-layerwise-kv under the mount point "
                 "of the leased namespace); one run at a time per folder")
      ->check(tutti::bench::kNotEmpty);
  app.add_flag("--prepare-only", o.prepare_only,
               "Create, preallocate and write the layer files of this shape in --data-dir, then exit (uring "
               "backend); a later run with the same shape options and --data-dir uses them as they are");
  app.add_option("--json", o.json_path, "Also write the figures as JSON to this file");
  // A switch and its negation as two flags ("--NAME" sets `value`, "--no-NAME" clears it; giving both is an
  // error): one flag "--NAME,!--no-NAME" would show as "--NAME,--no-NAME{false}" in --help, which reads
  // like a default of off. Each help text states the real default.
  auto add_switch = [&app](const std::string& name, bool& value, const std::string& on_help,
                           const std::string& off_help) {
    CLI::Option* on = app.add_flag_callback(
        "--" + name, [&value] { value = true; }, on_help);
    CLI::Option* off = app.add_flag_callback(
        "--no-" + name, [&value] { value = false; }, off_help);
    on->excludes(off);
  };
  add_switch("verify", o.settings.verify, "Verify every tensor read and written (default: on)", "Skip verification");
  add_switch("drop-caches", o.drop_caches,
             "Drop the page cache between phases (root only; default: on when run as root)",
             "Keep the page cache between phases");
  add_switch("pread-baseline", o.pread_baseline,
             "Measure pread with 1 thread and with as many threads as Tutti keeps requests in flight, in the same "
             "run (default: on)",
             "Skip the pread baselines");
#if defined(LAYERWISE_GPU)
  app.add_option("--memory", o.memory,
                 "Where the KV slots live: device (GPU memory, compute on the GPU; uring, nvme-soft and "
                 "nvme-soft-striped backends), host (the host profile's pipeline) or auto (device for those backends "
                 "when a CUDA device is present, else host)")
      ->check(CLI::IsMember({"auto", "device", "host"}))
      ->capture_default_str();
  app.add_option("--compute", o.compute,
                 "Per-layer compute on the GPU: gemm (cuBLAS GEMMs repeated to about --compute-ms) or sleep (a kernel "
                 "spinning --compute-ms)")
      ->check(CLI::IsMember({"gemm", "sleep"}))
      ->capture_default_str();
  app.add_option("--gemm-tokens", o.gemm_tokens, "Rows (new tokens) of the per-layer GEMMs")
      ->check(CLI::Range(1u, 1u << 16))
      ->capture_default_str();
  app.add_option("--hidden", o.hidden,
                 "Hidden size of the MLP GEMM [tokens x hidden] x [hidden x hidden] (multiple of 8)")
      ->check(CLI::Range(8u, 1u << 16))
      ->capture_default_str();
  app.add_option("--accelerator", o.accelerator, "CUDA device ordinal")
      ->check(CLI::Range(0, 1023))
      ->capture_default_str();
  add_switch("cufile-baseline", o.cufile_baseline,
             "Measure cuFile (cuFileRead into the same device slots) in the same run (default: on)",
             "Skip the cuFile baseline");
#endif
  // 0 after --help; 2 for a command line CLI11 refuses (it names the option): exit code kExitRefused.
  if (const int parsed = tutti::bench::parse_flags(app, argc, argv); parsed >= 0) return parsed;
  auto refuse = [](const std::string& message) {
    fmt::print(stderr, "error: INVALID_ARGUMENT: {}\n", message);
    return kExitRefused;
  };
  if (o.stripe_devices < 1 || o.stripe_devices > kMaxStripeDevices)
    return refuse(fmt::format(
        "--stripe-devices = {} is out of range: expected 1 to {} (one ext4 image and soft NVMe controller each)",
        o.stripe_devices, kMaxStripeDevices));
  if (stripe_option->count() && o.backend != "nvme-soft-striped")
    return refuse(fmt::format("--stripe-devices applies to --backend nvme-soft-striped, not --backend {}", o.backend));
  if (o.backend == "nvme-soft-striped") shape.stripe_devices = o.stripe_devices;
#if defined(LAYERWISE_TUTTID)
  for (const CLI::Option* lease_option : {socket_option, controller_option, lease_queues_option})
    if (lease_option->count() && o.backend != "nvme")
      return refuse(fmt::format("{} applies to --backend nvme, not --backend {}", lease_option->get_name(), o.backend));
  if (o.backend == "nvme" && o.lease.controller.empty())
    return refuse(
        "--backend nvme needs --controller NAME: the controller of tuttid's configuration to lease queues on "
        "(`tuttictl devices` lists them)");
  if (o.backend == "nvme" && o.lease.socket.empty())
    return refuse("--tuttid-socket is empty: expected the path of tuttid's socket (default " +
                  std::string(tutti::daemon::kDefaultSocketPath) + ")");
  if (o.lease.queues < 1 || o.lease.queues > kMaxLeaseQueues)
    return refuse(
        fmt::format("--lease-queues = {} is out of range: expected 1 to {}", o.lease.queues, kMaxLeaseQueues));
#endif
#if defined(LAYERWISE_GPU)
  const bool device_capable = o.backend != "memfs";
  if (o.memory == "auto") {
    o.memory = device_capable && gpu::device_count() > 0 ? "device" : "host";
    if (device_capable && o.memory == "host")
      fmt::print(stderr, "note: no CUDA device found: the KV slots live in host memory (--memory host)\n");
  }
  if (o.memory == "device" && !device_capable)
    return refuse(
        "--memory device needs --backend uring, nvme-soft or nvme-soft-striped (memfs moves host memory "
        "only); use --memory host");
  if (o.memory == "device" && o.hidden % 8 != 0)
    return refuse(fmt::format("--hidden = {} must be a multiple of 8", o.hidden));
#endif

  // The model's shape, with what the command line changed.
  o.model = *models.find(model_name);
  std::vector<std::string> changed;
  if (layers_option->count()) {
    o.model.layers = shape.layers;
    changed.push_back(fmt::format("--layers {}", shape.layers));
  }
  shape.layers = o.model.layers;
  if (kv_heads_option->count()) {
    o.model.kv_heads = kv_heads;
    changed.push_back(fmt::format("--kv-heads {}", kv_heads));
  }
  if (head_dim_option->count()) {
    o.model.head_dim = head_dim;
    changed.push_back(fmt::format("--head-dim {}", head_dim));
  }
  if (dtype_option->count()) {
    o.model.dtype = dtype;
    o.model.dtype_bytes = models.dtype_bytes(dtype);
    changed.push_back(fmt::format("--dtype {}", dtype));
  }
  if (!changed.empty()) o.model.name = fmt::format("{} with {}", model_name, joined(changed));
  if (shape.chunk_tokens > shape.context_tokens)
    return refuse(fmt::format("--tokens-per-block = {} exceeds --context-tokens = {}: the prefix holds no whole block",
                              shape.chunk_tokens, shape.context_tokens));
  if (app.count("--tensor-bytes")) {
    o.model.kv_heads = 0;  // the tensor size was given directly: no KV heads, head dim or dtype apply
    if (shape.tensor_bytes % 4096 != 0)
      return refuse(
          fmt::format("--tensor-bytes = {} must be a multiple of 4096 (O_DIRECT alignment)", shape.tensor_bytes));
  } else {
    const std::uint64_t per_token = std::uint64_t{o.model.kv_heads} * o.model.head_dim * o.model.dtype_bytes;
    const std::uint64_t bytes = o.model.tensor_bytes(shape.chunk_tokens);
    if (bytes % 4096 != 0)
      return refuse(fmt::format(
          "one K or V tensor of --tokens-per-block {} x {} x head dim {} x {} ({}) is {} bytes, not a "
          "multiple of 4096 (the O_DIRECT alignment): make --tokens-per-block a multiple of {}",
          shape.chunk_tokens, counted(o.model.kv_heads, "KV head"), o.model.head_dim,
          counted(o.model.dtype_bytes, "byte"), o.model.dtype, bytes, 4096 / std::gcd(per_token, std::uint64_t{4096})));
    if (bytes > (std::uint64_t{1} << 30))
      return refuse(
          fmt::format("one K or V tensor of --tokens-per-block {} is {} bytes, above the 1 GiB limit of "
                      "one request: lower --tokens-per-block",
                      counted(shape.chunk_tokens, "token"), bytes));
    shape.tensor_bytes = bytes;
  }
  if (std::isnan(o.compute_ms))  // CLI::Range lets NaN through (every comparison with it is false)
    return refuse(fmt::format("--compute-ms = {} must be a number in [0, 10000]", o.compute_ms));
  o.settings.compute_ns_per_layer = static_cast<std::uint64_t>(o.compute_ms * 1e6);
  o.settings.run_salt = std::random_device{}() | 1u;  // nonzero: differs from the prepared content
  // Fail fast on shapes this machine cannot hold, before hashing the whole data set. layers (<= 1024)
  // x layer_file_bytes (<= 2^24 chunks x 2 x 2^30) can pass 2^64: bound it first, so the free-space
  // check (data bytes + a quarter) cannot wrap and wave an impossible data set through.
  constexpr std::uint64_t kMaxDataSetBytes = std::uint64_t{1} << 60;
  if (shape.layer_file_bytes() > kMaxDataSetBytes / shape.layers)
    return refuse(fmt::format("the data set (--layers = {} x {} bytes per layer file) exceeds the limit of {} bytes",
                              shape.layers, shape.layer_file_bytes(), kMaxDataSetBytes));
  // Striped, a unit is one K or V tensor: the layer's tensors must lie back to back from offset 0 (they
  // do whenever the tensor is a multiple of 4096 bytes, as checked above), so each unit holds one tensor.
  if (shape.stripe_devices > 1 && shape.layer_file_bytes() != std::uint64_t{2} * shape.chunks() * shape.tensor_bytes)
    return refuse(fmt::format(
        "--backend nvme-soft-striped stripes in units of one K or V tensor ({} bytes), but a layer file of this "
        "shape is {} bytes, not {} x 2 tensors: pick a tensor size that is a multiple of 4096",
        shape.tensor_bytes, shape.layer_file_bytes(), counted(shape.chunks(), "chunk")));
  const std::uint64_t data_bytes = data_set_bytes(shape);
  if (o.backend == "memfs" && (shape.layer_file_bytes() > tutti::memfs::Store::Options::kDefaultMaxFileBytes ||
                               data_bytes > tutti::memfs::Store::Options::kDefaultMaxTotalBytes))
    return refuse(fmt::format("the data set ({} x {} bytes) exceeds memfs's limits ({} bytes per file, {} in all)",
                              counted(shape.layers, "layer"), shape.layer_file_bytes(),
                              tutti::memfs::Store::Options::kDefaultMaxFileBytes,
                              tutti::memfs::Store::Options::kDefaultMaxTotalBytes));
  if (o.prepare_only && o.backend != "uring")
    return refuse(fmt::format("--prepare-only writes the layer files of the uring backend; --backend {} {}", o.backend,
                              o.backend == "memfs"       ? "keeps its data in host memory"
                              : o.backend == "nvme-soft" ? "writes its files into the ext4 image it creates itself"
                              : o.backend == "nvme"
                                  ? "writes its files on the leased namespace's file system when it runs"
                                  : "writes its shard files into the ext4 images it creates itself"));

  DataPlace place;
  if (o.backend == "memfs") {
    print_header(o, place);
    std::vector<std::string> uris;
    for (std::uint32_t l = 0; l < shape.layers; ++l)
      uris.push_back(fmt::format("memfs://{}?size={}", shape.layer_file_name(l), shape.layer_file_bytes()));
    auto runtime = tutti::make_memfs_runtime();
    if (!runtime) return fail_with(runtime.status(), kExitFailed);
    return run<tutti::MemfsRuntime>(*runtime, o, place, {}, uris, false, [&](tutti::MemfsRuntime& rt) {
      // memfs lives in this process: write the data set through the runtime itself.
      AlignedBuffer tensor(shape.tensor_bytes);
      auto memory = rt.register_memory({tensor.data, tensor.size, tutti::MemoryKind::HOST});
      if (!memory) return memory.status();
      Window<tutti::MemfsRuntime> window(rt, o.settings.io_timeout_ns);
      Progress progress("writing the data set into memfs", data_bytes, Progress::Unit::bytes);
      std::uint64_t written = 0;
      for (std::uint32_t l = 0; l < shape.layers; ++l) {
        auto target = rt.open(uris[l], {.writable = true});
        if (!target) return target.status();
        for (std::uint32_t c = 0; c < shape.chunks(); ++c)
          for (std::uint32_t k = 0; k < 2; ++k) {
            fill_tensor(std::span(tensor.data, tensor.size), l, c, k);
            TUTTI_RETURN_IF_ERROR(window.submit(
                {{tutti::Direction::WRITE, *memory, 0, *target, shape.tensor_offset(c, k), shape.tensor_bytes}}));
            TUTTI_RETURN_IF_ERROR(window.drain());
            progress.update(written += shape.tensor_bytes);
          }
        TUTTI_RETURN_IF_ERROR(rt.close(*target));
      }
      progress.update(data_bytes);
      return rt.unregister_memory(*memory);
    });
  }

  const char* tmp = std::getenv("TMPDIR");
  place.dir =
      o.data_dir.empty() ? fs::path(tmp && *tmp ? tmp : "/var/tmp") / "tutti-layerwise-kv" : fs::path(o.data_dir);
  bool placed = false;  // nvme: the data folder known (and on the namespace) before the lease
#if defined(LAYERWISE_TUTTID)
  if (o.backend == "nvme")
    if (auto refused = place_before_lease(o, place, placed)) return *refused;  // --data-dir off the namespace
#endif
  DataDirLock lock;  // held until main returns: every phase below reads or writes the folder's files
  if (o.backend != "nvme" || placed)
    if (auto refused = check_data_dir(o, place, lock)) return *refused;  // the lock before the lease
#if defined(LAYERWISE_TUTTID)
  std::unique_ptr<tutti::daemon::LeasedController> leased;  // outlives the runtime over its queues
  if (o.backend == "nvme") {
    if (auto refused = lease_for_run(o, place, leased)) return *refused;
    if (!placed)
      if (auto refused = check_data_dir(o, place, lock)) return *refused;
  }
#endif
  print_header(o, place);
  const fs::path& dir = place.dir;
  if (o.prepare_only) {
    if (auto s = prepare_files(shape, dir); !s.is_ok()) return fail_with(s, kExitFailed, "preparing data files");
    fmt::print(
        "  prepared       : {} layer files, {}, in '{}'; a run with the same shape options and --data-dir uses "
        "them as they are (manifest.json records the shape)\n",
        shape.layers, format_bytes(data_bytes), dir.string());
    return kExitVerified;
  }
  if (soft_nvme_backend(o.backend)) return run_nvme_soft(o, place);
#if defined(LAYERWISE_TUTTID)
  if (o.backend == "nvme") return run_nvme_leased(o, place, *leased);
#endif

#if defined(LAYERWISE_GPU)
  if (o.memory == "device") return run_gpu(o, place);
#endif
  if (auto s = prepare_files(shape, dir); !s.is_ok()) return fail_with(s, kExitFailed, "preparing data files");
  std::vector<std::string> uris;
  for (std::uint32_t l = 0; l < shape.layers; ++l) uris.push_back(file_uri(dir / shape.layer_file_name(l)));
  auto runtime = tutti::make_uring_runtime();
  if (!runtime) return fail_with(runtime.status(), kExitFailed);
  return run<tutti::UringRuntime>(*runtime, o, place, {dir}, uris, true, {});
}
