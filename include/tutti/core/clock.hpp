// Time in nanoseconds on the host: the one monotonic clock and the saturating deadline arithmetic
// every bounded wait of the library uses (the runtime's wait and shutdown, the DataPaths' progress
// and drain loops, accel::timer_ns in the host pass).
//
// Units: nanoseconds of std::chrono::steady_clock since an unspecified epoch. Deadlines never wrap:
// a budget of UINT64_MAX means "forever", and every sum saturates at UINT64_MAX.
// Thread-safety: every function is safe to call from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tutti {

/// Monotonic time in nanoseconds (std::chrono::steady_clock).
inline std::uint64_t monotonic_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

/// a + b without wrapping: saturates at UINT64_MAX. constexpr, so device code may call it too.
constexpr std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/// The largest budget handed to a DataPath or to std::chrono, in ns (2^62 ns, about 146 years):
/// "forever" without overflowing std::chrono's signed 64-bit nanosecond count.
inline constexpr std::uint64_t kMaxBudgetNs = std::uint64_t{1} << 62;

/// The deadline `budget_ns` from now on the monotonic_ns clock, saturating instead of wrapping.
inline std::uint64_t deadline_after_ns(std::uint64_t budget_ns) noexcept {
  return saturating_add(monotonic_ns(), budget_ns);
}

/// The nanoseconds left until `deadline_ns` (0 once it passed), capped at kMaxBudgetNs.
inline std::uint64_t remaining_ns(std::uint64_t deadline_ns) noexcept {
  const std::uint64_t now = monotonic_ns();
  return deadline_ns > now ? std::min(deadline_ns - now, kMaxBudgetNs) : 0;
}

/// A budget as a std::chrono duration, capped at kMaxBudgetNs (for wait_for / try_lock_for).
inline std::chrono::nanoseconds as_duration(std::uint64_t budget_ns) noexcept {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::min(budget_ns, kMaxBudgetNs)));
}

}  // namespace tutti
