// The host-compiled user of local_nvme_host_unit.hpp (see there).
#include "local_nvme_host_unit.hpp"

#if defined(__CUDACC__)
#error "local_nvme_host_unit.cpp must be compiled by the host compiler: it is the .cpp half of the test"
#endif

namespace tutti::gpu_test {

const char* host_unit_compiler() {
#if defined(__clang__)
  return "clang++";
#else
  return "g++";
#endif
}

Status read_from_host_compiled_unit(local_nvme::LocalNvmeDataPath& path,
                                    local_nvme::LocalNvmeDataPath::open_target& target,
                                    local_nvme::LocalNvmeDataPath::registered_memory& registration,
                                    const MemoryView& memory, std::uint64_t offset, std::uint64_t length,
                                    std::uint32_t requests, std::vector<RequestCompletion>& completions) {
  using Path = local_nvme::LocalNvmeDataPath;
  std::vector<PathRequest<Path>> batch;
  const std::uint64_t each = length / requests;
  for (std::uint32_t i = 0; i < requests; ++i)
    batch.push_back(
        PathRequest<Path>{Direction::READ, &registration, memory, offset + i * each, &target, offset + i * each, each});
  std::vector<Status> states(batch.size());
  auto b = path.submit(batch, states);
  for (const Status& s : states) TUTTI_RETURN_IF_ERROR(s);
  completions.assign(batch.size(), RequestCompletion{});
  return path.progress(b, completions, 60'000'000'000ull);
}

}  // namespace tutti::gpu_test
