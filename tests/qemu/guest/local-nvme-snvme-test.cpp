// Guest test of the local_nvme DataPath (include/tutti/path/local_nvme.hpp, host profile: the
// submit and progress kernels on host threads) over libnvm's SnvmeController on the real snvme
// driver, with the emulated IOMMU on: every buffer is DMA-mapped through the driver.
//
// There is no file system on the namespace's scratch tail, so the file is a local_file::Target
// built by hand: kFileExtentBytes extents whose blocks are scattered over the namespace in
// reverse file order, with one 4 KiB gap after each extent (a wrong extent walk, a wrong LBA or a
// stray write shows up as wrong bytes in a gap or in the file). The test
//  1. fills the region with 0xEE through O_DIRECT on /dev/snvme0n1,
//  2. writes a pattern through the DataPath (two WRITE requests from registered memory at a dword
//     offset, then FLUSH), and checks the raw LBAs with O_DIRECT reads of the block device (the
//     driver's kernel queues, not the DataPath's): every extent holds its file bytes, every gap
//     still holds 0xEE; plain Read commands on a queue pair of SnvmeController's own read the
//     first and last LBA of every extent,
//  3. reads back through the DataPath into a second registered buffer at dword memory offsets:
//     one LBA, a few pages (PRP list), one MDTS-sized command, the whole file (split at extents
//     and MDTS), a request across six extents, and a batch of kBatchRequests requests over all
//     queue pairs (every 16th across an extent boundary; each queue pair must serve some);
//     every byte and each request's command count are compared, and the buffer bytes around
//     each destination must stay untouched,
//  4. checks bad requests: a misaligned target offset (INVALID_ARGUMENT at submit), a WRITE
//     whose memory ends before its length (OUT_OF_RANGE at submit), a READ past end of file
//     (DATA_LOSS, 0 bytes), a WRITE into an extent past the end of the namespace (the controller
//     answers LBA Out of Range: DEVICE_ERROR naming it); none of them moves a byte (buffer and
//     namespace compared again),
//  5. unregisters, closes, destroys the DataPath and shuts the controller down; the driver's
//     counters must show no queue group, DMA map or pinned page left.
// Usage: local-nvme-snvme-test <lba_size> <scratch_lba>
//   scratch_lba: first LBA of an 8 MiB region the test may overwrite (outside any file system).
//        local-nvme-snvme-test reset <lba_size> <scratch_lba>
//   a READ through the DataPath works; after a controller reset (debugfs) the next READ, whose
//   command the controller never sees, ends with DEVICE_ERROR and no byte moved, well within its
//   command_timeout_ns, and tearing everything down leaves no pin, map or queue in the driver.
// Prints "ok: ..." / "FAIL: ..." per check; exit status 0 only when every check passed.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tutti/path/local_nvme.hpp>

#include "../../../libnvm/snvme/snvme_controller.hpp"
#include "guest_check.hpp"

using namespace tutti;
using Path = local_nvme::LocalNvmeDataPath;

namespace {

using guest::check;
using guest::failures;

constexpr std::uint64_t kSecond = 1'000'000'000ull;
constexpr std::uint64_t kKiB = 1024;
constexpr std::uint8_t kFill = 0xee;       // namespace bytes outside the file
constexpr std::uint8_t kCanary = 0xa5;     // destination buffer bytes no read may touch
constexpr std::uint32_t kQueuePairs = 4;
constexpr std::uint32_t kBatchRequests = 384;
// The file's extents in file order (bytes, 4 KiB multiples): larger and smaller than MDTS
// (QEMU's default MDTS is 512 KiB), single pages, and a 2 MiB run. 4 MiB in all.
constexpr std::uint64_t kFileExtentBytes[] = {1024 * kKiB, 640 * kKiB, 4 * kKiB, 8 * kKiB, 116 * kKiB, 256 * kKiB, 2048 * kKiB};
constexpr std::uint64_t kGap = 4 * kKiB;

using guest::pattern;  // the file's byte at file offset o

/// Page-aligned host memory (freed by the destructor; registered regions are unregistered first).
struct Memory {
  explicit Memory(std::size_t n) : size(n), data(static_cast<std::uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~Memory() { std::free(data); }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  MemoryView view() const { return MemoryView{data, size, MemoryKind::HOST, -1}; }
  std::size_t size;
  std::uint8_t* data;
};

/// O_DIRECT read of `n` bytes at byte `at` of the block device (n, at: LBA multiples).
bool raw_read(int fd, std::uint64_t at, std::uint64_t n, std::vector<std::uint8_t>& out) {
  Memory m(n);
  const bool ok = ::pread(fd, m.data, n, static_cast<off_t>(at)) == static_cast<ssize_t>(n);
  out.assign(m.data, m.data + n);
  return ok;
}

/// The whole scratch span [first, end): each extent must hold its file bytes, everything else kFill.
bool namespace_holds_file(int fd, const std::vector<local_file::Extent>& extents, std::uint64_t first, std::uint64_t end,
                          std::string& why) {
  std::vector<std::uint8_t> raw;
  if (!raw_read(fd, first, end - first, raw)) {
    why = std::string("O_DIRECT read failed: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::uint8_t> want(end - first, kFill);
  for (const auto& e : extents)
    for (std::uint64_t i = 0; i < e.length; ++i) want[e.device_offset - first + i] = pattern(e.file_offset + i);
  for (std::uint64_t i = 0; i < want.size(); ++i)
    if (raw[i] != want[i]) {
      why = "first difference at namespace byte " + std::to_string(first + i) + " (LBA-relative byte " +
            std::to_string(i) + "): " + std::to_string(raw[i]) + " instead of " + std::to_string(want[i]);
      return false;
    }
  why = std::to_string(end - first) + " bytes";
  return true;
}

/// NVMe commands the DataPath must issue for file bytes [offset, offset + length): one per piece
/// of an extent, each piece split into commands of at most `mdts` bytes.
std::uint32_t expected_commands(const std::vector<local_file::Extent>& extents, std::uint64_t offset, std::uint64_t length,
                                std::uint64_t mdts) {
  std::uint32_t n = 0;
  for (const auto& e : extents) {
    const std::uint64_t lo = std::max(offset, e.file_offset), hi = std::min(offset + length, e.file_end());
    if (lo < hi) n += static_cast<std::uint32_t>((hi - lo + mdts - 1) / mdts);
  }
  return n;
}

/// Reads the first and the last LBA of every extent with plain NVM Read commands (NVM Command Set
/// 1.0, 3.2.4; PRP1 only, one page) on a queue pair created on SnvmeController itself, into a
/// buffer DMA-mapped through the driver, and compares with the file bytes. Deletes the queue pair
/// and the mapping before it returns.
bool read_extent_edges(libnvm::SnvmeController& c, const std::vector<local_file::Extent>& extents, std::uint32_t lba,
                       std::string& why) {
  auto qp = c.create_io_queue_pair(16);
  if (!qp) {
    why = "create_io_queue_pair: " + qp.status().to_string();
    return false;
  }
  const libnvm::QueuePairInfo& info = qp.value();
  nvme::QueuePairStorage storage(info.submission_queue, info.completion_queue, info.submission_queue_tail_doorbell,
                                 info.completion_queue_head_doorbell, info.controller_status, info.depth, info.qid);
  const nvme::QueuePair& q = storage.queue();
  Memory m(4096);
  auto map = c.dma_map(m.data, 4096);
  bool ok = map.is_ok();
  why = ok ? "" : "dma_map: " + map.status().to_string();
  std::uint32_t reads = 0;
  for (std::size_t k = 0; k < extents.size() && ok; ++k) {
    const local_file::Extent& e = extents[k];
    for (std::uint64_t within : {std::uint64_t{0}, e.length - lba}) {
      std::memset(m.data, kCanary, 4096);
      nvme::SubmissionQueueEntry sqe{};
      sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::read);
      sqe.nsid = c.identity().nsid;
      sqe.data_pointer.prp.prp1 = map->bus_addresses[0];
      const std::uint64_t slba = (e.device_offset + within) / lba;
      sqe.cdw10 = static_cast<std::uint32_t>(slba);
      sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
      sqe.cdw12 = 0;  // NLB 0's based: one LBA
      std::uint16_t cid = 0;
      if (!q.allocate_command_identifier(cid)) {
        why = "no free command identifier";
        ok = false;
        break;
      }
      sqe.command_identifier = cid;
      nvme::WaitResult w{StatusCode::INTERNAL, {}};  // stays INTERNAL if submit fails
      if (q.submit(sqe) == StatusCode::OK) w = q.wait_for_completion(cid, 10 * kSecond);
      if (w.status != StatusCode::OK || !w.completion.status().success()) {
        why = "Read of SLBA " + std::to_string(slba) + " did not complete successfully";
        ok = false;
        break;
      }
      for (std::uint32_t i = 0; i < lba && ok; ++i)
        if (m.data[i] != pattern(e.file_offset + within + i)) {
          why = "SLBA " + std::to_string(slba) + " byte " + std::to_string(i) + " differs from file offset " +
                std::to_string(e.file_offset + within + i);
          ok = false;
        }
      ++reads;
    }
  }
  if (ok) why = std::to_string(reads) + " Read commands on QID " + std::to_string(info.qid);
  if (map && !c.dma_unmap(map->id).is_ok()) {
    why += "; dma_unmap failed";
    ok = false;
  }
  if (!c.delete_io_queue_pair(info.qid).is_ok()) {
    why += "; delete_io_queue_pair failed";
    ok = false;
  }
  return ok;
}

/// One READ of file [offset, offset + length) into `buf` at memory_offset.
struct Read {
  std::uint64_t memory_offset;
  std::uint64_t target_offset;
  std::uint64_t length;
};

struct Harness {
  libnvm::SnvmeController& controller;
  Path& path;
  Path::open_target& target;
  Path::registered_memory& read_registration;
  Memory& read_buffer;
  const std::vector<local_file::Extent>& extents;

  /// Submits `requests` as one batch and waits (bounded); false if progress failed.
  bool run(const std::vector<PathRequest<Path>>& requests, std::vector<Status>& states,
           std::vector<RequestCompletion>& completions) {
    states.assign(requests.size(), Status());
    completions.assign(requests.size(), RequestCompletion{});
    auto b = path.submit(requests, states);
    Status s = path.progress(b, completions, 30 * kSecond);
    if (!s.is_ok()) std::printf("progress: %s\n", s.to_string().c_str());
    return s.is_ok();
  }

  /// Runs the reads as one batch; checks each completed OK with every byte and the expected
  /// number of commands (expected_commands), and that the canary around and between destinations
  /// is intact.
  void reads(const std::string& what, const std::vector<Read>& rs) {
    std::memset(read_buffer.data, kCanary, read_buffer.size);
    std::vector<PathRequest<Path>> requests;
    for (const Read& r : rs)
      requests.push_back(PathRequest<Path>{Direction::READ, &read_registration, read_buffer.view(), r.memory_offset, &target,
                                           r.target_offset, r.length});
    std::vector<Status> states;
    std::vector<RequestCompletion> completions;
    const auto t0 = std::chrono::steady_clock::now();
    bool ok = run(requests, states, completions);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string why;
    std::vector<std::uint8_t> want(read_buffer.size, kCanary);
    std::uint64_t bytes = 0;
    std::uint64_t commands = 0;
    for (std::size_t i = 0; i < rs.size() && ok; ++i) {
      const RequestCompletion& c = completions[i];
      if (!states[i].is_ok() || !c.done || !c.status.is_ok() || c.confirmed_bytes != rs[i].length) {
        why = "request " + std::to_string(i) + ": submit " + states[i].to_string() + ", completion " + c.status.to_string() +
              ", confirmed " + std::to_string(c.confirmed_bytes) + " of " + std::to_string(rs[i].length);
        ok = false;
      } else if (const std::uint32_t n = expected_commands(extents, rs[i].target_offset, rs[i].length, path.max_command_bytes());
                 c.commands != n) {
        why = "request " + std::to_string(i) + " took " + std::to_string(c.commands) + " commands, expected " +
              std::to_string(n);
        ok = false;
      }
      commands += c.commands;
      for (std::uint64_t k = 0; k < rs[i].length; ++k) want[rs[i].memory_offset + k] = pattern(rs[i].target_offset + k);
      bytes += rs[i].length;
    }
    if (ok)
      for (std::size_t k = 0; k < want.size(); ++k)
        if (read_buffer.data[k] != want[k]) {
          why = "buffer byte " + std::to_string(k) + " is " + std::to_string(read_buffer.data[k]) + ", expected " +
                std::to_string(want[k]) + (want[k] == kCanary ? " (outside every destination)" : "");
          ok = false;
          break;
        }
    check(ok, what + ": " + std::to_string(rs.size()) + " request(s), " + std::to_string(bytes) + " bytes, " + std::to_string(commands) + " commands, " +
                  (ok ? "every byte matches, canary intact (" + std::to_string(ms) + " ms)" : why));
  }
};

/// A value of /sys/kernel/debug/snvme/stats (module-wide leak counters), or -1.
long long driver_total(const char* key) {
  char line[128], k[64];
  long long v = -1, got;
  std::FILE* f = std::fopen("/sys/kernel/debug/snvme/stats", "r");
  if (f == nullptr) return -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "%63s %lld", k, &got) == 2 && std::strcmp(k, key) == 0) v = got;
  std::fclose(f);
  return v;
}

/// What a controller reset does to the DataPath over SnvmeController (docs/driver.md).
int reset_test(std::uint32_t want_lba, std::uint64_t scratch_lba) {
  constexpr std::uint64_t kBytes = 64 * kKiB;
  int fd = ::open("/dev/snvme0n1", O_RDWR | O_DIRECT);
  auto opened = libnvm::SnvmeController::open();
  if (!check(fd >= 0 && opened.is_ok(), "open /dev/snvme0n1 and the controller: " + opened.status().to_string())) return 1;
  {
    std::unique_ptr<libnvm::SnvmeController> controller = std::move(opened.value());
    libnvm::BringUpOptions bring_up;
    bring_up.io_queue_pairs_requested = 1;
    if (!check(controller->bring_up(bring_up).is_ok(), "bring_up")) return 1;
    const std::uint32_t lba = controller->identity().lba_size;
    check(lba == want_lba, "LBA size " + std::to_string(lba));
    const std::uint64_t at = scratch_lba * lba;
    {
      Memory fill(kBytes);
      for (std::uint64_t i = 0; i < kBytes; ++i) fill.data[i] = pattern(i);
      check(::pwrite(fd, fill.data, kBytes, static_cast<off_t>(at)) == static_cast<ssize_t>(kBytes),
            "64 KiB of pattern written at the scratch LBA through O_DIRECT");
    }
    Memory buffer(kBytes);  // outlives the DataPath: its registration may be held by zombies
    Path::Options options;
    options.queue_pairs = 1;
    options.queue_depth = 16;
    options.command_timeout_ns = 30 * kSecond;
    auto created = Path::create(*controller, options);
    if (!check(created.is_ok(), "DataPath::create: " + created.status().to_string())) return 1;
    Path& path = created.value();
    local_file::Target t;
    t.path = "synthetic (one extent on /dev/snvme0n1)";
    t.extents = {{0, at, kBytes}};
    t.file_size = kBytes;
    t.lba_size = lba;
    t.nsid = controller->identity().nsid;
    auto target = path.open(std::move(t), OpenOptions{});
    auto reg = path.register_memory(buffer.view());
    if (!check(target.is_ok() && reg.is_ok(), "open the target, register 64 KiB")) return 1;
    std::vector<PathRequest<Path>> read = {
        {Direction::READ, &*reg, buffer.view(), 0, &*target, 4 * kKiB, 8 * kKiB}};
    std::vector<Status> states(1);
    std::vector<RequestCompletion> completions(1);
    auto run = [&] {
      states.assign(1, Status());
      completions.assign(1, RequestCompletion{});
      auto b = path.submit(read, states);
      return path.progress(b, completions, 60 * kSecond);
    };
    std::memset(buffer.data, kCanary, kBytes);
    Status s = run();
    bool same = true;
    for (std::uint64_t i = 0; i < 8 * kKiB; ++i) same = same && buffer.data[i] == pattern(4 * kKiB + i);
    check(s.is_ok() && completions[0].status.is_ok() && same, "READ of 8 KiB before the reset: " +
                                                                   completions[0].status.to_string());

    std::ofstream("/sys/kernel/debug/snvme/snvme0/reset") << "1\n" << std::flush;
    std::memset(buffer.data, kCanary, kBytes);
    const auto t0 = std::chrono::steady_clock::now();
    s = run();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    bool untouched = true;
    for (std::uint64_t i = 0; i < kBytes; ++i) untouched = untouched && buffer.data[i] == kCanary;
    check(states[0].is_ok() && completions[0].done && completions[0].status.code() == StatusCode::DEVICE_ERROR &&
              completions[0].confirmed_bytes == 0 && ms < 10000,
          "READ after the reset: submit " + states[0].to_string() + ", completion " + completions[0].status.to_string() +
              ", " + std::to_string(completions[0].confirmed_bytes) + " bytes confirmed, after " + std::to_string(ms) +
              " ms (command_timeout_ns 30 s; progress " + s.to_string() + ")");
    check(untouched, "no byte of the buffer moved");
    check(driver_total("pinned_pages") > 0, "the registration's pages stay pinned while the DataPath lives");
    (void)path.unregister_memory(*reg);
    (void)path.close(*target);
  }  // DataPath, then SnvmeController destroyed: the driver's file is closed
  ::close(fd);
  check(driver_total("pinned_pages") == 0 && driver_total("dma_maps") == 0 && driver_total("queue_groups") == 0,
        "after the DataPath and the controller are destroyed: no pin, map or queue group left");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "reset") == 0)
    return reset_test(static_cast<std::uint32_t>(std::atoi(argv[2])), std::strtoull(argv[3], nullptr, 0));
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <lba_size> <scratch_lba>\n", argv[0]);
    return 2;
  }
  const std::uint32_t want_lba = static_cast<std::uint32_t>(std::atoi(argv[1]));
  const std::uint64_t scratch_lba = std::strtoull(argv[2], nullptr, 0);

  const auto started = std::chrono::steady_clock::now();
  auto opened = libnvm::SnvmeController::open();
  if (!opened) {
    std::printf("FAIL: open: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  libnvm::SnvmeController& controller = *opened.value();
  libnvm::BringUpOptions bring_up;
  bring_up.io_queue_pairs_requested = kQueuePairs;
  if (!check(controller.bring_up(bring_up).is_ok(), "bring_up with " + std::to_string(kQueuePairs) + " queue pairs")) return 1;
  const libnvm::ControllerIdentity& id = controller.identity();
  const std::uint32_t lba = id.lba_size;
  check(lba == want_lba, "LBA size " + std::to_string(lba) + " (QEMU was given " + std::to_string(want_lba) + ")");

  int fd = ::open("/dev/snvme0n1", O_RDWR | O_DIRECT);
  if (!check(fd >= 0, "open /dev/snvme0n1 O_DIRECT")) return 1;

  // The file: extents in file order, placed in reverse order from the start of the scratch region.
  const std::uint64_t first = scratch_lba * lba;
  std::vector<local_file::Extent> extents;
  std::uint64_t file_size = 0;
  for (std::uint64_t len : kFileExtentBytes) {
    extents.push_back({file_size, 0, len});
    file_size += len;
  }
  std::uint64_t end = first + kGap;  // a gap before the first placed extent too
  for (std::size_t k = extents.size(); k-- > 0;) {
    extents[k].device_offset = end;
    end += extents[k].length + kGap;
  }
  std::printf("file: %llu bytes in %zu extents, namespace bytes [%llu, %llu) (LBAs %llu..%llu), MDTS %llu bytes\n",
              static_cast<unsigned long long>(file_size), extents.size(), static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(end), static_cast<unsigned long long>(first / lba),
              static_cast<unsigned long long>(end / lba - 1), static_cast<unsigned long long>(id.max_data_transfer_bytes));
  if (!check(end - first <= 8 * 1024 * kKiB && end <= id.namespace_size_lbas * lba, "the file fits the 8 MiB scratch region"))
    return 1;
  {
    Memory fill(end - first);
    std::memset(fill.data, kFill, fill.size);
    check(::pwrite(fd, fill.data, fill.size, static_cast<off_t>(first)) == static_cast<ssize_t>(fill.size) && ::fsync(fd) == 0,
          "scratch region filled with 0xee through O_DIRECT");
  }

  {
    Path::Options options;
    options.queue_pairs = kQueuePairs;
    options.queue_depth = 256;
    options.command_timeout_ns = 10 * kSecond;
    auto created = Path::create(controller, options);
    if (!check(created.is_ok(), "DataPath::create over SnvmeController: " + created.status().to_string())) return 1;
    Path& path = created.value();
    const std::uint64_t mdts = path.max_command_bytes();
    std::printf("DataPath: %u queue pairs of depth %u, largest command %llu bytes\n", kQueuePairs, options.queue_depth,
                static_cast<unsigned long long>(mdts));

    local_file::Target t;
    t.path = "synthetic (hand-built extents on /dev/snvme0n1)";
    t.extents = extents;
    t.file_size = file_size;
    t.lba_size = lba;
    t.nsid = id.nsid;
    t.writable = true;
    auto opened_target = path.open(std::move(t), OpenOptions{.writable = true});
    if (!check(opened_target.is_ok(), "open the hand-built target: " + opened_target.status().to_string())) return 1;
    Path::open_target& target = opened_target.value();

    Memory write_buffer(file_size + 4);
    Memory read_buffer(kBatchRequests * 16 * kKiB);  // a 16 KiB slot per batch request; holds the whole file too
    for (std::uint64_t i = 0; i < file_size; ++i) write_buffer.data[4 + i] = pattern(i);
    auto wreg = path.register_memory(write_buffer.view());
    auto rreg = path.register_memory(read_buffer.view());
    if (!check(wreg.is_ok() && rreg.is_ok(), "register_memory of both buffers (dma_map through the driver): " +
                                                 wreg.status().to_string() + " / " + rreg.status().to_string()))
      return 1;
    auto counters = controller.driver_counters();
    check(counters && counters->queue_groups == kQueuePairs && counters->dma_maps == 4,
          "driver counts " + std::to_string(kQueuePairs) + " queue groups and 4 DMA maps (2 regions, 2 PRP list buffers): " +
              (counters ? std::to_string(counters->queue_groups) + " groups, " + std::to_string(counters->dma_maps) + " maps"
                        : counters.status().to_string()));

    Harness h{controller, path, target, *rreg, read_buffer, extents};
    std::vector<Status> states;
    std::vector<RequestCompletion> completions;

    // --- WRITE the file from memory offset 4 (dword, not page aligned), then FLUSH.
    {
      const std::uint64_t split = 1024 * kKiB;
      std::vector<PathRequest<Path>> writes = {
          {Direction::WRITE, &*wreg, write_buffer.view(), 4, &target, 0, split},
          {Direction::WRITE, &*wreg, write_buffer.view(), 4 + split, &target, split, file_size - split}};
      bool ok = h.run(writes, states, completions);
      for (std::size_t i = 0; i < writes.size(); ++i)
        ok = ok && states[i].is_ok() && completions[i].status.is_ok() && completions[i].confirmed_bytes == writes[i].length;
      check(ok, "WRITE of the file (" + std::to_string(file_size) + " bytes in 2 requests, " +
                    std::to_string(completions[0].commands + completions[1].commands) + " commands): " +
                    completions[0].status.to_string() + " / " + completions[1].status.to_string());
      std::vector<PathRequest<Path>> flush = {{Direction::FLUSH, nullptr, MemoryView{}, 0, &target, 0, 0}};
      ok = h.run(flush, states, completions);
      check(ok && states[0].is_ok() && completions[0].status.is_ok() && completions[0].commands == 1,
            "FLUSH: " + states[0].to_string() + " / " + completions[0].status.to_string());
    }
    std::string why;
    bool held = namespace_holds_file(fd, extents, first, end, why);
    check(held, "O_DIRECT read of the raw LBAs: every extent holds its file bytes at its LBAs, every gap still 0xee: " + why);
    held = read_extent_edges(controller, extents, lba, why);
    check(held,
          "plain NVMe Read commands on a queue pair of SnvmeController's own: first and last LBA of every extent: " + why);

    // --- READs through the DataPath at dword memory offsets.
    const std::uint64_t e1 = 1024 * kKiB;  // start of the 640 KiB extent
    h.reads("1 LBA", {{4, e1 + 4096, lba}});
    h.reads("3 pages at memory offset 8 (PRP list: 4 memory pages)", {{8, e1 + 8192, 12 * kKiB}});
    check(mdts <= e1, "MDTS (" + std::to_string(mdts) + " bytes) fits in the first extent");
    h.reads("one MDTS-sized command", {{12, 0, std::min<std::uint64_t>(mdts, e1)}});
    h.reads("the whole file in one request (split at extents and MDTS)", {{16, 0, file_size}});
    // [1 MiB - 8 KiB, 8 KiB into the 256 KiB extent): six extents.
    const std::uint64_t across = e1 - 8 * kKiB;
    h.reads("one request across six extents", {{20, across, 8 * kKiB + 640 * kKiB + 4 * kKiB + 8 * kKiB + 116 * kKiB + 8 * kKiB}});
    {
      std::vector<Read> batch;
      for (std::uint32_t i = 0; i < kBatchRequests; ++i) {
        const std::uint64_t length = (i % 3 == 0 ? 8 : 4) * kKiB + (i % 5 == 0 ? lba : 0);
        std::uint64_t offset = (std::uint64_t{i} * 7919 * 4096) % (file_size - 16 * kKiB);
        if (i % 16 == 0) offset = extents[1 + (i / 16) % (extents.size() - 1)].file_offset - 4 * kKiB;  // across a boundary
        batch.push_back({std::uint64_t{i} * 16 * kKiB + 4 * (i % 7), offset, length});  // at most 12.5 KiB + 24
      }
      std::vector<nvme::QueuePairState> before;
      for (std::uint32_t q = 0; q < kQueuePairs; ++q) before.push_back(path.queue_statistics(q));
      h.reads("batch over all queue pairs", batch);
      std::string per_queue;
      bool all = true;
      for (std::uint32_t q = 0; q < kQueuePairs; ++q) {
        const nvme::QueuePairState now = path.queue_statistics(q);
        const std::uint64_t reaped = now.completions_reaped - before[q].completions_reaped;
        const std::uint64_t rung = now.doorbell_writes - before[q].doorbell_writes;
        per_queue += " " + std::to_string(reaped) + "/" + std::to_string(rung);
        all = all && reaped > 0 && rung > 0 && now.stale_completions == 0;
      }
      check(all, "every queue pair served the batch, no stale completion (completions/SQ doorbell writes per queue pair:" +
                     per_queue + ")");
    }

    // --- Bad requests: rejected or failed with a clear status, nothing moves.
    {
      std::memset(read_buffer.data, kCanary, read_buffer.size);
      std::vector<PathRequest<Path>> bad = {
          {Direction::READ, &*rreg, read_buffer.view(), 0, &target, lba / 2, 4096},  // misaligned target offset
          {Direction::WRITE, &*wreg, write_buffer.view(), write_buffer.size - 4096, &target, 0, 8192},  // memory too short
          {Direction::READ, &*rreg, read_buffer.view(), 0, &target, file_size, 4096},  // past end of file
      };
      const bool ran = h.run(bad, states, completions);
      check(!states[0].is_ok() && states[0].code() == StatusCode::INVALID_ARGUMENT &&
                states[0].message().find("target_offset") != std::string::npos,
            "misaligned target offset rejected at submit: " + states[0].to_string());
      check(!states[1].is_ok() && states[1].code() == StatusCode::OUT_OF_RANGE &&
                states[1].message().find("length = 8192 needs 8192 bytes") != std::string::npos,
            "WRITE with 4096 bytes of memory for 8192 rejected at submit: " + states[1].to_string());
      check(ran && states[2].is_ok() && completions[2].done && completions[2].status.code() == StatusCode::DATA_LOSS &&
                completions[2].confirmed_bytes == 0 && completions[2].commands == 0,
            "READ past end of file: " + completions[2].status.to_string() + ", " +
                std::to_string(completions[2].confirmed_bytes) + " bytes, " + std::to_string(completions[2].commands) +
                " commands");
      bool canary = true;
      for (std::size_t k = 0; k < read_buffer.size; ++k) canary = canary && read_buffer.data[k] == kCanary;
      check(canary, "no byte of the read buffer moved");
    }
    {
      // A second target whose one extent lies past the end of the namespace: the controller
      // itself must refuse the command (LBA Out of Range), and the DataPath must say so.
      local_file::Target beyond;
      beyond.path = "synthetic (extent past the end of the namespace)";
      beyond.extents = {{0, id.namespace_size_lbas * lba, 64 * kKiB}};
      beyond.file_size = 64 * kKiB;
      beyond.lba_size = lba;
      beyond.nsid = id.nsid;
      beyond.writable = true;
      auto bt = path.open(std::move(beyond), OpenOptions{.writable = true});
      if (check(bt.is_ok(), "open a target with an extent past the namespace: " + bt.status().to_string())) {
        std::vector<PathRequest<Path>> w = {{Direction::WRITE, &*wreg, write_buffer.view(), 4, &*bt, 0, 64 * kKiB}};
        const bool ran = h.run(w, states, completions);
        const std::string msg = completions[0].status.to_string();
        check(ran && states[0].is_ok() && completions[0].status.code() == StatusCode::DEVICE_ERROR &&
                  completions[0].confirmed_bytes == 0 && (completions[0].device_status & 0xff) == 0x80 &&
                  msg.find("SLBA " + std::to_string(id.namespace_size_lbas)) != std::string::npos,
              "WRITE past the end of the namespace fails with the controller's status 0x" +
                  [&] { char s[16]; std::snprintf(s, sizeof s, "%03x", completions[0].device_status); return std::string(s); }() +
                  ": " + msg);
        check(path.close(*bt).is_ok(), "close of the second target");
      }
    }
    held = namespace_holds_file(fd, extents, first, end, why);
    check(held, "after the bad requests the namespace is unchanged: " + why);

    check(path.unregister_memory(*wreg).is_ok() && path.unregister_memory(*rreg).is_ok(), "unregister_memory of both buffers");
    check(path.zombie_commands() == 0, "no zombie commands");
    check(path.aborts_sent() == 0, "no Abort was needed");
    check(path.close(target).is_ok(), "close of the target");
    counters = controller.driver_counters();
    check(counters && counters->dma_maps == 0 && counters->pinned_pages == 0,
          "after unregister: no DMA map or pinned page left in the driver");
  }  // DataPath destroyed here: it deletes its queue pairs
  auto counters = controller.driver_counters();
  check(counters && counters->queue_groups == 0, "after the DataPath is destroyed: no queue group left");
  Status st = controller.shutdown(kSecond);
  check(st.is_ok(), "shutdown: " + st.to_string());
  counters = controller.driver_counters();
  check(counters && counters->queue_groups == 0 && counters->dma_maps == 0 && counters->pinned_pages == 0 &&
            counters->user_queues_free == counters->user_queues,
        "after shutdown: no groups, maps or pins; all user queues free");
  ::close(fd);
  std::printf("%s (%.0f ms)\n", failures ? "local-nvme-snvme-test: FAILED" : "local-nvme-snvme-test: all checks passed",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  return failures ? 1 : 0;
}
