// The uring DataPath into and out of DEVICE memory through the pinned staging ring (CUDA profile,
// suite gpu). Every byte is checked after a plain cudaMemcpy back to the host. Without a usable GPU
// each case says so and passes nothing off as tested.
#include <cuda_runtime.h>

#include <tutti/accel/stream.hpp>

#include "gpu_kernels.hpp"
#include "uring_test_support.hpp"

using namespace tutti;
using namespace tutti::testing;

namespace {

bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    MESSAGE("no CUDA device: DEVICE-memory cases not run");
    return false;
  }
  return true;
}

struct DeviceBuffer {
  explicit DeviceBuffer(std::uint64_t bytes) : size(bytes) { REQUIRE(cudaMalloc(&pointer, bytes) == cudaSuccess); }
  ~DeviceBuffer() { (void)cudaFree(pointer); }
  std::vector<std::byte> to_host() const {
    std::vector<std::byte> out(size);
    REQUIRE(cudaMemcpy(out.data(), pointer, size, cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }
  MemoryView view() const { return {pointer, size, MemoryKind::DEVICE, 0}; }
  void* pointer = nullptr;
  std::uint64_t size;
};

/// A non-blocking stream of the test (the caller's stream), destroyed after it drained.
struct CallerStream {
  CallerStream() { REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess); }
  ~CallerStream() {
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};

/// Bytes of `device` that differ from the file pattern, counted by a kernel queued on `stream` now.
unsigned long long mismatches_seen_on(cudaStream_t stream, const DeviceBuffer& device, std::uint64_t bytes,
                                      std::uint32_t seed) {
  unsigned long long* counter = nullptr;
  REQUIRE(cudaMalloc(&counter, sizeof *counter) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(counter, 0, sizeof *counter, stream) == cudaSuccess);
  REQUIRE(testing::gpu::count_pattern_mismatches(device.pointer, bytes, 0, seed, counter, stream) == cudaSuccess);
  unsigned long long host = ~0ull;
  REQUIRE(cudaMemcpyAsync(&host, counter, sizeof host, cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  (void)cudaFree(counter);
  return host;
}

/// The setup most cases share: a pattern file of `file_bytes` bytes (seed `seed`) in a fresh scratch
/// directory, a runtime whose io_uring DataPath has `datapath` options, the file opened through it
/// (buffered fallback allowed; writable when asked), and a DEVICE buffer of `device_bytes` bytes
/// (file_bytes when 0) registered with the runtime. Members are destroyed in reverse order: the
/// DEVICE buffer is freed before the runtime shuts down, as in a test that declared them in turn.
struct DeviceFileSetup {
  struct Options {
    std::string name;                ///< File name inside the scratch directory.
    std::uint64_t file_bytes = 0;    ///< Size of the pattern file in bytes.
    std::uint32_t seed = 0;          ///< Pattern seed of the file (pattern_byte).
    bool writable = false;           ///< Open for WRITE requests too.
    uring::Options datapath{};       ///< Options of the io_uring DataPath (defaults: those of UringRuntime{}).
    std::uint64_t device_bytes = 0;  ///< Size of the DEVICE buffer in bytes; 0: file_bytes.
  };

  explicit DeviceFileSetup(const Options& options)
      : path(dir.file(options.name)),
        runtime(require_ok(make_uring_runtime(options.datapath))),
        device(options.device_bytes != 0 ? options.device_bytes : options.file_bytes) {
    write_pattern_file(path, options.file_bytes, options.seed);
    auto opened = runtime.open("file://" + path, {.writable = options.writable, .allow_buffered = true});
    REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
    target = *opened;
  }

  /// Registers the DEVICE buffer (after the case filled it, when it fills it first).
  MemoryHandle register_device() {
    auto m = runtime.register_memory(device.view());
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    return *m;
  }

  TempDirectory dir;
  std::string path;
  UringRuntime runtime = require_ok(make_uring_runtime());
  TargetHandle target{};
  DeviceBuffer device;
};

constexpr std::uint64_t kBusyKernelNs = 300'000'000;  // 300 ms: far longer than reading 4 MiB

}  // namespace

TEST_CASE("reads into DEVICE memory through the staging ring, larger than the staging budget, with a tail") {
  if (!have_gpu()) return;
  const std::uint64_t size = (48u << 20) + 4096 + 321;  // more than 4 x 4 MiB staging buffers, unaligned tail
  DeviceFileSetup f({.name = "kv",
                     .file_bytes = size,
                     .seed = 31,
                     .datapath = {.staging_buffers = 4, .staging_buffer_bytes = 4u << 20},
                     .device_bytes = size + 4096});
  auto payload = file::FileResolver{}.resolve("file://" + f.path, {.allow_buffered = true});
  REQUIRE(payload.is_ok());
  MESSAGE("file system ", payload->filesystem, ", O_DIRECT ", payload->direct);
  const MemoryHandle m = f.register_device();
  auto c = run_all(f.runtime, {{Direction::READ, m, 0, f.target, 0, 32u << 20},
                               {Direction::READ, m, 32u << 20, f.target, 32u << 20, size - (32u << 20)}});
  for (const auto& one : c) REQUIRE_MESSAGE(one.status.is_ok(), one.status.to_string());
  CHECK(c[1].confirmed_bytes == size - (32u << 20));
  const auto host = f.device.to_host();
  CHECK(matches_pattern(host.data(), 0, size, 31));
  CHECK(f.runtime.datapath().stats().staged_chunks >= 13);
  CHECK(f.runtime.unregister_memory(m).is_ok());
}

TEST_CASE("writes from DEVICE memory land byte for byte, tail included, without growing the file") {
  if (!have_gpu()) return;
  const std::uint64_t size = (9u << 20) + 100;
  DeviceFileSetup f({.name = "kv", .file_bytes = size, .seed = 32, .writable = true, .device_bytes = size + 4096});
  std::vector<std::byte> source(size + 4096);
  for (std::uint64_t i = 0; i < source.size(); ++i) source[i] = pattern_byte(i, 33);
  REQUIRE(cudaMemcpy(f.device.pointer, source.data(), source.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  const MemoryHandle m = f.register_device();
  auto c = run_all(f.runtime, {{Direction::WRITE, m, 0, f.target, 0, size}, {Direction::FLUSH, {}, 0, f.target, 0, 0}});
  for (const auto& one : c) REQUIRE_MESSAGE(one.status.is_ok(), one.status.to_string());
  CHECK(file_size(f.path) == size);
  const auto plain = read_plain(f.path, 0, size);
  CHECK(std::memcmp(plain.data(), source.data(), size) == 0);
}

TEST_CASE("many small DEVICE reads (16 KiB blocks) share the bounded staging ring") {
  if (!have_gpu()) return;
  DeviceFileSetup f({.name = "blocks", .file_bytes = 16u << 20, .seed = 34, .datapath = {.queue_depth = 1024}});
  const MemoryHandle m = f.register_device();
  std::vector<IoRequest> requests;
  for (std::uint64_t i = 0; i < 1024; ++i)
    requests.push_back({Direction::READ, m, i * 16384, f.target, (1023 - i) * 16384, 16384});
  auto c = run_all(f.runtime, requests);
  for (const auto& one : c) REQUIRE(one.status.is_ok());
  const auto host = f.device.to_host();
  for (std::uint64_t i = 0; i < 1024; ++i)
    REQUIRE(matches_pattern(host.data() + i * 16384, (1023 - i) * 16384, 16384, 34));
}

TEST_CASE(
    "a READ fenced on the caller's stream lands after the kernel queued there before it, and a kernel queued after "
    "completion sees the file's bytes") {
  if (!have_gpu()) return;
  const std::uint64_t size = 4u << 20;
  DeviceFileSetup f({.name = "fenced",
                     .file_bytes = size,
                     .seed = 35,
                     .datapath = {.staging_buffers = 2, .staging_buffer_bytes = 1u << 20}});
  const MemoryHandle m = f.register_device();
  CallerStream caller;
  REQUIRE(
      f.runtime.datapath().set_completion_stream(f.device.pointer, accel::StreamRef::from_cuda(caller.stream)).is_ok());
  // The region's previous user: still busy when the READ is submitted, then it overwrites the region.
  REQUIRE(testing::gpu::spin_then_fill(f.device.pointer, size, 0xAB, kBusyKernelNs, caller.stream) == cudaSuccess);
  auto c = run_all(f.runtime, {{Direction::READ, m, 0, f.target, 0, size}});
  REQUIRE_MESSAGE(c[0].status.is_ok(), c[0].status.to_string());
  CHECK(mismatches_seen_on(caller.stream, f.device, size, 35) == 0);
  CHECK(f.runtime.unregister_memory(m).is_ok());
}

TEST_CASE("without a fence the same READ is overwritten by the earlier kernel (the hazard the fence removes)") {
  if (!have_gpu()) return;
  const std::uint64_t size = 4u << 20;
  DeviceFileSetup f({.name = "unfenced", .file_bytes = size, .seed = 36});
  const MemoryHandle m = f.register_device();
  CallerStream caller;
  REQUIRE(testing::gpu::spin_then_fill(f.device.pointer, size, 0xAB, kBusyKernelNs, caller.stream) == cudaSuccess);
  auto c = run_all(f.runtime, {{Direction::READ, m, 0, f.target, 0, size}});
  REQUIRE(c[0].status.is_ok());
  // The staging copy ran on the ring's own stream long before the busy kernel's fill.
  CHECK(mismatches_seen_on(caller.stream, f.device, size, 36) > size / 2);
  CHECK(f.runtime.unregister_memory(m).is_ok());
}

TEST_CASE("a WRITE fenced on the caller's stream writes what the kernel queued before it produced") {
  if (!have_gpu()) return;
  const std::uint64_t size = 4u << 20;
  DeviceFileSetup f({.name = "produced",
                     .file_bytes = size,
                     .seed = 37,
                     .writable = true,
                     .datapath = {.staging_buffers = 2, .staging_buffer_bytes = 1u << 20}});
  REQUIRE(cudaMemset(f.device.pointer, 0, size) == cudaSuccess);
  const MemoryHandle m = f.register_device();
  CallerStream caller;
  REQUIRE(
      f.runtime.datapath().set_completion_stream(f.device.pointer, accel::StreamRef::from_cuda(caller.stream)).is_ok());
  REQUIRE(testing::gpu::spin_then_fill(f.device.pointer, size, 0x5A, kBusyKernelNs, caller.stream) == cudaSuccess);
  auto c = run_all(f.runtime, {{Direction::WRITE, m, 0, f.target, 0, size}, {Direction::FLUSH, {}, 0, f.target, 0, 0}});
  for (const auto& one : c) REQUIRE_MESSAGE(one.status.is_ok(), one.status.to_string());
  const auto plain = read_plain(f.path, 0, size);
  std::uint64_t produced = 0;
  for (std::byte b : plain) produced += b == std::byte{0x5A} ? 1 : 0;
  CHECK(produced == size);
  CHECK(f.runtime.unregister_memory(m).is_ok());
}

TEST_CASE("set_completion_stream refuses host memory and unknown addresses, naming them") {
  if (!have_gpu()) return;
  CallerStream caller;
  const auto stream = accel::StreamRef::from_cuda(caller.stream);
  uring::UringDataPath d = require_ok(uring::UringDataPath::create());
  AlignedBuffer host(4096);
  auto h = d.register_memory(host.view());
  REQUIRE(h.is_ok());
  const Status on_host = d.set_completion_stream(*h, stream);
  CHECK(on_host.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(on_host.message().find("HOST") != std::string::npos);
  CHECK(d.set_completion_stream(static_cast<const void*>(host.get()), stream).code() == StatusCode::NOT_FOUND);
  DeviceBuffer device(1u << 20);
  auto m = d.register_memory(device.view());
  REQUIRE(m.is_ok());
  CHECK(d.set_completion_stream(static_cast<const void*>(device.pointer), stream).is_ok());
  CHECK(d.set_completion_stream(static_cast<const void*>(device.pointer), accel::StreamRef{}).is_ok());
  REQUIRE(d.unregister_memory(*m).is_ok());
  CHECK(d.set_completion_stream(static_cast<const void*>(device.pointer), stream).code() == StatusCode::NOT_FOUND);
  CHECK(d.unregister_memory(*h).is_ok());
}
