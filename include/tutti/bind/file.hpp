// The plain-file payload: what tutti::file::FileResolver produces and tutti::uring::UringDataPath opens.
//
// One open regular file of any Linux file system, reached through the kernel's file interface (no
// FIEMAP, no block addresses): the file descriptor (owned, closed on destruction), the file's size in
// bytes at open time, and the alignment the file system requires for O_DIRECT.
//
// Thread-safety: a payload is a plain, move-only value. The descriptors may be used by several
// threads at once (pread/pwrite and io_uring take explicit offsets; nothing uses the file position).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <tutti/core/errno.hpp>
#include <tutti/core/file_descriptor.hpp>

namespace tutti::file {

/// An owned file descriptor (tutti/core/file_descriptor.hpp).
using FileDescriptor = tutti::FileDescriptor;
/// The text of an errno value with its symbolic name (tutti/core/errno.hpp).
using tutti::errno_text;

/// Where Target::direct_io_alignment came from.
enum class AlignmentSource : std::uint8_t {
  statx = 0,         ///< statx(2) with STATX_DIOALIGN: stx_dio_offset_align (Linux 6.1+, per file system).
  block_device = 1,  ///< The logical block size of the block device behind the file system (BLKSSZGET / sysfs).
  probe = 2,         ///< A probing O_DIRECT read at growing sizes (512 .. 4096 bytes).
  buffered = 3,      ///< Not O_DIRECT (OpenOptions::allow_buffered): the page cache needs no alignment (1).
};

constexpr std::string_view to_string(AlignmentSource source) noexcept {
  switch (source) {
    case AlignmentSource::statx: return "STATX";
    case AlignmentSource::block_device: return "BLOCK_DEVICE";
    case AlignmentSource::probe: return "PROBE";
    case AlignmentSource::buffered: return "BUFFERED";
  }
  return "UNKNOWN_ALIGNMENT_SOURCE";
}

/// The payload: one open regular file.
struct Target {
  /// The file, opened O_CLOEXEC, O_RDWR when `writable` else O_RDONLY, plus O_DIRECT when `direct`.
  FileDescriptor fd;
  /// For writable O_DIRECT targets only: the same inode opened again without O_DIRECT (through
  /// /proc/self/fd), so that a write of an unaligned tail that ends at the end of the file can be
  /// written exactly, without extending the file (see docs/uring.md, "The tail rule"). -1 otherwise.
  FileDescriptor tail_fd;
  /// Why a writable O_DIRECT target has no tail_fd (the reopen found no /proc/self/fd: the call, the
  /// path and the errno text); the DataPath names it when it rejects an unaligned tail WRITE. Empty
  /// when tail_fd is open or not needed.
  std::string tail_fd_error;
  std::string path;                       ///< The decoded absolute path, for messages.
  std::string filesystem;                 ///< File system type name from statfs(2), e.g. "ext4", "tmpfs".
  std::uint64_t size = 0;                 ///< File size in bytes at open time.
  std::uint32_t direct_io_alignment = 1;  ///< Bytes: O_DIRECT offsets and lengths must be multiples (1 when buffered).
  std::uint32_t direct_io_memory_alignment =
      1;  ///< Bytes: O_DIRECT buffer addresses must be multiples (1 when buffered).
  AlignmentSource alignment_source = AlignmentSource::buffered;
  bool direct = false;    ///< Opened with O_DIRECT (page cache bypassed).
  bool writable = false;  ///< Opened read-write (OpenOptions::writable).

  /// The file's size in bytes at open time (the runtime checks request bounds against it).
  std::uint64_t size_bytes() const noexcept { return size; }
};

}  // namespace tutti::file
