// Files on a real file system for the drive controller (drive_controller.cuh): written with a known
// pattern, located by the product's FIEMAP resolver, and the LBA map that makes a
// DriveNvmeController hold exactly their LBAs, so that the local_nvme path reads them through
// "drive:///ABSOLUTE/PATH" targets at the rate of drive-like controllers (issue 23: "files resolved
// by FIEMAP whose LBAs map into the RAM namespace"). For the GPU suite and tutti-bench-gpu-drive
// (cuda profile; not library code).
//
//   DriveFiles::make(directory, count, file_bytes, chunk_bytes, word)
//     0. refuses, before writing anything, a DIRECTORY that is not one or whose file system has no
//        block device (tmpfs, overlayfs: UNSUPPORTED);
//     1. makes DIRECTORY/tutti-drive-files-XXXXXX (mkdtemp; DIRECTORY made absolute with realpath)
//        with `count` files file-NNNN of
//        file_bytes each, 64-bit word w of file f being word(f, w); written with O_DIRECT in
//        chunk_bytes pieces, round robin over the files, then fsync'd. An O_DIRECT write allocates
//        its blocks at once, so files written side by side interleave on the device and get
//        several extents each (DriveFiles::extents says how many the file system gave);
//     2. resolves each file with local_file::LocalFileResolver (FIEMAP; the block device of
//        DIRECTORY's file system, its partition start from sysfs; ChangeProtection::watch_only here:
//        resolver() has the default protection, so the runtimes that serve the files make them
//        immutable while they hold them);
//     3. sorts every extent by LBA (as the DataPath will address them: partition start included),
//        joins those contiguous on the device, and places the ranges one after the other in the
//        namespace: lba_map and namespace_bytes for DriveSettings.
//   fill(controller) copies the mapped LBAs into the controller's namespace: from the block device
//     itself when it can be opened (O_DIRECT reads at the device offsets FIEMAP gave, so a wrong
//     offset or partition start shows as wrong bytes in the reads' verification), else from the
//     files at their file offsets (FIEMAP's offsets then go unchecked against the device; `source`
//     says which was used).
//   The destructor unlinks the files and the directory. Destroy the runtimes that opened them
//     first: their FS_IMMUTABLE_FL refuses the unlink (a leftover is named on stderr, with
//     `chattr -i`). A process killed before it leaves them behind: remove
//     DIRECTORY/tutti-drive-files-* (after `chattr -i` on its files if the kill came while a
//     runtime held them).
// Units: bytes, and 4096-byte LBAs (kDriveLbaSize: the file system's block size must be a multiple
// of it). Errors: the resolver's (UNSUPPORTED on a file system without FIEMAP or O_DIRECT, such as
// tmpfs or overlayfs), INVALID_ARGUMENT for sizes that are zero or not multiples of 4096, errno
// classes of mkdtemp, open, write and fsync. Thread-safety: none (one thread makes, fills and
// destroys a set).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>
#include <tutti/core/errno.hpp>
#include <tutti/core/file_descriptor.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/uri.hpp>
#include <tutti/resolve/local_file.hpp>

#include "drive_controller.cuh"

namespace tutti::gpu_test {

class DriveFiles {
 public:
  /// Word w (bytes 8w .. 8w + 7) of file f.
  using Word = std::function<std::uint64_t(std::uint32_t file, std::uint64_t word)>;

  /// Makes, writes and locates the files (see the file comment).
  static Result<std::unique_ptr<DriveFiles>> make(const std::string& directory, std::uint32_t count,
                                                  std::uint64_t file_bytes, std::uint64_t chunk_bytes,
                                                  const Word& word) {
    if (count == 0 || file_bytes == 0 || file_bytes % kDriveLbaSize != 0 || chunk_bytes == 0 ||
        chunk_bytes % kDriveLbaSize != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "drive files: count = {}, file_bytes = {}, chunk_bytes = {}: each must be positive, the sizes "
                   "multiples of {}",
                   count, file_bytes, chunk_bytes, kDriveLbaSize);
    // Before any file is written: the directory must be one (made absolute, links resolved, so that
    // the URIs name it) on a file system with a block device.
    char* real = ::realpath(directory.c_str(), nullptr);
    if (real == nullptr) {
      const int e = errno;
      return status_from_errno(e, fmt::format("drive files: directory '{}'", directory));
    }
    const std::string absolute(real);
    std::free(real);
    struct stat st {};
    if (::stat(absolute.c_str(), &st) != 0) {
      const int e = errno;
      return status_from_errno(e, fmt::format("drive files: stat '{}' (from '{}')", absolute, directory));
    }
    if (!S_ISDIR(st.st_mode))
      return error(StatusCode::INVALID_ARGUMENT, "drive files: '{}' ('{}') is not a directory", directory, absolute);
    if (major(st.st_dev) == 0)
      return error(StatusCode::UNSUPPORTED,
                   "drive files: '{}' is on a file system whose device number names no block device (tmpfs, "
                   "overlayfs, btrfs ...): its FIEMAP offsets cannot be mapped to one device's LBAs; use ext4 or "
                   "xfs (a loop-mounted image works)",
                   directory);
    std::unique_ptr<DriveFiles> set(new DriveFiles);
    std::string made = absolute + "/tutti-drive-files-XXXXXX";
    if (::mkdtemp(made.data()) == nullptr) {
      const int e = errno;
      return status_from_errno(e, fmt::format("drive files: mkdtemp in '{}'", absolute));
    }
    set->directory_ = made;
    set->file_bytes_ = file_bytes;
    for (std::uint32_t f = 0; f < count; ++f) set->paths_.push_back(fmt::format("{}/file-{:04}", made, f));
    TUTTI_RETURN_IF_ERROR(set->write(chunk_bytes, word));
    TUTTI_RETURN_IF_ERROR(set->locate());
    return Result<std::unique_ptr<DriveFiles>>(std::move(set));
  }

  DriveFiles(const DriveFiles&) = delete;
  DriveFiles& operator=(const DriveFiles&) = delete;
  ~DriveFiles() {
    for (const std::string& p : paths_)
      if (::unlink(p.c_str()) != 0 && errno != ENOENT)
        std::fprintf(stderr, "drive files: cannot remove '%s' (%s); if it is immutable: chattr -i '%s'\n", p.c_str(),
                     std::strerror(errno), p.c_str());
    if (!directory_.empty() && ::rmdir(directory_.c_str()) != 0 && errno != ENOENT)
      std::fprintf(stderr, "drive files: cannot remove the directory '%s' (%s)\n", directory_.c_str(),
                   std::strerror(errno));
  }

  /// The files, and their URIs for DriveNamespaceResolver ("drive:///...", percent-encoded).
  const std::vector<std::string>& paths() const noexcept { return paths_; }
  std::string uri(std::size_t file) const { return "drive://" + escape_path(paths_.at(file)); }
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  /// The FIEMAP resolver for DriveNamespaceResolver::files (the file system's block device), with
  /// the product's default change protection: a runtime that opens the files makes them immutable
  /// (where the process may) until it closes them.
  const local_file::LocalFileResolver& resolver() const noexcept { return *serving_resolver_; }
  /// For DriveSettings: the ranges, and the namespace bytes they fill.
  const std::vector<DriveLbaRange>& lba_map() const noexcept { return lba_map_; }
  std::uint64_t namespace_bytes() const noexcept { return namespace_bytes_; }
  /// Extents FIEMAP gave (after the resolver merged adjacent ones): in all, fewest and most per file.
  std::uint64_t extents() const noexcept { return extents_; }
  std::uint64_t fewest_extents() const noexcept { return fewest_extents_; }
  std::uint64_t most_extents() const noexcept { return most_extents_; }
  /// The block device of the file system (e.g. "/dev/loop0"), or "" when sysfs does not name it.
  const std::string& block_device() const noexcept { return block_device_; }
  /// Where fill() took the bytes from: "block device /dev/..." or "the files (...: why not the device)".
  const std::string& source() const noexcept { return source_; }
  /// One line: the files, their extents and ranges, and (after fill) the source.
  std::string describe() const {
    return fmt::format(
        "{} files of {} MiB in {} (block device {}), {} extents ({} to {} per file), {} LBA ranges, "
        "namespace {} MiB{}",
        paths_.size(), file_bytes_ >> 20, directory_, block_device_.empty() ? "?" : block_device_, extents_,
        fewest_extents_, most_extents_, lba_map_.size(), namespace_bytes_ >> 20,
        source_.empty() ? "" : ", filled from " + source_);
  }

  /// Copies the mapped LBAs into `controller`'s namespace (made with namespace_bytes() and
  /// lba_map()). Errors: the reads' errno classes, DATA_LOSS on a short read, the copies'.
  Status fill(DriveNvmeController& controller) {
    if (controller.settings().namespace_bytes < namespace_bytes_)
      return error(StatusCode::INVALID_ARGUMENT, "drive files: the namespace has {} bytes, the files' LBAs need {}",
                   controller.settings().namespace_bytes, namespace_bytes_);
    std::string why_not;
    FileDescriptor device;
    if (!block_device_.empty()) {
      device = FileDescriptor(::open(block_device_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
      if (!device.valid()) why_not = fmt::format("{}: {}", block_device_, std::strerror(errno));
    } else {
      why_not = "the block device is not named in sysfs";
    }
    constexpr std::uint64_t kPiece = std::uint64_t{8} << 20;
    auto staging = accel::MappedHostBuffer::allocate(kPiece);
    if (!staging) return staging.status().with_context("drive files: staging");
    auto* buffer = static_cast<std::uint8_t*>(staging.value().data());
    const auto copy_in = [&](int fd, const std::string& name, std::uint64_t at, std::uint64_t bytes,
                             std::uint64_t namespace_at) -> Status {
      for (std::uint64_t done = 0; done < bytes;) {
        const std::uint64_t n = std::min(kPiece, bytes - done);
        const ssize_t got = ::pread(fd, buffer, n, static_cast<off_t>(at + done));
        if (got < 0) {
          const int e = errno;
          return status_from_errno(e, fmt::format("drive files: pread of {} bytes at {} of '{}'", n, at + done, name));
        }
        if (static_cast<std::uint64_t>(got) != n)
          return error(StatusCode::DATA_LOSS, "drive files: pread of {} bytes at {} of '{}' returned {}", n, at + done,
                       name, got);
        TUTTI_RETURN_IF_ERROR(accel::copy_to_device(controller.namespace_data() + namespace_at + done, buffer, n));
        done += n;
      }
      return Status::success();
    };
    if (device.valid()) {
      for (const DriveLbaRange& r : lba_map_)
        TUTTI_RETURN_IF_ERROR(copy_in(device.get(), block_device_, r.starting_lba * kDriveLbaSize - partition_start_,
                                      r.blocks * kDriveLbaSize, r.namespace_lba * kDriveLbaSize));
      source_ = "block device " + block_device_;
      return Status::success();
    }
    for (std::size_t f = 0; f < paths_.size(); ++f) {
      FileDescriptor file(::open(paths_[f].c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
      if (!file.valid()) {
        const int e = errno;
        return status_from_errno(e, fmt::format("drive files: open '{}'", paths_[f]));
      }
      for (const local_file::Extent& x : file_extents_[f]) {
        auto at = namespace_byte(x.device_offset);
        if (!at) return at.status();
        TUTTI_RETURN_IF_ERROR(copy_in(file.get(), paths_[f], x.file_offset, x.length, *at));
      }
    }
    source_ =
        fmt::format("the files (not the block device: {}; FIEMAP's offsets unchecked against the device)", why_not);
    return Status::success();
  }

 private:
  DriveFiles() = default;

  /// Step 1: the files, chunk by chunk, round robin; then fsync.
  Status write(std::uint64_t chunk_bytes, const Word& word) {
    std::vector<FileDescriptor> files;
    for (const std::string& p : paths_) {
      files.emplace_back(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644));
      if (!files.back().valid()) {
        const int e = errno;
        if (e == EINVAL)
          return error(StatusCode::UNSUPPORTED, "drive files: '{}': the file system of '{}' has no O_DIRECT", p,
                       directory_);
        return status_from_errno(e, fmt::format("drive files: create '{}'", p));
      }
    }
    // Page aligned, as O_DIRECT needs (chunk_bytes is a multiple of 4096).
    const std::unique_ptr<void, decltype(&std::free)> buffer(std::aligned_alloc(4096, chunk_bytes), &std::free);
    if (!buffer)
      return error(StatusCode::RESOURCE_EXHAUSTED, "drive files: no memory for a {}-byte chunk", chunk_bytes);
    auto* words = static_cast<std::uint64_t*>(buffer.get());
    for (std::uint64_t at = 0; at < file_bytes_; at += chunk_bytes) {
      const std::uint64_t n = std::min(chunk_bytes, file_bytes_ - at);
      for (std::uint32_t f = 0; f < files.size(); ++f) {
        for (std::uint64_t w = 0; w < n / 8; ++w) words[w] = word(f, at / 8 + w);
        const ssize_t wrote = ::pwrite(files[f].get(), words, n, static_cast<off_t>(at));
        if (wrote < 0) {
          const int e = errno;
          return status_from_errno(e, fmt::format("drive files: write '{}'", paths_[f]));
        }
        if (static_cast<std::uint64_t>(wrote) != n)
          return error(StatusCode::DATA_LOSS, "drive files: write of {} bytes to '{}' wrote {}", n, paths_[f], wrote);
      }
    }
    for (std::uint32_t f = 0; f < files.size(); ++f)
      if (::fsync(files[f].get()) != 0) {
        const int e = errno;
        return status_from_errno(e, fmt::format("drive files: fsync '{}'", paths_[f]));
      }
    return Status::success();
  }

  /// Steps 2 and 3: FIEMAP every file, then the merged, placed ranges.
  Status locate() {
    struct stat st {};
    if (::stat(directory_.c_str(), &st) != 0) {
      const int e = errno;
      return status_from_errno(e, fmt::format("drive files: stat '{}'", directory_));
    }
    local_file::LocalFileResolver::Options options;
    options.device = st.st_dev;
    options.lba_size = kDriveLbaSize;
    auto serving = local_file::LocalFileResolver::create(options);
    if (!serving) return serving.status().with_context(fmt::format("drive files in '{}'", directory_));
    serving_resolver_ = std::make_unique<local_file::LocalFileResolver>(std::move(serving.value()));
    // Locating them takes no immutable flag: the set only reads the extents, and the runtimes that
    // serve the files take it.
    options.change_protection = local_file::ChangeProtection::watch_only;
    auto resolver = local_file::LocalFileResolver::create(options);
    if (!resolver) return resolver.status().with_context(fmt::format("drive files in '{}'", directory_));
    partition_start_ = *resolver->options().partition_start_bytes;
    block_device_ = device_node(st.st_dev);
    std::vector<local_file::Extent> all;
    fewest_extents_ = ~std::uint64_t{0};
    for (const std::string& p : paths_) {
      auto t = resolver->resolve("file://" + escape_path(p), {});
      if (!t) return t.status();
      file_extents_.push_back(t->extents);
      all.insert(all.end(), t->extents.begin(), t->extents.end());
      extents_ += t->extents.size();
      fewest_extents_ = std::min<std::uint64_t>(fewest_extents_, t->extents.size());
      most_extents_ = std::max<std::uint64_t>(most_extents_, t->extents.size());
    }
    std::sort(all.begin(), all.end(), [](const local_file::Extent& a, const local_file::Extent& b) {
      return a.device_offset < b.device_offset;
    });
    for (const local_file::Extent& x : all) {
      const std::uint64_t lba = x.device_offset / kDriveLbaSize, blocks = x.length / kDriveLbaSize;
      if (!lba_map_.empty() && lba_map_.back().starting_lba + lba_map_.back().blocks == lba)
        lba_map_.back().blocks += blocks;  // contiguous on the device: one range
      else
        lba_map_.push_back(DriveLbaRange{lba, blocks, namespace_bytes_ / kDriveLbaSize});
      namespace_bytes_ += x.length;
    }
    return Status::success();
  }

  /// The namespace byte that holds device byte `device_offset`. INTERNAL when no range holds it
  /// (locate maps every extent, so that is a bug here, reported rather than read out of bounds).
  Result<std::uint64_t> namespace_byte(std::uint64_t device_offset) const {
    const std::uint64_t lba = device_offset / kDriveLbaSize;
    auto r = std::upper_bound(lba_map_.begin(), lba_map_.end(), lba,
                              [](std::uint64_t l, const DriveLbaRange& range) { return l < range.starting_lba; });
    if (r == lba_map_.begin() || lba - (r - 1)->starting_lba >= (r - 1)->blocks)
      return error(StatusCode::INTERNAL, "drive files: LBA {} (device byte {}) is in none of the {} mapped ranges", lba,
                   device_offset, lba_map_.size());
    --r;
    return (r->namespace_lba + (lba - r->starting_lba)) * kDriveLbaSize;
  }

  /// "/dev/NAME" of a block device from sysfs's uevent (DEVNAME=), or "".
  static std::string device_node(dev_t device) {
    std::ifstream uevent(fmt::format("/sys/dev/block/{}:{}/uevent", major(device), minor(device)));
    for (std::string line; std::getline(uevent, line);)
      if (line.rfind("DEVNAME=", 0) == 0) return "/dev/" + line.substr(8);
    return "";
  }

  std::string directory_;
  std::vector<std::string> paths_;
  std::uint64_t file_bytes_ = 0;
  std::unique_ptr<local_file::LocalFileResolver> serving_resolver_;
  std::uint64_t partition_start_ = 0;
  std::string block_device_, source_;
  std::vector<std::vector<local_file::Extent>> file_extents_;
  std::vector<DriveLbaRange> lba_map_;
  std::uint64_t namespace_bytes_ = 0;
  std::uint64_t extents_ = 0, fewest_extents_ = 0, most_extents_ = 0;
};

}  // namespace tutti::gpu_test
