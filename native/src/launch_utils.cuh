// launch_utils.cuh - host-side helpers shared by the core launchers: argument checks that raise a
// clear error naming the op (std::invalid_argument, ValueError in Python) and device queries
// (SM count, opt-in shared memory) that are cheap and legal while a stream is being captured.
#pragma once

#include <stdexcept>
#include <string>
#include <cuda_runtime.h>

#include "common.cuh"

namespace lampo {

inline void require(bool ok, const char* op, const std::string& what) {
    if (!ok) throw std::invalid_argument(std::string(op) + ": " + what);
}

inline int device_attribute(cudaDeviceAttr attr) {
    int dev = 0, value = 0;
    LAMPO_CUDA_CHECK(cudaGetDevice(&dev));
    LAMPO_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, dev));
    return value;
}

inline int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }
inline size_t smem_optin_bytes() {
    return size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
}

// Allow a kernel to use `bytes` of dynamic shared memory (needed above 48 KiB).
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, size_t bytes, const char* op) {
    require(bytes <= smem_optin_bytes(), op,
            "needs " + std::to_string(bytes) + " bytes of shared memory per block, the device allows " +
                std::to_string(smem_optin_bytes()));
    LAMPO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace lampo
