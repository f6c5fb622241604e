// Fault injection (error status on the Nth command or an LBA range, delayed and lost
// completions, controller fatal status), timeouts and Abort.
#include <doctest/doctest.h>

#include <tutti/accel/primitives.hpp>

#include "soft_fixture.hpp"

using namespace tutti;
using namespace tutti::test;
using nvme::GenericStatus;

TEST_CASE("an injected status fails exactly the Nth matching command") {
  SoftFixture f;
  libnvm::SoftFaultRule rule;
  rule.nth_command = 3;
  rule.opcode = static_cast<int>(nvme::NvmOpcode::read);
  rule.status = nvme::make_status(nvme::MediaStatus::unrecovered_read_error, true);
  f.device->inject_fault(rule);
  std::memset(f.region.data, 0x42, 4096);
  for (int i = 1; i <= 5; ++i) {
    CAPTURE(i);
    const auto cqe = f.run(f.read_write(false, 0, 1, 0));
    if (i == 3) {
      CHECK(nvme::is(cqe.status(), nvme::MediaStatus::unrecovered_read_error));
      CHECK(cqe.status().do_not_retry());
      CHECK(nvme::classify(cqe.status()) == nvme::StatusDisposition::fail);
    } else {
      CHECK(cqe.status().success());
    }
  }
  // Writes never matched the read-only rule.
  CHECK(f.run(f.read_write(true, 0, 1, 0)).status().success());
  CHECK(f.device->counters().injected_faults == 1);
}

TEST_CASE("an injected status fails every command touching an LBA range, and only those") {
  SoftFixture f;
  libnvm::SoftFaultRule rule;
  rule.lba_range_only = true;
  rule.first_lba = 100;
  rule.last_lba = 109;
  rule.max_fires = 0;  // unlimited
  rule.status = nvme::make_status(nvme::MediaStatus::write_fault, true);
  f.device->inject_fault(rule);
  CHECK(f.run(f.read_write(true, 90, 10, 0)).status().success());                                   // 90..99
  CHECK(nvme::is(f.run(f.read_write(true, 95, 10, 0)).status(), nvme::MediaStatus::write_fault));   // 95..104
  CHECK(nvme::is(f.run(f.read_write(false, 109, 1, 0)).status(), nvme::MediaStatus::write_fault));  // 109
  CHECK(f.run(f.read_write(false, 110, 4, 0)).status().success());                                  // 110..113
  CHECK(nvme::is(f.run(f.read_write(false, 105, 1, 0)).status(), nvme::MediaStatus::write_fault));
  f.device->clear_faults();
  CHECK(f.run(f.read_write(false, 105, 1, 0)).status().success());
  CHECK(f.device->counters().injected_faults == 3);
}

TEST_CASE("a delayed completion arrives after the delay, not before") {
  SoftFixture f;
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::delay_completion;
  rule.delay_ns = 50'000'000;  // 50 ms
  f.device->inject_fault(rule);
  const nvme::QueuePair& q = f.io.queue();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  auto sqe = f.read_write(false, 7, 1, 0);
  sqe.command_identifier = cid;
  const std::uint64_t start = accel::timer_ns();
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  CHECK(q.wait_for_completion(cid, 10'000'000).status == StatusCode::TIMEOUT);  // 10 ms: still held
  const nvme::WaitResult done = q.wait_for_completion(cid, kWait);
  REQUIRE(done.status == StatusCode::OK);
  CHECK(done.completion.status().success());
  CHECK(accel::timer_ns() - start >= 50'000'000);
  CHECK(f.file.read(7 * 4096, 4096) == std::vector<std::uint8_t>(f.region.data, f.region.data + 4096));
}

TEST_CASE("a lost completion times out, Abort ends it with Command Abort Requested, memory untouched") {
  SoftFixture f;
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::lose_completion;
  f.device->inject_fault(rule);
  const nvme::QueuePair& q = f.io.queue();
  std::memset(f.region.data, 0x99, 4096);
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  auto sqe = f.read_write(false, 1, 1, 0);
  sqe.command_identifier = cid;
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  const std::uint64_t start = accel::timer_ns();
  CHECK(q.wait_for_completion(cid, 20'000'000).status == StatusCode::TIMEOUT);
  CHECK(accel::timer_ns() - start >= 20'000'000);
  // Another command on the same queue still completes (the lost one does not block the queue).
  CHECK(f.run(f.read_write(false, 2, 1, 4096)).status().success());
  auto aborted = f.controller->abort(f.io.info.qid, cid, kWait);
  REQUIRE(aborted.is_ok());
  CHECK(*aborted);
  const nvme::WaitResult done = q.wait_for_completion(cid, kWait);
  REQUIRE(done.status == StatusCode::OK);
  CHECK(nvme::is(done.completion.status(), GenericStatus::command_abort_requested));
  CHECK(f.region.data[0] == 0x99);  // the aborted read never ran
  // Aborting it again, or an unknown CID: not aborted.
  auto again = f.controller->abort(f.io.info.qid, cid, kWait);
  REQUIRE(again.is_ok());
  CHECK_FALSE(*again);
  CHECK(f.device->counters().aborted_commands == 1);
}

TEST_CASE("an abandoned command's late completion is dropped and its CID reused safely") {
  SoftFixture f;
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::delay_completion;
  rule.delay_ns = 30'000'000;
  f.device->inject_fault(rule);
  const nvme::QueuePair& q = f.io.queue();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  auto sqe = f.read_write(false, 1, 1, 0);
  sqe.command_identifier = cid;
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  REQUIRE(q.wait_for_completion(cid, 1'000'000).status == StatusCode::TIMEOUT);
  q.abandon(cid);
  // Drive the queue until the late completion has been reaped and dropped.
  const std::uint64_t deadline = accel::deadline_after(kWait);
  while (f.io.storage->statistics().abandoned_completions == 0 && accel::timer_ns() < deadline) {
    q.reap_completions();
    accel::shim::yield_thread();
  }
  CHECK(f.io.storage->statistics().abandoned_completions == 1);
  // The slot's next CID has a new generation: a completion for the old CID cannot match it.
  std::uint16_t next = 0;
  for (std::uint32_t i = 0; i < q.cid_capacity; ++i) {
    REQUIRE(q.allocate_command_identifier(next));
    if (q.cid_index(next) == q.cid_index(cid)) break;
  }
  CHECK(q.cid_index(next) == q.cid_index(cid));
  CHECK(next != cid);
}

TEST_CASE("Controller Fatal Status stops the queues; waiters get DEVICE_ERROR; reset recovers") {
  SoftFixture f;
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::controller_fatal;
  f.device->inject_fault(rule);
  const nvme::QueuePair& q = f.io.queue();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  auto sqe = f.read_write(false, 0, 1, 0);
  sqe.command_identifier = cid;
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  const nvme::WaitResult waited = q.wait_for_completion(cid, kWait);
  CHECK(waited.status == StatusCode::DEVICE_ERROR);
  CHECK(f.controller->controller_status().fatal());
  // Admin commands fail closed too.
  nvme::SubmissionQueueEntry features{};
  features.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::get_features);
  features.cdw10 = 7;
  CHECK(f.controller->submit_admin(features, 50'000'000).code() == StatusCode::DEVICE_ERROR);
  // Reset (bring-up) clears CFS; new queues work.
  f.device->clear_faults();
  REQUIRE(f.controller->bring_up(libnvm::BringUpOptions{}).is_ok());
  CHECK_FALSE(f.controller->controller_status().fatal());
  IoQueue fresh = make_io_queue(*f.controller, 16);
  CHECK(f.run(f.read_write(false, 0, 1, 0), &fresh.queue()).status().success());
}

TEST_CASE("set_controller_fatal is seen by pollers at once") {
  SoftFixture f;
  f.device->set_controller_fatal();
  CHECK(f.controller->controller_status().fatal());
  const nvme::QueuePair& q = f.io.queue();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  CHECK(q.wait_for_completion(cid, kWait).status == StatusCode::DEVICE_ERROR);
}

TEST_CASE("deleting an SQ completes held commands with Command Aborted due to SQ Deletion") {
  SoftFixture f;
  IoQueue extra = make_io_queue(*f.controller, 8);
  libnvm::SoftFaultRule rule;
  rule.action = libnvm::SoftFaultRule::Action::lose_completion;
  rule.sqid = extra.info.qid;
  f.device->inject_fault(rule);
  const nvme::QueuePair& q = extra.queue();
  std::uint16_t cid = 0;
  REQUIRE(q.allocate_command_identifier(cid));
  auto sqe = f.read_write(false, 0, 1, 0);
  sqe.command_identifier = cid;
  REQUIRE(q.submit(sqe) == StatusCode::OK);
  REQUIRE(q.wait_for_completion(cid, 5'000'000).status == StatusCode::TIMEOUT);
  // Delete the SQ by hand (the CQ stays, so the abort completion can be read).
  nvme::SubmissionQueueEntry del{};
  del.opcode = static_cast<std::uint8_t>(nvme::AdminOpcode::delete_io_submission_queue);
  del.cdw10 = extra.info.qid;
  auto done = f.controller->submit_admin(del, kWait);
  REQUIRE(done.is_ok());
  CHECK(done->status().success());
  const nvme::WaitResult waited = q.wait_for_completion(cid, kWait);
  REQUIRE(waited.status == StatusCode::OK);
  CHECK(nvme::is(waited.completion.status(), GenericStatus::aborted_sq_deletion));
  CHECK(nvme::classify(waited.completion.status()) == nvme::StatusDisposition::fail);  // DNR set
}
