// The soft controller in accelerator mode driven by GPU threads: a kernel writes SQEs into an I/O
// SQ the controller created in mapped pinned memory, rings the SQ tail doorbell in the mapped
// BAR0 (nvme::QueuePair::submit: reserve, write, ring), and reaps the CQEs the worker threads
// post by Phase Tag (QueuePair::wait_for_completion, bounded by accel::timer_ns = %globaltimer).
// Reads of a real file on the machine's disk land in cudaMalloc memory (verified byte for byte
// after copying back); Writes from GPU memory are checked in the file with pread.
// Suite gpu; exits 77 without a GPU (gpu_main.cpp).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tutti/accel/memory.hpp>
#include <tutti/accel/primitives.hpp>
#include <tutti/libnvm/controller.hpp>
#include <tutti/libnvm/soft_controller.hpp>
#include <tutti/nvme/prp.hpp>
#include <tutti/nvme/queue.hpp>
#include <tutti/nvme/sgl.hpp>
#include <tutti/nvme/status.hpp>

using namespace tutti;

namespace {

constexpr std::uint32_t kLba = 4096;
constexpr std::uint64_t kFileBytes = 32u << 20;  // 8192 LBAs
constexpr std::uint32_t kCommands = 256;         // per phase (reads, then writes)
constexpr std::uint32_t kLbasPerCommand = 16;    // 64 KiB: PRP1 + a PRP list of 15 entries
constexpr std::uint64_t kCommandBytes = std::uint64_t{kLbasPerCommand} * kLba;
constexpr std::uint64_t kPhaseBytes = kCommands * kCommandBytes;  // 16 MiB
constexpr std::uint32_t kQueueDepth = 64;                         // < threads: the SQ fills and wraps around
constexpr std::uint32_t kNotRun = 0xffffffffu;

/// What one command saw on the GPU.
struct CommandResult {
  std::uint32_t wait_status;  ///< StatusCode of the wait (OK, TIMEOUT, DEVICE_ERROR), or kNotRun
  std::uint32_t nvme_status;  ///< CQE status without the Phase Tag
  std::uint32_t cid_matches;  ///< 1 when the CQE carried the command's CID
  std::uint32_t refusals;     ///< RESOURCE_EXHAUSTED answers (no CID or SQ slot) before submission
};

struct KernelArgs {
  nvme::QueuePair queue;                       ///< rings and doorbells mapped, shared state in device memory
  const nvme::SubmissionQueueEntry* commands;  ///< device array: SQEs with PRPs/SGLs, CID filled here
  std::uint32_t command_count;
  CommandResult* results;        ///< device array, one per command
  std::uint64_t budget_ns;       ///< whole kernel
  std::uint64_t wait_budget_ns;  ///< per wait_for_completion
};

/// Thread t runs commands t, t + threads, ...: allocate a CID, submit (reserve + write + ring the
/// SQ tail doorbell), wait for the CQE (reaping by Phase Tag). Every loop ends at a %globaltimer
/// deadline; a refused step reaps completions to make room.
__global__ void soft_command_kernel(KernelArgs args) {
  const std::uint64_t deadline = accel::deadline_after(args.budget_ns);
  const std::uint32_t stride = gridDim.x * blockDim.x;
  for (std::uint32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < args.command_count; c += stride) {
    CommandResult result{kNotRun, 0xffffu, 0, 0};
    nvme::SubmissionQueueEntry sqe = args.commands[c];
    std::uint16_t cid = 0;
    bool allocated = false;
    while (!(allocated = args.queue.allocate_command_identifier(cid)) && accel::timer_ns() < deadline) {
      ++result.refusals;
      args.queue.reap_completions();
    }
    if (!allocated) {
      result.wait_status = static_cast<std::uint32_t>(StatusCode::TIMEOUT);
      args.results[c] = result;
      continue;
    }
    sqe.command_identifier = cid;
    StatusCode submitted = StatusCode::RESOURCE_EXHAUSTED;
    while ((submitted = args.queue.submit(sqe)) == StatusCode::RESOURCE_EXHAUSTED && accel::timer_ns() < deadline) {
      ++result.refusals;
      args.queue.reap_completions();
    }
    if (submitted != StatusCode::OK) {
      args.queue.abandon(cid);
      result.wait_status = static_cast<std::uint32_t>(StatusCode::TIMEOUT);
      args.results[c] = result;
      continue;
    }
    const nvme::WaitResult waited = args.queue.wait_for_completion(cid, args.wait_budget_ns);
    result.wait_status = static_cast<std::uint32_t>(waited.status);
    if (waited.status == StatusCode::OK) {
      result.nvme_status = waited.completion.status().without_phase();
      result.cid_matches = waited.completion.command_identifier() == cid ? 1u : 0u;
    } else if (waited.status == StatusCode::TIMEOUT) {
      args.queue.abandon(cid);
    }
    args.results[c] = result;
  }
}

void cuda_require(cudaError_t result, const char* what) {
  REQUIRE_MESSAGE(result == cudaSuccess, what << ": " << cudaGetErrorString(result));
}

/// A file of kFileBytes with a deterministic pattern on the machine's disk (not tmpfs when
/// /var/tmp is on the root file system); removed on destruction.
struct PatternFile {
  PatternFile() {
    int fd = -1;
    for (const char* directory : {"/var/tmp", "/tmp"}) {
      std::string name = std::string(directory) + "/tutti-gpu-soft-XXXXXX";
      fd = ::mkstemp(name.data());
      if (fd >= 0) {
        path = name;
        break;
      }
    }
    REQUIRE(fd >= 0);
    bytes.resize(kFileBytes);
    std::mt19937 random(2026);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(random());
    REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  ~PatternFile() { ::unlink(path.c_str()); }
  std::vector<std::uint8_t> pread_back(std::uint64_t offset, std::uint64_t length) const {
    std::vector<std::uint8_t> out(length);
    const int fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pread(fd, out.data(), length, static_cast<off_t>(offset)) == static_cast<ssize_t>(length));
    ::close(fd);
    return out;
  }
  std::string path;
  std::vector<std::uint8_t> bytes;
};

/// The queue pair's shared state (nvme::QueuePairState, ready words, command slots, CID bitmap)
/// in device memory, initialised as nvme::QueuePairStorage does; the view over the controller's
/// mapped rings and doorbells.
struct GpuQueue {
  explicit GpuQueue(const libnvm::QueuePairInfo& info) {
    const std::uint32_t capacity = info.depth;
    const std::uint32_t words = (capacity + 31) / 32;
    auto allocate = [](std::size_t bytes) {
      auto buffer = accel::DeviceBuffer::allocate(bytes);
      REQUIRE_MESSAGE(buffer.is_ok(), buffer.status().to_string());
      return std::move(*buffer);
    };
    state = allocate(sizeof(nvme::QueuePairState));
    ready = allocate(sizeof(std::uint64_t) * info.depth);
    slots = allocate(sizeof(nvme::CommandSlot) * capacity);
    bitmap = allocate(sizeof(std::uint32_t) * words);
    nvme::QueuePairState initial{};
    initial.cq_phase = 1;  // the first pass expects Phase Tag 1 (CQ memory starts zeroed)
    REQUIRE(accel::copy_to_device(state.data(), &initial, sizeof initial).is_ok());
    std::vector<std::uint32_t> bits(words, 0);
    for (std::uint32_t bit = capacity; bit < words * 32; ++bit) bits[bit / 32] |= 1u << (bit % 32);
    REQUIRE(accel::copy_to_device(bitmap.data(), bits.data(), bits.size() * sizeof(std::uint32_t)).is_ok());
    view.sq = info.submission_queue;
    view.cq = info.completion_queue;
    view.sq_tail_doorbell = info.submission_queue_tail_doorbell;
    view.cq_head_doorbell = info.completion_queue_head_doorbell;
    view.controller_status = info.controller_status;
    view.depth = info.depth;
    view.qid = info.qid;
    view.cid_capacity = capacity;
    view.cid_index_bits = nvme::cid_index_bits_for(capacity);
    view.state = static_cast<nvme::QueuePairState*>(state.data());
    view.sq_ready = static_cast<std::uint64_t*>(ready.data());
    view.slots = static_cast<nvme::CommandSlot*>(slots.data());
    view.cid_bitmap = static_cast<std::uint32_t*>(bitmap.data());
  }
  accel::DeviceBuffer state, ready, slots, bitmap;
  nvme::QueuePair view{};
};

/// Runs the kernel over `commands` and returns the per-command results.
std::vector<CommandResult> run_on_gpu(const GpuQueue& queue, const std::vector<nvme::SubmissionQueueEntry>& commands) {
  auto sqes = accel::DeviceBuffer::allocate(sizeof(nvme::SubmissionQueueEntry) * commands.size());
  REQUIRE(sqes.is_ok());
  REQUIRE(accel::copy_to_device(sqes->data(), commands.data(), sizeof(nvme::SubmissionQueueEntry) * commands.size())
              .is_ok());
  std::vector<CommandResult> results(commands.size(), CommandResult{kNotRun, 0xffffu, 0, 0});
  auto device_results = accel::DeviceBuffer::allocate(sizeof(CommandResult) * results.size());
  REQUIRE(device_results.is_ok());
  REQUIRE(
      accel::copy_to_device(device_results->data(), results.data(), sizeof(CommandResult) * results.size()).is_ok());
  KernelArgs args{};
  args.queue = queue.view;
  args.commands = static_cast<const nvme::SubmissionQueueEntry*>(sqes->data());
  args.command_count = static_cast<std::uint32_t>(commands.size());
  args.results = static_cast<CommandResult*>(device_results->data());
  args.budget_ns = 60'000'000'000ull;
  args.wait_budget_ns = 20'000'000'000ull;
  // 4 blocks of 32 threads: 128 threads for a 64-deep queue, so CIDs and SQ slots run out and the
  // rings wrap several times.
  soft_command_kernel<<<4, 32>>>(args);
  cuda_require(cudaGetLastError(), "launch soft_command_kernel");
  cuda_require(cudaStreamSynchronize(nullptr), "soft_command_kernel");
  REQUIRE(
      accel::copy_from_device(results.data(), device_results->data(), sizeof(CommandResult) * results.size()).is_ok());
  return results;
}

void check_results(const std::vector<CommandResult>& results) {
  std::uint32_t ok = 0, refusals = 0;
  for (std::size_t c = 0; c < results.size(); ++c) {
    const CommandResult& r = results[c];
    CAPTURE(c);
    CHECK(r.wait_status == static_cast<std::uint32_t>(StatusCode::OK));
    CHECK_MESSAGE(r.nvme_status == 0,
                  nvme::describe_status(nvme::StatusField{static_cast<std::uint16_t>(r.nvme_status)}));
    CHECK(r.cid_matches == 1);
    ok += r.wait_status == static_cast<std::uint32_t>(StatusCode::OK) && r.nvme_status == 0 ? 1 : 0;
    refusals += r.refusals;
  }
  CHECK(ok == results.size());
  MESSAGE(ok << " commands completed on the GPU, " << refusals << " refusals (CID or SQ slot) retried");
}

}  // namespace

TEST_CASE(
    "GPU threads submit Reads and Writes to the soft controller in accelerator mode; data moves between a file and GPU "
    "memory") {
  PatternFile file;
  libnvm::SoftControllerConfig config;
  config.backing_path = file.path;
  config.accelerator_mode = true;
  config.lba_size = kLba;
  config.worker_threads = 2;
  config.max_data_transfer_bytes = 1u << 20;
  auto created = libnvm::SoftController::create(config);
  REQUIRE_MESSAGE(created.is_ok(), created.status().to_string());
  std::shared_ptr<libnvm::SoftController> device = *created;
  auto opened = libnvm::open_soft_controller(device);
  REQUIRE(opened.is_ok());
  std::unique_ptr<libnvm::Controller> controller = std::move(*opened);
  libnvm::BringUpOptions options;
  options.io_queue_pairs_requested = 2;
  const Status up = controller->bring_up(options);
  REQUIRE_MESSAGE(up.is_ok(), up.to_string());
  auto info = controller->create_io_queue_pair(kQueueDepth);
  REQUIRE_MESSAGE(info.is_ok(), info.status().to_string());
  GpuQueue queue(*info);

  // GPU memory for the data, DMA-mapped as device regions; PRP lists and SGL segments in
  // controller DMA memory (mapped pinned), one page per command.
  auto read_target = accel::DeviceBuffer::allocate(kPhaseBytes);
  auto write_source = accel::DeviceBuffer::allocate(kPhaseBytes);
  REQUIRE(read_target.is_ok());
  REQUIRE(write_source.is_ok());
  auto read_mapping = controller->dma_map_device(read_target->data(), read_target->size());
  auto write_mapping = controller->dma_map_device(write_source->data(), write_source->size());
  REQUIRE_MESSAGE(read_mapping.is_ok(), read_mapping.status().to_string());
  REQUIRE(write_mapping.is_ok());
  CHECK(read_mapping->memory_kind == libnvm::DmaMemoryKind::device);
  auto lists = controller->allocate_dma_buffer(std::uint64_t{kCommands} * 4096);
  REQUIRE(lists.is_ok());

  SUBCASE("Reads into cudaMalloc memory (PRP lists) match the file byte for byte") {
    std::vector<nvme::SubmissionQueueEntry> commands(kCommands);
    for (std::uint32_t c = 0; c < kCommands; ++c) {
      nvme::SubmissionQueueEntry& sqe = commands[c];
      sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::read);
      sqe.nsid = 1;
      const std::uint64_t slba = std::uint64_t{c} * kLbasPerCommand;
      sqe.cdw10 = static_cast<std::uint32_t>(slba);
      sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
      sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, kLbasPerCommand - 1);
      const nvme::DescriptorArea area{static_cast<std::uint8_t*>(lists->host_address) + c * 4096ull,
                                      lists->bus_address + c * 4096ull, 4096};
      const nvme::PrpBuild built = nvme::build_prp(read_mapping->page_table(), c * kCommandBytes, kCommandBytes, area);
      REQUIRE(built.status == StatusCode::OK);
      sqe.data_pointer.prp.prp1 = built.prp1;
      sqe.data_pointer.prp.prp2 = built.prp2;
    }
    check_results(run_on_gpu(queue, commands));
    std::vector<std::uint8_t> landed(kPhaseBytes);
    REQUIRE(accel::copy_from_device(landed.data(), read_target->data(), landed.size()).is_ok());
    CHECK(std::memcmp(landed.data(), file.bytes.data(), kPhaseBytes) == 0);
    const auto counters = device->counters();
    CHECK(counters.device_bytes_read == kPhaseBytes);
    CHECK(counters.read_commands == kCommands);
    CHECK(counters.dma_faults == 0);
  }

  SUBCASE("Writes from cudaMalloc memory (SGLs) land in the file, checked with pread") {
    std::vector<std::uint8_t> fresh(kPhaseBytes);
    std::mt19937 random(77);
    for (auto& b : fresh) b = static_cast<std::uint8_t>(random());
    REQUIRE(accel::copy_to_device(write_source->data(), fresh.data(), fresh.size()).is_ok());
    const std::uint64_t first_lba = kPhaseBytes / kLba;  // the second half of the file
    std::vector<nvme::SubmissionQueueEntry> commands(kCommands);
    for (std::uint32_t c = 0; c < kCommands; ++c) {
      nvme::SubmissionQueueEntry& sqe = commands[c];
      sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::write);
      sqe.nsid = 1;
      const std::uint64_t slba = first_lba + std::uint64_t{c} * kLbasPerCommand;
      sqe.cdw10 = static_cast<std::uint32_t>(slba);
      sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
      sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, kLbasPerCommand - 1);
      const nvme::DescriptorArea area{static_cast<std::uint8_t*>(lists->host_address) + c * 4096ull,
                                      lists->bus_address + c * 4096ull, 4096};
      const nvme::SglBuild built = nvme::build_sgl(write_mapping->page_table(), c * kCommandBytes, kCommandBytes, area);
      REQUIRE(built.status == StatusCode::OK);
      sqe.set_data_pointer_kind(nvme::DataPointerKind::sgl_contiguous_metadata);
      sqe.data_pointer.sgl1 = built.sgl1;
    }
    check_results(run_on_gpu(queue, commands));
    CHECK(file.pread_back(first_lba * kLba, kPhaseBytes) == fresh);
    CHECK(file.pread_back(0, kPhaseBytes) ==
          std::vector<std::uint8_t>(file.bytes.begin(), file.bytes.begin() + kPhaseBytes));
    const auto counters = device->counters();
    CHECK(counters.device_bytes_written == kPhaseBytes);
    CHECK(counters.write_commands == kCommands);
    CHECK(counters.dma_faults == 0);
  }

  CHECK(controller->dma_unmap(read_mapping->id).is_ok());
  CHECK(controller->dma_unmap(write_mapping->id).is_ok());
  CHECK(controller->free_dma_buffer(lists->id).is_ok());
  CHECK(controller->delete_io_queue_pair(info->qid).is_ok());
}
