// Guest test of libnvm's SnvmeController on the real snvme driver: bring-up through the driver,
// Identify data against GET_INFO and the block device, reads and writes through
// tutti/nvme/queue.hpp with PRPs built by tutti/nvme/prp.hpp, compared byte for byte with
// O_DIRECT I/O on /dev/snvme0n1, Abort, error mapping, and no leaks after shutdown.
// Usage: libnvm-snvme-test <lba_size> <scratch_lba>
//   scratch_lba: first LBA of a 1 MiB region the test may overwrite (outside any file system).
//        libnvm-snvme-test reset
//   a poller waiting for a completion while the controller is reset stops with DEVICE_ERROR
//   well within its deadline; the object's calls fail, its pins stay until it is destroyed, and
//   a new SnvmeController works.
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
#include <string>
#include <thread>
#include <vector>

#include <tutti/nvme/prp.hpp>
#include <tutti/nvme/queue.hpp>

#include "../../../libnvm/snvme/snvme_controller.hpp"
#include "guest_check.hpp"

using namespace tutti;

namespace {

using guest::check;
using guest::failures;

constexpr std::uint64_t kSecond = 1'000'000'000ull;

// One Read/Write of `bytes` at `slba` into/from map at `offset`; returns the NVMe status or -1.
int io(const nvme::QueuePair& q, std::uint8_t opcode, std::uint32_t nsid, std::uint64_t slba, std::uint32_t lba_size,
       const libnvm::DmaMapping& map, std::uint64_t offset, std::uint64_t bytes, const libnvm::DmaBuffer& list) {
  nvme::SubmissionQueueEntry sqe{};
  sqe.opcode = opcode;
  sqe.nsid = nsid;
  auto prp = nvme::build_prp(map.page_table(), offset, bytes, list.descriptor_area());
  if (prp.status != StatusCode::OK) return -1;
  sqe.data_pointer.prp.prp1 = prp.prp1;
  sqe.data_pointer.prp.prp2 = prp.prp2;
  sqe.cdw10 = static_cast<std::uint32_t>(slba);
  sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
  sqe.cdw12 = static_cast<std::uint32_t>(bytes / lba_size - 1);  // NLB, 0's based
  std::uint16_t cid = 0;
  if (!q.allocate_command_identifier(cid)) return -1;
  sqe.command_identifier = cid;
  if (q.submit(sqe) != StatusCode::OK) return -1;
  nvme::WaitResult w = q.wait_for_completion(cid, 10 * kSecond);
  if (w.status != StatusCode::OK) return -1;
  return w.completion.status().success() ? 0 : (w.completion.status().status_code_type() << 8 | w.completion.status().status_code());
}

// A value of /sys/kernel/debug/snvme/stats (module-wide leak counters), or -1.
long long driver_total(const std::string& key) {
  std::ifstream in("/sys/kernel/debug/snvme/stats");
  std::string k;
  long long v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return -1;
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Reads 8 KiB at LBA 64 through a fresh queue pair of c and compares with O_DIRECT.
bool read_matches(libnvm::SnvmeController& c, int bfd) {
  const libnvm::ControllerIdentity& id = c.identity();
  auto qp = c.create_io_queue_pair(8);
  void* mem = std::aligned_alloc(4096, 8192);
  void* want = std::aligned_alloc(4096, 8192);
  auto map = c.dma_map(mem, 8192);
  auto list = c.allocate_dma_buffer(4096);
  bool ok = qp && map && list && ::pread(bfd, want, 8192, 64 * id.lba_size) == 8192;
  if (ok) {
    nvme::QueuePairStorage storage(qp->submission_queue, qp->completion_queue, qp->submission_queue_tail_doorbell,
                                   qp->completion_queue_head_doorbell, qp->controller_status, qp->depth, qp->qid);
    ok = io(storage.queue(), 0x02, id.nsid, 64, id.lba_size, map.value(), 0, 8192, list.value()) == 0 &&
         std::memcmp(mem, want, 8192) == 0;
  }
  if (qp) (void)c.delete_io_queue_pair(qp->qid);
  if (map) (void)c.dma_unmap(map->id);
  if (list) (void)c.free_dma_buffer(list->id);
  std::free(mem);
  std::free(want);
  return ok;
}

// What a controller reset does to an SnvmeController and its pollers (docs/driver.md).
int reset_test() {
  constexpr std::uint64_t kBudget = 30 * kSecond;  // the poller's deadline
  int bfd = ::open("/dev/snvme0n1", O_RDONLY | O_DIRECT);
  auto opened = libnvm::SnvmeController::open();
  if (bfd < 0 || !opened) {
    std::printf("FAIL: open: %s\n", opened ? std::strerror(errno) : opened.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<libnvm::SnvmeController> c = std::move(opened.value());
  libnvm::BringUpOptions opts;
  opts.io_queue_pairs_requested = 1;
  Status st = c->bring_up(opts);
  check(st.is_ok(), "bring_up: " + st.to_string());
  if (!st.is_ok()) return 1;
  auto qp = c->create_io_queue_pair(16);
  void* mem = std::aligned_alloc(4096, 1u << 20);
  auto map = c->dma_map(mem, 1u << 20);
  check(qp && map, "queue pair and a 1 MiB DMA map");
  if (!qp || !map) return 1;
  check(qp->controller_status != nullptr && c->controller_status().ready(),
        "the queue pair's CSTS word is the status page's, and reads RDY");
  check(read_matches(*c, bfd), "a read through the driver matches O_DIRECT before the reset");

  // The poller waits for a command the controller does not hold (as after a reset, when the
  // command it waited for is gone): only the status page can stop it before its deadline.
  nvme::QueuePairStorage storage(qp->submission_queue, qp->completion_queue, qp->submission_queue_tail_doorbell,
                                 qp->completion_queue_head_doorbell, qp->controller_status, qp->depth, qp->qid);
  const nvme::QueuePair& q = storage.queue();
  std::uint16_t cid = 0;
  check(q.allocate_command_identifier(cid), "a CID to wait for");
  nvme::WaitResult waited;
  std::uint64_t waited_ns = 0;
  std::thread poller([&] {
    const std::uint64_t t0 = now_ns();
    waited = q.wait_for_completion(cid, kBudget);
    waited_ns = now_ns() - t0;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::ofstream("/sys/kernel/debug/snvme/snvme0/reset") << "1\n" << std::flush;
  poller.join();
  check(waited.status == StatusCode::DEVICE_ERROR && waited_ns < kBudget / 3,
        "the poller stopped with " + std::string(to_string(waited.status)) + " after " +
            std::to_string(waited_ns / 1000000) + " ms (deadline " + std::to_string(kBudget / 1000000) + " ms)");
  check(c->controller_status().fatal(), "controller_status() reads all ones");
  auto again = c->create_io_queue_pair(16);
  check(!again && again.code() == StatusCode::DEVICE_ERROR, "create_io_queue_pair: " + again.status().to_string());
  auto counters = c->driver_counters();
  check(!counters && counters.code() == StatusCode::DEVICE_ERROR, "driver_counters: " + counters.status().to_string());
  auto ab = c->abort(qp->qid, cid, kSecond);
  check(!ab && ab.code() == StatusCode::DEVICE_ERROR, "abort: " + ab.status().to_string());
  check(driver_total("pinned_pages") >= 256 && driver_total("queue_groups") == 1,
        "pins and the queue group stay while the object lives");
  c.reset();
  check(driver_total("pinned_pages") == 0 && driver_total("dma_maps") == 0 && driver_total("queue_groups") == 0,
        "destroying the object (closing the file) released them");

  auto fresh = libnvm::SnvmeController::open();
  check(fresh.is_ok(), "a new SnvmeController opens: " + fresh.status().to_string());
  if (fresh) {
    st = fresh.value()->bring_up(opts);
    check(st.is_ok() && read_matches(*fresh.value(), bfd), "and reads match O_DIRECT after the reset");
  }
  ::close(bfd);
  std::free(mem);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "reset") == 0) return reset_test();
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <lba_size> <scratch_lba>\n", argv[0]);
    return 2;
  }
  const std::uint32_t want_lba = static_cast<std::uint32_t>(std::atoi(argv[1]));
  const std::uint64_t scratch = std::strtoull(argv[2], nullptr, 0);

  auto missing = libnvm::SnvmeController::open("/dev/snvme7");
  check(!missing && missing.code() == StatusCode::NOT_FOUND, "open of an absent node: " + missing.status().to_string());

  auto opened = libnvm::SnvmeController::open();
  if (!opened) {
    std::printf("FAIL: open: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  libnvm::SnvmeController& c = *opened.value();
  check(c.kind() == "snvme", "kind() is snvme");

  libnvm::BringUpOptions too_many;
  too_many.io_queue_pairs_requested = 5000;
  Status st = c.bring_up(too_many);
  check(st.code() == StatusCode::INVALID_ARGUMENT, "bring_up past the queue budget: " + st.to_string());
  libnvm::BringUpOptions bad_ns;
  bad_ns.io_queue_pairs_requested = 1;
  bad_ns.nsid = 9;
  st = c.bring_up(bad_ns);
  check(st.code() == StatusCode::INVALID_ARGUMENT, "bring_up of nsid 9: " + st.to_string());
  libnvm::BringUpOptions opts;
  opts.io_queue_pairs_requested = 2;
  st = c.bring_up(opts);
  check(st.is_ok(), "bring_up: " + st.to_string());
  if (!st.is_ok()) return 1;

  const libnvm::ControllerIdentity& id = c.identity();
  std::printf("identity: %s / %s / %s, LBA %u, NSZE %llu, MDTS %llu, MQES+1 %u, user queues %u, SGL %d, VWC %d\n",
              id.model_number.c_str(), id.serial_number.c_str(), id.firmware_revision.c_str(), id.lba_size,
              static_cast<unsigned long long>(id.namespace_size_lbas),
              static_cast<unsigned long long>(id.max_data_transfer_bytes), id.max_queue_entries,
              id.io_submission_queues_allocated, id.sgl_supported, id.volatile_write_cache);
  check(id.serial_number == "deadbeef", "Identify Controller SN through the driver is deadbeef");
  check(id.lba_size == want_lba, "LBA size " + std::to_string(id.lba_size) + " from Identify Namespace FLBAS");
  int bfd = ::open("/dev/snvme0n1", O_RDWR | O_DIRECT);
  std::uint64_t bdev_bytes = 0;
  if (bfd < 0 || ::ioctl(bfd, BLKGETSIZE64, &bdev_bytes) != 0) {
    std::printf("FAIL: /dev/snvme0n1: %s\n", std::strerror(errno));
    return 1;
  }
  check(bdev_bytes == id.namespace_size_lbas * id.lba_size, "NSZE x LBA size equals the block device size");
  check(c.controller_status().ready(), "controller_status() reports RDY");

  auto bad_depth = c.create_io_queue_pair(1);
  check(!bad_depth && bad_depth.code() == StatusCode::INVALID_ARGUMENT, "depth 1: " + bad_depth.status().to_string());
  auto qp = c.create_io_queue_pair(16);
  check(qp.is_ok(), "create_io_queue_pair(16): " + qp.status().to_string());
  if (!qp) return 1;
  const libnvm::QueuePairInfo& info = qp.value();
  nvme::QueuePairStorage storage(info.submission_queue, info.completion_queue, info.submission_queue_tail_doorbell,
                                 info.completion_queue_head_doorbell, info.controller_status, info.depth, info.qid);
  const nvme::QueuePair& q = storage.queue();

  constexpr std::size_t kBytes = 1u << 20;
  void* mem = std::aligned_alloc(4096, kBytes);
  void* want = std::aligned_alloc(4096, kBytes);
  auto map = c.dma_map(mem, kBytes);
  check(map.is_ok(), "dma_map(1 MiB): " + map.status().to_string());
  auto unaligned = c.dma_map(static_cast<char*>(mem) + 512, 4096);
  check(!unaligned && unaligned.code() == StatusCode::INVALID_ARGUMENT, "dma_map unaligned: " + unaligned.status().to_string());
  auto list = c.allocate_dma_buffer(4096);
  check(list.is_ok(), "allocate_dma_buffer(4096) for PRP lists: " + list.status().to_string());
  if (!map || !list) return 1;

  // Reads of several shapes against O_DIRECT reads of the same LBAs.
  const std::uint64_t sizes[] = {4096, 8192, 12288, 65536, 512 * 1024};
  for (std::uint64_t bytes : sizes) {
    if (bytes > id.max_data_transfer_bytes && id.max_data_transfer_bytes != 0) continue;
    std::memset(mem, 0x5a, bytes);
    const std::uint64_t lba = 64;
    bool pread_ok = ::pread(bfd, want, bytes, static_cast<off_t>(lba * id.lba_size)) == static_cast<ssize_t>(bytes);
    int s = io(q, 0x02, id.nsid, lba, id.lba_size, map.value(), 0, bytes, list.value());
    check(pread_ok && s == 0 && std::memcmp(mem, want, bytes) == 0,
          "read of " + std::to_string(bytes) + " bytes at LBA 64 matches O_DIRECT (status " + std::to_string(s) + ")");
  }

  // Write a pattern to the scratch region, read it back through the block device.
  for (std::size_t i = 0; i < kBytes; ++i) static_cast<unsigned char*>(mem)[i] = static_cast<unsigned char>(i * 7 + 3);
  int s = io(q, 0x01, id.nsid, scratch, id.lba_size, map.value(), 0, 256 * 1024, list.value());
  check(s == 0, "write of 256 KiB at scratch LBA " + std::to_string(scratch));
  std::memset(want, 0, 256 * 1024);
  bool pread_ok = ::pread(bfd, want, 256 * 1024, static_cast<off_t>(scratch * id.lba_size)) == 256 * 1024;
  check(pread_ok && std::memcmp(mem, want, 256 * 1024) == 0, "O_DIRECT read of the scratch region sees the written bytes");

  // Abort: a command that already completed is not found by the controller.
  auto ab = c.abort(info.qid, 0x0001, kSecond);
  check(ab.is_ok(), "abort of a completed CID answers: " + (ab ? std::string(ab.value() ? "aborted" : "not aborted") : ab.status().to_string()));
  auto ab_bad = c.abort(1, 0x0001, kSecond);
  check(!ab_bad && ab_bad.code() == StatusCode::NOT_FOUND, "abort on the kernel's QID 1: " + ab_bad.status().to_string());
  auto admin = c.submit_admin(nvme::SubmissionQueueEntry{}, kSecond);
  check(!admin && admin.code() == StatusCode::UNSUPPORTED, "submit_admin: " + admin.status().to_string());

  auto counters = c.driver_counters();
  check(counters && counters->queue_groups == 1 && counters->dma_maps == 2 && counters->pinned_pages == 257,
        "driver counts 1 group, 2 maps, 257 pinned pages");
  check(c.delete_io_queue_pair(info.qid).is_ok(), "delete_io_queue_pair");
  check(c.delete_io_queue_pair(info.qid).code() == StatusCode::NOT_FOUND, "second delete is NOT_FOUND");
  check(c.dma_unmap(map->id).is_ok(), "dma_unmap");
  check(c.dma_unmap(map->id).code() == StatusCode::NOT_FOUND, "second dma_unmap is NOT_FOUND");
  check(c.free_dma_buffer(list->id).is_ok(), "free_dma_buffer");
  st = c.shutdown(kSecond);
  check(st.is_ok(), "shutdown: " + st.to_string());
  counters = c.driver_counters();
  check(counters && counters->queue_groups == 0 && counters->dma_maps == 0 && counters->pinned_pages == 0 &&
            counters->user_queues_free == counters->user_queues,
        "after shutdown: no groups, maps or pins; all user queues free");
  ::close(bfd);
  std::free(mem);
  std::free(want);
  return failures ? 1 : 0;
}
