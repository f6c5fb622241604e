// Replays a committed fuzz corpus in an ordinary test (any compiler, no libFuzzer): every regular
// file of the folder named by an environment variable goes through the fuzz target's run_one,
// which returns "" when the invariant holds and a description of the violation otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace tutti::testing {

/// CHECKs run_one(bytes, size) == "" for every regular file in the folder that environment
/// variable `variable` names (REQUIREd to be set; `hint` says to what), with the file's path
/// captured, and CHECKs that at least `minimum` inputs were replayed. Returns how many were.
template <class RunOne>
std::size_t replay_corpus(const char* variable, const char* hint, RunOne&& run_one, std::size_t minimum = 10) {
  const char* directory = std::getenv(variable);
  REQUIRE_MESSAGE(directory != nullptr, "set " << variable << " to " << hint);
  std::size_t replayed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CAPTURE(entry.path().string());
    CHECK(std::string(run_one(bytes.data(), bytes.size())) == "");
    ++replayed;
  }
  CHECK(replayed >= minimum);
  return replayed;
}

}  // namespace tutti::testing
