// moe_router.cu - MoE router: fp32 logits, softmax over all experts, top-k, renormalised weights.
//
//   h [T, H] bf16 ; w_router [E, H] bf16 -> logits [T, E] fp32 (written: caller's scratch)
//   p = softmax(logits) ; top-k of p (ties -> lower id) ; w = p_sel / sum(p_sel)
//   -> ids [T, k] int32 (descending p), weights [T, k] fp32
//   (w is computed as exp(l_sel - l_max) / sum over the selected: the same numbers.)
//
// Two launches. Logits: for T <= 8 a GEMV that reads the router matrix once for all rows (one
// warp per expert row, 16-byte loads); for a prefill chunk the tensor-core GEMM of
// moe_grouped_gemm.cuh as one dense group. Top-k: one warp per token, each lane holding up to 16
// logits in registers (E <= 512), k rounds of a warp arg-max.
#include "common.cuh"
#include "launch_utils.cuh"
#include "gdn_moe_vec.cuh"
#include "moe_common.h"
#include "moe_grouped_gemm.cuh"
#include "moe_topk.cuh"
#include "ops.h"

namespace lampo {
namespace {

constexpr int ROUTER_GEMV_WARPS = 4;
constexpr int TOPK_WARPS = 4;

// Logits of expert row e for all TT tokens: one warp, 16-byte loads, U in flight per lane.
template <int TT>
__device__ __forceinline__ void router_row_logits(const bf16* __restrict__ h, const bf16* __restrict__ w,
                                                  float* __restrict__ logits, int e, int H, int E) {
    const int lane = threadIdx.x % 32;
    const bf16* row = w + size_t(e) * H;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[t] = 0.f;
    constexpr int U = 4;  // 16-byte weight loads in flight per lane
    for (int base = 0; base < H; base += 32 * 8 * U) {
        uint4 wv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) wv[u] = ldg_u4(row + c);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) {
#pragma unroll
                for (int t = 0; t < TT; ++t) acc[t] = dot_bf16x8(wv[u], ldg_u4(h + size_t(t) * H + c), acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) logits[size_t(t) * E + e] = s;
    }
}

template <int TT>
__global__ void __launch_bounds__(ROUTER_GEMV_WARPS * 32)
router_logits_gemv(const bf16* __restrict__ h, const bf16* __restrict__ w, float* __restrict__ logits,
                   int H, int E) {
    pdl_begin();
    const int e = blockIdx.x * ROUTER_GEMV_WARPS + threadIdx.x / 32;
    if (e < E) router_row_logits<TT>(h, w, logits, e, H, E);
}

__global__ void __launch_bounds__(TOPK_WARPS * 32)
router_topk(const float* __restrict__ logits, int32_t* __restrict__ ids, float* __restrict__ weights,
            int T, int E, int k) {
    pdl_begin();
    const int t = blockIdx.x * TOPK_WARPS + threadIdx.x / 32;
    if (t < T) router_row_topk(logits, ids, weights, t, E, k);
}

}  // namespace

void moe_router_topk(const bf16* h, const bf16* w_router, float* logits, int32_t* ids,
                     float* weights, int T, int H, int E, int k, cudaStream_t stream) {
    moe_check_tokens("moe_router_topk", T, k, H);
    moe_check_experts("moe_router_topk", E, k);
    if (T <= MOE_DECODE_MAX_T) {
        const dim3 grid(ceil_div(E, ROUTER_GEMV_WARPS));
        const int threads = ROUTER_GEMV_WARPS * 32;
        auto launch = [&](auto gemv) {
            launch_pdl("router_logits_gemv", gemv, grid, threads, 0, stream, h, w_router, logits, H, E);
        };
        switch (T) {
            case 1: launch(router_logits_gemv<1>); break;
            case 2: launch(router_logits_gemv<2>); break;
            case 3: launch(router_logits_gemv<3>); break;
            case 4: launch(router_logits_gemv<4>); break;
            case 5: launch(router_logits_gemv<5>); break;
            case 6: launch(router_logits_gemv<6>); break;
            case 7: launch(router_logits_gemv<7>); break;
            default: launch(router_logits_gemv<8>); break;
        }
    } else {
        moe_gemm::Problem p{};
        p.A = h;
        p.B = w_router;
        p.C = logits;
        p.ldc = E;
        p.N = E;
        p.K = H;
        p.rows = T;
        moe_gemm::launch_grouped_gemm<moe_gemm::Epilogue::F32>(p, ceil_div(T, moe_gemm::BM), stream);
    }
    launch_pdl("router_topk", router_topk, ceil_div(T, TOPK_WARPS), TOPK_WARPS * 32, 0, stream, logits, ids,
               weights, T, E, k);
}

}  // namespace lampo
