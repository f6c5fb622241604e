// doctest main for suites that need root (loop devices, mounts, drop_caches): exits 77 (meson's
// "skipped") when not root, so an unprivileged run says so instead of failing or passing silently.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (geteuid() != 0) {
    std::puts("SKIP: this suite needs root (loop devices and mounts)");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
