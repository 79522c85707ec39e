// moe_topk.cuh - the router's top-k by one warp (CUDA only), shared by moe_router.cu and
// moe_decode_fused.cu: k rounds of a warp arg-max over the E <= 512 logits of one token (each
// lane holds E / 32 of them in registers), ties to the lower expert id, then the softmax weights
// renormalised over the selected experts: w_j = exp(l_j - l_max) / sum_selected exp(l - l_max).
#pragma once

#include <cstdint>

#include "common.cuh"
#include "moe_common.h"

namespace lampo {

constexpr int TOPK_PER_LANE = MOE_MAX_EXPERTS / 32;

// Top-k of token t's logits by one warp (ties -> lower id) and the renormalised softmax weights.
// Reads the logits through L2 (__ldcg): in the fused kernel other blocks wrote them.
__device__ __forceinline__ void router_row_topk(const float* __restrict__ logits, int32_t* __restrict__ ids,
                                                float* __restrict__ weights, int t, int E, int k) {
    const int lane = threadIdx.x % 32;
    const float* row = logits + size_t(t) * E;
    float v[TOPK_PER_LANE];  // v[i] = logit of expert lane + 32 i
#pragma unroll
    for (int i = 0; i < TOPK_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < E ? __ldcg(row + e) : -INFINITY;
    }
    float top = 0.f, denom = 0.f, my_val = 0.f;
    int my_id = 0;
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < TOPK_PER_LANE; ++i) {
            const int e = lane + 32 * i;
            if (e < E && (v[i] > bv || bi == 0x7fffffff)) {  // ascending ids: first max wins
                bv = v[i];
                bi = e;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (r == 0) top = bv;
        denom += expf(bv - top);
        if (lane == r) {
            my_val = bv;
            my_id = bi;
        }
        if ((bi & 31) == lane) {
#pragma unroll
            for (int i = 0; i < TOPK_PER_LANE; ++i)
                if (lane + 32 * i == bi) v[i] = -INFINITY;
        }
    }
    if (lane < k) {
        ids[size_t(t) * k + lane] = my_id;
        weights[size_t(t) * k + lane] = expf(my_val - top) / denom;
    }
}

}  // namespace lampo
