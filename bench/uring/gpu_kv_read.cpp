// gpu_kv_read (CUDA profile): reading a KV-sized working set from files into GPU memory, three ways
// in the same run on the same files:
//   uring   the uring DataPath (O_DIRECT io_uring reads into its pinned staging ring, cudaMemcpyAsync
//           host-to-device), through UringRuntime;
//   cufile  libcufile (bench/support/cufile_reader.hpp) on O_DIRECT descriptors, in whatever mode the
//           driver runs (compat mode without the nvidia-fs module; printed and recorded);
//   pread   plain pread (page cache) into one pinned buffer + cudaMemcpy, one block at a time;
// for two shapes: whole per-layer tensors (default 80 layers x 512 KiB tensors, read layer by layer)
// and 16 KiB blocks (the same bytes as a paged KV cache's blocks, in one fixed random order); each with
// a cold page cache (sync + drop_caches when writable, and posix_fadvise(DONTNEED) on every file) and
// a warm one (every file read through the page cache first). O_DIRECT readers bypass the page cache,
// so their warm figures read the device again: that is what they do in production too.
//
// Every pass starts from zeroed device memory and is verified byte for byte afterwards (the device
// memory is copied back and compared with the files' contents); a pass that fails verification or
// an IO error fails the run (exit 1). A pass stops taking new reads after --pass-seconds (what it read
// until then is measured and marked partial), so the whole run is bounded.
//
//   gpu_kv_read [--help] [--dir DIR] [--layers N] [--tensors-per-layer N] [--tensor-bytes B] [--block-bytes B]
//               [--queue-depth N] [--cufile-threads N] [--pass-seconds S] [--json PATH] [--keep-files]
//
// GB/s is 10^9 bytes per second. Exit status: 0 when every pass verified, 1 otherwise, 2 on bad flags.
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/presets/uring.hpp>

#include "../support/cli_checks.hpp"
#include "../support/ordered_waits.hpp"
#include "../support/uring_device_staging.hpp"

#if defined(TUTTI_HAVE_CUFILE)
#include "cufile_reader.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  std::string dir = "/var/tmp/tutti-gpu-kv";
  std::uint64_t layers = 80;
  std::uint64_t tensors_per_layer = 25;
  std::uint64_t tensor_bytes = 512 << 10;
  std::uint64_t block_bytes = 16 << 10;
  std::uint32_t queue_depth = 256;
  std::uint32_t cufile_threads = 16;
  double pass_seconds = 5.0;
  std::string json;
  bool keep_files = false;
  std::uint64_t layer_bytes() const { return tensors_per_layer * tensor_bytes; }
  std::uint64_t total_bytes() const { return layers * layer_bytes(); }
  std::string layer_path(std::uint64_t layer) const { return fmt::format("{}/layer{:02}.kv", dir, layer); }
};

/// One read of the working set: `bytes` at `offset` of layer file `layer`, into device memory at
/// layer * layer_bytes + offset.
struct Unit {
  std::uint64_t layer = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

struct PassResult {
  std::string method;
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::size_t units_done = 0;  // a prefix of the unit order
  bool partial = false;
  bool verified = false;
  std::string error;
  std::string note;
  double gigabytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gpu_kv_read: %s\n", what.c_str());
  std::exit(1);
}

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) die(fmt::format("{}: {} ({})", what, cudaGetErrorString(code), cudaGetErrorName(code)));
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// The files' contents: 64-bit words of splitmix64 over the word index, one buffer for all layers.
std::vector<std::uint64_t> make_contents(std::uint64_t bytes) {
  std::vector<std::uint64_t> words(bytes / 8);
  for (std::uint64_t i = 0; i < words.size(); ++i) {
    std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    words[i] = z ^ (z >> 31);
  }
  return words;
}

void write_files(const Settings& s, const std::vector<std::uint64_t>& contents) {
  if (::mkdir(s.dir.c_str(), 0755) != 0 && errno != EEXIST)
    die(fmt::format("mkdir {}: {}", s.dir, std::strerror(errno)));
  const auto* bytes = reinterpret_cast<const char*>(contents.data());
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const std::string path = s.layer_path(l);
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) die(fmt::format("create {}: {}", path, std::strerror(errno)));
    for (std::uint64_t done = 0; done < s.layer_bytes();) {
      const ssize_t n =
          ::pwrite(fd, bytes + l * s.layer_bytes() + done, s.layer_bytes() - done, static_cast<off_t>(done));
      if (n <= 0) die(fmt::format("write {}: {}", path, std::strerror(errno)));
      done += static_cast<std::uint64_t>(n);
    }
    if (::fsync(fd) != 0) die(fmt::format("fsync {}: {}", path, std::strerror(errno)));
    ::close(fd);
  }
}

/// Empties the page cache of the files. Returns how: "drop_caches" (sync + echo 3, root with a
/// writable /proc/sys) or "posix_fadvise(DONTNEED)" (always applied to every file as well).
std::string make_cold(const Settings& s) {
  ::sync();
  bool dropped = false;
  {
    std::ofstream drop("/proc/sys/vm/drop_caches");
    if (drop) {
      drop << "3\n";
      drop.flush();
      dropped = static_cast<bool>(drop);
    }
  }
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const int fd = ::open(s.layer_path(l).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(fmt::format("open {}: {}", s.layer_path(l), std::strerror(errno)));
    if (::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) die("posix_fadvise(DONTNEED) failed");
    ::close(fd);
  }
  return dropped ? "drop_caches" : "posix_fadvise(DONTNEED)";
}

/// Reads every file through the page cache (untimed), so the next passes find it warm.
void make_warm(const Settings& s) {
  std::vector<char> chunk(8 << 20);
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const int fd = ::open(s.layer_path(l).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(fmt::format("open {}: {}", s.layer_path(l), std::strerror(errno)));
    while (::read(fd, chunk.data(), chunk.size()) > 0) {
    }
    ::close(fd);
  }
}

std::vector<Unit> make_order(const Settings& s, std::uint64_t unit_bytes, bool shuffled) {
  std::vector<Unit> order;
  for (std::uint64_t l = 0; l < s.layers; ++l)
    for (std::uint64_t o = 0; o < s.layer_bytes(); o += unit_bytes) order.push_back({l, o, unit_bytes});
  if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  return order;
}

/// Compares the device memory of the first `done` units with the files' contents.
bool verify(const Settings& s, const std::vector<Unit>& order, std::size_t done, const void* device,
            const std::vector<std::uint64_t>& contents, std::vector<char>& host) {
  check(cudaMemcpy(host.data(), device, s.total_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy (verification)");
  const auto* expected = reinterpret_cast<const char*>(contents.data());
  for (std::size_t i = 0; i < done; ++i) {
    const std::uint64_t at = order[i].layer * s.layer_bytes() + order[i].offset;
    if (std::memcmp(host.data() + at, expected + at, order[i].bytes) != 0) return false;
  }
  return true;
}

PassResult run_uring(const Settings& s, const std::vector<Unit>& order, void* device) {
  PassResult r;
  r.method = "uring";
  const std::uint64_t unit = order.front().bytes;
  const tutti::uring::Options options = tutti::bench::uring_device_read_options(unit, s.queue_depth);
  auto created = tutti::make_uring_runtime(options);
  if (!created) die("uring runtime: " + created.status().to_string());
  tutti::UringRuntime& runtime = *created;
  std::vector<tutti::TargetHandle> targets;
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    auto t = runtime.open("file://" + s.layer_path(l), {});
    if (!t) die("uring open: " + t.status().to_string());
    targets.push_back(*t);
  }
  auto memory = runtime.register_memory({device, s.total_bytes(), tutti::MemoryKind::DEVICE, 0});
  if (!memory) die("uring register_memory: " + memory.status().to_string());
  const std::size_t per_submit = std::max<std::size_t>(1, s.queue_depth / 2);
  std::deque<tutti::IoHandle> in_flight;
  std::size_t next = 0;
  const auto start = Clock::now();
  auto submit_next = [&] {
    if (seconds_since(start) >= s.pass_seconds) return;
    std::vector<tutti::IoRequest> requests;
    for (; next < order.size() && requests.size() < per_submit; ++next) {
      const Unit& u = order[next];
      requests.push_back(
          {tutti::Direction::READ, *memory, u.layer * s.layer_bytes() + u.offset, targets[u.layer], u.offset, u.bytes});
    }
    if (requests.empty()) return;
    auto outcome = runtime.submit(requests);
    if (outcome.accepted != requests.size())
      die(fmt::format("uring submit accepted {} of {}: {}", outcome.accepted, requests.size(),
                      outcome.initial_states.back().to_string()));
    in_flight.push_back(outcome.io);
  };
  submit_next();
  submit_next();
  // Only bytes the runtime confirmed count: a failed wait ends the pass, and the units still in
  // flight or never submitted are not counted (the table marks the pass failed).
  const tutti::bench::OrderedWaits waited =
      tutti::bench::wait_in_order(runtime, in_flight, 60'000'000'000ull, submit_next);
  r.seconds = seconds_since(start);
  r.bytes = waited.confirmed_bytes;
  r.units_done = next;
  r.partial = next < order.size();
  if (!waited.error.empty()) {
    r.error = "uring " + waited.error;
    return r;
  }
  if (tutti::Status s2 = runtime.unregister_memory(*memory); !s2.is_ok()) r.error = s2.to_string();
  for (auto t : targets) (void)runtime.close(t);
  return r;
}

#if defined(TUTTI_HAVE_CUFILE)
PassResult run_cufile(const Settings& s, const std::vector<Unit>& order, void* device) {
  namespace cf = tutti::bench::cufile;
  PassResult r;
  r.method = "cufile";
  std::vector<std::unique_ptr<cf::File>> files;
  bool direct = true;
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    auto f = cf::File::open(s.layer_path(l), direct);
    if (!f && direct && l == 0) {  // compat mode also takes a page-cache descriptor: say so, and use it
      std::fprintf(stderr, "cuFile with O_DIRECT refused (%s); trying without O_DIRECT\n",
                   f.status().to_string().c_str());
      r.note = "O_DIRECT refused (" + f.status().to_string() + "), page-cache descriptors; ";
      direct = false;
      f = cf::File::open(s.layer_path(l), direct);
    }
    if (!f) {
      r.error = "cuFile open: " + f.status().to_string();
      return r;
    }
    files.push_back(std::move(f).value());
  }
  auto buffer = cf::DeviceBuffer::register_range(device, s.total_bytes());
  if (!buffer) {
    std::fprintf(stderr, "cuFileBufRegister refused (%s); reading into unregistered memory\n",
                 buffer.status().to_string().c_str());
    buffer = cf::DeviceBuffer::unregistered(device, s.total_bytes());
    if (!buffer) die("cuFile buffer: " + buffer.status().to_string());
  }
  r.note += (*buffer)->registered() ? "cuFileBufRegister'ed destination" : "unregistered destination";
  std::vector<cf::Range> ranges;
  for (const Unit& u : order)
    ranges.push_back({files[u.layer].get(), u.offset, u.layer * s.layer_bytes() + u.offset, u.bytes});
  // Slices of the order, so the pass can stop at --pass-seconds between them.
  const std::size_t slice = std::max<std::size_t>(s.cufile_threads * 16, ranges.size() / 32);
  cf::ReadOptions read_options;
  read_options.threads = s.cufile_threads;
  read_options.timeout_ns = 60'000'000'000ull;
  const auto start = Clock::now();
  std::size_t done = 0;
  while (done < ranges.size() && seconds_since(start) < s.pass_seconds) {
    const std::size_t n = std::min(slice, ranges.size() - done);
    auto report = cf::read(**buffer, std::span<const cf::Range>(ranges).subspan(done, n), read_options);
    if (!report) {
      r.error = report.status().to_string();
      break;
    }
    done += n;
    r.bytes += report->bytes;
  }
  r.seconds = seconds_since(start);
  r.units_done = done;
  r.partial = done < ranges.size();
  return r;
}
#endif

PassResult run_pread(const Settings& s, const std::vector<Unit>& order, void* device) {
  PassResult r;
  r.method = "pread";
  std::vector<int> fds;
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const int fd = ::open(s.layer_path(l).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(fmt::format("open {}: {}", s.layer_path(l), std::strerror(errno)));
    fds.push_back(fd);
  }
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, order.front().bytes, cudaHostAllocDefault), "cudaHostAlloc");
  const auto start = Clock::now();
  std::size_t done = 0;
  for (; done < order.size() && seconds_since(start) < s.pass_seconds; ++done) {
    const Unit& u = order[done];
    const ssize_t n = ::pread(fds[u.layer], pinned, u.bytes, static_cast<off_t>(u.offset));
    if (n != static_cast<ssize_t>(u.bytes)) {
      r.error = fmt::format("pread of {} bytes at {} of {} returned {}", u.bytes, u.offset, s.layer_path(u.layer), n);
      break;
    }
    check(cudaMemcpy(static_cast<char*>(device) + u.layer * s.layer_bytes() + u.offset, pinned, u.bytes,
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    r.bytes += u.bytes;
  }
  r.seconds = seconds_since(start);
  r.units_done = done;
  r.partial = done < order.size();
  check(cudaFreeHost(pinned), "cudaFreeHost");
  for (int fd : fds) ::close(fd);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  // CLI11 checks every number against its range before the conversion can wrap: "-4096" is not a
  // size, and 2^32 + 2 is not a queue depth (both once slipped through strtoull and a 32-bit cast).
  CLI::App app{
      "gpu_kv_read: a KV-sized working set from files into GPU memory, through the uring DataPath, cuFile "
      "and pread + cudaMemcpy, every pass verified byte for byte"};
  app.add_option("--dir", s.dir, "folder for the layer files (created)")
      ->check(tutti::bench::kNotEmpty)
      ->capture_default_str();
  app.add_option("--layers", s.layers, "layer files")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1000}))
      ->capture_default_str();
  app.add_option("--tensors-per-layer", s.tensors_per_layer, "tensors per layer file")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--tensor-bytes", s.tensor_bytes, "bytes per tensor (a multiple of 4096)")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--block-bytes", s.block_bytes,
                 "bytes per block of the random-block shape (a multiple of 4096 dividing --tensor-bytes)")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--queue-depth", s.queue_depth, "uring requests in flight")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(2u, 32768u))
      ->capture_default_str();
  app.add_option("--cufile-threads", s.cufile_threads, "cuFile reader threads")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  std::uint32_t pass_seconds = static_cast<std::uint32_t>(s.pass_seconds);  // whole seconds: no NaN, no fractions
  app.add_option("--pass-seconds", pass_seconds, "time bound of one pass, s")
      ->check(tutti::bench::kDecimal)
      ->check(CLI::Range(1u, 86400u))
      ->capture_default_str();
  app.add_option("--json", s.json, "write the results as JSON here");
  app.add_flag("--keep-files", s.keep_files, "keep the layer files");
  if (const int status = tutti::bench::parse_flags(app, argc, argv); status != -1) return status;
  s.pass_seconds = pass_seconds;
  if (s.tensor_bytes % 4096 != 0 || s.block_bytes % 4096 != 0 || s.tensor_bytes % s.block_bytes != 0) {
    std::fprintf(stderr,
                 "gpu_kv_read: --tensor-bytes = %llu and --block-bytes = %llu must be multiples of 4096 with the "
                 "block dividing the tensor\n",
                 static_cast<unsigned long long>(s.tensor_bytes), static_cast<unsigned long long>(s.block_bytes));
    return 2;
  }

  // The working set lives in host memory (contents, verification copy) and in one cudaMalloc.
  if (s.total_bytes() > (std::uint64_t{1} << 40)) {
    std::fprintf(stderr,
                 "gpu_kv_read: the working set (--layers x --tensors-per-layer x --tensor-bytes = %llu bytes) exceeds "
                 "the limit of 1 TiB\n",
                 static_cast<unsigned long long>(s.total_bytes()));
    return 2;
  }
  const auto contents = make_contents(s.total_bytes());
  write_files(s, contents);
  std::vector<char> host(s.total_bytes());
  void* device = nullptr;
  check(cudaMalloc(&device, s.total_bytes()), "cudaMalloc");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int runtime_version = 0, driver_version = 0;
  (void)cudaRuntimeGetVersion(&runtime_version);
  (void)cudaDriverGetVersion(&driver_version);

  nlohmann::json out;
  out["gpu"] = prop.name;
  out["cuda_runtime_version"] = runtime_version;
  out["cuda_driver_api_version"] = driver_version;
  out["settings"] = {{"dir", s.dir},
                     {"layers", s.layers},
                     {"tensors_per_layer", s.tensors_per_layer},
                     {"tensor_bytes", s.tensor_bytes},
                     {"block_bytes", s.block_bytes},
                     {"total_bytes", s.total_bytes()},
                     {"queue_depth", s.queue_depth},
                     {"cufile_threads", s.cufile_threads},
                     {"pass_seconds", s.pass_seconds}};

#if defined(TUTTI_HAVE_CUFILE)
  tutti::bench::cufile::Driver::Options driver_options;
  driver_options.device = 0;
  auto driver = tutti::bench::cufile::Driver::open(driver_options);
  if (driver) {
    out["cufile"] = (*driver)->info().describe();
    out["cufile_mode"] = std::string(to_string((*driver)->info().mode));
    std::printf("%s\n", (*driver)->info().describe().c_str());
  } else {  // measured without cuFile, and said so
    out["cufile"] = "cuFileDriverOpen failed: " + driver.status().to_string();
    std::printf("cuFile not measured: %s\n", driver.status().to_string().c_str());
  }
  const bool with_cufile = driver.is_ok();
#else
  out["cufile"] = "not built (no libcufile / cufile.h in this toolkit)";
  std::printf("cuFile: not built (no libcufile / cufile.h in this toolkit)\n");
#endif
  std::printf(
      "GPU %s, CUDA runtime %d, %llu layers x %llu x %llu-byte tensors = %llu bytes in %s, queue depth %u, "
      "cuFile threads %u\n",
      prop.name, runtime_version, static_cast<unsigned long long>(s.layers),
      static_cast<unsigned long long>(s.tensors_per_layer), static_cast<unsigned long long>(s.tensor_bytes),
      static_cast<unsigned long long>(s.total_bytes()), s.dir.c_str(), s.queue_depth, s.cufile_threads);
  std::printf(
      "| shape | cache | uring GB/s | cuFile GB/s | pread+cudaMemcpy GB/s | uring / cuFile | uring / pread |\n"
      "|---|---|---|---|---|---|---|\n");

  bool all_ok = true;
  nlohmann::json passes = nlohmann::json::array();
  for (const bool blocks : {false, true}) {
    const std::uint64_t unit = blocks ? s.block_bytes : s.tensor_bytes;
    const auto order = make_order(s, unit, blocks);
    const std::string shape = blocks ? fmt::format("{} KiB blocks, random order", unit >> 10)
                                     : fmt::format("{} KiB tensors, layer order", unit >> 10);
    for (const char* cache : {"cold", "warm"}) {
      const bool cold = std::strcmp(cache, "cold") == 0;
      std::vector<PassResult> results;
      using Runner = PassResult (*)(const Settings&, const std::vector<Unit>&, void*);
      std::vector<Runner> runners{run_uring};
#if defined(TUTTI_HAVE_CUFILE)
      if (with_cufile) runners.push_back(run_cufile);
#endif
      runners.push_back(run_pread);
      std::string cold_method;
      if (!cold) make_warm(s);
      for (Runner run : runners) {
        if (cold) cold_method = make_cold(s);
        check(cudaMemset(device, 0, s.total_bytes()), "cudaMemset");
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        PassResult r = run(s, order, device);
        r.verified = r.error.empty() && verify(s, order, r.units_done, device, contents, host);
        if (!r.verified) {
          all_ok = false;
          std::fprintf(stderr, "%s %s %s: %s\n", r.method.c_str(), shape.c_str(), cache,
                       r.error.empty() ? "device memory differs from the files" : r.error.c_str());
        }
        passes.push_back({{"shape", shape},
                          {"unit_bytes", unit},
                          {"cache", cache},
                          {"cold_method", cold ? cold_method : ""},
                          {"method", r.method},
                          {"bytes", r.bytes},
                          {"seconds", r.seconds},
                          {"gigabytes_per_second", r.gigabytes_per_second()},
                          {"partial", r.partial},
                          {"verified", r.verified},
                          {"error", r.error},
                          {"note", r.note}});
        if (!r.note.empty())
          std::fprintf(stderr, "%s %s %s: %s\n", r.method.c_str(), shape.c_str(), cache, r.note.c_str());
        results.push_back(r);
      }
      auto gbps = [&](const char* method) {  // 0 for a failed or missing pass: no ratio from it
        for (const auto& r : results)
          if (r.method == method) return r.verified ? r.gigabytes_per_second() : 0.0;
        return 0.0;
      };
      auto cell = [&](const char* method) {
        for (const auto& r : results)
          if (r.method == method)
            return r.verified ? fmt::format("{:.2f}{}", r.gigabytes_per_second(), r.partial ? "*" : "")
                              : fmt::format("failed ({:.2f} GB/s confirmed)", r.gigabytes_per_second());
        return std::string("-");
      };
      auto ratio = [&](const char* a, const char* b) {
        return gbps(a) > 0 && gbps(b) > 0 ? fmt::format("{:.2f}", gbps(a) / gbps(b)) : std::string("-");
      };
      std::printf("| %s | %s%s | %s | %s | %s | %s | %s |\n", shape.c_str(), cache,
                  cold ? fmt::format(" ({})", cold_method).c_str() : "", cell("uring").c_str(), cell("cufile").c_str(),
                  cell("pread").c_str(), ratio("uring", "cufile").c_str(), ratio("uring", "pread").c_str());
      std::fflush(stdout);
    }
  }
  std::printf(
      "(* = the pass stopped at --pass-seconds; GB/s over the bytes it read. failed = an IO error or a "
      "verification failure: GB/s over the bytes the runtime confirmed before it, not a figure to use)\n");
  out["passes"] = passes;
  out["all_verified"] = all_ok;
  if (!s.json.empty()) {
    std::ofstream file(s.json);
    file << out.dump(2) << "\n";
    if (!file) die("cannot write " + s.json);
  }
  check(cudaFree(device), "cudaFree");
  if (!s.keep_files)
    for (std::uint64_t l = 0; l < s.layers; ++l) ::unlink(s.layer_path(l).c_str());
  return all_ok ? 0 : 1;
}
