// A user of the local_nvme DataPath compiled by the host compiler (local_nvme_host_unit.cpp),
// linked into the same program as the nvcc-compiled GPU suite (local_nvme_test.cu): the test that
// .cpp and .cu users share one definition of the kernel launches (libtutti_cuda).
#pragma once

#include <cstdint>
#include <vector>

#include <tutti/path/local_nvme.hpp>

namespace tutti::gpu_test {

/// "g++" or "clang++": the compiler that built local_nvme_host_unit.cpp (never "nvcc").
const char* host_unit_compiler();

/// Reads [offset, offset + length) of `target` into `memory` (registered as `registration`) in
/// `requests` equal requests, one submit and progress until done (60 s), from host-compiled code.
/// Returns the submit's first rejection or progress's error; `completions` gets one per request.
Status read_from_host_compiled_unit(local_nvme::LocalNvmeDataPath& path,
                                    local_nvme::LocalNvmeDataPath::open_target& target,
                                    local_nvme::LocalNvmeDataPath::registered_memory& registration,
                                    const MemoryView& memory, std::uint64_t offset, std::uint64_t length,
                                    std::uint32_t requests, std::vector<RequestCompletion>& completions);

}  // namespace tutti::gpu_test
