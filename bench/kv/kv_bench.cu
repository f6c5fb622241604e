// kv_bench in the cuda profile: the same program (kv_bench.cpp), compiled by nvcc (the store's XXH3
// checksum launches themselves are compiled once, in libtutti_cuda, for .cpp and .cu callers
// alike). `kv_bench --memory device` loads into GPU memory.
#include "kv_bench.cpp"
