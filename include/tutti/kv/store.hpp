// KvStore<Runtime>: KV-cache blocks named by the engine's block hash, in preallocated layer files
// (kv/layout.hpp), indexed by LMDB (kv/index.hpp), bounded in bytes with CLOCK eviction
// (kv/slots.hpp), each piece checksummed with XXH3-64 where its bytes are (kv/checksum.hpp), one
// writer per directory (kv/writer_lock.hpp). docs/kv-store.md is the long form.
//
//   auto store = KvStore<UringRuntime>::open(runtime, "/mnt/nvme/kv", ns, {.capacity_bytes = 64ull << 30});
//   auto memory = (*store)->register_memory({kv_pool, pool_bytes, MemoryKind::DEVICE, 0});
//   std::size_t hit = (*store)->lookup(keys).value();             // stored prefix length, in blocks
//   for (layer ...) ios[layer] = (*store)->load(first(keys, hit), layer, pieces[layer]);   // one submit each
//   for (layer ...) { (*store)->wait_layer(layer, budget); compute(layer); }
//   for (layer ...) (*store)->store(missed_keys, layer, new_pieces[layer]);                 // one submit each
//   (*store)->wait_layer(...); (*store)->commit(missed_keys, budget);                      // visible from here
//
// Visibility (the crash rule): a block becomes visible to lookup and load only in commit(), once
// every layer of it was stored without error, every layer file written since the last commit was
// flushed through the runtime (FLUSH: fdatasync for uring, NVMe Flush for local_nvme), and its
// index record was committed to LMDB (synced). A crash at any point before that leaves the block
// invisible; one after it leaves it complete. Eviction deletes the victim's record (committed)
// before its slot is written again, so a record never points at bytes of another block.
//
// Units: bytes, nanoseconds. Errors: every entry point validates its arguments and names the field,
// the value and the limit. Per-block outcomes (a key not stored, a read that failed, a checksum that
// did not match, no free slot) are Statuses in LayerResult::blocks / commit's vector, never hidden.
//
// Thread-safety: every member function may be called from any thread. One mutex guards the slot
// table, the in-memory index and the IO table; it is not held across runtime submits and waits or
// checksums, but it is held across LMDB write transactions (commit, eviction), so a writer's lookup
// may wait for a commit's sync. One thread at a time waits for a given KvIo (others get BUSY).
// Processes: one writer per directory (a second is refused BUSY naming the holder's pid), any
// number of readers (options.read_only): lookup and load, no pins, loads re-check the record's
// generation after the read.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/kv/checksum.hpp>
#include <tutti/kv/index.hpp>
#include <tutti/kv/layout.hpp>
#include <tutti/kv/namespace.hpp>
#include <tutti/kv/slots.hpp>
#include <tutti/kv/writer_lock.hpp>

namespace tutti::kv {

/// How a store is opened. Defaults are the constants; docs/kv-store.md lists them.
struct StoreOptions {
  static constexpr std::uint64_t kDefaultIoTimeoutNs = 60'000'000'000;  // 60 s
  /// Byte bound of the data files, all layers together. Creating: required (>= one block of all
  /// layers). Reopening: 0 takes the store's, any other value must equal it.
  std::uint64_t capacity_bytes = 0;
  /// Open as a reader: lookup and load only, no writer lock, the store must exist.
  bool read_only = false;
  /// Create the directory and the store when absent (writers only).
  bool create_if_missing = true;
  /// Loads skip checksum verification. Unsafe: a block damaged on disk, or replaced by another
  /// process while it was read, may then be served. Off by default.
  bool unsafe_skip_verification = false;
  /// LMDB map size (the largest the index may grow), bytes; 0: derived from the slot count.
  std::uint64_t index_map_bytes = 0;
  /// Budget of the store's own waits (the FLUSH in commit, draining IO at destruction), ns.
  std::uint64_t io_timeout_ns = kDefaultIoTimeoutNs;
  /// CUDA profile: the stream the checksum kernels run on (nullptr: the default stream).
  void* checksum_stream = nullptr;
  /// Threads that checksum host memory in one call (the calling thread is one of them); 0: the
  /// hardware threads, at most kMaxChecksumThreads. A thread is only used per
  /// kChecksumBytesPerThread bytes to hash.
  std::uint32_t host_checksum_threads = 0;
  static constexpr std::uint32_t kMaxChecksumThreads = 8;
  static constexpr std::uint64_t kChecksumBytesPerThread = std::uint64_t{4} << 20;  // 4 MiB
};

/// One memory piece of one block of one layer: `length` bytes at `offset` of a region registered
/// with KvStore::register_memory. address + offset must be a multiple of 4096; a length that is
/// not a multiple of 4096 moves the length rounded up to 4096 (the region needs room for it, and a
/// load writes the rounded bytes), while its checksum covers exactly `length` bytes.
struct Piece {
  MemoryHandle memory;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// A store-level IO (one load or store of one layer). Plain value; 0 is null.
struct KvIo {
  std::uint64_t id = 0;
  friend bool operator==(const KvIo&, const KvIo&) = default;
};

enum class KvOperation : std::uint8_t { LOAD, STORE };

/// The outcome of one load or store of one layer.
struct LayerResult {
  KvIo io;
  KvOperation operation = KvOperation::LOAD;
  std::uint32_t layer = 0;
  Status status;               ///< OK when every block is OK, else the first block's failure
  std::vector<Status> blocks;  ///< one per key, in input order
  std::size_t ok_blocks = 0;
  std::uint64_t bytes = 0;           ///< bytes moved for the OK blocks (piece lengths)
  std::uint64_t verified_bytes = 0;  ///< bytes whose checksum was computed and matched (loads)
  std::uint64_t skipped_blocks = 0;  ///< stores of keys already visible (nothing written)
};

/// Counters since open (this process).
struct Statistics {
  std::uint64_t lookups = 0, lookup_keys = 0, lookup_hits = 0;
  std::uint64_t load_blocks = 0;            ///< blocks asked for by load()
  std::uint64_t hits = 0;                   ///< blocks loaded (and verified unless unsafe)
  std::uint64_t misses = 0;                 ///< blocks not stored when load() asked for them
  std::uint64_t load_failures = 0;          ///< blocks whose read failed (IO error, bad destination)
  std::uint64_t verification_failures = 0;  ///< blocks refused: checksum mismatch or replaced while read
  std::uint64_t loaded_bytes = 0, verified_bytes = 0;
  std::uint64_t stored_layer_blocks = 0;  ///< block-layers written
  std::uint64_t stored_bytes = 0;
  std::uint64_t store_failures = 0;  ///< block-layers whose write failed or had no slot
  std::uint64_t committed_blocks = 0, commit_failures = 0;
  std::uint64_t evictions = 0;
  std::uint64_t resubmits = 0;        ///< runtime submits beyond one per operation (backpressure)
  std::uint64_t dropped_records = 0;  ///< damaged index records removed at open
  std::uint64_t visible_blocks = 0, pending_blocks = 0, slots = 0, capacity_bytes = 0;
};

/// "keys[3] (0x0a1b2c...)" style text of a key for messages: at most its first 16 bytes in hex.
inline std::string key_text(std::string_view key) {
  std::string hex;
  for (std::size_t i = 0; i < std::min<std::size_t>(key.size(), 16); ++i)
    hex += fmt::format("{:02x}", static_cast<unsigned char>(key[i]));
  return fmt::format("0x{}{}", hex, key.size() > 16 ? "..." : "");
}

template <class Runtime>
class KvStore {
 public:
  using Options = StoreOptions;

  /// Opens the store in `directory` for `ns`, creating it when absent (writers, with
  /// create_if_missing). Errors: INVALID_ARGUMENT (a namespace field or option out of range, a
  /// namespace that differs from the store's: every differing field named, a capacity that differs),
  /// BUSY (another process is the writer: its pid is named), NOT_FOUND (reader, or
  /// create_if_missing = false, and no store), RESOURCE_EXHAUSTED (not enough free space: nothing
  /// is left behind), DATA_LOSS (a layer file of the wrong size), the runtime's open errors.
  static Result<std::unique_ptr<KvStore>> open(Runtime& runtime, const std::string& directory, const Namespace& ns,
                                               const Options& options) {
    TUTTI_RETURN_IF_ERROR(ns.validate());
    if (directory.empty()) return error(StatusCode::INVALID_ARGUMENT, "directory is empty");
    if (options.io_timeout_ns == 0)
      return error(StatusCode::INVALID_ARGUMENT, "options.io_timeout_ns = 0 must be >= 1");
    auto store = std::unique_ptr<KvStore>(new KvStore(runtime, directory, ns, options));
    TUTTI_RETURN_IF_ERROR(store->open_files().with_context(fmt::format("KV store '{}'", directory)));
    return Result<std::unique_ptr<KvStore>>(std::move(store));  // explicit: nvcc does not move implicitly here
  }

  /// Waits up to options.io_timeout_ns for IO in flight, then closes the layer files and
  /// unregisters the regions registered through the store. IO still in flight then keeps its
  /// targets and memory (the runtime refuses to free them).
  ~KvStore() {
    std::vector<std::uint64_t> ids;
    {
      std::scoped_lock lock(mutex_);
      for (auto& [id, op] : ops_) ids.push_back(id);
    }
    const auto deadline = deadline_after_ns(options_.io_timeout_ns);
    for (auto id : ids) (void)wait(KvIo{id}, remaining_ns(deadline));
    for (auto t : targets_) (void)runtime_.close(t);
    for (auto& [handle, view] : memory_) (void)runtime_.unregister_memory(handle);
  }

  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const Namespace& name_space() const noexcept { return ns_; }
  const Layout& layout() const noexcept { return layout_; }
  const std::string& directory() const noexcept { return dir_; }
  bool read_only() const noexcept { return options_.read_only; }

  // ---------------------------------------------------------------------------------------------
  // Memory

  /// Registers a region with the runtime and the store (the store reads host memory to checksum
  /// it, and checks pieces against the region). Errors: the runtime's.
  Result<MemoryHandle> register_memory(const MemoryView& view) {
    auto handle = runtime_.register_memory(view);
    if (!handle) return handle.status();
    std::scoped_lock lock(mutex_);
    memory_.emplace_back(*handle, view);
    return handle;
  }

  /// Unregisters a region. Errors: INVALID_ARGUMENT (not registered through this store), BUSY
  /// (IO using it in flight), the runtime's.
  Status unregister_memory(MemoryHandle handle) {
    std::scoped_lock lock(mutex_);
    auto it = std::find_if(memory_.begin(), memory_.end(), [&](const auto& m) { return m.first == handle; });
    if (it == memory_.end())
      return error(StatusCode::INVALID_ARGUMENT, "memory = {} was not registered with this store", handle.to_string());
    TUTTI_RETURN_IF_ERROR(runtime_.unregister_memory(handle));
    memory_.erase(it);
    return Status::success();
  }

  // ---------------------------------------------------------------------------------------------
  // Lookup

  /// The number of leading keys whose blocks are visible (the stored prefix, in blocks).
  /// Errors: INVALID_ARGUMENT (a key of 0 or more than 64 bytes), the index's errors (readers).
  Result<std::size_t> lookup(std::span<const std::string_view> keys) {
    TUTTI_RETURN_IF_ERROR(check_keys(keys, false));
    counters_.lookups.fetch_add(1, std::memory_order_relaxed);
    counters_.lookup_keys.fetch_add(keys.size(), std::memory_order_relaxed);
    std::size_t hit = 0;
    if (options_.read_only) {
      auto reader = index_->reader();
      if (!reader) return reader.status();
      for (; hit < keys.size(); ++hit) {
        auto found = reader->get(keys[hit]);
        if (!found) return found.status();
        if (!*found) break;
      }
    } else {
      std::scoped_lock lock(mutex_);
      for (; hit < keys.size(); ++hit) {
        auto it = visible_.find(keys[hit]);
        if (it == visible_.end()) break;
        slots_[it->second.slot].referenced = true;
      }
    }
    counters_.lookup_hits.fetch_add(hit, std::memory_order_relaxed);
    return hit;
  }

  // ---------------------------------------------------------------------------------------------
  // Load and store: one runtime submit per call (one layer)

  /// Reads layer `layer` of each key's block into destinations[k * P + p] (P = pieces per block),
  /// in ONE runtime submit. Keys that are not visible get NOT_FOUND in their LayerResult entry and
  /// are not read; a destination piece shorter than the stored one gets OUT_OF_RANGE. Blocks read
  /// are pinned until wait() and verified there (unless options.unsafe_skip_verification).
  /// Errors (the whole call, nothing submitted): INVALID_ARGUMENT / OUT_OF_RANGE for bad keys, a
  /// layer out of range, a wrong number of pieces, a piece outside its region, misaligned or
  /// longer than the namespace's piece; BUSY after the runtime shut down.
  Result<KvIo> load(std::span<const std::string_view> keys, std::uint32_t layer, std::span<const Piece> destinations) {
    return submit_layer(KvOperation::LOAD, keys, layer, destinations);
  }

  /// Writes layer `layer` of each key's block from sources[k * P + p], in ONE runtime submit. The
  /// checksums are computed here, before the submit (host memory on this thread, DEVICE memory by
  /// the checksum kernels), so sources must not change until wait() returns. The first store of a
  /// key takes a slot (a free one, else a CLOCK victim: its record is deleted before its slot is
  /// written). Keys already visible are skipped (OK, LayerResult::skipped_blocks). A block stays
  /// invisible until commit(). Per block: RESOURCE_EXHAUSTED when every slot is pinned or pending,
  /// BUSY while the same layer of the same key is in flight, INVALID_ARGUMENT when piece lengths
  /// differ from the block's earlier layers. Errors (whole call): as load(), plus UNSUPPORTED for
  /// a reader and INVALID_ARGUMENT for a key repeated in the call.
  Result<KvIo> store(std::span<const std::string_view> keys, std::uint32_t layer, std::span<const Piece> sources) {
    return submit_layer(KvOperation::STORE, keys, layer, sources);
  }

  /// Waits up to timeout_ns for `io`, verifies (loads), updates the block states and returns the
  /// result once; the handle is then spent. Errors: NOT_FOUND (unknown or spent handle), TIMEOUT
  /// (wait again), BUSY (another thread waits for it).
  Result<LayerResult> wait(KvIo io, std::uint64_t timeout_ns) {
    std::shared_ptr<Op> op;
    {
      std::scoped_lock lock(mutex_);
      auto it = ops_.find(io.id);
      if (it == ops_.end())
        return error(StatusCode::NOT_FOUND, "io = {} is not a pending KV IO of this store (unknown or already waited)",
                     io.id);
      if (it->second->waiting) return error(StatusCode::BUSY, "io = {} is being waited for by another thread", io.id);
      op = it->second;
      if (op->finished) {  // completed during a wait_layer that then timed out
        LayerResult kept = std::move(*op->finished);
        ops_.erase(it);
        return Result<LayerResult>(std::move(kept));
      }
      op->waiting = true;
    }
    Status s = drive(*op, deadline_after_ns(timeout_ns));
    if (!s.is_ok()) {
      std::scoped_lock lock(mutex_);
      op->waiting = false;
      return s;
    }
    LayerResult result = finish(*op);
    result.io = io;
    std::scoped_lock lock(mutex_);
    ops_.erase(io.id);
    return Result<LayerResult>(std::move(result));
  }

  /// Waits up to timeout_ns for every load and store of `layer` submitted so far and returns
  /// their results in submission order (each handle is spent). Errors: INVALID_ARGUMENT (layer out
  /// of range), TIMEOUT (the results of those that completed are kept for the next wait_layer or
  /// wait), BUSY.
  Result<std::vector<LayerResult>> wait_layer(std::uint32_t layer, std::uint64_t timeout_ns) {
    TUTTI_RETURN_IF_ERROR(check_layer(layer));
    std::vector<std::uint64_t> ids;
    {
      std::scoped_lock lock(mutex_);
      for (auto& [id, op] : ops_)
        if (op->layer == layer) ids.push_back(id);
    }
    const std::uint64_t deadline = deadline_after_ns(timeout_ns);
    std::vector<LayerResult> out;
    for (auto id : ids) {
      std::shared_ptr<Op> op;
      {
        std::scoped_lock lock(mutex_);
        auto it = ops_.find(id);
        if (it == ops_.end()) continue;  // another thread waited for it
        op = it->second;
      }
      auto r = wait(KvIo{id}, remaining_ns(deadline));
      if (!r) {
        // Keep what already completed for a later call.
        std::scoped_lock lock(mutex_);
        for (auto& done : out) {
          auto kept = std::make_shared<Op>();
          kept->layer = done.layer;
          const std::uint64_t kept_id = done.io.id;
          kept->finished = std::move(done);
          ops_.emplace(kept_id, std::move(kept));
        }
        return r.status();
      }
      out.push_back(std::move(*r));
    }
    return Result<std::vector<LayerResult>>(std::move(out));
  }

  /// Makes the keys' pending blocks visible: every layer must have been stored (and waited for)
  /// without error. Flushes the layer files written since the last commit through the runtime,
  /// then commits their records in one LMDB transaction. Returns one Status per key: OK (visible,
  /// also when it already was), NOT_FOUND (never stored), NOT_READY (layers missing or in flight:
  /// it stays pending), or the failure that dropped the pending block (a failed layer write, a
  /// flush error, an index commit error such as RESOURCE_EXHAUSTED for ENOSPC or a full index map:
  /// its slot is freed and it never becomes visible). Errors (whole call): bad keys, UNSUPPORTED
  /// for readers, TIMEOUT when the flush did not finish (the blocks stay pending: commit again).
  Result<std::vector<Status>> commit(std::span<const std::string_view> keys, std::uint64_t timeout_ns) {
    TUTTI_RETURN_IF_ERROR(check_writer("commit"));
    TUTTI_RETURN_IF_ERROR(check_keys(keys, false));
    std::vector<Status> out(keys.size());
    std::vector<std::string> ready;
    std::vector<std::uint64_t> flush_upto(layout_.layers);
    {
      std::scoped_lock lock(mutex_);
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const std::string key(keys[k]);
        if (visible_.count(key)) continue;
        auto it = pending_.find(key);
        if (it == pending_.end()) {
          out[k] = error(StatusCode::NOT_FOUND, "keys[{}] ({}) has no pending block (store every layer first)", k,
                         key_text(key));
          continue;
        }
        Pending& p = it->second;
        if (!p.failure.is_ok()) {
          out[k] = p.failure;
          slots_.release(p.slot);
          pending_.erase(it);
          counters_.commit_failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        if (p.committing) {
          out[k] = error(StatusCode::BUSY, "keys[{}] ({}) is being committed by another thread", k, key_text(key));
          continue;
        }
        std::uint32_t missing = 0, in_flight = 0;
        for (auto st : p.layer_state) {
          missing += st == LayerState::NONE ? 1 : 0;
          in_flight += st == LayerState::IN_FLIGHT ? 1 : 0;
        }
        if (missing + in_flight > 0) {
          out[k] = error(StatusCode::NOT_READY,
                         "keys[{}] ({}): {} of {} layers not stored yet and {} in flight (wait for them); it stays "
                         "pending",
                         k, key_text(key), missing, layout_.layers, in_flight);
          continue;
        }
        p.committing = true;
        ready.push_back(key);
      }
      for (std::uint32_t l = 0; l < layout_.layers; ++l) flush_upto[l] = written_[l];
    }
    if (ready.empty()) return Result<std::vector<Status>>(std::move(out));

    // 1. Flush every layer file written since the last commit (data durable before the record).
    std::vector<IoRequest> flushes;
    std::vector<std::uint32_t> flushed_layers;
    for (std::uint32_t l = 0; l < layout_.layers; ++l)
      if (flush_upto[l] > flushed_[l]) {
        flushes.push_back(IoRequest{Direction::FLUSH, MemoryHandle{}, 0, targets_[l], 0, 0});
        flushed_layers.push_back(l);
      }
    Status flushed = run_requests(flushes, deadline_after_ns(timeout_ns));

    std::scoped_lock lock(mutex_);
    if (flushed.code() == StatusCode::TIMEOUT) {
      for (auto& key : ready) pending_.at(key).committing = false;
      return flushed.with_context("commit: flush of the layer files");
    }
    Index::Batch batch;
    std::vector<BlockRecord> records;
    std::uint64_t generation = next_generation_;
    if (flushed.is_ok()) {
      for (std::size_t i = 0; i < flushes.size(); ++i)
        flushed_[flushed_layers[i]] = std::max(flushed_[flushed_layers[i]], flush_upto[flushed_layers[i]]);
      for (auto& key : ready) {
        Pending& p = pending_.at(key);
        BlockRecord r{p.slot, generation++, p.piece_lengths, p.checksums};
        batch.puts.emplace_back(key, encode_record(key, r, layout_.layers));
        records.push_back(std::move(r));
      }
      batch.meta.emplace_back("next_generation", u64_bytes(generation));
    }
    Status committed = flushed.is_ok() ? index_->apply(batch).with_context("commit")
                                       : flushed.with_context("commit: flush of the layer files");
    for (std::size_t i = 0; i < ready.size(); ++i) {
      auto it = pending_.find(ready[i]);
      Pending& p = it->second;
      if (committed.is_ok()) {
        Slot& slot = slots_[p.slot];
        slot.state = SlotState::VISIBLE;
        slot.generation = records[i].generation;
        slot.referenced = true;
        slot.key = visible_.emplace(ready[i], std::move(records[i])).first->first;
        counters_.committed_blocks.fetch_add(1, std::memory_order_relaxed);
      } else {
        slots_.release(p.slot);
        counters_.commit_failures.fetch_add(1, std::memory_order_relaxed);
      }
      pending_.erase(it);
    }
    if (committed.is_ok()) next_generation_ = generation;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (!out[k].is_ok()) continue;
      if (!committed.is_ok() && std::find(ready.begin(), ready.end(), std::string(keys[k])) != ready.end())
        out[k] = committed.with_context(fmt::format("keys[{}] ({}) not made visible", k, key_text(keys[k])));
    }
    return Result<std::vector<Status>>(std::move(out));
  }

  /// Drops the keys' pending blocks (stored layers are forgotten, slots freed). Keys without a
  /// pending block are ignored. Errors: bad keys, UNSUPPORTED for readers, BUSY while a layer of
  /// one of them is in flight or being committed (nothing is dropped).
  Status discard(std::span<const std::string_view> keys) {
    TUTTI_RETURN_IF_ERROR(check_writer("discard"));
    TUTTI_RETURN_IF_ERROR(check_keys(keys, false));
    std::scoped_lock lock(mutex_);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto it = pending_.find(std::string(keys[k]));
      if (it == pending_.end()) continue;
      const bool busy = it->second.committing || std::count(it->second.layer_state.begin(),
                                                            it->second.layer_state.end(), LayerState::IN_FLIGHT) > 0;
      if (busy)
        return error(StatusCode::BUSY, "keys[{}] ({}) has a store in flight or a commit running", k, key_text(keys[k]));
    }
    for (auto key : keys) {
      auto it = pending_.find(std::string(key));
      if (it == pending_.end()) continue;
      slots_.release(it->second.slot);
      pending_.erase(it);
    }
    return Status::success();
  }

  // ---------------------------------------------------------------------------------------------
  // Pins and eviction

  /// Pins visible blocks so eviction skips them (counted: pin twice, unpin twice). Errors: bad
  /// keys, UNSUPPORTED for readers, NOT_FOUND naming the first key that is not visible (nothing is
  /// pinned then).
  Status pin(std::span<const std::string_view> keys) {
    TUTTI_RETURN_IF_ERROR(check_writer("pin"));
    TUTTI_RETURN_IF_ERROR(check_keys(keys, false));
    std::scoped_lock lock(mutex_);
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (!visible_.count(std::string(keys[k])))
        return error(StatusCode::NOT_FOUND, "keys[{}] ({}) is not a visible block; nothing was pinned", k,
                     key_text(keys[k]));
    for (auto key : keys) ++slots_[visible_.at(std::string(key)).slot].pins;
    return Status::success();
  }

  /// Undoes pin(). Errors: as pin(), and INVALID_ARGUMENT for a key not pinned (nothing unpinned).
  Status unpin(std::span<const std::string_view> keys) {
    TUTTI_RETURN_IF_ERROR(check_writer("unpin"));
    TUTTI_RETURN_IF_ERROR(check_keys(keys, false));
    std::scoped_lock lock(mutex_);
    std::map<std::uint32_t, std::uint32_t> wanted;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto it = visible_.find(std::string(keys[k]));
      if (it == visible_.end())
        return error(StatusCode::NOT_FOUND, "keys[{}] ({}) is not a visible block; nothing was unpinned", k,
                     key_text(keys[k]));
      if (++wanted[it->second.slot] > slots_[it->second.slot].pins)
        return error(StatusCode::INVALID_ARGUMENT, "keys[{}] ({}) is not pinned (pins = {}); nothing was unpinned", k,
                     key_text(keys[k]), slots_[it->second.slot].pins);
    }
    for (auto [slot, n] : wanted) slots_[slot].pins -= n;
    return Status::success();
  }

  /// Removes visible, unpinned blocks (their records first, in one LMDB transaction). Keys not
  /// visible and pinned blocks are skipped. Returns how many were evicted. Errors: bad keys,
  /// UNSUPPORTED for readers, the index's errors (nothing evicted).
  Result<std::size_t> evict(std::span<const std::string_view> keys) {
    TUTTI_RETURN_IF_ERROR(check_writer("evict"));
    TUTTI_RETURN_IF_ERROR(check_keys(keys, false));
    std::scoped_lock lock(mutex_);
    std::vector<std::uint32_t> victims;
    for (auto key : keys) {
      auto it = visible_.find(std::string(key));
      if (it == visible_.end() || slots_[it->second.slot].pins > 0) continue;
      if (std::find(victims.begin(), victims.end(), it->second.slot) == victims.end())
        victims.push_back(it->second.slot);
    }
    TUTTI_RETURN_IF_ERROR(evict_locked(victims));
    for (auto s : victims) slots_.release(s);
    return victims.size();
  }

  /// A snapshot of the counters and of the current block counts.
  Statistics statistics() const {
    Statistics s;
    s.lookups = counters_.lookups.load();
    s.lookup_keys = counters_.lookup_keys.load();
    s.lookup_hits = counters_.lookup_hits.load();
    s.load_blocks = counters_.load_blocks.load();
    s.hits = counters_.hits.load();
    s.misses = counters_.misses.load();
    s.load_failures = counters_.load_failures.load();
    s.verification_failures = counters_.verification_failures.load();
    s.loaded_bytes = counters_.loaded_bytes.load();
    s.verified_bytes = counters_.verified_bytes.load();
    s.stored_layer_blocks = counters_.stored_layer_blocks.load();
    s.stored_bytes = counters_.stored_bytes.load();
    s.store_failures = counters_.store_failures.load();
    s.committed_blocks = counters_.committed_blocks.load();
    s.commit_failures = counters_.commit_failures.load();
    s.evictions = counters_.evictions.load();
    s.resubmits = counters_.resubmits.load();
    s.dropped_records = counters_.dropped_records.load();
    std::scoped_lock lock(mutex_);
    s.visible_blocks = visible_.size();
    s.pending_blocks = pending_.size();
    s.slots = layout_.slots;
    s.capacity_bytes = layout_.total_bytes();
    return s;
  }

 private:
  enum class LayerState : std::uint8_t { NONE, IN_FLIGHT, WRITTEN };

  struct Pending {
    std::uint32_t slot = 0;
    std::vector<std::uint64_t> piece_lengths;  // set by the first layer stored
    std::vector<std::uint64_t> checksums;      // [layer * P + piece]
    std::vector<LayerState> layer_state;
    Status failure;
    bool committing = false;
  };

  /// One piece to checksum: where its bytes are and what is expected (loads).
  struct PieceCheck {
    const void* address = nullptr;
    std::uint64_t length = 0;
    bool device = false;
    std::uint64_t expected = 0;
    bool hashed = false;  // loads into host memory: checksummed as its read completed (`value`)
    std::uint64_t value = 0;
  };

  struct Op {
    KvOperation operation = KvOperation::LOAD;
    std::uint32_t layer = 0;
    std::vector<std::string> keys;
    std::vector<Status> blocks;             // initial per-block state (OK = submitted or skipped)
    std::vector<bool> submitted;            // block k has requests
    std::vector<bool> skipped;              // store: already visible
    std::vector<std::uint32_t> slot;        // block k's slot
    std::vector<std::uint64_t> generation;  // load: the record's generation when it was looked up
    std::vector<PieceCheck> checks;         // [k * P + p]
    std::vector<std::uint64_t> block_bytes;
    std::vector<IoRequest> requests;
    std::vector<std::size_t> request_block;
    std::vector<std::size_t> request_check;  // load: the index in `checks` of the piece request i reads
    std::vector<Status> request_status;
    std::vector<bool> request_done;
    std::vector<std::size_t> unsubmitted;  // request indices not accepted yet (backpressure)
    std::vector<std::size_t> in_flight;    // request index of each position of the batch `io` was submitted with
    IoHandle io;
    bool waiting = false;
    std::optional<LayerResult> finished;  // kept by wait_layer after a TIMEOUT
  };

  struct Counters {
    std::atomic<std::uint64_t> lookups{0}, lookup_keys{0}, lookup_hits{0}, load_blocks{0}, hits{0}, misses{0},
        load_failures{0}, verification_failures{0}, loaded_bytes{0}, verified_bytes{0}, stored_layer_blocks{0},
        stored_bytes{0}, store_failures{0}, committed_blocks{0}, commit_failures{0}, evictions{0}, resubmits{0},
        dropped_records{0};
  };

  KvStore(Runtime& runtime, std::string dir, const Namespace& ns, const Options& options)
      : runtime_(runtime),
        dir_(std::move(dir)),
        ns_(ns),
        options_(options),
        slots_(0),
        host_checksum_threads_(
            options.host_checksum_threads != 0
                ? options.host_checksum_threads
                : std::clamp<std::uint32_t>(std::thread::hardware_concurrency(), 1, StoreOptions::kMaxChecksumThreads)),
        hasher_(options.checksum_stream) {}

  static std::string u64_bytes(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

  // --- open ------------------------------------------------------------------------------------

  std::uint64_t default_map_bytes(const Layout& l) const {
    const std::uint64_t record = 32 + 8 * (l.pieces() + std::uint64_t{l.layers} * l.pieces()) + 8;
    const std::uint64_t per_block = (record + kMaxKeyBytes + 64) * 3;
    return round_up(std::max<std::uint64_t>(std::uint64_t{16} << 20, l.slots * per_block + (std::uint64_t{4} << 20)),
                    std::uint64_t{1} << 20);
  }

  Status open_files() {
    struct stat st {};
    const bool exists = ::stat(dir_.c_str(), &st) == 0;
    if (exists && !S_ISDIR(st.st_mode)) return error(StatusCode::INVALID_ARGUMENT, "'{}' is not a directory", dir_);
    if (options_.read_only) {
      if (!exists || ::access((dir_ + "/index.mdb").c_str(), F_OK) != 0)
        return error(StatusCode::NOT_FOUND, "no KV store in '{}' (a reader does not create one)", dir_);
      auto index = Index::open(dir_, true, 0);
      if (!index) return index.status();
      index_ = std::move(index.value());
      TUTTI_RETURN_IF_ERROR(read_format());
      return open_targets();
    }
    bool created_dir = false;
    if (!exists) {
      if (!options_.create_if_missing)
        return error(StatusCode::NOT_FOUND, "'{}' does not exist and options.create_if_missing = false", dir_);
      if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST)
        return errno_status(errno, fmt::format("mkdir '{}'", dir_));
      created_dir = true;
    }
    auto lock = WriterLock::acquire(dir_);
    if (!lock) {
      if (created_dir) ::rmdir(dir_.c_str());
      return lock.status();
    }
    lock_ = std::move(lock.value());
    bool have_format = false;
    if (::access((dir_ + "/index.mdb").c_str(), F_OK) == 0) {
      auto index =
          Index::open(dir_, false, options_.index_map_bytes ? options_.index_map_bytes : (std::uint64_t{16} << 20));
      if (!index) return index.status();
      index_ = std::move(index.value());
      auto reader = index_->reader();
      if (!reader) return reader.status();
      auto format = reader->get("format", true);
      if (!format) return format.status();
      have_format = format->has_value();
    }
    if (!have_format) {
      // No store, or a creation that did not finish (the format record is written last).
      index_.reset();
      if (!options_.create_if_missing)
        return error(StatusCode::NOT_FOUND, "no KV store in '{}' and options.create_if_missing = false", dir_);
      Status s = create();
      if (!s.is_ok()) {
        remove_store_files();
        lock_.remove_file();
        lock_ = WriterLock();
        if (created_dir) ::rmdir(dir_.c_str());
        return s;
      }
    } else {
      TUTTI_RETURN_IF_ERROR(read_format());
      const std::uint64_t map = options_.index_map_bytes ? options_.index_map_bytes : default_map_bytes(layout_);
      index_.reset();  // reopen with the layout's map size
      auto index = Index::open(dir_, false, map);
      if (!index) return index.status();
      index_ = std::move(index.value());
      TUTTI_RETURN_IF_ERROR(recover());
    }
    return open_targets();
  }

  void remove_store_files() {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ignored)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("layer-", 0) == 0 || name.rfind(".creating-layer-", 0) == 0 || name == "index.mdb" ||
          name == "index.mdb-lock")
        std::filesystem::remove(entry.path(), ignored);
    }
    (void)detail::fsync_directory(dir_);
  }

  Status create() {
    if (options_.capacity_bytes == 0)
      return error(StatusCode::INVALID_ARGUMENT, "options.capacity_bytes = 0: a new store needs its byte bound");
    auto layout = Layout::compute(ns_, options_.capacity_bytes);
    if (!layout) return layout.status();
    layout_ = *layout;
    remove_store_files();  // leftovers of a creation that crashed
    const std::uint64_t map = options_.index_map_bytes ? options_.index_map_bytes : default_map_bytes(layout_);
    TUTTI_RETURN_IF_ERROR(create_layer_files(dir_, layout_, std::uint64_t{1} << 20));
    auto index = Index::open(dir_, false, map);
    if (!index) return index.status();
    index_ = std::move(index.value());
    nlohmann::json format{{"format_version", kFormatVersion},
                          {"namespace", ns_.to_json()},
                          {"layout", layout_.to_json()},
                          {"capacity_bytes", options_.capacity_bytes}};
    Index::Batch batch;
    batch.meta.emplace_back("next_generation", u64_bytes(1));
    batch.meta.emplace_back("format", format.dump());  // written last: its presence means complete
    TUTTI_RETURN_IF_ERROR(index_->apply(batch).with_context("create the index"));
    capacity_bytes_ = options_.capacity_bytes;
    slots_ = SlotTable(layout_.slots);
    next_generation_ = 1;
    written_.assign(layout_.layers, 0);
    flushed_.assign(layout_.layers, 0);
    return Status::success();
  }

  Status read_format() {
    auto reader = index_->reader();
    if (!reader) return reader.status();
    auto format = reader->get("format", true);
    if (!format) return format.status();
    if (!*format) return error(StatusCode::DATA_LOSS, "the index of '{}' has no format record", dir_);
    nlohmann::json j = nlohmann::json::parse(**format, nullptr, false);
    if (j.is_discarded() || !j.contains("format_version") || !j.contains("namespace") || !j.contains("layout"))
      return error(StatusCode::DATA_LOSS, "the format record of '{}' is unreadable", dir_);
    if (j["format_version"] != kFormatVersion)
      return error(StatusCode::UNSUPPORTED, "the store in '{}' has format version {}; this build reads version {}",
                   dir_, j["format_version"].dump(), kFormatVersion);
    auto stored = Namespace::from_json(j["namespace"]);
    if (!stored) return stored.status();
    if (auto diff = Namespace::differences(*stored, ns_); !diff.empty())
      return error(StatusCode::INVALID_ARGUMENT, "the namespace differs from the store's: {}", diff);
    auto layout = Layout::from_json(j["layout"]);
    if (!layout) return layout.status();
    layout_ = *layout;
    capacity_bytes_ = j.value("capacity_bytes", std::uint64_t{0});
    if (options_.capacity_bytes != 0 && options_.capacity_bytes != capacity_bytes_)
      return error(StatusCode::INVALID_ARGUMENT,
                   "options.capacity_bytes = {} differs from the store's {} (resizing is not supported; pass 0 to take "
                   "the store's)",
                   options_.capacity_bytes, capacity_bytes_);
    auto generation = reader->get("next_generation", true);
    if (!generation) return generation.status();
    next_generation_ =
        (*generation && (*generation)->size() == 8) ? detail::get<std::uint64_t>((*generation)->data()) : 1;
    for (std::uint32_t l = 0; l < layout_.layers; ++l) {
      const std::string path = dir_ + "/" + Layout::file_name(l);
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) return errno_status(errno, fmt::format("stat '{}'", path));
      if (static_cast<std::uint64_t>(st.st_size) != layout_.file_bytes())
        return error(StatusCode::DATA_LOSS, "'{}' has {} bytes; the layout says {}", path, st.st_size,
                     layout_.file_bytes());
    }
    slots_ = SlotTable(layout_.slots);
    written_.assign(layout_.layers, 0);
    flushed_.assign(layout_.layers, 0);
    return Status::success();
  }

  /// Rebuilds the slot table and the in-memory index from the records; damaged records (bad
  /// checksum, slot out of range, slot claimed twice) are deleted and counted, never served.
  Status recover() {
    std::vector<std::string> damaged;
    {
      auto reader = index_->reader();
      if (!reader) return reader.status();
      auto records = reader->count();
      if (!records) return records.status();
      visible_.reserve(std::min<std::uint64_t>(*records, layout_.slots));
      TUTTI_RETURN_IF_ERROR(reader->scan([&](std::string_view key, std::string_view value) {
        auto record = decode_record(key, value, layout_.layers, layout_.pieces());
        if (!record || key.empty() || key.size() > kMaxKeyBytes ||
            !slots_.claim_visible(record->slot, record->generation)) {
          damaged.emplace_back(key);
          return Status::success();
        }
        const std::uint32_t slot = record->slot;
        slots_[slot].key = visible_.emplace(std::string(key), std::move(record.value())).first->first;
        return Status::success();
      }));
    }
    slots_.rebuild_free_list();
    if (!damaged.empty()) {
      Index::Batch batch;
      batch.deletes = damaged;
      TUTTI_RETURN_IF_ERROR(index_->apply(batch).with_context("delete damaged index records"));
      counters_.dropped_records.fetch_add(damaged.size(), std::memory_order_relaxed);
    }
    return Status::success();
  }

  Status open_targets() {
    std::vector<std::string> uris;
    for (std::uint32_t l = 0; l < layout_.layers; ++l) uris.push_back("file://" + dir_ + "/" + Layout::file_name(l));
    OpenOptions o;
    o.writable = !options_.read_only;
    auto opened = runtime_.open_batch(uris, o);
    Status failure;
    for (auto& t : opened) {
      if (t)
        targets_.push_back(*t);
      else if (failure.is_ok())
        failure = t.status();
    }
    if (!failure.is_ok()) {
      for (auto t : targets_) (void)runtime_.close(t);
      targets_.clear();
      return failure;
    }
    return Status::success();
  }

  // --- validation ------------------------------------------------------------------------------

  Status check_writer(std::string_view what) const {
    if (options_.read_only)
      return error(StatusCode::UNSUPPORTED, "{}: this store was opened read-only (options.read_only = true)", what);
    return Status::success();
  }

  Status check_layer(std::uint32_t layer) const {
    if (layer >= layout_.layers)
      return error(StatusCode::INVALID_ARGUMENT, "layer = {} is out of range: the store has layers 0..{}", layer,
                   layout_.layers - 1);
    return Status::success();
  }

  static Status check_keys(std::span<const std::string_view> keys, bool unique) {
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (keys[k].empty() || keys[k].size() > kMaxKeyBytes)
        return error(StatusCode::INVALID_ARGUMENT, "keys[{}] has {} bytes; a key has 1..{} bytes", k, keys[k].size(),
                     kMaxKeyBytes);
    if (unique) {
      std::unordered_map<std::string_view, std::size_t> seen;
      for (std::size_t k = 0; k < keys.size(); ++k)
        if (auto [it, fresh] = seen.emplace(keys[k], k); !fresh)
          return error(StatusCode::INVALID_ARGUMENT, "keys[{}] ({}) repeats keys[{}]; a store names each block once", k,
                       key_text(keys[k]), it->second);
    }
    return Status::success();
  }

  /// Checks every piece (mutex_ held) and returns the region of each.
  Status check_pieces(std::string_view field, std::size_t blocks, std::span<const Piece> pieces,
                      std::vector<const MemoryView*>& views) const {
    const std::size_t P = layout_.pieces();
    if (pieces.size() != blocks * P)
      return error(StatusCode::INVALID_ARGUMENT, "{}.size() = {} must be keys.size() = {} x {} pieces per block = {}",
                   field, pieces.size(), blocks, P, blocks * P);
    views.resize(pieces.size());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& piece = pieces[i];
      const std::uint64_t full = layout_.piece_bytes[i % P];
      auto it = std::find_if(memory_.begin(), memory_.end(), [&](const auto& m) { return m.first == piece.memory; });
      if (it == memory_.end())
        return error(StatusCode::INVALID_ARGUMENT,
                     "{}[{}].memory = {} is not registered with this store (KvStore::register_memory)", field, i,
                     piece.memory.to_string());
      if (piece.length == 0 || piece.length > full)
        return error(StatusCode::INVALID_ARGUMENT, "{}[{}].length = {} is outside 1..{} (namespace.piece_bytes[{}])",
                     field, i, piece.length, full, i % P);
      const MemoryView& view = it->second;
      const std::uint64_t span = round_up(piece.length, kAlignment);
      if (piece.offset > view.size || span > view.size - piece.offset)
        return error(StatusCode::OUT_OF_RANGE,
                     "{}[{}]: offset = {} + {} bytes (the length {} rounded up to {}) reaches past the registered "
                     "region of {} bytes",
                     field, i, piece.offset, span, piece.length, kAlignment, view.size);
      const auto address = reinterpret_cast<std::uintptr_t>(view.address) + piece.offset;
      if (address % kAlignment != 0)
        return error(StatusCode::INVALID_ARGUMENT, "{}[{}]: address + offset = {:#x} is not a multiple of {} bytes",
                     field, i, address, kAlignment);
      views[i] = &view;
    }
    return Status::success();
  }

  // --- submit ----------------------------------------------------------------------------------

  Result<KvIo> submit_layer(KvOperation operation, std::span<const std::string_view> keys, std::uint32_t layer,
                            std::span<const Piece> pieces) {
    const bool load = operation == KvOperation::LOAD;
    const std::string_view field = load ? "destinations" : "sources";
    if (!load) TUTTI_RETURN_IF_ERROR(check_writer("store"));
    TUTTI_RETURN_IF_ERROR(check_keys(keys, !load));
    TUTTI_RETURN_IF_ERROR(check_layer(layer));
    const std::size_t P = layout_.pieces();
    auto op = std::make_shared<Op>();
    op->operation = operation;
    op->layer = layer;
    op->blocks.resize(keys.size());
    op->submitted.assign(keys.size(), false);
    op->skipped.assign(keys.size(), false);
    op->slot.assign(keys.size(), 0);
    op->generation.assign(keys.size(), 0);
    op->block_bytes.assign(keys.size(), 0);
    op->checks.resize(pieces.size());
    for (auto k : keys) op->keys.emplace_back(k);

    std::vector<const MemoryView*> views;
    std::optional<Index::Reader> reader;
    if (load && options_.read_only) {
      auto r = index_->reader();
      if (!r) return r.status();
      reader.emplace(std::move(r.value()));
    }
    std::unique_lock lock(mutex_);
    TUTTI_RETURN_IF_ERROR(check_pieces(field, keys.size(), pieces, views));
    if (load) {
      counters_.load_blocks.fetch_add(keys.size(), std::memory_order_relaxed);
      for (std::size_t k = 0; k < keys.size(); ++k) {
        std::optional<BlockRecord> record;
        if (reader) {
          auto found = reader->get(keys[k]);
          if (!found) return found.status();
          if (*found) {
            auto decoded = decode_record(keys[k], **found, layout_.layers, P);
            if (!decoded) {
              op->blocks[k] = decoded.status();
              counters_.verification_failures.fetch_add(1, std::memory_order_relaxed);
              continue;
            }
            record = std::move(decoded.value());
          }
        } else if (auto it = visible_.find(op->keys[k]); it != visible_.end()) {
          record = it->second;
        }
        if (!record) {
          op->blocks[k] = error(StatusCode::NOT_FOUND, "keys[{}] ({}) is not stored", k, key_text(keys[k]));
          counters_.misses.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        Status fits;
        for (std::size_t p = 0; p < P && fits.is_ok(); ++p)
          if (pieces[k * P + p].length < record->piece_lengths[p])
            fits = error(StatusCode::OUT_OF_RANGE,
                         "{}[{}].length = {} is below the stored piece's {} bytes (keys[{}] ({}), piece {})", field,
                         k * P + p, pieces[k * P + p].length, record->piece_lengths[p], k, key_text(keys[k]), p);
        if (!fits.is_ok()) {
          op->blocks[k] = fits;
          counters_.load_failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        op->slot[k] = record->slot;
        op->generation[k] = record->generation;
        op->submitted[k] = true;
        for (std::size_t p = 0; p < P; ++p) {
          const Piece& piece = pieces[k * P + p];
          const MemoryView& view = *views[k * P + p];
          const std::uint64_t length = record->piece_lengths[p];
          op->checks[k * P + p] = PieceCheck{static_cast<const std::uint8_t*>(view.address) + piece.offset, length,
                                             view.kind == MemoryKind::DEVICE, record->checksums[layer * P + p]};
          op->block_bytes[k] += length;
          op->requests.push_back(IoRequest{Direction::READ, piece.memory, piece.offset, targets_[layer],
                                           layout_.offset(record->slot, p), round_up(length, kAlignment)});
          op->request_block.push_back(k);
          op->request_check.push_back(k * P + p);
        }
        if (!reader) {
          ++slots_[record->slot].pins;  // not evicted while it is read
          slots_[record->slot].referenced = true;
        }
      }
    } else {
      TUTTI_RETURN_IF_ERROR(prepare_store(*op, keys, pieces, views));
    }
    lock.unlock();

    if (!load) {
      // Checksums where the bytes are, before they go out.
      Status hashed = checksum(op->checks);
      std::scoped_lock relock(mutex_);
      for (std::size_t k = 0; k < keys.size(); ++k) {
        if (!op->submitted[k]) continue;
        Pending& p = pending_.at(op->keys[k]);
        if (!hashed.is_ok()) {
          op->blocks[k] = hashed.with_context("checksum of the sources");
          op->submitted[k] = false;
          p.layer_state[layer] = LayerState::NONE;
          continue;
        }
        for (std::size_t j = 0; j < P; ++j) p.checksums[layer * P + j] = op->checks[k * P + j].expected;
      }
      if (!hashed.is_ok()) {
        std::vector<IoRequest> kept;
        std::vector<std::size_t> kept_block;
        op->requests.swap(kept);
        op->request_block.swap(kept_block);
      }
    }

    op->request_status.resize(op->requests.size());
    op->request_done.assign(op->requests.size(), false);
    for (std::size_t i = 0; i < op->requests.size(); ++i) op->unsubmitted.push_back(i);
    submit_some(*op);  // ONE runtime submit for the layer (more only under backpressure, in wait)
    std::scoped_lock relock(mutex_);
    const std::uint64_t id = next_io_++;
    ops_.emplace(id, op);
    return KvIo{id};
  }

  /// Store bookkeeping for submit_layer (mutex_ held): slots, evictions, requests.
  Status prepare_store(Op& op, std::span<const std::string_view> keys, std::span<const Piece> pieces,
                       const std::vector<const MemoryView*>& views) {
    const std::size_t P = layout_.pieces();
    const std::uint32_t layer = op.layer;
    // Keys of this call that are visible are held so the clock cannot pick them for the others.
    std::vector<std::uint32_t> held;
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (auto it = visible_.find(op.keys[k]); it != visible_.end()) {
        ++slots_[it->second.slot].pins;
        held.push_back(it->second.slot);
      }
    std::vector<bool> chosen(layout_.slots, false);
    std::vector<std::uint32_t> victims;
    std::vector<std::size_t> need_slot;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const std::string& key = op.keys[k];
      if (visible_.count(key)) {
        op.skipped[k] = true;
        continue;
      }
      std::vector<std::uint64_t> lengths(P);
      for (std::size_t p = 0; p < P; ++p) lengths[p] = pieces[k * P + p].length;
      if (auto it = pending_.find(key); it != pending_.end()) {
        Pending& pending = it->second;
        if (pending.committing || pending.layer_state[layer] == LayerState::IN_FLIGHT) {
          op.blocks[k] = error(StatusCode::BUSY, "keys[{}] ({}): layer {} is in flight or being committed", k,
                               key_text(key), layer);
          continue;
        }
        if (pending.piece_lengths != lengths) {
          op.blocks[k] =
              error(StatusCode::INVALID_ARGUMENT,
                    "{}[{}..{}]: piece lengths differ from those of the block's earlier layers (keys[{}] ({}), "
                    "piece 0: {} vs {} bytes)",
                    "sources", k * P, k * P + P - 1, k, key_text(key), lengths[0], pending.piece_lengths[0]);
          continue;
        }
        op.slot[k] = pending.slot;
        op.submitted[k] = true;
        continue;
      }
      if (slots_.free_count() > need_slot.size()) {
        need_slot.push_back(k);
        continue;
      }
      auto victim = slots_.next_victim(chosen);
      if (!victim) {
        op.blocks[k] =
            error(StatusCode::RESOURCE_EXHAUSTED,
                  "keys[{}] ({}): no slot: all {} slots hold pinned or pending blocks (capacity_bytes = {}); "
                  "unpin or commit blocks, or open a larger store",
                  k, key_text(key), layout_.slots, layout_.total_bytes());
        counters_.store_failures.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      chosen[*victim] = true;
      victims.push_back(*victim);
      need_slot.push_back(k);
    }
    for (auto s : held) --slots_[s].pins;
    // Victims' records go first, durably, before any of their slots is written.
    if (Status s = evict_locked(victims); !s.is_ok()) {
      for (auto k : need_slot) {
        op.blocks[k] = s.with_context("evict to make room");
        counters_.store_failures.fetch_add(1, std::memory_order_relaxed);
      }
      need_slot.clear();
    } else {
      for (auto v : victims) slots_.release(v);
    }
    for (auto k : need_slot) {
      auto slot = slots_.take_free();
      if (!slot) {  // cannot happen: free slots and victims were counted
        op.blocks[k] = error(StatusCode::INTERNAL, "keys[{}]: no free slot after eviction", k);
        continue;
      }
      Pending pending;
      pending.slot = *slot;
      pending.piece_lengths.resize(P);
      for (std::size_t p = 0; p < P; ++p) pending.piece_lengths[p] = pieces[k * P + p].length;
      pending.checksums.assign(std::size_t{layout_.layers} * P, 0);
      pending.layer_state.assign(layout_.layers, LayerState::NONE);
      slots_[*slot].key = pending_.emplace(op.keys[k], std::move(pending)).first->first;
      op.slot[k] = *slot;
      op.submitted[k] = true;
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      if (!op.submitted[k]) continue;
      pending_.at(op.keys[k]).layer_state[layer] = LayerState::IN_FLIGHT;
      for (std::size_t p = 0; p < P; ++p) {
        const Piece& piece = pieces[k * P + p];
        const MemoryView& view = *views[k * P + p];
        op.checks[k * P + p] = PieceCheck{static_cast<const std::uint8_t*>(view.address) + piece.offset, piece.length,
                                          view.kind == MemoryKind::DEVICE, 0};
        op.block_bytes[k] += piece.length;
        op.requests.push_back(IoRequest{Direction::WRITE, piece.memory, piece.offset, targets_[layer],
                                        layout_.offset(op.slot[k], p), round_up(piece.length, kAlignment)});
        op.request_block.push_back(k);
      }
    }
    return Status::success();
  }

  /// Deletes the records of `victims` (visible slots) in one transaction and forgets them (mutex_
  /// held). The slots are not released here.
  Status evict_locked(const std::vector<std::uint32_t>& victims) {
    if (victims.empty()) return Status::success();
    Index::Batch batch;
    for (auto s : victims) batch.deletes.emplace_back(slots_[s].key);
    TUTTI_RETURN_IF_ERROR(index_->apply(batch).with_context("evict"));
    for (const auto& key : batch.deletes) visible_.erase(key);  // the slots' key views die here
    counters_.evictions.fetch_add(victims.size(), std::memory_order_relaxed);
    return Status::success();
  }

  /// XXH3-64 of each check's bytes into check.expected (stores) — host memory here, device memory
  /// through the checksum kernels in one batch.
  Status checksum(std::vector<PieceCheck>& checks) { return hash_into(checks, true); }

  /// Computes the checksums of `checks`; into .expected (assign) or compared (returns per check).
  Status hash_into(std::vector<PieceCheck>& checks, bool assign, std::vector<bool>* matches = nullptr) {
    std::vector<HashInput> device_inputs;
    std::vector<std::size_t> device_index, host_index;
    std::vector<std::uint64_t> values(checks.size());
    std::uint64_t host_bytes = 0;
    for (std::size_t i = 0; i < checks.size(); ++i) {
      if (checks[i].address == nullptr) continue;  // block not submitted
      if (checks[i].hashed) {                      // checksummed as its read completed
        values[i] = checks[i].value;
        continue;
      }
      if (checks[i].device) {
        device_inputs.push_back({checks[i].address, checks[i].length});
        device_index.push_back(i);
      } else {
        host_index.push_back(i);
        host_bytes += checks[i].length;
      }
    }
    // Host pieces on up to host_checksum_threads threads (the caller is one), one piece at a time.
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t n = next.fetch_add(1); n < host_index.size(); n = next.fetch_add(1))
        values[host_index[n]] = host_checksum(checks[host_index[n]].address, checks[host_index[n]].length);
    };
    const std::uint64_t threads = std::min<std::uint64_t>(
        {host_checksum_threads_, host_index.size(), host_bytes / StoreOptions::kChecksumBytesPerThread + 1});
    {
      std::vector<std::jthread> helpers;
      for (std::uint64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
      work();
    }
    if (!device_inputs.empty()) {
      std::vector<std::uint64_t> out(device_inputs.size());
      TUTTI_RETURN_IF_ERROR(hasher_.hash(device_inputs, out, options_.io_timeout_ns));
      for (std::size_t i = 0; i < out.size(); ++i) values[device_index[i]] = out[i];
    }
    if (assign) {
      for (std::size_t i = 0; i < checks.size(); ++i) checks[i].expected = values[i];
    } else if (matches) {
      matches->assign(checks.size(), true);
      for (std::size_t i = 0; i < checks.size(); ++i)
        (*matches)[i] = checks[i].address == nullptr || values[i] == checks[i].expected;
    }
    return Status::success();
  }

  /// Submits the op's unsubmitted requests in one runtime submit; rejected with RESOURCE_EXHAUSTED
  /// stay unsubmitted (backpressure), other rejections fail their request.
  void submit_some(Op& op) {
    if (op.unsubmitted.empty() || !op.io.is_null()) return;
    std::vector<IoRequest> batch;
    for (auto i : op.unsubmitted) batch.push_back(op.requests[i]);
    auto outcome = runtime_.submit(batch);
    std::vector<std::size_t> still;
    // Completions name their position in `batch` (RequestCompletion::request_index), accepted or not:
    // map every position, not only the accepted ones, or a partly refused batch misreads them.
    op.in_flight = op.unsubmitted;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const std::size_t i = op.unsubmitted[b];
      const Status& s = outcome.initial_states[b];
      if (s.is_ok()) continue;  // in flight
      if (s.code() == StatusCode::RESOURCE_EXHAUSTED && outcome.accepted > 0) {
        still.push_back(i);  // resubmitted once some of this IO completed
      } else if (s.code() == StatusCode::RESOURCE_EXHAUSTED) {
        still.push_back(i);  // nothing in flight from us: retry on the next drive() pass
      } else {
        op.request_status[i] = s;
        op.request_done[i] = true;
      }
    }
    op.unsubmitted = std::move(still);
    op.io = outcome.io;
  }

  /// Drives the op's runtime IO until every request is done or `deadline` passes.
  Status drive(Op& op, std::uint64_t deadline) {
    for (;;) {
      if (!op.io.is_null()) {
        hash_as_completed(op, deadline);
        auto result = runtime_.wait(op.io, remaining_ns(deadline));
        if (!result) {
          if (result.code() == StatusCode::TIMEOUT) return result.status();
          // A progress error: the runtime keeps the IO in flight. Report it as the requests' failure
          // only once the IO is done; until then it is a TIMEOUT-like retry.
          return result.status().with_context("KV IO");
        }
        for (const auto& c : result->completions) {
          const std::size_t i = op.in_flight[c.request_index];
          op.request_status[i] = c.status;
          op.request_done[i] = true;
        }
        (void)runtime_.release(op.io);
        op.io = IoHandle{};
        op.in_flight.clear();
      }
      if (op.unsubmitted.empty()) return Status::success();
      counters_.resubmits.fetch_add(1, std::memory_order_relaxed);
      submit_some(op);
      if (op.io.is_null()) {
        if (remaining_ns(deadline) == 0)
          return error(StatusCode::TIMEOUT, "KV IO: {} request(s) still refused by the runtime (queue full)",
                       op.unsubmitted.size());
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  /// Loads into host memory with verification: checksums each piece as its read completes
  /// (StorageRuntime::wait_some), on this thread, while the layer's other reads are in flight, so
  /// that after the IO only the pieces that completed last are left to checksum (finish). Returns
  /// when the IO is complete, the deadline passed, or progress failed: wait() then reports which.
  void hash_as_completed(Op& op, std::uint64_t deadline) {
    if (op.operation != KvOperation::LOAD || options_.unsafe_skip_verification) return;
    if (std::none_of(op.checks.begin(), op.checks.end(),
                     [](const PieceCheck& c) { return c.address != nullptr && !c.device && !c.hashed; }))
      return;
    if (destinations_overlap(op)) return;
    for (;;) {
      auto done = runtime_.wait_some(op.io, remaining_ns(deadline));
      if (!done || done->empty()) return;
      for (const RequestCompletion& c : *done) {
        if (!c.status.is_ok()) continue;
        PieceCheck& check = op.checks[op.request_check[op.in_flight[c.request_index]]];
        if (check.device || check.hashed) continue;
        check.value = host_checksum(check.address, check.length);
        check.hashed = true;
      }
    }
  }

  /// True when two reads of a load write overlapping host memory (a repeated key, destinations that
  /// share bytes, or a rounded-up read whose tail reaches the next piece). A piece checked as its read
  /// completed could then be overwritten by a later read and served unverified: such a load is
  /// checked after all its reads, as a whole, instead.
  static bool destinations_overlap(const Op& op) {
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;  // [begin, end) of each host read
    ranges.reserve(op.requests.size());
    for (std::size_t i = 0; i < op.requests.size(); ++i) {
      const PieceCheck& c = op.checks[op.request_check[i]];
      if (c.address == nullptr || c.device) continue;
      const auto begin = reinterpret_cast<std::uintptr_t>(c.address);
      ranges.emplace_back(begin, begin + op.requests[i].length);
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second) return true;
    return false;
  }

  /// Turns a completed op into its result: per-block status, verification (loads), block states.
  LayerResult finish(Op& op) {
    const std::size_t P = layout_.pieces();
    const bool load = op.operation == KvOperation::LOAD;
    LayerResult r;
    r.operation = op.operation;
    r.layer = op.layer;
    r.blocks = op.blocks;
    std::vector<Status> io_status(op.keys.size());
    for (std::size_t i = 0; i < op.requests.size(); ++i)
      if (!op.request_status[i].is_ok() && io_status[op.request_block[i]].is_ok())
        io_status[op.request_block[i]] = op.request_status[i];
    std::vector<bool> matches;
    Status hashed;
    if (load && !options_.unsafe_skip_verification) {
      std::vector<PieceCheck> checks = op.checks;
      for (std::size_t k = 0; k < op.keys.size(); ++k)
        if (!op.submitted[k] || !io_status[k].is_ok())
          for (std::size_t p = 0; p < P; ++p) checks[k * P + p].address = nullptr;
      hashed = hash_into(checks, false, &matches);
    }
    std::optional<Index::Reader> reader;
    if (load && options_.read_only) {
      auto rd = index_->reader();
      if (rd)
        reader.emplace(std::move(rd.value()));
      else
        hashed = rd.status();
    }
    std::scoped_lock lock(mutex_);
    for (std::size_t k = 0; k < op.keys.size(); ++k) {
      if (op.skipped[k]) {
        ++r.skipped_blocks;
        continue;
      }
      if (!op.submitted[k]) continue;
      Status s = io_status[k].with_context(fmt::format("keys[{}] ({}) layer {}", k, key_text(op.keys[k]), op.layer));
      if (load) {
        if (!reader) --slots_[op.slot[k]].pins;
        if (s.is_ok() && !options_.unsafe_skip_verification) {
          if (!hashed.is_ok()) {
            s = hashed.with_context(fmt::format("keys[{}] ({}) not verified", k, key_text(op.keys[k])));
          } else {
            for (std::size_t p = 0; p < P && s.is_ok(); ++p)
              if (!matches[k * P + p])
                s = error(StatusCode::DATA_LOSS,
                          "keys[{}] ({}) layer {} piece {}: the bytes read do not match the stored XXH3-64 checksum "
                          "{:#018x}; the block is not served",
                          k, key_text(op.keys[k]), op.layer, p, op.checks[k * P + p].expected);
            if (!s.is_ok()) counters_.verification_failures.fetch_add(1, std::memory_order_relaxed);
          }
        } else if (!s.is_ok()) {
          counters_.load_failures.fetch_add(1, std::memory_order_relaxed);
        }
        if (s.is_ok() && reader) {  // also without verification: the slot may hold another block by now
          s = recheck_generation(*reader, op, k);
          if (!s.is_ok()) counters_.verification_failures.fetch_add(1, std::memory_order_relaxed);
        }
        if (s.is_ok()) {
          counters_.hits.fetch_add(1, std::memory_order_relaxed);
          counters_.loaded_bytes.fetch_add(op.block_bytes[k], std::memory_order_relaxed);
          if (!options_.unsafe_skip_verification) {
            counters_.verified_bytes.fetch_add(op.block_bytes[k], std::memory_order_relaxed);
            r.verified_bytes += op.block_bytes[k];
          }
        }
      } else {
        auto it = pending_.find(op.keys[k]);
        if (it != pending_.end()) {
          it->second.layer_state[op.layer] = s.is_ok() ? LayerState::WRITTEN : LayerState::NONE;
          if (!s.is_ok()) it->second.failure = s;
        }
        if (s.is_ok()) {
          counters_.stored_layer_blocks.fetch_add(1, std::memory_order_relaxed);
          counters_.stored_bytes.fetch_add(op.block_bytes[k], std::memory_order_relaxed);
          written_[op.layer] += 1;
        } else {
          counters_.store_failures.fetch_add(1, std::memory_order_relaxed);
        }
      }
      r.blocks[k] = s;
      if (s.is_ok()) r.bytes += op.block_bytes[k];
    }
    for (const auto& s : r.blocks) {
      if (s.is_ok())
        ++r.ok_blocks;
      else if (r.status.is_ok())
        r.status = s;
    }
    return r;
  }

  /// Readers: the record must still be the one read before the IO (same generation), or the slot
  /// may have been given to another block meanwhile.
  Status recheck_generation(const Index::Reader& reader, const Op& op, std::size_t k) const {
    auto found = reader.get(op.keys[k]);
    if (!found) return found.status();
    if (*found) {
      auto record = decode_record(op.keys[k], **found, layout_.layers, layout_.pieces());
      if (record && record->generation == op.generation[k] && record->slot == op.slot[k]) return Status::success();
    }
    return error(StatusCode::DATA_LOSS,
                 "keys[{}] ({}) was evicted or replaced by the writer while it was read; the block is not served", k,
                 key_text(op.keys[k]));
  }

  /// Runs `requests` (FLUSHes) to completion within the deadline; the first failure.
  Status run_requests(const std::vector<IoRequest>& requests, std::uint64_t deadline) {
    if (requests.empty()) return Status::success();
    Op op;
    op.requests = requests;
    op.request_status.resize(requests.size());
    op.request_done.assign(requests.size(), false);
    for (std::size_t i = 0; i < requests.size(); ++i) op.unsubmitted.push_back(i);
    submit_some(op);
    TUTTI_RETURN_IF_ERROR(drive(op, deadline));
    for (const auto& s : op.request_status)
      if (!s.is_ok()) return s;
    return Status::success();
  }

  Runtime& runtime_;
  std::string dir_;
  Namespace ns_;
  Options options_;
  Layout layout_;
  std::uint64_t capacity_bytes_ = 0;
  WriterLock lock_;
  std::unique_ptr<Index> index_;
  std::vector<TargetHandle> targets_;

  mutable std::mutex mutex_;
  SlotTable slots_;
  /// Hash of keys that finds a std::string entry from a std::string_view without a copy.
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view key) const noexcept { return std::hash<std::string_view>{}(key); }
  };
  template <class V>
  using KeyMap = std::unordered_map<std::string, V, KeyHash, std::equal_to<>>;
  KeyMap<BlockRecord> visible_;
  KeyMap<Pending> pending_;
  std::vector<std::pair<MemoryHandle, MemoryView>> memory_;
  std::map<std::uint64_t, std::shared_ptr<Op>> ops_;
  std::uint64_t next_io_ = 1;
  std::uint64_t next_generation_ = 1;
  std::vector<std::uint64_t> written_;  // per layer: block-layers written so far
  std::vector<std::uint64_t> flushed_;  // per layer: written_ value covered by the last flush
  std::uint64_t host_checksum_threads_;
  DeviceHasher hasher_;
  Counters counters_;
};

}  // namespace tutti::kv
