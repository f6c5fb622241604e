// Error paths of the runtime, driven by the fault-injecting DataPath.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include <faulty_datapath.hpp>
#include <tutti/tutti.hpp>

using namespace tutti;
using tutti::testing::Faults;
using tutti::testing::FaultyBackend;
using tutti::testing::FaultyDataPath;

namespace {
constexpr std::uint64_t kSecond = 1'000'000'000;
}

TEST_CASE("a short transfer is reported per request with confirmed bytes, indices and the device status") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://short?size=65536");
  std::vector<std::byte> buffer(65536);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->fail_after_bytes = 4096;
  faults->device_status = 0x0281;  // SCT 2 (media error), SC 0x81 (unrecovered read error)
  std::vector<IoRequest> batch{{Direction::READ, mem, 0, target, 0, 4096},
                               {Direction::READ, mem, 4096, target, 4096, 8192},
                               {Direction::READ, mem, 12288, target, 12288, 2048},
                               {Direction::READ, mem, 16384, target, 16384, 16384}};
  auto outcome = rt.submit(batch);
  REQUIRE(outcome.accepted == 4);
  auto result = rt.wait(outcome.io, kSecond);
  REQUIRE(result.is_ok());
  CHECK(result->status.code() == StatusCode::DATA_LOSS);
  CHECK(result->status.message().find("requests[1]") != std::string::npos);
  CHECK(result->failure_kind == StatusCode::DATA_LOSS);
  REQUIRE(result->first_failed_request.has_value());
  CHECK(*result->first_failed_request == 1);
  CHECK(result->failed_requests == std::vector<std::size_t>{1, 3});
  CHECK(result->device_status == 0x0281);
  CHECK(result->requested_bytes == 4096 + 8192 + 2048 + 16384);
  CHECK(result->confirmed_bytes == 4096 + 4096 + 2048 + 4096);
}

TEST_CASE("a failing progress keeps the IO in flight and its memory pinned until it recovers") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://progress?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->fail_progress = true;
  std::vector<IoRequest> batch{{Direction::READ, mem, 0, target, 0, 4096}};
  auto outcome = rt.submit(batch);
  REQUIRE(outcome.accepted == 1);
  auto failed = rt.wait(outcome.io, kSecond);
  CHECK(failed.code() == StatusCode::DEVICE_ERROR);
  CHECK(failed.status().message().find("faulty") != std::string::npos);
  CHECK(rt.query(outcome.io).code() == StatusCode::DEVICE_ERROR);
  CHECK(rt.unregister_memory(mem).code() == StatusCode::BUSY);
  CHECK(rt.shutdown(1'000'000).code() == StatusCode::TIMEOUT);
  faults->fail_progress = false;
  auto done = rt.wait(outcome.io, kSecond);
  REQUIRE(done.is_ok());
  CHECK(done->status.is_ok());
  CHECK(rt.shutdown(kSecond).is_ok());
}

TEST_CASE("a delayed completion honours the wait budget and completes once released") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://delay?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->close_gate();
  std::vector<IoRequest> batch{{Direction::READ, mem, 0, target, 0, 4096}};
  auto outcome = rt.submit(batch);
  for (int i = 0; i < 3; ++i) CHECK(rt.wait(outcome.io, 1'000'000).code() == StatusCode::TIMEOUT);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    faults->open_gate();
  });
  auto done = rt.wait(outcome.io, 10 * kSecond);
  opener.join();
  REQUIRE(done.is_ok());
  CHECK(done->confirmed_bytes == 4096);
}

TEST_CASE("unregister_memory keeps the handle valid while the DataPath says the device still uses the memory") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://held?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->unregister_busy = true;
  CHECK(rt.unregister_memory(mem).code() == StatusCode::BUSY);
  CHECK(rt.unregister_memory(mem).code() == StatusCode::BUSY);  // still the same live handle
  CHECK(rt.shutdown(1'000'000).code() == StatusCode::BUSY);     // shutdown keeps it registered too
  faults->unregister_busy = false;
  CHECK(rt.shutdown(kSecond).is_ok());
  CHECK(rt.unregister_memory(mem).code() == StatusCode::NOT_FOUND);
  (void)target;
}

TEST_CASE("after a BUSY unregister the region stays registered and usable") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://held2?size=4096");
  std::vector<std::byte> buffer(4096);
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  faults->unregister_busy = true;
  REQUIRE(rt.unregister_memory(mem).code() == StatusCode::BUSY);
  // After a BUSY unregister the handle is live again and usable.
  std::vector<IoRequest> batch{{Direction::READ, mem, 0, target, 0, 4096}};
  auto outcome = rt.submit(batch);
  CHECK(outcome.accepted == 1);
  REQUIRE(rt.wait(outcome.io, kSecond).is_ok());
  faults->unregister_busy = false;
  CHECK(rt.unregister_memory(mem).is_ok());
}

TEST_CASE("a close whose flush times out keeps the target open and usable, and can be retried") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  auto target = *rt.open("memfs://closing?size=8192", OpenOptions{.writable = true, .flush_on_close = true});
  std::vector<std::byte> buffer(8192, std::byte{0x5a});
  auto mem = *rt.register_memory({buffer.data(), buffer.size(), MemoryKind::HOST});
  std::vector<IoRequest> write{{Direction::WRITE, mem, 0, target, 0, 8192}};
  auto written = rt.submit(write);
  REQUIRE(written.accepted == 1);
  REQUIRE(rt.wait(written.io, kSecond).is_ok());

  faults->close_timeouts = 1;
  const Status first = rt.close(target);
  CHECK(first.code() == StatusCode::TIMEOUT);
  CHECK(first.message().find("closing") != std::string::npos);  // names the target's URI
  // The handle is still valid and the data still readable: nothing was dropped.
  REQUIRE(rt.target_size(target).is_ok());
  std::vector<std::byte> back(8192);
  auto back_mem = *rt.register_memory({back.data(), back.size(), MemoryKind::HOST});
  std::vector<IoRequest> read{{Direction::READ, back_mem, 0, target, 0, 8192}};
  auto reading = rt.submit(read);
  REQUIRE(reading.accepted == 1);
  REQUIRE(rt.wait(reading.io, kSecond).is_ok());
  CHECK(back == buffer);

  CHECK(rt.close(target).is_ok());  // the retry succeeds and releases the handle
  CHECK(rt.target_size(target).code() == StatusCode::NOT_FOUND);
  CHECK(rt.close(target).code() == StatusCode::NOT_FOUND);
  CHECK(rt.shutdown(kSecond).is_ok());
}

TEST_CASE("a shutdown whose close of a target times out keeps that target and closes it on the next shutdown") {
  auto faults = std::make_shared<Faults>();
  StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
  REQUIRE(rt.open("memfs://retained?size=4096", OpenOptions{.writable = true, .flush_on_close = true}).is_ok());
  faults->close_timeouts = 2;
  const Status first = rt.shutdown(kSecond);
  CHECK(first.code() == StatusCode::TIMEOUT);
  CHECK(first.message().find("retained") != std::string::npos);  // the DataPath's error names the target
  CHECK(faults->closes.load() == 0);
  // The flush is still unconfirmed: a second shutdown must not report OK for it.
  CHECK(rt.shutdown(kSecond).code() == StatusCode::TIMEOUT);
  CHECK(faults->closes.load() == 0);
  CHECK(rt.shutdown(kSecond).is_ok());
  CHECK(faults->closes.load() == 1);
  CHECK(rt.shutdown(kSecond).is_ok());
  CHECK(faults->closes.load() == 1);
}

TEST_CASE("close racing shutdown releases the target exactly once and never after it was freed") {
  // close() does not check shutting_down, so it may start after shutdown's wait for closes in progress;
  // shutdown must not erase (and free) an entry that close() still holds. ASan reports a use after
  // free, and `closes` counts a double close, if it does.
  for (int round = 0; round < 300; ++round) {
    auto faults = std::make_shared<Faults>();
    StorageRuntime<FaultyBackend> rt(FaultyBackend{memfs::MemfsResolver{}, FaultyDataPath{faults}});
    auto target = rt.open(fmt::format("memfs://race-{}?size=4096", round));
    REQUIRE(target.is_ok());
    Status closed;
    std::thread closer([&] { closed = rt.close(*target); });
    Status down = rt.shutdown(kSecond);
    closer.join();
    CHECK((closed.is_ok() || closed.code() == StatusCode::NOT_FOUND));
    if (!down.is_ok()) {
      CHECK(down.code() == StatusCode::TIMEOUT);
      down = rt.shutdown(kSecond);
    }
    CHECK(down.is_ok());
    CHECK(faults->closes.load() == 1);
  }
}
