// The KV store's GPU half (suite gpu, cuda profile; exits 77 without a GPU):
//  - the XXH3 checksum kernels (kv/checksum.hpp) on DEVICE memory give exactly libxxhash's
//    XXH3_64bits of the same bytes, for every length class and alignment;
//  - KvStore over the uring preset stores blocks from DEVICE memory (checksummed by the kernels)
//    and loads them into DEVICE memory, verified by the kernels; a block damaged on disk is refused.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "../support/require_ok.hpp"

#include <tutti/accel/memory.hpp>
#include <tutti/kv/kv.hpp>
#include <tutti/presets.hpp>

#include "../support/real_files.hpp"

using namespace tutti;
using tutti::testing::require_ok;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;

/// DEVICE memory, freed by the destructor.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t n) : size(n) {
    auto p = accel::allocate_device(n);
    REQUIRE_MESSAGE(p.is_ok(), p.status().to_string());
    data = static_cast<std::uint8_t*>(*p);
  }
  ~DeviceBuffer() { accel::free_device(data); }
  std::uint8_t* data;
  std::size_t size;
};

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

kv::Namespace gpu_namespace() {
  kv::Namespace ns;
  ns.model = "gpu-test-model";
  ns.dtype = "bfloat16";
  ns.block_tokens = 16;
  ns.layers = 3;
  ns.piece_bytes = {65536, 65536};
  ns.hash_algorithm = "sha256_cbor";
  return ns;
}

std::string key_of(std::uint64_t i) { return std::string(reinterpret_cast<const char*>(&i), 8) + "gpu-key"; }

}  // namespace

TEST_CASE("the XXH3 checksum kernels on DEVICE memory equal libxxhash's XXH3_64bits of the same bytes") {
  const std::size_t bytes = (std::size_t{1} << 22) + 4096;
  const auto host = random_bytes(bytes, 7);
  DeviceBuffer device(bytes);
  REQUIRE(accel::copy_to_device(device.data, host.data(), bytes).is_ok());
  std::vector<kv::HashInput> inputs;
  std::vector<std::size_t> offsets;
  std::size_t offset = 0;
  auto add = [&](std::uint64_t length) {
    inputs.push_back({device.data + offset, length});
    offsets.push_back(offset);
    offset = (offset + 13) % 4000;
  };
  for (std::uint64_t n = 0; n <= 2100; ++n) add(n);
  for (std::uint64_t base : {4096ull, 65536ull, 1ull << 19, 1ull << 20, 1ull << 22})
    for (std::int64_t d : {-65, -64, -1, 0, 1, 64}) add(base + d);
  kv::DeviceHasher hasher;
  std::vector<std::uint64_t> out(inputs.size());
  Status s = hasher.hash(inputs, out, 60 * kSecond);
  REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    REQUIRE_MESSAGE(out[i] == XXH3_64bits(host.data() + offsets[i], inputs[i].length), "length ", inputs[i].length);
}

TEST_CASE(
    "KvStore over uring stores blocks from DEVICE memory and loads them into DEVICE memory, verified by the kernels") {
  testing::TempDirectory dir;
  UringRuntime rt = require_ok(make_uring_runtime());
  const auto ns = gpu_namespace();
  const std::size_t blocks = 32, P = 2;
  const std::uint64_t piece = 65536, block = P * piece;
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < blocks; ++i) keys.push_back(key_of(i));
  const std::vector<std::string_view> keyviews(keys.begin(), keys.end());
  std::vector<std::vector<std::uint8_t>> expected;  // per layer, blocks x P pieces
  {
    kv::StoreOptions o;
    o.capacity_bytes = 64 * ns.layers * block;
    auto opened = kv::KvStore<UringRuntime>::open(rt, dir.file("kv"), ns, o);
    REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
    auto& store = **opened;
    DeviceBuffer source(ns.layers * blocks * block), destination(blocks * block);
    auto src = store.register_memory({source.data, source.size, MemoryKind::DEVICE, 0});
    auto dst = store.register_memory({destination.data, destination.size, MemoryKind::DEVICE, 0});
    REQUIRE_MESSAGE(src.is_ok(), src.status().to_string());
    REQUIRE_MESSAGE(dst.is_ok(), dst.status().to_string());
    for (std::uint32_t layer = 0; layer < ns.layers; ++layer) {
      expected.push_back(random_bytes(blocks * block, 100 + layer));
      REQUIRE(
          accel::copy_to_device(source.data + layer * blocks * block, expected.back().data(), blocks * block).is_ok());
      std::vector<kv::Piece> pieces;
      for (std::size_t i = 0; i < blocks * P; ++i) pieces.push_back({*src, layer * blocks * block + i * piece, piece});
      auto io = store.store(keyviews, layer, pieces);
      REQUIRE_MESSAGE(io.is_ok(), io.status().to_string());
    }
    for (std::uint32_t layer = 0; layer < ns.layers; ++layer) {
      auto r = store.wait_layer(layer, 60 * kSecond);
      REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
      REQUIRE_MESSAGE(r->front().status.is_ok(), r->front().status.to_string());
    }
    auto committed = store.commit(keyviews, 60 * kSecond);
    REQUIRE(committed.is_ok());
    for (const auto& s : *committed) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
    for (std::uint32_t layer = 0; layer < ns.layers; ++layer) {
      std::vector<kv::Piece> pieces;
      for (std::size_t i = 0; i < blocks * P; ++i) pieces.push_back({*dst, i * piece, piece});
      auto io = store.load(keyviews, layer, pieces);
      REQUIRE(io.is_ok());
      auto r = store.wait(*io, 60 * kSecond);
      REQUIRE(r.is_ok());
      REQUIRE_MESSAGE(r->status.is_ok(), r->status.to_string());
      CHECK(r->verified_bytes == blocks * block);
      std::vector<std::uint8_t> back(blocks * block);
      REQUIRE(accel::copy_from_device(back.data(), destination.data, back.size()).is_ok());
      CHECK(back == expected[layer]);
    }
  }
  // Damage block 5's piece 0 in layer 2 on disk: the kernels' verification refuses it.
  const std::string path = dir.file("kv") + "/layer-00002.kv";
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::uint8_t byte = 0;
  REQUIRE(::pread(fd, &byte, 1, 5 * block + 77) == 1);
  byte ^= 1;
  REQUIRE(::pwrite(fd, &byte, 1, 5 * block + 77) == 1);
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
  auto opened = kv::KvStore<UringRuntime>::open(rt, dir.file("kv"), ns, {});
  REQUIRE(opened.is_ok());
  auto& store = **opened;
  DeviceBuffer destination(blocks * block);
  auto dst = store.register_memory({destination.data, destination.size, MemoryKind::DEVICE, 0});
  REQUIRE(dst.is_ok());
  std::vector<kv::Piece> pieces;
  for (std::size_t i = 0; i < blocks * P; ++i) pieces.push_back({*dst, i * piece, piece});
  auto io = store.load(keyviews, 2, pieces);
  REQUIRE(io.is_ok());
  auto r = store.wait(*io, 60 * kSecond);
  REQUIRE(r.is_ok());
  CHECK(r->ok_blocks == blocks - 1);
  CHECK(r->blocks[5].code() == StatusCode::DATA_LOSS);
  CHECK(store.statistics().verification_failures == 1);
}
