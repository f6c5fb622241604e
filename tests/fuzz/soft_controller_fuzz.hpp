// One fuzz input run through the soft controller: an arbitrary SQE and arbitrary PRP list / SGL
// segment bytes. Shared by the libFuzzer target and the corpus replay test.
//
// Input layout:
//   byte 0       mode: bit 0 = admin queue (only non-mutating admin opcodes are sent),
//                      bit 1 = skip the controller (decoder only)
//   bytes 1-64   the SQE (the CID is overwritten)
//   bytes 65-    up to 8 KiB copied into a DMA-mapped descriptor area (PRP lists, SGL segments)
// Address words (PRP1, PRP2, SGL1 address, and every 8-byte word of the area) with bit 63 set
// are rebased to region_bus + (word & 0xfffff); with bit 62 set (and 63 clear) to area_bus +
// (word & 0x1fff): this lets the fuzzer reach mapped memory without knowing bus addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti::fuzz {

/// Runs one input. Returns an empty string when every invariant held, else what broke:
/// a command that got no completion in 2 s, a decoded transfer whose length differs from the
/// command's, or a controller that became fatal.
std::string run_one(const std::uint8_t* data, std::size_t size);

}  // namespace tutti::fuzz
