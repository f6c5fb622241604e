// The local_nvme DataPath with its submit and poll kernels on the GPU (CUDA profile), against the
// soft controller in accelerator_mode (BAR0 and queues in mapped pinned memory, GPU memory
// reached through map_device and a pinned bounce buffer) backed by a real file:
//   - reads of the file into GPU memory (cudaMalloc) verified byte for byte against pread, over
//     scattered extents and multi-page PRP lists (both page tables in device memory, checked
//     with cudaPointerGetAttributes);
//   - writes from GPU memory verified against the file's bytes;
//   - batches of 1 to 8192 requests, thousands of commands in flight across 64 queue pairs;
//   - SQ/CQ wrap-around on a shallow queue;
//   - command credits taken by warps: the lane-order prefix a queue pair covers, never more than exist;
//   - the poll kernel polling on %globaltimer: one launch for a batch of many waves with a
//     budget, one launch per pass without (poll_kernel_launches);
//   - an injected NVMe error (DEVICE_ERROR with its status), a lost completion (TIMEOUT after an
//     NVMe Abort, deadlines on %globaltimer; the soft controller answers the Abort, so no zombie);
//   - DEVICE memory registrations refused by a controller without accelerator_mode;
//   - a stream the caller creates (Options::stream) carrying the staged-batch copy, the submit
//     kernels and the report copies (and the poll kernels with poll_stream_per_batch false; by
//     default each batch's own stream carries them); the batch pool's backpressure
//     (RESOURCE_EXHAUSTED naming max_batches_in_flight) and 256 submits reusing one pool slot,
//     every byte verified;
//   - four threads submitting and progressing batches at once on one DataPath, their submit and
//     poll kernels running concurrently (poll streams per batch) or on one stream, byte for byte.
//   - retries: a retryable status (DNR clear) sent again by the poll kernel, at most 3 attempts;
//     DNR set or a non-retryable status fails at once;
//   - a host-compiled unit of the same program (local_nvme_host_unit.cpp) submitting through the
//     same DataPath runs the GPU kernels too (one launch definition: libtutti_cuda);
//   - the target handle cache: 12 targets through 4 L1 entries in rotating order (hit, miss and
//     eviction counters checked), pinned entries forcing a read from the L2 (mapped) copy, close;
//   - the targets' change words in device memory: set() lands beside a running kernel, which sees
//     it; a target whose file changed is refused by the kernel's admission with DATA_LOSS while
//     another target of the batch reads byte for byte; a request staged before the change and held
//     on the stream until another thread raised it is refused by its kernel.
// The soft controller emulates the device: figures from here say nothing about an SSD.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

#include <tutti/accel/memory.hpp>
#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/path/local_nvme.hpp>

#include "local_nvme_host_unit.hpp"
#include "path_rig.hpp"  // tests/support

using namespace tutti;
using Path = local_nvme::LocalNvmeDataPath;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;

/// The byte at `offset` of a backing file made by make_backing(seed).
std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t offset) {
  std::uint64_t x = (offset / 8) * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x >> (8 * (offset % 8)));
}

std::string make_backing(std::uint64_t seed, std::uint64_t bytes) {
  char name[] = "/tmp/tutti-gpu-lnvme-XXXXXX";
  const int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  std::vector<std::uint8_t> chunk(1 << 20);
  for (std::uint64_t at = 0; at < bytes; at += chunk.size()) {
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = pattern_byte(seed, at + i);
    REQUIRE(::pwrite(fd, chunk.data(), chunk.size(), static_cast<off_t>(at)) == static_cast<ssize_t>(chunk.size()));
  }
  ::close(fd);
  return name;
}

std::vector<std::uint8_t> read_file(const std::string& path, std::uint64_t at, std::uint64_t n) {
  std::vector<std::uint8_t> out(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out.data() + done, n - done, static_cast<off_t>(at + done));
    REQUIRE(got > 0);
    done += static_cast<std::uint64_t>(got);
  }
  ::close(fd);
  return out;
}

/// GPU memory of `bytes`, filled with `fill`.
struct DeviceMemory {
  explicit DeviceMemory(std::size_t bytes, std::uint8_t fill = 0xEE) : size(bytes) {
    auto b = accel::DeviceBuffer::allocate(bytes);
    REQUIRE_MESSAGE(b.is_ok(), b.status().to_string());
    buffer = std::move(b.value());
    std::vector<std::uint8_t> host(bytes, fill);
    REQUIRE(accel::copy_to_device(buffer.data(), host.data(), bytes).is_ok());
  }
  std::vector<std::uint8_t> read(std::uint64_t at, std::uint64_t n) const {
    std::vector<std::uint8_t> out(n);
    REQUIRE(accel::copy_from_device(out.data(), static_cast<const std::uint8_t*>(buffer.data()) + at, n).is_ok());
    return out;
  }
  void write(std::uint64_t at, const std::vector<std::uint8_t>& bytes) {
    REQUIRE(accel::copy_to_device(static_cast<std::uint8_t*>(buffer.data()) + at, bytes.data(), bytes.size()).is_ok());
  }
  MemoryView view() const { return MemoryView{buffer.data(), size, MemoryKind::DEVICE, 0}; }
  accel::DeviceBuffer buffer;
  std::size_t size;
};

/// A soft controller in accelerator_mode on a pattern-filled file, its driver and a Path.
struct Rig : tutti::testing::PathRig<Path> {
  explicit Rig(Path::Options options = {}, libnvm::SoftControllerConfig config = {},
               std::uint64_t backing_bytes = 64 << 20)
      : PathRig(60 * kSecond) {
    backing = make_backing(seed, backing_bytes);
    config.backing_path = backing;
    config.accelerator_mode = true;
    config.scatter_bus_pages = true;
    if (config.worker_threads == libnvm::kSoftDefaultWorkerThreads) config.worker_threads = 4;
    auto d = libnvm::SoftController::create(config);
    REQUIRE_MESSAGE(d.is_ok(), d.status().to_string());
    device = *d;
    auto c = libnvm::open_soft_controller(device);
    REQUIRE(c.is_ok());
    controller = std::move(c.value());
    libnvm::BringUpOptions bring_up;
    bring_up.io_queue_pairs_requested = static_cast<std::uint16_t>(std::max<std::uint32_t>(8, options.queue_pairs));
    REQUIRE(controller->bring_up(bring_up).is_ok());
    auto p = Path::create(*controller, options);
    REQUIRE_MESSAGE(p.is_ok(), p.status().to_string());
    path.emplace(std::move(p.value()));
  }
  ~Rig() {
    path.reset();
    controller.reset();
    device.reset();
    ::unlink(backing.c_str());
  }
  Path::open_target open(std::vector<local_file::Extent> extents, std::uint64_t size) {
    local_file::Target t;
    t.path = "gpu-synthetic";
    t.extents = std::move(extents);
    t.file_size = size;
    t.lba_size = controller->identity().lba_size;
    t.nsid = controller->identity().nsid;
    return open_or_fail(std::move(t));
  }
  /// The file's bytes [offset, offset + n) through `extents`.
  std::vector<std::uint8_t> expected(const std::vector<local_file::Extent>& extents, std::uint64_t offset,
                                     std::uint64_t n) {
    std::vector<std::uint8_t> out;
    out.reserve(n);
    while (n > 0) {
      const local_file::Extent* e = nullptr;
      for (const auto& x : extents)
        if (offset >= x.file_offset && offset < x.file_offset + x.length) e = &x;
      REQUIRE(e != nullptr);
      const std::uint64_t take = std::min(n, e->file_offset + e->length - offset);
      auto bytes = read_file(backing, e->device_offset + (offset - e->file_offset), take);
      out.insert(out.end(), bytes.begin(), bytes.end());
      offset += take;
      n -= take;
    }
    return out;
  }

  std::uint64_t seed = 0x5eed;
  std::string backing;
  std::shared_ptr<libnvm::SoftController> device;
  std::unique_ptr<libnvm::Controller> controller;
};

/// `blocks` file blocks scattered over the namespace in reverse order, `run` blocks per extent.
std::vector<local_file::Extent> reversed_extents(std::uint64_t blocks, std::uint64_t run) {
  std::vector<local_file::Extent> out;
  for (std::uint64_t b = 0; b < blocks; b += run)
    out.push_back({b * 4096, (blocks - b - run) * 4096 + (1 << 20), run * 4096});
  return out;
}

/// One queue pair of depth 8 (7 commands in flight, 7 credits), request window 4, over a 4 MiB
/// file whose every block is its own extent (reversed_extents(1024, 1)), read into 4 MiB of GPU memory.
struct ShallowRig {
  static Path::Options options() {
    Path::Options o;
    o.queue_pairs = 1;
    o.queue_depth = 8;
    o.request_window = 4;
    return o;
  }
  Rig rig{options()};
  std::vector<local_file::Extent> extents = reversed_extents(1024, 1);
  Path::open_target target = rig.open(extents, 1024 * 4096);
  DeviceMemory memory{1024 * 4096};
  Path::registered_memory registration = rig.map(memory);
};

void check_all_ok(const std::vector<Status>& states, const std::vector<RequestCompletion>& completions,
                  const std::vector<std::uint64_t>& lengths) {
  for (std::size_t i = 0; i < states.size(); ++i) {
    REQUIRE_MESSAGE(states[i].is_ok(), "request ", i, ": ", states[i].to_string());
    REQUIRE_MESSAGE(completions[i].status.is_ok(), "request ", i, ": ", completions[i].status.to_string());
    REQUIRE(completions[i].confirmed_bytes == lengths[i]);
  }
}

}  // namespace

TEST_CASE("reads of a real file over scattered extents land in GPU memory byte for byte") {
  Path::Options o;
  o.queue_pairs = 4;
  Rig rig(o);
  const std::uint64_t blocks = 2048;  // 8 MiB file, extents of 16 blocks in reverse order
  const auto extents = reversed_extents(blocks, 16);
  auto target = rig.open(extents, blocks * 4096);
  DeviceMemory memory(blocks * 4096 + 8192);
  auto registration = rig.map(memory);
  // Both page tables the kernels read per command are in device memory (no PCIe read per lookup).
  const local_nvme::PrpTable* table = registration.prp_table();
  REQUIRE(table != nullptr);
  for (const void* page_table :
       {static_cast<const void*>(table->pages.bus_addresses), static_cast<const void*>(table->lists.bus_addresses)}) {
    cudaPointerAttributes attributes{};
    REQUIRE(cudaPointerGetAttributes(&attributes, page_table) == cudaSuccess);
    CHECK(attributes.type == cudaMemoryTypeDevice);
  }
  CHECK(table->pages.page_count == (blocks * 4096 + 8192) / 4096);
  CHECK(table->lists.page_count == 2 * table->list_pages);
  // Lengths from one block to 2 MiB (PRP lists of both variants, MDTS splits), one per request,
  // at scattered file offsets and at memory offsets that are not page aligned (dword aligned).
  struct Piece {
    std::uint64_t file_offset, length, memory_offset;
  };
  const std::vector<Piece> pieces = {{0, 4096, 0},
                                     {4096, 8192, 4096 * 3 + 4},
                                     {65536, 65536 * 3, 300 * 4096},
                                     {1 << 20, 2 << 20, 1 << 22},
                                     {7 << 20, 1 << 20, 7 << 20}};
  std::vector<PathRequest<Path>> requests;
  std::vector<std::uint64_t> lengths;
  for (const auto& p : pieces) {
    requests.push_back(
        rig.request(Direction::READ, registration, memory, p.memory_offset, target, p.file_offset, p.length));
    lengths.push_back(p.length);
  }
  auto [states, completions] = rig.run(requests);
  check_all_ok(states, completions, lengths);
  for (const auto& p : pieces) {
    INFO("file offset ", p.file_offset, " length ", p.length);
    CHECK(memory.read(p.memory_offset, p.length) == rig.expected(extents, p.file_offset, p.length));
  }
  const auto counters = rig.device->counters();
  CHECK(counters.device_bytes_read >= (4096 + 8192 + 65536 * 3 + (2 << 20) + (1 << 20)));
  CHECK(rig.path->unregister_memory(registration).is_ok());
}

TEST_CASE("the cuda profile's poll kernel budget defaults to 1 ms") {
  CHECK(Path::Options{}.poll_kernel_budget_ns == 1'000'000u);
  CHECK(Path::Options::kDefaultPollKernelBudgetNs == 1'000'000u);
}

TEST_CASE(
    "the poll kernel polls on the GPU: one launch for a batch of many waves with a budget, one per pass without") {
  // 96 requests (3 warps) of 8 commands of 4 KiB each with a window of 2: at least 4 passes per
  // request. With a 1 s budget the warps poll on %globaltimer until done: ONE launch. With budget
  // 0 every pass is a launch: at least 4 (3 more than one, as every request needs 4 passes).
  const std::uint64_t requests_per_batch = 96, bytes_per_request = 8 * 4096;
  for (const std::uint64_t budget : {std::uint64_t{0}, Path::Options::kMaxPollKernelBudgetNs}) {
    CAPTURE(budget);
    Path::Options o;
    o.queue_pairs = 4;
    o.request_window = 2;
    o.max_command_bytes = 4096;
    o.poll_kernel_budget_ns = budget;
    Rig rig(o);
    const auto extents = reversed_extents(1024, 16);
    auto target = rig.open(extents, 1024 * 4096);
    DeviceMemory memory(requests_per_batch * bytes_per_request);
    auto registration = rig.map(memory);
    std::vector<PathRequest<Path>> requests;
    std::vector<std::uint64_t> lengths(requests_per_batch, bytes_per_request);
    for (std::uint64_t i = 0; i < requests_per_batch; ++i)
      requests.push_back(rig.request(Direction::READ, registration, memory, i * bytes_per_request, target,
                                     (i * 37 % 128) * bytes_per_request, bytes_per_request));
    const std::uint64_t before = rig.path->poll_kernel_launches();
    auto [states, completions] = rig.run(requests);
    check_all_ok(states, completions, lengths);
    for (std::uint64_t i = 0; i < requests_per_batch; ++i) {
      CHECK(completions[i].commands == 8);
      CHECK(memory.read(i * bytes_per_request, bytes_per_request) ==
            rig.expected(extents, (i * 37 % 128) * bytes_per_request, bytes_per_request));
    }
    const std::uint64_t launches = rig.path->poll_kernel_launches() - before;
    if (budget == 0) {
      CHECK(launches >= 4);
    } else {
      CHECK(launches == 1);
    }
    CHECK(rig.path->unregister_memory(registration).is_ok());
  }
}

TEST_CASE("the persistent poller's settings are checked, naming the field and the range") {
  Rig rig;
  auto& controller = *rig.controller;
  Path::Options o;
  o.persistent_poller_warps = Path::Options::kMaxPersistentPollerWarps + 1;
  CHECK(Path::create(controller, o).status().message().find("persistent_poller_warps = 1025 outside 0..1024") !=
        std::string::npos);
  o = {};
  o.persistent_poller_warps = 1;
  o.persistent_poller_lifetime_ns = 0;
  CHECK(Path::create(controller, o).status().message().find("persistent_poller_lifetime_ns = 0 outside 1..") !=
        std::string::npos);
  o.persistent_poller_lifetime_ns = 1'000'000;
  o.persistent_poller_idle_ns = 1'000'001;
  CHECK(Path::create(controller, o).status().message().find("persistent_poller_idle_ns = 1000001 outside 1..1000000") !=
        std::string::npos);
}

TEST_CASE("the persistent poller polls the soft controller's queues: every batch posted, no poll kernel, bytes right") {
  // The same 96 requests of 8 commands as above (3 warps' chunks over 4 poller warps), twice: the
  // batch is handed to the poller at submit and progress only reads its released word.
  const std::uint64_t requests_per_batch = 96, bytes_per_request = 8 * 4096;
  Path::Options o;
  o.queue_pairs = 4;
  o.request_window = 2;
  o.max_command_bytes = 4096;
  o.persistent_poller_warps = 4;
  Rig rig(o);
  const auto extents = reversed_extents(1024, 16);
  auto target = rig.open(extents, 1024 * 4096);
  DeviceMemory memory(requests_per_batch * bytes_per_request);
  auto registration = rig.map(memory);
  for (std::uint64_t round = 0; round < 2; ++round) {
    std::vector<PathRequest<Path>> requests;
    std::vector<std::uint64_t> lengths(requests_per_batch, bytes_per_request);
    for (std::uint64_t i = 0; i < requests_per_batch; ++i)
      requests.push_back(rig.request(Direction::READ, registration, memory, i * bytes_per_request, target,
                                     ((i * 37 + round) % 128) * bytes_per_request, bytes_per_request));
    auto [states, completions] = rig.run(requests);
    check_all_ok(states, completions, lengths);
    for (std::uint64_t i = 0; i < requests_per_batch; ++i)
      CHECK(memory.read(i * bytes_per_request, bytes_per_request) ==
            rig.expected(extents, ((i * 37 + round) % 128) * bytes_per_request, bytes_per_request));
  }
  CHECK(rig.path->batches_posted_to_poller() == 2);
  CHECK(rig.path->poll_kernel_launches() == 0);
  CHECK(rig.path->persistent_poller_launches() >= 1);
  CHECK(rig.path->unregister_memory(registration).is_ok());
}

TEST_CASE("writes from GPU memory reach the file byte for byte") {
  Rig rig;
  const auto extents = reversed_extents(512, 8);
  auto target = rig.open(extents, 512 * 4096);
  DeviceMemory memory(512 * 4096);
  std::vector<std::uint8_t> data(512 * 4096);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7 + i / 4096);
  memory.write(0, data);
  auto registration = rig.map(memory);
  std::vector<PathRequest<Path>> requests;
  std::vector<std::uint64_t> lengths;
  for (std::uint64_t at = 0; at < data.size(); at += 64 * 4096) {
    requests.push_back(rig.request(Direction::WRITE, registration, memory, at, target, at, 64 * 4096));
    lengths.push_back(64 * 4096);
  }
  auto [states, completions] = rig.run(requests);
  check_all_ok(states, completions, lengths);
  CHECK(rig.expected(extents, 0, data.size()) == data);
  CHECK(rig.device->counters().device_bytes_written == data.size());
}

TEST_CASE("batches of 1 to 8192 requests across 64 queue pairs complete and land byte for byte") {
  Path::Options o;
  o.queue_pairs = 64;
  o.queue_depth = 256;  // 64 x 255 credits: 8192 single-command requests fit at once
  o.threads_per_block = 128;
  libnvm::SoftControllerConfig config;
  config.worker_threads = 8;
  Rig rig(o, config, 64 << 20);
  const std::uint64_t blocks = 8192;  // 32 MiB file, one extent
  const std::vector<local_file::Extent> extents{{0, 0, blocks * 4096}};
  auto target = rig.open(extents, blocks * 4096);
  DeviceMemory memory(blocks * 4096);
  auto registration = rig.map(memory);
  const auto file = rig.expected(extents, 0, blocks * 4096);
  for (const std::uint64_t n : {1ull, 7ull, 32ull, 1000ull, 8192ull}) {
    INFO("batch of ", n);
    std::vector<PathRequest<Path>> requests;
    std::vector<std::uint64_t> lengths(n, 4096);
    // Request i reads file block (i * 3) % blocks into memory block i: a permutation when n <= blocks.
    for (std::uint64_t i = 0; i < n; ++i)
      requests.push_back(
          rig.request(Direction::READ, registration, memory, i * 4096, target, (i * 3 % blocks) * 4096, 4096));
    auto [states, completions] = rig.run(requests);
    check_all_ok(states, completions, lengths);
    const auto landed = memory.read(0, n * 4096);
    std::uint64_t wrong = 0;
    for (std::uint64_t i = 0; i < n; ++i)
      if (std::memcmp(landed.data() + i * 4096, file.data() + (i * 3 % blocks) * 4096, 4096) != 0) ++wrong;
    CHECK(wrong == 0);
  }
  std::uint64_t reaped = 0;
  for (std::size_t q = 0; q < 64; ++q) reaped += rig.path->queue_statistics(q).completions_reaped;
  CHECK(reaped == 1 + 7 + 32 + 1000 + 8192);
  CHECK(rig.path->queue_statistics(63).completions_reaped > 0);  // every queue pair carried commands
}

TEST_CASE_FIXTURE(ShallowRig, "a shallow queue pair wraps its SQ and CQ many times") {
  // 16 KiB requests of 4 one-block extents each: 4 commands per request, window 4; one request
  // per batch (a second would exceed the 7 credits), 64 batches: 256 commands, 32 passes of the
  // 8-entry rings.
  for (std::uint64_t k = 0; k < 64; ++k) {
    auto [states, completions] =
        rig.run({rig.request(Direction::READ, registration, memory, k * 16384, target, k * 16384, 16384)});
    check_all_ok(states, completions, {16384});
    REQUIRE(completions[0].commands == 4);
  }
  CHECK(memory.read(0, 64 * 16384) == rig.expected(extents, 0, 64 * 16384));
  const auto stats = rig.path->queue_statistics(0);
  CHECK(stats.completions_reaped == 256);
  CHECK(stats.stale_completions == 0);
  CHECK(stats.invalid_completions == 0);
}

TEST_CASE_FIXTURE(
    ShallowRig, "credits on the GPU: a warp takes the lane-order prefix its queue pair covers, warps never over-take") {
  std::vector<RequestCompletion> completions;
  const auto submit = [&](std::uint64_t requests, std::uint64_t bytes, std::vector<Status>& states) {
    std::vector<PathRequest<Path>> rs;
    for (std::uint64_t i = 0; i < requests; ++i)
      rs.push_back(rig.request(Direction::READ, registration, memory, i * bytes, target, i * bytes, bytes));
    states.assign(requests, Status{});
    completions.assign(requests, RequestCompletion{});
    const auto reads_before = rig.device->counters().read_commands;
    auto b = rig.path->submit(rs, states);
    REQUIRE(rig.path->progress(b, completions, 60 * kSecond).is_ok());
    return rig.device->counters().read_commands - reads_before;
  };
  SUBCASE("one warp, 8 requests of 2 commands each against 7 credits: lanes 0 to 2 run, the rest are refused") {
    // The group's CAS takes the prefix 0..2 (6 credits); lane 3's 2 do not fit the 1 left: it and
    // every later lane are refused (first come, first served within the warp).
    std::vector<Status> states;
    CHECK(submit(8, 8192, states) == 6);
    for (std::uint64_t i = 0; i < 8; ++i) {
      INFO("request ", i);
      if (i < 3) {
        CHECK(states[i].is_ok());
        CHECK(completions[i].confirmed_bytes == 8192);
      } else {
        CHECK(states[i].code() == StatusCode::RESOURCE_EXHAUSTED);
      }
    }
    CHECK(memory.read(0, 3 * 8192) == rig.expected(extents, 0, 3 * 8192));
  }
  SUBCASE("eight warps of single-command requests against 7 credits: exactly 7 run") {
    // The warps' CASes on the one credit word race: one takes 7, the others find 0. No credit is
    // lost to the race and none is granted twice.
    std::vector<Status> states;
    const auto reads = submit(256, 4096, states);
    std::uint64_t accepted = 0;
    for (std::uint64_t i = 0; i < 256; ++i) {
      if (states[i].is_ok()) {
        ++accepted;
        CHECK(completions[i].confirmed_bytes == 4096);
        CHECK(memory.read(i * 4096, 4096) == rig.expected(extents, i * 4096, 4096));
      } else {
        CHECK(states[i].code() == StatusCode::RESOURCE_EXHAUSTED);
      }
    }
    CHECK(accepted == 7);
    CHECK(reads == accepted);
  }
  // Whatever ran above, all 7 credits came back: 7 single-command requests in one warp all run.
  std::vector<Status> states;
  CHECK(submit(7, 4096, states) == 7);
  for (const Status& s : states) CHECK(s.is_ok());
  CHECK(memory.read(0, 7 * 4096) == rig.expected(extents, 0, 7 * 4096));
}

TEST_CASE("an injected NVMe error becomes DEVICE_ERROR with its status; the other requests succeed") {
  Rig rig;
  const std::vector<local_file::Extent> extents{{0, 0, 256 * 4096}};
  auto target = rig.open(extents, 256 * 4096);
  DeviceMemory memory(256 * 4096);
  auto registration = rig.map(memory);
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::complete_with_status;
  rule.lba_range_only = true;
  rule.first_lba = 100;
  rule.last_lba = 100;
  rig.device->inject_fault(rule);
  std::vector<PathRequest<Path>> requests;
  for (std::uint64_t i = 0; i < 4; ++i)
    requests.push_back(
        rig.request(Direction::READ, registration, memory, i * 64 * 4096, target, i * 64 * 4096, 64 * 4096));
  auto [states, completions] = rig.run(requests);
  for (auto& s : states) REQUIRE(s.is_ok());
  CHECK(completions[0].status.is_ok());
  CHECK(completions[1].status.code() == StatusCode::DEVICE_ERROR);  // LBA 100 is in request 1
  CHECK(completions[1].device_status == (2u << 8 | 0x81u));         // Unrecovered Read Error
  CHECK(completions[2].status.is_ok());
  CHECK(completions[3].status.is_ok());
  CHECK(memory.read(0, 64 * 4096) == rig.expected(extents, 0, 64 * 4096));
}

TEST_CASE(
    "a retryable NVMe status is sent again by the GPU kernels, at most 3 times; DNR or a non-retryable status fails") {
  // The command covering LBA 100 (request 1) gets the injected status on its first `fires`
  // attempts (0: every attempt); nvme::classify decides in the poll kernel, on the GPU.
  struct Case {
    const char* what;
    nvme::StatusField status;
    std::uint64_t fires;
    bool succeeds;
    std::uint32_t retries;
  };
  const Case cases[] = {
      {"Namespace Not Ready twice, DNR clear: the third attempt succeeds",
       nvme::make_status(nvme::GenericStatus::namespace_not_ready, false), 2, true, 2},
      {"Namespace Not Ready on every attempt: fails after 3 attempts",
       nvme::make_status(nvme::GenericStatus::namespace_not_ready, false), 0, false, 2},
      {"Namespace Not Ready with DNR set: fails at once",
       nvme::make_status(nvme::GenericStatus::namespace_not_ready, true), 0, false, 0},
      {"Unrecovered Read Error, DNR clear (not transient): fails at once",
       nvme::make_status(nvme::MediaStatus::unrecovered_read_error, false), 0, false, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Rig rig;
    const std::vector<local_file::Extent> extents{{0, 0, 256 * 4096}};
    auto target = rig.open(extents, 256 * 4096);
    DeviceMemory memory(256 * 4096);
    auto registration = rig.map(memory);
    libnvm::SoftFaultRule rule;
    rule.action = libnvm::SoftFaultRule::Action::complete_with_status;
    rule.status = c.status;
    rule.lba_range_only = true;
    rule.first_lba = 100;
    rule.last_lba = 100;
    rule.max_fires = c.fires;
    rig.device->inject_fault(rule);
    std::vector<PathRequest<Path>> requests;
    for (std::uint64_t i = 0; i < 4; ++i)
      requests.push_back(
          rig.request(Direction::READ, registration, memory, i * 64 * 4096, target, i * 64 * 4096, 64 * 4096));
    auto [states, completions] = rig.run(requests);
    for (auto& s : states) REQUIRE(s.is_ok());
    CHECK(completions[1].retries == c.retries);
    CHECK(rig.path->commands_retried() == c.retries);
    // Every failed attempt got the injected status: all of them when it fails, all but the last when it succeeds.
    CHECK(rig.device->counters().injected_faults == (c.succeeds ? c.retries : c.retries + 1u));
    if (c.succeeds) {
      CHECK_MESSAGE(completions[1].status.is_ok(), completions[1].status.to_string());
      CHECK(completions[1].confirmed_bytes == 64u * 4096);
    } else {
      CHECK(completions[1].status.code() == StatusCode::DEVICE_ERROR);
      CHECK(completions[1].device_status ==
            (static_cast<std::uint32_t>(c.status.status_code_type()) << 8 | c.status.status_code()));
    }
    for (std::size_t i : {0u, 2u, 3u}) {
      CHECK(completions[i].status.is_ok());
      CHECK(completions[i].retries == 0);
    }
    const std::uint64_t verified = c.succeeds ? 4 * 64 * 4096 : 64 * 4096;
    CHECK(memory.read(0, verified) == rig.expected(extents, 0, verified));
    CHECK(rig.path->unregister_memory(registration).is_ok());
  }
}

TEST_CASE("host-compiled and nvcc-compiled users of local_nvme in one program both run the GPU kernels") {
  // local_nvme_host_unit.cpp is compiled by the host compiler and linked into this program. Before
  // libtutti_cuda, its copy of the launch returned UNSUPPORTED and its synchronize returned OK, and
  // the linker could pick either copy for this file's calls too (an ODR violation). Now both call
  // the one launch compiled in libtutti_cuda.
  MESSAGE("host-compiled unit built by ", tutti::gpu_test::host_unit_compiler());
  Path::Options o;
  o.queue_pairs = 4;
  Rig rig(o);
  const auto extents = reversed_extents(1024, 8);
  auto target = rig.open(extents, 1024 * 4096);
  DeviceMemory memory(1024 * 4096);
  auto registration = rig.map(memory);
  // First half from the host-compiled unit, second half from here, into the same GPU memory.
  const std::uint64_t half = 512 * 4096;
  const std::uint64_t launches = rig.path->poll_kernel_launches();
  std::vector<RequestCompletion> from_host;
  const Status host_status = tutti::gpu_test::read_from_host_compiled_unit(*rig.path, target, registration,
                                                                           memory.view(), 0, half, 64, from_host);
  REQUIRE_MESSAGE(host_status.is_ok(), host_status.to_string());
  REQUIRE(from_host.size() == 64);
  for (const RequestCompletion& c : from_host) {
    CHECK_MESSAGE(c.status.is_ok(), c.status.to_string());
    CHECK(c.confirmed_bytes == half / 64);
  }
  CHECK(rig.path->poll_kernel_launches() > launches);  // the .cpp's progress launched GPU poll kernels
  std::vector<PathRequest<Path>> requests;
  std::vector<std::uint64_t> lengths;
  for (std::uint64_t i = 0; i < 64; ++i) {
    requests.push_back(rig.request(Direction::READ, registration, memory, half + i * (half / 64), target,
                                   half + i * (half / 64), half / 64));
    lengths.push_back(half / 64);
  }
  auto [states, completions] = rig.run(requests);
  check_all_ok(states, completions, lengths);
  CHECK(memory.read(0, 2 * half) == rig.expected(extents, 0, 2 * half));
  CHECK(rig.path->unregister_memory(registration).is_ok());
}

TEST_CASE("a lost completion times out on the GPU clock, is aborted, and the request reports TIMEOUT") {
  Path::Options o;
  o.command_timeout_ns = 200'000'000;  // 200 ms
  o.abort_timeout_ns = 200'000'000;
  Rig rig(o);
  const std::vector<local_file::Extent> extents{{0, 0, 64 * 4096}};
  auto target = rig.open(extents, 64 * 4096);
  DeviceMemory memory(64 * 4096);
  auto registration = rig.map(memory);
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::lose_completion;
  rule.lba_range_only = true;  // only request 0's block
  rule.first_lba = 0;
  rule.last_lba = 0;
  rig.device->inject_fault(rule);
  const auto started = accel::timer_ns();
  auto [states, completions] = rig.run({rig.request(Direction::READ, registration, memory, 0, target, 0, 4096),
                                        rig.request(Direction::READ, registration, memory, 4096, target, 4096, 4096)});
  const auto elapsed = accel::timer_ns() - started;
  REQUIRE(states[0].is_ok());
  CHECK(completions[0].status.code() == StatusCode::TIMEOUT);
  CHECK(completions[1].status.is_ok());
  CHECK(rig.path->aborts_sent() >= 1);
  CHECK(elapsed >= 200'000'000);
  CHECK(elapsed < 20 * kSecond);
  // The soft controller answers Abort for a held command (Command Abort Requested), so no zombie
  // remains and the memory can go.
  CHECK(rig.path->zombie_commands() == 0);
  CHECK(rig.path->unregister_memory(registration).is_ok());
}

TEST_CASE("DEVICE memory needs a controller that can map it: UNSUPPORTED without accelerator_mode") {
  const std::string backing = make_backing(1, 4 << 20);
  libnvm::SoftControllerConfig config;
  config.backing_path = backing;
  auto d = libnvm::SoftController::create(config);
  REQUIRE(d.is_ok());
  auto c = libnvm::open_soft_controller(*d);
  REQUIRE(c.is_ok());
  REQUIRE(c.value()->bring_up({}).is_ok());
  {
    auto p = Path::create(*c.value(), {});
    REQUIRE(p.is_ok());
    DeviceMemory memory(1 << 20);
    auto r = p.value().register_memory(memory.view());
    CHECK(r.status().code() == StatusCode::UNSUPPORTED);
    CHECK(r.status().message().find("dma_map_device") != std::string::npos);
  }
  ::unlink(backing.c_str());
}

TEST_CASE(
    "the caller's stream carries the batch copies and kernels; the batch pool bounds live batches and is reused") {
  bool per_batch = true;
  SUBCASE("poll kernels on each batch's own stream (the default)") {}
  SUBCASE("poll kernels on the caller's stream too") { per_batch = false; }
  // A stream the caller owns (non-blocking: no implicit ordering with the legacy default stream).
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    Path::Options o;
    o.queue_pairs = 4;
    o.stream = accel::StreamRef::from_cuda(stream);
    o.poll_stream_per_batch = per_batch;
    o.max_batches_in_flight = 2;
    Rig rig(o);
    const std::uint64_t blocks = 1024;  // 4 MiB file, extents of 8 blocks in reverse order
    const auto extents = reversed_extents(blocks, 8);
    auto target = rig.open(extents, blocks * 4096);
    DeviceMemory memory(blocks * 4096);
    auto registration = rig.map(memory);
    // Batch k reads blocks [k * 64, k * 64 + 64) as 64 single-block requests into the same place in memory.
    auto make = [&](std::uint64_t k) {
      std::vector<PathRequest<Path>> rs;
      for (std::uint64_t i = 0; i < 64; ++i) {
        const std::uint64_t at = ((k * 64 + i) % blocks) * 4096;
        rs.push_back(rig.request(Direction::READ, registration, memory, at, target, at, 4096));
      }
      return rs;
    };
    auto r1 = make(0), r2 = make(1), r3 = make(2);
    std::vector<Status> s1(64), s2(64), s3(64);
    std::optional<Path::batch> b1(rig.path->submit(r1, s1));
    auto b2 = rig.path->submit(r2, s2);
    for (std::size_t i = 0; i < 64; ++i) {
      REQUIRE_MESSAGE(s1[i].is_ok(), s1[i].to_string());
      REQUIRE_MESSAGE(s2[i].is_ok(), s2[i].to_string());
    }
    CHECK(rig.path->batches_in_flight() == 2);
    // A third live batch exceeds the pool: every request is rejected at once, naming the limit and
    // the option; nothing of it reaches the controller.
    const auto reads_before = rig.device->counters().read_commands;
    auto b3 = rig.path->submit(r3, s3);
    for (const Status& s : s3) {
      CHECK(s.code() == StatusCode::RESOURCE_EXHAUSTED);
      CHECK(s.message().find("max_batches_in_flight = 2") != std::string::npos);
    }
    std::vector<RequestCompletion> c1(64), c2(64), c3(64);
    CHECK(rig.path->progress(b3, c3, kSecond).is_ok());
    REQUIRE(rig.path->progress(*b1, c1, 60 * kSecond).is_ok());
    REQUIRE(rig.path->progress(b2, c2, 60 * kSecond).is_ok());
    const std::vector<std::uint64_t> lengths(64, 4096);
    check_all_ok(s1, c1, lengths);
    check_all_ok(s2, c2, lengths);
    CHECK(rig.device->counters().read_commands - reads_before <= 128);  // at most b1's and b2's
    CHECK(memory.read(0, 128 * 4096) == rig.expected(extents, 0, 128 * 4096));
    b1.reset();  // its slot goes back to the pool
    CHECK(rig.path->batches_in_flight() == 1);
    // Many submits through the one free slot: every byte of the file lands, no slot is added.
    for (std::uint64_t k = 0; k < 256; ++k) {
      auto rs = make(k);
      std::vector<Status> states(64);
      auto b = rig.path->submit(rs, states);
      std::vector<RequestCompletion> completions(64);
      REQUIRE(rig.path->progress(b, completions, 60 * kSecond).is_ok());
      check_all_ok(states, completions, lengths);
    }
    CHECK(rig.path->batch_slots_allocated() == 2);
    CHECK(memory.read(0, blocks * 4096) == rig.expected(extents, 0, blocks * 4096));
    CHECK(cudaStreamQuery(stream) == cudaSuccess);  // nothing left on the caller's stream
    CHECK(rig.path->unregister_memory(registration).is_ok());
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("four threads submit and progress batches at once on one DataPath, byte for byte") {
  for (const bool per_batch : {true, false}) {
    CAPTURE(per_batch);
    Path::Options o;
    o.queue_pairs = 8;
    o.poll_stream_per_batch = per_batch;
    Rig rig(o);
    const std::uint64_t blocks = 1024;  // 4 MiB file, extents of 8 blocks in reverse order
    const auto extents = reversed_extents(blocks, 8);
    auto target = rig.open(extents, blocks * 4096);
    constexpr std::uint64_t kThreads = 4, kBatches = 16, kPerBatch = 64;  // each thread reads the whole file
    DeviceMemory memory(kThreads * blocks * 4096);
    auto registration = rig.map(memory);
    // doctest's checks are not thread-safe: the threads count what went wrong, checked after.
    std::atomic<std::uint64_t> failures{0};
    std::vector<std::thread> threads;
    for (std::uint64_t t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (std::uint64_t k = 0; k < kBatches; ++k) {
          std::vector<PathRequest<Path>> rs;
          for (std::uint64_t i = 0; i < kPerBatch; ++i) {
            const std::uint64_t at = (k * kPerBatch + i) * 4096;
            rs.push_back(rig.request(Direction::READ, registration, memory, t * blocks * 4096 + at, target, at, 4096));
          }
          std::vector<Status> states(kPerBatch);
          auto b = rig.path->submit(rs, states);
          std::vector<RequestCompletion> done(kPerBatch);
          if (!rig.path->progress(b, done, 60 * kSecond).is_ok()) {
            failures.fetch_add(1);
            continue;
          }
          for (std::uint64_t i = 0; i < kPerBatch; ++i)
            if (!states[i].is_ok() || !done[i].status.is_ok() || done[i].confirmed_bytes != 4096) failures.fetch_add(1);
        }
      });
    for (std::thread& th : threads) th.join();
    CHECK(failures.load() == 0);
    for (std::uint64_t t = 0; t < kThreads; ++t)
      CHECK(memory.read(t * blocks * 4096, blocks * 4096) == rig.expected(extents, 0, blocks * 4096));
    CHECK(rig.path->unregister_memory(registration).is_ok());
  }
}

TEST_CASE("the target handle cache: more targets than L1 holds, read in rotating order on the GPU, byte for byte") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    Path::Options o;
    o.queue_pairs = 4;
    o.stream = accel::StreamRef::from_cuda(stream);
    o.device_target_cache_entries = 4;
    Rig rig(o);
    // 12 targets of 64 blocks (256 KiB), each 16 extents of 4 blocks in reverse order at its own
    // place on the namespace, so a handle resolved against the wrong extents reads wrong bytes.
    constexpr std::size_t kTargets = 12;
    constexpr std::uint64_t kBlocks = 64, kRun = 4, kBytes = kBlocks * 4096;
    std::vector<std::vector<local_file::Extent>> extents(kTargets);
    std::vector<Path::open_target> targets;
    for (std::size_t k = 0; k < kTargets; ++k) {
      for (std::uint64_t b = 0; b < kBlocks; b += kRun)
        extents[k].push_back({b * 4096, (k + 1) * (2 << 20) + k * 4096 + (kBlocks - b - kRun) * 4096, kRun * 4096});
      targets.push_back(rig.open(extents[k], kBytes));
    }
    CHECK(rig.path->target_cache_statistics().host_bytes == kTargets * 16 * sizeof(local_file::Extent));
    DeviceMemory memory(kTargets * kBytes);
    auto registration = rig.map(memory);
    // One batch reads target k whole, as 16 requests of 16 KiB (one lookup per distinct target).
    auto read_target = [&](std::size_t k) {
      std::vector<PathRequest<Path>> rs;
      for (std::uint64_t i = 0; i < 16; ++i)
        rs.push_back(
            rig.request(Direction::READ, registration, memory, k * kBytes + i * 16384, targets[k], i * 16384, 16384));
      auto [states, completions] = rig.run(rs);
      check_all_ok(states, completions, std::vector<std::uint64_t>(16, 16384));
    };
    auto check_bytes = [&](std::size_t k) {
      INFO("target ", k);
      CHECK(memory.read(k * kBytes, kBytes) == rig.expected(extents[k], 0, kBytes));
    };
    // Rotating order over 12 targets through 4 LRU entries: every lookup misses; after the first
    // 4, every miss evicts the least recently used entry.
    for (int round = 0; round < 3; ++round) {
      for (std::size_t k = 0; k < kTargets; ++k) {
        std::vector<std::uint8_t> fill(kBytes, static_cast<std::uint8_t>(0x11 * (round + 1)));
        memory.write(k * kBytes, fill);  // stale bytes from the last round cannot pass
        read_target(k);
        check_bytes(k);
      }
    }
    auto s = rig.path->target_cache_statistics();
    CHECK(s.hits == 0);
    CHECK(s.misses == 3 * kTargets);
    CHECK(s.evictions == 3 * kTargets - 4);
    CHECK(s.fallbacks == 0);
    CHECK(s.resident == 4);
    CHECK(s.pinned == 0);
    // The last four are resident: reading them again (most recent first) hits, bytes still right.
    for (std::size_t k : {11, 10, 9, 8}) {
      memory.write(k * kBytes, std::vector<std::uint8_t>(kBytes, 0x77));
      read_target(k);
      check_bytes(k);
    }
    s = rig.path->target_cache_statistics();
    CHECK(s.hits == 4);
    CHECK(s.misses == 3 * kTargets);
    // A live batch pins all four entries: a fifth target cannot evict them and is read from its L2
    // (mapped pinned host) copy by the GPU, byte for byte.
    std::vector<PathRequest<Path>> pinning;
    for (std::size_t k : {8, 9, 10, 11})
      pinning.push_back(rig.request(Direction::READ, registration, memory, k * kBytes, targets[k], 0, 4096));
    std::vector<Status> pin_states(pinning.size());
    std::optional<Path::batch> live(rig.path->submit(pinning, pin_states));
    std::vector<RequestCompletion> pin_completions(pinning.size());
    REQUIRE(rig.path->progress(*live, pin_completions, 60 * kSecond).is_ok());
    check_all_ok(pin_states, pin_completions, std::vector<std::uint64_t>(pinning.size(), 4096));
    CHECK(rig.path->target_cache_statistics().pinned == 4);
    memory.write(0, std::vector<std::uint8_t>(kBytes, 0x55));
    read_target(0);
    check_bytes(0);
    s = rig.path->target_cache_statistics();
    CHECK(s.hits == 8);
    CHECK(s.misses == 3 * kTargets + 1);
    CHECK(s.evictions == 3 * kTargets - 4);
    CHECK(s.fallbacks == 1);
    live.reset();
    CHECK(rig.path->target_cache_statistics().pinned == 0);
    // Close of a resident target drops its entry; its L2 room returns.
    CHECK(rig.path->close(targets[11]).is_ok());
    s = rig.path->target_cache_statistics();
    CHECK(s.resident == 3);
    CHECK(s.host_bytes == (kTargets - 1) * 16 * sizeof(local_file::Extent));
    CHECK(cudaStreamQuery(stream) == cudaSuccess);
    CHECK(rig.path->unregister_memory(registration).is_ok());
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

/// Writes 1 to started[0], then spins until *word reads nonzero or `budget_ns` passes on
/// %globaltimer, and writes what it read last, plus 1, to started[1] (mapped host memory).
static __global__ void wait_for_change_word(std::uint32_t* word, std::uint64_t budget_ns, std::uint32_t* started) {
  accel::SystemAtomicRef<std::uint32_t>(started[0]).store(1, accel::MemoryOrder::release);
  const std::uint64_t deadline = accel::timer_ns() + budget_ns;
  std::uint32_t seen = 0;
  while ((seen = accel::DeviceAtomicRef<std::uint32_t>(*word).load(accel::MemoryOrder::relaxed)) == 0 &&
         accel::timer_ns() < deadline)
    __nanosleep(1000);
  accel::SystemAtomicRef<std::uint32_t>(started[1]).store(seen + 1, accel::MemoryOrder::release);
}

/// Holds its stream until *release reads nonzero (the host writes it; mapped host memory) or
/// `budget_ns` passes on %globaltimer; then writes 1 (released) or 2 (budget spent) to *result.
static __global__ void hold_stream(std::uint32_t* release, std::uint64_t budget_ns, std::uint32_t* result) {
  const std::uint64_t deadline = accel::timer_ns() + budget_ns;
  bool released = false;
  while (!(released = accel::SystemAtomicRef<std::uint32_t>(*release).load(accel::MemoryOrder::acquire) != 0) &&
         accel::timer_ns() < deadline)
    __nanosleep(1000);
  accel::SystemAtomicRef<std::uint32_t>(*result).store(released ? 1 : 2, accel::MemoryOrder::release);
}

/// Waits (bounded, on the host) until `flag` reads nonzero; whether it did.
bool wait_for_flag(const std::uint32_t& flag, std::chrono::seconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (accel::SystemAtomicRef<std::uint32_t>(const_cast<std::uint32_t&>(flag)).load(accel::MemoryOrder::acquire) ==
             0 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag != 0;
}

TEST_CASE("change words on the GPU: set() lands in device memory beside a running kernel, which sees the 1") {
  // A kernel on the legacy default stream (where submits run unless Options::stream names another)
  // spins on a fresh word for up to 10 s. set() copies on the pool's own stream: were that copy
  // queued behind the kernel, the kernel would time out reading 0.
  auto made = local_nvme::ChangeWords::create(5 * kSecond);
  REQUIRE_MESSAGE(made.is_ok(), made.status().to_string());
  auto& words = *made.value();
  auto word = words.acquire();
  REQUIRE_MESSAGE(word.is_ok(), word.status().to_string());
  auto flags = local_nvme::kernel_array<std::uint32_t>(2, 0);
  wait_for_change_word<<<1, 1, 0, nullptr>>>(*word, 10 * kSecond, flags.data());
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(wait_for_flag(flags[0], std::chrono::seconds(10)));  // the kernel runs
  const Status set = words.set(*word);
  CHECK_MESSAGE(set.is_ok(), set.to_string());
  REQUIRE(accel::synchronize(nullptr, 20 * kSecond).is_ok());
  CHECK(flags[1] == 2);  // it read 1 (seen + 1), not 0 after its budget
  words.release(*word);
  // The recycled word is 0 again, read by a kernel that then times out at once.
  auto again = words.acquire();
  REQUIRE(again.is_ok());
  CHECK(*again == *word);
  flags[0] = flags[1] = 0;
  wait_for_change_word<<<1, 1, 0, nullptr>>>(*again, 0, flags.data());
  REQUIRE(accel::synchronize(nullptr, 20 * kSecond).is_ok());
  CHECK(flags[1] == 1);  // read 0
  words.release(*again);
  // The always-changed word reads 1 on the GPU.
  flags[0] = flags[1] = 0;
  wait_for_change_word<<<1, 1, 0, nullptr>>>(words.always_changed(), 0, flags.data());
  REQUIRE(accel::synchronize(nullptr, 20 * kSecond).is_ok());
  CHECK(flags[1] == 2);
}

/// Opens a target over `extents` whose change guard watches the real file `watched` (watch only:
/// no immutable flag), standing for the file the hand-built extents describe.
Path::open_target open_watched(Rig& rig, const std::string& watched, const std::vector<local_file::Extent>& extents,
                               std::uint64_t size) {
  local_file::Target t;
  t.path = watched;
  t.extents = extents;
  t.file_size = size;
  t.lba_size = rig.controller->identity().lba_size;
  t.nsid = rig.controller->identity().nsid;
  const int fd = ::open(watched.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  auto guard = local_file::ChangeGuard::create(fd, watched, local_file::ChangeProtection::watch_only);
  ::close(fd);
  REQUIRE_MESSAGE(guard.is_ok(), guard.status().to_string());
  t.guard = std::move(guard.value());
  return rig.open_or_fail(std::move(t));
}

/// Writes one byte into `path` (an IN_MODIFY event for its change guard).
void modify(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, "x", 1, 0) == 1);
  ::close(fd);
}

TEST_CASE("a target whose file changed is refused by the GPU's admission with DATA_LOSS; another target still reads") {
  Rig rig;
  const std::vector<local_file::Extent> extents{{0, 0, 64 * 4096}};
  const std::string watched = make_backing(7, 4096);
  auto changing = open_watched(rig, watched, extents, 64 * 4096);
  auto other = rig.open(extents, 64 * 4096);
  DeviceMemory memory(128 * 4096);
  auto registration = rig.map(memory);
  const auto read_both = [&] {
    return rig.run({rig.request(Direction::READ, registration, memory, 0, changing, 0, 64 * 4096),
                    rig.request(Direction::READ, registration, memory, 64 * 4096, other, 0, 64 * 4096)});
  };
  {
    auto [states, completions] = read_both();
    check_all_ok(states, completions, {64 * 4096, 64 * 4096});
  }
  modify(watched);
  memory.write(0, std::vector<std::uint8_t>(128 * 4096, 0x11));
  auto [states, completions] = read_both();
  CHECK(states[0].code() == StatusCode::DATA_LOSS);
  CHECK(states[0].message().find(watched) != std::string::npos);
  REQUIRE_MESSAGE(states[1].is_ok(), states[1].to_string());
  REQUIRE_MESSAGE(completions[1].status.is_ok(), completions[1].status.to_string());
  CHECK(memory.read(0, 64 * 4096) == std::vector<std::uint8_t>(64 * 4096, 0x11));  // nothing moved for it
  CHECK(memory.read(64 * 4096, 64 * 4096) == rig.expected(extents, 0, 64 * 4096));
  CHECK(rig.path->unregister_memory(registration).is_ok());
  ::unlink(watched.c_str());
}

TEST_CASE(
    "a request staged before its file changed and admitted after another thread raised the change is refused by its "
    "kernel") {
  // Thread A's submit stages a read while the file is unchanged; its copy and AdmitKernel wait on
  // the shared stream behind a kernel that holds it. The file changes; thread B's submit of the
  // same target raises the change (its own request is refused through the always-changed word) and
  // queues behind A. Only once the target's word is set is the stream let go: A's admission must
  // read the 1 from device memory. A verdict staged with A's request would let it through.
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    Path::Options o;
    o.stream = accel::StreamRef::from_cuda(stream);
    o.command_timeout_ns = 30 * kSecond;  // A's submit waits behind the hold: well within its bound
    Rig rig(o);
    const std::vector<local_file::Extent> extents{{0, 0, 64 * 4096}};
    const std::string watched = make_backing(9, 4096);
    auto target = open_watched(rig, watched, extents, 64 * 4096);
    DeviceMemory memory(128 * 4096);
    auto registration = rig.map(memory);
    auto flags =
        local_nvme::kernel_array<std::uint32_t>(3, 0);  // [0] release the hold, [1] hold's result, [2] A started
    hold_stream<<<1, 1, 0, stream>>>(&flags[0], 20 * kSecond, &flags[1]);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const auto submit_on = [&](std::uint64_t memory_offset, std::vector<Status>& states) {
      std::vector<PathRequest<Path>> requests{
          rig.request(Direction::READ, registration, memory, memory_offset, target, 0, 64 * 4096)};
      auto b = rig.path->submit(requests, states);
      std::vector<RequestCompletion> completions(1);
      (void)rig.path->progress(b, completions, 20 * kSecond);
    };
    std::vector<Status> a_states(1), b_states(1);
    std::thread a([&] {
      accel::SystemAtomicRef<std::uint32_t>(flags[2]).store(1, accel::MemoryOrder::release);
      submit_on(0, a_states);
    });
    REQUIRE(wait_for_flag(flags[2], std::chrono::seconds(10)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // A stages and waits behind the hold
    modify(watched);
    std::thread b([&] { submit_on(64 * 4096, b_states); });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (target.signal->state.load() != local_nvme::ChangeSignal::raised && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto raised = target.signal->state.load();
    accel::SystemAtomicRef<std::uint32_t>(flags[0]).store(1, accel::MemoryOrder::release);  // let the stream go
    a.join();
    b.join();
    CHECK(raised == local_nvme::ChangeSignal::raised);  // B's raise landed while the stream was held
    CHECK(flags[1] == 1);                               // the hold ended on the release, not its budget
    CHECK_MESSAGE(a_states[0].code() == StatusCode::DATA_LOSS, a_states[0].to_string());
    CHECK_MESSAGE(b_states[0].code() == StatusCode::DATA_LOSS, b_states[0].to_string());
    CHECK(memory.read(0, 128 * 4096) == std::vector<std::uint8_t>(128 * 4096, 0xEE));  // nothing moved
    CHECK(rig.path->unregister_memory(registration).is_ok());
    ::unlink(watched.c_str());
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}
