// gdn_common.cuh - constants, argument checks and the gate formula shared by the Gated DeltaNet
// kernels (include from .cu files only).
#pragma once

#include <stdexcept>
#include <string>

#include "common.cuh"

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

}  // namespace lampo
