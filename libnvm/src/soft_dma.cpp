// The soft controller's PRP and SGL decoder (see soft_dma.hpp).
#include "soft_dma.hpp"

#include <algorithm>
#include <array>

namespace tutti::libnvm::soft {
namespace {

using nvme::GenericStatus;
using nvme::make_status;

DecodeResult failure(GenericStatus status) {
  DecodeResult result;
  result.status = make_status(status, true);
  return result;
}

DecodeResult dma_failure() {
  DecodeResult result = failure(GenericStatus::data_transfer_error);
  result.dma_fault = true;
  return result;
}

void append(std::vector<BusSegment>& segments, std::uint64_t bus, std::uint64_t length) {
  if (length == 0) return;
  if (!segments.empty() && segments.back().bus_address + segments.back().length == bus) {
    segments.back().length += length;
    return;
  }
  segments.push_back(BusSegment{bus, length});
}

}  // namespace

DecodeResult decode_prp(std::uint64_t prp1, std::uint64_t prp2, std::uint64_t length, const DecodeLimits& limits,
                        const BusReader& reader) {
  const std::uint64_t page = limits.page_size;
  DecodeResult result;
  if (length == 0) return result;
  // PRP1: bits 1:0 shall be cleared (dword aligned), offset into the page allowed.
  if (prp1 % 4 != 0) return failure(GenericStatus::prp_offset_invalid);
  const std::uint64_t first = page - prp1 % page;
  if (length <= first) {
    append(result.segments, prp1, length);
    return result;
  }
  std::uint64_t remaining = length - first;
  append(result.segments, prp1, first);
  if (remaining <= page) {
    // PRP2 is a data page: offset shall be 0.
    if (prp2 % page != 0) return failure(GenericStatus::prp_offset_invalid);
    append(result.segments, prp2, remaining);
    return result;
  }
  // PRP2 points to a PRP list; entries are 8 bytes so the pointer is qword aligned.
  if (prp2 % 8 != 0) return failure(GenericStatus::prp_offset_invalid);
  const std::uint64_t data_entries = (remaining + page - 1) / page;
  std::uint64_t chain_hops = 0;
  std::uint64_t cursor = prp2;
  // Entries are read in runs (one reader call each; a list in accelerator memory costs one copy
  // per run, not per entry): never past the end of the current list page, never more entries
  // than the transfer still needs, so exactly the bytes a one-by-one walk reads are read.
  std::array<std::uint64_t, 64> run{};
  while (remaining > 0) {
    const std::uint64_t slots_to_page_end = (page - cursor % page) / 8;
    const std::uint64_t entries_needed = (remaining + page - 1) / page;
    const std::uint64_t count = std::min({slots_to_page_end, entries_needed, std::uint64_t{run.size()}});
    if (!reader(cursor, run.data(), count * sizeof(std::uint64_t))) return dma_failure();
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::uint64_t entry = run[i];
      ++result.descriptors_walked;
      const bool last_slot_of_page = cursor % page == page - 8;
      if (last_slot_of_page && remaining > page) {
        // More than one entry still needed: this slot chains to the next list page.
        if (entry % 8 != 0) return failure(GenericStatus::prp_offset_invalid);
        if (++chain_hops > data_entries) return failure(GenericStatus::invalid_field_in_command);
        cursor = entry;
        break;  // the chain slot is the last of the run
      }
      if (entry % page != 0) return failure(GenericStatus::prp_offset_invalid);
      const std::uint64_t chunk = std::min(remaining, page);
      append(result.segments, entry, chunk);
      remaining -= chunk;
      cursor += 8;
    }
  }
  return result;
}

DecodeResult decode_sgl(const nvme::SglDescriptor& sgl1, std::uint64_t length, const DecodeLimits& limits,
                        const BusReader& reader) {
  using Type = nvme::SglDescriptorType;
  if (!limits.sgl_supported) return failure(GenericStatus::invalid_field_in_command);
  DecodeResult result;
  std::uint64_t total = 0;
  auto add_data_block = [&](const nvme::SglDescriptor& d) -> bool {
    if (d.subtype() != static_cast<std::uint8_t>(nvme::SglDescriptorSubtype::address)) return false;
    append(result.segments, d.address, d.length);
    total += d.length;
    return true;
  };
  auto check_total = [&]() -> DecodeResult {
    // The SGL must describe exactly the transfer (SGLS bit 18, longer SGLs, is not supported).
    if (total != length) return failure(GenericStatus::data_sgl_length_invalid);
    return std::move(result);
  };

  switch (sgl1.type()) {
    case Type::data_block:
      result.descriptors_walked = 1;
      if (!add_data_block(sgl1)) return failure(GenericStatus::sgl_descriptor_type_invalid);
      return check_total();
    case Type::segment:
    case Type::last_segment: break;
    default: return failure(GenericStatus::sgl_descriptor_type_invalid);
  }

  nvme::SglDescriptor pointer = sgl1;
  std::vector<nvme::SglDescriptor> segment;
  for (;;) {
    if (pointer.subtype() != static_cast<std::uint8_t>(nvme::SglDescriptorSubtype::address))
      return failure(GenericStatus::sgl_descriptor_type_invalid);
    if (pointer.length == 0 || pointer.length % sizeof(nvme::SglDescriptor) != 0)
      return failure(GenericStatus::invalid_sgl_segment_descriptor);
    const std::uint32_t count = pointer.length / sizeof(nvme::SglDescriptor);
    if (static_cast<std::uint64_t>(result.descriptors_walked) + count > limits.max_sgl_descriptors)
      return failure(GenericStatus::invalid_number_of_sgl_descriptors);
    segment.resize(count);
    if (!reader(pointer.address, segment.data(), pointer.length)) return dma_failure();
    result.descriptors_walked += count;
    const bool is_last_segment = pointer.type() == Type::last_segment;
    bool has_next = false;
    for (std::uint32_t i = 0; i < count; ++i) {
      const nvme::SglDescriptor& d = segment[i];
      switch (d.type()) {
        case Type::data_block:
          if (!add_data_block(d)) return failure(GenericStatus::sgl_descriptor_type_invalid);
          break;
        case Type::segment:
        case Type::last_segment:
          // Only the last descriptor of a (non-last) Segment may point to the next segment.
          if (is_last_segment || i != count - 1) return failure(GenericStatus::invalid_sgl_segment_descriptor);
          pointer = d;
          has_next = true;
          break;
        default: return failure(GenericStatus::sgl_descriptor_type_invalid);
      }
      if (total > length) return failure(GenericStatus::data_sgl_length_invalid);
    }
    if (is_last_segment) break;
    if (!has_next) return failure(GenericStatus::invalid_sgl_segment_descriptor);
  }
  return check_total();
}

DecodeResult decode_data_pointer(const nvme::SubmissionQueueEntry& sqe, std::uint64_t length,
                                 const DecodeLimits& limits, const BusReader& reader) {
  switch (sqe.data_pointer_kind()) {
    case nvme::DataPointerKind::prp:
      return decode_prp(sqe.data_pointer.prp.prp1, sqe.data_pointer.prp.prp2, length, limits, reader);
    case nvme::DataPointerKind::sgl_contiguous_metadata:
      return decode_sgl(sqe.data_pointer.sgl1, length, limits, reader);
    default: return failure(GenericStatus::invalid_field_in_command);
  }
}

}  // namespace tutti::libnvm::soft
