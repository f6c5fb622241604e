// tutti-bench: an fio-like load generator for Tutti backends.
//
//   tutti-bench --backend uring --dir /mnt/nvme0/bench --pattern rand --rw read --block-size 4096
//               --queue-depth 64 --batch 16 --files 4 --file-size 268435456 --seconds 10 --json out.json
//
// Keeps up to --queue-depth requests in flight, submitted --batch at a time; requests the backend
// pushes back (RESOURCE_EXHAUSTED) are resubmitted later. Latency is measured per IO handle from
// submit to the moment query() first sees it complete and attributed to each of its requests.
// Prints a table row and writes JSON (scripts/plot-bench turns JSON files into PNG plots).
//
// --verify (the default): the files hold a self-checking pattern (bench/support/verify_pattern.hpp;
// memfs files are written with it through the runtime first), read memory is poisoned before each
// read and checked block by block when the read completes, WRITEs carry the pattern with a stamp of
// this run, and every block written is read back through the runtime after the run and checked.
// MB/s counts only requests that completed OK and, with --verify, read back correct; a mismatch fails
// the run (exit 1). The time spent checking is part of the run and printed on its own line.
// The submit line: wall time spent inside StorageRuntime::submit per request handed to it.
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

#include <unordered_set>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/tutti.hpp>

#include "../support/verify_pattern.hpp"

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
  bool verify = true;
  std::uint64_t seed = 1;
};

struct Results {
  std::uint64_t bytes = 0, requests = 0, commands = 0, rejected = 0, errors = 0;
  double seconds = 0;
  std::uint64_t verified_read_bytes = 0, verified_written_bytes = 0, mismatched_blocks = 0;
  double verify_seconds = 0;
  double submit_seconds = 0;             // wall time inside StorageRuntime::submit
  std::uint64_t submitted_requests = 0;  // requests handed to submit (rejected ones included)
  std::vector<double> latencies_us;
  double percentile(double p) {
    if (latencies_us.empty()) return 0;
    std::sort(latencies_us.begin(), latencies_us.end());
    const auto index = static_cast<std::size_t>(p / 100.0 * static_cast<double>(latencies_us.size() - 1));
    return latencies_us[index];
  }
};

std::string file_uri(const fs::path& p) { return "file://" + fs::absolute(p).string(); }

/// Whether the file already holds the pattern of file `index` (its first and last blocks are checked).
bool holds_pattern(const fs::path& p, std::uint32_t index, std::uint64_t size) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::vector<std::byte> block(tutti::bench::kPatternBlockBytes);
  bool ok = true;
  for (std::uint64_t at : {std::uint64_t{0}, size - block.size()})
    ok = ok && ::pread(fd, block.data(), block.size(), static_cast<off_t>(at)) == static_cast<ssize_t>(block.size()) &&
         tutti::bench::count_bad_blocks(block.data(), index, at, block.size()) == 0;
  ::close(fd);
  return ok;
}

/// Creates and fills the benchmark files with the verification pattern once (reused when their size
/// matches and they hold the pattern).
tutti::Status prepare(const Config& c) {
  std::error_code ec;
  fs::create_directories(c.dir, ec);
  std::vector<std::byte> chunk(1 << 20);
  for (std::uint32_t f = 0; f < c.files; ++f) {
    const fs::path p = fs::path(c.dir) / fmt::format("bench-{}.dat", f);
    if (fs::exists(p) && fs::file_size(p) == c.file_size && holds_pattern(p, f, c.file_size)) continue;
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return tutti::error(tutti::StatusCode::DEVICE_ERROR, "create {}: {}", p.string(), std::strerror(errno));
    for (std::uint64_t off = 0; off < c.file_size; off += chunk.size()) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), c.file_size - off));
      tutti::bench::fill_pattern(chunk.data(), f, off, n, 0);
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

/// Runs `requests` through the runtime to completion (RESOURCE_EXHAUSTED ones again after the
/// others finished). Errors: a request's or the runtime's failure.
template <class Runtime>
tutti::Status run_to_completion(Runtime& rt, std::vector<tutti::IoRequest> requests) {
  while (!requests.empty()) {
    auto outcome = rt.submit(requests);
    std::vector<tutti::IoRequest> again;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (outcome.initial_states[i].is_ok()) continue;
      if (outcome.initial_states[i].code() != tutti::StatusCode::RESOURCE_EXHAUSTED) return outcome.initial_states[i];
      again.push_back(requests[i]);
    }
    if (outcome.accepted > 0) {
      auto r = rt.wait(outcome.io, 60'000'000'000);
      if (!r) return r.status();
      (void)rt.release(outcome.io);
      if (!r->status.is_ok()) return r->status;
    }
    requests = std::move(again);
  }
  return tutti::Status::success();
}

/// memfs files start zeroed: with --verify, writes the pattern into them through the runtime first.
template <class Runtime>
tutti::Status fill_memfs(Runtime& rt, const Config& c, const std::vector<tutti::TargetHandle>& targets,
                         std::byte* buffer, tutti::MemoryHandle memory, std::uint64_t memory_bytes) {
  const std::uint64_t chunk = std::min<std::uint64_t>(memory_bytes, 1 << 20);  // a multiple of 4096
  for (std::uint32_t f = 0; f < c.files; ++f)
    for (std::uint64_t off = 0; off < c.file_size; off += chunk) {
      const std::uint64_t n = std::min(chunk, c.file_size - off);
      tutti::bench::fill_pattern(buffer, f, off, n, 0);
      TUTTI_RETURN_IF_ERROR(run_to_completion(rt, {{tutti::Direction::WRITE, memory, 0, targets[f], off, n}}));
    }
  return tutti::Status::success();
}

template <class Runtime>
tutti::Result<Results> run(Runtime& rt, const Config& c, const std::vector<std::string>& uris) {
  namespace pattern = tutti::bench;
  const bool writes = c.rw != "read";
  std::vector<tutti::TargetHandle> targets;
  for (const auto& r : rt.open_batch(uris, {.writable = writes || c.backend == "memfs"})) {
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
  auto memory = rt.register_memory(
      {buffer, memory_bytes, c.memory == "pinned" ? tutti::MemoryKind::PINNED_HOST : tutti::MemoryKind::HOST});
  if (!memory) {
    std::free(buffer);
    return memory.status();
  }
  tutti::Status failure;
  if (c.backend == "memfs" && c.verify) failure = fill_memfs(rt, c, targets, buffer, *memory, memory_bytes);
  std::mt19937_64 rng(c.seed);
  const std::uint64_t blocks_per_file = c.file_size / c.block_size;
  std::uint64_t sequential = 0;
  std::vector<std::uint32_t> free_slots(c.queue_depth);
  for (std::uint32_t i = 0; i < c.queue_depth; ++i) free_slots[i] = c.queue_depth - 1 - i;
  pattern::WriteStamps stamps;
  // With writes, no two requests in flight touch the same block (a read racing a write could see a
  // torn block); `busy` holds the in-flight blocks as file << 40 | block.
  std::unordered_set<std::uint64_t> busy, written;
  auto key = [](std::uint32_t file, std::uint64_t block) { return (std::uint64_t{file} << 40) | block; };

  struct Issued {
    std::uint32_t slot = 0, file = 0;
    std::uint64_t block = 0;
    bool read = true;
  };
  struct InFlight {
    tutti::IoHandle io;
    Clock::time_point submitted;
    std::vector<Issued> issued;  // by submit input index
    std::vector<bool> accepted;
  };
  std::deque<InFlight> in_flight;
  Results results;
  std::vector<tutti::IoRequest> pending;
  std::vector<Issued> pending_issued;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(c.seconds);

  auto complete = [&](InFlight& f, const tutti::IoResult& r) {
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - f.submitted).count();
    results.requests += r.requests;
    results.commands += r.commands;
    results.errors += r.failed_requests.size();
    for (std::size_t i = 0; i < r.requests; ++i) results.latencies_us.push_back(us);
    const auto verify_start = Clock::now();
    for (const tutti::RequestCompletion& done : r.completions) {
      const Issued& is = f.issued[done.request_index];
      std::byte* memory_at = buffer + std::uint64_t{is.slot} * c.block_size;
      if (done.status.is_ok()) {
        bool correct = true;
        if (is.read && c.verify) {
          const std::uint64_t bad =
              pattern::count_bad_blocks(memory_at, is.file, is.block * c.block_size, c.block_size);
          results.mismatched_blocks += bad;
          correct = bad == 0;
          if (correct) results.verified_read_bytes += c.block_size;
        }
        if (!is.read) written.insert(key(is.file, is.block));
        if (correct) results.bytes += c.block_size;
      }
      busy.erase(key(is.file, is.block));
      free_slots.push_back(is.slot);
    }
    if (c.verify) results.verify_seconds += std::chrono::duration<double>(Clock::now() - verify_start).count();
    (void)rt.release(f.io);
  };

  while (failure.is_ok() && Clock::now() < end) {
    // Fill: new requests into free memory slots, up to one batch at a time.
    for (int collisions = 0; pending.size() < c.batch && !free_slots.empty() && collisions < 64;) {
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
      if (writes && !busy.insert(key(file, block)).second) {  // in flight already: pick another
        ++collisions;
        continue;
      }
      const std::uint32_t slot = free_slots.back();
      free_slots.pop_back();
      std::byte* memory_at = buffer + std::uint64_t{slot} * c.block_size;
      if (!read)  // WRITEs always carry the pattern, so the files stay checkable
        pattern::fill_pattern(memory_at, file, block * c.block_size, c.block_size, stamps.next());
      else if (c.verify)  // bytes a read does not deliver never pass the check
        std::memset(memory_at, pattern::kPoisonByte, c.block_size);
      pending.push_back({read ? tutti::Direction::READ : tutti::Direction::WRITE, *memory,
                         std::uint64_t{slot} * c.block_size, targets[file], block * c.block_size, c.block_size});
      pending_issued.push_back({slot, file, block, read});
    }
    if (!pending.empty()) {
      const auto submitted = Clock::now();  // latency includes the submit call itself
      auto outcome = rt.submit(pending);
      results.submit_seconds += std::chrono::duration<double>(Clock::now() - submitted).count();
      results.submitted_requests += pending.size();
      InFlight f{outcome.io, submitted, pending_issued, std::vector<bool>(pending.size(), false)};
      std::vector<tutti::IoRequest> rejected;
      std::vector<Issued> rejected_issued;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (outcome.initial_states[i].is_ok()) {
          f.accepted[i] = true;
        } else if (outcome.initial_states[i].code() == tutti::StatusCode::RESOURCE_EXHAUSTED) {
          ++results.rejected;
          rejected.push_back(pending[i]);
          rejected_issued.push_back(pending_issued[i]);
        } else {
          failure = outcome.initial_states[i];
          busy.erase(key(pending_issued[i].file, pending_issued[i].block));
          free_slots.push_back(pending_issued[i].slot);
        }
      }
      if (outcome.accepted > 0) in_flight.push_back(std::move(f));
      pending = std::move(rejected);
      pending_issued = std::move(rejected_issued);
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

  // Every block written in this run is read back through the runtime and must carry this run's stamp.
  if (failure.is_ok() && c.verify && !written.empty()) {
    std::vector<std::uint64_t> keys(written.begin(), written.end());
    for (std::size_t first = 0; first < keys.size() && failure.is_ok(); first += c.queue_depth) {
      const std::size_t n = std::min<std::size_t>(c.queue_depth, keys.size() - first);
      std::vector<tutti::IoRequest> reads;
      for (std::size_t i = 0; i < n; ++i) {
        std::memset(buffer + i * c.block_size, pattern::kPoisonByte, c.block_size);
        reads.push_back({tutti::Direction::READ, *memory, i * c.block_size, targets[keys[first + i] >> 40],
                         (keys[first + i] & ((std::uint64_t{1} << 40) - 1)) * c.block_size, c.block_size});
      }
      failure = run_to_completion(rt, reads);
      for (std::size_t i = 0; i < n && failure.is_ok(); ++i) {
        const std::byte* at = buffer + i * c.block_size;
        std::uint64_t bad = pattern::count_bad_blocks(at, keys[first + i] >> 40, reads[i].target_offset, c.block_size);
        for (std::uint64_t b = 0; b < c.block_size; b += pattern::kPatternBlockBytes)
          bad += stamps.ours(pattern::pattern_stamp(at + b)) ? 0 : 1;
        results.mismatched_blocks += bad;
        if (bad == 0) results.verified_written_bytes += c.block_size;
      }
    }
  }
  if (rt.unregister_memory(*memory).is_ok()) std::free(buffer);  // else IO may still land there: leak it
  for (auto t : targets) (void)rt.close(t);
  if (!failure.is_ok()) return failure;
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"tutti-bench: fio-like load for Tutti backends; prints a table row and writes JSON"};
  app.add_option("--backend", c.backend, "uring or memfs")
      ->check(CLI::IsMember({"uring", "memfs"}))
      ->capture_default_str();
  app.add_option("--dir", c.dir, "Directory for the benchmark files (file backends)");
  app.add_option("--pattern", c.pattern, "seq or rand")->check(CLI::IsMember({"seq", "rand"}))->capture_default_str();
  app.add_option("--rw", c.rw, "read, write or mix")
      ->check(CLI::IsMember({"read", "write", "mix"}))
      ->capture_default_str();
  app.add_option("--read-percent", c.read_percent, "Reads in a mix, percent")
      ->check(CLI::Range(0u, 100u))
      ->capture_default_str();
  app.add_option("--block-size", c.block_size, "Bytes per request (multiple of 4096)")
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--batch", c.batch, "Requests per submit")->check(CLI::Range(1u, 8192u))->capture_default_str();
  app.add_option("--queue-depth", c.queue_depth, "Requests in flight")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--files", c.files, "Number of files")->check(CLI::Range(1u, 4096u))->capture_default_str();
  app.add_option("--file-size", c.file_size, "Bytes per file")
      ->check(CLI::Range(std::uint64_t{4096}, std::uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--seconds", c.seconds, "Duration")->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  app.add_option("--memory", c.memory, "host or pinned")
      ->check(CLI::IsMember({"host", "pinned"}))
      ->capture_default_str();
  app.add_option("--json", c.json_path, "Write results as JSON to this file");
  app.add_flag("--drop-caches,!--no-drop-caches", c.drop_caches, "Drop the page cache before the run (root only)");
  app.add_flag("--verify,!--no-verify", c.verify,
               "Check every byte read against the files' pattern and read back every block written (default on)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (c.block_size % 4096 != 0 || c.file_size % c.block_size != 0) {
    fmt::print(stderr, "error: --block-size = {} must be a multiple of 4096 and divide --file-size = {}\n",
               c.block_size, c.file_size);
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
    for (std::uint32_t f = 0; f < c.files; ++f)
      uris.push_back(file_uri(fs::path(c.dir) / fmt::format("bench-{}.dat", f)));
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
  fmt::print("{:<8} {:<5} {:<5} {:>8} {:>6} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7}\n", "backend", "pat", "rw",
             "bs", "qd", "batch", "MB/s", "IOPS", "p50_us", "p99_us", "p99.9_us", "errors");
  fmt::print("{:<8} {:<5} {:<5} {:>8} {:>6} {:>6} {:>10.1f} {:>10.0f} {:>9.1f} {:>9.1f} {:>9.1f} {:>7}{}\n", c.backend,
             c.pattern, c.rw, c.block_size, c.queue_depth, c.batch, mbps, iops, p50, p99, p999, r.errors,
             r.mismatched_blocks > 0 ? "  VERIFY FAILED" : "");
  const double submit_ns =
      r.submitted_requests ? r.submit_seconds / static_cast<double>(r.submitted_requests) * 1e9 : 0;
  fmt::print("submit: {:.0f} ns per request inside StorageRuntime::submit ({} requests in {:.3f} s)\n", submit_ns,
             r.submitted_requests, r.submit_seconds);
  if (c.verify)
    fmt::print(
        "verify: {} bytes read and checked, {} bytes written and read back, {} mismatched 4096-byte blocks "
        "({:.3f} s of checking in the {:.3f} s run)\n",
        r.verified_read_bytes, r.verified_written_bytes, r.mismatched_blocks, r.verify_seconds, r.seconds);
  else
    fmt::print("verify: off (--no-verify): MB/s counts bytes the runtime confirmed, not checked\n");
  if (!c.json_path.empty()) {
    nlohmann::json j = {{"backend", c.backend},
                        {"pattern", c.pattern},
                        {"rw", c.rw},
                        {"block_size", c.block_size},
                        {"queue_depth", c.queue_depth},
                        {"batch", c.batch},
                        {"files", c.files},
                        {"file_size", c.file_size},
                        {"memory", c.memory},
                        {"seconds", r.seconds},
                        {"bytes", r.bytes},
                        {"requests", r.requests},
                        {"commands", r.commands},
                        {"rejected", r.rejected},
                        {"errors", r.errors},
                        {"mb_per_s", mbps},
                        {"iops", iops},
                        {"latency_us", {{"p50", p50}, {"p99", p99}, {"p99.9", p999}}},
                        {"submit_ns_per_request", submit_ns},
                        {"verify", c.verify},
                        {"verified_read_bytes", r.verified_read_bytes},
                        {"verified_written_bytes", r.verified_written_bytes},
                        {"mismatched_blocks", r.mismatched_blocks},
                        {"verify_seconds", r.verify_seconds}};
    std::ofstream(c.json_path) << j.dump(2) << "\n";
  }
  return r.errors == 0 && r.mismatched_blocks == 0 ? 0 : 1;
}
