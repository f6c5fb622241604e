// local_nvme Path against a soft controller backed by a plain file, with hand-built extents
// (no root needed): splitting at extents and MDTS, prebuilt PRP lists (both variants, scattered
// bus pages), writes, flush, injected NVMe errors, lost completions (TIMEOUT + Abort), zombie
// commands keeping memory mapped, backpressure, concurrent submitters, null mode, defaults, the
// target handle cache (hits, misses, LRU eviction, pinning, fallbacks to L2, close, the L2 bound),
// and the pool of the targets' change words.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include <doctest/doctest.h>

#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/nvme/status.hpp>
#include <tutti/path/local_nvme.hpp>

#include "host_buffer.hpp"
#include "path_rig.hpp"
#include "soft_drive.hpp"
#include "test_files.hpp"

using namespace tutti;
using Path = local_nvme::LocalNvmeDataPath;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;

using tutti::testing::Buffer;

/// A soft controller on a pattern-filled backing file, its driver and a Path.
/// The PathRig base comes second: its Path is destroyed before the SoftDrive's controller.
struct Rig : tutti::testing::SoftDrive, tutti::testing::PathRig<Path> {
  explicit Rig(Path::Options options = {}, libnvm::SoftControllerConfig config = {},
               std::uint64_t backing_bytes = 64 << 20)
      : SoftDrive(config, backing_bytes, 77, "/tmp/tutti-lnvme-"), PathRig(20 * kSecond) {
    auto p = Path::create(*controller, options);
    REQUIRE_MESSAGE(p.is_ok(), p.status().to_string());
    path.emplace(std::move(p.value()));
  }

  Path::open_target open(std::vector<local_file::Extent> extents, std::uint64_t size) {
    local_file::Target t;
    t.path = "synthetic";
    t.extents = std::move(extents);
    t.file_size = size;
    t.lba_size = controller->identity().lba_size;
    return open_or_fail(std::move(t));
  }
  /// Bytes of the backing file (the namespace) at byte offset `at`.
  std::vector<std::uint8_t> device_bytes(std::uint64_t at, std::uint64_t n) {
    return tutti::testing::read_file(backing, at, n);
  }
};

/// Extents that scatter file blocks over the namespace in reverse order, `run` LBAs per extent.
std::vector<local_file::Extent> reversed_extents(std::uint64_t blocks, std::uint64_t run, std::uint64_t lba) {
  std::vector<local_file::Extent> out;
  for (std::uint64_t b = 0; b < blocks; b += run)
    out.push_back({b * lba, (blocks - b - run) * lba + 4096 * 16, run * lba});
  return out;
}

/// What the file's bytes are, read from the namespace through the extents.
/// `count` extents of `chunk` bytes each, the file's chunks stored in reverse order from
/// `device_base` on (so a wrong extent list reads wrong bytes).
std::vector<local_file::Extent> reversed_chunks(std::uint64_t device_base, std::uint64_t count,
                                                std::uint64_t chunk = 16384) {
  std::vector<local_file::Extent> out;
  for (std::uint64_t j = 0; j < count; ++j) out.push_back({j * chunk, device_base + (count - 1 - j) * chunk, chunk});
  return out;
}

std::vector<std::uint8_t> expected_from_extents_of(const tutti::testing::SoftDrive& drive,
                                                   const std::vector<local_file::Extent>& e, std::uint64_t offset,
                                                   std::uint64_t length) {
  std::vector<std::uint8_t> out;
  for (const auto& x : e) {
    const std::uint64_t lo = std::max(offset, x.file_offset), hi = std::min(offset + length, x.file_end());
    if (lo >= hi) continue;
    auto part = tutti::testing::read_file(drive.backing, x.device_offset + (lo - x.file_offset), hi - lo);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<std::uint8_t> expected_from_extents(Rig& rig, const std::vector<local_file::Extent>& e,
                                                std::uint64_t offset, std::uint64_t length) {
  return expected_from_extents_of(rig, e, offset, length);
}

}  // namespace

TEST_CASE("option defaults are pinned") {
  Path::Options o;
  CHECK(o.queue_pairs == 2);
  CHECK(o.queue_depth == 256);
  CHECK(o.command_timeout_ns == 5'000'000'000u);
  CHECK(o.abort_timeout_ns == 1'000'000'000u);
  CHECK(o.admin_timeout_ns == 1'000'000'000u);
  CHECK(o.request_window == 16);
  CHECK(o.threads_per_block == 32);
  CHECK(o.max_command_bytes == 0);
  CHECK(o.max_batches_in_flight == 256);
  CHECK(o.device_target_cache_entries == 256);
  CHECK(o.device_target_cache_entry_extents == 256);
  CHECK(o.host_target_cache_bytes == std::uint64_t{256} << 20);
  CHECK(o.device_queue_state);
  CHECK(o.poll_kernel_budget_ns == 0u);    // host profile; 1 ms in the cuda profile (tests/gpu pins it)
  CHECK(o.submit_poll_budget_ns == 0u);    // the submit kernel does not poll unless asked
  CHECK(o.poll_stream_per_batch);          // CUDA profile: poll kernels on each batch's own stream
  CHECK(o.persistent_poller_warps == 0u);  // no persistent poller unless asked (CUDA profile only)
  CHECK(o.persistent_poller_lifetime_ns == 100'000'000u);
  CHECK(o.persistent_poller_idle_ns == 1'000'000u);
  CHECK(Path::capabilities.offset_alignment == 4096);
  CHECK(Path::capabilities.unaligned_tail_at_end_of_target);
}

TEST_CASE("invalid options are rejected naming the field") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  auto d = libnvm::SoftController::create(config);
  REQUIRE(d.is_ok());
  auto c = libnvm::open_soft_controller(*d);
  REQUIRE(c.is_ok());
  CHECK(Path::create(**c).code() == StatusCode::INVALID_ARGUMENT);  // not brought up
  REQUIRE((*c)->bring_up({}).is_ok());
  Path::Options o;
  o.queue_depth = 1;
  CHECK(Path::create(**c, o).status().message().find("queue_depth") != std::string::npos);
  o = {};
  o.request_window = 0;
  CHECK(Path::create(**c, o).status().message().find("request_window") != std::string::npos);
  o = {};
  o.queue_pairs = 1000;
  CHECK(Path::create(**c, o).status().message().find("queue_pairs") != std::string::npos);
  o = {};
  o.max_batches_in_flight = 0;
  CHECK(Path::create(**c, o).status().message().find("max_batches_in_flight = 0") != std::string::npos);
  o.max_batches_in_flight = Path::Options::kMaxBatchesInFlightLimit + 1;
  CHECK(Path::create(**c, o).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(Path::Options{}.max_batches_in_flight == Path::Options::kDefaultMaxBatchesInFlight);
  o = {};
  o.max_batches_in_flight = 4;
  o.prepared_batches = 5;
  CHECK(Path::create(**c, o).status().message().find("prepared_batches = 5 above max_batches_in_flight = 4") !=
        std::string::npos);
  o.prepared_batches = 2;
  CHECK(Path::create(**c, o).status().message().find("prepared_batch_requests = 0 outside 1..65536") !=
        std::string::npos);
  o.prepared_batch_requests = Path::Options::kMaxBatchRequests + 1;
  CHECK(Path::create(**c, o).code() == StatusCode::INVALID_ARGUMENT);
  o = {};
  o.device_target_cache_entries = Path::Options::kMaxDeviceTargetCacheEntries + 1;
  CHECK(Path::create(**c, o).status().message().find("device_target_cache_entries = 65537 outside 0..65536") !=
        std::string::npos);
  o = {};
  o.device_target_cache_entry_extents = 0;
  CHECK(Path::create(**c, o).status().message().find("device_target_cache_entry_extents = 0") != std::string::npos);
  o = {};
  o.host_target_cache_bytes = 0;
  CHECK(Path::create(**c, o).status().message().find("host_target_cache_bytes = 0") != std::string::npos);
  o = {};
  o.poll_kernel_budget_ns = Path::Options::kMaxPollKernelBudgetNs + 1;
  CHECK(Path::create(**c, o).status().message().find("poll_kernel_budget_ns = 1000000001 outside 0..1000000000") !=
        std::string::npos);
  o = {};
  o.command_timeout_ns = 1'000'000;
  o.poll_kernel_budget_ns = 500'001;  // the host waits command_timeout_ns for a kernel: at most half of it
  CHECK(Path::create(**c, o).status().message().find("poll_kernel_budget_ns = 500001 outside 0..500000") !=
        std::string::npos);
  o.poll_kernel_budget_ns = 500'000;
  CHECK(Path::create(**c, o).is_ok());
  o.submit_poll_budget_ns = 500'001;  // the same bound for the submit kernel's polling
  CHECK(Path::create(**c, o).status().message().find("submit_poll_budget_ns = 500001 outside 0..500000") !=
        std::string::npos);
  o.submit_poll_budget_ns = 500'000;
  CHECK(Path::create(**c, o).is_ok());
  // The persistent poller is a long-lived kernel: the host profile's launches run a block's threads
  // one after another, so it is refused there, naming the field (its ranges are checked on the GPU).
  o = {};
  o.persistent_poller_warps = 4;
  CHECK(Path::create(**c, o).status().message().find("persistent_poller_warps = 4 needs the cuda profile") !=
        std::string::npos);
}

TEST_CASE("a submit kernel that polls (submit_poll_budget_ns) returns the batch done, and progress launches nothing") {
  // 8 requests of 8 commands each (4 KiB, window 2: at least 4 passes each). With a 1 s budget the
  // submit kernel polls them to the end; with a budget that ends after its first pass it cannot,
  // and progress launches poll kernels for the rest. The bytes are right either way.
  for (const std::uint64_t budget : {Path::Options::kMaxPollKernelBudgetNs, std::uint64_t{1}}) {
    CAPTURE(budget);
    Path::Options o;
    o.request_window = 2;
    o.max_command_bytes = 4096;
    o.submit_poll_budget_ns = budget;
    Rig rig(o);
    auto t = rig.open({{0, 0, 1 << 20}}, 1 << 20);
    Buffer buffer(1 << 20);
    auto m = rig.map(buffer);
    std::memset(buffer.data, 0xEE, buffer.size);
    std::vector<PathRequest<Path>> requests;
    for (std::uint64_t i = 0; i < 8; ++i)
      requests.push_back(rig.request(Direction::READ, m, buffer, i * 32768, t, (i * 7 % 8) * 32768, 32768));
    std::vector<Status> states(requests.size());
    const std::uint64_t before = rig.path->poll_kernel_launches();
    auto batch = rig.path->submit(requests, states);
    for (const Status& s : states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
    std::vector<RequestCompletion> done(requests.size());
    REQUIRE(rig.path->progress(batch, done, 20 * kSecond).is_ok());
    const std::uint64_t launches = rig.path->poll_kernel_launches() - before;
    if (budget == Path::Options::kMaxPollKernelBudgetNs) {
      CHECK(launches == 0);
    } else {
      CHECK(launches >= 1);
    }
    for (std::uint64_t i = 0; i < 8; ++i) {
      CAPTURE(i);
      REQUIRE_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
      CHECK(done[i].done);
      CHECK(done[i].confirmed_bytes == 32768);
      CHECK(done[i].commands == 8);
      const auto expected = rig.device_bytes((i * 7 % 8) * 32768, 32768);
      CHECK(std::equal(expected.begin(), expected.end(), buffer.bytes() + i * 32768));
    }
    batch = {};
    CHECK(rig.path->unregister_memory(m).is_ok());
  }
}

TEST_CASE(
    "the progress kernel polls on the accelerator's clock: one launch per batch with a budget, one per pass without") {
  // One request of 32 commands (4 KiB each) with a window of 2: at most 2 complete per pass, so
  // a kernel that polls one pass needs at least 16 launches; one that polls until done needs one
  // (unless the 1 s budget runs out first).
  for (const std::uint64_t budget : {std::uint64_t{0}, Path::Options::kMaxPollKernelBudgetNs}) {
    CAPTURE(budget);
    Path::Options o;
    o.request_window = 2;
    o.max_command_bytes = 4096;
    o.poll_kernel_budget_ns = budget;
    Rig rig(o);
    auto t = rig.open({{0, 0, 1 << 20}}, 1 << 20);
    Buffer buffer(1 << 20);
    auto m = rig.map(buffer);
    const std::uint64_t before = rig.path->poll_kernel_launches();
    const auto split_before = rig.path->submit_time_split();
    const std::uint64_t submit_start = accel::timer_ns();
    auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 64 << 10, 32 * 4096)});
    const std::uint64_t run_ns = accel::timer_ns() - submit_start;
    REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
    CHECK(done[0].commands == 32);
    // The submit's time split counts this one submit, and its parts fit inside the whole run.
    const auto split = rig.path->submit_time_split();
    CHECK(split.submits == split_before.submits + 1);
    CHECK(split.staging_ns > split_before.staging_ns);  // staging 1 request takes time
    CHECK(split.device_ns > split_before.device_ns);    // so does running its AdmitKernel
    CHECK(split.staging_ns - split_before.staging_ns + split.device_ns - split_before.device_ns <= run_ns);
    const auto expected = rig.device_bytes(64 << 10, 32 * 4096);
    CHECK(std::equal(expected.begin(), expected.end(), buffer.bytes()));
    const std::uint64_t launches = rig.path->poll_kernel_launches() - before;
    if (budget == 0) {
      CHECK(launches >= 16);
    } else {
      CHECK(launches == 1);
    }
    CHECK(rig.path->unregister_memory(m).is_ok());
  }
}

TEST_CASE("a request is split at extent boundaries and at the command size limit, and reads the right bytes") {
  Path::Options o;
  o.max_command_bytes = 64 << 10;
  Rig rig(o);
  const std::uint64_t blocks = 1024;  // 4 MiB file in extents of 48 KiB, reversed on the device
  auto extents = reversed_extents(blocks, 12, 4096);
  extents.back().length = (blocks - (extents.size() - 1) * 12) * 4096;
  auto t = rig.open(extents, blocks * 4096 - 100);
  Buffer buffer(8 << 20);
  auto m = rig.map(buffer);
  struct Case {
    std::uint64_t offset, length, memory_offset;
  };
  for (Case c : {Case{0, 4096, 0}, Case{4096, 49152, 4}, Case{40960, 200 * 4096, 4096 * 3 + 64},
                 Case{0, blocks * 4096 - 100, 0}, Case{12 * 4096, 24 * 4096, 2048}}) {
    CAPTURE(c.offset);
    CAPTURE(c.length);
    std::memset(buffer.data, 0xEE, buffer.size);
    auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, c.memory_offset, t, c.offset, c.length)});
    REQUIRE(states[0].is_ok());
    REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
    CHECK(done[0].confirmed_bytes == c.length);
    // Expected commands: one per extent piece, each piece split at 64 KiB.
    std::uint32_t commands = 0;
    for (const auto& e : extents) {
      const std::uint64_t lo = std::max(c.offset, e.file_offset);
      const std::uint64_t hi = std::min((c.offset + c.length + 4095) / 4096 * 4096, e.file_end());
      if (lo < hi) commands += static_cast<std::uint32_t>((hi - lo + (64 << 10) - 1) / (64 << 10));
    }
    CHECK(done[0].commands == commands);
    auto expected = expected_from_extents(rig, extents, c.offset, c.length);
    CHECK(std::equal(expected.begin(), expected.end(), buffer.bytes() + c.memory_offset));
  }
  CHECK(rig.path->unregister_memory(m).is_ok());
}

namespace {

/// Another controller that says the host cannot reach its queue memory (QueuePairInfo::
/// host_accessible false, as a GPU-resident controller says in the CUDA profile), so the DataPath
/// puts the queue state and credits in device memory (host memory in this profile).
struct KernelsOnlyController : nvme::Controller {
  explicit KernelsOnlyController(nvme::Controller& c) : inner(c) {}
  std::string_view kind() const noexcept override { return inner.kind(); }
  Status bring_up(const nvme::BringUpOptions& o) override { return inner.bring_up(o); }
  Status shutdown(std::uint64_t t) override { return inner.shutdown(t); }
  const nvme::ControllerIdentity& identity() const noexcept override { return inner.identity(); }
  nvme::ControllerStatus controller_status() const noexcept override { return inner.controller_status(); }
  Result<nvme::QueuePairInfo> create_io_queue_pair(std::uint32_t depth) override {
    auto info = inner.create_io_queue_pair(depth);
    if (info) info->host_accessible = false;
    return info;
  }
  Status delete_io_queue_pair(std::uint16_t qid) override { return inner.delete_io_queue_pair(qid); }
  Result<nvme::DmaMapping> dma_map(void* a, std::size_t n) override { return inner.dma_map(a, n); }
  Result<nvme::DmaMapping> dma_map_device(void* a, std::size_t n) override { return inner.dma_map_device(a, n); }
  Status dma_unmap(std::uint64_t id) override { return inner.dma_unmap(id); }
  Result<nvme::DmaBuffer> allocate_dma_buffer(std::size_t n) override { return inner.allocate_dma_buffer(n); }
  Status free_dma_buffer(std::uint64_t id) override { return inner.free_dma_buffer(id); }
  Result<nvme::CompletionQueueEntry> submit_admin(const nvme::SubmissionQueueEntry& c, std::uint64_t t) override {
    return inner.submit_admin(c, t);
  }
  Result<bool> abort(std::uint16_t sqid, std::uint16_t cid, std::uint64_t t) override {
    return inner.abort(sqid, cid, t);
  }
  nvme::Controller& inner;
};

}  // namespace

TEST_CASE("queues only kernels reach keep their state and credits in device memory and read the right bytes") {
  tutti::testing::SoftDrive drive({}, 16 << 20, 91, "/tmp/tutti-lnvme-");
  KernelsOnlyController hidden(*drive.controller);
  Path::Options o;
  o.queue_pairs = 2;
  o.queue_depth = 16;
  tutti::testing::PathRig<Path> rig(20 * kSecond);
  {
    // The placement follows the controller and the option: kept in (mapped) host memory when the host
    // reaches the rings, or when device_queue_state is off.
    auto plain = Path::create(*drive.controller, o);
    REQUIRE_MESSAGE(plain.is_ok(), plain.status().to_string());
    CHECK_FALSE(plain->queue_state_in_device_memory(0));
    Path::Options mapped = o;
    mapped.device_queue_state = false;
    auto kept = Path::create(hidden, mapped);
    REQUIRE_MESSAGE(kept.is_ok(), kept.status().to_string());
    CHECK_FALSE(kept->queue_state_in_device_memory(0));
    CHECK_FALSE(kept->queue_state_in_device_memory(1));
  }
  auto created = Path::create(hidden, o);
  REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
  CHECK(created->queue_state_in_device_memory(0));
  CHECK(created->queue_state_in_device_memory(1));
  CHECK_THROWS_AS((void)created->queue_state_in_device_memory(2), std::out_of_range);
  rig.path.emplace(std::move(created.value()));
  local_file::Target target;
  target.path = "synthetic";
  target.extents = reversed_chunks(1 << 20, 64);  // 1 MiB file, 16 KiB extents in reverse order
  target.file_size = 64 * 16384;
  target.lba_size = drive.controller->identity().lba_size;
  auto t = rig.open_or_fail(std::move(target));
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  std::vector<PathRequest<Path>> requests;
  for (std::uint64_t i = 0; i < 32; ++i)  // more requests than one queue's 15 credits: both pairs, reused credits
    requests.push_back(rig.request(Direction::READ, m, buffer, i * 32768, t, i * 32768, 32768));
  for (int round = 0; round < 3; ++round) {
    std::memset(buffer.data, 0xEE, buffer.size);
    std::vector<PathRequest<Path>> pending = requests;
    std::uint64_t confirmed = 0;
    for (int attempt = 0; attempt < 100 && !pending.empty(); ++attempt) {
      auto [states, done] = rig.run(pending);
      std::vector<PathRequest<Path>> again;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (states[i].code() == StatusCode::RESOURCE_EXHAUSTED) {
          again.push_back(pending[i]);
          continue;
        }
        REQUIRE_MESSAGE(states[i].is_ok(), states[i].to_string());
        REQUIRE_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
        confirmed += done[i].confirmed_bytes;
      }
      pending = std::move(again);
    }
    CHECK(pending.empty());
    CHECK(confirmed == 1 << 20);
    auto expected = expected_from_extents_of(drive, reversed_chunks(1 << 20, 64), 0, 1 << 20);
    CHECK(std::equal(expected.begin(), expected.end(), buffer.bytes()));
  }
  // Each round needed every queue's 15 credits several times over (32 requests of 2 commands each),
  // so credits came back between submits; the counters come from the moved state.
  std::uint64_t reaped = 0;
  for (std::size_t q = 0; q < 2; ++q) reaped += rig.path->queue_statistics(q).completions_reaped;
  CHECK(reaped == 3 * 32 * 2);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("prebuilt PRP lists serve every start page, both list variants and chained list pages") {
  Rig rig;  // MDTS 1 MiB: 256 pages per command, lists cross list pages often
  auto t = rig.open({{0, 0, 48 << 20}}, 48 << 20);
  Buffer buffer(12 << 20);  // 3072 pages: several list pages per variant
  auto m = rig.map(buffer);
  std::vector<PathRequest<Path>> batch;
  // Command last pages e with e % 511 == 0 need variant 1; sweep start pages across 511 boundaries.
  for (std::uint64_t start_page : {0ull, 1ull, 254ull, 255ull, 256ull, 510ull, 511ull, 766ull, 767ull, 1021ull, 1022ull,
                                   1277ull, 2300ull, 2555ull, 2800ull}) {
    std::memset(buffer.data, 0xEE, buffer.size);
    const std::uint64_t length = std::min<std::uint64_t>(1 << 20, buffer.size - start_page * 4096);
    const std::uint64_t file_offset = start_page * 8192;
    auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, start_page * 4096, t, file_offset, length)});
    REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
    auto expected = rig.device_bytes(file_offset, length);
    CHECK_MESSAGE(std::equal(expected.begin(), expected.end(), buffer.bytes() + start_page * 4096), "start page ",
                  start_page);
  }
  CHECK(rig.device->counters().dma_faults == 0);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

/// Walks PRP1/PRP2 as a controller does (NVMe Base Spec 2.0, 4.3.1): the page addresses a
/// transfer of `length` bytes touches, reading list entries through `read_entry(bus_address)`;
/// a chain entry is the last slot of a list page when more than one entry remains.
template <class ReadEntry>
std::vector<std::uint64_t> walk_prp(std::uint64_t prp1, std::uint64_t prp2, std::uint64_t length, std::uint64_t page,
                                    ReadEntry read_entry) {
  std::vector<std::uint64_t> out{prp1 / page * page};
  const std::uint64_t pages = (prp1 % page + length + page - 1) / page;
  if (pages == 2) out.push_back(prp2);
  if (pages <= 2) return out;
  std::uint64_t entry = prp2;
  for (std::uint64_t left = pages - 1; left > 0;) {
    if (entry % page == page - 8 && left > 1) {
      entry = read_entry(entry);  // chain to the next list page
      continue;
    }
    out.push_back(read_entry(entry));
    entry += 8;
    --left;
  }
  return out;
}

TEST_CASE("PrpTable: list pages scattered in bus space; every start page and length walks exactly its pages") {
  // A 2100-page region whose pages and list pages sit at scattered, descending bus addresses.
  constexpr std::uint64_t kPage = 4096, kRegionPages = 2100;
  std::vector<std::uint64_t> region(kRegionPages);
  for (std::uint64_t i = 0; i < kRegionPages; ++i) region[i] = (1ull << 40) + (kRegionPages - i) * 3 * kPage;
  local_nvme::PrpTable table;
  table.list_pages = local_nvme::PrpTable::list_pages_for(kRegionPages, kPage);
  std::vector<std::uint64_t> list_pages(2 * table.list_pages);
  for (std::uint64_t i = 0; i < list_pages.size(); ++i)
    list_pages[i] = (1ull << 41) + (list_pages.size() - i) * 5 * kPage;
  table.pages = nvme::PageTableView{region.data(), kRegionPages, kPage};
  table.lists = nvme::PageTableView{list_pages.data(), list_pages.size(), kPage};
  std::vector<std::uint64_t> lists(list_pages.size() * kPage / 8, ~0ull);
  table.fill(lists.data());
  const auto read_entry = [&](std::uint64_t bus) {
    for (std::uint64_t i = 0; i < list_pages.size(); ++i)
      if (bus >= list_pages[i] && bus < list_pages[i] + kPage) return lists[(i * kPage + (bus - list_pages[i])) / 8];
    FAIL("PRP list read outside every list page, bus address ", bus);
    return std::uint64_t{0};
  };
  std::uint64_t checked = 0, used_variant_1 = 0;
  for (std::uint64_t first = 0; first < kRegionPages; first += 7) {
    for (std::uint64_t count : {1ull, 2ull, 3ull, 256ull, 511ull, 512ull, 513ull, 1100ull}) {
      if (first + count > kRegionPages) continue;
      const std::uint64_t offset = first * kPage + (count % 2 == 0 ? 0 : 4);  // dword offsets too
      const std::uint64_t length = count * kPage - (offset % kPage);
      const nvme::PrpBuild prp = table.lookup(offset, length);
      REQUIRE(prp.status == StatusCode::OK);
      CHECK(prp.prp1 == region[first] + offset % kPage);
      const auto walked = walk_prp(prp.prp1, prp.prp2, length, kPage, read_entry);
      REQUIRE(walked.size() == count);
      for (std::uint64_t k = 0; k < count; ++k)
        CHECK_MESSAGE(walked[k] == region[first + k], "first ", first, " count ", count);
      if (count >= 3 && (first + count - 1) % 511 == 0) ++used_variant_1;
      ++checked;
    }
  }
  CHECK(checked > 1900);
  CHECK(used_variant_1 > 0);  // the sweep met the case only the shifted variant serves
  CHECK(table.lookup(kRegionPages * kPage - 4, 8).status == StatusCode::OUT_OF_RANGE);
  CHECK(table.lookup(2, 8).status == StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("a DEVICE region (accelerator_mode) reads through the prebuilt lists, chained list pages included") {
  // Host profile: accelerator memory is host memory behind the same accel calls, so this runs the
  // CUDA profile's registration (dma_map_device, page tables in an accel::DeviceBuffer) on the
  // CPU; tests/gpu runs it on a GPU.
  libnvm::SoftControllerConfig config;
  config.accelerator_mode = true;
  Rig rig({}, config);
  auto t = rig.open({{0, 0, 48 << 20}}, 48 << 20);
  Buffer buffer(6 << 20);  // 1536 pages: four list pages per variant
  auto mapped = rig.path->register_memory({buffer.data, buffer.size, MemoryKind::DEVICE, 0});
  REQUIRE_MESSAGE(mapped.is_ok(), mapped.status().to_string());
  auto& m = *mapped;
  const local_nvme::PrpTable* table = m.prp_table();
  REQUIRE(table != nullptr);
  CHECK(table->pages.page_count == 1536);
  CHECK(table->lists.page_count == 2 * table->list_pages);
  const MemoryView view{buffer.data, buffer.size, MemoryKind::DEVICE, 0};
  int chained = 0;
  for (std::uint64_t start_page : {0ull, 255ull, 256ull, 400ull, 511ull, 766ull, 1000ull, 1022ull, 1277ull}) {
    std::memset(buffer.data, 0xEE, buffer.size);
    const std::uint64_t length = std::min<std::uint64_t>(1 << 20, buffer.size - start_page * 4096);
    const std::uint64_t file_offset = start_page * 8192;
    // One 1 MiB command (MDTS): its list entries are virtual indices start+1 .. start+pages-1 of
    // the variant lookup picks; the walk follows a chain when they span two list pages.
    const std::uint64_t pages = length / 4096, last = start_page + pages - 1;
    const std::uint64_t shift = table->shift(last % 511 == 0 ? 1 : 0);
    if ((start_page + 1 + shift) / 511 != (last + shift) / 511) ++chained;
    auto [states, done] =
        rig.run({PathRequest<Path>{Direction::READ, &m, view, start_page * 4096, &t, file_offset, length}});
    REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
    auto expected = rig.device_bytes(file_offset, length);
    CHECK_MESSAGE(std::equal(expected.begin(), expected.end(), buffer.bytes() + start_page * 4096), "start page ",
                  start_page);
  }
  CHECK(chained >= 2);  // start pages 400 and 1000 cross a list page
  CHECK(rig.device->counters().dma_faults == 0);
  CHECK(rig.path->unregister_memory(m).is_ok());
  CHECK(m.prp_table() == nullptr);
}

TEST_CASE("writes land on the namespace at the extents' LBAs and FLUSH issues one NVMe Flush") {
  Rig rig;
  auto extents = reversed_extents(64, 4, 4096);
  auto t = rig.open(extents, 64 * 4096);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  auto data = tutti::testing::pattern(5, 0, 40 * 4096);
  std::memcpy(buffer.data, data.data(), data.size());
  auto [states, done] = rig.run({rig.request(Direction::WRITE, m, buffer, 0, t, 8 * 4096, 40 * 4096)});
  REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
  CHECK(done[0].commands == 10);
  CHECK(expected_from_extents(rig, extents, 8 * 4096, 40 * 4096) == data);
  PathRequest<Path> flush{Direction::FLUSH, nullptr, MemoryView{}, 0, &t, 0, 0};
  const auto before = rig.device->counters().flush_commands;
  auto [fs, fd] = rig.run({flush});
  CHECK(fd[0].status.is_ok());
  CHECK(fd[0].commands == 1);
  CHECK(rig.device->counters().flush_commands == before + 1);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("close flushes the namespace when the target was opened with flush_on_close") {
  Rig rig;
  local_file::Target t;
  t.path = "synthetic";
  t.extents = {{0, 0, 1 << 20}};
  t.file_size = 1 << 20;
  t.lba_size = 4096;
  auto opened = rig.path->open(std::move(t), OpenOptions{true, true, false});
  REQUIRE(opened.is_ok());
  const auto before = rig.device->counters().flush_commands;
  CHECK(rig.path->close(*opened).is_ok());
  CHECK(rig.device->counters().flush_commands == before + 1);
  // Without flush_on_close, close issues nothing.
  auto plain = rig.open({{0, 0, 1 << 20}}, 1 << 20);
  CHECK(rig.path->close(plain).is_ok());
  CHECK(rig.device->counters().flush_commands == before + 1);
  // A failing Flush is reported by close.
  libnvm::SoftFaultRule rule;
  rule.opcode = static_cast<int>(nvme::NvmOpcode::flush);
  rig.device->inject_fault(rule);
  local_file::Target t2;
  t2.path = "synthetic";
  t2.extents = {{0, 0, 1 << 20}};
  t2.file_size = 1 << 20;
  t2.lba_size = 4096;
  auto failing = rig.path->open(std::move(t2), OpenOptions{true, true, false});
  REQUIRE(failing.is_ok());
  CHECK(rig.path->close(*failing).code() == StatusCode::DEVICE_ERROR);
}

TEST_CASE("an injected media error on an LBA range fails only the requests that touch it, with the raw NVMe status") {
  Rig rig;
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(4 << 20);
  auto m = rig.map(buffer);
  libnvm::SoftFaultRule rule;
  rule.lba_range_only = true;
  rule.first_lba = 300;
  rule.last_lba = 300;
  rule.max_fires = 0;
  rig.device->inject_fault(rule);
  auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 0, 1 << 20),              // LBAs 0..255
                                 rig.request(Direction::READ, m, buffer, 1 << 20, t, 1 << 20, 1 << 20),  // 256..511
                                 rig.request(Direction::READ, m, buffer, 2 << 20, t, 2 << 20, 64 << 10)});
  CHECK(done[0].status.is_ok());
  CHECK(done[0].confirmed_bytes == 1 << 20);
  CHECK(done[1].status.code() == StatusCode::DEVICE_ERROR);
  CHECK(done[1].device_status == 0x281);  // SCT 2 (media), SC 81h Unrecovered Read Error
  CHECK(done[1].confirmed_bytes == 0);
  CHECK(done[1].status.message().find("Unrecovered Read Error") != std::string::npos);
  CHECK(done[2].status.is_ok());
  // A split request: the failing command fails the request; the others' bytes are confirmed.
  Path::Options o;
  o.max_command_bytes = 256 << 10;
  Rig split(o);
  auto t2 = split.open({{0, 0, 16 << 20}}, 16 << 20);
  auto m2 = split.map(buffer);
  split.device->inject_fault(rule);
  auto [s2, d2] = split.run({split.request(Direction::READ, m2, buffer, 0, t2, 0, 2 << 20)});
  CHECK(d2[0].status.code() == StatusCode::DEVICE_ERROR);
  CHECK(d2[0].commands == 8);
  CHECK(d2[0].confirmed_bytes == 7 * (256u << 10));
  CHECK(split.path->unregister_memory(m2).is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

/// Makes the rig's controller hold every command that touches `lba` unanswered (lose_completion):
/// only Abort or SQ deletion ends such a command.
void lose_completions_at(Rig& rig, std::uint64_t lba) {
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::lose_completion;
  rule.lba_range_only = true;
  rule.first_lba = lba;
  rule.last_lba = lba;
  rig.device->inject_fault(rule);
}

TEST_CASE("a lost completion times out, is aborted with NVMe Abort, and reports TIMEOUT") {
  Path::Options o;
  o.command_timeout_ns = 50'000'000;  // 50 ms
  Rig rig(o);
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  lose_completions_at(rig, 16);
  const auto start = accel::timer_ns();
  auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 16 * 4096, 4096),
                                 rig.request(Direction::READ, m, buffer, 8192, t, 0, 4096)});
  const auto elapsed = accel::timer_ns() - start;
  CHECK(done[0].status.code() == StatusCode::TIMEOUT);
  CHECK(done[0].device_status == 0x007);  // Command Abort Requested
  CHECK(done[0].confirmed_bytes == 0);
  CHECK(done[1].status.is_ok());
  CHECK(rig.path->aborts_sent() == 1);
  CHECK(rig.device->counters().aborted_commands == 1);
  CHECK(elapsed >= 50'000'000u);
  CHECK(elapsed < 5 * kSecond);
  CHECK(rig.path->zombie_commands() == 0);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

/// One 4 KiB READ submitted to a controller that loses every completion: the setup of the tests
/// of what progress, Abort and zombies do when a command never completes. `batch` and
/// `completions` are the submit's; the rig, target and mapping stay alive with the object.
struct LostCompletionRead {
  explicit LostCompletionRead(Path::Options options) : rig(options) {
    target.emplace(rig.open({{0, 0, 16 << 20}}, 16 << 20));
    mapping.emplace(rig.map(buffer));
    libnvm::SoftFaultRule rule;
    rule.action = libnvm::SoftFaultRule::Action::lose_completion;
    rig.device->inject_fault(rule);
    std::vector<Status> states(1);
    std::vector<PathRequest<Path>> rs{rig.request(Direction::READ, *mapping, buffer, 0, *target, 0, 4096)};
    batch = rig.path->submit(rs, states);
    REQUIRE(states[0].is_ok());
  }
  Rig rig;
  Buffer buffer{1 << 20};
  std::optional<Path::open_target> target;
  std::optional<Path::registered_memory> mapping;
  Path::batch batch;
  std::vector<RequestCompletion> completions = std::vector<RequestCompletion>(1);
};

TEST_CASE("progress never hangs: a short budget returns NOT_READY and the IO finishes later") {
  Path::Options o;
  o.command_timeout_ns = 200'000'000;
  LostCompletionRead lost(o);
  auto& path = *lost.rig.path;
  CHECK(path.progress(lost.batch, lost.completions, 1'000'000).code() == StatusCode::NOT_READY);
  CHECK_FALSE(lost.completions[0].done);
  CHECK(path.progress(lost.batch, lost.completions, 10 * kSecond).is_ok());
  CHECK(lost.completions[0].status.code() == StatusCode::TIMEOUT);
  CHECK(path.unregister_memory(*lost.mapping).is_ok());
}

TEST_CASE("progress(SOME) returns at the first new completion while another command is held; ALL waits for all") {
  Path::Options o;
  o.command_timeout_ns = 2 * kSecond;  // the held command times out (and is aborted) after 2 s
  Rig rig(o);
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  lose_completions_at(rig, 16);
  std::vector<Status> states(2);
  std::vector<PathRequest<Path>> rs{rig.request(Direction::READ, m, buffer, 0, t, 16 * 4096, 4096),
                                    rig.request(Direction::READ, m, buffer, 8192, t, 0, 4096)};
  auto batch = rig.path->submit(rs, states);
  REQUIRE(states[0].is_ok());
  REQUIRE(states[1].is_ok());
  std::vector<RequestCompletion> completions(2);
  // Were SOME to wait like ALL, this call would return only after the held command's 2 s timeout,
  // with both entries done.
  const Status some = rig.path->progress(batch, completions, 60 * kSecond, ProgressUntil::SOME);
  CHECK_MESSAGE(some.code() == StatusCode::NOT_READY, some.to_string());
  REQUIRE(completions[1].done);
  CHECK(completions[1].status.is_ok());
  CHECK(completions[1].confirmed_bytes == 4096);
  CHECK_FALSE(completions[0].done);
  // Nothing new: a short SOME call reports nothing more.
  const Status nothing_new = rig.path->progress(batch, completions, 20'000'000, ProgressUntil::SOME);
  CHECK_MESSAGE(nothing_new.code() == StatusCode::NOT_READY, nothing_new.to_string());
  CHECK_FALSE(completions[0].done);
  // ALL waits for the held command: it times out, is aborted, and the batch is done.
  const Status all = rig.path->progress(batch, completions, 20 * kSecond, ProgressUntil::ALL);
  CHECK_MESSAGE(all.is_ok(), all.to_string());
  REQUIRE(completions[0].done);
  CHECK(completions[0].status.code() == StatusCode::TIMEOUT);
  CHECK(completions[0].confirmed_bytes == 0);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("a polling kernel stays within progress's timeout: a lost completion, a 10 ms budget, a 20 ms progress") {
  Path::Options o;
  o.command_timeout_ns = kSecond;
  o.poll_kernel_budget_ns = 10'000'000;  // each launch polls up to 10 ms
  LostCompletionRead lost(o);
  auto& path = *lost.rig.path;
  const std::uint64_t before = path.poll_kernel_launches();
  const auto start = accel::timer_ns();
  CHECK(path.progress(lost.batch, lost.completions, 20'000'000).code() == StatusCode::NOT_READY);
  const auto elapsed = accel::timer_ns() - start;
  CHECK(elapsed >= 20'000'000u);
  CHECK(elapsed < 500'000'000u);  // 20 ms + at most one pass (generous for sanitizers)
  // Each launch polls at most 10 ms, so the 20 ms progress launched once or more (twice on an idle
  // machine; once when the first launch itself ran past 20 ms on a loaded one).
  CHECK(path.poll_kernel_launches() - before >= 1);
  CHECK_FALSE(lost.completions[0].done);
  // The command then times out (1 s), is aborted, and the request reports TIMEOUT.
  CHECK(path.progress(lost.batch, lost.completions, 10 * kSecond).is_ok());
  CHECK(lost.completions[0].status.code() == StatusCode::TIMEOUT);
  CHECK(path.unregister_memory(*lost.mapping).is_ok());
}

TEST_CASE("commands the controller never answers keep their memory mapped: unregister is BUSY") {
  Path::Options o;
  o.command_timeout_ns = 20'000'000;
  o.abort_timeout_ns = 20'000'000;
  o.admin_timeout_ns = 20'000'000;
  LostCompletionRead lost(o);
  auto& path = *lost.rig.path;
  lost.rig.device->set_controller_fatal();  // the Abort cannot be answered either
  REQUIRE(path.progress(lost.batch, lost.completions, 10 * kSecond).is_ok());
  CHECK(lost.completions[0].status.code() == StatusCode::DEVICE_ERROR);
  CHECK(lost.completions[0].confirmed_bytes == 0);
  CHECK(path.zombie_commands() == 1);
  CHECK(path.unregister_memory(*lost.mapping).code() == StatusCode::BUSY);
}

TEST_CASE("backpressure: a full queue rejects requests with RESOURCE_EXHAUSTED and they never run") {
  Path::Options o;
  o.queue_pairs = 1;
  o.queue_depth = 4;  // 3 commands in flight
  o.request_window = 1;
  Rig rig(o);
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  std::vector<PathRequest<Path>> rs;
  for (std::uint64_t i = 0; i < 8; ++i)
    rs.push_back(rig.request(Direction::READ, m, buffer, i * 4096, t, i * 4096, 4096));
  std::vector<Status> states(rs.size());
  const auto reads_before = rig.device->counters().read_commands;
  auto b = rig.path->submit(rs, states);
  std::size_t accepted = 0;
  for (auto& s : states) {
    if (s.is_ok())
      ++accepted;
    else
      CHECK(s.code() == StatusCode::RESOURCE_EXHAUSTED);
  }
  CHECK(accepted == 3);
  std::vector<RequestCompletion> completions(rs.size());
  REQUIRE(rig.path->progress(b, completions, 10 * kSecond).is_ok());
  CHECK(rig.device->counters().read_commands - reads_before == 3);
  // Credits are back: the same requests are accepted now (window 1 spreads a big request).
  std::vector<Status> again(1);
  std::vector<PathRequest<Path>> big{rig.request(Direction::READ, m, buffer, 0, t, 0, 1 << 20)};
  auto b2 = rig.path->submit(big, again);
  CHECK(again[0].is_ok());
  std::vector<RequestCompletion> c2(1);
  REQUIRE(rig.path->progress(b2, c2, 10 * kSecond).is_ok());
  CHECK(c2[0].status.is_ok());
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("the batch pool: a submit past max_batches_in_flight is rejected whole, slots are reused") {
  Path::Options o;
  o.max_batches_in_flight = 2;
  Rig rig(o);
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  auto make = [&](std::uint64_t first, std::size_t count) {
    std::vector<PathRequest<Path>> rs;
    for (std::uint64_t i = 0; i < count; ++i)
      rs.push_back(
          rig.request(Direction::READ, m, buffer, (first + i) * 4096 % (1 << 20), t, (first + i) * 4096, 4096));
    return rs;
  };
  auto r1 = make(0, 8), r2 = make(8, 8), r3 = make(16, 8);
  std::vector<Status> s1(8), s2(8), s3(8);
  const auto reads_before = rig.device->counters().read_commands;
  std::optional<Path::batch> b1(rig.path->submit(r1, s1));
  auto b2 = rig.path->submit(r2, s2);
  CHECK(rig.path->batches_in_flight() == 2);
  auto b3 = rig.path->submit(r3, s3);  // the pool is exhausted: backpressure, nothing runs
  for (auto& s : s3) {
    CHECK(s.code() == StatusCode::RESOURCE_EXHAUSTED);
    CHECK(s.message().find("max_batches_in_flight = 2") != std::string::npos);
  }
  std::vector<RequestCompletion> c3(8);
  CHECK(rig.path->progress(b3, c3, kSecond).is_ok());  // nothing accepted: nothing to wait for
  std::vector<RequestCompletion> c1(8), c2(8);
  REQUIRE(rig.path->progress(*b1, c1, 10 * kSecond).is_ok());
  REQUIRE(rig.path->progress(b2, c2, 10 * kSecond).is_ok());
  CHECK(rig.device->counters().read_commands - reads_before == 16);
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(c1[i].status.is_ok());
    CHECK(c2[i].status.is_ok());
  }
  b1.reset();  // its slot returns to the pool
  CHECK(rig.path->batches_in_flight() == 1);
  // Many submits reuse the two slots: no new slot is ever allocated.
  for (int round = 0; round < 100; ++round) {
    auto rs = make(static_cast<std::uint64_t>(round % 32) * 8, 8);
    std::vector<Status> states(8);
    auto b = rig.path->submit(rs, states);
    for (auto& s : states) REQUIRE(s.is_ok());
    std::vector<RequestCompletion> c(8);
    REQUIRE(rig.path->progress(b, c, 10 * kSecond).is_ok());
    for (std::size_t i = 0; i < 8; ++i) {
      REQUIRE(c[i].status.is_ok());
      CHECK(c[i].confirmed_bytes == 4096);
    }
  }
  CHECK(rig.path->batch_slots_allocated() == 2);
  CHECK(rig.path->batches_in_flight() == 1);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("prepared batch slots exist after create and serve submits up to their size without a new slot") {
  Path::Options o;
  o.max_batches_in_flight = 4;
  o.prepared_batches = 3;
  o.prepared_batch_requests = 16;
  Rig rig(o);
  CHECK(rig.path->batch_slots_allocated() == 3);
  CHECK(rig.path->batches_in_flight() == 0);
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  std::vector<std::vector<PathRequest<Path>>> requests(3);
  std::vector<std::vector<Status>> states(3, std::vector<Status>(16));
  std::vector<Path::batch> batches;
  for (std::size_t b = 0; b < 3; ++b) {
    for (std::uint64_t i = 0; i < 16; ++i)
      requests[b].push_back(rig.request(Direction::READ, m, buffer, (b * 16 + i) * 4096, t, (b * 16 + i) * 4096, 4096));
    batches.push_back(rig.path->submit(requests[b], states[b]));
    for (auto& s : states[b]) REQUIRE(s.is_ok());
  }
  CHECK(rig.path->batch_slots_allocated() == 3);  // three batches in flight, no slot made at submit
  for (auto& b : batches) {
    std::vector<RequestCompletion> c(16);
    REQUIRE(rig.path->progress(b, c, 10 * kSecond).is_ok());
    for (auto& one : c) CHECK(one.confirmed_bytes == 4096);
  }
  batches.clear();
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("several threads submit and progress concurrently on shared queues") {
  Rig rig;
  auto t = rig.open({{0, 0, 32 << 20}}, 32 << 20);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      Buffer buffer(256 << 10);
      auto reg = rig.path->register_memory({buffer.data, buffer.size, MemoryKind::HOST, -1});
      if (!reg) {
        ++failures;
        return;
      }
      for (int round = 0; round < 50; ++round) {
        std::vector<PathRequest<Path>> rs;
        for (std::uint64_t i = 0; i < 16; ++i)
          rs.push_back(PathRequest<Path>{Direction::READ, &*reg,
                                         MemoryView{buffer.data, buffer.size, MemoryKind::HOST, -1}, i * 16384, &t,
                                         ((k * 50 + round) * 16 + i) % 2048 * 16384, 16384});
        std::vector<Status> states(rs.size());
        auto b = rig.path->submit(rs, states);
        std::vector<RequestCompletion> completions(rs.size());
        if (!rig.path->progress(b, completions, 20 * kSecond).is_ok()) ++failures;
        for (std::size_t i = 0; i < rs.size(); ++i) {
          if (!states[i].is_ok()) continue;  // backpressure is allowed
          if (!completions[i].status.is_ok()) ++failures;
          auto expected = tutti::testing::pattern(77, rs[i].target_offset, 16384);
          if (std::memcmp(expected.data(), buffer.bytes() + i * 16384, 16384) != 0) ++failures;
        }
      }
      if (!rig.path->unregister_memory(*reg).is_ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
}

TEST_CASE("null mode completes commands without moving data (submission cost measurements)") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1 << 20;
  Rig rig({}, config);
  auto t = rig.open({{0, 0, 1 << 30}}, 1 << 30);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 0, 1 << 20)});
  CHECK(done[0].status.is_ok());
  CHECK(buffer.bytes()[0] == 0xEE);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

// --- the target handle cache (path/local_nvme/target_cache.hpp) ---------------------------------

namespace {

/// One target of the cache tests: its extents (16 reversed 16 KiB chunks at its own namespace
/// offset) and its open handle.
struct CachedTarget {
  std::vector<local_file::Extent> extents;
  std::uint64_t size = 0;
  Path::open_target open;
};

std::vector<CachedTarget> open_cached_targets(Rig& rig, std::size_t count, std::uint64_t chunks = 16) {
  std::vector<CachedTarget> out;
  for (std::size_t k = 0; k < count; ++k) {
    CachedTarget t;
    t.extents = reversed_chunks((k + 1) * (1 << 20) + 8192 * k, chunks);
    t.size = chunks * 16384;
    t.open = rig.open(t.extents, t.size);
    out.push_back(std::move(t));
  }
  return out;
}

/// Reads the whole target in one request (one submit, batch destroyed after it) and checks every byte.
void read_whole_and_verify(Rig& rig, CachedTarget& t) {
  Buffer buffer(t.size);
  auto m = rig.map(buffer);
  auto [states, completions] = rig.run({rig.request(Direction::READ, m, buffer, 0, t.open, 0, t.size)});
  REQUIRE_MESSAGE(states[0].is_ok(), states[0].to_string());
  REQUIRE_MESSAGE(completions[0].status.is_ok(), completions[0].status.to_string());
  CHECK(completions[0].confirmed_bytes == t.size);
  const auto expected = expected_from_extents(rig, t.extents, 0, t.size);
  CHECK(std::memcmp(buffer.data, expected.data(), t.size) == 0);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

/// (hits, misses, evictions, fallbacks, resident, pinned) of the Path's target cache.
std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t, std::uint32_t> cache_counters(
    Rig& rig) {
  const auto s = rig.path->target_cache_statistics();
  return {s.hits, s.misses, s.evictions, s.fallbacks, s.resident, s.pinned};
}
using Counters = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t, std::uint32_t>;

}  // namespace

TEST_CASE("target cache: misses fill L1, hits reuse it, the least recently used target is evicted, bytes stay right") {
  Path::Options o;
  o.device_target_cache_entries = 3;
  Rig rig(o);
  auto targets = open_cached_targets(rig, 5);
  CHECK(cache_counters(rig) == Counters{0, 0, 0, 0, 0, 0});
  for (int k : {0, 1, 2}) read_whole_and_verify(rig, targets[k]);
  CHECK(cache_counters(rig) == Counters{0, 3, 0, 0, 3, 0});
  read_whole_and_verify(rig, targets[0]);  // hit: LRU order is now 1, 2, 0
  CHECK(cache_counters(rig) == Counters{1, 3, 0, 0, 3, 0});
  read_whole_and_verify(rig, targets[3]);  // miss: evicts 1
  CHECK(cache_counters(rig) == Counters{1, 4, 1, 0, 3, 0});
  read_whole_and_verify(rig, targets[0]);  // still resident
  CHECK(cache_counters(rig) == Counters{2, 4, 1, 0, 3, 0});
  read_whole_and_verify(rig, targets[1]);  // was evicted: miss, evicts 2 (LRU: 2, 3, 0)
  CHECK(cache_counters(rig) == Counters{2, 5, 2, 0, 3, 0});
  read_whole_and_verify(rig, targets[3]);  // resident
  read_whole_and_verify(rig, targets[0]);  // resident
  CHECK(cache_counters(rig) == Counters{4, 5, 2, 0, 3, 0});
  read_whole_and_verify(rig, targets[2]);  // evicted before: miss, evicts 1 (LRU: 1, 3, 0)
  read_whole_and_verify(rig, targets[1]);  // miss again, evicts 3
  CHECK(cache_counters(rig) == Counters{4, 7, 4, 0, 3, 0});
  // Rotating over more targets than L1 holds (LRU now 0, 2, 1): the first round hits 0, 1, 2 and
  // misses 3, 4; from then on every lookup misses and evicts; every byte is still right.
  for (int round = 0; round < 4; ++round)
    for (auto& t : targets) read_whole_and_verify(rig, t);
  const auto s = rig.path->target_cache_statistics();
  CHECK(s.hits == 4 + 3);
  CHECK(s.misses == 7 + 2 + 15);
  CHECK(s.evictions == 4 + 2 + 15);
  CHECK(s.fallbacks == 0);
  CHECK(s.resident == 3);
  CHECK(s.host_bytes == 5 * 16 * sizeof(local_file::Extent));
}

TEST_CASE("target cache: one lookup per distinct target per submit; a batch pins its entries until destroyed") {
  Path::Options o;
  o.device_target_cache_entries = 2;
  Rig rig(o);
  auto targets = open_cached_targets(rig, 3);
  Buffer buffer(3 * targets[0].size);
  auto m = rig.map(buffer);
  // One batch, 16 requests over 2 targets (chunk by chunk): 2 lookups, both misses.
  std::vector<PathRequest<Path>> rs;
  for (std::uint64_t c = 0; c < 16; ++c)
    for (int k : {0, 1})
      rs.push_back(
          rig.request(Direction::READ, m, buffer, k * targets[0].size + c * 16384, targets[k].open, c * 16384, 16384));
  std::vector<Status> states(rs.size());
  std::optional<Path::batch> b1(rig.path->submit(rs, states));
  for (auto& s : states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  CHECK(cache_counters(rig) == Counters{0, 2, 0, 0, 2, 2});
  std::vector<RequestCompletion> c1(rs.size());
  REQUIRE(rig.path->progress(*b1, c1, 20 * kSecond).is_ok());
  for (auto& c : c1) CHECK(c.status.is_ok());
  for (int k : {0, 1}) {
    const auto expected = expected_from_extents(rig, targets[k].extents, 0, targets[k].size);
    CHECK(std::memcmp(buffer.bytes() + k * targets[0].size, expected.data(), targets[k].size) == 0);
  }
  // b1 is alive (done, not destroyed): both entries stay pinned, so target 2 cannot evict them and
  // is read from its L2 copy (a fallback), byte for byte.
  read_whole_and_verify(rig, targets[2]);
  CHECK(cache_counters(rig) == Counters{0, 3, 0, 1, 2, 2});
  // A hit on a pinned entry is fine: pins are counted.
  read_whole_and_verify(rig, targets[0]);
  CHECK(cache_counters(rig) == Counters{1, 3, 0, 1, 2, 2});
  b1.reset();
  CHECK(cache_counters(rig) == Counters{1, 3, 0, 1, 2, 0});
  read_whole_and_verify(rig, targets[2]);  // now it may evict the LRU entry (target 1)
  CHECK(cache_counters(rig) == Counters{1, 4, 1, 1, 2, 0});
  read_whole_and_verify(rig, targets[0]);
  CHECK(cache_counters(rig) == Counters{2, 4, 1, 1, 2, 0});
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE(
    "target cache: a batch with more targets than L1 holds reads the rest from L2; big targets and entries = 0 too") {
  SUBCASE("more distinct targets in one batch than entries") {
    Path::Options o;
    o.device_target_cache_entries = 2;
    Rig rig(o);
    auto targets = open_cached_targets(rig, 5);
    Buffer buffer(5 * targets[0].size);
    auto m = rig.map(buffer);
    std::vector<PathRequest<Path>> rs;
    for (std::size_t k = 0; k < targets.size(); ++k)
      rs.push_back(rig.request(Direction::READ, m, buffer, k * targets[0].size, targets[k].open, 0, targets[k].size));
    auto [states, completions] = rig.run(rs);
    for (std::size_t k = 0; k < targets.size(); ++k) {
      REQUIRE(states[k].is_ok());
      CHECK(completions[k].status.is_ok());
      const auto expected = expected_from_extents(rig, targets[k].extents, 0, targets[k].size);
      CHECK(std::memcmp(buffer.bytes() + k * targets[0].size, expected.data(), targets[k].size) == 0);
    }
    CHECK(cache_counters(rig) == Counters{0, 5, 0, 3, 2, 0});
    CHECK(rig.path->unregister_memory(m).is_ok());
  }
  SUBCASE("a target with more extents than an entry holds") {
    Path::Options o;
    o.device_target_cache_entry_extents = 8;
    Rig rig(o);
    auto targets = open_cached_targets(rig, 2);  // 16 extents each
    read_whole_and_verify(rig, targets[0]);
    read_whole_and_verify(rig, targets[0]);
    CHECK(cache_counters(rig) == Counters{0, 0, 0, 2, 0, 0});
    auto small = rig.open(reversed_chunks(48 << 20, 8), 8 * 16384);  // exactly 8 extents: fits
    CachedTarget t{reversed_chunks(48 << 20, 8), 8 * 16384, std::move(small)};
    read_whole_and_verify(rig, t);
    read_whole_and_verify(rig, t);
    CHECK(cache_counters(rig) == Counters{1, 1, 0, 2, 1, 0});
  }
  SUBCASE("entries = 0: L1 disabled, every submit reads L2") {
    Path::Options o;
    o.device_target_cache_entries = 0;
    Rig rig(o);
    auto targets = open_cached_targets(rig, 2);
    for (auto& t : targets) read_whole_and_verify(rig, t);
    CHECK(cache_counters(rig) == Counters{0, 0, 0, 2, 0, 0});
  }
}

TEST_CASE("target cache: close drops the L1 entry (at once, or when the last pinning batch goes) and returns L2 room") {
  Path::Options o;
  o.device_target_cache_entries = 4;
  Rig rig(o);
  auto targets = open_cached_targets(rig, 3);
  const std::uint64_t per_target = 16 * sizeof(local_file::Extent);
  CHECK(rig.path->target_cache_statistics().host_bytes == 3 * per_target);
  for (auto& t : targets) read_whole_and_verify(rig, t);
  CHECK(cache_counters(rig) == Counters{0, 3, 0, 0, 3, 0});
  CHECK(rig.path->close(targets[0].open).is_ok());
  CHECK(rig.path->target_cache_statistics().resident == 2);
  CHECK(rig.path->target_cache_statistics().host_bytes == 2 * per_target);
  // Closed while a (finished) batch still pins it: the entry stays until that batch is destroyed.
  Buffer buffer(targets[1].size);
  auto m = rig.map(buffer);
  std::vector<PathRequest<Path>> rs{rig.request(Direction::READ, m, buffer, 0, targets[1].open, 0, targets[1].size)};
  std::vector<Status> states(1);
  std::optional<Path::batch> b(rig.path->submit(rs, states));
  REQUIRE(states[0].is_ok());
  std::vector<RequestCompletion> c(1);
  REQUIRE(rig.path->progress(*b, c, 20 * kSecond).is_ok());
  CHECK(c[0].status.is_ok());
  CHECK(rig.path->close(targets[1].open).is_ok());
  CHECK(cache_counters(rig) == Counters{1, 3, 0, 0, 2, 1});
  b.reset();
  CHECK(cache_counters(rig) == Counters{1, 3, 0, 0, 1, 0});
  CHECK(rig.path->target_cache_statistics().host_bytes == per_target);
  // A target opened after the closes gets a fresh id: a miss, never a stale entry.
  auto reopened = rig.open(targets[0].extents, targets[0].size);
  CachedTarget again{targets[0].extents, targets[0].size, std::move(reopened)};
  read_whole_and_verify(rig, again);
  CHECK(cache_counters(rig) == Counters{1, 4, 0, 0, 2, 0});
  // A destroyed (never closed) open target releases its room too.
  targets.clear();
  CHECK(rig.path->target_cache_statistics().host_bytes == per_target);
  CHECK(rig.path->target_cache_statistics().resident == 1);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

TEST_CASE("target cache: open beyond host_target_cache_bytes is RESOURCE_EXHAUSTED naming the limit") {
  Path::Options o;
  o.host_target_cache_bytes = 20 * sizeof(local_file::Extent);
  Rig rig(o);
  auto first = rig.open(reversed_chunks(1 << 20, 16), 16 * 16384);
  const auto second_extents = reversed_chunks(4 << 20, 8);
  const auto second = [&] {
    local_file::Target t;
    t.path = "second";
    t.extents = second_extents;
    t.file_size = 8 * 16384;
    t.lba_size = rig.controller->identity().lba_size;
    return t;
  };
  auto refused = rig.path->open(second(), {});
  REQUIRE(refused.code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(refused.status().message().find("Options::host_target_cache_bytes") != std::string::npos);
  CHECK(refused.status().message().find("'second'") != std::string::npos);
  CHECK(rig.path->target_cache_statistics().host_bytes == 16 * sizeof(local_file::Extent));
  CHECK(rig.path->close(first).is_ok());
  auto accepted = rig.path->open(second(), {});
  REQUIRE_MESSAGE(accepted.is_ok(), accepted.status().to_string());
  CachedTarget c{second_extents, 8 * 16384, std::move(accepted.value())};
  read_whole_and_verify(rig, c);
  CHECK(rig.path->target_cache_statistics().misses == 1);
}

TEST_CASE("a request whose memory ends before its transfer is rejected at submit naming length and memory_offset") {
  Rig rig;
  auto t = rig.open({{0, 0, 1 << 20}}, (1 << 20) - 100);  // the last LBA is a tail
  Buffer buffer(16384);
  auto m = rig.map(buffer);
  const auto before = rig.device_bytes(0, 1 << 20);
  // Not a tail: 8192 bytes with 4096 bytes of memory left; then a tail of 3996 bytes that moves a
  // whole 4096-byte LBA with 4000 bytes of memory left.
  auto [states, done] = rig.run({rig.request(Direction::WRITE, m, buffer, 12288, t, 0, 8192),
                                 rig.request(Direction::READ, m, buffer, 12384, t, (1 << 20) - 4096, 3996)});
  CHECK(states[0].code() == StatusCode::OUT_OF_RANGE);
  CHECK_MESSAGE(states[0].message().find("length = 8192 needs 8192 bytes") != std::string::npos, states[0].to_string());
  CHECK(states[0].message().find("only 4096 bytes follow memory_offset = 12288") != std::string::npos);
  CHECK(states[1].code() == StatusCode::OUT_OF_RANGE);
  CHECK_MESSAGE(states[1].message().find("length = 3996 needs 4096 bytes") != std::string::npos, states[1].to_string());
  CHECK(states[1].message().find("only 4000 bytes follow memory_offset = 12384") != std::string::npos);
  CHECK(!done[0].done);
  CHECK(!done[1].done);
  CHECK(std::all_of(buffer.bytes(), buffer.bytes() + buffer.size, [](std::uint8_t b) { return b == 0xEE; }));
  CHECK(rig.device_bytes(0, 1 << 20) == before);
  CHECK(rig.path->unregister_memory(m).is_ok());
}

// ----- Retries (docs/local-nvme.md, "Retries"; NVMe Base 2.0, 4.2.3) --------------------------

namespace {
/// A rule that completes the command covering LBA `lba` with `status` on its first `fires` attempts.
libnvm::SoftFaultRule status_on_lba(std::uint64_t lba, nvme::StatusField status, std::uint64_t fires) {
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::complete_with_status;
  rule.status = status;
  rule.lba_range_only = true;
  rule.first_lba = lba;
  rule.last_lba = lba;
  rule.max_fires = fires;
  return rule;
}
}  // namespace

TEST_CASE("a retryable status with DNR clear is sent again and the request succeeds, retries counted") {
  Rig rig;
  auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer buffer(1 << 20);
  auto m = rig.map(buffer);
  // Namespace Not Ready, DNR 0 (nvme::classify: retry) on the first two attempts of the command
  // that covers LBA 10; the third attempt succeeds.
  rig.device->inject_fault(status_on_lba(10, nvme::make_status(nvme::GenericStatus::namespace_not_ready, false), 2));
  auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 0, 256 << 10)});
  REQUIRE(states[0].is_ok());
  CHECK_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
  CHECK(done[0].confirmed_bytes == 256u << 10);
  CHECK(done[0].commands == 1);
  CHECK(done[0].retries == 2);
  CHECK(done[0].device_status == 0);
  CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + (256 << 10)) == rig.device_bytes(0, 256 << 10));
  CHECK(rig.path->commands_retried() == 2);
  CHECK(rig.device->counters().injected_faults == 2);
  // In a split request only the command that got the status is sent again.
  Path::Options o;
  o.max_command_bytes = 64 << 10;
  Rig split(o);
  auto t2 = split.open({{0, 0, 16 << 20}}, 16 << 20);
  Buffer b2(1 << 20);
  auto m2 = split.map(b2);
  split.device->inject_fault(status_on_lba(100, nvme::make_status(nvme::GenericStatus::command_interrupted, false), 1));
  auto [s2, d2] = split.run({split.request(Direction::READ, m2, b2, 0, t2, 0, 1 << 20)});
  CHECK_MESSAGE(d2[0].status.is_ok(), d2[0].status.to_string());
  CHECK(d2[0].commands == 16);
  CHECK(d2[0].retries == 1);
  CHECK(std::vector<std::uint8_t>(b2.bytes(), b2.bytes() + (1 << 20)) == split.device_bytes(0, 1 << 20));
  CHECK(split.path->commands_retried() == 1);
  CHECK(rig.path->unregister_memory(m).is_ok());
  CHECK(split.path->unregister_memory(m2).is_ok());
}

TEST_CASE("a retryable status is sent at most 3 times; DNR set or a non-retryable status fails at once") {
  struct Case {
    const char* what;
    nvme::StatusField status;
    std::uint64_t fires;    // attempts that get the status
    std::uint32_t retries;  // expected
    std::uint16_t device_status;
  };
  const Case cases[] = {
      {"retryable on every attempt: 3 attempts, then it fails",
       nvme::make_status(nvme::GenericStatus::namespace_not_ready, false), 0, 2, 0x082},
      {"retryable code with DNR set", nvme::make_status(nvme::GenericStatus::namespace_not_ready, true), 0, 0, 0x082},
      {"not retryable (Unrecovered Read Error), DNR clear",
       nvme::make_status(nvme::MediaStatus::unrecovered_read_error, false), 0, 0, 0x281},
      {"not retryable (LBA Out of Range), DNR clear", nvme::make_status(nvme::GenericStatus::lba_out_of_range, false),
       0, 0, 0x080},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Rig rig;
    auto t = rig.open({{0, 0, 16 << 20}}, 16 << 20);
    Buffer buffer(1 << 20);
    auto m = rig.map(buffer);
    rig.device->inject_fault(status_on_lba(10, c.status, c.fires));
    auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 0, 256 << 10),
                                   rig.request(Direction::READ, m, buffer, 256 << 10, t, 1 << 20, 256 << 10)});
    REQUIRE(states[0].is_ok());
    CHECK(done[0].status.code() == StatusCode::DEVICE_ERROR);
    CHECK(done[0].device_status == c.device_status);
    CHECK(done[0].retries == c.retries);
    CHECK(done[0].confirmed_bytes == 0);
    CHECK(rig.device->counters().injected_faults == c.retries + 1u);
    CHECK(done[1].status.is_ok());  // the other request is untouched
    CHECK(done[1].retries == 0);
    CHECK(rig.path->commands_retried() == c.retries);
    CHECK(rig.path->unregister_memory(m).is_ok());
  }
}

TEST_CASE("a retry is decided by status, DNR, attempts and the first attempt's deadline, never after a failure") {
  local_nvme::RequestState r;
  local_nvme::CommandRecord rec;
  rec.phase = local_nvme::CommandPhase::in_flight;
  rec.attempts = 1;
  rec.deadline_ns = 1000;
  const nvme::StatusField retryable = nvme::make_status(nvme::GenericStatus::namespace_not_ready, false);
  using local_nvme::may_retry;
  CHECK(may_retry(r, rec, retryable, 999));
  CHECK_FALSE(may_retry(r, rec, retryable, 1000));  // never past the command's deadline
  CHECK_FALSE(may_retry(r, rec, nvme::make_status(nvme::GenericStatus::namespace_not_ready, true), 0));  // DNR
  CHECK_FALSE(
      may_retry(r, rec, nvme::make_status(nvme::GenericStatus::invalid_field_in_command, false), 0));  // not transient
  rec.attempts = local_nvme::kMaxCommandAttempts;
  CHECK_FALSE(may_retry(r, rec, retryable, 0));  // attempts spent
  rec.attempts = 1;
  rec.phase = local_nvme::CommandPhase::abort_sent;
  CHECK_FALSE(may_retry(r, rec, retryable, 0));  // our Abort ends it
  rec.phase = local_nvme::CommandPhase::in_flight;
  r.outcome = local_nvme::RequestOutcome::nvme_error;
  CHECK_FALSE(may_retry(r, rec, retryable, 0));  // the request failed already: issue nothing more
  // A retry that could not be sent before the deadline (the SQ had no room) fails the request
  // with the status that asked for it, and the request finishes.
  local_nvme::CommandRecord records[1];
  records[0] = rec;
  records[0].phase = local_nvme::CommandPhase::retry;
  records[0].last_status = 0x082;
  records[0].starting_lba = 77;
  local_nvme::RequestState pending;
  pending.accepted = true;
  pending.window = 1;
  pending.max_window = 1;
  pending.pending_retries = 1;
  pending.records = records;
  pending.issued_bytes = pending.transfer_length = 4096;
  std::uint32_t credits = 0;
  const local_nvme::DeviceQueue queue{nvme::QueuePair{}, &credits};
  local_nvme::poll_request(pending, queue, 999, false);
  CHECK(pending.outcome == local_nvme::RequestOutcome::ok);  // still before its deadline: it waits
  CHECK(pending.pending_retries == 1);
  local_nvme::poll_request(pending, queue, 1000, false);
  CHECK(pending.outcome == local_nvme::RequestOutcome::nvme_error);
  CHECK(pending.nvme_status == 0x082);
  CHECK(pending.failed_lba == 77);
  CHECK(pending.pending_retries == 0);
  local_nvme::detail::finish_if_idle(pending, queue);
  CHECK(pending.done);
  CHECK(credits == 1);  // its credit came back
}

// ----- Admission (issue 14, 1; docs/local-nvme.md, "Admission") --------------------------------

TEST_CASE("every request is admitted on an idle queue pair: depths 2, 8, 16, 17 and windows 1 to 64") {
  Rig rig;
  // 48 extents of 16 KiB in reverse order: a 768 KiB read is 48 commands whatever the MDTS.
  const auto extents = reversed_chunks(1 << 20, 48);
  Buffer buffer(8 * 48 * 16384);
  const auto expected = expected_from_extents(rig, extents, 0, 48 * 16384);
  for (const std::uint32_t depth : {2u, 8u, 16u, 17u}) {
    for (std::uint32_t window = 1; window <= local_nvme::kMaxWindow; ++window) {
      CAPTURE(depth);
      CAPTURE(window);
      Path::Options o;
      o.queue_pairs = 1;
      o.queue_depth = depth;
      o.request_window = window;
      rig.path.reset();
      auto created = Path::create(*rig.controller, o);
      REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
      rig.path.emplace(std::move(created.value()));
      // The window adapts to what a queue pair can ever give: depth - 1 credits.
      REQUIRE(rig.path->options().request_window == std::min(window, depth - 1));
      auto t = rig.open(extents, 48 * 16384);
      auto m = rig.map(buffer);
      std::memset(buffer.data, 0xEE, buffer.size);
      auto [states, done] = rig.run({rig.request(Direction::READ, m, buffer, 0, t, 0, 48 * 16384)});
      REQUIRE_MESSAGE(states[0].is_ok(), states[0].to_string());
      REQUIRE_MESSAGE(done[0].status.is_ok(), done[0].status.to_string());
      CHECK(done[0].commands == 48);
      CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + 48 * 16384) == expected);
      CHECK(rig.path->unregister_memory(m).is_ok());
    }
  }
}

TEST_CASE("a batch larger than a shallow queue's credits completes when its rejected requests are resubmitted") {
  Rig rig;
  const auto extents = reversed_chunks(1 << 20, 48);
  const auto expected = expected_from_extents(rig, extents, 0, 48 * 16384);
  for (const std::uint32_t depth : {2u, 8u, 16u, 17u}) {
    CAPTURE(depth);
    Path::Options o;
    o.queue_pairs = 2;
    o.queue_depth = depth;
    o.request_window = 64;
    rig.path.reset();
    auto created = Path::create(*rig.controller, o);
    REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
    rig.path.emplace(std::move(created.value()));
    auto t = rig.open(extents, 48 * 16384);
    Buffer buffer(48 * 16384);
    auto m = rig.map(buffer);
    // 8 requests of 6 extents each (96 KiB): more commands than the credits of a shallow pair.
    std::vector<std::size_t> pending = {0, 1, 2, 3, 4, 5, 6, 7};
    std::size_t rejected = 0, rounds = 0;
    while (!pending.empty()) {
      REQUIRE(++rounds < 1000);  // bounded: every round admits at least one request
      std::vector<PathRequest<Path>> rs;
      for (std::size_t i : pending)
        rs.push_back(rig.request(Direction::READ, m, buffer, i * 6 * 16384, t, i * 6 * 16384, 6 * 16384));
      auto [states, done] = rig.run(rs);
      std::vector<std::size_t> again;
      for (std::size_t k = 0; k < pending.size(); ++k) {
        if (states[k].code() == StatusCode::RESOURCE_EXHAUSTED) {
          CHECK(states[k].message().find("resubmit later") != std::string::npos);
          again.push_back(pending[k]);
          ++rejected;
          continue;
        }
        REQUIRE_MESSAGE(states[k].is_ok(), states[k].to_string());
        REQUIRE_MESSAGE(done[k].status.is_ok(), done[k].status.to_string());
        CHECK(done[k].commands == 6);
      }
      REQUIRE(again.size() < pending.size());
      pending = again;
    }
    MESSAGE("depth ", depth, ": ", rejected, " rejections (backpressure) before all 8 requests ran");
    CHECK(std::vector<std::uint8_t>(buffer.bytes(), buffer.bytes() + 48 * 16384) == expected);
    CHECK(rig.path->unregister_memory(m).is_ok());
  }
}

TEST_CASE(
    "the submit kernel reads a target's change word at admission, not again in its first plan; later plans read it") {
  std::uint32_t changed = 1;
  local_nvme::CommandRecord records[1];
  const auto flush_of = [&] {
    local_nvme::RequestState r;
    r.opcode = nvme::NvmOpcode::flush;  // no extents or memory to plan
    r.target.changed = &changed;
    r.max_window = 1;
    r.records = records;
    return r;
  };
  // Changed before admission: refused, no credit asked.
  local_nvme::RequestState refused = flush_of();
  CHECK(local_nvme::admission_need(refused) == 0);
  CHECK(refused.outcome == local_nvme::RequestOutcome::rejected_target_changed);
  CHECK(refused.done);
  // Unchanged at admission, changed right after: the first plan (admitting) issues, which is what
  // the word's read in admission decided; any later plan (a poll kernel's) sees the change.
  changed = 0;
  local_nvme::RequestState admitted = flush_of();
  const std::uint32_t needed = local_nvme::admission_need(admitted);
  REQUIRE(needed == 1);
  local_nvme::admit_request(admitted, needed, true);
  changed = 1;
  local_nvme::RequestState polled = admitted;
  nvme::SubmissionQueueEntry sqes[local_nvme::kMaxWindow];
  std::uint32_t record_of[local_nvme::kMaxWindow];
  std::uint64_t planned = 0;
  CHECK(local_nvme::detail::plan_commands(admitted, sqes, record_of, planned, /*admitting=*/true) == 1);
  CHECK(admitted.outcome == local_nvme::RequestOutcome::ok);
  CHECK(local_nvme::detail::plan_commands(polled, sqes, record_of, planned) == 0);
  CHECK(polled.outcome == local_nvme::RequestOutcome::target_changed);
}

TEST_CASE(
    "change words: a fresh word reads 0, set makes it 1, a released word comes back as 0, the pool grows by "
    "chunks, and the always-changed word reads 1") {
  auto made = local_nvme::ChangeWords::create(kSecond);
  REQUIRE_MESSAGE(made.is_ok(), made.status().to_string());
  auto& words = *made.value();
  CHECK(words.chunks() == 1);  // the first chunk holds the always-changed word
  REQUIRE(words.always_changed() != nullptr);
  CHECK(*words.always_changed() == 1);
  auto first = words.acquire();
  REQUIRE(first.is_ok());
  CHECK(*first != words.always_changed());
  CHECK(**first == 0);
  REQUIRE(words.set(*first).is_ok());
  CHECK(**first == 1);
  // Recycled: the word of a closed target is handed to the next one, zeroed.
  words.release(*first);
  auto again = words.acquire();
  REQUIRE(again.is_ok());
  CHECK(*again == *first);
  CHECK(**again == 0);
  // One chunk holds kChangeWordsPerChunk words, one of them the always-changed word: as many open
  // targets again take a second chunk.
  std::vector<std::uint32_t*> held{*again};
  for (std::uint32_t i = 1; i <= local_nvme::kChangeWordsPerChunk; ++i) {
    auto w = words.acquire();
    REQUIRE(w.is_ok());
    held.push_back(*w);
  }
  CHECK(words.chunks() == 2);
  held.push_back(words.always_changed());
  std::sort(held.begin(), held.end());
  CHECK(std::adjacent_find(held.begin(), held.end()) == held.end());  // no word handed out twice
  held.erase(std::find(held.begin(), held.end(), words.always_changed()));
  for (auto* w : held) words.release(w);
  CHECK(*words.always_changed() == 1);
  CHECK_FALSE(local_nvme::ChangeWords::create(0).is_ok());
  CHECK(local_nvme::ChangeWords::create(0).status().message().find("write_timeout_ns is 0") != std::string::npos);
}

TEST_CASE(
    "a change signal raised once: its word is set, staged requests point at the always-changed word, and "
    "its word never goes back to the pool") {
  auto made = local_nvme::ChangeWords::create(kSecond);
  REQUIRE(made.is_ok());
  const auto words = made.value();
  char file[] = "/tmp/tutti-lnvme-signal-XXXXXX";
  const int fd = ::mkstemp(file);
  REQUIRE(fd >= 0);
  auto guard = local_file::ChangeGuard::create(fd, file, local_file::ChangeProtection::watch_only);
  REQUIRE_MESSAGE(guard.is_ok(), guard.status().to_string());
  auto signal = std::make_unique<local_nvme::ChangeSignal>();
  signal->words = words;
  auto acquired = words->acquire();
  REQUIRE(acquired.is_ok());
  signal->word = *acquired;
  signal->watch = guard->watch();
  std::uint32_t* const word = signal->word;
  local_nvme::DeviceTarget staged;
  staged.changed = word;
  local_file::poll_changes();
  signal->stage(staged);  // unchanged: the staged handle keeps the target's word
  CHECK(staged.changed == word);
  CHECK(*word == 0);
  REQUIRE(::pwrite(fd, "x", 1, 0) == 1);  // IN_MODIFY
  local_file::poll_changes();
  signal->stage(staged);
  CHECK(staged.changed == words->always_changed());
  CHECK(signal->state.load() == local_nvme::ChangeSignal::raised);
  CHECK(*word == 1);
  CHECK(signal->raise_if_changed());  // raised once; later calls only report it
  signal.reset();
  // Kept out of the pool: the next open target gets another word.
  auto next = words->acquire();
  REQUIRE(next.is_ok());
  CHECK(*next != word);
  CHECK(*word == 1);
  words->release(*next);
  ::close(fd);
  ::unlink(file);
}
