// The GPU side of the layer-wise example: see gpu_compute.hpp. The only source file of the example
// that includes CUDA headers (cuda_runtime.h, cuda_fp16.h, cublas_v2.h, and, when libcufile was
// found (TUTTI_HAVE_CUFILE), cufile.h through bench/support/cufile_reader.hpp).
#include "gpu_compute.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#if defined(TUTTI_HAVE_CUFILE)
#include "cufile_reader.hpp"  // bench/support: the cuFile baseline reader (includes cufile.h)
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <tutti/accel/memory.hpp>

namespace layerwise::gpu {
namespace {

using tutti::Status;
using tutti::StatusCode;

Status cuda_status(cudaError_t code, const char* call) {
  if (code == cudaSuccess) return Status::success();
  return tutti::error(StatusCode::DEVICE_ERROR, "{} failed: {} ({})", call, cudaGetErrorString(code),
                      cudaGetErrorName(code));
}

Status cublas_status(cublasStatus_t code, const char* call) {
  if (code == CUBLAS_STATUS_SUCCESS) return Status::success();
  return tutti::error(StatusCode::DEVICE_ERROR, "{} failed: {} ({})", call, cublasGetStatusString(code),
                      static_cast<int>(code));
}

#define LAYERWISE_CUDA(call) TUTTI_RETURN_IF_ERROR(cuda_status((call), #call))
#define LAYERWISE_CUBLAS(call) TUTTI_RETURN_IF_ERROR(cublas_status((call), #call))

/// Word i of a tensor: splitmix64 of seed + (i + 1) * golden ratio; the same bytes as fill_tensor.
__global__ void fill_kernel(std::uint64_t* words, std::uint64_t count, std::uint64_t seed) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    std::uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    words[i] = z ^ (z >> 31);
  }
}

/// GEMM operands: values in [-1/64, 1/64) from a hash of the index, so no operand is all zeros.
__global__ void init_operand_kernel(__half* values, std::uint64_t count, std::uint32_t seed) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    values[i] = __float2half(static_cast<float>(h % 2048u) / 131072.0f - 1.0f / 128.0f);
  }
}

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));  // PTX ISA: %globaltimer, ns (sm_30+)
  return t;
}

/// Sleep mode's compute: one thread spins on %globaltimer for `ns`.
__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

unsigned blocks_for(std::uint64_t count) {
  const std::uint64_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks > 4096 ? 4096 : (blocks == 0 ? 1 : blocks));
}

Status wait_event(cudaEvent_t event, int ordinal, std::uint64_t timeout_ns, const char* what) {
  LAYERWISE_CUDA(cudaSetDevice(ordinal));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  for (;;) {
    const cudaError_t code = cudaEventQuery(event);
    if (code == cudaSuccess) return Status::success();
    if (code != cudaErrorNotReady) return cuda_status(code, "cudaEventQuery");
    if (std::chrono::steady_clock::now() >= deadline)
      return tutti::error(StatusCode::TIMEOUT, "{} did not complete within {} ns", what, timeout_ns);
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

}  // namespace

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the (non-sticky) "no device" error
    return 0;
  }
  return count;
}

struct Gpu::State {
  int ordinal = 0;
  ComputeConfig config;
  std::uint32_t layers = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t verification = nullptr;
  cudaStream_t poison = nullptr;  // fill_device's memsets
  cudaEvent_t poisoned = nullptr;
  cublasHandle_t cublas = nullptr;
  __half* a = nullptr;       // [tokens x hidden]
  __half* w = nullptr;       // [hidden x hidden]
  __half* c = nullptr;       // [tokens x hidden]
  __half* q = nullptr;       // [tokens x head_elements]
  __half* scores = nullptr;  // [cached_chunks x tokens x chunk_tokens]
  std::uint32_t score_chunks = 0;
  std::uint32_t head_elements = 0;
  std::uint32_t repetitions = 0;
  std::vector<void*> device_memory;
  std::vector<void*> pinned_memory;
  cudaEvent_t verification_done[2] = {nullptr, nullptr};
  cudaEvent_t drained[2] = {nullptr, nullptr};
  cudaEvent_t calibration[2] = {nullptr, nullptr};  // timing events of calibrate()
  cudaEvent_t pipeline_start = nullptr;             // mark_start()
  bool started = false;
  std::vector<cudaEvent_t> layer_start, layer_end;
  std::vector<bool> layer_ran;
  bool leak = false;  // set when the device did not drain: its memory is never freed
#if defined(TUTTI_HAVE_CUFILE)
  std::unique_ptr<tutti::bench::cufile::Driver> cufile_driver;  // destroyed after the buffer
  std::unique_ptr<tutti::bench::cufile::DeviceBuffer> cufile_buffer;
#endif
};

Gpu::Gpu(std::unique_ptr<State> state) : state_(std::move(state)) {}

Gpu::~Gpu() {
  State& s = *state_;
  (void)cudaSetDevice(s.ordinal);
  cufile_close();
  if (!synchronize(10'000'000'000ULL).is_ok()) s.leak = true;  // never free memory a kernel may still use
  for (cudaEvent_t e : s.layer_start) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : s.layer_end) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : s.verification_done)
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : s.drained)
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : s.calibration)
    if (e) (void)cudaEventDestroy(e);
  if (s.pipeline_start) (void)cudaEventDestroy(s.pipeline_start);
  if (s.cublas) (void)cublasDestroy(s.cublas);
  if (!s.leak) {
    for (void* p : s.device_memory) tutti::accel::free_device(p);
    for (void* p : s.pinned_memory) (void)cudaFreeHost(p);
  }
  if (s.compute) (void)cudaStreamDestroy(s.compute);
  if (s.verification) (void)cudaStreamDestroy(s.verification);
  if (s.poison) (void)cudaStreamDestroy(s.poison);
  if (s.poisoned) (void)cudaEventDestroy(s.poisoned);
}

tutti::Result<std::unique_ptr<Gpu>> Gpu::open(int ordinal, const ComputeConfig& config, std::uint32_t layers) {
  int count = 0;
  LAYERWISE_CUDA(cudaGetDeviceCount(&count));
  if (ordinal < 0 || ordinal >= count)
    return tutti::error(StatusCode::INVALID_ARGUMENT, "accelerator = {} is not a CUDA device ordinal in [0, {})",
                        ordinal, count);
  if (config.use_gemm && (config.hidden == 0 || config.hidden % 8 != 0))
    return tutti::error(StatusCode::INVALID_ARGUMENT, "hidden = {} must be a positive multiple of 8", config.hidden);
  if (config.use_gemm && config.tokens == 0)
    return tutti::error(StatusCode::INVALID_ARGUMENT, "tokens = 0: the GEMM needs at least one row");
  if (config.tensor_bytes == 0 || config.tensor_bytes % 8 != 0)
    return tutti::error(StatusCode::INVALID_ARGUMENT, "tensor_bytes = {} must be a positive multiple of 8",
                        config.tensor_bytes);
  auto state = std::make_unique<State>();
  state->ordinal = ordinal;
  state->config = config;
  state->layers = layers;
  std::unique_ptr<Gpu> gpu(new Gpu(std::move(state)));
  State& s = *gpu->state_;
  LAYERWISE_CUDA(cudaSetDevice(ordinal));
  LAYERWISE_CUDA(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
  LAYERWISE_CUDA(cudaStreamCreateWithFlags(&s.verification, cudaStreamNonBlocking));
  LAYERWISE_CUDA(cudaStreamCreateWithFlags(&s.poison, cudaStreamNonBlocking));
  LAYERWISE_CUDA(cudaEventCreateWithFlags(&s.poisoned, cudaEventDisableTiming));
  for (int i = 0; i < 2; ++i) {
    LAYERWISE_CUDA(cudaEventCreateWithFlags(&s.verification_done[i], cudaEventDisableTiming));
    LAYERWISE_CUDA(cudaEventCreateWithFlags(&s.drained[i], cudaEventDisableTiming));
    LAYERWISE_CUDA(cudaEventCreate(&s.calibration[i]));
  }
  LAYERWISE_CUDA(cudaEventCreate(&s.pipeline_start));
  s.layer_start.resize(layers, nullptr);
  s.layer_end.resize(layers, nullptr);
  s.layer_ran.resize(layers, false);
  for (std::uint32_t l = 0; l < layers; ++l) {
    LAYERWISE_CUDA(cudaEventCreate(&s.layer_start[l]));
    LAYERWISE_CUDA(cudaEventCreate(&s.layer_end[l]));
  }
  if (config.use_gemm) {
    LAYERWISE_CUBLAS(cublasCreate(&s.cublas));
    LAYERWISE_CUBLAS(cublasSetStream(s.cublas, s.compute));
    const std::uint64_t ah = std::uint64_t{config.tokens} * config.hidden;
    const std::uint64_t wh = std::uint64_t{config.hidden} * config.hidden;
    auto a = gpu->allocate_device(ah * sizeof(__half));
    auto w = gpu->allocate_device(wh * sizeof(__half));
    auto c = gpu->allocate_device(ah * sizeof(__half));
    if (!a) return a.status();
    if (!w) return w.status();
    if (!c) return c.status();
    s.a = reinterpret_cast<__half*>(*a);
    s.w = reinterpret_cast<__half*>(*w);
    s.c = reinterpret_cast<__half*>(*c);
    init_operand_kernel<<<blocks_for(ah), 256, 0, s.compute>>>(s.a, ah, 1);
    init_operand_kernel<<<blocks_for(wh), 256, 0, s.compute>>>(s.w, wh, 2);
    LAYERWISE_CUDA(cudaGetLastError());
    // Attention over the restored K tensors: a K tensor is [chunk_tokens x head_elements] fp16.
    const std::uint64_t elements = config.tensor_bytes / sizeof(__half);
    if (config.chunk_tokens > 0 && elements % config.chunk_tokens == 0 && (elements / config.chunk_tokens) % 8 == 0) {
      s.head_elements = static_cast<std::uint32_t>(elements / config.chunk_tokens);
      const std::uint64_t qh = std::uint64_t{config.tokens} * s.head_elements;
      auto q = gpu->allocate_device(qh * sizeof(__half));
      if (!q) return q.status();
      s.q = reinterpret_cast<__half*>(*q);
      init_operand_kernel<<<blocks_for(qh), 256, 0, s.compute>>>(s.q, qh, 3);
      LAYERWISE_CUDA(cudaGetLastError());
    }
  }
  TUTTI_RETURN_IF_ERROR(gpu->synchronize(10'000'000'000ULL));
  return tutti::Result<std::unique_ptr<Gpu>>(std::move(gpu));
}

int Gpu::ordinal() const noexcept { return state_->ordinal; }

std::string Gpu::description() const {
  cudaDeviceProp properties{};
  int runtime = 0, driver = 0;
  if (cudaGetDeviceProperties(&properties, state_->ordinal) != cudaSuccess) return "unknown CUDA device";
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  return fmt::format("{} ({} SMs, {:.0f} GiB), CUDA runtime {}.{}, driver API {}.{}", properties.name,
                     properties.multiProcessorCount, static_cast<double>(properties.totalGlobalMem) / (1ULL << 30),
                     runtime / 1000, runtime % 1000 / 10, driver / 1000, driver % 1000 / 10);
}

tutti::Result<std::byte*> Gpu::allocate_device(std::uint64_t bytes) {
  LAYERWISE_CUDA(cudaSetDevice(state_->ordinal));
  // accel::allocate_device, not cudaMalloc: cudaMalloc aligns to 256 bytes only, and the KV slots
  // take O_DIRECT reads and NVMe PRPs, which need 4096-byte aligned memory.
  auto p = tutti::accel::allocate_device(bytes);
  if (!p) return p.status().with_context(fmt::format("{} bytes of device memory", bytes));
  state_->device_memory.push_back(*p);
  return static_cast<std::byte*>(*p);
}

tutti::Result<std::byte*> Gpu::allocate_pinned(std::uint64_t bytes) {
  void* p = nullptr;
  LAYERWISE_CUDA(cudaSetDevice(state_->ordinal));
  if (auto s = cuda_status(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc"); !s.is_ok())
    return s.with_context(fmt::format("{} bytes of pinned host memory", bytes));
  state_->pinned_memory.push_back(p);
  return static_cast<std::byte*>(p);
}

tutti::Status Gpu::fill_device(std::byte* device, int value, std::uint64_t bytes, std::uint64_t timeout_ns) {
  State& s = *state_;
  LAYERWISE_CUDA(cudaSetDevice(s.ordinal));
  LAYERWISE_CUDA(cudaMemsetAsync(device, value, bytes, s.poison));
  LAYERWISE_CUDA(cudaEventRecord(s.poisoned, s.poison));
  return wait_event(s.poisoned, s.ordinal, timeout_ns, "cudaMemsetAsync");
}

void Gpu::keep_memory() noexcept { state_->leak = true; }

tutti::Status Gpu::copy_to_device(std::byte* device, const std::byte* host, std::uint64_t bytes) {
  LAYERWISE_CUDA(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
  return Status::success();
}

tutti::Status Gpu::copy_to_host(std::byte* host, const std::byte* device, std::uint64_t bytes) {
  LAYERWISE_CUDA(cudaSetDevice(state_->ordinal));
  LAYERWISE_CUDA(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
  return Status::success();
}

tutti::Status Gpu::copy_to_host_async(std::byte* host, const std::byte* device, std::uint64_t bytes, int slot) {
  State& s = *state_;
  LAYERWISE_CUDA(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s.verification));
  LAYERWISE_CUDA(cudaEventRecord(s.verification_done[slot & 1], s.verification));
  return Status::success();
}

tutti::Status Gpu::launch_layer(std::uint32_t layer, const std::byte* read_slot, std::uint32_t cached_chunks,
                                std::byte* write_slot, const std::uint64_t* seeds, std::uint32_t missed_tensors) {
  State& s = *state_;
  const ComputeConfig& c = s.config;
  if (layer >= s.layers)
    return tutti::error(StatusCode::INVALID_ARGUMENT, "layer = {} is not below layers = {}", layer, s.layers);
  if (c.use_gemm && s.head_elements != 0 && cached_chunks > s.score_chunks)
    return tutti::error(StatusCode::INVALID_ARGUMENT, "cached_chunks = {} exceeds the {} calibrate() sized",
                        cached_chunks, s.score_chunks);
  LAYERWISE_CUDA(cudaEventRecord(s.layer_start[layer], s.compute));
  const std::uint64_t words = c.tensor_bytes / sizeof(std::uint64_t);
  for (std::uint32_t i = 0; i < missed_tensors; ++i)
    fill_kernel<<<blocks_for(words), 256, 0, s.compute>>>(
        reinterpret_cast<std::uint64_t*>(write_slot + std::uint64_t{i} * c.tensor_bytes), words, seeds[i]);
  LAYERWISE_CUDA(cudaGetLastError());
  if (c.use_gemm) {
    const float alpha = 1.0f, beta = 0.0f;
    if (s.head_elements != 0 && cached_chunks > 0) {
      // Column-major view: S_c^T[chunk_tokens x tokens] = (K_c as [head x chunk_tokens])^T * Q^T[head x tokens].
      const long long k_stride = static_cast<long long>(c.tensor_bytes);  // 2 tensors of tensor_bytes / 2 halves
      LAYERWISE_CUBLAS(cublasGemmStridedBatchedEx(
          s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(c.chunk_tokens), static_cast<int>(c.tokens),
          static_cast<int>(s.head_elements), &alpha, read_slot, CUDA_R_16F, static_cast<int>(s.head_elements), k_stride,
          s.q, CUDA_R_16F, static_cast<int>(s.head_elements), 0, &beta, s.scores, CUDA_R_16F,
          static_cast<int>(c.chunk_tokens), static_cast<long long>(c.chunk_tokens) * c.tokens,
          static_cast<int>(cached_chunks), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    for (std::uint32_t r = 0; r < s.repetitions; ++r)
      LAYERWISE_CUBLAS(cublasGemmEx(s.cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(c.hidden),
                                    static_cast<int>(c.tokens), static_cast<int>(c.hidden), &alpha, s.w, CUDA_R_16F,
                                    static_cast<int>(c.hidden), s.a, CUDA_R_16F, static_cast<int>(c.hidden), &beta, s.c,
                                    CUDA_R_16F, static_cast<int>(c.hidden), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else if (c.compute_ns > 0) {
    spin_kernel<<<1, 1, 0, s.compute>>>(c.compute_ns);
    LAYERWISE_CUDA(cudaGetLastError());
  }
  LAYERWISE_CUDA(cudaEventRecord(s.layer_end[layer], s.compute));
  s.layer_ran[layer] = true;
  return Status::success();
}

tutti::Result<GemmFigures> Gpu::calibrate(std::uint32_t cached_chunks) {
  State& s = *state_;
  const ComputeConfig& c = s.config;
  GemmFigures figures;
  if (!c.use_gemm) return figures;
  LAYERWISE_CUDA(cudaSetDevice(s.ordinal));
  if (s.head_elements != 0 && cached_chunks > s.score_chunks) {
    auto scores = allocate_device(std::uint64_t{cached_chunks} * c.tokens * c.chunk_tokens * sizeof(__half));
    if (!scores) return scores.status();
    s.scores = reinterpret_cast<__half*>(*scores);
    s.score_chunks = cached_chunks;
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    return cublas_status(
        cublasGemmEx(s.cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(c.hidden), static_cast<int>(c.tokens),
                     static_cast<int>(c.hidden), &alpha, s.w, CUDA_R_16F, static_cast<int>(c.hidden), s.a, CUDA_R_16F,
                     static_cast<int>(c.hidden), &beta, s.c, CUDA_R_16F, static_cast<int>(c.hidden), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  };
  for (int i = 0; i < 3; ++i) TUTTI_RETURN_IF_ERROR(gemm());  // warm-up: cuBLAS heuristics, clocks
  constexpr int kRuns = 20;
  LAYERWISE_CUDA(cudaEventRecord(s.calibration[0], s.compute));
  for (int i = 0; i < kRuns; ++i) TUTTI_RETURN_IF_ERROR(gemm());
  LAYERWISE_CUDA(cudaEventRecord(s.calibration[1], s.compute));
  TUTTI_RETURN_IF_ERROR(wait_event(s.calibration[1], s.ordinal, 30'000'000'000ULL, "GEMM calibration"));
  float ms = 0;
  LAYERWISE_CUDA(cudaEventElapsedTime(&ms, s.calibration[0], s.calibration[1]));
  figures.mlp_gemm_ms = static_cast<double>(ms) / kRuns;
  const double flops = 2.0 * c.tokens * static_cast<double>(c.hidden) * c.hidden;
  figures.mlp_tflops = figures.mlp_gemm_ms > 0 ? flops / (figures.mlp_gemm_ms * 1e-3) / 1e12 : 0;
  const double target_ms = static_cast<double>(c.compute_ns) / 1e6;
  s.repetitions =
      c.compute_ns == 0 ? 0 : static_cast<std::uint32_t>(std::max(1.0, std::round(target_ms / figures.mlp_gemm_ms)));
  figures.repetitions = s.repetitions;
  figures.head_elements = s.head_elements;
  figures.flops_per_layer = static_cast<std::uint64_t>(flops) * s.repetitions +
                            (s.head_elements ? 2ULL * c.tokens * c.chunk_tokens * s.head_elements * cached_chunks : 0);
  return figures;
}

tutti::Status Gpu::wait_layer(std::uint32_t layer, std::uint64_t timeout_ns) {
  if (layer >= state_->layers || !state_->layer_ran[layer])
    return tutti::error(StatusCode::INVALID_ARGUMENT, "layer = {} was not launched (layers = {})", layer,
                        state_->layers);
  return wait_event(state_->layer_end[layer], state_->ordinal, timeout_ns,
                    fmt::format("compute of layer {}", layer).c_str());
}

tutti::Status Gpu::wait_verification(int slot, std::uint64_t timeout_ns) {
  return wait_event(state_->verification_done[slot & 1], state_->ordinal, timeout_ns, "verification copy");
}

tutti::Status Gpu::synchronize(std::uint64_t timeout_ns) {
  State& s = *state_;
  if (!s.compute || !s.verification) return Status::success();
  LAYERWISE_CUDA(cudaSetDevice(s.ordinal));
  LAYERWISE_CUDA(cudaEventRecord(s.drained[0], s.compute));
  LAYERWISE_CUDA(cudaEventRecord(s.drained[1], s.verification));
  TUTTI_RETURN_IF_ERROR(wait_event(s.drained[0], s.ordinal, timeout_ns, "compute stream"));
  return wait_event(s.drained[1], s.ordinal, timeout_ns, "verification stream");
}

tutti::Status Gpu::mark_start() {
  LAYERWISE_CUDA(cudaEventRecord(state_->pipeline_start, state_->compute));
  state_->started = true;
  return Status::success();
}

std::uint64_t Gpu::layer_wait_ns(std::uint32_t layer) const {
  const State& s = *state_;
  if (layer >= s.layers || !s.layer_ran[layer]) return 0;
  cudaEvent_t before = nullptr;
  if (layer == 0) {
    if (!s.started) return 0;
    before = s.pipeline_start;
  } else {
    if (!s.layer_ran[layer - 1]) return 0;
    before = s.layer_end[layer - 1];
  }
  float ms = 0;
  if (cudaEventElapsedTime(&ms, before, s.layer_start[layer]) != cudaSuccess || ms < 0) return 0;
  return static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6);
}

std::uint64_t Gpu::layer_compute_ns(std::uint32_t layer) const {
  if (layer >= state_->layers || !state_->layer_ran[layer]) return 0;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, state_->layer_start[layer], state_->layer_end[layer]) != cudaSuccess) return 0;
  return static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6);
}

#if defined(TUTTI_HAVE_CUFILE)

bool Gpu::has_cufile() { return true; }

tutti::Status Gpu::cufile_open(std::byte* device, std::uint64_t bytes) {
  namespace cf = tutti::bench::cufile;
  State& s = *state_;
  cufile_close();
  cf::Driver::Options options;  // compat mode allowed, not forced
  options.device = s.ordinal;
  auto driver = cf::Driver::open(options);
  if (!driver) return driver.status();
  s.cufile_driver = std::move(*driver);
  auto buffer = cf::DeviceBuffer::register_range(device, bytes);
  if (!buffer) {
    cufile_close();
    return buffer.status();
  }
  s.cufile_buffer = std::move(*buffer);
  return Status::success();
}

std::string Gpu::cufile_description() const {
  return state_->cufile_driver ? state_->cufile_driver->info().describe() : std::string();
}

tutti::Result<std::uint64_t> Gpu::cufile_read(const std::string& path, const std::vector<FileRange>& ranges,
                                              std::uint32_t threads, std::uint64_t timeout_ns) {
  namespace cf = tutti::bench::cufile;
  State& s = *state_;
  if (!s.cufile_buffer)
    return tutti::error(StatusCode::INVALID_ARGUMENT, "cufile_read of '{}' before cufile_open", path);
  auto file = cf::File::open(path);
  if (!file) return file.status();
  std::vector<cf::Range> reads;
  for (const FileRange& r : ranges) reads.push_back({file->get(), r.file_offset, r.buffer_offset, r.bytes});
  auto report = cf::read(*s.cufile_buffer, reads, {.threads = threads, .timeout_ns = timeout_ns, .device = s.ordinal});
  if (!report) return report.status();
  return report->elapsed_ns;
}

void Gpu::cufile_close() {
  State& s = *state_;
  s.cufile_buffer.reset();
  s.cufile_driver.reset();
}

#else  // no libcufile at build time

bool Gpu::has_cufile() { return false; }
tutti::Status Gpu::cufile_open(std::byte*, std::uint64_t) {
  return tutti::error(StatusCode::UNSUPPORTED, "built without libcufile (cufile.h / libcufile.so not found by meson)");
}
std::string Gpu::cufile_description() const { return std::string(); }
tutti::Result<std::uint64_t> Gpu::cufile_read(const std::string&, const std::vector<FileRange>&, std::uint32_t,
                                              std::uint64_t) {
  return cufile_open(nullptr, 0);
}
void Gpu::cufile_close() {}

#endif

}  // namespace layerwise::gpu
