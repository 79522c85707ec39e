// device_code.cu - which architecture the running device code was compiled for.
//
// The kernels test __CUDA_ARCH__ for the sm_90 instructions (programmatic dependent launch,
// thread block clusters, bulk copies); the launchers pick those forms from the host. A build for
// an older architecture runs on a newer GPU from its PTX, compiled by the driver for the GPU with
// the older __CUDA_ARCH__ (a build for sm_89 on an RTX 5090, say): its kernels then lack the
// sm_90 instructions although the GPU has them, so the host must ask what the code has, not only
// what the GPU is. An empty kernel's attributes say it (ptxVersion: the virtual architecture the
// code came from, major * 10 + minor), as for every kernel of the build.
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {
__global__ void device_code_probe_kernel() {}
}  // namespace

// Also the first place a build that this GPU cannot load at all shows (code for sm_90a alone on
// an RTX 4090, say): that error names the fix instead of CUDA's "no kernel image".
int device_code_arch() {
    static const int arch = [] {
        cudaFuncAttributes attributes{};
        const cudaError_t err = cudaFuncGetAttributes(&attributes, device_code_probe_kernel);
        if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
            (void)cudaGetLastError();
            const std::string major = std::to_string(device_attribute(cudaDevAttrComputeCapabilityMajor));
            const std::string minor = std::to_string(device_attribute(cudaDevAttrComputeCapabilityMinor));
            throw CudaError("this GPU (compute capability " + major + "." + minor +
                            ") cannot load the engine's kernels, which were built for other GPUs: reinstall Lampo "
                            "with LAMPO_CUDA_ARCH=" + major + minor + " (README, Requirements)");
        }
        LAMPO_CUDA_CHECK(err);
        return attributes.ptxVersion;
    }();
    return arch;
}

}  // namespace lampo
