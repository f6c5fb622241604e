// NVMe opcodes, admin and NVM command set, with names for messages.
//
// Admin: NVMe Base Specification 2.0, 5 "Admin Command Set" (Figure 28 "Opcodes for Admin
// Commands"). NVM I/O: NVM Command Set Specification 1.0, 3 "I/O Commands for the NVM Command
// Set" (Figure 18 "Opcodes for NVM Commands").
#pragma once

#include <cstdint>
#include <string_view>

#include <tutti/accel/config.hpp>

namespace tutti::nvme {

/// Admin command opcodes (Base 2.0, Figure 28).
enum class AdminOpcode : std::uint8_t {
  delete_io_submission_queue = 0x00,  ///< Base 2.0, 5.7
  create_io_submission_queue = 0x01,  ///< Base 2.0, 5.5
  get_log_page = 0x02,                ///< Base 2.0, 5.16
  delete_io_completion_queue = 0x04,  ///< Base 2.0, 5.6
  create_io_completion_queue = 0x05,  ///< Base 2.0, 5.4
  identify = 0x06,                    ///< Base 2.0, 5.17
  abort = 0x08,                       ///< Base 2.0, 5.1
  set_features = 0x09,                ///< Base 2.0, 5.27
  get_features = 0x0a,                ///< Base 2.0, 5.15
};

/// NVM command set I/O opcodes (NVM Command Set 1.0, Figure 18).
enum class NvmOpcode : std::uint8_t {
  flush = 0x00,               ///< NVM 1.0, 3.2.2 (Base 2.0, 7.1)
  write = 0x01,               ///< NVM 1.0, 3.2.6
  read = 0x02,                ///< NVM 1.0, 3.2.4
  write_zeroes = 0x08,        ///< NVM 1.0, 3.2.8
  dataset_management = 0x09,  ///< NVM 1.0, 3.2.3
};

/// Data transfer direction encoded in opcode bits 1:0 (Base 2.0, Figure 28 note: 00b none,
/// 01b host to controller, 10b controller to host, 11b bidirectional).
enum class DataTransfer : std::uint8_t { none = 0, host_to_controller = 1, controller_to_host = 2, bidirectional = 3 };
TUTTI_HOST_DEVICE constexpr DataTransfer data_transfer_of(std::uint8_t opcode) noexcept {
  return static_cast<DataTransfer>(opcode & 0x3u);
}
static_assert(data_transfer_of(static_cast<std::uint8_t>(NvmOpcode::write)) == DataTransfer::host_to_controller);
static_assert(data_transfer_of(static_cast<std::uint8_t>(NvmOpcode::read)) == DataTransfer::controller_to_host);
static_assert(data_transfer_of(static_cast<std::uint8_t>(AdminOpcode::identify)) == DataTransfer::controller_to_host);
static_assert(data_transfer_of(static_cast<std::uint8_t>(NvmOpcode::dataset_management)) ==
              DataTransfer::host_to_controller);

/// Name of an admin opcode ("Identify"), or "Unknown admin opcode".
constexpr std::string_view admin_opcode_name(std::uint8_t opcode) noexcept {
  switch (static_cast<AdminOpcode>(opcode)) {
    case AdminOpcode::delete_io_submission_queue: return "Delete I/O Submission Queue";
    case AdminOpcode::create_io_submission_queue: return "Create I/O Submission Queue";
    case AdminOpcode::get_log_page: return "Get Log Page";
    case AdminOpcode::delete_io_completion_queue: return "Delete I/O Completion Queue";
    case AdminOpcode::create_io_completion_queue: return "Create I/O Completion Queue";
    case AdminOpcode::identify: return "Identify";
    case AdminOpcode::abort: return "Abort";
    case AdminOpcode::set_features: return "Set Features";
    case AdminOpcode::get_features: return "Get Features";
  }
  return "Unknown admin opcode";
}
/// Name of an NVM I/O opcode ("Read"), or "Unknown I/O opcode".
constexpr std::string_view nvm_opcode_name(std::uint8_t opcode) noexcept {
  switch (static_cast<NvmOpcode>(opcode)) {
    case NvmOpcode::flush: return "Flush";
    case NvmOpcode::write: return "Write";
    case NvmOpcode::read: return "Read";
    case NvmOpcode::write_zeroes: return "Write Zeroes";
    case NvmOpcode::dataset_management: return "Dataset Management";
  }
  return "Unknown I/O opcode";
}

/// Feature identifiers used here (Base 2.0, 5.27.1, Figure 317).
enum class FeatureIdentifier : std::uint8_t {
  number_of_queues = 0x07,  ///< Base 2.0, 5.27.1.5
};

/// Identify CNS values used here (Base 2.0, 5.17.1, Figure 273).
enum class IdentifyCns : std::uint8_t {
  namespace_data = 0x00,         ///< Identify Namespace data structure for NSID (NVM 1.0, 4.1.5.1)
  controller = 0x01,             ///< Identify Controller data structure (Base 2.0, 5.17.2.1)
  active_namespace_list = 0x02,  ///< Active Namespace ID list (Base 2.0, 5.17.2.2)
};

/// Log page identifiers used here (Base 2.0, 5.16.1, Figure 202).
enum class LogPageIdentifier : std::uint8_t {
  smart_health = 0x02,  ///< SMART / Health Information (Base 2.0, 5.16.1.3), 512 bytes
};

}  // namespace tutti::nvme
