// moe_router.cu - MoE router: fp32 logits, softmax over all experts, top-k, renormalised weights.
//
//   h [T, H] bf16 ; w_router [E, H] bf16 -> logits [T, E] fp32 (written: caller's scratch)
//   p = softmax(logits) ; top-k of p (ties -> lower id) ; w = p_sel / sum(p_sel)
//   -> ids [T, k] int32 (descending p), weights [T, k] fp32
//   (w is computed as exp(l_sel - l_max) / sum over the selected: the same numbers.)
//
// Two launches. Logits: for T <= 8 the projections' GEMV (gemv.cu, the router matrix read once for
// all rows; the folded decode step runs the same GEMV on the normed residual, so every decode path
// sums the logits in one order); for a prefill chunk the tensor-core GEMM of moe_grouped_gemm.cuh
// as one dense group. Top-k: one warp per token, each lane holding up to 16 logits in registers
// (E <= 512), k rounds of a warp arg-max.
#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/matmul.cuh"
#include "kernels/moe/moe_common.h"
#include "kernels/moe/moe_grouped_gemm.cuh"
#include "kernels/moe/moe_topk.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int TOPK_WARPS = 4;

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
        gemv_bf16<float>(w_router, h, logits, T, E, H, stream);
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
