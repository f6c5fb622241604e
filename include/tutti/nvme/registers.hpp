// NVMe controller registers ("controller properties") and doorbells, as spec-only structures.
//
// NVMe Base Specification 2.0, 3.1.3 "Controller Properties" (Figure 33, offsets and fields) and
// NVMe over PCIe Transport Specification 1.0, 3.1.2 "Controller Properties" (SQyTDBL / CQyHDBL
// doorbells at 1000h + (2y [+1]) * (4 << CAP.DSTRD)). All registers little-endian.
// No driver logic here: shared by libnvm, kernels and the driver's uapi.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tutti/nvme/bitfield.hpp>

namespace tutti::nvme {

/// CAP, Controller Capabilities, offset 00h, 64 bits, read-only (Base 2.0, 3.1.3.1).
struct ControllerCapabilities {
  std::uint64_t raw;
  using MQES = BitField<std::uint64_t, 0, 16>;    ///< Maximum Queue Entries Supported, 0's based (>= 1)
  using CQR = BitField<std::uint64_t, 16, 1>;     ///< Contiguous Queues Required
  using AMS = BitField<std::uint64_t, 17, 2>;     ///< Arbitration Mechanism Supported
  using TO = BitField<std::uint64_t, 24, 8>;      ///< Timeout: worst-case CSTS.RDY transition, 500 ms units
  using DSTRD = BitField<std::uint64_t, 32, 4>;   ///< Doorbell Stride: doorbells are (4 << DSTRD) bytes apart
  using NSSRS = BitField<std::uint64_t, 36, 1>;   ///< NVM Subsystem Reset Supported
  using CSS = BitField<std::uint64_t, 37, 8>;     ///< Command Sets Supported (bit 0: NVM command set)
  using BPS = BitField<std::uint64_t, 45, 1>;     ///< Boot Partition Support
  using MPSMIN = BitField<std::uint64_t, 48, 4>;  ///< Memory Page Size Minimum: 2 ^ (12 + MPSMIN) bytes
  using MPSMAX = BitField<std::uint64_t, 52, 4>;  ///< Memory Page Size Maximum: 2 ^ (12 + MPSMAX) bytes

  /// Maximum entries per I/O queue (MQES + 1, decoded from 0's based).
  TUTTI_HOST_DEVICE constexpr std::uint32_t max_queue_entries() const noexcept {
    return static_cast<std::uint32_t>(MQES::decode(raw)) + 1;
  }
  /// Doorbell stride in bytes: 4 << DSTRD.
  TUTTI_HOST_DEVICE constexpr std::uint32_t doorbell_stride_bytes() const noexcept { return 4u << DSTRD::decode(raw); }
  /// CAP.TO in ns (500 ms units).
  TUTTI_HOST_DEVICE constexpr std::uint64_t timeout_ns() const noexcept { return TO::decode(raw) * 500'000'000ull; }
  /// Smallest memory page size in bytes.
  TUTTI_HOST_DEVICE constexpr std::uint64_t memory_page_size_minimum() const noexcept {
    return 1ull << (12 + MPSMIN::decode(raw));
  }
  TUTTI_HOST_DEVICE constexpr std::uint64_t memory_page_size_maximum() const noexcept {
    return 1ull << (12 + MPSMAX::decode(raw));
  }
};
static_assert(sizeof(ControllerCapabilities) == 8);

/// VS, Version, offset 08h (Base 2.0, 3.1.3.2): MJR 31:16, MNR 15:8, TER 7:0.
struct Version {
  std::uint32_t raw;
  using TER = BitField<std::uint32_t, 0, 8>;    ///< Tertiary version
  using MNR = BitField<std::uint32_t, 8, 8>;    ///< Minor version
  using MJR = BitField<std::uint32_t, 16, 16>;  ///< Major version
  TUTTI_HOST_DEVICE static constexpr Version make(std::uint32_t major, std::uint32_t minor,
                                                  std::uint32_t tertiary) noexcept {
    return Version{MJR::encode(MNR::encode(TER::encode(0, tertiary), minor), major)};
  }
};
static_assert(sizeof(Version) == 4);
/// NVMe 2.0.0, the version the soft controller reports.
inline constexpr Version kVersion2_0 = Version::make(2, 0, 0);

/// CC, Controller Configuration, offset 14h (Base 2.0, 3.1.3.5).
struct ControllerConfiguration {
  std::uint32_t raw;
  using EN = BitField<std::uint32_t, 0, 1>;       ///< Enable
  using CSS = BitField<std::uint32_t, 4, 3>;      ///< I/O Command Set Selected (000b: NVM)
  using MPS = BitField<std::uint32_t, 7, 4>;      ///< Memory Page Size: 2 ^ (12 + MPS) bytes
  using AMS = BitField<std::uint32_t, 11, 3>;     ///< Arbitration Mechanism Selected (000b: round robin)
  using SHN = BitField<std::uint32_t, 14, 2>;     ///< Shutdown Notification (01b normal, 10b abrupt)
  using IOSQES = BitField<std::uint32_t, 16, 4>;  ///< I/O SQ Entry Size: 2 ^ n bytes (6: 64 B)
  using IOCQES = BitField<std::uint32_t, 20, 4>;  ///< I/O CQ Entry Size: 2 ^ n bytes (4: 16 B)
};
static_assert(sizeof(ControllerConfiguration) == 4);
inline constexpr std::uint32_t kShutdownNone = 0, kShutdownNormal = 1, kShutdownAbrupt = 2;  ///< CC.SHN values
inline constexpr std::uint32_t kSubmissionQueueEntrySizeLog2 = 6;  ///< CC.IOSQES for 64-byte SQEs
inline constexpr std::uint32_t kCompletionQueueEntrySizeLog2 = 4;  ///< CC.IOCQES for 16-byte CQEs

/// CSTS, Controller Status, offset 1Ch (Base 2.0, 3.1.3.6). An all-ones read means the device is
/// gone (surprise removal), never a valid status.
struct ControllerStatus {
  std::uint32_t raw;
  using RDY = BitField<std::uint32_t, 0, 1>;    ///< Ready
  using CFS = BitField<std::uint32_t, 1, 1>;    ///< Controller Fatal Status
  using SHST = BitField<std::uint32_t, 2, 2>;   ///< Shutdown Status (00b normal, 01b occurring, 10b complete)
  using NSSRO = BitField<std::uint32_t, 4, 1>;  ///< NVM Subsystem Reset Occurred
  using PP = BitField<std::uint32_t, 5, 1>;     ///< Processing Paused
  TUTTI_HOST_DEVICE constexpr bool device_gone() const noexcept { return raw == 0xffffffffu; }
  TUTTI_HOST_DEVICE constexpr bool ready() const noexcept { return !device_gone() && RDY::decode(raw) == 1; }
  TUTTI_HOST_DEVICE constexpr bool fatal() const noexcept { return device_gone() || CFS::decode(raw) == 1; }
};
static_assert(sizeof(ControllerStatus) == 4);
inline constexpr std::uint32_t kShutdownStatusComplete = 2;  ///< CSTS.SHST: shutdown processing complete

/// AQA, Admin Queue Attributes, offset 24h (Base 2.0, 3.1.3.8). Sizes are 0's based entries (1..4095).
struct AdminQueueAttributes {
  std::uint32_t raw;
  using ASQS = BitField<std::uint32_t, 0, 12>;   ///< Admin Submission Queue Size, 0's based
  using ACQS = BitField<std::uint32_t, 16, 12>;  ///< Admin Completion Queue Size, 0's based
};
static_assert(sizeof(AdminQueueAttributes) == 4);

/// The register file at BAR0 offset 0 (Base 2.0, Figure 33). ASQ and ACQ are bus addresses,
/// 4 KiB aligned (bits 11:0 reserved). Doorbells follow at kDoorbellOffset.
struct ControllerRegisters {
  std::uint64_t cap;                        ///< 00h CAP, see Capabilities
  std::uint32_t vs;                         ///< 08h VS, see Version
  std::uint32_t intms;                      ///< 0Ch INTMS Interrupt Mask Set
  std::uint32_t intmc;                      ///< 10h INTMC Interrupt Mask Clear
  std::uint32_t cc;                         ///< 14h CC, see ControllerConfiguration
  std::uint32_t reserved_18;                ///< 18h reserved
  std::uint32_t csts;                       ///< 1Ch CSTS, see ControllerStatus
  std::uint32_t nssr;                       ///< 20h NSSR NVM Subsystem Reset
  std::uint32_t aqa;                        ///< 24h AQA, see AdminQueueAttributes
  std::uint64_t asq;                        ///< 28h ASQ Admin Submission Queue Base Address (bus address)
  std::uint64_t acq;                        ///< 30h ACQ Admin Completion Queue Base Address (bus address)
  std::uint32_t cmbloc;                     ///< 38h CMBLOC
  std::uint32_t cmbsz;                      ///< 3Ch CMBSZ
  std::uint8_t reserved_40[0x1000 - 0x40];  ///< 40h..FFFh: BPINFO, PMR, vendor specific (unused here)
};
static_assert(sizeof(ControllerRegisters) == 0x1000);
static_assert(offsetof(ControllerRegisters, cap) == 0x00);
static_assert(offsetof(ControllerRegisters, vs) == 0x08);
static_assert(offsetof(ControllerRegisters, intms) == 0x0c);
static_assert(offsetof(ControllerRegisters, intmc) == 0x10);
static_assert(offsetof(ControllerRegisters, cc) == 0x14);
static_assert(offsetof(ControllerRegisters, csts) == 0x1c);
static_assert(offsetof(ControllerRegisters, nssr) == 0x20);
static_assert(offsetof(ControllerRegisters, aqa) == 0x24);
static_assert(offsetof(ControllerRegisters, asq) == 0x28);
static_assert(offsetof(ControllerRegisters, acq) == 0x30);
static_assert(offsetof(ControllerRegisters, cmbloc) == 0x38);

/// Doorbells start at BAR0 offset 1000h (PCIe Transport 1.0, 3.1.2).
inline constexpr std::size_t kDoorbellOffset = 0x1000;

/// Byte offset from BAR0 of the Submission Queue y Tail Doorbell: 1000h + (2y) * (4 << DSTRD).
TUTTI_HOST_DEVICE constexpr std::size_t submission_queue_tail_doorbell_offset(std::uint16_t qid,
                                                                              std::uint32_t dstrd) noexcept {
  return kDoorbellOffset + (2 * static_cast<std::size_t>(qid)) * (std::size_t{4} << dstrd);
}
/// Byte offset from BAR0 of the Completion Queue y Head Doorbell: 1000h + (2y + 1) * (4 << DSTRD).
TUTTI_HOST_DEVICE constexpr std::size_t completion_queue_head_doorbell_offset(std::uint16_t qid,
                                                                              std::uint32_t dstrd) noexcept {
  return kDoorbellOffset + (2 * static_cast<std::size_t>(qid) + 1) * (std::size_t{4} << dstrd);
}
static_assert(submission_queue_tail_doorbell_offset(0, 0) == 0x1000);
static_assert(completion_queue_head_doorbell_offset(0, 0) == 0x1004);
static_assert(submission_queue_tail_doorbell_offset(1, 0) == 0x1008);
static_assert(completion_queue_head_doorbell_offset(3, 2) == 0x1000 + 7 * 16);

}  // namespace tutti::nvme
