// Several threads submit and wait at once; every request completes exactly once and the data is right.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <faulty_datapath.hpp>
#include <tutti/tutti.hpp>

using namespace tutti;

TEST_CASE("concurrent submitters make progress and every request completes exactly once") {
  constexpr int kThreads = 4;
  constexpr int kRounds = 100;
  constexpr int kPerBatch = 8;
  constexpr std::uint64_t kBlock = 512;
  MemfsRuntime rt = testing::require_ok(make_memfs_runtime());
  auto target = rt.open("memfs://concurrent?size=" + std::to_string(kThreads * kPerBatch * kBlock), {.writable = true});
  REQUIRE(target.is_ok());
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> completed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> out(kPerBatch * kBlock), in(kPerBatch * kBlock);
      auto src = rt.register_memory({out.data(), out.size(), MemoryKind::HOST});
      auto dst = rt.register_memory({in.data(), in.size(), MemoryKind::HOST});
      if (!src || !dst) {
        ++failures;
        return;
      }
      for (int round = 0; round < kRounds; ++round) {
        std::memset(out.data(), (t * 31 + round) & 0xff, out.size());
        std::vector<IoRequest> writes, reads;
        for (int k = 0; k < kPerBatch; ++k) {
          const std::uint64_t off = (t * kPerBatch + k) * kBlock;  // each thread owns its own range
          writes.push_back({Direction::WRITE, *src, k * kBlock, *target, off, kBlock});
          reads.push_back({Direction::READ, *dst, k * kBlock, *target, off, kBlock});
        }
        for (auto* batch : {&writes, &reads}) {
          std::vector<IoRequest> pending = *batch;
          while (!pending.empty()) {  // windowed resubmission of rejected requests (partial commit)
            auto outcome = rt.submit(pending);
            std::vector<IoRequest> rejected;
            for (std::size_t i = 0; i < pending.size(); ++i)
              if (!outcome.initial_states[i].is_ok()) rejected.push_back(pending[i]);
            if (outcome.accepted > 0) {
              auto result = rt.wait(outcome.io, 10'000'000'000);
              if (!result || !result->status.is_ok()) ++failures;
              std::set<std::size_t> seen;
              for (auto& c : result->completions)
                if (!seen.insert(c.request_index).second) ++failures;  // exactly once
              completed += result->completions.size();
              (void)rt.release(outcome.io);
            }
            pending = std::move(rejected);
          }
        }
        if (std::memcmp(out.data(), in.data(), in.size()) != 0) ++failures;
      }
      if (!rt.unregister_memory(*src).is_ok() || !rt.unregister_memory(*dst).is_ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(completed.load() == std::uint64_t{kThreads} * kRounds * kPerBatch * 2);
}
