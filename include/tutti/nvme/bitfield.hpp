// Named bit fields of little-endian NVMe dwords and registers: the spec's "bits 19:16" written as
// a type, so no code outside this header shifts or masks a raw dword by hand.
//
//   using IOSQES = BitField<std::uint32_t, 16, 4>;   // CC bits 19:16
//   cc = IOSQES::encode(cc, 6);  IOSQES::decode(cc) == 6
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include <tutti/accel/config.hpp>

namespace tutti::nvme {

// NVMe structures are little-endian (NVMe Base Spec 2.0, 1.5 "Conventions"); so are x86-64,
// AArch64 and NVIDIA GPUs. The structs here are the wire format only on such hosts.
static_assert(std::endian::native == std::endian::little, "the NVMe structures assume a little-endian host");

/// Bits [Lsb, Lsb + Width) of an unsigned Raw value.
template <class Raw, unsigned Lsb, unsigned Width>
struct BitField {
  static_assert(std::is_unsigned_v<Raw>, "BitField needs an unsigned raw type");
  static_assert(Width >= 1 && Lsb + Width <= sizeof(Raw) * 8, "BitField out of the raw type");
  static constexpr unsigned lsb = Lsb;
  static constexpr unsigned width = Width;
  static constexpr Raw max =
      Width == sizeof(Raw) * 8 ? static_cast<Raw>(~Raw{0}) : static_cast<Raw>((Raw{1} << Width) - 1);
  static constexpr Raw mask = static_cast<Raw>(max << Lsb);

  /// The field's value.
  TUTTI_HOST_DEVICE static constexpr Raw decode(Raw raw) noexcept { return static_cast<Raw>((raw >> Lsb) & max); }
  /// `raw` with the field replaced by `value` (truncated to Width bits).
  TUTTI_HOST_DEVICE static constexpr Raw encode(Raw raw, Raw value) noexcept {
    return static_cast<Raw>((raw & static_cast<Raw>(~mask)) | static_cast<Raw>((value & max) << Lsb));
  }
};

}  // namespace tutti::nvme
