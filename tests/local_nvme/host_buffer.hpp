// The host buffer of the local_nvme suites (synthetic_test.cpp, files_test.cpp): page-aligned host
// memory that the tests register with the DataPath and read into or write from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <doctest/doctest.h>

#include <tutti/core/io.hpp>

namespace tutti::testing {

/// `size` bytes of host memory aligned to 4096 bytes, filled with 0xEE (a value no test pattern
/// relies on, so bytes a transfer did not write stand out). REQUIREs that the allocation succeeds.
/// Not copyable; not thread-safe (one test thread owns it).
struct Buffer {
  explicit Buffer(std::size_t n) : size(n) {
    REQUIRE(posix_memalign(&data, 4096, n) == 0);
    std::memset(data, 0xEE, n);
  }
  ~Buffer() { free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::uint8_t* bytes() { return static_cast<std::uint8_t*>(data); }
  /// The whole buffer as HOST memory (device -1).
  MemoryView view() const { return MemoryView{data, size, MemoryKind::HOST, -1}; }
  void* data = nullptr;
  std::size_t size;  ///< Bytes.
};

}  // namespace tutti::testing
