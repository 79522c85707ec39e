// moe_gate_up.cuh - one block's share of the decode-time expert gate_up GEMV (CUDA only), shared by
// moe_experts.cu (act written to global memory for the down launch) and moe_ffn_decode.cu (act
// kept in the thread block cluster):
//   act[i] = bf16(silu(h . Wg[i]) * (h . Wu[i])),  W = [2 rows_n, H] bf16 (gate rows, then up rows)
// A block is GU_WARPS warps; a warp owns GU_PAIRS (gate, up) row pairs and streams them with
// GU_UNROLL 16-byte vectors per row per lane in flight (16 loads per lane), h read through L1.
// A routed slot's expert comes from ids [T, k] or from the warp top-k of the router logits
// (moe_topk.cuh), exactly as moe_router_topk selects it.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "gdn_moe_vec.cuh"
#include "moe_topk.cuh"
#include "ops.h"

namespace lampo {

constexpr int GU_WARPS = 4;
constexpr int GU_PAIRS = 4;  // (gate, up) row pairs per warp
constexpr int GU_ROWS_PER_BLOCK = GU_WARPS * GU_PAIRS;
constexpr int GU_UNROLL = 2;  // 16-byte chunks per lane per row per batch (x 8 rows: 16 in flight;
                              // H = 2048 in four batches). Half the warps of 2 pairs x 4, so the
                              // 35B-A3B grid (288 blocks of 4 warps) is resident at once; measured
                              // 2.419 vs 2.480 ms per step (docs/decode-performance.md, Round 6)

// How a launch learns its experts: read ids (and weights, when set) [T, k], or (logits set)
// select them from the router logits [T, E] and write ids and weights [T, k].
struct Routing {
    int32_t* ids;
    const float* logits;
    int E;
    float* weights;
};

struct SlotRoute {
    int expert;
    float weight;  // the renormalised router weight (0 when the ids come without weights)
};

// Slot s of token t, known to every lane of the calling warp. With logits, the warp runs the
// top-k; `store` (one warp per token) also writes ids and weights.
__device__ __forceinline__ SlotRoute route_slot(const Routing& routing, int t, int s, int k, bool store) {
    if (routing.logits) {
        const TopkLane sel = warp_topk(routing.logits + size_t(t) * routing.E, routing.E, k);
        if (store) store_topk(sel, routing.ids, routing.weights, t, k);
        return {__shfl_sync(0xffffffffu, sel.id, s), __shfl_sync(0xffffffffu, sel.weight, s)};
    }
    return {routing.ids[t * k + s], routing.weights ? routing.weights[t * k + s] : 0.f};
}

// sigmoid(h . w_gate) over H, known to every lane of the calling warp (the shared expert's weight).
__device__ __forceinline__ float shared_expert_gate(const bf16* hrow, const bf16* w_gate, int H) {
    const int lane = threadIdx.x % 32;
    float dot = 0.f;
    for (int c = lane * 8; c < H; c += 32 * 8) dot = dot_bf16x8(ldg_u4(hrow + c), ldg_u4(w_gate + c), dot);
    return sigmoid(warp_sum(dot));
}

// One warp's GU_PAIRS (gate, up) row pairs, rows r0 .. r0 + GU_PAIRS - 1 of a [2 rows_n, H] matrix,
// and the weight vectors in flight.
struct GateUpWarp {
    const bf16* rows[2 * GU_PAIRS];  // gate r, up r, gate r+1, up r+1, ...
    uint4 wv[GU_UNROLL][2 * GU_PAIRS];

    __device__ __forceinline__ void point(const bf16* W, int rows_n, int r0, int H) {
#pragma unroll
        for (int p = 0; p < GU_PAIRS; ++p) {
            rows[2 * p] = W + size_t(r0 + p) * H;
            rows[2 * p + 1] = W + size_t(rows_n + r0 + p) * H;
        }
    }

    // The batch of vectors from column `base` on.
    __device__ __forceinline__ void load(int base, int H) {
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int u = 0; u < GU_UNROLL; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) {
#pragma unroll
                for (int q = 0; q < 2 * GU_PAIRS; ++q) wv[u][q] = ldg_u4(rows[q] + c);
            }
        }
    }

    // Dots the batch loaded from column 0 and every later batch with hrow; acc[2p] / acc[2p + 1]
    // are this lane's partial gate / up sums of pair p (not yet summed over the warp).
    __device__ __forceinline__ void dot(const bf16* hrow, int H, float (&acc)[2 * GU_PAIRS]) {
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int q = 0; q < 2 * GU_PAIRS; ++q) acc[q] = 0.f;
        for (int base = 0;;) {
#pragma unroll
            for (int u = 0; u < GU_UNROLL; ++u) {
                const int c = base + (u * 32 + lane) * 8;
                if (c < H) {
                    const uint4 hv = ldg_u4(hrow + c);
#pragma unroll
                    for (int q = 0; q < 2 * GU_PAIRS; ++q) acc[q] = dot_bf16x8(wv[u][q], hv, acc[q]);
                }
            }
            base += 32 * 8 * GU_UNROLL;
            if (base >= H) break;
            load(base, H);
        }
    }
};

// act of pair p from the lane partials of GateUpWarp::dot (every lane gets it).
__device__ __forceinline__ float gate_up_act(const float (&acc)[2 * GU_PAIRS], int p) {
    return round_to_bf16(silu(warp_sum(acc[2 * p])) * warp_sum(acc[2 * p + 1]));
}

}  // namespace lampo
