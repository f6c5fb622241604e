// The runtime's contract over memfs: round trips, partial commit, backpressure, lifetime (BUSY),
// shutdown, per-backend bucketing under one IO handle, open_batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <numeric>
#include <string>
#include <vector>

#include <faulty_datapath.hpp>
#include <tutti/tutti.hpp>

using namespace tutti;
using tutti::testing::Faults;
using tutti::testing::FaultyBackend;
using tutti::testing::FaultyDataPath;

namespace {
constexpr std::uint64_t kSecond = 1'000'000'000;

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + 1) & 0xff);
  return v;
}
}  // namespace

TEST_CASE("data written through the runtime reads back byte for byte") {
  MemfsRuntime rt = testing::require_ok(make_memfs_runtime());
  auto target = rt.open("memfs://round-trip?size=65536", {.writable = true});
  REQUIRE(target.is_ok());
  CHECK(*rt.target_size(*target) == 65536);
  auto source = pattern(65536, 3);
  std::vector<std::byte> sink(65536);
  auto src = rt.register_memory({source.data(), source.size(), MemoryKind::HOST});
  auto dst = rt.register_memory({sink.data(), sink.size(), MemoryKind::HOST});
  REQUIRE(src.is_ok());
  REQUIRE(dst.is_ok());

  std::vector<IoRequest> writes;
  for (std::uint64_t off = 0; off < 65536; off += 4096)
    writes.push_back({Direction::WRITE, *src, off, *target, off, 4096});
  auto w = rt.submit(writes);
  REQUIRE(w.accepted == writes.size());
  auto wr = rt.wait(w.io, kSecond);
  REQUIRE(wr.is_ok());
  CHECK(wr->status.is_ok());
  CHECK(wr->requests == 16);
  CHECK(wr->requested_bytes == 65536);
  CHECK(wr->confirmed_bytes == 65536);
  CHECK(wr->completions.size() == 16);
  CHECK(rt.release(w.io).is_ok());

  std::vector<IoRequest> reads{{Direction::READ, *dst, 0, *target, 0, 65536}};
  auto r = rt.submit(reads);
  REQUIRE(r.accepted == 1);
  auto rr = rt.wait(r.io, kSecond);
  REQUIRE(rr.is_ok());
  CHECK(rr->confirmed_bytes == 65536);
  CHECK(std::memcmp(source.data(), sink.data(), sink.size()) == 0);
  CHECK(rt.release(r.io).is_ok());
  CHECK(rt.release(r.io).code() == StatusCode::NOT_FOUND);  // released handles go stale
  CHECK(rt.close(*target).is_ok());
  CHECK(rt.unregister_memory(*src).is_ok());
  CHECK(rt.unregister_memory(*dst).is_ok());
}

TEST_CASE("partial commit: a rejected request never runs and the IO handle covers only accepted ones") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = rt.open("memfs://partial?size=4096", {.writable = true});
  REQUIRE(target.is_ok());
  auto data = pattern(4096, 9);
  auto mem = rt.register_memory({data.data(), data.size(), MemoryKind::HOST});
  REQUIRE(mem.is_ok());

  faults->reject_at_position = 1;
  std::vector<IoRequest> batch{{Direction::WRITE, *mem, 0, *target, 0, 1024},
                               {Direction::WRITE, *mem, 1024, *target, 1024, 1024},
                               {Direction::WRITE, *mem, 2048, *target, 2048, 1024}};
  auto outcome = rt.submit(batch);
  REQUIRE(outcome.initial_states.size() == 3);
  CHECK(outcome.initial_states[0].is_ok());
  CHECK(outcome.initial_states[1].code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(outcome.initial_states[2].is_ok());
  CHECK(outcome.accepted == 2);
  auto result = rt.wait(outcome.io, kSecond);
  REQUIRE(result.is_ok());
  CHECK(result->requests == 2);
  CHECK(result->confirmed_bytes == 2048);
  REQUIRE(result->completions.size() == 2);
  CHECK(result->completions[0].request_index == 0);
  CHECK(result->completions[1].request_index == 2);

  // The rejected request never ran: its range still reads zero. Resubmitting it lands it.
  std::vector<std::byte> check(4096);
  auto cm = rt.register_memory({check.data(), check.size(), MemoryKind::HOST});
  faults->reject_at_position = -1;
  std::vector<IoRequest> read{{Direction::READ, *cm, 0, *target, 0, 4096}};
  auto r1 = rt.submit(read);
  REQUIRE(rt.wait(r1.io, kSecond).is_ok());
  CHECK(std::all_of(check.begin() + 1024, check.begin() + 2048, [](std::byte b) { return b == std::byte{0}; }));
  CHECK(std::memcmp(check.data(), data.data(), 1024) == 0);

  std::vector<IoRequest> again{batch[1]};
  auto r2 = rt.submit(again);
  REQUIRE(r2.accepted == 1);
  REQUIRE(rt.wait(r2.io, kSecond).is_ok());
  auto r3 = rt.submit(read);
  REQUIRE(rt.wait(r3.io, kSecond).is_ok());
  CHECK(std::memcmp(check.data(), data.data(), 3072) == 0);
}

TEST_CASE("backpressure rejects past the queue depth with RESOURCE_EXHAUSTED instead of blocking") {
  MemfsRuntime rt = testing::require_ok(make_memfs_runtime({.queue_depth = 2}));
  auto target = rt.open("memfs://pressure?size=8192");
  std::vector<std::byte> buffer(8192);
  auto mem = rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  REQUIRE(target.is_ok());
  REQUIRE(mem.is_ok());
  std::vector<IoRequest> batch;
  for (int i = 0; i < 5; ++i) batch.push_back({Direction::READ, *mem, 0, *target, 0, 1024});
  auto outcome = rt.submit(batch);
  CHECK(outcome.accepted == 2);
  CHECK(outcome.initial_states[0].is_ok());
  CHECK(outcome.initial_states[1].is_ok());
  for (int i = 2; i < 5; ++i) {
    CHECK(outcome.initial_states[i].code() == StatusCode::RESOURCE_EXHAUSTED);
    CHECK(outcome.initial_states[i].message().find("depth 2") != std::string::npos);
  }
  REQUIRE(rt.wait(outcome.io, kSecond).is_ok());
}

TEST_CASE("requests past the DataPath's batch limit are rejected RESOURCE_EXHAUSTED, the rest accepted") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = rt.open("memfs://limit?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  std::vector<IoRequest> batch(FaultyDataPath::capabilities.max_batch_requests + 6,
                               IoRequest{Direction::READ, *mem, 0, *target, 0, 512});
  auto outcome = rt.submit(batch);
  CHECK(outcome.accepted == FaultyDataPath::capabilities.max_batch_requests);
  for (std::size_t i = FaultyDataPath::capabilities.max_batch_requests; i < batch.size(); ++i)
    CHECK(outcome.initial_states[i].code() == StatusCode::RESOURCE_EXHAUSTED);
  REQUIRE(rt.wait(outcome.io, kSecond).is_ok());
}

TEST_CASE("close and unregister return BUSY while IO is in flight, and succeed after it completes") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = rt.open("memfs://busy?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->close_gate();
  std::vector<IoRequest> batch{{Direction::READ, *mem, 0, *target, 0, 4096}};
  auto outcome = rt.submit(batch);
  REQUIRE(outcome.accepted == 1);

  CHECK(rt.close(*target).code() == StatusCode::BUSY);
  CHECK(rt.unregister_memory(*mem).code() == StatusCode::BUSY);
  CHECK(rt.release(outcome.io).code() == StatusCode::BUSY);
  auto pending = rt.query(outcome.io);
  REQUIRE(pending.is_ok());
  CHECK_FALSE(pending->complete);
  CHECK(pending->requests == 1);
  auto timed_out = rt.wait(outcome.io, 2'000'000);
  CHECK(timed_out.code() == StatusCode::TIMEOUT);

  faults->open_gate();
  auto done = rt.wait(outcome.io, kSecond);
  REQUIRE(done.is_ok());
  CHECK(done->status.is_ok());
  auto finished = rt.query(outcome.io);
  CHECK(finished->complete);
  CHECK(finished->completed_requests == 1);
  CHECK(rt.close(*target).is_ok());
  CHECK(rt.unregister_memory(*mem).is_ok());
  CHECK(rt.release(outcome.io).is_ok());
}

TEST_CASE("shutdown with IO in flight returns TIMEOUT and keeps memory registered until the IO drains") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = rt.open("memfs://drain?size=4096", {.writable = true});
  std::vector<std::byte> buffer(4096, std::byte{0x5a});
  auto mem = rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->close_gate();
  std::vector<IoRequest> batch{{Direction::WRITE, *mem, 0, *target, 0, 4096}};
  auto outcome = rt.submit(batch);
  REQUIRE(outcome.accepted == 1);

  Status first = rt.shutdown(1'000'000);
  CHECK(first.code() == StatusCode::TIMEOUT);
  CHECK(first.message().find("stays alive") != std::string::npos);
  CHECK(rt.unregister_memory(*mem).code() == StatusCode::BUSY);  // still registered
  // New work is refused while shutting down.
  auto refused = rt.submit(batch);
  CHECK(refused.accepted == 0);
  CHECK(refused.initial_states[0].code() == StatusCode::BUSY);
  CHECK(rt.open("memfs://late?size=1").code() == StatusCode::BUSY);

  faults->open_gate();
  CHECK(rt.shutdown(kSecond).is_ok());
  CHECK(rt.shutdown(kSecond).is_ok());
  CHECK(rt.close(*target).code() == StatusCode::NOT_FOUND);  // shutdown closed it
}

TEST_CASE("a runtime destroyed with IO in flight keeps its DataPath alive instead of freeing it") {
  auto faults = std::make_shared<Faults>();
  std::weak_ptr<Faults> observer = faults;
  // Static storage: the leaked DataPath's worker may still copy into it after this test returns,
  // exactly as a device would (which is why the runtime leaks instead of freeing).
  static std::vector<std::byte> buffer(4096);
  {
    StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}},
                                     RuntimeOptions{.destructor_drain_timeout_ns = 1'000'000});
    auto target = rt.open("memfs://leak?size=4096");
    auto mem = rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
    faults->close_gate();
    std::vector<IoRequest> batch{{Direction::READ, *mem, 0, *target, 0, 4096}};
    REQUIRE(rt.submit(batch).accepted == 1);
  }
  // The DataPath (which holds a reference to the faults) was not destroyed.
  faults.reset();
  CHECK_FALSE(observer.expired());
}

namespace {
// A second scheme over the faulty DataPath, so one runtime has two backends.
struct ScratchResolver {
  using target_type = memfs::Target;
  static constexpr std::string_view scheme = "scratch";
  memfs::MemfsResolver inner;
  Result<memfs::Target> resolve(std::string_view uri, const OpenOptions& o) {
    std::string rewritten = "memfs" + std::string(uri.substr(uri.find("://")));
    return inner.resolve(rewritten, o);
  }
};
using TwoBackends = StorageRuntime<MemfsBackend, Backend<ScratchResolver, FaultyDataPath>>;
}  // namespace

TEST_CASE("requests for several backends in one submit are bucketed per backend under one IO handle") {
  auto faults = std::make_shared<Faults>();
  TwoBackends rt(MemfsBackend{memfs::MemfsResolver{}, testing::require_ok(memfs::MemfsDataPath::create())},
                 Backend<ScratchResolver, FaultyDataPath>{ScratchResolver{}, FaultyDataPath{faults}});
  auto a = rt.open("memfs://a?size=4096", {.writable = true});
  auto b = rt.open("scratch://b?size=4096", {.writable = true});
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  CHECK(rt.open("nfs://x").code() == StatusCode::INVALID_ARGUMENT);
  auto data = pattern(4096, 5);
  std::vector<std::byte> back(8192);
  auto src = rt.register_memory({data.data(), data.size(), MemoryKind::HOST});
  auto dst = rt.register_memory({back.data(), back.size(), MemoryKind::HOST});
  std::vector<IoRequest> writes{{Direction::WRITE, *src, 0, *a, 0, 2048},
                                {Direction::WRITE, *src, 2048, *b, 0, 2048},
                                {Direction::WRITE, *src, 0, *a, 2048, 2048},
                                {Direction::FLUSH, {}, 0, *b, 0, 0}};
  auto w = rt.submit(writes);
  REQUIRE(w.accepted == 4);
  auto wr = rt.wait(w.io, kSecond);
  REQUIRE(wr.is_ok());
  CHECK(wr->requests == 4);
  CHECK(wr->confirmed_bytes == 6144);
  REQUIRE(wr->completions.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(wr->completions[i].request_index == i);

  std::vector<IoRequest> reads{{Direction::READ, *dst, 0, *a, 0, 4096}, {Direction::READ, *dst, 4096, *b, 0, 2048}};
  auto r = rt.submit(reads);
  REQUIRE(rt.wait(r.io, kSecond).is_ok());
  CHECK(std::memcmp(back.data(), data.data(), 2048) == 0);
  CHECK(std::memcmp(back.data() + 2048, data.data(), 2048) == 0);
  CHECK(std::memcmp(back.data() + 4096, data.data() + 2048, 2048) == 0);
}

TEST_CASE("open_batch returns one result per URI in input order and failures do not stop the others") {
  MemfsRuntime rt = testing::require_ok(make_memfs_runtime());
  std::vector<std::string> uris;
  for (int i = 0; i < 50; ++i) uris.push_back("memfs://batch" + std::to_string(i) + "?size=4096");
  uris[7] = "memfs://missing";        // NOT_FOUND: no size to create it
  uris[20] = "memfs://bad?size=abc";  // INVALID_ARGUMENT
  uris[33] = "ftp://x";               // unknown scheme
  auto results = rt.open_batch(uris);
  REQUIRE(results.size() == uris.size());
  for (std::size_t i = 0; i < uris.size(); ++i) {
    CAPTURE(i);
    if (i == 7)
      CHECK(results[i].code() == StatusCode::NOT_FOUND);
    else if (i == 20 || i == 33)
      CHECK(results[i].code() == StatusCode::INVALID_ARGUMENT);
    else
      CHECK(results[i].is_ok());
  }
  CHECK(*rt.target_size(*results[0]) == 4096);
}

TEST_CASE("a wait budget of UINT64_MAX means wait as long as it takes, not TIMEOUT at once") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://forever?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->close_gate();
  std::vector<IoRequest> batch{{Direction::READ, mem, 0, target, 0, 4096}};
  auto outcome = rt.submit(batch);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    faults->open_gate();
  });
  auto done = rt.wait(outcome.io, UINT64_MAX);
  opener.join();
  REQUIRE(done.is_ok());
  CHECK(done->status.is_ok());
}

TEST_CASE("query and release never block behind another thread's wait") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://nonblocking?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->close_gate();
  std::vector<IoRequest> batch{{Direction::READ, mem, 0, target, 0, 4096}};
  auto outcome = rt.submit(batch);
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    waiting = true;
    (void)rt.wait(outcome.io, 10 * kSecond);
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the waiter now holds the IO
  // Both answer at once (BUSY or a snapshot) instead of blocking for the waiter's 10 s.
  auto q = rt.query(outcome.io);
  CHECK((q.code() == StatusCode::BUSY || (q.is_ok() && !q->complete)));
  CHECK(rt.release(outcome.io).code() == StatusCode::BUSY);
  CHECK(rt.shutdown(1'000'000).code() == StatusCode::TIMEOUT);
  faults->open_gate();
  waiter.join();
  CHECK(rt.shutdown(kSecond).is_ok());
}

TEST_CASE("wait_some hands out each completion once, before wait, and judges it as wait does") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://some?size=65536", {.writable = true});
  auto source = pattern(65536, 5);
  std::vector<std::byte> sink(65536);
  auto src = *rt.register_memory({source.data(), source.size(), MemoryKind::HOST});
  auto dst = *rt.register_memory({sink.data(), sink.size(), MemoryKind::HOST});
  auto w = rt.submit(std::vector<IoRequest>{{Direction::WRITE, src, 0, target, 0, 65536}});
  REQUIRE(rt.wait(w.io, kSecond).is_ok());
  REQUIRE(rt.release(w.io).is_ok());

  // 8 reads of 4 KiB and one of 32 KiB, which fails: requests above 16 KiB fail with DATA_LOSS.
  faults->fail_after_bytes = 16384;
  std::vector<IoRequest> reads;
  for (std::uint64_t i = 0; i < 8; ++i) reads.push_back({Direction::READ, dst, i * 4096, target, i * 4096, 4096});
  reads.push_back({Direction::READ, dst, 32768, target, 32768, 32768});
  faults->close_gate();
  auto r = rt.submit(reads);
  REQUIRE(r.accepted == reads.size());

  // Nothing completes while the gate is closed: an empty answer within the budget, not an error.
  auto none = rt.wait_some(r.io, 2'000'000);
  REQUIRE(none.is_ok());
  CHECK(none->empty());

  faults->open_gate();
  std::vector<int> seen(reads.size(), 0);
  std::size_t handed_out = 0;
  const std::uint64_t deadline = monotonic_ns() + 5 * kSecond;
  while (handed_out < reads.size() && monotonic_ns() < deadline) {
    auto some = rt.wait_some(r.io, kSecond);
    REQUIRE(some.is_ok());
    for (const RequestCompletion& c : *some) {
      REQUIRE(c.request_index < reads.size());
      ++seen[c.request_index];
      ++handed_out;
      if (c.request_index < 8) {
        CHECK(c.status.is_ok());
        CHECK(c.confirmed_bytes == 4096);
        // The request's bytes are usable now, before wait().
        CHECK(std::memcmp(sink.data() + c.request_index * 4096, source.data() + c.request_index * 4096, 4096) == 0);
      } else {
        CHECK(c.status.code() == StatusCode::DATA_LOSS);
      }
    }
  }
  CHECK(handed_out == reads.size());
  for (int n : seen) CHECK(n == 1);
  // Everything was handed out: later calls return nothing, and wait() still has the whole result.
  auto rest = rt.wait_some(r.io, 1'000'000);
  REQUIRE(rest.is_ok());
  CHECK(rest->empty());
  auto result = rt.wait(r.io, kSecond);
  REQUIRE(result.is_ok());
  CHECK(result->completions.size() == reads.size());
  CHECK(result->failed_requests == std::vector<std::size_t>{8});
  CHECK(rt.release(r.io).is_ok());
  CHECK(rt.wait_some(r.io, 1'000'000).code() == StatusCode::NOT_FOUND);
}

TEST_CASE("wait_some hands out completions one at a time as they arrive, each once, before the IO completes") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  constexpr std::size_t kReads = 8;
  constexpr std::uint64_t kPiece = 4096;
  auto target = *rt.open("memfs://arrive?size=32768", {.writable = true});
  auto source = pattern(kReads * kPiece, 9);
  std::vector<std::byte> sink(kReads * kPiece);
  auto src = *rt.register_memory({source.data(), source.size(), MemoryKind::HOST});
  auto dst = *rt.register_memory({sink.data(), sink.size(), MemoryKind::HOST});
  auto w = rt.submit(std::vector<IoRequest>{{Direction::WRITE, src, 0, target, 0, kReads * kPiece}});
  REQUIRE(rt.wait(w.io, kSecond).is_ok());
  REQUIRE(rt.release(w.io).is_ok());

  // From now on the DataPath passes on one completed request per credit the test releases.
  faults->metered = true;
  std::vector<IoRequest> reads;
  for (std::uint64_t i = 0; i < kReads; ++i)
    reads.push_back({Direction::READ, dst, i * kPiece, target, i * kPiece, kPiece});
  auto r = rt.submit(reads);
  REQUIRE(r.accepted == kReads);
  auto none = rt.wait_some(r.io, 20'000'000);  // no credit: nothing to hand out, not an error
  REQUIRE(none.is_ok());
  CHECK(none->empty());

  std::vector<int> seen(kReads, 0);
  for (std::size_t n = 0; n < kReads; ++n) {
    const std::uint64_t calls_before = faults->progress_calls.load();
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      faults->release_completions(1);
    });
    auto some = rt.wait_some(r.io, 10 * kSecond);
    releaser.join();
    REQUIRE(some.is_ok());
    REQUIRE(some->size() == 1);  // exactly the one that arrived, handed out at once
    const RequestCompletion& c = some->front();
    REQUIRE(c.request_index < kReads);
    CHECK(++seen[c.request_index] == 1);
    CHECK(c.status.is_ok());
    CHECK(c.confirmed_bytes == kPiece);
    CHECK(std::memcmp(sink.data() + c.request_index * kPiece, source.data() + c.request_index * kPiece, kPiece) == 0);
    // It waited for the 20 ms inside one DataPath progress(SOME) call; slicing the wait in 100 us steps
    // took about 200 calls.
    CHECK(faults->progress_calls.load() - calls_before <= 2);
    auto progress = rt.query(r.io);
    REQUIRE(progress.is_ok());
    CHECK(progress->completed_requests == n + 1);
    CHECK(progress->complete == (n + 1 == kReads));  // handed out before the IO completed
  }
  for (int k : seen) CHECK(k == 1);
  auto result = rt.wait(r.io, kSecond);
  REQUIRE(result.is_ok());
  CHECK(result->status.is_ok());
  CHECK(result->confirmed_bytes == kReads * kPiece);
  REQUIRE(result->completions.size() == kReads);
  for (std::size_t i = 0; i < kReads; ++i) CHECK(result->completions[i].request_index == i);
  CHECK(rt.release(r.io).is_ok());
}

namespace {
using HeldFirst = StorageRuntime<Backend<ScratchResolver, FaultyDataPath>, MemfsBackend>;
}  // namespace

TEST_CASE("wait_some on an IO over two backends hands out the second backend's completion while the first is held") {
  auto faults = std::make_shared<Faults>();
  HeldFirst rt(Backend<ScratchResolver, FaultyDataPath>{ScratchResolver{}, FaultyDataPath{faults}},
               MemfsBackend{memfs::MemfsResolver{}, testing::require_ok(memfs::MemfsDataPath::create())});
  auto held = *rt.open("scratch://held?size=8192", {.writable = true});
  auto quick = *rt.open("memfs://quick?size=8192", {.writable = true});
  auto data = pattern(8192, 3);
  std::vector<std::byte> back(3 * 4096);
  auto src = *rt.register_memory({data.data(), data.size(), MemoryKind::HOST});
  auto dst = *rt.register_memory({back.data(), back.size(), MemoryKind::HOST});
  auto w = rt.submit(
      std::vector<IoRequest>{{Direction::WRITE, src, 0, held, 0, 8192}, {Direction::WRITE, src, 0, quick, 0, 8192}});
  REQUIRE(rt.wait(w.io, kSecond).is_ok());
  REQUIRE(rt.release(w.io).is_ok());

  faults->close_gate();  // the first backend (faulty) holds every completion
  std::vector<IoRequest> reads{{Direction::READ, dst, 0, held, 0, 4096},
                               {Direction::READ, dst, 4096, quick, 4096, 4096},
                               {Direction::READ, dst, 8192, held, 4096, 4096}};
  auto r = rt.submit(reads);
  REQUIRE(r.accepted == 3);
  auto some = rt.wait_some(r.io, 10 * kSecond);
  REQUIRE(some.is_ok());
  REQUIRE(some->size() == 1);
  CHECK(some->front().request_index == 1);
  CHECK(some->front().status.is_ok());
  CHECK(std::memcmp(back.data() + 4096, data.data() + 4096, 4096) == 0);
  auto progress = rt.query(r.io);
  REQUIRE(progress.is_ok());
  CHECK_FALSE(progress->complete);
  CHECK(progress->completed_requests == 1);
  auto nothing = rt.wait_some(r.io, 20'000'000);  // the held backend gives nothing; no repeat of request 1
  REQUIRE(nothing.is_ok());
  CHECK(nothing->empty());
  CHECK(rt.wait(r.io, 1'000'000).code() == StatusCode::TIMEOUT);

  faults->open_gate();
  std::vector<std::size_t> rest;
  const std::uint64_t deadline = monotonic_ns() + 5 * kSecond;
  while (rest.size() < 2 && monotonic_ns() < deadline) {
    auto more = rt.wait_some(r.io, kSecond);
    REQUIRE(more.is_ok());
    for (const RequestCompletion& c : *more) {
      CHECK(c.status.is_ok());
      rest.push_back(c.request_index);
    }
  }
  std::sort(rest.begin(), rest.end());
  CHECK(rest == std::vector<std::size_t>{0, 2});
  auto result = rt.wait(r.io, kSecond);
  REQUIRE(result.is_ok());
  CHECK(result->status.is_ok());
  CHECK(result->confirmed_bytes == 3 * 4096);
  REQUIRE(result->completions.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(result->completions[i].request_index == i);
  CHECK(std::memcmp(back.data(), data.data(), 4096) == 0);
  CHECK(std::memcmp(back.data() + 8192, data.data() + 4096, 4096) == 0);
  CHECK(rt.release(r.io).is_ok());
}
