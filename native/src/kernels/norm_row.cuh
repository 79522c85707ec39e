// norm_row.cuh - one row of the zero-centred RMSNorm by a block's first NORM_THREADS threads, shared
// by rmsnorm.cu and the kernels that fold a residual add + norm into their prologue (same thread
// mapping and reduction order everywhere, so the folded forms are bit-identical to add_rmsnorm).
// A larger block (the LQ GEMV's 16 warps) runs the same sums: its other threads take no elements
// of them but join the block's barriers, and the element-wise scaling strides over every thread.
//   r = x (+ delta)          x [n] fp32, delta [n] bf16 (may be null), n % 4 == 0; ZERO_X: x is
//                            taken as zeros (r = 0 + delta, not read)
//   inv = rsqrt(mean(r^2) + eps)
//   y = bf16(r * inv * (1 + w))
#pragma once

#include "kernels/common.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/ops.h"

namespace lampo {

constexpr int NORM_THREADS = 256;

__device__ __forceinline__ float norm_block_sum(float v) {
    __shared__ float partial[NORM_THREADS / 32];
    __shared__ float total;
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0 && threadIdx.x < NORM_THREADS) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < NORM_THREADS / 32 ? partial[threadIdx.x] : 0.0f;
        s = warp_sum(s);
        if (threadIdx.x == 0) total = s;
    }
    __syncthreads();
    return total;
}

__device__ __forceinline__ float4 norm_load_bf16x4(const bf16* p) {
    const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// Element group i (4 values) of r = x (+ delta), read through L2 (ld.global.cg): kernels that
// fold the norm in may read a row that another block of the same launch wrote.
template <bool ZERO_X = false>
__device__ __forceinline__ float4 norm_residual4(const float* x, const bf16* delta, int i) {
    float4 v = ZERO_X ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : __ldcg(reinterpret_cast<const float4*>(x) + i);
    if (delta) {
        const float4 d = norm_load_bf16x4(delta + 4 * i);
        v.x += d.x; v.y += d.y; v.z += d.z; v.w += d.w;
    }
    return v;
}

constexpr int NORM_LOADS = 2;  // element groups per thread in flight at once (a 2,048 row: all)

// inv = rsqrt(mean(r^2) + eps) over the row; if r_out is set the block also writes r there
// (r_out may alias x: each element is read before it is written, by the same thread). A thread's
// groups are loaded NORM_LOADS at a time before any is used, so a row of up to NORM_LOADS *
// NORM_THREADS groups costs one round trip; the sum keeps the ascending order.
template <bool ZERO_X = false>
__device__ __forceinline__ float norm_row_inv(const float* x, const bf16* delta, float* r_out, int n, float eps) {
    float ss = 0.0f;
    for (int i0 = threadIdx.x < NORM_THREADS ? int(threadIdx.x) : n / 4; i0 < n / 4; i0 += NORM_LOADS * NORM_THREADS) {
        float4 v[NORM_LOADS];
#pragma unroll
        for (int l = 0; l < NORM_LOADS; ++l) {
            const int i = i0 + l * NORM_THREADS;
            if (i < n / 4) v[l] = norm_residual4<ZERO_X>(x, delta, i);
        }
#pragma unroll
        for (int l = 0; l < NORM_LOADS; ++l) {
            const int i = i0 + l * NORM_THREADS;
            if (i < n / 4) {
                if (r_out) reinterpret_cast<float4*>(r_out)[i] = v[l];
                ss += v[l].x * v[l].x + v[l].y * v[l].y + v[l].z * v[l].z + v[l].w * v[l].w;
            }
        }
    }
    return rsqrtf(norm_block_sum(ss) / float(n) + eps);
}

// y = bf16(r * inv * (1 + w)) with r read back from `r` (x + delta already applied). y may point
// to shared memory. STAGED: r and w are in shared memory (plain loads; the folded-norm GEMV stages
// them there), else in global memory (read through L2).
template <bool STAGED = false>
__device__ __forceinline__ void norm_row_scale(const float* r, float inv, const bf16* w, bf16* y, int n) {
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
        const float4 v = STAGED ? reinterpret_cast<const float4*>(r)[i] : __ldcg(reinterpret_cast<const float4*>(r) + i);
        const float4 g = STAGED ? load_bf16x4(w + 4 * i) : norm_load_bf16x4(w + 4 * i);
        store_bf16x4(y + 4 * i, make_float4(v.x * inv * (1.0f + g.x), v.y * inv * (1.0f + g.y),
                                                 v.z * inv * (1.0f + g.z), v.w * inv * (1.0f + g.w)));
    }
}

// The same with r recomputed as x (+ delta) (when r was not written anywhere).
__device__ __forceinline__ void norm_row_scale_sum(const float* x, const bf16* delta, float inv, const bf16* w,
                                                   bf16* y, int n) {
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
        const float4 v = norm_residual4(x, delta, i);
        const float4 g = norm_load_bf16x4(w + 4 * i);
        store_bf16x4(y + 4 * i, make_float4(v.x * inv * (1.0f + g.x), v.y * inv * (1.0f + g.y),
                                                 v.z * inv * (1.0f + g.z), v.w * inv * (1.0f + g.w)));
    }
}

}  // namespace lampo
