// gated_delta_rule_chunked.cu - the Gated DeltaNet over a prefill chunk, in the WY form with
// chunk C = 64 (qwen3.6-architecture.md §4.4); the same function as the token loop of
// gated_delta_rule_recurrent.cu (same I/O, see ops.h), fp32 inside.
//
// Per V head j and chunk of C rows (the last chunk zero-padded: q = k = v = 0, g = beta = 0):
//   G_t = g_1 + ... + g_t ; Gam_ts = exp(G_t - G_s) for t >= s, else 0
//   A   = strictly_lower(beta_t (k_t . k_s) Gam_ts)
//   (I + A) U = diag(beta) V ; (I + A) W = diag(beta exp(G)) K      (forward substitution)
//   P   = (Q K^T) .* Gam  (lower, diagonal kept)
//   then, sequentially over chunks with the state S [128, 128]:
//   V' = U - W S ; O = (Q .* exp(G)) S + P V' ; S = exp(G_C) S + (K .* exp(G_C - G))^T V'
// where q and k are l2-normed (q also scaled by 1/sqrt(128)).
//
// Two kernels (fp32 SIMT, no tensor cores: the state must stay fp32-exact to ~1e-6):
//   1. gdn_chunk_prepare, grid (chunks, Hv): everything local to one chunk, fully parallel.
//      Writes per (chunk, head) a record of U, W, P and the per-row scales that turn the raw
//      bf16 q / k rows into Q .* exp(G) and K .* exp(G_C - G) (plus exp(G_C)).
//   2. gdn_chunk_scan, grid (128/16, Hv): the sequential part. Columns of S evolve
//      independently, so each block owns a 128 x 16 column slice of one head's state (in shared
//      memory) and walks the chunks in order, staging each chunk's operands through shared
//      memory in tiles and computing V', O and the new S for its 16 columns.
#include "kernels/common.cuh"
#include "kernels/gdn/gdn_common.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int CH = 64;  // chunk length

// Workspace record per (chunk, V head), in floats.
constexpr int REC_U = 0;                         // U [64][128]
constexpr int REC_W = REC_U + CH * GDN_D;        // W [64][128]
constexpr int REC_P = REC_W + CH * GDN_D;        // P [64][64]
constexpr int REC_QSCALE = REC_P + CH * CH;      // [64]: rq_t * exp(G_t)        (0 on padding)
constexpr int REC_KSCALE = REC_QSCALE + CH;      // [64]: rk_t * exp(G_C - G_t)  (0 on padding)
constexpr int REC_GAMMA = REC_KSCALE + CH;       // [1] : exp(G_C)  (padded to 4 floats)
constexpr int REC_FLOATS = REC_GAMMA + 4;

// ---- kernel 1: chunk-local preparation -------------------------------------------------------
constexpr int PREP_THREADS = 256;
constexpr int XS = GDN_D + 4;  // padded row stride of the [64][128] tiles (16-byte rows, no conflicts)
constexpr int AS = CH + 4;     // padded row stride of A
constexpr size_t PREP_SMEM = sizeof(float) * (2 * CH * XS + CH * AS + 4 * CH);

__global__ void __launch_bounds__(PREP_THREADS)
gdn_chunk_prepare(const bf16* __restrict__ qkv, const bf16* __restrict__ a,
                  const bf16* __restrict__ b, const float* __restrict__ A_log,
                  const float* __restrict__ dt_bias, float* __restrict__ ws, int T, int Hk,
                  int Hv) {
    extern __shared__ float4 prep_smem4[];
    float* X1 = reinterpret_cast<float*>(prep_smem4);  // q rows, then beta*v
    float* X2 = X1 + CH * XS;                           // k rows, then beta*exp(G)*k
    float* Am = X2 + CH * XS;                           // A
    float* G_s = Am + CH * AS;
    float* beta_s = G_s + CH;
    float* rq_s = beta_s + CH;
    float* rk_s = rq_s + CH;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int c = blockIdx.x, j = blockIdx.y, hk = j / (Hv / Hk);
    const int tok0 = c * CH, nrows = min(CH, T - tok0);
    const int width = gdn_qkv_width(Hk, Hv);
    float* rec = ws + (size_t(c) * Hv + j) * REC_FLOATS;

    // 1. raw q, k rows (fp32) and the gates
    for (int idx = tid; idx < CH * (GDN_D / 8); idx += PREP_THREADS) {
        const int t = idx / (GDN_D / 8), col = (idx % (GDN_D / 8)) * 8;
        float qv[8], kv[8];
        if (t < nrows) {
            const bf16* row = qkv + size_t(tok0 + t) * width;
            load_bf16x8(row + hk * GDN_D + col, qv);
            load_bf16x8(row + (Hk + hk) * GDN_D + col, kv);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) qv[e] = kv[e] = 0.f;
        }
        float4* xq = reinterpret_cast<float4*>(X1 + t * XS + col);
        float4* xk = reinterpret_cast<float4*>(X2 + t * XS + col);
        xq[0] = make_float4(qv[0], qv[1], qv[2], qv[3]);
        xq[1] = make_float4(qv[4], qv[5], qv[6], qv[7]);
        xk[0] = make_float4(kv[0], kv[1], kv[2], kv[3]);
        xk[1] = make_float4(kv[4], kv[5], kv[6], kv[7]);
    }
    if (tid < CH) {
        float g = 0.f, beta = 0.f;
        if (tid < nrows) {
            const size_t ab = size_t(tok0 + tid) * Hv + j;
            gdn_gates(__bfloat162float(a[ab]), __bfloat162float(b[ab]), A_log[j], dt_bias[j], g, beta);
        }
        G_s[tid] = g;
        beta_s[tid] = beta;
    }
    __syncthreads();

    // 2. l2-normalise the rows (warp w: rows 8w..8w+7); warp 0 also turns g into G (prefix sum)
    const float inv_sqrt_d = rsqrtf(float(GDN_D));
    for (int r = 0; r < CH / 8; ++r) {
        const int t = warp * (CH / 8) + r;
        float4* xq = reinterpret_cast<float4*>(X1 + t * XS) + lane;
        float4* xk = reinterpret_cast<float4*>(X2 + t * XS) + lane;
        float4 qv = *xq, kv = *xk;
        const float sq = warp_sum(qv.x * qv.x + qv.y * qv.y + qv.z * qv.z + qv.w * qv.w);
        const float sk = warp_sum(kv.x * kv.x + kv.y * kv.y + kv.z * kv.z + kv.w * kv.w);
        const float rq = rsqrtf(sq + GDN_L2_EPS) * inv_sqrt_d, rk = rsqrtf(sk + GDN_L2_EPS);
        *xq = make_float4(qv.x * rq, qv.y * rq, qv.z * rq, qv.w * rq);
        *xk = make_float4(kv.x * rk, kv.y * rk, kv.z * rk, kv.w * rk);
        if (lane == 0) {
            rq_s[t] = rq;
            rk_s[t] = rk;
        }
    }
    if (warp == 0) {
        const float g0 = G_s[2 * lane], g1 = G_s[2 * lane + 1];
        float incl = g0 + g1;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float up = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += up;
        }
        const float excl = incl - (g0 + g1);
        G_s[2 * lane] = excl + g0;
        G_s[2 * lane + 1] = incl;
    }
    __syncthreads();

    // 3. K K^T and Q K^T (64 x 64); thread (tr, tc) owns rows tr + 16u and columns tc + 16v
    {
        const int tr = tid / 16, tc = tid % 16;
        float kk[4][4] = {}, qk[4][4] = {};
        for (int i = 0; i < GDN_D; i += 4) {
            float4 kt[4], ks[4], qt[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                kt[u] = *reinterpret_cast<const float4*>(X2 + (tr + 16 * u) * XS + i);
                qt[u] = *reinterpret_cast<const float4*>(X1 + (tr + 16 * u) * XS + i);
                ks[u] = *reinterpret_cast<const float4*>(X2 + (tc + 16 * u) * XS + i);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    kk[u][v] += kt[u].x * ks[v].x + kt[u].y * ks[v].y + kt[u].z * ks[v].z + kt[u].w * ks[v].w;
                    qk[u][v] += qt[u].x * ks[v].x + qt[u].y * ks[v].y + qt[u].z * ks[v].z + qt[u].w * ks[v].w;
                }
        }
        float* P = rec + REC_P;
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int t = tr + 16 * u, s = tc + 16 * v;
                const float gam = t >= s ? expf(G_s[t] - G_s[s]) : 0.f;
                Am[t * AS + s] = t > s ? beta_s[t] * kk[u][v] * gam : 0.f;
                P[t * CH + s] = qk[u][v] * gam;
            }
    }
    __syncthreads();

    // 4. right-hand sides: X1 = beta * v, X2 = beta * exp(G) * k ; per-row scales for the scan
    const float G_C = G_s[CH - 1];
    for (int idx = tid; idx < CH * (GDN_D / 4); idx += PREP_THREADS) {
        const int t = idx / (GDN_D / 4), col = (idx % (GDN_D / 4)) * 4;
        const float bt = beta_s[t];
        float4 vv = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < nrows) vv = load_bf16x4(qkv + size_t(tok0 + t) * width + (2 * Hk + j) * GDN_D + col);
        *reinterpret_cast<float4*>(X1 + t * XS + col) = make_float4(bt * vv.x, bt * vv.y, bt * vv.z, bt * vv.w);
        float4* xk = reinterpret_cast<float4*>(X2 + t * XS + col);
        const float sk = bt * expf(G_s[t]);
        const float4 kv = *xk;
        *xk = make_float4(sk * kv.x, sk * kv.y, sk * kv.z, sk * kv.w);
    }
    if (tid < CH) {
        const bool valid = tid < nrows;
        rec[REC_QSCALE + tid] = valid ? rq_s[tid] * expf(G_s[tid]) : 0.f;
        rec[REC_KSCALE + tid] = valid ? rk_s[tid] * expf(G_C - G_s[tid]) : 0.f;
    }
    if (tid == 0) rec[REC_GAMMA] = expf(G_C);
    __syncthreads();

    // 5. forward substitution, one column of [U | W] per thread, kept in registers
    {
        const int col = tid % GDN_D;
        const float* X = tid < GDN_D ? X1 : X2;
        float* out = rec + (tid < GDN_D ? REC_U : REC_W);
        float x[CH];
#pragma unroll
        for (int t = 0; t < CH; ++t) {
            float acc = X[t * XS + col];
            const float* arow = Am + t * AS;
#pragma unroll
            for (int s4 = 0; s4 < t; s4 += 4) {
                const float4 av = *reinterpret_cast<const float4*>(arow + s4);
                acc -= av.x * x[s4];
                if (s4 + 1 < t) acc -= av.y * x[s4 + 1];
                if (s4 + 2 < t) acc -= av.z * x[s4 + 2];
                if (s4 + 3 < t) acc -= av.w * x[s4 + 3];
            }
            x[t] = acc;
            out[t * GDN_D + col] = acc;
        }
    }
}

// ---- kernel 2: the sequential scan over chunks ------------------------------------------------
constexpr int SCAN_COLS = 16;     // state columns per block
constexpr int SCAN_THREADS = 128;
constexpr int HS = CH + 4;        // padded stride of the [64][64] staged tiles
constexpr int STAGE_FLOATS = (2 * CH * HS > CH * XS) ? 2 * CH * HS : CH * XS;

// dst[t][0..ncols) = src_row(t)[0..ncols) * scale[t] for bf16 rows (zero rows past nrows).
__device__ __forceinline__ void stage_scaled_bf16(float* dst, int dst_stride, const bf16* src,
                                                  size_t src_stride, int ncols, const float* scale,
                                                  int nrows) {
    const int per_row = ncols / 8;
    for (int idx = threadIdx.x; idx < CH * per_row; idx += SCAN_THREADS) {
        const int t = idx / per_row, col = (idx % per_row) * 8;
        float v[8];
        if (t < nrows) {
            load_bf16x8(src + size_t(t) * src_stride + col, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.f;
        }
        const float s = scale[t];
        float4* d = reinterpret_cast<float4*>(dst + t * dst_stride + col);
        d[0] = make_float4(v[0] * s, v[1] * s, v[2] * s, v[3] * s);
        d[1] = make_float4(v[4] * s, v[5] * s, v[6] * s, v[7] * s);
    }
}

// dst[t][0..ncols) = src[t * src_stride + 0..ncols) for fp32 rows.
__device__ __forceinline__ void stage_f32(float* dst, int dst_stride, const float* src,
                                          int src_stride, int ncols) {
    const int per_row = ncols / 4;
    for (int idx = threadIdx.x; idx < CH * per_row; idx += SCAN_THREADS) {
        const int t = idx / per_row, col = (idx % per_row) * 4;
        *reinterpret_cast<float4*>(dst + t * dst_stride + col) =
            *reinterpret_cast<const float4*>(src + size_t(t) * src_stride + col);
    }
}

__device__ __forceinline__ void fma4(float4& acc, float s, float4 v) {
    acc.x = fmaf(s, v.x, acc.x);
    acc.y = fmaf(s, v.y, acc.y);
    acc.z = fmaf(s, v.z, acc.z);
    acc.w = fmaf(s, v.w, acc.w);
}

__global__ void __launch_bounds__(SCAN_THREADS)
gdn_chunk_scan(const bf16* __restrict__ qkv, const float* __restrict__ ws, GdnStates states,
               bf16* __restrict__ o, int T, int Hk, int Hv) {
    __shared__ __align__(16) float S_s[GDN_D * SCAN_COLS];  // S[:, slice]
    __shared__ __align__(16) float Vp[CH * SCAN_COLS];      // V'[:, slice]
    __shared__ __align__(16) float stage[STAGE_FLOATS];
    __shared__ float qscale[CH], kscale[CH];

    const int tid = threadIdx.x;
    const int j = blockIdx.y, hk = j / (Hv / Hk);
    const int m0 = blockIdx.x * SCAN_COLS;
    const int cg = tid & 3, rp = tid >> 2;  // column group of 4; row pair (rp, rp + 32) / row quad
    const int width = gdn_qkv_width(Hk, Hv);
    const int nchunks = (T + CH - 1) / CH;
    // The block's slice of the state before the chunk (slot p) and after it (slot p + T: GdnStates)
    const size_t head_elems = size_t(GDN_D) * GDN_D, slot_elems = size_t(Hv) * head_elems;
    const int p = gdn_first_position(states);
    const float* Sg = states.recurrent + gdn_recurrent_offset(states, p, slot_elems) + j * head_elems;

    for (int idx = tid; idx < GDN_D * SCAN_COLS / 4; idx += SCAN_THREADS) {
        const int i = idx / (SCAN_COLS / 4), c4 = (idx % (SCAN_COLS / 4)) * 4;
        *reinterpret_cast<float4*>(S_s + i * SCAN_COLS + c4) =
            *reinterpret_cast<const float4*>(Sg + size_t(i) * GDN_D + m0 + c4);
    }

    for (int c = 0; c < nchunks; ++c) {
        const float* rec = ws + (size_t(c) * Hv + j) * REC_FLOATS;
        const int tok0 = c * CH, nrows = min(CH, T - tok0);
        const bf16* rows = qkv + size_t(tok0) * width;
        if (tid < CH) {
            qscale[tid] = rec[REC_QSCALE + tid];
            kscale[tid] = rec[REC_KSCALE + tid];
        }
        const float gamma = rec[REC_GAMMA];
        const int t0 = rp, t1 = rp + 32;

        // V' = U - W S and O = (Q .* exp(G)) S, over two halves of the key dimension
        float4 accW0 = make_float4(0.f, 0.f, 0.f, 0.f), accW1 = accW0, accQ0 = accW0, accQ1 = accW0;
        for (int half = 0; half < 2; ++half) {
            __syncthreads();  // stage free (and qscale visible)
            float* Ws = stage;
            float* Qs = stage + CH * HS;
            stage_f32(Ws, HS, rec + REC_W + half * 64, GDN_D, 64);
            stage_scaled_bf16(Qs, HS, rows + hk * GDN_D + half * 64, width, 64, qscale, nrows);
            __syncthreads();
            const float* Sh = S_s + half * 64 * SCAN_COLS + cg * 4;
#pragma unroll 4
            for (int i = 0; i < 64; i += 4) {
                const float4 w0 = *reinterpret_cast<const float4*>(Ws + t0 * HS + i);
                const float4 w1 = *reinterpret_cast<const float4*>(Ws + t1 * HS + i);
                const float4 q0 = *reinterpret_cast<const float4*>(Qs + t0 * HS + i);
                const float4 q1 = *reinterpret_cast<const float4*>(Qs + t1 * HS + i);
                const float w0a[4] = {w0.x, w0.y, w0.z, w0.w}, w1a[4] = {w1.x, w1.y, w1.z, w1.w};
                const float q0a[4] = {q0.x, q0.y, q0.z, q0.w}, q1a[4] = {q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                for (int ii = 0; ii < 4; ++ii) {
                    const float4 s = *reinterpret_cast<const float4*>(Sh + (i + ii) * SCAN_COLS);
                    fma4(accW0, w0a[ii], s);
                    fma4(accW1, w1a[ii], s);
                    fma4(accQ0, q0a[ii], s);
                    fma4(accQ1, q1a[ii], s);
                }
            }
        }
        {
            const float4 u0 = *reinterpret_cast<const float4*>(rec + REC_U + t0 * GDN_D + m0 + cg * 4);
            const float4 u1 = *reinterpret_cast<const float4*>(rec + REC_U + t1 * GDN_D + m0 + cg * 4);
            *reinterpret_cast<float4*>(Vp + t0 * SCAN_COLS + cg * 4) =
                make_float4(u0.x - accW0.x, u0.y - accW0.y, u0.z - accW0.z, u0.w - accW0.w);
            *reinterpret_cast<float4*>(Vp + t1 * SCAN_COLS + cg * 4) =
                make_float4(u1.x - accW1.x, u1.y - accW1.y, u1.z - accW1.z, u1.w - accW1.w);
        }
        __syncthreads();  // V' complete, stage free

        // O += P V'
        float* Ps = stage;
        stage_f32(Ps, HS, rec + REC_P, CH, CH);
        __syncthreads();
#pragma unroll 4
        for (int s = 0; s < CH; s += 4) {
            const float4 p0 = *reinterpret_cast<const float4*>(Ps + t0 * HS + s);
            const float4 p1 = *reinterpret_cast<const float4*>(Ps + t1 * HS + s);
            const float p0a[4] = {p0.x, p0.y, p0.z, p0.w}, p1a[4] = {p1.x, p1.y, p1.z, p1.w};
#pragma unroll
            for (int ss = 0; ss < 4; ++ss) {
                const float4 v = *reinterpret_cast<const float4*>(Vp + (s + ss) * SCAN_COLS + cg * 4);
                fma4(accQ0, p0a[ss], v);
                fma4(accQ1, p1a[ss], v);
            }
        }
        if (t0 < nrows) store_bf16x4(o + (size_t(tok0 + t0) * Hv + j) * GDN_D + m0 + cg * 4, accQ0);
        if (t1 < nrows) store_bf16x4(o + (size_t(tok0 + t1) * Hv + j) * GDN_D + m0 + cg * 4, accQ1);
        __syncthreads();  // stage free

        // S = exp(G_C) S + (K .* exp(G_C - G))^T V' ; thread owns rows 4 rp .. 4 rp + 3
        float* Ks = stage;
        stage_scaled_bf16(Ks, XS, rows + (Hk + hk) * GDN_D, width, GDN_D, kscale, nrows);
        __syncthreads();
        {
            float4 acc[4];
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                const float4 s = *reinterpret_cast<const float4*>(S_s + (4 * rp + n) * SCAN_COLS + cg * 4);
                acc[n] = make_float4(gamma * s.x, gamma * s.y, gamma * s.z, gamma * s.w);
            }
#pragma unroll 4
            for (int t = 0; t < CH; ++t) {
                const float4 kd = *reinterpret_cast<const float4*>(Ks + t * XS + 4 * rp);
                const float4 v = *reinterpret_cast<const float4*>(Vp + t * SCAN_COLS + cg * 4);
                fma4(acc[0], kd.x, v);
                fma4(acc[1], kd.y, v);
                fma4(acc[2], kd.z, v);
                fma4(acc[3], kd.w, v);
            }
#pragma unroll
            for (int n = 0; n < 4; ++n)
                *reinterpret_cast<float4*>(S_s + (4 * rp + n) * SCAN_COLS + cg * 4) = acc[n];
        }
    }
    __syncthreads();

    float* S_out = states.recurrent + gdn_recurrent_offset(states, p + T, slot_elems) + j * head_elems;
    for (int idx = tid; idx < GDN_D * SCAN_COLS / 4; idx += SCAN_THREADS) {
        const int i = idx / (SCAN_COLS / 4), c4 = (idx % (SCAN_COLS / 4)) * 4;
        *reinterpret_cast<float4*>(S_out + size_t(i) * GDN_D + m0 + c4) =
            *reinterpret_cast<const float4*>(S_s + i * SCAN_COLS + c4);
    }
}

}  // namespace

size_t gdn_chunked_workspace_bytes(int T, int Hv, int dk, int dv) {
    (void)dk;
    (void)dv;
    return size_t(ceil_div(T, CH)) * size_t(Hv) * REC_FLOATS * sizeof(float);
}

void gated_delta_rule_chunked(const bf16* qkv, const bf16* a, const bf16* b, const float* A_log,
                              const float* dt_bias, const GdnStates& states, bf16* o, void* workspace, int T,
                              int Hk, int Hv, int dk, int dv, cudaStream_t stream) {
    gdn_check_dims("gated_delta_rule_chunked", T, Hk, Hv, dk, dv);
    gdn_check_states("gated_delta_rule_chunked", states, T, false);
    static const bool smem_configured = [] {
        LAMPO_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_prepare,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              int(PREP_SMEM)));
        return true;
    }();
    (void)smem_configured;
    float* ws = static_cast<float*>(workspace);
    gdn_chunk_prepare<<<dim3(ceil_div(T, CH), Hv), PREP_THREADS, PREP_SMEM, stream>>>(
        qkv, a, b, A_log, dt_bias, ws, T, Hk, Hv);
    gdn_chunk_scan<<<dim3(GDN_D / SCAN_COLS, Hv), SCAN_THREADS, 0, stream>>>(qkv, ws, states, o, T,
                                                                            Hk, Hv);
}

}  // namespace lampo
