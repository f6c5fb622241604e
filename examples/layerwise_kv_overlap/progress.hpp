// What the example says while it works, on stderr: the progress of a long step, byte counts in
// binary units, and counts with their noun ("1 tensor", "2 tensors"). On a terminal a bar is redrawn in place ("\r"),
// at most ten times a second; anywhere else (a log, a pipe, CI) one line every few seconds and one when the step ends,
// so a log never gets a line of carriage returns.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <tutti/core/clock.hpp>
#include <tutti/core/counted.hpp>

namespace layerwise {

using tutti::counted;  // "1 tensor", "2 tensors" (tutti/core/counted.hpp)

/// "512 KiB", "1.25 GiB", "960.0 MiB": bytes in binary units (KiB = 1024 bytes), three significant
/// digits above KiB; whole bytes below 1 KiB ("1 byte", "512 bytes").
inline std::string format_bytes(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return counted(bytes, "byte");
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (value == static_cast<double>(static_cast<std::uint64_t>(value)))
    return fmt::format("{:.0f} {}", value, kUnits[unit]);
  return fmt::format("{:.{}f} {}", value, value >= 100 ? 0 : value >= 10 ? 1 : 2, kUnits[unit]);
}

/// The progress of one step of `total` units (bytes or items), reported to `out`. Not thread-safe:
/// one thread calls update(). A step of total 0 prints only its end line.
class Progress {
 public:
  enum class Unit { items, bytes };
  /// Log mode: at most one line per this interval, plus the end line.
  static constexpr std::uint64_t kLogIntervalNs = 5'000'000'000;
  /// Terminal mode: at most one redraw per this interval, plus the first and the last.
  static constexpr std::uint64_t kRedrawIntervalNs = 100'000'000;
  static constexpr int kBarWidth = 40;

  /// `terminal`: draw a bar (true) or print lines (false); by default whether `out` is a terminal.
  /// `now_ns`: the clock (tests pass their own).
  Progress(std::string what, std::uint64_t total, Unit unit, std::FILE* out = stderr, int terminal = -1,
           std::function<std::uint64_t()> now_ns = tutti::monotonic_ns)
      : what_(std::move(what)),
        total_(total),
        unit_(unit),
        out_(out),
        terminal_(terminal < 0 ? ::isatty(::fileno(out)) == 1 : terminal == 1),
        now_ns_(std::move(now_ns)),
        start_ns_(now_ns_()),
        last_line_ns_(start_ns_) {}

  /// Reports `done` units of `total` (clamped to total); the update reaching total ends the step.
  void update(std::uint64_t done) {
    done = std::min(done, total_);
    if (finished_) return;
    const std::uint64_t now = now_ns_();
    const bool end = done == total_;
    if (terminal_) {
      if (!end && drawn_ && now - last_line_ns_ < kRedrawIntervalNs) return;
      drawn_ = true;
      last_line_ns_ = now;
      const int filled = total_ ? static_cast<int>(done * kBarWidth / total_) : kBarWidth;
      fmt::print(out_, "\r{} [{}{}] {}", what_, std::string(static_cast<std::size_t>(filled), '#'),
                 std::string(static_cast<std::size_t>(kBarWidth - filled), '.'), amount(done));
      if (end) fmt::print(out_, "\n");
    } else if (end) {
      fmt::print(out_, "{}: done, {} in {:.1f} s\n", what_, amount(done), static_cast<double>(now - start_ns_) / 1e9);
    } else if (now - last_line_ns_ >= kLogIntervalNs) {
      fmt::print(out_, "{}: {}% ({}) after {:.0f} s\n", what_, total_ ? done * 100 / total_ : 100, amount(done),
                 static_cast<double>(now - start_ns_) / 1e9);
      last_line_ns_ = now;
    }
    std::fflush(out_);
    finished_ = end;
  }

 private:
  std::string amount(std::uint64_t done) const {
    if (unit_ == Unit::bytes) return fmt::format("{} of {}", format_bytes(done), format_bytes(total_));
    return fmt::format("{}/{}", done, total_);
  }

  std::string what_;
  std::uint64_t total_;
  Unit unit_;
  std::FILE* out_;
  bool terminal_;
  std::function<std::uint64_t()> now_ns_;
  std::uint64_t start_ns_;
  std::uint64_t last_line_ns_;
  bool finished_ = false;
  bool drawn_ = false;
};

}  // namespace layerwise
