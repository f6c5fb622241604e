// CLI11 helpers shared by the benchmarks' command lines (header-only; needs CLI11).
//   parse_flags: runs the parse with the benchmarks' exit statuses.
//   kDecimal: the text is a plain decimal number (digits only, no leading zero). CLI11 2.1 converts integers with
//   strtoull(..., base 0), which takes "010" as 8, "0x10" as 16 and accepts "+5" and " 5"; put this
//   check before a CLI::Range so that a flag means what its digits say.
//   kNotEmpty: the text is not empty (a path).
#pragma once

#include <algorithm>
#include <string>

#include <CLI/CLI.hpp>

namespace tutti::bench {

inline const CLI::Validator kDecimal(
    [](std::string& text) -> std::string {
      const bool digits =
          !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
      const bool leading_zero = text.size() > 1 && text[0] == '0';  // CLI11 would read it as octal
      return digits && !leading_zero ? std::string()
                                     : "'" + text + "' is not a decimal number (digits 0-9, no leading zero)";
    },
    "DECIMAL");

/// Parses argv with `app`. Returns -1 to run the benchmark; otherwise the process exit status:
/// 0 after --help (printed), 2 on a bad flag (CLI11 printed why, naming the flag).
inline int parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

inline const CLI::Validator kNotEmpty(
    [](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; }, "NOT EMPTY");

}  // namespace tutti::bench
