// moe_common.h - limits and argument checks shared by the MoE kernels (each check throws
// std::invalid_argument naming the op and the offending value).
#pragma once

#include <stdexcept>
#include <string>

namespace lampo {

constexpr int MOE_MAX_EXPERTS = 512;  // router top-k keeps E / 32 logits per lane
constexpr int MOE_MAX_K = 16;         // experts per token

inline void moe_check_tokens(const char* op, int T, int k, int H) {
    const std::string o(op);
    if (T < 1) throw std::invalid_argument(o + ": T must be >= 1, got " + std::to_string(T));
    if (k < 1 || k > MOE_MAX_K)
        throw std::invalid_argument(o + ": k must be in [1, 16], got " + std::to_string(k));
    if (H < 64 || H % 64 != 0)
        throw std::invalid_argument(o + ": H must be a positive multiple of 64, got " + std::to_string(H));
}

inline void moe_check_experts(const char* op, int E, int k) {
    if (E < 1 || E > MOE_MAX_EXPERTS || k > E)
        throw std::invalid_argument(std::string(op) + ": E must be in [k, 512], got E=" +
                                    std::to_string(E) + " k=" + std::to_string(k));
}

inline void moe_check_intermediate(const char* op, int I) {
    if (I < 64 || I % 64 != 0)
        throw std::invalid_argument(std::string(op) + ": I must be a positive multiple of 64, got " +
                                    std::to_string(I));
}

}  // namespace lampo
