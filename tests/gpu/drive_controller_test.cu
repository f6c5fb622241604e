// The GPU-resident data-moving drive controller (support/drive_controller.cuh) driven by the
// product's path: StorageRuntime<Backend<DriveNamespaceResolver, LocalNvmeDataPath>> on the GPU
// (AdmitKernel, PollKernel), every byte verified:
//   - reads of 4 KiB, 12 KiB, 512 KiB and 1 MiB + 4 KiB (PRP1 only, PRP1 + PRP2, PRP lists, several
//     commands) from a namespace in GPU memory and from one in pinned host memory land in GPU memory;
//   - writes from GPU memory reach the namespace;
//   - the controller's counters agree with the commands and bytes the runtime reports, and its
//     latency holds each batch at least latency_ns;
//   - fault injection: an error status becomes DEVICE_ERROR with that status and no bytes claimed;
//     a lost completion becomes TIMEOUT; the other requests of the batch succeed byte for byte;
//   - two controllers served by one kernel (striping), each with its own runtime;
//   - the link cap: a batch never completes before its bytes over the cap (a lower bound);
//   - the persistent poller (Options::persistent_poller_warps): batches it polls land byte for byte
//     with no poll kernel launched, it ends when idle and the next submit launches it again, and a
//     lost completion still becomes TIMEOUT (the poller hands the batch back for the Abort);
//   - one striped_nvme DataPath over three controllers: requests that cross units land byte for
//     byte, one submit launch for all controllers, also with the submit kernel polling
//     (Options::submit_poll_budget_ns: then progress launches nothing).
//   - the LBA map (DriveSettings::lba_map): reads inside its ranges land from their namespace
//     blocks, one outside them or across a range's end is LBA Out of Range, bad maps are refused;
//   - files on a real file system ($TUTTI_TEST_FILES_DIR, else /var/tmp), located by the product's
//     FIEMAP resolver and held through the LBA map (support/drive_files.hpp), read back whole
//     through drive:/// targets, byte for byte.
// Suite gpu; exits 77 without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/core/runtime.hpp>
#include <tutti/path/local_nvme.hpp>
#include <tutti/path/striped_nvme.hpp>

#include "drive_controller.cuh"
#include "drive_files.hpp"

using namespace tutti;
using gpu_test::DriveFiles;
using gpu_test::DriveLbaRange;
using gpu_test::DriveNamespaceResolver;
using gpu_test::DriveNvmeController;
using gpu_test::DriveService;
using gpu_test::DriveSettings;
using DriveBackend = Backend<DriveNamespaceResolver, local_nvme::LocalNvmeDataPath>;
using DriveRuntime = StorageRuntime<DriveBackend>;

namespace {

constexpr std::uint64_t kSecond = 1'000'000'000;
constexpr std::uint64_t kNamespaceBytes = std::uint64_t{32} << 20;

std::uint8_t pattern(std::uint64_t seed, std::uint64_t at) {
  std::uint64_t x = (at / 8) * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x >> (8 * (at % 8)));
}

/// A controller with its namespace filled with pattern(seed), a DataPath and a runtime over it,
/// DEVICE memory registered, one target over the whole namespace.
struct Drive {
  Drive(DriveSettings settings, std::uint64_t seed, std::uint32_t queue_pairs, std::uint64_t command_timeout_ns,
        void* stream, std::uint32_t persistent_poller_warps = 0, DriveNamespaceResolver resolver = {})
      : controller(std::make_unique<DriveNvmeController>(settings)), seed(seed) {
    REQUIRE(controller->bring_up({}).is_ok());
    std::vector<std::uint8_t> bytes(settings.namespace_bytes);
    for (std::uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(seed, i);
    REQUIRE(cudaMemcpy(controller->namespace_data(), bytes.data(), bytes.size(), cudaMemcpyDefault) == cudaSuccess);
    local_nvme::Options options;
    options.queue_pairs = queue_pairs;
    options.queue_depth = 256;
    options.command_timeout_ns = command_timeout_ns;
    options.abort_timeout_ns = command_timeout_ns;
    options.stream = accel::StreamRef::from_native_handle(stream);
    // Every batch slot made before the service's persistent kernel starts: an allocation at submit
    // would wait for that kernel to end (Options::prepared_batches).
    options.max_batches_in_flight = 4;
    options.prepared_batches = 4;
    options.prepared_batch_requests = 64;
    options.persistent_poller_warps = persistent_poller_warps;
    auto path = local_nvme::LocalNvmeDataPath::create(*controller, options);
    REQUIRE_MESSAGE(path.is_ok(), path.status().to_string());
    runtime = std::make_unique<DriveRuntime>(DriveBackend{std::move(resolver), std::move(path.value())});
    auto t = runtime->open(fmt::format("drive://all?bytes={}&at=0", settings.namespace_bytes), {.writable = true});
    REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
    target = *t;
    auto m = accel::DeviceBuffer::allocate(memory_bytes);
    REQUIRE(m.is_ok());
    memory_buffer = std::move(m.value());
    REQUIRE(cudaMemset(memory_buffer.data(), 0xEE, memory_bytes) == cudaSuccess);
    auto h = runtime->register_memory({memory_buffer.data(), memory_bytes, MemoryKind::DEVICE, 0});
    REQUIRE_MESSAGE(h.is_ok(), h.status().to_string());
    memory = *h;
  }
  ~Drive() {
    (void)runtime->unregister_memory(memory);
    (void)runtime->close(target);
    (void)runtime->shutdown(5 * kSecond);
  }
  std::vector<std::uint8_t> memory_bytes_at(std::uint64_t at, std::uint64_t n) const {
    std::vector<std::uint8_t> out(n);
    REQUIRE(
        accel::copy_from_device(out.data(), static_cast<const std::uint8_t*>(memory_buffer.data()) + at, n).is_ok());
    return out;
  }
  std::vector<std::uint8_t> expected(std::uint64_t at, std::uint64_t n) const {
    std::vector<std::uint8_t> out(n);
    for (std::uint64_t i = 0; i < n; ++i) out[i] = pattern(seed, at + i);
    return out;
  }
  IoRequest read(std::uint64_t memory_offset, std::uint64_t target_offset, std::uint64_t length) const {
    return IoRequest{Direction::READ, memory, memory_offset, target, target_offset, length};
  }

  static constexpr std::uint64_t memory_bytes = std::uint64_t{8} << 20;
  std::unique_ptr<DriveNvmeController> controller;
  std::uint64_t seed;
  std::unique_ptr<DriveRuntime> runtime;
  TargetHandle target;
  accel::DeviceBuffer memory_buffer;
  MemoryHandle memory;
};

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

struct Stream {
  Stream() { REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(stream); }
  cudaStream_t stream = nullptr;
};

/// The per-thread stack CUDA reserves for every kernel (cudaLimitStackSize), bytes; 0 when unknown.
/// The driver grows it at the launch of a kernel that needs more, and only while the device is
/// idle: such a launch waits for every running kernel, a persistent one included.
std::size_t stack_limit() {
  std::size_t bytes = 0;
  if (cudaDeviceGetLimit(&bytes, cudaLimitStackSize) != cudaSuccess) (void)cudaGetLastError();
  return bytes;
}

/// Says where a late batch stops, in one GPU run (issue 23): the service's kernel and control
/// words, the controller's view of every queue pair (DriveNvmeController::debug_dump: doorbells,
/// fetched / completed / CQEs posted, the commands in flight with their due times, the SQEs not
/// fetched, the CQ), the DataPath's view of the same queue pairs (tickets reserved, announced and
/// fetched, the CQ head and Phase Tag it expects, CQEs reaped, stale and invalid ones), its
/// counters and stream, and the IO's progress. Bounded (every device read waits at most 1 s, the
/// queries never wait); printed to stderr. Never on a hot path: only when a check already failed.
void diagnose(const std::string& when, Drive& drive, const DriveService& service, cudaStream_t stream,
              const IoHandle* io) {
  std::string text = fmt::format("---- drive controller diagnostics: {} ----\n", when);
  text += service.describe() + "\n";
  text += drive.controller->debug_dump();
  auto& path = drive.runtime->datapath();
  for (std::uint32_t i = 0; i < path.options().queue_pairs; ++i) {
    const nvme::QueuePairState s = path.queue_statistics(i);
    text += fmt::format(
        "local_nvme queue pair {}: SQ tickets reserved {}, announced by the tail doorbell {}, fetched (head ticket "
        "from CQEs) {} | CQ head {} expecting Phase Tag {} | doorbell writes {}, CQEs reaped {}, stale {}, abandoned "
        "{}, invalid {} | locks held: doorbell {}, CQ {}\n",
        i, s.sq_reserved, s.sq_doorbell_ticket, s.sq_head_ticket, s.cq_head, s.cq_phase, s.doorbell_writes,
        s.completions_reaped, s.stale_completions, s.abandoned_completions, s.invalid_completions, s.sq_doorbell_lock,
        s.cq_lock);
  }
  const cudaError_t stream_state = cudaStreamQuery(stream);
  const cudaError_t last = cudaPeekAtLastError();
  text += fmt::format(
      "local_nvme: poll kernel launches {}, Aborts sent {}, batches in flight {} | its stream: {} | last CUDA error: "
      "{} | per-thread stack limit {} bytes\n",
      path.poll_kernel_launches(), path.aborts_sent(), path.batches_in_flight(),
      stream_state == cudaSuccess         ? "idle"
      : stream_state == cudaErrorNotReady ? "busy"
                                          : cudaGetErrorString(stream_state),
      cudaGetErrorName(last), stack_limit());
  if (io != nullptr) {
    auto progress = drive.runtime->query(*io);
    text += progress.is_ok() ? fmt::format("IO: complete {}, {} of {} requests completed\n", progress->complete,
                                           progress->completed_requests, progress->requests)
                             : fmt::format("IO: {}\n", progress.status().to_string());
  }
  text += "---- end of diagnostics ----\n";
  std::fputs(text.c_str(), stderr);
}

/// Each request's completion as the runtime reports it (status, bytes, commands, NVMe status).
std::string describe_completions(const std::vector<RequestCompletion>& completions) {
  std::string text;
  for (const RequestCompletion& c : completions)
    text +=
        fmt::format("  request {}: {} | confirmed {} bytes | {} commands, {} retries | NVMe status {:#05x}\n",
                    c.request_index, c.status.to_string(), c.confirmed_bytes, c.commands, c.retries, c.device_status);
  return text;
}

/// Reads of mixed sizes (one batch), checked byte for byte and against the controller's counters.
/// On a late batch (not complete 2 s after submit; healthy: about a millisecond) or any disagreement
/// it prints diagnose()'s dump, so one GPU run says where it stops; every run prints one line with
/// the submit's duration and the stack limit around it.
void check_reads(bool namespace_in_host) {
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.namespace_in_host = namespace_in_host;
  settings.latency_ns = 50'000;
  std::uint64_t posted_before = 0;
  const std::size_t stack_at_start = stack_limit();
  {
    Drive drive(settings, namespace_in_host ? 7 : 3, 2, 5 * kSecond, stream.stream);
    const std::size_t stack_after_create = stack_limit();
    // (memory offset, target offset, length): PRP1 only; PRP1 + PRP2; PRP lists; several commands.
    const std::vector<std::array<std::uint64_t, 3>> shapes{{0, 4096 * 9, 4096},
                                                           {8192, 4096 * 1000, 12288},
                                                           {1 << 20, 5u << 20, 512 << 10},
                                                           {2 << 20, 9u << 20, (1 << 20) + 4096},
                                                           {4 << 20, kNamespaceBytes - 4096, 4096}};
    std::vector<IoRequest> requests;
    std::uint64_t bytes = 0;
    for (const auto& s : shapes) {
      requests.push_back(drive.read(s[0], s[1], s[2]));
      bytes += s[2];
    }
    DriveService service;
    REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
    const auto began = std::chrono::steady_clock::now();
    auto outcome = drive.runtime->submit(requests);
    const auto submit_took = std::chrono::steady_clock::now() - began;
    // One line in every run: a submit that waited for the service's kernel shows here (seconds,
    // with the service's warps gone by their budget), and so does a stack that grew at submit.
    fmt::print(stderr,
               "check_reads(namespace in {}): submit took {} us; per-thread stack limit {} bytes at start, {} after "
               "create, {} after submit; {}\n",
               namespace_in_host ? "pinned host memory" : "GPU memory",
               std::chrono::duration_cast<std::chrono::microseconds>(submit_took).count(), stack_at_start,
               stack_after_create, stack_limit(), service.describe());
    bool accepted = true;
    for (const Status& s : outcome.initial_states) accepted = accepted && s.is_ok();
    if (!accepted) diagnose("a request was refused at submit", drive, service, stream.stream, nullptr);
    for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
    // Waited for in two steps, to look at the queues while the commands are still within their
    // 5 s timeout: a healthy batch completes in about a millisecond.
    auto result = drive.runtime->wait(outcome.io, 2 * kSecond);
    if (!result.is_ok() && result.status().code() == StatusCode::TIMEOUT) {
      diagnose("IO not complete 2 s after submit", drive, service, stream.stream, &outcome.io);
      result = drive.runtime->wait(outcome.io, 8 * kSecond);
    }
    const auto took = std::chrono::steady_clock::now() - began;
    if (!result.is_ok()) {
      diagnose(fmt::format("IO not complete 10 s after submit: {}", result.status().to_string()), drive, service,
               stream.stream, &outcome.io);
      // The requests done so far (one bounded progress step); those not listed are still in flight.
      auto done = drive.runtime->wait_some(outcome.io, 1'000'000);
      fmt::print(stderr, "requests done 10 s after submit (the others are in flight):\n{}",
                 done.is_ok() ? describe_completions(*done) : done.status().to_string() + "\n");
    } else if (!result->status.is_ok()) {
      fmt::print(stderr, "check_reads: the IO completed with {}; per request:\n{}", result->status.to_string(),
                 describe_completions(result->completions));
      diagnose("IO completed with an error", drive, service, stream.stream, &outcome.io);
    }
    REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
    CHECK_MESSAGE(result->status.is_ok(), result->status.to_string());
    CHECK(result->confirmed_bytes == bytes);
    CHECK(took >= std::chrono::microseconds(50));  // the controller's latency holds every command
    const std::uint64_t commands = result->commands;
    (void)drive.runtime->release(outcome.io);
    const std::uint32_t budget_exits = service.stop();
    CHECK_MESSAGE(budget_exits == 0, service.describe());
    for (const auto& s : shapes) CHECK(drive.memory_bytes_at(s[0], s[2]) == drive.expected(s[1], s[2]));
    // Bytes around the requests were not touched.
    CHECK(drive.memory_bytes_at(4096, 4096) == std::vector<std::uint8_t>(4096, 0xEE));
    std::uint64_t moved = 0, completed = 0;
    for (std::uint16_t qid = 1; qid <= 2; ++qid) {
      auto q = drive.controller->queue_state(qid);
      REQUIRE(q.is_ok());
      moved += q->bytes_moved;
      completed += q->cq_tail;
      posted_before += q->failed + q->dropped;
    }
    CHECK(moved == bytes);
    CHECK(completed == commands);
    if (moved != bytes || completed != commands || budget_exits != 0)
      diagnose(fmt::format("after stop(): the controller moved {} of {} bytes and posted {} CQEs for {} commands",
                           moved, bytes, completed, commands),
               drive, service, stream.stream, nullptr);
  }
  CHECK(posted_before == 0);
}

}  // namespace

TEST_CASE("reads through local_nvme from a namespace in GPU memory land byte for byte (PRP1, PRP2, PRP lists)") {
  if (!have_gpu()) return;
  check_reads(false);
}

TEST_CASE("reads from a namespace in pinned host memory cross PCIe into GPU memory byte for byte") {
  if (!have_gpu()) return;
  check_reads(true);
}

TEST_CASE("writes from GPU memory reach the namespace byte for byte") {
  if (!have_gpu()) return;
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.latency_ns = 0;
  Drive drive(settings, 11, 2, 5 * kSecond, stream.stream);
  std::vector<std::uint8_t> source(1 << 20);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::uint8_t>(i * 7 + 1);
  REQUIRE(cudaMemcpy(drive.memory_buffer.data(), source.data(), source.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  DriveService service;
  REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
  std::vector<IoRequest> requests{
      IoRequest{Direction::WRITE, drive.memory, 0, drive.target, 3 << 20, 512 << 10},
      IoRequest{Direction::WRITE, drive.memory, 512 << 10, drive.target, 7 << 20, 512 << 10},
  };
  auto outcome = drive.runtime->submit(requests);
  for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  auto result = drive.runtime->wait(outcome.io, 10 * kSecond);
  REQUIRE(result.is_ok());
  CHECK_MESSAGE(result->status.is_ok(), result->status.to_string());
  CHECK(result->confirmed_bytes == std::uint64_t{1} << 20);
  (void)drive.runtime->release(outcome.io);
  CHECK(service.stop() == 0);
  std::vector<std::uint8_t> ns(512 << 10);
  REQUIRE(cudaMemcpy(ns.data(), drive.controller->namespace_data() + (3 << 20), ns.size(), cudaMemcpyDefault) ==
          cudaSuccess);
  CHECK(std::equal(ns.begin(), ns.end(), source.begin()));
  REQUIRE(cudaMemcpy(ns.data(), drive.controller->namespace_data() + (7 << 20), ns.size(), cudaMemcpyDefault) ==
          cudaSuccess);
  CHECK(std::equal(ns.begin(), ns.end(), source.begin() + (512 << 10)));
  // Next to the written range the namespace keeps its pattern.
  std::vector<std::uint8_t> after(4096);
  REQUIRE(cudaMemcpy(after.data(), drive.controller->namespace_data() + (3 << 20) + (512 << 10), 4096,
                     cudaMemcpyDefault) == cudaSuccess);
  CHECK(after == drive.expected((3 << 20) + (512 << 10), 4096));
}

/// One queue pair: the batch's 8 reads take SQ positions 0..7. Position 2 fails with Unrecovered Read
/// Error (SCT 2h, SC 81h; DNR set by the controller), position 5 is never completed: DEVICE_ERROR with
/// that status and TIMEOUT, no bytes claimed or moved, the other six land. With `poller_warps` the
/// persistent poller polls the batch and hands it back for the host's Abort.
void check_injected_faults(std::uint64_t latency_ns, std::uint32_t poller_warps) {
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.latency_ns = latency_ns;
  Drive drive(settings, 5, 1, 200'000'000, stream.stream, poller_warps);
  REQUIRE(drive.controller->inject(1, 2, 0x281, 5).is_ok());
  DriveService service;
  REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
  std::vector<IoRequest> requests;
  for (std::uint64_t i = 0; i < 8; ++i) requests.push_back(drive.read(i * 65536, i * 1048576, 4096));
  auto outcome = drive.runtime->submit(requests);
  for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  auto result = drive.runtime->wait(outcome.io, 10 * kSecond);
  REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
  std::uint32_t ok = 0, device_errors = 0, timeouts = 0;
  for (const RequestCompletion& c : result->completions) {
    const std::uint64_t i = c.request_index;
    if (c.status.is_ok()) {
      ++ok;
      CHECK(c.confirmed_bytes == 4096);
      CHECK(drive.memory_bytes_at(i * 65536, 4096) == drive.expected(i * 1048576, 4096));
    } else {
      CHECK(c.confirmed_bytes == 0);
      CHECK(drive.memory_bytes_at(i * 65536, 4096) == std::vector<std::uint8_t>(4096, 0xEE));  // nothing moved
      if (c.status.code() == StatusCode::DEVICE_ERROR) {
        ++device_errors;
        CHECK(c.device_status == 0x281u);
      }
      if (c.status.code() == StatusCode::TIMEOUT) ++timeouts;
    }
  }
  CHECK(ok == 6);
  CHECK(device_errors == 1);
  CHECK(timeouts == 1);
  CHECK(result->confirmed_bytes == 6 * 4096);
  auto& path = drive.runtime->datapath();
  if (poller_warps != 0) {
    CHECK(path.batches_posted_to_poller() == 1);
    CHECK(path.poll_kernel_launches() >= 1);  // the Abort's wait goes on with poll kernels
    CHECK(path.aborts_sent() == 1);           // the host's, after the poller handed the batch back
  }
  (void)drive.runtime->release(outcome.io);
  CHECK(service.stop() == 0);
  auto q = drive.controller->queue_state(1);
  REQUIRE(q.is_ok());
  CHECK(q->failed == 1);
  CHECK(q->dropped == 1);
  CHECK(q->bytes_moved == 6 * 4096);
}

TEST_CASE("injected faults: an error status becomes DEVICE_ERROR, a lost completion TIMEOUT; the rest land") {
  if (!have_gpu()) return;
  check_injected_faults(0, 0);
}

TEST_CASE("the persistent poller hands back a batch with a lost completion: TIMEOUT after the Abort, the rest land") {
  if (!have_gpu()) return;
  check_injected_faults(20'000, 2);
}

TEST_CASE(
    "the persistent poller: three batches in flight over 12 warps land byte for byte with no poll kernel; idle, it "
    "ends") {
  if (!have_gpu()) return;
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.latency_ns = 50'000;  // every batch is still in flight when its submit returns: posted
  Drive drive(settings, 31, 2, 5 * kSecond, stream.stream, 12);  // 12 warps: not a multiple of a block
  auto& path = drive.runtime->datapath();
  DriveService service;
  REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
  for (int round = 0; round < 2; ++round) {
    // Three batches of 40 requests (two chunks of 32, one warp each, and a partial one), all in flight
    // at once, 4 KiB to 64 KiB each.
    std::vector<IoHandle> ios;
    std::vector<std::array<std::uint64_t, 3>> shapes;
    for (std::uint64_t b = 0; b < 3; ++b) {
      std::vector<IoRequest> requests;
      for (std::uint64_t i = 0; i < 40; ++i) {
        const std::uint64_t k = b * 40 + i;
        const std::array<std::uint64_t, 3> s{k * 65536, ((k * 37 + round * 11) % 200) * 131072, 4096 * (1 + k % 16)};
        requests.push_back(drive.read(s[0], s[1], s[2]));
        shapes.push_back(s);
      }
      auto outcome = drive.runtime->submit(requests);
      for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
      ios.push_back(outcome.io);
    }
    for (IoHandle& io : ios) {
      auto result = drive.runtime->wait(io, 10 * kSecond);
      REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
      CHECK_MESSAGE(result->status.is_ok(), result->status.to_string());
      (void)drive.runtime->release(io);
    }
    for (const auto& s : shapes) CHECK(drive.memory_bytes_at(s[0], s[2]) == drive.expected(s[1], s[2]));
    REQUIRE(cudaMemset(drive.memory_buffer.data(), 0xEE, Drive::memory_bytes) == cudaSuccess);
    CHECK(path.batches_posted_to_poller() == 3u * (round + 1));
    CHECK(path.poll_kernel_launches() == 0);  // progress only read the released words
    // Idle for 20 times Options::persistent_poller_idle_ns (1 ms): the kernel ended by itself, and the
    // next round's first submit launches it again.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(path.persistent_poller_launches() == static_cast<std::uint64_t>(round + 1));
  }
  CHECK(service.stop() == 0);
}

TEST_CASE("the persistent poller under load: 800 batches, four in flight, chunks of one bitmap word on two warps") {
  // Two chunks per batch (64 requests), owned by the two warps, their released bits in one word: a
  // lost bit would hand a batch back early (counted as returned unfinished) or never (TIMEOUT).
  if (!have_gpu()) return;
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.latency_ns = 10'000;
  Drive drive(settings, 41, 2, 5 * kSecond, stream.stream, 2);
  auto& path = drive.runtime->datapath();
  DriveService service;
  REQUIRE(service.start({drive.controller.get()}, 0, 60 * kSecond).is_ok());
  std::uint64_t failed = 0, checked = 0;
  for (std::uint64_t round = 0; round < 200; ++round) {
    std::vector<IoHandle> ios;
    for (std::uint64_t b = 0; b < 4; ++b) {
      std::vector<IoRequest> requests;
      for (std::uint64_t i = 0; i < 64; ++i) {
        const std::uint64_t k = b * 64 + i;
        requests.push_back(drive.read(k * 4096, ((k * 131 + round * 7) % 8000) * 4096, 4096));
      }
      auto outcome = drive.runtime->submit(requests);
      for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
      ios.push_back(outcome.io);
    }
    for (IoHandle& io : ios) {
      auto result = drive.runtime->wait(io, 10 * kSecond);
      REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
      if (!result->status.is_ok()) ++failed;
      (void)drive.runtime->release(io);
    }
    if (round % 50 == 49) {  // every byte of this round
      for (std::uint64_t k = 0; k < 256; ++k)
        CHECK(drive.memory_bytes_at(k * 4096, 4096) == drive.expected(((k * 131 + round * 7) % 8000) * 4096, 4096));
      ++checked;
    }
  }
  CHECK(failed == 0);
  CHECK(checked == 4);
  CHECK(path.batches_posted_to_poller() == 800);
  // Only a kernel that ends (its lifetime, 100 ms) hands batches back unfinished: at most the four in
  // flight per launch.
  CHECK(path.batches_returned_unfinished() <= 4 * path.persistent_poller_launches());
  CHECK(service.stop() == 0);
}

TEST_CASE("two controllers served by one kernel, each under its own runtime, both land byte for byte") {
  if (!have_gpu()) return;
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.latency_ns = 20'000;
  settings.bytes_per_second = std::uint64_t{14} * 1000 * 1000 * 1000;
  Drive a(settings, 21, 2, 5 * kSecond, stream.stream);
  Drive b(settings, 22, 2, 5 * kSecond, stream.stream);
  DriveService service;
  REQUIRE(service.start({a.controller.get(), b.controller.get()}, 0, 20 * kSecond).is_ok());
  for (Drive* d : {&a, &b}) {
    std::vector<IoRequest> requests;
    for (std::uint64_t i = 0; i < 16; ++i) requests.push_back(d->read(i * (512 << 10), i * (1 << 20), 512 << 10));
    auto outcome = d->runtime->submit(requests);
    for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
    auto result = d->runtime->wait(outcome.io, 10 * kSecond);
    REQUIRE(result.is_ok());
    CHECK_MESSAGE(result->status.is_ok(), result->status.to_string());
    CHECK(result->confirmed_bytes == 16 * (512 << 10));
    (void)d->runtime->release(outcome.io);
  }
  CHECK(service.stop() == 0);
  for (Drive* d : {&a, &b})
    for (std::uint64_t i = 0; i < 16; ++i)
      CHECK(d->memory_bytes_at(i * (512 << 10), 512 << 10) == d->expected(i * (1 << 20), 512 << 10));
}

TEST_CASE("the link cap paces a controller: a batch takes at least its bytes over the cap, and lands byte for byte") {
  // A lower bound only (the emulated link cannot move bytes faster than its cap, rounded up to whole
  // ns; a loaded machine only makes it slower), so it fails only when the reservation under-counts:
  // mixed sizes in one fetch step (one reservation per step, each command ending at its prefix) over
  // two queues that share the controller's link. At 64 MiB/s one 124 KiB command left out is 1.9 ms,
  // far above the submit and poll round trips that the host's clock adds.
  if (!have_gpu()) return;
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.latency_ns = 1'000;
  settings.bytes_per_second = std::uint64_t{64} << 20;  // 64 MiB/s: 4 MiB take 62.5 ms
  Drive drive(settings, 23, 2, 5 * kSecond, stream.stream);
  DriveService service;
  REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
  std::vector<IoRequest> requests;
  std::uint64_t bytes = 0;
  for (std::uint64_t i = 0; i < 64; ++i) {
    const std::uint64_t length = i % 2 == 0 ? 4096 : (124 << 10);
    requests.push_back(drive.read(i * (128 << 10), i * (256 << 10), length));
    bytes += length;
  }
  const auto began = std::chrono::steady_clock::now();
  auto outcome = drive.runtime->submit(requests);
  for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  auto result = drive.runtime->wait(outcome.io, 10 * kSecond);
  const auto elapsed_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - began).count();
  REQUIRE(result.is_ok());
  CHECK_MESSAGE(result->status.is_ok(), result->status.to_string());
  CHECK(result->confirmed_bytes == bytes);
  (void)drive.runtime->release(outcome.io);
  CHECK(service.stop() == 0);
  const std::uint64_t link_ns = bytes * kSecond / settings.bytes_per_second;
  CAPTURE(link_ns);
  CHECK(static_cast<std::uint64_t>(elapsed_ns) >= link_ns);
  for (std::uint64_t i = 0; i < 64; ++i) {
    const std::uint64_t length = requests[i].length, slot = 128 << 10;
    CHECK(drive.memory_bytes_at(i * slot, length) == drive.expected(i * (256 << 10), length));
    CHECK(drive.memory_bytes_at(i * slot + length, slot - length) == std::vector<std::uint8_t>(slot - length, 0xEE));
  }
}

TEST_CASE(
    "an LBA map holds the host's LBAs in the namespace: reads inside a range land, outside or across are LBA Out "
    "of Range") {
  if (!have_gpu()) return;
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;  // 8192 blocks
  settings.latency_ns = 1'000;
  // LBAs 1 000 000 .. 1 002 047 at namespace block 4096; LBAs 5 000 000 .. 5 004 095 at block 0.
  settings.lba_map = {DriveLbaRange{1'000'000, 2048, 4096}, DriveLbaRange{5'000'000, 4096, 0}};
  Drive drive(settings, 31, 1, 5 * kSecond, stream.stream);
  CHECK(drive.controller->identity().namespace_size_lbas == 5'004'096);  // NSZE reaches the last mapped LBA
  const auto open = [&](std::uint64_t lba, std::uint64_t blocks) {
    auto t = drive.runtime->open(fmt::format("drive://range?bytes={}&at={}", blocks * 4096, lba * 4096));
    REQUIRE_MESSAGE(t.is_ok(), t.status().to_string());
    return *t;
  };
  const TargetHandle low = open(1'000'000, 2048), high = open(5'000'000, 4096);
  const TargetHandle beyond = open(1'001'000, 2048);  // its second half is outside every range
  const TargetHandle below = open(999'000, 1000);     // LBAs 999 000 .. 999 999: just before the first range
  // (target, target offset, length, namespace byte expected or ~0 for LBA Out of Range)
  struct Read {
    TargetHandle target;
    std::uint64_t offset, length, namespace_at;
  };
  constexpr std::uint64_t kOutside = ~std::uint64_t{0};
  const std::vector<Read> reads{{low, 0, 4096, 4096 * 4096ull},
                                {low, (2048 - 3) * 4096ull, 12288, (4096 + 2045) * 4096ull},  // the range's end
                                {high, 0, 512 << 10, 0},
                                {high, 4095 * 4096ull, 4096, 4095 * 4096ull},
                                {beyond, 1047 * 4096ull, 4096, (4096 + 2047) * 4096ull},  // LBA 1 002 047
                                {beyond, 1048 * 4096ull, 4096, kOutside},                 // LBA 1 002 048
                                {beyond, 1046 * 4096ull, 12288, kOutside},                // across the end
                                {below, 999 * 4096ull, 4096, kOutside},                   // LBA 999 999
                                {below, 0, 4096, kOutside}};                              // LBA 999 000
  std::vector<IoRequest> requests;
  for (std::size_t i = 0; i < reads.size(); ++i)
    requests.push_back(
        IoRequest{Direction::READ, drive.memory, i << 19, reads[i].target, reads[i].offset, reads[i].length});
  DriveService service;
  REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
  auto outcome = drive.runtime->submit(requests);
  for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
  auto result = drive.runtime->wait(outcome.io, 10 * kSecond);
  REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
  REQUIRE(result->completions.size() == reads.size());
  for (const RequestCompletion& c : result->completions) {
    const Read& r = reads[c.request_index];
    CAPTURE(c.request_index);
    if (r.namespace_at == kOutside) {
      CHECK(c.status.code() == StatusCode::DEVICE_ERROR);
      CHECK(c.device_status == 0x080u);  // SCT 0, SC 80h: LBA Out of Range
      CHECK(c.confirmed_bytes == 0);
      CHECK(drive.memory_bytes_at(c.request_index << 19, r.length) == std::vector<std::uint8_t>(r.length, 0xEE));
    } else {
      CHECK_MESSAGE(c.status.is_ok(), c.status.to_string());
      CHECK(c.confirmed_bytes == r.length);
      CHECK(drive.memory_bytes_at(c.request_index << 19, r.length) == drive.expected(r.namespace_at, r.length));
    }
  }
  (void)drive.runtime->release(outcome.io);
  CHECK(service.stop() == 0);
  for (const TargetHandle t : {low, high, beyond, below}) CHECK(drive.runtime->close(t).is_ok());

  // Maps the controller refuses at bring-up, naming the range and the check that refused it.
  struct BadMap {
    std::vector<DriveLbaRange> map;
    const char* words;
  };
  for (const BadMap& bad :
       {BadMap{{{10, 4, 0}, {12, 4, 100}}, "starts at LBA 12, before the end"},  // overlapping
        BadMap{{{20, 4, 0}, {10, 4, 100}}, "starts at LBA 10, before the end"},  // not sorted
        BadMap{{{10, 0, 0}}, "has 0 blocks"}, BadMap{{{10, 16, 8190}}, "beyond the namespace of 8192 blocks"},
        BadMap{{{~0ull - 2, 4, 0}}, "exceeds"},  // the LBAs overflow
        BadMap{{{10, 4, 0}, {20, 4, 2}}, "starts at namespace block 2, before the end"}}) {
    DriveSettings wrong = settings;
    wrong.lba_map = bad.map;
    DriveNvmeController controller(wrong);
    const Status up = controller.bring_up({});
    CHECK(up.code() == StatusCode::INVALID_ARGUMENT);
    CHECK_MESSAGE(up.message().find("lba_map[") != std::string::npos, up.to_string());
    CHECK_MESSAGE(up.message().find(bad.words) != std::string::npos, up.to_string(), " (want: ", bad.words, ")");
  }
}

TEST_CASE("files on a real file system, located by FIEMAP and held through the LBA map, read back byte for byte") {
  // The files go to $TUTTI_TEST_FILES_DIR, else /var/tmp: a file system with FIEMAP and O_DIRECT
  // (ext4, xfs). Where /var/tmp has no block device (tmpfs, overlayfs) the case says so and skips;
  // a chosen directory must work. Written in 64 KiB chunks round robin: several extents per file.
  if (!have_gpu()) return;
  const char* chosen = std::getenv("TUTTI_TEST_FILES_DIR");
  const std::string directory = chosen != nullptr ? chosen : "/var/tmp";
  constexpr std::uint32_t kFiles = 3;
  constexpr std::uint64_t kFileBytes = std::uint64_t{2} << 20;
  const auto word = [](std::uint32_t file, std::uint64_t w) {
    return (std::uint64_t{file + 1} << 56) ^ (w * 0x9E3779B97F4A7C15ull);
  };
  auto files = DriveFiles::make(directory, kFiles, kFileBytes, 64 << 10, word);
  if (!files.is_ok() && files.status().code() == StatusCode::UNSUPPORTED && chosen == nullptr) {
    MESSAGE("skipped: ", files.status().to_string(), " (set TUTTI_TEST_FILES_DIR to a directory on ext4 or xfs)");
    return;
  }
  REQUIRE_MESSAGE(files.is_ok(), files.status().to_string());
  DriveFiles& set = *files.value();
  MESSAGE(set.describe());
  CHECK(set.namespace_bytes() == kFiles * kFileBytes);
  CHECK(set.extents() >= kFiles);
  Stream stream;
  DriveSettings settings;
  settings.namespace_bytes = set.namespace_bytes();
  settings.lba_map = set.lba_map();
  settings.latency_ns = 1'000;
  {
    Drive drive(settings, 41, 2, 5 * kSecond, stream.stream, 0, DriveNamespaceResolver{set.resolver()});
    REQUIRE_MESSAGE(set.fill(*drive.controller).is_ok(), set.source());
    MESSAGE(set.source());
    // Every target opened before the service starts and closed after it stops: an open may grow
    // the target cache's device memory, and a cudaFree would wait for the service's kernel.
    std::vector<TargetHandle> targets;
    for (std::uint32_t f = 0; f < kFiles; ++f) {
      auto target = drive.runtime->open(set.uri(f));
      REQUIRE_MESSAGE(target.is_ok(), target.status().to_string());
      targets.push_back(*target);
    }
    DriveService service;
    REQUIRE(service.start({drive.controller.get()}, 0, 20 * kSecond).is_ok());
    // Each file whole, in pieces of 4 KiB, 60 KiB, 192 KiB and 12 KiB: some cross the extents'
    // boundaries (the DataPath splits them), each lands at its file offset in memory.
    constexpr std::array<std::uint64_t, 4> kPieces{4096, 61440, 196608, 12288};
    std::vector<std::vector<std::uint8_t>> expected(kFiles, std::vector<std::uint8_t>(kFileBytes));
    for (std::uint32_t f = 0; f < kFiles; ++f) {
      for (std::uint64_t w = 0; w < kFileBytes / 8; ++w) {
        const std::uint64_t v = word(f, w);
        std::memcpy(expected[f].data() + 8 * w, &v, 8);
      }
      std::vector<IoRequest> requests;
      for (std::uint64_t at = 0, k = 0; at < kFileBytes; ++k) {
        const std::uint64_t length = std::min(kPieces[k % kPieces.size()], kFileBytes - at);
        requests.push_back(IoRequest{Direction::READ, drive.memory, f * kFileBytes + at, targets[f], at, length});
        at += length;
      }
      REQUIRE(requests.size() <= 64);  // the batch slots the Drive prepared
      auto outcome = drive.runtime->submit(requests);
      for (const Status& s : outcome.initial_states) REQUIRE_MESSAGE(s.is_ok(), s.to_string());
      auto result = drive.runtime->wait(outcome.io, 10 * kSecond);
      REQUIRE_MESSAGE(result.is_ok(), result.status().to_string());
      CHECK_MESSAGE(result->status.is_ok(), result->status.to_string());
      CHECK(result->confirmed_bytes == kFileBytes);
      (void)drive.runtime->release(outcome.io);
      CHECK(drive.memory_bytes_at(f * kFileBytes, kFileBytes) == expected[f]);
    }
    CHECK(service.stop() == 0);
    for (const TargetHandle t : targets) CHECK(drive.runtime->close(t).is_ok());
  }
}

TEST_CASE("one striped_nvme DataPath over three controllers: requests across units land byte for byte, one launch") {
  if (!have_gpu()) return;
  using StripedPath = striped_nvme::StripedNvmeDataPath;
  constexpr std::uint64_t kUnit = 64 << 10;
  for (const std::uint64_t submit_poll : {std::uint64_t{0}, std::uint64_t{100'000'000}}) {
    CAPTURE(submit_poll);
    Stream stream;
    DriveSettings settings;
    settings.namespace_bytes = kNamespaceBytes;
    settings.latency_ns = 20'000;
    std::vector<std::unique_ptr<DriveNvmeController>> controllers;
    std::vector<nvme::Controller*> raw;
    std::vector<DriveNvmeController*> serviced;
    for (std::uint64_t d = 0; d < 3; ++d) {
      controllers.push_back(std::make_unique<DriveNvmeController>(settings));
      REQUIRE(controllers.back()->bring_up({}).is_ok());
      std::vector<std::uint8_t> bytes(kNamespaceBytes);
      for (std::uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(30 + d, i);
      REQUIRE(cudaMemcpy(controllers.back()->namespace_data(), bytes.data(), bytes.size(), cudaMemcpyDefault) ==
              cudaSuccess);
      raw.push_back(controllers.back().get());
      serviced.push_back(controllers.back().get());
    }
    local_nvme::Options options;
    options.queue_pairs = 2;
    options.queue_depth = 256;
    options.stream = accel::StreamRef::from_native_handle(stream.stream);
    options.max_batches_in_flight = 2;
    options.prepared_batches = 2;  // before the service starts (Options::prepared_batches)
    options.prepared_batch_requests = 256;
    options.submit_poll_budget_ns = submit_poll;
    auto created = StripedPath::create(raw, options);
    REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
    StripedPath path = std::move(created.value());
    striped_file::Target target;
    target.name = "three namespaces";
    target.unit_bytes = kUnit;
    for (std::uint64_t d = 0; d < 3; ++d) {
      local_file::Target shard;
      shard.path = fmt::format("namespace {}", d);
      shard.extents = {local_file::Extent{0, 0, kNamespaceBytes}};
      shard.file_size = kNamespaceBytes;
      shard.lba_size = gpu_test::kDriveLbaSize;
      target.shards.push_back(std::move(shard));
    }
    target.logical_size = 3 * kNamespaceBytes;
    auto opened = path.open(std::move(target), {});
    REQUIRE_MESSAGE(opened.is_ok(), opened.status().to_string());
    constexpr std::uint64_t kBytes = std::uint64_t{8} << 20;
    auto buffer = accel::DeviceBuffer::allocate(kBytes);
    REQUIRE(buffer.is_ok());
    REQUIRE(cudaMemset(buffer->data(), 0xEE, kBytes) == cudaSuccess);
    const MemoryView view{buffer->data(), kBytes, MemoryKind::DEVICE, 0};
    auto memory = path.register_memory(view);
    REQUIRE_MESSAGE(memory.is_ok(), memory.status().to_string());
    DriveService service;
    REQUIRE(service.start(serviced, 0, 20 * kSecond).is_ok());
    // 24 requests of 148 KiB (whole 4 KiB LBAs, as the runtime requires) starting 4 KiB before a
    // unit boundary: each splits into 4 pieces (4, 64, 64 and 16 KiB) over all three controllers.
    std::vector<PathRequest<StripedPath>> requests;
    for (std::uint64_t i = 0; i < 24; ++i)
      requests.push_back(PathRequest<StripedPath>{Direction::READ, &*memory, view, i * (256 << 10), &*opened,
                                                  (7 * i + 1) * kUnit - 4096, 148 << 10});
    std::vector<Status> states(requests.size());
    std::vector<RequestCompletion> done(requests.size());
    const std::uint64_t launches = path.launches();
    auto batch = path.submit(requests, states);
    CHECK(path.launches() - launches == 1);
    for (const Status& st : states) REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    const Status waited = path.progress(batch, done, 10 * kSecond);
    CHECK_MESSAGE(waited.is_ok(), waited.to_string());
    if (submit_poll != 0) CHECK(path.launches() - launches == 1);  // the submit polled them to the end
    CHECK(service.stop() == 0);
    std::vector<std::uint8_t> got(kBytes);
    REQUIRE(accel::copy_from_device(got.data(), buffer->data(), kBytes).is_ok());
    for (std::uint64_t i = 0; i < requests.size(); ++i) {
      CAPTURE(i);
      CHECK_MESSAGE(done[i].status.is_ok(), done[i].status.to_string());
      CHECK(done[i].confirmed_bytes == requests[i].length);
      std::uint64_t mismatches = 0;
      for (std::uint64_t x = 0; x < requests[i].length; ++x) {
        const striped_file::Placement place = striped_file::place(requests[i].target_offset + x, kUnit, 3);
        mismatches += got[requests[i].memory_offset + x] != pattern(30 + place.shard, place.shard_offset);
      }
      CHECK(mismatches == 0);
    }
    batch = {};
    CHECK(path.unregister_memory(*memory).is_ok());
    CHECK(path.close(*opened).is_ok());
  }
}
