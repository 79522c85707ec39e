// gated_delta_rule_recurrent.cu - the Gated DeltaNet token loop (decode, speculative verify).
//
//   qkv [T, 2*Hk*128 + Hv*128] bf16 (post-conv q | k | v) ; a, b [T, Hv] bf16 ;
//   A_log, dt_bias [Hv] fp32 ; state [Hv, 128, 128] fp32, S[j][i][m] (i: key dim, m: value dim)
//   per token t and V head j (QK head j / (Hv/Hk)):
//     g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
//     q = l2norm(q) / sqrt(128), k = l2norm(k)
//     S = exp(g) S ; e = v - S^T k ; S += k (beta e)^T ; o = S^T q      -> o [T, Hv, 128] bf16
//   snapshots (optional): the state after token t at snapshots + t * Hv*128*128.
//
// The state is pure bandwidth (64 KiB per head read and written once per call), and its columns
// m evolve independently, so each block owns a 128 x 16 column slice of one head (Hv*8 blocks)
// and keeps it in registers for all T tokens: thread (rg, cg) holds rows rg + 32n (n < 4) of 4
// columns as float4 (coalesced 16-byte loads). Both reductions of a token come from one pass over
// the decayed state, using S_new^T q = exp(g) S^T q + beta e (k.q):
//     kS = S^T k, qS = S^T q (old S) ; e = v - exp(g) kS ; o = exp(g) qS + beta e (k.q)
#include "common.cuh"
#include "launch_utils.cuh"
#include "gdn_common.cuh"
#include "gdn_moe_vec.cuh"
#include "ops.h"

namespace lampo {
namespace {

constexpr int REC_COLS = 16;                 // state columns per block
constexpr int REC_THREADS = 128;             // 32 row groups x 4 column groups
constexpr int REC_WARPS = REC_THREADS / 32;
constexpr int REC_ROWS = GDN_D / 32;         // rows per thread

__global__ void __launch_bounds__(REC_THREADS)
gdn_recurrent_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ a,
                     const bf16* __restrict__ b, const float* __restrict__ A_log,
                     const float* __restrict__ dt_bias, float* __restrict__ state,
                     bf16* __restrict__ o, float* __restrict__ snapshots, int T, int Hk, int Hv) {
    pdl_begin();
    __shared__ float q_s[GDN_D], k_s[GDN_D];
    __shared__ float norm_part[REC_WARPS][3];
    __shared__ float dot_part[REC_WARPS][4][8];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int cg = tid & 3, rg = tid >> 2;
    const int j = blockIdx.y, hk = j / (Hv / Hk);
    const int m0 = blockIdx.x * REC_COLS + cg * 4;
    const int width = gdn_qkv_width(Hk, Hv);
    const size_t head_elems = size_t(GDN_D) * GDN_D;

    float4 S[REC_ROWS];
    const float* Sj = state + j * head_elems;
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n)
        S[n] = *reinterpret_cast<const float4*>(Sj + size_t(rg + 32 * n) * GDN_D + m0);

    const float a_log = A_log[j], dtb = dt_bias[j];
    const float inv_sqrt_d = rsqrtf(float(GDN_D));

    for (int t = 0; t < T; ++t) {
        const bf16* row = qkv + size_t(t) * width;
        const float qv = __bfloat162float(row[hk * GDN_D + tid]);
        const float kv = __bfloat162float(row[Hk * GDN_D + hk * GDN_D + tid]);
        const float sq = warp_sum(qv * qv), sk = warp_sum(kv * kv), sqk = warp_sum(qv * kv);
        if (lane == 0) {
            norm_part[warp][0] = sq;
            norm_part[warp][1] = sk;
            norm_part[warp][2] = sqk;
        }
        __syncthreads();
        float tq = 0.f, tk = 0.f, tqk = 0.f;
#pragma unroll
        for (int w = 0; w < REC_WARPS; ++w) {
            tq += norm_part[w][0];
            tk += norm_part[w][1];
            tqk += norm_part[w][2];
        }
        const float rq = rsqrtf(tq + GDN_L2_EPS) * inv_sqrt_d, rk = rsqrtf(tk + GDN_L2_EPS);
        q_s[tid] = qv * rq;
        k_s[tid] = kv * rk;
        const float kq = tqk * rq * rk;
        float g, beta;
        gdn_gates(__bfloat162float(a[size_t(t) * Hv + j]), __bfloat162float(b[size_t(t) * Hv + j]),
                  a_log, dtb, g, beta);
        const float decay = expf(g);
        __syncthreads();

        // Partial S^T k and S^T q over this thread's rows, then over all 32 row groups.
        float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int n = 0; n < REC_ROWS; ++n) {
            const float kk = k_s[rg + 32 * n], qq = q_s[rg + 32 * n];
            part[0] = fmaf(kk, S[n].x, part[0]);
            part[1] = fmaf(kk, S[n].y, part[1]);
            part[2] = fmaf(kk, S[n].z, part[2]);
            part[3] = fmaf(kk, S[n].w, part[3]);
            part[4] = fmaf(qq, S[n].x, part[4]);
            part[5] = fmaf(qq, S[n].y, part[5]);
            part[6] = fmaf(qq, S[n].z, part[6]);
            part[7] = fmaf(qq, S[n].w, part[7]);
        }
#pragma unroll
        for (int p = 0; p < 8; ++p) {
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) part[p] += __shfl_xor_sync(0xffffffffu, part[p], off);
        }
        if (lane < 4) {
#pragma unroll
            for (int p = 0; p < 8; ++p) dot_part[warp][cg][p] = part[p];
        }
        __syncthreads();
        float tot[8];
#pragma unroll
        for (int p = 0; p < 8; ++p) {
            tot[p] = 0.f;
#pragma unroll
            for (int w = 0; w < REC_WARPS; ++w) tot[p] += dot_part[w][cg][p];
        }

        const float4 v = load_bf16x4(row + 2 * Hk * GDN_D + j * GDN_D + m0);
        float4 be;  // beta * e
        be.x = beta * (v.x - decay * tot[0]);
        be.y = beta * (v.y - decay * tot[1]);
        be.z = beta * (v.z - decay * tot[2]);
        be.w = beta * (v.w - decay * tot[3]);
        if (rg == 0) {
            const float4 out = make_float4(fmaf(decay, tot[4], be.x * kq), fmaf(decay, tot[5], be.y * kq),
                                           fmaf(decay, tot[6], be.z * kq), fmaf(decay, tot[7], be.w * kq));
            store_bf16x4(o + (size_t(t) * Hv + j) * GDN_D + m0, out);
        }
#pragma unroll
        for (int n = 0; n < REC_ROWS; ++n) {
            const float kk = k_s[rg + 32 * n];
            S[n].x = fmaf(decay, S[n].x, kk * be.x);
            S[n].y = fmaf(decay, S[n].y, kk * be.y);
            S[n].z = fmaf(decay, S[n].z, kk * be.z);
            S[n].w = fmaf(decay, S[n].w, kk * be.w);
        }
        if (snapshots) {
            float* snap = snapshots + size_t(t) * Hv * head_elems + j * head_elems;
#pragma unroll
            for (int n = 0; n < REC_ROWS; ++n)
                *reinterpret_cast<float4*>(snap + size_t(rg + 32 * n) * GDN_D + m0) = S[n];
        }
    }

    float* Sw = state + j * head_elems;
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n)
        *reinterpret_cast<float4*>(Sw + size_t(rg + 32 * n) * GDN_D + m0) = S[n];
}

}  // namespace

void gated_delta_rule_recurrent(const bf16* qkv, const bf16* a, const bf16* b, const float* A_log,
                                const float* dt_bias, float* state, bf16* o, float* snapshots,
                                int T, int Hk, int Hv, int dk, int dv, cudaStream_t stream) {
    gdn_check_dims("gated_delta_rule_recurrent", T, Hk, Hv, dk, dv);
    launch_pdl("gdn_recurrent_kernel", gdn_recurrent_kernel, dim3(GDN_D / REC_COLS, Hv), REC_THREADS, 0,
               stream, qkv, a, b, A_log, dt_bias, state, o, snapshots, T, Hk, Hv);
}

}  // namespace lampo
