// The uring DataPath on real files of the root file system (ext4 with O_DIRECT here): reads and
// writes byte for byte, tails, batches, backpressure, truncation, flush, concurrency. No root needed.
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <tutti/core/clock.hpp>

#include "uring_test_support.hpp"

using namespace tutti;
using namespace tutti::testing;

namespace {

struct Fixture {
  explicit Fixture(uring::Options options = {}) : runtime(require_ok(make_uring_runtime(options))) {}
  TargetHandle open(const std::string& path, OpenOptions options = {}) {
    auto t = runtime.open("file://" + path, options);
    REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
    return *t;
  }
  MemoryHandle memory(const AlignedBuffer& buffer) {
    auto m = runtime.register_memory(buffer.view());
    REQUIRE_MESSAGE(m.is_ok(), m.status().to_string());
    return *m;
  }
  TempDirectory dir;
  UringRuntime runtime = require_ok(make_uring_runtime());
};

IoRequest read_request(MemoryHandle m, std::uint64_t memory_offset, TargetHandle t, std::uint64_t offset,
                       std::uint64_t length) {
  return {Direction::READ, m, memory_offset, t, offset, length};
}

}  // namespace

TEST_CASE("an aligned read returns exactly the bytes the file system holds") {
  Fixture f;
  const auto path = f.dir.file("aligned");
  write_pattern_file(path, 1 << 20, 1);
  auto t = f.open(path);
  AlignedBuffer buffer(256 << 10);
  auto m = f.memory(buffer);
  auto c = run_all(f.runtime, {read_request(m, 0, t, 64 << 10, 256 << 10)});
  REQUIRE_MESSAGE(c[0].status.is_ok(), c[0].status.to_string());
  CHECK(c[0].confirmed_bytes == 256u << 10);
  CHECK(c[0].commands == 1);
  CHECK(matches_pattern(buffer.get(), 64 << 10, 256 << 10, 1));
  CHECK(std::memcmp(buffer.get(), read_plain(path, 64 << 10, 256 << 10).data(), 256 << 10) == 0);
  CHECK(f.runtime.datapath().stats().fixed_buffer_registrations == 1);
}

TEST_CASE("an unaligned tail read ending at end of file reports length bytes and moves the whole last unit") {
  Fixture f;
  const auto path = f.dir.file("tail");
  const std::uint64_t size = 3 * 4096 + 1234;
  write_pattern_file(path, size, 2);
  auto t = f.open(path);
  AlignedBuffer buffer(4 * 4096);
  std::memset(buffer.get(), 0xAB, buffer.bytes);
  auto m = f.memory(buffer);
  auto c = run_all(f.runtime, {read_request(m, 0, t, 4096, size - 4096)});
  REQUIRE_MESSAGE(c[0].status.is_ok(), c[0].status.to_string());
  CHECK(c[0].confirmed_bytes == size - 4096);
  CHECK(matches_pattern(buffer.get(), 4096, size - 4096, 2));

  SUBCASE("a tail that is not at the end of the file is refused by the runtime") {
    auto outcome = f.runtime.submit(std::vector<IoRequest>{read_request(m, 0, t, 0, 1000)});
    CHECK(outcome.initial_states[0].code() == StatusCode::INVALID_ARGUMENT);
  }
  SUBCASE("a tail whose rounded-up unit does not fit the memory is refused") {
    AlignedBuffer small(4096);
    auto sm = f.memory(small);
    auto outcome = f.runtime.submit(std::vector<IoRequest>{read_request(sm, 0, t, 3 * 4096, 1234)});
    CHECK(outcome.initial_states[0].is_ok());
    auto r = f.runtime.wait(outcome.io, 10 * kSecond);
    REQUIRE(r.is_ok());
    CHECK(r->status.is_ok());
    CHECK(matches_pattern(small.get(), 3 * 4096, 1234, 2));
    CHECK(f.runtime.release(outcome.io).is_ok());
    auto refused = f.runtime.submit(std::vector<IoRequest>{read_request(sm, 0, t, 4096, size - 4096)});
    CHECK(refused.initial_states[0].code() == StatusCode::OUT_OF_RANGE);
  }
}

TEST_CASE("aligned and tail writes land byte for byte and never grow the file") {
  Fixture f;
  const auto path = f.dir.file("write");
  const std::uint64_t size = 5 * 4096 + 777;
  write_pattern_file(path, size, 3);
  auto t = f.open(path, {.writable = true});
  AlignedBuffer buffer(6 * 4096);
  for (std::uint64_t i = 0; i < buffer.bytes; ++i) buffer.get()[i] = pattern_byte(i, 99);
  auto m = f.memory(buffer);
  std::vector<IoRequest> writes{
      {Direction::WRITE, m, 0, t, 0, 2 * 4096},                       // aligned
      {Direction::WRITE, m, 2 * 4096, t, 4 * 4096, size - 4 * 4096},  // tail: one unit + 777 bytes
      {Direction::FLUSH, {}, 0, t, 0, 0},
  };
  auto c = run_all(f.runtime, writes);
  for (const auto& one : c) REQUIRE_MESSAGE(one.status.is_ok(), one.status.to_string());
  CHECK(c[1].confirmed_bytes == size - 4 * 4096);
  CHECK(file_size(path) == size);
  const auto on_disk = read_plain(path, 0, size);
  CHECK(matches_pattern(on_disk.data(), 0, 2 * 4096, 99));
  CHECK(matches_pattern(on_disk.data() + 2 * 4096, 2 * 4096, 2 * 4096, 3));  // untouched
  CHECK(std::memcmp(on_disk.data() + 4 * 4096, buffer.get() + 2 * 4096, size - 4 * 4096) == 0);

  // Read back through O_DIRECT: the tail written through the page cache is seen by direct reads.
  AlignedBuffer back(2 * 4096);
  auto bm = f.memory(back);
  auto r = run_all(f.runtime, {read_request(bm, 0, t, 4 * 4096, size - 4 * 4096)});
  REQUIRE(r[0].status.is_ok());
  CHECK(std::memcmp(back.get(), buffer.get() + 2 * 4096, size - 4 * 4096) == 0);
}

TEST_CASE("batches of 1 to 4096 requests complete with every byte checked") {
  Fixture f(uring::Options{.queue_depth = 4096});
  const auto path = f.dir.file("batch");
  const std::uint64_t units = 4096;
  write_pattern_file(path, units * 4096, 4);
  auto t = f.open(path);
  AlignedBuffer buffer(units * 4096);
  auto m = f.memory(buffer);
  for (std::uint64_t n : {1u, 7u, 64u, 255u, 1000u, 4096u}) {
    CAPTURE(n);
    std::memset(buffer.get(), 0, buffer.bytes);
    std::vector<IoRequest> requests;
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t unit = (i * 2654435761u) % units;  // scattered offsets
      requests.push_back(read_request(m, i * 4096, t, unit * 4096, 4096));
    }
    auto outcome = f.runtime.submit(requests);
    REQUIRE(outcome.accepted == n);
    auto result = f.runtime.wait(outcome.io, 60 * kSecond);
    REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
    REQUIRE_MESSAGE(result->status.is_ok(), result->status.to_string());
    CHECK(result->confirmed_bytes == n * 4096);
    for (std::uint64_t i = 0; i < n; ++i)
      REQUIRE(matches_pattern(buffer.get() + i * 4096, ((i * 2654435761u) % units) * 4096, 4096, 4));
    CHECK(f.runtime.release(outcome.io).is_ok());
  }
}

TEST_CASE("a full queue rejects the excess with RESOURCE_EXHAUSTED without blocking, and resubmission completes") {
  Fixture f(uring::Options{.queue_depth = 8});
  const auto path = f.dir.file("pressure");
  write_pattern_file(path, 64 * 4096, 5);
  auto t = f.open(path);
  AlignedBuffer buffer(64 * 4096);
  auto m = f.memory(buffer);
  std::vector<IoRequest> requests;
  for (std::uint64_t i = 0; i < 64; ++i) requests.push_back(read_request(m, i * 4096, t, i * 4096, 4096));
  auto outcome = f.runtime.submit(requests);
  CHECK(outcome.accepted == 8);
  std::size_t rejected = 0;
  for (const auto& s : outcome.initial_states)
    if (s.code() == StatusCode::RESOURCE_EXHAUSTED) ++rejected;
  CHECK(rejected == 56);
  CHECK(f.runtime.datapath().stats().rejected_backpressure >= 56);
  REQUIRE(f.runtime.wait(outcome.io, 10 * kSecond).is_ok());
  REQUIRE(f.runtime.release(outcome.io).is_ok());
  auto c = run_all(f.runtime, requests);
  for (const auto& one : c) CHECK(one.status.is_ok());
  CHECK(matches_pattern(buffer.get(), 0, 64 * 4096, 5));
}

TEST_CASE("a large request is split into commands and arrives whole") {
  Fixture f;
  const auto path = f.dir.file("large");
  const std::uint64_t size = (16u << 20) + 4096 + 100;
  write_pattern_file(path, size, 6);
  auto t = f.open(path);
  AlignedBuffer buffer(size);
  auto m = f.memory(buffer);
  auto c = run_all(f.runtime, {read_request(m, 0, t, 0, size)});
  REQUIRE_MESSAGE(c[0].status.is_ok(), c[0].status.to_string());
  CHECK(c[0].commands == 17);  // 16 MiB + 4196 bytes in 1 MiB commands
  CHECK(matches_pattern(buffer.get(), 0, size, 6));
}

TEST_CASE("a file truncated under an open target fails reads OUT_OF_RANGE, never reporting stale bytes") {
  Fixture f;
  const auto path = f.dir.file("shrinking");
  write_pattern_file(path, 8 * 4096 + 500, 7);
  auto t = f.open(path);
  AlignedBuffer buffer(9 * 4096);
  auto m = f.memory(buffer);
  REQUIRE(::truncate(path.c_str(), 3 * 4096) == 0);
  auto c = run_all(f.runtime, {
                                  read_request(m, 0, t, 0, 2 * 4096),         // still inside: OK
                                  read_request(m, 0, t, 2 * 4096, 4 * 4096),  // ends early: short, then EOF
                                  read_request(m, 0, t, 5 * 4096, 4096),      // wholly past the new end
                                  read_request(m, 0, t, 8 * 4096, 500),       // the old tail
                              });
  CHECK(c[0].status.is_ok());
  CHECK(c[1].status.code() == StatusCode::OUT_OF_RANGE);
  CHECK(c[1].confirmed_bytes == 4096);
  CHECK(c[1].status.message().find(path) != std::string::npos);
  CHECK(c[2].status.code() == StatusCode::OUT_OF_RANGE);
  CHECK(c[2].confirmed_bytes == 0);
  CHECK(c[3].status.code() == StatusCode::OUT_OF_RANGE);
  CHECK(f.runtime.datapath().stats().short_transfer_resubmissions >= 1);

  SUBCASE("truncated to an unaligned size inside a read: OUT_OF_RANGE, not a short success") {
    REQUIRE(::truncate(path.c_str(), 4096 + 10) == 0);
    auto d = run_all(f.runtime, {read_request(m, 0, t, 0, 2 * 4096)});
    CHECK(d[0].status.code() == StatusCode::OUT_OF_RANGE);
    CHECK(d[0].confirmed_bytes == 4096 + 10);
  }
}

TEST_CASE("fixed buffers fall back to plain reads when the table is full or disabled, and say why") {
  Fixture f(uring::Options{.fixed_buffers = 1});
  const auto path = f.dir.file("fallback");
  write_pattern_file(path, 8 * 4096, 8);
  auto t = f.open(path);
  AlignedBuffer a(4 * 4096), b(4 * 4096);
  auto ma = f.memory(a);
  auto mb = f.memory(b);
  auto stats = f.runtime.datapath().stats();
  CHECK(stats.fixed_buffer_registrations == 1);
  CHECK(stats.fixed_buffer_fallbacks == 1);
  auto c = run_all(f.runtime, {read_request(ma, 0, t, 0, 4 * 4096), read_request(mb, 0, t, 4 * 4096, 4 * 4096)});
  CHECK(c[0].status.is_ok());
  CHECK(c[1].status.is_ok());
  CHECK(matches_pattern(a.get(), 0, 4 * 4096, 8));
  CHECK(matches_pattern(b.get(), 4 * 4096, 4 * 4096, 8));
  // Unregistering frees the slot for the next region.
  REQUIRE(f.runtime.unregister_memory(ma).is_ok());
  AlignedBuffer d(4096);
  auto md = f.memory(d);
  CHECK(f.runtime.datapath().stats().fixed_buffer_registrations == 2);
  CHECK(f.runtime.unregister_memory(md).is_ok());

  uring::UringDataPath disabled =
      require_ok(uring::UringDataPath::create(uring::Options{.registered_files = 0, .fixed_buffers = 0}));
  auto r = disabled.register_memory(a.view());
  REQUIRE(r.is_ok());
  CHECK(r->fixed_buffer_index == -1);
  CHECK(r->fixed_buffer_fallback.find("fixed_buffers = 0") != std::string::npos);
  CHECK(disabled.unregister_memory(*r).is_ok());
}

TEST_CASE("memory and targets in use are BUSY for unregister and close until the IO completes") {
  Fixture f;
  const auto path = f.dir.file("busy");
  write_pattern_file(path, 16 << 20, 9);
  auto t = f.open(path);
  AlignedBuffer buffer(16 << 20);
  auto m = f.memory(buffer);
  auto outcome = f.runtime.submit(std::vector<IoRequest>{read_request(m, 0, t, 0, 16 << 20)});
  REQUIRE(outcome.accepted == 1);
  const Status busy_memory = f.runtime.unregister_memory(m);
  const Status busy_target = f.runtime.close(t);
  auto result = f.runtime.wait(outcome.io, 30 * kSecond);
  REQUIRE(result.is_ok());
  CHECK(result->status.is_ok());
  if (!busy_memory.is_ok()) CHECK(busy_memory.code() == StatusCode::BUSY);
  if (!busy_target.is_ok()) CHECK(busy_target.code() == StatusCode::BUSY);
  REQUIRE(f.runtime.release(outcome.io).is_ok());
  if (!busy_memory.is_ok()) CHECK(f.runtime.unregister_memory(m).is_ok());
  if (!busy_target.is_ok()) CHECK(f.runtime.close(t).is_ok());
}

TEST_CASE("several threads submit and wait concurrently on one DataPath") {
  Fixture f(uring::Options{.queue_depth = 64});
  const auto path = f.dir.file("threads");
  write_pattern_file(path, 4 << 20, 10);
  auto t = f.open(path);
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      AlignedBuffer buffer(64 * 4096);
      auto m = f.runtime.register_memory(buffer.view());
      if (!m) {
        ++failures;
        return;
      }
      for (int round = 0; round < 20; ++round) {
        std::vector<IoRequest> requests;
        for (std::uint64_t i = 0; i < 16; ++i) {
          const std::uint64_t unit = (static_cast<std::uint64_t>(id) * 97 + round * 31 + i * 7) % 1024;
          requests.push_back(read_request(*m, i * 4096, t, unit * 4096, 4096));
        }
        auto outcome = f.runtime.submit(requests);
        if (outcome.accepted > 0) {
          auto r = f.runtime.wait(outcome.io, 30 * kSecond);
          if (!r || !r->status.is_ok()) ++failures;
          (void)f.runtime.release(outcome.io);
        }
        for (std::size_t i = 0; i < requests.size(); ++i) {
          if (!outcome.initial_states[i].is_ok()) {
            if (outcome.initial_states[i].code() != StatusCode::RESOURCE_EXHAUSTED) ++failures;
            continue;
          }
          if (!matches_pattern(buffer.get() + i * 4096, requests[i].target_offset, 4096, 10)) ++failures;
        }
      }
      if (!f.runtime.unregister_memory(*m).is_ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
}

TEST_CASE("SQPOLL runs the same IO") {
  Fixture f(uring::Options{.sqpoll = true});
  if (!f.runtime.datapath().status().is_ok()) {
    MESSAGE("SQPOLL refused here: ", f.runtime.datapath().status().to_string());
    return;
  }
  CHECK(f.runtime.datapath().stats().sqpoll_active);
  const auto path = f.dir.file("sqpoll");
  write_pattern_file(path, 64 * 4096, 11);
  auto t = f.open(path);
  AlignedBuffer buffer(64 * 4096);
  auto m = f.memory(buffer);
  std::vector<IoRequest> requests;
  for (std::uint64_t i = 0; i < 64; ++i) requests.push_back(read_request(m, i * 4096, t, (63 - i) * 4096, 4096));
  auto c = run_all(f.runtime, requests);
  for (std::uint64_t i = 0; i < 64; ++i) {
    CHECK(c[i].status.is_ok());
    CHECK(matches_pattern(buffer.get() + i * 4096, (63 - i) * 4096, 4096, 11));
  }
}

TEST_CASE("WRITE to a target opened read-only is refused before it runs") {
  Fixture f;
  const auto path = f.dir.file("readonly");
  write_pattern_file(path, 4096, 12);
  auto t = f.open(path);
  AlignedBuffer buffer(4096);
  auto m = f.memory(buffer);
  auto outcome = f.runtime.submit(std::vector<IoRequest>{{Direction::WRITE, m, 0, t, 0, 4096}});
  CHECK(outcome.initial_states[0].code() == StatusCode::INVALID_ARGUMENT);
  CHECK(read_plain(path, 0, 4096) == std::vector<std::byte>(read_plain(path, 0, 4096)));
  CHECK(matches_pattern(read_plain(path, 0, 4096).data(), 0, 4096, 12));
}

TEST_CASE("the DataPath itself refuses unregister and close while its commands are in flight") {
  TempDirectory dir;
  const auto path = dir.file("guard");
  write_pattern_file(path, 8 * 4096, 14);
  auto payload = file::FileResolver{}.resolve("file://" + path, {});
  REQUIRE(payload.is_ok());
  uring::UringDataPath d = require_ok(uring::UringDataPath::create());
  auto t = d.open(std::move(payload).value(), {});
  REQUIRE(t.is_ok());
  AlignedBuffer b(8 * 4096);
  auto m = d.register_memory(b.view());
  REQUIRE(m.is_ok());
  const PathRequest<uring::UringDataPath> r{Direction::READ, &*m, b.view(), 0, &*t, 0, 8 * 4096};
  std::vector<Status> states(1);
  auto batch = d.submit(std::span(&r, 1), states);
  REQUIRE(states[0].is_ok());
  // Nothing is reaped before progress(): the commands count as in flight until then.
  CHECK(d.unregister_memory(*m).code() == StatusCode::BUSY);
  CHECK(d.close(*t).code() == StatusCode::BUSY);
  std::vector<RequestCompletion> completions(1);
  REQUIRE(d.progress(batch, completions, 10 * kSecond).is_ok());
  CHECK(completions[0].done);
  CHECK(completions[0].status.is_ok());
  CHECK(completions[0].confirmed_bytes == 8 * 4096);
  CHECK(matches_pattern(b.get(), 0, 8 * 4096, 14));
  CHECK(d.unregister_memory(*m).is_ok());
  CHECK(d.close(*t).is_ok());
}

namespace {

/// A READ target over the read end of a pipe, built by hand (the file resolver opens regular files
/// only): a READ of it stays in flight, polled by io_uring, until the test writes into the pipe.
file::Target pipe_target(int read_end, std::uint64_t size) {
  file::Target t;
  t.fd = FileDescriptor(read_end);
  t.path = "pipe (read end)";
  t.filesystem = "pipefs";
  t.size = size;
  return t;
}

/// Writes 4096 pattern bytes of `seed` into the pipe (one write of at most PIPE_BUF bytes is atomic,
/// so a 4096-byte READ waiting on the pipe gets all of them at once).
void feed_pipe(int write_end, std::uint32_t seed) {
  std::vector<std::byte> bytes(4096);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern_byte(i, seed);
  REQUIRE(::write(write_end, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
}

}  // namespace

TEST_CASE(
    "progress(SOME) returns NOT_READY as soon as one request of a batch completed while another stays in flight; "
    "ALL on the same batch waits for its whole budget") {
  TempDirectory dir;
  const auto path = dir.file("some");
  write_pattern_file(path, 4096, 50);
  // Declared so that they go in reverse: were a check to end the test with the pipe's READ held, the
  // write end closes first (the READ ends at end of file, moving no byte), then the DataPath drains,
  // then the buffer is freed.
  AlignedBuffer b(2 * 4096);
  uring::UringDataPath d = require_ok(uring::UringDataPath::create());
  int ends[2] = {-1, -1};
  REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
  FileDescriptor write_end(ends[1]);
  auto held = d.open(pipe_target(ends[0], 1 << 20), {});
  REQUIRE_MESSAGE(held.is_ok(), held.status().to_string());
  auto payload = file::FileResolver{}.resolve("file://" + path, {});
  REQUIRE_MESSAGE(payload.is_ok(), payload.status().to_string());
  auto file = d.open(std::move(payload).value(), {});
  REQUIRE_MESSAGE(file.is_ok(), file.status().to_string());
  auto m = d.register_memory(b.view());
  REQUIRE(m.is_ok());
  // Request 0 (the pipe) is held; request 1 (the regular file) completes at once. The held one comes
  // first so that SOME cannot be satisfied by reporting the span in order.
  const std::vector<PathRequest<uring::UringDataPath>> requests{
      {Direction::READ, &*m, b.view(), 0, &*held, 0, 4096},
      {Direction::READ, &*m, b.view(), 4096, &*file, 0, 4096},
  };
  std::vector<Status> states(requests.size());
  auto batch = d.submit(requests, states);
  REQUIRE(states[0].is_ok());
  REQUIRE(states[1].is_ok());
  std::vector<RequestCompletion> completions(requests.size());

  // A watchdog feeds the pipe after 5 s unless SOME returned first. Were SOME to wait like ALL, the
  // pipe's READ would then complete inside this call and it would return OK with both entries done.
  std::mutex mutex;
  std::condition_variable cv;
  bool returned = false;
  bool fed = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, std::chrono::seconds(5), [&] { return returned; })) {
      feed_pipe(write_end.get(), 51);
      fed = true;
    }
  });
  const Status some = d.progress(batch, completions, 60 * kSecond, ProgressUntil::SOME);
  {
    std::lock_guard lock(mutex);
    returned = true;
  }
  cv.notify_one();
  watchdog.join();
  REQUIRE_FALSE_MESSAGE(fed, "progress(SOME) did not return within 5 s of the regular file's READ completing");
  REQUIRE_MESSAGE(some.code() == StatusCode::NOT_READY, some.to_string());
  REQUIRE(completions[1].done);
  CHECK_MESSAGE(completions[1].status.is_ok(), completions[1].status.to_string());
  CHECK(completions[1].confirmed_bytes == 4096);
  CHECK(matches_pattern(b.get() + 4096, 0, 4096, 50));
  CHECK_FALSE(completions[0].done);

  // ALL on the same batch: the pipe's READ is still held, so it waits out its whole budget, and the
  // file's entry stays as written.
  constexpr std::uint64_t kBudgetNs = 100'000'000;
  std::uint64_t start = monotonic_ns();
  const Status all = d.progress(batch, completions, kBudgetNs, ProgressUntil::ALL);
  CHECK(monotonic_ns() - start >= kBudgetNs);
  CHECK_MESSAGE(all.code() == StatusCode::NOT_READY, all.to_string());
  CHECK_FALSE(completions[0].done);
  CHECK(completions[1].done);
  CHECK(completions[1].confirmed_bytes == 4096);

  // SOME with nothing new: the file's completion was reported by an earlier call and does not count,
  // so this call waits out its budget too.
  start = monotonic_ns();
  const Status nothing_new = d.progress(batch, completions, kBudgetNs, ProgressUntil::SOME);
  CHECK(monotonic_ns() - start >= kBudgetNs);
  CHECK_MESSAGE(nothing_new.code() == StatusCode::NOT_READY, nothing_new.to_string());
  CHECK_FALSE(completions[0].done);

  // Releasing the pipe completes the batch: OK, with the bytes written into the pipe.
  feed_pipe(write_end.get(), 52);
  const Status done = d.progress(batch, completions, 10 * kSecond, ProgressUntil::SOME);
  REQUIRE_MESSAGE(done.is_ok(), done.to_string());
  REQUIRE(completions[0].done);
  CHECK_MESSAGE(completions[0].status.is_ok(), completions[0].status.to_string());
  CHECK(completions[0].confirmed_bytes == 4096);
  CHECK(matches_pattern(b.get(), 0, 4096, 52));
  CHECK(d.unregister_memory(*m).is_ok());
  CHECK(d.close(*held).is_ok());
  CHECK(d.close(*file).is_ok());
}

TEST_CASE("an unaligned tail WRITE on O_DIRECT without a tail descriptor is rejected at submit, naming the file") {
  TempDirectory dir;
  const auto path = dir.file("notail");
  write_pattern_file(path, 4096 + 10, 13);
  auto payload = file::FileResolver{}.resolve("file://" + path, {.writable = true});
  REQUIRE(payload.is_ok());
  if (!payload->direct) return;  // only O_DIRECT targets need the tail descriptor
  payload->tail_fd.reset();
  uring::UringDataPath d = require_ok(uring::UringDataPath::create());
  auto t = d.open(std::move(payload).value(), {.writable = true});
  REQUIRE(t.is_ok());
  AlignedBuffer b(8192);
  auto m = d.register_memory(b.view());
  REQUIRE(m.is_ok());
  const PathRequest<uring::UringDataPath> r{Direction::WRITE, &*m, b.view(), 0, &*t, 0, 4096 + 10};
  std::vector<Status> states(1);
  auto batch = d.submit(std::span(&r, 1), states);
  CHECK(states[0].code() == StatusCode::INVALID_ARGUMENT);
  CHECK(states[0].message().find(path) != std::string::npos);
  CHECK(file_size(path) == 4096 + 10);
  CHECK(d.unregister_memory(*m).is_ok());
  CHECK(d.close(*t).is_ok());
}

namespace {

/// Opens `path` writable with flush_on_close on `d` (DataPath API, so the test sees the target).
uring::UringDataPath::open_target open_for_flush(uring::UringDataPath& d, const std::string& path) {
  auto payload = file::FileResolver{}.resolve("file://" + path, {.writable = true, .flush_on_close = true});
  REQUIRE_MESSAGE(payload.is_ok(), payload.status().to_string());
  auto t = d.open(std::move(payload).value(), {.writable = true, .flush_on_close = true});
  REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
  return std::move(t).value();
}

/// Dirties `bytes` of the page cache of `path` through a second, buffered descriptor.
void dirty_page_cache(const std::string& path, std::uint64_t bytes, std::uint32_t seed) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::vector<std::byte> chunk(1 << 20);
  for (std::uint64_t done = 0; done < bytes; done += chunk.size()) {
    for (std::uint64_t i = 0; i < chunk.size(); ++i) chunk[i] = pattern_byte(done + i, seed);
    REQUIRE(::pwrite(fd, chunk.data(), chunk.size(), static_cast<off_t>(done)) == static_cast<ssize_t>(chunk.size()));
  }
  ::close(fd);
}

/// Calls close() every millisecond while it answers TIMEOUT, for at most 60 s; the last answer.
Status close_until_done(uring::UringDataPath& d, uring::UringDataPath::open_target& t) {
  Status out = d.close(t);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (out.code() == StatusCode::TIMEOUT && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    out = d.close(t);
  }
  return out;
}

}  // namespace

TEST_CASE("close with flush_on_close flushes through the ring within its budget and releases the target") {
  TempDirectory dir;
  const auto path = dir.file("flush");
  write_pattern_file(path, 4u << 20, 40);
  uring::UringDataPath d = require_ok(uring::UringDataPath::create());
  auto t = open_for_flush(d, path);
  dirty_page_cache(path, 4u << 20, 41);
  const auto commands_before = d.stats().commands;
  REQUIRE(d.close(t).is_ok());
  CHECK(d.stats().commands == commands_before + 1);  // the FLUSH went through the ring, not a blocking fdatasync
  CHECK_FALSE(t.file.fd.valid());
  CHECK(t.pending_close_flush == nullptr);
  const auto plain = read_plain(path, 0, 4u << 20);
  CHECK(matches_pattern(plain.data(), 0, 4u << 20, 41));
}

TEST_CASE(
    "close whose flush outlasts close_flush_timeout_ns returns TIMEOUT, keeps the target open, and a later close "
    "completes it") {
  TempDirectory dir;
  const auto path = dir.file("slowflush");
  const std::uint64_t size = 64u << 20;
  write_pattern_file(path, size, 42);
  // 0 ns: close() checks the flush once. IORING_OP_FSYNC always runs in an io-wq worker, so writing
  // back 64 MiB of dirty pages cannot have finished by then.
  uring::UringDataPath d = require_ok(uring::UringDataPath::create(uring::Options{.close_flush_timeout_ns = 0}));
  auto t = open_for_flush(d, path);
  dirty_page_cache(path, size, 43);
  const Status first = d.close(t);
  REQUIRE_MESSAGE(first.code() == StatusCode::TIMEOUT, first.to_string());
  CHECK(first.message().find(path) != std::string::npos);
  CHECK(first.message().find("close_flush_timeout_ns") != std::string::npos);
  CHECK(t.file.fd.valid());  // nothing released while the flush runs
  CHECK(t.pending_close_flush != nullptr);
  CHECK(d.stats().in_flight_commands == 1);
  const Status again = close_until_done(d, t);
  REQUIRE_MESSAGE(again.is_ok(), again.to_string());
  CHECK_FALSE(t.file.fd.valid());
  CHECK(d.stats().in_flight_commands == 0);
  const auto plain = read_plain(path, 0, size);
  CHECK(matches_pattern(plain.data(), 0, size, 43));
}

TEST_CASE("drain with a budget of UINT64_MAX waits for the commands in flight instead of ending at once") {
  // Regression: the drain deadline was now + drain_timeout_ns without saturation; UINT64_MAX (which
  // TUTTI_URING_DRAIN_TIMEOUT_NS accepts) wrapped into a deadline in the past, and the destructor
  // stopped draining at once.
  TempDirectory dir;
  const auto path = dir.file("drainforever");
  const std::uint64_t size = 64u << 20;
  write_pattern_file(path, size, 46);
  uring::UringDataPath d = require_ok(uring::UringDataPath::create(uring::Options{.close_flush_timeout_ns = 0}));
  auto t = open_for_flush(d, path);
  dirty_page_cache(path, size, 47);
  REQUIRE(d.close(t).code() == StatusCode::TIMEOUT);  // the FLUSH of 64 MiB of dirty pages is in flight
  REQUIRE(d.stats().in_flight_commands == 1);
  const Status drained = d.drain(UINT64_MAX);
  REQUIRE_MESSAGE(drained.is_ok(), drained.to_string());
  CHECK(d.stats().in_flight_commands == 0);
  REQUIRE(close_until_done(d, t).is_ok());
}

TEST_CASE("a WRITE submitted after a close returned TIMEOUT gets a FLUSH of its own before close reports OK") {
  TempDirectory dir;
  const auto path = dir.file("writeafter");
  const std::uint64_t size = 64u << 20;
  write_pattern_file(path, size, 46);
  uring::UringDataPath d = require_ok(uring::UringDataPath::create(uring::Options{.close_flush_timeout_ns = 0}));
  auto t = open_for_flush(d, path);
  dirty_page_cache(path, size, 47);
  const Status first = d.close(t);
  REQUIRE_MESSAGE(first.code() == StatusCode::TIMEOUT, first.to_string());
  // The target stays open: a WRITE lands on it while the first FLUSH may still run.
  AlignedBuffer b(4096);
  std::memset(b.get(), 0x6b, 4096);
  auto m = d.register_memory(b.view());
  REQUIRE(m.is_ok());
  const PathRequest<uring::UringDataPath> r{Direction::WRITE, &*m, b.view(), 0, &t, 0, 4096};
  std::vector<Status> states(1);
  auto batch = d.submit(std::span(&r, 1), states);
  REQUIRE(states[0].is_ok());
  std::vector<RequestCompletion> completions(1);
  REQUIRE(d.progress(batch, completions, 10 * kSecond).is_ok());
  REQUIRE(completions[0].status.is_ok());
  const auto commands_before = d.stats().commands;
  const Status again = close_until_done(d, t);
  REQUIRE_MESSAGE(again.is_ok(), again.to_string());
  // The FLUSH submitted before the WRITE does not cover it: close issued exactly one more.
  CHECK(d.stats().commands == commands_before + 1);
  CHECK_FALSE(t.file.fd.valid());
  CHECK(d.stats().in_flight_commands == 0);
  CHECK(d.unregister_memory(*m).is_ok());
  const auto plain = read_plain(path, 0, 4096);
  CHECK(std::all_of(plain.begin(), plain.end(), [](std::byte x) { return x == std::byte{0x6b}; }));
}

TEST_CASE("a target destroyed while its close flush is in flight leaves the flush to finish safely") {
  TempDirectory dir;
  const auto path = dir.file("dropped");
  write_pattern_file(path, 16u << 20, 44);
  uring::UringDataPath d = require_ok(uring::UringDataPath::create(uring::Options{.close_flush_timeout_ns = 0}));
  {
    auto t = open_for_flush(d, path);
    dirty_page_cache(path, 16u << 20, 45);
    const Status s = d.close(t);
    if (s.is_ok())
      MESSAGE("the flush finished within one check; nothing was left in flight");
    else
      REQUIRE(s.code() == StatusCode::TIMEOUT);
  }  // the target (and its in-flight gauge) is gone; the FLUSH references none of it
  // Another batch reaps the flush's completion (ASan would flag a write into the freed target).
  auto other = file::FileResolver{}.resolve("file://" + path, {});
  REQUIRE(other.is_ok());
  auto t2 = d.open(std::move(other).value(), {});
  REQUIRE(t2.is_ok());
  AlignedBuffer b(4096);
  auto m = d.register_memory(b.view());
  REQUIRE(m.is_ok());
  const PathRequest<uring::UringDataPath> r{Direction::READ, &*m, b.view(), 0, &*t2, 0, 4096};
  std::vector<Status> states(1);
  auto batch = d.submit(std::span(&r, 1), states);
  REQUIRE(states[0].is_ok());
  std::vector<RequestCompletion> completions(1);
  REQUIRE(d.progress(batch, completions, 10 * kSecond).is_ok());
  CHECK(completions[0].status.is_ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (d.stats().in_flight_commands > 0 && std::chrono::steady_clock::now() < deadline) {
    auto none = d.submit({}, {});  // an empty batch: its progress() only reaps others' completions
    std::vector<RequestCompletion> nothing;
    (void)d.progress(none, nothing, 1'000'000);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(d.stats().in_flight_commands == 0);
  CHECK(matches_pattern(b.get(), 0, 4096, 45));
  CHECK(d.unregister_memory(*m).is_ok());
  CHECK(d.close(*t2).is_ok());
}
