// launch_utils.cuh - host-side helpers shared by the core launchers: argument checks that raise a
// clear error naming the op (std::invalid_argument, ValueError in Python) and device queries
// (SM count, opt-in shared memory) that are cheap and legal while a stream is being captured, and
// the programmatic-dependent-launch wrapper every decode-step kernel goes out through.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>
#include <string>
#include <cuda_runtime.h>

#include "kernels/common.cuh"

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

// Shared memory a block may opt in to; LAMPO_SMEM_OPTIN=BYTES lowers it (101376: the 99 KiB of an
// sm_86 / sm_89 / sm_120 card), so an H200 runs the launchers' choices of a desktop GPU
// (tests/gpu/run.sh DESKTOP=1). Decided once per process.
inline size_t smem_optin_bytes() {
    static const size_t bytes = [] {
        size_t limit = size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
        const char* cap = std::getenv("LAMPO_SMEM_OPTIN");
        if (cap && *cap) limit = std::min(limit, size_t(std::strtoull(cap, nullptr, 10)));
        return limit;
    }();
    return bytes;
}

// Allow a kernel to use `bytes` of dynamic shared memory (needed above 48 KiB).
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, size_t bytes, const char* op) {
    require(bytes <= smem_optin_bytes(), op,
            "needs " + std::to_string(bytes) + " bytes of shared memory per block, the device allows " +
                std::to_string(smem_optin_bytes()));
    LAMPO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Whether the environment sets `name` to "0" (the A/B and test switches below).
inline bool env_switched_off(const char* name) {
    const char* env = std::getenv(name);
    return env && std::string(env) == "0";
}

// The virtual architecture the running device code was compiled for, major * 10 + minor (90 for a
// build for sm_90 / sm_90a; 89 for a build for sm_89 that the driver compiled for a newer GPU from
// its PTX). device_code.cu.
int device_code_arch();

// Whether the sm_90 forms may be launched (programmatic dependent launch, thread block clusters,
// bulk copies): the device is sm_90 or newer and so is the code running on it (a kernel compiled
// for an older architecture has no such instructions: its PDL wait would be no wait at all), and
// the environment does not set LAMPO_SM90=0 (the forms of older GPUs on an H200, for tests).
// Decided once per process, like everything the launchers ask per launch.
inline bool sm90_or_newer() {
    static const bool yes = !env_switched_off("LAMPO_SM90") &&
                            device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9 && device_code_arch() >= 90;
    return yes;
}

// Whether kernels go out with programmatic dependent launch: on sm_90+ unless the environment
// sets LAMPO_PDL=0 (for A/B measurements). Decided once per process.
inline bool pdl_enabled() {
    static const bool on = !env_switched_off("LAMPO_PDL") && sm90_or_newer();
    return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization: the
// kernel may begin launching while the previous kernel of the stream still runs, and must call
// pdl_begin() (common.cuh) before touching memory. The edge survives stream capture into a CUDA
// graph (CUDA >= 12.3). cluster_x > 1 groups the blocks into thread block clusters of cluster_x
// along x (sm_90+; grid.x a multiple of it). Launch failures raise CudaError naming `op`.
template <class... Params, class... Args>
inline void launch_pdl_clusters(const char* op, unsigned cluster_x, void (*kernel)(Params...), dim3 grid,
                                dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl_enabled()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n++].val.clusterDim = {cluster_x, 1, 1};
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    if constexpr (timeline_built()) timeline_note_launch(op);
    cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, __FILE__, __LINE__);
}

template <class... Params, class... Args>
inline void launch_pdl(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
    launch_pdl_clusters(op, 1, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace lampo
