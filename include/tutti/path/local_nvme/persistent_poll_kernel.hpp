// The persistent poller's kernel (Options::persistent_poller_warps; docs/local-nvme.md, "The
// persistent poller"): one long-lived launch whose warps poll every batch the host hands them, so a
// batch's progress costs the host no launch, no copy and no stream wait, only reads of a word in
// mapped pinned memory. The host class is path/local_nvme/persistent_poller.hpp.
//
// Protocol (every word named here is 8 bytes, aligned):
//  - The host hands a batch over by writing a PollerPost into the ring `posts` (mapped pinned host
//    memory) and then storing PollerHostWords::tail (release, then a seq_cst fence); then it reads
//    PollerHostWords::closing. Warp 0 of the kernel (the dispatcher) reads tail, copies each new post
//    into the device-memory table entry of its batch slot (PollerPost::table_index) and publishes
//    it (PollerEntry state = the post's sequence, release at device scope).
//  - Every warp scans the table and polls the 32-request chunks of each active entry that it owns
//    (chunk c of entry e belongs to warp (e + c) mod warps, so no two warps touch a request). A warp
//    releases a chunk when none of its requests is waiting any more, one needs the host (a record
//    timed_out or zombie: the Abort is the host's), or the poller is stopping: it writes the chunk's
//    RequestReports into the batch's mapped report array, fences at system scope and counts the chunk
//    off; the warp that releases the last chunk stores the post's sequence into the batch's
//    `released` word (system scope, after a system fence): from then on the host owns the batch again.
//  - Stop (host stop word, the kernel's lifetime, or idle_ns with no active entry): the dispatcher
//    stores PollerHostWords::closing, fences at system scope, reads tail once more and takes every
//    post up to it (so a post the host made before it read `closing` as 0 is always taken: both sides
//    store, fence, then load, as in Dekker's algorithm), then relays the stop to the other warps in
//    device memory. Each warp then makes one last pass that releases every chunk it owns, and the last
//    warp to leave stores 1 + the posts taken into PollerHostWords::exited. A post the host made
//    after the poller closed and at or past exited - 1 was not taken: the host polls it itself.
// Every loop is bounded by the kernel's lifetime (a %globaltimer deadline), so a lost host never
// leaves the GPU busy. Thread-safety: one launch at a time per PollerHostWords.
#pragma once

#include <cstdint>

#include <tutti/accel/primitives.hpp>
#include <tutti/accel/warp.hpp>
#include <tutti/path/local_nvme/kernels.hpp>

namespace tutti::local_nvme {

/// One batch handed to the persistent poller. Written by the host into the ring of posts.
struct PollerPost {
  RequestState* requests = nullptr;     ///< the batch's RequestStates (device memory), `count` entries
  RequestReport* reports = nullptr;     ///< where the poller writes their reports (mapped pinned host memory)
  std::uint64_t* released = nullptr;    ///< mapped pinned word: the poller stores `sequence` when it hands back
  std::uint64_t* chunk_bits = nullptr;  ///< device memory, one bit per chunk of 32 requests: released chunks
  std::uint64_t count = 0;              ///< requests of the batch (1..Options::kMaxBatchRequests)
  std::uint64_t sequence = 0;           ///< non-zero, unique per post of this poller
  std::uint64_t table_index = 0;        ///< the batch slot's table entry (< the table's capacity)
};

/// The words the host and the kernel share (mapped pinned host memory, 64-byte aligned).
struct PollerHostWords {
  std::uint64_t tail = 0;     ///< posts written (host)
  std::uint64_t taken = 0;    ///< posts the dispatcher took into the table (kernel; the host's ring room)
  std::uint64_t closing = 0;  ///< 1 once the kernel takes no post after the ones up to its last read of tail
  std::uint64_t exited = 0;   ///< 1 + posts taken, once every warp left (kernel, last store of the launch)
  std::uint64_t stop = 0;     ///< the host asks the kernel to end
  std::uint64_t reserved[3] = {};
};

/// A table entry: the post of the batch slot with this index, while active (device memory).
struct PollerEntry {
  PollerPost post;
  std::uint64_t chunks_left = 0;  ///< chunks not released yet (atomic, device scope)
};

/// The kernel's own words (device memory, zero before the first launch; each launch leaves them so).
struct PollerDeviceWords {
  std::uint64_t stop_generation = 0;  ///< the dispatcher's relay of the stop: the launch's generation
  std::uint64_t table_end = 0;        ///< 1 + the highest table index ever posted (the warps scan below it)
  std::uint64_t warps_left = 0;       ///< warps that made their last pass (the last one resets it)
  std::uint64_t taken = 0;            ///< posts taken by this launch (the dispatcher's copy of PollerHostWords::taken)
};

namespace detail {

/// Chunk c's bit in a batch's chunk bitmap. Atomic at device scope: the 64 chunks of one word
/// belong to different warps (a plain read-modify-write of one would lose another's bit), and the
/// dispatcher clears the words from another SM.
TUTTI_HOST_DEVICE inline bool chunk_released(std::uint64_t* bits, std::uint64_t c) noexcept {
  return (accel::DeviceAtomicRef<std::uint64_t>(bits[c / 64]).load(accel::MemoryOrder::relaxed) >> (c % 64)) & 1u;
}
TUTTI_HOST_DEVICE inline void mark_chunk_released(std::uint64_t* bits, std::uint64_t c) noexcept {
  accel::DeviceAtomicRef<std::uint64_t>(bits[c / 64])
      .fetch_or(std::uint64_t{1} << (c % 64), accel::MemoryOrder::relaxed);
}

}  // namespace detail

/// The persistent poller's kernel: `warps` warps (launched as warps x 32 threads), one launch per
/// poller lifetime (see the file comment). Every pointer must be reachable by the GPU: `host` and
/// `posts` mapped pinned, `entries`, `entry_state` (sequence of the active post per table entry, 0
/// when free) and `device_words` in device memory, `queues` as for PollKernel. Units: ns of the
/// kernels' clock (%globaltimer).
struct PersistentPollKernel {
  PollerHostWords* host = nullptr;
  const PollerPost* posts = nullptr;
  std::uint64_t ring_size = 0;  ///< entries of `posts`
  PollerEntry* entries = nullptr;
  std::uint64_t* entry_state = nullptr;
  std::uint64_t table_capacity = 0;  ///< entries of `entries` and `entry_state`
  PollerDeviceWords* device_words = nullptr;
  const DeviceQueue* queues = nullptr;
  std::uint64_t warps = 0;
  std::uint64_t generation = 0;   ///< non-zero, different from the previous launch's
  std::uint64_t lifetime_ns = 0;  ///< the launch ends by itself this long after it started
  std::uint64_t idle_ns = 0;      ///< ... or after this long with no active entry

  TUTTI_HOST_DEVICE void operator()(accel::ThreadIndex t) const noexcept {
    if (host == nullptr || warps == 0) return;  // preload_kernels' empty launch
    const std::uint64_t warp = t.global() / accel::kDeviceWarpSize;
    if (warp >= warps) return;  // never a second owner of a chunk (the host launches exactly `warps` warps)
    const std::uint64_t started = accel::timer_ns();
    const std::uint64_t end = started + lifetime_ns;
    std::uint64_t last_busy = started;
    std::uint64_t passes = 0;
    accel::Backoff backoff(
        accel::Backoff::Settings{.spin_steps = 8, .yield_steps = 8, .first_sleep_ns = 128, .max_sleep_ns = 2048});
    for (;;) {
      bool stopping = false;
      if (warp == 0) {
        const std::uint64_t now = accel::timer_ns();
        stopping = dispatch(now >= end || now - last_busy >= idle_ns);
      } else {
        std::uint64_t seen = 0;
        if (accel::lane_id() == 0)
          seen = accel::DeviceAtomicRef<std::uint64_t>(device_words->stop_generation).load(accel::MemoryOrder::acquire);
        seen = accel::warp_broadcast(seen, 0);
        // Only the dispatcher's relay ends a worker: a post it takes later may have chunks that only this
        // warp owns. A lost dispatcher cannot keep the others alive past twice the lifetime (the host
        // then gives the launch up: PersistentPoller::launch_ended).
        stopping = seen == generation || accel::timer_ns() >= end + lifetime_ns;
      }
      bool active = false;
      const bool progressed = scan(warp, stopping, (passes++ & 63) == 0 || backoff.sleeping(), active);
      if (stopping) break;
      if (active) last_busy = accel::timer_ns();
      if (progressed) {
        backoff.reset();
      } else {
        backoff.pause();
      }
    }
    leave();
  }

 private:
  /// Warp 0: takes the posts written since its last look into the table; with `stop_now`, closes
  /// (see the file comment) and relays the stop. Returns whether the warp stops. Collective.
  TUTTI_HOST_DEVICE bool dispatch(bool stop_now) const noexcept {
    std::uint64_t tail = 0, taken = 0, stop = 0;
    if (accel::lane_id() == 0) {
      taken = device_words->taken;
      tail = accel::SystemAtomicRef<std::uint64_t>(host->tail).load(accel::MemoryOrder::acquire);
      stop = accel::SystemAtomicRef<std::uint64_t>(host->stop).load(accel::MemoryOrder::relaxed);
      if (stop_now || stop != 0) {
        accel::SystemAtomicRef<std::uint64_t>(host->closing).store(1, accel::MemoryOrder::relaxed);
        accel::fence_system();  // closing before the last read of tail (the host: tail before closing)
        tail = accel::SystemAtomicRef<std::uint64_t>(host->tail).load(accel::MemoryOrder::acquire);
      }
    }
    tail = accel::warp_broadcast(tail, 0);
    taken = accel::warp_broadcast(taken, 0);
    const bool stopping = accel::warp_broadcast(stop_now || stop != 0 ? 1u : 0u, 0) != 0;
    // The host never has more than ring_size posts not taken; the bound keeps a broken one harmless.
    const std::uint64_t upto = tail - taken > ring_size ? taken + ring_size : tail;
    for (std::uint64_t k = taken; k < upto; ++k) take(posts[k % ring_size]);
    if (accel::lane_id() == 0 && upto != taken) {
      device_words->taken = upto;
      // Release: the host reuses ring entries up to here once it reads it.
      accel::SystemAtomicRef<std::uint64_t>(host->taken).store(upto, accel::MemoryOrder::release);
    }
    if (accel::lane_id() == 0) {
      if (stopping)
        accel::DeviceAtomicRef<std::uint64_t>(device_words->stop_generation)
            .store(generation, accel::MemoryOrder::release);
    }
    accel::warp_sync();
    return stopping;
  }

  /// Copies one post into its table entry, clears its chunk bits and publishes it. Collective.
  TUTTI_HOST_DEVICE void take(const PollerPost& post_in_host) const noexcept {
    const PollerPost post = read_post(post_in_host);  // lane 0 reads it (after its acquire of tail), all get it
    if (post.table_index >= table_capacity || post.count == 0 || post.sequence == 0) return;  // the host checks too
    const std::uint64_t chunks = (post.count + accel::kDeviceWarpSize - 1) / accel::kDeviceWarpSize;
    for (std::uint64_t w = accel::lane_id(); w < (chunks + 63) / 64; w += accel::kDeviceWarpSize)
      accel::DeviceAtomicRef<std::uint64_t>(post.chunk_bits[w]).store(0, accel::MemoryOrder::relaxed);
    accel::fence(accel::ThreadScope::device, accel::MemoryOrder::seq_cst);
    accel::warp_sync();
    if (accel::lane_id() == 0) {
      PollerEntry& entry = entries[post.table_index];
      entry.post = post;
      entry.chunks_left = chunks;
      accel::DeviceAtomicRef<std::uint64_t> end(device_words->table_end);
      std::uint64_t seen = end.load(accel::MemoryOrder::relaxed);
      while (seen < post.table_index + 1 &&
             !end.compare_exchange_strong(seen, post.table_index + 1, accel::MemoryOrder::relaxed)) {
      }
      accel::DeviceAtomicRef<std::uint64_t>(entry_state[post.table_index])
          .store(post.sequence, accel::MemoryOrder::release);
    }
    accel::warp_sync();
  }

  /// One pass over the table: polls this warp's unreleased chunks of every active entry (releasing
  /// all of them when `stopping`). Returns whether a request finished or a chunk was released;
  /// `active` whether any entry was active. Collective.
  TUTTI_HOST_DEVICE bool scan(std::uint64_t warp, bool stopping, bool check_controller, bool& active) const noexcept {
    std::uint64_t end = 0;
    if (accel::lane_id() == 0)
      end = accel::DeviceAtomicRef<std::uint64_t>(device_words->table_end).load(accel::MemoryOrder::acquire);
    end = accel::warp_broadcast(end, 0);
    bool progressed = false;
    for (std::uint64_t base = 0; base < end; base += accel::kDeviceWarpSize) {
      const std::uint64_t e = base + accel::lane_id();
      const std::uint64_t sequence =
          e < end ? accel::DeviceAtomicRef<std::uint64_t>(entry_state[e]).load(accel::MemoryOrder::acquire) : 0;
      std::uint32_t pending = accel::warp_ballot(sequence != 0);
      while (pending != 0) {
        const std::uint32_t lane = accel::lowest_lane(pending);
        pending &= pending - 1;
        active = true;
        progressed = poll_entry(warp, base + lane, accel::warp_broadcast(sequence, lane), stopping, check_controller) ||
                     progressed;
      }
    }
    return progressed;
  }

  /// One pass over the chunks of entry `e` this warp owns. Collective.
  TUTTI_HOST_DEVICE bool poll_entry(std::uint64_t warp, std::uint64_t e, std::uint64_t sequence, bool stopping,
                                    bool check_controller) const noexcept {
    // Lane 0 acquires the state again and reads the post, so every lane decides on the same values.
    std::uint64_t seen = 0;
    if (accel::lane_id() == 0)
      seen = accel::DeviceAtomicRef<std::uint64_t>(entry_state[e]).load(accel::MemoryOrder::acquire);
    if (accel::warp_broadcast(seen, 0) != sequence) return false;
    const PollerPost post = read_post(entries[e].post);
    if (post.sequence != sequence) return false;  // published after this warp read the state: next pass
    const std::uint64_t chunks = (post.count + accel::kDeviceWarpSize - 1) / accel::kDeviceWarpSize;
    bool progressed = false;
    for (std::uint64_t c = (warp + warps - e % warps) % warps; c < chunks; c += warps) {
      // Lane 0 reads the chunk's bit, then the state again: a bit read from a later post (the entry
      // released, the slot posted again and its bits cleared meanwhile) comes with a state that is no
      // longer this post's sequence (the clears precede the new state's release store).
      std::uint32_t verdict = 0;  // 0: poll it, 1: released already, 2: the entry moved on
      if (accel::lane_id() == 0) {
        if (detail::chunk_released(post.chunk_bits, c)) {
          verdict = 1;
        } else {
          accel::fence(accel::ThreadScope::device, accel::MemoryOrder::acquire);
          if (accel::DeviceAtomicRef<std::uint64_t>(entry_state[e]).load(accel::MemoryOrder::acquire) != sequence)
            verdict = 2;
        }
      }
      verdict = accel::warp_broadcast(verdict, 0);
      if (verdict == 1) continue;
      if (verdict == 2) return progressed;
      const std::uint64_t i = c * accel::kDeviceWarpSize + accel::lane_id();
      RequestState* r = i < post.count ? &post.requests[i] : nullptr;
      const bool waiting_before = r != nullptr && r->accepted && !r->done;
      warp_reap(r, queues);
      if (r != nullptr) poll_request(*r, queues[r->queue_index], accel::timer_ns(), check_controller);
      detail::warp_issue_commands(r, queues);
      if (r != nullptr) detail::finish_if_idle(*r, queues[r->queue_index]);
      const bool waiting = r != nullptr && r->accepted && !r->done;
      const bool host_needed = r != nullptr && records_needing_host(*r) != 0;
      progressed = progressed || accel::warp_ballot(waiting_before && !waiting) != 0;
      if (!stopping && accel::warp_ballot(waiting) != 0 && accel::warp_ballot(host_needed) == 0) continue;
      release_chunk(post, e, c, r, i);
      progressed = true;
    }
    return progressed;
  }

  /// Hands chunk c of entry e back: reports, a system fence, its bit, the count; the last chunk
  /// stores the sequence into the batch's released word and frees the entry. Collective.
  TUTTI_HOST_DEVICE void release_chunk(const PollerPost& post, std::uint64_t e, std::uint64_t c, const RequestState* r,
                                       std::uint64_t i) const noexcept {
    if (r != nullptr) write_report(*r, post.reports[i]);
    accel::fence_system();  // this lane's report before the count the releasing warp reads
    accel::warp_sync();
    if (accel::lane_id() == 0) {
      detail::mark_chunk_released(post.chunk_bits, c);
      const std::uint64_t left =
          accel::DeviceAtomicRef<std::uint64_t>(entries[e].chunks_left).fetch_sub(1, accel::MemoryOrder::acq_rel);
      if (left == 1) {
        accel::DeviceAtomicRef<std::uint64_t>(entry_state[e]).store(0, accel::MemoryOrder::relaxed);
        accel::fence_system();  // every chunk's reports (fenced, then counted) before the hand-back
        accel::SystemAtomicRef<std::uint64_t>(*post.released).store(post.sequence, accel::MemoryOrder::release);
      }
    }
    accel::warp_sync();
  }

  /// `source` as lane 0 reads it, in every lane (seven broadcasts). Collective.
  TUTTI_HOST_DEVICE static PollerPost read_post(const PollerPost& source) noexcept {
    PollerPost p{};
    if (accel::lane_id() == 0) p = source;
    PollerPost out;
    out.requests =
        reinterpret_cast<RequestState*>(accel::warp_broadcast(reinterpret_cast<std::uintptr_t>(p.requests), 0));
    out.reports =
        reinterpret_cast<RequestReport*>(accel::warp_broadcast(reinterpret_cast<std::uintptr_t>(p.reports), 0));
    out.released =
        reinterpret_cast<std::uint64_t*>(accel::warp_broadcast(reinterpret_cast<std::uintptr_t>(p.released), 0));
    out.chunk_bits =
        reinterpret_cast<std::uint64_t*>(accel::warp_broadcast(reinterpret_cast<std::uintptr_t>(p.chunk_bits), 0));
    out.count = accel::warp_broadcast(p.count, 0);
    out.sequence = accel::warp_broadcast(p.sequence, 0);
    out.table_index = accel::warp_broadcast(p.table_index, 0);
    return out;
  }

  /// The warp's last step: the last warp out resets the count and tells the host.
  TUTTI_HOST_DEVICE void leave() const noexcept {
    if (accel::lane_id() != 0) return;
    accel::DeviceAtomicRef<std::uint64_t> left(device_words->warps_left);
    if (left.fetch_add(1, accel::MemoryOrder::acq_rel) + 1 != warps) return;
    left.store(0, accel::MemoryOrder::relaxed);
    const std::uint64_t taken = device_words->taken;
    device_words->taken = 0;  // the next launch starts from an empty ring
    accel::fence_system();
    accel::SystemAtomicRef<std::uint64_t>(host->exited).store(taken + 1, accel::MemoryOrder::release);
  }
};

}  // namespace tutti::local_nvme
