// Spec structures: sizes, offsets, named fields, status names and the classification.
#include <doctest/doctest.h>

#include <cstddef>

#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/identify.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/registers.hpp>
#include <tutti/nvme/status.hpp>

using namespace tutti::nvme;

TEST_CASE("wire structures have the sizes and offsets of the specification") {
  CHECK(sizeof(SubmissionQueueEntry) == 64);
  CHECK(alignof(SubmissionQueueEntry) == 64);
  CHECK(sizeof(CompletionQueueEntry) == 16);
  CHECK(sizeof(SglDescriptor) == 16);
  CHECK(sizeof(IdentifyController) == 4096);
  CHECK(sizeof(IdentifyNamespace) == 4096);
  CHECK(sizeof(ControllerRegisters) == 0x1000);
  CHECK(offsetof(ControllerRegisters, cc) == 0x14);
  CHECK(offsetof(ControllerRegisters, csts) == 0x1c);
  CHECK(offsetof(ControllerRegisters, aqa) == 0x24);
  CHECK(offsetof(ControllerRegisters, asq) == 0x28);
  CHECK(offsetof(ControllerRegisters, acq) == 0x30);
  CHECK(offsetof(SubmissionQueueEntry, data_pointer) == 24);
  CHECK(offsetof(SubmissionQueueEntry, cdw10) == 40);
  CHECK(offsetof(IdentifyController, mdts) == 77);
  CHECK(offsetof(IdentifyController, sgls) == 536);
  CHECK(offsetof(IdentifyNamespace, lbaf) == 128);
  CHECK(sizeof(DatasetManagementRange) == 16);
}

TEST_CASE("SQE fields encode where the specification puts them") {
  SubmissionQueueEntry sqe{};
  sqe.opcode = 0x02;
  sqe.command_identifier = 0xbeef;
  sqe.set_data_pointer_kind(DataPointerKind::sgl_contiguous_metadata);
  sqe.flags = SubmissionQueueEntry::Fuse::encode(sqe.flags, 2);
  std::uint32_t cdw0 = 0;
  std::memcpy(&cdw0, &sqe, 4);
  CHECK((cdw0 & 0xff) == 0x02);      // OPC 7:0
  CHECK(((cdw0 >> 8) & 0x3) == 2);   // FUSE 9:8
  CHECK(((cdw0 >> 14) & 0x3) == 1);  // PSDT 15:14
  CHECK((cdw0 >> 16) == 0xbeef);     // CID 31:16
  sqe.cdw10 = 0x11223344;
  sqe.cdw11 = 0x55667788;
  CHECK(starting_lba(sqe) == 0x5566778811223344ull);
  sqe.cdw12 = ReadWriteFields::NLB::encode(0, 0xffff);
  CHECK(number_of_logical_blocks(sqe) == 65536);
}

TEST_CASE("CQE dword 3 carries CID and status with the phase tag in bit 16") {
  CompletionQueueEntry cqe{};
  cqe.dw3 = CompletionQueueEntry::make_dw3(0x1234, StatusField::make(0, 0x80, true, 1));
  CHECK(cqe.command_identifier() == 0x1234);
  CHECK(cqe.status().phase() == 1);
  CHECK(cqe.status().status_code() == 0x80);
  CHECK(cqe.status().status_code_type() == 0);
  CHECK(cqe.status().do_not_retry());
  CHECK(((cqe.dw3 >> 16) & 1) == 1);        // P
  CHECK(((cqe.dw3 >> 17) & 0xff) == 0x80);  // SC
  CHECK((cqe.dw3 >> 31) == 1);              // DNR
  CHECK(cqe.status().without_phase() == (cqe.status().raw & 0xfffe));
}

TEST_CASE("register fields decode CAP, CC, CSTS and AQA") {
  ControllerCapabilities cap{0};
  cap.raw = ControllerCapabilities::MQES::encode(cap.raw, 1023);
  cap.raw = ControllerCapabilities::DSTRD::encode(cap.raw, 2);
  cap.raw = ControllerCapabilities::TO::encode(cap.raw, 4);
  CHECK(cap.max_queue_entries() == 1024);
  CHECK(cap.doorbell_stride_bytes() == 16);
  CHECK(cap.timeout_ns() == 2'000'000'000ull);
  CHECK(cap.memory_page_size_minimum() == 4096);
  CHECK(((cap.raw >> 32) & 0xf) == 2);
  ControllerStatus csts{0xffffffffu};
  CHECK(csts.device_gone());
  CHECK(csts.fatal());
  CHECK_FALSE(csts.ready());
  csts.raw = 0x3;
  CHECK(csts.fatal());
  CHECK(csts.ready());
  std::uint32_t cc = ControllerConfiguration::IOSQES::encode(0, 6);
  cc = ControllerConfiguration::IOCQES::encode(cc, 4);
  CHECK(cc == 0x00460000u);
  CHECK(submission_queue_tail_doorbell_offset(5, 0) == 0x1000 + 40);
  CHECK(completion_queue_head_doorbell_offset(5, 1) == 0x1000 + 11 * 8);
  CHECK(Version::make(2, 0, 0).raw == 0x00020000u);
}

TEST_CASE("Identify helpers decode FLBAS, LBA formats and MDTS") {
  IdentifyNamespace ns{};
  ns.nlbaf = 1;
  ns.lbaf[0] = LbaFormat::make(9);
  ns.lbaf[1] = LbaFormat::make(12);
  ns.flbas = IdentifyNamespace::Flbas::FormatIndexLow::encode(0, 1);
  CHECK(ns.lba_size_bytes() == 4096);
  ns.flbas = 0;
  CHECK(ns.lba_size_bytes() == 512);
  ns.flbas = IdentifyNamespace::Flbas::FormatIndexLow::encode(0, 5);  // beyond NLBAF
  CHECK(ns.lba_size_bytes() == 0);
  IdentifyController c{};
  c.mdts = 5;
  CHECK(c.max_data_transfer_bytes(4096) == 128 * 1024);
  c.mdts = 0;
  CHECK(c.max_data_transfer_bytes(4096) == 0);
  c.sgls = 1;
  CHECK(c.sgl_supported());
}

TEST_CASE("status codes have names and one classification") {
  CHECK(status_code_name(0, 0x13) == "PRP Offset Invalid");
  CHECK(status_code_name(0, 0x0f) == "Data SGL Length Invalid");
  CHECK(status_code_name(1, 0x01) == "Invalid Queue Identifier");
  CHECK(status_code_name(2, 0x81) == "Unrecovered Read Error");
  CHECK(status_code_name(3, 0x71) == "Command Aborted By Host");
  CHECK(status_code_name(0, 0x7e) == "Unknown status code");
  CHECK(status_code_name(5, 0x00) == "Unknown status code");
  CHECK(status_code_type_name(4) == "Reserved Status Code Type");
  CHECK(describe_status(make_status(GenericStatus::lba_out_of_range, true)) ==
        "LBA Out of Range (SCT 0h Generic Command Status, SC 80h, DNR 1)");
  CHECK(classify(StatusField{0}) == StatusDisposition::success);
  CHECK(classify(StatusField::make(0, 0, false, 1)) == StatusDisposition::success);  // phase ignored
  CHECK(classify(make_status(GenericStatus::command_interrupted, false)) == StatusDisposition::retry);
  CHECK(classify(make_status(GenericStatus::aborted_sq_deletion, false)) == StatusDisposition::retry);
  CHECK(classify(make_status(GenericStatus::data_transfer_error, false)) == StatusDisposition::fail);
  CHECK(classify(make_status(GenericStatus::command_abort_requested, false)) == StatusDisposition::fail);
  CHECK(classify(make_status(GenericStatus::aborted_power_loss, false)) == StatusDisposition::fatal);
  CHECK(classify(make_status(PathStatus::asymmetric_access_transition, false)) == StatusDisposition::retry);
  CHECK(classify(make_status(PathStatus::asymmetric_access_transition, true)) == StatusDisposition::fail);
  CHECK(classify(make_status(PathStatus::internal_path_error, true)) == StatusDisposition::fatal);
  CHECK(classify(StatusField::make(7, 0xc0, false)) == StatusDisposition::fail);
  CHECK(disposition_name(StatusDisposition::retry) == "retry");
  // Every generic status listed has a name.
  for (unsigned sc = 0; sc <= 0x24; ++sc)
    if (sc != 0x17) CHECK_MESSAGE(status_code_name(0, static_cast<std::uint8_t>(sc)) != "Unknown status code", sc);
}

TEST_CASE("opcode names and data transfer directions") {
  CHECK(nvm_opcode_name(0x02) == "Read");
  CHECK(nvm_opcode_name(0x09) == "Dataset Management");
  CHECK(admin_opcode_name(0x06) == "Identify");
  CHECK(admin_opcode_name(0x55) == "Unknown admin opcode");
  CHECK(data_transfer_of(0x01) == DataTransfer::host_to_controller);
  CHECK(data_transfer_of(0x00) == DataTransfer::none);
}
