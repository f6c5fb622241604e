// Submission queue entry (64 B), completion queue entry (16 B), SGL descriptors (16 B), and the
// command dword fields of the commands Tutti issues, as spec-only structures.
//
// NVMe Base Specification 2.0: 4.1 "Submission Queue Entry" (Figure 88 "Common Command Format",
// Figure 87 "Command Dword 0"), 4.2 "Completion Queue Entry" (Figure 90, Figure 91 "Status
// Field"), 4.3.2 "Scatter Gather List (SGL)" (Figure 114 "SGL Descriptor Format", Figure 115
// "SGL Descriptor Type"); admin command dwords in 5.x; NVM Command Set Specification 1.0 for I/O.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tutti/nvme/bitfield.hpp>
#include <tutti/nvme/opcodes.hpp>

namespace tutti::nvme {

/// SGL descriptor types (Base 2.0, Figure 115), bits 7:4 of the SGL Identifier byte.
enum class SglDescriptorType : std::uint8_t {
  data_block = 0x0,            ///< Address + Length of data
  bit_bucket = 0x1,            ///< discard Length bytes (not supported by the soft controller)
  segment = 0x2,               ///< Address + Length of the next SGL segment (more segments follow)
  last_segment = 0x3,          ///< Address + Length of the last SGL segment (data blocks only)
  keyed_data_block = 0x4,      ///< NVMe over Fabrics only
  transport_data_block = 0x5,  ///< NVMe over Fabrics only
};
/// SGL descriptor subtypes (Base 2.0, Figure 116), bits 3:0 of the SGL Identifier byte.
enum class SglDescriptorSubtype : std::uint8_t { address = 0x0, offset = 0x1, transport_specific = 0xa };

/// One SGL descriptor, 16 bytes (Base 2.0, Figure 114). Address is a bus address (Subtype
/// Address) with any byte alignment when Identify Controller SGLS = 01b; Length in bytes.
struct SglDescriptor {
  std::uint64_t address;     ///< bytes 07:00
  std::uint32_t length;      ///< bytes 11:08, bytes
  std::uint8_t reserved[3];  ///< bytes 14:12
  std::uint8_t identifier;   ///< byte 15: SGL Identifier (type 7:4, subtype 3:0)
  using Subtype = BitField<std::uint8_t, 0, 4>;
  using Type = BitField<std::uint8_t, 4, 4>;
  TUTTI_HOST_DEVICE constexpr SglDescriptorType type() const noexcept {
    return static_cast<SglDescriptorType>(Type::decode(identifier));
  }
  TUTTI_HOST_DEVICE constexpr std::uint8_t subtype() const noexcept { return Subtype::decode(identifier); }
  /// A descriptor of `type` (subtype Address) covering `length` bytes at bus `address`.
  TUTTI_HOST_DEVICE static constexpr SglDescriptor make(SglDescriptorType type, std::uint64_t address,
                                                        std::uint32_t length) noexcept {
    return SglDescriptor{address,
                         length,
                         {0, 0, 0},
                         Type::encode(Subtype::encode(0, static_cast<std::uint8_t>(SglDescriptorSubtype::address)),
                                      static_cast<std::uint8_t>(type))};
  }
};
static_assert(sizeof(SglDescriptor) == 16);
static_assert(offsetof(SglDescriptor, length) == 8);
static_assert(offsetof(SglDescriptor, identifier) == 15);

/// PSDT, PRP or SGL for Data Transfer, CDW0 bits 15:14 (Base 2.0, Figure 87).
enum class DataPointerKind : std::uint8_t {
  prp = 0,                      ///< 00b: PRP1 / PRP2
  sgl_contiguous_metadata = 1,  ///< 01b: SGL, MPTR is a contiguous buffer address
  sgl_metadata_sgl = 2,         ///< 10b: SGL, MPTR is an SGL segment address
  reserved = 3,
};

/// Data Pointer, SQE bytes 39:24: PRP Entry 1 and 2, or SGL Entry 1 (Base 2.0, Figure 88).
union DataPointer {
  struct {
    std::uint64_t prp1;  ///< PRP Entry 1: bus address; bits 1:0 zero (dword aligned), may carry a page offset
    std::uint64_t prp2;  ///< PRP Entry 2: second page address, or the bus address of a PRP list
  } prp;
  SglDescriptor sgl1;  ///< SGL Entry 1 (PSDT != 00b)
};
static_assert(sizeof(DataPointer) == 16);

/// Submission Queue Entry, 64 bytes (Base 2.0, Figure 88 "Common Command Format").
/// Aligned to 64 bytes in every queue; written by the host (or a GPU thread), read by the
/// controller after the SQ tail doorbell announces it.
struct alignas(64) SubmissionQueueEntry {
  std::uint8_t opcode;               ///< CDW0 7:0 OPC
  std::uint8_t flags;                ///< CDW0 15:8: FUSE 9:8, PSDT 15:14 (see Fuse, Psdt)
  std::uint16_t command_identifier;  ///< CDW0 31:16 CID, unique among outstanding commands of one SQ
  std::uint32_t nsid;                ///< CDW1 Namespace Identifier (FFFFFFFFh: all namespaces)
  std::uint32_t cdw2;                ///< CDW2, command specific
  std::uint32_t cdw3;                ///< CDW3, command specific
  std::uint64_t metadata_pointer;    ///< CDW5:4 MPTR
  DataPointer data_pointer;          ///< CDW9:6 DPTR
  std::uint32_t cdw10, cdw11, cdw12, cdw13, cdw14, cdw15;  ///< command specific

  using Fuse = BitField<std::uint8_t, 0, 2>;  ///< flags bits 1:0 = CDW0 9:8, fused operation
  using Psdt = BitField<std::uint8_t, 6, 2>;  ///< flags bits 7:6 = CDW0 15:14, PRP or SGL
  TUTTI_HOST_DEVICE constexpr DataPointerKind data_pointer_kind() const noexcept {
    return static_cast<DataPointerKind>(Psdt::decode(flags));
  }
  TUTTI_HOST_DEVICE constexpr void set_data_pointer_kind(DataPointerKind kind) noexcept {
    flags = Psdt::encode(flags, static_cast<std::uint8_t>(kind));
  }
};
static_assert(sizeof(SubmissionQueueEntry) == 64);
static_assert(offsetof(SubmissionQueueEntry, command_identifier) == 2);
static_assert(offsetof(SubmissionQueueEntry, nsid) == 4);
static_assert(offsetof(SubmissionQueueEntry, metadata_pointer) == 16);
static_assert(offsetof(SubmissionQueueEntry, data_pointer) == 24);
static_assert(offsetof(SubmissionQueueEntry, cdw10) == 40);
static_assert(offsetof(SubmissionQueueEntry, cdw15) == 60);

/// Status Field of a CQE (Base 2.0, Figure 91), the upper half of CQE dword 3 including the
/// Phase Tag at bit 0. Status Code Type and Status Code meanings are in nvme/status.hpp.
struct StatusField {
  std::uint16_t raw;
  using P = BitField<std::uint16_t, 0, 1>;     ///< Phase Tag
  using SC = BitField<std::uint16_t, 1, 8>;    ///< Status Code
  using SCT = BitField<std::uint16_t, 9, 3>;   ///< Status Code Type
  using CRD = BitField<std::uint16_t, 12, 2>;  ///< Command Retry Delay
  using M = BitField<std::uint16_t, 14, 1>;    ///< More (Get Log Page has more information)
  using DNR = BitField<std::uint16_t, 15, 1>;  ///< Do Not Retry
  TUTTI_HOST_DEVICE constexpr std::uint8_t phase() const noexcept { return static_cast<std::uint8_t>(P::decode(raw)); }
  TUTTI_HOST_DEVICE constexpr std::uint8_t status_code() const noexcept {
    return static_cast<std::uint8_t>(SC::decode(raw));
  }
  TUTTI_HOST_DEVICE constexpr std::uint8_t status_code_type() const noexcept {
    return static_cast<std::uint8_t>(SCT::decode(raw));
  }
  TUTTI_HOST_DEVICE constexpr bool do_not_retry() const noexcept { return DNR::decode(raw) != 0; }
  /// True for Successful Completion (SCT 0, SC 0).
  TUTTI_HOST_DEVICE constexpr bool success() const noexcept { return SC::decode(raw) == 0 && SCT::decode(raw) == 0; }
  /// The status without the phase tag (what nvme/status.hpp classifies).
  TUTTI_HOST_DEVICE constexpr std::uint16_t without_phase() const noexcept { return P::encode(raw, 0); }
  TUTTI_HOST_DEVICE static constexpr StatusField make(std::uint8_t sct, std::uint8_t sc, bool dnr,
                                                      std::uint8_t phase = 0) noexcept {
    return StatusField{DNR::encode(SCT::encode(SC::encode(P::encode(0, phase), sc), sct), dnr ? 1 : 0)};
  }
};
static_assert(sizeof(StatusField) == 2);

/// Completion Queue Entry, 16 bytes (Base 2.0, Figure 90). The controller writes dwords 0-2 and
/// then dword 3 (CID 15:0 + Status Field with the Phase Tag 31:16) as one 32-bit release store; a
/// consumer reads dword 3 with one 32-bit acquire load and, only if the phase tag is the expected
/// one, reads dwords 0-2. Dword 3 is therefore one uint32_t member with named accessors.
struct alignas(16) CompletionQueueEntry {
  std::uint32_t dw0;            ///< DW0 command specific (e.g. Set Features result)
  std::uint32_t dw1;            ///< DW1 command specific
  std::uint16_t sq_head;        ///< DW2 15:0 SQ Head Pointer: SQ slots before it are free
  std::uint16_t sq_identifier;  ///< DW2 31:16 SQ Identifier the command came from
  std::uint32_t dw3;            ///< DW3: CID (see CID) and Status Field (see Status)

  using CID = BitField<std::uint32_t, 0, 16>;      ///< DW3 15:0 Command Identifier
  using Status = BitField<std::uint32_t, 16, 16>;  ///< DW3 31:16 Status Field incl. Phase Tag
  TUTTI_HOST_DEVICE constexpr std::uint16_t command_identifier() const noexcept {
    return static_cast<std::uint16_t>(CID::decode(dw3));
  }
  TUTTI_HOST_DEVICE constexpr StatusField status() const noexcept {
    return StatusField{static_cast<std::uint16_t>(Status::decode(dw3))};
  }
  /// Dword 3 for a CID and a status field (with its phase tag).
  TUTTI_HOST_DEVICE static constexpr std::uint32_t make_dw3(std::uint16_t cid, StatusField status) noexcept {
    return Status::encode(CID::encode(0, cid), status.raw);
  }
};
static_assert(sizeof(CompletionQueueEntry) == 16);
static_assert(offsetof(CompletionQueueEntry, dw1) == 4);
static_assert(offsetof(CompletionQueueEntry, sq_head) == 8);
static_assert(offsetof(CompletionQueueEntry, sq_identifier) == 10);
static_assert(offsetof(CompletionQueueEntry, dw3) == 12);
static_assert(CompletionQueueEntry::make_dw3(0x1234, StatusField{0x8001}) == 0x80011234u);

// ---------------------------------------------------------------------------------------------
// Command dword fields (one struct per command; names from the spec).

/// Read / Write (NVM 1.0, 3.2.4 and 3.2.6): CDW10-11 SLBA, CDW12 NLB (0's based) and flags.
struct ReadWriteFields {
  using NLB = BitField<std::uint32_t, 0, 16>;   ///< CDW12 15:0 Number of Logical Blocks, 0's based
  using FUA = BitField<std::uint32_t, 30, 1>;   ///< CDW12 30 Force Unit Access
  using LR = BitField<std::uint32_t, 31, 1>;    ///< CDW12 31 Limited Retry
  using DEAC = BitField<std::uint32_t, 25, 1>;  ///< CDW12 25 Deallocate (Write Zeroes only)
};
TUTTI_HOST_DEVICE constexpr std::uint64_t starting_lba(const SubmissionQueueEntry& sqe) noexcept {
  return (static_cast<std::uint64_t>(sqe.cdw11) << 32) | sqe.cdw10;
}
/// Number of logical blocks of a Read/Write/Write Zeroes, decoded (1..65536).
TUTTI_HOST_DEVICE constexpr std::uint32_t number_of_logical_blocks(const SubmissionQueueEntry& sqe) noexcept {
  return ReadWriteFields::NLB::decode(sqe.cdw12) + 1;
}

/// Dataset Management (NVM 1.0, 3.2.3): CDW10 NR (0's based ranges), CDW11 AD; data: ranges.
struct DatasetManagementFields {
  using NR = BitField<std::uint32_t, 0, 8>;   ///< CDW10 7:0 Number of Ranges, 0's based
  using IDR = BitField<std::uint32_t, 0, 1>;  ///< CDW11 0 Integral Dataset for Read
  using IDW = BitField<std::uint32_t, 1, 1>;  ///< CDW11 1 Integral Dataset for Write
  using AD = BitField<std::uint32_t, 2, 1>;   ///< CDW11 2 Attribute - Deallocate
};
/// One Dataset Management range, 16 bytes (NVM 1.0, Figure 39).
struct DatasetManagementRange {
  std::uint32_t context_attributes;
  std::uint32_t length_in_logical_blocks;  ///< LBAs (not 0's based)
  std::uint64_t starting_lba;
};
static_assert(sizeof(DatasetManagementRange) == 16);

/// Create I/O Completion Queue (Base 2.0, 5.4) and Create I/O Submission Queue (5.5).
struct CreateQueueFields {
  using QID = BitField<std::uint32_t, 0, 16>;     ///< CDW10 15:0 Queue Identifier
  using QSIZE = BitField<std::uint32_t, 16, 16>;  ///< CDW10 31:16 Queue Size, 0's based entries
  using PC = BitField<std::uint32_t, 0, 1>;       ///< CDW11 0 Physically Contiguous
  using IEN = BitField<std::uint32_t, 1, 1>;      ///< CDW11 1 Interrupts Enabled (CQ only)
  using QPRIO = BitField<std::uint32_t, 1, 2>;    ///< CDW11 2:1 Queue Priority (SQ only)
  using IV = BitField<std::uint32_t, 16, 16>;     ///< CDW11 31:16 Interrupt Vector (CQ only)
  using CQID = BitField<std::uint32_t, 16, 16>;   ///< CDW11 31:16 Completion Queue Identifier (SQ only)
};
/// Delete I/O SQ / CQ (Base 2.0, 5.6, 5.7): CDW10 15:0 QID.
struct DeleteQueueFields {
  using QID = BitField<std::uint32_t, 0, 16>;
};
/// Abort (Base 2.0, 5.1): CDW10 SQID 15:0, CID 31:16. Completion DW0 bit 0 = 1: not aborted.
struct AbortFields {
  using SQID = BitField<std::uint32_t, 0, 16>;
  using CID = BitField<std::uint32_t, 16, 16>;
  using NotAborted = BitField<std::uint32_t, 0, 1>;  ///< completion DW0 bit 0 (IANP)
};
/// Identify (Base 2.0, 5.17): CDW10 CNS 7:0, CNTID 31:16.
struct IdentifyFields {
  using CNS = BitField<std::uint32_t, 0, 8>;
  using CNTID = BitField<std::uint32_t, 16, 16>;
};
/// Get / Set Features (Base 2.0, 5.15, 5.27): CDW10 FID 7:0, SV 31 (Set); SEL 10:8 (Get).
struct FeatureFields {
  using FID = BitField<std::uint32_t, 0, 8>;
  using SEL = BitField<std::uint32_t, 8, 3>;
  using SV = BitField<std::uint32_t, 31, 1>;
};
/// Number of Queues feature (Base 2.0, 5.27.1.5): CDW11 and completion DW0, both 0's based.
struct NumberOfQueuesFields {
  using NSQR = BitField<std::uint32_t, 0, 16>;   ///< Number of I/O Submission Queues Requested / Allocated (NSQA)
  using NCQR = BitField<std::uint32_t, 16, 16>;  ///< Number of I/O Completion Queues Requested / Allocated (NCQA)
};
/// Get Log Page (Base 2.0, 5.16): CDW10 LID 7:0, NUMDL 31:16; CDW11 NUMDU 15:0 (dwords, 0's based).
struct GetLogPageFields {
  using LID = BitField<std::uint32_t, 0, 8>;
  using NUMDL = BitField<std::uint32_t, 16, 16>;
  using NUMDU = BitField<std::uint32_t, 0, 16>;
};

}  // namespace tutti::nvme
