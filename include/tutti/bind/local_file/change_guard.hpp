// The change guard of a local_file target: what keeps the file's block map fixed while a DataPath
// writes its LBAs directly, and what tells the DataPath when it was not (docs/local-nvme.md, "A
// file changed under local_nvme").
//
// local_nvme resolves a file's extents once and then reads and writes those LBAs without the file
// system. If the file is truncated and its blocks go to another file, a read through the old
// extents returns the other file's bytes and a write overwrites them. Two protections, by
// privilege:
//  - FS_IMMUTABLE_FL (needs CAP_LINUX_IMMUTABLE, and ownership of the file or CAP_FOWNER): set on
//    the open file before its extents are resolved, so no truncate, write, fallocate, unlink or
//    rename through the file system can change the block map while the target is open; cleared
//    when the last guard of the file in this process is released. A process that dies with the
//    flag set leaves it set: `chattr -i FILE` (e2fsprogs) clears it; `lsattr FILE` shows it (an
//    `i` in the flags); the resolver's refusal to open such a file read-write names the command.
//  - An inotify watch of the open file's inode (IN_MODIFY, IN_ATTRIB, IN_DELETE_SELF,
//    IN_MOVE_SELF), always, with or without the flag: the kernel queues the event in the system
//    call that changed the file, and poll_changes() reads the queue without blocking and without
//    signals whenever a DataPath submits or progresses. A changed target fails every later
//    request with DATA_LOSS. Setting or clearing FS_IMMUTABLE_FL queues no event (measured on
//    ext4), so a guard never sees its own flag, nor another process's.
// What remains (the race window): commands issued between the system call that changed the file
// and the DataPath's next poll_changes(). On ext4 with data=ordered (the default) blocks freed by
// a truncate are not given to another file before the journal commits the transaction that
// freed them, so within that window no other file owns them yet.
//
// One inotify instance per process (IN_CLOEXEC | IN_NONBLOCK), created on first use; one watch
// per inode, shared by every guard of that inode in the process (inotify returns the same watch
// descriptor for the same inode) and removed with the last of them. A file this process made
// immutable costs one more file descriptor (a duplicate, kept to clear the flag with). A child made by fork() without
// exec shares the instance's queue with its parent: do not use guards on both sides.
// Several processes serving one file: the one that set FS_IMMUTABLE_FL clears it when it releases
// its last guard; the others keep their inotify watch and are protected by it from then on.
// Thread-safety: every function may be called from any thread (one mutex per process).
#pragma once

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include <tutti/core/errno.hpp>
#include <tutti/core/file_descriptor.hpp>
#include <tutti/core/status.hpp>

namespace tutti::local_file {

/// How a resolved file is protected (LocalFileResolver::Options::change_protection).
enum class ChangeProtection : std::uint8_t {
  /// FS_IMMUTABLE_FL where the process may set it (else found set, or not settable: watch only),
  /// and an inotify watch. The default.
  immutable_and_watch,
  /// The inotify watch alone, as in a process without CAP_LINUX_IMMUTABLE. For callers that must
  /// keep changing the file through the file system while it is open elsewhere (every such change
  /// fails the target), and for tests of the unprivileged path.
  watch_only,
};
inline constexpr ChangeProtection kDefaultChangeProtection = ChangeProtection::immutable_and_watch;

/// The inotify events that mean "the block map may have changed" (inotify(7)).
inline constexpr std::uint32_t kChangeEvents = IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF;

namespace detail {

/// One watched inode of this process: its watch, whether this process set FS_IMMUTABLE_FL on it,
/// and how many change events arrived. Fields other than `changes` are guarded by the monitor's
/// mutex.
struct WatchedInode {
  dev_t device = 0;
  ino_t inode = 0;
  std::string path;              ///< the path of the first guard (for messages)
  int watch = -1;                ///< inotify watch descriptor; -1 once removed (or never added)
  std::uint32_t holders = 0;     ///< live guards of this inode in the process
  bool immutable_owned = false;  ///< this process set FS_IMMUTABLE_FL and clears it with the last guard
  /// A descriptor of the file (a duplicate of the first guard's) kept while immutable_owned, to
  /// clear the flag with whatever happened to the guards' own descriptors.
  FileDescriptor flag_descriptor;
  bool immutable_found = false;           ///< FS_IMMUTABLE_FL was already set when the first guard came
  std::string immutable_refused;          ///< why the flag could not be set (e.g. "Operation not permitted")
  std::atomic<std::uint32_t> events{0};   ///< every inotify mask bit seen so far (set before `changes` moves)
  std::atomic<std::uint64_t> changes{0};  ///< change events so far (never decreases)
};

/// What the inotify event bits in `mask` say happened to the file, joined with "; ".
inline std::string describe_events(std::uint32_t mask) {
  static constexpr std::pair<std::uint32_t, const char*> kWords[] = {
      {IN_MODIFY, "it was written or truncated through the file system (IN_MODIFY)"},
      {IN_ATTRIB, "its attributes or link count changed, e.g. it was unlinked (IN_ATTRIB)"},
      {IN_MOVE_SELF, "it was renamed or moved (IN_MOVE_SELF)"},
      {IN_DELETE_SELF, "it was deleted (IN_DELETE_SELF)"},
      {IN_UNMOUNT, "its file system was unmounted (IN_UNMOUNT)"},
      {IN_Q_OVERFLOW, "the inotify queue overflowed, so events were lost (IN_Q_OVERFLOW)"},
      {IN_IGNORED, "the kernel removed its watch (IN_IGNORED)"},
  };
  std::string out;
  for (const auto& [bit, words] : kWords)
    if (mask & bit) out += (out.empty() ? "" : "; ") + std::string(words);
  return out;
}

/// The process's inotify instance and its watched inodes. Shared (std::shared_ptr) by every inode
/// record, so it outlives the last guard whatever the order of static destruction.
class ChangeMonitor {
 public:
  static const std::shared_ptr<ChangeMonitor>& instance() {
    static const std::shared_ptr<ChangeMonitor> monitor(new ChangeMonitor());
    return monitor;
  }
  ChangeMonitor(const ChangeMonitor&) = delete;
  ChangeMonitor& operator=(const ChangeMonitor&) = delete;
  ~ChangeMonitor() {
    if (inotify_ >= 0) ::close(inotify_);
  }

  /// The inode record for the open file `fd`, with one more holder: an existing one, or a new one
  /// with FS_IMMUTABLE_FL set (when `protection` asks for it and the process may) and a watch.
  Result<std::shared_ptr<WatchedInode>> acquire(int fd, const std::string& path, ChangeProtection protection) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      return status_from_errno(e, fmt::format("'{}': fstat for the change guard", path));
    }
    std::scoped_lock lock(mutex_);
    const auto key = std::pair{st.st_dev, st.st_ino};
    if (const auto found = by_inode_.find(key); found != by_inode_.end()) {
      WatchedInode& known = *found->second;
      // A watch-only record gets the flag when a guard that asks for it comes (never the reverse:
      // the flag stays while any guard of the file needs it).
      if (protection == ChangeProtection::immutable_and_watch && !known.immutable_owned && !known.immutable_found)
        set_immutable(fd, known);
      ++known.holders;
      return found->second;
    }
    auto record = std::make_shared<WatchedInode>();
    record->device = st.st_dev;
    record->inode = st.st_ino;
    record->path = path;
    if (protection == ChangeProtection::immutable_and_watch) set_immutable(fd, *record);
    const bool immutable = record->immutable_owned || record->immutable_found;
    if (Status watched = add_watch(fd, *record); !watched.is_ok() && !immutable) {
      (void)clear_immutable(*record);
      return watched.with_context(
          fmt::format("'{}': FS_IMMUTABLE_FL is not set ({}) and the file cannot be watched either", path,
                      record->immutable_refused.empty() ? "not asked for" : record->immutable_refused));
    }
    record->holders = 1;
    try {
      by_inode_.emplace(key, record);
      if (record->watch >= 0) by_watch_.emplace(record->watch, record);
    } catch (...) {
      by_inode_.erase(key);
      if (record->watch >= 0) (void)::inotify_rm_watch(inotify_, record->watch);
      (void)clear_immutable(*record);
      return error(StatusCode::RESOURCE_EXHAUSTED, "'{}': no memory for the change guard", path);
    }
    if (record->watch >= 0) watches_.fetch_add(1, std::memory_order_relaxed);
    return record;
  }

  /// One holder fewer; the last removes the watch and clears the flag this process set. Errors:
  /// DEVICE_ERROR when the flag cannot be cleared (the message gives the command that clears it).
  Status release(WatchedInode& record) {
    std::scoped_lock lock(mutex_);
    if (record.holders == 0 || --record.holders != 0) return Status::success();
    if (record.watch >= 0) {
      by_watch_.erase(record.watch);
      (void)::inotify_rm_watch(inotify_, record.watch);
      record.watch = -1;
      watches_.fetch_sub(1, std::memory_order_relaxed);
    }
    by_inode_.erase(std::pair{record.device, record.inode});
    return clear_immutable(record);
  }

  /// How `record` is protected now (a snapshot taken under the mutex).
  struct Protection {
    bool immutable_owned = false;
    bool immutable_found = false;
    bool watched = false;
    std::string immutable_refused;
  };
  Protection protection(const WatchedInode& record) {
    std::scoped_lock lock(mutex_);
    return Protection{record.immutable_owned, record.immutable_found, record.watch >= 0, record.immutable_refused};
  }

  /// open(path, flags) of a file that this process made immutable (a read-write open of an
  /// immutable file fails with EPERM): the flag is cleared for the open(2) and set again, under
  /// the mutex, so no guard of this process sees the file mutable; a change another process makes
  /// in that window is seen by the watch. Returns the descriptor, or -1 with errno set (EPERM:
  /// this process does not own the flag on that file).
  int open_owned_immutable(const std::string& path, int flags) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return -1;
    std::scoped_lock lock(mutex_);
    const auto found = by_inode_.find(std::pair{st.st_dev, st.st_ino});
    if (found == by_inode_.end() || !found->second->immutable_owned) {
      errno = EPERM;
      return -1;
    }
    const int probe = found->second->flag_descriptor.get();
    int attributes = 0;
    int fd = -1;
    if (::ioctl(probe, FS_IOC_GETFLAGS, &attributes) == 0) {
      const int mutable_attributes = attributes & ~FS_IMMUTABLE_FL;
      if (::ioctl(probe, FS_IOC_SETFLAGS, &mutable_attributes) == 0) {
        fd = ::open(path.c_str(), flags);
        const int e = errno;
        attributes |= FS_IMMUTABLE_FL;
        (void)::ioctl(probe, FS_IOC_SETFLAGS, &attributes);  // the flag is back before anyone of ours looks
        errno = e;
      }
    }
    return fd;
  }

  /// Reads every pending event without blocking; see poll_changes().
  void poll() noexcept {
    if (watches_.load(std::memory_order_relaxed) == 0) return;
    std::scoped_lock lock(mutex_);
    alignas(inotify_event) char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(inotify_, buffer, sizeof buffer);
      if (n <= 0) return;  // EAGAIN: nothing pending (EINTR: the next poll reads it)
      for (ssize_t at = 0; at + static_cast<ssize_t>(sizeof(inotify_event)) <= n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        deliver(*event);
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
  }

 private:
  ChangeMonitor() = default;

  void deliver(const inotify_event& event) {
    if (event.mask & IN_Q_OVERFLOW) {
      for (auto& [key, record] : by_inode_) mark(*record, event.mask);
      return;
    }
    const auto found = by_watch_.find(event.wd);
    if (found == by_watch_.end()) return;  // a watch this process already removed
    const std::shared_ptr<WatchedInode> record = found->second;
    mark(*record, event.mask);
    if (event.mask & IN_IGNORED) {  // the kernel removed the watch (file deleted, unmounted)
      by_watch_.erase(found);
      record->watch = -1;
      watches_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  static void mark(WatchedInode& record, std::uint32_t mask) {
    record.events.fetch_or(mask, std::memory_order_relaxed);
    record.changes.fetch_add(1, std::memory_order_release);
  }

  /// Sets FS_IMMUTABLE_FL (FS_IOC_SETFLAGS, ioctl_iflags(2)) unless it is set already; a refusal
  /// (no CAP_LINUX_IMMUTABLE, a read-only mount, a file system without flags) is recorded.
  static void set_immutable(int fd, WatchedInode& record) {
    int flags = 0;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) {
      record.immutable_refused = fmt::format("FS_IOC_GETFLAGS: {}", std::strerror(errno));
      return;
    }
    if (flags & FS_IMMUTABLE_FL) {
      record.immutable_found = true;
      return;
    }
    FileDescriptor own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!own.valid()) {
      record.immutable_refused =
          fmt::format("no descriptor to clear FS_IMMUTABLE_FL with later: {}", std::strerror(errno));
      return;
    }
    flags |= FS_IMMUTABLE_FL;
    if (::ioctl(own.get(), FS_IOC_SETFLAGS, &flags) != 0) {
      const int e = errno;
      record.immutable_refused = e == EPERM ? "setting FS_IMMUTABLE_FL needs CAP_LINUX_IMMUTABLE"
                                            : fmt::format("FS_IOC_SETFLAGS: {}", std::strerror(e));
      return;
    }
    record.flag_descriptor = std::move(own);
    record.immutable_owned = true;
  }

  static Status clear_immutable(WatchedInode& record) {
    if (!record.immutable_owned) return Status::success();
    const int fd = record.flag_descriptor.get();
    int flags = 0;
    int e = 0;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) {
      e = errno;
    } else if (flags & FS_IMMUTABLE_FL) {
      flags &= ~FS_IMMUTABLE_FL;
      if (::ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0) e = errno;
    }
    if (e != 0)
      return error(StatusCode::DEVICE_ERROR,
                   "'{}': could not clear FS_IMMUTABLE_FL ({}); the file stays immutable until `chattr -i {}`",
                   record.path, std::strerror(e), record.path);
    record.immutable_owned = false;
    record.flag_descriptor.reset();
    return Status::success();
  }

  /// Adds the watch through /proc/self/fd/N, which names the open file itself (the inode of `fd`,
  /// whatever happened to its path since it was opened).
  Status add_watch(int fd, WatchedInode& record) {
    if (inotify_ < 0) {
      inotify_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
      if (inotify_ < 0) {
        const int e = errno;
        return status_from_errno(e, e == EMFILE ? "inotify_init1 (raise fs.inotify.max_user_instances or the file "
                                                  "descriptor limit)"
                                                : "inotify_init1");
      }
    }
    const std::string self = fmt::format("/proc/self/fd/{}", fd);
    const int watch = ::inotify_add_watch(inotify_, self.c_str(), kChangeEvents);
    if (watch < 0) {
      const int e = errno;
      if (e == ENOSPC || e == ENOMEM)
        return error(StatusCode::RESOURCE_EXHAUSTED, "inotify_add_watch: {} (raise fs.inotify.max_user_watches)",
                     std::strerror(e));
      if (e == ENOENT)
        return error(StatusCode::UNSUPPORTED, "inotify_add_watch({}): {} (is /proc mounted?)", self, std::strerror(e));
      return status_from_errno(e, fmt::format("inotify_add_watch({})", self));
    }
    record.watch = watch;
    return Status::success();
  }

  std::mutex mutex_;
  int inotify_ = -1;
  std::atomic<std::size_t> watches_{0};  ///< live watches: poll() reads nothing while there are none
  std::map<std::pair<dev_t, ino_t>, std::shared_ptr<WatchedInode>> by_inode_;
  std::unordered_map<int, std::shared_ptr<WatchedInode>> by_watch_;
};

}  // namespace detail

/// Reads the pending change events of every guard of this process without blocking and without
/// signals (one read(2) returning EAGAIN when nothing is pending; nothing at all while no watch
/// exists). The DataPaths call it at every submit and every progress step. Thread-safe.
inline void poll_changes() noexcept { detail::ChangeMonitor::instance()->poll(); }

/// A copyable view of one guard's change state, for a DataPath to keep with its open target:
/// changed() after poll_changes() says whether the file changed since the guard was made.
class ChangeWatch {
 public:
  ChangeWatch() = default;
  ChangeWatch(std::shared_ptr<const detail::WatchedInode> inode, std::uint64_t baseline) noexcept
      : inode_(std::move(inode)), baseline_(baseline) {}
  /// A change event arrived since the guard was made (and was read by poll_changes()).
  bool changed() const noexcept { return inode_ && inode_->changes.load(std::memory_order_acquire) != baseline_; }
  /// What the change events said ("" while unchanged).
  std::string what() const {
    return changed() ? detail::describe_events(inode_->events.load(std::memory_order_relaxed)) : std::string();
  }

 private:
  std::shared_ptr<const detail::WatchedInode> inode_;
  std::uint64_t baseline_ = 0;
};

/// The guard of one open file (a member of local_file::Target, destroyed before its lease).
/// Move-only. A default-constructed guard guards nothing (hand-built targets).
class ChangeGuard {
 public:
  ChangeGuard() = default;

  /// Guards the open file `fd` (named `path` in messages) with `protection`; see the file comment.
  /// Errors: a failed fstat as tutti/core/errno.hpp classifies its errno, and when the file can be
  /// neither made immutable nor watched: RESOURCE_EXHAUSTED (inotify limits: fs.inotify.max_user_watches
  /// / max_user_instances, EMFILE), UNSUPPORTED (/proc not mounted), other inotify errnos by the same table.
  static Result<ChangeGuard> create(int fd, const std::string& path, ChangeProtection protection) {
    auto monitor = detail::ChangeMonitor::instance();
    auto record = monitor->acquire(fd, path, protection);
    if (!record) return record.status();
    ChangeGuard guard;
    guard.monitor_ = std::move(monitor);
    guard.inode_ = std::move(record.value());
    guard.baseline_ = guard.inode_->changes.load(std::memory_order_acquire);
    return Result<ChangeGuard>(std::move(guard));  // explicit: nvcc's front end does not move implicitly here
  }

  ChangeGuard(ChangeGuard&& other) noexcept
      : monitor_(std::move(other.monitor_)), inode_(std::move(other.inode_)), baseline_(other.baseline_) {}
  ChangeGuard& operator=(ChangeGuard&& other) noexcept {
    if (this != &other) {
      (void)release();
      monitor_ = std::move(other.monitor_);
      inode_ = std::move(other.inode_);
      baseline_ = other.baseline_;
    }
    return *this;
  }
  ChangeGuard(const ChangeGuard&) = delete;
  ChangeGuard& operator=(const ChangeGuard&) = delete;
  ~ChangeGuard() { (void)release(); }

  /// Guards a file.
  bool active() const noexcept { return inode_ != nullptr; }
  /// FS_IMMUTABLE_FL is set on the file: by this process (it clears it with the last guard of the
  /// file), or found set when the first guard came (left as it is).
  bool immutable() const {
    const auto p = protection();
    return p.immutable_owned || p.immutable_found;
  }
  bool immutable_owned() const { return protection().immutable_owned; }
  /// Why FS_IMMUTABLE_FL is not set ("" when it is, or was not asked for).
  std::string immutable_refused() const { return protection().immutable_refused; }
  /// An inotify watch is in place (always, unless the file is immutable and the watch failed, or
  /// the kernel removed it: the file was deleted or its file system unmounted).
  bool watched() const { return protection().watched; }
  /// See ChangeWatch.
  ChangeWatch watch() const noexcept { return ChangeWatch(inode_, baseline_); }
  bool changed() const noexcept { return watch().changed(); }

  /// Ends the guard (the destructor does it too, silently): the last guard of the file in the
  /// process removes the watch and clears FS_IMMUTABLE_FL if this process set it. Errors:
  /// DEVICE_ERROR when the flag cannot be cleared (its message gives the command that clears it).
  Status release() {
    if (!inode_) return Status::success();
    const Status released = monitor_->release(*inode_);
    inode_.reset();
    monitor_.reset();
    return released;
  }

 private:
  detail::ChangeMonitor::Protection protection() const {
    return inode_ ? monitor_->protection(*inode_) : detail::ChangeMonitor::Protection{};
  }

  std::shared_ptr<detail::ChangeMonitor> monitor_;
  std::shared_ptr<detail::WatchedInode> inode_;
  std::uint64_t baseline_ = 0;
};

}  // namespace tutti::local_file
