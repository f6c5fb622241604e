// Bring-up, Identify, queue creation and deletion, registers and DMA mapping rules.
#include <doctest/doctest.h>

#include <tutti/accel/primitives.hpp>

#include "soft_fixture.hpp"

using namespace tutti;
using namespace tutti::test;

TEST_CASE("soft controller defaults are the documented constants") {
  const libnvm::SoftControllerConfig config;
  CHECK(config.lba_size == 4096);
  CHECK(config.max_queue_entries == 1024);
  CHECK(config.max_io_queue_pairs == 64);
  CHECK(config.max_data_transfer_bytes == 1u << 20);
  CHECK(config.worker_threads == 1);
  CHECK(config.idle_sleep_max_ns == 100'000);
  CHECK(config.max_sgl_descriptors == 8192);
  CHECK(config.doorbell_stride == 0);
  CHECK_FALSE(config.null_mode);
  CHECK_FALSE(config.scatter_bus_pages);
  const libnvm::BringUpOptions options;
  CHECK(options.admin_queue_depth == 32);
  CHECK(options.nsid == 1);
}

TEST_CASE("invalid soft controller configurations are rejected with the field named") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 16;
  config.lba_size = 1024;
  auto r = libnvm::SoftController::create(config);
  CHECK(r.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(r.status().message().find("lba_size") != std::string::npos);
  config.lba_size = 512;
  config.max_data_transfer_bytes = 5000;
  CHECK(libnvm::SoftController::create(config).code() == StatusCode::INVALID_ARGUMENT);
  config.max_data_transfer_bytes = 0;
  config.namespace_size_lbas = 0;
  CHECK(libnvm::SoftController::create(config).code() == StatusCode::INVALID_ARGUMENT);
  libnvm::SoftControllerConfig missing;
  missing.backing_path = "/nonexistent/tutti-soft-backing";
  CHECK(libnvm::SoftController::create(missing).code() == StatusCode::NOT_FOUND);
}

TEST_CASE("bring-up reports identity from Identify Controller and Identify Namespace") {
  for (std::uint32_t lba : {512u, 4096u}) {
    CAPTURE(lba);
    libnvm::SoftControllerConfig config;
    config.lba_size = lba;
    config.max_data_transfer_bytes = 256 * 1024;
    SoftFixture f(config, 8u << 20);
    const libnvm::ControllerIdentity& id = f.controller->identity();
    CHECK(f.controller->kind() == "soft");
    CHECK(id.lba_size == lba);
    CHECK(id.namespace_size_lbas == (8u << 20) / lba);
    CHECK(id.max_data_transfer_bytes == 256 * 1024);
    CHECK(id.max_queue_entries == 1024);
    CHECK(id.io_submission_queues_allocated == 16);
    CHECK(id.number_of_namespaces == 1);
    CHECK(id.sgl_supported);
    CHECK(id.write_zeroes_supported);
    CHECK(id.dataset_management_supported);
    CHECK(id.volatile_write_cache);
    CHECK(id.model_number == "Tutti soft NVMe controller");
    CHECK(id.serial_number == "TUTTISOFT0001");
    CHECK(id.namespace_data.nlbaf == 1);
    CHECK(id.namespace_data.lba_format_index() == (lba == 4096 ? 1u : 0u));
    CHECK(id.controller.ver == nvme::kVersion2_0.raw);
    CHECK(f.controller->controller_status().ready());
    CHECK_FALSE(f.controller->controller_status().fatal());
  }
}

TEST_CASE("bring-up of a namespace that does not exist fails with INVALID_ARGUMENT") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  auto device = libnvm::SoftController::create(config);
  REQUIRE(device.is_ok());
  auto controller = libnvm::open_soft_controller(*device);
  REQUIRE(controller.is_ok());
  libnvm::BringUpOptions options;
  options.nsid = 2;
  CHECK((*controller)->bring_up(options).code() == StatusCode::INVALID_ARGUMENT);
  options.nsid = 1;
  CHECK((*controller)->bring_up(options).is_ok());
}

TEST_CASE("I/O queue pairs are created up to the allocated number and deleted") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  config.max_io_queue_pairs = 4;
  config.worker_threads = 2;
  SoftFixture f(config);
  CHECK(f.controller->identity().io_submission_queues_allocated == 4);
  std::vector<libnvm::QueuePairInfo> pairs;
  for (int i = 0; i < 3; ++i) {
    auto pair = f.controller->create_io_queue_pair(16);
    REQUIRE(pair.is_ok());
    CHECK(pair->qid == i + 2);
    CHECK(pair->depth == 16);
    CHECK(reinterpret_cast<std::uintptr_t>(pair->submission_queue) % 4096 == 0);
    pairs.push_back(*pair);
  }
  CHECK(f.controller->create_io_queue_pair(16).code() == StatusCode::RESOURCE_EXHAUSTED);
  CHECK(f.controller->create_io_queue_pair(1).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(f.controller->create_io_queue_pair(1025).code() == StatusCode::INVALID_ARGUMENT);
  CHECK(f.controller->delete_io_queue_pair(3).is_ok());
  CHECK(f.controller->delete_io_queue_pair(3).code() == StatusCode::NOT_FOUND);
  auto again = f.controller->create_io_queue_pair(1024);
  REQUIRE(again.is_ok());
  CHECK(again->qid == 3);
  // The re-created queue works (phase starts at 1 again on fresh memory).
  nvme::QueuePairStorage storage(again->submission_queue, again->completion_queue,
                                 again->submission_queue_tail_doorbell, again->completion_queue_head_doorbell,
                                 again->controller_status, again->depth, again->qid);
  nvme::SubmissionQueueEntry flush{};
  flush.opcode = static_cast<std::uint8_t>(nvme::NvmOpcode::flush);
  flush.nsid = 1;
  CHECK(f.run(flush, &storage.queue()).status().success());
}

TEST_CASE("a region holding a live queue cannot be unmapped, memory stays valid") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  SoftFixture f(config);
  // The I/O SQ lives in a DmaBuffer the driver allocated: the device refuses to unmap it.
  const std::uint64_t sq_bus = f.io.info.submission_queue_bus_address;
  CHECK(f.device->translate(sq_bus, 64) == f.io.info.submission_queue);
  // Find the mapping id through a fresh map attempt of overlapping memory: INVALID_ARGUMENT.
  auto overlapping = f.controller->dma_map(f.region.data, 4096);
  CHECK(overlapping.code() == StatusCode::INVALID_ARGUMENT);
  auto misaligned = f.controller->dma_map(f.region.data + 1, 4096);
  CHECK(misaligned.code() == StatusCode::INVALID_ARGUMENT);
  CHECK(f.controller->dma_unmap(999999).code() == StatusCode::NOT_FOUND);
  CHECK(f.controller->dma_unmap(f.mapping.id).is_ok());
  CHECK(f.controller->dma_unmap(f.mapping.id).code() == StatusCode::NOT_FOUND);
}

TEST_CASE("queue memory in a caller mapping makes unmap return BUSY until the queue is deleted") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  SoftFixture f(config);
  AlignedBuffer queue_memory(2 * 4096);
  auto mapped = f.controller->dma_map(queue_memory.data, queue_memory.size);
  REQUIRE(mapped.is_ok());
  nvme::SubmissionQueueEntry create_cq{};
  create_cq.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::create_io_completion_queue);
  create_cq.data_pointer.prp.prp1 = mapped->bus_addresses[0];
  create_cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 9), 15);
  create_cq.cdw11 = nvme::CreateQueueFields::PC::encode(0, 1);
  auto done = f.controller->submit_admin(create_cq, kWait);
  REQUIRE(done.is_ok());
  REQUIRE(done->status().success());
  CHECK(f.controller->dma_unmap(mapped->id).code() == StatusCode::BUSY);
  nvme::SubmissionQueueEntry delete_cq{};
  delete_cq.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::delete_io_completion_queue);
  delete_cq.cdw10 = 9;
  done = f.controller->submit_admin(delete_cq, kWait);
  REQUIRE(done.is_ok());
  CHECK(done->status().success());
  CHECK(f.controller->dma_unmap(mapped->id).is_ok());
}

TEST_CASE("shutdown reports CSTS.SHST complete and bring-up works again afterwards") {
  libnvm::SoftControllerConfig config;
  SoftFixture f(config);
  CHECK(f.controller->shutdown(kWait).is_ok());
  CHECK(nvme::ControllerStatus::SHST::decode(f.controller->controller_status().raw) == nvme::kShutdownStatusComplete);
  CHECK(f.controller->bring_up(libnvm::BringUpOptions{}).is_ok());
  auto pair = f.controller->create_io_queue_pair(8);
  CHECK(pair.is_ok());
}

TEST_CASE("a torn admin queue configuration sets CSTS.CFS and bring-up reports DEVICE_ERROR") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 64;
  auto device = libnvm::SoftController::create(config);
  REQUIRE(device.is_ok());
  volatile std::uint32_t* bar = (*device)->bar0();
  // ASQ points nowhere mapped: enabling must fail closed with CFS, not crash.
  accel::mmio_store32(bar + 0x24 / 4, 0x000f000f);
  accel::mmio_store32(bar + 0x28 / 4, 0x1000);
  accel::mmio_store32(bar + 0x2c / 4, 0);
  accel::mmio_store32(bar + 0x30 / 4, 0x2000);
  accel::mmio_store32(bar + 0x34 / 4, 0);
  accel::mmio_store32(bar + 0x14 / 4, 0x00460001);
  const std::uint64_t deadline = accel::deadline_after(kWait);
  while (!nvme::ControllerStatus{accel::mmio_load32(bar + 0x1c / 4)}.fatal() && accel::timer_ns() < deadline)
    accel::shim::yield_thread();
  CHECK(nvme::ControllerStatus{accel::mmio_load32(bar + 0x1c / 4)}.fatal());
  CHECK((*device)->counters().dma_faults >= 1);
  // The driver's bring-up resets (clears CFS) and succeeds on a proper configuration.
  auto controller = libnvm::open_soft_controller(*device);
  REQUIRE(controller.is_ok());
  const Status up = (*controller)->bring_up(libnvm::BringUpOptions{});
  CHECK_MESSAGE(up.is_ok(), up.to_string());
}

TEST_CASE("admin commands report the specification's status codes") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  config.max_queue_entries = 64;
  SoftFixture f(config, 1u << 20, 1u << 20, 16);
  auto admin = [&](const nvme::SubmissionQueueEntry& sqe) {
    auto done = f.controller->submit_admin(sqe, kWait);
    REQUIRE(done.is_ok());
    return *done;
  };
  using CS = nvme::CommandSpecificStatus;
  nvme::SubmissionQueueEntry sqe{};
  sqe.opcode = 0x7f;
  CHECK(is_status(admin(sqe), nvme::GenericStatus::invalid_command_opcode));

  nvme::SubmissionQueueEntry cq{};
  cq.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::create_io_completion_queue);
  cq.data_pointer.prp.prp1 = f.list_area.bus_address;
  cq.cdw11 = nvme::CreateQueueFields::PC::encode(0, 1);
  cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 0), 7);
  CHECK(is_status(admin(cq), CS::invalid_queue_identifier));  // QID 0
  cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 17), 7);
  CHECK(is_status(admin(cq), CS::invalid_queue_identifier));  // beyond the allocated 16
  cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 1), 7);
  CHECK(is_status(admin(cq), CS::invalid_queue_identifier));  // exists
  cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 5), 64);
  CHECK(is_status(admin(cq), CS::invalid_queue_size));  // 65 > MQES + 1
  cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 5), 0);
  CHECK(is_status(admin(cq), CS::invalid_queue_size));  // 1 entry
  cq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 5), 7);
  cq.cdw11 = 0;
  CHECK(is_status(admin(cq), nvme::GenericStatus::invalid_field_in_command));  // PC = 0, CAP.CQR = 1
  cq.cdw11 = nvme::CreateQueueFields::PC::encode(0, 1);
  cq.data_pointer.prp.prp1 = f.list_area.bus_address + 8;
  CHECK(is_status(admin(cq), nvme::GenericStatus::prp_offset_invalid));
  cq.data_pointer.prp.prp1 = 0x2000;  // not mapped
  CHECK(is_status(admin(cq), nvme::GenericStatus::data_transfer_error));
  cq.data_pointer.prp.prp1 = f.list_area.bus_address;
  cq.cdw11 = nvme::CreateQueueFields::IV::encode(nvme::CreateQueueFields::IEN::encode(cq.cdw11, 1), 3);
  CHECK(is_status(admin(cq), CS::invalid_interrupt_vector));

  nvme::SubmissionQueueEntry sq{};
  sq.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::create_io_submission_queue);
  sq.data_pointer.prp.prp1 = f.list_area.bus_address;
  sq.cdw10 = nvme::CreateQueueFields::QSIZE::encode(nvme::CreateQueueFields::QID::encode(0, 5), 7);
  sq.cdw11 = nvme::CreateQueueFields::CQID::encode(nvme::CreateQueueFields::PC::encode(0, 1), 6);
  CHECK(is_status(admin(sq), CS::completion_queue_invalid));

  nvme::SubmissionQueueEntry del{};
  del.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::delete_io_completion_queue);
  del.cdw10 = 1;
  CHECK(is_status(admin(del), CS::invalid_queue_deletion));  // SQ 1 still uses CQ 1
  del.cdw10 = 12;
  CHECK(is_status(admin(del), CS::invalid_queue_identifier));
  del.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::delete_io_submission_queue);
  CHECK(is_status(admin(del), CS::invalid_queue_identifier));

  nvme::SubmissionQueueEntry features{};
  features.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::set_features);
  features.cdw10 = static_cast<std::uint32_t>(nvme::FeatureIdentifier::number_of_queues);
  CHECK(is_status(admin(features), nvme::GenericStatus::command_sequence_error));  // I/O queues exist
  features.cdw10 = 0x42;
  CHECK(is_status(admin(features), nvme::GenericStatus::invalid_field_in_command));
  features.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::get_features);
  features.cdw10 = static_cast<std::uint32_t>(nvme::FeatureIdentifier::number_of_queues);
  const auto got = admin(features);
  CHECK(got.status().success());
  CHECK(nvme::NumberOfQueuesFields::NSQR::decode(got.dw0) == 15);

  nvme::SubmissionQueueEntry log{};
  log.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::get_log_page);
  log.data_pointer.prp.prp1 = f.list_area.bus_address;
  log.cdw10 = nvme::GetLogPageFields::NUMDL::encode(nvme::GetLogPageFields::LID::encode(0, 0x7e), 127);
  CHECK(is_status(admin(log), CS::invalid_log_page));
  log.cdw10 = nvme::GetLogPageFields::NUMDL::encode(nvme::GetLogPageFields::LID::encode(0, 2), 127);
  CHECK(admin(log).status().success());

  nvme::SubmissionQueueEntry identify{};
  identify.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::identify);
  identify.data_pointer.prp.prp1 = f.list_area.bus_address;
  identify.cdw10 = 0x55;
  CHECK(is_status(admin(identify), nvme::GenericStatus::invalid_field_in_command));  // CNS
  identify.cdw10 = 0;
  identify.nsid = 7;
  CHECK(is_status(admin(identify), nvme::GenericStatus::invalid_namespace_or_format));
  identify.cdw10 = 1;
  identify.set_data_pointer_kind(nvme::DataPointerKind::sgl_contiguous_metadata);
  CHECK(is_status(admin(identify), nvme::GenericStatus::invalid_field_in_command));  // admin commands use PRPs
  identify.set_data_pointer_kind(nvme::DataPointerKind::prp);
  identify.data_pointer.prp.prp1 = 0x3000;  // unmapped: IOMMU rule
  const auto before = f.device->counters().dma_faults;
  CHECK(is_status(admin(identify), nvme::GenericStatus::data_transfer_error));
  CHECK(f.device->counters().dma_faults == before + 1);
  identify.cdw10 = 2;  // active namespace list
  identify.nsid = 0;
  identify.data_pointer.prp.prp1 = f.list_area.bus_address;
  CHECK(admin(identify).status().success());
  CHECK(static_cast<std::uint32_t*>(f.list_area.host_address)[0] == 1);
  CHECK(f.device->counters().errors_by_status.size() >= 10);
}

TEST_CASE("regression: a re-created queue pair starts from doorbell 0 even after its QID was used") {
  libnvm::SoftControllerConfig config;
  config.null_mode = true;
  config.namespace_size_lbas = 1024;
  SoftFixture f(config, 1u << 20, 1u << 20, 8);
  // One command leaves CQ head doorbell 1: for a fresh CQ at tail 0 that reads as "full".
  REQUIRE(f.run(f.read_write(false, 0, 1, 0)).status().success());
  REQUIRE(accel::mmio_load32(f.io.info.completion_queue_head_doorbell) == 1);
  const std::uint16_t qid = f.io.info.qid;
  f.io.storage.reset();
  REQUIRE(f.controller->delete_io_queue_pair(qid).is_ok());
  f.io = make_io_queue(*f.controller, 8);
  REQUIRE(f.io.info.qid == qid);
  for (int i = 0; i < 20; ++i) REQUIRE(f.run(f.read_write(false, 0, 1, 0)).status().success());
}
