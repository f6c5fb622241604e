// Queue ring primitives against a hand-driven fake controller: CIDs and generations, doorbell
// coalescing (also across threads), phase tags, stale completions, time-bounded polling; and the
// warp submission protocol (nvme/warp_queue.hpp) as a host thread runs it (a one-lane warp).
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <set>
#include <thread>
#include <vector>

#include <tutti/accel/primitives.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/warp_queue.hpp>
#include <tutti/nvme/status.hpp>

using namespace tutti;
using namespace tutti::nvme;

namespace {

/// Rings, doorbells and CSTS in ordinary memory; the test plays the controller.
struct FakeQueue {
  explicit FakeQueue(std::uint32_t depth, std::uint32_t cid_capacity = 0)
      : sq(depth), cq(depth), storage(sq.data(), cq.data(), &sq_tail, &cq_head, &csts, depth, 1, cid_capacity) {
    REQUIRE(storage.valid());
  }
  const QueuePair& q() const { return storage.queue(); }
  std::uint32_t tail() { return accel::mmio_load32(&sq_tail); }
  /// Posts a completion as a controller would: dwords 0-2, then dword 3 with a release store.
  void post(std::uint16_t cid, StatusField status, std::uint16_t sq_head, std::uint16_t sqid = 1) {
    CompletionQueueEntry& slot = cq[cq_tail];
    slot.dw0 = 0;
    slot.sq_head = sq_head;
    slot.sq_identifier = sqid;
    status.raw = StatusField::P::encode(status.raw, static_cast<std::uint16_t>(phase));
    accel::SystemAtomicRef<std::uint32_t>(slot.dw3).store(CompletionQueueEntry::make_dw3(cid, status),
                                                          accel::MemoryOrder::release);
    if (++cq_tail == cq.size()) {
      cq_tail = 0;
      phase ^= 1;
    }
  }
  std::vector<SubmissionQueueEntry> sq;
  std::vector<CompletionQueueEntry> cq;
  alignas(4) std::uint32_t sq_tail = 0;
  alignas(4) std::uint32_t cq_head = 0;
  alignas(4) std::uint32_t csts = 1;
  std::uint32_t cq_tail = 0;
  std::uint32_t phase = 1;
  QueuePairStorage storage;
};

}  // namespace

TEST_CASE("CIDs are unique while in flight, run out at capacity, and come back with a new generation") {
  FakeQueue f(16, 8);
  const QueuePair& q = f.q();
  CHECK(q.cid_index_bits == 3);
  std::set<std::uint16_t> cids;
  for (int i = 0; i < 8; ++i) {
    std::uint16_t cid = 0;
    REQUIRE(q.allocate_command_identifier(cid));
    CHECK(cid != 0xffff);
    cids.insert(cid);
  }
  CHECK(cids.size() == 8);
  std::uint16_t extra = 0;
  CHECK_FALSE(q.allocate_command_identifier(extra));
  // Complete one and take it: its index comes back with generation + 1.
  const std::uint16_t first = *cids.begin();
  f.post(first, StatusField{0}, 0);
  CHECK(q.reap_completions() == 1);
  CompletionQueueEntry cqe{};
  REQUIRE(q.take_completion(first, cqe));
  CHECK_FALSE(q.take_completion(first, cqe));  // taken once
  std::uint16_t again = 0;
  REQUIRE(q.allocate_command_identifier(again));
  CHECK(q.cid_index(again) == q.cid_index(first));
  CHECK(q.cid_generation(again) == q.cid_generation(first) + 1);
}

TEST_CASE("release_command_identifier frees a CID that never reached the SQ, only while it is in flight") {
  FakeQueue f(8, 4);
  const QueuePair& q = f.q();
  std::uint16_t cids[4];
  for (auto& cid : cids) REQUIRE(q.allocate_command_identifier(cid));
  std::uint16_t extra = 0;
  REQUIRE_FALSE(q.allocate_command_identifier(extra));  // all 4 taken
  CHECK(q.release_command_identifier(cids[2]));
  CHECK_FALSE(q.release_command_identifier(cids[2]));  // already free: nothing changes
  REQUIRE(q.allocate_command_identifier(extra));       // the released index is usable again
  CHECK(q.cid_index(extra) == q.cid_index(cids[2]));
  CHECK(q.cid_generation(extra) == q.cid_generation(cids[2]) + 1);
  // A CID whose completion was delivered is not in flight: release refuses, take_completion frees it.
  f.post(cids[0], StatusField{0}, 0);
  CHECK(q.reap_completions() == 1);
  CHECK_FALSE(q.release_command_identifier(cids[0]));
  CompletionQueueEntry cqe{};
  CHECK(q.take_completion(cids[0], cqe));
  CHECK_FALSE(q.release_command_identifier(static_cast<std::uint16_t>(cids[3] ^ 0x100)));  // another generation
}

TEST_CASE("a stale completion (old generation) is counted and never delivered to the new command") {
  FakeQueue f(8, 4);
  const QueuePair& q = f.q();
  std::uint16_t old_cid = 0;
  REQUIRE(q.allocate_command_identifier(old_cid));
  q.abandon(old_cid);  // gave up on it...
  f.post(old_cid, StatusField{0}, 0);
  CHECK(q.reap_completions() == 1);  // ...its completion frees the CID
  CHECK(f.storage.statistics().abandoned_completions == 1);
  std::uint16_t fresh = 0;
  for (int i = 0; i < 4; ++i) {
    REQUIRE(q.allocate_command_identifier(fresh));
    if (q.cid_index(fresh) == q.cid_index(old_cid)) break;
  }
  REQUIRE(q.cid_index(fresh) == q.cid_index(old_cid));
  // A duplicate completion of the old CID arrives: dropped as stale.
  f.post(old_cid, StatusField::make(0, 0x04, true), 0);
  CHECK(q.reap_completions() == 1);
  CHECK(f.storage.statistics().stale_completions == 1);
  CompletionQueueEntry cqe{};
  CHECK_FALSE(q.take_completion(fresh, cqe));
  // A CID whose index is beyond the table, and a CQE from another SQ, are caught too.
  f.post(0x0fff, StatusField{0}, 0);
  f.post(fresh, StatusField{0}, 0, 7);
  CHECK(q.reap_completions() == 2);
  CHECK(f.storage.statistics().stale_completions == 2);
  CHECK(f.storage.statistics().invalid_completions == 1);
  REQUIRE(q.take_completion(fresh, cqe));  // delivered despite the wrong SQ id (counted as invalid)
}

TEST_CASE("one doorbell write announces a run of entries written out of order") {
  FakeQueue f(16);
  const QueuePair& q = f.q();
  std::uint64_t first = 0;
  REQUIRE(q.reserve_submission_slots(3, first));
  CHECK(first == 0);
  SubmissionQueueEntry sqe{};
  sqe.cdw10 = 2;
  q.write_submission(2, sqe);
  CHECK(q.ring_submission_doorbell() == 0);  // slot 0 not ready: nothing announced
  sqe.cdw10 = 1;
  q.write_submission(1, sqe);
  CHECK(q.ring_submission_doorbell() == 0);
  CHECK(f.tail() == 0);
  sqe.cdw10 = 0;
  q.write_submission(0, sqe);
  CHECK(q.ring_submission_doorbell() == 3);
  CHECK(f.tail() == 3);
  CHECK(f.storage.statistics().doorbell_writes == 1);
  CHECK(f.sq[2].cdw10 == 2);
}

TEST_CASE("reservations stop at depth - 1 unconsumed entries; the CQE's SQ head frees them") {
  FakeQueue f(4);
  const QueuePair& q = f.q();
  SubmissionQueueEntry sqe{};
  std::vector<std::uint16_t> cids;
  for (int i = 0; i < 3; ++i) {
    std::uint16_t cid = 0;
    REQUIRE(q.allocate_command_identifier(cid));
    sqe.command_identifier = cid;
    CHECK(q.submit(sqe) == StatusCode::OK);
    cids.push_back(cid);
  }
  CHECK(q.submit(sqe) == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(f.tail() == 3);
  f.post(cids[0], StatusField{0}, 2);  // the controller fetched two entries
  q.reap_completions();
  CHECK(q.submissions_outstanding() == 1);
  CHECK(q.submit(sqe) == StatusCode::OK);
  CHECK(q.submit(sqe) == StatusCode::OK);
  CHECK(q.submit(sqe) == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(f.tail() == 1);  // 5 entries: tail wrapped to 1
}

TEST_CASE("an SQ head beyond the announced tail is rejected and counted, not trusted") {
  FakeQueue f(8);
  const QueuePair& q = f.q();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  SubmissionQueueEntry sqe{};
  sqe.command_identifier = cid;
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  f.post(cid, StatusField{0}, 5);  // only 2 entries were ever announced
  q.reap_completions();
  CHECK(f.storage.statistics().invalid_completions == 1);
  CHECK(q.submissions_outstanding() == 2);
  CompletionQueueEntry cqe{};
  CHECK(q.take_completion(cid, cqe));  // the completion itself is still delivered
}

TEST_CASE("the reaper follows the phase tag around the CQ and writes the head doorbell once per batch") {
  FakeQueue f(4);
  const QueuePair& q = f.q();
  for (int round = 0; round < 5; ++round) {
    std::vector<std::uint16_t> cids(3);
    for (auto& cid : cids) REQUIRE(q.allocate_command_identifier(cid));
    for (auto cid : cids) f.post(cid, StatusField{0}, 0);
    CHECK(q.reap_completions() == 3);
    CHECK(q.reap_completions() == 0);  // nothing new: old entries have the old phase
    CHECK(accel::mmio_load32(&f.cq_head) == f.cq_tail);
    CompletionQueueEntry cqe{};
    for (auto cid : cids) CHECK(q.take_completion(cid, cqe));
  }
  CHECK(f.storage.statistics().completions_reaped == 15);
  CHECK(f.storage.statistics().cq_phase == f.phase);
}

TEST_CASE("state moved to device memory keeps working: CIDs, SQ reservations, reaping and statistics") {
  // Host profile: allocate_device is host memory, so the host can drive the moved view; the CUDA
  // profile moves it to GPU memory for queues only kernels reach (gpu_drive_controller covers it).
  FakeQueue f(8, 8);
  const QueuePair before = f.q();
  CompletionQueueEntry cqe{};
  std::uint16_t first = 0;
  REQUIRE(before.allocate_command_identifier(first));  // state changed before the move travels with it
  REQUIRE(f.storage.move_to_device().is_ok());
  CHECK(f.storage.in_device_memory());
  const QueuePair& q = f.q();
  CHECK(q.state != before.state);
  CHECK(q.slots != before.slots);
  CHECK(q.cid_bitmap != before.cid_bitmap);
  CHECK(q.sq_ready != before.sq_ready);
  CHECK(reinterpret_cast<std::uintptr_t>(q.state) % kQueueStateLineBytes == 0);
  // A second move is a caller bug, refused without changing the view.
  const Status again = f.storage.move_to_device();
  CHECK(again.code() == StatusCode::INTERNAL);
  CHECK(f.q().state == q.state);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::uint16_t> cids(3);
    for (auto& cid : cids) REQUIRE(q.allocate_command_identifier(cid));
    for (auto cid : cids) CHECK(cid != first);  // the CID taken before the move is still in flight
    for (auto cid : cids) f.post(cid, StatusField{0}, 0);
    CHECK(q.reap_completions() == 3);
    for (auto cid : cids) CHECK(q.take_completion(cid, cqe));
  }
  CHECK(f.storage.statistics().completions_reaped == 9);
  CHECK(f.storage.statistics().cq_phase == f.phase);
  // The moved state is the only one updated: the initial image stays as it was.
  CHECK(before.state->completions_reaped == 0);
}

TEST_CASE("waiting is bounded by the time budget and reports a fatal controller") {
  FakeQueue f(8);
  const QueuePair& q = f.q();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  const std::uint64_t start = accel::timer_ns();
  CHECK(q.wait_for_completion(cid, 20'000'000).status == StatusCode::TIMEOUT);
  const std::uint64_t elapsed = accel::timer_ns() - start;
  CHECK(elapsed >= 20'000'000);
  CHECK(elapsed < 2'000'000'000);
  CHECK(q.wait_for_completion(cid, 0).status == StatusCode::TIMEOUT);
  f.csts = ControllerStatus::CFS::encode(1, 1);
  CHECK(q.wait_for_completion(cid, 1'000'000'000).status == StatusCode::DEVICE_ERROR);
  f.csts = 0xffffffffu;
  CHECK(q.wait_for_completion(cid, 1'000'000'000).status == StatusCode::DEVICE_ERROR);
  f.csts = 1;
  f.post(cid, StatusField{0}, 0);
  CHECK(q.wait_for_completion(cid, 1'000'000'000).status == StatusCode::OK);
}

TEST_CASE("many threads submit through one queue; a fake controller sees every SQE exactly once") {
  constexpr std::uint32_t kDepth = 64;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  FakeQueue f(kDepth, 256);
  const QueuePair& q = f.q();
  std::atomic<bool> stop{false};
  std::vector<int> seen(kThreads * kPerThread, 0);
  std::atomic<int> duplicates{0};
  std::thread controller([&] {
    std::uint32_t head = 0;
    accel::Backoff backoff;
    while (!stop.load()) {
      const std::uint32_t tail = f.tail();
      bool work = false;
      while (head != tail) {
        // Room in the CQ? (the host's head doorbell)
        if ((f.cq_tail + 1) % kDepth == accel::mmio_load32(&f.cq_head)) break;
        const SubmissionQueueEntry sqe = f.sq[head];
        head = (head + 1) % kDepth;
        if (seen[sqe.cdw10]++ != 0) ++duplicates;
        f.post(sqe.command_identifier, StatusField{0}, static_cast<std::uint16_t>(head));
        work = true;
      }
      if (work)
        backoff.reset();
      else
        backoff.pause();
    }
  });
  std::atomic<int> failures{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t)
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::uint16_t cid = 0;
        const std::uint64_t deadline = accel::deadline_after(10'000'000'000ull);
        while (!q.allocate_command_identifier(cid)) {
          q.reap_completions();
          if (accel::timer_ns() > deadline) {
            ++failures;
            return;
          }
        }
        SubmissionQueueEntry sqe{};
        sqe.command_identifier = cid;
        sqe.cdw10 = static_cast<std::uint32_t>(t * kPerThread + i);
        while (q.submit(sqe) != StatusCode::OK) {
          q.reap_completions();
          if (accel::timer_ns() > deadline) {
            ++failures;
            return;
          }
        }
        if (i % 4 == 3 || i == kPerThread - 1) {  // wait for every 4th: keeps several in flight
          if (q.wait_for_completion(cid, 10'000'000'000ull).status != StatusCode::OK) ++failures;
        } else {
          q.abandon(cid);
        }
      }
    });
  for (auto& s : submitters) s.join();
  // Drain what is left.
  const std::uint64_t deadline = accel::deadline_after(10'000'000'000ull);
  while (f.storage.statistics().completions_reaped < kThreads * kPerThread && accel::timer_ns() < deadline) {
    q.reap_completions();
    accel::shim::yield_thread();
  }
  stop.store(true);
  controller.join();
  CHECK(failures.load() == 0);
  CHECK(duplicates.load() == 0);
  for (int v : seen) REQUIRE(v == 1);
  const QueuePairState stats = f.storage.statistics();
  CHECK(stats.completions_reaped == kThreads * kPerThread);
  CHECK(stats.doorbell_writes <= kThreads * kPerThread);
  CHECK(stats.stale_completions == 0);
  CHECK(stats.invalid_completions == 0);
  MESSAGE("doorbell writes for ", kThreads * kPerThread, " SQEs: ", stats.doorbell_writes);
}

TEST_CASE(
    "regression: completions keep matching after CID generations wrap (state kept more generation bits than the CID)") {
  FakeQueue f(16, 8192);  // 13 index bits: only 3 generation bits, wraps every 8 reuses of a slot
  const QueuePair& q = f.q();
  for (int i = 0; i < 20000; ++i) {
    std::uint16_t cid = 0;
    REQUIRE(q.allocate_command_identifier(cid));
    SubmissionQueueEntry sqe{};
    sqe.command_identifier = cid;
    REQUIRE(q.submit(sqe) == StatusCode::OK);
    f.post(cid, StatusField{0}, static_cast<std::uint16_t>(f.tail()));
    const WaitResult waited = q.wait_for_completion(cid, 1'000'000'000);
    REQUIRE(waited.status == StatusCode::OK);
    REQUIRE(waited.completion.command_identifier() == cid);
  }
  CHECK(f.storage.statistics().stale_completions == 0);
}

namespace {
/// The queue views as the warp protocol takes them.
struct OneQueue {
  const QueuePair* queue;
  const QueuePair& operator()(std::uint32_t) const { return *queue; }
};
/// Writes `n` Read SQEs with fresh CIDs at [ticket, ticket + n); CDW10 = first_slba + k.
void write_reads(const QueuePair& q, std::uint64_t ticket, std::uint32_t n, std::uint32_t first_slba,
                 std::vector<std::uint16_t>& cids) {
  for (std::uint32_t k = 0; k < n; ++k) {
    std::uint16_t cid = 0;
    REQUIRE(q.allocate_command_identifier(cid));
    SubmissionQueueEntry sqe{};
    sqe.opcode = static_cast<std::uint8_t>(NvmOpcode::read);
    sqe.command_identifier = cid;
    sqe.cdw10 = first_slba + k;
    q.write_submission(ticket + k, sqe);
    cids.push_back(cid);
  }
}
}  // namespace

TEST_CASE("warp_submit puts a lane's run into the SQ with one reservation and one doorbell write") {
  FakeQueue f(16);
  const QueuePair& q = f.q();
  std::vector<std::uint16_t> cids;
  CHECK(warp_submit(OneQueue{&q}, 0, 5, [&](std::uint64_t ticket) { write_reads(q, ticket, 5, 100, cids); }));
  CHECK(f.tail() == 5);
  CHECK(f.storage.statistics().doorbell_writes == 1);
  CHECK(f.storage.statistics().sq_reserved == 5);
  for (std::uint32_t k = 0; k < 5; ++k) {
    CHECK(f.sq[k].cdw10 == 100 + k);
    CHECK(f.sq[k].command_identifier == cids[k]);
  }
  // A lane with nothing to submit takes part without effect.
  CHECK_FALSE(warp_submit(OneQueue{&q}, 0, 0, [&](std::uint64_t) { FAIL("write called for count 0"); }));
  CHECK(f.storage.statistics().doorbell_writes == 1);
}

TEST_CASE("warp_submit refuses a run that can never fit and one that finds the SQ full, writing nothing") {
  FakeQueue f(8);
  const QueuePair& q = f.q();
  bool written = false;
  // depth - 1 = 7 entries at most: 8 never fit.
  CHECK_FALSE(warp_submit(OneQueue{&q}, 0, 8, [&](std::uint64_t) { written = true; }));
  CHECK_FALSE(written);
  CHECK(f.storage.statistics().sq_reserved == 0);
  std::vector<std::uint16_t> cids;
  REQUIRE(warp_submit(OneQueue{&q}, 0, 6, [&](std::uint64_t ticket) { write_reads(q, ticket, 6, 0, cids); }));
  // One slot left: a run of 2 finds the SQ full and is refused without blocking.
  CHECK_FALSE(warp_submit(OneQueue{&q}, 0, 2, [&](std::uint64_t) { written = true; }));
  CHECK_FALSE(written);
  CHECK(f.tail() == 6);
  // The controller fetches four entries (CQE SQ Head Pointer 4): the run fits now.
  f.post(cids[0], StatusField{0}, 4);
  CHECK(warp_reap_completions(q) == 1);
  CHECK(warp_submit(OneQueue{&q}, 0, 2, [&](std::uint64_t ticket) { write_reads(q, ticket, 2, 6, cids); }));
  CHECK(f.tail() == 0);  // 8 entries announced on a ring of 8: the tail wrapped
  CHECK(f.storage.statistics().doorbell_writes == 2);
}

TEST_CASE("warp_reap_completions delivers through the same steps as reap_completions") {
  // Same CQE sequence through both reapers: every counter and delivery must agree.
  auto run = [](bool warp) {
    FakeQueue f(8, 4);
    const QueuePair& q = f.q();
    const auto reap = [&] { return warp ? warp_reap_completions(q) : q.reap_completions(); };
    std::uint16_t a = 0, b = 0, c = 0;
    REQUIRE(q.allocate_command_identifier(a));
    REQUIRE(q.allocate_command_identifier(b));
    REQUIRE(q.allocate_command_identifier(c));
    SubmissionQueueEntry sqe{};
    for (int i = 0; i < 3; ++i) REQUIRE(q.submit(sqe) == StatusCode::OK);
    q.abandon(b);
    f.post(a, StatusField::make(0, 0x02, false), 1);  // Invalid Field in Command, delivered as is
    f.post(b, StatusField{0}, 2);                     // abandoned: dropped, CID freed
    f.post(0x0fff, StatusField{0}, 2);                // no such CID: stale
    f.post(c, StatusField{0}, 3, 9);                  // wrong SQ identifier: counted invalid, delivered
    CHECK(reap() == 4);
    CHECK(reap() == 0);
    CompletionQueueEntry cqe{};
    REQUIRE(q.take_completion(a, cqe));
    CHECK(cqe.status().status_code() == 0x02);
    CHECK_FALSE(q.take_completion(b, cqe));
    CHECK(q.take_completion(c, cqe));
    const QueuePairState s = f.storage.statistics();
    CHECK(s.completions_reaped == 4);
    CHECK(s.abandoned_completions == 1);
    CHECK(s.stale_completions == 1);
    CHECK(s.invalid_completions == 1);
    CHECK(q.submissions_outstanding() == 1);     // the last valid SQ Head Pointer was 2
    CHECK(accel::mmio_load32(&f.cq_head) == 4);  // one CQ head doorbell write for the batch
    return s.cq_head;
  };
  CHECK(run(false) == run(true));
}

TEST_CASE("the queue state keeps each party's words on its own 128-byte line, statistics apart from locks") {
  CHECK(alignof(QueuePairState) == kQueueStateLineBytes);
  CHECK(offsetof(QueuePairState, sq_reserved) / kQueueStateLineBytes !=
        offsetof(QueuePairState, sq_head_ticket) / kQueueStateLineBytes);
  for (const std::size_t lock : {offsetof(QueuePairState, sq_doorbell_lock), offsetof(QueuePairState, cq_lock)})
    for (const std::size_t counter :
         {offsetof(QueuePairState, doorbell_writes), offsetof(QueuePairState, completions_reaped),
          offsetof(QueuePairState, cid_hint), offsetof(QueuePairState, sq_reserved)})
      CHECK(lock / kQueueStateLineBytes != counter / kQueueStateLineBytes);
  FakeQueue f(8);
  CHECK(reinterpret_cast<std::uintptr_t>(f.q().state) % kQueueStateLineBytes == 0);
}
