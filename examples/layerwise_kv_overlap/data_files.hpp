// The example's data folder: the layer files of a data set in the KV block store's layout (dataset.hpp's
// Shape::layout(), tutti::kv::Layout), their manifest, the lock that keeps two runs apart, and what the
// folder's file system is. One piece of code for the example's runs and for --prepare-only, so a folder
// prepared ahead is exactly what a run expects.
//
//   <data dir>/layer-00000.kv ... (kv::Layout::file_name)   layer_file_bytes() each, every byte written
//   <data dir>/manifest.json     the shape and its layout (shape_json), written last
// Striped (Shape::stripe_devices N > 1, dataset.hpp): shard i of every layer lives in its own folder
// (one per ext4 image) under the same file name, shard_file_bytes() each, every byte written; that
// folder's manifest also names the shard.
//   <data dir>/layerwise.lock    flock(2) of the run using the folder (DataDirLock)
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/bind/striped_file.hpp>
#include <tutti/core/status.hpp>
#include <tutti/core/errno.hpp>

#include "dataset.hpp"
#include "progress.hpp"

namespace layerwise {

namespace fs = std::filesystem;

/// The manifest of a data set: what its files hold and where (the store's layout). hit_percent belongs
/// to it because the missed chunks hold the last run's recomputed tensors, not the prepared content.
/// Format 3: the KV store's layout (format 2 named the files layer-NNN.kv). A striped shape adds
/// "stripe": {"devices": N, "unit_bytes": tensor_bytes}.
inline nlohmann::json shape_json(const Shape& s) {
  nlohmann::json j = {{"layers", s.layers},
                      {"context_tokens", s.context_tokens},
                      {"chunk_tokens", s.chunk_tokens},
                      {"tensor_bytes", s.tensor_bytes},
                      {"hit_percent", s.hit_percent},
                      {"layout", s.layout().to_json()},
                      {"format", 3}};
  if (s.stripe_devices > 1) j["stripe"] = {{"devices", s.stripe_devices}, {"unit_bytes", s.tensor_bytes}};
  return j;
}

/// The manifest of shard `shard` of a data set: shape_json, and for a striped shape the shard's index.
inline nlohmann::json manifest_json(const Shape& s, std::uint32_t shard) {
  nlohmann::json j = shape_json(s);
  if (s.stripe_devices > 1) j["stripe"]["shard"] = shard;
  return j;
}

/// Bytes of the whole data set (every layer file); saturates at UINT64_MAX.
inline std::uint64_t data_set_bytes(const Shape& s) {
  const unsigned __int128 bytes = static_cast<unsigned __int128>(s.layers) * s.layer_file_bytes();
  return bytes > UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(bytes);
}

/// Whether `dir` holds the complete data set of `shape` (striped: its shard `shard`): its manifest, and
/// every layer file at its size.
inline bool data_set_complete(const Shape& shape, const fs::path& dir, std::uint32_t shard = 0) {
  std::error_code ec;
  std::ifstream in(dir / "manifest.json");
  if (!in) return false;
  auto saved = nlohmann::json::parse(in, nullptr, false);
  if (saved.is_discarded() || saved != manifest_json(shape, shard)) return false;
  for (std::uint32_t l = 0; l < shape.layers; ++l)
    if (fs::file_size(dir / shape.layer_file_name(l), ec) != shape.shard_file_bytes() || ec) return false;
  return true;
}

/// Removes the layer files in `dir` that the data set of `shape` has no use for: those of more layers,
/// or named as an earlier format named them ("layer-000.kv"), so a folder reused with another shape does
/// not keep gigabytes of old tensors. Only regular files named "layer-<digits>.kv" are touched.
inline void remove_stale_layer_files(const Shape& shape, const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool layer_file = name.starts_with("layer-") && name.ends_with(".kv") && name.size() > 9 &&
                            std::all_of(name.begin() + 6, name.end() - 3, [](char c) { return c >= '0' && c <= '9'; });
    if (!layer_file || !entry.is_regular_file(ec)) continue;
    bool current = false;
    for (std::uint32_t l = 0; l < shape.layers && !current; ++l) current = name == shape.layer_file_name(l);
    if (!current) stale.push_back(entry.path());
  }
  for (const auto& path : stale) fs::remove(path, ec);
}

/// Creates the layer files of `shape` in `dir` (an existing folder) unless they are complete already:
/// each file is preallocated to its full size (fallocate(2), so a disk without room fails at once and
/// not gigabytes later; skipped where the file system has no fallocate), then every tensor is written
/// with its content (fill_tensor, salt 0) and the file fsynced; the manifest is written last, so an
/// interrupted preparation is redone by the next run. Progress, or a line saying the data set is reused,
/// goes to stderr.
/// Striped (shape.stripe_devices N > 1): writes shard `shard` (0 to N-1) of every layer instead, the
/// tensors striped_file::place puts on it at their shard offsets and zeros in its units past the layer.
/// Errors (naming the file): those of open, fallocate, pwrite and fsync as tutti::status_from_errno
/// classifies them (RESOURCE_EXHAUSTED for ENOSPC and EDQUOT, INVALID_ARGUMENT for EACCES and EROFS, ...);
/// INVALID_ARGUMENT for a shard index of N or more.
inline tutti::Status prepare_files(const Shape& shape, const fs::path& dir, std::uint32_t shard = 0) {
  const std::uint32_t devices = std::max(1u, shape.stripe_devices);
  if (shard >= devices)
    return tutti::error(tutti::StatusCode::INVALID_ARGUMENT, "shard = {}; expected 0 to {}", shard, devices - 1);
  const std::string label =
      devices == 1 ? std::string("the data set") : fmt::format("shard {} of {} of the data set", shard, devices);
  if (data_set_complete(shape, dir, shard)) {
    fmt::print(stderr, "reusing {} in '{}': its manifest matches this shape (remove the folder to write it again)\n",
               label, dir.string());
    return tutti::Status::success();
  }
  std::error_code ec;
  fs::remove(dir / "manifest.json", ec);
  remove_stale_layer_files(shape, dir);
  const std::uint64_t file_bytes = shape.shard_file_bytes();
  const unsigned __int128 all = static_cast<unsigned __int128>(shape.layers) * file_bytes;
  const std::uint64_t total = all > UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(all);
  fmt::print(stderr, "writing {}: {} of {} ({}) in '{}'\n", label, counted(shape.layers, "layer file"),
             format_bytes(file_bytes), format_bytes(total), dir.string());
  Progress progress("writing " + label, total, Progress::Unit::bytes);
  std::vector<std::byte> tensor(shape.tensor_bytes);
  std::uint64_t written = 0;
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const fs::path path = dir / shape.layer_file_name(l);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tutti::status_from_errno(errno, fmt::format("create '{}'", path.string()));
    auto fail = [&](const char* what) {
      const int err = errno;
      ::close(fd);
      return tutti::status_from_errno(err, fmt::format("{} '{}'", what, path.string()));
    };
    auto write_at = [&](std::uint64_t offset) {
      const ssize_t n = ::pwrite(fd, tensor.data(), tensor.size(), static_cast<off_t>(offset));
      if (n != static_cast<ssize_t>(tensor.size())) {
        if (n >= 0) errno = ENOSPC;  // a short write: the file system ran out of room
        return false;
      }
      written += tensor.size();
      progress.update(written);
      return true;
    };
    const int allocated = ::fallocate(fd, 0, 0, static_cast<off_t>(file_bytes));
    if (allocated != 0 && errno != EOPNOTSUPP) return fail("fallocate");
    std::uint64_t units_here = 0;  // the shard's units holding a tensor
    for (std::uint32_t c = 0; c < shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k) {
        // One shard: the identity (shard 0, the layer offset).
        const auto at = tutti::striped_file::place(shape.tensor_offset(c, k), shape.tensor_bytes, devices);
        if (at.shard != shard) continue;
        fill_tensor(tensor, l, c, k);
        if (!write_at(at.shard_offset)) return fail("write");
        ++units_here;
      }
    // Striped: the shard's units past the layer's last tensor hold zeros (every byte written, so
    // FIEMAP finds no unwritten extent).
    std::fill(tensor.begin(), tensor.end(), std::byte{0});
    for (std::uint64_t u = units_here; devices > 1 && u < file_bytes / shape.tensor_bytes; ++u)
      if (!write_at(u * shape.tensor_bytes)) return fail("write");
    if (::fsync(fd) != 0) return fail("fsync");
    ::close(fd);
  }
  progress.update(total);
  std::ofstream manifest(dir / "manifest.json");
  manifest << manifest_json(shape, shard).dump(2) << "\n";
  manifest.close();
  if (!manifest)
    return tutti::error(tutti::StatusCode::DEVICE_ERROR, "could not write '{}'", (dir / "manifest.json").string());
  return tutti::Status::success();
}

/// An exclusive flock(2) on "<data dir>/layerwise.lock", held until destruction (the end of main), so
/// that two runs cannot rewrite the same layer files at once (one's written-tensor check would then
/// read the other's bytes). Not copyable; one per process.
class DataDirLock {
 public:
  static constexpr const char* kFileName = "layerwise.lock";
  DataDirLock() = default;
  DataDirLock(const DataDirLock&) = delete;
  DataDirLock& operator=(const DataDirLock&) = delete;
  ~DataDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock; the empty file stays (unlinking it would race)
  }

  /// Takes the lock without waiting. Errors: BUSY when another process holds it (the message names the
  /// folder and --data-dir); the errno's code (status_from_errno) when the lock file cannot be opened
  /// or locked, e.g. INVALID_ARGUMENT for a folder this user may not write.
  tutti::Status acquire(const fs::path& dir) {
    const fs::path path = dir / kFileName;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return tutti::status_from_errno(errno, fmt::format("--data-dir: lock file '{}'", path.string()));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return tutti::Status::success();
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      return tutti::error(tutti::StatusCode::BUSY,
                          "data directory '{}' is in use by another layerwise_kv_overlap run (it holds the lock "
                          "'{}'); wait for that run to end or pick another folder with --data-dir",
                          dir.string(), path.string());
    return tutti::status_from_errno(err, fmt::format("flock '{}'", path.string()));
  }

 private:
  int fd_ = -1;
};

/// What holds a folder: its file system and whether that keeps the files in RAM.
struct FileSystemInfo {
  std::string type = "unknown";  ///< As /proc/self/mountinfo names it: "ext4", "xfs", "tmpfs" ...
  std::string source;            ///< The mount's source: "/dev/nvme0n1p2", "tmpfs" ...
  std::string ram_backed;        ///< Why the files live in RAM ("tmpfs keeps its files in RAM"); empty when not.
  /// "ext4 on /dev/vda1", "tmpfs".
  std::string describe() const { return source.empty() || source == type ? type : type + " on " + source; }
};

namespace detail {

/// mountinfo's octal escapes (\040 for a space) undone.
inline std::string unescape_mountinfo(const std::string& field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string octal = field.substr(i + 1, 3);
      if (octal.size() == 3 && std::all_of(octal.begin(), octal.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out += static_cast<char>(std::stoi(octal, nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

/// The block device's kernel name ("vda1", "zram0", "loop3") of device number `device`; empty when none.
inline std::string block_device_name(dev_t device) {
  std::error_code ec;
  const fs::path link = fs::read_symlink(fmt::format("/sys/dev/block/{}:{}", major(device), minor(device)), ec);
  return ec ? std::string() : link.filename().string();
}

}  // namespace detail

/// The file system holding `dir` (an existing folder), from /proc/self/mountinfo (the mount whose
/// device number is the folder's, the deepest such mount point on the folder's path). RAM-backed:
/// tmpfs, ramfs and hugetlbfs; a file system on a RAM block device (zram, brd's ramN); a loop device
/// whose backing file is itself on one of these. Never fails: unknown parts stay "unknown" or empty.
inline FileSystemInfo describe_filesystem(const fs::path& dir, int depth = 0) {
  FileSystemInfo info;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return info;
  std::error_code ec;
  const std::string path = fs::weakly_canonical(fs::absolute(dir), ec).string();
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  std::size_t best = 0;
  while (std::getline(mountinfo, line)) {
    std::istringstream in(line);
    std::string id, parent, numbers, root, mount_point;
    if (!(in >> id >> parent >> numbers >> root >> mount_point)) continue;
    if (numbers != fmt::format("{}:{}", major(st.st_dev), minor(st.st_dev))) continue;
    std::string field;
    while (in >> field && field != "-") {
    }
    std::string type, source;
    if (!(in >> type >> source)) continue;
    mount_point = detail::unescape_mountinfo(mount_point);
    const bool on_path = path.compare(0, mount_point.size(), mount_point) == 0;
    const std::size_t rank = on_path ? mount_point.size() + 1 : 0;  // any mount of the device beats none
    if (info.type == "unknown" || rank > best) {
      info.type = type;
      info.source = detail::unescape_mountinfo(source);
      best = rank;
    }
  }
  if (info.type == "tmpfs" || info.type == "ramfs" || info.type == "hugetlbfs") {
    info.ram_backed = info.type + " keeps its files in RAM";
    return info;
  }
  const std::string device = detail::block_device_name(st.st_dev);
  if (device.starts_with("zram") || (device.starts_with("ram") && device.size() > 3 && std::isdigit(device[3]))) {
    info.ram_backed = fmt::format("its block device {} is a RAM disk", device);
  } else if (device.starts_with("loop") && depth == 0) {
    std::ifstream backing(fmt::format("/sys/block/{}/loop/backing_file", device));
    std::string file;
    if (std::getline(backing, file) && !file.empty()) {
      const FileSystemInfo under = describe_filesystem(fs::path(file).parent_path(), depth + 1);
      if (!under.ram_backed.empty())
        info.ram_backed = fmt::format("its loop device {} is backed by '{}' on {}", device, file, under.describe());
    }
  }
  return info;
}

}  // namespace layerwise
