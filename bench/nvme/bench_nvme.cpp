// NVMe queue path and builders.
//  - BM_QueuePathNull: host cost per command on the queue path against the soft controller in
//    null mode (build SQE + submit + reap): queue depth (commands in flight per submitter thread)
//    1, 32, 256; 1 and 2 submitter threads sharing one queue pair. Reports commands/s and
//    ns/command (wall clock, the controller thread included: on a 2-core machine it competes).
//  - BM_BuildPrp / BM_BuildSgl: building the data pointer of 4 KiB .. 2 MiB transfers.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/prp.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/sgl.hpp>

using namespace tutti;

namespace {

constexpr std::uint32_t kQueueDepth = 1024;

struct NullController {
  NullController() {
    libnvm::SoftControllerConfig config;
    config.null_mode = true;
    config.namespace_size_lbas = 1 << 20;
    config.max_queue_entries = kQueueDepth;
    config.idle_sleep_max_ns = 50'000;
    device = *libnvm::SoftController::create(config);
    controller = libnvm::open_soft_controller(device).value();
    if (!controller->bring_up(libnvm::BringUpOptions{}).is_ok()) std::abort();
    page = static_cast<std::uint8_t*>(std::aligned_alloc(4096, 4096));
    mapping = *controller->dma_map(page, 4096);
  }
  std::shared_ptr<libnvm::SoftController> device;
  std::unique_ptr<libnvm::Controller> controller;
  std::uint8_t* page = nullptr;
  libnvm::DmaMapping mapping;
  libnvm::QueuePairInfo info;
  std::unique_ptr<nvme::QueuePairStorage> storage;
};

NullController& null_controller() {
  static NullController instance;
  return instance;
}

void create_queue(const benchmark::State&) {
  NullController& c = null_controller();
  c.info = *c.controller->create_io_queue_pair(kQueueDepth);
  c.storage = std::make_unique<nvme::QueuePairStorage>(
      c.info.submission_queue, c.info.completion_queue, c.info.submission_queue_tail_doorbell,
      c.info.completion_queue_head_doorbell, c.info.controller_status, c.info.depth, c.info.qid, kQueueDepth);
}

void delete_queue(const benchmark::State&) {
  NullController& c = null_controller();
  c.storage.reset();
  (void)c.controller->delete_io_queue_pair(c.info.qid);
}

void BM_QueuePathNull(benchmark::State& state) {
  NullController& c = null_controller();
  const nvme::QueuePair& q = c.storage->queue();
  const auto depth = static_cast<std::size_t>(state.range(0));
  std::vector<std::uint16_t> in_flight(depth);
  std::size_t next = 0;
  std::uint64_t lba = static_cast<std::uint64_t>(state.thread_index()) << 16;
  auto submit_one = [&](std::uint16_t& cid) {
    while (!q.allocate_command_identifier(cid)) q.reap_completions();
    nvme::SubmissionQueueEntry sqe{};  // a 4 KiB Read (null mode: validated, no data moved)
    sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::read);
    sqe.command_identifier = cid;
    sqe.nsid = 1;
    sqe.cdw10 = static_cast<std::uint32_t>(lba++ & 0xfffff);
    sqe.data_pointer.prp.prp1 = c.mapping.bus_addresses[0];
    while (q.submit(sqe) != StatusCode::OK) q.reap_completions();
  };
  for (auto& cid : in_flight) submit_one(cid);
  for (auto _ : state) {
    // Reap the oldest command and replace it: `depth` commands stay in flight.
    const nvme::WaitResult done = q.wait_for_completion(in_flight[next], 10'000'000'000ull);
    if (done.status != StatusCode::OK || !done.completion.status().success()) {
      state.SkipWithError("command failed");
      break;
    }
    submit_one(in_flight[next]);
    next = (next + 1) % depth;
  }
  for (auto cid : in_flight) (void)q.wait_for_completion(cid, 10'000'000'000ull);
  state.SetItemsProcessed(state.iterations());
  state.counters["commands_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  // Seconds per command over all threads (Google Benchmark sums thread iterations and averages
  // thread wall time), printed with an SI prefix: "1.1us" = 1100 ns/command.
  state.counters["time_per_command"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                          benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_QueuePathNull)
    ->ArgName("qd")
    ->Arg(1)
    ->Arg(32)
    ->Arg(256)
    ->Threads(1)
    ->Threads(2)
    ->Setup(create_queue)
    ->Teardown(delete_queue)
    ->UseRealTime()
    ->MinTime(1.0);

struct Table {
  explicit Table(bool contiguous) : bus(1024), list(static_cast<std::uint8_t*>(std::aligned_alloc(4096, 64 * 1024))) {
    for (std::size_t i = 0; i < bus.size(); ++i)
      bus[i] = 0x10'0000'0000ull + (contiguous ? i : (bus.size() - i) * 3) * 4096;
  }
  ~Table() { std::free(list); }
  nvme::PageTableView view() const { return nvme::PageTableView{bus.data(), bus.size(), 4096}; }
  nvme::DescriptorArea area() const { return nvme::DescriptorArea{list, 0x20'0000'0000ull, 64 * 1024}; }
  std::vector<std::uint64_t> bus;
  std::uint8_t* list;
};

void BM_BuildPrp(benchmark::State& state) {
  const Table table(true);
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  for (auto _ : state) {
    const nvme::PrpBuild built = nvme::build_prp(table.view(), 0, bytes, table.area());
    benchmark::DoNotOptimize(built);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BuildPrp)->ArgName("bytes")->Arg(4096)->Arg(64 << 10)->Arg(512 << 10)->Arg(2 << 20);

void BM_BuildSgl(benchmark::State& state) {
  const Table table(state.range(1) == 1);
  const auto bytes = static_cast<std::uint64_t>(state.range(0));
  for (auto _ : state) {
    const nvme::SglBuild built = nvme::build_sgl(table.view(), 0, bytes, table.area());
    benchmark::DoNotOptimize(built);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BuildSgl)->ArgNames({"bytes", "contiguous"})->ArgsProduct({{4096, 64 << 10, 512 << 10, 2 << 20}, {1, 0}});

}  // namespace

BENCHMARK_MAIN();
