// bench/support/verify_pattern.hpp, the check behind the benchmarks' --verify modes: a block passes
// only where it belongs (file and offset) and whole (one write's stamp throughout); poisoned, zeroed,
// shifted, foreign and torn blocks fail, and a run's write stamps are told from other runs'.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <verify_pattern.hpp>

using namespace tutti::bench;

namespace {
constexpr std::uint64_t kBlock = kPatternBlockBytes;

std::vector<std::byte> blocks(std::uint64_t file, std::uint64_t offset, std::uint64_t count, std::uint64_t stamp) {
  std::vector<std::byte> v(count * kBlock);
  fill_pattern(v.data(), file, offset, v.size(), stamp);
  return v;
}
}  // namespace

TEST_CASE("a block read from where it was written passes, whatever write stamped it") {
  CHECK(count_bad_blocks(blocks(3, 8 * kBlock, 4, 0).data(), 3, 8 * kBlock, 4 * kBlock) == 0);
  CHECK(count_bad_blocks(blocks(3, 8 * kBlock, 4, 0x1234'0000'0007).data(), 3, 8 * kBlock, 4 * kBlock) == 0);
}

TEST_CASE("poisoned or zeroed memory, another offset and another file fail block by block") {
  std::vector<std::byte> poison(2 * kBlock, std::byte{kPoisonByte}), zero(2 * kBlock);
  CHECK(count_bad_blocks(poison.data(), 0, 0, poison.size()) == 2);
  CHECK(count_bad_blocks(zero.data(), 0, 0, zero.size()) == 2);
  CHECK(count_bad_blocks(blocks(1, 0, 2, 0).data(), 1, kBlock, 2 * kBlock) == 2);  // read at the wrong offset
  CHECK(count_bad_blocks(blocks(1, 0, 2, 0).data(), 2, 0, 2 * kBlock) == 2);       // from the wrong file
}

TEST_CASE("a torn block (two writes) and a single flipped byte fail") {
  auto a = blocks(0, 0, 1, 5), b = blocks(0, 0, 1, 6);
  std::memcpy(a.data() + 2048, b.data() + 2048, 2048);  // second half from another write
  CHECK(count_bad_blocks(a.data(), 0, 0, kBlock) == 1);
  auto c = blocks(0, 0, 3, 0);
  c[kBlock + 1000] ^= std::byte{1};
  CHECK(count_bad_blocks(c.data(), 0, 0, 3 * kBlock) == 1);
}

TEST_CASE("a run's write stamps are its own and never the preparing pass's 0") {
  WriteStamps run, other;
  const std::uint64_t first = run.next(), second = run.next();
  CHECK(first != 0);
  CHECK(first != second);
  CHECK(run.ours(first));
  CHECK(run.ours(second));
  CHECK_FALSE(run.ours(0));
  CHECK(pattern_stamp(blocks(0, 0, 1, second).data()) == second);
  CHECK(other.ours(other.next()));
}
