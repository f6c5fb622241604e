// The bounded two-tier cache of device-resident target handles of the local_nvme DataPath
// (docs/local-nvme.md, "The target handle cache").
//
// A target's extents (local_file::Extent, 24 bytes each, sorted and gap-free) are resolved once,
// by FIEMAP when the file is opened, and never re-resolved. They then live in two tiers:
//  - L2, the home: one copy per open target in kernel-reachable memory (mapped pinned host memory
//    in the CUDA profile, host memory in the host profile), owned by the open target. Bounded by
//    TargetCacheLimits::host_bytes (Options::host_target_cache_bytes): open is refused beyond it.
//  - L1: `entries` fixed-size entries of `entry_extents` extents each, in one accelerator
//    allocation made at creation (device memory in the CUDA profile, host memory standing in for
//    it in the host profile). A submit that needs a target not resident in L1 makes it resident
//    with ONE copy of its extents from L2 (accel::copy_to_device_async on the submit's stream,
//    enqueued before the batch's launch, so the kernels see the bytes), taking a free entry or
//    evicting the least recently used entry that no live batch pins. Eviction is by dropping: the
//    extents are read-only and the L2 copy stays authoritative, so nothing is copied back.
// A live batch pins every L1 entry its requests use until the batch is destroyed; a pinned entry
// is never evicted or overwritten, so a kernel never reads extents that changed under it. When L1
// cannot serve a target (no entry is free or unpinned, the target has more than entry_extents
// extents, L1 is disabled with entries = 0, or the entry is still being filled by another
// submit whose copy has not been waited for), the submit uses the L2 copy instead (the mapped
// copy the kernels reach over PCIe in the CUDA profile): a fallback, counted, never an error and
// never a wait.
//
// Counters (TargetCacheStatistics): one lookup per distinct target per submit. hits: resident
// and ready in L1; misses: not resident (then a copy fills an entry, or, without room, a
// fallback); evictions: resident entries dropped to make room; fallbacks: lookups served from L2.
// Units: bytes unless named *_extents / entries. Thread-safety: every member function may be
// called from any thread (one mutex); the cache is shared (std::shared_ptr) by the DataPath, its
// open targets and its live batches, so it outlives whichever goes last.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/async_copy.hpp>
#include <tutti/accel/memory.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/kernels.hpp>

namespace tutti::local_nvme {

/// The cache's bounds (validated by DataPath::create, which names the Options fields).
struct TargetCacheLimits {
  std::uint32_t entries = 0;        ///< L1 entries (targets resident at once); 0 disables L1
  std::uint32_t entry_extents = 0;  ///< extents one L1 entry holds (>= 1)
  std::uint64_t host_bytes = 0;     ///< L2: bytes of extents of all open targets together (>= 1)
};

/// A snapshot of the cache's counters and occupancy (see the file comment for their meaning).
struct TargetCacheStatistics {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::uint64_t fallbacks = 0;
  std::uint32_t resident = 0;    ///< L1 entries holding a target (pinned or not)
  std::uint32_t pinned = 0;      ///< L1 entries pinned by live batches
  std::uint64_t host_bytes = 0;  ///< L2 bytes held by open targets
};

class TargetCache {
 public:
  /// A cache with L1 allocated (entries x entry_extents x 24 bytes of accelerator memory).
  /// Errors: INVALID_ARGUMENT (entry_extents or host_bytes = 0), the allocation's errors
  /// (RESOURCE_EXHAUSTED, UNSUPPORTED, DEVICE_ERROR).
  static Result<std::shared_ptr<TargetCache>> create(const TargetCacheLimits& limits) {
    if (limits.entry_extents == 0 || limits.host_bytes == 0)
      return error(StatusCode::INVALID_ARGUMENT, "target cache: entry_extents = {} and host_bytes = {} must be >= 1",
                   limits.entry_extents, limits.host_bytes);
    std::shared_ptr<TargetCache> cache(new (std::nothrow) TargetCache());
    if (!cache) return error(StatusCode::RESOURCE_EXHAUSTED, "target cache: no memory for the cache");
    cache->limits_ = limits;
    if (limits.entries > 0) {
      const std::size_t bytes = std::size_t{limits.entries} * limits.entry_extents * sizeof(local_file::Extent);
      auto l1 = accel::DeviceBuffer::allocate(bytes);
      if (!l1)
        return l1.status().with_context(
            fmt::format("target cache: L1 of {} entries x {} extents", limits.entries, limits.entry_extents));
      cache->l1_ = std::move(l1.value());
      try {
        cache->entries_.assign(limits.entries, Entry{});
        cache->index_.reserve(limits.entries);
      } catch (const std::bad_alloc&) {
        return error(StatusCode::RESOURCE_EXHAUSTED, "target cache: no memory for the index of {} entries",
                     limits.entries);
      }
    }
    return cache;
  }

  const TargetCacheLimits& limits() const noexcept { return limits_; }

  /// Reserves L2 room for a target of `extent_count` extents at open and returns its id (unique,
  /// never reused, never 0). RESOURCE_EXHAUSTED naming Options::host_target_cache_bytes when the
  /// open targets' extents would exceed it (close a target first).
  Result<std::uint64_t> admit(std::uint64_t extent_count, std::string_view path) {
    const std::uint64_t bytes = extent_count * sizeof(local_file::Extent);
    std::scoped_lock lock(mutex_);
    if (bytes > limits_.host_bytes || host_bytes_ > limits_.host_bytes - bytes)
      return error(
          StatusCode::RESOURCE_EXHAUSTED,
          "local_nvme: the {} extents of '{}' ({} bytes) do not fit: open targets hold {} of the {} bytes set by "
          "Options::host_target_cache_bytes; close a target or raise the limit",
          extent_count, path, bytes, host_bytes_, limits_.host_bytes);
    host_bytes_ += bytes;
    return ++last_id_;
  }

  /// The target `id` (of admit, with `extent_count` extents) is closed: its L2 room returns and
  /// its L1 entry is dropped now, or, while live batches pin it, when the last of them is destroyed.
  void release(std::uint64_t id, std::uint64_t extent_count) noexcept {
    std::scoped_lock lock(mutex_);
    host_bytes_ -= extent_count * sizeof(local_file::Extent);
    const auto found = index_.find(id);
    if (found == index_.end()) return;
    Entry& e = entries_[found->second];
    index_.erase(found);
    if (e.pins == 0)
      e = Entry{};
    else
      e.closed = true;
  }

  /// The handle a submit's kernels use for target `id`, whose L2 handle is `home`: an L1 handle
  /// (its extents in entry memory; the entry is pinned, its index appended to `pins`) or `home`
  /// (fallback). On a miss that takes an entry, one copy of the extents is enqueued on `stream`
  /// and `copied` is set: the caller must wait for the stream (accel::synchronize) before the
  /// batch's pins are marked ready (mark_ready) or released (unpin). Never waits; never fails
  /// (a copy that cannot be enqueued is a fallback). `pins` must have room reserved by the
  /// caller (push_back may otherwise throw std::bad_alloc; the entry is then released).
  DeviceTarget acquire(std::uint64_t id, const DeviceTarget& home, void* stream, std::vector<std::uint32_t>& pins,
                       bool& copied) {
    std::scoped_lock lock(mutex_);
    if (limits_.entries == 0 || home.extent_count > limits_.entry_extents || home.extent_count == 0) {
      ++counters_.fallbacks;
      return home;
    }
    ++tick_;
    if (const auto found = index_.find(id); found != index_.end()) {
      Entry& e = entries_[found->second];
      if (!e.ready) {  // another submit's copy into it may still be in flight
        ++counters_.fallbacks;
        return home;
      }
      if (!pin(found->second, pins)) {
        ++counters_.fallbacks;
        return home;
      }
      ++counters_.hits;
      e.last_used = tick_;
      return at(found->second, home);
    }
    ++counters_.misses;
    // A free entry, else the least recently used entry no live batch pins (evicted by dropping:
    // the extents are read-only, L2 stays authoritative).
    std::uint32_t victim = limits_.entries;
    for (std::uint32_t i = 0; i < limits_.entries; ++i) {
      const Entry& e = entries_[i];
      if (e.pins != 0) continue;
      if (e.id == 0) {
        victim = i;
        break;
      }
      if (victim == limits_.entries || e.last_used < entries_[victim].last_used) victim = i;
    }
    if (victim == limits_.entries) {  // every entry is pinned by a live batch
      ++counters_.fallbacks;
      return home;
    }
    Entry& e = entries_[victim];
    if (e.id != 0) {
      index_.erase(e.id);
      ++counters_.evictions;
    }
    e = Entry{};
    try {
      index_.emplace(id, victim);
    } catch (const std::bad_alloc&) {
      ++counters_.fallbacks;
      return home;
    }
    const Status enqueued = accel::copy_to_device_async(entry_memory(victim), home.extents,
                                                        home.extent_count * sizeof(local_file::Extent), stream);
    if (enqueued.is_ok()) copied = true;
    if (!enqueued.is_ok() || !pin(victim, pins)) {
      index_.erase(id);
      ++counters_.fallbacks;
      return home;
    }
    e.id = id;
    e.last_used = tick_;
    return at(victim, home);
  }

  /// The copies of the submit that pinned `pins` have landed (its stream was waited for):
  /// later submits may use those entries.
  void mark_ready(std::span<const std::uint32_t> pins) noexcept {
    std::scoped_lock lock(mutex_);
    for (const std::uint32_t i : pins) entries_[i].ready = true;
  }

  /// A batch that pinned `pins` is destroyed (no kernel of it runs): the entries may be evicted;
  /// an entry whose target was closed, or whose copy was never marked ready, is dropped.
  void unpin(std::span<const std::uint32_t> pins) noexcept {
    std::scoped_lock lock(mutex_);
    for (const std::uint32_t i : pins) {
      Entry& e = entries_[i];
      if (--e.pins != 0) continue;
      if (e.closed) {
        e = Entry{};
      } else if (!e.ready) {
        index_.erase(e.id);
        e = Entry{};
      }
    }
  }

  TargetCacheStatistics statistics() const {
    std::scoped_lock lock(mutex_);
    TargetCacheStatistics s = counters_;
    for (const Entry& e : entries_) {
      if (e.id != 0) ++s.resident;
      if (e.pins != 0) ++s.pinned;
    }
    s.host_bytes = host_bytes_;
    return s;
  }

 private:
  struct Entry {
    std::uint64_t id = 0;         ///< target id; 0: free
    std::uint64_t last_used = 0;  ///< tick of the last lookup that used it (LRU order)
    std::uint32_t pins = 0;       ///< live batches using it
    bool ready = false;           ///< its copy is known to have landed
    bool closed = false;          ///< its target was closed while pinned: dropped at the last unpin
  };

  TargetCache() = default;

  local_file::Extent* entry_memory(std::uint32_t i) const noexcept {
    return static_cast<local_file::Extent*>(l1_.data()) + std::size_t{i} * limits_.entry_extents;
  }
  DeviceTarget at(std::uint32_t i, const DeviceTarget& home) const noexcept {
    DeviceTarget t = home;
    t.extents = entry_memory(i);
    return t;
  }
  bool pin(std::uint32_t i, std::vector<std::uint32_t>& pins) noexcept {
    try {
      pins.push_back(i);
    } catch (const std::bad_alloc&) {
      return false;
    }
    ++entries_[i].pins;
    return true;
  }

  mutable std::mutex mutex_;
  TargetCacheLimits limits_;
  accel::DeviceBuffer l1_;
  std::vector<Entry> entries_;
  std::unordered_map<std::uint64_t, std::uint32_t> index_;  ///< target id -> L1 entry
  TargetCacheStatistics counters_;
  std::uint64_t host_bytes_ = 0;
  std::uint64_t last_id_ = 0;
  std::uint64_t tick_ = 0;
};

}  // namespace tutti::local_nvme
