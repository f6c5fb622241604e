// Identify Controller and Identify Namespace data structures (4096 bytes each), the fields Tutti
// uses named, the rest reserved bytes, offsets asserted.
//
// NVMe Base Specification 2.0, 5.17.2.1 "Identify Controller data structure" (Figure 275);
// NVM Command Set Specification 1.0, 4.1.5.1 "Identify Namespace data structure" (Figure 97) and
// Figure 98 "LBA Format Data Structure".
#pragma once

#include <cstddef>
#include <cstdint>

#include <tutti/nvme/bitfield.hpp>

namespace tutti::nvme {

/// Identify Controller data structure (CNS 01h), 4096 bytes.
struct IdentifyController {
  std::uint16_t vid;     ///< 01:00 PCI Vendor ID
  std::uint16_t ssvid;   ///< 03:02 PCI Subsystem Vendor ID
  char sn[20];           ///< 23:04 Serial Number, ASCII, space padded
  char mn[40];           ///< 63:24 Model Number, ASCII, space padded
  char fr[8];            ///< 71:64 Firmware Revision
  std::uint8_t rab;      ///< 72 Recommended Arbitration Burst
  std::uint8_t ieee[3];  ///< 75:73 IEEE OUI
  std::uint8_t cmic;     ///< 76 Controller Multi-Path I/O and Namespace Sharing Capabilities
  std::uint8_t mdts;     ///< 77 Maximum Data Transfer Size: 2^MDTS units of CAP.MPSMIN pages; 0 = no limit
  std::uint16_t cntlid;  ///< 79:78 Controller ID
  std::uint32_t ver;     ///< 83:80 Version (as VS)
  std::uint8_t reserved_84[256 - 84];     ///< 255:84 (RTD3, OAES, CTRATT, ..., not used here)
  std::uint16_t oacs;                     ///< 257:256 Optional Admin Command Support
  std::uint8_t acl;                       ///< 258 Abort Command Limit, 0's based
  std::uint8_t aerl;                      ///< 259 Asynchronous Event Request Limit, 0's based
  std::uint8_t frmw;                      ///< 260 Firmware Updates
  std::uint8_t lpa;                       ///< 261 Log Page Attributes
  std::uint8_t elpe;                      ///< 262 Error Log Page Entries, 0's based
  std::uint8_t npss;                      ///< 263 Number of Power States Support, 0's based
  std::uint8_t reserved_264[512 - 264];   ///< 511:264
  std::uint8_t sqes;                      ///< 512 Submission Queue Entry Size: 3:0 required, 7:4 maximum (log2 bytes)
  std::uint8_t cqes;                      ///< 513 Completion Queue Entry Size: 3:0 required, 7:4 maximum (log2 bytes)
  std::uint16_t maxcmd;                   ///< 515:514 Maximum Outstanding Commands (fabrics; 0 here)
  std::uint32_t nn;                       ///< 519:516 Number of Namespaces (maximum NSID)
  std::uint16_t oncs;                     ///< 521:520 Optional NVM Command Support (see OncsBits)
  std::uint16_t fuses;                    ///< 523:522 Fused Operation Support
  std::uint8_t fna;                       ///< 524 Format NVM Attributes
  std::uint8_t vwc;                       ///< 525 Volatile Write Cache (see VwcBits)
  std::uint16_t awun;                     ///< 527:526 Atomic Write Unit Normal, 0's based LBAs
  std::uint16_t awupf;                    ///< 529:528 Atomic Write Unit Power Fail, 0's based LBAs
  std::uint8_t icsvscc;                   ///< 530
  std::uint8_t nwpc;                      ///< 531
  std::uint16_t acwu;                     ///< 533:532
  std::uint16_t ocfs;                     ///< 535:534
  std::uint32_t sgls;                     ///< 539:536 SGL Support (see SglsBits)
  std::uint8_t reserved_540[4096 - 540];  ///< 4095:540 (SUBNQN, power states, vendor specific)

  /// ONCS bits (Base 2.0, Figure 275, bytes 521:520).
  struct OncsBits {
    using Compare = BitField<std::uint16_t, 0, 1>;
    using WriteUncorrectable = BitField<std::uint16_t, 1, 1>;
    using DatasetManagement = BitField<std::uint16_t, 2, 1>;
    using WriteZeroes = BitField<std::uint16_t, 3, 1>;
  };
  /// VWC bits (Base 2.0, Figure 275, byte 525).
  struct VwcBits {
    using Present = BitField<std::uint8_t, 0, 1>;        ///< a volatile write cache is present
    using FlushBehavior = BitField<std::uint8_t, 1, 2>;  ///< Flush with NSID FFFFFFFFh: 10b unsupported, 11b supported
  };
  /// SGLS bits (Base 2.0, Figure 275, bytes 539:536).
  struct SglsBits {
    using SglSupport = BitField<std::uint32_t, 0, 2>;  ///< 00b none, 01b any alignment, 10b dword aligned
    using KeyedSgl = BitField<std::uint32_t, 2, 1>;
    using BitBucket = BitField<std::uint32_t, 16, 1>;
    using LengthLargerThanData = BitField<std::uint32_t, 18, 1>;  ///< SGL may describe more than the transfer
    using MptrContainsSgl = BitField<std::uint32_t, 19, 1>;
  };
  /// Maximum data transfer size in bytes for a memory page size of `page_size_minimum` bytes
  /// (CAP.MPSMIN); 0 means no limit.
  TUTTI_HOST_DEVICE constexpr std::uint64_t max_data_transfer_bytes(std::uint64_t page_size_minimum) const noexcept {
    return mdts == 0 ? 0 : page_size_minimum << mdts;
  }
  /// ONCS bit 3: the Write Zeroes command is supported.
  TUTTI_HOST_DEVICE constexpr bool write_zeroes_supported() const noexcept {
    return OncsBits::WriteZeroes::decode(oncs) != 0;
  }
  /// ONCS bit 2: the Dataset Management command is supported.
  TUTTI_HOST_DEVICE constexpr bool dataset_management_supported() const noexcept {
    return OncsBits::DatasetManagement::decode(oncs) != 0;
  }
  /// VWC bit 0: a volatile write cache is present (writes are durable only after a Flush).
  TUTTI_HOST_DEVICE constexpr bool volatile_write_cache_present() const noexcept {
    return VwcBits::Present::decode(vwc) != 0;
  }
  /// True when the controller accepts SGLs for NVM commands.
  TUTTI_HOST_DEVICE constexpr bool sgl_supported() const noexcept { return SglsBits::SglSupport::decode(sgls) != 0; }
};
static_assert(sizeof(IdentifyController) == 4096);
static_assert(offsetof(IdentifyController, sn) == 4);
static_assert(offsetof(IdentifyController, mn) == 24);
static_assert(offsetof(IdentifyController, fr) == 64);
static_assert(offsetof(IdentifyController, mdts) == 77);
static_assert(offsetof(IdentifyController, cntlid) == 78);
static_assert(offsetof(IdentifyController, ver) == 80);
static_assert(offsetof(IdentifyController, oacs) == 256);
static_assert(offsetof(IdentifyController, acl) == 258);
static_assert(offsetof(IdentifyController, sqes) == 512);
static_assert(offsetof(IdentifyController, nn) == 516);
static_assert(offsetof(IdentifyController, oncs) == 520);
static_assert(offsetof(IdentifyController, vwc) == 525);
static_assert(offsetof(IdentifyController, sgls) == 536);

/// LBA Format Data Structure, 4 bytes (NVM 1.0, Figure 98).
struct LbaFormat {
  std::uint32_t raw;
  using MS = BitField<std::uint32_t, 0, 16>;     ///< Metadata Size, bytes per LBA
  using LBADS = BitField<std::uint32_t, 16, 8>;  ///< LBA Data Size: 2^LBADS bytes (>= 9)
  using RP = BitField<std::uint32_t, 24, 2>;     ///< Relative Performance
  TUTTI_HOST_DEVICE constexpr std::uint64_t lba_size_bytes() const noexcept {
    const auto lbads = LBADS::decode(raw);
    return lbads < 9 || lbads > 31 ? 0 : (std::uint64_t{1} << lbads);
  }
  TUTTI_HOST_DEVICE static constexpr LbaFormat make(std::uint32_t lbads, std::uint32_t metadata_size = 0) noexcept {
    return LbaFormat{LBADS::encode(MS::encode(0, metadata_size), lbads)};
  }
};
static_assert(sizeof(LbaFormat) == 4);

/// Identify Namespace data structure for the NVM command set (CNS 00h), 4096 bytes.
struct IdentifyNamespace {
  std::uint64_t nsze;   ///< 07:00 Namespace Size, LBAs
  std::uint64_t ncap;   ///< 15:08 Namespace Capacity, LBAs
  std::uint64_t nuse;   ///< 23:16 Namespace Utilization, LBAs
  std::uint8_t nsfeat;  ///< 24 Namespace Features
  std::uint8_t nlbaf;   ///< 25 Number of LBA Formats, 0's based
  std::uint8_t flbas;   ///< 26 Formatted LBA Size (see Flbas)
  std::uint8_t mc;      ///< 27 Metadata Capabilities
  std::uint8_t dpc;     ///< 28 End-to-end Data Protection Capabilities
  std::uint8_t dps;     ///< 29 End-to-end Data Protection Type Settings
  std::uint8_t nmic;    ///< 30
  std::uint8_t rescap;  ///< 31
  std::uint8_t fpi;     ///< 32
  std::uint8_t dlfeat;  ///< 33 Deallocate Logical Block Features: 2:0 = 001b reads of deallocated LBAs return zeroes
  std::uint8_t reserved_34[128 - 34];  ///< 127:34 (NAWUN ... EUI64)
  LbaFormat lbaf[64];                  ///< 383:128 LBA Format 0..63
  std::uint8_t reserved_384[4096 - 384];

  /// FLBAS fields (NVM 1.0, Figure 97 byte 26): format index = (high << 4) | low.
  struct Flbas {
    using FormatIndexLow = BitField<std::uint8_t, 0, 4>;
    using MetadataExtended = BitField<std::uint8_t, 4, 1>;
    using FormatIndexHigh = BitField<std::uint8_t, 5, 2>;
  };
  /// Index of the LBA format in use (0..63).
  TUTTI_HOST_DEVICE constexpr std::uint32_t lba_format_index() const noexcept {
    return static_cast<std::uint32_t>(Flbas::FormatIndexHigh::decode(flbas) << 4) |
           Flbas::FormatIndexLow::decode(flbas);
  }
  /// LBA size in bytes of the format in use; 0 if the structure is malformed.
  TUTTI_HOST_DEVICE constexpr std::uint64_t lba_size_bytes() const noexcept {
    const auto index = lba_format_index();
    return index > nlbaf ? 0 : lbaf[index].lba_size_bytes();
  }
  /// DLFEAT 2:0 = 001b: a deallocated LBA reads as zeroes.
  using DeallocatedReadsZeroes = BitField<std::uint8_t, 0, 3>;
};
static_assert(sizeof(IdentifyNamespace) == 4096);
static_assert(offsetof(IdentifyNamespace, ncap) == 8);
static_assert(offsetof(IdentifyNamespace, nlbaf) == 25);
static_assert(offsetof(IdentifyNamespace, flbas) == 26);
static_assert(offsetof(IdentifyNamespace, dlfeat) == 33);
static_assert(offsetof(IdentifyNamespace, lbaf) == 128);

/// SMART / Health Information log page (Base 2.0, 5.16.1.3, Figure 207), the counters used here.
struct SmartHealthLog {
  std::uint8_t critical_warning;           ///< 0
  std::uint8_t composite_temperature[2];   ///< 2:1 Kelvin, little-endian (unaligned in the page)
  std::uint8_t available_spare;            ///< 3
  std::uint8_t available_spare_threshold;  ///< 4
  std::uint8_t percentage_used;            ///< 5
  std::uint8_t reserved_6[32 - 6];
  std::uint64_t data_units_read[2];      ///< 47:32 in thousands of 512-byte units (128-bit)
  std::uint64_t data_units_written[2];   ///< 63:48
  std::uint64_t host_read_commands[2];   ///< 79:64
  std::uint64_t host_write_commands[2];  ///< 95:80
  std::uint8_t reserved_96[160 - 96];
  std::uint64_t media_errors[2];  ///< 175:160
  std::uint8_t reserved_176[512 - 176];
};
static_assert(sizeof(SmartHealthLog) == 512);
static_assert(offsetof(SmartHealthLog, composite_temperature) == 1);
static_assert(offsetof(SmartHealthLog, data_units_read) == 32);
static_assert(offsetof(SmartHealthLog, host_write_commands) == 80);
static_assert(offsetof(SmartHealthLog, media_errors) == 160);

}  // namespace tutti::nvme
