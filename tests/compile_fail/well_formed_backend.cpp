// Control: the same harness must compile a well-formed pair, so a broken harness cannot pass.
#include <tutti/tutti.hpp>

int main() {
  auto datapath = tutti::memfs::MemfsDataPath::create();
  if (!datapath) return 1;
  tutti::Backend<tutti::memfs::MemfsResolver, tutti::memfs::MemfsDataPath> backend{{}, std::move(datapath).value()};
  (void)backend;
}
