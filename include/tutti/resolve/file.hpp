// tutti::file::FileResolver: file:// URIs -> an open regular file (tutti::file::Target), on any Linux file
// system (ext4, xfs, btrfs, tmpfs, overlayfs ...). It needs no FIEMAP: the DataPath (uring) reaches the
// file through the kernel's file interface.
//
// URI grammar: file://[localhost]/ABSOLUTE/PATH, percent-decoded by tutti::parse_uri
// ("file:///mnt/kv/layer%2017" names "/mnt/kv/layer 17"). The authority must be empty or "localhost";
// no query keys are accepted.
//
// Opening:
//  - O_RDONLY, or O_RDWR when OpenOptions::writable; always O_CLOEXEC; never creates the file.
//  - O_DIRECT whenever the file system supports it. When it does not (open(2) fails with EINVAL, or
//    statx reports a direct-IO alignment of 0), the open fails UNSUPPORTED naming the file system,
//    unless OpenOptions::allow_buffered is set: then the file is opened through the page cache and the
//    payload says so (Target::direct = false). There is no silent fallback.
//  - Regular files only (directories, FIFOs, devices, sockets are refused before they are opened, so
//    opening a FIFO cannot block).
//  - The O_DIRECT alignment: statx(2) STATX_DIOALIGN when the kernel reports it (Linux 6.1+), else the
//    logical block size of the block device behind the file system (sysfs queue/logical_block_size),
//    else a probing O_DIRECT read of 512, 1024, 2048 and 4096 bytes (the first size accepted).
//
//  - The tail descriptor of a writable O_DIRECT file: the same inode reopened through /proc/self/fd
//    without O_DIRECT. When /proc/self/fd is missing (ENOENT: /proc not mounted) the open succeeds
//    without it and Target::tail_fd_error keeps the cause, which the DataPath names when it rejects an
//    unaligned tail WRITE; any other failure (EMFILE: no descriptor left ...) fails the open with its errno.
//
// Errors (messages name the call, the path, the access asked for and the errno text):
//  - INVALID_ARGUMENT: malformed URI (see parse_uri), scheme other than "file", an authority other
//    than "" or "localhost", a relative or empty path, a query, not a regular file;
//  - UNSUPPORTED: the file system does not support O_DIRECT (open fails EINVAL with O_DIRECT only, or
//    statx reports no direct-IO alignment) and allow_buffered is not set;
//  - every errno of stat, open, fstat and fcntl: the one classification of tutti/core/errno.hpp
//    (docs/api.md, "errno values"): NOT_FOUND (ENOENT, ENOTDIR), INVALID_ARGUMENT (EACCES, EPERM,
//    EROFS, ETXTBSY, EISDIR, ELOOP, ENAMETOOLONG), RESOURCE_EXHAUSTED (EMFILE, ENFILE, ENOMEM),
//    DEVICE_ERROR (EIO and the rest).
//
// Thread-safety: resolve() is const and may be called from several threads at once (open_batch).
#pragma once

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <tutti/bind/file.hpp>
#include <tutti/core/errno.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/uri.hpp>

namespace tutti::file {

namespace detail {

/// The name of a file system type from statfs(2)'s f_type ("ext4", "tmpfs" ...), or its magic number in hex.
inline std::string filesystem_name(long type) {
  switch (static_cast<unsigned long>(type)) {
    case EXT4_SUPER_MAGIC: return "ext4";  // also ext2 and ext3: one magic number
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case TMPFS_MAGIC: return "tmpfs";
    case RAMFS_MAGIC: return "ramfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case NFS_SUPER_MAGIC: return "nfs";
    case 0x65735546UL: return "fuse";
    case 0x2fc12fc1UL: return "zfs";
    case F2FS_SUPER_MAGIC: return "f2fs";
    default: break;
  }
  return fmt::format("file system type {:#x}", static_cast<unsigned long>(type));
}

/// The file system type name of an open descriptor.
inline std::string filesystem_of(int fd) {
  struct statfs info {};
  if (::fstatfs(fd, &info) != 0) return "unknown file system";
  return filesystem_name(info.f_type);
}

/// The logical block size in bytes of the block device `device` (a whole disk or a partition), read
/// from sysfs; 0 when there is none (tmpfs, overlayfs, network file systems).
inline std::uint32_t logical_block_size(dev_t device) {
  const unsigned major_number = major(device), minor_number = minor(device);
  for (const char* relative : {"queue/logical_block_size", "../queue/logical_block_size"}) {
    std::ifstream in(fmt::format("/sys/dev/block/{}:{}/{}", major_number, minor_number, relative));
    std::uint32_t bytes = 0;
    if (in >> bytes && bytes > 0) return bytes;
  }
  return 0;
}

/// The smallest of 512, 1024, 2048, 4096 bytes that an O_DIRECT read at offset 0 accepts; 0 when none.
inline std::uint32_t probe_direct_io_alignment(int fd) {
  constexpr std::size_t kProbeBytes = 4096;
  std::unique_ptr<void, void (*)(void*)> buffer(std::aligned_alloc(kProbeBytes, kProbeBytes), std::free);
  if (!buffer) return 0;
  for (std::uint32_t size = 512; size <= kProbeBytes; size *= 2)
    if (::pread(fd, buffer.get(), size, 0) >= 0) return size;
  return 0;
}

}  // namespace detail

/// Resolver for file:// URIs. Stateless; copies are independent. See the file comment for the rules.
class FileResolver {
 public:
  using target_type = Target;
  static constexpr std::string_view scheme = "file";

  /// Resolves and opens `text`. See the file comment for the opening rules and the errors.
  Result<Target> resolve(std::string_view text, const OpenOptions& options) const {
    auto uri = parse_uri(text);
    if (!uri) return uri.status();
    if (uri->scheme != scheme)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has scheme '{}'; the file resolver serves 'file'", text,
                   uri->scheme);
    if (!uri->authority.empty() && uri->authority != "localhost")
      return error(StatusCode::INVALID_ARGUMENT,
                   "uri '{}' names host '{}'; only local files are served (file:///path or file://localhost/path)",
                   text, uri->authority);
    if (!uri->query.empty())
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has a query; the file resolver accepts no query keys", text);
    const std::string& path = uri->path;
    if (path.empty() || path.front() != '/' || path == "/")
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has no absolute file path (expected file:///path)", text);
    return open_path(path, options);
  }

  /// Opens an absolute, already decoded path with the rules of resolve().
  static Result<Target> open_path(const std::string& path, const OpenOptions& options) {
    struct stat before {};
    if (::stat(path.c_str(), &before) != 0) return tutti::open_error("stat", path, options.writable, errno);
    if (!S_ISREG(before.st_mode))
      return error(StatusCode::INVALID_ARGUMENT, "'{}' is not a regular file (file type {:#o})", path,
                   static_cast<unsigned>(before.st_mode & S_IFMT));

    // O_NONBLOCK keeps a file swapped for a FIFO since the stat from blocking the open; it is cleared
    // right after (io_uring would otherwise see IOCB_NOWAIT and return EAGAIN on regular files).
    const int access = options.writable ? O_RDWR : O_RDONLY;
    const int flags = access | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    Target target;
    target.path = path;
    target.writable = options.writable;
    target.fd = FileDescriptor(::open(path.c_str(), flags | O_DIRECT));
    bool direct = target.fd.valid();
    if (!direct) {
      const int open_errno = errno;
      if (open_errno != EINVAL) return tutti::open_error("open", path, options.writable, open_errno);
      target.fd = FileDescriptor(::open(path.c_str(), flags));  // O_DIRECT refused: open plainly to learn more
      if (!target.fd.valid()) return tutti::open_error("open", path, options.writable, errno);
    }
    TUTTI_RETURN_IF_ERROR(clear_nonblock(target.fd.get(), path));
    target.filesystem = detail::filesystem_of(target.fd.get());

    struct stat info {};
    if (::fstat(target.fd.get(), &info) != 0) return tutti::open_error("fstat", path, options.writable, errno);
    if (!S_ISREG(info.st_mode))
      return error(StatusCode::INVALID_ARGUMENT, "'{}' is not a regular file (it changed while being opened)", path);
    target.size = static_cast<std::uint64_t>(info.st_size);

    if (direct) {
      // statx STATX_DIOALIGN first; an offset alignment of 0 there means "no direct IO on this file".
      struct statx extended {};
      if (::statx(target.fd.get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &extended) == 0 &&
          (extended.stx_mask & STATX_DIOALIGN) != 0) {
        if (extended.stx_dio_offset_align == 0) {
          direct = false;
        } else {
          target.direct_io_alignment = extended.stx_dio_offset_align;
          target.direct_io_memory_alignment =
              extended.stx_dio_mem_align ? extended.stx_dio_mem_align : extended.stx_dio_offset_align;
          target.alignment_source = AlignmentSource::statx;
        }
      } else if (const std::uint32_t block = detail::logical_block_size(info.st_dev); block > 0) {
        target.direct_io_alignment = target.direct_io_memory_alignment = block;
        target.alignment_source = AlignmentSource::block_device;
      } else if (const std::uint32_t probed = detail::probe_direct_io_alignment(target.fd.get()); probed > 0) {
        target.direct_io_alignment = target.direct_io_memory_alignment = probed;
        target.alignment_source = AlignmentSource::probe;
      } else {
        direct = false;
      }
    }

    if (!direct) {
      if (!options.allow_buffered)
        return error(StatusCode::UNSUPPORTED,
                     "'{}' is on {}, which does not support O_DIRECT; set OpenOptions::allow_buffered to use the "
                     "page cache explicitly",
                     path, target.filesystem);
      if (target.fd.valid() && (::fcntl(target.fd.get(), F_GETFL) & O_DIRECT) != 0) {
        target.fd = FileDescriptor(::open(path.c_str(), access | O_CLOEXEC | O_NOCTTY));  // drop O_DIRECT
        if (!target.fd.valid()) return tutti::open_error("open", path, options.writable, errno);
      }
      target.direct = false;
      target.direct_io_alignment = target.direct_io_memory_alignment = 1;
      target.alignment_source = AlignmentSource::buffered;
      return Result<Target>(std::move(target));
    }
    target.direct = true;
    if (options.writable) TUTTI_RETURN_IF_ERROR(open_tail_descriptor(target));
    return Result<Target>(std::move(target));
  }

 private:
  /// Opens the tail descriptor of a writable O_DIRECT target (see the file comment). Missing
  /// /proc/self/fd is recorded in tail_fd_error; any other errno fails the open.
  static Status open_tail_descriptor(Target& target) {
    const std::string proc_path = fmt::format("/proc/self/fd/{}", target.fd.get());
    target.tail_fd = FileDescriptor(::open(proc_path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY));
    if (target.tail_fd.valid()) return Status::success();
    const int error_number = errno;
    const std::string context =
        fmt::format("open '{}' (the tail descriptor of '{}', for unaligned WRITEs at its end)", proc_path, target.path);
    if (error_number != ENOENT) return status_from_errno(error_number, context);
    target.tail_fd_error = fmt::format("{}: {}; is /proc mounted?", context, errno_text(error_number));
    return Status::success();
  }

  static Status clear_nonblock(int fd, const std::string& path) {
    const int current = ::fcntl(fd, F_GETFL);
    if (current < 0 || ::fcntl(fd, F_SETFL, current & ~O_NONBLOCK) != 0) {
      const int e = errno;
      return status_from_errno(e, fmt::format("fcntl on '{}'", path));
    }
    return Status::success();
  }
};

}  // namespace tutti::file
