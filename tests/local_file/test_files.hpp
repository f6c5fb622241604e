// Helpers shared by the local_file and local_nvme suites: deterministic file contents written
// through the file system, and reading them back.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <tutti/core/status.hpp>

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

inline std::vector<std::uint8_t> pattern(std::uint64_t seed, std::uint64_t offset, std::uint64_t length) {
  std::vector<std::uint8_t> out(length);
  for (std::uint64_t i = 0; i < length; ++i) out[i] = pattern_byte(seed, offset + i);
  return out;
}

/// Appends pattern(seed) bytes [offset, offset + length) to `path` through the file system
/// (buffered writes, O_APPEND), in chunks of `chunk` bytes.
inline void append_pattern(const std::string& path, std::uint64_t seed, std::uint64_t offset, std::uint64_t length,
                           std::uint64_t chunk = 1 << 20) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  REQUIRE(fd >= 0);
  for (std::uint64_t done = 0; done < length;) {
    const std::uint64_t n = std::min(chunk, length - done);
    auto bytes = pattern(seed, offset + done, n);
    REQUIRE(::write(fd, bytes.data(), n) == static_cast<ssize_t>(n));
    done += n;
  }
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
}

/// Writes a whole file of `length` pattern(seed) bytes.
inline void write_pattern_file(const std::string& path, std::uint64_t seed, std::uint64_t length) {
  ::unlink(path.c_str());
  append_pattern(path, seed, 0, length);
}

/// Reads [offset, offset + length) of `path` through the file system (buffered).
inline std::vector<std::uint8_t> read_file(const std::string& path, std::uint64_t offset, std::uint64_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<std::uint8_t> out(length);
  std::uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, out.data() + done, length - done, static_cast<off_t>(offset + done));
    REQUIRE(n > 0);
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return out;
}

inline std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace tutti::testing
