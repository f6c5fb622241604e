// Shared fixture of the soft controller conformance tests: a backing file, a soft controller,
// the libnvm driver brought up, one I/O queue pair driven by tutti/nvme/queue.hpp, and a
// DMA-mapped data region.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <tutti/libnvm/controller.hpp>
#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/prp.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/sgl.hpp>
#include <tutti/nvme/status.hpp>

namespace tutti::test {

inline constexpr std::uint64_t kSecond = 1'000'000'000;
inline constexpr std::uint64_t kWait = 10 * kSecond;  // generous: sanitizers on 2 shared cores

/// A temporary file of `bytes` bytes filled with a deterministic pattern; removed on destruction.
class TempFile {
 public:
  explicit TempFile(std::uint64_t bytes, std::uint32_t seed = 1) {
    char name[] = "/tmp/tutti-soft-XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    path_ = name;
    std::vector<std::uint8_t> data(bytes);
    std::mt19937 random(seed);
    for (auto& b : data) b = static_cast<std::uint8_t>(random());
    REQUIRE(::pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()));
    ::close(fd);
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }
  std::vector<std::uint8_t> read(std::uint64_t offset, std::uint64_t length) const {
    std::vector<std::uint8_t> out(length);
    const int fd = ::open(path_.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pread(fd, out.data(), length, static_cast<off_t>(offset)) == static_cast<ssize_t>(length));
    ::close(fd);
    return out;
  }

 private:
  std::string path_;
};

/// Page-aligned host memory, freed on destruction.
struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t bytes)
      : size(bytes), data(static_cast<std::uint8_t*>(std::aligned_alloc(4096, bytes))) {
    std::memset(data, 0, bytes);
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::size_t size;
  std::uint8_t* data;
};

/// One I/O queue pair with its queue primitive state.
struct IoQueue {
  libnvm::QueuePairInfo info;
  std::unique_ptr<nvme::QueuePairStorage> storage;
  const nvme::QueuePair& queue() const { return storage->queue(); }
};

inline IoQueue make_io_queue(libnvm::Controller& controller, std::uint32_t depth, std::uint32_t cid_capacity = 0) {
  auto info = controller.create_io_queue_pair(depth);
  REQUIRE_MESSAGE(info.is_ok(), info.status().to_string());
  IoQueue q;
  q.info = *info;
  q.storage = std::make_unique<nvme::QueuePairStorage>(
      info->submission_queue, info->completion_queue, info->submission_queue_tail_doorbell,
      info->completion_queue_head_doorbell, info->controller_status, info->depth, info->qid, cid_capacity);
  REQUIRE(q.storage->valid());
  return q;
}

/// Controller + driver + one queue + one mapped data region.
struct SoftFixture {
  explicit SoftFixture(libnvm::SoftControllerConfig config = {}, std::uint64_t file_bytes = 8u << 20,
                       std::size_t region_bytes = 4u << 20, std::uint32_t depth = 64)
      : file(config.null_mode ? 4096 : file_bytes), region(region_bytes), lists(1u << 20) {
    if (!config.null_mode) config.backing_path = file.path();
    if (config.null_mode && config.namespace_size_lbas == 0) config.namespace_size_lbas = file_bytes / config.lba_size;
    auto created = libnvm::SoftController::create(config);
    REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
    device = *created;
    auto opened = libnvm::open_soft_controller(device);
    REQUIRE(opened.is_ok());
    controller = std::move(*opened);
    libnvm::BringUpOptions options;
    options.io_queue_pairs_requested = 16;
    const Status up = controller->bring_up(options);
    REQUIRE_MESSAGE(up.is_ok(), up.to_string());
    io = make_io_queue(*controller, depth);
    auto mapped = controller->dma_map(region.data, region.size);
    REQUIRE_MESSAGE(mapped.is_ok(), mapped.status().to_string());
    mapping = std::move(*mapped);
    auto list_buffer = controller->allocate_dma_buffer(lists.size);
    REQUIRE(list_buffer.is_ok());
    list_area = *list_buffer;
  }

  std::uint32_t lba_size() const { return controller->identity().lba_size; }

  /// A Read or Write of nlb LBAs at slba into region bytes at `offset`, PRPs or SGL.
  nvme::SubmissionQueueEntry read_write(bool write, std::uint64_t slba, std::uint32_t nlb, std::uint64_t offset,
                                        bool sgl = false) {
    nvme::SubmissionQueueEntry sqe{};
    sqe.opcode = static_cast<std::uint8_t>(write ? nvme::NvmOpcode::write : nvme::NvmOpcode::read);
    sqe.nsid = 1;
    sqe.cdw10 = static_cast<std::uint32_t>(slba);
    sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
    sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, nlb - 1);
    const std::uint64_t bytes = std::uint64_t{nlb} * lba_size();
    if (sgl) {
      const nvme::SglBuild built = nvme::build_sgl(mapping.page_table(), offset, bytes, list_area.descriptor_area(), 4);
      REQUIRE(built.status == StatusCode::OK);
      sqe.set_data_pointer_kind(nvme::DataPointerKind::sgl_contiguous_metadata);
      sqe.data_pointer.sgl1 = built.sgl1;
    } else {
      const nvme::PrpBuild built = nvme::build_prp(mapping.page_table(), offset, bytes, list_area.descriptor_area());
      REQUIRE(built.status == StatusCode::OK);
      sqe.data_pointer.prp.prp1 = built.prp1;
      sqe.data_pointer.prp.prp2 = built.prp2;
    }
    return sqe;
  }

  /// Submits on `q` and waits (budget kWait); returns the CQE. Fails the test on transport errors.
  nvme::CompletionQueueEntry run(const nvme::SubmissionQueueEntry& request, const nvme::QueuePair* q = nullptr) {
    nvme::SubmissionQueueEntry sqe = request;
    const nvme::QueuePair& queue = q != nullptr ? *q : io.queue();
    std::uint16_t cid = 0;
    REQUIRE(queue.allocate_command_identifier(cid));
    sqe.command_identifier = cid;
    REQUIRE(queue.submit(sqe) == StatusCode::OK);
    const nvme::WaitResult waited = queue.wait_for_completion(cid, kWait);
    REQUIRE(waited.status == StatusCode::OK);
    CHECK(waited.completion.command_identifier() == cid);
    return waited.completion;
  }

  TempFile file;
  AlignedBuffer region;
  AlignedBuffer lists;
  std::shared_ptr<libnvm::SoftController> device;
  std::unique_ptr<libnvm::Controller> controller;
  IoQueue io;
  libnvm::DmaMapping mapping;
  libnvm::DmaBuffer list_area;
};

inline bool is_status(const nvme::CompletionQueueEntry& cqe, nvme::GenericStatus s) {
  return nvme::is(cqe.status(), s);
}
inline bool is_status(const nvme::CompletionQueueEntry& cqe, nvme::CommandSpecificStatus s) {
  return nvme::is(cqe.status(), s);
}

}  // namespace tutti::test
