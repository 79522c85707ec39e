// gdn_common.cuh - constants, argument checks and the gate formula shared by the Gated DeltaNet
// kernels (include from .cu files only).
#pragma once

#include <stdexcept>
#include <string>

#include "common.cuh"
#include "gdn_moe_vec.cuh"

namespace lampo {

constexpr int GDN_D = 128;          // dk = dv = 128 in every Qwen3.5/3.6 checkpoint
constexpr float GDN_L2_EPS = 1e-6f;  // l2norm(x) = x * rsqrt(sum(x^2) + eps)

// Width of one row of the post-conv qkv activation: q (Hk*dk) | k (Hk*dk) | v (Hv*dv).
__host__ __device__ inline int gdn_qkv_width(int Hk, int Hv) { return 2 * Hk * GDN_D + Hv * GDN_D; }

inline void gdn_check_dims(const char* op, int T, int Hk, int Hv, int dk, int dv) {
    if (dk != GDN_D || dv != GDN_D)
        throw std::invalid_argument(std::string(op) + ": dk and dv must be 128, got dk=" +
                                    std::to_string(dk) + " dv=" + std::to_string(dv));
    if (T < 1) throw std::invalid_argument(std::string(op) + ": T must be >= 1, got " + std::to_string(T));
    if (Hk < 1 || Hv < Hk || Hv % Hk != 0)
        throw std::invalid_argument(std::string(op) + ": Hv must be a positive multiple of Hk, got Hk=" +
                                    std::to_string(Hk) + " Hv=" + std::to_string(Hv));
}

// Per token and V head: g = -exp(A_log) * softplus(a + dt_bias) (<= 0), beta = sigmoid(b).
__device__ __forceinline__ void gdn_gates(float a, float b, float A_log, float dt_bias, float& g,
                                          float& beta) {
    g = -expf(A_log) * softplus(a + dt_bias);
    beta = sigmoid(b);
}

// One step of the causal conv + SiLU of one channel: silu(w[K-1] x + sum_j w[j] hist[j]), hist the
// K-1 previous inputs (oldest first). The summation order of conv1d_silu_kernel (bit-identical).
template <int K>
__device__ __forceinline__ float conv_silu_step(const float (&w)[K], const float (&hist)[K - 1], float x) {
    float acc = w[K - 1] * x;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) acc = fmaf(w[j], hist[j], acc);
    return silu(acc);
}

// Gated RMSNorm of one dv-row by one warp: y = bf16(w * bf16(o * rsqrt(mean(o^2) + eps)) * silu(z)).
// L2_ONLY reads o with ld.global.cg (o written by other blocks of the running kernel).
template <bool L2_ONLY>
__device__ __forceinline__ void gated_rmsnorm_row(const __nv_bfloat16* o, const __nv_bfloat16* __restrict__ z,
                                                  const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y, int dv,
                                                  float eps) {
    const int lane = threadIdx.x % 32;
    auto load_o = [&](int c) {
        if (!L2_ONLY) return load_bf16x4(o + c);
        const uint2 raw = __ldcg(reinterpret_cast<const uint2*>(o + c));
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
        const float2 lo = __bfloat1622float2(h2[0]), hi = __bfloat1622float2(h2[1]);
        return make_float4(lo.x, lo.y, hi.x, hi.y);
    };
    float ss = 0.f;
    for (int c = lane * 4; c < dv; c += 128) {
        const float4 v = load_o(c);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float r = rsqrtf(warp_sum(ss) / float(dv) + eps);
    for (int c = lane * 4; c < dv; c += 128) {
        const float4 v = load_o(c);
        const float4 g = load_bf16x4(z + c);
        const float4 wv = load_bf16x4(w + c);
        float4 out;
        out.x = wv.x * round_to_bf16(v.x * r) * silu(g.x);
        out.y = wv.y * round_to_bf16(v.y * r) * silu(g.y);
        out.z = wv.z * round_to_bf16(v.z * r) * silu(g.z);
        out.w = wv.w * round_to_bf16(v.w * r) * silu(g.w);
        store_bf16x4(y + c, out);
    }
}

}  // namespace lampo
