// The NVMe queue ring primitives (nvme/queue.hpp) driven by GPU warps through the warp submission
// protocol (nvme/warp_queue.hpp, via tests/support/raw_queue_driver.hpp) against the GPU-resident
// null controller (tests/support/null_controller.hpp), all in device memory.
// Suite gpu; exits 77 without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include <tutti/nvme/warp_queue.hpp>

#include "command_kernel.cuh"
#include "gpu_queues.hpp"

using tutti::StatusCode;
using tutti::gpu_test::GpuNullController;
using tutti::gpu_test::QueueSet;
using tutti::gpu_test::QueueSetConfig;
using tutti::gpu_test::RawCommandRecord;
using tutti::gpu_test::RawDriverArgs;

namespace {

struct RunShape {
  std::uint32_t blocks = 1;
  std::uint32_t warps_per_block = 1;
  std::uint32_t commands_per_warp = 32;
  std::uint64_t wait_budget_ns = 100'000'000;  // 100 ms
};

struct RunResult {
  std::vector<RawCommandRecord> records;
  std::vector<std::uint32_t> warp_queue;
  unsigned long long completed = 0;
  unsigned long long unfinished = 0;
  std::uint32_t controller_deadline_exits = 0;
};

/// Runs raw_command_kernel over `set` with a GPU null controller (one warp per queue) and returns
/// every record. The controller is stopped before the records are read.
RunResult run_commands(QueueSet& set, const RunShape& shape) {
  const std::uint32_t warps = shape.blocks * shape.warps_per_block;
  const std::size_t commands = static_cast<std::size_t>(warps) * shape.commands_per_warp;
  std::vector<RawCommandRecord> initial(commands);
  for (auto& r : initial) r.status = tutti::test::kNotRun;
  tutti::gpu_test::Buffer records(tutti::gpu_test::MemoryKind::device, sizeof(RawCommandRecord) * commands);
  records.upload(initial.data(), sizeof(RawCommandRecord) * commands);
  tutti::gpu_test::Buffer warp_queue(tutti::gpu_test::MemoryKind::device, sizeof(std::uint32_t) * warps);
  tutti::gpu_test::Buffer totals(tutti::gpu_test::MemoryKind::device, 2 * sizeof(unsigned long long));
  RunResult out;
  cudaFuncAttributes attributes{};  // loads raw_command_kernel before the persistent controller runs (see gpu_main.cpp)
  TUTTI_CUDA_CHECK(cudaFuncGetAttributes(&attributes, tutti::gpu_test::raw_command_kernel));
  {
    GpuNullController controller(set);
    RawDriverArgs args;
    args.queues = set.queues();
    args.queue_count = set.queue_count();
    args.commands_per_warp = shape.commands_per_warp;
    args.records = records.as<RawCommandRecord>();
    args.warp_queue = warp_queue.as<std::uint32_t>();
    args.completed = totals.as<unsigned long long>();
    args.unfinished = totals.as<unsigned long long>() + 1;
    args.budget_ns = 20'000'000'000ull;
    args.wait_budget_ns = shape.wait_budget_ns;
    tutti::gpu_test::raw_command_kernel<<<shape.blocks, shape.warps_per_block * 32>>>(args);
    TUTTI_CUDA_CHECK(cudaGetLastError());
    // The legacy default stream only: cudaDeviceSynchronize would also wait for the persistent
    // controller, which leaves only when stopped.
    TUTTI_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    out.controller_deadline_exits = controller.stop();
  }
  out.records.resize(commands);
  records.download(out.records.data(), sizeof(RawCommandRecord) * commands);
  out.warp_queue.resize(warps);
  warp_queue.download(out.warp_queue.data(), sizeof(std::uint32_t) * warps);
  unsigned long long t[2];
  totals.download(t, sizeof(t));
  out.completed = t[0];
  out.unfinished = t[1];
  return out;
}

/// Every command completed OK exactly once with its own CID and SLBA echo; the controller and the
/// queues agree on the counts; nothing stale or invalid was seen.
void check_all_completed_once(const QueueSet& set, const RunResult& run) {
  std::size_t bad_status = 0, bad_count = 0, bad_echo = 0;
  for (const RawCommandRecord& r : run.records) {
    bad_status += r.status != static_cast<std::uint32_t>(StatusCode::OK);
    bad_count += r.completions != 1;
    bad_echo += r.echo_ok != 1;
  }
  CHECK(bad_status == 0);
  CHECK(bad_count == 0);
  CHECK(bad_echo == 0);
  CHECK(run.completed == run.records.size());
  CHECK(run.unfinished == 0);
  CHECK(run.controller_deadline_exits == 0);
  const auto queues = set.queue_states();
  const auto controllers = set.controller_states();
  std::uint64_t posted = 0, reaped = 0;
  for (std::uint32_t q = 0; q < set.queue_count(); ++q) {
    CAPTURE(q);
    CHECK(queues[q].stale_completions == 0);
    CHECK(queues[q].invalid_completions == 0);
    CHECK(queues[q].abandoned_completions == 0);
    CHECK(queues[q].completions_reaped == controllers[q].cq_tail);
    CHECK(controllers[q].sq_head == controllers[q].cq_tail);
    CHECK(queues[q].sq_reserved == controllers[q].sq_head);
    posted += controllers[q].cq_tail;
    reaped += queues[q].completions_reaped;
  }
  CHECK(posted == run.records.size());
  CHECK(reaped == run.records.size());
}

}  // namespace

TEST_CASE("a warp submits 32 commands with one SQ tail doorbell write and reaps every completion") {
  QueueSet set(QueueSetConfig{1, 1024, 0, tutti::gpu_test::MemoryKind::device});
  const RunResult run = run_commands(set, RunShape{1, 1, 32});
  check_all_completed_once(set, run);
  const auto queues = set.queue_states();
  CHECK(queues[0].doorbell_writes == 1);  // one doorbell for the warp's run of 32 SQEs
  CHECK(queues[0].sq_doorbell_ticket == 32);
  const auto controllers = set.controller_states();
  CHECK(controllers[0].tail_updates >= 1);
  for (const RawCommandRecord& r : run.records) CHECK(r.refusals == 0);
}

TEST_CASE("SQ and CQ wrap around hundreds of times with the Phase Tag flipping each pass") {
  SUBCASE("depth 64, four warps on one queue") {
    QueueSet set(QueueSetConfig{1, 64, 64, tutti::gpu_test::MemoryKind::device});
    const RunResult run = run_commands(set, RunShape{1, 4, 2048});
    check_all_completed_once(set, run);
    CHECK(set.controller_states()[0].cq_tail / 64 >= 128);  // passes through the CQ
  }
  SUBCASE("depth 16, fewer slots and CIDs than lanes: runs split, refused lanes resubmit") {
    QueueSet set(QueueSetConfig{1, 16, 16, tutti::gpu_test::MemoryKind::device});
    const RunResult run = run_commands(set, RunShape{1, 1, 1024});
    check_all_completed_once(set, run);
    std::size_t refused = 0;
    for (const RawCommandRecord& r : run.records) refused += r.refusals != 0;
    CHECK(refused > 0);  // half a warp cannot get a CID at a time: backpressure, then success
  }
}

TEST_CASE("thousands of concurrent commands across all queues complete exactly once with the right CID") {
  int sms = 0;
  TUTTI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  QueueSet set(QueueSetConfig{64, 256, 256, tutti::gpu_test::MemoryKind::device});
  const RunShape shape{static_cast<std::uint32_t>(sms) * 2, 4, 128};
  const std::uint32_t in_flight = shape.blocks * shape.warps_per_block * 32;
  const std::uint32_t in_all = shape.blocks * shape.warps_per_block * shape.commands_per_warp;
  MESSAGE(in_flight, " commands in flight at once at most, ", in_all, " in all, over 64 queues");
  const RunResult run = run_commands(set, shape);
  check_all_completed_once(set, run);
  std::set<std::uint32_t> used;
  for (std::uint32_t q : run.warp_queue) used.insert(q);
  CHECK(used.size() == 64);  // every queue carried commands
}

TEST_CASE("blocks get disjoint queues while there are at least as many queues as blocks") {
  QueueSet set(QueueSetConfig{64, 256, 256, tutti::gpu_test::MemoryKind::device});
  const RunShape shape{32, 4, 64};
  const RunResult run = run_commands(set, shape);
  check_all_completed_once(set, run);
  std::vector<std::set<std::uint32_t>> blocks_of_queue(64);
  for (std::uint32_t w = 0; w < run.warp_queue.size(); ++w)
    blocks_of_queue.at(run.warp_queue[w]).insert(w / shape.warps_per_block);
  for (std::uint32_t q = 0; q < 64; ++q) {
    CAPTURE(q);
    CHECK(blocks_of_queue[q].size() == 1);  // one block per queue, and every queue used
  }
  // The mapping itself, for other shapes: disjoint ranges, all queues covered.
  for (std::uint32_t grid : {1u, 3u, 7u, 64u, 100u}) {
    for (std::uint32_t queues : {1u, 8u, 64u, 128u}) {
      std::vector<std::set<std::uint32_t>> owners(queues);
      for (std::uint32_t b = 0; b < grid; ++b)
        for (std::uint32_t w = 0; w < 64; ++w) owners[tutti::test::select_queue(b, grid, w, queues)].insert(b);
      std::size_t max_blocks = 0, idle = 0;
      for (const auto& o : owners) {
        max_blocks = std::max(max_blocks, o.size());
        idle += o.empty();
      }
      CAPTURE(grid);
      CAPTURE(queues);
      CHECK(idle == (grid * 64 >= queues ? 0u : queues - grid * 64));
      CHECK(max_blocks == (grid + queues - 1) / queues);
    }
  }
}

TEST_CASE("a lost completion becomes TIMEOUT after the %globaltimer budget and the rest complete") {
  QueueSet set(QueueSetConfig{1, 1024, 0, tutti::gpu_test::MemoryKind::device});
  set.drop_completion(0, 5);                          // the 6th SQE the controller consumes gets no CQE
  constexpr std::uint64_t kWaitBudgetNs = 2'000'000;  // 2 ms
  const RunResult run = run_commands(set, RunShape{1, 1, 64, kWaitBudgetNs});
  std::size_t timeouts = 0, ok = 0;
  for (const RawCommandRecord& r : run.records) {
    if (r.status == static_cast<std::uint32_t>(StatusCode::TIMEOUT)) {
      ++timeouts;
      CHECK(r.completions == 0);
      CHECK(r.wait_ns >= kWaitBudgetNs);
      CHECK(r.wait_ns < kWaitBudgetNs + 1'000'000);  // the deadline, plus at most a 2 us sleep and a tick
      MESSAGE("TIMEOUT after ", r.wait_ns, " ns (budget ", kWaitBudgetNs, " ns), CID ", r.cid);
    } else if (r.status == static_cast<std::uint32_t>(StatusCode::OK) && r.completions == 1 && r.echo_ok == 1) {
      ++ok;
    }
  }
  CHECK(timeouts == 1);
  CHECK(ok == 63);
  const auto controllers = set.controller_states();
  CHECK(controllers[0].dropped == 1);
  CHECK(controllers[0].sq_head == 64);
  CHECK(controllers[0].cq_tail == 63);
  CHECK(set.queue_states()[0].stale_completions == 0);
}
