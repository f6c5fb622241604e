// --backend nvme: the example as a tuttid client (docs/daemon.md, docs/kv-cache.md). A lease of NVMe queue
// pairs on one of tuttid's controllers (tutti::daemon::LeasedController), the local_nvme runtime over them,
// and the layer files on the file system of the lease's namespace, which tuttid mounted or verified and
// reports with the lease (its mount point and block device): files resolved with FIEMAP to that namespace's
// LBAs, every IO an NVMe command on the leased queues.
// What this file holds: the lease's pinned-byte budget for a shape, the check that the data folder lies on
// the namespace's file system, the KV slots in memory of the lease, and the page-cache hygiene of files
// whose blocks the controller writes behind the file system's back.
// Thread-safety: one thread (main's).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tutti/path/local_nvme/prp_table.hpp>

#include "dataset.hpp"
#include "leased_controller.hpp"
#include "pipeline.hpp"

namespace layerwise {

/// What --backend nvme asks tuttid for (--tuttid-socket, --controller, --lease-queues).
struct LeaseChoice {
  std::string socket{tutti::daemon::kDefaultSocketPath};
  std::string controller;
  std::uint64_t queues = 1;  ///< wide, so that a huge --lease-queues is range-checked, not a conversion error
};

/// Most queue pairs --lease-queues asks for (tuttid grants at most 64 in one lease).
inline constexpr std::uint32_t kMaxLeaseQueues = 64;

/// Pinned bytes a lease needs for `shape`: the KV slots (Pipeline's read and write slots, each rounded up to
/// 4096) and, per slot registration, local_nvme's PRP lists (2 x list pages of 4096 bytes,
/// registration.hpp); a Pipeline per run reuses them (LeasedMemory).
inline std::uint64_t lease_pinned_bytes(const Shape& shape) {
  std::uint64_t total = 0;
  for (std::uint64_t bytes : {read_slot_bytes(shape), write_slot_bytes(shape)}) {
    const std::uint64_t pages = (bytes + 4095) / 4096;
    total += pages * 4096 + 2 * tutti::local_nvme::PrpTable::list_pages_for(pages, 4096) * 4096;
  }
  return total;
}

/// The KV slots in memory of the lease (allocate_host_memory: a memfd tuttid maps, registered on the
/// lease). A slot given back is reused by the next Pipeline asking for the same size, so --repeat N runs
/// hold one set of slots. Memory stays registered until the LeasedController is destroyed.
class LeasedMemory final : public HostMemorySource {
 public:
  explicit LeasedMemory(tutti::daemon::LeasedController& controller) : controller_(controller) {}
  tutti::Result<std::byte*> allocate(std::uint64_t bytes) override {
    for (Block& b : blocks_)
      if (b.free && b.bytes == bytes) {
        b.free = false;
        std::memset(b.data, 0, bytes);
        return b.data;
      }
    auto memory = controller_.allocate_host_memory(bytes);
    if (!memory) return memory.status();
    blocks_.push_back({static_cast<std::byte*>(*memory), bytes, false});
    return blocks_.back().data;
  }
  void release(std::byte* data, std::uint64_t) override {
    for (Block& b : blocks_)
      if (b.data == data) b.free = true;
  }

 private:
  struct Block {
    std::byte* data;
    std::uint64_t bytes;
    bool free;
  };
  tutti::daemon::LeasedController& controller_;
  std::vector<Block> blocks_;
};

/// The namespace of the lease (its NSID) as tuttid reports it, or an error naming what is missing.
inline tutti::Result<tutti::daemon::LeasedNamespace> lease_namespace(const tutti::daemon::LeasedController& c,
                                                                     const std::string& controller) {
  const std::uint32_t nsid = c.identity().nsid;
  for (const auto& n : c.namespaces()) {
    if (n.nsid != nsid) continue;
    if (n.mount.empty() || n.block_device.empty())
      return tutti::error(tutti::StatusCode::NOT_READY,
                          "namespace {} of controller {} has {} in tuttid's configuration: --backend nvme puts its "
                          "files on that namespace's file system (namespaces[].mount, docs/daemon.md \"Mounts\")",
                          nsid, controller, n.mount.empty() ? "no mount point" : "a mount point that is not mounted");
    return n;
  }
  return tutti::error(tutti::StatusCode::NOT_READY,
                      "controller {} lists no namespace {} in tuttid's configuration (namespaces[]): --backend nvme "
                      "puts its files on that namespace's file system, mounted by tuttid (docs/daemon.md \"Mounts\")",
                      controller, nsid);
}

/// OK when `dir` (or, when it does not exist yet, its nearest existing parent) lies on the file system of
/// namespace `ns`: its st_dev is the namespace's block device. INVALID_ARGUMENT naming --data-dir and its value,
/// the mount point it must be under, the namespace's device and the one `dir` is on otherwise.
inline tutti::Status check_on_namespace(const std::filesystem::path& dir, const tutti::daemon::LeasedNamespace& ns,
                                        const std::string& controller) {
  struct stat device {};
  if (::stat(ns.block_device.c_str(), &device) != 0 || !S_ISBLK(device.st_mode))
    return tutti::error(tutti::StatusCode::NOT_READY,
                        "tuttid reports block device '{}' for namespace {} of controller {}, which is not a block "
                        "device here: {}",
                        ns.block_device, ns.nsid, controller, std::strerror(errno));
  std::error_code ec;
  std::filesystem::path existing = std::filesystem::absolute(dir, ec);
  while (!std::filesystem::exists(existing, ec) && existing.has_relative_path()) existing = existing.parent_path();
  struct stat st {};
  if (::stat(existing.c_str(), &st) != 0)
    return tutti::status_from_errno(errno, fmt::format("--data-dir '{}': stat '{}'", dir.string(), existing.string()));
  if (st.st_dev == device.st_rdev) return tutti::Status::success();
  return tutti::error(tutti::StatusCode::INVALID_ARGUMENT,
                      "--data-dir '{}' is not on namespace {} of controller {}: give a folder under '{}', where tuttid "
                      "has its {} file system mounted from {} ({}:{}); '{}'{} is on device {}:{} (the default is '{}')",
                      dir.string(), ns.nsid, controller, ns.mount, ns.filesystem, ns.block_device,
                      major(device.st_rdev), minor(device.st_rdev), existing.string(),
                      existing == dir ? "" : ", the nearest folder of it that exists,", major(st.st_dev),
                      minor(st.st_dev), (std::filesystem::path(ns.mount) / "tutti-layerwise-kv").string());
}

/// The layer files' pages dropped from the file system's page cache (after writing dirty ones back): the
/// controller reads and writes their blocks on the device behind the file system's back, so a page cached
/// before would hide what it wrote from a later buffered read, and a dirty one written back later would
/// overwrite it. Called before the run (after preparing the files) and after it.
inline tutti::Status drop_file_pages(const Shape& shape, const std::filesystem::path& dir) {
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const std::filesystem::path path = dir / shape.layer_file_name(l);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tutti::status_from_errno(errno, fmt::format("open '{}'", path.string()));
    const bool synced = ::fdatasync(fd) == 0;
    const int e = synced ? ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) : errno;
    ::close(fd);
    if (e != 0)
      return tutti::status_from_errno(
          e, fmt::format("{} '{}'", synced ? "posix_fadvise DONTNEED" : "fdatasync", path.string()));
  }
  return tutti::Status::success();
}

}  // namespace layerwise
