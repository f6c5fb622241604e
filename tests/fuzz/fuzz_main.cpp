// libFuzzer entry point (clang -fsanitize=fuzzer): a broken invariant aborts, so the fuzzer
// saves the input as a crash.
#include <cstdio>
#include <cstdlib>

#include "soft_controller_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string broken = tutti::fuzz::run_one(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
