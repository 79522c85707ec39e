// gdn_moe_vec.cuh - 16-byte bf16 vector loads/stores and small helpers shared by the Gated
// DeltaNet and MoE kernels (CUDA only). A "bf16x8" is 8 consecutive bf16 = one 16-byte access;
// pointers passed here must be 16-byte aligned (8-byte for the x4 forms).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "kernels/bf16_vec.cuh"

namespace lampo {

// Loads 8 bf16 (16 bytes) and widens them to fp32.
__device__ __forceinline__ void load_bf16x8(const __nv_bfloat16* p, float (&out)[8]) {
    bf16x8_to_float(*reinterpret_cast<const uint4*>(p), out);
}

// Raw 16-byte read-only load, for streaming weights with many loads in flight before use.
__device__ __forceinline__ uint4 ldg_u4(const __nv_bfloat16* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

// sum_i a[i] * b[i] over the 8 bf16 packed in each of a and b, added to acc in fp32.
__device__ __forceinline__ float dot_bf16x8(uint4 a, uint4 b, float acc) {
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 fa = __bfloat1622float2(a2[i]);
        const float2 fb = __bfloat1622float2(b2[i]);
        acc = fmaf(fa.x, fb.x, acc);
        acc = fmaf(fa.y, fb.y, acc);
    }
    return acc;
}

// Rounds 8 floats to bf16 and stores them (16 bytes).
__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* p, const float v[8]) {
    uint4 raw;
    __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h2[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
}

// Loads / stores 4 bf16 (8 bytes).
__device__ __forceinline__ float4 load_bf16x4(const __nv_bfloat16* p) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 lo = __bfloat1622float2(h2[0]);
    const float2 hi = __bfloat1622float2(h2[1]);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* p, float4 v) {
    uint2 raw;
    __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
    h2[0] = __floats2bfloat162_rn(v.x, v.y);
    h2[1] = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(p) = raw;
}

__device__ __forceinline__ float round_to_bf16(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

}  // namespace lampo
