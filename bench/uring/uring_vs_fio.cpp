// uring_vs_fio: the uring DataPath (through tutti::UringRuntime) against fio --ioengine=io_uring
// --direct=1, in the same run, on the same file, at the same block size and queue depth:
//   4 KiB random reads and 512 KiB sequential reads, page cache dropped before every run.
// Prints throughput (MB/s, 10^6 bytes per second), IOPS, the ratio uring / fio, and CPU time per IO
// (user + system, microseconds: getrusage for uring, less the thread CPU time --verify spends
// poisoning and checking memory; fio's usr_cpu + sys_cpu for fio).
//
//   uring_vs_fio [--file PATH] [--size BYTES] [--iodepth N] [--seconds S] [--fio PATH] [--batch N]
//                [--verify | --no-verify]
//
// --file      the test file (written with the self-checking pattern of bench/support/verify_pattern.hpp
//             when missing, smaller than --size or holding something else);
//             default /var/tmp/tutti-uring-bench.dat. Pick a file system with O_DIRECT.
// --size      bytes of the file used, default 1 GiB.
// --iodepth   requests in flight, default 32 (both sides).
// --seconds   seconds per measurement, default 10 (time based on both sides).
// --repeat    measurements per side and workload, default 3, alternating uring and fio; the median
//             is reported (this machine's disk is shared, single runs vary by +-30%).
// --batch     requests per runtime submit, default 4: the uring side keeps iodepth / batch submits of
//             `batch` requests in flight and replaces the oldest when it completes.
// --verify    (default) the uring side poisons each request's memory before the read and checks every
//             4096-byte block it read against the pattern when the read completes; MB/s counts only
//             checked bytes and a mismatch fails the run (exit 1). fio reads the same file without a
//             check (it can verify only data it wrote itself). --no-verify counts confirmed bytes.
// Needs root for drop_caches (without it the runs are warm for buffered readers; O_DIRECT reads do
// not use the page cache either way).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tutti/presets/uring.hpp>

#include "../support/verify_pattern.hpp"

namespace {

struct Settings {
  std::string file = "/var/tmp/tutti-uring-bench.dat";
  std::uint64_t size = std::uint64_t{1} << 30;
  std::uint32_t iodepth = 32;
  std::uint32_t seconds = 10;
  std::uint32_t batch = 4;
  std::uint32_t repeat = 3;
  std::string fio = "fio";
  bool verify = true;
};

struct Figures {
  double bytes_per_second = 0;
  double iops = 0;
  double cpu_us_per_io = 0;             ///< user + system CPU time per request, in microseconds
  std::uint64_t verified_bytes = 0;     ///< bytes read and checked against the pattern (uring side)
  std::uint64_t mismatched_blocks = 0;  ///< 4096-byte blocks that did not hold the pattern
};

/// CPU time of the calling thread, in seconds (the checking of --verify is measured with it and left
/// out of the uring side's CPU per IO, so that figure stays the IO path's).
double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

void drop_caches() {
  if (geteuid() != 0) return;
  if (std::system("sync && echo 3 > /proc/sys/vm/drop_caches") != 0) std::fprintf(stderr, "drop_caches failed\n");
}

/// Whether the first and the last block of the used size hold the pattern (file 0).
bool holds_pattern(int fd, std::uint64_t size) {
  std::vector<std::byte> block(tutti::bench::kPatternBlockBytes);
  for (std::uint64_t at : {std::uint64_t{0}, size - block.size()})
    if (::pread(fd, block.data(), block.size(), static_cast<off_t>(at)) != static_cast<ssize_t>(block.size()) ||
        tutti::bench::count_bad_blocks(block.data(), 0, at, block.size()) != 0)
      return false;
  return true;
}

bool prepare_file(const Settings& s) {
  const int fd = ::open(s.file.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<std::uint64_t>(st.st_size) < s.size || !holds_pattern(fd, s.size)) {
    std::fprintf(stderr, "writing %llu bytes of the verification pattern to %s ...\n",
                 static_cast<unsigned long long>(s.size), s.file.c_str());
    std::vector<std::byte> chunk(8u << 20);
    for (std::uint64_t done = 0; done < s.size; done += chunk.size()) {
      const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), s.size - done);
      tutti::bench::fill_pattern(chunk.data(), 0, done, n, 0);
      if (::pwrite(fd, chunk.data(), n, static_cast<off_t>(done)) != static_cast<ssize_t>(n)) return false;
    }
    ::fsync(fd);
  }
  ::close(fd);
  return true;
}

/// Keeps iodepth requests in flight through UringRuntime for `seconds`: iodepth / batch submits of
/// `batch` requests; when the oldest completes it is released and a new one submitted.
Figures run_uring(const Settings& s, std::uint64_t block, bool random_offsets) {
  auto created = tutti::make_uring_runtime(tutti::uring::Options{.queue_depth = s.iodepth * 2});
  if (!created) {
    std::fprintf(stderr, "uring runtime: %s\n", created.status().to_string().c_str());
    std::exit(1);
  }
  tutti::UringRuntime& runtime = *created;
  auto target = runtime.open("file://" + s.file);
  if (!target) {
    std::fprintf(stderr, "open: %s\n", target.status().to_string().c_str());
    std::exit(1);
  }
  const std::uint64_t buffer_bytes = block * s.iodepth;
  std::unique_ptr<std::byte, void (*)(void*)> buffer(static_cast<std::byte*>(std::aligned_alloc(4096, buffer_bytes)),
                                                     std::free);
  auto memory = runtime.register_memory({buffer.get(), buffer_bytes, tutti::MemoryKind::HOST, -1});
  if (!memory) {
    std::fprintf(stderr, "register_memory: %s\n", memory.status().to_string().c_str());
    std::exit(1);
  }
  const std::uint64_t blocks = s.size / block;
  std::mt19937_64 random(7);
  std::uint64_t next_sequential = 0;
  auto next_offset = [&] {
    if (random_offsets) return (random() % blocks) * block;
    const std::uint64_t o = next_sequential * block;
    next_sequential = (next_sequential + 1) % blocks;
    return o;
  };
  const std::uint32_t batch = std::max<std::uint32_t>(1, std::min(s.batch, s.iodepth));
  const std::uint32_t groups = std::max<std::uint32_t>(1, s.iodepth / batch);
  struct InFlight {
    tutti::IoHandle io;
    std::uint32_t group;
    std::vector<std::uint64_t> offsets;  // file offset of each request of the group
  };
  std::deque<InFlight> ring;
  std::uint64_t bytes = 0, requests = 0, verified = 0, mismatched = 0;
  double checking = 0;  // CPU seconds spent poisoning and checking memory (--verify)
  auto submit_group = [&](std::uint32_t g) {
    std::vector<tutti::IoRequest> batch_requests;
    std::vector<std::uint64_t> offsets;
    for (std::uint32_t i = 0; i < batch; ++i) {
      const std::uint64_t memory_offset = (std::uint64_t{g} * batch + i) * block;
      if (s.verify) {
        const double checking_start = thread_cpu_seconds();
        std::memset(buffer.get() + memory_offset, tutti::bench::kPoisonByte, block);
        checking += thread_cpu_seconds() - checking_start;
      }
      offsets.push_back(next_offset());
      batch_requests.push_back({tutti::Direction::READ, *memory, memory_offset, *target, offsets.back(), block});
    }
    auto outcome = runtime.submit(batch_requests);
    if (outcome.accepted != batch_requests.size()) {
      std::fprintf(stderr, "submit: %s\n", outcome.initial_states[0].to_string().c_str());
      std::exit(1);
    }
    ring.push_back({outcome.io, g, std::move(offsets)});
  };
  const double cpu_start = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::seconds(s.seconds);
  for (std::uint32_t g = 0; g < groups; ++g) submit_group(g);
  auto now = start;
  while (!ring.empty()) {
    InFlight oldest = ring.front();
    ring.pop_front();
    auto result = runtime.wait(oldest.io, 30'000'000'000ull);
    if (!result || !result->status.is_ok()) {
      std::fprintf(stderr, "wait: %s\n", (result ? result->status : result.status()).to_string().c_str());
      std::exit(1);
    }
    if (s.verify) {
      const double checking_start = thread_cpu_seconds();
      for (std::uint32_t i = 0; i < batch; ++i) {
        const std::byte* at = buffer.get() + (std::uint64_t{oldest.group} * batch + i) * block;
        const std::uint64_t bad = tutti::bench::count_bad_blocks(at, 0, oldest.offsets[i], block);
        mismatched += bad;
        if (bad == 0) {
          verified += block;
          bytes += block;
        }
      }
      checking += thread_cpu_seconds() - checking_start;
    } else {
      bytes += result->confirmed_bytes;
    }
    requests += result->requests;
    (void)runtime.release(oldest.io);
    now = std::chrono::steady_clock::now();
    if (now < end) submit_group(oldest.group);
  }
  const double elapsed = std::chrono::duration<double>(now - start).count();
  const double cpu = cpu_seconds() - cpu_start - checking;
  return {static_cast<double>(bytes) / elapsed, static_cast<double>(requests) / elapsed,
          requests ? cpu / static_cast<double>(requests) * 1e6 : 0.0, verified, mismatched};
}

Figures run_fio(const Settings& s, std::uint64_t block, bool random_offsets, std::string& command) {
  command = fmt::format(
      "{} --name=tutti --filename={} --size={} --ioengine=io_uring --direct=1 --rw={} --bs={} --iodepth={} "
      "--runtime={} --time_based --norandommap --randrepeat=0 --group_reporting --output-format=json",
      s.fio, s.file, s.size, random_offsets ? "randread" : "read", block, s.iodepth, s.seconds);
  FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) {
    std::fprintf(stderr, "cannot run fio\n");
    std::exit(1);
  }
  std::string output;
  char chunk[4096];
  while (std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) output.append(chunk, n);
  pclose(pipe);
  const auto json_start = output.find('{');
  if (json_start == std::string::npos) {
    std::fprintf(stderr, "fio printed no JSON:\n%s\n", output.c_str());
    std::exit(1);
  }
  const auto json = nlohmann::json::parse(output.substr(json_start));
  const auto& job = json.at("jobs").at(0);
  const auto& read = job.at("read");
  // usr_cpu / sys_cpu are percentages of the job's runtime (ms).
  const double cpu = (job.at("usr_cpu").get<double>() + job.at("sys_cpu").get<double>()) / 100.0 *
                     job.at("job_runtime").get<double>() / 1e3;
  const double ios = read.at("total_ios").get<double>();
  return {read.at("bw_bytes").get<double>(), read.at("iops").get<double>(), ios > 0 ? cpu / ios * 1e6 : 0.0};
}

/// The run with the median throughput.
Figures median(std::vector<Figures> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const Figures& a, const Figures& b) { return a.bytes_per_second < b.bytes_per_second; });
  return runs[runs.size() / 2];
}

std::uint64_t number(const char* text) { return std::strtoull(text, nullptr, 10); }

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--verify" || key == "--no-verify") {
      s.verify = key == "--verify";
      --i;  // a flag without a value
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value\n", key.c_str());
      return 2;
    }
    if (key == "--file")
      s.file = argv[i + 1];
    else if (key == "--size")
      s.size = number(argv[i + 1]);
    else if (key == "--iodepth")
      s.iodepth = static_cast<std::uint32_t>(number(argv[i + 1]));
    else if (key == "--seconds")
      s.seconds = static_cast<std::uint32_t>(number(argv[i + 1]));
    else if (key == "--batch")
      s.batch = static_cast<std::uint32_t>(number(argv[i + 1]));
    else if (key == "--fio")
      s.fio = argv[i + 1];
    else if (key == "--repeat")
      s.repeat = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(number(argv[i + 1])));
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  s.size = s.size / (512 << 10) * (512 << 10);
  if (s.size == 0 || s.iodepth == 0 || s.seconds == 0 || !prepare_file(s)) {
    std::fprintf(stderr, "bad settings or cannot prepare %s\n", s.file.c_str());
    return 2;
  }
  std::printf("file %s, %llu bytes, iodepth %u, %u s per run, median of %u runs each, uring batch %u, cold cache: %s\n",
              s.file.c_str(), static_cast<unsigned long long>(s.size), s.iodepth, s.seconds, s.repeat, s.batch,
              geteuid() == 0 ? "drop_caches before each run" : "no (not root)");
  std::printf(
      "| workload | uring MB/s | uring IOPS | fio MB/s | fio IOPS | uring / fio | uring CPU us/IO | fio CPU us/IO |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> commands;
  std::uint64_t verified = 0, mismatched = 0;
  for (const auto& [name, block, random_offsets] :
       {std::tuple{"4 KiB random read", std::uint64_t{4096}, true},
        std::tuple{"512 KiB sequential read", std::uint64_t{512} << 10, false}}) {
    std::vector<Figures> uring_runs, fio_runs;
    std::string command;
    for (std::uint32_t r = 0; r < s.repeat; ++r) {
      drop_caches();
      uring_runs.push_back(run_uring(s, block, random_offsets));
      verified += uring_runs.back().verified_bytes;
      mismatched += uring_runs.back().mismatched_blocks;
      drop_caches();
      fio_runs.push_back(run_fio(s, block, random_offsets, command));
    }
    commands.push_back(command);
    const Figures uring = median(uring_runs), fio = median(fio_runs);
    std::printf("| %s | %.1f | %.0f | %.1f | %.0f | %.3f | %.1f | %.1f |\n", name, uring.bytes_per_second / 1e6,
                uring.iops, fio.bytes_per_second / 1e6, fio.iops,
                fio.bytes_per_second > 0 ? uring.bytes_per_second / fio.bytes_per_second : 0.0, uring.cpu_us_per_io,
                fio.cpu_us_per_io);
    std::fflush(stdout);
  }
  for (const auto& c : commands) std::printf("fio command: %s\n", c.c_str());
  if (s.verify)
    std::printf(
        "verify: uring side: %llu bytes read and checked against the file's pattern, %llu mismatched "
        "4096-byte blocks%s; fio's reads are not checked (fio verifies only data it wrote itself)\n",
        static_cast<unsigned long long>(verified), static_cast<unsigned long long>(mismatched),
        mismatched ? " -> VERIFY FAILED" : "");
  else
    std::printf("verify: off (--no-verify): uring MB/s counts confirmed bytes, not checked bytes\n");
  return mismatched == 0 ? 0 : 1;
}
