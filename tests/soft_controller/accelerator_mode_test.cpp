// The soft controller's accelerator mode (GPU mode) with the profile's accel memory: BAR0 and DMA
// buffers from accel::allocate_mapped_host, accelerator memory (accel::allocate_device) mapped
// with dma_map_device, Reads and Writes through the workers' bounce buffers verified byte for
// byte against the backing file, PRP lists and SGL segments inside device regions, the IOMMU
// rule for device regions, transfers across bounce-buffer chunks, and the unmap rules.
// In the host profile "device" memory is host memory moved with memcpy, so this suite runs on
// every machine; in the cuda profile it needs a GPU (and is skipped, with a message, without one).
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <tutti/accel/memory.hpp>

#include "soft_fixture.hpp"

using namespace tutti;
using namespace tutti::test;
using nvme::GenericStatus;

namespace {

/// False (with a message) in the cuda profile without a usable device: nothing to test there.
bool accelerator_available() {
  auto probe = accel::allocate_mapped_host(4096);
  if (probe) {
    accel::free_mapped_host(*probe);
    return true;
  }
  if (accel::kProfile == accel::Profile::host)
    FAIL("host profile allocate_mapped_host failed: " << probe.status().to_string());
  MESSAGE("skipped: no usable accelerator: " << probe.status().to_string());
  return false;
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> out(n);
  std::mt19937 random(seed);
  for (auto& b : out) b = static_cast<std::uint8_t>(random());
  return out;
}

/// Device memory mapped into the controller, with host-side helpers to fill and read it.
struct DeviceRegion {
  DeviceRegion(libnvm::Controller& controller, std::size_t bytes) {
    auto allocated = accel::DeviceBuffer::allocate(bytes);
    REQUIRE_MESSAGE(allocated.is_ok(), allocated.status().to_string());
    buffer = std::move(*allocated);
    auto mapped = controller.dma_map_device(buffer.data(), buffer.size());
    REQUIRE_MESSAGE(mapped.is_ok(), mapped.status().to_string());
    mapping = std::move(*mapped);
  }
  std::vector<std::uint8_t> download(std::uint64_t offset, std::uint64_t length) const {
    std::vector<std::uint8_t> out(length);
    REQUIRE(
        accel::copy_from_device(out.data(), static_cast<const std::uint8_t*>(buffer.data()) + offset, length).is_ok());
    return out;
  }
  void upload(std::uint64_t offset, const std::vector<std::uint8_t>& bytes) {
    REQUIRE(
        accel::copy_to_device(static_cast<std::uint8_t*>(buffer.data()) + offset, bytes.data(), bytes.size()).is_ok());
  }
  void fill(std::uint8_t value) { upload(0, std::vector<std::uint8_t>(buffer.size(), value)); }

  accel::DeviceBuffer buffer;
  libnvm::DmaMapping mapping;
};

/// A Read or Write of nlb LBAs at slba into `mapping` bytes at `offset`, PRPs or SGL, with the
/// PRP list / SGL segments built in `area` (host-visible builder memory).
nvme::SubmissionQueueEntry read_write(SoftFixture& f, const libnvm::DmaMapping& mapping, bool write, std::uint64_t slba,
                                      std::uint32_t nlb, std::uint64_t offset, bool sgl,
                                      const nvme::DescriptorArea& area) {
  nvme::SubmissionQueueEntry sqe{};
  sqe.opcode = static_cast<std::uint8_t>(write ? nvme::NvmOpcode::write : nvme::NvmOpcode::read);
  sqe.nsid = 1;
  sqe.cdw10 = static_cast<std::uint32_t>(slba);
  sqe.cdw11 = static_cast<std::uint32_t>(slba >> 32);
  sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, nlb - 1);
  const std::uint64_t bytes = std::uint64_t{nlb} * f.lba_size();
  if (sgl) {
    const nvme::SglBuild built = nvme::build_sgl(mapping.page_table(), offset, bytes, area, 4);
    REQUIRE(built.status == StatusCode::OK);
    sqe.set_data_pointer_kind(nvme::DataPointerKind::sgl_contiguous_metadata);
    sqe.data_pointer.sgl1 = built.sgl1;
  } else {
    const nvme::PrpBuild built = nvme::build_prp(mapping.page_table(), offset, bytes, area);
    REQUIRE(built.status == StatusCode::OK);
    sqe.data_pointer.prp.prp1 = built.prp1;
    sqe.data_pointer.prp.prp2 = built.prp2;
  }
  return sqe;
}

libnvm::SoftControllerConfig accelerator_config() {
  libnvm::SoftControllerConfig config;
  config.accelerator_mode = true;
  return config;
}

}  // namespace

TEST_CASE("accelerator_mode defaults to false and map_device is UNSUPPORTED without it") {
  CHECK(libnvm::kSoftDefaultAcceleratorMode == false);
  CHECK(libnvm::SoftControllerConfig{}.accelerator_mode == libnvm::kSoftDefaultAcceleratorMode);
  CHECK(libnvm::kSoftDefaultBounceBufferBytes == 1u << 20);
  SoftFixture f;
  auto refused = f.controller->dma_map_device(f.region.data, 4096);
  CHECK(refused.code() == StatusCode::UNSUPPORTED);
  CHECK(refused.status().message().find("accelerator_mode") != std::string::npos);
  CHECK(f.device->map_device(f.region.data, 4096).code() == StatusCode::UNSUPPORTED);
}

TEST_CASE("accel memory: sizes are validated, allocations are aligned and zeroed, copies round-trip") {
  if (!accelerator_available()) return;
  CHECK(accel::allocate_mapped_host(0).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(accel::allocate_device(0).code() == StatusCode::INVALID_ARGUMENT);
  auto too_big = accel::allocate_device(accel::kMaxAllocationBytes + 1);
  CHECK(too_big.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(too_big.status().message().find("bytes = ") != std::string::npos);
  CHECK(accel::copy_to_device(nullptr, "x", 1).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(accel::copy_from_device(nullptr, nullptr, 0).is_ok());  // nothing to move

  auto host = accel::MappedHostBuffer::allocate(5000);
  REQUIRE(host.is_ok());
  CHECK(host->size() == 8192);
  CHECK(reinterpret_cast<std::uintptr_t>(host->data()) % 4096 == 0);
  const auto* bytes = static_cast<const std::uint8_t*>(host->data());
  CHECK(std::all_of(bytes, bytes + host->size(), [](std::uint8_t b) { return b == 0; }));

  auto device = accel::DeviceBuffer::allocate(3 * 4096);
  REQUIRE(device.is_ok());
  CHECK(reinterpret_cast<std::uintptr_t>(device->data()) % 4096 == 0);
  std::vector<std::uint8_t> zeroes(device->size(), 0xff);
  REQUIRE(accel::copy_from_device(zeroes.data(), device->data(), zeroes.size()).is_ok());
  CHECK(std::all_of(zeroes.begin(), zeroes.end(), [](std::uint8_t b) { return b == 0; }));
  const auto data = pattern(device->size(), 3);
  REQUIRE(accel::copy_to_device(device->data(), data.data(), data.size()).is_ok());
  std::vector<std::uint8_t> back(data.size());
  REQUIRE(accel::copy_from_device(back.data(), device->data(), back.size()).is_ok());
  CHECK(back == data);

  accel::DeviceBuffer moved = std::move(*device);
  CHECK(device->data() == nullptr);
  CHECK(moved.size() == 3 * 4096);
}

TEST_CASE("accelerator mode: reads into and writes from device regions match the file, PRP and SGL, scattered pages") {
  if (!accelerator_available()) return;
  for (std::uint32_t lba : {512u, 4096u})
    for (bool scatter : {false, true})
      for (bool sgl : {false, true}) {
        CAPTURE(lba);
        CAPTURE(scatter);
        CAPTURE(sgl);
        libnvm::SoftControllerConfig config = accelerator_config();
        config.lba_size = lba;
        config.scatter_bus_pages = scatter;
        SoftFixture f(config, 4u << 20, 64u << 10);
        DeviceRegion region(*f.controller, 2u << 20);
        CHECK(region.mapping.memory_kind == libnvm::DmaMemoryKind::device);
        CHECK(region.mapping.host_address == region.buffer.data());
        std::mt19937 random(lba + scatter * 7 + sgl * 13);
        std::uint64_t moved = 0;
        for (int i = 0; i < 12; ++i) {
          const std::uint32_t nlb = 1 + random() % ((256u * 1024) / lba);
          const std::uint64_t slba = random() % (f.controller->identity().namespace_size_lbas - nlb);
          const std::uint64_t bytes = std::uint64_t{nlb} * lba;
          const std::uint64_t offset = (random() % ((region.buffer.size() - bytes) / 4)) * 4;  // dword aligned
          // Read: device bytes [offset, offset + bytes) equal the file; neighbours untouched.
          region.fill(0xa5);
          const auto read =
              f.run(read_write(f, region.mapping, false, slba, nlb, offset, sgl, f.list_area.descriptor_area()));
          REQUIRE_MESSAGE(read.status().success(), nvme::describe_status(read.status()));
          const auto landed = region.download(0, region.buffer.size());
          const auto expected = f.file.read(slba * lba, bytes);
          CHECK(std::memcmp(landed.data() + offset, expected.data(), bytes) == 0);
          if (offset > 0) CHECK(landed[offset - 1] == 0xa5);
          if (offset + bytes < landed.size()) CHECK(landed[offset + bytes] == 0xa5);
          // Write: new device bytes land in the file.
          const auto fresh = pattern(bytes, static_cast<std::uint32_t>(i + 100));
          region.upload(offset, fresh);
          const auto write =
              f.run(read_write(f, region.mapping, true, slba, nlb, offset, sgl, f.list_area.descriptor_area()));
          REQUIRE(write.status().success());
          CHECK(f.file.read(slba * lba, bytes) == fresh);
          moved += bytes;
        }
        const auto counters = f.device->counters();
        CHECK(counters.bytes_read == moved);
        CHECK(counters.bytes_written == moved);
        CHECK(counters.device_bytes_read == moved);
        CHECK(counters.device_bytes_written == moved);
        CHECK(counters.dma_faults == 0);
      }
}

TEST_CASE("accelerator mode: a PRP list and SGL segments that live in a device region are read from it") {
  if (!accelerator_available()) return;
  libnvm::SoftControllerConfig config = accelerator_config();
  config.scatter_bus_pages = true;  // one Data Block per page: the SGL needs segments, the PRP a list
  SoftFixture f(config, 4u << 20, 64u << 10);
  DeviceRegion data(*f.controller, 1u << 20);
  DeviceRegion lists(*f.controller, 8192);
  // The builders write into host staging memory that claims the device region's bus address;
  // the bytes are then uploaded, so the controller can only find them in device memory.
  for (bool sgl : {false, true}) {
    CAPTURE(sgl);
    std::vector<std::uint8_t> staging(4096, 0);
    const nvme::DescriptorArea area{staging.data(), lists.mapping.bus_addresses[0], staging.size()};
    const std::uint32_t nlb = 64;  // 256 KiB: 64 pages, PRP list of 63 entries / 4-descriptor SGL segments
    const std::uint64_t slba = sgl ? 300 : 100;
    auto sqe = read_write(f, data.mapping, false, slba, nlb, sgl ? 8192 : 0, sgl, area);
    lists.upload(0, staging);
    std::fill(staging.begin(), staging.end(), 0);  // the host copy is gone: only the device holds the list
    data.fill(0);
    const auto read = f.run(sqe);
    REQUIRE_MESSAGE(read.status().success(), nvme::describe_status(read.status()));
    CHECK(data.download(sgl ? 8192 : 0, 64u * 4096) == f.file.read(slba * 4096, 64u * 4096));
  }
  CHECK(f.device->counters().dma_faults == 0);
}

TEST_CASE("accelerator mode: transfers larger than the bounce buffer move in chunks; MDTS-sized transfers succeed") {
  if (!accelerator_available()) return;
  SUBCASE("no MDTS: a 3 MiB + 8 KiB transfer crosses the 1 MiB bounce buffer three times") {
    libnvm::SoftControllerConfig config = accelerator_config();
    config.max_data_transfer_bytes = 0;
    SoftFixture f(config, 8u << 20, 64u << 10);
    DeviceRegion region(*f.controller, 4u << 20);
    // SGL: one Data Block per page run, no PRP list page limit; start 4 KiB into the region.
    const std::uint32_t nlb = (3u << 20) / 4096 + 2;
    auto area = f.list_area.descriptor_area();
    const auto read = f.run(read_write(f, region.mapping, false, 10, nlb, 4096, true, area));
    REQUIRE_MESSAGE(read.status().success(), nvme::describe_status(read.status()));
    CHECK(region.download(4096, std::uint64_t{nlb} * 4096) == f.file.read(10 * 4096, std::uint64_t{nlb} * 4096));
    const auto fresh = pattern(std::uint64_t{nlb} * 4096, 77);
    region.upload(4096, fresh);
    const auto write = f.run(read_write(f, region.mapping, true, 700, nlb, 4096, true, area));
    REQUIRE(write.status().success());
    CHECK(f.file.read(700 * 4096, fresh.size()) == fresh);
    CHECK(f.device->counters().device_bytes_read == fresh.size());
    CHECK(f.device->counters().device_bytes_written == fresh.size());
  }
  SUBCASE("MDTS 64 KiB: exactly MDTS moves through the 64 KiB bounce buffer, MDTS + 1 LBA is refused") {
    libnvm::SoftControllerConfig config = accelerator_config();
    config.max_data_transfer_bytes = 64u << 10;
    config.worker_threads = 2;
    SoftFixture f(config, 4u << 20, 64u << 10);
    DeviceRegion region(*f.controller, 256u << 10);
    const auto area = f.list_area.descriptor_area();
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{4096 + 512}}) {
      CAPTURE(offset);
      region.fill(0);
      const auto read = f.run(read_write(f, region.mapping, false, 16, 16, offset, false, area));
      REQUIRE_MESSAGE(read.status().success(), nvme::describe_status(read.status()));
      CHECK(region.download(offset, 64u << 10) == f.file.read(16 * 4096, 64u << 10));
      const auto fresh = pattern(64u << 10, static_cast<std::uint32_t>(offset));
      region.upload(offset, fresh);
      REQUIRE(f.run(read_write(f, region.mapping, true, 40, 16, offset, false, area)).status().success());
      CHECK(f.file.read(40 * 4096, fresh.size()) == fresh);
    }
    region.fill(0x5a);
    const auto too_long = f.run(read_write(f, region.mapping, false, 16, 17, 0, false, area));
    CHECK(is_status(too_long, GenericStatus::invalid_field_in_command));
    CHECK(region.download(0, region.buffer.size()) == std::vector<std::uint8_t>(region.buffer.size(), 0x5a));
  }
}

TEST_CASE("accelerator mode: the IOMMU rule holds for device regions; device memory is untouched on a fault") {
  if (!accelerator_available()) return;
  SoftFixture f(accelerator_config(), 4u << 20, 64u << 10);
  DeviceRegion region(*f.controller, 64u << 10);
  region.fill(0x3c);
  const std::vector<std::uint8_t> untouched(region.buffer.size(), 0x3c);
  // Past the end of the region: its last page plus the unmapped guard page after it.
  nvme::SubmissionQueueEntry sqe{};
  sqe.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::read);
  sqe.nsid = 1;
  sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, 1);  // 2 LBAs = 8 KiB
  sqe.data_pointer.prp.prp1 = region.mapping.bus_addresses.back();
  sqe.data_pointer.prp.prp2 = region.mapping.bus_addresses.back() + 4096;
  CHECK(is_status(f.run(sqe), GenericStatus::data_transfer_error));
  CHECK(f.device->counters().dma_faults == 1);
  CHECK(region.download(0, region.buffer.size()) == untouched);
  // The device address itself is not a bus address.
  sqe.cdw12 = nvme::ReadWriteFields::NLB::encode(0, 0);
  sqe.data_pointer.prp.prp1 = reinterpret_cast<std::uint64_t>(region.buffer.data());
  sqe.data_pointer.prp.prp2 = 0;
  CHECK(is_status(f.run(sqe), GenericStatus::data_transfer_error));
  CHECK(f.device->counters().dma_faults == 2);
  // After unmap, the old bus addresses fault and the memory stays as it was.
  const std::uint64_t old_bus = region.mapping.bus_addresses[0];
  REQUIRE(f.controller->dma_unmap(region.mapping.id).is_ok());
  sqe.data_pointer.prp.prp1 = old_bus;
  CHECK(is_status(f.run(sqe), GenericStatus::data_transfer_error));
  CHECK(f.device->counters().dma_faults == 3);
  CHECK(region.download(0, region.buffer.size()) == untouched);
  CHECK(f.device->counters().device_bytes_read == 0);
}

TEST_CASE("accelerator mode: map_device validates its arguments; unmap returns NOT_FOUND and BUSY by the rules") {
  if (!accelerator_available()) return;
  SoftFixture f(accelerator_config(), 4u << 20, 64u << 10);
  auto buffer = accel::DeviceBuffer::allocate(16384);
  REQUIRE(buffer.is_ok());
  auto* base = static_cast<std::uint8_t*>(buffer->data());
  CHECK(f.controller->dma_map_device(nullptr, 4096).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(f.controller->dma_map_device(base, 0).code() == StatusCode::INVALID_ARGUMENT);
  auto misaligned = f.controller->dma_map_device(base + 512, 4096);
  CHECK(misaligned.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(misaligned.status().message().find("device_address") != std::string::npos);
  CHECK(f.controller->dma_map_device(base, 4096 + 512).code() == StatusCode::INVALID_ARGUMENT);
  // A length far past any allocation (a negative size cast to size_t, a wrong unit) is refused by
  // name and limit instead of mapped: commands could otherwise DMA past the real buffer.
  const std::size_t huge = accel::kMaxAllocationBytes + 4096;
  auto too_long = f.controller->dma_map_device(base, huge);
  CHECK(too_long.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(too_long.status().message().find(fmt::format("length = {}", huge)) != std::string::npos);
  CHECK(too_long.status().message().find(fmt::format("{}", accel::kMaxAllocationBytes)) != std::string::npos);
  CHECK(f.controller->dma_map(base, huge).code() == StatusCode::INVALID_ARGUMENT);
  auto mapped = f.controller->dma_map_device(base, 8192);
  REQUIRE(mapped.is_ok());
  CHECK(f.controller->dma_map_device(base + 4096, 8192).code() == StatusCode::INVALID_ARGUMENT);  // overlaps
  CHECK(f.controller->dma_map(base, 4096).code() == StatusCode::INVALID_ARGUMENT);  // same memory, other kind
  CHECK(f.controller->dma_unmap(mapped->id).is_ok());
  CHECK(f.controller->dma_unmap(mapped->id).code() == StatusCode::NOT_FOUND);

  // Queue memory in accelerator mode is mapped host memory reachable at the same address; an I/O
  // queue cannot live in a device region (the workers read SQEs with plain loads).
  auto queue_memory = f.controller->allocate_dma_buffer(64 * 64);
  REQUIRE(queue_memory.is_ok());
  auto device_queue = f.controller->dma_map_device(base, 16384);
  REQUIRE(device_queue.is_ok());
  nvme::SubmissionQueueEntry create{};
  create.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::create_io_completion_queue);
  create.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 9), 63);
  create.cdw11 = nvme::CreateQueueFields::PC::encode(0, 1);
  create.data_pointer.prp.prp1 = device_queue->bus_addresses[0];
  auto refused = f.controller->submit_admin(create, kWait);
  REQUIRE(refused.is_ok());
  CHECK_FALSE(refused->status().success());
  // A CQ in the mapped buffer is accepted, and its region is then BUSY until the queue is deleted.
  create.data_pointer.prp.prp1 = queue_memory->bus_address;
  auto accepted = f.controller->submit_admin(create, kWait);
  REQUIRE(accepted.is_ok());
  REQUIRE_MESSAGE(accepted->status().success(), nvme::describe_status(accepted->status()));
  CHECK(f.controller->free_dma_buffer(queue_memory->id).code() == StatusCode::BUSY);
  nvme::SubmissionQueueEntry remove{};
  remove.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::delete_io_completion_queue);
  remove.cdw10 = nvme::DeleteQueueFields::QID::encode(0, 9);
  auto deleted = f.controller->submit_admin(remove, kWait);
  REQUIRE(deleted.is_ok());
  CHECK(deleted->status().success());
  CHECK(f.controller->free_dma_buffer(queue_memory->id).is_ok());
  CHECK(f.controller->dma_unmap(device_queue->id).is_ok());
}

TEST_CASE("accelerator mode: BAR0 and DMA buffers are mapped memory the accelerator reaches at the same address") {
  if (!accelerator_available()) return;
  SoftFixture f(accelerator_config(), 4u << 20, 64u << 10);
  // The queue the fixture created lives in controller DMA memory: its rings and doorbells are
  // the addresses a kernel would use (checked on a GPU by the gpu suite's soft controller test).
  CHECK(f.io.info.submission_queue != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(f.device->bar0()) % 4096 == 0);
  CHECK(f.device->bar0_size() % 4096 == 0);
  auto buffer = f.controller->allocate_dma_buffer(100);
  REQUIRE(buffer.is_ok());
  CHECK(buffer->length == 4096);
  CHECK(f.device->translate(buffer->bus_address, 4096) == buffer->host_address);
  const auto* bytes = static_cast<const std::uint8_t*>(buffer->host_address);
  CHECK(std::all_of(bytes, bytes + 4096, [](std::uint8_t b) { return b == 0; }));
  CHECK(f.controller->free_dma_buffer(buffer->id).is_ok());
  CHECK(f.controller->allocate_dma_buffer(0).code() == StatusCode::INVALID_ARGUMENT);
}
