// Open targets of the local_nvme DataPath: the payload (local_file::Target: the lease, the change
// guard and the host copy of the extents) plus the device-resident handle the kernels use
// (DeviceTarget), with the target's registration in the target handle cache (target_cache.hpp).
// The extents are resolved once, by the caller's FIEMAP, and never again: open copies them into
// L2 (kernel-reachable memory, host memory in the host profile) and submits copy them into L1.
//
// A file changed under local_nvme (docs/local-nvme.md): the payload's change guard
// (bind/local_file/change_guard.hpp) keeps the file immutable where the process may, and watches
// it with inotify. The DataPath reads the watch's events at every submit and progress step
// (local_file::poll_changes) and raises the target's ChangeSignal once the file changed: the
// kernels then issue no further command of the target (commands in flight drain), its requests
// in flight complete with DATA_LOSS, and every later request of it is refused with DATA_LOSS.
// Units: bytes. Thread-safety: an open target is used by one thread at a time for open and close;
// submits and progress steps read it, and raise its signal, concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include <tutti/accel/placement.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/bind/local_file.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/change_words.hpp>
#include <tutti/path/local_nvme/kernel_array.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/target_cache.hpp>

namespace tutti::local_nvme {

/// A target's registration with the target handle cache: its id and L2 room, released (and its
/// L1 entry dropped) when the target is closed or destroyed. Movable through its unique_ptr.
struct CacheLease {
  std::shared_ptr<TargetCache> cache;
  std::uint64_t id = 0;            ///< TargetCache::admit's id (never reused)
  std::uint64_t extent_count = 0;  ///< extents held in L2
  CacheLease() = default;
  CacheLease(const CacheLease&) = delete;
  CacheLease& operator=(const CacheLease&) = delete;
  ~CacheLease() {
    if (cache) cache->release(id, extent_count);
  }
};

/// The "changed under local_nvme" state of one open target: the word the kernels read
/// (DeviceTarget::changed, a word of the DataPath's ChangeWords pool: device memory in the CUDA
/// profile) and the guard's view of the file's change events. Owned by the open target (a stable
/// address for the batches that point to it); submit and progress raise it, from any thread.
struct ChangeSignal {
  /// What the host did about a change: nothing yet; setting the word (one thread, the first to
  /// see the change); set (the word is 1); or the set failed (not tried again: the copy stays
  /// enqueued and lands when the device gets to it).
  enum State : std::uint8_t { unraised = 0, raising = 1, raised = 2, raise_failed = 3 };
  std::shared_ptr<ChangeWords> words;  ///< the pool `word` comes from
  std::uint32_t* word = nullptr;       ///< 0 unchanged, 1 changed (the kernels issue nothing more)
  std::atomic<std::uint8_t> state{unraised};
  local_file::ChangeWatch watch;
  std::string path;
  ChangeSignal() = default;
  ChangeSignal(const ChangeSignal&) = delete;
  ChangeSignal& operator=(const ChangeSignal&) = delete;
  /// A word that was never set goes back to the pool; one that was (or may be) set is kept out of
  /// it, so no kernel that outlived this target reads a later target's 0 in it.
  ~ChangeSignal() {
    if (words && state.load(std::memory_order_acquire) == unraised) words->release(word);
  }
  /// Whether the file changed (read local_file::poll_changes first). The first caller that sees
  /// the change sets the word (ChangeWords::set) and returns once every kernel admission from
  /// then on refuses the target; callers meanwhile and afterwards return at once. A set that
  /// failed (the copy did not land within the pool's timeout) is not tried again: the requests
  /// staged from then on are refused anyway (stage), and the host reports the target's requests
  /// in flight as DATA_LOSS.
  bool raise_if_changed() noexcept {
    if (state.load(std::memory_order_acquire) != unraised) return true;
    if (!watch.changed()) return false;
    std::uint8_t expected = unraised;
    if (!state.compare_exchange_strong(expected, raising, std::memory_order_acq_rel)) return true;
    bool set = false;
    try {
      set = words->set(word).is_ok();
    } catch (...) {  // no memory for the error's text: counted as failed
    }
    state.store(set ? raised : raise_failed, std::memory_order_release);
    return true;
  }
  /// Stages a request of this target: raises the signal if the file changed, and then points the
  /// staged handle at the pool's always-1 word, so the request's kernel refuses it whether or not
  /// this target's own word has landed.
  void stage(DeviceTarget& staged) noexcept {
    if (raise_if_changed()) staged.changed = words->always_changed();
  }
  /// DATA_LOSS naming the file and what happened to it; `consequence` says what that means for
  /// the caller's request.
  Status change_error(std::string_view consequence) const {
    return error(StatusCode::DATA_LOSS, "target changed under local_nvme: '{}': {}; {}", path, watch.what(),
                 consequence);
  }
};

/// The open target (LocalNvmeDataPath::open_target): the payload (its lease, change guard and
/// extents) plus the device-resident handle.
struct OpenTarget {
  std::unique_ptr<local_file::Target> payload;  ///< the lease, the guard and the host copy of the extents
  /// L2 of the target handle cache: the kernels' home copy (mapped pinned host memory in the
  /// CUDA profile); device_target points into it; submits copy it into L1 (never re-resolved).
  KernelArray<local_file::Extent> extents;
  DeviceTarget device_target;
  std::unique_ptr<CacheLease> cache_lease;  ///< the id the cache knows the target by
  std::unique_ptr<ChangeSignal> signal;     ///< device_target.changed is its word
  bool flush_on_close = false;              ///< OpenOptions::flush_on_close: close() issues an NVMe Flush first
};

/// Builds the device-resident handle of `target` for a namespace of `lba_size`-byte LBAs: the L2
/// copy of its extents in kernel-reachable memory, admitted to `cache`, and its change signal with
/// a word of `words`.
/// Errors: INVALID_ARGUMENT when the payload's LBA size is not `lba_size`, or its invariants
/// (Target::validate) do not hold; DATA_LOSS when the file changed since it was resolved;
/// RESOURCE_EXHAUSTED when the open targets' extents would exceed the cache's L2 bound
/// (Options::host_target_cache_bytes), or the copy cannot be allocated; ChangeWords::acquire's.
inline Result<OpenTarget> make_open_target(local_file::Target&& target, const OpenOptions& options,
                                           std::uint32_t lba_size, const std::shared_ptr<TargetCache>& cache,
                                           const std::shared_ptr<ChangeWords>& words) {
  if (target.lba_size != lba_size)
    return error(StatusCode::INVALID_ARGUMENT,
                 "local_nvme: '{}' was resolved for {}-byte LBAs but the namespace uses {}-byte LBAs", target.path,
                 target.lba_size, lba_size);
  TUTTI_RETURN_IF_ERROR(target.validate());
  local_file::poll_changes();
  if (target.guard.changed())
    return error(StatusCode::DATA_LOSS, "target changed under local_nvme: '{}': {}; resolve it again", target.path,
                 target.guard.watch().what());
  OpenTarget t;
  t.flush_on_close = options.flush_on_close;
  t.payload = std::make_unique<local_file::Target>(std::move(target));
  auto id = cache->admit(t.payload->extents.size(), t.payload->path);
  if (!id) return id.status();
  t.cache_lease = std::make_unique<CacheLease>();
  t.cache_lease->cache = cache;
  t.cache_lease->id = *id;
  t.cache_lease->extent_count = t.payload->extents.size();
  try {
    t.signal = std::make_unique<ChangeSignal>();
    t.signal->watch = t.payload->guard.watch();
    t.signal->path = t.payload->path;
    t.extents = KernelArray<local_file::Extent>(t.payload->extents.begin(), t.payload->extents.end(),
                                                accel::PlacementAllocator<local_file::Extent>(accel::kKernelReachable));
  } catch (const std::bad_alloc&) {
    return error(StatusCode::RESOURCE_EXHAUSTED, "local_nvme: no memory for the {} extents of '{}'",
                 t.payload->extents.size(), t.payload->path);
  }
  auto word = words->acquire();
  if (!word) return word.status().with_context(t.payload->path);
  t.signal->words = words;
  t.signal->word = *word;
  t.device_target = DeviceTarget{t.extents.data(),    t.extents.size(), t.payload->file_size,
                                 t.payload->lba_size, t.payload->nsid,  t.signal->word};
  return Result<OpenTarget>(std::move(t));  // explicit: nvcc's front end does not move implicitly here
}

}  // namespace tutti::local_nvme
