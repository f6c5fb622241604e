// The layer-wise restore pipeline with the KV slots in GPU memory (CUDA build, LAYERWISE_GPU):
//
//   for layer L:  read(L+1) -> device slot  ||  compute(L) on the compute stream  ||  write(L-1) <- device slot
//
// The storage runtime moves file bytes into DEVICE memory (the uring DataPath stages them through pinned
// host buffers) and reports a read done only once its bytes are in device memory. The host thread then
// launches compute(L) (the fill of the recomputed tensors, the GEMMs) on the compute stream and moves on:
// it never waits for compute(L) except where a buffer is reused:
//   - write(L-1) is submitted once compute(L-1)'s end event completed (its tensors exist);
//   - read(L+1) lands in the slot compute(L-1) read, so it also waits for that event.
// Verification: every tensor read is copied back to pinned host memory on a stream of its own and hashed
// (XXH3) on a helper thread while the pipeline goes on; the copy, not the hash, gates the slot's reuse.
//
// The baselines read the same cached tensors of the same files into the same device slots without
// Tutti: pread (O_DIRECT) into a pinned bounce buffer + cudaMemcpy, and cuFile (cuFileRead; compat mode
// where the nvidia-fs module is absent). One thread each, one tensor at a time.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tutti/tutti.hpp>

#include "baselines.hpp"
#include "dataset.hpp"
#include "gpu_compute.hpp"
#include "pipeline.hpp"

namespace layerwise {

/// What the GPU build measures beyond Report.
struct GpuReport {
  std::string device;     ///< Gpu::description().
  gpu::GemmFigures gemm;  ///< Calibration of the MLP GEMM (GEMM mode).
  bool use_gemm = true;
  std::uint64_t gpu_compute_ns = 0;  ///< Sum over layers of the compute stream's time (events).
  /// Host thread's time in reads.drain() (it waits for read(L) while the GPU may still compute L-1);
  /// Report::read_stall_ns is the GPU's wait instead (the compute stream's idle time before each layer).
  std::uint64_t host_read_wait_ns = 0;
  /// The cached tensors through cuFileRead into the same device slots, with 1 and with 8 reads in
  /// flight (8: the uring DataPath's default staging buffers, Tutti's concurrency into device memory).
  struct CufileRun {
    std::uint32_t threads = 0;
    PhaseStats stats;
  };
  std::vector<CufileRun> cufile_runs;
  std::string cufile_mode;   ///< cufile_reader.hpp's DriverInfo::describe(): compat or GPUDirect.
  std::string cufile_error;  ///< Why the cuFile baseline did not run; empty when it ran.
};

/// Hashes device slots on a helper thread after an asynchronous copy to pinned host memory. Two host
/// buffers, used by layers of alternating parity. Driven by one thread.
class SlotVerifier {
 public:
  SlotVerifier(gpu::Gpu& gpu, const Checksums& sums, const Shape& shape, std::array<std::byte*, 2> host,
               std::uint64_t timeout_ns, bool enabled)
      : gpu_(gpu), sums_(sums), shape_(shape), host_(host), timeout_ns_(timeout_ns), enabled_(enabled) {}
  ~SlotVerifier() {
    for (auto& p : pending_)
      if (p.valid()) p.wait();
  }
  SlotVerifier(const SlotVerifier&) = delete;
  SlotVerifier& operator=(const SlotVerifier&) = delete;

  /// Starts verifying layer `layer`'s cached tensors at `slot` (device memory). Finishes the hash of
  /// layer - 2 first (it used the same host buffer). Does nothing when verification is off.
  tutti::Status start(std::uint32_t layer, const std::byte* slot, const char* phase) {
    if (!enabled_) return tutti::Status::success();
    const int parity = static_cast<int>(layer % 2);
    TUTTI_RETURN_IF_ERROR(collect(parity));
    const std::uint64_t bytes = std::uint64_t{shape_.hit_chunks()} * 2 * shape_.tensor_bytes;
    if (bytes == 0) return tutti::Status::success();
    TUTTI_RETURN_IF_ERROR(gpu_.copy_to_host_async(host_[parity], slot, bytes, parity));
    started_[parity] = true;
    pending_[parity] = std::async(std::launch::async, [this, layer, parity, phase] {
      Outcome out;
      const auto start = Clock::now();
      out.status = gpu_.wait_verification(parity, timeout_ns_);
      if (!out.status.is_ok()) return out;
      check_cached_layer(host_[parity], layer, shape_, sums_, phase, out.report);
      out.report.verify_ns = elapsed_ns(start);
      return out;
    });
    return tutti::Status::success();
  }

  /// Waits (bounded) until the copy of the slot of layer `layer` left device memory: the slot may be
  /// overwritten afterwards.
  tutti::Status copied(std::uint32_t layer) {
    const int parity = static_cast<int>(layer % 2);
    if (!started_[parity]) return tutti::Status::success();
    return gpu_.wait_verification(parity, timeout_ns_);
  }

  /// Finishes every hash and adds the results to `report`.
  tutti::Status finish(Report& report) {
    tutti::Status first = collect(0);
    tutti::Status second = collect(1);
    report.merge_checks(verified_);
    report.verify_ns += verified_.verify_ns;
    verified_ = Report{};
    return first.is_ok() ? second : first;
  }

 private:
  struct Outcome {
    tutti::Status status;
    Report report;
  };

  tutti::Status collect(int parity) {
    if (!pending_[parity].valid()) return tutti::Status::success();
    Outcome out = pending_[parity].get();
    verified_.merge_checks(out.report);
    verified_.verify_ns += out.report.verify_ns;
    return out.status;
  }

  gpu::Gpu& gpu_;
  const Checksums& sums_;
  Shape shape_;
  std::array<std::byte*, 2> host_;
  std::uint64_t timeout_ns_;
  bool enabled_;
  std::array<bool, 2> started_{false, false};
  std::array<std::future<Outcome>, 2> pending_;
  Report verified_;
};

/// The pipeline with device KV slots, over one runtime and one data set (one target per layer).
template <class Runtime>
class GpuPipeline {
 public:
  GpuPipeline(Runtime& runtime, gpu::Gpu& gpu, const Settings& settings, const Checksums& checksums)
      : runtime_(runtime),
        gpu_(gpu),
        settings_(settings),
        checksums_(checksums),
        hit_tensors_(settings.shape.hit_chunks() * 2),
        miss_tensors_(settings.shape.miss_chunks() * 2) {}

  /// Unregisters the device slots; when the runtime refuses (IO still in flight), the Gpu keeps all its
  /// memory for good rather than free it under a transfer.
  ~GpuPipeline() {
    bool released = true;
    if (!read_memory_.is_null()) released = runtime_.unregister_memory(read_memory_).is_ok() && released;
    if (!write_memory_.is_null()) released = runtime_.unregister_memory(write_memory_).is_ok() && released;
    if (!released) gpu_.keep_memory();
    for (auto t : layers_) (void)runtime_.close(t);
  }
  GpuPipeline(const GpuPipeline&) = delete;
  GpuPipeline& operator=(const GpuPipeline&) = delete;

  /// Opens one target per layer, allocates the device slots (2 x cached tensors for reads, 2 x missed
  /// tensors for writes), the pinned verification buffers and the baseline's bounce buffer, and registers
  /// the slots with the runtime as DEVICE memory of the Gpu's accelerator.
  tutti::Status open(const std::vector<std::string>& uris) {
    auto opened = runtime_.open_batch(uris, {.writable = true});
    for (std::size_t i = 0; i < opened.size(); ++i) {
      if (!opened[i]) return opened[i].status();
      layers_.push_back(*opened[i]);
    }
    const std::uint64_t tb = tensor_bytes();
    const std::uint64_t read_bytes = std::max<std::uint64_t>(1, hit_tensors_) * tb;
    const std::uint64_t write_bytes = std::max<std::uint64_t>(1, miss_tensors_) * tb;
    auto reads = gpu_.allocate_device(2 * read_bytes);
    if (!reads) return reads.status();
    reads_ = *reads;
    auto writes = gpu_.allocate_device(2 * write_bytes);
    if (!writes) return writes.status();
    writes_ = *writes;
    for (int i = 0; i < 2; ++i) {
      auto host = gpu_.allocate_pinned(read_bytes);
      if (!host) return host.status();
      verify_host_[static_cast<std::size_t>(i)] = *host;
    }
    auto written = gpu_.allocate_pinned(write_bytes);
    if (!written) return written.status();
    written_host_ = *written;
    auto bounce = gpu_.allocate_pinned(tb);
    if (!bounce) return bounce.status();
    bounce_ = *bounce;
    auto r = runtime_.register_memory({reads_, 2 * read_bytes, tutti::MemoryKind::DEVICE, gpu_.ordinal()});
    if (!r) return r.status();
    read_memory_ = *r;
    auto w = runtime_.register_memory({writes_, 2 * write_bytes, tutti::MemoryKind::DEVICE, gpu_.ordinal()});
    if (!w) return w.status();
    write_memory_ = *w;
    return tutti::Status::success();
  }

  std::byte* read_slot(std::uint32_t layer) const { return reads_ + (layer % 2) * hit_tensors_ * tensor_bytes(); }
  std::byte* write_slot(std::uint32_t layer) const { return writes_ + (layer % 2) * miss_tensors_ * tensor_bytes(); }

  /// Phase 1: every cached tensor through the runtime into device memory, no compute. Verification runs
  /// beside it (copy + hash); the figure is the IO's wall time.
  tutti::Status restore_only(Report& report) {
    SlotVerifier verifier = make_verifier();
    Window<Runtime> window(runtime_, settings_.io_timeout_ns);
    const auto start = Clock::now();
    TUTTI_RETURN_IF_ERROR(submit_reads(window, 0));
    for (std::uint32_t layer = 0; layer < layers(); ++layer) {
      TUTTI_RETURN_IF_ERROR(window.drain());
      TUTTI_RETURN_IF_ERROR(verifier.start(layer, read_slot(layer), "restore"));
      if (layer + 1 < layers()) {
        if (layer >= 1) TUTTI_RETURN_IF_ERROR(verifier.copied(layer - 1));  // read(L+1) reuses its slot
        TUTTI_RETURN_IF_ERROR(submit_reads(window, layer + 1));
      }
    }
    report.restore_only = window.stats();
    report.restore_only.ns = elapsed_ns(start);
    return verifier.finish(report);
  }

  /// Baseline: pread (O_DIRECT, one tensor at a time) into a pinned bounce buffer, then cudaMemcpy into
  /// the same device slot. Timed: the pread and the copy. Verified after each layer, untimed. The layer
  /// files are in `dirs[0]`, or striped (shape.stripe_devices = N) their shard i in `dirs[i]`: each tensor
  /// is read from the shard it lies on (detail::pread_tensor, baselines.hpp).
  tutti::Status pread_baseline(const std::vector<std::filesystem::path>& dirs, Report& report) {
    const Shape& shape = settings_.shape;
    auto files = detail::open_layer_files(shape, dirs);
    if (!files) return files.status();
    for (std::uint32_t l = 0; l < layers(); ++l) {
      std::byte* slot = read_slot(l);
      TUTTI_RETURN_IF_ERROR(poison(slot, hit_tensors_ * tensor_bytes()));
      for (std::uint32_t index = 0; index < hit_tensors_; ++index) {
        const auto t = Clock::now();
        TUTTI_RETURN_IF_ERROR(detail::pread_tensor((*files)[l], bounce_, index, shape, l));
        TUTTI_RETURN_IF_ERROR(
            gpu_.copy_to_device(slot + std::uint64_t{index} * tensor_bytes(), bounce_, tensor_bytes()));
        report.pread_baseline.ns += elapsed_ns(t);
        report.pread_baseline.bytes += tensor_bytes();
        ++report.pread_baseline.requests;
      }
      TUTTI_RETURN_IF_ERROR(verify_slot_now(l, "pread+cudaMemcpy", report));
    }
    return tutti::Status::success();
  }

  /// Baseline: cuFileRead (bench/support/cufile_reader.hpp) of each layer's cached tensors into the same
  /// device slot, once with 1 and once with 8 reads in flight. Timed: the reads of each layer (not the
  /// file's open and registration). cuFile is a baseline: a driver, file registration or read that
  /// fails stops it and is recorded in gpu_report.cufile_error (the summary prints it, and only runs
  /// that completed are reported); it is not an error of the run. Tensors it did deliver are verified,
  /// and a mismatch fails the run like any other.
  tutti::Status cufile_baseline(const std::vector<std::filesystem::path>& dirs, Report& report, GpuReport& gpu_report) {
    const Shape& shape = settings_.shape;
    const std::uint64_t slots_bytes = 2 * std::max<std::uint64_t>(1, hit_tensors_) * tensor_bytes();
    if (auto s = gpu_.cufile_open(reads_, slots_bytes); !s.is_ok()) {
      gpu_report.cufile_error = s.to_string();
      return tutti::Status::success();
    }
    gpu_report.cufile_mode = gpu_.cufile_description();
    for (std::uint32_t threads : {1u, 8u}) {
      GpuReport::CufileRun run{threads, {}};
      for (std::uint32_t l = 0; l < layers(); ++l) {
        std::byte* slot = read_slot(l);
        TUTTI_RETURN_IF_ERROR(poison(slot, hit_tensors_ * tensor_bytes()));
        // The layer's tensors grouped by the file they lie on: its layer file, or (striped) each shard
        // file with the tensors striped_file::place puts there, at their shard offsets.
        std::vector<std::vector<gpu::Gpu::FileRange>> ranges(dirs.size());
        std::uint32_t index = 0;
        for (std::uint32_t c = 0; c < shape.hit_chunks(); ++c)
          for (std::uint32_t k = 0; k < 2; ++k, ++index) {
            const auto at = tutti::striped_file::place(shape.tensor_offset(c, k), tensor_bytes(),
                                                       static_cast<std::uint32_t>(dirs.size()));
            ranges[at.shard].push_back(
                {at.shard_offset, static_cast<std::uint64_t>(slot - reads_) + std::uint64_t{index} * tensor_bytes(),
                 tensor_bytes()});
          }
        for (std::size_t shard = 0; shard < dirs.size(); ++shard) {
          if (ranges[shard].empty()) continue;
          auto ns = gpu_.cufile_read((dirs[shard] / shape.layer_file_name(l)).string(), ranges[shard], threads,
                                     settings_.io_timeout_ns);
          if (!ns) {
            gpu_report.cufile_error =
                ns.status().with_context(fmt::format("{} thread(s), layer {}", threads, l)).to_string();
            gpu_.cufile_close();
            return tutti::Status::success();
          }
          run.stats.ns += *ns;
          run.stats.bytes += ranges[shard].size() * tensor_bytes();
          run.stats.requests += ranges[shard].size();
        }
        TUTTI_RETURN_IF_ERROR(verify_slot_now(l, threads == 1 ? "cuFile" : "cuFile x8", report));
      }
      gpu_report.cufile_runs.push_back(run);
    }
    gpu_.cufile_close();
    return tutti::Status::success();
  }

  /// Phase 2: read(L+1) || compute(L) || write(L-1), compute on the GPU.
  tutti::Status run(Report& report, GpuReport& gpu_report) {
    SlotVerifier verifier = make_verifier();
    Window<Runtime> reads(runtime_, settings_.io_timeout_ns);
    Window<Runtime> writes(runtime_, settings_.io_timeout_ns);
    const std::uint64_t timeout = settings_.io_timeout_ns;
    const auto start = Clock::now();
    TUTTI_RETURN_IF_ERROR(gpu_.mark_start());
    TUTTI_RETURN_IF_ERROR(submit_reads(reads, 0));
    for (std::uint32_t layer = 0; layer < layers(); ++layer) {
      auto t = Clock::now();
      TUTTI_RETURN_IF_ERROR(reads.drain());  // the layer's K/V are in device memory
      gpu_report.host_read_wait_ns += elapsed_ns(t);
      const std::vector<std::uint64_t> seeds = missed_seeds(layer);
      TUTTI_RETURN_IF_ERROR(gpu_.launch_layer(layer, read_slot(layer), settings_.shape.hit_chunks(), write_slot(layer),
                                              seeds.data(), static_cast<std::uint32_t>(seeds.size())));
      TUTTI_RETURN_IF_ERROR(verifier.start(layer, read_slot(layer), "pipeline"));
      if (layer >= 1) {
        t = Clock::now();
        TUTTI_RETURN_IF_ERROR(gpu_.wait_layer(layer - 1, timeout));  // its tensors exist; its read slot is free
        report.write_stall_ns += elapsed_ns(t);
        TUTTI_RETURN_IF_ERROR(writes.submit(write_requests(layer - 1, tutti::Direction::WRITE)));
      }
      if (layer + 1 < layers()) {
        if (layer >= 1) TUTTI_RETURN_IF_ERROR(verifier.copied(layer - 1));
        TUTTI_RETURN_IF_ERROR(submit_reads(reads, layer + 1));
      }
      t = Clock::now();
      TUTTI_RETURN_IF_ERROR(writes.drain());  // compute(L+1) overwrites write(L-1)'s slot
      report.write_stall_ns += elapsed_ns(t);
    }
    if (layers() >= 1) {
      auto t = Clock::now();
      TUTTI_RETURN_IF_ERROR(gpu_.wait_layer(layers() - 1, timeout));
      TUTTI_RETURN_IF_ERROR(writes.submit(write_requests(layers() - 1, tutti::Direction::WRITE)));
      TUTTI_RETURN_IF_ERROR(writes.drain());
      report.write_stall_ns += elapsed_ns(t);
    }
    report.pipeline_ns = elapsed_ns(start);
    report.pipeline_reads = reads.stats();
    report.pipeline_writes = writes.stats();
    report.pipeline_reads.ns = report.pipeline_writes.ns = report.pipeline_ns;  // both ran the whole pipeline
    TUTTI_RETURN_IF_ERROR(gpu_.synchronize(timeout));
    for (std::uint32_t l = 0; l < layers(); ++l) {
      gpu_report.gpu_compute_ns += gpu_.layer_compute_ns(l);
      report.read_stall_ns += gpu_.layer_wait_ns(l);  // compute waited for read(l)
    }
    report.compute_ns = gpu_report.gpu_compute_ns;
    return verifier.finish(report);
  }

  /// Reads back every tensor the pipeline wrote (into device memory, through the runtime), copies it to
  /// the host and compares it with this run's salted content.
  tutti::Status verify_written(Report& report) {
    if (miss_tensors_ == 0) return tutti::Status::success();
    for (std::uint32_t layer = 0; layer < layers(); ++layer) {
      TUTTI_RETURN_IF_ERROR(poison(write_slot(layer), miss_tensors_ * tensor_bytes()));
      Window<Runtime> window(runtime_, settings_.io_timeout_ns);
      TUTTI_RETURN_IF_ERROR(window.submit(write_requests(layer, tutti::Direction::READ)));
      TUTTI_RETURN_IF_ERROR(window.drain());
      TUTTI_RETURN_IF_ERROR(gpu_.copy_to_host(written_host_, write_slot(layer), miss_tensors_ * tensor_bytes()));
      check_written_layer(written_host_, layer, settings_.shape, settings_.run_salt, report);
    }
    return tutti::Status::success();
  }

  std::uint32_t layers() const { return settings_.shape.layers; }
  std::uint64_t tensor_bytes() const { return settings_.shape.tensor_bytes; }

 private:
  SlotVerifier make_verifier() {
    return SlotVerifier(gpu_, checksums_, settings_.shape, verify_host_, settings_.io_timeout_ns, settings_.verify);
  }

  /// Poisons a slot (0xa5) so a read that moves no bytes cannot pass verification on stale bytes.
  tutti::Status poison(std::byte* device, std::uint64_t bytes) {
    if (!settings_.verify || bytes == 0) return tutti::Status::success();
    return gpu_.fill_device(device, 0xa5, bytes, settings_.io_timeout_ns);
  }

  tutti::Status submit_reads(Window<Runtime>& window, std::uint32_t layer) {
    TUTTI_RETURN_IF_ERROR(poison(read_slot(layer), hit_tensors_ * tensor_bytes()));
    std::vector<tutti::IoRequest> out;
    const std::uint64_t base = (layer % 2) * hit_tensors_ * tensor_bytes();
    std::uint64_t index = 0;
    for (std::uint32_t c = 0; c < settings_.shape.hit_chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k, ++index)
        out.push_back({tutti::Direction::READ, read_memory_, base + index * tensor_bytes(), layers_[layer],
                       settings_.shape.tensor_offset(c, k), tensor_bytes()});
    if (out.empty()) return tutti::Status::success();
    return window.submit(std::move(out));
  }

  std::vector<tutti::IoRequest> write_requests(std::uint32_t layer, tutti::Direction direction) const {
    std::vector<tutti::IoRequest> out;
    const std::uint64_t base = (layer % 2) * miss_tensors_ * tensor_bytes();
    std::uint64_t index = 0;
    for (std::uint32_t c = settings_.shape.hit_chunks(); c < settings_.shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k, ++index)
        out.push_back({direction, write_memory_, base + index * tensor_bytes(), layers_[layer],
                       settings_.shape.tensor_offset(c, k), tensor_bytes()});
    return out;
  }

  std::vector<std::uint64_t> missed_seeds(std::uint32_t layer) const {
    std::vector<std::uint64_t> seeds;
    for (std::uint32_t c = settings_.shape.hit_chunks(); c < settings_.shape.chunks(); ++c)
      for (std::uint32_t k = 0; k < 2; ++k) seeds.push_back(tensor_seed(layer, c, k, settings_.run_salt));
    return seeds;
  }

  /// Copies layer `layer`'s read slot to the host now and hashes it (the baselines' untimed check).
  tutti::Status verify_slot_now(std::uint32_t layer, const char* phase, Report& report) {
    if (!settings_.verify) return tutti::Status::success();
    TUTTI_RETURN_IF_ERROR(gpu_.copy_to_host(verify_host_[0], read_slot(layer), hit_tensors_ * tensor_bytes()));
    check_cached_layer(verify_host_[0], layer, settings_.shape, checksums_, phase, report);
    return tutti::Status::success();
  }

  Runtime& runtime_;
  gpu::Gpu& gpu_;
  Settings settings_;
  const Checksums& checksums_;
  std::uint64_t hit_tensors_;
  std::uint64_t miss_tensors_;
  std::byte* reads_ = nullptr;                               // device: 2 slots of hit_tensors_ tensors
  std::byte* writes_ = nullptr;                              // device: 2 slots of miss_tensors_ tensors
  std::array<std::byte*, 2> verify_host_{nullptr, nullptr};  // pinned
  std::byte* written_host_ = nullptr;                        // pinned
  std::byte* bounce_ = nullptr;                              // pinned, one tensor
  std::vector<tutti::TargetHandle> layers_;
  tutti::MemoryHandle read_memory_;
  tutti::MemoryHandle write_memory_;
};

}  // namespace layerwise
