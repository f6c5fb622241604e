#include "soft_controller_fuzz.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/queue.hpp>

#include "soft_dma.hpp"

namespace tutti::fuzz {
namespace {

constexpr std::size_t kRegionBytes = 256 * 1024;
constexpr std::size_t kAreaBytes = 8192;
constexpr std::uint64_t kBudgetNs = 2'000'000'000;

struct Harness {
  Harness() {
    char name[] = "/tmp/tutti-fuzz-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd < 0 || ::ftruncate(fd, 1 << 20) != 0) std::abort();
    ::close(fd);
    path = name;
    libnvm::SoftControllerConfig config;
    config.backing_path = path;
    config.max_sgl_descriptors = 1024;
    config.idle_sleep_max_ns = 20'000;
    auto created = libnvm::SoftController::create(config);
    if (!created) std::abort();
    device = *created;
    auto opened = libnvm::open_soft_controller(device);
    if (!opened) std::abort();
    controller = std::move(*opened);
    libnvm::BringUpOptions options;
    options.io_queue_pairs_requested = 2;
    if (!controller->bring_up(options).is_ok()) std::abort();
    auto pair = controller->create_io_queue_pair(16);
    if (!pair) std::abort();
    info = *pair;
    storage = std::make_unique<nvme::QueuePairStorage>(
        info.submission_queue, info.completion_queue, info.submission_queue_tail_doorbell,
        info.completion_queue_head_doorbell, info.controller_status, info.depth, info.qid);
    region = static_cast<std::uint8_t*>(std::aligned_alloc(4096, kRegionBytes));
    auto mapped = controller->dma_map(region, kRegionBytes);
    if (!mapped) std::abort();
    region_bus = mapped->bus_addresses.front();
    auto buffer = controller->allocate_dma_buffer(kAreaBytes);
    if (!buffer) std::abort();
    area = *buffer;
  }
  ~Harness() {
    storage.reset();
    controller.reset();
    device.reset();
    std::free(region);
    ::unlink(path.c_str());
  }
  std::uint64_t rebase(std::uint64_t word) const {
    if (word >> 63) return region_bus + (word & 0xfffff);
    if ((word >> 62) & 1) return area.bus_address + (word & 0x1fff);
    return word;
  }
  std::string path;
  std::shared_ptr<libnvm::SoftController> device;
  std::unique_ptr<libnvm::Controller> controller;
  libnvm::QueuePairInfo info;
  std::unique_ptr<nvme::QueuePairStorage> storage;
  std::uint8_t* region = nullptr;
  std::uint64_t region_bus = 0;
  libnvm::DmaBuffer area;
};

Harness& harness() {
  static Harness h;
  return h;
}

bool admin_opcode_allowed(std::uint8_t opcode) {
  switch (static_cast<nvme::AdminOpcode>(opcode)) {
    case nvme::AdminOpcode::identify:
    case nvme::AdminOpcode::get_features:
    case nvme::AdminOpcode::get_log_page:
    case nvme::AdminOpcode::abort: return true;
    default: return false;  // queue and feature changes would break the harness state between inputs
  }
}

}  // namespace

std::string run_one(const std::uint8_t* data, std::size_t size) {
  if (size < 1 + sizeof(nvme::SubmissionQueueEntry)) return {};
  Harness& h = harness();
  const std::uint8_t mode = data[0];
  nvme::SubmissionQueueEntry sqe{};
  std::memcpy(&sqe, data + 1, sizeof sqe);
  const std::size_t area_bytes = std::min(size - 1 - sizeof sqe, kAreaBytes);
  auto* area = static_cast<std::uint8_t*>(h.area.host_address);
  std::memset(area, 0, kAreaBytes);
  std::memcpy(area, data + 1 + sizeof sqe, area_bytes);
  auto* words = reinterpret_cast<std::uint64_t*>(area);
  for (std::size_t w = 0; w < kAreaBytes / 8; ++w) words[w] = h.rebase(words[w]);
  if (sqe.data_pointer_kind() == nvme::DataPointerKind::prp) {
    sqe.data_pointer.prp.prp1 = h.rebase(sqe.data_pointer.prp.prp1);
    sqe.data_pointer.prp.prp2 = h.rebase(sqe.data_pointer.prp.prp2);
  } else {
    sqe.data_pointer.sgl1.address = h.rebase(sqe.data_pointer.sgl1.address);
  }

  // The decoder alone, with the real bus space as reader.
  const std::uint64_t length = 1 + (sqe.cdw12 & 0xffff) * 512ull;
  libnvm::soft::DecodeLimits limits;
  limits.max_sgl_descriptors = 1024;
  const auto decoded = libnvm::soft::decode_data_pointer(sqe, length, limits,
                                                         [&](std::uint64_t bus, void* destination, std::size_t bytes) {
                                                           const void* host = h.device->translate(bus, bytes);
                                                           if (host == nullptr) return false;
                                                           std::memcpy(destination, host, bytes);
                                                           return true;
                                                         });
  if (decoded.status.success()) {
    std::uint64_t total = 0;
    for (const auto& segment : decoded.segments) total += segment.length;
    if (total != length) return fmt::format("decoded {} bytes for a {}-byte transfer", total, length);
  }
  if (mode & 2) return {};

  const bool admin = (mode & 1) != 0;
  if (admin) {
    if (!admin_opcode_allowed(sqe.opcode)) return {};
    auto done = h.controller->submit_admin(sqe, kBudgetNs);
    if (!done) return "admin command: " + done.status().to_string();
  } else {
    const nvme::QueuePair& q = h.storage->queue();
    std::uint16_t cid = 0;
    if (!q.allocate_command_identifier(cid)) return "no free CID: an earlier command never completed";
    sqe.command_identifier = cid;
    if (q.submit(sqe) != StatusCode::OK) return "I/O submission queue full: an earlier command was never fetched";
    const nvme::WaitResult waited = q.wait_for_completion(cid, kBudgetNs);
    if (waited.status != StatusCode::OK) {
      q.abandon(cid);
      return fmt::format("I/O command opcode {:#x} got no completion: {}", sqe.opcode, to_string(waited.status));
    }
  }
  if (h.controller->controller_status().fatal()) return "controller fatal status after a command";
  return {};
}

}  // namespace tutti::fuzz
