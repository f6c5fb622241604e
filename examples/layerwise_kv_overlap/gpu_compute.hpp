// The GPU side of the layer-wise example (CUDA build only, LAYERWISE_GPU): device memory, streams,
// events, the per-layer compute (a cuBLAS GEMM or a fixed-time spin kernel), the kernel that produces
// the recomputed K/V tensors, and the two baselines that read the same tensors into the same device
// memory without Tutti (pread + cudaMemcpy, and cuFile).
//
// This header includes no CUDA header: main.cpp and gpu_pipeline.hpp are host C++; everything that
// touches the CUDA runtime, cuBLAS or cuFile is in gpu_compute.cu.
//
// Thread-safety: one thread drives a Gpu (allocation, launches, copies); wait_event() and
// copy_to_host() may also be called from the verification thread, which only reads the events and
// memory it is handed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tutti/core/status.hpp>

namespace layerwise::gpu {

/// The per-layer compute on the GPU.
///
/// GEMM mode (`use_gemm`): each layer runs
///   1. attention scores of the new tokens over the restored cache: for every cached chunk c,
///      S_c[tokens x chunk_tokens] = Q[tokens x head_elements] * K_c^T, K_c being the chunk's K tensor
///      read from the file (fp16, row-major [chunk_tokens x head_elements]); one strided batched GEMM;
///   2. `repetitions` times the MLP-like step C[tokens x hidden] = A[tokens x hidden] * W[hidden x hidden]
///      (fp16 inputs, fp32 accumulation, cublasGemmEx), calibrated so one layer takes about compute_ns.
/// Sleep mode: a kernel that spins on %globaltimer for compute_ns.
/// In both modes the layer's recomputed (missed) K/V tensors are produced by a fill kernel first.
struct ComputeConfig {
  bool use_gemm = true;
  std::uint64_t compute_ns = 2'000'000;     ///< Target time of one layer's compute, ns.
  std::uint32_t tokens = 1024;              ///< Rows of the MLP GEMM and of Q (new tokens of the step).
  std::uint32_t hidden = 8192;              ///< Model hidden size (elements), multiple of 8.
  std::uint32_t chunk_tokens = 256;         ///< Tokens per chunk (rows of one K tensor).
  std::uint64_t tensor_bytes = 512 * 1024;  ///< Bytes of one K or V tensor.
};

/// What calibrate() measured.
struct GemmFigures {
  std::uint32_t repetitions = 0;      ///< MLP GEMMs per layer.
  double mlp_gemm_ms = 0;             ///< One MLP GEMM, ms (mean of the calibration runs).
  double mlp_tflops = 0;              ///< Its rate, 10^12 FLOP/s (2 * tokens * hidden^2 per GEMM).
  std::uint32_t head_elements = 0;    ///< Columns of one K tensor as fp16; 0: no attention GEMM.
  std::uint64_t flops_per_layer = 0;  ///< FLOPs one layer's GEMMs perform.
};

/// CUDA devices usable by this process (cudaGetDeviceCount); 0 when none or when the call fails.
int device_count() noexcept;

/// One accelerator: streams (compute, verification), cuBLAS, events, and the memory it allocated.
class Gpu {
 public:
  /// Opens accelerator `ordinal` (cudaSetDevice), creates the compute and verification streams and,
  /// in GEMM mode, the cuBLAS handle and the GEMM operands (tokens x hidden, hidden x hidden, fp16).
  /// `layers` sizes the per-layer timing events. Errors: INVALID_ARGUMENT for ordinal < 0, ordinal
  /// >= the device count, hidden = 0 or not a multiple of 8, tokens = 0; DEVICE_ERROR naming the
  /// failing CUDA / cuBLAS call (no device, out of memory).
  static tutti::Result<std::unique_ptr<Gpu>> open(int ordinal, const ComputeConfig& config, std::uint32_t layers);
  /// Synchronizes the device, then frees everything it allocated.
  ~Gpu();
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  int ordinal() const noexcept;
  /// "NVIDIA H200, driver 580.x, CUDA runtime 13.0".
  std::string description() const;

  /// Device memory (accel::allocate_device: 4096-byte aligned, zeroed), freed with the Gpu. Errors
  /// as accel::allocate_device (RESOURCE_EXHAUSTED / DEVICE_ERROR when out of memory).
  tutti::Result<std::byte*> allocate_device(std::uint64_t bytes);
  /// Page-locked host memory (cudaHostAlloc, page aligned), freed with the Gpu.
  tutti::Result<std::byte*> allocate_pinned(std::uint64_t bytes);

  /// Sets `bytes` of device memory to `value` (cudaMemsetAsync on a stream of its own) and waits at
  /// most `timeout_ns`. Errors: TIMEOUT; DEVICE_ERROR naming the call.
  tutti::Status fill_device(std::byte* device, int value, std::uint64_t bytes, std::uint64_t timeout_ns);
  /// Never free the memory this Gpu allocated: for a caller whose storage runtime may still move data
  /// into it (unregister_memory refused with BUSY).
  void keep_memory() noexcept;
  /// Synchronous copies (cudaMemcpy): the baseline's and the verification's.
  tutti::Status copy_to_device(std::byte* device, const std::byte* host, std::uint64_t bytes);
  tutti::Status copy_to_host(std::byte* host, const std::byte* device, std::uint64_t bytes);
  /// Starts a device-to-host copy on the verification stream and records verification event `slot`
  /// (0 or 1) after it.
  tutti::Status copy_to_host_async(std::byte* host, const std::byte* device, std::uint64_t bytes, int slot);

  /// Launches layer `layer`'s compute (layer < the `layers` given to open) on the compute stream,
  /// between the layer's start and end events: fills `missed_tensors` tensors of tensor_bytes at
  /// `write_slot` (tensor i's content is the splitmix64 stream of seeds[i], see dataset.hpp
  /// tensor_seed), then runs the attention GEMM over the `cached_chunks` K tensors at `read_slot` (K of
  /// chunk c at byte c * 2 * tensor_bytes) and the MLP GEMMs, or the spin. Returns once launched.
  /// Errors: INVALID_ARGUMENT for a layer out of range or more cached chunks than calibrate() sized;
  /// DEVICE_ERROR naming the CUDA / cuBLAS call.
  tutti::Status launch_layer(std::uint32_t layer, const std::byte* read_slot, std::uint32_t cached_chunks,
                             std::byte* write_slot, const std::uint64_t* seeds, std::uint32_t missed_tensors);

  /// Allocates the attention scores for up to `cached_chunks` chunks, measures one MLP GEMM (after a
  /// warm-up) and sets the repetitions per layer so that a layer's compute takes about compute_ns
  /// (none when compute_ns is 0). In sleep mode only the scores are skipped and nothing is measured.
  /// Errors: DEVICE_ERROR naming the call.
  tutti::Result<GemmFigures> calibrate(std::uint32_t cached_chunks);

  /// Waits until layer `layer`'s compute completed, polling cudaEventQuery every 10 us, at most
  /// `timeout_ns`. Errors: TIMEOUT naming the layer and the budget; DEVICE_ERROR for a failed kernel.
  tutti::Status wait_layer(std::uint32_t layer, std::uint64_t timeout_ns);
  /// The same for verification event `slot` (0 or 1). Callable from the verification thread.
  tutti::Status wait_verification(int slot, std::uint64_t timeout_ns);
  /// Waits (bounded, polled) until the compute and verification streams ran dry.
  tutti::Status synchronize(std::uint64_t timeout_ns);
  /// Records the compute stream's start event: the reference of layer_wait_ns(0). Call before the
  /// first launch_layer of a pipeline. Errors: DEVICE_ERROR naming the call.
  tutti::Status mark_start();
  /// How long the compute stream sat idle before layer `layer`'s compute began, in ns: from the end of
  /// layer - 1's compute (from mark_start() for layer 0) to the start of this layer's. The host launches
  /// a layer only once its reads completed, so this is the time compute waited for its data (plus the
  /// launch itself). Only after synchronize(); 0 when the layer did not run.
  std::uint64_t layer_wait_ns(std::uint32_t layer) const;
  /// GPU time of layer `layer`'s compute in ns (cudaEventElapsedTime of its start / end events); only
  /// after synchronize(). 0 when the layer did not run.
  std::uint64_t layer_compute_ns(std::uint32_t layer) const;

  /// Whether the cuFile baseline is built in (libcufile found at build time: TUTTI_HAVE_CUFILE).
  static bool has_cufile();
  /// cuFile baseline (bench/support/cufile_reader.hpp): opens the driver (compat mode allowed: the
  /// only mode without the nvidia-fs module) and registers `device` / `bytes` as its buffer
  /// (cuFileBufRegister). Errors: UNSUPPORTED when not built in or refused; DEVICE_ERROR with cuFile's
  /// text (see cufile_reader.hpp).
  tutti::Status cufile_open(std::byte* device, std::uint64_t bytes);
  /// "cuFile 1.15, compat mode (nvidia-fs not loaded; ...)": the mode in effect; empty before cufile_open.
  std::string cufile_description() const;
  /// One read of the cuFile baseline: bytes at file_offset into the registered buffer at buffer_offset.
  struct FileRange {
    std::uint64_t file_offset = 0;    ///< Bytes from the start of the file.
    std::uint64_t buffer_offset = 0;  ///< Bytes from the `device` given to cufile_open.
    std::uint64_t bytes = 0;
  };
  /// Opens `path` (O_DIRECT, cuFileHandleRegister) and reads every range with `threads` synchronous
  /// cuFileRead calls in flight, within `timeout_ns`. Returns the wall time of the reads in ns (the
  /// open is not counted); every range arrived whole when it returns a value. Errors: those of
  /// cufile_reader.hpp's File::open and read() (NOT_FOUND, OUT_OF_RANGE for a short file, TIMEOUT,
  /// DEVICE_ERROR ...); INVALID_ARGUMENT before cufile_open.
  tutti::Result<std::uint64_t> cufile_read(const std::string& path, const std::vector<FileRange>& ranges,
                                           std::uint32_t threads, std::uint64_t timeout_ns);
  /// Deregisters the buffer and closes the driver (also done by the destructor).
  void cufile_close();

  struct State;

 private:
  explicit Gpu(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace layerwise::gpu
