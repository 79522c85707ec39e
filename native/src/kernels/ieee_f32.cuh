// ieee_f32.cuh - fp32 steps rounded as IEEE 754 says (nearest even, subnormals kept) whatever the
// build's fast-math flags: PTX without .ftz, for kernels whose results must equal numpy's bit for bit.
#pragma once

namespace lampo {

__device__ __forceinline__ float ieee_div(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float ieee_mul(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float ieee_sub(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

}  // namespace lampo
