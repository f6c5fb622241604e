// tutti-bench-gpu-local-nvme: end-to-end reads of one real file into GPU memory, four ways in the
// same run, on the same file, at the same request sizes (4 KiB, 64 KiB, 1 MiB):
//   local_nvme  the local_nvme DataPath with its submit and poll kernels on the GPU (CUDA profile),
//               against the soft controller in accelerator_mode (host worker threads pread the
//               backing file into a pinned bounce buffer and copy it into GPU memory);
//   uring       the uring DataPath (O_DIRECT io_uring reads into its pinned staging ring, then
//               cudaMemcpyAsync host-to-device), through UringRuntime, into the same GPU memory;
//   cuFile      libcufile through bench/support/cufile_reader.hpp, in compat mode where nvidia-fs is
//               absent (the mode is printed and recorded); only where meson found libcufile;
//   pread       host threads pread the file into pinned memory and cudaMemcpyAsync it into GPU
//               memory (the classic bounce path).
// This measures the EMULATION: the soft controller's workers and copies bound local_nvme's rate,
// not an SSD; uring and cuFile read the file system with O_DIRECT, pread and the soft controller
// read the page cache (the file is written just before). No figure here is an NVMe figure.
//
// Per path and request size: requests cover the file in order, request k reading file bytes
// [k x size, (k + 1) x size) into GPU memory at the same offset (one cudaMalloc as large as the
// file); rate = bytes confirmed / wall time of the pass, best of --repeat passes. local_nvme
// submits batches of --batch requests; uring keeps two submits of --uring-queue-depth / 2 requests
// in flight; cuFile keeps --cufile-threads synchronous reads in flight; pread uses --workers
// threads. Before every pass a kernel fills the GPU memory with the complement of the file's bytes
// (so no byte can match by accident); after it a kernel compares every byte with the file's
// contents (byte for byte, outside the timed part). A failed request, a short confirmation or one
// differing byte fails the run.
//
// The uring and cuFile passes live in local_nvme_read_baselines.cpp (host compiler); this file keeps
// the GPU kernels. Before the first pass, one untimed local_nvme batch of the largest size lets the
// batch pool size its device buffers, so no timed pass pays for a slot's growth (cudaFree/cudaMalloc,
// which wait for the device).
//
// Usage: tutti-bench-gpu-local-nvme [--help] [--file-mib N] [--batch B] [--queues Q] [--workers W]
//                                   [--repeat R] [--uring-queue-depth D] [--cufile-threads T]
//                                   [--poll-budget-ns NS] [--dir DIR] [--json FILE]
// --poll-budget-ns: the DataPath's Options::poll_kernel_budget_ns (0: one poll pass per launch).
// Exits 77 without a CUDA device; 2 on bad flags (checked before any file or GPU work); 1 when a
// request failed or a byte did not match.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <tutti/accel/config.hpp>
#include <tutti/accel/memory.hpp>
#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/path/local_nvme.hpp>

#include "bench_options.hpp"
#include "local_nvme_read_baselines.hpp"

namespace {

using namespace tutti;
using Path = local_nvme::LocalNvmeDataPath;
using bench::gpu_read::Row;

constexpr const char* kProgram = "tutti-bench-gpu-local-nvme";
constexpr std::uint64_t kTimeoutNs = 60'000'000'000ull;  // every wait of a pass: 60 s

using Options = tutti::bench::gpu::LocalNvmeReadOptions;
static_assert(Options{}.poll_budget_ns == Path::Options::kDefaultPollKernelBudgetNs,
              "the benchmark's default poll budget is the DataPath's");
static_assert(Options::kMaxPollBudgetNs == Path::Options::kMaxPollKernelBudgetNs, "and so is its limit");

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The file's byte at `offset` (bytes); the same function on the host (writing the file) and on the
/// GPU (poisoning and verifying device memory).
TUTTI_HOST_DEVICE inline std::uint8_t pattern_byte(std::uint64_t offset) {
  return static_cast<std::uint8_t>((offset * 2654435761u) >> 13 ^ offset >> 12);
}

__global__ void fill_complement(std::uint8_t* device, std::uint64_t bytes) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    device[i] = static_cast<std::uint8_t>(~pattern_byte(i));
}

__global__ void count_mismatches(const std::uint8_t* device, std::uint64_t bytes, unsigned long long* mismatches,
                                 unsigned long long* first) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    if (device[i] != pattern_byte(i)) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, static_cast<unsigned long long>(i));
    }
}

/// Byte-for-byte verification of GPU memory that should hold file bytes [0, bytes) at offset 0.
class Verifier {
 public:
  Verifier() {
    if (cudaMalloc(&counters_, 2 * sizeof(unsigned long long)) != cudaSuccess) counters_ = nullptr;
  }
  ~Verifier() {
    if (counters_) cudaFree(counters_);
  }
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  /// Fills [device, device + bytes) with the complement of the file's bytes. False on a CUDA error.
  bool poison(void* device, std::uint64_t bytes) {
    fill_complement<<<1024, 256>>>(static_cast<std::uint8_t*>(device), bytes);
    return cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
  }
  /// The number of bytes of [device, device + bytes) that differ from the file (all of them on a
  /// CUDA error, so a broken check can never pass); prints the first differing offset.
  std::uint64_t mismatches(const void* device, std::uint64_t bytes, const std::string& what) {
    unsigned long long host[2] = {0, ~0ull};
    if (counters_ == nullptr || cudaMemcpy(counters_, host, sizeof host, cudaMemcpyHostToDevice) != cudaSuccess)
      return bytes;
    count_mismatches<<<1024, 256>>>(static_cast<const std::uint8_t*>(device), bytes, counters_, counters_ + 1);
    if (const cudaError_t e = cudaGetLastError();
        e != cudaSuccess || cudaMemcpy(host, counters_, sizeof host, cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::fprintf(stderr, "%s: the verification kernel failed (%s): every byte counted as differing\n", what.c_str(),
                   cudaGetErrorString(e != cudaSuccess ? e : cudaGetLastError()));
      return bytes;
    }
    if (host[0] != 0)
      std::fprintf(stderr, "%s: %llu bytes differ from the file, the first at offset %llu\n", what.c_str(), host[0],
                   host[1]);
    return host[0];
  }

 private:
  unsigned long long* counters_ = nullptr;
};

/// A pass that may still write into GPU memory cannot be left behind while the memory is freed:
/// print why and end the process without running destructors.
[[noreturn]] void abandon(const std::string& what, const Status& status) {
  std::fprintf(stderr, "%s: %s; requests may still be in flight: exiting without freeing the memory they name\n",
               what.c_str(), status.to_string().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

bool make_file(const std::string& path, std::uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) return false;
  std::vector<std::uint8_t> chunk(8 << 20);
  for (std::uint64_t at = 0; at < bytes; at += chunk.size()) {
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = pattern_byte(at + i);
    if (::pwrite(fd, chunk.data(), chunk.size(), static_cast<off_t>(at)) != static_cast<ssize_t>(chunk.size())) {
      ::close(fd);
      return false;
    }
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  return synced;
}

void run_local_nvme(Row& row, Path& path, Path::open_target& target, Path::registered_memory& registration,
                    const MemoryView& view, std::uint64_t file_bytes, const Options& options) {
  const std::uint64_t request_bytes = row.request_bytes;
  const double start = now_seconds();
  for (std::uint64_t offset = 0; offset < file_bytes;) {
    std::vector<PathRequest<Path>> requests;
    for (std::uint64_t i = 0; i < options.batch && offset < file_bytes; ++i, offset += request_bytes)
      requests.push_back(
          PathRequest<Path>{Direction::READ, &registration, view, offset, &target, offset, request_bytes});
    std::vector<Status> states(requests.size());
    auto b = path.submit(requests, states);
    std::vector<RequestCompletion> completions(requests.size());
    const Status s = path.progress(b, completions, kTimeoutNs);
    if (!s.is_ok()) abandon("local_nvme progress", s);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (!states[i].is_ok() || !completions[i].status.is_ok() || completions[i].confirmed_bytes != request_bytes) {
        if (row.errors == 0)
          std::fprintf(stderr, "local_nvme request failed: %s / %s\n", states[i].to_string().c_str(),
                       completions[i].status.to_string().c_str());
        ++row.errors;
        continue;
      }
      row.bytes += request_bytes;
      ++row.requests;
    }
  }
  row.seconds = now_seconds() - start;
}

void run_bounce(Row& row, const std::string& file, void* device, std::uint64_t file_bytes, std::uint32_t threads) {
  const std::uint64_t request_bytes = row.request_bytes;
  std::vector<std::uint64_t> errors(threads, 0), moved(threads, 0), count(threads, 0);
  const double start = now_seconds();
  std::vector<std::thread> workers;
  for (std::uint32_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      const int fd = ::open(file.c_str(), O_RDONLY);
      void* pinned = nullptr;
      cudaStream_t stream = nullptr;
      if (fd < 0 || cudaHostAlloc(&pinned, request_bytes, cudaHostAllocDefault) != cudaSuccess ||
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        errors[t] = 1;
        if (fd >= 0) ::close(fd);
        if (pinned) cudaFreeHost(pinned);
        return;
      }
      for (std::uint64_t k = t; k * request_bytes < file_bytes; k += threads) {
        const std::uint64_t offset = k * request_bytes;
        if (::pread(fd, pinned, request_bytes, static_cast<off_t>(offset)) != static_cast<ssize_t>(request_bytes)) {
          ++errors[t];
          continue;
        }
        if (cudaMemcpyAsync(static_cast<std::uint8_t*>(device) + offset, pinned, request_bytes, cudaMemcpyHostToDevice,
                            stream) != cudaSuccess ||
            cudaStreamSynchronize(stream) != cudaSuccess) {
          ++errors[t];
          continue;
        }
        moved[t] += request_bytes;
        ++count[t];
      }
      cudaStreamDestroy(stream);
      cudaFreeHost(pinned);
      ::close(fd);
    });
  for (auto& w : workers) w.join();
  row.seconds = now_seconds() - start;
  for (std::uint32_t t = 0; t < threads; ++t) {
    row.bytes += moved[t];
    row.requests += count[t];
    row.errors += errors[t];
  }
}

/// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\')
      out += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    else
      out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const int status = tutti::bench::gpu::parse_local_nvme_read_options(argc, argv, options); status != -1)
    return status;
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "tutti-bench-gpu-local-nvme: no CUDA device (%s): nothing measured (exit 77)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  int runtime_version = 0, driver_version = 0;
  (void)cudaRuntimeGetVersion(&runtime_version);
  (void)cudaDriverGetVersion(&driver_version);
  const std::uint64_t file_bytes = options.file_mib << 20;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess || file_bytes > free_bytes / 2) {
    std::fprintf(stderr, "%s: --file-mib = %llu needs %llu bytes of GPU memory; the limit is half the free %zu bytes\n",
                 kProgram, static_cast<unsigned long long>(options.file_mib),
                 static_cast<unsigned long long>(file_bytes), free_bytes);
    return 2;
  }
  std::string name = options.dir + "/tutti-bench-gpu-lnvme-XXXXXX";
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    std::fprintf(stderr, "mkstemp in %s: %s\n", options.dir.c_str(), std::strerror(errno));
    return 1;
  }
  ::close(fd);
  const std::string file = name;
  if (!make_file(file, file_bytes + (1 << 20))) {
    std::fprintf(stderr, "cannot write %s\n", file.c_str());
    ::unlink(file.c_str());
    return 1;
  }

  libnvm::SoftControllerConfig config;
  config.backing_path = file;
  config.accelerator_mode = true;
  config.worker_threads = options.workers;
  config.max_io_queue_pairs = static_cast<std::uint16_t>(options.queues);
  auto device = libnvm::SoftController::create(config);
  if (!device) {
    std::fprintf(stderr, "soft controller: %s\n", device.status().to_string().c_str());
    return 1;
  }
  auto controller = libnvm::open_soft_controller(*device);
  libnvm::BringUpOptions bring_up;
  bring_up.io_queue_pairs_requested = static_cast<std::uint16_t>(options.queues);
  if (!controller || !controller.value()->bring_up(bring_up).is_ok()) {
    std::fprintf(stderr, "soft controller driver: bring_up failed\n");
    return 1;
  }
  Path::Options path_options;
  path_options.queue_pairs = options.queues;
  path_options.queue_depth = 1024;
  path_options.threads_per_block = 128;
  path_options.poll_kernel_budget_ns = options.poll_budget_ns;
  auto path = Path::create(*controller.value(), path_options);
  if (!path) {
    std::fprintf(stderr, "DataPath: %s\n", path.status().to_string().c_str());
    return 1;
  }
  local_file::Target t;
  t.path = file;
  t.extents = {local_file::Extent{0, 0, file_bytes}};
  t.file_size = file_bytes;
  t.lba_size = controller.value()->identity().lba_size;
  t.nsid = controller.value()->identity().nsid;
  auto target = path->open(std::move(t), {});
  auto memory = accel::DeviceBuffer::allocate(file_bytes);
  if (!target || !memory) {
    std::fprintf(stderr, "open / device memory failed\n");
    return 1;
  }
  const MemoryView view{memory->data(), file_bytes, MemoryKind::DEVICE, 0};
  auto registration = path->register_memory(view);
  if (!registration) {
    std::fprintf(stderr, "register_memory: %s\n", registration.status().to_string().c_str());
    return 1;
  }
  // One untimed local_nvme batch of the largest size any pass submits (options.batch requests of
  // 4 KiB): the batch pool sizes its device buffers then and reuses them, so no timed pass pays
  // for a slot's growth (cudaFree/cudaMalloc wait for the device). It also ran first, before any
  // other GPU allocation, as the workaround for accel::allocate_device refusing cudaMalloc's
  // 256-byte-aligned results; allocate_device now aligns itself (docs/benchmarks.md). Its bytes
  // are checked by the first verified pass like any other.
  {
    std::vector<PathRequest<Path>> requests;
    for (std::uint64_t offset = 0; requests.size() < options.batch && offset < file_bytes; offset += 4096)
      requests.push_back(PathRequest<Path>{Direction::READ, &*registration, view, offset, &*target, offset, 4096});
    std::vector<Status> states(requests.size());
    auto b = path->submit(requests, states);
    std::vector<RequestCompletion> completions(requests.size());
    if (const Status s = path->progress(b, completions, kTimeoutNs); !s.is_ok())
      abandon("local_nvme warm-up progress", s);
    for (std::size_t i = 0; i < requests.size(); ++i)
      if (!states[i].is_ok() || !completions[i].status.is_ok() || completions[i].confirmed_bytes != 4096) {
        std::fprintf(stderr, "local_nvme warm-up request %zu failed: %s / %s\n", i, states[i].to_string().c_str(),
                     completions[i].status.to_string().c_str());
        return 1;
      }
  }
  Verifier verifier;

  bench::gpu_read::PassFrame frame;
  frame.repeat = options.repeat;
  frame.poison = [&] { return verifier.poison(memory->data(), file_bytes); };
  frame.mismatches = [&](const std::string& label) { return verifier.mismatches(memory->data(), file_bytes, label); };
  std::string cufile_description;
  auto cufile = bench::gpu_read::open_cufile(memory->data(), file_bytes, cufile_description);

  std::printf(
      "GPU: %s, CUDA runtime %d, driver API %d; file %s, %llu MiB, written just before (page cache warm for "
      "pread and the soft controller; uring and cuFile read it with O_DIRECT)\n",
      properties.name, runtime_version, driver_version, file.c_str(),
      static_cast<unsigned long long>(options.file_mib));
  std::printf(
      "local_nvme: soft controller with %u workers, %u I/O queue pairs of depth 1024, batches of up to %u "
      "requests, poll kernel budget %llu ns; uring: queue depth %u; cuFile: %u threads; pread: %u threads; best of "
      "%u passes\n",
      options.workers, options.queues, options.batch, static_cast<unsigned long long>(options.poll_budget_ns),
      options.uring_queue_depth, options.cufile_threads, options.workers, options.repeat);
  std::printf("cuFile: %s\n", cufile_description.c_str());
  std::printf("THIS MEASURES THE SOFT CONTROLLER EMULATION (host workers + bounce copies), not an SSD.\n");
  std::vector<Row> rows;
  std::uint64_t failures = 0;
  auto add = [&](Row r) {  // printed as soon as measured, so a run cut short still shows its rows
    failures += r.errors + r.mismatched_bytes;
    std::printf("%-50s request=%-8llu %9.3f GiB/s %11.0f requests/s  %8.3f s  errors=%llu mismatched_bytes=%llu%s%s\n",
                r.path.c_str(), static_cast<unsigned long long>(r.request_bytes), r.gib_per_second(),
                r.requests_per_second(), r.seconds, static_cast<unsigned long long>(r.errors),
                static_cast<unsigned long long>(r.mismatched_bytes), r.note.empty() ? "" : "  ", r.note.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  const std::vector<std::uint64_t> sizes = {4096ull, 65536ull, 1ull << 20};
  for (const std::uint64_t request : sizes) {
    add(bench::gpu_read::best_of("tutti local_nvme (GPU kernels, soft controller)", request, frame, [&](Row& row) {
      run_local_nvme(row, *path, *target, *registration, view, file_bytes, options);
    }));
    add(bench::gpu_read::measure_uring(file, memory->data(), file_bytes, request, options.uring_queue_depth, frame));
    if (cufile) add(bench::gpu_read::measure_cufile(*cufile, file, file_bytes, request, options.cufile_threads, frame));
    add(bench::gpu_read::best_of("pread + cudaMemcpy (host threads, pinned bounce)", request, frame, [&](Row& row) {
      run_bounce(row, file, memory->data(), file_bytes, options.workers);
    }));
  }
  // The comparison table: GiB/s per path and local_nvme's ratio to each of the others.
  auto rate = [&](std::uint64_t request, const char* prefix) {
    for (const Row& r : rows)
      if (r.request_bytes == request && r.path.rfind(prefix, 0) == 0) return r.gib_per_second();
    return 0.0;
  };
  auto cell = [](double v) { return v > 0 ? fmt::format("{:.2f}", v) : std::string("-"); };
  auto ratio = [](double a, double b) { return a > 0 && b > 0 ? fmt::format("{:.2f}", a / b) : std::string("-"); };
  std::printf(
      "\n| request | local_nvme GiB/s | uring GiB/s | cuFile GiB/s | pread + cudaMemcpy GiB/s | local_nvme / uring | "
      "local_nvme / cuFile | local_nvme / pread | uring / cuFile |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const std::uint64_t request : sizes) {
    const double l = rate(request, "tutti local_nvme"), u = rate(request, "tutti uring"), c = rate(request, "cuFile"),
                 p = rate(request, "pread");
    std::printf("| %llu KiB | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                static_cast<unsigned long long>(request >> 10), cell(l).c_str(), cell(u).c_str(), cell(c).c_str(),
                cell(p).c_str(), ratio(l, u).c_str(), ratio(l, c).c_str(), ratio(l, p).c_str(), ratio(u, c).c_str());
  }
  std::printf("%s\n", failures == 0 ? "every pass verified byte for byte: 0 errors, 0 mismatched bytes"
                                    : "FAILED: requests failed or bytes differ (see above)");
  cufile.reset();  // cuFileBufDeregister and cuFileDriverClose before the memory is freed
  (void)path->unregister_memory(*registration);
  if (!options.json.empty()) {
    if (FILE* f = std::fopen(options.json.c_str(), "w")) {
      std::fprintf(f,
                   "{\"gpu\": %s, \"cuda_runtime_version\": %d, \"cuda_driver_api_version\": %d, \"file_bytes\": %llu, "
                   "\"workers\": %u, \"queues\": %u, \"batch\": %u, \"poll_kernel_budget_ns\": %llu, "
                   "\"uring_queue_depth\": %u, \"cufile_threads\": %u, "
                   "\"repeat\": %u, \"cufile\": %s, \"all_verified\": %s, \"rows\": [\n",
                   json_string(properties.name).c_str(), runtime_version, driver_version,
                   static_cast<unsigned long long>(file_bytes), options.workers, options.queues, options.batch,
                   static_cast<unsigned long long>(options.poll_budget_ns), options.uring_queue_depth,
                   options.cufile_threads, options.repeat, json_string(cufile_description).c_str(),
                   failures == 0 ? "true" : "false");
      for (std::size_t i = 0; i < rows.size(); ++i)
        std::fprintf(
            f,
            "  {\"path\": %s, \"request_bytes\": %llu, \"bytes\": %llu, \"requests\": %llu, \"seconds\": %.6f, "
            "\"gib_per_second\": %.4f, \"requests_per_second\": %.1f, \"errors\": %llu, \"mismatched_bytes\": %llu, "
            "\"note\": %s}%s\n",
            json_string(rows[i].path).c_str(), static_cast<unsigned long long>(rows[i].request_bytes),
            static_cast<unsigned long long>(rows[i].bytes), static_cast<unsigned long long>(rows[i].requests),
            rows[i].seconds, rows[i].gib_per_second(), rows[i].requests_per_second(),
            static_cast<unsigned long long>(rows[i].errors), static_cast<unsigned long long>(rows[i].mismatched_bytes),
            json_string(rows[i].note).c_str(), i + 1 < rows.size() ? "," : "");
      std::fprintf(f, "]}\n");
      std::fclose(f);
    } else {
      std::fprintf(stderr, "cannot write %s\n", options.json.c_str());
      ++failures;
    }
  }
  ::unlink(file.c_str());
  return failures == 0 ? 0 : 1;
}
