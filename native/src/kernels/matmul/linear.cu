// linear.cu - the weight-format seam's dispatch (contract in linear.h): BF16 weights go to the
// GEMV kernel for T <= GEMV_MAX_T and to the tensor-core GEMM above; T == 0 is a no-op. The
// decode step's folded forms (one token) are GEMVs.
#include "kernels/launch_utils.cuh"
#include "kernels/linear.h"
#include "kernels/matmul.cuh"

namespace lampo {
namespace {

const bf16* bf16_weights(const Linear& W) {
    require(W.format == WeightFormat::BF16, "linear_forward",
            "unsupported weight format " + std::to_string(int32_t(W.format)));
    require(W.data != nullptr && W.out > 0 && W.in > 0, "linear_forward", "empty weight");
    return static_cast<const bf16*>(W.data);
}

template <class OutT>
void linear_dispatch(const Linear& W, const bf16* x, OutT* y, int T, cudaStream_t stream) {
    const bf16* w = bf16_weights(W);
    if (T <= 0) return;
    if (T <= GEMV_MAX_T) gemv_bf16(w, x, y, T, W.out, W.in, stream);
    else gemm_bf16(w, x, y, T, W.out, W.in, stream);
}

}  // namespace

void linear_forward(const Linear& W, const bf16* x, bf16* y, int T, cudaStream_t stream) {
    linear_dispatch(W, x, y, T, stream);
}

void linear_forward_f32(const Linear& W, const bf16* x, float* y, int T, cudaStream_t stream) {
    linear_dispatch(W, x, y, T, stream);
}

void linear_forward_normed(const Linear& W, const ResidualNorm& x, bf16* y, cudaStream_t stream) {
    gemv_bf16_normed(bf16_weights(W), x, y, W.out, W.in, stream);
}

void linear_forward_normed_f32(const Linear& W, const ResidualNorm& x, float* y, cudaStream_t stream) {
    gemv_bf16_normed(bf16_weights(W), x, y, W.out, W.in, stream);
}

void linear_forward_add_residual(const Linear& W, const bf16* x, float* residual, cudaStream_t stream) {
    gemv_bf16_add_residual(bf16_weights(W), x, residual, W.out, W.in, stream);
}

}  // namespace lampo
