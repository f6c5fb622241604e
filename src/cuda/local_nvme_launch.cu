// The local_nvme kernels' launches for the cuda profile: their one definition (declared in
// path/local_nvme/launch.hpp), compiled by nvcc, so every user of the DataPath, host-compiled or
// not, launches the same GPU kernels.
#include <tutti/accel/primitives.hpp>
#include <tutti/path/local_nvme/kernels.hpp>
#include <tutti/path/local_nvme/launch.hpp>

namespace tutti::local_nvme {
inline namespace TUTTI_PROFILE_NAMESPACE {

Status launch_kernel(const accel::LaunchConfig& config, const AdmitKernel& kernel) {
  return accel::launch(config, kernel);
}

Status launch_kernel(const accel::LaunchConfig& config, const PollKernel& kernel) {
  return accel::launch(config, kernel);
}

Status preload_kernels() {
  TUTTI_RETURN_IF_ERROR(accel::preload<AdmitKernel>());
  return accel::preload<PollKernel>();
}

}  // namespace TUTTI_PROFILE_NAMESPACE
}  // namespace tutti::local_nvme
