// XXH3-64 (seed 0, the default 192-byte secret) as host/device functions, written from the
// algorithm's specification (xxHash's doc/xxhash_spec.md, "XXH3 Algorithm Description"), so that
// a kernel computes exactly the value libxxhash's XXH3_64bits() returns for the same bytes. Host
// code hashes with libxxhash itself (kv/checksum.hpp); these functions are what device code runs,
// and tests/kv/checksum_test.cpp checks them against libxxhash on every length class.
//
// Shape, for a parallel kernel: inputs of more than 240 bytes ("large") keep 8 accumulators, and
// accumulator j depends only on the input words j and j ^ 1 of every stripe and on the secret (see
// accumulate() in the spec: acc[i ^ 1] += stripe[i]; acc[i] += lo32(stripe[i] ^ secret[i]) *
// hi32(...); the scramble is per accumulator). So large_lane(p, len, j) computes accumulator j
// alone, 8 threads compute one input's 8 accumulators without talking to each other, and
// large_merge() folds them (the spec's finalMerge). Inputs of at most 240 bytes take one thread
// (hash_small()). hash() is the whole function in one thread, for tests and small inputs.
//
// The secret is passed as a pointer so device code reads it from memory it can reach (the
// checksum engine copies kDefaultSecret into its device buffer once); bytes are read little-endian
// one at a time, so no address needs any alignment.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tutti/accel/config.hpp>

namespace tutti::kv::xxh3 {

/// The secret's size in bytes (the spec's default secret).
inline constexpr std::size_t kSecretBytes = 192;
/// Stripe and block sizes of the large-input path, bytes (spec: stripesPerBlock = (192 - 64) / 8).
inline constexpr std::uint64_t kStripeBytes = 64;
inline constexpr std::uint64_t kStripesPerBlock = (kSecretBytes - 64) / 8;
inline constexpr std::uint64_t kBlockBytes = kStripeBytes * kStripesPerBlock;  // 1024
/// Inputs longer than this take the 8-accumulator path.
inline constexpr std::uint64_t kMidSizeMax = 240;
/// Accumulators (and so threads per input) of the large path.
inline constexpr unsigned kLanes = 8;

/// The spec's default secret.
struct Secret {
  std::uint8_t bytes[kSecretBytes];
};
inline constexpr Secret kDefaultSecret{{
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4,
    0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43,
    0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
    0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78,
    0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16,
    0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}};

// The spec's primes.
inline constexpr std::uint64_t kPrime32_1 = 0x9E3779B1u;
inline constexpr std::uint64_t kPrime32_2 = 0x85EBCA77u;
inline constexpr std::uint64_t kPrime32_3 = 0xC2B2AE3Du;
inline constexpr std::uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kPrime64_3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kPrime64_5 = 0x27D4EB2F165667C5ull;
inline constexpr std::uint64_t kPrimeMx1 = 0x165667919E3779F9ull;
inline constexpr std::uint64_t kPrimeMx2 = 0x9FB21C651E98DF25ull;

/// The large path's initial accumulators (spec, "Step 1"), read by lane index.
TUTTI_HOST_DEVICE constexpr std::uint64_t initial_accumulator(unsigned lane) noexcept {
  switch (lane) {
    case 0: return kPrime32_3;
    case 1: return kPrime64_1;
    case 2: return kPrime64_2;
    case 3: return kPrime64_3;
    case 4: return kPrime64_4;
    case 5: return kPrime32_2;
    case 6: return kPrime64_5;
    default: return kPrime32_1;
  }
}

TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t read64(const std::uint8_t* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little-endian, any alignment
  return v;
}
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t read32(const std::uint8_t* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t rotl64(std::uint64_t v, unsigned r) noexcept {
  return (v << r) | (v >> (64 - r));
}
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint32_t bswap32(std::uint32_t v) noexcept {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t bswap64(std::uint64_t v) noexcept {
  return (static_cast<std::uint64_t>(bswap32(static_cast<std::uint32_t>(v))) << 32) |
         bswap32(static_cast<std::uint32_t>(v >> 32));
}

/// The 128-bit product of a and b folded to 64 bits: low half xor high half.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t mul128_fold64(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t high = 0;
  TUTTI_IF_DEVICE((high = __umul64hi(a, b);),
                  (high = static_cast<std::uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);));
  return (a * b) ^ high;
}

TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t avalanche(std::uint64_t x) noexcept {
  x ^= x >> 37;
  x *= kPrimeMx1;
  return x ^ (x >> 32);
}
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t avalanche_xxh64(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= kPrime64_2;
  x ^= x >> 29;
  x *= kPrime64_3;
  return x ^ (x >> 32);
}

/// The spec's mixStep with seed 0: 16 bytes of data against 16 bytes of the secret.
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t mix16(const std::uint8_t* data, const std::uint8_t* secret) noexcept {
  return mul128_fold64(read64(data) ^ read64(secret), read64(data + 8) ^ read64(secret + 8));
}

/// XXH3-64 of inputs of 0..240 bytes (spec: empty, 1-3, 4-8, 9-16, 17-128, 129-240).
TUTTI_HOST_DEVICE inline std::uint64_t hash_small(const std::uint8_t* p, std::uint64_t len,
                                                  const std::uint8_t* secret) noexcept {
  if (len == 0) return avalanche_xxh64(read64(secret + 56) ^ read64(secret + 64));
  if (len <= 3) {
    const std::uint32_t combined = static_cast<std::uint32_t>(p[len - 1]) | static_cast<std::uint32_t>(len) << 8 |
                                   static_cast<std::uint32_t>(p[0]) << 16 |
                                   static_cast<std::uint32_t>(p[len >> 1]) << 24;
    const std::uint64_t value = static_cast<std::uint64_t>(read32(secret) ^ read32(secret + 4)) ^ combined;
    return avalanche_xxh64(value);
  }
  if (len <= 8) {
    const std::uint64_t first = read32(p), last = read32(p + len - 4);
    const std::uint64_t combined = last | (first << 32);
    std::uint64_t value = (read64(secret + 8) ^ read64(secret + 16)) ^ combined;
    value ^= rotl64(value, 49) ^ rotl64(value, 24);
    value *= kPrimeMx2;
    value ^= (value >> 35) + len;
    value *= kPrimeMx2;
    return value ^ (value >> 28);
  }
  if (len <= 16) {
    const std::uint64_t low = (read64(secret + 24) ^ read64(secret + 32)) ^ read64(p);
    const std::uint64_t high = (read64(secret + 40) ^ read64(secret + 48)) ^ read64(p + len - 8);
    return avalanche(len + bswap64(low) + high + mul128_fold64(low, high));
  }
  std::uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    const std::uint64_t rounds = ((len - 1) >> 5) + 1;
    for (std::uint64_t r = rounds; r-- > 0;) {
      acc += mix16(p + r * 16, secret + r * 32);
      acc += mix16(p + len - r * 16 - 16, secret + r * 32 + 16);
    }
    return avalanche(acc);
  }
  const std::uint64_t chunks = len >> 4;
  for (std::uint64_t i = 0; i < 8; ++i) acc += mix16(p + i * 16, secret + i * 16);
  acc = avalanche(acc);
  for (std::uint64_t i = 8; i < chunks; ++i) acc += mix16(p + i * 16, secret + (i - 8) * 16 + 3);
  acc += mix16(p + len - 16, secret + 119);  // spec: secret offset 136 - 17
  return avalanche(acc);
}

/// One accumulation step of one lane (spec: accumulate): the stripe at `stripe`, the secret at
/// `secret_at` (the 64 bytes this stripe uses).
TUTTI_HOST_DEVICE TUTTI_FORCEINLINE std::uint64_t accumulate_lane(std::uint64_t acc, const std::uint8_t* stripe,
                                                                  const std::uint8_t* secret_at,
                                                                  unsigned lane) noexcept {
  const std::uint64_t own = read64(stripe + 8 * lane);
  const std::uint64_t keyed = own ^ read64(secret_at + 8 * lane);
  acc += read64(stripe + 8 * (lane ^ 1u));  // acc[i ^ 1] += stripe[i]
  return acc + (keyed & 0xFFFFFFFFu) * (keyed >> 32);
}

/// Accumulator `lane` (0..7) of the large path over the whole input (len > 240): every full
/// block's stripes then its scramble, the last block's full stripes, and the last 64 bytes.
TUTTI_HOST_DEVICE inline std::uint64_t large_lane(const std::uint8_t* p, std::uint64_t len, const std::uint8_t* secret,
                                                  unsigned lane) noexcept {
  std::uint64_t acc = initial_accumulator(lane);
  const std::uint64_t blocks = (len - 1) / kBlockBytes;  // the last block is left for the last round
  const std::uint64_t scramble_secret = read64(secret + kSecretBytes - 64 + 8 * lane);
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = p + b * kBlockBytes;
    for (std::uint64_t n = 0; n < kStripesPerBlock; ++n)
      acc = accumulate_lane(acc, block + n * kStripeBytes, secret + n * 8, lane);
    acc ^= acc >> 47;  // round_scramble
    acc ^= scramble_secret;
    acc *= kPrime32_1;
  }
  const std::uint64_t last_len = len - blocks * kBlockBytes;
  const std::uint64_t full_stripes = (last_len - 1) / kStripeBytes;
  const std::uint8_t* last_block = p + blocks * kBlockBytes;
  for (std::uint64_t n = 0; n < full_stripes; ++n)
    acc = accumulate_lane(acc, last_block + n * kStripeBytes, secret + n * 8, lane);
  return accumulate_lane(acc, p + len - kStripeBytes, secret + kSecretBytes - 71, lane);
}

/// The spec's finalMerge of the 8 accumulators for XXH3-64 (init len * PRIME64_1, secret offset 11).
TUTTI_HOST_DEVICE inline std::uint64_t large_merge(const std::uint64_t* acc, std::uint64_t len,
                                                   const std::uint8_t* secret) noexcept {
  std::uint64_t result = len * kPrime64_1;
  for (unsigned i = 0; i < 4; ++i)
    result +=
        mul128_fold64(acc[2 * i] ^ read64(secret + 11 + 16 * i), acc[2 * i + 1] ^ read64(secret + 11 + 16 * i + 8));
  return avalanche(result);
}

/// XXH3-64 of `len` bytes at `p`, in one thread.
TUTTI_HOST_DEVICE inline std::uint64_t hash(const std::uint8_t* p, std::uint64_t len,
                                            const std::uint8_t* secret) noexcept {
  if (len <= kMidSizeMax) return hash_small(p, len, secret);
  std::uint64_t acc[kLanes];
  for (unsigned lane = 0; lane < kLanes; ++lane) acc[lane] = large_lane(p, len, secret, lane);
  return large_merge(acc, len, secret);
}

}  // namespace tutti::kv::xxh3
