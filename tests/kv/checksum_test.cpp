// XXH3-64 as the store computes it: the host/device functions of kv/xxh3.hpp and the DeviceHasher
// kernels (run by accel::launch on the host thread pool in this profile) give exactly libxxhash's
// XXH3_64bits for every length class (0, 1-3, 4-8, 9-16, 17-128, 129-240, one block, many blocks,
// partial stripes) and every alignment of the input.
#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include <tutti/kv/checksum.hpp>

using namespace tutti;

namespace {

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

/// Every length up to 2100 (all small cases, the 240/241 boundary, 1 and 2 blocks with every
/// partial stripe), then lengths around block and stripe boundaries up to 1 MiB + 65.
std::vector<std::uint64_t> lengths() {
  std::vector<std::uint64_t> out;
  for (std::uint64_t n = 0; n <= 2100; ++n) out.push_back(n);
  for (std::uint64_t base : {4096ull, 65536ull, 1ull << 19, 1ull << 20})
    for (std::int64_t d : {-65, -64, -63, -1, 0, 1, 63, 64, 65}) out.push_back(base + d);
  return out;
}

}  // namespace

TEST_CASE("the one-thread XXH3 of kv/xxh3.hpp equals libxxhash's XXH3_64bits on every length class") {
  const auto data = random_bytes((1 << 20) + 200, 1);
  for (std::uint64_t n : lengths()) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{3}}) {  // unaligned inputs too
      const std::uint8_t* p = data.data() + offset;
      REQUIRE_MESSAGE(kv::xxh3::hash(p, n, kv::xxh3::kDefaultSecret.bytes) == XXH3_64bits(p, n), "length ", n,
                      " offset ", offset);
    }
  }
}

TEST_CASE("the device checksum kernels equal libxxhash's XXH3_64bits for a batch of every length class") {
  const auto data = random_bytes((1 << 20) + 200, 2);
  std::vector<kv::HashInput> inputs;
  std::size_t offset = 0;
  for (std::uint64_t n : lengths()) {
    inputs.push_back({data.data() + offset, n});
    offset = (offset + 7) % 100;  // vary the alignment
  }
  kv::DeviceHasher hasher;
  std::vector<std::uint64_t> out(inputs.size());
  Status s = hasher.hash(inputs, out, 60'000'000'000ull);
  REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    REQUIRE_MESSAGE(out[i] == XXH3_64bits(inputs[i].address, inputs[i].length), "length ", inputs[i].length);
  // A second, smaller batch reuses the buffer; a larger one grows it.
  std::vector<std::uint64_t> one(1);
  REQUIRE(hasher.hash(std::span(inputs).subspan(2000, 1), one, 1'000'000'000).is_ok());
  CHECK(one[0] == XXH3_64bits(inputs[2000].address, inputs[2000].length));
  CHECK(kv::host_checksum(data.data(), 4096) == XXH3_64bits(data.data(), 4096));
}

TEST_CASE("the device checksum refuses a batch whose output has another size, and a null input") {
  kv::DeviceHasher hasher;
  std::vector<kv::HashInput> inputs{{nullptr, 5}};
  std::vector<std::uint64_t> out(2);
  Status s = hasher.hash(inputs, out, 1'000'000'000);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(s.message().find("out.size() = 2") != std::string::npos);
  out.resize(1);
  s = hasher.hash(inputs, out, 1'000'000'000);
  CHECK(s.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(s.message().find("inputs[0].address is null for length = 5") != std::string::npos);
}
