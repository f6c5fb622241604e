// The doctest main of the GPU suite: exits 77 (meson: skipped) when no CUDA device is usable, so
// a CPU machine that built the cuda profile skips these tests instead of failing them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

int main(int argc, char** argv) {
  // Load every kernel at start: with lazy loading (CUDA's default since 12.2) the first launch of
  // a kernel waits for the module load, which waits for running kernels, and the persistent null
  // controller only leaves when told to: the first submitter launch would stall until the
  // controller's budget ran out. An explicit CUDA_MODULE_LOADING in the environment wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result != cudaSuccess || count == 0) {
    std::fprintf(stderr, "no CUDA device (%s): skipping (exit 77)\n",
                 result != cudaSuccess ? cudaGetErrorString(result) : "0 devices");
    return 77;
  }
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess)
    std::fprintf(stderr, "GPU 0: %s, sm_%d%d, %d SMs\n", properties.name, properties.major, properties.minor,
                 properties.multiProcessorCount);
  doctest::Context context(argc, argv);
  return context.run();
}
