// gdn_common.cuh - constants, argument checks and the gate formula shared by the Gated DeltaNet
// kernels (include from .cu files only).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/ops.h"

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

// The recurrent state's ring size (GdnStates::recurrent_slots: 0 means the conv state's `slots`).
__host__ __device__ __forceinline__ int gdn_recurrent_slots(const GdnStates& s) {
    return s.recurrent_slots ? s.recurrent_slots : s.slots;
}

inline void gdn_check_states(const char* op, const GdnStates& s, int T, bool rows) {
    const int rec_slots = gdn_recurrent_slots(s);
    if (s.slots < 1 || rec_slots < 1 || (std::max(s.slots, rec_slots) > 1 && !s.pos))
        throw std::invalid_argument(std::string(op) + ": a state ring needs slots >= 1 and, with more than one, "
                                    "the device position; got slots=" + std::to_string(s.slots) +
                                    ", recurrent_slots=" + std::to_string(rec_slots));
    if (rows && (T >= s.slots || (!s.records && T >= rec_slots)))
        throw std::invalid_argument(std::string(op) + ": the states after each of " + std::to_string(T) +
                                    " tokens need more than " + std::to_string(T) + " slots, got " +
                                    std::to_string(s.slots) + (s.records ? " (conv)" : "") +
                                    (s.records || rec_slots == s.slots ? "" : ", recurrent " + std::to_string(rec_slots)));
}

// The call's first position in the ring (ops.h, GdnStates): 0 when there is one slot, else read
// through L2 (the fused step reads it before its PDL wait; d_pos is written between passes only).
__device__ __forceinline__ int gdn_first_position(const GdnStates& s) {
    return s.slots == 1 && gdn_recurrent_slots(s) == 1 ? 0 : __ldcg(s.pos);
}
// The conv state's slot before the token at position p, as an element offset of `slot_elems`.
__device__ __forceinline__ size_t gdn_slot_offset(const GdnStates& s, int p, size_t slot_elems) {
    return size_t(p % s.slots) * slot_elems;
}
// The recurrent state's.
__device__ __forceinline__ size_t gdn_recurrent_offset(const GdnStates& s, int p, size_t slot_elems) {
    return size_t(p % gdn_recurrent_slots(s)) * slot_elems;
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

// The gated RMSNorm's arithmetic, shared by gated_rmsnorm.cu and the fused decode step so that
// both give the same bits: a lane's sum of squares over 4 channels, the row scale from the warp's
// sums, and y for 4 channels: y = bf16(w * bf16(o * r) * silu(z)), r = rsqrt(mean(o^2) + eps).
__device__ __forceinline__ float sumsq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }

__device__ __forceinline__ float gated_rms_scale(float lane_ss, int dv, float eps) {
    return rsqrtf(warp_sum(lane_ss) / float(dv) + eps);
}

__device__ __forceinline__ float4 gated_norm4(float4 v, float r, float4 g, float4 wv) {
    return make_float4(wv.x * round_to_bf16(v.x * r) * silu(g.x), wv.y * round_to_bf16(v.y * r) * silu(g.y),
                       wv.z * round_to_bf16(v.z * r) * silu(g.z), wv.w * round_to_bf16(v.w * r) * silu(g.w));
}

// Gated RMSNorm of one dv-row by one warp (each lane owns groups of 4 channels).
__device__ __forceinline__ void gated_rmsnorm_row(const __nv_bfloat16* __restrict__ o, const __nv_bfloat16* __restrict__ z,
                                                  const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ y, int dv,
                                                  float eps) {
    const int lane = threadIdx.x % 32;
    float ss = 0.f;
    for (int c = lane * 4; c < dv; c += 128) ss += sumsq4(load_bf16x4(o + c));
    const float r = gated_rms_scale(ss, dv, eps);
    for (int c = lane * 4; c < dv; c += 128)
        store_bf16x4(y + c, gated_norm4(load_bf16x4(o + c), r, load_bf16x4(z + c), load_bf16x4(w + c)));
}

}  // namespace lampo
