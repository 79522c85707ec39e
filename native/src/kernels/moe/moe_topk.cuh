// moe_topk.cuh - the router's top-k by one warp (CUDA only), shared by moe_router.cu and
// moe_experts.cu (the decode gate_up launch selects its own experts): k rounds of a warp arg-max
// over the E <= 512 logits of one token, ties to the lower expert id, then the softmax weights
// renormalised over the selected experts:
//   w_j = exp(l_j - l_max) / sum_selected exp(l - l_max).
// Each lane holds E / 32 logits (expert lane + 32 i) and its own running best; a round is two
// single-instruction warp reductions (max of the order-preserving key, then min id among the lanes
// holding it: warp_argmax of order_key.cuh), and only the lane that lost its best rescans its values.
#pragma once

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/moe/moe_common.h"
#include "kernels/order_key.cuh"

namespace lampo {

constexpr int TOPK_PER_LANE = MOE_MAX_EXPERTS / 32;

// One token's selection, held by the warp: lane j < k has the j-th selected expert (descending
// logit) in `id` and its renormalised weight in `weight`.
struct TopkLane {
    int id;
    float weight;
};

// Top-`rounds` of the logits row [E] (fp32) by one warp; reads through L2 (__ldcg), as written by
// the launch before. rounds = k gives the top-k; fewer rounds make only the first selections
// (their ids exact, the weights meaningless): a warp that needs the s-th expert alone stops after
// s + 1 rounds.
__device__ __forceinline__ TopkLane warp_topk(const float* __restrict__ row, int E, int rounds) {
    const int lane = threadIdx.x % 32;
    uint32_t key[TOPK_PER_LANE];  // key[i]: expert lane + 32 i (0 = absent or already taken)
#pragma unroll
    for (int i = 0; i < TOPK_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        key[i] = e < E ? max(order_key(__ldcg(row + e)), 1u) : 0u;
    }
    auto lane_best = [&](int& best_i) {  // ascending ids: the first of equal keys wins
        uint32_t b = 0u;
        best_i = 0;
#pragma unroll
        for (int i = 0; i < TOPK_PER_LANE; ++i)
            if (key[i] > b) { b = key[i]; best_i = i; }
        return b;
    };
    int best_i;
    uint32_t best = lane_best(best_i);
    float top = 0.f, denom = 0.f, my_val = 0.f;
    int my_id = 0;
    for (int r = 0; r < rounds; ++r) {
        const ArgMax win = warp_argmax({best, lane + 32 * best_i});
        const int id = win.id;
        const float v = key_value(win.key);
        if (r == 0) top = v;
        denom += expf(v - top);
        if (lane == r) {
            my_val = v;
            my_id = id;
        }
        if ((id & 31) == lane) {
#pragma unroll
            for (int i = 0; i < TOPK_PER_LANE; ++i)
                if (i == best_i) key[i] = 0u;
            best = lane_best(best_i);
        }
    }
    return {my_id, expf(my_val - top) / denom};
}

// Token t's selection from warp_topk into ids / weights [T, k] (lanes below k, one slot each).
__device__ __forceinline__ void store_topk(const TopkLane& sel, int32_t* __restrict__ ids, float* __restrict__ weights,
                                          int t, int k) {
    const int lane = threadIdx.x % 32;
    if (lane < k) {
        ids[size_t(t) * k + lane] = sel.id;
        weights[size_t(t) * k + lane] = sel.weight;
    }
}

// Top-k of token t's logits [T, E] -> ids [T, k], weights [T, k].
__device__ __forceinline__ void router_row_topk(const float* __restrict__ logits, int32_t* __restrict__ ids,
                                                float* __restrict__ weights, int t, int E, int k) {
    store_topk(warp_topk(logits + size_t(t) * E, E, k), ids, weights, t, k);
}

}  // namespace lampo
