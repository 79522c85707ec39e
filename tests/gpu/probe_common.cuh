// probe_common.cuh - what the standalone probes' ctypes libraries share (probe_expert_reads.cu,
// probe_stream.cu): the last error as text for Python, and the one filled allocation they read.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace probe {

inline char g_error[256] = "";

// Records `what: <CUDA error>` for the library's *_error() and returns true when e is an error.
inline bool failed(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return false;
    std::snprintf(g_error, sizeof g_error, "%s: %s", what, cudaGetErrorString(e));
    return true;
}

// *base = `bytes` of device memory filled with 0x01; 0, or -1 with g_error set.
template <class T>
int alloc_filled(T** base, size_t bytes) {
    if (failed(cudaMalloc(base, bytes), "cudaMalloc")) return -1;
    if (failed(cudaMemset(*base, 1, bytes), "cudaMemset")) return -1;
    return failed(cudaDeviceSynchronize(), "memset") ? -1 : 0;
}

}  // namespace probe
