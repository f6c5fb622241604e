// Must NOT compile: something that is not a DataPath bound as one.
#include <tutti/tutti.hpp>

struct NotADataPath {
  using target_type = tutti::memfs::Target;
};

int main() {
  tutti::Backend<tutti::memfs::MemfsResolver, NotADataPath>* backend = nullptr;
  (void)sizeof(*backend);
}
