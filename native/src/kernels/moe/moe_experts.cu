// moe_experts.cu - routed experts for few tokens (decode, speculative verify; T <= 8).
//
//   gate_up: act[t, s, i] = bf16(silu(h_t . Wg[e][i]) * (h_t . Wu[e][i])), e = ids[t, s]
//            gate_up [E, 2I, H] bf16 (rows 0..I-1 gate, I..2I-1 up) -> act [T, k, I] bf16
//   down:    out[t, r] = bf16(sum_s w[t, s] * (act[t, s] . Wd[e][r]))   down [E, H, I] bf16
//
// These GEMVs stream the selected experts' weights (35B-A3B: 8 x 6 MiB per layer per token,
// the largest byte stream of a decode step), so both kernels are built around 16-byte weight
// loads with several in flight per lane and read nothing but the selected rows:
// - gate_up: grid (row tiles of 16, T*k slots); a warp owns four (gate, up) row pairs and dots
//   them with h_t, then applies silu * up. h_t's vectors are loaded with each weight batch, so a
//   batch waits for one round trip, not one per vector (-0.05 ms per 35B-A3B step,
//   docs/design/kernels-gdn-moe.md). In the decode step's form
//   (moe_experts_gate_up_select) it also makes the selection: every warp of a routed slot runs
//   the router's warp top-k (moe_topk.cuh) on token t's logits, stopping after s + 1 rounds, and
//   takes slot s's expert, so slot 0's blocks stream after one round, slot k - 1's after k; one
//   warp per token runs all k rounds and writes ids and weights for the down launch. That removes
//   the top-k launch.
// - down: grid (row tiles of 8); a warp owns one output row r and, per token, walks every slot's
//   Wd[e][r] in a fixed order, so the weighted sum over experts needs no atomics and is
//   deterministic. The token's k ids and weights are loaded once (lane j: slot j) and handed to
//   each item by a shuffle, so a batch's weight loads all go out together instead of each waiting
//   for an id load of its own (-0.015 ms per 35B-A3B step, docs/design/kernels-gdn-moe.md).
//   The decode step's form (moe_experts_down_add) adds the rounded row to the fp32 residual
//   stream instead of storing it.
// - shared expert (optional MoeSharedSlot, contract in ops.h): one more slot per token in both
//   grids, with its own matrices and intermediate size Is; the first gate_up block of that slot
//   also computes its weight sigmoid(h_t . w_gate). A MoE FFN step is then router + 2 launches.
// - the shared slot's gate_up blocks load their first weights before waiting for the previous
//   kernel (their rows are known up front); a routed block can only start after its top-k.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/moe/moe_common.h"
#include "kernels/moe/moe_topk.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int GU_WARPS = 4;
constexpr int GU_PAIRS = 4;  // (gate, up) row pairs per warp
constexpr int GU_ROWS_PER_BLOCK = GU_WARPS * GU_PAIRS;
constexpr int GU_UNROLL = 2;  // 16-byte chunks per lane per row per batch (x 8 rows: 16 in flight;
                              // H = 2048 in four batches). Half the warps of 2 pairs x 4, so the
                              // 35B-A3B grid (288 blocks of 4 warps) is resident at once; measured
                              // 2.419 vs 2.480 ms per step (docs/design/kernels-gdn-moe.md)

// How the gate_up launch learns its experts: read ids [T, k], or (logits set) select them itself
// from the router logits [T, E] and write ids and weights [T, k].
struct Routing {
    int32_t* ids;
    const float* logits;
    int E;
    float* weights;
};

// This warp's (gate, up) row pairs from column `base` on: GU_UNROLL vectors per row per lane.
__device__ __forceinline__ void gate_up_batch(uint4 (&wv)[GU_UNROLL][2 * GU_PAIRS], const bf16* const (&rows)[2 * GU_PAIRS],
                                              int base, int H, int lane) {
#pragma unroll
    for (int u = 0; u < GU_UNROLL; ++u) {
        const int c = base + (u * 32 + lane) * 8;
        if (c < H) {
#pragma unroll
            for (int q = 0; q < 2 * GU_PAIRS; ++q) wv[u][q] = ldg_u4(rows[q] + c);
        }
    }
}

// The matching vectors of h_t (read through L2: written by the previous kernel), loaded with each
// weight batch so that a batch's dot products wait for one round trip, not one per vector.
__device__ __forceinline__ void h_batch(uint4 (&hv)[GU_UNROLL], const bf16* hrow, int base, int H, int lane) {
#pragma unroll
    for (int u = 0; u < GU_UNROLL; ++u) {
        const int c = base + (u * 32 + lane) * 8;
        if (c < H) hv[u] = ldg_u4(hrow + c);
    }
}

__global__ void __launch_bounds__(GU_WARPS * 32)
moe_gate_up_gemv(const bf16* __restrict__ h, const bf16* __restrict__ gate_up, Routing routing,
                 bf16* __restrict__ act, int T, int k, int H, int I, MoeSharedSlot shared) {
    const int slots = shared.gate_up ? k + 1 : k;  // per token
    const int t = blockIdx.y / slots, s = blockIdx.y % slots;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const bf16* hrow = h + size_t(t) * H;
    const bool is_shared = s == k;
    const int rows_n = is_shared ? shared.inter : I;  // this slot's intermediate size
    const int r0 = blockIdx.x * GU_ROWS_PER_BLOCK + warp * GU_PAIRS;
    const bool has_rows = r0 < rows_n;  // the grid spans max(I, Is); sizes are multiples of 64

    const bf16* rows[2 * GU_PAIRS];  // gate r, up r, gate r+1, up r+1, ...
    auto point_rows = [&](const bf16* W) {
#pragma unroll
        for (int p = 0; p < GU_PAIRS; ++p) {
            rows[2 * p] = W + size_t(r0 + p) * H;
            rows[2 * p + 1] = W + size_t(rows_n + r0 + p) * H;
        }
    };
    uint4 wv[GU_UNROLL][2 * GU_PAIRS];
    if (is_shared && has_rows) {  // known rows: the first batch before the wait
        point_rows(shared.gate_up);
        gate_up_batch(wv, rows, 0, H, lane);
    }
    pdl_begin();
    int expert = 0;
    if (!is_shared && routing.logits) {
        const bool writes = s == 0 && blockIdx.x == 0 && warp == 0;  // the whole selection, once per token
        const TopkLane sel = warp_topk(routing.logits + size_t(t) * routing.E, routing.E, writes ? k : s + 1);
        expert = __shfl_sync(0xffffffffu, sel.id, s);
        if (writes) store_topk(sel, routing.ids, routing.weights, t, k);
    } else if (!is_shared) {
        expert = routing.ids[t * k + s];
    }
    if (is_shared && blockIdx.x == 0 && warp == 0) {  // the shared slot's weight for token t
        float dot = 0.f;
#pragma unroll 8
        for (int c = lane * 8; c < H; c += 32 * 8) dot = dot_bf16x8(ldg_u4(hrow + c), ldg_u4(shared.w_gate + c), dot);
        dot = warp_sum(dot);
        if (lane == 0) shared.gate[t] = sigmoid(dot);
    }
    timeline_mark(TL_SELECTED);
    if (!has_rows) return;
    if (!is_shared) {
        point_rows(gate_up + size_t(expert) * 2 * I * H);
        gate_up_batch(wv, rows, 0, H, lane);
    }
    uint4 hv[GU_UNROLL];
    h_batch(hv, hrow, 0, H, lane);
    bf16* out = is_shared ? act + size_t(T) * k * I + size_t(t) * rows_n : act + size_t(t * k + s) * I;

    float acc[2 * GU_PAIRS] = {};
    for (int base = 0;;) {
#pragma unroll
        for (int u = 0; u < GU_UNROLL; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) {
#pragma unroll
                for (int q = 0; q < 2 * GU_PAIRS; ++q) acc[q] = dot_bf16x8(wv[u][q], hv[u], acc[q]);
            }
        }
        base += 32 * 8 * GU_UNROLL;
        if (base >= H) break;
        gate_up_batch(wv, rows, base, H, lane);
        h_batch(hv, hrow, base, H, lane);
    }
#pragma unroll
    for (int p = 0; p < GU_PAIRS; ++p) {
        const float g = warp_sum(acc[2 * p]), u = warp_sum(acc[2 * p + 1]);
        if (lane == 0) out[r0 + p] = __float2bfloat16_rn(silu(g) * u);
    }
}

constexpr int DN_WARPS = 8;   // one output row per warp
constexpr int DN_UNROLL = 9;  // (slot, chunk) items per lane per batch: the 35B-A3B's 576 items of a
                              // row (8 routed + 1 shared x 512 / 8) in two batches

__global__ void __launch_bounds__(DN_WARPS * 32)
moe_down_gemv(const bf16* __restrict__ act, const bf16* __restrict__ down,
              const int32_t* __restrict__ ids, const float* __restrict__ weights,
              bf16* __restrict__ out, float* __restrict__ residual, int T, int k, int H, int I,
              MoeSharedSlot shared) {
    pdl_begin();
    const int r = blockIdx.x * DN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= H) return;
    const int chunks = I / 8;                                    // 16-byte chunks per routed row
    const int routed_items = k * chunks;                         // (slot, chunk) pairs per token
    const int items = routed_items + (shared.down ? shared.inter / 8 : 0);  // + the shared row
    const int step_s = 32 / chunks, step_c = 32 % chunks;       // an item 32 further on
    const bf16* act_shared = act + size_t(T) * k * I;
    // Token 0's residual value of this row (the decode step's one token), read now, off the tail.
    const float residual_first = residual && lane == 0 ? __ldcg(residual + r) : 0.f;
    for (int t = 0; t < T; ++t) {
        // Lane j < k holds slot j's expert and weight: one load each, then shuffles, so no weight
        // load waits for an id load of its own.
        const int slot_id = lane < k ? __ldg(ids + t * k + lane) : 0;
        const float slot_w = lane < k ? __ldg(weights + t * k + lane) : 0.f;
        const float gate_shared = shared.down ? shared.gate[t] : 0.f;
        // This lane's items are lane, lane + 32, ...: item = s * chunks + ci, stepped without a division.
        int s = lane / chunks, ci = lane % chunks;
        float acc = 0.f;
        for (int base = 0; base < items; base += 32 * DN_UNROLL) {
            uint4 wv[DN_UNROLL], av[DN_UNROLL];
            float wt[DN_UNROLL];
#pragma unroll
            for (int u = 0; u < DN_UNROLL; ++u) {  // straight-line: every load of the batch goes out at once
                const int item = base + u * 32 + lane;
                const int holder = min(s, k - 1);  // past the routed items: any lane, unused
                const int e = __shfl_sync(0xffffffffu, slot_id, holder);
                const float w = __shfl_sync(0xffffffffu, slot_w, holder);
                const bool routed = item < routed_items;
                const int c_shared = (item - routed_items) * 8;
                const bf16* wp = routed ? down + (size_t(e) * H + r) * I + ci * 8
                                        : shared.down + size_t(r) * shared.inter + c_shared;
                const bf16* ap = routed ? act + size_t(t * k + s) * I + ci * 8
                                        : act_shared + size_t(t) * shared.inter + c_shared;
                wt[u] = routed ? w : gate_shared;
                if (item < items) {
                    wv[u] = ldg_u4(wp);
                    av[u] = *reinterpret_cast<const uint4*>(ap);
                }
                s += step_s;
                ci += step_c;
                if (ci >= chunks) {
                    ci -= chunks;
                    ++s;
                }
            }
#pragma unroll
            for (int u = 0; u < DN_UNROLL; ++u) {
                const int item = base + u * 32 + lane;
                if (item < items) acc = fmaf(wt[u], dot_bf16x8(wv[u], av[u], 0.f), acc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) {  // out, or (residual set) the residual stream += the rounded row
            if (residual)
                residual[size_t(t) * H + r] = (t == 0 ? residual_first : residual[size_t(t) * H + r]) +
                                              __bfloat162float(__float2bfloat16_rn(acc));
            else out[size_t(t) * H + r] = __float2bfloat16_rn(acc);
        }
    }
}

void check_decode_dims(const char* op, int T, int k, int H, int I) {
    moe_check_tokens(op, T, k, H);
    moe_check_intermediate(op, I);
    if (T > MOE_DECODE_MAX_T)
        throw std::invalid_argument(std::string(op) + ": T must be <= 8 (use moe_experts_prefill), got " +
                                    std::to_string(T));
}

// The launch-time view of the optional shared slot (all null when absent), checked once.
MoeSharedSlot shared_slot(const char* op, const MoeSharedSlot* shared) {
    if (!shared) return MoeSharedSlot{};
    if (!shared->gate_up || !shared->down || !shared->w_gate || !shared->gate)
        throw std::invalid_argument(std::string(op) + ": the shared slot needs gate_up, down, w_gate and gate");
    moe_check_intermediate(op, shared->inter);
    return *shared;
}

void launch_gate_up(const char* op, const bf16* h, const bf16* gate_up, Routing routing, bf16* act, int T, int k,
                    int H, int I, cudaStream_t stream, const MoeSharedSlot* shared) {
    check_decode_dims(op, T, k, H, I);
    const MoeSharedSlot sh = shared_slot(op, shared);
    const int rows = sh.gate_up ? std::max(I, sh.inter) : I;
    const dim3 grid(rows / GU_ROWS_PER_BLOCK, T * (sh.gate_up ? k + 1 : k));
    launch_pdl(op, moe_gate_up_gemv, grid, GU_WARPS * 32, 0, stream, h, gate_up, routing, act, T, k, H, I, sh);
}

void launch_down(const char* op, const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                 bf16* out, float* residual, int T, int k, int H, int I, cudaStream_t stream,
                 const MoeSharedSlot* shared) {
    check_decode_dims(op, T, k, H, I);
    const MoeSharedSlot sh = shared_slot(op, shared);
    launch_pdl(op, moe_down_gemv, ceil_div(H, DN_WARPS), DN_WARPS * 32, 0, stream, act, down, ids, weights,
               out, residual, T, k, H, I, sh);
}

}  // namespace

void moe_experts_gate_up(const bf16* h, const bf16* gate_up, const int32_t* ids, bf16* act, int T,
                         int k, int H, int I, cudaStream_t stream, const MoeSharedSlot* shared) {
    launch_gate_up("moe_experts_gate_up", h, gate_up, {const_cast<int32_t*>(ids), nullptr, 0, nullptr}, act, T,
                   k, H, I, stream, shared);
}

void moe_experts_gate_up_select(const bf16* h, const float* logits, int E, const bf16* gate_up, int32_t* ids,
                                float* weights, bf16* act, int T, int k, int H, int I, cudaStream_t stream,
                                const MoeSharedSlot* shared) {
    const char* op = "moe_experts_gate_up_select";
    moe_check_experts(op, E, k);
    launch_gate_up(op, h, gate_up, {ids, logits, E, weights}, act, T, k, H, I, stream, shared);
}

void moe_experts_down(const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                      bf16* out, int T, int k, int H, int I, cudaStream_t stream,
                      const MoeSharedSlot* shared) {
    launch_down("moe_experts_down", act, down, ids, weights, out, nullptr, T, k, H, I, stream, shared);
}

void moe_experts_down_add(const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                          float* residual, int T, int k, int H, int I, cudaStream_t stream,
                          const MoeSharedSlot* shared) {
    launch_down("moe_experts_down_add", act, down, ids, weights, nullptr, residual, T, k, H, I, stream, shared);
}

}  // namespace lampo
