// Real-file helpers shared by the test suites (local_file, local_nvme, uring): scratch directories
// on the root file system, files written through the file system in chunks and fsynced, plain
// (buffered) reads of what the file system returns, and file sizes. Every failure is a doctest
// REQUIRE naming the path, so a broken fixture stops the test case instead of passing it.
//
// Each suite keeps its own byte pattern (tests/local_file/test_files.hpp, tests/uring/
// uring_test_support.hpp, the latter mirrored by a GPU kernel) and writes it through these helpers.
//
//   tutti::testing::TempDirectory dir;                              // /var/tmp/tutti-test-XXXXXX
//   write_file(dir.file("kv"), FileWrite::REPLACE, 1 << 20,
//              [](std::uint64_t at, std::span<std::byte> chunk) { /* bytes [at, at + size) */ });
//   auto bytes = read_file<std::byte>(dir.file("kv"), 0, 4096);     // buffered pread
//
// Not thread-safe per path: concurrent writers of one file interleave their chunks.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

namespace tutti::testing {

/// How write_file() opens its file: REPLACE creates it or truncates it to 0 bytes first; APPEND
/// creates it or adds the bytes after its current end (O_APPEND).
enum class FileWrite { REPLACE, APPEND };

/// Writes `length` bytes to `path` through the file system (buffered write(2) calls of at most
/// `chunk_bytes` bytes each), then fsyncs. `fill(at, chunk)` is called once per chunk, in order, and
/// must set `chunk` to bytes [at, at + chunk.size()) of the data, `at` counting from the first byte
/// this call writes (0), not from the start of the file. length 0 only creates (or truncates) the
/// file. REQUIREs that open, every write and fsync succeed (open's error names the path and errno).
/// chunk_bytes must be > 0.
template <class Fill>
void write_file(const std::string& path, FileWrite mode, std::uint64_t length, Fill&& fill,
                std::uint64_t chunk_bytes = std::uint64_t{1} << 20) {
  REQUIRE(chunk_bytes > 0);
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == FileWrite::APPEND ? O_APPEND : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0644);
  REQUIRE_MESSAGE(fd >= 0, "cannot open ", path, " for writing: ", std::strerror(errno));
  std::vector<std::byte> chunk(static_cast<std::size_t>(std::min(chunk_bytes, std::max<std::uint64_t>(length, 1))));
  for (std::uint64_t done = 0; done < length;) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), length - done);
    fill(done, std::span<std::byte>(chunk.data(), static_cast<std::size_t>(n)));
    REQUIRE(::write(fd, chunk.data(), n) == static_cast<ssize_t>(n));
    done += n;
  }
  REQUIRE(::fsync(fd) == 0);
  ::close(fd);
}

/// What the file system returns for bytes [offset, offset + length) of `path`, through buffered
/// pread(2) calls (the page cache, never O_DIRECT). `Byte` is std::uint8_t or std::byte, whichever
/// the caller compares with. REQUIREs that the file opens and holds all `length` bytes (a read that
/// ends early, at end of file or on an error, fails the test case).
template <class Byte = std::uint8_t>
std::vector<Byte> read_file(const std::string& path, std::uint64_t offset, std::uint64_t length) {
  static_assert(sizeof(Byte) == 1, "read_file returns bytes");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE_MESSAGE(fd >= 0, "cannot open ", path, " for reading: ", std::strerror(errno));
  std::vector<Byte> out(static_cast<std::size_t>(length));
  std::uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, out.data() + done, length - done, static_cast<off_t>(offset + done));
    REQUIRE(n > 0);
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return out;
}

/// The size of `path` in bytes (stat(2) st_size). REQUIREs that stat succeeds.
inline std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  REQUIRE_MESSAGE(::stat(path.c_str(), &st) == 0, "cannot stat ", path, ": ", std::strerror(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

/// A unique scratch directory under /var/tmp (the root file system, which keeps O_DIRECT, unlike a
/// tmpfs /tmp), created by the constructor (REQUIREs mkdtemp succeeds) and removed with everything
/// in it by the destructor (best effort: a leftover directory is harmless). Not copyable.
struct TempDirectory {
  TempDirectory() {
    char name[] = "/var/tmp/tutti-test-XXXXXX";
    REQUIRE_MESSAGE(::mkdtemp(name) != nullptr, "mkdtemp under /var/tmp: ", std::strerror(errno));
    path = name;
  }
  ~TempDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;

  /// The path of `name` inside the directory (nothing is created).
  std::string file(const std::string& name) const { return path + "/" + name; }

  std::string path;
};

}  // namespace tutti::testing
