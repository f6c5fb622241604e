// Between the host and the local_nvme kernels: a request of a submit staged as the RequestState
// the kernels run (kernels.hpp), and a kernel's RequestReport turned back into the Status the
// caller sees (the rejections of submit, the completions of progress). Every message names the
// field, the value and the limit, or the file offset, SLBA and queue of the failed command.
// Units: bytes. Thread-safety: reentrant (reads the Engine's immutable settings and queue ids).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include <tutti/core/concepts.hpp>
#include <tutti/core/io.hpp>
#include <tutti/core/status.hpp>
#include <tutti/nvme/opcodes.hpp>
#include <tutti/nvme/status.hpp>
#include <tutti/path/local_nvme/engine.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/registration.hpp>
#include <tutti/path/local_nvme/targets.hpp>

namespace tutti::local_nvme {

namespace detail {
/// `to = value` with the result of the assignment explicitly discarded (Status is [[nodiscard]],
/// and nvcc's front end warns about the discarded Status& of operator=).
inline void assign(Status& to, Status value) { (void)(to = std::move(value)); }
}  // namespace detail

/// The NVM command of a request direction (NVM Command Set 1.0: Read 3.2.4, Write 3.2.6, Flush 3.2.2).
constexpr nvme::NvmOpcode opcode_of(Direction direction) noexcept {
  return direction == Direction::READ    ? nvme::NvmOpcode::read
         : direction == Direction::WRITE ? nvme::NvmOpcode::write
                                         : nvme::NvmOpcode::flush;
}

/// Stages request `p` (a PathRequest of the DataPath) as `r` for the kernels: on queue
/// `queue_index`, against the target handle `target` (its L1 entry or L2 copy), with `window`
/// records at `records` (device memory, set free by the submit kernel). `mapping` receives the
/// registration the request's commands may touch (kept for the zombie hand-off).
template <class Request>
void stage_request(RequestState& r, const Request& p, const Engine& engine, std::uint32_t queue_index,
                   const DeviceTarget& target, CommandRecord* records, std::shared_ptr<Mapping>& mapping) {
  r.opcode = opcode_of(p.direction);
  r.queue_index = queue_index;
  r.target = target;
  r.target_offset = p.target_offset;
  r.length = p.length;
  r.max_command_bytes = engine.max_command_bytes;
  r.command_timeout_ns = engine.options.command_timeout_ns;
  r.abort_timeout_ns = engine.options.abort_timeout_ns;
  r.max_window = engine.options.request_window;
  r.records = records;
  if (p.memory != nullptr && p.memory->mapping) {
    const Mapping& m = *p.memory->mapping;
    r.memory = m.table;
    // The mapping starts at the page that holds the region's first byte.
    r.memory_offset = (m.user_address - reinterpret_cast<std::uintptr_t>(m.mapping.host_address)) + p.memory_offset;
    r.memory_room = p.memory_offset <= p.memory_view.size ? p.memory_view.size - p.memory_offset : 0;
    mapping = p.memory->mapping;
  }
}

/// The Status of a request the submit kernel did not accept: `r` as staged, `report` from the
/// kernel, `p` the request, `signal` its target's change signal.
template <class Request>
Status rejection(const Engine& engine, const RequestState& r, const RequestReport& report, const Request& p,
                 const ChangeSignal& signal) {
  const Queue& q = *engine.queues[r.queue_index];
  switch (report.outcome) {
    case RequestOutcome::rejected_target_changed:
      return signal.change_error(
          "its extents no longer describe it, so no command was issued; close it and open it "
          "again");
    case RequestOutcome::rejected_backpressure:
      return error(StatusCode::RESOURCE_EXHAUSTED,
                   "local_nvme: I/O queue {} has no free command slots (depth {}); resubmit later", q.info.qid,
                   q.info.depth);
    case RequestOutcome::rejected_alignment:
      return error(StatusCode::INVALID_ARGUMENT,
                   "local_nvme: target_offset = {} and length = {} must be multiples of the {}-byte LBA size unless "
                   "the request ends at end of file ({})",
                   p.target_offset, p.length, r.target.lba_size, r.target.file_size);
    case RequestOutcome::rejected_memory_room:
      return error(StatusCode::OUT_OF_RANGE,
                   "local_nvme: length = {} needs {} bytes of memory (whole {}-byte LBAs: a tail is transferred "
                   "rounded up) but only {} bytes follow memory_offset = {}",
                   p.length, report.transfer_length, r.target.lba_size, r.memory_room, p.memory_offset);
    default:
      return error(StatusCode::INTERNAL, "local_nvme: request not accepted (outcome {})",
                   static_cast<unsigned>(report.outcome));
  }
}

/// The completion of request i: `r` as staged, `report` from the last kernel (done), `signal` its
/// target's change signal, raised (after local_file::poll_changes) when the file changed: then
/// the request fails with DATA_LOSS whatever its commands said, because the blocks they read or
/// wrote may no longer be the file's (docs/local-nvme.md, "A file changed under local_nvme").
inline RequestCompletion completion_of(const Engine& engine, const RequestState& r, const RequestReport& report,
                                       std::size_t i, ChangeSignal& signal) {
  RequestCompletion c;
  c.request_index = i;
  c.done = true;
  c.commands = report.commands;
  c.retries = report.retries;
  c.device_status = report.nvme_status;
  c.confirmed_bytes = std::min(report.confirmed_bytes, r.length);
  const Queue& q = *engine.queues[r.queue_index];
  const nvme::StatusField field = nvme::StatusField::make(static_cast<std::uint8_t>(report.nvme_status >> 8),
                                                          static_cast<std::uint8_t>(report.nvme_status & 0xff), false);
  if (report.outcome == RequestOutcome::target_changed || signal.raise_if_changed()) {
    detail::assign(c.status, signal.change_error(fmt::format("{} of {} bytes moved but may belong to another file, "
                                                             "and no command was issued after the change was seen",
                                                             c.confirmed_bytes, r.length)));
    return c;
  }
  switch (report.outcome) {
    case RequestOutcome::ok: detail::assign(c.status, Status::success()); break;
    case RequestOutcome::nvme_error:
      detail::assign(c.status,
                     error(StatusCode::DEVICE_ERROR,
                           "local_nvme: command at file offset {} (SLBA {}, I/O queue {}) failed: {}; {} of {} bytes "
                           "confirmed",
                           report.failed_file_offset, report.failed_lba, q.info.qid, nvme::describe_status(field),
                           c.confirmed_bytes, r.length));
      break;
    case RequestOutcome::timed_out:
      detail::assign(
          c.status,
          error(StatusCode::TIMEOUT,
                "local_nvme: a command at file offset {} (SLBA {}, I/O queue {}) did not complete within {} "
                "ns and was aborted{}; {} of {} bytes confirmed",
                report.failed_file_offset, report.failed_lba, q.info.qid, engine.options.command_timeout_ns,
                report.zombies > 0 ? " (no answer: its memory stays mapped)" : "", c.confirmed_bytes, r.length));
      break;
    case RequestOutcome::controller_fatal:
      detail::assign(c.status, error(StatusCode::DEVICE_ERROR,
                                     "local_nvme: controller fatal status (CSTS.CFS) or device gone with I/O queue {} "
                                     "busy; {} of {} bytes confirmed",
                                     q.info.qid, c.confirmed_bytes, r.length));
      break;
    case RequestOutcome::no_extent:
      detail::assign(c.status, error(StatusCode::DATA_LOSS, "local_nvme: no extent maps file offset {}",
                                     report.failed_file_offset));
      break;
    case RequestOutcome::prp_error:
      detail::assign(c.status, error(StatusCode::OUT_OF_RANGE,
                                     "local_nvme: memory for file offset {} lies outside the registered region",
                                     report.failed_file_offset));
      break;
    default:
      detail::assign(c.status, error(StatusCode::INTERNAL, "local_nvme: unexpected outcome {}",
                                     static_cast<unsigned>(report.outcome)));
  }
  return c;
}

}  // namespace tutti::local_nvme
