// The local_file resolver: `file:///absolute/path` -> extents of that file on one NVMe namespace
// (tutti::local_file::Target, include/tutti/bind/local_file.hpp), through FIEMAP.
//
// Configuration (Resolver::Options): the block device that backs the namespace's file system
// (a path such as /dev/nvme0n1p1 or /dev/loop3, or its dev_t), the partition's start offset (read
// from sysfs /sys/dev/block/MAJ:MIN/start * 512 when the device is a partition, unless given),
// the namespace's LBA size and NSID.
//
// resolve(uri, options):
//  1. parse_uri + percent-decoding; INVALID_ARGUMENT for another scheme, a host/authority
//     (file://host/x, which is also how a relative "file://dir/x" parses), an empty path, a path
//     that is not absolute, or any query key;
//  2. open(O_DIRECT | O_RDONLY, or O_RDWR when options.writable; O_CLOEXEC): UNSUPPORTED (EINVAL: no
//     O_DIRECT on that file system), every other errno as tutti/core/errno.hpp classifies it for all
//     resolvers (NOT_FOUND for ENOENT, INVALID_ARGUMENT for EROFS / EACCES / EISDIR ...: docs/api.md);
//     INVALID_ARGUMENT when it is not a regular file;
//  3. the change guard (Options::change_protection, bind/local_file/change_guard.hpp): sets
//     FS_IMMUTABLE_FL when the process may and watches the file with inotify, before the extents
//     are read, so they cannot change unnoticed from here on; BUSY when a writable open finds the
//     file immutable (another process serves it, or one that did ended without clearing it:
//     `chattr -i`), the guard's errors when the file can be neither made immutable nor watched;
//  4. fsync per Options::fsync_policy (default: writable opens only, see FsyncPolicy), then
//     FIEMAP with FIEMAP_FLAG_SYNC (writes dirty data back, resolves delayed allocation) over
//     [0, st_size), kFiemapExtentsPerCall extents per ioctl, as many calls as needed (no cap);
//  5. fail closed, with the file offset in the message:
//       UNSUPPORTED  no FIEMAP (tmpfs, overlayfs: EOPNOTSUPP/ENOTTY), the file is not on the
//                    configured block device (st_dev != the device's st_rdev), inline or
//                    tail-packed data, encoded or encrypted extents, FIEMAP_EXTENT_NOT_ALIGNED,
//                    shared (reflinked) extents when opened writable, device offsets or lengths
//                    not multiples of the LBA size, unknown location;
//       DATA_LOSS    holes (no extent maps an offset below EOF), unwritten (preallocated)
//                    extents, delayed allocation that FIEMAP_FLAG_SYNC did not resolve;
//  6. adjacent extents contiguous on the device are merged; the open fd becomes the lease, and the
//     guard goes with it (released when the target is destroyed or closed).
// The whole algorithm and the lease's limits: docs/local-nvme.md.
//
// Thread-safety: resolve() is const and may be called from many threads at once (open_batch).
#pragma once

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tutti/bind/local_file.hpp>
#include <tutti/core/errno.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/uri.hpp>

namespace tutti::local_file {

/// Extents requested per FS_IOC_FIEMAP call (the walk repeats until EOF; there is no total cap).
inline constexpr std::uint32_t kFiemapExtentsPerCall = 256;

/// Reads a partition's start offset in bytes from sysfs: <sysfs_root>/dev/block/MAJ:MIN/start
/// (in 512-byte sectors, whatever the LBA size) when <...>/partition exists, else 0 (a whole
/// disk). When <sysfs_root>/dev/block is not populated (some containers), the device is looked
/// up by its "dev" file under <sysfs_root>/class/block/*/. Errors: UNSUPPORTED when the device is
/// in neither place (set Resolver::Options::partition_start_bytes instead), DEVICE_ERROR when
/// the start file cannot be parsed. Thread-safety: reentrant.
inline Result<std::uint64_t> read_partition_start(dev_t device, const std::string& sysfs_root = "/sys") {
  namespace fs = std::filesystem;
  const std::string id = std::to_string(major(device)) + ":" + std::to_string(minor(device));
  std::error_code ec;
  fs::path dir = fs::path(sysfs_root) / "dev" / "block" / id;
  if (!fs::exists(dir / "dev", ec)) {
    dir.clear();
    for (const auto& entry : fs::directory_iterator(fs::path(sysfs_root) / "class" / "block", ec)) {
      std::ifstream dev_file(entry.path() / "dev");
      std::string text;
      if (dev_file >> text && text == id) {
        dir = entry.path();
        break;
      }
    }
    if (dir.empty())
      return error(StatusCode::UNSUPPORTED,
                   "block device {} is not listed under {}/dev/block or {}/class/block; set "
                   "local_file::LocalFileResolver::Options::partition_start_bytes explicitly",
                   id, sysfs_root, sysfs_root);
  }
  if (!fs::exists(dir / "partition", ec)) return std::uint64_t{0};
  std::ifstream start_file(dir / "start");
  std::uint64_t sectors = 0;
  if (!(start_file >> sectors))
    return error(StatusCode::DEVICE_ERROR, "cannot read the partition start of block device {} from {}", id,
                 (dir / "start").string());
  return sectors * 512;
}

/// When resolve() calls fsync before FIEMAP. FIEMAP_FLAG_SYNC always writes the file's dirty
/// data back and resolves delayed allocation, which is all a read needs (the bytes are on the
/// device at the mapped LBAs). fsync adds the journal commit of the block allocation and a device
/// cache flush, so that NVMe writes into those blocks survive a crash together with their
/// allocation; it costs a cache flush per open (about 2 ms on a loop device, 100x the FIEMAP walk).
enum class FsyncPolicy : std::uint8_t {
  always,          ///< fsync every file before FIEMAP
  writable_opens,  ///< fsync only files opened with OpenOptions::writable (default)
  never,           ///< rely on FIEMAP_FLAG_SYNC alone
};
inline constexpr FsyncPolicy kDefaultFsyncPolicy = FsyncPolicy::writable_opens;

/// Resolver for file:// URIs on one NVMe namespace. Copyable (plain configuration).
class LocalFileResolver {
 public:
  using target_type = Target;
  static constexpr std::string_view scheme = "file";

  /// Settings. Defaults: lba_size kDefaultLbaSize, nsid 1, sysfs_root "/sys", partition start read
  /// from sysfs.
  struct Options {
    static constexpr std::uint32_t kDefaultLbaSize = 4096;
    /// The block device holding the file system (e.g. "/dev/nvme0n1p2", "/dev/loop3"); used when
    /// `device` is 0.
    std::string block_device_path;
    /// The block device as a dev_t (major:minor), instead of block_device_path.
    dev_t device = 0;
    /// Bytes from the start of the namespace to the start of the block device (a partition's
    /// offset). Unset: read from sysfs (read_partition_start).
    std::optional<std::uint64_t> partition_start_bytes;
    /// The namespace's LBA size in bytes (512 or 4096): the alignment every extent must meet.
    std::uint32_t lba_size = kDefaultLbaSize;
    /// NVMe Namespace Identifier written into the payload (1-based).
    std::uint32_t nsid = 1;
    /// Where sysfs is mounted (tests point it at a fake tree).
    std::string sysfs_root = "/sys";
    /// When to fsync the file before the FIEMAP walk (kDefaultFsyncPolicy: writable opens).
    FsyncPolicy fsync_policy = kDefaultFsyncPolicy;
    /// How an open file is kept from changing under its extents (kDefaultChangeProtection:
    /// FS_IMMUTABLE_FL where permitted, and an inotify watch; docs/local-nvme.md, "A file changed
    /// under local_nvme").
    ChangeProtection change_protection = kDefaultChangeProtection;
  };

  /// Validates the options and finds the device. Errors: INVALID_ARGUMENT (lba_size not 512 or
  /// 4096, nsid 0, neither path nor dev_t given, path is not a block device), NOT_FOUND (no such
  /// path), UNSUPPORTED / DEVICE_ERROR from read_partition_start.
  static Result<LocalFileResolver> create(Options options) {
    if (options.lba_size != 512 && options.lba_size != 4096)
      return error(StatusCode::INVALID_ARGUMENT, "local_file: lba_size = {} must be 512 or 4096 bytes",
                   options.lba_size);
    if (options.nsid == 0) return error(StatusCode::INVALID_ARGUMENT, "local_file: nsid = 0 is not a valid NSID");
    if (options.device == 0) {
      if (options.block_device_path.empty())
        return error(StatusCode::INVALID_ARGUMENT,
                     "local_file: set block_device_path or device (the block device of the namespace)");
      struct stat st {};
      if (::stat(options.block_device_path.c_str(), &st) != 0) {
        const int e = errno;
        return status_from_errno(e, fmt::format("local_file: block_device_path '{}'", options.block_device_path));
      }
      if (!S_ISBLK(st.st_mode))
        return error(StatusCode::INVALID_ARGUMENT, "local_file: block_device_path '{}' is not a block device",
                     options.block_device_path);
      options.device = st.st_rdev;
    }
    if (!options.partition_start_bytes) {
      auto start = read_partition_start(options.device, options.sysfs_root);
      if (!start) return start.status();
      options.partition_start_bytes = *start;
    }
    if (*options.partition_start_bytes % options.lba_size != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_file: partition start {} is not a multiple of the {}-byte LBA size",
                   *options.partition_start_bytes, options.lba_size);
    return LocalFileResolver(std::move(options));
  }

  /// The effective options (device and partition start filled in).
  const Options& options() const noexcept { return options_; }

  /// Resolves `text` to the extents of the file; see the file comment for every error.
  Result<Target> resolve(std::string_view text, const OpenOptions& open_options) const {
    auto uri = parse_uri(text);
    if (!uri) return uri.status();
    if (uri->scheme != scheme)
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has scheme '{}'; the local_file resolver serves 'file'",
                   text, uri->scheme);
    if (!uri->authority.empty() && uri->authority != "localhost")
      return error(StatusCode::INVALID_ARGUMENT,
                   "uri '{}' names host or relative path '{}'; use file:///absolute/path (relative paths and remote "
                   "hosts are not supported)",
                   text, uri->authority);
    if (!uri->query.empty())
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}': file URIs take no query (got key '{}')", text,
                   uri->query.front().first);
    if (uri->path.empty() || uri->path == "/")
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}' has an empty path; expected file:///absolute/path", text);
    if (uri->path.front() != '/')
      return error(StatusCode::INVALID_ARGUMENT, "uri '{}': path '{}' is relative; expected an absolute path", text,
                   uri->path);
    return resolve_path(uri->path, open_options);
  }

  /// Steps 2-5 of resolve() for an absolute, decoded path.
  Result<Target> resolve_path(const std::string& path, const OpenOptions& open_options) const {
    struct stat pre {};
    if (::stat(path.c_str(), &pre) == 0 && !S_ISREG(pre.st_mode))
      return error(StatusCode::INVALID_ARGUMENT, "'{}' is not a regular file", path);
    const int flags = (open_options.writable ? O_RDWR : O_RDONLY) | O_DIRECT | O_CLOEXEC;
    FileLease lease(::open(path.c_str(), flags));
    // A read-write open of a file this process serves, and so made immutable, opens it while the
    // flag is briefly cleared (change_guard.hpp); a file made immutable by anyone else stays refused.
    if (!lease.valid() && errno == EPERM && open_options.writable)
      lease = FileLease(detail::ChangeMonitor::instance()->open_owned_immutable(path, flags));
    if (!lease.valid()) {
      const int e = errno;
      if (e == EINVAL)
        return error(StatusCode::UNSUPPORTED, "'{}': the file system does not support O_DIRECT (open: {})", path,
                     errno_text(e));
      if (e == EPERM && is_immutable(path))
        return error(StatusCode::BUSY,
                     "'{}' is immutable (FS_IMMUTABLE_FL), so it cannot be opened read-write: a local_nvme target of "
                     "another process holds it, or a process that held one ended without clearing the flag; when no "
                     "process serves the file, `chattr -i {}` clears it",
                     path, path);
      return open_error("open", path, open_options.writable, e);
    }
    struct stat st {};
    if (::fstat(lease.get(), &st) != 0) return open_error("fstat", path, open_options.writable, errno);
    if (!S_ISREG(st.st_mode)) return error(StatusCode::INVALID_ARGUMENT, "'{}' is not a regular file", path);
    auto guard = ChangeGuard::create(lease.get(), path, options_.change_protection);  // ends before the lease
    if (!guard) return guard.status();
    // The size as the guard holds it (the file may have changed between the first fstat and the guard).
    if (::fstat(lease.get(), &st) != 0) return open_error("fstat", path, open_options.writable, errno);
    const bool fsync_now = options_.fsync_policy == FsyncPolicy::always ||
                           (options_.fsync_policy == FsyncPolicy::writable_opens && open_options.writable);
    if (fsync_now && ::fsync(lease.get()) != 0 && errno != EINVAL) {
      const int e = errno;
      return status_from_errno(e, fmt::format("fsync '{}'", path));
    }

    Target target;
    target.path = path;
    target.file_size = static_cast<std::uint64_t>(st.st_size);
    target.lba_size = options_.lba_size;
    target.nsid = options_.nsid;
    target.block_device = options_.device;
    target.partition_start = *options_.partition_start_bytes;
    target.writable = open_options.writable;
    TUTTI_RETURN_IF_ERROR(walk_fiemap(lease.get(), path, target, open_options.writable));
    if (st.st_dev != options_.device)
      return error(StatusCode::UNSUPPORTED,
                   "'{}' (file offset 0) lives on block device {}:{}, not on the namespace's block device {}:{}", path,
                   major(st.st_dev), minor(st.st_dev), major(options_.device), minor(options_.device));
    TUTTI_RETURN_IF_ERROR(target.validate());
    poll_changes();
    if (guard->changed())
      return error(StatusCode::DATA_LOSS, "'{}' changed while its extents were read: {}; open it again", path,
                   guard->watch().what());
    target.lease = std::move(lease);
    target.guard = std::move(guard.value());
    return Result<Target>(std::move(target));  // explicit: nvcc does not move implicitly into a Result
  }

 private:
  explicit LocalFileResolver(Options options) : options_(std::move(options)) {}

  /// FS_IMMUTABLE_FL is set on the file at `path` (false when it cannot be read).
  static bool is_immutable(const std::string& path) {
    FileLease probe(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    int flags = 0;
    return probe.valid() && ::ioctl(probe.get(), FS_IOC_GETFLAGS, &flags) == 0 && (flags & FS_IMMUTABLE_FL) != 0;
  }

  /// FIEMAP over [0, file_size) in as many calls as needed; fills target.extents (merged).
  Status walk_fiemap(int fd, const std::string& path, Target& target, bool writable) const {
    const std::uint64_t size = target.file_size;
    if (size == 0) return Status::success();
    std::vector<std::uint64_t> storage((sizeof(fiemap) + kFiemapExtentsPerCall * sizeof(fiemap_extent)) / 8 + 1);
    auto* map = reinterpret_cast<fiemap*>(storage.data());
    std::uint64_t next = 0;  // first file offset not yet mapped
    bool last_seen = false;
    while (next < size && !last_seen) {
      std::memset(map, 0, sizeof(fiemap));
      map->fm_start = next;
      map->fm_length = size - next;
      map->fm_flags = FIEMAP_FLAG_SYNC;
      map->fm_extent_count = kFiemapExtentsPerCall;
      if (::ioctl(fd, FS_IOC_FIEMAP, map) != 0) {
        const int e = errno;
        if (e == EOPNOTSUPP || e == ENOTTY || e == EINVAL)
          return error(StatusCode::UNSUPPORTED,
                       "'{}' (file offset {}): the file system does not support FIEMAP ({}), so its extents cannot be "
                       "found",
                       path, next, errno_text(e));
        return status_from_errno(e, fmt::format("'{}' (file offset {}): FIEMAP", path, next));
      }
      if (map->fm_mapped_extents == 0) break;  // the rest is a hole: reported below
      for (std::uint32_t i = 0; i < map->fm_mapped_extents; ++i) {
        const fiemap_extent& fe = map->fm_extents[i];
        TUTTI_RETURN_IF_ERROR(check_extent(fe, path, next, writable));
        if (fe.fe_logical > next)
          return error(StatusCode::DATA_LOSS, "'{}': hole at file offset {} ({} bytes unmapped)", path, next,
                       fe.fe_logical - next);
        const std::uint64_t device_offset = *options_.partition_start_bytes + fe.fe_physical;
        if (device_offset % target.lba_size != 0 || fe.fe_length % target.lba_size != 0 ||
            fe.fe_logical % target.lba_size != 0)
          return error(StatusCode::UNSUPPORTED,
                       "'{}': extent at file offset {} (device offset {}, length {}) is not aligned to the {}-byte LBA "
                       "size",
                       path, fe.fe_logical, device_offset, fe.fe_length, target.lba_size);
        // An extent that starts before `next` overlaps what we mapped (FIEMAP returns whole
        // extents intersecting fm_start): keep only the part from `next` on.
        const std::uint64_t skip = next > fe.fe_logical ? next - fe.fe_logical : 0;
        if (skip >= fe.fe_length) continue;
        Extent extent{fe.fe_logical + skip, device_offset + skip, fe.fe_length - skip};
        Extent* back = target.extents.empty() ? nullptr : &target.extents.back();
        if (back != nullptr && back->file_end() == extent.file_offset &&
            back->device_offset + back->length == extent.device_offset)
          back->length += extent.length;  // contiguous in the file and on the device: merge
        else
          target.extents.push_back(extent);
        next = target.extents.back().file_end();
        if (fe.fe_flags & FIEMAP_EXTENT_LAST) last_seen = true;
      }
    }
    if (next < size)
      return error(StatusCode::DATA_LOSS, "'{}': hole at file offset {} (no extent up to the end of file {})", path,
                   next, size);
    return Status::success();
  }

  /// Fail-closed checks of one extent's flags (see the file comment).
  static Status check_extent(const fiemap_extent& fe, const std::string& path, std::uint64_t next, bool writable) {
    const std::uint64_t at = fe.fe_logical > next ? fe.fe_logical : next;
    const std::uint32_t f = fe.fe_flags;
    if (f & FIEMAP_EXTENT_UNWRITTEN)
      return error(StatusCode::DATA_LOSS,
                   "'{}': unwritten (preallocated) extent at file offset {}: its blocks hold stale bytes the file "
                   "system reads as zeros",
                   path, at);
    if (f & FIEMAP_EXTENT_DELALLOC)
      return error(StatusCode::DATA_LOSS,
                   "'{}': delayed-allocation extent at file offset {} has no device location yet", path, at);
    if (f & (FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DATA_TAIL))
      return error(StatusCode::UNSUPPORTED, "'{}': inline or tail-packed data at file offset {} has no LBA of its own",
                   path, at);
    if (f & (FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED))
      return error(StatusCode::UNSUPPORTED, "'{}': encoded or encrypted extent at file offset {}", path, at);
    if (f & FIEMAP_EXTENT_NOT_ALIGNED)
      return error(StatusCode::UNSUPPORTED, "'{}': extent at file offset {} is not block aligned", path, at);
    if (f & FIEMAP_EXTENT_UNKNOWN)
      return error(StatusCode::UNSUPPORTED, "'{}': extent at file offset {} has an unknown location", path, at);
    if (writable && (f & FIEMAP_EXTENT_SHARED))
      return error(StatusCode::UNSUPPORTED,
                   "'{}': shared (reflinked) extent at file offset {}: writing it in place would change other files",
                   path, at);
    return Status::success();
  }

  Options options_;
};

}  // namespace tutti::local_file
