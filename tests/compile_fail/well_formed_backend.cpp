// Control: the same harness must compile a well-formed pair, so a broken harness cannot pass.
#include <tutti/tutti.hpp>

int main() {
  tutti::Backend<tutti::memfs::Resolver, tutti::memfs::DataPath> backend{};
  (void)backend;
}
