// The data layout of a KV store: one preallocated file per layer, `slots` fixed-size slots each;
// block slot s is at the same index in every layer file, so the blocks of one layer, for any set
// of keys, are one batch of requests on one file (one runtime submit).
//
//   <dir>/layer-00000.kv ... layer-<layers-1>.kv     slots x slot_bytes each
//   slot s of a layer file, at s * slot_bytes:  piece 0 | pad to 4096 | piece 1 | pad | ...
//
// Every piece starts on a 4096-byte boundary (the O_DIRECT and LBA alignment of the runtime's
// DataPaths), so each piece is one aligned request. Files are created full size and fully written
// (zeros through write(2), never fallocate, which leaves unwritten extents that FIEMAP reports and
// local_nvme cannot serve), fsynced, created under temporary names and renamed only once all of
// them are complete; any failure (ENOSPC, EDQUOT, EIO) removes every file this call created.
#pragma once

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/core/errno.hpp>
#include <tutti/core/status.hpp>
#include <tutti/kv/namespace.hpp>
#include <tutti/kv/quota.hpp>

namespace tutti::kv {

/// Alignment of every piece inside a slot and of every memory address the store moves, bytes.
inline constexpr std::uint64_t kAlignment = 4096;
/// Most slots of one store (the index stores a slot as 32 bits).
inline constexpr std::uint64_t kMaxSlots = 0xFFFFFFFFull;

constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) noexcept { return (v + a - 1) / a * a; }

/// Where each block's pieces live. Computed from the namespace and the byte bound.
struct Layout {
  std::uint32_t layers = 0;
  std::vector<std::uint64_t> piece_bytes;    ///< full length of each piece, bytes
  std::vector<std::uint64_t> piece_offsets;  ///< offset of each piece inside a slot, bytes (4096-aligned)
  std::uint64_t slot_bytes = 0;              ///< bytes of one slot of one layer file (multiple of 4096)
  std::uint64_t slots = 0;                   ///< blocks the store holds

  std::uint64_t file_bytes() const noexcept { return slots * slot_bytes; }
  std::uint64_t total_bytes() const noexcept { return file_bytes() * layers; }
  std::size_t pieces() const noexcept { return piece_bytes.size(); }
  /// Offset of piece `piece` of slot `slot` in every layer file.
  std::uint64_t offset(std::uint64_t slot, std::size_t piece) const noexcept {
    return slot * slot_bytes + piece_offsets[piece];
  }
  static std::string file_name(std::uint32_t layer) { return fmt::format("layer-{:05}.kv", layer); }

  /// The layout of `ns` within `capacity_bytes` bytes of data files (all layers together).
  /// Errors: INVALID_ARGUMENT when not even one block fits (naming both numbers).
  static Result<Layout> compute(const Namespace& ns, std::uint64_t capacity_bytes) {
    Layout l;
    l.layers = ns.layers;
    l.piece_bytes = ns.piece_bytes;
    for (std::uint64_t b : ns.piece_bytes) {
      l.piece_offsets.push_back(l.slot_bytes);
      l.slot_bytes += round_up(b, kAlignment);
    }
    const std::uint64_t block_bytes = l.slot_bytes * l.layers;  // one block, all layers
    if (capacity_bytes < block_bytes)
      return error(StatusCode::INVALID_ARGUMENT,
                   "options.capacity_bytes = {} is below one block of {} bytes ({} layers x {}-byte slots)",
                   capacity_bytes, block_bytes, l.layers, l.slot_bytes);
    l.slots = std::min(capacity_bytes / block_bytes, kMaxSlots);
    return Result<Layout>(std::move(l));
  }

  nlohmann::json to_json() const {
    return {{"layers", layers},
            {"piece_bytes", piece_bytes},
            {"piece_offsets", piece_offsets},
            {"slot_bytes", slot_bytes},
            {"slots", slots}};
  }
  static Result<Layout> from_json(const nlohmann::json& j) {
    try {
      Layout l;
      j.at("layers").get_to(l.layers);
      j.at("piece_bytes").get_to(l.piece_bytes);
      j.at("piece_offsets").get_to(l.piece_offsets);
      j.at("slot_bytes").get_to(l.slot_bytes);
      j.at("slots").get_to(l.slots);
      if (l.piece_bytes.size() != l.piece_offsets.size() || l.slots == 0 || l.slot_bytes % kAlignment != 0)
        return error(StatusCode::DATA_LOSS, "the stored layout is inconsistent: {}", j.dump());
      return Result<Layout>(std::move(l));
    } catch (const nlohmann::json::exception& e) {
      return error(StatusCode::DATA_LOSS, "the stored layout is unreadable: {}", e.what());
    }
  }
};

/// A Status for errno `e` with context, by the one errno table (tutti/core/errno.hpp): ENOSPC and EDQUOT are
/// RESOURCE_EXHAUSTED.
inline Status errno_status(int e, std::string_view context) { return status_from_errno(e, context); }

namespace detail {

/// Creates `path` (must not exist) of `bytes` bytes, every byte written (zeros), fsynced.
inline Status write_full_file(const std::string& path, std::uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, fmt::format("create '{}'", path));
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  auto zeros = std::make_unique<char[]>(kChunk);  // value-initialised: zeros
  Status out;
  for (std::uint64_t done = 0; done < bytes && out.is_ok();) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, bytes - done));
    const ssize_t w = ::pwrite(fd, zeros.get(), n, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;
      out = errno_status(e, fmt::format("write '{}' at offset {} of {} bytes", path, done, bytes));
      if (e == EDQUOT) {
        const auto slash = path.find_last_of('/');
        out = with_quota_note(out, slash == std::string::npos ? std::string(".") : path.substr(0, slash));
      }
    } else {
      done += static_cast<std::uint64_t>(w);
    }
  }
  if (out.is_ok() && ::fsync(fd) != 0) out = errno_status(errno, fmt::format("fsync '{}'", path));
  ::close(fd);
  return out;
}

inline Status fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, fmt::format("open directory '{}'", dir));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  return rc == 0 ? Status::success() : errno_status(e, fmt::format("fsync directory '{}'", dir));
}

}  // namespace detail

/// Free bytes of the file system holding `dir` for an unprivileged writer (statvfs f_bavail).
inline Result<std::uint64_t> free_bytes(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return errno_status(errno, fmt::format("statvfs '{}'", dir));
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

/// Creates every layer file of `layout` in `dir`: refuses up front when the file system has fewer
/// free bytes than the files need plus `reserve_bytes` (for the index), writes each file under a
/// temporary name (".creating-layer-NNNNN.kv"), fsyncs it, then renames all and fsyncs `dir`.
/// It also refuses up front when a block quota of the caller (kv/quota.hpp: user, group or project,
/// unless the caller has CAP_SYS_RESOURCE) leaves fewer bytes than that.
/// On any failure every file it created is removed. Errors: RESOURCE_EXHAUSTED (not enough free
/// space, not enough quota, ENOSPC, EDQUOT: the message names the bytes needed and free, or the
/// quota's hard limit and use), the errno's code otherwise.
inline Status create_layer_files(const std::string& dir, const Layout& layout, std::uint64_t reserve_bytes) {
  auto free = free_bytes(dir);
  if (!free) return free.status();
  const std::uint64_t need = layout.total_bytes() + reserve_bytes;
  if (need > *free)
    return error(StatusCode::RESOURCE_EXHAUSTED,
                 "the store needs {} bytes ({} layer files of {} bytes and {} bytes for the index) but the file system "
                 "of '{}' has {} bytes free (no space left on device)",
                 need, layout.layers, layout.file_bytes(), reserve_bytes, dir, *free);
  if (!caller_passes_quota_limits())
    if (auto quota = tightest_block_quota(dir); quota && need > quota->headroom_bytes())
      return error(
          StatusCode::RESOURCE_EXHAUSTED,
          "the store needs {} bytes ({} layer files of {} bytes and {} bytes for the index) but the {} quota of "
          "id {} on the file system of '{}' allows {} more bytes (hard limit {} bytes, {} bytes in use; disk "
          "quota exceeded); raise it (setquota) or lower capacity_bytes",
          need, layout.layers, layout.file_bytes(), reserve_bytes, quota->kind, quota->id, dir, quota->headroom_bytes(),
          quota->hard_limit_bytes, quota->used_bytes);
  std::vector<std::string> created;
  auto remove_created = [&] {
    for (const auto& p : created) ::unlink(p.c_str());
    (void)detail::fsync_directory(dir);
  };
  for (std::uint32_t layer = 0; layer < layout.layers; ++layer) {
    const std::string temp = dir + "/.creating-" + Layout::file_name(layer);
    ::unlink(temp.c_str());  // a leftover of a creation that crashed
    created.push_back(temp);
    if (Status s = detail::write_full_file(temp, layout.file_bytes()); !s.is_ok()) {
      remove_created();
      return s.with_context("create the store's layer files");
    }
  }
  for (std::uint32_t layer = 0; layer < layout.layers; ++layer) {
    const std::string final_path = dir + "/" + Layout::file_name(layer);
    if (::rename(created[layer].c_str(), final_path.c_str()) != 0) {
      const int e = errno;
      remove_created();
      return errno_status(e, fmt::format("rename '{}' to '{}'", created[layer], final_path));
    }
    created[layer] = final_path;
  }
  if (Status s = detail::fsync_directory(dir); !s.is_ok()) {
    remove_created();
    return s;
  }
  return Status::success();
}

}  // namespace tutti::kv
