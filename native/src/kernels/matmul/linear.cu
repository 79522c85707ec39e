// linear.cu - the weight-format seam's dispatch (contract in linear.h): T <= GEMV_MAX_T goes to
// the GEMV kernel of the weights' format, larger T to its tensor-core GEMM; T == 0 is a no-op. The
// decode step's folded forms (one token) are the GEMVs' normed / add-residual forms; the row parts
// of a verify window's fused projections are the GEMVs' parts forms; the prenormed forms (a norm
// carried between two blocks in halves) exist for LQ weights only.
#include "kernels/launch_utils.cuh"
#include "kernels/linear.h"
#include "kernels/matmul.cuh"

namespace lampo {

size_t Linear::bytes() const {
    if (format == WeightFormat::LQ) return lq_packed_bytes(out, in, bits);
    return size_t(out) * size_t(in) * 2;
}

Linear Linear::rows(int first, int n) const {
    require(first >= 0 && n > 0 && first + n <= out, "Linear::rows",
            "rows [" + std::to_string(first) + ", " + std::to_string(first + n) + ") of " + std::to_string(out));
    require(format != WeightFormat::LQ || (first % LQ_TILE_ROWS == 0 && n % LQ_TILE_ROWS == 0), "Linear::rows",
            "LQ rows go in whole strips of 16");
    require(!interleaved, "Linear::rows", "an interleaved gate|up block's rows are not one range");
    Linear before = *this;  // the rows above the range, whose bytes come first
    before.out = first;
    Linear r = *this;
    r.out = n;
    r.data = static_cast<const char*>(data) + before.bytes();
    return r;
}

namespace {

void check_weight(const Linear& W) {
    require(W.data != nullptr && W.out > 0 && W.in > 0, "linear_forward", "empty weight");
    require(W.format == WeightFormat::BF16 || W.format == WeightFormat::LQ, "linear_forward",
            "unsupported weight format " + std::to_string(int32_t(W.format)));
}

template <class OutT>
void linear_dispatch(const Linear& W, const bf16* x, OutT* y, int T, cudaStream_t stream) {
    check_weight(W);
    if (T <= 0) return;
    if (W.format == WeightFormat::LQ) {
        const uint8_t* w = static_cast<const uint8_t*>(W.data);
        if (T <= GEMV_MAX_T) gemv_lq(w, W.bits, x, y, T, W.out, W.in, stream);
        else gemm_lq(w, W.bits, x, y, T, W.out, W.in, stream);
        return;
    }
    const bf16* w = static_cast<const bf16*>(W.data);
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

void linear_forward_parts(const Linear& W, const bf16* x, const RowParts& parts, int T, cudaStream_t stream) {
    check_weight(W);
    require(T >= 1 && T <= GEMV_MAX_T, "linear_forward_parts", "T must be 1.." + std::to_string(GEMV_MAX_T) +
                                                                   ", got " + std::to_string(T));
    if (W.format == WeightFormat::LQ) gemv_lq_parts(static_cast<const uint8_t*>(W.data), W.bits, x, parts, T, W.out, W.in, stream);
    else gemv_bf16_parts(static_cast<const bf16*>(W.data), x, parts, T, W.out, W.in, stream);
}

namespace {

template <class OutT>
void normed_dispatch(const Linear& W, const ResidualNorm& x, OutT* y, cudaStream_t stream) {
    check_weight(W);
    if (W.format == WeightFormat::LQ) gemv_lq_normed(static_cast<const uint8_t*>(W.data), W.bits, x, y, W.out, W.in, stream);
    else gemv_bf16_normed(static_cast<const bf16*>(W.data), x, y, W.out, W.in, stream);
}

}  // namespace

void linear_forward_normed(const Linear& W, const ResidualNorm& x, bf16* y, cudaStream_t stream) {
    normed_dispatch(W, x, y, stream);
}

void linear_forward_normed_f32(const Linear& W, const ResidualNorm& x, float* y, cudaStream_t stream) {
    normed_dispatch(W, x, y, stream);
}

void linear_forward_add_residual_prenorm(const Linear& W, const bf16* x, float* residual, const Prenorm& next, int T,
                                         cudaStream_t stream) {
    check_weight(W);
    require(W.format == WeightFormat::LQ, "linear_forward_add_residual_prenorm", "needs LQ weights");
    gemv_lq_add_residual_prenorm(static_cast<const uint8_t*>(W.data), W.bits, x, residual, next, T, W.out, W.in, stream);
}

void linear_forward_prenormed(const Linear& W, const PrenormedRows& x, bf16* y, const RowParts& parts, int T,
                              cudaStream_t stream) {
    check_weight(W);
    require(W.format == WeightFormat::LQ, "linear_forward_prenormed", "needs LQ weights");
    gemv_lq_prenormed(static_cast<const uint8_t*>(W.data), W.bits, x, y, parts, T, W.out, W.in, stream);
}

void linear_forward_prenormed_swiglu(const Linear& W, const PrenormedRows& x, bf16* act, int T, cudaStream_t stream) {
    check_weight(W);
    require(W.format == WeightFormat::LQ && W.interleaved, "linear_forward_prenormed_swiglu",
            "needs an interleaved LQ gate|up block");
    gemv_lq_prenormed_swiglu(static_cast<const uint8_t*>(W.data), W.bits, x, act, T, W.out, W.in, stream);
}

void linear_forward_add_residual(const Linear& W, const bf16* x, float* residual, cudaStream_t stream, bool set) {
    check_weight(W);
    if (W.format == WeightFormat::LQ) {
        gemv_lq_add_residual(static_cast<const uint8_t*>(W.data), W.bits, x, residual, W.out, W.in, stream, set);
    } else {
        gemv_bf16_add_residual(static_cast<const bf16*>(W.data), x, residual, W.out, W.in, stream, set);
    }
}

}  // namespace lampo
