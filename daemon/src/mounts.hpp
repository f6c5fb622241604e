// The file systems of the namespaces tuttid serves (docs/daemon.md, "Mounts"). A namespace listed with a
// mount point in the configuration is, at bring-up, either
//   - verified: something is mounted there already, and it must be the namespace's file system: mounted
//     from the namespace's block device (an snvme namespace, or a soft image that is a block device), or
//     from a loop device whose backing file is the soft controller's image (same device and inode,
//     LOOP_GET_STATUS64; the whole image: offset 0, no shorter size limit, not a partition), with the
//     configured file system type; or
//   - mounted by tuttid: nothing is mounted there, so tuttid attaches the image to a free loop device
//     (LOOP_CTL_GET_FREE, then LOOP_CONFIGURE, or LOOP_SET_FD + LOOP_SET_STATUS64 on kernels before 5.8;
//     read-write, buffered, LO_FLAGS_AUTOCLEAR: the loop device and the soft controller share the image's page cache),
//     or takes the block device as it is, and mounts it with the configured file system (MS_NOSUID | MS_NODEV |
//     MS_NOATIME).
// An image another loop device already has as backing file is refused (all but the verified mount), so one
// image is never mounted twice; ImageLock holds an flock on a soft controller's image (a PCI controller's
// /dev/snvmeX) while it is up.
// At stop, release() unmounts what tuttid mounted (retrying while busy, up to the timeout, then a lazy
// unmount) and detaches the loop device it attached. A verified mount is left as it was.
// Every wait is bounded by MountRequest::timeout_ns. Errors name the configuration key path.
// Reused by every kind of controller: soft controllers pass their image, PCI controllers the block device
// of the namespace (/dev/snvmeXnY).
// Thread-safety: one thread uses a NamespaceMount; mount_or_verify may run on several threads for different
// mount points.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <tutti/core/status.hpp>

#include "config.hpp"

namespace tutti::daemon {

/// Longest any one step of mounting or unmounting waits: a loop attach racing other attaches, an unmount
/// while a process still has files open, a loop device's detach.
inline constexpr std::uint64_t kDefaultMountTimeoutNs = 5'000'000'000;

/// One line of /proc/self/mountinfo (proc(5)): the one parser of tuttid's mounts, soft and PCI.
struct MountEntry {
  std::string id;     ///< the mount ID (first field): unique among the mounts present
  std::string point;  ///< where, unescaped
  dev_t device = 0;
  std::string filesystem;  ///< the type: "ext4"
  std::string source;      ///< as mounted: "/dev/loop3"
};

/// Every mount of /proc/self/mountinfo, in its order (a later mount at a point is on top of earlier ones).
std::vector<MountEntry> mount_table();

/// The mount on top at `mount_point` (spelled as the kernel lists it: canonical, no trailing slash); nullopt
/// when nothing is mounted there.
std::optional<MountEntry> mounted_at(const std::string& mount_point);

/// What to mount (or find mounted) where.
struct MountRequest {
  std::string key;          ///< the namespace's key path, for errors: "controllers[0].namespaces[0]"
  std::uint32_t nsid = 1;   ///< the namespace (reported back by NamespaceMount::nsid)
  std::string mount_point;  ///< absolute; created (mode 0755) when missing and nothing is mounted there
  std::string filesystem;   ///< "ext4" or "xfs" (config.hpp)
  /// Where the file system lives: a block device (mounted as it is) or a regular file (loop-attached).
  std::string source;
  std::string source_key;  ///< the key that named `source`, for errors: "controllers[0].soft.image"
  std::uint64_t timeout_ns = kDefaultMountTimeoutNs;
};

/// A namespace's file system as tuttid found or mounted it. Move-only; the destructor releases (errors
/// dropped: call release() to see them).
class NamespaceMount {
 public:
  /// Verifies what is mounted at request.mount_point, or mounts request.source there (see the file comment).
  /// Errors (each naming request.key or request.source_key, the value and what was expected):
  /// INVALID_ARGUMENT (a mount of another device, file system type or image there; the image attached to
  /// another loop device; a loop device with an offset or a size limit, a partition; source neither a block
  /// device nor a regular file; the mount point not an absolute path, not a folder
  /// or under a file that is not a folder; a verified mount read-only; timeout_ns 0), NOT_FOUND (source
  /// missing), DEVICE_ERROR (a loop or mount system call failed: its errno text, with a hint for EINVAL, e.g. no such
  /// file system on the image), TIMEOUT (no free loop device within the timeout).
  static Result<NamespaceMount> mount_or_verify(const MountRequest& request);

  NamespaceMount() = default;
  NamespaceMount(NamespaceMount&& other) noexcept { *this = std::move(other); }
  NamespaceMount& operator=(NamespaceMount&& other) noexcept;
  NamespaceMount(const NamespaceMount&) = delete;
  NamespaceMount& operator=(const NamespaceMount&) = delete;
  ~NamespaceMount();

  /// Unmounts what mount_or_verify mounted and detaches the loop device it attached; nothing for a verified
  /// mount. Only while the top mount at the mount point is still the one it made (same mount ID and device):
  /// another mount on top is left alone, with a DEVICE_ERROR saying so. An unmount refused with EBUSY (a process has
  /// files open there) is retried every 20 ms until the timeout, then done lazily (MNT_DETACH: the file system goes
  /// once its last file closes; the loop device, set to clear itself, with it). Returns the first error (TIMEOUT for
  /// the lazy case, DEVICE_ERROR for a failed call); releasing twice does nothing.
  Status release();

  const std::string& key() const noexcept { return key_; }
  std::uint32_t nsid() const noexcept { return nsid_; }
  const std::string& mount_point() const noexcept { return mount_point_; }
  const std::string& filesystem() const noexcept { return filesystem_; }
  /// The block device the file system is mounted from: "/dev/loop3", "/dev/snvme0n1".
  const std::string& block_device() const noexcept { return block_device_; }
  /// Its device number (a file on the file system has it as st_dev).
  dev_t device() const noexcept { return device_; }
  /// Whether the mount is still the one found or made at bring-up: the top mount at mount_point() from
  /// device(), and for an image its loop device still backed by the image (device, inode) at offset 0 (the
  /// descriptor held on the device keeps a self-clearing loop device from being freed and reused meanwhile).
  /// INVALID_ARGUMENT naming the key, what is there now and what was there.
  Status recheck() const;
  /// "mounted" (by this tuttid, released at stop) or "verified" (found mounted, left alone).
  std::string_view state() const noexcept { return mounted_here_ ? "mounted" : "verified"; }

 private:
  std::string key_, mount_point_, filesystem_, block_device_;
  std::uint32_t nsid_ = 1;
  dev_t device_ = 0;
  bool mounted_here_ = false;
  bool loop_attached_here_ = false;
  std::string mount_id_;  ///< of the mount tuttid made (mountinfo's first field): release() unmounts only it
  int device_fd_ = -1;    ///< block_device(), open while tuttid serves the mount
  std::pair<dev_t, ino_t> image_{0, 0};  ///< a loop device's backing file; inode 0: not a loop device
  std::uint64_t timeout_ns_ = kDefaultMountTimeoutNs;
};

/// An exclusive flock(2) (LOCK_EX | LOCK_NB) on a soft controller's image, or a PCI controller's /dev/snvmeX,
/// held while the controller runs, so that two tuttids never serve (and mount) one image or controller.
/// Move-only; the lock goes with the object.
class ImageLock {
 public:
  /// Locks `image` (named by configuration key `key`), opened read-only. Errors: NOT_FOUND (no such file),
  /// BUSY (another process holds the lock: another tuttid serves it), DEVICE_ERROR (open or flock failed).
  static Result<ImageLock> acquire(const std::string& image, const std::string& key);
  /// The locked file's descriptor (read-only), -1 when empty.
  int fd() const noexcept { return fd_; }
  ImageLock() = default;
  ImageLock(ImageLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ImageLock& operator=(ImageLock&& other) noexcept;
  ImageLock(const ImageLock&) = delete;
  ImageLock& operator=(const ImageLock&) = delete;
  ~ImageLock();

 private:
  int fd_ = -1;
};

/// The mounts of the namespaces of controller `index` of the configuration that list a mount point, in
/// their order. `source_of(nsid)` gives where a namespace's file system lives (a soft controller: its
/// image; a PCI controller: /dev/snvmeXnY) and the key naming it, or an error. All or none: a failure
/// releases the mounts made before it.
Result<std::vector<NamespaceMount>> mount_namespaces(
    const ControllerConfig& config, std::size_t index,
    const std::function<Result<std::pair<std::string, std::string>>(std::uint32_t nsid)>& source_of,
    std::uint64_t timeout_ns = kDefaultMountTimeoutNs);

/// A namespace as the protocol reports it (devices, acquire): nsid, mount, filesystem, and, when its file
/// system is mounted (`mount` not null), block_device and mount_state ("mounted" or "verified").
nlohmann::json namespace_json(const NamespaceConfig& config, const NamespaceMount* mount);

}  // namespace tutti::daemon
