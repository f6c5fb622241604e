// Figures over repeated runs (--repeat N): the median with the smallest and largest value, printed
// "0.95 [0.90-1.02]", so one lucky or unlucky run cannot pass for the result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace layerwise {

/// The median, minimum and maximum of a figure over `runs` runs (all 0 when runs is 0).
struct Spread {
  double median = 0;
  double min = 0;
  double max = 0;
  std::size_t runs = 0;
};

/// The spread of `values`; the median of an even count is the mean of the two middle values.
inline Spread spread_of(std::vector<double> values) {
  Spread s;
  s.runs = values.size();
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  const std::size_t mid = values.size() / 2;
  s.median = values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
  return s;
}

/// "0.95" for one run, "0.95 [0.90-1.02]" for several, with `decimals` digits after the point and
/// `suffix` after each number ("x" for ratios: "1.97x [1.90x-2.05x]").
inline std::string format_spread(const Spread& s, int decimals, const std::string& suffix = "") {
  if (s.runs <= 1) return fmt::format("{:.{}f}{}", s.median, decimals, suffix);
  return fmt::format("{:.{}f}{} [{:.{}f}{}-{:.{}f}{}]", s.median, decimals, suffix, s.min, decimals, suffix, s.max,
                     decimals, suffix);
}

/// The index of the run whose `keys` value is the median (the lower of the two middle ones for an
/// even count): the run whose detailed figures stand for all of them. 0 for an empty list.
inline std::size_t median_index(const std::vector<double>& keys) {
  if (keys.empty()) return 0;
  std::vector<std::size_t> order(keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  return order[(keys.size() - 1) / 2];
}

}  // namespace layerwise
