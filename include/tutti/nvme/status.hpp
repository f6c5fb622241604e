// NVMe status codes: names for messages and the one classification of a completion status into
// retry / fail / fatal.
//
// NVMe Base Specification 2.0, 4.2.3 "Status Field Definition": Figure 92 "Status Code Type
// Values", Figure 94 "Generic Command Status Values" (and the NVM-command-set-specific generic
// values 80h-84h, NVM Command Set 1.0 Figure 24), Figure 95 "Command Specific Status Values",
// Figure 96 "Media and Data Integrity Errors", Figure 97 "Path Related Status".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <tutti/nvme/commands.hpp>

namespace tutti::nvme {

/// Status Code Type (SCT) values, Figure 92.
enum class StatusCodeType : std::uint8_t {
  generic = 0,
  command_specific = 1,
  media_and_data_integrity = 2,
  path_related = 3,
  vendor_specific = 7,
};

/// Generic Command Status values (SCT 0), Figure 94 and NVM 1.0 Figure 24.
enum class GenericStatus : std::uint8_t {
  successful_completion = 0x00,
  invalid_command_opcode = 0x01,
  invalid_field_in_command = 0x02,
  command_id_conflict = 0x03,
  data_transfer_error = 0x04,
  aborted_power_loss = 0x05,
  internal_error = 0x06,
  command_abort_requested = 0x07,
  aborted_sq_deletion = 0x08,
  aborted_failed_fused = 0x09,
  aborted_missing_fused = 0x0a,
  invalid_namespace_or_format = 0x0b,
  command_sequence_error = 0x0c,
  invalid_sgl_segment_descriptor = 0x0d,
  invalid_number_of_sgl_descriptors = 0x0e,
  data_sgl_length_invalid = 0x0f,
  metadata_sgl_length_invalid = 0x10,
  sgl_descriptor_type_invalid = 0x11,
  invalid_use_of_controller_memory_buffer = 0x12,
  prp_offset_invalid = 0x13,
  atomic_write_unit_exceeded = 0x14,
  operation_denied = 0x15,
  sgl_offset_invalid = 0x16,
  host_identifier_inconsistent_format = 0x18,
  keep_alive_timer_expired = 0x19,
  keep_alive_timeout_invalid = 0x1a,
  aborted_preempt_and_abort = 0x1b,
  sanitize_failed = 0x1c,
  sanitize_in_progress = 0x1d,
  sgl_data_block_granularity_invalid = 0x1e,
  command_not_supported_for_queue_in_cmb = 0x1f,
  namespace_is_write_protected = 0x20,
  command_interrupted = 0x21,
  transient_transport_error = 0x22,
  command_prohibited_by_lockdown = 0x23,
  admin_command_media_not_ready = 0x24,
  lba_out_of_range = 0x80,
  capacity_exceeded = 0x81,
  namespace_not_ready = 0x82,
  reservation_conflict = 0x83,
  format_in_progress = 0x84,
};

/// Command Specific Status values (SCT 1), Figure 95 (the ones of commands used here).
enum class CommandSpecificStatus : std::uint8_t {
  completion_queue_invalid = 0x00,
  invalid_queue_identifier = 0x01,
  invalid_queue_size = 0x02,
  abort_command_limit_exceeded = 0x03,
  asynchronous_event_request_limit_exceeded = 0x05,
  invalid_firmware_slot = 0x06,
  invalid_firmware_image = 0x07,
  invalid_interrupt_vector = 0x08,
  invalid_log_page = 0x09,
  invalid_format = 0x0a,
  invalid_queue_deletion = 0x0c,
  feature_identifier_not_saveable = 0x0d,
  feature_not_changeable = 0x0e,
  feature_not_namespace_specific = 0x0f,
  conflicting_attributes = 0x80,  ///< NVM 1.0: Dataset Management / Read / Write
  invalid_protection_information = 0x81,
  attempted_write_to_read_only_range = 0x82,
};

/// Media and Data Integrity Errors (SCT 2), Figure 96.
enum class MediaStatus : std::uint8_t {
  write_fault = 0x80,
  unrecovered_read_error = 0x81,
  end_to_end_guard_check_error = 0x82,
  end_to_end_application_tag_check_error = 0x83,
  end_to_end_reference_tag_check_error = 0x84,
  compare_failure = 0x85,
  access_denied = 0x86,
  deallocated_or_unwritten_logical_block = 0x87,
};

/// Path Related Status (SCT 3), Figure 97.
enum class PathStatus : std::uint8_t {
  internal_path_error = 0x00,
  asymmetric_access_persistent_loss = 0x01,
  asymmetric_access_inaccessible = 0x02,
  asymmetric_access_transition = 0x03,
  controller_pathing_error = 0x60,
  host_pathing_error = 0x70,
  command_aborted_by_host = 0x71,
};

/// A Status Field value built from a named status (phase 0).
TUTTI_HOST_DEVICE constexpr StatusField make_status(GenericStatus sc, bool dnr) noexcept {
  return StatusField::make(static_cast<std::uint8_t>(StatusCodeType::generic), static_cast<std::uint8_t>(sc), dnr);
}
TUTTI_HOST_DEVICE constexpr StatusField make_status(CommandSpecificStatus sc, bool dnr) noexcept {
  return StatusField::make(static_cast<std::uint8_t>(StatusCodeType::command_specific), static_cast<std::uint8_t>(sc),
                           dnr);
}
TUTTI_HOST_DEVICE constexpr StatusField make_status(MediaStatus sc, bool dnr) noexcept {
  return StatusField::make(static_cast<std::uint8_t>(StatusCodeType::media_and_data_integrity),
                           static_cast<std::uint8_t>(sc), dnr);
}
TUTTI_HOST_DEVICE constexpr StatusField make_status(PathStatus sc, bool dnr) noexcept {
  return StatusField::make(static_cast<std::uint8_t>(StatusCodeType::path_related), static_cast<std::uint8_t>(sc), dnr);
}
/// True when `status` carries exactly (SCT, SC) of `sc` (ignores phase, DNR, CRD, M).
TUTTI_HOST_DEVICE constexpr bool is(StatusField status, GenericStatus sc) noexcept {
  return status.status_code_type() == 0 && status.status_code() == static_cast<std::uint8_t>(sc);
}
TUTTI_HOST_DEVICE constexpr bool is(StatusField status, CommandSpecificStatus sc) noexcept {
  return status.status_code_type() == 1 && status.status_code() == static_cast<std::uint8_t>(sc);
}
TUTTI_HOST_DEVICE constexpr bool is(StatusField status, MediaStatus sc) noexcept {
  return status.status_code_type() == 2 && status.status_code() == static_cast<std::uint8_t>(sc);
}
static_assert(is(make_status(GenericStatus::lba_out_of_range, true), GenericStatus::lba_out_of_range));
static_assert(make_status(GenericStatus::lba_out_of_range, true).do_not_retry());
static_assert(make_status(GenericStatus::successful_completion, false).success());

/// Name of a Status Code Type ("Generic Command Status").
constexpr std::string_view status_code_type_name(std::uint8_t sct) noexcept {
  switch (sct) {
    case 0: return "Generic Command Status";
    case 1: return "Command Specific Status";
    case 2: return "Media and Data Integrity Errors";
    case 3: return "Path Related Status";
    case 7: return "Vendor Specific";
    default: return "Reserved Status Code Type";
  }
}

/// Name of a status (SCT, SC), e.g. "LBA Out of Range"; "Unknown status code" when not listed.
constexpr std::string_view status_code_name(std::uint8_t sct, std::uint8_t sc) noexcept {
  if (sct == 0) {
    switch (static_cast<GenericStatus>(sc)) {
      case GenericStatus::successful_completion: return "Successful Completion";
      case GenericStatus::invalid_command_opcode: return "Invalid Command Opcode";
      case GenericStatus::invalid_field_in_command: return "Invalid Field in Command";
      case GenericStatus::command_id_conflict: return "Command ID Conflict";
      case GenericStatus::data_transfer_error: return "Data Transfer Error";
      case GenericStatus::aborted_power_loss: return "Commands Aborted due to Power Loss Notification";
      case GenericStatus::internal_error: return "Internal Error";
      case GenericStatus::command_abort_requested: return "Command Abort Requested";
      case GenericStatus::aborted_sq_deletion: return "Command Aborted due to SQ Deletion";
      case GenericStatus::aborted_failed_fused: return "Command Aborted due to Failed Fused Command";
      case GenericStatus::aborted_missing_fused: return "Command Aborted due to Missing Fused Command";
      case GenericStatus::invalid_namespace_or_format: return "Invalid Namespace or Format";
      case GenericStatus::command_sequence_error: return "Command Sequence Error";
      case GenericStatus::invalid_sgl_segment_descriptor: return "Invalid SGL Segment Descriptor";
      case GenericStatus::invalid_number_of_sgl_descriptors: return "Invalid Number of SGL Descriptors";
      case GenericStatus::data_sgl_length_invalid: return "Data SGL Length Invalid";
      case GenericStatus::metadata_sgl_length_invalid: return "Metadata SGL Length Invalid";
      case GenericStatus::sgl_descriptor_type_invalid: return "SGL Descriptor Type Invalid";
      case GenericStatus::invalid_use_of_controller_memory_buffer: return "Invalid Use of Controller Memory Buffer";
      case GenericStatus::prp_offset_invalid: return "PRP Offset Invalid";
      case GenericStatus::atomic_write_unit_exceeded: return "Atomic Write Unit Exceeded";
      case GenericStatus::operation_denied: return "Operation Denied";
      case GenericStatus::sgl_offset_invalid: return "SGL Offset Invalid";
      case GenericStatus::host_identifier_inconsistent_format: return "Host Identifier Inconsistent Format";
      case GenericStatus::keep_alive_timer_expired: return "Keep Alive Timer Expired";
      case GenericStatus::keep_alive_timeout_invalid: return "Keep Alive Timeout Invalid";
      case GenericStatus::aborted_preempt_and_abort: return "Command Aborted due to Preempt and Abort";
      case GenericStatus::sanitize_failed: return "Sanitize Failed";
      case GenericStatus::sanitize_in_progress: return "Sanitize In Progress";
      case GenericStatus::sgl_data_block_granularity_invalid: return "SGL Data Block Granularity Invalid";
      case GenericStatus::command_not_supported_for_queue_in_cmb: return "Command Not Supported for Queue in CMB";
      case GenericStatus::namespace_is_write_protected: return "Namespace is Write Protected";
      case GenericStatus::command_interrupted: return "Command Interrupted";
      case GenericStatus::transient_transport_error: return "Transient Transport Error";
      case GenericStatus::command_prohibited_by_lockdown: return "Command Prohibited by Command and Feature Lockdown";
      case GenericStatus::admin_command_media_not_ready: return "Admin Command Media Not Ready";
      case GenericStatus::lba_out_of_range: return "LBA Out of Range";
      case GenericStatus::capacity_exceeded: return "Capacity Exceeded";
      case GenericStatus::namespace_not_ready: return "Namespace Not Ready";
      case GenericStatus::reservation_conflict: return "Reservation Conflict";
      case GenericStatus::format_in_progress: return "Format In Progress";
    }
  } else if (sct == 1) {
    switch (static_cast<CommandSpecificStatus>(sc)) {
      case CommandSpecificStatus::completion_queue_invalid: return "Completion Queue Invalid";
      case CommandSpecificStatus::invalid_queue_identifier: return "Invalid Queue Identifier";
      case CommandSpecificStatus::invalid_queue_size: return "Invalid Queue Size";
      case CommandSpecificStatus::abort_command_limit_exceeded: return "Abort Command Limit Exceeded";
      case CommandSpecificStatus::asynchronous_event_request_limit_exceeded:
        return "Asynchronous Event Request Limit Exceeded";
      case CommandSpecificStatus::invalid_firmware_slot: return "Invalid Firmware Slot";
      case CommandSpecificStatus::invalid_firmware_image: return "Invalid Firmware Image";
      case CommandSpecificStatus::invalid_interrupt_vector: return "Invalid Interrupt Vector";
      case CommandSpecificStatus::invalid_log_page: return "Invalid Log Page";
      case CommandSpecificStatus::invalid_format: return "Invalid Format";
      case CommandSpecificStatus::invalid_queue_deletion: return "Invalid Queue Deletion";
      case CommandSpecificStatus::feature_identifier_not_saveable: return "Feature Identifier Not Saveable";
      case CommandSpecificStatus::feature_not_changeable: return "Feature Not Changeable";
      case CommandSpecificStatus::feature_not_namespace_specific: return "Feature Not Namespace Specific";
      case CommandSpecificStatus::conflicting_attributes: return "Conflicting Attributes";
      case CommandSpecificStatus::invalid_protection_information: return "Invalid Protection Information";
      case CommandSpecificStatus::attempted_write_to_read_only_range: return "Attempted Write to Read Only Range";
    }
  } else if (sct == 2) {
    switch (static_cast<MediaStatus>(sc)) {
      case MediaStatus::write_fault: return "Write Fault";
      case MediaStatus::unrecovered_read_error: return "Unrecovered Read Error";
      case MediaStatus::end_to_end_guard_check_error: return "End-to-end Guard Check Error";
      case MediaStatus::end_to_end_application_tag_check_error: return "End-to-end Application Tag Check Error";
      case MediaStatus::end_to_end_reference_tag_check_error: return "End-to-end Reference Tag Check Error";
      case MediaStatus::compare_failure: return "Compare Failure";
      case MediaStatus::access_denied: return "Access Denied";
      case MediaStatus::deallocated_or_unwritten_logical_block: return "Deallocated or Unwritten Logical Block";
    }
  } else if (sct == 3) {
    switch (static_cast<PathStatus>(sc)) {
      case PathStatus::internal_path_error: return "Internal Path Error";
      case PathStatus::asymmetric_access_persistent_loss: return "Asymmetric Access Persistent Loss";
      case PathStatus::asymmetric_access_inaccessible: return "Asymmetric Access Inaccessible";
      case PathStatus::asymmetric_access_transition: return "Asymmetric Access Transition";
      case PathStatus::controller_pathing_error: return "Controller Pathing Error";
      case PathStatus::host_pathing_error: return "Host Pathing Error";
      case PathStatus::command_aborted_by_host: return "Command Aborted By Host";
    }
  }
  return "Unknown status code";
}
static_assert(status_code_name(0, 0x80) == "LBA Out of Range");

/// What a caller should do with a completion status.
enum class StatusDisposition : std::uint8_t {
  success,  ///< Successful Completion
  retry,    ///< transient condition and DNR = 0: resubmitting the same command may succeed
  fail,     ///< this command failed (bad field, range, media error, or DNR = 1): report it
  fatal,    ///< the controller (or its path) is unusable until reset: stop using the queue
};

/// THE classification of a status field (phase ignored). One place, as SPDK's
/// nvme_completion_is_retry. Rules:
///  - SCT 0 SC 0: success.
///  - fatal (regardless of DNR): Internal Error, Commands Aborted due to Power Loss Notification,
///    Keep Alive Timer Expired, Sanitize Failed, Path Related Internal Path Error.
///  - retry when DNR = 0 and the condition is transient: Namespace Not Ready, Format In Progress,
///    Command Interrupted, Transient Transport Error, Admin Command Media Not Ready, Sanitize In
///    Progress, Command Aborted due to SQ Deletion, Asymmetric Access Transition / Inaccessible,
///    Controller/Host Pathing Error.
///  - fail: everything else (including Data Transfer Error, Command Abort Requested, LBA Out of
///    Range, all SGL/PRP errors, media errors, vendor and reserved codes).
TUTTI_HOST_DEVICE constexpr StatusDisposition classify(StatusField status) noexcept {
  const std::uint8_t sct = status.status_code_type();
  const std::uint8_t sc = status.status_code();
  if (sct == 0 && sc == 0) return StatusDisposition::success;
  if (sct == 0) {
    switch (static_cast<GenericStatus>(sc)) {
      case GenericStatus::internal_error:
      case GenericStatus::aborted_power_loss:
      case GenericStatus::keep_alive_timer_expired:
      case GenericStatus::sanitize_failed: return StatusDisposition::fatal;
      case GenericStatus::namespace_not_ready:
      case GenericStatus::format_in_progress:
      case GenericStatus::command_interrupted:
      case GenericStatus::transient_transport_error:
      case GenericStatus::admin_command_media_not_ready:
      case GenericStatus::sanitize_in_progress:
      case GenericStatus::aborted_sq_deletion:
        return status.do_not_retry() ? StatusDisposition::fail : StatusDisposition::retry;
      default: return StatusDisposition::fail;
    }
  }
  if (sct == 3) {
    if (sc == static_cast<std::uint8_t>(PathStatus::internal_path_error)) return StatusDisposition::fatal;
    if (sc == static_cast<std::uint8_t>(PathStatus::command_aborted_by_host)) return StatusDisposition::fail;
    return status.do_not_retry() ? StatusDisposition::fail : StatusDisposition::retry;
  }
  return StatusDisposition::fail;
}
static_assert(classify(make_status(GenericStatus::successful_completion, false)) == StatusDisposition::success);
static_assert(classify(make_status(GenericStatus::namespace_not_ready, false)) == StatusDisposition::retry);
static_assert(classify(make_status(GenericStatus::namespace_not_ready, true)) == StatusDisposition::fail);
static_assert(classify(make_status(GenericStatus::internal_error, true)) == StatusDisposition::fatal);
static_assert(classify(make_status(MediaStatus::unrecovered_read_error, false)) == StatusDisposition::fail);

/// Name of a disposition ("retry").
constexpr std::string_view disposition_name(StatusDisposition d) noexcept {
  switch (d) {
    case StatusDisposition::success: return "success";
    case StatusDisposition::retry: return "retry";
    case StatusDisposition::fail: return "fail";
    case StatusDisposition::fatal: return "fatal";
  }
  return "unknown";
}

/// Readable text of a status, e.g. "LBA Out of Range (SCT 0h Generic Command Status, SC 80h, DNR 1)".
inline std::string describe_status(StatusField status) {
  const std::uint8_t sct = status.status_code_type();
  const std::uint8_t sc = status.status_code();
  return fmt::format("{} (SCT {:X}h {}, SC {:02X}h, DNR {})", status_code_name(sct, sc), sct,
                     status_code_type_name(sct), sc, status.do_not_retry() ? 1 : 0);
}

}  // namespace tutti::nvme
