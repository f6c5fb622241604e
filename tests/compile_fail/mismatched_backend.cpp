// Must NOT compile: a resolver whose payload differs from the DataPath's payload.
#include <tutti/tutti.hpp>

struct OtherPayload {
  std::uint64_t size_bytes() const { return 0; }
};
struct OtherResolver {
  using target_type = OtherPayload;
  static constexpr std::string_view scheme = "other";
  tutti::Result<OtherPayload> resolve(std::string_view, const tutti::OpenOptions&) { return OtherPayload{}; }
};

int main() {
  tutti::Backend<OtherResolver, tutti::memfs::MemfsDataPath> backend{};
  (void)backend;
}
