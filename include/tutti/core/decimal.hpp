// Decimal numbers read from text (the uring DataPath's TUTTI_URING_* environment variables, memfs URI
// query values): one parser, so every reader refuses the same inputs (empty text, a sign, spaces,
// trailing characters, a value past the limit or past 64 bits).
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

namespace tutti {

/// The value of `text` when it is a decimal number (digits only) in 0..max, else nullopt.
/// Thread-safety: reentrant.
inline std::optional<std::uint64_t> parse_decimal(std::string_view text,
                                                  std::uint64_t max = ~std::uint64_t{0}) noexcept {
  std::uint64_t parsed = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || parsed > max) return std::nullopt;
  return parsed;
}

}  // namespace tutti
