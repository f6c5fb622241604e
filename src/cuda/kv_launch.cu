// The KV store's checksum launches for the cuda profile: their one definition (declared in
// kv/checksum.hpp), compiled by nvcc, so every user of KvStore or DeviceHasher, host-compiled or
// not, runs the same GPU kernels.
#include <tutti/accel/primitives.hpp>
#include <tutti/kv/checksum.hpp>

namespace tutti::kv {
inline namespace TUTTI_PROFILE_NAMESPACE {

Status launch_kernel(const accel::LaunchConfig& config, const detail::Xxh3LaneKernel& kernel) {
  return accel::launch(config, kernel);
}

Status launch_kernel(const accel::LaunchConfig& config, const detail::Xxh3FinishKernel& kernel) {
  return accel::launch(config, kernel);
}

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::kv
