// Disk quotas as the KV store reports them. A store is refused by a quota in two places: while it
// creates its layer files (write(2) fails with EDQUOT) and when an index commit grows index.mdb.
// Both are RESOURCE_EXHAUSTED (tutti/core/errno.hpp); this header makes the message name the limit.
//
// Linux block quotas (user, group and project quotas of ext4 and XFS) are read with quotactl_fd(2)
// (Linux 5.14; Q_GETQUOTA, struct dqblk: limits in 1024-byte quota blocks, usage in bytes) for the
// caller's effective uid and gid and the directory's project id (FS_IOC_FSGETXATTR). A caller with
// CAP_SYS_RESOURCE is not held to them (the kernel lets it pass hard limits). btrfs qgroup limits
// are not quotactl quotas: there the message says EDQUOT came from a quota whose limit this cannot
// read, and names `btrfs qgroup show`.
//
// Thread-safety: every function is reentrant. Errors: none; a quota that cannot be read is absent.
#pragma once

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/quota.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <tutti/core/status.hpp>

namespace tutti::kv {

/// One block quota that applies to the caller on a file system. Units: bytes.
struct BlockQuota {
  std::string_view kind;               ///< "user", "group" or "project"
  std::uint32_t id = 0;                ///< uid, gid or project id
  std::uint64_t hard_limit_bytes = 0;  ///< the limit writes cannot pass (0: none)
  std::uint64_t soft_limit_bytes = 0;  ///< the limit past which the grace period runs (0: none)
  std::uint64_t used_bytes = 0;        ///< bytes charged to this id now

  /// Bytes the caller may still allocate under the hard limit (UINT64_MAX without one).
  std::uint64_t headroom_bytes() const noexcept {
    if (hard_limit_bytes == 0) return ~std::uint64_t{0};
    return used_bytes >= hard_limit_bytes ? 0 : hard_limit_bytes - used_bytes;
  }
};

/// True when the calling thread has CAP_SYS_RESOURCE in its effective set: block quotas' hard
/// limits do not hold it back.
inline bool caller_passes_quota_limits() noexcept {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_SYS_RESOURCE / 32].effective >> (CAP_SYS_RESOURCE % 32)) & 1u;
}

/// The block quota with the least headroom among the caller's user, group and the project quota
/// of `dir` (any directory on the file system), or nullopt when none has a hard limit (no quotas,
/// quotas off, or a file system whose quotas quotactl does not read, such as btrfs qgroups).
inline std::optional<BlockQuota> tightest_block_quota(const std::string& dir) {
#if defined(SYS_quotactl_fd)
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::uint32_t project = 0;
  bool has_project = false;
  fsxattr attributes{};
  if (::ioctl(fd, FS_IOC_FSGETXATTR, &attributes) == 0) {
    project = attributes.fsx_projid;
    has_project = true;
  }
  std::optional<BlockQuota> tightest;
  auto consider = [&](int type, std::string_view kind, std::uint32_t id) {
    dqblk q{};
    if (::syscall(SYS_quotactl_fd, fd, QCMD(Q_GETQUOTA, type), id, &q) != 0) return;
    if (!(q.dqb_valid & QIF_BLIMITS) || q.dqb_bhardlimit == 0) return;
    BlockQuota b{kind, id, q.dqb_bhardlimit * QIF_DQBLKSIZE, q.dqb_bsoftlimit * QIF_DQBLKSIZE, q.dqb_curspace};
    if (!tightest || b.headroom_bytes() < tightest->headroom_bytes()) tightest = b;
  };
  consider(USRQUOTA, "user", static_cast<std::uint32_t>(::geteuid()));
  consider(GRPQUOTA, "group", static_cast<std::uint32_t>(::getegid()));
  if (has_project) consider(PRJQUOTA, "project", project);
  ::close(fd);
  return tightest;
#else
  (void)dir;
  return std::nullopt;
#endif
}

/// What to add to an EDQUOT error on the file system of `dir`: the limit when quotactl reads it,
/// otherwise where to look.
inline std::string quota_note(const std::string& dir) {
  if (auto q = tightest_block_quota(dir))
    return fmt::format(
        "the {} quota of id {} on the file system of '{}' has a hard limit of {} bytes with {} bytes in "
        "use (soft limit {} bytes); raise it (setquota) or lower capacity_bytes",
        q->kind, q->id, dir, q->hard_limit_bytes, q->used_bytes, q->soft_limit_bytes);
  return fmt::format(
      "a quota on the file system of '{}' refused the bytes; its limit is not readable through "
      "quotactl (a btrfs qgroup limit: btrfs qgroup show -re); raise it or lower capacity_bytes",
      dir);
}

/// `s` (an EDQUOT error on the file system of `dir`) with quota_note(dir) appended to its message.
inline Status with_quota_note(const Status& s, const std::string& dir) {
  if (s.is_ok()) return s;
  return Status(s.code(), fmt::format("{} ({})", s.message(), quota_note(dir)));
}

}  // namespace tutti::kv
