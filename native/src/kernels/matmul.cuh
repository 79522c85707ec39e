// matmul.cuh - the two bf16 matrix-product kernels behind linear_forward (linear.cu):
//   y [T, out] = x [T, in] @ W^T,  W [out, in] bf16 row-major, fp32 accumulation, OutT bf16 or fp32.
// gemv_bf16: T <= GEMV_MAX_T (gemv.cu);  gemm_bf16: any T (gemm.cu, tensor cores).
// gemv_bf16_normed / gemv_bf16_add_residual: the decode step's folded forms (linear.h).
// gemv_lq: the GEMV for weights in the LQ format.
// Both need in % 8 == 0 (16-byte rows); gemm also out % 8 == 0.
#pragma once

#include "kernels/ops.h"

namespace lampo {

template <class OutT>
void gemv_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);

// The decode step's folded forms (T = 1; contract in linear.h).
template <class OutT>
void gemv_bf16_normed(const bf16* W, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream);
void gemv_bf16_add_residual(const bf16* W, const bf16* x, float* residual, int out, int in, cudaStream_t stream);

template <class OutT>
void gemm_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);

// gemv_lq: the GEMV product for W in the LQ format (gemv_lq.cu; models/quant/layout.py): W the
// packed tiles of a [out, in] matrix at `bits` in {4, 5, 6}, out % 16 == 0, in % 64 == 0,
// T <= GEMV_MAX_T. lq_packed_bytes: the size of those tiles.
template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);
size_t lq_packed_bytes(int out, int in, int bits);

}  // namespace lampo
