// kv_quant.cuh - quantize one KV row into the INT8 cache, by one warp (CUDA only).
//   cache row [D] bytes q + 128 (offset binary, ops.h), scales [D/64] fp16. Per group of 64 values:
//   scale = fp16(max|x| / 127); q = clip(rint(x / float(scale)), -127, 127), q = 0 when the scale is
//   0 - bit-exact with kv_int8.quantize_int8_g64 of the reference (IEEE division and
//   round-half-even, not the fast-math approximations). Lane l holds dims [8l, 8l+8) in x
//   (D % 64 == 0, D <= 256: 8 lanes per group); lanes >= D / 8 hold zeros and store nothing.
#pragma once

#include <cstdint>
#include <cuda_fp16.h>

#include "kernels/common.cuh"

namespace lampo {

__device__ __forceinline__ void kv_quantize_row(const float (&x)[8], int lane, int D, uint8_t* __restrict__ cache_row,
                                                half* __restrict__ scale_row) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const half scale = __float2half_rn(__fdiv_rn(amax, 127.0f));
    const float s = __half2float(scale);
    if (lane >= D / 8) return;
    uint32_t packed[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float q = s > 0.0f ? fminf(fmaxf(rintf(__fdiv_rn(x[i], s)), -127.0f), 127.0f) : 0.0f;
        packed[i / 4] |= uint32_t(int(q) + 128) << (8 * (i % 4));
    }
    reinterpret_cast<uint2*>(cache_row)[lane] = make_uint2(packed[0], packed[1]);
    if ((lane & 7) == 0) scale_row[lane / 8] = scale;
}

}  // namespace lampo
