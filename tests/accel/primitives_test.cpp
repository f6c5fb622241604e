// accel primitives in the host profile: atomics, fences, MMIO stores, timer, backoff, launch.
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include <tutti/accel/primitives.hpp>

using namespace tutti;
using namespace tutti::accel;

TEST_CASE("the host profile is selected by meson") { CHECK(kProfile == Profile::host); }

TEST_CASE("AtomicRef performs the read-modify-write operations") {
  alignas(8) std::uint64_t value = 5;
  SystemAtomicRef<std::uint64_t> ref(value);
  CHECK(ref.fetch_add(3, MemoryOrder::relaxed) == 5);
  CHECK(ref.fetch_sub(1, MemoryOrder::acq_rel) == 8);
  CHECK(ref.fetch_or(0x10, MemoryOrder::seq_cst) == 7);
  CHECK(ref.fetch_and(0x13, MemoryOrder::release) == 0x17);
  std::uint64_t expected = 0x13;
  CHECK(ref.compare_exchange_strong(expected, 42, MemoryOrder::acq_rel));
  expected = 1;
  CHECK_FALSE(ref.compare_exchange_strong(expected, 43, MemoryOrder::acq_rel));
  CHECK(expected == 42);
  CHECK(ref.exchange(9, MemoryOrder::seq_cst) == 42);
  ref.store(11, MemoryOrder::release);
  CHECK(ref.load(MemoryOrder::acquire) == 11);
  fence_system();
  fence(ThreadScope::block, MemoryOrder::acq_rel);
  fence(ThreadScope::thread, MemoryOrder::seq_cst);
}

TEST_CASE("mmio_store32 and mmio_load32 move 32-bit values") {
  alignas(4) std::uint32_t reg = 0;
  mmio_store32(&reg, 0xdeadbeef);
  CHECK(mmio_load32(&reg) == 0xdeadbeef);
}

TEST_CASE("the timer is monotonic in nanoseconds and deadlines saturate") {
  const std::uint64_t a = timer_ns();
  shim::sleep_ns(2'000'000);
  const std::uint64_t b = timer_ns();
  CHECK(b - a >= 2'000'000);
  CHECK(deadline_after(~0ull) == ~0ull);
  CHECK(deadline_after(1000) >= b + 1000);
}

TEST_CASE("backoff spins, then yields, then sleeps with a cap") {
  Backoff::Settings settings;
  settings.spin_steps = 2;
  settings.yield_steps = 2;
  settings.first_sleep_ns = 1000;
  settings.max_sleep_ns = 4000;
  Backoff backoff(settings);
  for (int i = 0; i < 4; ++i) {
    CHECK_FALSE(backoff.sleeping());
    backoff.pause();
  }
  CHECK(backoff.sleeping());
  const std::uint64_t start = timer_ns();
  for (int i = 0; i < 10; ++i) backoff.pause();
  CHECK(timer_ns() - start >= 10 * 1000);
  backoff.reset();
  CHECK_FALSE(backoff.sleeping());
}

TEST_CASE("launch runs every logical thread exactly once") {
  constexpr std::uint32_t kBlocks = 37, kThreads = 13;
  std::vector<std::atomic<int>> hits(kBlocks * kThreads);
  const Status status = launch(LaunchConfig{kBlocks, kThreads, nullptr}, [&](const ThreadIndex& index) {
    CHECK(index.grid_dim == kBlocks);
    CHECK(index.block_dim == kThreads);
    hits[index.global()].fetch_add(1);
  });
  REQUIRE(status.is_ok());
  for (auto& h : hits) CHECK(h.load() == 1);
}

TEST_CASE("launch reports an empty grid and a throwing kernel") {
  CHECK(launch(LaunchConfig{0, 1, nullptr}, [](const ThreadIndex&) {}).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(launch(LaunchConfig{1, 0, nullptr}, [](const ThreadIndex&) {}).code() == StatusCode::INVALID_ARGUMENT);
  const Status thrown = launch(LaunchConfig{4, 2, nullptr}, [](const ThreadIndex& i) {
    if (i.block == 2) throw std::runtime_error("kernel failure");
  });
  CHECK(thrown.code() == StatusCode::INTERNAL);
  CHECK(thrown.message().find("kernel failure") != std::string::npos);
}

TEST_CASE("launch may be called from several threads at once") {
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 20; ++i)
        REQUIRE(launch(LaunchConfig{8, 4, nullptr}, [&](const ThreadIndex&) { total.fetch_add(1); }).is_ok());
    });
  for (auto& c : callers) c.join();
  CHECK(total.load() == 4 * 20 * 8 * 4);
}
