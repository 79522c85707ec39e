// moe_decode_fused.cu - the whole sparse-MoE FFN of one decode token in one launch.
//
//   residual += delta_in                                  residual [H] fp32, delta_in [H] bf16
//   x = bf16(rmsnorm(residual) * (1 + post_norm))
//   logits = W_router x ; top-k (ties -> lower id) ; w = softmax renormalised over the selected
//   act_s = bf16(silu(Wg_s x) * (Wu_s x))    for the k selected experts and the shared expert
//   out = bf16(sum_s w_s (Wd_s act_s) + sigmoid(w_gate . x) (Wd_shared act_shared))
//   if next_norm: residual += out ; normed = bf16(rmsnorm(residual) * (1 + next_norm))
//
// Shapes as in ops.h (router [E, H], gate_up [E, 2I, H], down [E, H, I], shared [2Is, H] / [H, Is]).
// Bit-identical to add_rmsnorm -> moe_router_topk -> moe_experts_gate_up -> moe_experts_down (with
// the shared slot) -> add_rmsnorm: every dot product and reduction visits the same values in the
// same order as those kernels.
//
// Why one launch: at batch 1 the separate kernels are latency chains (the router alone ~10 us for
// 1 MiB), and each kernel boundary costs a drain + launch. Here a persistent grid (every block
// resident, grid_sync.cuh) runs the phases with two grid barriers:
//   P0  every block: residual add + norm into shared memory, the shared expert's gate
//   P1  warps over items: router rows (logits to global), then the shared expert's (gate, up)
//       row pairs (they do not depend on the routing); before the PDL wait every warp already
//       pulled its router row and its shared-expert down rows into L2
//   --- barrier 1 ---
//   every block: top-k by one warp (redundant per block, no extra barrier); block 0 writes the
//       residual
//   P2  warps over the k * I routed (gate, up) row pairs -> act (global)
//   --- barrier 2 ---  (then the next kernel may start launching)
//   P3  every block copies act into shared memory; warps over output rows: the down GEMV
//   last block (exit ticket): the next layer's residual add + norm
#include <algorithm>

#include "common.cuh"
#include "gdn_moe_vec.cuh"
#include "grid_sync.cuh"
#include "launch_utils.cuh"
#include "moe_common.h"
#include "moe_topk.cuh"
#include "norm_row.cuh"
#include "ops.h"

namespace lampo {
namespace {

constexpr int FM_WARPS = NORM_THREADS / 32;  // 8 warps: the norm prologue's thread mapping
constexpr int FM_LINE = 64;                  // bf16 per 128-byte L2 line

// Streaming weight loads: read once, so marked L2 evict-first (they should not push activations,
// states or the next kernel's prefetched weights out of L2).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

__device__ __forceinline__ uint4 ldg_stream(const bf16* p, uint64_t policy) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

// dot(W row, x) with x in shared memory, lane visiting 16-byte chunks lane, lane + 32, ... in
// order (the accumulation order of router_row_logits and moe_gate_up_gemv).
__device__ __forceinline__ float row_dot_smem(const bf16* __restrict__ w, const bf16* x, int H, int lane,
                                              uint64_t policy) {
    float acc = 0.f;
    constexpr int U = 8;
    for (int base = 0; base < H; base += 32 * 8 * U) {
        uint4 wv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) wv[u] = ldg_stream(w + c, policy);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) acc = dot_bf16x8(wv[u], *reinterpret_cast<const uint4*>(x + c), acc);
        }
    }
    return acc;
}

// One (gate, up) row pair -> act = bf16(silu(g) * u); both rows' loads in flight together.
__device__ __forceinline__ void gate_up_pair(const bf16* __restrict__ g_row, const bf16* __restrict__ u_row,
                                             const bf16* x, int H, int lane, uint64_t policy, bf16* act) {
    float g = 0.f, u = 0.f;
    constexpr int U = 8;
    for (int base = 0; base < H; base += 32 * 8 * U) {
        uint4 gv[U], uv[U];
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int c = base + (j * 32 + lane) * 8;
            if (c < H) {
                gv[j] = ldg_stream(g_row + c, policy);
                uv[j] = ldg_stream(u_row + c, policy);
            }
        }
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int c = base + (j * 32 + lane) * 8;
            if (c < H) {
                const uint4 xv = *reinterpret_cast<const uint4*>(x + c);
                g = dot_bf16x8(gv[j], xv, g);
                u = dot_bf16x8(uv[j], xv, u);
            }
        }
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) *act = __float2bfloat16_rn(silu(g) * u);
}

__device__ __forceinline__ void prefetch_row_l2(const bf16* row, int n, int lane) {
    for (int c = lane * FM_LINE; c < n; c += 32 * FM_LINE) pdl_prefetch_l2(row + c);
}

// P3 for this warp's output rows r: out[r] = bf16(sum over items of w_slot * (Wd row chunk . act
// chunk)), items in moe_down_gemv's order (routed slots, then the shared expert), 8 loads in
// flight per lane (a single batch of all 18 measured slower: 20 vs 12.6 us per layer).
__device__ __forceinline__ void down_rows(const MoeDecodeFusedArgs& a, const bf16* acts, const int32_t* s_ids,
                                          const float* s_w, float s_shared_gate, int gw, int nw, int lane,
                                          uint64_t stream_policy) {
    const int H = a.H, k = a.k, I = a.I, Is = a.shared.inter;
    constexpr int U = 8;
    const int chunks = I / 8, routed_items = k * chunks, items = routed_items + Is / 8;
    for (int r = gw; r < H; r += nw) {
        float acc = 0.f;
        for (int base = 0; base < items; base += 32 * U) {
            uint4 wv[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int item = base + u * 32 + lane;
                if (item < routed_items) {
                    const int s = item / chunks, c = (item % chunks) * 8;
                    wv[u] = ldg_stream(a.down + (size_t(s_ids[s]) * H + r) * I + c, stream_policy);
                } else if (item < items) {
                    wv[u] = ldg_stream(a.shared.down + size_t(r) * Is + (item - routed_items) * 8, stream_policy);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int item = base + u * 32 + lane;
                if (item < items) {
                    const bool routed = item < routed_items;
                    const float wt = routed ? s_w[item / chunks] : s_shared_gate;
                    const int off = routed ? item * 8 : k * I + (item - routed_items) * 8;
                    acc = fmaf(wt, dot_bf16x8(wv[u], *reinterpret_cast<const uint4*>(acts + off), 0.f), acc);
                }
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) a.out[r] = __float2bfloat16_rn(acc);
    }

}

constexpr int FM_MAX_NORM_VEC = 4;  // float4 groups per thread kept in registers: H <= 4096

__global__ void __launch_bounds__(NORM_THREADS, 2) moe_decode_fused_kernel(MoeDecodeFusedArgs a) {
    extern __shared__ uint4 smem_vec[];
    bf16* xs = reinterpret_cast<bf16*>(smem_vec);  // [H] normed input
    bf16* acts = xs + a.H;                          // [k I + Is] act, copied in for P3
    __shared__ int32_t s_ids[MOE_MAX_K];
    __shared__ float s_w[MOE_MAX_K];
    __shared__ float s_shared_gate;

    const int H = a.H, E = a.E, k = a.k, I = a.I, Is = a.shared.inter;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gw = blockIdx.x * FM_WARPS + warp, nw = gridDim.x * FM_WARPS;
    const int p1_items = E + Is;
    const uint64_t stream_policy = l2_evict_first_policy();

    // Weights are immutable: read the norm weights, pull what does not depend on the routing into
    // L2 (router rows, the shared expert), all before waiting for the previous kernel.
    float4 g4[FM_MAX_NORM_VEC];
#pragma unroll
    for (int m = 0; m < FM_MAX_NORM_VEC; ++m) {
        const int i = threadIdx.x + m * NORM_THREADS;
        if (i < H / 4) g4[m] = norm_load_bf16x4(a.post_norm + 4 * i);
    }
    for (int j = gw; j < p1_items; j += nw) {
        if (j < E) {
            prefetch_row_l2(a.router + size_t(j) * H, H, lane);
        } else {
            prefetch_row_l2(a.shared.gate_up + size_t(j - E) * H, H, lane);
            prefetch_row_l2(a.shared.gate_up + size_t(Is + j - E) * H, H, lane);
        }
    }
    for (int r = gw; r < H; r += nw) prefetch_row_l2(a.shared.down + size_t(r) * Is, Is, lane);
    pdl_wait();

    // P0: x = norm(residual + delta_in) in shared memory (r kept in registers: norm_row_inv's
    // thread mapping and arithmetic), then the shared expert's gate.
    {
        float4 r4[FM_MAX_NORM_VEC];
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < FM_MAX_NORM_VEC; ++m) {
            const int i = threadIdx.x + m * NORM_THREADS;
            if (i < H / 4) {
                const float4 v = norm_residual4(a.residual, a.delta_in, i);
                r4[m] = v;
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        }
        const float inv = rsqrtf(norm_block_sum(ss) / float(H) + a.eps);
#pragma unroll
        for (int m = 0; m < FM_MAX_NORM_VEC; ++m) {
            const int i = threadIdx.x + m * NORM_THREADS;
            const float4 v = r4[m], g = g4[m];
            if (i < H / 4)
                store_bf16x4(xs + 4 * i, make_float4(v.x * inv * (1.0f + g.x), v.y * inv * (1.0f + g.y),
                                                          v.z * inv * (1.0f + g.z), v.w * inv * (1.0f + g.w)));
        }
    }
    __syncthreads();
    if (warp == 0) {
        float dot = 0.f;
        for (int c = lane * 8; c < H; c += 32 * 8)
            dot = dot_bf16x8(*reinterpret_cast<const uint4*>(xs + c), ldg_u4(a.shared.w_gate + c), dot);
        dot = warp_sum(dot);
        if (lane == 0) s_shared_gate = sigmoid(dot);
    }

    // P1: router logits, then the shared expert's row pairs.
    bf16* act_shared = a.act + size_t(k) * I;
    for (int j = gw; j < p1_items; j += nw) {
        if (j < E) {
            const float s = warp_sum(row_dot_smem(a.router + size_t(j) * H, xs, H, lane, stream_policy));
            if (lane == 0) a.logits[j] = s;
        } else {
            const int p = j - E;
            gate_up_pair(a.shared.gate_up + size_t(p) * H, a.shared.gate_up + size_t(Is + p) * H, xs, H, lane,
                         stream_policy, act_shared + p);
        }
    }
    grid_barrier(a.sync, gridDim.x);

    // Routing (every block for itself) and, by block 0, the residual.
    if (warp == 0) router_row_topk(a.logits, s_ids, s_w, 0, E, k);
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < H / 4; i += NORM_THREADS)
            reinterpret_cast<float4*>(a.residual)[i] = norm_residual4(a.residual, a.delta_in, i);
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x < k) {
        if (a.ids_out) a.ids_out[threadIdx.x] = s_ids[threadIdx.x];
        if (a.weights_out) a.weights_out[threadIdx.x] = s_w[threadIdx.x];
    }

    // P2: the routed (gate, up) row pairs.
    for (int j = gw; j < k * I; j += nw) {
        const int s = j / I, i = j % I;
        const bf16* g_row = a.gate_up + (size_t(s_ids[s]) * 2 * I + i) * H;
        gate_up_pair(g_row, g_row + size_t(I) * H, xs, H, lane, stream_policy, a.act + j);
    }
    grid_barrier(a.sync, 2 * gridDim.x);
    pdl_launch_dependents();

    // P3: the down GEMV over every slot, shared expert last (moe_down_gemv's item order), all of
    // a row's loads in flight at once (a 35B-A3B row: 18 per lane).
    const int act_n = k * I + Is;
    for (int i = threadIdx.x; i < act_n / 8; i += NORM_THREADS)
        reinterpret_cast<uint4*>(acts)[i] = __ldcg(reinterpret_cast<const uint4*>(a.act) + i);
    __syncthreads();
    down_rows(a, acts, s_ids, s_w, s_shared_gate, gw, nw, lane, stream_policy);
    // The next layer's residual add + norm, by the last block (it sees every row of out).
    if (grid_exit_ticket(a.sync) && a.next_norm) {
        const float inv_next = norm_row_inv(a.residual, a.out, a.residual, H, a.eps);
        norm_row_scale(a.residual, inv_next, a.next_norm, a.normed, H);
    }
}

// One wave: as many blocks as can be resident at once (every block must be, grid_sync.cuh), capped
// by the work. With __launch_bounds__(256, 2) that is 2 blocks per SM (1 per SM measured slower).
int fused_grid(size_t smem, int max_useful_blocks) {
    int occ = 0;
    LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_decode_fused_kernel, NORM_THREADS,
                                                                   smem));
    if (occ < 1) throw std::invalid_argument("moe_decode_fused: the kernel does not fit on a multiprocessor");
    return std::max(1, std::min(max_useful_blocks, occ * sm_count()));
}

}  // namespace

void moe_decode_fused(const MoeDecodeFusedArgs& a, cudaStream_t stream) {
    const char* op = "moe_decode_fused";
    moe_check_tokens(op, 1, a.k, a.H);
    moe_check_experts(op, a.E, a.k);
    moe_check_intermediate(op, a.I);
    moe_check_intermediate(op, a.shared.inter);
    require(a.residual && a.delta_in && a.post_norm && a.router && a.gate_up && a.down && a.shared.gate_up &&
                a.shared.down && a.shared.w_gate && a.out && a.logits && a.act && a.sync,
            op, "a required pointer is null");
    require(!a.next_norm || a.normed, op, "next_norm needs a normed output");
    require(a.H <= 4 * NORM_THREADS * FM_MAX_NORM_VEC, op, "H must be <= 4096, got " + std::to_string(a.H));
    const size_t smem = (size_t(a.H) + size_t(a.k) * a.I + a.shared.inter) * sizeof(bf16);
    if (smem > 48 * 1024) allow_dynamic_smem(moe_decode_fused_kernel, smem, op);
    const int work = std::max({a.E + a.shared.inter, a.k * a.I, a.H});
    const int grid = fused_grid(smem, ceil_div(work, FM_WARPS));
    launch_pdl(op, moe_decode_fused_kernel, grid, NORM_THREADS, smem, stream, a);
}

}  // namespace lampo
