// The namespaces' file systems: see mounts.hpp.
#include "mounts.hpp"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>

namespace tutti::daemon {
namespace {

namespace fs = std::filesystem;

constexpr auto kRetryInterval = std::chrono::milliseconds(20);

/// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// mountinfo's octal escapes (\040 for a space) undone.
std::string unescape(const std::string& field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    auto digit = [&](std::size_t k, char highest) { return field[k] >= '0' && field[k] <= highest; };
    const bool octal =
        field[i] == '\\' && i + 3 < field.size() && digit(i + 1, '3') && digit(i + 2, '7') && digit(i + 3, '7');
    if (!octal) {
      out += field[i];
      continue;
    }
    out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
    i += 3;
  }
  return out;
}

/// Where block device `device` is mounted ("'/mnt/a'"), for messages; "not mounted" when nowhere.
std::string mounted_where(dev_t device) {
  for (const auto& entry : mount_table())
    if (entry.device == device) return "mounted at '" + entry.point + "'";
  return "not mounted";
}

std::string device_text(dev_t device) { return fmt::format("{}:{}", major(device), minor(device)); }

/// "/dev/<kernel name>" of block device `device` (from /sys/dev/block/MAJ:MIN), or "MAJ:MIN" when sysfs
/// does not list it.
std::string device_node(dev_t device) {
  std::error_code ec;
  const fs::path link = fs::read_symlink(fmt::format("/sys/dev/block/{}", device_text(device)), ec);
  return ec ? device_text(device) : "/dev/" + link.filename().string();
}

/// LOOP_GET_STATUS64 of loop device `node`; nullopt when `node` is no loop device or has no backing file.
std::optional<loop_info64> loop_status(const std::string& node) {
  Fd fd(::open(node.c_str(), O_RDONLY | O_CLOEXEC));
  loop_info64 info{};
  if (fd.fd < 0 || ::ioctl(fd.fd, LOOP_GET_STATUS64, &info) != 0) return std::nullopt;
  return info;
}

/// The backing file of loop device `node` as (device, inode) (LOOP_GET_STATUS64); nullopt when `node` is no
/// loop device or has no backing file.
std::optional<std::pair<dev_t, ino_t>> loop_backing(const std::string& node) {
  const auto info = loop_status(node);
  if (!info) return std::nullopt;
  // lo_device is the kernel's new_encode_dev (linux/kdev_t.h): minor bits 0-7 and 20-31, major bits 8-19.
  const auto encoded = static_cast<std::uint32_t>(info->lo_device);
  const dev_t device = makedev((encoded & 0xfff00u) >> 8, (encoded & 0xffu) | ((encoded >> 12) & 0xfff00u));
  return std::pair<dev_t, ino_t>(device, static_cast<ino_t>(info->lo_inode));
}

/// The backing file sysfs names for loop device `node` ("/dev/loop3"), for messages; "none" when it has none.
std::string loop_backing_name(const std::string& node) {
  std::ifstream in(fmt::format("/sys/block/{}/loop/backing_file", fs::path(node).filename().string()));
  std::string name;
  return std::getline(in, name) && !name.empty() ? "'" + name + "'" : std::string("none");
}

/// The attached loop devices ("/dev/loopN") whose backing file is (device, inode), from /sys/block (a
/// bound loop device has a loop/ folder there) and LOOP_GET_STATUS64.
std::vector<std::string> loops_backed_by(dev_t device, ino_t inode) {
  std::vector<std::string> nodes;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/block", ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("loop") || !fs::exists(entry.path() / "loop", ec)) continue;
    const auto backing = loop_backing("/dev/" + name);
    if (backing && backing->first == device && backing->second == inode) nodes.push_back("/dev/" + name);
  }
  return nodes;
}

/// INVALID_ARGUMENT when a loop device other than `except` ("" for none) has `source` (the image, stat
/// `image`) as backing file: its file system would be mounted twice, read-write, from one image.
Status refuse_other_loops(const MountRequest& r, const struct stat& image, const std::string& except) {
  for (const std::string& node : loops_backed_by(image.st_dev, image.st_ino)) {
    if (node == except) continue;
    struct stat st {};
    const std::string where = ::stat(node.c_str(), &st) == 0 ? mounted_where(st.st_rdev) : "state unknown";
    return error(StatusCode::INVALID_ARGUMENT,
                 "{}: {} '{}' is already attached to {} ({}): expected no other loop device of the image, so that "
                 "its file system is never mounted twice; unmount it and detach {} (losetup -d), or make {}.mount "
                 "that mount point",
                 r.key, r.source_key, r.source, node, where, node, r.key);
  }
  return Status::success();
}

/// Attaches `image` read-write to a free loop device; returns "/dev/loopN" and an open descriptor of it (the
/// device clears itself at its last close: keep it open until the file system is mounted). A device another process
/// takes between LOOP_CTL_GET_FREE and the attach (EBUSY) is skipped, until `deadline`.
Result<std::pair<std::string, int>> attach_loop(const MountRequest& r, int image_fd, std::uint64_t deadline) {
  Fd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (control.fd < 0)
    return error(StatusCode::DEVICE_ERROR, "{}: attaching {} '{}' to a loop device: open /dev/loop-control: {}", r.key,
                 r.source_key, r.source, std::strerror(errno));
  for (;;) {
    const int n = ::ioctl(control.fd, LOOP_CTL_GET_FREE);
    if (n < 0)
      return error(StatusCode::DEVICE_ERROR, "{}: attaching {} '{}': LOOP_CTL_GET_FREE: {}", r.key, r.source_key,
                   r.source, std::strerror(errno));
    const std::string node = fmt::format("/dev/loop{}", n);
    Fd loop(::open(node.c_str(), O_RDWR | O_CLOEXEC));
    int attached = -1, err = errno;
    if (loop.fd >= 0) {
      loop_config config{};
      config.fd = static_cast<std::uint32_t>(image_fd);
      // Cleared by the kernel at its last close (the unmount): a tuttid killed before release() leaves no
      // loop device behind once the admin unmounts.
      config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
      std::strncpy(reinterpret_cast<char*>(config.info.lo_file_name), r.source.c_str(), LO_NAME_SIZE - 1);
      attached = ::ioctl(loop.fd, LOOP_CONFIGURE, &config);
      err = errno;
      if (attached != 0 && (err == EINVAL || err == ENOTTY)) {  // before Linux 5.8: no LOOP_CONFIGURE
        attached = ::ioctl(loop.fd, LOOP_SET_FD, image_fd);
        err = errno;
        if (attached == 0) {
          loop_info64 info{};
          info.lo_flags = LO_FLAGS_AUTOCLEAR;
          std::strncpy(reinterpret_cast<char*>(info.lo_file_name), r.source.c_str(), LO_NAME_SIZE - 1);
          if (::ioctl(loop.fd, LOOP_SET_STATUS64, &info) != 0) {
            err = errno;
            (void)::ioctl(loop.fd, LOOP_CLR_FD, 0);
            attached = -1;
          }
        }
      }
    }
    if (attached == 0) return std::pair(node, std::exchange(loop.fd, -1));
    // EBUSY: another process attached it first; ENOENT: its node is not there yet. Both pass; others fail.
    if (err != EBUSY && err != ENOENT)
      return error(StatusCode::DEVICE_ERROR, "{}: attaching {} '{}' to {}: {}", r.key, r.source_key, r.source, node,
                   std::strerror(err));
    if (remaining_ns(deadline) == 0)
      return error(StatusCode::TIMEOUT, "{}: attaching {} '{}': no free loop device within {} ms ({}: {})", r.key,
                   r.source_key, r.source, r.timeout_ns / 1'000'000, node, std::strerror(err));
    std::this_thread::sleep_for(kRetryInterval);
  }
}

/// Detaches loop device `node` and waits (until `deadline`) until it has no backing file. A device still
/// open elsewhere is set to clear itself at its last close (the kernel's LOOP_CLR_FD does that).
Status detach_loop(const std::string& key, const std::string& node, std::uint64_t deadline) {
  {
    Fd loop(::open(node.c_str(), O_RDONLY | O_CLOEXEC));
    if (loop.fd < 0)
      return error(StatusCode::DEVICE_ERROR, "{}: detaching {}: open: {}", key, node, std::strerror(errno));
    if (::ioctl(loop.fd, LOOP_CLR_FD, 0) != 0 && errno != ENXIO)
      return error(StatusCode::DEVICE_ERROR, "{}: detaching {}: LOOP_CLR_FD: {}", key, node, std::strerror(errno));
  }  // closed: a clear the kernel deferred to the last close happens now
  while (loop_backing(node)) {
    if (remaining_ns(deadline) == 0)
      return error(StatusCode::TIMEOUT,
                   "{}: {} still has backing file {} after LOOP_CLR_FD (it detaches at its last "
                   "close)",
                   key, node, loop_backing_name(node));
    std::this_thread::sleep_for(kRetryInterval);
  }
  return Status::success();
}

}  // namespace

/// Every mount of /proc/self/mountinfo, in its order (a later mount at a point is on top of earlier ones).
std::vector<MountEntry> mount_table() {
  std::ifstream in("/proc/self/mountinfo");
  std::vector<MountEntry> table;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, numbers, root, point, field;
    if (!(fields >> id >> parent >> numbers >> root >> point)) continue;
    while (fields >> field && field != "-") {
    }
    MountEntry entry;
    entry.id = id;
    entry.point = unescape(point);
    unsigned major_number = 0, minor_number = 0;
    if (std::sscanf(numbers.c_str(), "%u:%u", &major_number, &minor_number) != 2) continue;
    entry.device = makedev(major_number, minor_number);
    if (!(fields >> entry.filesystem >> entry.source)) continue;
    entry.source = unescape(entry.source);
    table.push_back(std::move(entry));
  }
  return table;
}

/// The mount on top at `mount_point` (canonical); nullopt when nothing is mounted there.
std::optional<MountEntry> mounted_at(const std::string& mount_point) {
  std::optional<MountEntry> found;
  for (auto& entry : mount_table())
    if (entry.point == mount_point) found = std::move(entry);
  return found;
}

Result<NamespaceMount> NamespaceMount::mount_or_verify(const MountRequest& r) {
  const std::uint64_t deadline = deadline_after_ns(r.timeout_ns);
  if (r.timeout_ns == 0)
    return error(StatusCode::INVALID_ARGUMENT, "{}: MountRequest::timeout_ns = 0: every wait needs a bound", r.key);
  if (r.mount_point.empty() || r.mount_point.front() != '/')
    return error(StatusCode::INVALID_ARGUMENT, "{}.mount: '{}' is not an absolute path", r.key, r.mount_point);
  if (r.filesystem != "ext4" && r.filesystem != "xfs")
    return error(StatusCode::INVALID_ARGUMENT, "{}.filesystem: \"{}\" is not supported; expected \"ext4\" or \"xfs\"",
                 r.key, r.filesystem);
  struct stat source {};
  if (::stat(r.source.c_str(), &source) != 0) {
    const int e = errno;
    return error(e == ENOENT ? StatusCode::NOT_FOUND : StatusCode::DEVICE_ERROR, "{}: '{}': {}", r.source_key, r.source,
                 std::strerror(e));
  }
  const bool block = S_ISBLK(source.st_mode);
  if (!block && !S_ISREG(source.st_mode))
    return error(StatusCode::INVALID_ARGUMENT, "{}: '{}' is neither a block device nor a regular file (an image)",
                 r.source_key, r.source);
  std::error_code ec;
  const std::string point = fs::weakly_canonical(r.mount_point, ec).string();
  NamespaceMount m;
  m.key_ = r.key;
  m.nsid_ = r.nsid;
  m.mount_point_ = point.empty() ? r.mount_point : point;
  m.filesystem_ = r.filesystem;
  m.timeout_ns_ = r.timeout_ns;
  if (auto found = mounted_at(m.mount_point_)) {
    // Verify: the namespace's file system, from its device (or the image's loop device), of the right type.
    const std::string node = device_node(found->device);
    if (fs::exists(fmt::format("/sys/dev/block/{}/partition", device_text(found->device)), ec))
      return error(StatusCode::INVALID_ARGUMENT,
                   "{}.mount: '{}' is mounted from {} ({}), a partition: expected the whole device of {} '{}' (a "
                   "namespace's file system starts at its first LBA)",
                   r.key, m.mount_point_, node, device_text(found->device), r.source_key, r.source);
    if (block && found->device != source.st_rdev)
      return error(StatusCode::INVALID_ARGUMENT,
                   "{}.mount: '{}' is mounted from {} ({}), not from {} '{}' ({}): unmount it, or fix the mount point",
                   r.key, m.mount_point_, node, device_text(found->device), r.source_key, r.source,
                   device_text(source.st_rdev));
    if (!block) {
      const auto backing = loop_backing(node);
      if (!backing || backing->first != source.st_dev || backing->second != source.st_ino)
        return error(StatusCode::INVALID_ARGUMENT,
                     "{}.mount: '{}' is mounted as {} from {} ({}{}), not from a loop device of {} '{}': unmount "
                     "it, or fix the mount point",
                     r.key, m.mount_point_, found->filesystem, found->source, device_text(found->device),
                     backing ? ", backing file " + loop_backing_name(node) : std::string(), r.source_key, r.source);
      // The whole image, from its first byte: a loop device with an offset or a size limit shorter than the
      // image puts the file system (and every LBA a client resolves on it) elsewhere on the namespace.
      const auto info = loop_status(node);
      if (info && info->lo_offset != 0)
        return error(StatusCode::INVALID_ARGUMENT,
                     "{}.mount: '{}' is mounted from {}, which starts at offset {} of {} '{}': expected offset 0 "
                     "(the whole image; mount it without offset=)",
                     r.key, m.mount_point_, node, info->lo_offset, r.source_key, r.source);
      if (info && info->lo_sizelimit != 0 && info->lo_sizelimit < static_cast<std::uint64_t>(source.st_size))
        return error(StatusCode::INVALID_ARGUMENT,
                     "{}.mount: '{}' is mounted from {}, limited to {} bytes of {} '{}' ({} bytes): expected no size "
                     "limit (the whole image; mount it without sizelimit=)",
                     r.key, m.mount_point_, node, info->lo_sizelimit, r.source_key, r.source, source.st_size);
      if (Status other = refuse_other_loops(r, source, node); !other.is_ok()) return other;
    }
    if (found->filesystem != r.filesystem)
      return error(StatusCode::INVALID_ARGUMENT, "{}.filesystem: \"{}\", but '{}' is mounted as {} from {}", r.key,
                   r.filesystem, m.mount_point_, found->filesystem, node);
    struct statvfs fs_flags {};
    if (::statvfs(m.mount_point_.c_str(), &fs_flags) == 0 && (fs_flags.f_flag & ST_RDONLY) != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "{}.mount: '{}' is mounted read-only from {}: expected read-write (clients write their files "
                   "there); remount it rw",
                   r.key, m.mount_point_, node);
    m.block_device_ = node;
    m.device_ = found->device;
    if (!block) m.image_ = {source.st_dev, source.st_ino};
    // Held open: a loop device set to clear itself cannot be freed and reused while tuttid serves the mount.
    m.device_fd_ = ::open(node.c_str(), O_RDONLY | O_CLOEXEC);
    return m;
  }
  // Nothing mounted there: mount it.
  if (fs::exists(m.mount_point_, ec) && !fs::is_directory(m.mount_point_, ec))
    return error(StatusCode::INVALID_ARGUMENT, "{}.mount: '{}' exists and is not a folder", r.key, m.mount_point_);
  fs::create_directories(m.mount_point_, ec);
  if (ec == std::errc::not_a_directory)  // a parent is a regular file: the same mistake as above
    return error(StatusCode::INVALID_ARGUMENT, "{}.mount: '{}' lies under a file that is not a folder", r.key,
                 m.mount_point_);
  if (ec) return error(StatusCode::DEVICE_ERROR, "{}.mount: creating '{}': {}", r.key, m.mount_point_, ec.message());
  std::string node = r.source;
  if (!block) {
    if (Status other = refuse_other_loops(r, source, ""); !other.is_ok()) return other;
    Fd image(::open(r.source.c_str(), O_RDWR | O_CLOEXEC));
    if (image.fd < 0)
      return error(StatusCode::DEVICE_ERROR, "{}: opening '{}' read-write: {}", r.source_key, r.source,
                   std::strerror(errno));
    auto attached = attach_loop(r, image.fd, deadline);
    if (!attached) return attached.status();
    node = attached->first;
    m.device_fd_ = attached->second;
    m.image_ = {source.st_dev, source.st_ino};
    m.loop_attached_here_ = true;  // from here on the destructor detaches it
  }
  m.block_device_ = node;
  if (::mount(node.c_str(), m.mount_point_.c_str(), r.filesystem.c_str(), MS_NOSUID | MS_NODEV | MS_NOATIME, nullptr) !=
      0) {
    const int e = errno;
    return error(StatusCode::DEVICE_ERROR, "{}.mount: mount -t {} {} ({} '{}') on '{}': {}{}", r.key, r.filesystem,
                 node, r.source_key, r.source, m.mount_point_, std::strerror(e),
                 e == EINVAL
                     ? fmt::format(" (is there an {} file system on it? mkfs.{} makes one)", r.filesystem, r.filesystem)
                     : std::string());
  }
  m.mounted_here_ = true;
  if (auto made = mounted_at(m.mount_point_)) m.mount_id_ = made->id;  // what release() may unmount
  struct stat device {};
  if (::stat(node.c_str(), &device) == 0) m.device_ = device.st_rdev;
  if (m.device_fd_ < 0) m.device_fd_ = ::open(node.c_str(), O_RDONLY | O_CLOEXEC);
  return m;
}

NamespaceMount& NamespaceMount::operator=(NamespaceMount&& other) noexcept {
  if (this == &other) return *this;
  (void)release();
  key_ = std::move(other.key_);
  mount_point_ = std::move(other.mount_point_);
  filesystem_ = std::move(other.filesystem_);
  block_device_ = std::move(other.block_device_);
  nsid_ = other.nsid_;
  device_ = other.device_;
  mounted_here_ = std::exchange(other.mounted_here_, false);
  loop_attached_here_ = std::exchange(other.loop_attached_here_, false);
  device_fd_ = std::exchange(other.device_fd_, -1);
  mount_id_ = std::move(other.mount_id_);
  image_ = other.image_;
  timeout_ns_ = other.timeout_ns_;
  return *this;
}

NamespaceMount::~NamespaceMount() { (void)release(); }

Status NamespaceMount::release() {
  const std::uint64_t deadline = deadline_after_ns(timeout_ns_);
  Status first;
  if (std::exchange(mounted_here_, false)) {
    for (;;) {
      // Only the mount tuttid made: another one mounted on top since (or in its place) is left alone.
      const auto top = mounted_at(mount_point_);
      if (!top) break;  // unmounted meanwhile
      if (top->id != mount_id_ || top->device != device_) {
        first = error(StatusCode::DEVICE_ERROR,
                      "{}.mount: '{}' now has {} from {} on top (mount ID {}), not the mount tuttid made (mount ID "
                      "{}, {}): left mounted; unmount it, and tuttid's beneath it, by hand",
                      key_, mount_point_, top->filesystem, top->source, top->id, mount_id_, block_device_);
        break;
      }
      if (::umount2(mount_point_.c_str(), 0) == 0 || errno == EINVAL) break;  // EINVAL: unmounted meanwhile
      const int e = errno;
      if (e != EBUSY) {
        first = error(StatusCode::DEVICE_ERROR, "{}.mount: umount '{}': {}", key_, mount_point_, std::strerror(e));
        break;
      }
      if (remaining_ns(deadline) == 0) {
        // Busy past the timeout (a process has files open there), and still ours (checked above): detach it
        // from the tree now; the file system goes, and the loop device clears itself, once the last file
        // closes.
        (void)::umount2(mount_point_.c_str(), MNT_DETACH);
        first = error(StatusCode::TIMEOUT,
                      "{}.mount: '{}' still busy after {} ms (a process has files open there): unmounted lazily, it "
                      "goes when the last file closes",
                      key_, mount_point_, timeout_ns_ / 1'000'000);
        break;
      }
      std::this_thread::sleep_for(kRetryInterval);
    }
  }
  if (device_fd_ >= 0) ::close(std::exchange(device_fd_, -1));  // an autoclear loop device clears now
  if (std::exchange(loop_attached_here_, false)) {
    Status detached = detach_loop(key_, block_device_, first.is_ok() ? deadline : deadline_after_ns(0));
    if (!detached.is_ok() && first.is_ok()) first = detached;
  }
  return first;
}

Status NamespaceMount::recheck() const {
  if (mount_point_.empty()) return Status::success();
  const auto found = mounted_at(mount_point_);
  if (!found || found->device != device_)
    return error(StatusCode::INVALID_ARGUMENT,
                 "{}.mount: '{}' is {}, not from {} ({}) as at bring-up: the mount changed since; restart tuttid "
                 "once it is restored",
                 key_, mount_point_,
                 found ? fmt::format("now mounted from {} ({})", found->source, device_text(found->device))
                       : std::string("no longer mounted"),
                 block_device_, device_text(device_));
  if (image_.second != 0) {
    const auto info = loop_status(block_device_);
    const auto backing = loop_backing(block_device_);
    if (!info || !backing || *backing != image_ || info->lo_offset != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "{}.mount: {} now has backing file {} at offset {}, not the image (device {}, inode {}) at offset "
                   "0 as at bring-up: the mount changed since; restart tuttid once it is restored",
                   key_, block_device_, loop_backing_name(block_device_), info ? info->lo_offset : 0,
                   device_text(image_.first), image_.second);
  }
  return Status::success();
}

Result<ImageLock> ImageLock::acquire(const std::string& image, const std::string& key) {
  ImageLock lock;
  lock.fd_ = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
  if (lock.fd_ < 0) {
    const int e = errno;
    return error(e == ENOENT ? StatusCode::NOT_FOUND : StatusCode::DEVICE_ERROR, "{}: '{}': {}", key, image,
                 std::strerror(e));
  }
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK)
      return error(StatusCode::BUSY,
                   "{}: '{}' is locked (flock) by another process: another tuttid serves it; expected each "
                   "image or controller served by one tuttid",
                   key, image);
    return error(StatusCode::DEVICE_ERROR, "{}: flock '{}': {}", key, image, std::strerror(e));
  }
  return lock;
}

ImageLock& ImageLock::operator=(ImageLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ImageLock::~ImageLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

Result<std::vector<NamespaceMount>> mount_namespaces(
    const ControllerConfig& config, std::size_t index,
    const std::function<Result<std::pair<std::string, std::string>>(std::uint32_t nsid)>& source_of,
    std::uint64_t timeout_ns) {
  std::vector<NamespaceMount> mounts;
  for (std::size_t i = 0; i < config.namespaces.size(); ++i) {
    const NamespaceConfig& n = config.namespaces[i];
    if (n.mount.empty()) continue;
    const std::string key = fmt::format("controllers[{}].namespaces[{}]", index, i);
    auto source = source_of(n.nsid);
    if (!source) return source.status().with_context(key);
    auto mount = NamespaceMount::mount_or_verify({.key = key,
                                                  .nsid = n.nsid,
                                                  .mount_point = n.mount,
                                                  .filesystem = n.filesystem,
                                                  .source = source->first,
                                                  .source_key = source->second,
                                                  .timeout_ns = timeout_ns});
    if (!mount) return mount.status();  // the mounts made so far are released with `mounts`
    mounts.push_back(std::move(mount.value()));
  }
  return mounts;
}

nlohmann::json namespace_json(const NamespaceConfig& config, const NamespaceMount* mount) {
  nlohmann::json j{{"nsid", config.nsid}, {"mount", config.mount}, {"filesystem", config.filesystem}};
  if (mount != nullptr) {
    j["mount"] = mount->mount_point();  // canonical
    j["block_device"] = mount->block_device();
    j["mount_state"] = std::string(mount->state());
  }
  return j;
}

}  // namespace tutti::daemon
