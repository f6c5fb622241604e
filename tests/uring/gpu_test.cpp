// The uring DataPath into and out of DEVICE memory through the pinned staging ring (CUDA profile,
// suite gpu). Every byte is checked after a plain cudaMemcpy back to the host. Without a usable GPU
// each case says so and passes nothing off as tested.
#include <cuda_runtime.h>

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

}  // namespace

TEST_CASE("reads into DEVICE memory through the staging ring, larger than the staging budget, with a tail") {
  if (!have_gpu()) return;
  TempDirectory dir;
  const auto path = dir.file("kv");
  const std::uint64_t size = (48u << 20) + 4096 + 321;  // more than 4 x 4 MiB staging buffers, unaligned tail
  write_pattern_file(path, size, 31);
  UringRuntime runtime(UringBackend{
      file::Resolver{}, uring::DataPath(uring::Options{.staging_buffers = 4, .staging_buffer_bytes = 4u << 20})});
  auto t = runtime.open("file://" + path, {.allow_buffered = true});
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  auto payload = file::Resolver{}.resolve("file://" + path, {.allow_buffered = true});
  REQUIRE(payload.is_ok());
  MESSAGE("file system ", payload->filesystem, ", O_DIRECT ", payload->direct);
  DeviceBuffer device(size + 4096);
  auto m = runtime.register_memory(device.view());
  REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
  auto c = run_all(runtime, {{Direction::READ, *m, 0, *t, 0, 32u << 20},
                             {Direction::READ, *m, 32u << 20, *t, 32u << 20, size - (32u << 20)}});
  for (const auto& one : c) REQUIRE_MESSAGE(one.status.is_ok(), one.status.to_string());
  CHECK(c[1].confirmed_bytes == size - (32u << 20));
  const auto host = device.to_host();
  CHECK(matches_pattern(host.data(), 0, size, 31));
  CHECK(runtime.datapath().stats().staged_chunks >= 13);
  CHECK(runtime.unregister_memory(*m).is_ok());
}

TEST_CASE("writes from DEVICE memory land byte for byte, tail included, without growing the file") {
  if (!have_gpu()) return;
  TempDirectory dir;
  const auto path = dir.file("kv");
  const std::uint64_t size = (9u << 20) + 100;
  write_pattern_file(path, size, 32);
  UringRuntime runtime;
  auto t = runtime.open("file://" + path, {.writable = true, .allow_buffered = true});
  REQUIRE(t.is_ok());
  std::vector<std::byte> source(size + 4096);
  for (std::uint64_t i = 0; i < source.size(); ++i) source[i] = pattern_byte(i, 33);
  DeviceBuffer device(size + 4096);
  REQUIRE(cudaMemcpy(device.pointer, source.data(), source.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  auto m = runtime.register_memory(device.view());
  REQUIRE(m.is_ok());
  auto c = run_all(runtime, {{Direction::WRITE, *m, 0, *t, 0, size}, {Direction::FLUSH, {}, 0, *t, 0, 0}});
  for (const auto& one : c) REQUIRE_MESSAGE(one.status.is_ok(), one.status.to_string());
  CHECK(file_size(path) == size);
  const auto plain = read_plain(path, 0, size);
  CHECK(std::memcmp(plain.data(), source.data(), size) == 0);
}

TEST_CASE("many small DEVICE reads (16 KiB blocks) share the bounded staging ring") {
  if (!have_gpu()) return;
  TempDirectory dir;
  const auto path = dir.file("blocks");
  write_pattern_file(path, 16u << 20, 34);
  UringRuntime runtime(UringBackend{file::Resolver{}, uring::DataPath(uring::Options{.queue_depth = 1024})});
  auto t = runtime.open("file://" + path, {.allow_buffered = true});
  REQUIRE(t.is_ok());
  DeviceBuffer device(16u << 20);
  auto m = runtime.register_memory(device.view());
  REQUIRE(m.is_ok());
  std::vector<IoRequest> requests;
  for (std::uint64_t i = 0; i < 1024; ++i) requests.push_back({Direction::READ, *m, i * 16384, *t, (1023 - i) * 16384, 16384});
  auto c = run_all(runtime, requests);
  for (const auto& one : c) REQUIRE(one.status.is_ok());
  const auto host = device.to_host();
  for (std::uint64_t i = 0; i < 1024; ++i) REQUIRE(matches_pattern(host.data() + i * 16384, (1023 - i) * 16384, 16384, 34));
}
