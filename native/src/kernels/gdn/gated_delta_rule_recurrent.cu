// gated_delta_rule_recurrent.cu - the Gated DeltaNet token loop (decode, speculative verify).
//
//   qkv [T, 2*Hk*128 + Hv*128] bf16 (post-conv q | k | v) ; a, b [T, Hv] bf16 ;
//   A_log, dt_bias [Hv] fp32 ; state [Hv, 128, 128] fp32, S[j][i][m] (i: key dim, m: value dim)
//   per token t and V head j (QK head j / (Hv/Hk)):
//     g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
//     q = l2norm(q) / sqrt(128), k = l2norm(k)
//     S = exp(g) S ; e = v - S^T k ; S += k (beta e)^T ; o = S^T q      -> o [T, Hv, 128] bf16
//   The state continues from and goes to GdnStates' ring of slots (ops.h); with rows, the state
//   after every token t goes to its slot, or, with records, the token's record (k, beta e, exp(g))
//   from which gdn_replay rebuilds it (below), and the window writes no recurrent state.
//
// The state is pure bandwidth (64 KiB per head read and written once per call), and its columns
// m evolve independently, so each block owns a 128 x 16 column slice of one head (Hv*8 blocks)
// and keeps it in registers for all T tokens: thread (rg, cg) holds rows rg + 32n (n < 4) of 4
// columns as float4 (coalesced 16-byte loads). Both reductions of a token come from one pass over
// the decayed state, using S_new^T q = exp(g) S^T q + beta e (k.q):
//     kS = S^T k, qS = S^T q (old S) ; e = v - exp(g) kS ; o = exp(g) qS + beta e (k.q)
#include <cooperative_groups.h>

#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/gdn/gdn_common.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int REC_COLS = 16;                 // state columns per block
constexpr int REC_THREADS = 128;             // 32 row groups x 4 column groups
constexpr int REC_WARPS = REC_THREADS / 32;
constexpr int REC_ROWS = GDN_D / 32;         // rows per thread

// The state's step S = decay S + k be^T on a thread's slice (rows rg + 32 n, 4 columns): the one
// expression of the token loop and of gdn_replay, so both round alike. k_at(n): k of row rg + 32 n.
template <class KAt>
__device__ __forceinline__ void rank_one_step(float4 (&S)[REC_ROWS], KAt k_at, float decay, float4 be) {
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n) {
        const float kk = k_at(n);
        S[n].x = fmaf(decay, S[n].x, kk * be.x);
        S[n].y = fmaf(decay, S[n].y, kk * be.y);
        S[n].z = fmaf(decay, S[n].z, kk * be.z);
        S[n].w = fmaf(decay, S[n].w, kk * be.w);
    }
}

// Where a thread writes its part of a token's record (GdnStates::records, ops.h), each null where
// it writes none: k (the normed key, thread tid's element) by the first block of a K group, be
// (its 4 columns) by row group 0, the decay by thread 0 of the head's first block.
struct RecordOut {
    float* k = nullptr;
    float* be = nullptr;
    float* decay = nullptr;
};

// The record of token t (GdnStates::records) for the thread at (rg, m0) of head j's block `column`.
__device__ __forceinline__ RecordOut record_out(float* records, int t, int Hk, int Hv, int j, int column, int rg,
                                                int m0) {
    if (!records) return {};
    float* at = records + size_t(t) * gdn_record_floats(Hk, Hv);
    const int tid = threadIdx.x, hk = j / (Hv / Hk);
    RecordOut r;
    if (column == 0 && j % (Hv / Hk) == 0) r.k = at + hk * GDN_D + tid;
    if (rg == 0) r.be = at + (Hk + j) * GDN_D + m0;
    if (column == 0 && tid == 0) r.decay = at + (Hk + Hv) * GDN_D + j;
    return r;
}

// One token of the delta rule for the block's 128 x 16 slice of head j, state S in registers.
// Thread tid brings q[tid], k[tid] (raw, before the l2 norms) and v[m0 .. m0+3] of its column group;
// the return value is o[m0 .. m0+3] (meaningful in every thread; row group 0 stores it). `rec`:
// where the token's record goes (RecordOut).
__device__ __forceinline__ float4 rec_token(float4 (&S)[REC_ROWS], float qv, float kv, float4 v,
                                            float a, float b, float a_log, float dtb, const RecordOut& rec) {
    __shared__ float q_s[GDN_D], k_s[GDN_D];
    __shared__ float norm_part[REC_WARPS][3];
    __shared__ float dot_part[REC_WARPS][4][8];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int cg = tid & 3, rg = tid >> 2;
    const float inv_sqrt_d = rsqrtf(float(GDN_D));

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
    gdn_gates(a, b, a_log, dtb, g, beta);
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

    float4 be;  // beta * e
    be.x = beta * (v.x - decay * tot[0]);
    be.y = beta * (v.y - decay * tot[1]);
    be.z = beta * (v.z - decay * tot[2]);
    be.w = beta * (v.w - decay * tot[3]);
    const float4 out = make_float4(fmaf(decay, tot[4], be.x * kq), fmaf(decay, tot[5], be.y * kq),
                                   fmaf(decay, tot[6], be.z * kq), fmaf(decay, tot[7], be.w * kq));
    rank_one_step(S, [&](int n) { return k_s[rg + 32 * n]; }, decay, be);
    if (rec.k) *rec.k = k_s[tid];
    if (rec.be) *reinterpret_cast<float4*>(rec.be) = be;
    if (rec.decay) *rec.decay = decay;
    return out;
}

// Through L2 (__ldcg): the fused decode step reads the state before its PDL wait (common.cuh).
__device__ __forceinline__ void load_slice(float4 (&S)[REC_ROWS], const float* Sj, int rg, int m0) {
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n)
        S[n] = __ldcg(reinterpret_cast<const float4*>(Sj + size_t(rg + 32 * n) * GDN_D + m0));
}

__device__ __forceinline__ void store_slice(const float4 (&S)[REC_ROWS], float* Sj, int rg, int m0) {
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n)
        *reinterpret_cast<float4*>(Sj + size_t(rg + 32 * n) * GDN_D + m0) = S[n];
}

__global__ void __launch_bounds__(REC_THREADS)
gdn_recurrent_kernel(const bf16* __restrict__ qkv, const bf16* __restrict__ a,
                     const bf16* __restrict__ b, const float* __restrict__ A_log,
                     const float* __restrict__ dt_bias, GdnStates states,
                     bf16* __restrict__ o, bool rows, int T, int Hk, int Hv) {
    pdl_begin();
    const int tid = threadIdx.x;
    const int cg = tid & 3, rg = tid >> 2;
    const int j = blockIdx.y, hk = j / (Hv / Hk);
    const int m0 = blockIdx.x * REC_COLS + cg * 4;
    const int width = gdn_qkv_width(Hk, Hv);
    const size_t head_elems = size_t(GDN_D) * GDN_D, slot_elems = size_t(Hv) * head_elems;
    const int p = gdn_first_position(states);

    float4 S[REC_ROWS];
    load_slice(S, states.recurrent + gdn_recurrent_offset(states, p, slot_elems) + j * head_elems, rg, m0);
    const float a_log = A_log[j], dtb = dt_bias[j];
    for (int t = 0; t < T; ++t) {
        const bf16* row = qkv + size_t(t) * width;
        const float qv = __bfloat162float(row[hk * GDN_D + tid]);
        const float kv = __bfloat162float(row[Hk * GDN_D + hk * GDN_D + tid]);
        const float4 v = load_bf16x4(row + 2 * Hk * GDN_D + j * GDN_D + m0);
        const RecordOut rec = rows ? record_out(states.records, t, Hk, Hv, j, blockIdx.x, rg, m0) : RecordOut{};
        const float4 out = rec_token(S, qv, kv, v, __bfloat162float(a[size_t(t) * Hv + j]),
                                     __bfloat162float(b[size_t(t) * Hv + j]), a_log, dtb, rec);
        if (rg == 0) store_bf16x4(o + (size_t(t) * Hv + j) * GDN_D + m0, out);
        if (!states.records && (rows || t == T - 1))  // with records: the window's first state stays
            store_slice(S, states.recurrent + gdn_recurrent_offset(states, p + 1 + t, slot_elems) + j * head_elems, rg,
                        m0);
    }
}

// A Gated DeltaNet layer's few-token step (decode: T = 1; a verify window: T <= 8) in one launch,
// grid (8, Hv) as above, the 8 blocks of V head j one thread block cluster (sm_90+); both states
// come from and go to GdnStates' ring of slots (ops.h):
// 1. before the wait, the constants: conv weights of the block's channels (thread tid: q and k
//    channel tid of K head hk; threads 0..15 also the block's 16 v channels), A_log, dt_bias, and
//    in rank 0's first warp the norm weight; and the states, which only this kernel writes in a
//    forward pass (the rule in common.cuh): the ring position, the state slice and the conv states
//    of those channels.
// 2. after the wait, every token's inputs at once (their loads in flight together, each value kept in
//    the shared memory of the thread that uses it; a and b by threads t < T); then per token t:
//    conv + SiLU of row t (the channels' last K-1 inputs kept in registers), the
//    delta rule step of gdn_recurrent_kernel (rec_token), each block's bf16 o slice into rank 0's
//    shared memory (two buffers, so one cluster barrier per token), and there rank 0's first warp
//    runs the gated RMSNorm of head j with z -> y row t. The states after token t go to their slot
//    with rows, and after the last token always: the recurrent slice and the v channels' conv state
//    by each block, the q/k channels' conv state (the same in every block of the K group) by the
//    group's first block; with records, no recurrent slice (the window's first state stays where it
//    is, for gdn_replay), and each token's record (record_out).
// 3. only when the last token's slot is the slot read (one slot, or T a multiple of the slots) is
//    the q/k conv state written where the other blocks of the K group may still read it: then each
//    block takes a ticket on counters[hk] after reading it, and the last one writes it.
// Numbers identical to causal_conv1d_silu -> gated_delta_rule_recurrent -> gated_rmsnorm, rows
// included.
constexpr int FUSED_CLUSTER = GDN_D / REC_COLS;
constexpr int FUSED_MAX_T = GEMV_MAX_T;  // the most tokens of one launch: the few-token forward's bound

template <int K>
__device__ __forceinline__ void load_conv_w(const bf16* __restrict__ conv_w, int c, float (&w)[K]) {
#pragma unroll
    for (int q = 0; q < K; ++q) w[q] = __bfloat162float(conv_w[size_t(c) * K + q]);
}

// A channel's last K-1 conv inputs, oldest first: read through L2 (the fused step reads them
// before its PDL wait), shifted by one input, written as a [C, K-1] state row.
template <int K>
__device__ __forceinline__ void load_hist(const bf16* conv_state, int c, float (&hist)[K - 1]) {
#pragma unroll
    for (int q = 0; q < K - 1; ++q) hist[q] = __bfloat162float(__ldcg(conv_state + size_t(c) * (K - 1) + q));
}
template <int K>
__device__ __forceinline__ void shift_in(float (&hist)[K - 1], float xc) {
#pragma unroll
    for (int q = 0; q < K - 2; ++q) hist[q] = hist[q + 1];
    hist[K - 2] = xc;
}
template <int K>
__device__ __forceinline__ void store_hist(bf16* conv_state, int c, const float (&hist)[K - 1]) {
#pragma unroll
    for (int q = 0; q < K - 1; ++q) conv_state[size_t(c) * (K - 1) + q] = __float2bfloat16_rn(hist[q]);
}

// ROWS: a verify window's form (the states after every token, or the tokens' records); the decode
// step's instance (ROWS false) holds none of that code.
template <int K, bool ROWS>
__global__ void __launch_bounds__(REC_THREADS)
gdn_decode_fused_kernel(const bf16* __restrict__ x, const bf16* __restrict__ conv_w,
                        const bf16* __restrict__ a, const bf16* __restrict__ b,
                        const float* __restrict__ A_log, const float* __restrict__ dt_bias, GdnStates states,
                        const bf16* __restrict__ z, const bf16* __restrict__ norm_w, bf16* __restrict__ y,
                        unsigned* counters, int T, int Hk, int Hv, float eps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float v_s[REC_COLS];
    __shared__ __align__(8) bf16 o_row[2][GDN_D];  // rank 0: head j's o of token t in buffer t % 2
    __shared__ bool last;
    __shared__ float xq_s[FUSED_MAX_T][REC_THREADS], xk_s[FUSED_MAX_T][REC_THREADS], xv_s[FUSED_MAX_T][REC_COLS];
    __shared__ float ab_s[FUSED_MAX_T][2];
    __shared__ float4 z_s[FUSED_MAX_T][32];
    // This block runs: its cluster peers may store into its shared memory once every block has
    // arrived (the wait before the first store below). Relaxed: the loads before the PDL wait stay
    // in flight.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    const int tid = threadIdx.x;
    const int cg = tid & 3, rg = tid >> 2;
    const int j = blockIdx.y, hk = j / (Hv / Hk);
    const int m0 = blockIdx.x * REC_COLS + cg * 4;
    const bool norm_lane = blockIdx.x == 0 && tid < 32;  // rank 0's first warp: channels 4 tid .. 4 tid + 3
    const size_t head_elems = size_t(GDN_D) * GDN_D, rec_slot = size_t(Hv) * head_elems;
    const int C = gdn_qkv_width(Hk, Hv);
    const size_t conv_slot = size_t(C) * (K - 1);
    const int cq = hk * GDN_D + tid, ck = (Hk + hk) * GDN_D + tid;
    const int cv = 2 * Hk * GDN_D + j * GDN_D + blockIdx.x * REC_COLS + tid;  // tid < REC_COLS
    const bool group_first = blockIdx.x == 0 && j % (Hv / Hk) == 0;  // the K group's first block
    const bool in_place = T % states.slots == 0;                     // the last token's slot is the one read

    // 1. constants and states.
    float wq[K], wk[K], wv[K];
    load_conv_w<K>(conv_w, cq, wq);
    load_conv_w<K>(conv_w, ck, wk);
    if (tid < REC_COLS) load_conv_w<K>(conv_w, cv, wv);
    const float a_log = A_log[j], dtb = dt_bias[j];
    const float4 nw = norm_lane ? load_bf16x4(norm_w + tid * 4) : float4{};
    const int p = gdn_first_position(states);
    float4 S[REC_ROWS];
    load_slice(S, states.recurrent + gdn_recurrent_offset(states, p, rec_slot) + j * head_elems, rg, m0);
    const bf16* conv_in = states.conv + gdn_slot_offset(states, p, conv_slot);
    float hq[K - 1], hkk[K - 1], hv[K - 1];
    load_hist<K>(conv_in, cq, hq);
    load_hist<K>(conv_in, ck, hkk);
    if (tid < REC_COLS) load_hist<K>(conv_in, cv, hv);
    pdl_begin();

    // 2. the tokens' inputs, then the tokens.
#pragma unroll
    for (int t = 0; t < FUSED_MAX_T; ++t) {
        if (t >= T) break;
        const bf16* xt = x + size_t(t) * C;
        xq_s[t][tid] = __bfloat162float(xt[cq]);
        xk_s[t][tid] = __bfloat162float(xt[ck]);
        if (tid < REC_COLS) xv_s[t][tid] = __bfloat162float(xt[cv]);
        if (norm_lane) z_s[t][tid] = load_bf16x4(z + (size_t(t) * Hv + j) * GDN_D + tid * 4);
        if (tid == t) {
            ab_s[t][0] = __bfloat162float(a[size_t(t) * Hv + j]);
            ab_s[t][1] = __bfloat162float(b[size_t(t) * Hv + j]);
        }
    }
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    unsigned ticket = 0;
    for (int t = 0; t < T; ++t) {
        const bool keep = ROWS || t == T - 1;  // the states after token t go to slot p + 1 + t
        bf16* conv_out = states.conv + gdn_slot_offset(states, p + 1 + t, conv_slot);
        const float xq = xq_s[t][tid], xk = xk_s[t][tid];
        const float4 zv = norm_lane ? z_s[t][tid] : float4{};
        // conv + SiLU (conv_out is bf16 in the three-launch path)
        const float qv = round_to_bf16(conv_silu_step<K>(wq, hq, xq));
        const float kv = round_to_bf16(conv_silu_step<K>(wk, hkk, xk));
        shift_in<K>(hq, xq);
        shift_in<K>(hkk, xk);
        if (keep && group_first && !in_place) {
            store_hist<K>(conv_out, cq, hq);
            store_hist<K>(conv_out, ck, hkk);
        }
        if (tid < REC_COLS) {
            const float xv = xv_s[t][tid];
            v_s[tid] = round_to_bf16(conv_silu_step<K>(wv, hv, xv));
            shift_in<K>(hv, xv);
            if (keep) store_hist<K>(conv_out, cv, hv);  // read by this block only
        }
        __syncthreads();  // v_s is complete (and, at t = 0, every q/k conv state read of this block is done)
        if (in_place && t == 0 && tid == 0) {
            __threadfence();
            ticket = atomicAdd(counters + hk, 1u);
        }
        const float4 v = make_float4(v_s[cg * 4], v_s[cg * 4 + 1], v_s[cg * 4 + 2], v_s[cg * 4 + 3]);
        const RecordOut rec = ROWS ? record_out(states.records, t, Hk, Hv, j, blockIdx.x, rg, m0) : RecordOut{};
        const float4 out = rec_token(S, qv, kv, v, ab_s[t][0], ab_s[t][1], a_log, dtb, rec);  // its barriers order v_s's reuse
        if (!(ROWS && states.records) && (ROWS || t == T - 1))  // with records: the first state stays
            store_slice(S, states.recurrent + gdn_recurrent_offset(states, p + 1 + t, rec_slot) + j * head_elems, rg,
                        m0);
        if (t == 0) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // rank 0 runs
        if (rg == 0) store_bf16x4(cluster.map_shared_rank(o_row[t & 1], 0) + m0, out);
        cluster.sync();
        if (norm_lane) {
            const float4 o4 = load_bf16x4(o_row[t & 1] + tid * 4);
            const float r = gated_rms_scale(sumsq4(o4), GDN_D, eps);
            store_bf16x4(y + (size_t(t) * Hv + j) * GDN_D + tid * 4, gated_norm4(o4, r, zv, nw));
        }
    }

    // 3. the q/k conv state in place: by the K group's last block.
    if (in_place) {
        if (tid == 0) last = ticket == gridDim.x * (Hv / Hk) - 1;
        __syncthreads();
        if (last) {
            bf16* conv_out = states.conv + gdn_slot_offset(states, p, conv_slot);
            store_hist<K>(conv_out, cq, hq);
            store_hist<K>(conv_out, ck, hkk);
            if (tid == 0) counters[hk] = 0;
        }
    }
#else
    __trap();  // gdn_decode_fused launches it on sm_90+ only
#endif
}

// gdn_replay (ops.h): a streaming pass over every layer's recurrent state. S = decay S + k u^T acts
// on each element alone, so the replay needs no slice of a head per thread: grid (128 /
// REPLAY_ROWS, Hv, layers), block REPLAY_THREADS; warp w takes rows i0 + w + 8 n (n < 4) of head j,
// lane l the 4 columns 4 l .. 4 l + 3, so a warp reads and writes whole 512-byte state rows. The
// state loads go out first, then the block copies the keep records' parts it needs (k of its rows,
// u of head j, the decay) into shared memory, and each thread applies them in token order with the
// token loop's rank_one_step (the same products and sums: the window's values, bit for bit). In the
// token loop's slice layout (64-byte pieces of rows, a record read from L2 per token between the
// state's load and its store) the 27B's replay, 151 MB read and written, ran at 1.3 TB/s on an H100.
constexpr int REPLAY_ROWS = 32;                                // state rows per block
constexpr int REPLAY_THREADS = 32 * REPLAY_ROWS / REC_ROWS;  // 8 warps, REC_ROWS rows each
static_assert(REPLAY_THREADS / 32 * REC_ROWS == REPLAY_ROWS && GDN_D == 32 * 4, "a lane's 4 columns of a row");

__global__ void __launch_bounds__(REPLAY_THREADS) gdn_replay_kernel(const GdnReplay r) {
    __shared__ float k_s[GEMV_MAX_T][REPLAY_ROWS], u_s[GEMV_MAX_T][GDN_D], decay_s[GEMV_MAX_T];
    pdl_begin();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int i0 = blockIdx.x * REPLAY_ROWS, j = blockIdx.y, hk = j / (r.Hv / r.Hk);
    const size_t head_elems = size_t(GDN_D) * GDN_D, slot_elems = size_t(r.Hv) * head_elems;
    float* layer = reinterpret_cast<float*>(reinterpret_cast<char*>(r.recurrent) + blockIdx.z * r.layer_pitch);
    const float* records =
        reinterpret_cast<const float*>(reinterpret_cast<const char*>(r.records) + blockIdx.z * r.records_pitch);
    const float* from = layer + size_t(r.pos % r.slots) * slot_elems + j * head_elems;
    float4 S[REC_ROWS];
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n)
        S[n] = __ldcg(reinterpret_cast<const float4*>(from + size_t(i0 + warp + 8 * n) * GDN_D) + lane);
    constexpr int PER_TOKEN = REPLAY_ROWS + GDN_D + 1;  // a token's k rows, u and decay
    for (int e = tid; e < r.keep * PER_TOKEN; e += REPLAY_THREADS) {
        const int t = e / PER_TOKEN, c = e % PER_TOKEN;
        const float* at = records + size_t(t) * gdn_record_floats(r.Hk, r.Hv);
        if (c < GDN_D) u_s[t][c] = at[(r.Hk + j) * GDN_D + c];
        else if (c < GDN_D + REPLAY_ROWS) k_s[t][c - GDN_D] = at[hk * GDN_D + i0 + c - GDN_D];
        else decay_s[t] = at[(r.Hk + r.Hv) * GDN_D + j];
    }
    __syncthreads();
    for (int t = 0; t < r.keep; ++t) {
        const float4 u = reinterpret_cast<const float4*>(u_s[t])[lane];
        rank_one_step(S, [&](int n) { return k_s[t][warp + 8 * n]; }, decay_s[t], u);
    }
    float* to = layer + size_t((r.pos + r.keep) % r.slots) * slot_elems + j * head_elems;
#pragma unroll
    for (int n = 0; n < REC_ROWS; ++n)
        reinterpret_cast<float4*>(to + size_t(i0 + warp + 8 * n) * GDN_D)[lane] = S[n];
}

}  // namespace

void gdn_replay(const GdnReplay& r, cudaStream_t stream) {
    const char* op = "gdn_replay";
    if (r.keep < 1 || r.keep > GEMV_MAX_T)
        throw std::invalid_argument(std::string(op) + ": keep must be 1.." + std::to_string(GEMV_MAX_T) + ", got " +
                                    std::to_string(r.keep));
    if (r.slots < 1) throw std::invalid_argument(std::string(op) + ": needs slots >= 1");
    gdn_check_dims(op, 1, r.Hk, r.Hv, GDN_D, GDN_D);
    if (!r.recurrent || !r.records || r.layers < 1 || r.pos < 0)
        throw std::invalid_argument(std::string(op) + ": needs the states, the records, layers >= 1 and pos >= 0");
    launch_pdl("gdn_replay_kernel", gdn_replay_kernel, dim3(GDN_D / REPLAY_ROWS, r.Hv, r.layers), REPLAY_THREADS, 0,
               stream, r);
}

void gated_delta_rule_recurrent(const bf16* qkv, const bf16* a, const bf16* b, const float* A_log,
                                const float* dt_bias, const GdnStates& states, bf16* o, bool rows,
                                int T, int Hk, int Hv, int dk, int dv, cudaStream_t stream) {
    gdn_check_dims("gated_delta_rule_recurrent", T, Hk, Hv, dk, dv);
    gdn_check_states("gated_delta_rule_recurrent", states, T, rows);
    launch_pdl("gdn_recurrent_kernel", gdn_recurrent_kernel, dim3(GDN_D / REC_COLS, Hv), REC_THREADS, 0,
               stream, qkv, a, b, A_log, dt_bias, states, o, rows, T, Hk, Hv);
}

bool gdn_decode_fused_available() { return sm90_or_newer(); }

void gdn_decode_fused(const bf16* qkv, const bf16* conv_w, const bf16* a, const bf16* b, const float* A_log,
                      const float* dt_bias, const GdnStates& states, const bf16* z, const bf16* norm_w, bf16* y,
                      unsigned* counters, bool rows, int T, int Hk, int Hv, int dk, int dv, int K, float eps,
                      cudaStream_t stream) {
    const char* op = "gdn_decode_fused";
    gdn_check_dims(op, T, Hk, Hv, dk, dv);
    gdn_check_states(op, states, T, rows);
    if (!counters) throw std::invalid_argument(std::string(op) + ": needs Hk zeroed counters");
    if (T > FUSED_MAX_T)
        throw std::invalid_argument(std::string(op) + ": at most " + std::to_string(FUSED_MAX_T) + " tokens, got " +
                                    std::to_string(T));
    if (!gdn_decode_fused_available())
        throw std::invalid_argument(std::string(op) + ": needs thread block clusters (sm_90 or newer)");
    const dim3 grid(FUSED_CLUSTER, Hv);
    auto launch = [&](auto window, auto step) {
        launch_pdl_clusters(op, FUSED_CLUSTER, rows ? window : step, grid, REC_THREADS, 0, stream, qkv, conv_w, a, b,
                            A_log, dt_bias, states, z, norm_w, y, counters, T, Hk, Hv, eps);
    };
    switch (K) {
        case 2: launch(gdn_decode_fused_kernel<2, true>, gdn_decode_fused_kernel<2, false>); break;
        case 3: launch(gdn_decode_fused_kernel<3, true>, gdn_decode_fused_kernel<3, false>); break;
        case 4: launch(gdn_decode_fused_kernel<4, true>, gdn_decode_fused_kernel<4, false>); break;
        default:
            throw std::invalid_argument(std::string(op) + ": conv kernel size K must be 2, 3 or 4, got " +
                                        std::to_string(K));
    }
}

}  // namespace lampo
