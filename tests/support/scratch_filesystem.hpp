// Real file systems for tests: an ext4 or btrfs image on a loop device, or a tmpfs,
// mounted in a fresh directory and torn down by the destructor. Needs root; use with root_main.cpp.
//
//   auto fs = tutti::testing::ScratchFilesystem::create({.type = FilesystemType::EXT4});
//   fs->mount_point()  -> "/tmp/tutti-fs-XXXXXX/mnt"
//   fs->loop_device()  -> "/dev/loop3"   (the block device that backs the file system)
//   fs->image_path()   -> the image file (what a soft controller can be backed by)
//   fs->drop_caches()  -> sync + echo 3 > /proc/sys/vm/drop_caches
//   fs->remount()      -> unmount and mount again (cold page cache for this file system)
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <fmt/format.h>

#include <tutti/core/status.hpp>

namespace tutti::testing {

enum class FilesystemType { EXT4, TMPFS, BTRFS };

/// Runs a shell command; INTERNAL with the command and its exit status on failure.
inline Status run_command(const std::string& command) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  if (rc != 0) return error(StatusCode::INTERNAL, "command failed (status {}): {}", rc, command);
  return Status::success();
}

class ScratchFilesystem {
 public:
  struct Options {
    FilesystemType type = FilesystemType::EXT4;
    std::uint64_t size_bytes = std::uint64_t{256} << 20;  ///< Image or tmpfs size in bytes.
    std::uint32_t block_size = 4096;                      ///< ext4 block size in bytes.
    std::uint32_t sector_size = 512;                      ///< Loop device logical block size (512 or 4096).
    std::string mkfs_options{};                           ///< Added to mkfs (ext4: "-O quota -E quotatype=usrquota").
    std::string mount_options{};  ///< mount -o, also on remount (ext4: "usrquota" enforces user quotas).
  };

  static Result<std::unique_ptr<ScratchFilesystem>> create(const Options& options) {
    if (geteuid() != 0) return Status(StatusCode::UNSUPPORTED, "scratch file systems need root");
    char templ[] = "/tmp/tutti-fs-XXXXXX";
    if (mkdtemp(templ) == nullptr) return Status(StatusCode::INTERNAL, "mkdtemp failed");
    auto fs = std::unique_ptr<ScratchFilesystem>(new ScratchFilesystem());
    fs->root_ = templ;
    fs->mount_point_ = fs->root_ + "/mnt";
    fs->type_ = options.type;
    ::mkdir(fs->mount_point_.c_str(), 0755);
    if (options.type == FilesystemType::TMPFS) {
      TUTTI_RETURN_IF_ERROR(
          run_command(fmt::format("mount -t tmpfs -o size={} tmpfs {}", options.size_bytes, fs->mount_point_)));
      fs->mounted_ = true;
      return fs;
    }
    fs->image_path_ = fs->root_ + "/disk.img";
    TUTTI_RETURN_IF_ERROR(run_command(fmt::format("truncate -s {} {}", options.size_bytes, fs->image_path_)));
    if (options.type == FilesystemType::BTRFS)
      TUTTI_RETURN_IF_ERROR(run_command(fmt::format("mkfs.btrfs -q -f {} {}", options.mkfs_options, fs->image_path_)));
    else
      TUTTI_RETURN_IF_ERROR(
          run_command(fmt::format("mkfs.ext4 -q -F -b {} -E lazy_itable_init=0,lazy_journal_init=0 {} {}",
                                  options.block_size, options.mkfs_options, fs->image_path_)));
    fs->mount_options_ = options.mount_options.empty() ? "" : "-o " + options.mount_options;
    FILE* p = popen(
        fmt::format("losetup --find --show --sector-size {} {}", options.sector_size, fs->image_path_).c_str(), "r");
    if (p == nullptr) return Status(StatusCode::INTERNAL, "losetup could not run");
    char line[256] = {};
    const bool got = std::fgets(line, sizeof line, p) != nullptr;
    pclose(p);
    if (!got) return Status(StatusCode::INTERNAL, "losetup printed no device");
    fs->loop_device_ = line;
    while (!fs->loop_device_.empty() && (fs->loop_device_.back() == '\n' || fs->loop_device_.back() == ' '))
      fs->loop_device_.pop_back();
    TUTTI_RETURN_IF_ERROR(
        run_command(fmt::format("mount {} {} {}", fs->mount_options_, fs->loop_device_, fs->mount_point_)));
    fs->mounted_ = true;
    return fs;
  }

  ScratchFilesystem(const ScratchFilesystem&) = delete;
  ScratchFilesystem& operator=(const ScratchFilesystem&) = delete;
  ~ScratchFilesystem() {
    if (mounted_) (void)run_command(fmt::format("umount {}", mount_point_));
    if (!loop_device_.empty()) (void)run_command(fmt::format("losetup -d {}", loop_device_));
    (void)run_command(fmt::format("rm -rf {}", root_));
  }

  const std::string& mount_point() const noexcept { return mount_point_; }
  const std::string& image_path() const noexcept { return image_path_; }
  const std::string& loop_device() const noexcept { return loop_device_; }
  /// A path inside the mounted file system.
  std::string path(const std::string& name) const { return mount_point_ + "/" + name; }

  /// Writes dirty pages and drops the page cache, so the next reads come from the device.
  static Status drop_caches() { return run_command("sync && echo 3 > /proc/sys/vm/drop_caches"); }

  /// Unmounts and mounts the file system again, with the same mount options (images only).
  Status remount() {
    TUTTI_RETURN_IF_ERROR(run_command(fmt::format("umount {}", mount_point_)));
    mounted_ = false;
    TUTTI_RETURN_IF_ERROR(run_command(fmt::format("mount {} {} {}", mount_options_, loop_device_, mount_point_)));
    mounted_ = true;
    return Status::success();
  }

 private:
  ScratchFilesystem() = default;
  FilesystemType type_ = FilesystemType::EXT4;
  std::string root_, mount_point_, image_path_, loop_device_, mount_options_;
  bool mounted_ = false;
};

}  // namespace tutti::testing
