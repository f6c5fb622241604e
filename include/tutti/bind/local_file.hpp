// The local_file payload: a file as sorted extents on one NVMe namespace, plus the open file
// descriptor that is its lease. Produced by tutti::local_file::LocalFileResolver (FIEMAP), opened by
// tutti::local_nvme::LocalNvmeDataPath.
//
// Units: file offsets, device offsets and lengths in bytes; LBAs in logical blocks of `lba_size`
// bytes (the namespace's LBA format, NVMe Base Spec 2.0, 5.17.2.1 / NVM Command Set 1.0, 4.1.5.1).
// Invariants of a Target built by the resolver (checked by Target::validate):
//  - extents are sorted by file_offset, do not overlap, and cover [0, file_size) without gaps;
//  - every file_offset, device_offset and length is a multiple of lba_size;
//  - the last extent may reach past file_size (to the end of the last file system block).
// Lookup is O(log n) (find_extent, usable from host and device code).
// Thread-safety: a Target is a plain value once built; concurrent readers are fine.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tutti/accel/config.hpp>
#include <tutti/bind/local_file/change_guard.hpp>
#include <tutti/core/file_descriptor.hpp>
#include <tutti/core/status.hpp>

namespace tutti::local_file {

/// One contiguous run of a file on the namespace. 24 bytes, trivially copyable (device-resident
/// copies are made by the DataPath).
struct Extent {
  std::uint64_t file_offset = 0;    ///< bytes from the start of the file; multiple of the LBA size
  std::uint64_t device_offset = 0;  ///< bytes from the start of the namespace (partition start included)
  std::uint64_t length = 0;         ///< bytes; multiple of the LBA size, > 0

  /// First LBA of the extent on the namespace (device_offset / lba_size).
  TUTTI_HOST_DEVICE constexpr std::uint64_t first_lba(std::uint32_t lba_size) const noexcept {
    return device_offset / lba_size;
  }
  /// One past the last file byte of the extent (overflow cannot happen: checked by validate()).
  TUTTI_HOST_DEVICE constexpr std::uint64_t file_end() const noexcept { return file_offset + length; }
};
static_assert(sizeof(Extent) == 24);

/// Index of the extent holding file byte `offset` in the sorted array extents[0, count), or
/// `count` when no extent holds it. Binary search, O(log count); host and device code.
TUTTI_HOST_DEVICE constexpr std::size_t find_extent(const Extent* extents, std::size_t count,
                                                    std::uint64_t offset) noexcept {
  std::size_t low = 0;
  std::size_t high = count;  // first extent with file_offset > offset is in [low, high]
  while (low < high) {
    const std::size_t mid = low + (high - low) / 2;
    if (extents[mid].file_offset <= offset)
      low = mid + 1;
    else
      high = mid;
  }
  if (low == 0) return count;
  const Extent& e = extents[low - 1];
  return offset < e.file_end() ? low - 1 : count;
}

/// The lease: an owned file descriptor (opened O_DIRECT by the resolver). Closing it ends the
/// lease. What the lease protects and what it does not: docs/local-nvme.md, "The lease"; what
/// keeps the block map fixed while the file is open is the target's ChangeGuard
/// (local_file/change_guard.hpp).
/// Move-only; closes the descriptor in its destructor; get() is the descriptor.
using FileLease = tutti::FileDescriptor;

/// The payload: one regular file, resolved to extents on one namespace.
struct Target {
  std::string path;                   ///< absolute path the file was opened by (for messages)
  std::vector<Extent> extents;        ///< sorted by file_offset, gap-free over [0, file_size)
  std::uint64_t file_size = 0;        ///< bytes (st_size at resolve time)
  std::uint32_t lba_size = 0;         ///< bytes per LBA of the namespace: 512 or 4096
  std::uint32_t nsid = 1;             ///< NVMe Namespace Identifier the device offsets refer to
  dev_t block_device = 0;             ///< st_rdev of the namespace's block device (the file's st_dev)
  std::uint64_t partition_start = 0;  ///< bytes; already added to every device_offset
  bool writable = false;              ///< the lease was opened read-write (OpenOptions::writable)
  FileLease lease;                    ///< the open O_DIRECT file descriptor
  /// FS_IMMUTABLE_FL and the inotify watch of the file, made by the resolver before FIEMAP
  /// (local_file/change_guard.hpp); ends with the target. Default constructed (guards nothing)
  /// in hand-built targets.
  ChangeGuard guard;

  /// The target size in bytes (the file size; the runtime checks bounds against it).
  std::uint64_t size_bytes() const noexcept { return file_size; }

  /// Index of the extent that holds file byte `offset`, or extents.size() when none does.
  std::size_t find(std::uint64_t offset) const noexcept { return find_extent(extents.data(), extents.size(), offset); }

  /// Checks the invariants listed in the file comment. DATA_LOSS naming the file offset of the
  /// first gap; INVALID_ARGUMENT for a bad lba_size, a misaligned or empty extent, or overflow.
  Status validate() const {
    if (lba_size != 512 && lba_size != 4096)
      return error(StatusCode::INVALID_ARGUMENT, "'{}': lba_size = {} is not 512 or 4096 bytes", path, lba_size);
    std::uint64_t expected = 0;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      const Extent& e = extents[i];
      if (e.length == 0 || e.file_offset % lba_size != 0 || e.device_offset % lba_size != 0 || e.length % lba_size != 0)
        return error(StatusCode::INVALID_ARGUMENT,
                     "'{}': extent {} (file offset {}, device offset {}, length {}) is empty or not aligned to the "
                     "{}-byte LBA size",
                     path, i, e.file_offset, e.device_offset, e.length, lba_size);
      if (e.file_offset != expected)
        return error(StatusCode::DATA_LOSS, "'{}': no extent maps file offset {} (hole)", path, expected);
      if (e.file_offset > UINT64_MAX - e.length || e.device_offset > UINT64_MAX - e.length)
        return error(StatusCode::INVALID_ARGUMENT, "'{}': extent {} overflows 64 bits", path, i);
      expected = e.file_end();
    }
    if (expected < file_size)
      return error(StatusCode::DATA_LOSS, "'{}': no extent maps file offset {} (hole up to end of file {})", path,
                   expected, file_size);
    return Status::success();
  }
};

}  // namespace tutti::local_file
