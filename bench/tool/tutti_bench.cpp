// tutti-bench: an fio-like load generator for Tutti backends.
//
//   tutti-bench --backend uring --dir /mnt/nvme0/bench --pattern rand --rw read --block-size 4096
//               --queue-depth 64 --batch 16 --files 4 --file-size 268435456 --seconds 10 --json out.json
//
// Keeps up to --queue-depth requests in flight, submitted --batch at a time; requests the backend
// pushes back (RESOURCE_EXHAUSTED) are resubmitted later. Latency is measured per IO handle from
// submit to the moment query() first sees it complete and attributed to each of its requests.
// Prints a table row and writes JSON (scripts/plot-bench turns JSON files into PNG plots).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/tutti.hpp>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string backend = "uring";
  std::string dir;
  std::string pattern = "rand";  // seq | rand
  std::string rw = "read";       // read | write | mix
  std::uint32_t read_percent = 70;
  std::uint64_t block_size = 4096;
  std::uint32_t batch = 16;
  std::uint32_t queue_depth = 64;
  std::uint32_t files = 1;
  std::uint64_t file_size = std::uint64_t{256} << 20;
  double seconds = 5.0;
  std::string memory = "host";  // host | pinned
  std::string json_path;
  bool drop_caches = geteuid() == 0;
  std::uint64_t seed = 1;
};

struct Results {
  std::uint64_t bytes = 0, requests = 0, commands = 0, rejected = 0, errors = 0;
  double seconds = 0;
  std::vector<double> latencies_us;
  double percentile(double p) {
    if (latencies_us.empty()) return 0;
    std::sort(latencies_us.begin(), latencies_us.end());
    const auto index = static_cast<std::size_t>(p / 100.0 * static_cast<double>(latencies_us.size() - 1));
    return latencies_us[index];
  }
};

std::string file_uri(const fs::path& p) { return "file://" + fs::absolute(p).string(); }

/// Creates and fills the benchmark files once (reused when their size matches).
tutti::Status prepare(const Config& c) {
  std::error_code ec;
  fs::create_directories(c.dir, ec);
  std::vector<char> chunk(1 << 20, static_cast<char>(0xab));
  for (std::uint32_t f = 0; f < c.files; ++f) {
    const fs::path p = fs::path(c.dir) / fmt::format("bench-{}.dat", f);
    if (fs::exists(p) && fs::file_size(p) == c.file_size) continue;
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return tutti::error(tutti::StatusCode::DEVICE_ERROR, "create {}: {}", p.string(), std::strerror(errno));
    for (std::uint64_t off = 0; off < c.file_size; off += chunk.size()) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), c.file_size - off));
      if (::pwrite(fd, chunk.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
        ::close(fd);
        return tutti::error(tutti::StatusCode::DEVICE_ERROR, "write {}", p.string());
      }
    }
    ::fsync(fd);
    ::close(fd);
  }
  return tutti::Status::success();
}

template <class Runtime>
tutti::Result<Results> run(Runtime& rt, const Config& c, const std::vector<std::string>& uris) {
  std::vector<tutti::TargetHandle> targets;
  for (const auto& r : rt.open_batch(uris, {.writable = c.rw != "read"})) {
    if (!r) return r.status();
    targets.push_back(*r);
  }
  const std::uint64_t memory_bytes = std::uint64_t{c.queue_depth} * c.block_size;
  auto* buffer = static_cast<std::byte*>(std::aligned_alloc(4096, (memory_bytes + 4095) / 4096 * 4096));
  if (buffer == nullptr)
    return tutti::error(tutti::StatusCode::RESOURCE_EXHAUSTED,
                        "--queue-depth {} x --block-size {} = {} bytes of memory could not be allocated", c.queue_depth,
                        c.block_size, memory_bytes);
  std::memset(buffer, 0x5a, memory_bytes);
  if (c.memory == "pinned" && ::mlock(buffer, memory_bytes) != 0) {
    std::free(buffer);
    return tutti::error(tutti::StatusCode::RESOURCE_EXHAUSTED, "--memory pinned: mlock of {} bytes failed: {}",
                        memory_bytes, std::strerror(errno));
  }
  auto memory = rt.register_memory({buffer, memory_bytes, c.memory == "pinned" ? tutti::MemoryKind::PINNED_HOST : tutti::MemoryKind::HOST});
  if (!memory) {
    std::free(buffer);
    return memory.status();
  }
  std::mt19937_64 rng(c.seed);
  const std::uint64_t blocks_per_file = c.file_size / c.block_size;
  std::uint64_t sequential = 0;
  std::vector<std::uint32_t> free_slots(c.queue_depth);
  for (std::uint32_t i = 0; i < c.queue_depth; ++i) free_slots[i] = c.queue_depth - 1 - i;

  struct InFlight {
    tutti::IoHandle io;
    Clock::time_point submitted;
    std::vector<std::uint32_t> slots;
  };
  std::deque<InFlight> in_flight;
  Results results;
  std::vector<tutti::IoRequest> pending;
  std::vector<std::uint32_t> pending_slots;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(c.seconds);
  tutti::Status failure;

  auto complete = [&](InFlight& f, const tutti::IoResult& r) {
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - f.submitted).count();
    results.bytes += r.confirmed_bytes;
    results.requests += r.requests;
    results.commands += r.commands;
    results.errors += r.failed_requests.size();
    for (std::size_t i = 0; i < r.requests; ++i) results.latencies_us.push_back(us);
    for (auto s : f.slots) free_slots.push_back(s);
    (void)rt.release(f.io);
  };

  while (Clock::now() < end && failure.is_ok()) {
    // Fill: new requests into free memory slots, up to one batch at a time.
    while (pending.size() < c.batch && !free_slots.empty()) {
      const std::uint32_t slot = free_slots.back();
      free_slots.pop_back();
      std::uint64_t block;
      std::uint32_t file;
      if (c.pattern == "seq") {
        block = sequential % blocks_per_file;
        file = static_cast<std::uint32_t>((sequential / blocks_per_file) % c.files);
        ++sequential;
      } else {
        block = rng() % blocks_per_file;
        file = static_cast<std::uint32_t>(rng() % c.files);
      }
      const bool read = c.rw == "read" || (c.rw == "mix" && rng() % 100 < c.read_percent);
      pending.push_back({read ? tutti::Direction::READ : tutti::Direction::WRITE, *memory, std::uint64_t{slot} * c.block_size,
                         targets[file], block * c.block_size, c.block_size});
      pending_slots.push_back(slot);
    }
    if (!pending.empty()) {
      const auto submitted = Clock::now();  // latency includes the submit call itself
      auto outcome = rt.submit(pending);
      InFlight f{outcome.io, submitted, {}};
      std::vector<tutti::IoRequest> rejected;
      std::vector<std::uint32_t> rejected_slots;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (outcome.initial_states[i].is_ok()) {
          f.slots.push_back(pending_slots[i]);
        } else if (outcome.initial_states[i].code() == tutti::StatusCode::RESOURCE_EXHAUSTED) {
          ++results.rejected;
          rejected.push_back(pending[i]);
          rejected_slots.push_back(pending_slots[i]);
        } else {
          failure = outcome.initial_states[i];
        }
      }
      if (outcome.accepted > 0) in_flight.push_back(std::move(f));
      pending = std::move(rejected);
      pending_slots = std::move(rejected_slots);
    }
    // Reap: everything already complete; when nothing is and the queue is full, wait for the oldest.
    bool reaped = false;
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      auto q = rt.query(it->io);
      if (q && q->complete) {
        auto r = rt.wait(it->io, 0);
        if (r) complete(*it, *r);
        it = in_flight.erase(it);
        reaped = true;
      } else {
        ++it;
      }
    }
    if (!reaped && free_slots.empty() && !in_flight.empty()) {
      auto r = rt.wait(in_flight.front().io, 1'000'000);
      if (r) {
        complete(in_flight.front(), *r);
        in_flight.pop_front();
      } else if (r.code() != tutti::StatusCode::TIMEOUT) {
        failure = r.status();
      }
    }
  }
  for (auto& f : in_flight) {
    auto r = rt.wait(f.io, 30'000'000'000);
    if (r) complete(f, *r);
  }
  results.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (rt.unregister_memory(*memory).is_ok()) std::free(buffer);  // else IO may still land there: leak it
  for (auto t : targets) (void)rt.close(t);
  if (!failure.is_ok()) return failure;
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"tutti-bench: fio-like load for Tutti backends; prints a table row and writes JSON"};
  app.add_option("--backend", c.backend, "uring or memfs")->check(CLI::IsMember({"uring", "memfs"}))->capture_default_str();
  app.add_option("--dir", c.dir, "Directory for the benchmark files (file backends)");
  app.add_option("--pattern", c.pattern, "seq or rand")->check(CLI::IsMember({"seq", "rand"}))->capture_default_str();
  app.add_option("--rw", c.rw, "read, write or mix")->check(CLI::IsMember({"read", "write", "mix"}))->capture_default_str();
  app.add_option("--read-percent", c.read_percent, "Reads in a mix, percent")->check(CLI::Range(0u, 100u))->capture_default_str();
  app.add_option("--block-size", c.block_size, "Bytes per request (multiple of 4096)")->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 30))->capture_default_str();
  app.add_option("--batch", c.batch, "Requests per submit")->check(CLI::Range(1u, 8192u))->capture_default_str();
  app.add_option("--queue-depth", c.queue_depth, "Requests in flight")->check(CLI::Range(1u, 65536u))->capture_default_str();
  app.add_option("--files", c.files, "Number of files")->check(CLI::Range(1u, 4096u))->capture_default_str();
  app.add_option("--file-size", c.file_size, "Bytes per file")->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 40))->capture_default_str();
  app.add_option("--seconds", c.seconds, "Duration")->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  app.add_option("--memory", c.memory, "host or pinned")->check(CLI::IsMember({"host", "pinned"}))->capture_default_str();
  app.add_option("--json", c.json_path, "Write results as JSON to this file");
  app.add_flag("--drop-caches,!--no-drop-caches", c.drop_caches, "Drop the page cache before the run (root only)");
  CLI11_PARSE(app, argc, argv);
  if (c.block_size % 4096 != 0 || c.file_size % c.block_size != 0) {
    fmt::print(stderr, "error: --block-size = {} must be a multiple of 4096 and divide --file-size = {}\n", c.block_size, c.file_size);
    return 2;
  }
  if (c.batch > c.queue_depth) {
    fmt::print(stderr, "error: --batch = {} exceeds --queue-depth = {}\n", c.batch, c.queue_depth);
    return 2;
  }

  tutti::Result<Results> results = tutti::Status(tutti::StatusCode::INTERNAL, "no backend ran");
  std::vector<std::string> uris;
  if (c.backend == "memfs") {
    for (std::uint32_t f = 0; f < c.files; ++f) uris.push_back(fmt::format("memfs://bench-{}?size={}", f, c.file_size));
    auto rt = tutti::make_memfs_runtime();
    results = rt ? run(*rt, c, uris) : tutti::Result<Results>(rt.status());
  } else {
    if (c.dir.empty()) {
      fmt::print(stderr, "error: --dir is required for backend {}\n", c.backend);
      return 2;
    }
    if (auto s = prepare(c); !s.is_ok()) {
      fmt::print(stderr, "error: {}\n", s.to_string());
      return 2;
    }
    if (c.drop_caches && std::system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null") != 0)
      fmt::print(stderr, "note: --drop-caches: /proc/sys/vm/drop_caches is not writable; the page cache was kept\n");
    for (std::uint32_t f = 0; f < c.files; ++f) uris.push_back(file_uri(fs::path(c.dir) / fmt::format("bench-{}.dat", f)));
    auto rt = tutti::make_uring_runtime();
    results = rt ? run(*rt, c, uris) : tutti::Result<Results>(rt.status());
  }
  if (!results) {
    fmt::print(stderr, "error: {}\n", results.status().to_string());
    return 1;
  }
  Results& r = *results;
  const double mbps = static_cast<double>(r.bytes) / r.seconds / 1e6;
  const double iops = static_cast<double>(r.requests) / r.seconds;
  const double p50 = r.percentile(50), p99 = r.percentile(99), p999 = r.percentile(99.9);
  fmt::print("{:<8} {:<5} {:<5} {:>8} {:>6} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7}\n", "backend", "pat", "rw", "bs", "qd",
             "batch", "MB/s", "IOPS", "p50_us", "p99_us", "p99.9_us", "errors");
  fmt::print("{:<8} {:<5} {:<5} {:>8} {:>6} {:>6} {:>10.1f} {:>10.0f} {:>9.1f} {:>9.1f} {:>9.1f} {:>7}\n", c.backend, c.pattern,
             c.rw, c.block_size, c.queue_depth, c.batch, mbps, iops, p50, p99, p999, r.errors);
  if (!c.json_path.empty()) {
    nlohmann::json j = {{"backend", c.backend}, {"pattern", c.pattern}, {"rw", c.rw}, {"block_size", c.block_size},
                        {"queue_depth", c.queue_depth}, {"batch", c.batch}, {"files", c.files}, {"file_size", c.file_size},
                        {"memory", c.memory}, {"seconds", r.seconds}, {"bytes", r.bytes}, {"requests", r.requests},
                        {"commands", r.commands}, {"rejected", r.rejected}, {"errors", r.errors}, {"mb_per_s", mbps},
                        {"iops", iops}, {"latency_us", {{"p50", p50}, {"p99", p99}, {"p99.9", p999}}}};
    std::ofstream(c.json_path) << j.dump(2) << "\n";
  }
  return r.errors == 0 ? 0 : 1;
}
