// moe_shared_combine.cu - adds the gated shared expert to the routed experts' output:
//   out[t] = bf16(routed[t] + sigmoid(h_t . w_gate) * shared[t])     all [T, H] bf16, w_gate [H]
// One block per token: a block reduction for the scalar gate, then 16-byte elementwise work.
#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/moe/moe_common.h"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int SC_THREADS = 256;

__global__ void __launch_bounds__(SC_THREADS)
moe_shared_combine_kernel(const bf16* __restrict__ routed, const bf16* __restrict__ shared,
                          const bf16* __restrict__ h, const bf16* __restrict__ w_gate,
                          bf16* __restrict__ out, int H) {
    pdl_begin();
    __shared__ float part[SC_THREADS / 32];
    const size_t row = size_t(blockIdx.x) * H;
    float dot = 0.f;
    for (int c = threadIdx.x * 8; c < H; c += SC_THREADS * 8)
        dot = dot_bf16x8(ldg_u4(h + row + c), ldg_u4(w_gate + c), dot);
    dot = warp_sum(dot);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = dot;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < SC_THREADS / 32; ++w) total += part[w];
    const float gate = sigmoid(total);
    for (int c = threadIdx.x * 8; c < H; c += SC_THREADS * 8) {
        float r[8], s[8], y[8];
        load_bf16x8(routed + row + c, r);
        load_bf16x8(shared + row + c, s);
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = fmaf(gate, s[e], r[e]);
        store_bf16x8(out + row + c, y);
    }
}

}  // namespace

void moe_shared_combine(const bf16* routed, const bf16* shared, const bf16* h, const bf16* w_gate,
                        bf16* out, int T, int H, cudaStream_t stream) {
    moe_check_tokens("moe_shared_combine", T, 1, H);
    launch_pdl("moe_shared_combine_kernel", moe_shared_combine_kernel, T, SC_THREADS, 0, stream, routed,
               shared, h, w_gate, out, H);
}

}  // namespace lampo
