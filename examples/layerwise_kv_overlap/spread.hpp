// Figures over repeated runs (--repeat N): the median with the smallest and largest value, printed
// "0.95 [0.90-1.02]", so one lucky or unlucky run cannot pass for the result; and the verdict drawn from
// a ratio's spread, which says "inconclusive" when the runs disagree on which side of 1x it lies.
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

/// What a ratio tutti/baseline over the runs says: BEAT from a median of 1.05x, SLOWER up to 0.95x, MATCHED
/// in between; but when several runs' min-max range crosses 1x (min < 1 < max: faster in some runs, slower in
/// others), INCONCLUSIVE, whatever the median, unless the whole range lies within 0.95x-1.05x (MATCHED: every
/// run within 5%). One run has no range: its ratio decides.
enum class Comparison { BEAT, SLOWER, MATCHED, INCONCLUSIVE };

inline constexpr double kBeatRatio = 1.05;
inline constexpr double kSlowerRatio = 0.95;

inline Comparison compare_ratio(const Spread& ratio) {
  if (ratio.runs > 1 && ratio.min < 1.0 && ratio.max > 1.0)
    return ratio.min >= kSlowerRatio && ratio.max <= kBeatRatio ? Comparison::MATCHED : Comparison::INCONCLUSIVE;
  if (ratio.median >= kBeatRatio) return Comparison::BEAT;
  if (ratio.median <= kSlowerRatio) return Comparison::SLOWER;
  return Comparison::MATCHED;
}

/// The comparison's name in the JSON report: "beat", "slower", "matched" or "inconclusive".
inline const char* comparison_name(Comparison c) {
  switch (c) {
    case Comparison::BEAT: return "beat";
    case Comparison::SLOWER: return "slower";
    case Comparison::MATCHED: return "matched";
    case Comparison::INCONCLUSIVE: return "inconclusive";
  }
  return "?";
}

/// The verdict's words for the restore against `baseline` ("pread 1 thread"), from the spread of the ratio
/// tutti/baseline: "restore beat pread 1 thread by 1.31x [1.20x-1.40x]", "restore was slower than ... (0.80x)",
/// "restore matched ... (1.01x [0.98x-1.03x])", or, when the range crosses 1x, "restore against ...
/// inconclusive: 1.30x [0.90x-1.50x] over 3 runs, faster in some, slower in others".
inline std::string comparison_words(const Spread& ratio, const std::string& baseline) {
  const std::string figures = format_spread(ratio, 2, "x");
  switch (compare_ratio(ratio)) {
    case Comparison::BEAT: return fmt::format("restore beat {} by {}", baseline, figures);
    case Comparison::SLOWER: return fmt::format("restore was slower than {} ({})", baseline, figures);
    case Comparison::MATCHED: return fmt::format("restore matched {} ({})", baseline, figures);
    case Comparison::INCONCLUSIVE:
      return fmt::format("restore against {} inconclusive: {} over {} runs, faster in some, slower in others", baseline,
                         figures, ratio.runs);
  }
  return figures;
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
