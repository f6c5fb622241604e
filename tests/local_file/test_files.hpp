// Pattern helpers of the local_file and local_nvme suites: deterministic file contents written
// through the file system (tests/support/real_files.hpp does the file IO, and provides read_file,
// file_size and TempDirectory to the files that include this one).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <real_files.hpp>

namespace tutti::testing {

/// The byte at `offset` of the test pattern `seed`: varies with offset and seed, never constant
/// over a 4 KiB block, so misplaced blocks are caught.
inline std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t offset) {
  std::uint64_t x = (offset / 8 + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x >> (8 * (offset % 8)));
}

/// Bytes [offset, offset + length) of the test pattern `seed`.
inline std::vector<std::uint8_t> pattern(std::uint64_t seed, std::uint64_t offset, std::uint64_t length) {
  std::vector<std::uint8_t> out(length);
  for (std::uint64_t i = 0; i < length; ++i) out[i] = pattern_byte(seed, offset + i);
  return out;
}

/// Appends pattern(seed) bytes [offset, offset + length) to `path` (created when missing) through
/// the file system (buffered writes, O_APPEND), in chunks of `chunk` bytes, then fsyncs.
inline void append_pattern(const std::string& path, std::uint64_t seed, std::uint64_t offset, std::uint64_t length,
                           std::uint64_t chunk = 1 << 20) {
  write_file(
      path, FileWrite::APPEND, length,
      [&](std::uint64_t at, std::span<std::byte> bytes) {
        for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte{pattern_byte(seed, offset + at + i)};
      },
      chunk);
}

/// Writes a whole new file (a new inode: any old `path` is unlinked first) of `length`
/// pattern(seed) bytes.
inline void write_pattern_file(const std::string& path, std::uint64_t seed, std::uint64_t length) {
  ::unlink(path.c_str());
  append_pattern(path, seed, 0, length);
}

}  // namespace tutti::testing
