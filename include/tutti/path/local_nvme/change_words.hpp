// The change words of one DataPath's open targets (targets.hpp, ChangeSignal; docs/local-nvme.md,
// "A file changed under local_nvme"): one 32-bit word per open target, 0 while its file is
// unchanged and 1 once the host saw it change, in device memory, where a GPU's kernel threads read
// it at L2 latency (admission_need, plan_commands). In mapped host memory each read was a PCIe
// round trip: one per request at admission cost a 1024-request submit kernel about 40 us on the
// H200 (docs/benchmarks.md, "The change word in device memory"). The pool also holds one word that
// is always 1 (always_changed): a request staged after its target's raise points at it, so its
// kernel refuses it whether or not the target's own word has landed.
//
// Writes: set() copies a 1 into the word on the pool's own non-blocking stream and waits for the
// copy, at most the timeout given to create. A copy engine runs beside running kernels, so the
// copy does not wait for them as such; it can still queue behind another stream's work where the
// device's hardware queues alias the streams (CUDA_DEVICE_MAX_CONNECTIONS, default 8): a stream
// holding a running kernel, a copy and a queued kernel delayed a 4-byte copy on another stream by
// the running kernel's whole length on the H200. When set() returns OK, every kernel thread that
// reads the word from then on sees the 1 (a relaxed device-scope load is served by L2, where the
// copy landed). acquire() writes a 0 the same way. No lock is held across a copy or its wait.
// Allocation: words come in chunks of kChangeWordsPerChunk (one device allocation per that many
// open targets) and are recycled by release(); the chunks are freed with the pool, which the
// Engine and every open target share (it outlives both). An Engine whose kernel may run forever
// leaks the pool on purpose (engine.hpp); a word that was ever set is never recycled
// (ChangeSignal), so a kernel that outlived its target never reads it back as 0.
// Host profile: the words are host memory, written with an atomic store; there is no stream.
// Units: ns. Thread-safety: every member function may be called by any thread at any time.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <tutti/accel/async_copy.hpp>
#include <tutti/accel/launch.hpp>
#include <tutti/accel/memory.hpp>
#include <tutti/accel/placement.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/core/status.hpp>
#include <tutti/path/local_nvme/kernel_array.hpp>

namespace tutti::local_nvme {

/// Words per device allocation of a ChangeWords pool (4 KiB: the allocation granule of accel::allocate_device).
inline constexpr std::uint32_t kChangeWordsPerChunk = 1024;

/// The pool of change words (see the header). Held by std::shared_ptr.
class ChangeWords {
 public:
  /// A pool whose writes wait at most `write_timeout_ns` for their copy (> 0; the DataPath passes
  /// Options::command_timeout_ns), with its first chunk and its always-1 word written. Errors:
  /// INVALID_ARGUMENT for a zero timeout; RESOURCE_EXHAUSTED (host or device memory);
  /// DEVICE_ERROR when the stream cannot be created or the copy fails; TIMEOUT when the first
  /// write did not land within the timeout.
  static Result<std::shared_ptr<ChangeWords>> create(std::uint64_t write_timeout_ns) {
    if (write_timeout_ns == 0)
      return error(StatusCode::INVALID_ARGUMENT, "change words: write_timeout_ns is 0, must be > 0");
    std::shared_ptr<ChangeWords> words;
    try {
      words = std::shared_ptr<ChangeWords>(new ChangeWords());
      words->values_ = kernel_array<std::uint32_t>(2);
    } catch (const std::bad_alloc& failure) {
      return accel::allocation_failure(failure, "change words: the copies' pinned sources");
    }
    words->values_[1] = 1;
    words->write_timeout_ns_ = write_timeout_ns;
    auto stream = accel::OwnedStream::create();
    if (!stream) return stream.status().with_context("change words: their stream");
    words->stream_ = std::move(stream.value());
    {
      std::lock_guard lock(words->mutex_);
      TUTTI_RETURN_IF_ERROR(words->grow());
      words->always_changed_ = words->free_.back();
      words->free_.pop_back();
    }
    TUTTI_RETURN_IF_ERROR(
        words->write(words->always_changed_, 1).with_context("change words: the always-changed word"));
    return Result<std::shared_ptr<ChangeWords>>(std::move(words));
  }

  /// A word for a newly opened target, set to 0 (written and waited for). Device memory in the
  /// CUDA profile: not dereferenceable on the host. Errors: RESOURCE_EXHAUSTED when no chunk can
  /// be allocated; the write's (DEVICE_ERROR, TIMEOUT), when the word is not handed out.
  Result<std::uint32_t*> acquire() {
    std::uint32_t* word = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (free_.empty()) TUTTI_RETURN_IF_ERROR(grow());
      word = free_.back();
      free_.pop_back();
    }
    if (Status zeroed = write(word, 0); !zeroed.is_ok()) {
      release(word);  // a later acquire zeroes it again (the single stream orders the copies)
      return zeroed.with_context("change words: zeroing a word for an open target");
    }
    return Result<std::uint32_t*>(word);
  }

  /// Gives back a word of acquire() that was never set (its target is closed). A word that was
  /// set stays out of the pool (ChangeSignal keeps it: 4 bytes).
  void release(std::uint32_t* word) noexcept {
    if (word == nullptr) return;
    std::lock_guard lock(mutex_);
    free_.push_back(word);  // capacity reserved by grow(): never throws
  }

  /// Sets `word` to 1 and returns once every kernel thread that reads it from now on sees the 1.
  /// Errors: the copy's DEVICE_ERROR, or TIMEOUT when it did not land within the timeout (it stays
  /// enqueued and lands later).
  Status set(std::uint32_t* word) {
    return write(word, 1).with_context("change words: raising a target's change word");
  }

  /// The word that is always 1 (device memory in the CUDA profile): a staged request of a target
  /// whose change was raised points at it (ChangeSignal::stage).
  std::uint32_t* always_changed() const noexcept { return always_changed_; }

  /// Device chunks allocated (each kChangeWordsPerChunk words).
  std::size_t chunks() const {
    std::lock_guard lock(mutex_);
    return chunks_.size();
  }

 private:
  ChangeWords() = default;

  /// One more chunk, its words on the free list. Caller holds mutex_.
  Status grow() {
    try {
      free_.reserve((chunks_.size() + 1) * kChangeWordsPerChunk);
      chunks_.reserve(chunks_.size() + 1);
    } catch (const std::bad_alloc&) {
      return error(StatusCode::RESOURCE_EXHAUSTED, "change words: no host memory for {} more words",
                   kChangeWordsPerChunk);
    }
    auto chunk = accel::DeviceBuffer::allocate(kChangeWordsPerChunk * sizeof(std::uint32_t));
    if (!chunk) return chunk.status().with_context("change words: a chunk of device memory");
    auto* first = static_cast<std::uint32_t*>(chunk->data());
    for (std::uint32_t i = kChangeWordsPerChunk; i-- > 0;) free_.push_back(first + i);
    chunks_.push_back(std::move(chunk.value()));
    return Status::success();
  }

  /// Writes `value` (0 or 1) into `word` and waits for it. The pinned sources never change, so
  /// copies from several threads need no lock; the one stream keeps each word's writes in order.
  Status write(std::uint32_t* word, std::uint32_t value) {
    if constexpr (accel::kProfile == accel::Profile::host) {
      accel::DeviceAtomicRef<std::uint32_t>(*word).store(value, accel::MemoryOrder::release);
      return Status::success();
    } else {
      void* stream = stream_.ref().native_handle();
      TUTTI_RETURN_IF_ERROR(accel::copy_to_device_async(word, &values_[value], sizeof(std::uint32_t), stream));
      return accel::synchronize(stream, write_timeout_ns_);
    }
  }

  mutable std::mutex mutex_;  ///< guards chunks_ and free_ only
  std::vector<accel::DeviceBuffer> chunks_;
  std::vector<std::uint32_t*> free_;
  std::uint32_t* always_changed_ = nullptr;
  KernelArray<std::uint32_t> values_;  ///< {0, 1}: the copies' pinned sources
  accel::OwnedStream stream_;
  std::uint64_t write_timeout_ns_ = 0;
};

}  // namespace tutti::local_nvme
