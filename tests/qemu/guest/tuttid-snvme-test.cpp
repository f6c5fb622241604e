// Guest client of tuttid on a PCI controller bound to the snvme driver (docs/daemon.md, "PCI controllers";
// tests/qemu/guest/suite.sh runs it against a real tuttid). Modes:
//   io <socket> <controller> <lba_size> <scratch_lba>
//       LeasedController::acquire (2 queues, 8 MiB pinned), the local_nvme DataPath on the leased queues over
//       the sealed file tuttid sent: WRITE 1 MiB of a pattern from allocate_host_memory (DMA-mapped through
//       the driver), FLUSH, READ it back into a canary-filled buffer, every byte compared; an O_DIRECT read of
//       /dev/snvme0n1 (the kernel's queues) sees the same bytes. Prints the lease latency (acquire and
//       release of 1 queue, mean of 20, a figure).
//   seal <socket> <controller>
//       a lease of 1 queue and 64 KiB asked by hand on the socket: its file came with the answer; on it
//       CREATE_QUEUE_GROUP is EPERM, DMA_MAP of 128 KiB is EDQUOT, 64 KiB succeeds, 4 KiB more is EDQUOT;
//       "register" on the lease is refused; after release the client's copy is revoked (ESTALE) and the groups
//       are gone from the driver.
//   hold <socket> <controller> <lba_size> <scratch_lba> <ready_file>
//       a lease of 2 queues keeping READs in flight through the DataPath until killed; creates ready_file
//       once they are.
//   told <socket> <controller> <ready_file>
//       a lease of 1 queue asked on the socket; creates ready_file, then waits (bounded 60 s) for tuttid's
//       "revoked" event of that lease with the reason "controller reset" (the suite resets the controller).
//   revoked <socket> <controller> <lba_size> <scratch_lba> <ready_file>
//       a lease of 2 queues with the DataPath on them (one READ done); creates ready_file, then waits (bounded
//       60 s) until the queues' CSTS word reads all ones (tuttid revoked the lease: the suite sends SIGTERM),
//       then tears the DataPath and the lease down without touching the revoked rings (no SIGBUS).
//   reclaim <socket> <controller> <leasable_queues>
//       acquires every leasable queue, retrying until tuttid has reclaimed a killed holder's (bounded 10 s);
//       prints the time from its start (right after the kill) to the grant; then the driver holds only this
//       lease's groups and no pin of the dead holder.
//   submit <socket> <controller> <lba_size> <scratch_lba> <ready_file>
//       a holder that keeps submitting across the revocation of its leases (the suite drains tuttid): READs
//       through the DataPath on a LeasedController (2 queues) and, on a lease of 1 queue asked by hand, READs
//       written into the SQ ring and rung on the doorbell of the file tuttid sent, as any program would, never
//       checking CSTS first; creates ready_file once both moved data. After the revocation each reports its
//       error (the DataPath DEVICE_ERROR within 10 s, the hand-driven queue no completion and no DMA), its
//       status page reads LEASE, its doorbells a stand-in of all ones, its ioctls ESTALE; no SIGBUS (a SIGBUS
//       is a FAIL).
//   across <socket> <controller> <lba_size> <scratch_lba> <ready_file> <revoked_file> <done_file>
//       a lease of 2 queues driven by hand, READs every 20 ms while tuttid is killed and started again: the
//       new tuttid revokes this file at its start (status page LEASE), after which a READ gets no completion
//       and no SIGBUS; creates revoked_file, then keeps the file open until done_file exists (bounded).
//   full <socket> <controller> <leasable_queues>
//       another process's queue groups leave the driver one queue short: acquire of every leasable queue is
//       refused RESOURCE_EXHAUSTED (tuttid's "exhausted"), naming the controller, the queues asked and the
//       queues free; once they are gone, it is granted at once, and the driver holds only its groups (a
//       revoked holder that still holds its file holds none).
// Prints "ok: ..." / "FAIL: ..." per check; exit status 0 only when every check passed.
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <tutti/path/local_nvme.hpp>
#include <uapi/snvme.h>

#include "../../../daemon/src/client.hpp"
#include "../../../daemon/src/leased_controller.hpp"
#include "../../../libnvm/snvme/snvme_controller.hpp"
#include "guest_check.hpp"

using namespace tutti;
using Path = local_nvme::LocalNvmeDataPath;
using json = nlohmann::json;

namespace {

using guest::check;
using guest::failures;

constexpr std::uint64_t kSecond = 1'000'000'000ull;
constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kBytes = 1024 * kKiB;
constexpr std::uint8_t kCanary = 0xa5;

using guest::pattern;

/// The errno of GET_INFO on `fd`, 0 when it succeeds.
int get_info_errno(int fd) {
  auto info = snvme_info{};
  info.hdr = {SNVME_ABI_VERSION, sizeof info};
  return ::ioctl(fd, SNVME_IOC_GET_INFO, &info) == 0 ? 0 : errno;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// The lease of `queues` queues as a LeasedController; null (and a FAIL line) when refused.
std::unique_ptr<daemon::LeasedController> lease(const std::string& socket, const std::string& controller,
                                                std::uint32_t queues, std::uint64_t pinned) {
  auto c = daemon::LeasedController::acquire({socket, controller, queues, pinned});
  if (!check(c.is_ok(), "acquire " + std::to_string(queues) + " queue(s) of " + controller + ": " +
                            c.status().to_string()))
    return nullptr;
  return std::move(c.value());
}

/// A DataPath on the lease's queues over one extent of `kBytes` at `scratch_lba`, with a READ or WRITE runner.
struct Session {
  std::unique_ptr<daemon::LeasedController> leased;
  std::optional<Path> path;
  std::optional<Path::registered_memory> reg;
  std::optional<Path::open_target> target;
  std::uint8_t* memory = nullptr;

  bool open(const std::string& socket, const std::string& controller, std::uint64_t scratch_lba) {
    leased = lease(socket, controller, 2, 8 * kBytes);
    if (!leased) return false;
    Path::Options options;
    options.queue_pairs = 2;
    options.queue_depth = leased->queue_depth();
    options.command_timeout_ns = 30 * kSecond;
    auto created = Path::create(*leased, options);
    if (!check(created.is_ok(), "DataPath::create on the leased queues: " + created.status().to_string())) return false;
    path.emplace(std::move(created.value()));
    auto m = leased->allocate_host_memory(2 * kBytes);
    if (!check(m.is_ok(), "allocate_host_memory: " + m.status().to_string())) return false;
    memory = static_cast<std::uint8_t*>(*m);
    auto r = path->register_memory(MemoryView{memory, 2 * kBytes, MemoryKind::HOST, -1});
    if (!check(r.is_ok(), "register 2 MiB (DMA_MAP through the sealed file): " + r.status().to_string())) return false;
    reg.emplace(std::move(r.value()));
    local_file::Target t;
    t.path = "synthetic (one extent on the leased namespace)";
    t.extents = {{0, scratch_lba * leased->identity().lba_size, kBytes}};
    t.file_size = kBytes;
    t.lba_size = leased->identity().lba_size;
    t.nsid = leased->identity().nsid;
    auto opened = path->open(std::move(t), OpenOptions{});
    if (!check(opened.is_ok(), "open the target: " + opened.status().to_string())) return false;
    target.emplace(std::move(opened.value()));
    return true;
  }
  /// One request of `length` bytes at file offset 0 from/to memory offset `at`; its completion status.
  Status run(Direction d, std::uint64_t at, std::uint64_t length) {
    std::vector<PathRequest<Path>> rs = {
        d == Direction::FLUSH
            ? PathRequest<Path>{d, nullptr, MemoryView{}, 0, &*target, 0, 0}
            : PathRequest<Path>{d, &*reg, MemoryView{memory, 2 * kBytes, MemoryKind::HOST, -1}, at, &*target, 0, length}};
    std::vector<Status> states(1);
    std::vector<RequestCompletion> completions(1);
    auto b = path->submit(rs, states);
    if (!states[0].is_ok()) return states[0];
    Status s = path->progress(b, completions, 60 * kSecond);
    if (!s.is_ok()) return s;
    if (!completions[0].status.is_ok()) return completions[0].status;
    if (completions[0].confirmed_bytes != length)
      return error(StatusCode::DATA_LOSS, "{} of {} bytes confirmed", completions[0].confirmed_bytes, length);
    return Status::success();
  }
  ~Session() {
    if (path && reg) (void)path->unregister_memory(*reg);
    if (path && target) (void)path->close(*target);
    path.reset();
  }
};

int io_test(const std::string& socket, const std::string& controller, std::uint32_t want_lba, std::uint64_t scratch_lba) {
  {
    Session s;
    if (!s.open(socket, controller, scratch_lba)) return 1;
    check(s.leased->identity().lba_size == want_lba,
          "the lease's LBA size is " + std::to_string(s.leased->identity().lba_size));
    for (std::uint64_t i = 0; i < kBytes; ++i) s.memory[i] = pattern(i);
    Status w = s.run(Direction::WRITE, 0, kBytes);
    check(w.is_ok(), "WRITE 1 MiB through the leased queues: " + w.to_string());
    Status f = s.run(Direction::FLUSH, 0, 0);
    check(f.is_ok(), "FLUSH: " + f.to_string());
    std::memset(s.memory + kBytes, kCanary, kBytes);
    Status r = s.run(Direction::READ, kBytes, kBytes);
    bool same = r.is_ok();
    for (std::uint64_t i = 0; same && i < kBytes; ++i) same = s.memory[kBytes + i] == pattern(i);
    check(same, "READ 1 MiB back through the leased queues, every byte matches: " + r.to_string());
  }
  // The kernel's own queues see the same bytes.
  const int fd = ::open("/dev/snvme0n1", O_RDONLY | O_DIRECT);
  void* raw = nullptr;
  bool same = fd >= 0 && ::posix_memalign(&raw, 4096, kBytes) == 0 &&
              ::pread(fd, raw, kBytes, static_cast<off_t>(scratch_lba * want_lba)) == static_cast<ssize_t>(kBytes);
  for (std::uint64_t i = 0; same && i < kBytes; ++i) same = static_cast<std::uint8_t*>(raw)[i] == pattern(i);
  check(same, "O_DIRECT read of /dev/snvme0n1 holds the written bytes");
  std::free(raw);
  if (fd >= 0) ::close(fd);
  // Lease latency: acquire (open, CREATE_QUEUE_GROUP, SEAL, SCM_RIGHTS, adopt) and release, mean of 20.
  const auto t0 = std::chrono::steady_clock::now();
  int granted = 0;
  for (int i = 0; i < 20; ++i) granted += lease(socket, controller, 1, 1 << 20) != nullptr;
  std::printf("figure: lease latency (acquire + release of 1 queue, LeasedController) %.2f ms mean of 20\n",
              ms_since(t0) / 20);
  check(granted == 20, "20 leases granted and released in a row");
  return failures ? 1 : 0;
}

/// A lease of `queues` queues and 64 KiB asked by hand on a new connection `c`: the answer's "lease", its file
/// in `fd`; null (with a FAIL line) when refused or when not exactly one file came with it.
json raw_lease(std::optional<daemon::Connection>& c, const std::string& socket, const std::string& controller, int& fd,
               std::uint32_t queues = 1) {
  auto connected = daemon::Connection::connect(socket);
  if (!check(connected.is_ok(), "connect: " + connected.status().to_string())) return nullptr;
  c.emplace(std::move(connected.value()));
  std::vector<int> fds;
  auto answer = c->call(json{{"tutti", 1}, {"op", "acquire"}, {"controller", controller}, {"queues", queues},
                             {"pinned_bytes", 64 * kKiB}},
                        10 * kSecond, {}, fds);
  const bool ok = answer.is_ok() && answer->value("ok", false) && fds.size() == 1 && (*answer)["lease"].contains("snvme");
  check(ok, "acquire " + std::to_string(queues) + " queue(s), 64 KiB: one file came with the answer: " +
                (answer ? answer->dump() : answer.status().to_string()));
  if (!ok) {
    for (int f : fds) ::close(f);
    return nullptr;
  }
  fd = fds[0];
  return (*answer)["lease"];
}

int seal_test(const std::string& socket, const std::string& controller) {
  std::optional<daemon::Connection> c;
  int fd = -1;
  const json lease = raw_lease(c, socket, controller, fd);
  if (lease.is_null()) return 1;
  const std::uint64_t id = lease["id"];
  check(lease["snvme"]["sealed_bytes"] == 64 * kKiB, "sealed_bytes is the lease's 64 KiB");
  auto group = snvme_queue_group{};
  group.hdr = {SNVME_ABI_VERSION, sizeof group};
  group.nr_queues = 1;
  group.entries = 16;
  const int created = ::ioctl(fd, SNVME_IOC_CREATE_QUEUE_GROUP, &group);
  check(created != 0 && errno == EPERM, "CREATE_QUEUE_GROUP on the sealed file is EPERM: " + std::string(std::strerror(errno)));
  void* memory = ::mmap(nullptr, 256 * kKiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  std::vector<std::uint64_t> bus(64);
  auto map = [&](std::uint64_t offset, std::uint64_t length, std::uint32_t& map_id) {
    auto m = snvme_dma_map{};
    m.hdr = {SNVME_ABI_VERSION, sizeof m};
    m.kind = SNVME_DMA_HOST;
    m.vaddr = reinterpret_cast<std::uintptr_t>(memory) + offset;
    m.length = length;
    m.bus_addrs = reinterpret_cast<std::uintptr_t>(bus.data());
    m.max_addrs = bus.size();
    const int r = ::ioctl(fd, SNVME_IOC_DMA_MAP, &m);
    map_id = m.map_id;
    return r == 0 ? 0 : errno;
  };
  std::uint32_t id1 = 0, id2 = 0;
  check(map(0, 128 * kKiB, id1) == EDQUOT, "DMA_MAP of 128 KiB (over the 64 KiB seal) is EDQUOT");
  check(map(0, 64 * kKiB, id1) == 0, "DMA_MAP of 64 KiB (the seal) succeeds");
  check(map(64 * kKiB, 4 * kKiB, id2) == EDQUOT, "DMA_MAP of 4 KiB more is EDQUOT");
  auto unmap = snvme_dma_unmap{};
  unmap.hdr = {SNVME_ABI_VERSION, sizeof unmap};
  unmap.map_id = id1;
  check(::ioctl(fd, SNVME_IOC_DMA_UNMAP, &unmap) == 0, "DMA_UNMAP");
  auto reg = c->call(json{{"tutti", 1}, {"op", "register"}, {"lease", id}, {"length", 4096}}, 10 * kSecond);
  check(reg.is_ok() && reg->value("ok", true) == false, "register on a PCI lease is refused: " + (reg ? reg->dump() : ""));
  auto released = c->call(json{{"tutti", 1}, {"op", "release"}, {"lease", id}}, 10 * kSecond);
  check(released.is_ok() && released->value("ok", false), "release");
  // tuttid revoked the file through its copy: this copy sees it, and the group is gone from the controller.
  const int revoked = get_info_errno(fd);
  check(revoked == ESTALE, "after release the client's copy of the file is revoked: GET_INFO " +
                               std::string(std::strerror(revoked)));
  const int fresh = ::open("/dev/snvme0", O_RDWR | O_CLOEXEC);
  auto info = snvme_info{};
  info.hdr = {SNVME_ABI_VERSION, sizeof info};
  check(fresh >= 0 && ::ioctl(fresh, SNVME_IOC_GET_INFO, &info) == 0 && info.queue_groups == 0,
        "after release no queue group is left on the controller (tuttid revoked the file through its copy): " +
            std::to_string(info.queue_groups));
  if (fresh >= 0) ::close(fresh);
  ::munmap(memory, 256 * kKiB);
  ::close(fd);
  return failures ? 1 : 0;
}

int hold_test(const std::string& socket, const std::string& controller, std::uint64_t scratch_lba, const char* ready) {
  Session s;
  if (!s.open(socket, controller, scratch_lba)) return 1;
  bool told = false;
  for (;;) {  // until SIGKILL: a batch of 8 READs of 128 KiB across both queues, again and again
    std::vector<PathRequest<Path>> rs;
    for (std::uint64_t i = 0; i < 8; ++i)
      rs.push_back({Direction::READ, &*s.reg, MemoryView{s.memory, 2 * kBytes, MemoryKind::HOST, -1}, i * 128 * kKiB,
                    &*s.target, i * 128 * kKiB, 128 * kKiB});
    std::vector<Status> states(rs.size());
    std::vector<RequestCompletion> completions(rs.size());
    auto b = s.path->submit(rs, states);
    if (!told) {
      std::ofstream(ready) << "busy\n";
      told = true;
    }
    if (!s.path->progress(b, completions, 60 * kSecond).is_ok()) return 1;
  }
}

int told_test(const std::string& socket, const std::string& controller, const char* ready) {
  std::optional<daemon::Connection> c;
  int fd = -1;
  const json lease = raw_lease(c, socket, controller, fd);
  if (lease.is_null()) return 1;
  const std::uint64_t id = lease["id"];
  std::ofstream(ready) << "leased\n";
  const auto t0 = std::chrono::steady_clock::now();
  auto event = c->next_event(60 * kSecond);
  check(event.is_ok() && (*event)["event"] == "revoked" && (*event)["lease"] == id &&
            (*event)["reason"] == "controller reset",
        "tuttid told this holder its lease " + std::to_string(id) + " was revoked by the reset, " +
            std::to_string(ms_since(t0)) + " ms after the lease was ready: " +
            (event ? event->dump() : event.status().to_string()));
  ::close(fd);
  return failures ? 1 : 0;
}

int revoked_test(const std::string& socket, const std::string& controller, std::uint64_t scratch_lba,
                 const char* ready) {
  Session s;
  if (!s.open(socket, controller, scratch_lba)) return 1;
  Status r = s.run(Direction::READ, 0, 64 * kKiB);
  check(r.is_ok(), "READ 64 KiB through the leased queues: " + r.to_string());
  std::ofstream(ready) << "leased\n";
  const auto t0 = std::chrono::steady_clock::now();
  while (s.leased->controller_status().raw != 0xffffffffu && ms_since(t0) < 60000)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  check(s.leased->controller_status().raw == 0xffffffffu,
        "the queues' CSTS word reads all ones once tuttid revoked the lease (" + std::to_string(ms_since(t0)) +
            " ms after the lease was ready)");
  return failures ? 1 : 0;  // ~Session: DataPath, then the lease (release answers not_found), no SIGBUS
}

int reclaim_test(const std::string& socket, const std::string& controller, std::uint32_t queues) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<daemon::LeasedController> all;
  while (!all && ms_since(t0) < 10000) {
    auto c = daemon::LeasedController::acquire({socket, controller, queues, 1 << 20});
    if (c.is_ok()) all = std::move(c.value());
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double ms = ms_since(t0);
  if (!check(all != nullptr, "every leasable queue granted again after the holder's SIGKILL")) return 1;
  std::printf("figure: SIGKILL of a holder of 2 queues to all %u leasable queues granted to another process: %.1f ms\n",
              queues, ms);
  auto driver = libnvm::SnvmeController::open("/dev/snvme0");
  auto counters = driver.is_ok() ? (*driver)->driver_counters() : Result<libnvm::SnvmeController::DriverCounters>(driver.status());
  check(counters.is_ok() && counters->queue_groups == queues && counters->pinned_pages == 0 && counters->dma_maps == 0,
        "the driver holds this lease's " + std::to_string(queues) + " groups and no pin or map of the dead holder: " +
            (counters ? std::to_string(counters->queue_groups) + " groups, " + std::to_string(counters->pinned_pages) +
                            " pinned pages, " + std::to_string(counters->dma_maps) + " maps"
                      : counters.status().to_string()));
  return failures ? 1 : 0;
}


/// A SIGBUS is the failure these tests look for: say so, and exit at once.
void sigbus_fails(int) {
  static const char message[] = "FAIL: SIGBUS: a revoked ring or doorbell mapping was not backed by a stand-in\n";
  (void)!::write(STDOUT_FILENO, message, sizeof message - 1);
  ::_exit(3);
}

/// One queue pair of a lease driven by hand through the file tuttid sent, as a program without libnvm would:
/// the doorbell window, the status page and the rings mapped from that file, a 4 KiB buffer DMA-mapped
/// through it, 64-byte READ commands written into the SQ ring (NVMe Base Spec 2.0, Figure 88) and 16-byte
/// completions read from the CQ ring (Figure 90).
struct RawQueue {
  int fd = -1;
  std::uint16_t qid = 0;
  std::uint32_t entries = 0, sq_doorbell = 0, cq_doorbell = 0, sq_bytes = 0, cq_bytes = 0;
  std::uint32_t doorbell_bytes = 0, lba_size = 0, nsid = 1;
  volatile std::uint8_t* sq = nullptr;
  volatile std::uint8_t* cq = nullptr;
  volatile std::uint8_t* doorbells = nullptr;
  const volatile snvme_status* status = nullptr;
  std::uint8_t* buffer = nullptr;
  std::uint64_t bus = 0;
  std::uint32_t tail = 0, head = 0;
  std::uint8_t phase = 1;
  std::uint16_t next_cid = 0;

  /// Maps queue `q` of the lease's "snvme" answer on `file`; false (with a FAIL line) when something fails.
  bool map(int file, const json& q) {
    fd = file;
    auto info = snvme_info{};
    info.hdr = {SNVME_ABI_VERSION, sizeof info};
    if (!check(::ioctl(fd, SNVME_IOC_GET_INFO, &info) == 0, "GET_INFO on the lease's file")) return false;
    doorbell_bytes = info.doorbell_bytes;
    lba_size = 1u << info.ns[0].lba_shift;
    nsid = info.ns[0].nsid;
    qid = q["qid"];
    entries = q["entries"];
    sq_doorbell = q["sq_doorbell"];
    cq_doorbell = q["cq_doorbell"];
    sq_bytes = q["sq_bytes"];
    cq_bytes = q["cq_bytes"];
    const std::uint64_t sq_offset = q["sq_offset"], cq_offset = q["cq_offset"];
    void* s = ::mmap(nullptr, sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(sq_offset));
    void* c = ::mmap(nullptr, cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(cq_offset));
    void* d = ::mmap(nullptr, doorbell_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, SNVME_MMAP_DOORBELLS);
    void* p = ::mmap(nullptr, SNVME_STATUS_BYTES, PROT_READ, MAP_SHARED, fd, SNVME_MMAP_STATUS);
    void* b = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (!check(s != MAP_FAILED && c != MAP_FAILED && d != MAP_FAILED && p != MAP_FAILED && b != MAP_FAILED,
               "mmap of QID " + std::to_string(qid) + "'s rings, the doorbells and the status page"))
      return false;
    sq = static_cast<volatile std::uint8_t*>(s);
    cq = static_cast<volatile std::uint8_t*>(c);
    doorbells = static_cast<volatile std::uint8_t*>(d);
    status = static_cast<const volatile snvme_status*>(p);
    buffer = static_cast<std::uint8_t*>(b);
    auto m = snvme_dma_map{};
    m.hdr = {SNVME_ABI_VERSION, sizeof m};
    m.kind = SNVME_DMA_HOST;
    m.vaddr = reinterpret_cast<std::uintptr_t>(buffer);
    m.length = 4096;
    m.bus_addrs = reinterpret_cast<std::uintptr_t>(&bus);
    m.max_addrs = 1;
    return check(::ioctl(fd, SNVME_IOC_DMA_MAP, &m) == 0, "DMA_MAP of 4 KiB through the lease's file");
  }
  std::uint32_t doorbell(std::uint32_t offset) const {
    return *reinterpret_cast<const volatile std::uint32_t*>(doorbells + offset);
  }
  /// A READ of 4 KiB at `slba` into `buffer` (filled with the canary first): 0 when it completed with
  /// success within `ms`, the NVMe status when it failed, -ETIMEDOUT when no completion came.
  int read(std::uint64_t slba, int ms) {
    std::memset(buffer, kCanary, 4096);
    std::uint8_t e[64] = {};
    const std::uint16_t cid = static_cast<std::uint16_t>(next_cid++ & 0x0fff);
    const std::uint32_t nlb = 4096 / lba_size - 1, lo = static_cast<std::uint32_t>(slba),
                        hi = static_cast<std::uint32_t>(slba >> 32);
    e[0] = 0x02;  // Read
    std::memcpy(e + 2, &cid, 2);
    std::memcpy(e + 4, &nsid, 4);
    std::memcpy(e + 24, &bus, 8);  // PRP1: one page
    std::memcpy(e + 40, &lo, 4);
    std::memcpy(e + 44, &hi, 4);
    std::memcpy(e + 48, &nlb, 4);
    for (int i = 0; i < 64; ++i) sq[tail * 64 + i] = e[i];
    tail = (tail + 1) % entries;
    std::atomic_thread_fence(std::memory_order_release);
    *reinterpret_cast<volatile std::uint32_t*>(doorbells + sq_doorbell) = tail;
    const auto t0 = std::chrono::steady_clock::now();
    volatile std::uint8_t* c = cq + head * 16;
    auto status_word = [c] { return static_cast<std::uint16_t>(c[14] | c[15] << 8); };
    while ((status_word() & 1) != phase) {
      if (ms_since(t0) > ms) {
        tail = (tail + entries - 1) % entries;  // never fetched: the slot is free again
        return -ETIMEDOUT;
      }
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint16_t st = status_word() >> 1;
    if (++head == entries) head = 0, phase ^= 1;
    *reinterpret_cast<volatile std::uint32_t*>(doorbells + cq_doorbell) = head;
    return st;
  }
};

/// What a revoked hand-driven queue must show: the status page LEASE and all ones, a READ with no
/// completion and no DMA, the doorbell window a stand-in of all ones, GET_INFO ESTALE. `who` names it.
void check_revoked_raw(RawQueue& q, std::uint64_t slba, const std::string& who) {
  check(q.status->revoked == SNVME_REVOKED_LEASE && q.status->csts == 0xffffffffu,
        who + ": the status page reads csts " + std::to_string(q.status->csts) + ", revoked " +
            std::to_string(q.status->revoked) + " (LEASE)");
  const int r = q.read(slba, 300);
  check(r == -ETIMEDOUT && q.buffer[0] == kCanary && q.buffer[4095] == kCanary,
        who + ": a READ written into the SQ ring and rung gets no completion and moves no data (" +
            std::to_string(r) + ")");
  check(q.doorbell(0) == 0xffffffffu, who + ": the doorbell window reads all ones (its stand-in, no queue behind it)");
  const int e = get_info_errno(q.fd);
  check(e == ESTALE, who + ": GET_INFO on the revoked file: " + std::string(std::strerror(e)));
}

int submit_test(const std::string& socket, const std::string& controller, std::uint64_t scratch_lba, const char* ready) {
  std::signal(SIGBUS, sigbus_fails);
  Session s;
  if (!s.open(socket, controller, scratch_lba)) return 1;
  std::optional<daemon::Connection> c;
  int fd = -1;
  const json lease = raw_lease(c, socket, controller, fd);
  if (lease.is_null()) return 1;
  RawQueue raw;
  if (!raw.map(fd, lease["snvme"]["queues"][0])) return 1;
  // Both keep submitting, neither looks at CSTS first: until each has failed once (bounded 60 s).
  Status path_error;
  int raw_error = 0;
  bool told = false;
  std::uint64_t rounds = 0;
  double path_failed_ms = -1, raw_failed_ms = -1;
  const auto t0 = std::chrono::steady_clock::now();
  while ((path_error.is_ok() || raw_error == 0) && ms_since(t0) < 60000) {
    if (path_error.is_ok()) {
      path_error = s.run(Direction::READ, 0, 64 * kKiB);
      if (!path_error.is_ok()) path_failed_ms = ms_since(t0);
    }
    if (raw_error == 0) {
      raw_error = raw.read(scratch_lba, 300);
      if (raw_error != 0) raw_failed_ms = ms_since(t0);
    }
    if (!told && path_error.is_ok() && raw_error == 0) {
      std::ofstream(ready) << "submitting\n";
      told = true;
    }
    ++rounds;
  }
  check(told, "READs moved data through both leases before the revocation");
  std::printf("%llu rounds; the DataPath failed at %.0f ms, the hand-driven queue at %.0f ms\n",
              static_cast<unsigned long long>(rounds), path_failed_ms, raw_failed_ms);
  check(path_error.code() == StatusCode::DEVICE_ERROR,
        "the DataPath's READ after the revocation reports an error, not success or a timeout: " +
            path_error.to_string());
  check(raw_error == -ETIMEDOUT, "the hand-driven READ after the revocation gets no completion: " +
                                     std::to_string(raw_error));
  check_revoked_raw(raw, scratch_lba, "the hand-driven lease");
  // Submitting again: the same clear error at once, no hang.
  const auto t1 = std::chrono::steady_clock::now();
  Status again = s.run(Direction::READ, 0, 64 * kKiB);
  check(again.code() == StatusCode::DEVICE_ERROR && ms_since(t1) < 10000,
        "a READ submitted again through the DataPath fails in " + std::to_string(ms_since(t1)) +
            " ms: " + again.to_string());
  check(s.leased->controller_status().raw == 0xffffffffu, "the LeasedController's CSTS reads all ones");
  // The drain's "revoking" comes first, then "revoked" (bounded 10 s).
  Result<json> event = json::object();
  const auto t2 = std::chrono::steady_clock::now();
  do event = c->next_event(10 * kSecond);
  while (event.is_ok() && (*event)["event"] == "revoking" && ms_since(t2) < 10000);
  check(event.is_ok() && (*event)["event"] == "revoked" && (*event)["lease"] == lease["id"],
        "tuttid told the hand-driven lease's holder: " + (event ? event->dump() : event.status().to_string()));
  ::close(fd);
  return failures ? 1 : 0;  // ~Session: the DataPath, then the lease (its release answers not_found)
}

int across_test(const std::string& socket, const std::string& controller, std::uint64_t scratch_lba,
                const char* ready, const char* revoked, const char* done) {
  std::signal(SIGBUS, sigbus_fails);
  std::optional<daemon::Connection> c;
  int fd = -1;
  const json lease = raw_lease(c, socket, controller, fd, 2);
  if (lease.is_null()) return 1;
  RawQueue q[2];
  if (!q[0].map(fd, lease["snvme"]["queues"][0]) || !q[1].map(fd, lease["snvme"]["queues"][1])) return 1;
  if (!check(q[0].read(scratch_lba, 5000) == 0 && q[1].read(scratch_lba, 5000) == 0, "READs on both queues"))
    return 1;
  std::ofstream(ready) << "leased\n";
  // READs every 20 ms while tuttid is killed and started again, until one gets no completion (bounded 120 s).
  std::uint64_t reads = 0, reads_without_tuttid = 0;
  bool tuttid_gone = false;
  int last = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (last == 0 && ms_since(t0) < 120000) {
    pollfd p{c->fd(), POLLIN, 0};
    if (!tuttid_gone && ::poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP)) != 0) {
      tuttid_gone = !c->next_event(0).is_ok();  // EOF: the old tuttid is gone
    }
    last = q[reads % 2].read(scratch_lba, 500);
    if (last == 0) ++reads, reads_without_tuttid += tuttid_gone;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("%llu READs completed, %llu of them after the old tuttid's socket closed\n",
              static_cast<unsigned long long>(reads), static_cast<unsigned long long>(reads_without_tuttid));
  check(tuttid_gone, "the old tuttid's socket closed (it was killed)");
  check(last == -ETIMEDOUT, "a READ once the new tuttid started gets no completion: " + std::to_string(last));
  check_revoked_raw(q[0], scratch_lba, "the holder across the restart (QID " + std::to_string(q[0].qid) + ")");
  std::ofstream(revoked) << "revoked\n";
  // The file stays open meanwhile: the suite checks that every leasable queue is granted anyway.
  const auto t1 = std::chrono::steady_clock::now();
  while (::access(done, F_OK) != 0 && ms_since(t1) < 120000)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  check(::access(done, F_OK) == 0, "the suite said done while this holder kept its revoked file open");
  ::close(fd);
  return failures ? 1 : 0;
}

int full_test(const std::string& socket, const std::string& controller, std::uint32_t queues) {
  // A process of its own (as root may) takes all but queues - 1 of the driver's free user queues.
  const int rogue = ::open("/dev/snvme0", O_RDWR | O_CLOEXEC);
  auto info = snvme_info{};
  info.hdr = {SNVME_ABI_VERSION, sizeof info};
  if (!check(rogue >= 0 && ::ioctl(rogue, SNVME_IOC_GET_INFO, &info) == 0, "open and GET_INFO of /dev/snvme0"))
    return 1;
  const std::uint32_t total = info.user_queues;
  std::uint32_t take = info.user_queues_free - (queues - 1);
  while (take > 0) {
    auto g = snvme_queue_group{};
    g.hdr = {SNVME_ABI_VERSION, sizeof g};
    g.nr_queues = std::min<std::uint32_t>(take, SNVME_MAX_GROUP_QUEUES);
    g.entries = 2;
    if (!check(::ioctl(rogue, SNVME_IOC_CREATE_QUEUE_GROUP, &g) == 0,
               "another process creates a group of " + std::to_string(g.nr_queues) + " queue(s)"))
      return 1;
    take -= g.nr_queues;
  }
  auto refused = daemon::LeasedController::acquire({socket, controller, queues, 1 << 20});
  const std::string message = refused.is_ok() ? std::string("granted") : refused.status().to_string();
  check(!refused.is_ok() && refused.code() == StatusCode::RESOURCE_EXHAUSTED &&
            message.find("exhausted") != std::string::npos && message.find("controller " + controller) != std::string::npos &&
            message.find(std::to_string(queues) + " queues asked") != std::string::npos &&
            message.find(std::to_string(queues - 1) + " of its " + std::to_string(total) + " user queues free") !=
                std::string::npos,
        "with the driver one queue short, acquire of " + std::to_string(queues) + " is a resource refusal: " + message);
  ::close(rogue);  // its groups go with it
  auto all = daemon::LeasedController::acquire({socket, controller, queues, 1 << 20});
  if (!check(all.is_ok(), "then every leasable queue (" + std::to_string(queues) + ") is granted at once: " +
                              all.status().to_string()))
    return 1;
  auto driver = libnvm::SnvmeController::open("/dev/snvme0");
  auto counters = driver.is_ok() ? (*driver)->driver_counters() : Result<libnvm::SnvmeController::DriverCounters>(driver.status());
  check(counters.is_ok() && counters->queue_groups == queues && counters->user_queues_free == total - queues,
        "the driver holds only this lease's " + std::to_string(queues) + " groups: " +
            (counters ? std::to_string(counters->queue_groups) + " groups, " +
                            std::to_string(counters->user_queues_free) + " of " + std::to_string(total) +
                            " user queues free"
                      : counters.status().to_string()));
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "io" && argc == 6)
    return io_test(argv[2], argv[3], static_cast<std::uint32_t>(std::atoi(argv[4])), std::strtoull(argv[5], nullptr, 0));
  if (mode == "seal" && argc == 4) return seal_test(argv[2], argv[3]);
  if (mode == "hold" && argc == 7) return hold_test(argv[2], argv[3], std::strtoull(argv[5], nullptr, 0), argv[6]);
  if (mode == "revoked" && argc == 7) return revoked_test(argv[2], argv[3], std::strtoull(argv[5], nullptr, 0), argv[6]);
  if (mode == "told" && argc == 5) return told_test(argv[2], argv[3], argv[4]);
  if (mode == "reclaim" && argc == 5)
    return reclaim_test(argv[2], argv[3], static_cast<std::uint32_t>(std::atoi(argv[4])));
  if (mode == "submit" && argc == 7) return submit_test(argv[2], argv[3], std::strtoull(argv[5], nullptr, 0), argv[6]);
  if (mode == "across" && argc == 9)
    return across_test(argv[2], argv[3], std::strtoull(argv[5], nullptr, 0), argv[6], argv[7], argv[8]);
  if (mode == "full" && argc == 5) return full_test(argv[2], argv[3], static_cast<std::uint32_t>(std::atoi(argv[4])));
  std::fprintf(stderr,
               "usage: %s io SOCKET CONTROLLER LBA_SIZE SCRATCH_LBA | seal SOCKET CONTROLLER | "
               "hold|revoked SOCKET CONTROLLER LBA_SIZE SCRATCH_LBA READY_FILE | told SOCKET CONTROLLER READY_FILE | "
               "reclaim|full SOCKET CONTROLLER QUEUES | submit SOCKET CONTROLLER LBA_SIZE SCRATCH_LBA READY_FILE | "
               "across SOCKET CONTROLLER LBA_SIZE SCRATCH_LBA READY_FILE REVOKED_FILE DONE_FILE\n",
               argv[0]);
  return 2;
}
