// libFuzzer entry point of the tuttid protocol parser (clang -fsanitize=fuzzer; tests/daemon/meson.build):
// a broken invariant aborts, so the fuzzer saves the input.
#include <cstdio>
#include <cstdlib>

#include "protocol_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string broken = tutti::daemon::fuzz::run_one(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
