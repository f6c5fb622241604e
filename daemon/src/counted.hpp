// Counts in the daemon's messages with their noun: "1 queue", "2 queues". tuttid's refusals reach tuttictl
// and every client (the KV example prints them), and its log reaches the journal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace tutti::daemon {

/// `n` and its noun, singular for exactly one: counted(1, "queue") is "1 queue", counted(0, "lease") "0 leases".
/// `plural` is `singular` + "s" unless given.
inline std::string counted(std::uint64_t n, std::string_view singular, std::string_view plural = {}) {
  if (n == 1) return fmt::format("1 {}", singular);
  if (plural.empty()) return fmt::format("{} {}s", n, singular);
  return fmt::format("{} {}", n, plural);
}

}  // namespace tutti::daemon
