// The soft controller's data pointer decoder: PRP1/PRP2/PRP lists and SGLs of an SQE turned
// into bus address ranges, with the specification's status for every malformed input.
// Internal to libnvm (tests and the fuzzer include it through libnvm_internal_dep).
//
// NVMe Base Specification 2.0, 4.3.1 "Physical Region Page Entry and List" and 4.3.2 "Scatter
// Gather List (SGL)"; statuses from Figure 94 (Generic Command Status).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <tutti/nvme/commands.hpp>
#include <tutti/nvme/status.hpp>

namespace tutti::libnvm::soft {

/// One bus address range of a transfer, in transfer order.
struct BusSegment {
  std::uint64_t bus_address;
  std::uint64_t length;  ///< bytes, >= 1
  friend bool operator==(const BusSegment&, const BusSegment&) = default;
};

/// Reads `length` bytes of device-visible memory at `bus_address` into `destination` (used for
/// PRP lists and SGL segments). Returns false when any byte is outside every mapped region.
using BusReader = std::function<bool(std::uint64_t bus_address, void* destination, std::size_t length)>;

/// Limits the decoder enforces.
struct DecodeLimits {
  std::uint32_t page_size = 4096;            ///< CC.MPS memory page size, bytes
  bool sgl_supported = true;                 ///< Identify Controller SGLS 1:0 != 00b
  std::uint32_t max_sgl_descriptors = 8192;  ///< descriptors walked per command (bounds loops)
};

/// Result of decoding: status Successful Completion with the segments, or the error status.
/// dma_fault is true when the error is a read of a PRP list / SGL segment outside every mapped
/// region (status Data Transfer Error).
struct DecodeResult {
  nvme::StatusField status{};
  bool dma_fault = false;
  std::vector<BusSegment> segments;  ///< bus-contiguous neighbours merged
  std::uint32_t descriptors_walked = 0;
};

/// Decodes PRP1/PRP2 (PRP lists read through `reader`) for a transfer of `length` >= 1 bytes.
/// Errors: PRP Offset Invalid (PRP1 not dword aligned, PRP2 / list entry with a page offset,
/// list pointer not qword aligned); Invalid Field in Command (list chain makes no progress);
/// Data Transfer Error with dma_fault (list not mapped).
DecodeResult decode_prp(std::uint64_t prp1, std::uint64_t prp2, std::uint64_t length, const DecodeLimits& limits,
                        const BusReader& reader);

/// Decodes SGL Entry 1 (segments read through `reader`) for a transfer of `length` >= 1 bytes.
/// Errors: Invalid Field in Command (SGLs not supported); SGL Descriptor Type Invalid (bit
/// bucket, keyed, transport or reserved type, or a subtype other than Address); Invalid SGL
/// Segment Descriptor (segment length 0 or not a multiple of 16, a segment pointer that is not
/// the last descriptor of a Segment, or inside a Last Segment, a Segment without a pointer);
/// Invalid Number of SGL Descriptors (more than max_sgl_descriptors); Data SGL Length Invalid
/// (data blocks sum to less or more than `length`); Data Transfer Error with dma_fault.
DecodeResult decode_sgl(const nvme::SglDescriptor& sgl1, std::uint64_t length, const DecodeLimits& limits,
                        const BusReader& reader);

/// Dispatches on PSDT: 00b PRP, 01b SGL; 10b (MPTR holds an SGL) and 11b give Invalid Field in
/// Command (metadata is not supported).
DecodeResult decode_data_pointer(const nvme::SubmissionQueueEntry& sqe, std::uint64_t length,
                                 const DecodeLimits& limits, const BusReader& reader);

}  // namespace tutti::libnvm::soft
