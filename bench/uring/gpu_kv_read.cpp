// gpu_kv_read (CUDA profile): reading a KV-sized working set from a file into GPU memory, in the same
// run, with
//   (a) the uring DataPath (O_DIRECT reads into the pinned staging ring, cudaMemcpyAsync H2D), and
//   (b) plain pread (page cache) into one pinned buffer + cudaMemcpy, one request at a time,
// for 512 KiB tensors and 16 KiB blocks, with a cold page cache (drop_caches before the run, root) and a
// warm one (the same run again). Prints GB/s (10^9 bytes per second) and the ratio (a) / (b).
//
//   gpu_kv_read [--file PATH] [--size BYTES] [--queue-depth N]
//
// cuFile (GPUDirect Storage, compat mode) is not measured here yet.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tutti/presets/uring.hpp>

namespace {

struct Settings {
  std::string file = "/var/tmp/tutti-gpu-kv.dat";
  std::uint64_t size = std::uint64_t{2} << 30;
  std::uint32_t queue_depth = 256;
};

void drop_caches() {
  if (geteuid() == 0 && std::system("sync && echo 3 > /proc/sys/vm/drop_caches") != 0)
    std::fprintf(stderr, "drop_caches failed\n");
}

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(code));
    std::exit(1);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// (a): every block of the file, in order, through UringRuntime into device memory, queue_depth
/// requests per submit, two submits in flight.
double run_uring(const Settings& s, std::uint64_t block, void* device) {
  tutti::uring::Options options;
  options.queue_depth = s.queue_depth;
  options.staging_buffer_bytes = std::max<std::uint64_t>(block, 256 << 10);
  options.staging_buffers = static_cast<std::uint32_t>(std::max<std::uint64_t>(8, (64u << 20) / options.staging_buffer_bytes));
  tutti::UringRuntime runtime(tutti::UringBackend{tutti::file::Resolver{}, tutti::uring::DataPath(options)});
  auto target = runtime.open("file://" + s.file, {.allow_buffered = true});
  auto memory = runtime.register_memory({device, s.size, tutti::MemoryKind::DEVICE, 0});
  if (!target || !memory) {
    std::fprintf(stderr, "open/register: %s %s\n", target.status().to_string().c_str(), memory.status().to_string().c_str());
    std::exit(1);
  }
  const std::uint64_t blocks = s.size / block;
  const std::uint64_t per_submit = std::max<std::uint64_t>(1, s.queue_depth / 2);
  std::vector<tutti::IoHandle> in_flight;
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t next = 0;
  auto submit_next = [&] {
    std::vector<tutti::IoRequest> requests;
    for (; next < blocks && requests.size() < per_submit; ++next)
      requests.push_back({tutti::Direction::READ, *memory, next * block, *target, next * block, block});
    if (requests.empty()) return;
    auto outcome = runtime.submit(requests);
    if (outcome.accepted != requests.size()) {
      std::fprintf(stderr, "submit: %s\n", outcome.initial_states.back().to_string().c_str());
      std::exit(1);
    }
    in_flight.push_back(outcome.io);
  };
  submit_next();
  submit_next();
  while (!in_flight.empty()) {
    auto result = runtime.wait(in_flight.front(), 60'000'000'000ull);
    if (!result || !result->status.is_ok()) {
      std::fprintf(stderr, "wait: %s\n", (result ? result->status : result.status()).to_string().c_str());
      std::exit(1);
    }
    (void)runtime.release(in_flight.front());
    in_flight.erase(in_flight.begin());
    submit_next();
  }
  return static_cast<double>(blocks * block) / seconds_since(start) / 1e9;
}

/// (b): pread (page cache) into a pinned buffer, then cudaMemcpy, block by block.
double run_pread(const Settings& s, std::uint64_t block, void* device) {
  const int fd = ::open(s.file.c_str(), O_RDONLY | O_CLOEXEC);
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, block, cudaHostAllocDefault), "cudaHostAlloc");
  const std::uint64_t blocks = s.size / block;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < blocks; ++i) {
    if (::pread(fd, pinned, block, static_cast<off_t>(i * block)) != static_cast<ssize_t>(block)) {
      std::fprintf(stderr, "pread failed\n");
      std::exit(1);
    }
    check(cudaMemcpy(static_cast<char*>(device) + i * block, pinned, block, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  const double gbps = static_cast<double>(blocks * block) / seconds_since(start) / 1e9;
  cudaFreeHost(pinned);
  ::close(fd);
  return gbps;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--file") s.file = argv[i + 1];
    else if (key == "--size") s.size = std::strtoull(argv[i + 1], nullptr, 10);
    else if (key == "--queue-depth") s.queue_depth = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
  }
  s.size = s.size / (512 << 10) * (512 << 10);
  {
    const int fd = ::open(s.file.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    std::vector<std::uint64_t> chunk((8u << 20) / 8);
    std::mt19937_64 random(1);
    for (std::uint64_t done = 0; done < s.size; done += chunk.size() * 8) {
      for (auto& w : chunk) w = random();
      if (::pwrite(fd, chunk.data(), chunk.size() * 8, static_cast<off_t>(done)) < 0) return 1;
    }
    ::fsync(fd);
    ::close(fd);
  }
  void* device = nullptr;
  check(cudaMalloc(&device, s.size), "cudaMalloc");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU %s, file %s, %llu bytes, queue depth %u\n", prop.name, s.file.c_str(),
              static_cast<unsigned long long>(s.size), s.queue_depth);
  std::printf("| block | cache | uring GB/s | pread+cudaMemcpy GB/s | uring / pread |\n|---|---|---|---|---|\n");
  for (std::uint64_t block : {std::uint64_t{512} << 10, std::uint64_t{16} << 10}) {
    for (const char* cache : {"cold", "warm"}) {
      const bool cold = std::strcmp(cache, "cold") == 0;
      if (cold) drop_caches();
      const double uring = run_uring(s, block, device);
      if (cold) drop_caches();
      const double pread = run_pread(s, block, device);
      std::printf("| %llu KiB | %s | %.2f | %.2f | %.2f |\n", static_cast<unsigned long long>(block >> 10), cache, uring,
                  pread, uring / pread);
      std::fflush(stdout);
    }
  }
  cudaFree(device);
  return 0;
}
