// The CUDA build compiles the KV store's binding with nvcc: the store checksums DEVICE memory with
// its XXH3 kernels (accel::launch), which launch only from code nvcc compiled (docs/kv-store.md,
// "Checksums"); from a host-compiler translation unit they return UNSUPPORTED.
#include "kv.cpp"
