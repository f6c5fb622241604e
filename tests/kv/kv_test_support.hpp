// Shared by the KV store suites and their helper process: a small namespace, page-aligned host
// buffers, deterministic block contents (one 64-bit word pattern per key, layer and piece), and
// whole-block store / load helpers that REQUIRE every step.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <tutti/kv/kv.hpp>
#include <tutti/presets.hpp>

namespace tutti::kvtest {

inline constexpr std::uint64_t kSecond = 1'000'000'000;

/// A namespace of `layers` layers and two pieces (K, V) of `piece` bytes each.
inline kv::Namespace small_namespace(std::uint32_t layers = 4, std::uint64_t piece = 8192) {
  kv::Namespace ns;
  ns.model = "test-model@1";
  ns.dtype = "bfloat16";
  ns.block_tokens = 16;
  ns.layers = layers;
  ns.piece_bytes = {piece, piece};
  ns.hash_algorithm = "sha256_cbor";
  ns.hash_seed = "0";
  return ns;
}

/// 2 layers of one 4096-byte piece (no K/V split): the namespace of the quota test and its helper.
inline kv::Namespace one_piece_namespace() {
  kv::Namespace ns = small_namespace(2, 4096);
  ns.piece_bytes = {4096};
  ns.kv_split = false;
  return ns;
}

/// The key of block i: 32 bytes derived from i (like a SHA-256 block hash), or `size` bytes.
inline std::string key_of(std::uint64_t i, std::size_t size = 32) {
  std::string k(size, '\0');
  std::uint64_t x = i * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t b = 0; b < size; ++b) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    k[b] = static_cast<char>(x >> 56);
  }
  return k;
}

/// Page-aligned host memory, freed by the destructor.
struct Buffer {
  explicit Buffer(std::size_t bytes) : size(bytes) {
    data = static_cast<std::uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(data, 0, bytes);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::uint8_t* data;
  std::size_t size;
};

/// Fills `n` bytes with the pattern of (key index, layer, piece).
inline void fill(std::uint8_t* p, std::uint64_t n, std::uint64_t key, std::uint32_t layer, std::uint32_t piece) {
  std::uint64_t x = (key << 20) ^ (std::uint64_t{layer} << 8) ^ piece ^ 0x5DEECE66Dull;
  for (std::uint64_t i = 0; i < n; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    std::memcpy(p + i, &z, std::min<std::uint64_t>(8, n - i));
  }
}

/// True when `n` bytes at p hold the pattern of (key, layer, piece).
inline bool holds(const std::uint8_t* p, std::uint64_t n, std::uint64_t key, std::uint32_t layer, std::uint32_t piece) {
  std::vector<std::uint8_t> expected(n);
  fill(expected.data(), n, key, layer, piece);
  return std::memcmp(p, expected.data(), n) == 0;
}

/// keys as string_views (the store's key type) over owned strings.
inline std::vector<std::string_view> views(const std::vector<std::string>& keys) {
  return std::vector<std::string_view>(keys.begin(), keys.end());
}

/// Pieces of `blocks` blocks laid out back to back in one region: block b, piece p at
/// (b * P + p) * stride, `length` bytes each.
inline std::vector<kv::Piece> pieces(MemoryHandle memory, std::size_t blocks, std::size_t P, std::uint64_t stride,
                                     std::uint64_t length, std::uint64_t base = 0) {
  std::vector<kv::Piece> out;
  for (std::size_t b = 0; b < blocks; ++b)
    for (std::size_t p = 0; p < P; ++p) out.push_back(kv::Piece{memory, base + (b * P + p) * stride, length});
  return out;
}

}  // namespace tutti::kvtest
