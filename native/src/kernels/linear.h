// linear.h - the weight-format seam: every projection of the layer loop is a `Linear`, and
// `linear_forward` picks the kernel by format and token count: BF16 matrices, or the LQ format
// (docs/weight-format.md; models/quant/layout.py: 16 x 64 tiles of 4-, 5- or 6-bit codes with fp16
// scales), without the layer loop knowing which.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace lampo {

enum class WeightFormat : int32_t { BF16 = 0, LQ = 1 };

struct Linear {
    WeightFormat format = WeightFormat::BF16;
    const void* data = nullptr;  // BF16: [out, in] row-major bf16; LQ: the packed tiles of [out, in]
    int out = 0;
    int in = 0;
    int bits = 0;                // LQ: 4, 5 or 6 (out % 16 == 0, in % 64 == 0)
    // LQ: a SwiGLU gate|up block kept with its halves' rows interleaved by 8 (out % 32 == 0; row
    // 16 j + r is gate row 8 j + r, 16 j + 8 + r up row 8 j + r: models/quant/layout.py
    // interleaved_rows), so its products come out in that order (silu_mul's interleaved form) and
    // its few-token GEMV can apply the activation itself (linear_forward_prenormed_swiglu).
    bool interleaved = false;
    size_t bytes() const;        // of one [out, in] matrix in its format
    // Rows [first, first + n) as a matrix of their own (LQ: first and n multiples of 16, whole strips).
    Linear rows(int first, int n) const;
};

// Largest token count served by the GEMV path (decode and speculative verify windows).
constexpr int GEMV_MAX_T = 8;

// y [T, W.out] = x [T, W.in] @ W^T.  bf16 in/out, fp32 accumulation.
// T <= GEMV_MAX_T: bandwidth-bound GEMV kernel (gemv.cu; LQ: gemv_lq.cu), graph-capturable.
// T  > GEMV_MAX_T: our own tensor-core GEMM (gemm.cu, mma.sync bf16 -> fp32; LQ: gemm_lq.cu, the
//                  tiles dequantized inside the tensor-core pipeline). Lampo links no
//                  cuBLAS: the CPU machines that build it have nvcc but no cuBLAS, and the
//                  engine needs only these two shapes of product.
void linear_forward(const Linear& W, const __nv_bfloat16* x, __nv_bfloat16* y, int T,
                    cudaStream_t stream);
// Same product with fp32 output (LM head logits, router logits).
void linear_forward_f32(const Linear& W, const __nv_bfloat16* x, float* y, int T,
                        cudaStream_t stream);

// The rows of a fused matrix's product stored as separate parts, each its own [T, width] matrix:
// row r of token t, first[i] <= r < first[i + 1], at dst[i] + t * (first[i + 1] - first[i]) +
// (r - first[i]); rows from first[n] on (a block's zero padding) are not stored. The verify window
// (T <= GEMV_MAX_T) splits the attention q|k|v and GDN qkv|z|b|a products this way as the GEMV
// writes them, where a copy per part would follow a plain product.
struct RowParts {
    static constexpr int MAX = 4;
    int n = 0;
    int first[MAX + 1] = {};
    __nv_bfloat16* dst[MAX] = {};
#ifdef __CUDACC__
    __device__ __forceinline__ __nv_bfloat16* at(int t, int row) const {
#pragma unroll
        for (int i = 0; i < MAX; ++i)
            if (i < n && row < first[i + 1]) return dst[i] + size_t(t) * (first[i + 1] - first[i]) + (row - first[i]);
        return nullptr;
    }
#endif
};
// y = x @ W^T for T <= GEMV_MAX_T tokens, written as `parts` (first[n] <= W.out).
void linear_forward_parts(const Linear& W, const __nv_bfloat16* x, const RowParts& parts, int T,
                          cudaStream_t stream);

// The decode step (one token) folds the residual stream into its projections instead of running
// an add_rmsnorm launch between them:
// - a block's input projection reads x = bf16(rmsnorm(residual) * (1 + weight)), built by the
//   projection kernel itself (the same values add_rmsnorm / rmsnorm would write);
// - a block's output projection adds its rounded output to the residual: residual += float(bf16(y))
//   (set: residual = 0 + float(bf16(y)), whatever it held: the MTP pass's fc starts the stream).
struct ResidualNorm {
    const float* residual = nullptr;         // [W.in] fp32: the residual stream of the token
    const __nv_bfloat16* weight = nullptr;   // [W.in] the zero-centred norm weight
    float eps = 1e-6f;
    __nv_bfloat16* normed_out = nullptr;     // optional [W.in]: the normed row is also written here
};
void linear_forward_normed(const Linear& W, const ResidualNorm& x, __nv_bfloat16* y, cudaStream_t stream);
void linear_forward_normed_f32(const Linear& W, const ResidualNorm& x, float* y, cudaStream_t stream);
void linear_forward_add_residual(const Linear& W, const __nv_bfloat16* x, float* residual, cudaStream_t stream,
                                 bool set = false);

// Decode steps and verify windows (T <= GEMV_MAX_T) of a dense model whose projections are all in
// the LQ format carry each norm between two blocks in two halves instead (no norm launch, and the
// window's tokens take them as the step's token does):
// - the output projection adds its rounded rows into the residual [T, W.out] (as above, for T
//   tokens) and writes, for the norm that follows, the prenormed rows bf16(r * (1 + weight)) and per
//   token and strip of PRENORM_STRIP rows the sum of the new residual's squares (Prenorm);
// - the next input projection takes the prenormed rows as x and scales each token's sums by
//   inv_t = rsqrt((sum of its strips' squares, in strip order) / n + eps) before rounding:
//   y = bf16(inv_t * (x_t @ W^T)) (PrenormedRows). Against rmsnorm then the product, only x's
//   rounding differs (it is rounded before inv_t is applied, not after).
constexpr int PRENORM_STRIP = 16;  // rows per strip sum (an LQ tile's rows)
struct Prenorm {
    const __nv_bfloat16* weight = nullptr;  // [W.out] the next norm's zero-centred weight
    __nv_bfloat16* rows = nullptr;          // [T, W.out] bf16(residual * (1 + weight))
    float* strip_squares = nullptr;         // [T, W.out / PRENORM_STRIP]
};
struct PrenormedRows {
    const __nv_bfloat16* rows = nullptr;    // [T, W.in]
    const float* strip_squares = nullptr;   // [T, W.in / PRENORM_STRIP]
    float eps = 1e-6f;
};
void linear_forward_add_residual_prenorm(const Linear& W, const __nv_bfloat16* x, float* residual,
                                         const Prenorm& next, int T, cudaStream_t stream);
// y [T, W.out] (parts.n > 0: stored as `parts` instead).
void linear_forward_prenormed(const Linear& W, const PrenormedRows& x, __nv_bfloat16* y, const RowParts& parts,
                              int T, cudaStream_t stream);
// The same product of an interleaved gate|up block (W.interleaved) with the SwiGLU activation
// applied where its rows are written: act [T, W.out / 2] = bf16(silu(gate) * up) of the product's
// bf16 gate and up rows, the values silu_mul (interleaved) computes from linear_forward_prenormed's.
void linear_forward_prenormed_swiglu(const Linear& W, const PrenormedRows& x, __nv_bfloat16* act, int T,
                                     cudaStream_t stream);

}  // namespace lampo
