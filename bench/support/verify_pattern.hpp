// A self-checking data pattern for the benchmarks' --verify modes (tutti-bench, uring_vs_fio,
// bench_local_nvme): every 4096-byte block of a benchmark file says which file and which block it is
// and which write produced it, so a read is verified against nothing but its own position, and a
// write is verified by reading the block back after the run. A GB/s figure is then of bytes that were
// checked, not merely of bytes the runtime confirmed.
//
// Block layout (64-bit little-endian words, 512 per block):
//   word 0        key(file, block): a 64-bit mix of the file number and the block's index in the file;
//                 a block read from another file or offset fails here;
//   word 1        the stamp of the write that produced the block: 0 for the preparing pass, otherwise
//                 (nonce << 32) | sequence, with a random 32-bit nonce per run (write_stamp);
//   words 2..511  stamp ^ (key + i): a torn block (parts of two writes), stale or zeroed memory fails.
// Units: bytes; file offsets and lengths are multiples of kPatternBlockBytes.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

namespace tutti::bench {

/// Bytes per self-describing block: offsets and lengths checked by the pattern are multiples of it.
inline constexpr std::uint64_t kPatternBlockBytes = 4096;
/// What the benchmarks write into memory before a read (so bytes a read did not deliver never pass).
inline constexpr unsigned char kPoisonByte = 0xa5;

/// The 64-bit key of block `block` (index, not byte offset) of file `file` (splitmix64 of both).
constexpr std::uint64_t pattern_key(std::uint64_t file, std::uint64_t block) noexcept {
  std::uint64_t x = (file << 40) ^ block ^ 0x5d1c'0f5e'7a11'7e57ull;
  x += 0x9e37'79b9'7f4a'7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58'476d'1ce4'e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d0'49bb'1331'11ebull;
  return x ^ (x >> 31);
}

/// Fills `bytes` (a multiple of kPatternBlockBytes) of `memory` with the pattern of file `file` from
/// byte `file_offset` (a multiple of kPatternBlockBytes) on, every block with `stamp`.
inline void fill_pattern(std::byte* memory, std::uint64_t file, std::uint64_t file_offset, std::uint64_t bytes,
                         std::uint64_t stamp) noexcept {
  constexpr std::uint64_t kWords = kPatternBlockBytes / 8;
  for (std::uint64_t done = 0; done < bytes; done += kPatternBlockBytes) {
    const std::uint64_t key = pattern_key(file, (file_offset + done) / kPatternBlockBytes);
    std::uint64_t words[kWords];
    words[0] = key;
    words[1] = stamp;
    for (std::uint64_t i = 2; i < kWords; ++i) words[i] = stamp ^ (key + i);
    std::memcpy(memory + done, words, kPatternBlockBytes);
  }
}

/// The stamp of one block in memory (word 1).
inline std::uint64_t pattern_stamp(const std::byte* block) noexcept {
  std::uint64_t stamp = 0;
  std::memcpy(&stamp, block + 8, 8);
  return stamp;
}

/// How many of the `bytes / kPatternBlockBytes` blocks at `memory` do not hold the pattern of file
/// `file` at `file_offset` (wrong key, or a body that does not match the block's own stamp). 0 means
/// every byte checked out, whatever write produced each block.
inline std::uint64_t count_bad_blocks(const std::byte* memory, std::uint64_t file, std::uint64_t file_offset,
                                      std::uint64_t bytes) noexcept {
  constexpr std::uint64_t kWords = kPatternBlockBytes / 8;
  std::uint64_t bad = 0;
  for (std::uint64_t done = 0; done < bytes; done += kPatternBlockBytes) {
    const std::uint64_t key = pattern_key(file, (file_offset + done) / kPatternBlockBytes);
    std::uint64_t words[kWords];
    std::memcpy(words, memory + done, kPatternBlockBytes);
    std::uint64_t differ = words[0] ^ key;
    const std::uint64_t stamp = words[1];
    for (std::uint64_t i = 2; i < kWords; ++i) differ |= words[i] ^ (stamp ^ (key + i));
    bad += differ != 0 ? 1 : 0;
  }
  return bad;
}

/// Stamps for one run's writes: (nonce << 32) | sequence, the nonce random and never 0 (0 is the
/// preparing pass), so a block written in this run is told apart from one written by an earlier run
/// (with probability 1 - 2^-32).
class WriteStamps {
 public:
  WriteStamps() {
    std::random_device random;
    while (nonce_ == 0) nonce_ = random();
  }
  std::uint64_t next() noexcept { return (std::uint64_t{nonce_} << 32) | (sequence_++ & 0xffff'ffffu); }
  /// Whether `stamp` was made by this object.
  bool ours(std::uint64_t stamp) const noexcept { return (stamp >> 32) == nonce_; }

 private:
  std::uint32_t nonce_ = 0;
  std::uint32_t sequence_ = 0;
};

}  // namespace tutti::bench
