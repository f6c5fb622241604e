// The layer-wise restore pipeline, written once against any tutti::StorageRuntime:
//
//   for layer L:  read(L+1)  ||  compute(L)  ||  write(L-1)
//
// Reads restore the cached chunks' K/V tensors of the next layer while the current layer computes;
// writes store the recomputed (missed) chunks of the previous layer. Submission is windowed: when
// the backend pushes back (RESOURCE_EXHAUSTED, partial commit), the rejected requests are resubmitted
// after the oldest IO in flight completes, so nothing is silently dropped. Every tensor read is
// verified against its checksum.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tutti/tutti.hpp>

#include "dataset.hpp"
#include "progress.hpp"

namespace layerwise {

using Clock = std::chrono::steady_clock;

inline std::uint64_t elapsed_ns(Clock::time_point since) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

/// Bytes, requests and device commands moved by one phase, and its wall time.
struct PhaseStats {
  std::uint64_t bytes = 0;
  std::uint64_t requests = 0;
  std::uint64_t commands = 0;
  std::uint64_t ns = 0;
  double gigabytes_per_second() const { return ns ? static_cast<double>(bytes) / static_cast<double>(ns) : 0.0; }
};

/// Everything the example measures in one run (one repetition of --repeat). Not thread-safe: a helper
/// thread fills a Report of its own, which the driving thread adds with merge_checks.
struct Report {
  PhaseStats restore_only;  ///< All cached tensors read through the runtime, no compute.
  /// Most requests the runtime had accepted and not yet completed during restore_only: the queue depth
  /// Tutti kept, which the queue-depth-matched pread baseline gives itself as threads.
  std::uint64_t restore_max_in_flight = 0;
  PhaseStats pread_baseline;  ///< The same tensors through plain pread into the same memory, 1 thread.
  PhaseStats pread_parallel;  ///< The same again from pread_parallel_threads threads (host profile).
  std::uint32_t pread_parallel_threads = 0;
  PhaseStats pipeline_reads;
  PhaseStats pipeline_writes;
  std::uint64_t pipeline_ns = 0;
  std::uint64_t compute_ns = 0;
  /// Host profile: the part of compute_ns spent producing the missed chunks' K/V tensors (the rest is
  /// the sleep that pads each layer to --compute-ms). 0 in the CUDA build.
  std::uint64_t compute_produce_ns = 0;
  std::uint64_t read_stall_ns = 0;   ///< Time compute waited for reads.
  std::uint64_t write_stall_ns = 0;  ///< Time compute waited for writes.
  std::uint64_t verify_ns = 0;
  std::uint64_t verified_tensors = 0;
  std::uint64_t mismatched_tensors = 0;
  std::vector<std::string> mismatches;  ///< The first few, for the message.
  /// Tensors checked per source ("restore", "pread", "pipeline", "written", the CUDA build's baselines),
  /// in the order each source was first counted; the counts add up to verified_tensors.
  std::vector<std::pair<std::string, std::uint64_t>> verified_by_source;

  /// Counts one tensor checked by source `phase` (a mismatch is counted too, and the first 8 are named
  /// "<phase> layer L chunk C K|V"). Every check goes through here, so verified_tensors is the true count.
  void count_tensor(bool matched, std::string_view phase, std::uint32_t layer, std::uint32_t chunk,
                    std::uint32_t kind) {
    ++verified_tensors;
    add_source(phase, 1);
    if (matched) return;
    ++mismatched_tensors;
    if (mismatches.size() < kNamedMismatches)
      mismatches.push_back(fmt::format("{} layer {} chunk {} {}", phase, layer, chunk, kind == 0 ? "K" : "V"));
  }

  /// Adds the tensor counts and named mismatches of `other` (a helper thread's Report); not the timings.
  void merge_checks(const Report& other) {
    verified_tensors += other.verified_tensors;
    mismatched_tensors += other.mismatched_tensors;
    for (const auto& [source, count] : other.verified_by_source) add_source(source, count);
    for (const auto& m : other.mismatches)
      if (mismatches.size() < kNamedMismatches) mismatches.push_back(m);
  }

  /// "restore 1920, pread 1920, pipeline 1920, written 640": what each source checked.
  std::string checks_by_source() const {
    std::string out;
    for (const auto& [source, count] : verified_by_source)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", source, count);
    return out.empty() ? "none" : out;
  }

 private:
  static constexpr std::size_t kNamedMismatches = 8;
  void add_source(std::string_view source, std::uint64_t count) {
    for (auto& [name, n] : verified_by_source)
      if (name == source) {
        n += count;
        return;
      }
    verified_by_source.emplace_back(std::string(source), count);
  }
};

/// What bounded the pipeline: the activity that, made faster, would shorten it.
enum class Bound { COMPUTE, READS, WRITES };

/// The figures the verdict is drawn from: totals over all layers, in nanoseconds. The host profile fills
/// them from the compute thread's time split; the CUDA build from the compute stream's CUDA events (compute
/// and its waits) and the host thread's waits (which IO it waited for).
struct BoundFigures {
  std::uint32_t layers = 1;
  std::string_view compute_name = "compute";  ///< How the summary names the compute ("GPU compute").
  std::uint64_t pipeline_ns = 0;              ///< Wall time of read(L+1) || compute(L) || write(L-1) over all layers.
  std::uint64_t compute_ns = 0;               ///< Time the compute ran.
  std::uint64_t compute_waited_ns = 0;        ///< Time the compute waited for IO, reads and writes together.
  std::uint64_t read_wait_ns = 0;             ///< Time the thread driving the pipeline waited for reads to complete,
  std::uint64_t write_wait_ns = 0;            ///< and for writes: which IO the compute waited for.
  std::uint64_t restore_alone_ns = 0;         ///< The same reads with no compute (restore only), for reference.
};

/// Compute-bound when the compute waited for IO at most a tenth of its own time (IO stretched the
/// pipeline by at most 10% over the compute alone); otherwise IO bounded it: read-bound or write-bound
/// by which the thread driving the pipeline waited for longer.
inline Bound pipeline_bound(const BoundFigures& f) {
  if (f.compute_waited_ns <= f.compute_ns / 10) return Bound::COMPUTE;
  return f.read_wait_ns >= f.write_wait_ns ? Bound::READS : Bound::WRITES;
}

/// The verdict's name in the JSON report ("bound"): "compute", "reads" or "writes".
inline const char* bound_name(Bound b) {
  return b == Bound::COMPUTE ? "compute" : b == Bound::READS ? "reads" : "writes";
}

/// The summary's "per layer" line after its label, the same words in both builds, e.g.
/// "restore alone 6.25 ms, compute 2.50 ms, pipeline 22.50 ms: write-bound: compute waited 20.00 ms for IO,
/// 800% of its own time (more than 10%: IO stretched the pipeline); the pipeline's thread waited 0.50 ms for
/// reads, 19.50 ms for writes". The share printed is the quantity the verdict's rule (pipeline_bound) tests:
/// compute's wait for IO over compute's own time. All figures are per layer (totals / layers), in ms.
inline std::string layer_bound_line(const BoundFigures& f) {
  const double layers = static_cast<double>(std::max(1u, f.layers));
  auto per_layer_ms = [&](std::uint64_t ns) { return static_cast<double>(ns) / 1e6 / layers; };
  const Bound bound = pipeline_bound(f);
  std::string share;
  if (f.compute_ns > 0) {
    const double percent = 100.0 * static_cast<double>(f.compute_waited_ns) / static_cast<double>(f.compute_ns);
    share = fmt::format("{:.{}f}% of its own time", percent, percent < 100 ? 1 : 0);  // 10.1% is not "10%"
  } else
    share = f.compute_waited_ns > 0 ? "with no compute time" : "0% of its own time";
  return fmt::format(
      "restore alone {:.2f} ms, {} {:.2f} ms, pipeline {:.2f} ms: {}-bound: compute waited {:.2f} ms for IO, {} ({}); "
      "the pipeline's thread waited {:.2f} ms for reads, {:.2f} ms for writes",
      per_layer_ms(f.restore_alone_ns), f.compute_name, per_layer_ms(f.compute_ns), per_layer_ms(f.pipeline_ns),
      bound == Bound::COMPUTE ? "compute"
      : bound == Bound::READS ? "read"
                              : "write",
      per_layer_ms(f.compute_waited_ns), share,
      bound == Bound::COMPUTE ? "10% or less: IO hides behind compute" : "more than 10%: IO stretched the pipeline",
      per_layer_ms(f.read_wait_ns), per_layer_ms(f.write_wait_ns));
}

/// What the host profile's simulated compute line adds after "took T ms", per layer in ms: why a layer's
/// compute took longer than --compute-ms (`asked`). Producing the missed chunks' K/V (`produce`) can take
/// longer than asked; beyond max(asked, produce) the thread woke late (a busy machine). Both causes are
/// named when both apply; "" when `took` is within 10% (+0.05 ms) of what they explain.
inline std::string compute_note(double asked, double produce, double took) {
  std::vector<std::string> causes;
  if (produce > asked) causes.push_back("producing the K/V alone takes longer than --compute-ms");
  const double expected = std::max(asked, produce), late = took - expected;
  if (late > 0.1 * expected + 0.05)
    causes.push_back(fmt::format("the thread woke {:.2f} ms late: the machine is busy", late));
  if (causes.empty()) return "";
  return causes.size() == 1 ? fmt::format(" ({})", causes[0]) : fmt::format(" ({}; {})", causes[0], causes[1]);
}

struct Settings {
  Shape shape;
  std::uint64_t compute_ns_per_layer = 2'000'000;
  bool verify = true;
  std::uint64_t io_timeout_ns = 60'000'000'000;  ///< Bound on any single wait.
  /// Salt of the tensors this run computes and writes (misses): differs per run, so verification of
  /// the written tensors cannot pass on bytes an earlier run wrote.
  std::uint64_t run_salt = 1;
};

/// Checks the cached tensors of `layer` as one slot holds them (chunk-major, K then V, host bytes)
/// against their checksums, into `report` under `phase`.
inline void check_cached_layer(const std::byte* slot, std::uint32_t layer, const Shape& shape, const Checksums& sums,
                               std::string_view phase, Report& report) {
  std::uint64_t index = 0;
  for (std::uint32_t c = 0; c < shape.hit_chunks(); ++c)
    for (std::uint32_t k = 0; k < 2; ++k, ++index)
      report.count_tensor(
          checksum(std::span(slot + index * shape.tensor_bytes, shape.tensor_bytes)) == sums.at(layer, c, k), phase,
          layer, c, k);
}

/// Checks the missed tensors of `layer` as read back from the files (chunk-major, K then V, host
/// bytes) against this run's salted content, so bytes an earlier run or the preparation left in the
/// files cannot pass for a write that did not land.
inline void check_written_layer(const std::byte* written, std::uint32_t layer, const Shape& shape, std::uint64_t salt,
                                Report& report) {
  std::vector<std::byte> expected(shape.tensor_bytes);
  std::uint64_t index = 0;
  for (std::uint32_t c = shape.hit_chunks(); c < shape.chunks(); ++c)
    for (std::uint32_t k = 0; k < 2; ++k, ++index) {
      fill_tensor(expected, layer, c, k, salt);
      report.count_tensor(std::memcmp(written + index * shape.tensor_bytes, expected.data(), expected.size()) == 0,
                          "written", layer, c, k);
    }
}

/// Where a Pipeline's KV slots come from when plain host memory will not do: --backend nvme takes them from
/// its tuttid lease (LeasedController::allocate_host_memory), the only memory the soft controller, which
/// runs in tuttid's process, can reach.
class HostMemorySource {
 public:
  virtual ~HostMemorySource() = default;
  /// `bytes` of zeroed memory, 4096-byte aligned; the error says why there is none.
  virtual tutti::Result<std::byte*> allocate(std::uint64_t bytes) = 0;
  /// Gives back what allocate returned, once the runtime no longer references it.
  virtual void release(std::byte* data, std::uint64_t bytes) = 0;
};

/// Aligned host memory that is freed only after the runtime no longer references it.
struct AlignedBuffer {
  std::byte* data = nullptr;
  std::uint64_t size = 0;
  HostMemorySource* source = nullptr;  ///< null: aligned_alloc
  tutti::Status status;                ///< why data is null
  /// Allocates (from `from`, else aligned_alloc) and touches every page (so no phase pays first-touch
  /// faults); data is null when the allocation failed, and status says why.
  explicit AlignedBuffer(std::uint64_t bytes, HostMemorySource* from = nullptr) : size(bytes), source(from) {
    if (source != nullptr) {
      auto got = source->allocate(bytes);
      if (got) data = *got;
      status = got.status();
    } else {
      data = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
      if (data == nullptr) status = tutti::error(tutti::StatusCode::RESOURCE_EXHAUSTED, "no {} bytes of memory", bytes);
    }
    if (data) std::memset(data, 0, bytes);
  }
  ~AlignedBuffer() {
    if (source != nullptr && data != nullptr)
      source->release(data, size);
    else
      std::free(data);
  }
  /// Gives the memory up for good: used when a device may still write into it.
  void leak() { data = nullptr; }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

/// Bytes of a Pipeline's read slots (two layers' cached tensors) and of its write slots (two layers' missed
/// ones); at least one tensor each.
inline std::uint64_t read_slot_bytes(const Shape& shape) {
  return std::max<std::uint64_t>(1, 2 * std::uint64_t{shape.hit_chunks()} * 2) * shape.tensor_bytes;
}
inline std::uint64_t write_slot_bytes(const Shape& shape) {
  return std::max<std::uint64_t>(1, 2 * std::uint64_t{shape.miss_chunks()} * 2) * shape.tensor_bytes;
}

/// Submits request lists to completion through a runtime, resubmitting what the backend rejects with
/// RESOURCE_EXHAUSTED once earlier IO completes. Not thread-safe: one Window per submitting thread.
template <class Runtime>
class Window {
 public:
  Window(Runtime& runtime, std::uint64_t timeout_ns) : runtime_(runtime), timeout_ns_(timeout_ns) {}
  /// On error paths a Window can go out of scope with IO in flight: wait for it (bounded) here, so
  /// the Pipeline's unregister below sees no IO in flight.
  ~Window() { (void)settle(timeout_ns_); }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  /// Returns once every request was accepted (some may still be in flight), or on a hard error.
  tutti::Status submit(std::vector<tutti::IoRequest> pending) {
    const auto start = Clock::now();
    while (!pending.empty()) {
      auto outcome = runtime_.submit(pending);
      if (outcome.accepted > 0) {
        in_flight_.push_back(outcome.io);  // tracked before any early return
        in_flight_requests_ += outcome.accepted;
        max_in_flight_requests_ = std::max(max_in_flight_requests_, in_flight_requests_);
      }
      std::vector<tutti::IoRequest> rejected;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        const tutti::Status& s = outcome.initial_states[i];
        if (s.is_ok()) continue;
        if (s.code() != tutti::StatusCode::RESOURCE_EXHAUSTED) return s.with_context(fmt::format("request {}", i));
        rejected.push_back(pending[i]);
      }
      if (!rejected.empty()) {
        ++resubmissions_;
        if (elapsed_ns(start) > timeout_ns_)
          return tutti::error(tutti::StatusCode::TIMEOUT, "{} still rejected after {} ns",
                              counted(rejected.size(), "request"), timeout_ns_);
        if (in_flight_.empty())
          std::this_thread::sleep_for(std::chrono::microseconds(50));  // pushed back by other users
        else
          TUTTI_RETURN_IF_ERROR(complete_oldest());
      }
      pending = std::move(rejected);
    }
    return tutti::Status::success();
  }

  /// Waits for every IO in flight; fails on any request that did not move all its bytes.
  tutti::Status drain() {
    while (!in_flight_.empty()) TUTTI_RETURN_IF_ERROR(complete_oldest());
    return tutti::Status::success();
  }

  /// Error path: waits (bounded) for whatever is still in flight so its memory can be released.
  /// Returns false when IO is still in flight afterwards: the caller must then not free the memory.
  bool settle(std::uint64_t budget_ns) {
    while (!in_flight_.empty()) {
      auto result = runtime_.wait(in_flight_.front(), budget_ns);
      if (!result) return false;
      (void)runtime_.release(in_flight_.front());
      in_flight_.pop_front();
    }
    return true;
  }

  const PhaseStats& stats() const { return stats_; }
  std::uint64_t resubmissions() const { return resubmissions_; }
  /// Most requests accepted by the runtime and not yet completed at any time: the queue depth kept.
  std::uint64_t max_in_flight_requests() const { return max_in_flight_requests_; }

 private:
  tutti::Status complete_oldest() {
    tutti::IoHandle io = in_flight_.front();
    auto result = runtime_.wait(io, timeout_ns_);
    if (!result) return result.status();  // still in flight: keep the handle (see abandon())
    in_flight_.pop_front();
    in_flight_requests_ -= std::min<std::uint64_t>(in_flight_requests_, result->requests);
    (void)runtime_.release(io);
    TUTTI_RETURN_IF_ERROR(result->status);
    if (result->confirmed_bytes != result->requested_bytes)
      return tutti::error(tutti::StatusCode::DATA_LOSS, "IO confirmed {} of {} bytes", result->confirmed_bytes,
                          result->requested_bytes);
    stats_.bytes += result->confirmed_bytes;
    stats_.requests += result->requests;
    stats_.commands += result->commands;
    return tutti::Status::success();
  }

  Runtime& runtime_;
  std::uint64_t timeout_ns_;
  std::deque<tutti::IoHandle> in_flight_;
  PhaseStats stats_;
  std::uint64_t resubmissions_ = 0;
  std::uint64_t in_flight_requests_ = 0;
  std::uint64_t max_in_flight_requests_ = 0;
};

/// The pipeline over one runtime and one data set (one target per layer).
template <class Runtime>
class Pipeline {
 public:
  /// `memory`: where the KV slots come from (null: aligned_alloc); it must outlive the Pipeline.
  Pipeline(Runtime& runtime, const Settings& settings, const Checksums& checksums, HostMemorySource* memory = nullptr)
      : runtime_(runtime),
        settings_(settings),
        checksums_(checksums),
        hit_tensors_(settings.shape.hit_chunks() * 2),
        miss_tensors_(settings.shape.miss_chunks() * 2),
        reads_(read_slot_bytes(settings.shape), memory),
        writes_(write_slot_bytes(settings.shape), memory) {}

  /// Unregisters the buffers; a buffer the runtime still uses (BUSY) is leaked rather than freed
  /// under a device that may still write it.
  ~Pipeline() {
    if (!read_memory_.is_null() && !runtime_.unregister_memory(read_memory_).is_ok()) reads_.leak();
    if (!write_memory_.is_null() && !runtime_.unregister_memory(write_memory_).is_ok()) writes_.leak();
    for (auto t : layers_) (void)runtime_.close(t);
  }

  /// Opens one target per layer (in parallel) and registers the read and write buffers.
  tutti::Status open(const std::vector<std::string>& uris) {
    auto opened = runtime_.open_batch(uris, {.writable = true});
    for (std::size_t i = 0; i < opened.size(); ++i) {
      if (!opened[i]) return opened[i].status();
      layers_.push_back(*opened[i]);
    }
    for (const AlignedBuffer* b : {&reads_, &writes_})
      if (b->data == nullptr) return b->status.with_context(fmt::format("KV slots of {} bytes", b->size));
    auto r = runtime_.register_memory({reads_.data, reads_.size, tutti::MemoryKind::HOST});
    if (!r) return r.status();
    read_memory_ = *r;
    auto w = runtime_.register_memory({writes_.data, writes_.size, tutti::MemoryKind::HOST});
    if (!w) return w.status();
    write_memory_ = *w;
    return tutti::Status::success();
  }

  std::byte* read_slot(std::uint32_t layer) { return reads_.data + (layer % 2) * hit_tensors_ * tensor_bytes(); }

  /// Phase 1: restore every cached tensor through the runtime with no compute. Layer L is verified
  /// on a helper thread while read(L+1) is in flight, so the figure measures IO, not hashing.
  tutti::Status restore_only(Report& report) {
    Window<Runtime> window(runtime_, settings_.io_timeout_ns);
    Report verified;              // declared first: outlives the verification thread below
    std::future<void> verifying;  // verification of the previous layer, writing into `verified`
    const auto start = Clock::now();
    TUTTI_RETURN_IF_ERROR(window.submit(read_requests(0)));
    for (std::uint32_t layer = 0; layer < layers(); ++layer) {
      TUTTI_RETURN_IF_ERROR(window.drain());
      if (verifying.valid()) verifying.wait();  // read(L+1) reuses the slot of layer L-1
      if (layer + 1 < layers()) TUTTI_RETURN_IF_ERROR(window.submit(read_requests(layer + 1)));
      verifying =
          std::async(std::launch::async, [this, layer, &verified] { verify_layer(layer, "restore", verified); });
    }
    report.restore_only = window.stats();
    report.restore_only.ns = elapsed_ns(start);  // IO only: the last layer's hashing is not counted
    report.restore_max_in_flight = window.max_in_flight_requests();
    if (verifying.valid()) verifying.wait();
    report.merge_checks(verified);
    return tutti::Status::success();
  }

  /// Phase 2: read(L+1) || compute(L) || write(L-1).
  tutti::Status run(Report& report) {
    Window<Runtime> reads(runtime_, settings_.io_timeout_ns);
    Window<Runtime> writes(runtime_, settings_.io_timeout_ns);
    const auto start = Clock::now();
    TUTTI_RETURN_IF_ERROR(reads.submit(read_requests(0)));
    for (std::uint32_t layer = 0; layer < layers(); ++layer) {
      auto t = Clock::now();
      TUTTI_RETURN_IF_ERROR(reads.drain());
      report.read_stall_ns += elapsed_ns(t);
      verify_layer(layer, "pipeline", report);
      if (layer + 1 < layers()) TUTTI_RETURN_IF_ERROR(reads.submit(read_requests(layer + 1)));
      if (layer >= 1) TUTTI_RETURN_IF_ERROR(writes.submit(write_requests(layer - 1)));
      compute(layer, report);
      t = Clock::now();
      TUTTI_RETURN_IF_ERROR(writes.drain());
      report.write_stall_ns += elapsed_ns(t);
    }
    if (layers() >= 1) TUTTI_RETURN_IF_ERROR(writes.submit(write_requests(layers() - 1)));
    auto t = Clock::now();
    TUTTI_RETURN_IF_ERROR(writes.drain());
    report.write_stall_ns += elapsed_ns(t);
    report.pipeline_ns = elapsed_ns(start);
    report.pipeline_reads = reads.stats();
    report.pipeline_writes = writes.stats();
    report.pipeline_reads.ns = report.pipeline_writes.ns = report.pipeline_ns;  // both ran the whole pipeline
    return tutti::Status::success();
  }

  /// Reads back every tensor the pipeline wrote and verifies it.
  tutti::Status verify_written(Report& report) {
    if (miss_tensors_ == 0) return tutti::Status::success();
    for (std::uint32_t layer = 0; layer < layers(); ++layer) {
      std::vector<tutti::IoRequest> requests = write_requests(layer);
      for (auto& r : requests) r.direction = tutti::Direction::READ;
      std::fill(writes_.data, writes_.data + writes_.size, std::byte{0xa5});
      Window<Runtime> window(runtime_, settings_.io_timeout_ns);
      TUTTI_RETURN_IF_ERROR(window.submit(std::move(requests)));
      TUTTI_RETURN_IF_ERROR(window.drain());
      check_written_layer(writes_.data + (layer % 2) * miss_tensors_ * tensor_bytes(), layer, settings_.shape,
                          settings_.run_salt, report);
    }
    return tutti::Status::success();
  }

  std::uint32_t layers() const { return settings_.shape.layers; }
  std::uint64_t tensor_bytes() const { return settings_.shape.tensor_bytes; }

 private:
  /// The reads of one layer's cached tensors into its slot. When verifying, the slot is poisoned
  /// first, so a read that moves no bytes cannot pass on what an earlier phase left there.
  std::vector<tutti::IoRequest> read_requests(std::uint32_t layer) {
    std::vector<tutti::IoRequest> out;
    const std::uint64_t base = (layer % 2) * hit_tensors_ * tensor_bytes();
    if (settings_.verify) std::memset(reads_.data + base, 0xa5, hit_tensors_ * tensor_bytes());
    std::uint64_t index = 0;
    for (std::uint32_t c = 0; c < settings_.shape.hit_chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k, ++index)
        out.push_back({tutti::Direction::READ, read_memory_, base + index * tensor_bytes(), layers_[layer],
                       settings_.shape.tensor_offset(c, k), tensor_bytes()});
    return out;
  }

  std::vector<tutti::IoRequest> write_requests(std::uint32_t layer) const {
    std::vector<tutti::IoRequest> out;
    const std::uint64_t base = (layer % 2) * miss_tensors_ * tensor_bytes();
    std::uint64_t index = 0;
    for (std::uint32_t c = settings_.shape.hit_chunks(); c < settings_.shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k, ++index)
        out.push_back({tutti::Direction::WRITE, write_memory_, base + index * tensor_bytes(), layers_[layer],
                       settings_.shape.tensor_offset(c, k), tensor_bytes()});
    return out;
  }

  /// Simulated compute of one layer (host profile; the CUDA build runs GEMMs): produces the missed
  /// chunks' K/V into the write slot (a splitmix64 stream per tensor, on this thread), then sleeps out
  /// the rest of the layer's compute time. When producing them alone takes longer than
  /// compute_ns_per_layer, the layer's compute takes that longer time (Report::compute_produce_ns).
  void compute(std::uint32_t layer, Report& report) {
    const auto start = Clock::now();
    std::byte* slot = writes_.data + (layer % 2) * miss_tensors_ * tensor_bytes();
    std::uint32_t index = 0;
    for (std::uint32_t c = settings_.shape.hit_chunks(); c < settings_.shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k, ++index)
        fill_tensor(std::span(slot + index * tensor_bytes(), tensor_bytes()), layer, c, k, settings_.run_salt);
    report.compute_produce_ns += elapsed_ns(start);
    const auto end = start + std::chrono::nanoseconds(settings_.compute_ns_per_layer);
    std::this_thread::sleep_until(end);
    report.compute_ns += elapsed_ns(start);
  }

  void verify_layer(std::uint32_t layer, std::string_view phase, Report& report) {
    if (!settings_.verify) return;
    const auto start = Clock::now();
    check_cached_layer(read_slot(layer), layer, settings_.shape, checksums_, phase, report);
    report.verify_ns += elapsed_ns(start);
  }

  Runtime& runtime_;
  Settings settings_;
  const Checksums& checksums_;
  std::uint64_t hit_tensors_;
  std::uint64_t miss_tensors_;
  AlignedBuffer reads_;
  AlignedBuffer writes_;
  std::vector<tutti::TargetHandle> layers_;
  tutti::MemoryHandle read_memory_;
  tutti::MemoryHandle write_memory_;
};

}  // namespace layerwise
