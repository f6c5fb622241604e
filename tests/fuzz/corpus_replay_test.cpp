// Replays the committed fuzz corpus (tests/fuzz/corpus/) in every build, with any compiler.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "soft_controller_fuzz.hpp"

TEST_CASE("every committed fuzz corpus input keeps the soft controller's invariants") {
  const char* directory = std::getenv("TUTTI_FUZZ_CORPUS");
  REQUIRE_MESSAGE(directory != nullptr, "set TUTTI_FUZZ_CORPUS to tests/fuzz/corpus");
  std::size_t replayed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CAPTURE(entry.path().string());
    CHECK(tutti::fuzz::run_one(bytes.data(), bytes.size()) == "");
    ++replayed;
  }
  CHECK(replayed >= 10);
}

TEST_CASE("inputs shorter than an SQE are ignored") {
  const std::uint8_t tiny[3] = {0, 1, 2};
  CHECK(tutti::fuzz::run_one(tiny, sizeof tiny) == "");
}
