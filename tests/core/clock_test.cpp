// core/clock.hpp: the one monotonic clock and its saturating deadline arithmetic.
#include <doctest/doctest.h>

#include <cstdint>

#include <tutti/core/clock.hpp>

using namespace tutti;

TEST_CASE("saturating_add stops at UINT64_MAX instead of wrapping") {
  CHECK(saturating_add(1, 2) == 3);
  CHECK(saturating_add(UINT64_MAX - 1, 1) == UINT64_MAX);
  CHECK(saturating_add(UINT64_MAX - 1, 2) == UINT64_MAX);
  CHECK(saturating_add(UINT64_MAX, UINT64_MAX) == UINT64_MAX);
  static_assert(saturating_add(UINT64_MAX, 1) == UINT64_MAX);
}

TEST_CASE("a deadline of UINT64_MAX nanoseconds lies in the future, never in the past") {
  const std::uint64_t before = monotonic_ns();
  CHECK(deadline_after_ns(UINT64_MAX) == UINT64_MAX);
  CHECK(deadline_after_ns(0) >= before);
  CHECK(remaining_ns(deadline_after_ns(UINT64_MAX)) == kMaxBudgetNs);
}

TEST_CASE("remaining_ns is 0 once the deadline passed and never more than the budget") {
  CHECK(remaining_ns(0) == 0);
  CHECK(remaining_ns(monotonic_ns()) == 0);
  const std::uint64_t budget = 10'000'000'000;  // 10 s
  CHECK(remaining_ns(deadline_after_ns(budget)) <= budget);
  CHECK(as_duration(UINT64_MAX).count() == static_cast<std::int64_t>(kMaxBudgetNs));
}

TEST_CASE("monotonic_ns never goes backwards") {
  std::uint64_t last = monotonic_ns();
  for (int i = 0; i < 10000; ++i) {
    const std::uint64_t now = monotonic_ns();
    REQUIRE(now >= last);
    last = now;
  }
}
