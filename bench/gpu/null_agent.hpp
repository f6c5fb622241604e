// Benchmark support (not library code): the agent that runs the null controller and the raw-queue
// rows of tutti-bench-gpu-submit, one definition per profile:
//   cuda profile  null_agent_cuda.cu: a persistent GPU kernel services the queues (one warp per
//                 queue, tests/support/null_controller.hpp), raw rows are GPU warps;
//   host profile  null_agent_host.cpp: host threads service the queues, raw rows are host threads.
// Everything the benchmark's main (submit_rate.cpp, host-compiled) needs from the accelerator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tutti/core/status.hpp>

#include "null_controller.hpp"   // tests/support
#include "raw_queue_driver.hpp"  // tests/support

namespace tutti::bench::gpu {

/// What the agents are, for the report ("NVIDIA H200, 132 SMs, ..." or "host threads").
std::string agent_description();
/// Streaming multiprocessors of the GPU (cuda profile), hardware threads (host profile).
std::uint32_t agent_units();

/// A running null controller service; stop() (also by the destructor) asks it to leave once idle
/// and waits (bounded by its budget), returning the servicing warps or threads that left because
/// their budget ran out (0 when all went well).
class NullService {
 public:
  virtual ~NullService() = default;
  virtual std::uint32_t stop() = 0;
};

struct NullServiceSettings {
  bool relay_stop = true;                ///< GPU: warp 0 relays the stop word into GPU memory (docs/gpu.md)
  std::uint64_t stop_poll_ns = 100'000;  ///< NullControllerSettings::stop_poll_interval_ns
  std::uint32_t host_threads = 1;        ///< host profile: servicing threads
};

/// Starts servicing `views` (views of queues in agent memory: NullNvmeController::controller_view).
/// Errors: DEVICE_ERROR (launch), TIMEOUT (the service did not start within 5 s).
Result<std::unique_ptr<NullService>> start_null_service(const std::vector<test::NullControllerQueue>& views,
                                                        const NullServiceSettings& settings);

/// Runs the raw-queue driver (tests/support/raw_queue_driver.hpp) with `agents` warps (GPU; blocks
/// of `per_block` warps, queue by test::select_queue) or host threads (agent i on queue i % Q).
/// `args` pointers are in agent memory. Returns the seconds the agents ran (CUDA events around the
/// kernel; steady_clock around the threads).
Result<double> run_raw_driver(const test::RawDriverArgs& args, std::uint32_t agents, std::uint32_t per_block);

/// Commands in flight per lane of a raw-queue agent: 1 on a GPU (32 lanes), 32 on a host thread.
std::uint32_t raw_commands_per_lane();

/// A stream for the DataPath's copies and kernels that never waits for the persistent service
/// (cuda: cudaStreamNonBlocking; host: nullptr), and its release.
void* create_stream();
void destroy_stream(void* stream);

}  // namespace tutti::bench::gpu
