// The striped_file payload: one logical target striped round robin, in units of `unit_bytes`,
// over N shard files, shard i on controller i (its own namespace). Produced by
// tutti::striped_file::StripedFileResolver (striped:// URIs), opened by
// tutti::striped_nvme::StripedNvmeDataPath. Each shard is a local_file::Target (FIEMAP extents on
// its own namespace, its own LBA size, lease and change guard).
//
// Placement (docs/striping.md): logical byte x lies in unit u = x / unit_bytes, on shard
// u % N, at shard byte (u / N) * unit_bytes + x % unit_bytes. The logical size is
// N x (shortest shard rounded down to whole units).
// Units: bytes. Invariants (validate): 1 <= N <= kMaxShards, unit_bytes > 0 and a multiple of
// every shard's LBA size, every shard holds at least size_bytes / N bytes.
// Thread-safety: a plain value once built; concurrent readers are fine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tutti/accel/config.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/status.hpp>

namespace tutti::striped_file {

/// Most shards (drives) one striped target may have.
inline constexpr std::uint32_t kMaxShards = 64;

/// Where one logical byte lives: shard index and byte offset in that shard's file.
struct Placement {
  std::uint32_t shard = 0;
  std::uint64_t shard_offset = 0;
};

/// The placement of logical byte `offset` over `shards` shards of `unit_bytes`-byte units
/// (round robin by unit). Host and device code; shards and unit_bytes > 0.
TUTTI_HOST_DEVICE constexpr Placement place(std::uint64_t offset, std::uint64_t unit_bytes,
                                            std::uint32_t shards) noexcept {
  const std::uint64_t unit = offset / unit_bytes;
  return Placement{static_cast<std::uint32_t>(unit % shards), (unit / shards) * unit_bytes + offset % unit_bytes};
}

/// The payload: N shard files and the stripe unit.
struct Target {
  std::string name;                        ///< NAME of striped://NAME (for messages)
  std::uint64_t unit_bytes = 0;            ///< stripe unit, bytes
  std::vector<local_file::Target> shards;  ///< shard i is served by controller i
  std::uint64_t logical_size = 0;          ///< bytes: N x (shortest shard rounded down to whole units)

  std::uint64_t size_bytes() const noexcept { return logical_size; }
  std::uint32_t shard_count() const noexcept { return static_cast<std::uint32_t>(shards.size()); }
  Placement locate(std::uint64_t offset) const noexcept { return place(offset, unit_bytes, shard_count()); }

  /// Checks the invariants of the file comment and every shard's (local_file::Target::validate).
  /// INVALID_ARGUMENT naming the field, the value and the limit.
  Status validate() const {
    if (shards.empty() || shards.size() > kMaxShards)
      return error(StatusCode::INVALID_ARGUMENT, "striped '{}': {} shards; expected 1 to {}", name, shards.size(),
                   kMaxShards);
    if (unit_bytes == 0) return error(StatusCode::INVALID_ARGUMENT, "striped '{}': unit = 0 bytes", name);
    if (logical_size % (unit_bytes * shards.size()) != 0)
      return error(StatusCode::INVALID_ARGUMENT,
                   "striped '{}': logical size {} is not a whole number of stripes of {} x {} bytes", name,
                   logical_size, shards.size(), unit_bytes);
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const local_file::Target& s = shards[i];
      TUTTI_RETURN_IF_ERROR(s.validate().with_context(fmt::format("striped '{}': shard {}", name, i)));
      if (unit_bytes % s.lba_size != 0)
        return error(StatusCode::INVALID_ARGUMENT,
                     "striped '{}': unit = {} bytes is not a multiple of shard {} ('{}')'s LBA size of {} bytes", name,
                     unit_bytes, i, s.path, s.lba_size);
      if (s.file_size < logical_size / shards.size())
        return error(StatusCode::INVALID_ARGUMENT, "striped '{}': shard {} ('{}') holds {} bytes; the stripe needs {}",
                     name, i, s.path, s.file_size, logical_size / shards.size());
    }
    return Status::success();
  }
};

}  // namespace tutti::striped_file
