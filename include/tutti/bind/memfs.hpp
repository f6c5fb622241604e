// The memfs payload: what the memfs resolver produces and the memfs DataPath opens.
// A sample binding: one payload type shared by one resolver family and one DataPath family
// (docs/extending.md shows how to write your own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tutti::memfs {

/// A named, fixed-size file held in host memory. Bytes start zeroed.
/// Thread-safety: the bytes are shared; concurrent IO to overlapping ranges is the caller's race.
struct File {
  std::string name;
  std::uint64_t size = 0;              ///< Bytes.
  std::unique_ptr<std::byte[]> bytes;  ///< `size` bytes.
};

/// The payload: a reference to one memfs File.
struct Target {
  std::shared_ptr<File> file;
  std::uint64_t size_bytes() const noexcept { return file->size; }
};

}  // namespace tutti::memfs
