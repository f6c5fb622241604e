// Replays the committed fuzz corpus (tests/fuzz/corpus/) in every build, with any compiler.
#include <doctest/doctest.h>

#include <cstdint>

#include "corpus_replay.hpp"  // tests/support
#include "soft_controller_fuzz.hpp"

TEST_CASE("every committed fuzz corpus input keeps the soft controller's invariants") {
  tutti::testing::replay_corpus("TUTTI_FUZZ_CORPUS", "tests/fuzz/corpus", tutti::fuzz::run_one);
}

TEST_CASE("inputs shorter than an SQE are ignored") {
  const std::uint8_t tiny[3] = {0, 1, 2};
  CHECK(tutti::fuzz::run_one(tiny, sizeof tiny) == "");
}
