// Read, Write, Flush, Write Zeroes, Dataset Management, verified byte for byte against the
// backing file; wrap-around, full queue, many queues from many threads; every I/O error status.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "soft_fixture.hpp"

using namespace tutti;
using namespace tutti::test;
using nvme::GenericStatus;

namespace {
void fill(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 random(seed);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(random());
}
}  // namespace

TEST_CASE("reads and writes move exactly the right bytes, PRP and SGL, both LBA formats, scattered pages") {
  for (std::uint32_t lba : {512u, 4096u})
    for (bool scatter : {false, true})
      for (bool sgl : {false, true}) {
        CAPTURE(lba);
        CAPTURE(scatter);
        CAPTURE(sgl);
        libnvm::SoftControllerConfig config;
        config.lba_size = lba;
        config.scatter_bus_pages = scatter;
        SoftFixture f(config, 4u << 20, 2u << 20);
        std::mt19937 random(lba + scatter * 7 + sgl * 13);
        for (int i = 0; i < 24; ++i) {
          const std::uint32_t nlb = 1 + random() % ((256u * 1024) / lba);
          const std::uint64_t slba = random() % (f.controller->identity().namespace_size_lbas - nlb);
          const std::uint64_t bytes = std::uint64_t{nlb} * lba;
          const std::uint64_t offset = (random() % ((f.region.size - bytes) / 4)) * 4;  // dword aligned
          // Read: region bytes [offset, offset + bytes) equal the file; neighbours untouched.
          std::memset(f.region.data, 0xa5, f.region.size);
          const auto read = f.run(f.read_write(false, slba, nlb, offset, sgl));
          REQUIRE_MESSAGE(read.status().success(), nvme::describe_status(read.status()));
          const auto expected = f.file.read(slba * lba, bytes);
          CHECK(std::memcmp(f.region.data + offset, expected.data(), bytes) == 0);
          if (offset > 0) CHECK(f.region.data[offset - 1] == 0xa5);
          if (offset + bytes < f.region.size) CHECK(f.region.data[offset + bytes] == 0xa5);
          // Write: new bytes land in the file.
          fill(f.region.data + offset, bytes, static_cast<std::uint32_t>(i));
          const auto write = f.run(f.read_write(true, slba, nlb, offset, sgl));
          REQUIRE(write.status().success());
          const auto written = f.file.read(slba * lba, bytes);
          CHECK(std::memcmp(f.region.data + offset, written.data(), bytes) == 0);
        }
        nvme::SubmissionQueueEntry flush{};
        flush.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::flush);
        flush.nsid = 1;
        CHECK(f.run(flush).status().success());
        const auto counters = f.device->counters();
        CHECK(counters.read_commands == 24);
        CHECK(counters.write_commands == 24);
        CHECK(counters.flush_commands == 1);
        CHECK(counters.bytes_read == counters.bytes_written);
        CHECK(counters.errors == 0);
        CHECK(counters.dma_faults == 0);
      }
}

TEST_CASE("FUA writes and Flush with NSID FFFFFFFFh succeed; Flush of another namespace fails") {
  SoftFixture f;
  fill(f.region.data, 4096, 3);
  auto sqe = f.read_write(true, 5, 1, 0);
  sqe.cdw12 = nvme::ReadWriteFields::FUA::encode(sqe.cdw12, 1);
  CHECK(f.run(sqe).status().success());
  CHECK(f.file.read(5 * 4096, 4096) == std::vector<std::uint8_t>(f.region.data, f.region.data + 4096));
  nvme::SubmissionQueueEntry flush{};
  flush.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::flush);
  flush.nsid = 0xffffffffu;
  CHECK(f.run(flush).status().success());
  flush.nsid = 3;
  CHECK(is_status(f.run(flush), GenericStatus::invalid_namespace_or_format));
}

TEST_CASE("Write Zeroes and Dataset Management deallocate make LBAs read as zeroes") {
  for (std::uint32_t lba : {512u, 4096u}) {
    CAPTURE(lba);
    libnvm::SoftControllerConfig config;
    config.lba_size = lba;
    SoftFixture f(config, 1u << 20);
    nvme::SubmissionQueueEntry zeroes{};
    zeroes.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::write_zeroes);
    zeroes.nsid = 1;
    zeroes.cdw10 = 3;
    zeroes.cdw12 = nvme::ReadWriteFields::NLB::encode(0, 4);  // 5 LBAs
    CHECK(f.run(zeroes).status().success());
    CHECK(f.file.read(3 * lba, 5 * lba) == std::vector<std::uint8_t>(5 * lba, 0));
    CHECK(f.file.read(8 * lba, 64) != std::vector<std::uint8_t>(64, 0));  // the neighbouring LBA keeps its random bytes

    auto* ranges = reinterpret_cast<nvme::DatasetManagementRange*>(f.region.data);
    ranges[0] = {0, 2, 20};
    ranges[1] = {0, 3, 40};
    nvme::SubmissionQueueEntry dsm{};
    dsm.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::dataset_management);
    dsm.nsid = 1;
    dsm.cdw10 = nvme::DatasetManagementFields::NR::encode(0, 1);
    dsm.cdw11 = nvme::DatasetManagementFields::AD::encode(0, 1);
    dsm.data_pointer.prp.prp1 = f.mapping.bus_addresses[0];
    CHECK(f.run(dsm).status().success());
    CHECK(f.file.read(20 * lba, 2 * lba) == std::vector<std::uint8_t>(2 * lba, 0));
    CHECK(f.file.read(40 * lba, 3 * lba) == std::vector<std::uint8_t>(3 * lba, 0));
    ranges[1] = {0, 3, f.controller->identity().namespace_size_lbas - 1};
    CHECK(is_status(f.run(dsm), GenericStatus::lba_out_of_range));
    zeroes.cdw10 = static_cast<std::uint32_t>(f.controller->identity().namespace_size_lbas - 2);
    CHECK(is_status(f.run(zeroes), GenericStatus::lba_out_of_range));
    const auto counters = f.device->counters();
    CHECK(counters.write_zeroes_commands == 1);
    CHECK(counters.dataset_management_commands == 1);
  }
}

TEST_CASE("I/O commands report LBA Out of Range, Invalid Namespace, MDTS, opcode and field errors") {
  libnvm::SoftControllerConfig config;
  config.max_data_transfer_bytes = 64 * 1024;
  SoftFixture f(config, 1u << 20);
  const std::uint64_t nsze = f.controller->identity().namespace_size_lbas;
  std::memset(f.region.data, 0x5a, f.region.size);
  CHECK(is_status(f.run(f.read_write(false, nsze, 1, 0)), GenericStatus::lba_out_of_range));
  CHECK(is_status(f.run(f.read_write(false, nsze - 1, 2, 0)), GenericStatus::lba_out_of_range));
  auto huge = f.read_write(false, 0, 1, 0);
  huge.cdw11 = 0xffffffffu;  // SLBA near 2^64: overflow-safe check
  CHECK(is_status(f.run(huge), GenericStatus::lba_out_of_range));
  CHECK(is_status(f.run(f.read_write(false, 0, 17, 0)), GenericStatus::invalid_field_in_command));  // 68 KiB > MDTS
  CHECK(f.run(f.read_write(false, 0, 16, 0)).status().success());                                   // exactly MDTS
  auto ns = f.read_write(false, 0, 1, 0);
  ns.nsid = 2;
  CHECK(is_status(f.run(ns), GenericStatus::invalid_namespace_or_format));
  ns.nsid = 0;
  CHECK(is_status(f.run(ns), GenericStatus::invalid_namespace_or_format));
  auto opcode = f.read_write(false, 0, 1, 0);
  opcode.opcode = 0x7c;
  CHECK(is_status(f.run(opcode), GenericStatus::invalid_command_opcode));
  auto fused = f.read_write(false, 0, 1, 0);
  fused.flags = nvme::SubmissionQueueEntry::Fuse::encode(0, 1);
  CHECK(is_status(f.run(fused), GenericStatus::invalid_field_in_command));
  auto psdt = f.read_write(false, 0, 1, 0);
  psdt.set_data_pointer_kind(nvme::DataPointerKind::reserved);
  CHECK(is_status(f.run(psdt), GenericStatus::invalid_field_in_command));
  psdt.set_data_pointer_kind(nvme::DataPointerKind::sgl_metadata_sgl);
  CHECK(is_status(f.run(psdt), GenericStatus::invalid_field_in_command));
  // None of the failed reads touched memory beyond the one successful read of 64 KiB at 0.
  for (std::size_t i = 64 * 1024; i < f.region.size; i += 997) REQUIRE(f.region.data[i] == 0x5a);
  const auto counters = f.device->counters();
  CHECK(counters.errors == 10);
  CHECK(counters.errors_by_status.at(nvme::make_status(GenericStatus::lba_out_of_range, true).raw) == 3);
}

TEST_CASE("PRP errors: PRP Offset Invalid for misaligned PRP1, PRP2 and list entries") {
  SoftFixture f;
  auto sqe = f.read_write(false, 0, 1, 0);
  sqe.data_pointer.prp.prp1 += 2;  // not dword aligned
  CHECK(is_status(f.run(sqe), GenericStatus::prp_offset_invalid));
  sqe = f.read_write(false, 0, 2, 0);
  sqe.data_pointer.prp.prp2 += 512;  // second page with an offset
  CHECK(is_status(f.run(sqe), GenericStatus::prp_offset_invalid));
  sqe = f.read_write(false, 0, 4, 0);  // needs a list
  static_cast<std::uint64_t*>(f.list_area.host_address)[1] += 8;
  CHECK(is_status(f.run(sqe), GenericStatus::prp_offset_invalid));
  sqe = f.read_write(false, 0, 4, 0);
  sqe.data_pointer.prp.prp2 += 4;  // list pointer not qword aligned
  CHECK(is_status(f.run(sqe), GenericStatus::prp_offset_invalid));
}

TEST_CASE("SGL errors: descriptor types, segment descriptors, lengths and descriptor counts") {
  libnvm::SoftControllerConfig config;
  config.max_sgl_descriptors = 64;
  config.scatter_bus_pages = true;  // many data blocks
  SoftFixture f(config);
  auto* segment = static_cast<nvme::SglDescriptor*>(f.list_area.host_address);
  const std::uint64_t area = f.list_area.bus_address;
  auto sqe = f.read_write(false, 0, 1, 0, true);
  const nvme::SglDescriptor block = sqe.data_pointer.sgl1;
  REQUIRE(block.type() == nvme::SglDescriptorType::data_block);

  auto with = [&](nvme::SglDescriptor sgl1) {
    auto s = sqe;
    s.data_pointer.sgl1 = sgl1;
    return f.run(s);
  };
  auto bucket = block;
  bucket.identifier = nvme::SglDescriptor::Type::encode(0, 1);
  CHECK(is_status(with(bucket), GenericStatus::sgl_descriptor_type_invalid));
  auto keyed = block;
  keyed.identifier = nvme::SglDescriptor::Type::encode(0, 4);
  CHECK(is_status(with(keyed), GenericStatus::sgl_descriptor_type_invalid));
  auto subtype = block;
  subtype.identifier = nvme::SglDescriptor::Subtype::encode(block.identifier, 1);
  CHECK(is_status(with(subtype), GenericStatus::sgl_descriptor_type_invalid));
  auto short_block = block;
  short_block.length -= 1;
  CHECK(is_status(with(short_block), GenericStatus::data_sgl_length_invalid));
  auto long_block = block;
  long_block.length += 1;
  CHECK(is_status(with(long_block), GenericStatus::data_sgl_length_invalid));

  // Segments.
  segment[0] = block;
  CHECK(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area, 16)).status().success());
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area, 17)),
                  GenericStatus::invalid_sgl_segment_descriptor));
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area, 0)),
                  GenericStatus::invalid_sgl_segment_descriptor));
  // A Segment without a pointer at its end.
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::segment, area, 16)),
                  GenericStatus::invalid_sgl_segment_descriptor));
  // A segment pointer inside a Last Segment.
  segment[1] = nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area, 16);
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area, 32)),
                  GenericStatus::invalid_sgl_segment_descriptor));
  // A pointer that is not the last descriptor of its Segment.
  segment[0] = nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area + 32, 16);
  segment[1] = block;
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::segment, area, 32)),
                  GenericStatus::invalid_sgl_segment_descriptor));
  // A Segment that points to itself forever: bounded by max_sgl_descriptors.
  segment[0] = nvme::SglDescriptor::make(nvme::SglDescriptorType::segment, area, 16);
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::segment, area, 16)),
                  GenericStatus::invalid_number_of_sgl_descriptors));
  // Data blocks summing to more than the transfer inside a segment.
  segment[0] = block;
  segment[1] = block;
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, area, 32)),
                  GenericStatus::data_sgl_length_invalid));
  // Segment list itself unmapped: Data Transfer Error, counted as a DMA fault.
  const auto faults = f.device->counters().dma_faults;
  CHECK(is_status(with(nvme::SglDescriptor::make(nvme::SglDescriptorType::last_segment, 0x5000, 16)),
                  GenericStatus::data_transfer_error));
  CHECK(f.device->counters().dma_faults == faults + 1);
}

TEST_CASE("DMA outside registered regions fails with Data Transfer Error and never touches memory") {
  SoftFixture f;
  AlignedBuffer unregistered(64 * 1024);
  std::memset(unregistered.data, 0x3c, unregistered.size);
  const auto before = f.device->counters();
  // A host pointer used as a bus address.
  auto sqe = f.read_write(false, 0, 1, 0);
  sqe.data_pointer.prp.prp1 = reinterpret_cast<std::uint64_t>(unregistered.data);
  CHECK(is_status(f.run(sqe), GenericStatus::data_transfer_error));
  // A transfer that starts inside the region and runs past its end (region is 4 MiB).
  std::memset(f.region.data, 0x77, f.region.size);
  auto tail = f.read_write(false, 0, 1, 0);
  tail.cdw12 = nvme::ReadWriteFields::NLB::encode(0, 1);  // 2 LBAs
  tail.data_pointer.prp.prp1 = f.mapping.bus_addresses.back();
  tail.data_pointer.prp.prp2 = f.mapping.bus_addresses.back() + 4096;  // guard page after the window
  CHECK(is_status(f.run(tail), GenericStatus::data_transfer_error));
  CHECK(f.region.data[f.region.size - 1] == 0x77);  // the mapped first page was not written either
  CHECK(f.region.data[f.region.size - 4096] == 0x77);
  // After unmapping, the same command fails too.
  auto good = f.read_write(false, 0, 1, 0);
  REQUIRE(f.controller->dma_unmap(f.mapping.id).is_ok());
  CHECK(is_status(f.run(good), GenericStatus::data_transfer_error));
  for (std::size_t i = 0; i < unregistered.size; ++i) REQUIRE(unregistered.data[i] == 0x3c);
  CHECK(f.region.data[0] == 0x77);
  const auto after = f.device->counters();
  CHECK(after.dma_faults == before.dma_faults + 3);
  CHECK(after.bytes_read == before.bytes_read);
}

TEST_CASE("null mode completes after full validation and moves no data") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  SoftFixture f(config, 1u << 20);
  std::memset(f.region.data, 0x11, 8192);
  CHECK(f.run(f.read_write(false, 0, 2, 0)).status().success());
  CHECK(f.region.data[0] == 0x11);
  CHECK(f.region.data[8191] == 0x11);
  CHECK(f.run(f.read_write(true, 3, 2, 0, true)).status().success());
  CHECK(is_status(f.run(f.read_write(false, 1u << 20, 1, 0)), GenericStatus::lba_out_of_range));
  auto bad = f.read_write(false, 0, 1, 0);
  bad.data_pointer.prp.prp1 = 0x1000;
  CHECK(is_status(f.run(bad), GenericStatus::data_transfer_error));
  const auto counters = f.device->counters();
  CHECK(counters.read_commands == 1);
  CHECK(counters.write_commands == 1);
  CHECK(counters.bytes_read == 0);
  CHECK(counters.bytes_written == 0);
}

TEST_CASE("SQ and CQ wrap around many times with phase flips on a depth-4 queue") {
  SoftFixture f({}, 1u << 20, 1u << 20, 4);
  for (int i = 0; i < 103; ++i) {
    const auto cqe = f.run(
        f.read_write(i % 2 == 0, static_cast<std::uint64_t>(i % 200), 1, 4096 * static_cast<std::uint64_t>(i % 8)));
    REQUIRE(cqe.status().success());
    REQUIRE(cqe.sq_identifier == f.io.info.qid);
  }
  const nvme::QueuePairState stats = f.io.storage->statistics();
  CHECK(stats.completions_reaped == 103);
  CHECK(stats.cq_head == 103 % 4);
  CHECK(stats.cq_phase == ((103 / 4) % 2 == 0 ? 1u : 0u));
  CHECK(stats.sq_head_ticket == 103);
  CHECK(stats.stale_completions == 0);
  CHECK(stats.invalid_completions == 0);
}

TEST_CASE("a full SQ refuses reservations without blocking and accepts them again after completions") {
  SoftFixture f({}, 1u << 20, 1u << 20, 8);
  const nvme::QueuePair& q = f.io.queue();
  // Hold the controller off by injecting lost completions? No: reserve without ringing the doorbell.
  std::uint64_t first = 0;
  REQUIRE(q.reserve_submission_slots(7, first));
  std::uint64_t more = 0;
  CHECK_FALSE(q.reserve_submission_slots(1, more));
  CHECK_FALSE(q.reserve_submission_slots(8, more));
  std::vector<std::uint16_t> cids(7);
  for (std::uint32_t i = 0; i < 7; ++i) {
    REQUIRE(q.allocate_command_identifier(cids[i]));
    auto sqe = f.read_write(false, i, 1, 4096 * i);
    sqe.command_identifier = cids[i];
    q.write_submission(first + i, sqe);
  }
  CHECK(q.ring_submission_doorbell() == 7);
  for (std::uint16_t cid : cids) CHECK(q.wait_for_completion(cid, kWait).completion.status().success());
  CHECK(q.reserve_submission_slots(7, more));
  CHECK(more == 7);
}

TEST_CASE("many queues from many threads at once, and two threads sharing one queue") {
  libnvm::SoftControllerConfig config;
  config.worker_threads = 2;
  SoftFixture f(config, 8u << 20, 4u << 20, 32);
  constexpr int kThreads = 4;
  std::vector<IoQueue> queues;
  for (int t = 0; t < kThreads; ++t) queues.push_back(make_io_queue(*f.controller, 32));
  std::atomic<int> failures{0};
  auto worker = [&](const nvme::QueuePair& q, int t, int slice) {
    // Each thread writes then reads back its own 16 LBAs, 1 LBA per command, QD up to 8.
    const std::uint64_t first_lba = static_cast<std::uint64_t>(slice) * 64;
    std::uint8_t* memory = f.region.data + static_cast<std::size_t>(slice) * 64 * 4096;
    fill(memory, 16 * 4096, static_cast<std::uint32_t>(t + 100));
    for (int phase = 0; phase < 2; ++phase) {
      std::vector<std::uint16_t> pending;
      for (int i = 0; i < 16; ++i) {
        auto sqe =
            f.read_write(phase == 0, first_lba + i, 1,
                         static_cast<std::uint64_t>(slice) * 64 * 4096 + (phase == 1 ? 32 * 4096 : 0) + i * 4096);
        std::uint16_t cid = 0;
        if (!q.allocate_command_identifier(cid)) {
          ++failures;
          return;
        }
        sqe.command_identifier = cid;
        while (q.submit(sqe) != StatusCode::OK) q.reap_completions();
        pending.push_back(cid);
        if (pending.size() == 8 || i == 15) {
          for (std::uint16_t c : pending)
            if (!q.wait_for_completion(c, kWait).completion.status().success()) ++failures;
          pending.clear();
        }
      }
    }
    if (std::memcmp(memory, memory + 32 * 4096, 16 * 4096) != 0) ++failures;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, std::cref(queues[t].queue()), t, t);
  // Two more threads share the fixture's queue: doorbell writes coalesce across them.
  threads.emplace_back(worker, std::cref(f.io.queue()), 10, 4);
  threads.emplace_back(worker, std::cref(f.io.queue()), 11, 5);
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  const auto shared = f.io.storage->statistics();
  CHECK(shared.completions_reaped == 64);
  CHECK(shared.doorbell_writes <= 64);
  CHECK(shared.stale_completions == 0);
  CHECK(f.device->counters().errors == 0);
}

TEST_CASE("invalid doorbell values are ignored and counted") {
  SoftFixture f({}, 1u << 20, 1u << 20, 8);
  accel::mmio_store32(f.io.info.submission_queue_tail_doorbell, 9);  // >= depth
  const std::uint64_t deadline = accel::deadline_after(kWait);
  while (f.device->counters().invalid_doorbell_writes == 0 && accel::timer_ns() < deadline) accel::shim::yield_thread();
  CHECK(f.device->counters().invalid_doorbell_writes == 1);
  accel::mmio_store32(f.io.info.submission_queue_tail_doorbell, 0);  // back to the true tail
  CHECK(f.run(f.read_write(false, 0, 1, 0)).status().success());
}

TEST_CASE("the SMART / Health log page reports the command and data unit counters") {
  SoftFixture f;
  for (int i = 0; i < 3; ++i) REQUIRE(f.run(f.read_write(false, 0, 64, 0)).status().success());  // 3 x 256 KiB
  nvme::SubmissionQueueEntry log{};
  log.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::get_log_page);
  log.data_pointer.prp.prp1 = f.list_area.bus_address;
  log.cdw10 = nvme::GetLogPageFields::NUMDL::encode(nvme::GetLogPageFields::LID::encode(0, 2), 127);
  auto done = f.controller->submit_admin(log, kWait);
  REQUIRE(done.is_ok());
  REQUIRE(done->status().success());
  nvme::SmartHealthLog page{};
  std::memcpy(&page, f.list_area.host_address, sizeof page);
  CHECK(page.host_read_commands[0] == 3);
  CHECK(page.data_units_read[0] == (3u * 256 * 1024 / 512 + 999) / 1000);
}
