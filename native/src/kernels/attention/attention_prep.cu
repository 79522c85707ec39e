// attention_prep.cu - gated-attention input prep: q/gate split, per-head zero-centred RMSNorm of
// q and k, partial NeoX RoPE, and (with a KvAppendTarget) the INT8 KV cache append of the new k and
// v rows. Contract in ops.h (attn_prep). Token t sits at position d_pos[0] + t.
//
// One warp per (token, head); lane l holds dims [8l, 8l+8) of the head in registers (D % 8 == 0,
// D <= 256). Heads 0..nq-1 are query heads (their gate half is copied through), nq..nq+nkv-1 key
// heads, and with the append nq+nkv..nq+2nkv-1 value heads (quantized as they are). RoPE pairs dim
// i with i + rotary_dim/2, which lives in lane l +- rotary_dim/16 (rotary_dim % 16 == 0): the
// partner's 8 values arrive by shuffles. inv_freq is computed on the host in double and rounded to
// fp32 (as the reference), the angle pos * inv_freq is one fp32 multiply, and cos/sin of that angle
// are evaluated in double (fast-math sinf would be wrong for angles up to ~2.6e5). The norm weights,
// the position and the cos / sin are read and computed before the PDL wait (the position is fixed
// for the forward pass: common.cuh), the gate half together with q. A key row is
// quantized from its bf16-rounded values (kv_quant.cuh), exactly what a later append of k_out would
// store; rows at positions >= context_max are not appended (the engine keeps the context inside the
// cache and checks it on the host before every step).
#include "kernels/bf16_vec.cuh"
#include "kernels/attention/kv_quant.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/ops.h"

#include <cmath>

namespace lampo {
namespace {

constexpr int PREP_WARPS = 8;
constexpr int MAX_ROPE_HALF = 128;

struct RopeFreqs {
    float inv_freq[MAX_ROPE_HALF];
};

__global__ void __launch_bounds__(PREP_WARPS * 32)
attn_prep_kernel(const bf16* __restrict__ qg, const bf16* __restrict__ k_raw, const bf16* __restrict__ q_norm_w,
                 const bf16* __restrict__ k_norm_w, const int32_t* __restrict__ d_pos, bf16* __restrict__ q_out,
                 bf16* __restrict__ gate_out, bf16* __restrict__ k_out, int nq, int nkv, int D, int rotary_dim,
                 float eps, const RopeFreqs freqs, const KvAppendTarget append) {
    const int t = blockIdx.x;
    const int head = blockIdx.y * PREP_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int heads = append.v ? nq + 2 * nkv : nq + nkv;
    const bool active = lane < D / 8;
    const bool is_q = head < nq;
    float g[8] = {};  // the norm weight (immutable: read before the wait)
    if (active && head < nq + nkv) bf16x8_to_float(reinterpret_cast<const uint4*>(is_q ? q_norm_w : k_norm_w)[lane], g);
    // The position is fixed for the forward pass (common.cuh), so RoPE's cos / sin of this lane's
    // dims are ready before the wait too.
    const int pos = __ldcg(d_pos) + t;
    const int half_dims = rotary_dim / 2;
    const int half_lanes = half_dims / 8;
    const bool first_half = lane < half_lanes;
    const bool rotates = lane < 2 * half_lanes && head < nq + nkv;
    float cf[8], sf[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        double sd = 0.0, cd = 1.0;
        if (rotates) sincos(double(__fmul_rn(float(pos), freqs.inv_freq[(first_half ? lane : lane - half_lanes) * 8 + i])), &sd, &cd);
        cf[i] = float(cd);
        sf[i] = float(sd);
    }
    pdl_begin();
    if (head >= heads) return;
    float x[8] = {};
    if (head >= nq + nkv) {  // a value row: straight into the cache
        const int h = head - nq - nkv;
        if (active) bf16x8_to_float(reinterpret_cast<const uint4*>(append.v + (size_t(t) * nkv + h) * D)[lane], x);
        if (pos >= 0 && pos < append.context_max) {
            const size_t row = size_t(h) * append.context_max + pos;
            kv_quantize_row(x, lane, D, append.v_cache + row * D, append.v_scale + row * (D / KV_GROUP));
        }
        return;
    }
    const bf16* src = is_q ? qg + (size_t(t) * nq + head) * 2 * D : k_raw + (size_t(t) * nkv + (head - nq)) * D;

    if (active) bf16x8_to_float(reinterpret_cast<const uint4*>(src)[lane], x);
    const uint4 gate = is_q && active ? reinterpret_cast<const uint4*>(src + D)[lane] : uint4{};  // copied through
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += x[i] * x[i];
    const float inv = rsqrtf(warp_sum(ss) / float(D) + eps);
    if (active) {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = x[i] * inv * (1.0f + g[i]);
    }

    const int partner = first_half ? lane + half_lanes : lane - half_lanes;
    float other[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) other[i] = __shfl_sync(0xffffffffu, x[i], partner & 31);
    if (rotates) {
#pragma unroll
        for (int i = 0; i < 8; ++i)  // first half: a cos - b sin ; second half: b cos + a sin
            x[i] = first_half ? x[i] * cf[i] - other[i] * sf[i] : x[i] * cf[i] + other[i] * sf[i];
    }
    const uint4 rounded = float_to_bf16x8(x);
    if (is_q) {
        if (!active) return;
        reinterpret_cast<uint4*>(q_out + (size_t(t) * nq + head) * D)[lane] = rounded;
        reinterpret_cast<uint4*>(gate_out + (size_t(t) * nq + head) * D)[lane] = gate;
        return;
    }
    const int h = head - nq;
    if (k_out && active) reinterpret_cast<uint4*>(k_out + (size_t(t) * nkv + h) * D)[lane] = rounded;
    if (append.v && pos >= 0 && pos < append.context_max) {
        if (active) bf16x8_to_float(rounded, x);
        const size_t row = size_t(h) * append.context_max + pos;
        kv_quantize_row(x, lane, D, append.k_cache + row * D, append.k_scale + row * (D / KV_GROUP));
    }
}

}  // namespace

void attn_prep(const bf16* qg, const bf16* k_raw, const bf16* q_norm_w, const bf16* k_norm_w,
               const int32_t* d_pos, bf16* q_out, bf16* gate_out, bf16* k_out, int T, int nq, int nkv, int D,
               int rotary_dim, float theta, float eps, cudaStream_t stream, const KvAppendTarget* append) {
    const char* op = "attn_prep";
    require(D > 0 && D % 8 == 0 && D <= 256, op, "head dim must be a multiple of 8 up to 256, got " + std::to_string(D));
    require(rotary_dim >= 0 && rotary_dim % 16 == 0 && rotary_dim <= D, op,
            "rotary_dim must be a multiple of 16 no larger than the head dim, got " + std::to_string(rotary_dim));
    require(nq >= 0 && nkv > 0, op, "need at least one key head (and no negative count of query heads)");
    require(nq > 0 || append, op, "key rows alone (no query heads) go to the cache: needs a KV append target");
    const KvAppendTarget target = append ? *append : KvAppendTarget{};
    require(k_out || target.v, op, "needs k_out, a KV append target or both");
    if (append) {
        require(D % KV_GROUP == 0, op, "the INT8 cache needs a head dim that is a multiple of 64, got " + std::to_string(D));
        require(target.v && target.k_cache && target.v_cache && target.k_scale && target.v_scale && target.context_max > 0, op,
                "the KV append target needs v, both caches, both scales and context_max > 0");
    }
    if (T <= 0) return;
    RopeFreqs freqs{};
    for (int i = 0; i < rotary_dim / 2; ++i)
        freqs.inv_freq[i] = float(1.0 / std::pow(double(theta), double(2 * i) / double(rotary_dim)));
    const dim3 grid(T, ceil_div(nq + (append ? 2 : 1) * nkv, PREP_WARPS));
    launch_pdl("attn_prep_kernel", attn_prep_kernel, grid, PREP_WARPS * 32, 0, stream, qg, k_raw, q_norm_w, k_norm_w,
               d_pos, q_out, gate_out, k_out, nq, nkv, D, rotary_dim, eps, freqs, target);
}

}  // namespace lampo
