// kv_bench in the cuda profile: the same program (kv_bench.cpp), compiled by nvcc so that the
// store's XXH3 checksum kernels launch on the GPU (a host-compiled .cpp of this profile gets
// UNSUPPORTED from accel::launch). `kv_bench --memory device` loads into GPU memory.
#include "kv_bench.cpp"
