// null_agent.hpp for the cuda profile: a persistent GPU kernel services the null controller's
// queues (one warp per queue) and GPU warps run the raw-queue rows.
#include "null_agent.hpp"

#include <chrono>
#include <thread>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "command_kernel.cuh"  // tests/gpu/support: raw_command_kernel

namespace tutti::bench::gpu {
namespace {

Status cuda_status(cudaError_t result, const char* what) {
  if (result == cudaSuccess) return Status::success();
  return error(StatusCode::DEVICE_ERROR, "{}: {}", what, cudaGetErrorString(result));
}

class GpuNullService final : public NullService {
 public:
  ~GpuNullService() override {
    stop();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaFreeHost(control_);
    cudaFree(views_);
    cudaFree(relay_);
  }
  Status start(const std::vector<test::NullControllerQueue>& views, const NullServiceSettings& s) {
    TUTTI_RETURN_IF_ERROR(
        cuda_status(cudaMalloc(reinterpret_cast<void**>(&views_), views.size() * sizeof(views[0])), "cudaMalloc"));
    TUTTI_RETURN_IF_ERROR(cuda_status(
        cudaMemcpy(views_, views.data(), views.size() * sizeof(views[0]), cudaMemcpyHostToDevice), "cudaMemcpy"));
    TUTTI_RETURN_IF_ERROR(cuda_status(
        cudaHostAlloc(reinterpret_cast<void**>(&control_), sizeof(*control_), cudaHostAllocMapped), "cudaHostAlloc"));
    *control_ = test::NullControllerControl{};
    test::NullControllerControl* device_control = nullptr;
    TUTTI_RETURN_IF_ERROR(cuda_status(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_control), control_, 0),
                                      "cudaHostGetDevicePointer"));
    test::NullControllerSettings settings;
    settings.stop_poll_interval_ns = s.stop_poll_ns;
    if (s.relay_stop) {
      TUTTI_RETURN_IF_ERROR(
          cuda_status(cudaMalloc(reinterpret_cast<void**>(&relay_), sizeof(std::uint32_t)), "cudaMalloc"));
      TUTTI_RETURN_IF_ERROR(cuda_status(cudaMemset(relay_, 0, sizeof(std::uint32_t)), "cudaMemset"));
      settings.stop_relay = relay_;
    }
    TUTTI_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    constexpr std::uint32_t kWarpsPerBlock = 4;
    const auto warps = static_cast<std::uint32_t>(views.size());
    const std::uint32_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const std::uint32_t threads = (warps < kWarpsPerBlock ? warps : kWarpsPerBlock) * 32;
    warps_ = blocks * (threads / 32);
    test::null_controller_kernel<<<blocks, threads, 0, stream_>>>(views_, warps, device_control, settings);
    TUTTI_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "null_controller_kernel launch"));
    started_ = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (reinterpret_cast<volatile std::uint32_t*>(control_)[1] < warps_) {  // running_warps
      if (std::chrono::steady_clock::now() > deadline)
        return error(StatusCode::TIMEOUT, "null controller: {} of {} warps running after 5 s",
                     reinterpret_cast<volatile std::uint32_t*>(control_)[1], warps_);
      std::this_thread::yield();
    }
    return Status::success();
  }
  std::uint32_t stop() override {
    if (!started_) return deadline_exits_;
    started_ = false;
    reinterpret_cast<volatile std::uint32_t*>(control_)[0] = 1;  // stop
    cudaStreamSynchronize(stream_);
    deadline_exits_ = reinterpret_cast<volatile std::uint32_t*>(control_)[2];
    return deadline_exits_;
  }

 private:
  test::NullControllerQueue* views_ = nullptr;
  test::NullControllerControl* control_ = nullptr;
  std::uint32_t* relay_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::uint32_t warps_ = 0;
  bool started_ = false;
  std::uint32_t deadline_exits_ = 0;
};

}  // namespace

std::string agent_description() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "no CUDA device";
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return fmt::format("{}, {} SMs, sm_{}{}; CUDA driver API {}, runtime {}", p.name, p.multiProcessorCount, p.major,
                     p.minor, driver, runtime);
}
std::uint32_t agent_units() {
  int sms = 0;
  return cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess && sms > 0
             ? static_cast<std::uint32_t>(sms)
             : 1u;
}

Result<std::unique_ptr<NullService>> start_null_service(const std::vector<test::NullControllerQueue>& views,
                                                        const NullServiceSettings& settings) {
  auto service = std::make_unique<GpuNullService>();
  TUTTI_RETURN_IF_ERROR(service->start(views, settings));
  return std::unique_ptr<NullService>(std::move(service));
}

Result<double> run_raw_driver(const test::RawDriverArgs& args, std::uint32_t agents, std::uint32_t per_block) {
  if (per_block == 0 || agents % per_block != 0)
    return error(StatusCode::INVALID_ARGUMENT, "raw rows: {} warps are not whole blocks of {}", agents, per_block);
  cudaStream_t stream = nullptr;
  TUTTI_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  gpu_test::raw_command_kernel<<<agents / per_block, per_block * 32, 0, stream>>>(args);
  Status launched = cuda_status(cudaGetLastError(), "raw_command_kernel launch");
  cudaEventRecord(stop, stream);
  Status waited = cuda_status(cudaStreamSynchronize(stream), "raw_command_kernel");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  TUTTI_RETURN_IF_ERROR(launched);
  TUTTI_RETURN_IF_ERROR(waited);
  return ms / 1e3;
}

std::uint32_t raw_commands_per_lane() { return 1; }

void* create_stream() {
  cudaStream_t stream = nullptr;
  return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess ? stream : nullptr;
}
void destroy_stream(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

}  // namespace tutti::bench::gpu
