// The host-thread baselines of tutti-bench-gpu-local-nvme: see local_nvme_read_baselines.hpp.
#include "local_nvme_read_baselines.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include <tutti/presets/uring.hpp>

#include "uring_device_staging.hpp"
#if defined(TUTTI_HAVE_CUFILE)
#include "cufile_reader.hpp"
#endif

namespace tutti::bench::gpu_read {
namespace {

constexpr std::uint64_t kTimeoutNs = 60'000'000'000ull;  // every wait of a pass: 60 s

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Row failed_setup(const std::string& name, std::uint64_t request_bytes, const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", name.c_str(), why.c_str());
  Row row;
  row.path = name;
  row.request_bytes = request_bytes;
  row.errors = 1;
  row.note = why;
  return row;
}

}  // namespace

Row measure_uring(const std::string& file, void* device, std::uint64_t file_bytes, std::uint64_t request_bytes,
                  std::uint32_t queue_depth, const PassFrame& frame) {
  const std::string name = "tutti uring (O_DIRECT, pinned staging)";
  auto created = make_uring_runtime(uring_device_read_options(request_bytes, queue_depth));
  if (!created) return failed_setup(name, request_bytes, "setup failed: " + created.status().to_string());
  UringRuntime& runtime = *created;
  auto target = runtime.open("file://" + file, {});
  if (!target) return failed_setup(name, request_bytes, "open failed: " + target.status().to_string());
  auto memory = runtime.register_memory({device, file_bytes, MemoryKind::DEVICE, 0});
  if (!memory) {
    (void)runtime.close(*target);
    return failed_setup(name, request_bytes, "register_memory failed: " + memory.status().to_string());
  }
  const std::size_t per_submit = std::max<std::size_t>(1, queue_depth / 2);
  Row best = best_of(name, request_bytes, frame, [&](Row& row) {
    std::deque<IoHandle> in_flight;
    std::uint64_t offset = 0;
    auto submit_next = [&] {
      std::vector<IoRequest> requests;
      for (; offset < file_bytes && requests.size() < per_submit; offset += request_bytes)
        requests.push_back({Direction::READ, *memory, offset, *target, offset, request_bytes});
      if (requests.empty()) return;
      auto outcome = runtime.submit(requests);
      if (outcome.accepted != requests.size()) {
        if (row.errors == 0)
          std::fprintf(stderr, "uring submit accepted %zu of %zu: %s\n", outcome.accepted, requests.size(),
                       outcome.initial_states.back().to_string().c_str());
        row.errors += requests.size() - outcome.accepted;
      }
      if (outcome.accepted > 0) in_flight.push_back(outcome.io);
    };
    const double start = now_seconds();
    submit_next();
    submit_next();
    while (!in_flight.empty()) {
      auto result = runtime.wait(in_flight.front(), kTimeoutNs);
      if (!result) {  // the reads may still land in the GPU memory: never free it
        std::fprintf(stderr, "uring wait: %s; reads may still be in flight: exiting without freeing their memory\n",
                     result.status().to_string().c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
      if (!result->status.is_ok() || result->confirmed_bytes != result->requested_bytes) {
        if (row.errors == 0)
          std::fprintf(stderr, "uring IO failed: %s (%llu of %llu bytes confirmed)\n",
                       result->status.to_string().c_str(), static_cast<unsigned long long>(result->confirmed_bytes),
                       static_cast<unsigned long long>(result->requested_bytes));
        row.errors += std::max<std::size_t>(result->failed_requests.size(), 1);
      }
      row.bytes += result->confirmed_bytes;
      row.requests += result->requests - std::min(result->requests, result->failed_requests.size());
      (void)runtime.release(in_flight.front());
      in_flight.pop_front();
      submit_next();
    }
    row.seconds = now_seconds() - start;
  });
  if (Status s = runtime.unregister_memory(*memory); !s.is_ok()) {
    std::fprintf(stderr, "uring unregister_memory: %s\n", s.to_string().c_str());
    ++best.errors;
  }
  (void)runtime.close(*target);
  return best;
}

#if defined(TUTTI_HAVE_CUFILE)
class CufileSession {
 public:
  std::unique_ptr<cufile::Driver> driver;
  std::unique_ptr<cufile::DeviceBuffer> buffer;  // destroyed first: cuFileBufDeregister before the driver closes
};

std::unique_ptr<CufileSession, void (*)(CufileSession*)> open_cufile(void* device, std::uint64_t bytes,
                                                                     std::string& description) {
  std::unique_ptr<CufileSession, void (*)(CufileSession*)> none(nullptr, [](CufileSession* s) { delete s; });
  cufile::Driver::Options options;
  options.device = 0;
  auto driver = cufile::Driver::open(options);
  if (!driver) {  // measured without cuFile, and said so
    description = "cuFileDriverOpen failed: " + driver.status().to_string();
    return none;
  }
  description = (*driver)->info().describe();
  auto buffer = cufile::DeviceBuffer::register_range(device, bytes);
  if (!buffer) {
    std::fprintf(stderr, "cuFileBufRegister refused (%s); reading into unregistered memory\n",
                 buffer.status().to_string().c_str());
    buffer = cufile::DeviceBuffer::unregistered(device, bytes);
  }
  if (!buffer) {
    description += "; buffer: " + buffer.status().to_string();
    return none;
  }
  auto session = new CufileSession{std::move(driver).value(), std::move(buffer).value()};
  return {session, [](CufileSession* s) {
            if (s) s->buffer.reset();
            delete s;
          }};
}

Row measure_cufile(CufileSession& session, const std::string& file, std::uint64_t file_bytes,
                   std::uint64_t request_bytes, std::uint32_t threads, const PassFrame& frame) {
  const std::string name = "cuFile (compat mode, cufile_reader.hpp)";
  std::string note = session.buffer->registered() ? "cuFileBufRegister'ed destination" : "unregistered destination";
  auto opened = cufile::File::open(file, true);
  if (!opened) {  // compat mode also takes a page-cache descriptor: say so, and use it
    std::fprintf(stderr, "cuFile with O_DIRECT refused (%s); trying without O_DIRECT\n",
                 opened.status().to_string().c_str());
    note += "; O_DIRECT refused (" + opened.status().to_string() + "), page-cache descriptor";
    opened = cufile::File::open(file, false);
  }
  if (!opened) return failed_setup(name, request_bytes, "cuFile open failed: " + opened.status().to_string());
  const std::unique_ptr<cufile::File> handle = std::move(opened).value();
  std::vector<cufile::Range> ranges;
  for (std::uint64_t offset = 0; offset < file_bytes; offset += request_bytes)
    ranges.push_back({handle.get(), offset, offset, request_bytes});
  cufile::ReadOptions read_options;
  read_options.threads = threads;
  read_options.timeout_ns = kTimeoutNs;
  Row best = best_of(name, request_bytes, frame, [&](Row& row) {
    const double start = now_seconds();
    auto report = cufile::read(*session.buffer, std::span<const cufile::Range>(ranges), read_options);
    row.seconds = now_seconds() - start;
    if (!report) {
      std::fprintf(stderr, "cuFile read: %s\n", report.status().to_string().c_str());
      row.errors += ranges.size();
      return;
    }
    row.bytes = report->bytes;
    row.requests = report->ranges;
    row.errors += ranges.size() - std::min<std::uint64_t>(report->ranges, ranges.size());
  });
  best.note = note;
  return best;
}
#else
class CufileSession {};

std::unique_ptr<CufileSession, void (*)(CufileSession*)> open_cufile(void*, std::uint64_t, std::string& description) {
  description = "not built (no libcufile / cufile.h in this toolkit)";
  return {nullptr, [](CufileSession* s) { delete s; }};
}

Row measure_cufile(CufileSession&, const std::string&, std::uint64_t, std::uint64_t request_bytes, std::uint32_t,
                   const PassFrame&) {
  return failed_setup("cuFile (compat mode, cufile_reader.hpp)", request_bytes, "not built");
}
#endif

}  // namespace tutti::bench::gpu_read
