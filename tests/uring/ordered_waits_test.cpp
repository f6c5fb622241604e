// bench/support/ordered_waits.hpp, the byte count of gpu_kv_read's uring pass: when a wait fails, the
// pass counts only the bytes the runtime confirmed, never every unit it submitted. A real file is
// truncated under an open uring target, so the later reads fail OUT_OF_RANGE (docs/uring.md).
#include <unistd.h>

#include <deque>

#include <ordered_waits.hpp>

#include "uring_test_support.hpp"

using namespace tutti;
using namespace tutti::testing;

TEST_CASE("a failed wait ends the pass and counts only confirmed bytes, not every submitted unit") {
  constexpr std::uint64_t kUnit = 4096, kUnitsPerIo = 4, kIos = 4;
  TempDirectory dir;
  const std::string path = dir.file("layer");
  write_pattern_file(path, kIos * kUnitsPerIo * kUnit, 5);
  UringRuntime runtime = require_ok(make_uring_runtime());
  auto target = require_ok(runtime.open("file://" + path));
  AlignedBuffer buffer(kIos * kUnitsPerIo * kUnit);
  auto memory = require_ok(runtime.register_memory(buffer.view()));
  REQUIRE(::truncate(path.c_str(), 6 * kUnit) == 0);  // units 6.. are gone: IO 1 fails half way

  std::deque<IoHandle> in_flight;
  std::uint64_t next_io = 0, submitted_bytes = 0;
  auto submit_next = [&] {
    if (next_io == kIos) return;
    std::vector<IoRequest> requests;
    for (std::uint64_t u = next_io * kUnitsPerIo; u < (next_io + 1) * kUnitsPerIo; ++u)
      requests.push_back({Direction::READ, memory, u * kUnit, target, u * kUnit, kUnit});
    auto outcome = runtime.submit(requests);
    REQUIRE(outcome.accepted == kUnitsPerIo);
    submitted_bytes += kUnitsPerIo * kUnit;
    in_flight.push_back(outcome.io);
    ++next_io;
  };
  submit_next();
  submit_next();
  const bench::OrderedWaits waited = bench::wait_in_order(runtime, in_flight, 30 * kSecond, submit_next);
  CHECK(waited.completed_ios == 1);
  CHECK(waited.confirmed_bytes == 6 * kUnit);         // IO 0 whole, units 4 and 5 of IO 1
  CHECK(submitted_bytes == 3 * kUnitsPerIo * kUnit);  // what the old count reported
  CHECK(waited.error.find("OUT_OF_RANGE") != std::string::npos);
  CHECK(in_flight.size() == 2);  // the failed IO and the one behind it: not counted
  CHECK(matches_pattern(buffer.get(), 0, 6 * kUnit, 5));
}
