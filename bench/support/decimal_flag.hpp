// parse_decimal_flag: the checked command-line number parser shared by the GPU read benchmarks
// (bench/uring/gpu_kv_read.cpp, bench/gpu/local_nvme_read.cu). Header-only, no dependency beyond
// the C++ standard library, so any benchmark can include it by relative path.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace tutti::bench {

/// The decimal number `text` given for `flag`, at most `max`. On anything else it prints
/// "<program>: <flag> = '<text>' is not a decimal number" or "<program>: <flag> = <value> exceeds
/// the limit of <max>" to stderr and exits the process with status 2 (a benchmark's "bad flags").
/// Refused: an empty string, a sign or leading space (strtoull alone takes "-4096" as 2^64 - 4096,
/// which then wraps every size product), trailing characters, values past 2^64 - 1 (ERANGE), and
/// values above `max` (so that a later cast to 32 bits cannot turn 2^32 + 2 into 2: pass the
/// narrower type's limit). Thread-safety: reads errno; call it from one thread, before the run.
inline std::uint64_t parse_decimal_flag(std::string_view program, const char* flag, const char* text, std::uint64_t max) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (text[0] < '0' || text[0] > '9' || errno != 0 || end == text || *end != '\0') {
    std::fprintf(stderr, "%.*s: %s = '%s' is not a decimal number\n", static_cast<int>(program.size()), program.data(), flag,
                 text);
    std::exit(2);
  }
  if (v > max) {
    std::fprintf(stderr, "%.*s: %s = %llu exceeds the limit of %llu\n", static_cast<int>(program.size()), program.data(), flag,
                 v, static_cast<unsigned long long>(max));
    std::exit(2);
  }
  return v;
}

}  // namespace tutti::bench
