// layerwise_kv_overlap: restore a long prefix's KV cache from files, layer by layer, while the model
// computes: read(L+1) || compute(L) || write(L-1). Verifies every tensor it reads and exits non-zero
// on any mismatch. See docs/kv-cache.md for the layout and README.md for how to run it.
// The CUDA build with cuBLAS (LAYERWISE_GPU) keeps the KV slots in GPU memory and computes on the GPU
// (gpu_pipeline.hpp, gpu_compute.cu), with pread + cudaMemcpy and cuFile baselines in the same run.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uriparser/Uri.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/libnvm/soft_local_nvme.hpp>
#include <tutti/tutti.hpp>

#include "dataset.hpp"
#include "pipeline.hpp"
#if defined(LAYERWISE_GPU)
#include "gpu_pipeline.hpp"
#endif

namespace fs = std::filesystem;
using namespace layerwise;

namespace {

struct Options {
  Settings settings;
  std::string backend = "uring";
  std::string data_dir;
  std::string json_path;
  bool drop_caches = geteuid() == 0;
  bool pread_baseline = true;
  double compute_ms = 2.0;
  /// The baseline's name and what it does, for the summary (the GPU build's baseline adds a copy).
  std::string pread_label = "plain pread";
  std::string pread_note = "same tensors, same memory, O_DIRECT, 1 thread";
#if defined(LAYERWISE_GPU)
  std::string memory = "auto";  ///< device: KV slots in GPU memory; host: the host profile's pipeline; auto: see --memory
  std::string compute = "gemm";    ///< gemm (cuBLAS) or sleep (a kernel spinning compute_ms)
  std::uint32_t gemm_tokens = 1024;
  std::uint32_t hidden = 8192;
  int accelerator = 0;
  bool cufile_baseline = true;
#endif
};

/// file:// URI of an absolute path, each segment percent-encoded.
std::string file_uri(const fs::path& path) {
  std::string uri = "file://";
  for (const auto& part : fs::absolute(path)) {
    if (part == "/") continue;
    const std::string segment = part.string();
    std::string escaped(segment.size() * 3 + 1, '\0');
    char* end = uriEscapeA(segment.c_str(), escaped.data(), URI_FALSE, URI_FALSE);
    escaped.resize(static_cast<std::size_t>(end - escaped.data()));
    uri += "/" + escaped;
  }
  return uri;
}

void progress_bar(const char* what, std::uint32_t done, std::uint32_t total) {
  constexpr int kWidth = 40;
  const int filled = total ? static_cast<int>(std::uint64_t{done} * kWidth / total) : kWidth;
  fmt::print(stderr, "\r{} [{}{}] {}/{}", what, std::string(filled, '#'), std::string(kWidth - filled, '.'), done, total);
  if (done == total) fmt::print(stderr, "\n");
  std::fflush(stderr);
}

nlohmann::json shape_json(const Shape& s) {
  // hit_percent belongs to the data set: the missed chunks hold the last run's recomputed tensors.
  return {{"layers", s.layers},           {"context_tokens", s.context_tokens}, {"chunk_tokens", s.chunk_tokens},
          {"tensor_bytes", s.tensor_bytes}, {"hit_percent", s.hit_percent},     {"format", 2}};
}

/// Writes the layer files (first run, or when the shape changed) with a progress bar.
tutti::Status prepare_files(const Shape& shape, const fs::path& dir) {
  const fs::path manifest = dir / "manifest.json";
  if (fs::exists(manifest)) {
    std::ifstream in(manifest);
    auto saved = nlohmann::json::parse(in, nullptr, false);
    bool complete = !saved.is_discarded() && saved == shape_json(shape);
    for (std::uint32_t l = 0; complete && l < shape.layers; ++l)
      complete = fs::exists(dir / shape.layer_file_name(l)) &&
                 fs::file_size(dir / shape.layer_file_name(l)) == shape.layer_file_bytes();
    if (complete) return tutti::Status::success();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "data directory '{}': {}", dir.string(), ec.message());
  fs::remove(manifest, ec);
  std::vector<std::byte> tensor(shape.tensor_bytes);
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const fs::path path = dir / shape.layer_file_name(l);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return tutti::error(tutti::StatusCode::DEVICE_ERROR, "create '{}': {}", path.string(), std::strerror(errno));
    for (std::uint32_t c = 0; c < shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k) {
        fill_tensor(tensor, l, c, k);
        const auto offset = static_cast<off_t>(shape.tensor_offset(c, k));
        if (::pwrite(fd, tensor.data(), tensor.size(), offset) != static_cast<ssize_t>(tensor.size())) {
          ::close(fd);
          return tutti::error(tutti::StatusCode::DEVICE_ERROR, "write '{}': {}", path.string(), std::strerror(errno));
        }
      }
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!synced) return tutti::error(tutti::StatusCode::DEVICE_ERROR, "fsync '{}'", path.string());
    progress_bar("preparing KV files", l + 1, shape.layers);
  }
  std::ofstream(manifest) << shape_json(shape).dump(2) << "\n";
  return tutti::Status::success();
}

void drop_page_cache(const Options& o) {
  if (!o.drop_caches) return;
  ::sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("3\n", f);
    std::fclose(f);
  }
}

/// The baseline: the same cached tensors through plain pread (one thread, O_DIRECT) into the same memory.
template <class Runtime>
tutti::Status pread_baseline(const Options& o, const fs::path& dir, Pipeline<Runtime>& pipeline,
                             const Checksums& sums, Report& report) {
  const Shape& shape = o.settings.shape;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const fs::path path = dir / shape.layer_file_name(l);
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return tutti::error(tutti::StatusCode::DEVICE_ERROR, "open '{}': {}", path.string(), std::strerror(errno));
    std::byte* slot = pipeline.read_slot(l);
    std::uint32_t index = 0;
    for (std::uint32_t c = 0; c < shape.hit_chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k, ++index) {
        std::byte* dst = slot + index * shape.tensor_bytes;
        const auto t = Clock::now();
        const ssize_t n = ::pread(fd, dst, shape.tensor_bytes, static_cast<off_t>(shape.tensor_offset(c, k)));
        report.pread_baseline.ns += elapsed_ns(t);  // the pread alone: hashing below is not timed
        if (n != static_cast<ssize_t>(shape.tensor_bytes)) {
          ::close(fd);
          return tutti::error(tutti::StatusCode::DATA_LOSS, "pread '{}' returned {}", path.string(), n);
        }
        report.pread_baseline.bytes += shape.tensor_bytes;
        ++report.pread_baseline.requests;
        if (o.settings.verify)  // counted like the pipelines' checks (Report::count_tensor), untimed
          report.count_tensor(checksum(std::span(dst, shape.tensor_bytes)) == sums.at(l, c, k), "pread", l, c, k);
      }
    ::close(fd);
  }
  return tutti::Status::success();
}

/// An exclusive flock(2) on "<data dir>/layerwise.lock", held until destruction (the end of main), so
/// that two runs cannot rewrite the same layer files at once (one's written-tensor check would then
/// read the other's bytes). Not copyable; one per process.
class DataDirLock {
 public:
  static constexpr const char* kFileName = "layerwise.lock";
  DataDirLock() = default;
  DataDirLock(const DataDirLock&) = delete;
  DataDirLock& operator=(const DataDirLock&) = delete;
  ~DataDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock; the empty file stays (unlinking it would race)
  }

  /// Takes the lock without waiting. Errors: BUSY when another process holds it (the message
  /// names the folder and --data-dir); DEVICE_ERROR when the lock file cannot be opened or locked.
  tutti::Status acquire(const fs::path& dir) {
    const fs::path path = dir / kFileName;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      return tutti::error(tutti::StatusCode::DEVICE_ERROR, "lock file '{}': {}", path.string(), std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return tutti::Status::success();
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      return tutti::error(tutti::StatusCode::BUSY,
                          "data directory '{}' is in use by another layerwise_kv_overlap run (it holds the lock "
                          "'{}'); wait for that run to end or pick another folder with --data-dir",
                          dir.string(), path.string());
    return tutti::error(tutti::StatusCode::DEVICE_ERROR, "flock '{}': {}", path.string(), std::strerror(err));
  }

 private:
  int fd_ = -1;
};

double ms(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

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

/// The summary (stdout). `bound` carries the figures of the "per layer" verdict (host_bound_figures,
/// or the CUDA build's gpu_bound_figures).
void print_report(const Options& o, const Report& r, const fs::path& dir, const BoundFigures& bound) {
  const Shape& s = o.settings.shape;
  fmt::print("\nlayerwise_kv_overlap  backend={}  data={}\n", o.backend, o.backend == "memfs" ? "memfs" : dir.string());
  if (o.backend == "nvme-soft")
    fmt::print("  note: nvme-soft is the software NVMe controller (pread/pwrite on an image file): its figures "
               "measure the emulation, not an NVMe drive\n");
  fmt::print("  shape: {} layers, {} tokens in {} chunks of {}, {}% cached ({} chunks), {} KiB K/V tensors\n", s.layers,
             s.context_tokens, s.chunks(), s.chunk_tokens, s.hit_percent, s.hit_chunks(), s.tensor_bytes / 1024);
  fmt::print("  restore only   : {:8.1f} MiB in {:8.2f} ms = {:6.2f} GB/s  ({} requests, {} device commands)\n",
             static_cast<double>(r.restore_only.bytes) / (1 << 20), ms(r.restore_only.ns),
             r.restore_only.gigabytes_per_second(), r.restore_only.requests, r.restore_only.commands);
  if (r.pread_baseline.ns && r.restore_only.ns)
    fmt::print("  {:<15}: {:8.1f} MiB in {:8.2f} ms = {:6.2f} GB/s  ({})  -> tutti/pread = {:.2f}x\n", o.pread_label,
               static_cast<double>(r.pread_baseline.bytes) / (1 << 20), ms(r.pread_baseline.ns),
               r.pread_baseline.gigabytes_per_second(), o.pread_note,
               r.restore_only.gigabytes_per_second() / r.pread_baseline.gigabytes_per_second());
  fmt::print("  pipeline       : {:8.2f} ms for {} layers: read {:6.2f} GB/s, write {:6.2f} GB/s ({} + {} requests, {} + {} "
             "commands)\n",
             ms(r.pipeline_ns), s.layers, static_cast<double>(r.pipeline_reads.bytes) / static_cast<double>(r.pipeline_ns),
             static_cast<double>(r.pipeline_writes.bytes) / static_cast<double>(r.pipeline_ns), r.pipeline_reads.requests,
             r.pipeline_writes.requests, r.pipeline_reads.commands, r.pipeline_writes.commands);
  fmt::print("  time split     : compute {:.2f} ms, waiting for reads {:.2f} ms, waiting for writes {:.2f} ms, verify "
             "{:.2f} ms\n",
             ms(r.compute_ns), ms(r.read_stall_ns), ms(r.write_stall_ns), ms(r.verify_ns));
  // Share of the read time hidden: restore alone takes R; inside the pipeline compute waited S for reads.
  const double hidden = r.restore_only.ns ? 1.0 - static_cast<double>(r.read_stall_ns) / static_cast<double>(r.restore_only.ns) : 0.0;
  if (r.restore_only.bytes == 0)
    fmt::print("  overlap        : n/a (no cached chunks to read: --hit-percent 0)\n");
  else
    fmt::print("  overlap        : compute waited {:.2f} ms for reads that take {:.2f} ms alone: {:.0f}% of the read "
               "time was hidden behind compute and writes\n",
               ms(r.read_stall_ns), ms(r.restore_only.ns), 100.0 * std::clamp(hidden, 0.0, 1.0));
  fmt::print("  per layer      : {}\n", layer_bound_line(bound));
  if (o.settings.verify)
    fmt::print("  verify         : {} tensors checked ({}; XXH3 per tensor read, byte compare per tensor written), {} "
               "mismatched -> {}\n",
               r.verified_tensors, r.checks_by_source(), r.mismatched_tensors, r.mismatched_tensors == 0 ? "VERIFIED" : "FAILED");
  else
    fmt::print("  verify         : off (--no-verify)\n");
}

nlohmann::json phase_json(const PhaseStats& p) {
  return nlohmann::json{{"bytes", p.bytes}, {"requests", p.requests}, {"commands", p.commands}, {"ns", p.ns},
                        {"gb_per_s", p.gigabytes_per_second()}};
}

/// Writes the figures as JSON; `bound` gives the "bound" verdict, `extra` (an object) adds the GPU build's fields.
void write_json(const Options& o, const Report& r, const BoundFigures& bound,
                const nlohmann::json& extra = nlohmann::json::object()) {
  if (o.json_path.empty()) return;
  auto phase = phase_json;
  nlohmann::json by_source = nlohmann::json::object();
  for (const auto& [source, count] : r.verified_by_source) by_source[source] = count;
  nlohmann::json j = {{"backend", o.backend},
                      {"shape", shape_json(o.settings.shape)},
                      {"restore_only", phase(r.restore_only)},
                      {"pread_baseline", phase(r.pread_baseline)},
                      {"pipeline_reads", phase(r.pipeline_reads)},
                      {"pipeline_writes", phase(r.pipeline_writes)},
                      {"pipeline_ns", r.pipeline_ns},
                      {"compute_ns", r.compute_ns},
                      {"read_stall_ns", r.read_stall_ns},
                      {"write_stall_ns", r.write_stall_ns},
                      {"verified_tensors", r.verified_tensors},
                      {"verified_tensors_by_source", by_source},
                      {"mismatched_tensors", r.mismatched_tensors},
                      {"bound", bound_name(pipeline_bound(bound))}};
  j.update(extra);
  std::ofstream out(o.json_path);
  out << j.dump(2) << "\n";
  if (!out.good()) fmt::print(stderr, "error: --json '{}': could not write the report\n", o.json_path);
}

/// Runs every phase on one runtime. `uris[l]` names layer l's target.
template <class Runtime>
int run(Runtime& runtime, const Options& o, const fs::path& dir, const std::vector<std::string>& uris,
        bool file_backed, const std::function<tutti::Status(Runtime&)>& prepare_in_runtime) {
  Report report;
  const Checksums sums = expected_checksums(o.settings.shape);
  if (prepare_in_runtime) {
    if (auto s = prepare_in_runtime(runtime); !s.is_ok()) {
      fmt::print(stderr, "error: preparing data: {}\n", s.to_string());
      return 2;
    }
  }
  Pipeline<Runtime> pipeline(runtime, o.settings, sums);
  auto fail = [&](const tutti::Status& s, const char* phase) {
    fmt::print(stderr, "error: {}: {}\n", phase, s.to_string());
    return 2;
  };
  if (auto s = pipeline.open(uris); !s.is_ok()) return fail(s, "open");
  drop_page_cache(o);
  if (auto s = pipeline.restore_only(report); !s.is_ok()) return fail(s, "restore");
  if (file_backed && o.pread_baseline) {
    drop_page_cache(o);
    if (auto s = pread_baseline(o, dir, pipeline, sums, report); !s.is_ok()) return fail(s, "pread baseline");
  }
  drop_page_cache(o);
  if (auto s = pipeline.run(report); !s.is_ok()) return fail(s, "pipeline");
  if (o.settings.verify)
    if (auto s = pipeline.verify_written(report); !s.is_ok()) return fail(s, "verify written tensors");
  print_report(o, report, dir, host_bound_figures(o, report));
  write_json(o, report, host_bound_figures(o, report));
  if (report.mismatched_tensors != 0) {
    fmt::print(stderr, "error: {} tensors did not match their checksums, first: {}\n", report.mismatched_tensors,
               report.mismatches.empty() ? "" : report.mismatches.front());
    return 1;
  }
  return 0;
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
  fmt::print("  device         : {}, accelerator {}; KV slots in device memory (accel::allocate_device)\n", g.device, o.accelerator);
  if (g.use_gemm) {
    fmt::print("  compute        : per layer {}{} x GEMM [{} x {}] x [{} x {}] fp16 (fp32 accumulate, cuBLAS); one GEMM "
               "{:.3f} ms = {:.0f} TFLOP/s\n",
               g.gemm.head_elements ? fmt::format("attention over {} cached K tensors ([{} x {}] x [{} x {}]^T) + ",
                                                  s.hit_chunks(), o.gemm_tokens, g.gemm.head_elements, s.chunk_tokens,
                                                  g.gemm.head_elements)
                                    : std::string(),
               g.gemm.repetitions, o.gemm_tokens, o.hidden, o.hidden, o.hidden, g.gemm.mlp_gemm_ms, g.gemm.mlp_tflops);
    const double achieved = g.gpu_compute_ns ? static_cast<double>(g.gemm.flops_per_layer) * s.layers /
                                                   static_cast<double>(g.gpu_compute_ns) / 1e3
                                             : 0.0;
    fmt::print("  GPU compute    : {:.2f} ms on the compute stream over {} layers ({:.3f} ms per layer, {:.0f} TFLOP/s "
               "in the pipeline), GPU busy {:.0f}% of the pipeline\n",
               ms(g.gpu_compute_ns), s.layers, ms(g.gpu_compute_ns) / s.layers, achieved,
               r.pipeline_ns ? 100.0 * static_cast<double>(g.gpu_compute_ns) / static_cast<double>(r.pipeline_ns) : 0.0);
  } else {
    fmt::print("  GPU compute    : {:.2f} ms of a spin kernel over {} layers (--compute sleep, {:.2f} ms per layer)\n",
               ms(g.gpu_compute_ns), s.layers, o.compute_ms);
  }
  fmt::print("  waits          : 'waiting for reads' is the compute stream's idle time before each layer (CUDA events); "
             "the host thread spent {:.2f} ms waiting for reads to complete\n",
             ms(g.host_read_wait_ns));
  for (const auto& run : g.cufile_runs)
    if (run.stats.ns && r.restore_only.ns)
      fmt::print("  {:<15}: {:8.1f} MiB in {:8.2f} ms = {:6.2f} GB/s  (cuFileRead, {} in flight, same tensors, same device "
                 "slots)  -> tutti/cuFile = {:.2f}x\n",
                 fmt::format("cuFile {} thr", run.threads), static_cast<double>(run.stats.bytes) / (1 << 20),
                 ms(run.stats.ns), run.stats.gigabytes_per_second(), run.threads,
                 r.restore_only.gigabytes_per_second() / run.stats.gigabytes_per_second());
  if (!g.cufile_mode.empty()) fmt::print("  cuFile mode    : {}\n", g.cufile_mode);
  if (!g.cufile_error.empty()) fmt::print("  cuFile         : {}: {}\n", g.cufile_runs.empty() ? "not measured" : "stopped", g.cufile_error);
}

nlohmann::json gpu_json(const Options& o, const Report& r, const GpuReport& g) {
  nlohmann::json compute = {{"mode", g.use_gemm ? "gemm" : "sleep"},
                            {"gpu_compute_ns", g.gpu_compute_ns},
                            {"host_read_wait_ns", g.host_read_wait_ns}};
  if (g.use_gemm)
    compute.update({{"tokens", o.gemm_tokens},
                    {"hidden", o.hidden},
                    {"head_elements", g.gemm.head_elements},
                    {"mlp_gemms_per_layer", g.gemm.repetitions},
                    {"mlp_gemm_ms", g.gemm.mlp_gemm_ms},
                    {"mlp_tflops", g.gemm.mlp_tflops},
                    {"flops_per_layer", g.gemm.flops_per_layer},
                    {"pipeline_tflops", g.gpu_compute_ns ? static_cast<double>(g.gemm.flops_per_layer) *
                                                               o.settings.shape.layers /
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

/// The pipeline with the KV slots in GPU memory and the compute on the GPU (gpu_pipeline.hpp), over
/// `runtime` (uring, or local_nvme over the soft controller), on the layer files `uris` / `paths`
/// (the baselines read `paths`). `device` was opened before the runtime and outlives it.
template <class Runtime>
int run_gpu_pipeline(const Options& o, const fs::path& dir, const std::vector<std::string>& uris,
                     const std::vector<std::string>& paths, gpu::Gpu& device, GpuReport& gpu_report, Runtime& runtime) {
  Report report;
  const Checksums sums = expected_checksums(o.settings.shape);
  {
    GpuPipeline<Runtime> pipeline(runtime, device, o.settings, sums);
    auto fail = [&](const tutti::Status& s, const char* phase) {
      fmt::print(stderr, "error: {}: {}\n", phase, s.to_string());
      return 2;
    };
    if (auto s = pipeline.open(uris); !s.is_ok()) return fail(s, "open");
    drop_page_cache(o);
    if (auto s = pipeline.restore_only(report); !s.is_ok()) return fail(s, "restore");
    if (o.pread_baseline) {
      drop_page_cache(o);
      if (auto s = pipeline.pread_baseline(paths, report); !s.is_ok()) return fail(s, "pread + cudaMemcpy baseline");
    }
    if (o.cufile_baseline) {
      drop_page_cache(o);
      if (auto s = pipeline.cufile_baseline(paths, report, gpu_report); !s.is_ok()) return fail(s, "cuFile baseline");
    } else {
      gpu_report.cufile_error = "off (--no-cufile-baseline)";
    }
    drop_page_cache(o);
    if (auto s = pipeline.run(report, gpu_report); !s.is_ok()) return fail(s, "pipeline");
    if (o.settings.verify)
      if (auto s = pipeline.verify_written(report); !s.is_ok()) return fail(s, "verify written tensors");
  }
  print_report(o, report, dir, gpu_bound_figures(o, report, gpu_report));
  print_gpu_report(o, report, gpu_report);
  write_json(o, report, gpu_bound_figures(o, report, gpu_report), gpu_json(o, report, gpu_report));
  if (report.mismatched_tensors != 0) {
    fmt::print(stderr, "error: {} tensors did not match their checksums, first: {}\n", report.mismatched_tensors,
               report.mismatches.empty() ? "" : report.mismatches.front());
    return 1;
  }
  return 0;
}

/// The uring backend with the KV slots in GPU memory and the compute on the GPU (see gpu_pipeline.hpp).
int run_gpu(Options o, const fs::path& dir) {
  const Shape& shape = o.settings.shape;
  o.pread_label = "pread+memcpy";
  o.pread_note = "pread O_DIRECT into a pinned buffer + cudaMemcpy, same tensors, same device slots, 1 thread";
  if (auto s = prepare_files(shape, dir); !s.is_ok()) {
    fmt::print(stderr, "error: preparing data files: {}\n", s.to_string());
    return 2;
  }
  std::vector<std::string> uris, paths;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    paths.push_back((dir / shape.layer_file_name(l)).string());
    uris.push_back(file_uri(dir / shape.layer_file_name(l)));
  }
  GpuReport gpu_report;
  auto device = open_gpu(o, gpu_report);  // outlives the runtime below
  if (!device) return 2;
  auto created = tutti::make_uring_runtime();
  if (!created) {
    fmt::print(stderr, "error: {}\n", created.status().to_string());
    return 2;
  }
  return run_gpu_pipeline<tutti::UringRuntime>(o, dir, uris, paths, *device.value(), gpu_report, *created);
}
#endif  // LAYERWISE_GPU

/// nvme-soft: the layer files live on an ext4 image (4096-byte blocks) loop-mounted under the data
/// directory; a software NVMe controller is backed by the same image, files are resolved to LBAs with
/// FIEMAP and every IO is an NVMe command on its queues. Needs root (losetup, mount).
/// CUDA build: GPU threads run local_nvme's submit and poll kernels (compiled once in libtutti_cuda,
/// so this host-compiled file launches them too) against the soft controller in accelerator_mode;
/// with --memory device the KV slots are GPU memory, which the controller reaches with map_device.
int run_nvme_soft(const Options& o, const fs::path& dir) {
  if (geteuid() != 0) {
    fmt::print(stderr, "error: --backend nvme-soft loop-mounts an ext4 image and needs root\n");
    return 2;
  }
  const Shape& shape = o.settings.shape;
  const fs::path base = dir / "nvme-soft", image = base / "disk.img", mount_point = base / "mnt";
  std::error_code ec;
  fs::create_directories(mount_point, ec);
  const std::uint64_t image_bytes = (shape.layers * shape.layer_file_bytes() * 5 / 4 + (std::uint64_t{64} << 20)) / 4096 * 4096;
  if (!fs::exists(image) || fs::file_size(image) != image_bytes) {
    fs::remove(image, ec);
    if (!shell(fmt::format("truncate -s {} '{}' && mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 '{}'",
                           image_bytes, image.string(), image.string()))) {
      fmt::print(stderr, "error: could not create the ext4 image '{}'\n", image.string());
      return 2;
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
    fmt::print(stderr, "error: could not loop-mount '{}'\n", image.string());
    return 2;
  }
  struct Unmount {
    std::string loop, mount_point;
    ~Unmount() {
      shell(fmt::format("umount '{}'", mount_point));
      shell("losetup -d " + loop);
    }
  } unmount{loop, mount_point.string()};

  if (auto s = prepare_files(shape, mount_point); !s.is_ok()) {
    fmt::print(stderr, "error: preparing data files: {}\n", s.to_string());
    return 2;
  }
  ::sync();
  std::vector<std::string> uris, paths;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    uris.push_back(file_uri(mount_point / shape.layer_file_name(l)));
    paths.push_back((mount_point / shape.layer_file_name(l)).string());
  }
#if defined(LAYERWISE_GPU)
  std::unique_ptr<gpu::Gpu> device;  // declared before the stack: it outlives the runtime
  GpuReport gpu_report;
  if (o.memory == "device") {
    auto opened = open_gpu(o, gpu_report);
    if (!opened) return 2;
    device = std::move(*opened);
  }
#endif
  tutti::SoftLocalNvmeOptions nvme;
  nvme.backing_path = image.string();
  nvme.block_device_path = loop;
  nvme.soft.worker_threads = 2;
  auto stack = tutti::make_soft_local_nvme(nvme);
  if (!stack) {
    fmt::print(stderr, "error: soft NVMe controller: {}\n", stack.status().to_string());
    return 2;
  }
  int rc = 0;
#if defined(LAYERWISE_GPU)
  if (device) {
    Options gpu_options = o;
    gpu_options.pread_label = "pread+memcpy";
    gpu_options.pread_note = "pread O_DIRECT into a pinned buffer + cudaMemcpy, same tensors, same device slots, 1 thread";
    rc = run_gpu_pipeline<tutti::LocalNvmeRuntime>(gpu_options, mount_point, uris, paths, *device, gpu_report,
                                                   *stack.value()->runtime);
  } else
#endif
    rc = run<tutti::LocalNvmeRuntime>(*stack.value()->runtime, o, mount_point, uris, true, {});
  fmt::print("  local_nvme     : {} NVMe commands sent again after a retryable status, {} Aborts sent\n",
             stack.value()->runtime->datapath().commands_retried(), stack.value()->runtime->datapath().aborts_sent());
  const auto counters = stack.value()->device->counters();
  fmt::print("  soft controller: {} NVMe I/O commands, {} MiB read, {} MiB written, {} errors, {} DMA faults\n",
             counters.io_commands, counters.bytes_read >> 20, counters.bytes_written >> 20, counters.errors,
             counters.dma_faults);
  return rc;
}
}  // namespace

int main(int argc, char** argv) {
  Options o;
  Shape& shape = o.settings.shape;
  CLI::App app{"Restore a prefix's KV cache from files layer by layer, overlapped with compute: "
               "read(L+1) || compute(L) || write(L-1). Every tensor read is verified."};
  app.add_option("--layers", shape.layers, "Model layers")->check(CLI::Range(1u, 1024u))->capture_default_str();
  app.add_option("--context-tokens", shape.context_tokens, "Prefix length in tokens")
      ->check(CLI::Range(1u, 1u << 24))->capture_default_str();
  app.add_option("--chunk-tokens", shape.chunk_tokens, "Tokens per KV chunk")->check(CLI::Range(1u, 1u << 20))->capture_default_str();
  app.add_option("--hit-percent", shape.hit_percent, "Share of the prefix's chunks found in the cache")
      ->check(CLI::Range(0u, 100u))->capture_default_str();
  app.add_option("--tensor-bytes", shape.tensor_bytes, "Bytes of one K or V tensor of one chunk (multiple of 4096)")
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 30))->capture_default_str();
  app.add_option("--compute-ms", o.compute_ms, "Compute time per layer in milliseconds (simulated on the host; in the CUDA build the GEMMs' target or the spin)")
      ->check(CLI::Range(0.0, 10000.0))->capture_default_str();
  app.add_option("--backend", o.backend,
                 "Backend: uring (io_uring + O_DIRECT, any file system), nvme-soft (FIEMAP + NVMe queues of the "
                 "software NVMe controller, on an ext4 image it loop-mounts; root) or memfs (host memory)")
      ->check(CLI::IsMember({"uring", "nvme-soft", "memfs"}))->capture_default_str();
  app.add_option("--data-dir", o.data_dir,
                 "Where the layer files live (default: $TMPDIR/tutti-layerwise-kv); one run at a time per folder "
                 "(a second run fails at once)");
  app.add_option("--json", o.json_path, "Also write the figures as JSON to this file");
  // A switch and its negation as two flags ("--NAME" sets `value`, "--no-NAME" clears it; giving both is an
  // error): one flag "--NAME,!--no-NAME" would show as "--NAME,--no-NAME{false}" in --help, which reads
  // like a default of off. Each help text states the real default.
  auto add_switch = [&app](const std::string& name, bool& value, const std::string& on_help, const std::string& off_help) {
    CLI::Option* on = app.add_flag_callback("--" + name, [&value] { value = true; }, on_help);
    CLI::Option* off = app.add_flag_callback("--no-" + name, [&value] { value = false; }, off_help);
    on->excludes(off);
  };
  add_switch("verify", o.settings.verify, "Verify every tensor read and written (default: on)", "Skip verification");
  add_switch("drop-caches", o.drop_caches, "Drop the page cache between phases (root only; default: on when run as root)",
             "Keep the page cache between phases");
  add_switch("pread-baseline", o.pread_baseline, "Measure plain pread in the same run (default: on)",
             "Skip the plain pread baseline");
#if defined(LAYERWISE_GPU)
  app.add_option("--memory", o.memory,
                 "Where the KV slots live: device (GPU memory, compute on the GPU; uring and nvme-soft backends), "
                 "host (the host profile's pipeline) or auto (device for uring and nvme-soft when a CUDA device is "
                 "present, else host)")
      ->check(CLI::IsMember({"auto", "device", "host"}))->capture_default_str();
  app.add_option("--compute", o.compute,
                 "Per-layer compute on the GPU: gemm (cuBLAS GEMMs repeated to about --compute-ms) or sleep (a kernel "
                 "spinning --compute-ms)")
      ->check(CLI::IsMember({"gemm", "sleep"}))->capture_default_str();
  app.add_option("--gemm-tokens", o.gemm_tokens, "Rows (new tokens) of the per-layer GEMMs")
      ->check(CLI::Range(1u, 1u << 16))->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden size of the MLP GEMM [tokens x hidden] x [hidden x hidden] (multiple of 8)")
      ->check(CLI::Range(8u, 1u << 16))->capture_default_str();
  app.add_option("--accelerator", o.accelerator, "CUDA device ordinal")->check(CLI::Range(0, 1023))->capture_default_str();
  add_switch("cufile-baseline", o.cufile_baseline,
             "Measure cuFile (cuFileRead into the same device slots) in the same run (default: on)",
             "Skip the cuFile baseline");
#endif
  CLI11_PARSE(app, argc, argv);
#if defined(LAYERWISE_GPU)
  if (o.memory == "auto") {
    o.memory = o.backend != "memfs" && gpu::device_count() > 0 ? "device" : "host";
    if (o.backend != "memfs" && o.memory == "host")
      fmt::print(stderr, "note: no CUDA device found: the KV slots live in host memory (--memory host)\n");
  }
  if (o.memory == "device" && o.backend == "memfs") {
    fmt::print(stderr, "error: --memory device needs --backend uring or nvme-soft (memfs moves host memory only); use "
                       "--memory host\n");
    return 2;
  }
  if (o.memory == "device" && o.hidden % 8 != 0) {
    fmt::print(stderr, "error: --hidden = {} must be a multiple of 8\n", o.hidden);
    return 2;
  }
#endif
  if (shape.chunk_tokens > shape.context_tokens) {
    fmt::print(stderr, "error: --chunk-tokens = {} exceeds --context-tokens = {}: the prefix holds no whole chunk\n",
               shape.chunk_tokens, shape.context_tokens);
    return 2;
  }
  if (shape.tensor_bytes % 4096 != 0) {
    fmt::print(stderr, "error: --tensor-bytes = {} must be a multiple of 4096 (O_DIRECT alignment)\n", shape.tensor_bytes);
    return 2;
  }
  if (std::isnan(o.compute_ms)) {  // CLI::Range lets NaN through (every comparison with it is false)
    fmt::print(stderr, "error: --compute-ms = {} must be a number in [0, 10000]\n", o.compute_ms);
    return 2;
  }
  o.settings.compute_ns_per_layer = static_cast<std::uint64_t>(o.compute_ms * 1e6);
  o.settings.run_salt = std::random_device{}() | 1u;  // nonzero: differs from the prepared content
  // Fail fast on shapes this machine cannot hold, before hashing the whole data set. layers (<= 1024)
  // x layer_file_bytes (<= 2^24 chunks x 2 x 2^30) can pass 2^64: bound it first, so the free-space
  // check below (data_bytes + data_bytes / 4) cannot wrap and wave an impossible data set through.
  constexpr std::uint64_t kMaxDataSetBytes = std::uint64_t{1} << 60;
  if (shape.layer_file_bytes() > kMaxDataSetBytes / shape.layers) {
    fmt::print(stderr, "error: the data set (--layers = {} x {} bytes per layer file) exceeds the limit of {} bytes\n",
               shape.layers, shape.layer_file_bytes(), kMaxDataSetBytes);
    return 2;
  }
  const std::uint64_t data_bytes = std::uint64_t{shape.layers} * shape.layer_file_bytes();
  if (o.backend == "memfs" && (shape.layer_file_bytes() > tutti::memfs::Store::Options::kDefaultMaxFileBytes ||
                               data_bytes > tutti::memfs::Store::Options::kDefaultMaxTotalBytes)) {
    fmt::print(stderr, "error: the data set ({} layers x {} bytes) exceeds memfs's limits ({} bytes per file, {} in all)\n",
               shape.layers, shape.layer_file_bytes(), tutti::memfs::Store::Options::kDefaultMaxFileBytes,
               tutti::memfs::Store::Options::kDefaultMaxTotalBytes);
    return 2;
  }
  const char* tmp = std::getenv("TMPDIR");
  const fs::path dir = o.data_dir.empty() ? fs::path(tmp && *tmp ? tmp : "/tmp") / "tutti-layerwise-kv" : fs::path(o.data_dir);

  std::vector<std::string> uris;
  if (o.backend == "memfs") {
    for (std::uint32_t l = 0; l < shape.layers; ++l)
      uris.push_back(fmt::format("memfs://layer-{:03}?size={}", l, shape.layer_file_bytes()));
    auto runtime = tutti::make_memfs_runtime();
    if (!runtime) {
      fmt::print(stderr, "error: {}\n", runtime.status().to_string());
      return 2;
    }
    return run<tutti::MemfsRuntime>(*runtime, o, dir, uris, false, [&](tutti::MemfsRuntime& rt) {
      // memfs lives in this process: write the data set through the runtime itself.
      AlignedBuffer tensor(shape.tensor_bytes);
      auto memory = rt.register_memory({tensor.data, tensor.size, tutti::MemoryKind::HOST});
      if (!memory) return memory.status();
      Window<tutti::MemfsRuntime> window(rt, o.settings.io_timeout_ns);
      for (std::uint32_t l = 0; l < shape.layers; ++l) {
        auto target = rt.open(uris[l], {.writable = true});
        if (!target) return target.status();
        for (std::uint32_t c = 0; c < shape.chunks(); ++c)
          for (std::uint32_t k = 0; k < 2; ++k) {
            fill_tensor(std::span(tensor.data, tensor.size), l, c, k);
            TUTTI_RETURN_IF_ERROR(window.submit({{tutti::Direction::WRITE, *memory, 0, *target, shape.tensor_offset(c, k), shape.tensor_bytes}}));
            TUTTI_RETURN_IF_ERROR(window.drain());
          }
        TUTTI_RETURN_IF_ERROR(rt.close(*target));
        progress_bar("preparing KV tensors", l + 1, shape.layers);
      }
      return rt.unregister_memory(*memory);
    });
  }

  {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const auto space = fs::space(dir, ec);
    if (ec) {
      fmt::print(stderr, "error: --data-dir '{}': {}\n", dir.string(), ec.message());
      return 2;
    }
    if (data_bytes + data_bytes / 4 > space.available + (fs::exists(dir / "manifest.json") ? data_bytes : 0)) {
      fmt::print(stderr, "error: the data set needs about {} bytes in '{}', which has {} bytes available\n",
                 data_bytes + data_bytes / 4, dir.string(), space.available);
      return 2;
    }
  }
  DataDirLock lock;  // held until main returns: every phase below reads or writes the folder's files
  if (auto s = lock.acquire(dir); !s.is_ok()) {
    fmt::print(stderr, "error: {}\n", s.to_string());
    return 2;
  }
  if (o.backend == "nvme-soft") return run_nvme_soft(o, dir);

#if defined(LAYERWISE_GPU)
  if (o.memory == "device") return run_gpu(o, dir);
#endif
  if (auto s = prepare_files(shape, dir); !s.is_ok()) {
    fmt::print(stderr, "error: preparing data files: {}\n", s.to_string());
    return 2;
  }
  for (std::uint32_t l = 0; l < shape.layers; ++l) uris.push_back(file_uri(dir / shape.layer_file_name(l)));
  auto runtime = tutti::make_uring_runtime();
  if (!runtime) {
    fmt::print(stderr, "error: {}\n", runtime.status().to_string());
    return 2;
  }
  return run<tutti::UringRuntime>(*runtime, o, dir, uris, true, {});
}
