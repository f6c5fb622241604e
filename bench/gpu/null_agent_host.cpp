// null_agent.hpp for the host profile: host threads service the null controller's queues and run
// the raw-queue rows.
#include "null_agent.hpp"

#include <chrono>
#include <thread>

#include <tutti/accel/primitives.hpp>

namespace tutti::bench::gpu {

std::string agent_description() {
  return "host threads (host profile: kernels and the null controller run on host threads)";
}
std::uint32_t agent_units() { return std::max(1u, std::thread::hardware_concurrency()); }

namespace {
class HostNullService final : public NullService {
 public:
  HostNullService(std::vector<test::NullControllerQueue> views, const NullServiceSettings& s)
      : views_(std::move(views)) {
    test::NullControllerSettings settings;
    settings.budget_ns = 600'000'000'000ull;  // 10 minutes: stop() ends it
    settings.stop_poll_interval_ns = s.stop_poll_ns;
    const std::uint32_t threads = std::max(1u, std::min<std::uint32_t>(s.host_threads, views_.size()));
    for (std::uint32_t i = 0; i < threads; ++i)
      threads_.emplace_back([this, i, threads, settings] {
        test::run_null_controller(views_.data(), static_cast<std::uint32_t>(views_.size()), i, threads, &control_,
                                  settings);
      });
  }
  ~HostNullService() override { stop(); }
  std::uint32_t stop() override {
    accel::SystemAtomicRef<std::uint32_t>(control_.stop).store(1, accel::MemoryOrder::release);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    return control_.deadline_exits;
  }

 private:
  std::vector<test::NullControllerQueue> views_;
  test::NullControllerControl control_{};
  std::vector<std::thread> threads_;
};
}  // namespace

Result<std::unique_ptr<NullService>> start_null_service(const std::vector<test::NullControllerQueue>& views,
                                                        const NullServiceSettings& settings) {
  return std::unique_ptr<NullService>(new HostNullService(views, settings));
}

Result<double> run_raw_driver(const test::RawDriverArgs& args, std::uint32_t agents, std::uint32_t) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < agents; ++i)
    threads.emplace_back([&args, i] { test::drive_raw_commands(args, i, i % args.queue_count); });
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uint32_t raw_commands_per_lane() { return 32; }
void* create_stream() { return nullptr; }
void destroy_stream(void*) {}

}  // namespace tutti::bench::gpu
