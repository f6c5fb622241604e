// NVMe queue ring primitives, used alike by host threads and GPU threads (host and cuda profiles):
// slot reservation, SQE write, doorbell coalescing, command identifiers with generations, CQ phase-tag
// tracking, CQ head doorbell, and completion polling bounded by a time budget in nanoseconds.
//
// Written only against tutti/accel/ primitives (no std::atomic, no vendor headers).
// Spec: NVMe Base Specification 2.0, 3.3.1 "Memory-based Transport Queue Model" (circular queues,
// full when tail + 1 == head, at most depth - 1 entries outstanding), 4.2 "Completion Queue Entry"
// (Phase Tag inverts on every pass), 3.3.1.2 "Completion Queue" and NVMe over PCIe Transport 1.0,
// 3.1.2 (SQyTDBL / CQyHDBL doorbells).
//
// Model. A QueuePair is a trivially copyable view of:
//   - the SQ and CQ rings (owned by the controller driver, libnvm's QueuePairInfo),
//   - the doorbells and CSTS,
//   - QueuePairState, per-slot ready words, and the command slot table, in memory every
//     submitter and reaper can reach (host memory here; device memory for GPU kernels).
// Submission is ticket based: tickets are 64-bit sequence numbers, slot = ticket % depth.
//   1. reserve_submission_slots(n): one atomic CAS takes n consecutive tickets, or fails when the
//      SQ would hold more than depth - 1 unconsumed entries (full: RESOURCE_EXHAUSTED, never blocks);
//   2. write_submission(ticket, sqe): the SQE is copied into its slot, then the slot's ready word
//      is set to ticket + 1;
//   3. ring_submission_doorbell(): whoever wins a try-lock scans forward over consecutive ready
//      slots and writes the SQ tail doorbell ONCE for the whole run, whichever threads wrote them.
//      A thread that loses the try-lock leaves; the winner re-checks after unlocking, so the
//      loser's entry is never stranded (see the proof at the function).
// Completion: CQEs are reaped by any waiting thread that wins the CQ try-lock; each CQE is routed
// to its command slot by CID (index | generation << index_bits), and the CQ head doorbell is
// written once per reaped batch. A CQE whose CID is not in flight with that generation is a stale
// completion: counted and dropped, never matched to the wrong command.
// The warp-collective protocol (nvme/warp_queue.hpp: warp_submit, warp_ring_submission_doorbell,
// warp_reap_completions) is built from the steps of this file, with 32 lanes per scan;
// release_command_identifier frees a CID whose command never reached the SQ.
// Thread-safety: all functions may be called concurrently by any number of threads on one
// QueuePair (host threads, or GPU threads in the CUDA profile, never both at once: see
// kSubmitterScope) unless noted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/placement.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/registers.hpp>

namespace tutti::nvme {

/// Scopes of the queue's atomics (accel/scope.hpp). Two groups of memory, two scopes:
///  - what the controller reads or writes (SQ and CQ entries, the doorbells): system scope. The
///    controller is another agent (a PCIe device, or the soft controller's host threads), so the
///    CQE's dword 3 is read with a system-scope acquire, and every doorbell store is preceded by
///    a system fence (accel::mmio_store32);
///  - the submitters' and reapers' own bookkeeping (QueuePairState, the ready words, the command
///    slots, the CID bitmap): device scope. No controller ever reads it, and the threads that
///    submit to and reap one queue pair run on ONE agent at a time: the GPU's threads (cuda
///    profile kernels) or host threads (the host profile; libnvm's admin queue; the local_nvme
///    DataPath's zombie reaping, which runs only while no kernel of the DataPath runs, see
///    docs/local-nvme.md). A system-scope acquire, release or seq_cst operation from a GPU is a
///    fence.sys (MEMBAR.SYS), which waits until every earlier store of the thread has reached the
///    system's point of coherence, a PCIe round trip when any of them went to host memory; at
///    device scope it is a fence.gpu, which waits for the GPU's L2 only. In the host profile both
///    are std::atomic_ref operations (scope has no meaning between host threads).
/// Precondition this puts on callers: never drive one queue pair from host threads and GPU
/// threads at the same time (host and GPU atomics on one word are not atomic with respect to
/// each other over PCIe on x86 anyway: cudaDevAttrHostNativeAtomicSupported = 0).
inline constexpr accel::ThreadScope kControllerScope = accel::ThreadScope::system;
inline constexpr accel::ThreadScope kSubmitterScope = accel::ThreadScope::device;
template <class T>
using ControllerAtomic = accel::AtomicRef<T, kControllerScope>;
template <class T>
using SubmitterAtomic = accel::AtomicRef<T, kSubmitterScope>;

/// Bytes between the groups of QueuePairState: one GPU L2 cache line (128 bytes, two x86 lines).
inline constexpr std::size_t kQueueStateLineBytes = 128;

/// Shared bookkeeping of one queue pair. Zero-initialised means "empty queue"; cq_phase starts
/// at 1 (QueuePairStorage sets it). Lives where all submitters and reapers reach it; aligned to
/// kQueueStateLineBytes (std::allocator and cudaMalloc honour it; mapped host memory is page
/// aligned).
/// Layout: each group of words written by a different party sits on its own 128-byte line, so a
/// write by one party never invalidates the line another party is spinning on or CASing (false
/// sharing): the SQ reservation (every submitter's CAS), the SQ head (written by the reaper, read
/// by every reservation), the doorbell try-lock and announced tail (the doorbell writer), the CQ
/// try-lock, head and phase (the reaper), the CID allocation hint (every CID allocation), and the
/// statistics, which are counters only: they are updated with relaxed device-scope increments and
/// never read on the hot path (a snapshot is read by the host after the work, statistics()).
struct QueuePairState {
  // --- submission reservation: CAS by every submitter (reserve_submission_slots)
  alignas(kQueueStateLineBytes) std::uint64_t sq_reserved;  ///< next SQ ticket to hand out
  // --- SQ head: stored by the reaper (from each CQE's SQ Head Pointer), loaded by every reservation
  alignas(kQueueStateLineBytes) std::uint64_t sq_head_ticket;  ///< tickets the controller has fetched
  // --- SQ tail doorbell: the try-lock and the tail it protects (ring_submission_doorbell)
  alignas(kQueueStateLineBytes) std::uint64_t sq_doorbell_ticket;  ///< tickets announced through the SQ tail doorbell
  std::uint32_t sq_doorbell_lock;                                  ///< 0 free, 1 held (try-lock only)
  // --- completion queue: the try-lock and what it protects (reap_completions)
  alignas(kQueueStateLineBytes) std::uint32_t cq_lock;  ///< 0 free, 1 held (try-lock only)
  std::uint32_t cq_head;                                ///< next CQ slot to read, 0..depth-1 (under cq_lock)
  std::uint32_t cq_phase;                               ///< expected Phase Tag of the next CQE, 0 or 1 (under cq_lock)
  // --- CID allocation: fetch_add by every allocate_command_identifier
  alignas(kQueueStateLineBytes) std::uint32_t cid_hint;  ///< where CID allocation starts scanning
  // --- statistics: relaxed device-scope counters, read only as a snapshot
  alignas(kQueueStateLineBytes) std::uint64_t doorbell_writes;  ///< SQ tail doorbell writes (shows coalescing)
  std::uint64_t completions_reaped;                             ///< CQEs consumed
  std::uint64_t stale_completions;                              ///< CQEs whose CID was not in flight (dropped)
  std::uint64_t abandoned_completions;  ///< CQEs of commands the waiter gave up on (dropped, CID freed)
  std::uint64_t invalid_completions;    ///< CQEs with a wrong SQ identifier or impossible SQ head
};
static_assert(sizeof(QueuePairState) == 6 * kQueueStateLineBytes);
static_assert(offsetof(QueuePairState, sq_head_ticket) == 1 * kQueueStateLineBytes);
static_assert(offsetof(QueuePairState, sq_doorbell_ticket) == 2 * kQueueStateLineBytes);
static_assert(offsetof(QueuePairState, cq_lock) == 3 * kQueueStateLineBytes);
static_assert(offsetof(QueuePairState, cid_hint) == 4 * kQueueStateLineBytes);
static_assert(offsetof(QueuePairState, doorbell_writes) == 5 * kQueueStateLineBytes);

/// One command slot: the state word and the completion delivered to it. 32 bytes.
/// state = generation << 2 | CommandState.
struct alignas(16) CommandSlot {
  std::uint32_t state;
  std::uint32_t reserved[3];
  CompletionQueueEntry completion;
};
static_assert(sizeof(CommandSlot) == 32);

/// States of a command slot.
enum class CommandState : std::uint32_t {
  free = 0,       ///< CID available
  in_flight = 1,  ///< CID allocated, completion not yet delivered
  completed = 2,  ///< completion delivered, waiting for take_completion
  abandoned = 3,  ///< the waiter gave up; the reaper frees the CID when the completion arrives
};

/// Outcome of waiting for a completion.
struct WaitResult {
  StatusCode status = StatusCode::OK;  ///< OK, TIMEOUT, or DEVICE_ERROR (CSTS.CFS set / device gone)
  CompletionQueueEntry completion{};   ///< valid when status == OK (its NVMe status may be an error)
};

/// View of one I/O (or admin) queue pair plus its shared state. Trivially copyable; pass to
/// kernels by value. Build it with make_queue_pair (or QueuePairStorage on the host).
struct QueuePair {
  SubmissionQueueEntry* sq = nullptr;  ///< depth SQEs
  CompletionQueueEntry* cq = nullptr;  ///< depth CQEs (same depth as the SQ)
  volatile std::uint32_t* sq_tail_doorbell = nullptr;
  volatile std::uint32_t* cq_head_doorbell = nullptr;
  const volatile std::uint32_t* controller_status = nullptr;  ///< CSTS, may be null (no fatal checks)
  std::uint32_t depth = 0;                                    ///< entries per ring, 2..65536
  std::uint16_t qid = 0;                                      ///< SQ identifier (CQEs must carry it)
  std::uint32_t cid_capacity = 0;                             ///< command slots, 1..32768
  std::uint32_t cid_index_bits = 0;                           ///< bits of the CID that index the slot table
  QueuePairState* state = nullptr;
  std::uint64_t* sq_ready = nullptr;    ///< depth words: ticket + 1 when the slot's SQE is written
  CommandSlot* slots = nullptr;         ///< cid_capacity slots
  std::uint32_t* cid_bitmap = nullptr;  ///< (cid_capacity + 31) / 32 words, bit set = allocated

  // ----- command identifiers -----------------------------------------------------------------

  /// Allocates a CID: a free slot index plus the slot's next generation. Returns false when all
  /// cid_capacity CIDs are in use (never blocks). CID FFFFh is never produced.
  TUTTI_HOST_DEVICE bool allocate_command_identifier(std::uint16_t& cid) const noexcept {
    const std::uint32_t words = (cid_capacity + 31) / 32;
    const std::uint32_t start =
        SubmitterAtomic<std::uint32_t>(state->cid_hint).fetch_add(1, accel::MemoryOrder::relaxed) % words;
    for (std::uint32_t w = 0; w < words; ++w) {
      const std::uint32_t word_index = (start + w) % words;
      SubmitterAtomic<std::uint32_t> word(cid_bitmap[word_index]);
      std::uint32_t value = word.load(accel::MemoryOrder::relaxed);
      while (value != 0xffffffffu) {
        const std::uint32_t bit = lowest_zero_bit(value);
        const std::uint32_t old = word.fetch_or(1u << bit, accel::MemoryOrder::acq_rel);
        if ((old & (1u << bit)) == 0) {
          const std::uint32_t index = word_index * 32 + bit;
          SubmitterAtomic<std::uint32_t> slot_state(slots[index].state);
          // The state keeps the generation exactly as the CID carries it (16 - cid_index_bits bits).
          std::uint32_t generation = ((slot_state.load(accel::MemoryOrder::relaxed) >> 2) + 1) & generation_mask();
          if (make_cid(index, generation) == 0xffffu) generation = (generation + 1) & generation_mask();
          // Release: a reaper that sees in_flight also sees the reset of the previous completion.
          slot_state.store(encode_state(generation, CommandState::in_flight), accel::MemoryOrder::release);
          cid = make_cid(index, generation);
          return true;
        }
        value = old | (1u << bit);
      }
    }
    return false;
  }

  /// Slot index of a CID.
  TUTTI_HOST_DEVICE std::uint32_t cid_index(std::uint16_t cid) const noexcept {
    return cid & ((1u << cid_index_bits) - 1);
  }
  /// Generation of a CID (16 - cid_index_bits bits).
  TUTTI_HOST_DEVICE std::uint32_t cid_generation(std::uint16_t cid) const noexcept {
    return static_cast<std::uint32_t>(cid) >> cid_index_bits;
  }

  // ----- submission --------------------------------------------------------------------------

  /// Reserves `count` (1..depth-1) consecutive SQ slots; first_ticket receives the first ticket.
  /// Returns false, reserving nothing, when the SQ lacks room (the caller resubmits later).
  TUTTI_HOST_DEVICE bool reserve_submission_slots(std::uint32_t count, std::uint64_t& first_ticket) const noexcept {
    if (count == 0 || count > depth - 1) return false;
    SubmitterAtomic<std::uint64_t> reserved(state->sq_reserved);
    SubmitterAtomic<std::uint64_t> head(state->sq_head_ticket);
    std::uint64_t current = reserved.load(accel::MemoryOrder::relaxed);
    for (;;) {
      // Acquire: the controller fetched every slot before head (we may overwrite them).
      const std::uint64_t consumed = head.load(accel::MemoryOrder::acquire);
      if (current + count - consumed > depth - 1) return false;
      if (reserved.compare_exchange_strong(current, current + count, accel::MemoryOrder::acq_rel)) {
        first_ticket = current;
        return true;
      }
    }
  }

  /// Copies `sqe` into the slot of `ticket` and marks it ready. `sqe` carries its CID already.
  /// Precondition: ticket was reserved by this caller and not yet written.
  TUTTI_HOST_DEVICE void write_submission(std::uint64_t ticket, const SubmissionQueueEntry& sqe) const noexcept {
    sq[ticket % depth] = sqe;
    // Seq_cst (release at least): the SQE bytes are ordered before the ready word, so the
    // doorbell writer that observes the word announces a complete SQE; seq_cst is needed for the
    // stranded-entry argument in ring_submission_doorbell.
    SubmitterAtomic<std::uint64_t>(sq_ready[ticket % depth]).store(ticket + 1, accel::MemoryOrder::seq_cst);
  }

  /// Announces every ready entry that follows the last announced one, with ONE SQ tail doorbell
  /// write for the whole run (entries written by any threads). Returns the entries announced by
  /// this call (0 when another thread holds the doorbell lock: that thread announces ours).
  /// Why no entry is stranded: a writer W stores ready (seq_cst) then fails the try-lock, so the
  /// holder H's unlock comes later in the seq_cst order; H re-reads the next ready word after
  /// its unlock (seq_cst) and therefore sees W's entry and loops to announce it.
  TUTTI_HOST_DEVICE std::uint32_t ring_submission_doorbell() const noexcept {
    SubmitterAtomic<std::uint32_t> lock(state->sq_doorbell_lock);
    SubmitterAtomic<std::uint64_t> announced_ticket(state->sq_doorbell_ticket);
    std::uint32_t announced = 0;
    for (;;) {
      std::uint32_t expected = 0;
      if (!lock.compare_exchange_strong(expected, 1, accel::MemoryOrder::seq_cst)) return announced;
      const std::uint64_t start = announced_ticket.load(accel::MemoryOrder::relaxed);
      std::uint64_t end = start;
      // Acquire: the SQE bytes of each ready slot are visible to us, hence (cumulativity through
      // the system fence in mmio_store32) to the controller when it sees the doorbell.
      while (end - start < depth - 1 &&
             SubmitterAtomic<std::uint64_t>(sq_ready[end % depth]).load(accel::MemoryOrder::acquire) == end + 1)
        ++end;
      if (end != start) {
        announced_ticket.store(end, accel::MemoryOrder::relaxed);
        accel::mmio_store32(sq_tail_doorbell, static_cast<std::uint32_t>(end % depth));  // one write for the run
        count(state->doorbell_writes);
      }
      lock.store(0, accel::MemoryOrder::seq_cst);
      announced += static_cast<std::uint32_t>(end - start);
      if (SubmitterAtomic<std::uint64_t>(sq_ready[end % depth]).load(accel::MemoryOrder::seq_cst) != end + 1)
        return announced;
    }
  }

  /// reserve 1 + write + ring. RESOURCE_EXHAUSTED when the SQ is full (nothing submitted).
  TUTTI_HOST_DEVICE StatusCode submit(const SubmissionQueueEntry& sqe) const noexcept {
    std::uint64_t ticket = 0;
    if (!reserve_submission_slots(1, ticket)) return StatusCode::RESOURCE_EXHAUSTED;
    write_submission(ticket, sqe);
    ring_submission_doorbell();
    return StatusCode::OK;
  }

  // ----- completion --------------------------------------------------------------------------

  /// Consumes up to `max_entries` new CQEs if this thread wins the CQ try-lock (else returns 0),
  /// delivers each to its command slot, and writes the CQ head doorbell once for the batch.
  /// Returns the CQEs consumed.
  TUTTI_HOST_DEVICE std::uint32_t reap_completions(std::uint32_t max_entries = 0xffffffffu) const noexcept {
    SubmitterAtomic<std::uint32_t> lock(state->cq_lock);
    std::uint32_t expected = 0;
    if (!lock.compare_exchange_strong(expected, 1, accel::MemoryOrder::acquire)) return 0;
    std::uint32_t head = state->cq_head;
    std::uint32_t phase = state->cq_phase;
    std::uint32_t consumed = 0;
    while (consumed < max_entries) {
      CompletionQueueEntry& slot = cq[head];
      // Acquire: dwords 0-2 were written before dword 3 (the controller's release store).
      const std::uint32_t dw3 = ControllerAtomic<std::uint32_t>(slot.dw3).load(accel::MemoryOrder::acquire);
      CompletionQueueEntry entry{};
      entry.dw3 = dw3;
      if (entry.status().phase() != phase) break;  // not yet written on this pass
      entry.dw0 = slot.dw0;
      entry.dw1 = slot.dw1;
      entry.sq_head = slot.sq_head;
      entry.sq_identifier = slot.sq_identifier;
      deliver(entry);
      ++consumed;
      if (++head == depth) {
        head = 0;
        phase ^= 1u;  // the Phase Tag inverts on each pass through the CQ
      }
    }
    if (consumed != 0) {
      state->cq_head = head;
      state->cq_phase = phase;
      count(state->completions_reaped, consumed);
      // All reads of the consumed CQEs happen before the controller may overwrite them.
      accel::mmio_store32(cq_head_doorbell, head);  // one CQ head doorbell write per batch
    }
    lock.store(0, accel::MemoryOrder::release);
    return consumed;
  }

  /// If the completion of `cid` has been delivered, copies it to `out`, frees the CID and
  /// returns true. Otherwise returns false.
  TUTTI_HOST_DEVICE bool take_completion(std::uint16_t cid, CompletionQueueEntry& out) const noexcept {
    const std::uint32_t index = cid_index(cid);
    if (index >= cid_capacity) return false;
    SubmitterAtomic<std::uint32_t> slot_state(slots[index].state);
    const std::uint32_t generation = cid_generation(cid);
    // Acquire: the completion bytes written by the reaper are visible.
    if (slot_state.load(accel::MemoryOrder::acquire) != encode_state(generation, CommandState::completed)) return false;
    out = slots[index].completion;
    release_slot(index, generation);
    return true;
  }

  /// Gives up on `cid` (after a timeout, before or after an Abort): its completion, when it
  /// arrives, is dropped and the CID freed then. If it already arrived, it is freed now.
  TUTTI_HOST_DEVICE void abandon(std::uint16_t cid) const noexcept {
    const std::uint32_t index = cid_index(cid);
    if (index >= cid_capacity) return;
    const std::uint32_t generation = cid_generation(cid);
    SubmitterAtomic<std::uint32_t> slot_state(slots[index].state);
    std::uint32_t expected = encode_state(generation, CommandState::in_flight);
    if (slot_state.compare_exchange_strong(expected, encode_state(generation, CommandState::abandoned),
                                           accel::MemoryOrder::acq_rel))
      return;
    if (expected == encode_state(generation, CommandState::completed)) release_slot(index, generation);
  }

  /// Frees `cid` whose command never reached the SQ (allocated, then not submitted: the SQ stayed
  /// full, or the submitter gave up before writing its SQE). Returns false, and changes nothing,
  /// when `cid` is not in flight with that generation (already freed, completed or abandoned):
  /// a CID whose SQE was written must go through take_completion or abandon instead.
  TUTTI_HOST_DEVICE bool release_command_identifier(std::uint16_t cid) const noexcept {
    const std::uint32_t index = cid_index(cid);
    if (index >= cid_capacity) return false;
    const std::uint32_t generation = cid_generation(cid);
    std::uint32_t expected = encode_state(generation, CommandState::in_flight);
    // Acq_rel: the state becomes free (keeping its generation) before the bitmap bit is cleared.
    if (!SubmitterAtomic<std::uint32_t>(slots[index].state)
             .compare_exchange_strong(expected, encode_state(generation, CommandState::free),
                                      accel::MemoryOrder::acq_rel))
      return false;
    SubmitterAtomic<std::uint32_t>(cid_bitmap[index / 32])
        .fetch_and(~(1u << (index % 32)), accel::MemoryOrder::release);
    return true;
  }

  /// Waits for the completion of `cid` for at most budget_ns, reaping the CQ meanwhile (any
  /// waiter reaps for all). Returns OK with the CQE, TIMEOUT (the command stays in flight: call
  /// abandon or Abort it), or DEVICE_ERROR when CSTS reports Controller Fatal Status or all ones.
  TUTTI_HOST_DEVICE WaitResult wait_for_completion(std::uint16_t cid, std::uint64_t budget_ns) const noexcept {
    WaitResult result;
    const std::uint64_t deadline = accel::deadline_after(budget_ns);
    accel::Backoff backoff;
    for (;;) {
      if (take_completion(cid, result.completion)) return result;
      if (reap_completions() != 0) {
        backoff.reset();
        continue;
      }
      // CSTS is a device register (an uncached MMIO read on real hardware, a PCIe round trip from
      // a GPU): read it only once the poll has backed off to sleeping, and at the deadline.
      if ((backoff.sleeping() || accel::timer_ns() >= deadline) && controller_failed()) {
        result.status = StatusCode::DEVICE_ERROR;
        return result;
      }
      if (accel::timer_ns() >= deadline) {
        // Last look: the completion may have landed while we checked the clock.
        reap_completions();
        if (take_completion(cid, result.completion)) return result;
        result.status = StatusCode::TIMEOUT;
        return result;
      }
      backoff.pause();
    }
  }

  /// True when CSTS is readable and reports CFS, or reads all ones (device gone).
  TUTTI_HOST_DEVICE bool controller_failed() const noexcept {
    if (controller_status == nullptr) return false;
    return ControllerStatus{accel::mmio_load32(controller_status)}.fatal();
  }

  /// Entries reserved but not yet fetched by the controller (approximate under concurrency).
  TUTTI_HOST_DEVICE std::uint64_t submissions_outstanding() const noexcept {
    return SubmitterAtomic<std::uint64_t>(state->sq_reserved).load(accel::MemoryOrder::relaxed) -
           SubmitterAtomic<std::uint64_t>(state->sq_head_ticket).load(accel::MemoryOrder::relaxed);
  }

  TUTTI_HOST_DEVICE static constexpr std::uint32_t encode_state(std::uint32_t generation, CommandState s) noexcept {
    return ((generation & 0xffffu) << 2) | static_cast<std::uint32_t>(s);
  }

  // ----- steps of delivering a CQE (the reaper, under the CQ lock) ------------------------------
  // reap_completions and nvme::warp_reap_completions (nvme/warp_queue.hpp) deliver with the same
  // steps: the serial reaper runs all three per CQE with release/acquire on each; the warp reaper
  // runs them in 32 lanes at once with ONE release fence between stage and publish per batch.

  /// What stage_completion found for one CQE, for publish_completion.
  struct Delivery {
    std::uint32_t index = 0;       ///< command slot of the CQE's CID
    std::uint32_t generation = 0;  ///< generation the CID carries
    bool publish = false;          ///< the slot was in flight (completion copied) or abandoned
  };

  /// True when the CQE names this SQ and an SQ Head Pointer inside the ring (Base 2.0, 4.2.1).
  TUTTI_HOST_DEVICE bool completion_fields_valid(const CompletionQueueEntry& entry) const noexcept {
    return entry.sq_identifier == qid && entry.sq_head < depth;
  }

  /// Step 1: advances the SQ head ticket to a CQE's SQ Head Pointer (slots before it were fetched
  /// by the controller and may be reused). A head beyond the announced tail is counted invalid and
  /// ignored. `order`: release for a single CQE; relaxed when the caller fences the batch.
  TUTTI_HOST_DEVICE void advance_submission_head(std::uint16_t sq_head_pointer,
                                                 accel::MemoryOrder order) const noexcept {
    SubmitterAtomic<std::uint64_t> head(state->sq_head_ticket);
    const std::uint64_t old_head = head.load(accel::MemoryOrder::relaxed);
    const std::uint64_t advance = (sq_head_pointer + depth - old_head % depth) % depth;
    const std::uint64_t announced =
        SubmitterAtomic<std::uint64_t>(state->sq_doorbell_ticket).load(accel::MemoryOrder::acquire);
    // Release (here or by the caller's fence): the controller's fetch of those slots happened
    // before their reuse.
    if (old_head + advance <= announced)
      head.store(old_head + advance, order);
    else
      count(state->invalid_completions);
  }

  /// Step 2: finds the command slot of the CQE's CID; when it is in flight with that generation,
  /// copies the completion into it (not yet visible to the waiter). A CID out of range or not in
  /// flight with that generation is a stale completion: counted, never delivered.
  TUTTI_HOST_DEVICE Delivery stage_completion(const CompletionQueueEntry& entry) const noexcept {
    Delivery d;
    const std::uint16_t cid = entry.command_identifier();
    d.index = cid_index(cid);
    d.generation = cid_generation(cid);
    if (d.index >= cid_capacity) {
      count(state->stale_completions);
      return d;
    }
    // Acquire: pairs with the allocator's release of in_flight (the previous owner's read of the
    // slot's completion happened before we overwrite it).
    const std::uint32_t current =
        SubmitterAtomic<std::uint32_t>(slots[d.index].state).load(accel::MemoryOrder::acquire);
    if (current == encode_state(d.generation, CommandState::in_flight)) {
      slots[d.index].completion = entry;
      d.publish = true;
    } else if (current == encode_state(d.generation, CommandState::abandoned)) {
      d.publish = true;  // publish_completion's CAS fails and frees the CID
    } else {
      count(state->stale_completions);
    }
    return d;
  }

  /// Step 3: makes a staged completion visible (in_flight -> completed). `order`: acq_rel for a
  /// single CQE; relaxed after the caller's release fence over the batch. When the waiter
  /// abandoned the command meanwhile, the CID is freed now (release_slot).
  TUTTI_HOST_DEVICE void publish_completion(const Delivery& d, accel::MemoryOrder order) const noexcept {
    if (!d.publish) return;
    SubmitterAtomic<std::uint32_t> slot_state(slots[d.index].state);
    std::uint32_t expected = encode_state(d.generation, CommandState::in_flight);
    if (slot_state.compare_exchange_strong(expected, encode_state(d.generation, CommandState::completed), order))
      return;
    if (expected != encode_state(d.generation, CommandState::abandoned)) {
      count(state->stale_completions);
      return;
    }
    count(state->abandoned_completions);
    release_slot(d.index, d.generation);
  }

  /// Frees a command slot (state first, keeping its generation, then the bitmap bit, so the next
  /// allocator starts from this generation).
  TUTTI_HOST_DEVICE void release_slot(std::uint32_t index, std::uint32_t generation) const noexcept {
    SubmitterAtomic<std::uint32_t>(slots[index].state)
        .store(encode_state(generation, CommandState::free), accel::MemoryOrder::release);
    SubmitterAtomic<std::uint32_t>(cid_bitmap[index / 32])
        .fetch_and(~(1u << (index % 32)), accel::MemoryOrder::release);
  }

  /// Adds to a statistics counter of QueuePairState (relaxed: counters order nothing).
  TUTTI_HOST_DEVICE static void count(std::uint64_t& counter, std::uint64_t n = 1) noexcept {
    SubmitterAtomic<std::uint64_t>(counter).fetch_add(n, accel::MemoryOrder::relaxed);
  }

 private:
  TUTTI_HOST_DEVICE std::uint32_t generation_mask() const noexcept { return (1u << (16 - cid_index_bits)) - 1; }
  TUTTI_HOST_DEVICE std::uint16_t make_cid(std::uint32_t index, std::uint32_t generation) const noexcept {
    return static_cast<std::uint16_t>(((generation & generation_mask()) << cid_index_bits) | index);
  }

  TUTTI_HOST_DEVICE static std::uint32_t lowest_zero_bit(std::uint32_t value) noexcept {
    std::uint32_t bit = 0;
    TUTTI_IF_DEVICE((bit = static_cast<std::uint32_t>(__ffs(static_cast<int>(~value)) - 1);),
                    (bit = static_cast<std::uint32_t>(__builtin_ctz(~value));));
    return bit;
  }

  /// Delivers one CQE: the three steps above, each with its own ordering.
  TUTTI_HOST_DEVICE void deliver(const CompletionQueueEntry& entry) const noexcept {
    if (completion_fields_valid(entry))
      advance_submission_head(entry.sq_head, accel::MemoryOrder::release);
    else
      count(state->invalid_completions);
    publish_completion(stage_completion(entry), accel::MemoryOrder::acq_rel);
  }
};

/// Number of CID index bits for `capacity` command slots (at least 1, at most 15).
TUTTI_HOST_DEVICE constexpr std::uint32_t cid_index_bits_for(std::uint32_t capacity) noexcept {
  std::uint32_t bits = 1;
  while ((1u << bits) < capacity) ++bits;
  return bits;
}
static_assert(cid_index_bits_for(1) == 1);
static_assert(cid_index_bits_for(256) == 8);
static_assert(cid_index_bits_for(257) == 9);

/// Host-side owner of the shared state of one queue pair (state, ready words, command slots,
/// CID bitmap), initialised, and the QueuePair view over it. The rings and doorbells are not
/// owned (they come from libnvm's QueuePairInfo or any controller). Not copyable; the view stays
/// valid while this object lives.
/// Placement (accel/placement.hpp): host memory by default; accel::Placement::mapped_host puts
/// the shared state where GPU kernels reach it too (CUDA profile: mapped pinned host memory,
/// used by the local_nvme DataPath's GPU submission). Throws std::bad_alloc when that memory
/// cannot be allocated. move_to_device() then moves it into accelerator memory, for queues whose
/// rings only kernels reach.
class QueuePairStorage {
 public:
  /// sq/cq: rings of `depth` entries (2..65536); cid_capacity: command slots (1..32768, default
  /// depth). Out-of-range arguments yield an invalid storage (valid() == false).
  QueuePairStorage(SubmissionQueueEntry* sq, CompletionQueueEntry* cq, volatile std::uint32_t* sq_tail_doorbell,
                   volatile std::uint32_t* cq_head_doorbell, const volatile std::uint32_t* controller_status,
                   std::uint32_t depth, std::uint16_t qid, std::uint32_t cid_capacity = 0,
                   accel::Placement placement = accel::Placement::host)
      : state_(1, QueuePairState{}, Allocator<QueuePairState>(placement)),
        ready_(depth, 0, Allocator<std::uint64_t>(placement)),
        slots_(cid_capacity == 0 ? depth : cid_capacity, CommandSlot{}, Allocator<CommandSlot>(placement)),
        bitmap_((slots_.size() + 31) / 32, 0, Allocator<std::uint32_t>(placement)) {
    if (depth < 2 || depth > 65536 || slots_.empty() || slots_.size() > 32768) return;
    for (std::size_t i = slots_.size(); i < bitmap_.size() * 32; ++i)
      bitmap_[i / 32] |= 1u << (i % 32);  // beyond capacity
    state_[0].cq_phase = 1;               // the first pass expects Phase Tag 1 (CQ memory starts zeroed)
    view_.sq = sq;
    view_.cq = cq;
    view_.sq_tail_doorbell = sq_tail_doorbell;
    view_.cq_head_doorbell = cq_head_doorbell;
    view_.controller_status = controller_status;
    view_.depth = depth;
    view_.qid = qid;
    view_.cid_capacity = static_cast<std::uint32_t>(slots_.size());
    view_.cid_index_bits = cid_index_bits_for(view_.cid_capacity);
    view_.state = state_.data();
    view_.sq_ready = ready_.data();
    view_.slots = slots_.data();
    view_.cid_bitmap = bitmap_.data();
  }
  QueuePairStorage(const QueuePairStorage&) = delete;
  QueuePairStorage& operator=(const QueuePairStorage&) = delete;

  bool valid() const noexcept { return view_.state != nullptr; }
  /// The view (trivially copyable; share it with every submitter).
  const QueuePair& queue() const noexcept { return view_; }
  /// Statistics snapshot (plain reads: approximate while other threads use the queue). After
  /// move_to_device, a copy from accelerator memory (all zero when that copy fails).
  QueuePairState statistics() const noexcept {
    if (device_.data() == nullptr) return state_[0];
    QueuePairState copy{};
    if (!accel::copy_from_device(&copy, device_.data(), sizeof(copy)).is_ok()) return QueuePairState{};
    return copy;
  }

  /// Moves the shared state (as initialised, before any submitter used the queue) into one
  /// accel::allocate_device allocation: GPU memory in the CUDA profile, host memory in the host
  /// profile. Why: with the state in mapped pinned host memory every submitter atomic (SQ slot
  /// reservation, doorbell and CQ try-locks, CID slots) is a PCIe round trip, about 1 us, and GPU
  /// warps polling host memory slow every kernel on the device (docs/gpu.md, "Execution model");
  /// in GPU memory they are L2 operations. For queues whose rings and doorbells only kernels reach
  /// (QueuePairInfo::host_accessible false): afterwards host threads must not call the view's
  /// functions (a host load of GPU memory faults), only statistics(). Call once, before the view
  /// is shared; the view's addresses change. Errors: allocate_device's, copy_to_device's (the
  /// storage is then unchanged); INTERNAL when invalid or already moved (a caller bug).
  Status move_to_device() {
    if (!valid() || device_.data() != nullptr)
      return Status(StatusCode::INTERNAL, "QueuePairStorage::move_to_device: invalid or already moved");
    // One allocation: state, ready words, command slots, bitmap, each on its own 128-byte line.
    const auto line = [](std::size_t bytes) {
      return (bytes + kQueueStateLineBytes - 1) / kQueueStateLineBytes * kQueueStateLineBytes;
    };
    const std::size_t ready_at = line(sizeof(QueuePairState));
    const std::size_t slots_at = ready_at + line(ready_.size() * sizeof(std::uint64_t));
    const std::size_t bitmap_at = slots_at + line(slots_.size() * sizeof(CommandSlot));
    const std::size_t total = bitmap_at + bitmap_.size() * sizeof(std::uint32_t);
    auto buffer = accel::DeviceBuffer::allocate(total);
    if (!buffer) return buffer.status().with_context("QueuePairStorage::move_to_device");
    auto* base = static_cast<std::uint8_t*>(buffer->data());
    for (auto [offset, source, bytes] :
         {std::tuple{std::size_t{0}, static_cast<const void*>(state_.data()), sizeof(QueuePairState)},
          std::tuple{ready_at, static_cast<const void*>(ready_.data()), ready_.size() * sizeof(std::uint64_t)},
          std::tuple{slots_at, static_cast<const void*>(slots_.data()), slots_.size() * sizeof(CommandSlot)},
          std::tuple{bitmap_at, static_cast<const void*>(bitmap_.data()), bitmap_.size() * sizeof(std::uint32_t)}})
      if (Status copied = accel::copy_to_device(base + offset, source, bytes); !copied.is_ok())
        return copied.with_context("QueuePairStorage::move_to_device");
    view_.state = reinterpret_cast<QueuePairState*>(base);
    view_.sq_ready = reinterpret_cast<std::uint64_t*>(base + ready_at);
    view_.slots = reinterpret_cast<CommandSlot*>(base + slots_at);
    view_.cid_bitmap = reinterpret_cast<std::uint32_t*>(base + bitmap_at);
    device_ = std::move(buffer.value());
    return Status::success();
  }
  /// True after move_to_device.
  bool in_device_memory() const noexcept { return device_.data() != nullptr; }

 private:
  template <class T>
  using Allocator = accel::PlacementAllocator<T>;
  std::vector<QueuePairState, Allocator<QueuePairState>> state_;
  std::vector<std::uint64_t, Allocator<std::uint64_t>> ready_;
  std::vector<CommandSlot, Allocator<CommandSlot>> slots_;
  std::vector<std::uint32_t, Allocator<std::uint32_t>> bitmap_;
  accel::DeviceBuffer device_;  ///< the state after move_to_device (the vectors above keep the initial image)
  QueuePair view_{};
};

}  // namespace tutti::nvme
