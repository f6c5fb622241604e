// What the C++ guest programs of the QEMU rig share: one "ok: ..." / "FAIL: ..." line per check, the count of
// failed checks that decides their exit status (tests/qemu/guest/suite.sh reads it), and the byte pattern
// the data-moving tests write and verify.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace guest {

inline int failures = 0;

/// Prints the verdict line of one check, counts it when it failed, returns `ok`.
inline bool check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
  return ok;
}

/// The byte at offset `o`: splitmix64 of the 8-byte word index, so every LBA differs.
inline std::uint8_t pattern(std::uint64_t o) {
  std::uint64_t z = o / 8 + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<std::uint8_t>(z >> (8 * (o % 8)));
}

}  // namespace guest
