// tutti-bench-gpu-drive: the product's GPU path at the rate of drive-like controllers.
//
// Path measured: StorageRuntime<Backend<DriveNamespaceResolver, LocalNvmeDataPath>>::submit / wait
// (the DataPath's staging copy, AdmitKernel, PollKernel launches), DEVICE memory as destination.
// Controller: the GPU-resident data-moving drive controller (tests/gpu/support/drive_controller.cuh):
// one per simulated drive, each with its own namespace, DataPath and runtime; one persistent kernel
// serves them all. A per-command latency (--latencies-us) and a per-controller link cap
// (--cap-gbps, default 14 GB/s: one PCIe Gen5 x4 drive) make each behave like one drive.
//
// Rows (each runs --seconds after 2 x --in-flight warm-up batches per submitter):
//   iops      4 KiB random reads, namespace in GPU memory (no PCIe crossing: the figure is the
//             path's command rate), --iops-batch requests per submit, --submitters threads per
//             controller, each keeping --in-flight batches submitted (closed loop); 1..4
//             controllers x each latency.
//   gbps      512 KiB random reads, namespace in pinned host memory (the bytes cross PCIe into GPU
//             memory as a drive's DMA would), --gbps-batch requests per submit.
//   latency   one submitter on one controller (namespace in GPU memory, latency --latency-row-us):
//             per-batch latency p50 / p99 (submit to wait's return) and host CPU time per batch
//             (getrusage RUSAGE_THREAD) for one layer's batch (24 x 512 KiB) and 1, 64, 1024 x 4 KiB.
//   copy      pinned host-to-device cudaMemcpyAsync bandwidth (256 MiB, best of 5): the link's limit.
//   striped   (--striped, instead of the rows above) one striped_nvme DataPath over N controllers
//             (--stripe-controllers), one submitter keeping --striped-in-flight batches submitted:
//             512 KiB reads from pinned namespaces (GB/s) and 4 KiB reads from GPU ones (IOPS).
// Targets: without --files, the whole namespace of each controller (drive://, one extent). With
// --files DIR, N files of M MiB written into a new directory under DIR (a real file system with
// FIEMAP and O_DIRECT), located by the product's FIEMAP resolver (local_file::LocalFileResolver), and
// each controller holds exactly their LBAs through its LBA map, filled from the block device at the
// offsets FIEMAP gave (from the files when the device cannot be opened; the output says which): the
// iops, gbps and latency rows then read random files through drive:///PATH targets, so the
// DataPath's extent search over real extents is in the measured path (tests/gpu/support/drive_files.hpp).
// Every byte counted is verified: after each batch a kernel compares every destination byte with
// the namespace's pattern (double-buffered, off the measured thread's critical path); a row with
// any mismatch, any failed request or a verified-byte count different from the confirmed bytes is
// reported with errors and exit status 1.
// Ratios: best iops row / raw queue rate (--raw-json: tutti-bench-gpu-submit's JSON, its best raw
// row), 4-controller rows at 70 us / targets (13 M IOPS, 50 GB/s), gbps rows / pinned copy.
//
// Usage: tutti-bench-gpu-drive [--controllers 1,2,3,4] [--latencies-us 0,70] [--seconds S]
//   [--submitters T] [--in-flight F] [--queues Q] [--depth D] [--iops-batch B] [--gbps-batch B] [--cap-gbps G]
//   [--latency-row-us L] [--latency-batches N] [--queue-state device|mapped-host] [--warps-per-queue W]
//   [--submit-poll-us U] [--poll-kernel-us P] [--poll-stream-per-batch 0|1] [--persistent-poller-warps W]
//   [--persistent-poller-idle-us I]
//   [--striped [--stripe-controllers 1,2,3,4]
//   [--striped-in-flight F]]
//   [--files DIR [--file-count N] [--file-mib M] [--file-chunk-kib K]]
//   [--raw-json FILE] [--json FILE]
// Exits 77 without a CUDA device, 2 on bad flags, 1 when any row had errors.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/stream.hpp>
#include <tutti/core/runtime.hpp>
#include <tutti/path/local_nvme.hpp>
#include <tutti/path/striped_nvme.hpp>

#include "drive_controller.cuh"  // tests/gpu/support
#include "drive_files.hpp"       // tests/gpu/support

namespace {

using namespace tutti;
using gpu_test::DriveFiles;
using gpu_test::DriveNamespaceResolver;
using gpu_test::DriveNvmeController;
using gpu_test::DriveService;
using gpu_test::DriveSettings;
using DriveBackend = Backend<DriveNamespaceResolver, local_nvme::LocalNvmeDataPath>;
using DriveRuntime = StorageRuntime<DriveBackend>;

constexpr std::uint64_t kSecond = 1'000'000'000;
constexpr std::uint64_t kNamespaceBytes = std::uint64_t{1} << 30;  // per controller

struct Options {
  std::vector<std::uint32_t> controllers{1, 2, 3, 4};
  std::vector<std::uint32_t> latencies_us{0, 70};
  double seconds = 1.0;
  std::uint32_t submitters = 2;  ///< per controller
  std::uint32_t in_flight = 1;   ///< --in-flight: batches each iops / gbps submitter keeps submitted
  std::uint32_t queues = 16;     ///< per controller
  std::uint32_t depth = 1024;
  std::uint32_t iops_batch = 1024;
  std::uint32_t gbps_batch = 128;
  double cap_gbps = 14.0;
  std::uint32_t latency_row_us = 70;
  std::uint32_t latency_batches = 300;
  std::uint32_t submit_poll_us =
      0;  ///< local_nvme::Options::submit_poll_budget_ns, us (0: the submit kernel does not poll)
  bool poll_stream_per_batch = true;            ///< local_nvme::Options::poll_stream_per_batch
  std::int64_t poll_kernel_us = -1;             ///< local_nvme::Options::poll_kernel_budget_ns, us (-1: its default)
  std::uint32_t persistent_poller_warps = 0;    ///< local_nvme::Options::persistent_poller_warps (0: none)
  std::uint64_t persistent_poller_idle_us = 0;  ///< local_nvme::Options::persistent_poller_idle_ns, us (0: default)
  std::string queue_state = "device";           ///< local_nvme::Options::device_queue_state: device | mapped-host
  std::uint32_t warps_per_queue = 0;            ///< the drive service's warps per queue (0: DriveService's default)
  bool striped = false;                         ///< --striped: the striped rows only
  std::uint32_t striped_in_flight = 1;          ///< --striped-in-flight: batches the striped submitter keeps in flight
  std::vector<std::uint32_t> stripe_controllers{1, 2, 3, 4};
  std::string files_dir;                ///< --files: read files made here, located by FIEMAP (empty: drive:// targets)
  std::uint32_t file_count = 16;        ///< --file-count
  std::uint32_t file_mib = 64;          ///< --file-mib: each file's size
  std::uint32_t file_chunk_kib = 1024;  ///< --file-chunk-kib: the round robin's write size (sets the extents)
  std::string raw_json, json;
};

// ----- the namespace pattern and the verification kernel ---------------------------------------

__host__ __device__ inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Word w (byte 8 * w) of pattern `seed`: of controller `seed`'s namespace, or of file `seed` -
/// kFileSeed. mix is a bijection and w < 2^32 (a namespace or file of at most 32 GiB), so words of
/// two seeds below 2^32 never coincide.
__host__ __device__ inline std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t w) {
  return mix(w ^ (seed << 32));
}
/// What a drive's requests read: `count` targets of `bytes` each, word w of target t being
/// pattern_word(first_seed + t, w) ^ mask. Without --files one target, the whole namespace
/// (drive://, one extent), its seed the drive's own, mask 0; with --files the files (drive:///PATH,
/// FIEMAP's extents), the same seeds on every drive, so each drive's namespace is XORed with its own
/// mask after the fill: a read that another drive served fails the verification either way.
struct TargetSet {
  std::uint32_t count = 1;
  std::uint64_t bytes = kNamespaceBytes;
  std::uint64_t first_seed = 0;
  std::uint64_t mask = 0;
};
constexpr std::uint64_t kFileSeed = 100;  ///< TargetSet::first_seed of the --files set

/// Target of request i of batch b of a submitter (stream `who`): one of the set at random.
__host__ __device__ inline std::uint32_t request_target(std::uint64_t who, std::uint64_t b, std::uint64_t i,
                                                        const TargetSet& set) {
  return set.count == 1 ? 0 : static_cast<std::uint32_t>(mix(~((who << 40) ^ (b << 16) ^ i)) % set.count);
}
/// Offset of request i of batch b of a submitter (stream `who`) in its target: a random multiple
/// of `bytes`.
__host__ __device__ inline std::uint64_t request_offset(std::uint64_t who, std::uint64_t b, std::uint64_t i,
                                                        std::uint64_t bytes, const TargetSet& set) {
  return mix((who << 40) ^ (b << 16) ^ i) % (set.bytes / bytes) * bytes;
}

__global__ void fill_kernel(std::uint64_t* ns, std::uint64_t words, std::uint64_t seed) {
  for (std::uint64_t w = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; w < words;
       w += std::uint64_t{gridDim.x} * blockDim.x)
    ns[w] = pattern_word(seed, w);
}

/// XORs every namespace word with `mask` (TargetSet::mask).
__global__ void mask_kernel(std::uint64_t* ns, std::uint64_t words, std::uint64_t mask) {
  for (std::uint64_t w = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; w < words;
       w += std::uint64_t{gridDim.x} * blockDim.x)
    ns[w] ^= mask;
}

/// Checks request i's `bytes` at dest + i * bytes against its target's pattern at its offset;
/// counts mismatching words and verified bytes.
__global__ void verify_kernel(const std::uint64_t* dest, std::uint32_t n, std::uint64_t bytes, TargetSet set,
                              std::uint64_t who, std::uint64_t b, unsigned long long* mismatches,
                              unsigned long long* verified) {
  const std::uint64_t words = bytes / 8;
  unsigned long long bad = 0;
  for (std::uint32_t i = blockIdx.x; i < n; i += gridDim.x) {
    const std::uint64_t seed = set.first_seed + request_target(who, b, i, set);
    const std::uint64_t first = request_offset(who, b, i, bytes, set) / 8;
    for (std::uint64_t w = threadIdx.x; w < words; w += blockDim.x)
      if (dest[i * words + w] != (pattern_word(seed, first + w) ^ set.mask)) ++bad;
    if (threadIdx.x == 0) atomicAdd(verified, static_cast<unsigned long long>(bytes));
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

// ----- one drive: controller, DataPath, runtime, target, per-submitter buffers -----------------

/// One submitter thread's destinations: one buffer per batch it keeps in flight, plus one being
/// verified; `verified[k]` is recorded after buffer k's verification kernel.
struct Submitter {
  std::vector<accel::DeviceBuffer> buffers;
  std::vector<MemoryHandle> memory;
  cudaStream_t verify_stream = nullptr;
  std::vector<cudaEvent_t> verified;
};

struct Drive {
  Drive() = default;
  Drive(const Drive&) = delete;
  Drive& operator=(const Drive&) = delete;
  ~Drive() {
    runtime.reset();  // first: its kernels run on `stream`, its registrations name the submitters' buffers
    for (Submitter& s : submitters) {
      for (cudaEvent_t e : s.verified)
        if (e != nullptr) cudaEventDestroy(e);
      if (s.verify_stream != nullptr) cudaStreamDestroy(s.verify_stream);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  std::unique_ptr<DriveNvmeController> controller;
  cudaStream_t stream = nullptr;
  std::unique_ptr<DriveRuntime> runtime;
  std::vector<TargetHandle> targets;  ///< by TargetSet index
  std::vector<Submitter> submitters;
  TargetSet set;
};

Status cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess ? Status::success() : error(StatusCode::DEVICE_ERROR, "{}: {}", what, cudaGetErrorString(e));
}

/// The DataPath options every row shares, from the command line (--queues, --depth, --queue-state,
/// --submit-poll-us, --poll-kernel-us, --poll-stream-per-batch, --persistent-poller-warps), its kernels on
/// `stream`.
local_nvme::Options path_options(const Options& o, cudaStream_t stream) {
  local_nvme::Options options;
  options.queue_pairs = o.queues;
  options.queue_depth = o.depth;
  options.device_queue_state = o.queue_state == "device";
  options.submit_poll_budget_ns = std::uint64_t{o.submit_poll_us} * 1000;
  if (o.poll_kernel_us >= 0) options.poll_kernel_budget_ns = static_cast<std::uint64_t>(o.poll_kernel_us) * 1000;
  options.poll_stream_per_batch = o.poll_stream_per_batch;
  options.persistent_poller_warps = o.persistent_poller_warps;
  if (o.persistent_poller_idle_us != 0) options.persistent_poller_idle_ns = o.persistent_poller_idle_us * 1000;
  options.stream = accel::StreamRef::from_native_handle(stream);
  return options;
}

/// Brings up a drive with `submitters` sets of o.in_flight + 1 buffers of `buffer_bytes` each. Its
/// targets: the whole namespace, filled with pattern_word(seed, ...) (one extent); or, with
/// `files`, the files, their LBAs held through the controller's LBA map and copied in by
/// DriveFiles::fill.
Result<std::unique_ptr<Drive>> make_drive(const Options& o, bool namespace_in_host, std::uint64_t seed,
                                          std::uint32_t submitters, std::uint64_t buffer_bytes, DriveFiles* files) {
  auto d = std::make_unique<Drive>();
  DriveSettings settings;
  settings.namespace_bytes = kNamespaceBytes;
  settings.namespace_in_host = namespace_in_host;
  DriveNamespaceResolver resolver;
  if (files != nullptr) {
    d->set = TargetSet{static_cast<std::uint32_t>(files->paths().size()), files->file_bytes(), kFileSeed, mix(seed)};
    settings.namespace_bytes = files->namespace_bytes();
    settings.lba_map = files->lba_map();
    resolver.files = files->resolver();
  } else {
    d->set = TargetSet{1, kNamespaceBytes, seed, 0};
  }
  d->controller = std::make_unique<DriveNvmeController>(settings);
  TUTTI_RETURN_IF_ERROR(d->controller->bring_up({}));
  if (files != nullptr) {
    TUTTI_RETURN_IF_ERROR(files->fill(*d->controller));
    mask_kernel<<<1024, 256>>>(reinterpret_cast<std::uint64_t*>(d->controller->namespace_data()),
                               files->namespace_bytes() / 8, d->set.mask);
    TUTTI_RETURN_IF_ERROR(cuda(cudaDeviceSynchronize(), "namespace mask"));
  } else {
    fill_kernel<<<1024, 256>>>(reinterpret_cast<std::uint64_t*>(d->controller->namespace_data()), kNamespaceBytes / 8,
                               seed);
    TUTTI_RETURN_IF_ERROR(cuda(cudaDeviceSynchronize(), "namespace fill"));
  }
  TUTTI_RETURN_IF_ERROR(cuda(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  local_nvme::Options options = path_options(o, d->stream);
  options.max_batches_in_flight = std::max<std::uint32_t>(4, 2 * submitters * o.in_flight);
  // Every slot made now, before the service's persistent kernel starts (Options::prepared_batches).
  options.prepared_batches = options.max_batches_in_flight;
  options.prepared_batch_requests = std::max({o.iops_batch, o.gbps_batch, 1024u});
  auto path = local_nvme::LocalNvmeDataPath::create(*d->controller, options);
  if (!path) return path.status();
  d->runtime = std::make_unique<DriveRuntime>(DriveBackend{std::move(resolver), std::move(path.value())});
  for (std::uint32_t t = 0; t < d->set.count; ++t) {
    auto opened =
        d->runtime->open(files != nullptr ? files->uri(t) : fmt::format("drive://ns?bytes={}&at=0", kNamespaceBytes));
    if (!opened) return opened.status();
    d->targets.push_back(*opened);
  }
  d->submitters.resize(submitters);
  for (Submitter& s : d->submitters) {
    for (std::uint32_t k = 0; k <= o.in_flight; ++k) {
      auto b = accel::DeviceBuffer::allocate(buffer_bytes);
      if (!b) return b.status();
      auto m = d->runtime->register_memory({b.value().data(), buffer_bytes, MemoryKind::DEVICE, 0});
      if (!m) return m.status();
      s.buffers.push_back(std::move(b.value()));
      s.memory.push_back(*m);
      TUTTI_RETURN_IF_ERROR(
          cuda(cudaEventCreateWithFlags(&s.verified.emplace_back(), cudaEventDisableTiming), "cudaEventCreate"));
    }
    TUTTI_RETURN_IF_ERROR(cuda(cudaStreamCreateWithFlags(&s.verify_stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  }
  return Result<std::unique_ptr<Drive>>(std::move(d));
}

// ----- rows ---------------------------------------------------------------------------------------

struct Row {
  std::string kind;  ///< iops, gbps, latency
  std::uint32_t controllers = 0, latency_us = 0, batch = 0, submitters = 0;
  std::uint32_t in_flight = 1;  ///< batches each submitter kept submitted
  std::uint64_t request_bytes = 0;
  std::string namespace_memory;
  double seconds = 0;
  std::uint64_t requests = 0, bytes = 0, verified_bytes = 0, batches = 0;
  double iops = 0, gbps = 0, p50_us = 0, p99_us = 0, cpu_us_per_batch = 0;
  double submit_p50_us = 0;               ///< submit's share of a batch (staging, AdmitKernel launch, report copy)
  double poll_launches_per_batch = 0;     ///< PollKernel launches per batch (wait's relaunches)
  double posted_per_batch = 0;            ///< batches handed to the persistent poller, per batch
  std::uint64_t poller_launches = 0;      ///< the persistent poller's kernel launches in the row
  std::uint64_t returned_unfinished = 0;  ///< batches it handed back unfinished (LocalNvmeDataPath)
  double staging_us = 0, device_us = 0;   ///< submit's mean split (LocalNvmeDataPath::submit_time_split)
  std::uint64_t errors = 0;
  std::string first_error;
};

void note(Row& row, const std::string& what) {
  if (row.errors++ == 0) row.first_error = what;
}

double thread_cpu_us() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double percentile_us(std::vector<std::uint64_t> ns, double p) {
  if (ns.empty()) return 0;
  std::sort(ns.begin(), ns.end());
  return static_cast<double>(ns[std::min(ns.size() - 1, static_cast<std::size_t>(p * ns.size()))]) / 1e3;
}

/// The row's verdict from the verification kernels' counters in device memory (`counters`: mismatching
/// words, verified bytes) once every kernel ended: any mismatch, or verified bytes other than the bytes
/// counted, is an error (`source` names what the bytes were compared with). Then its rates from
/// row.requests, row.bytes and row.seconds.
void finish_verified_row(Row& row, const unsigned long long* counters, const char* source) {
  unsigned long long host_counters[2] = {0, 0};
  if (cudaMemcpy(host_counters, counters, sizeof(host_counters), cudaMemcpyDeviceToHost) != cudaSuccess)
    note(row, "copy of the verification counters");
  row.verified_bytes = host_counters[1];
  if (host_counters[0] != 0) note(row, fmt::format("{} destination words differ from {}", host_counters[0], source));
  if (row.verified_bytes != row.bytes)
    note(row, fmt::format("{} bytes verified for {} bytes counted", row.verified_bytes, row.bytes));
  row.iops = row.seconds > 0 ? static_cast<double>(row.requests) / row.seconds : 0;
  row.gbps = row.seconds > 0 ? static_cast<double>(row.bytes) / row.seconds / 1e9 : 0;
}

/// Closed loop on drives[0..controllers): each submitter thread keeps `in_flight` batches of `batch`
/// reads of `bytes` submitted (StorageRuntime::submit, then wait on the oldest) for `seconds` (or
/// `max_batches`), each verified on the GPU. Counters in device memory. A batch's latency is its
/// submit to its wait's return, so with more than one in flight it includes the wait behind older ones.
Row run_row(std::vector<std::unique_ptr<Drive>>& drives, std::uint32_t controllers, std::uint32_t submitters,
            std::uint32_t in_flight, std::uint32_t batch, std::uint64_t bytes, double seconds,
            std::uint64_t max_batches, std::uint32_t warps_per_queue, Row row) {
  row.controllers = controllers;
  row.batch = batch;
  row.request_bytes = bytes;
  row.submitters = submitters * controllers;
  row.in_flight = in_flight;
  unsigned long long* counters = nullptr;  // mismatches, verified bytes
  if (cudaMalloc(&counters, 2 * sizeof(unsigned long long)) != cudaSuccess ||
      cudaMemset(counters, 0, 2 * sizeof(unsigned long long)) != cudaSuccess) {
    note(row, "cudaMalloc of the verification counters");
    return row;
  }
  std::vector<DriveNvmeController*> serviced;
  for (std::uint32_t c = 0; c < controllers; ++c) serviced.push_back(drives[c]->controller.get());
  DriveService service;
  if (Status s = service.start(serviced, warps_per_queue, static_cast<std::uint64_t>((seconds + 30) * 1e9));
      !s.is_ok()) {
    note(row, s.to_string());
    cudaFree(counters);
    return row;
  }
  struct PerThread {
    Row row;
    std::vector<std::uint64_t> latencies, submit_ns;
    double cpu_us = 0;
  };
  std::vector<PerThread> per(controllers * submitters);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  const auto measure = [&](std::uint32_t c, std::uint32_t t, PerThread& me) {
    Drive& d = *drives[c];
    Submitter& s = d.submitters[t];
    const std::uint64_t who = (std::uint64_t{c} << 8) | t;
    std::vector<IoRequest> requests(batch);
    while (!go.load()) std::this_thread::yield();
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    const double cpu0 = thread_cpu_us();
    struct Pending {
      std::uint64_t number = 0;  ///< the submitter's batch number (its offsets and pattern)
      IoHandle io;
      bool accepted = true;
      std::chrono::steady_clock::time_point began;
    };
    std::deque<Pending> flight;  // oldest first
    const auto buffers = static_cast<std::uint64_t>(s.buffers.size());
    // After any error the thread submits nothing more and only waits for what it has in flight: a
    // batch that did not finish may still write its buffer, which must not be handed out again.
    bool stopped = false;
    for (std::uint64_t next = 0;;) {
      while (!stopped && flight.size() < in_flight && next < max_batches && std::chrono::steady_clock::now() < end) {
        Pending& p = flight.emplace_back();
        p.number = next++;
        const std::uint64_t k = p.number % buffers;
        if (p.number >= buffers) cudaEventSynchronize(s.verified[k]);  // the buffer's previous batch is verified
        for (std::uint32_t i = 0; i < batch; ++i)
          requests[i] = IoRequest{Direction::READ,
                                  s.memory[k],
                                  i * bytes,
                                  d.targets[request_target(who, p.number, i, d.set)],
                                  request_offset(who, p.number, i, bytes, d.set),
                                  bytes};
        p.began = std::chrono::steady_clock::now();
        auto outcome = d.runtime->submit(requests);
        me.submit_ns.push_back(static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - p.began).count()));
        p.io = outcome.io;
        for (const Status& st : outcome.initial_states)
          if (!st.is_ok()) {
            note(me.row, st.to_string());
            p.accepted = false;
            stopped = true;
            break;
          }
        if (outcome.accepted == 0) flight.pop_back();  // nothing to wait for
      }
      if (flight.empty()) break;
      const Pending& p = flight.front();
      const std::uint64_t k = p.number % buffers;
      auto result = d.runtime->wait(p.io, 10 * kSecond);
      const auto ended = std::chrono::steady_clock::now();
      if (!result) {
        note(me.row, result.status().to_string());
        stopped = true;
      } else if (p.accepted) {
        const IoResult& io = *result;
        if (!io.status.is_ok() || io.requests != batch || io.confirmed_bytes != batch * bytes)
          note(me.row, fmt::format("IoResult: {}, {} requests, {} bytes", io.status.to_string(), io.requests,
                                   io.confirmed_bytes));
        else {
          me.row.requests += batch;
          me.row.bytes += batch * bytes;
          verify_kernel<<<std::min<std::uint32_t>(batch, 1024), 256, 0, s.verify_stream>>>(
              static_cast<const std::uint64_t*>(s.buffers[k].data()), batch, bytes, d.set, who, p.number, counters,
              counters + 1);
          cudaEventRecord(s.verified[k], s.verify_stream);
        }
      }
      (void)d.runtime->release(p.io);
      ++me.row.batches;
      me.latencies.push_back(
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(ended - p.began).count()));
      flight.pop_front();
    }
    me.cpu_us = thread_cpu_us() - cpu0;
    cudaStreamSynchronize(s.verify_stream);
  };
  for (std::uint32_t c = 0; c < controllers; ++c)
    for (std::uint32_t t = 0; t < submitters; ++t)
      threads.emplace_back([&, c, t] { measure(c, t, per[c * submitters + t]); });
  std::uint64_t launches_before = 0, posted_before = 0, poller_launches_before = 0, unfinished_before = 0;
  std::vector<local_nvme::LocalNvmeDataPath::SubmitTimeSplit> split_before;
  for (std::uint32_t c = 0; c < controllers; ++c) {
    launches_before += drives[c]->runtime->datapath().poll_kernel_launches();
    posted_before += drives[c]->runtime->datapath().batches_posted_to_poller();
    poller_launches_before += drives[c]->runtime->datapath().persistent_poller_launches();
    unfinished_before += drives[c]->runtime->datapath().batches_returned_unfinished();
    split_before.push_back(drives[c]->runtime->datapath().submit_time_split());
  }
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& th : threads) th.join();
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (const std::uint32_t exits = service.stop(); exits != 0)
    note(row, fmt::format("{} service warps ran out of budget", exits));
  std::uint64_t launches = 0, posted = 0;
  std::uint64_t timed = 0, staging_ns = 0, device_ns = 0;
  for (std::uint32_t c = 0; c < controllers; ++c) {
    launches += drives[c]->runtime->datapath().poll_kernel_launches();
    posted += drives[c]->runtime->datapath().batches_posted_to_poller();
    row.poller_launches += drives[c]->runtime->datapath().persistent_poller_launches();
    row.returned_unfinished += drives[c]->runtime->datapath().batches_returned_unfinished();
    const auto split = drives[c]->runtime->datapath().submit_time_split();
    timed += split.submits - split_before[c].submits;
    staging_ns += split.staging_ns - split_before[c].staging_ns;
    device_ns += split.device_ns - split_before[c].device_ns;
  }
  launches -= launches_before;
  if (timed != 0) {
    row.staging_us = static_cast<double>(staging_ns) / 1e3 / static_cast<double>(timed);
    row.device_us = static_cast<double>(device_ns) / 1e3 / static_cast<double>(timed);
  }
  std::vector<std::uint64_t> all, submits;
  double cpu = 0;
  for (PerThread& p : per) {
    row.requests += p.row.requests;
    row.bytes += p.row.bytes;
    row.batches += p.row.batches;
    if (p.row.errors != 0 && row.errors == 0) row.first_error = p.row.first_error;
    row.errors += p.row.errors;
    all.insert(all.end(), p.latencies.begin(), p.latencies.end());
    submits.insert(submits.end(), p.submit_ns.begin(), p.submit_ns.end());
    cpu += p.cpu_us;
  }
  finish_verified_row(row, counters, drives[0]->set.first_seed == kFileSeed ? "the files" : "the namespace");
  cudaFree(counters);
  row.p50_us = percentile_us(all, 0.50);
  row.p99_us = percentile_us(all, 0.99);
  row.cpu_us_per_batch = row.batches == 0 ? 0 : cpu / static_cast<double>(row.batches);
  row.submit_p50_us = percentile_us(submits, 0.50);
  row.poll_launches_per_batch = row.batches == 0 ? 0 : static_cast<double>(launches) / static_cast<double>(row.batches);
  row.poller_launches -= poller_launches_before;
  row.returned_unfinished -= unfinished_before;
  row.posted_per_batch =
      row.batches == 0 ? 0 : static_cast<double>(posted - posted_before) / static_cast<double>(row.batches);
  return row;
}

// ----- striped rows (--striped): one striped_nvme DataPath over N drive controllers -----------------

using StripedPath = striped_nvme::StripedNvmeDataPath;
constexpr std::uint64_t kStripeUnit = 512 << 10;  // one K or V tensor of an 8B-class model's 256-token chunk

/// Logical offset of request i of batch b in a striped target of n namespaces: a random multiple of `bytes`.
__host__ __device__ inline std::uint64_t striped_offset(std::uint32_t n, std::uint64_t b, std::uint64_t i,
                                                        std::uint64_t bytes) {
  return mix((std::uint64_t{0xface} << 40) ^ (b << 16) ^ i) % (n * kNamespaceBytes / bytes) * bytes;
}

/// Checks request i's `bytes` at dest + i * bytes: logical byte x lies in unit u = x / kStripeUnit, on
/// controller u % n (namespace seed `first_seed` + that index) at namespace byte (u / n) * kStripeUnit +
/// x % kStripeUnit (striped_file::place; each shard is its namespace from byte 0).
__global__ void verify_striped_kernel(const std::uint64_t* dest, std::uint32_t count, std::uint64_t bytes,
                                      std::uint32_t n, std::uint64_t first_seed, std::uint64_t b,
                                      unsigned long long* mismatches, unsigned long long* verified) {
  const std::uint64_t words = bytes / 8;
  unsigned long long bad = 0;
  for (std::uint32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const std::uint64_t start = striped_offset(n, b, i, bytes);
    for (std::uint64_t w = threadIdx.x; w < words; w += blockDim.x) {
      const std::uint64_t x = start + 8 * w, u = x / kStripeUnit;
      const std::uint64_t shard_byte = (u / n) * kStripeUnit + x % kStripeUnit;
      if (dest[i * words + w] != pattern_word(first_seed + u % n, shard_byte / 8)) ++bad;
    }
    if (threadIdx.x == 0) atomicAdd(verified, static_cast<unsigned long long>(bytes));
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

/// One striped row: a StripedNvmeDataPath over controllers[0..n) (the namespaces filled with seeds
/// first_seed + d), one striped target of their n namespaces in units of kStripeUnit, one submitter thread
/// running batches of `batch` reads of `bytes` through submit / progress for `seconds`, keeping
/// --striped-in-flight batches submitted (the oldest is waited for before the next is submitted), each
/// into its own GPU destination (one more than in flight, so the next batch never waits for the
/// verification of the one just done), every byte verified on the GPU. A batch's latency is submit to
/// its progress returning, so with more than one in flight it includes the wait behind the older ones.
/// Created, measured and destroyed while the service runs only between create and destroy (every
/// allocation happens before it starts).
Row run_striped_row(const Options& o, std::vector<std::unique_ptr<DriveNvmeController>>& controllers, std::uint32_t n,
                    std::uint64_t first_seed, std::uint32_t batch, std::uint64_t bytes, Row row) {
  row.controllers = n;
  row.batch = batch;
  row.request_bytes = bytes;
  row.submitters = 1;
  const std::uint32_t in_flight = o.striped_in_flight;
  row.in_flight = in_flight;
  constexpr std::uint32_t kMostBuffers = 5;  // --striped-in-flight is at most 4
  const std::uint32_t buffer_count = in_flight + 1;
  // Released on every return, after the path (declared below, destroyed first) that uses the stream.
  struct CudaResources {
    cudaStream_t stream = nullptr, verify_stream = nullptr;
    unsigned long long* counters = nullptr;  // mismatches, verified bytes
    ~CudaResources() {
      if (counters != nullptr) cudaFree(counters);
      if (stream != nullptr) cudaStreamDestroy(stream);
      if (verify_stream != nullptr) cudaStreamDestroy(verify_stream);
    }
  } cuda_resources;
  cudaStream_t& stream = cuda_resources.stream;
  cudaStream_t& verify_stream = cuda_resources.verify_stream;
  unsigned long long*& counters = cuda_resources.counters;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&verify_stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(&counters, 2 * sizeof(unsigned long long)) != cudaSuccess ||
      cudaMemset(counters, 0, 2 * sizeof(unsigned long long)) != cudaSuccess) {
    note(row, "CUDA set-up of the striped row");
    return row;
  }
  {
    std::vector<nvme::Controller*> raw;
    std::vector<DriveNvmeController*> serviced;
    for (std::uint32_t d = 0; d < n; ++d) {
      raw.push_back(controllers[d].get());
      serviced.push_back(controllers[d].get());
    }
    local_nvme::Options options = path_options(o, stream);
    options.persistent_poller_warps = 0;  // local_nvme only (striped_nvme refuses it)
    options.max_batches_in_flight = std::max<std::uint32_t>(4, in_flight);
    options.prepared_batches =
        options.max_batches_in_flight;  // every slot made now, before the service's persistent kernel starts
    options.prepared_batch_requests = batch * static_cast<std::uint32_t>((bytes + kStripeUnit - 1) / kStripeUnit + 1);
    auto created = StripedPath::create(raw, options);
    if (!created) {
      note(row, created.status().to_string());
      return row;
    }
    StripedPath path = std::move(created.value());
    striped_file::Target target;
    target.name = "namespaces";
    target.unit_bytes = kStripeUnit;
    for (std::uint32_t d = 0; d < n; ++d) {
      local_file::Target shard;
      shard.path = fmt::format("namespace of controller {}", d);
      shard.extents = {local_file::Extent{0, 0, kNamespaceBytes}};
      shard.file_size = kNamespaceBytes;
      shard.lba_size = gpu_test::kDriveLbaSize;
      target.shards.push_back(std::move(shard));
    }
    target.logical_size = n * kNamespaceBytes;
    auto opened = path.open(std::move(target), {});
    accel::DeviceBuffer buffers[kMostBuffers];
    std::optional<StripedPath::registered_memory> memory[kMostBuffers];
    cudaEvent_t verified[kMostBuffers] = {};
    const std::uint64_t buffer_bytes = std::uint64_t{batch} * bytes;
    for (std::uint32_t k = 0; k < buffer_count && opened; ++k) {
      auto b = accel::DeviceBuffer::allocate(buffer_bytes);
      if (!b) {
        note(row, b.status().to_string());
        break;
      }
      buffers[k] = std::move(b.value());
      auto m = path.register_memory({buffers[k].data(), buffer_bytes, MemoryKind::DEVICE, 0});
      if (!m) {
        note(row, m.status().to_string());
        break;
      }
      memory[k].emplace(std::move(m.value()));
      if (cudaEventCreateWithFlags(&verified[k], cudaEventDisableTiming) != cudaSuccess) {
        note(row, "cudaEventCreateWithFlags for the verification");
        break;
      }
    }
    if (!opened) note(row, opened.status().to_string());
    DriveService service;
    if (row.errors == 0) {
      if (Status started =
              service.start(serviced, o.warps_per_queue, static_cast<std::uint64_t>((o.seconds + 30) * 1e9));
          !started.is_ok())
        note(row, started.to_string());
    }
    if (row.errors == 0) {
      // One entry per batch in flight, oldest first; each keeps its requests until its progress returns.
      struct InFlight {
        std::uint64_t number = 0;
        std::uint32_t buffer = 0;
        std::vector<PathRequest<StripedPath>> requests;
        std::vector<Status> states;
        std::optional<StripedPath::batch> io;
        std::chrono::steady_clock::time_point began;
      };
      std::deque<InFlight> flight;
      std::vector<RequestCompletion> done(batch);
      std::vector<std::uint64_t> latencies;
      const double cpu0 = thread_cpu_us();
      const auto start = std::chrono::steady_clock::now();
      const auto end = start + std::chrono::duration<double>(o.seconds);
      std::uint64_t next = 0;
      while (row.errors == 0) {
        while (flight.size() < in_flight && std::chrono::steady_clock::now() < end && row.errors == 0) {
          InFlight& f = flight.emplace_back();
          f.number = next++;
          f.buffer = static_cast<std::uint32_t>(f.number % buffer_count);
          const std::uint32_t k = f.buffer;
          if (f.number >= buffer_count) cudaEventSynchronize(verified[k]);  // the buffer's last batch is verified
          f.requests.resize(batch);
          f.states.resize(batch);
          for (std::uint32_t i = 0; i < batch; ++i)
            f.requests[i] = PathRequest<StripedPath>{Direction::READ,
                                                     &*memory[k],
                                                     MemoryView{buffers[k].data(), buffer_bytes, MemoryKind::DEVICE, 0},
                                                     i * bytes,
                                                     &*opened,
                                                     striped_offset(n, f.number, i, bytes),
                                                     bytes};
          f.began = std::chrono::steady_clock::now();
          f.io.emplace(path.submit(f.requests, f.states));
          for (const Status& st : f.states)
            if (!st.is_ok()) note(row, st.to_string());
        }
        if (flight.empty()) break;
        InFlight& f = flight.front();
        const Status waited = path.progress(*f.io, done, 10 * kSecond);
        latencies.push_back(static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - f.began).count()));
        if (!waited.is_ok()) note(row, waited.to_string());
        for (const RequestCompletion& c : done)
          if (!c.status.is_ok() || c.confirmed_bytes != bytes)
            note(row, fmt::format("request: {}, {} bytes", c.status.to_string(), c.confirmed_bytes));
        if (row.errors == 0) {
          row.requests += batch;
          row.bytes += buffer_bytes;
          ++row.batches;
          const std::uint32_t k = f.buffer;
          verify_striped_kernel<<<std::min<std::uint32_t>(batch, 1024), 256, 0, verify_stream>>>(
              static_cast<const std::uint64_t*>(buffers[k].data()), batch, bytes, n, first_seed, f.number, counters,
              counters + 1);
          cudaEventRecord(verified[k], verify_stream);
        }
        flight.pop_front();
      }
      // After an error the batches still in flight are waited for, so no read lands in a buffer being freed.
      for (InFlight& f : flight) (void)path.progress(*f.io, done, 10 * kSecond);
      flight.clear();
      row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      row.cpu_us_per_batch = row.batches == 0 ? 0 : (thread_cpu_us() - cpu0) / static_cast<double>(row.batches);
      row.p50_us = percentile_us(latencies, 0.50);
      row.p99_us = percentile_us(latencies, 0.99);
      cudaStreamSynchronize(verify_stream);
    }
    if (const std::uint32_t exits = service.stop(); exits != 0)
      note(row, fmt::format("{} service warps ran out of budget", exits));
    for (std::uint32_t k = 0; k < kMostBuffers; ++k) {
      if (memory[k]) (void)path.unregister_memory(*memory[k]);
      if (verified[k] != nullptr) cudaEventDestroy(verified[k]);
    }
    if (opened) (void)path.close(*opened);
  }  // the path (its queue pairs) goes before the next row creates another
  finish_verified_row(row, counters, "the namespaces");
  return row;
}

double pinned_copy_gbps() {
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  void* host = nullptr;
  void* device = nullptr;
  if (cudaHostAlloc(&host, kBytes, cudaHostAllocDefault) != cudaSuccess) return 0;
  if (cudaMalloc(&device, kBytes) != cudaSuccess) {
    cudaFreeHost(host);
    return 0;
  }
  std::memset(host, 1, kBytes);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t a = nullptr, b = nullptr;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a, stream);
    cudaMemcpyAsync(device, host, kBytes, cudaMemcpyHostToDevice, stream);
    cudaEventRecord(b, stream);
    cudaStreamSynchronize(stream);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (ms > 0) best = std::max(best, static_cast<double>(kBytes) / (ms / 1e3) / 1e9);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(stream);
  cudaFree(device);
  cudaFreeHost(host);
  return best;
}

/// The best raw row's commands/s in tutti-bench-gpu-submit's JSON, or 0.
double raw_commands_per_second(const std::string& path) {
  if (path.empty()) return 0;
  std::ifstream in(path);
  if (!in) return 0;
  double best = 0;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& r : j.at("rows"))
      if (r.value("path", "") == "raw" && r.value("errors", 1) == 0)
        best = std::max(best, r.value("commands_per_second", 0.0));
  } catch (const std::exception&) {
    return 0;
  }
  return best;
}

nlohmann::json to_json(const Row& r) {
  return {{"kind", r.kind},
          {"controllers", r.controllers},
          {"latency_us", r.latency_us},
          {"namespace_memory", r.namespace_memory},
          {"batch", r.batch},
          {"request_bytes", r.request_bytes},
          {"submitters", r.submitters},
          {"in_flight", r.in_flight},
          {"seconds", r.seconds},
          {"batches", r.batches},
          {"requests", r.requests},
          {"bytes", r.bytes},
          {"verified_bytes", r.verified_bytes},
          {"iops", r.iops},
          {"gbps", r.gbps},
          {"p50_us", r.p50_us},
          {"p99_us", r.p99_us},
          {"cpu_us_per_batch", r.cpu_us_per_batch},
          {"submit_p50_us", r.submit_p50_us},
          {"poll_launches_per_batch", r.poll_launches_per_batch},
          {"posted_to_poller_per_batch", r.posted_per_batch},
          {"poller_launches", r.poller_launches},
          {"poller_returned_unfinished", r.returned_unfinished},
          {"submit_staging_us", r.staging_us},
          {"submit_device_us", r.device_us},
          {"errors", r.errors},
          {"first_error", r.first_error}};
}

void print(const Row& r) {
  std::printf(
      "%-7s controllers=%u latency_us=%u namespace=%s batch=%ux%lluB submitters=%u  M_IOPS=%.3f GB/s=%.2f "
      "p50_us=%.1f p99_us=%.1f submit_p50_us=%.1f (means: staging %.1f + device %.1f) polls/batch=%.1f "
      "posted/batch=%.2f (poller launches %llu, returned unfinished %llu) cpu_us/batch=%.1f "
      "batches=%llu verified_bytes=%llu errors=%llu%s%s\n",
      r.kind.c_str(), r.controllers, r.latency_us, r.namespace_memory.c_str(), r.batch,
      static_cast<unsigned long long>(r.request_bytes), r.submitters, r.iops / 1e6, r.gbps, r.p50_us, r.p99_us,
      r.submit_p50_us, r.staging_us, r.device_us, r.poll_launches_per_batch, r.posted_per_batch,
      static_cast<unsigned long long>(r.poller_launches), static_cast<unsigned long long>(r.returned_unfinished),
      r.cpu_us_per_batch, static_cast<unsigned long long>(r.batches), static_cast<unsigned long long>(r.verified_bytes),
      static_cast<unsigned long long>(r.errors), r.errors ? " first_error=" : "", r.first_error.c_str());
  std::fflush(stdout);
}

/// --striped: for each namespace placement (pinned host: 512 KiB reads, GB/s; GPU: 4 KiB reads, IOPS),
/// the largest --stripe-controllers count of drive controllers at --latency-row-us and --cap-gbps, then one
/// row per count, each printed with its ratio to the 1-controller row. True when every row had no error.
bool run_striped(const Options& o, std::uint64_t cap) {
  const std::uint32_t most = *std::max_element(o.stripe_controllers.begin(), o.stripe_controllers.end());
  bool ok = true;
  nlohmann::json out = nlohmann::json::array();
  for (const bool in_host : {true, false}) {
    const std::uint64_t bytes = in_host ? kStripeUnit : 4096;
    const std::uint32_t batch = in_host ? o.gbps_batch : o.iops_batch;
    const std::uint64_t first_seed = in_host ? 40 : 60;
    std::vector<std::unique_ptr<DriveNvmeController>> controllers;
    for (std::uint32_t d = 0; d < most; ++d) {
      DriveSettings settings;
      settings.namespace_bytes = kNamespaceBytes;
      settings.namespace_in_host = in_host;
      auto c = std::make_unique<DriveNvmeController>(settings);
      Status up = c->bring_up({});
      if (up.is_ok()) {
        fill_kernel<<<1024, 256>>>(reinterpret_cast<std::uint64_t*>(c->namespace_data()), kNamespaceBytes / 8,
                                   first_seed + d);
        up = cuda(cudaDeviceSynchronize(), "namespace fill");
      }
      if (up.is_ok()) up = c->set_timing(std::uint64_t{o.latency_row_us} * 1000, cap);
      if (!up.is_ok()) {
        std::fprintf(stderr, "striped rows: controller %u: %s\n", d, up.to_string().c_str());
        return false;
      }
      controllers.push_back(std::move(c));
    }
    double one = 0;
    for (std::uint32_t n : o.stripe_controllers) {
      Row row;
      row.kind = in_host ? "striped-gbps" : "striped-iops";
      row.latency_us = o.latency_row_us;
      row.namespace_memory = in_host ? "pinned-host" : "gpu";
      row = run_striped_row(o, controllers, n, first_seed, batch, bytes, row);
      const double figure = in_host ? row.gbps : row.iops;
      if (n == 1 && row.errors == 0) one = figure;
      print(row);
      std::printf("        striped over %u controller(s): %.2fx one controller\n", n, one > 0 ? figure / one : 0.0);
      ok = ok && row.errors == 0;
      auto j = to_json(row);
      j["ratio_to_one_controller"] = one > 0 ? figure / one : 0.0;
      out.push_back(j);
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["queue_state"] = o.queue_state;
    j["submit_poll_us"] = o.submit_poll_us;
    j["poll_kernel_us"] = o.poll_kernel_us;
    j["poll_stream_per_batch"] = o.poll_stream_per_batch;
    j["persistent_poller_warps"] = o.persistent_poller_warps;
    j["persistent_poller_idle_us"] = o.persistent_poller_idle_us;
    j["stripe_unit_bytes"] = kStripeUnit;
    j["striped_in_flight"] = o.striped_in_flight;
    j["rows"] = out;
    std::ofstream(o.json) << j.dump(2) << '\n';
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);   // each row reaches a log as it ends, also when the run is cut off
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);  // a lazy module load would wait for the persistent service
  Options o;
  CLI::App app{"tutti-bench-gpu-drive: the local_nvme GPU path against drive-like GPU-resident controllers"};
  app.option_defaults()->always_capture_default();  // --help shows each option's default
  app.footer(
      "Needs an NVIDIA GPU: the drive controllers run on it. Exit status: 0 every row verified; 1 a row had errors; "
      "2 bad options; 77 no CUDA device (nothing measured). Rows and columns: docs/benchmarks.md, \"Drive rate\".");
  app.add_option("--controllers", o.controllers, "controller counts, 1..4")->delimiter(',')->check(CLI::Range(1, 4));
  app.add_option("--latencies-us", o.latencies_us, "per-command latencies, us")
      ->delimiter(',')
      ->check(CLI::Range(0, 10000));
  app.add_option("--seconds", o.seconds, "measured seconds per row")->check(CLI::Range(0.05, 30.0));
  app.add_option("--submitters", o.submitters, "submitter threads per controller")->check(CLI::Range(1, 16));
  app.add_option("--in-flight", o.in_flight,
                 "batches each iops / gbps submitter keeps submitted, 1..4 (submit, then wait on the oldest; each "
                 "into its own destination); the latency rows keep 1")
      ->check(CLI::Range(1, 4));
  app.add_option("--queues", o.queues, "queue pairs per controller")->check(CLI::Range(1, 64));
  app.add_option("--depth", o.depth, "queue depth")->check(CLI::Range(64, 4096));
  app.add_option("--iops-batch", o.iops_batch, "4 KiB requests per submit")->check(CLI::Range(1, 4096));
  app.add_option("--gbps-batch", o.gbps_batch, "512 KiB requests per submit")->check(CLI::Range(1, 256));
  app.add_option("--cap-gbps", o.cap_gbps, "link cap per controller, GB/s (0: none)")->check(CLI::Range(0.0, 1000.0));
  app.add_option("--latency-row-us", o.latency_row_us, "latency of the latency rows, us")->check(CLI::Range(0, 10000));
  app.add_option("--latency-batches", o.latency_batches, "batches per latency row")->check(CLI::Range(10, 100000));
  app.add_option("--queue-state", o.queue_state,
                 "where the kernels' queue state lives (local_nvme::Options::device_queue_state): device memory, or "
                 "mapped pinned host memory to measure the difference")
      ->check(CLI::IsMember({"device", "mapped-host"}));
  app.add_option("--warps-per-queue", o.warps_per_queue,
                 "warps of the drive service per queue (0: its default, DriveService::kDefaultWarpsPerQueue)")
      ->check(CLI::Range(0, 32));
  app.add_option("--poll-stream-per-batch", o.poll_stream_per_batch,
                 "1: each batch's poll kernels on its own stream (local_nvme::Options::poll_stream_per_batch, the "
                 "default); 0: on the DataPath's one stream, behind and ahead of the submits");
  app.add_option("--poll-kernel-us", o.poll_kernel_us,
                 "how long one poll kernel launch may poll, us (local_nvme::Options::poll_kernel_budget_ns; 0: one "
                 "pass per launch; -1: the default)")
      ->check(CLI::Range(-1, 1000000));
  app.add_option("--persistent-poller-warps", o.persistent_poller_warps,
                 "warps of the persistent poller (local_nvme::Options::persistent_poller_warps; 0: none, the "
                 "default): progress waits on a word the poller writes instead of launching poll kernels")
      ->check(CLI::Range(0, 1024));
  app.add_option("--persistent-poller-idle-us", o.persistent_poller_idle_us,
                 "how long the persistent poller stays without a batch before it ends, us (local_nvme::Options::"
                 "persistent_poller_idle_ns; 0: its default, 1 ms)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--submit-poll-us", o.submit_poll_us,
                 "how long the submit kernel polls the batch it admitted, us (local_nvme::Options::"
                 "submit_poll_budget_ns; 0: it does not, the default)")
      ->check(CLI::Range(0, 1000000));
  app.add_flag("--striped", o.striped,
               "only the striped rows: one striped_nvme DataPath over N controllers (--stripe-controllers), 512 KiB "
               "units, one submitter; GB/s (512 KiB reads, pinned namespaces) and IOPS (4 KiB reads, GPU namespaces), "
               "each as the ratio to one controller");
  app.add_option("--stripe-controllers", o.stripe_controllers, "controller counts of the striped rows, 1..8")
      ->delimiter(',')
      ->check(CLI::Range(1, 8));
  app.add_option("--striped-in-flight", o.striped_in_flight,
                 "batches the striped rows' one submitter keeps in flight, 1..4 (each into its own destination)")
      ->check(CLI::Range(1, 4));
  app.add_option("--files", o.files_dir,
                 "read files instead of the whole namespace: --file-count files of --file-mib MiB are written into a "
                 "new directory under this one (a file system with FIEMAP and O_DIRECT: ext4, xfs; a loop-mounted "
                 "image works), located by the product's FIEMAP resolver, and each controller holds exactly their "
                 "LBAs (its LBA map); the iops, gbps and latency rows read them through drive:///PATH targets. "
                 "Removed on a normal exit (after a kill: remove DIR/tutti-drive-files-*, after chattr -i on its "
                 "files)");
  app.add_option("--file-count", o.file_count, "files of --files")->check(CLI::Range(1, 1024));
  app.add_option("--file-mib", o.file_mib, "size of each file of --files, MiB")->check(CLI::Range(1, 4096));
  app.add_option("--file-chunk-kib", o.file_chunk_kib,
                 "the files are written round robin in pieces of this size with O_DIRECT, so they interleave on the "
                 "device: smaller pieces, more extents per file; a multiple of 4")
      ->check(CLI::Range(4, 1 << 20));
  app.add_option("--raw-json", o.raw_json, "tutti-bench-gpu-submit --json output, for the raw-queue ratio");
  app.add_option("--json", o.json, "write the rows as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Every batch a controller's submitters keep in flight needs a command slot of its queue pairs (a
  // 4 KiB or 512 KiB read is one command); more would be refused at submit as RESOURCE_EXHAUSTED.
  const std::uint64_t commands = std::uint64_t{o.submitters} * o.in_flight * std::max(o.iops_batch, o.gbps_batch);
  const std::uint64_t slots = std::uint64_t{o.queues} * (o.depth - 1);
  if (commands > slots) {
    std::fprintf(stderr,
                 "--submitters %u x --in-flight %u x %u requests per batch (--iops-batch, --gbps-batch) = %llu "
                 "commands in flight per controller exceed its --queues %u x (--depth %u - 1) = %llu command "
                 "slots: lower one of them\n",
                 o.submitters, o.in_flight, std::max(o.iops_batch, o.gbps_batch),
                 static_cast<unsigned long long>(commands), o.queues, o.depth, static_cast<unsigned long long>(slots));
    return 2;
  }
  if (app.count("--files") != 0 && o.files_dir.empty()) {
    std::fprintf(stderr, "--files: give a directory (an empty value reads no files)\n");
    return 2;
  }
  for (const char* flag : {"--file-count", "--file-mib", "--file-chunk-kib"})
    if (app.count(flag) != 0 && o.files_dir.empty()) {
      std::fprintf(stderr, "%s applies to --files DIR, which is not given\n", flag);
      return 2;
    }
  if (!o.files_dir.empty() && o.striped) {
    std::fprintf(stderr, "--files applies to the iops, gbps and latency rows, not to --striped\n");
    return 2;
  }
  if (o.file_chunk_kib % 4 != 0) {
    std::fprintf(stderr, "--file-chunk-kib %u is not a multiple of 4 (KiB: whole 4096-byte LBAs)\n", o.file_chunk_kib);
    return 2;
  }
  if (!o.files_dir.empty() && std::uint64_t{o.file_count} * o.file_mib > 16384) {
    std::fprintf(stderr,
                 "--file-count %u x --file-mib %u = %llu MiB exceed 16384 MiB: every controller holds all the files' "
                 "bytes, in GPU memory and in pinned host memory\n",
                 o.file_count, o.file_mib, static_cast<unsigned long long>(std::uint64_t{o.file_count} * o.file_mib));
    return 2;
  }
  if (!o.files_dir.empty()) {  // what can be told before any file or GPU work (DriveFiles::make checks the rest)
    struct stat st {};
    const int found = ::stat(o.files_dir.c_str(), &st) == 0 ? 0 : errno;
    if (found != 0 || !S_ISDIR(st.st_mode)) {
      std::fprintf(stderr, "--files %s: not a directory (%s)\n", o.files_dir.c_str(),
                   found != 0 ? std::strerror(found) : "another kind of file");
      return 2;
    }
    if (major(st.st_dev) == 0) {
      std::fprintf(stderr,
                   "--files %s: its file system has no block device (tmpfs, overlayfs, procfs ...), so FIEMAP gives "
                   "no LBAs: use a directory on ext4 or xfs (a loop-mounted image works)\n",
                   o.files_dir.c_str());
      return 2;
    }
  }
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "tutti-bench-gpu-drive: no CUDA device (%s): nothing measured (exit 77)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const std::uint32_t max_controllers = *std::max_element(o.controllers.begin(), o.controllers.end());
  const auto cap = static_cast<std::uint64_t>(o.cap_gbps * 1e9);
  const double copy_gbps = pinned_copy_gbps();
  std::printf("queue state in %s memory\n", o.queue_state == "device" ? "device" : "mapped pinned host");
  std::printf("submit kernel polls: %u us\n", o.submit_poll_us);
  std::printf("poll kernels on %s\n", o.poll_stream_per_batch ? "a stream per batch" : "the DataPath's stream");
  std::printf("poll kernel budget: %lld us%s\n", static_cast<long long>(o.poll_kernel_us),
              o.poll_kernel_us < 0 ? " (the default)" : "");
  std::printf("persistent poller: %u warps%s\n", o.persistent_poller_warps,
              o.persistent_poller_warps == 0 ? " (none)" : "");
  std::printf("batches in flight per submitter: %u\n", o.in_flight);
  std::printf("drive service: %u warps per queue\n",
              o.warps_per_queue != 0 ? o.warps_per_queue : DriveService::kDefaultWarpsPerQueue);
  std::printf("copy    pinned host-to-device GB/s=%.2f\n", copy_gbps);
  if (o.striped) return run_striped(o, cap) ? 0 : 1;
  // The files outlive every drive (their runtimes hold the files open and immutable).
  std::unique_ptr<DriveFiles> files;
  std::string targets =
      fmt::format("the whole namespace of {} MiB per controller (drive://, one extent)", kNamespaceBytes >> 20);
  if (!o.files_dir.empty()) {
    const auto began = std::chrono::steady_clock::now();
    auto made = DriveFiles::make(o.files_dir, o.file_count, std::uint64_t{o.file_mib} << 20,
                                 std::uint64_t{o.file_chunk_kib} << 10,
                                 [](std::uint32_t f, std::uint64_t w) { return pattern_word(kFileSeed + f, w); });
    if (!made) {
      // A directory that cannot hold them is a bad option; a write or FIEMAP that failed is not.
      const StatusCode code = made.status().code();
      std::fprintf(stderr, "--files %s: %s\n", o.files_dir.c_str(), made.status().to_string().c_str());
      return code == StatusCode::INVALID_ARGUMENT || code == StatusCode::NOT_FOUND || code == StatusCode::UNSUPPORTED
                 ? 2
                 : 1;
    }
    files = std::move(made.value());
    targets =
        fmt::format("files located by FIEMAP (drive:///PATH): {}; written and located in {:.1f} s", files->describe(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  }
  std::printf("targets: %s\n", targets.c_str());
  std::vector<Row> rows;
  bool failed = false;
  const auto run_set = [&](bool in_host, std::uint32_t batch, std::uint64_t bytes, const char* kind) {
    std::vector<std::unique_ptr<Drive>> drives;
    // The iops set also serves the latency rows (up to 1024 x 4 KiB and 24 x 512 KiB).
    const bool iops = std::strcmp(kind, "iops") == 0;
    const std::uint64_t buffer = std::max<std::uint64_t>(std::uint64_t{batch} * bytes, iops ? 24u << 19 : 0);
    for (std::uint32_t c = 0; c < max_controllers; ++c) {
      auto d = make_drive(o, in_host, 1 + c + (in_host ? 16 : 0), o.submitters, buffer, files.get());
      if (!d) {
        std::fprintf(stderr, "%s rows: %s\n", kind, d.status().to_string().c_str());
        failed = true;
        return drives;
      }
      drives.push_back(std::move(d.value()));
    }
    if (files) std::printf("        %s rows: namespaces filled from %s\n", kind, files->source().c_str());
    for (std::uint32_t lat : o.latencies_us)
      for (std::uint32_t c : o.controllers) {
        for (auto& d : drives) (void)d->controller->set_timing(std::uint64_t{lat} * 1000, cap);
        Row row;
        row.kind = kind;
        row.latency_us = lat;
        row.namespace_memory = in_host ? "pinned-host" : "gpu";
        const Row warm = run_row(drives, c, o.submitters, o.in_flight, batch, bytes, 0.05, 2 * o.in_flight,
                                 o.warps_per_queue, row);  // warm-up (slots grow)
        row = run_row(drives, c, o.submitters, o.in_flight, batch, bytes, o.seconds, ~std::uint64_t{0},
                      o.warps_per_queue, row);
        if (warm.errors != 0) note(row, "warm-up: " + warm.first_error);  // the row fails with it
        print(row);
        failed = failed || row.errors != 0;
        rows.push_back(row);
      }
    return drives;
  };
  {
    auto drives = run_set(false, o.iops_batch, 4096, "iops");
    if (!drives.empty()) {
      // Latency rows: one submitter on controller 0, largest batch first (no slot grows under the service).
      (void)drives[0]->controller->set_timing(std::uint64_t{o.latency_row_us} * 1000, cap);
      for (auto [n, bytes] :
           {std::pair<std::uint32_t, std::uint64_t>{1024, 4096}, {24, 512 << 10}, {64, 4096}, {1, 4096}}) {
        if (n > std::max(o.iops_batch, 1024u)) continue;  // the slots grew to this at most
        Row row;
        row.kind = "latency";
        row.latency_us = o.latency_row_us;
        row.namespace_memory = "gpu";
        row = run_row(drives, 1, 1, 1, n, bytes, 30.0, o.latency_batches, o.warps_per_queue, row);
        print(row);
        failed = failed || row.errors != 0;
        rows.push_back(row);
      }
    }
    for (auto& d : drives) (void)d->runtime->shutdown(5 * kSecond);
  }
  {
    auto drives = run_set(true, o.gbps_batch, 512 << 10, "gbps");
    for (auto& d : drives) (void)d->runtime->shutdown(5 * kSecond);
  }
  // Ratios.
  const double raw = raw_commands_per_second(o.raw_json);
  double best_iops = 0, iops_4x70 = 0, gbps_4x70 = 0, best_gbps = 0;
  for (const Row& r : rows) {
    if (r.errors != 0) continue;
    if (r.kind == "iops") best_iops = std::max(best_iops, r.iops);
    if (r.kind == "gbps") best_gbps = std::max(best_gbps, r.gbps);
    if (r.kind == "iops" && r.controllers == 4 && r.latency_us == 70) iops_4x70 = r.iops;
    if (r.kind == "gbps" && r.controllers == 4 && r.latency_us == 70) gbps_4x70 = r.gbps;
  }
  std::printf(
      "ratios  best_iops/raw_queue=%s iops(4 ctl, 70us)/13M=%.3f gbps(4 ctl, 70us)/50=%.3f "
      "best_gbps/pinned_copy=%.3f\n",
      raw > 0 ? fmt::format("{:.3f} (raw {:.1f} M commands/s)", best_iops / raw, raw / 1e6).c_str()
              : "n/a (no --raw-json)",
      iops_4x70 / 13e6, gbps_4x70 / 50.0, copy_gbps > 0 ? best_gbps / copy_gbps : 0.0);
  if (!o.json.empty()) {
    nlohmann::json j;
    j["queue_state"] = o.queue_state;
    j["submit_poll_us"] = o.submit_poll_us;
    j["poll_kernel_us"] = o.poll_kernel_us;
    j["poll_stream_per_batch"] = o.poll_stream_per_batch;
    j["persistent_poller_warps"] = o.persistent_poller_warps;
    j["persistent_poller_idle_us"] = o.persistent_poller_idle_us;
    j["in_flight"] = o.in_flight;
    j["targets"] = targets;
    j["pinned_copy_gbps"] = copy_gbps;
    j["raw_queue_commands_per_second"] = raw;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) j["rows"].push_back(to_json(r));
    j["ratios"] = {{"best_iops_over_raw", raw > 0 ? best_iops / raw : 0.0},
                   {"iops_4_controllers_70us_over_13M", iops_4x70 / 13e6},
                   {"gbps_4_controllers_70us_over_50", gbps_4x70 / 50.0},
                   {"best_gbps_over_pinned_copy", copy_gbps > 0 ? best_gbps / copy_gbps : 0.0}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return failed ? 1 : 0;
}
