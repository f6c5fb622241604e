// Counts in messages with their noun: "1 queue", "2 queues", "0 leases". One spelling for every
// message a person reads (tuttid's refusals and log, tuttictl, the KV example's report).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tutti {

/// `n` and its noun, singular for exactly one: counted(1, "queue") is "1 queue", counted(0, "lease")
/// "0 leases". `plural` is `singular` + "s" unless given (counted(2, "index", "indices")).
/// Throws std::bad_alloc like any std::string. Thread-safety: reentrant.
inline std::string counted(std::uint64_t n, std::string_view singular, std::string_view plural = {}) {
  if (n == 1) return fmt::format("1 {}", singular);
  if (plural.empty()) return fmt::format("{} {}s", n, singular);
  return fmt::format("{} {}", n, plural);
}

}  // namespace tutti
