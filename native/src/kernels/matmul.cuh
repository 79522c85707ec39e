// matmul.cuh - the two bf16 matrix-product kernels behind linear_forward (linear.cu):
//   y [T, out] = x [T, in] @ W^T,  W [out, in] bf16 row-major, fp32 accumulation, OutT bf16 or fp32.
// gemv_bf16: T <= GEMV_MAX_T (gemv.cu);  gemm_bf16: any T (gemm.cu, tensor cores).
// gemv_bf16_normed / gemv_bf16_add_residual: the decode step's folded forms (linear.h).
// gemv_lq / gemm_lq: the GEMV / GEMM for weights in the LQ format (gemv_lq_normed /
// gemv_lq_add_residual: the GEMV's folded forms); gemm_lq_grouped: that GEMM over
// groups of rows, one matrix per group (the MoE prefill experts).
// Both need in % 8 == 0 (16-byte rows); gemm also out % 8 == 0.
#pragma once

#include "kernels/ops.h"

namespace lampo {

template <class OutT>
void gemv_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);

// The decode step's folded forms (T = 1; contract in linear.h).
template <class OutT>
void gemv_bf16_normed(const bf16* W, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream);
void gemv_bf16_add_residual(const bf16* W, const bf16* x, float* residual, int out, int in, cudaStream_t stream,
                            bool set = false);
// The bf16 product of gemv_bf16 stored as row parts (linear.h RowParts).
// The check of both GEMVs' parts forms: min_n..RowParts::MAX parts within the `out` rows (gemv.cu).
void require_row_parts(const char* op, const RowParts& parts, int min_n, int out);
void gemv_bf16_parts(const bf16* W, const bf16* x, const RowParts& parts, int T, int out, int in, cudaStream_t stream);

template <class OutT>
void gemm_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);

// gemv_lq: the GEMV product for W in the LQ format (gemv_lq.cu; models/quant/layout.py): W the
// packed tiles of a [out, in] matrix at `bits` in {4, 5, 6}, out % 16 == 0, in % 64 == 0,
// T <= GEMV_MAX_T. lq_packed_bytes: the size of those tiles.
template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);
size_t lq_packed_bytes(int out, int in, int bits);
// How many gemv_lq launches so far went out as pairs of blocks (clusters of two staging x once
// between them; gemv_lq.cu): the op tests check that the launches meant to take them did.
long long gemv_lq_pair_launches();
// The bf16 product of gemv_lq stored as row parts (linear.h RowParts).
void gemv_lq_parts(const uint8_t* W, int bits, const bf16* x, const RowParts& parts, int T, int out, int in,
                   cudaStream_t stream);
// The decode step's folded forms of gemv_lq (T = 1; contract in linear.h, as gemv_bf16_normed /
// gemv_bf16_add_residual): gemv_lq_normed is bit for bit rmsnorm followed by gemv_lq.
template <class OutT>
void gemv_lq_normed(const uint8_t* W, int bits, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream);
// The two halves of a norm between blocks (contract in linear.h: Prenorm, PrenormedRows).
void gemv_lq_add_residual_prenorm(const uint8_t* W, int bits, const bf16* x, float* residual, const Prenorm& next,
                                  int T, int out, int in, cudaStream_t stream);
void gemv_lq_prenormed(const uint8_t* W, int bits, const PrenormedRows& x, bf16* y, const RowParts& parts, int T,
                       int out, int in, cudaStream_t stream);
void gemv_lq_add_residual(const uint8_t* W, int bits, const bf16* x, float* residual, int out, int in,
                          cudaStream_t stream, bool set = false);
// gemv_lq_prenormed of an interleaved gate|up block [out, in] (linear.h Linear::interleaved) with the
// activation applied as the rows are written: act [T, out / 2] = bf16(silu(bf16(gate)) * bf16(up)).
void gemv_lq_prenormed_swiglu(const uint8_t* W, int bits, const PrenormedRows& x, bf16* act, int T, int out, int in,
                              cudaStream_t stream);
constexpr int LQ_TILE_ROWS = 16;  // an LQ tile: 16 rows x 64 columns (one fp16 scale per row)
constexpr int LQ_TILE_COLS = 64;

// gemm_lq: the same product for any T >= 1 (the prefill path, T > GEMV_MAX_T) on the tensor cores,
// reading the packed tiles directly (gemm_lq.cu): fp32 sums of the exact products code * x, scaled
// per tile as gemv_lq does. W and x 16-byte aligned.
template <class OutT>
void gemm_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);

// gemm_lq_grouped: gemm_lq's kernel over groups of rows, one LQ matrix [out, in] per group at
// W + g * group_bytes. Rows come in tiles of LQ_GEMM_TILE_ROWS that never straddle two groups,
// listed in a device table (built on the GPU, e.g. by the MoE prefill sort: no host sync):
//   tile i < *num_tiles covers rows r in [tile_row0[i], min(tile_row0[i] + 64, group_end[g])),
//   g = tile_group[i];  c[r, n] = sum_k x[x_rows ? x_rows[r] : r, k] * W_g[n, k]  (fp32)
//   BF16:   y[r, n] = bf16(c[r, n])                                             y [rows, ldy]
//   SWIGLU: y[r, i] = bf16(silu(c[r, i]) * c[r, out/2 + i]), i < out/2 (gate rows, then up rows;
//           out a multiple of 32)
// The grid has tile_slots row tiles (an upper bound of *num_tiles).
constexpr int LQ_GEMM_TILE_ROWS = 64;
enum class LqEpilogue : int { BF16, SWIGLU };
struct LqRowGroups {
    const int32_t* x_rows = nullptr;      // [rows] gathered x row of each row, or null
    const int32_t* tile_group = nullptr;  // [tile_slots]
    const int32_t* tile_row0 = nullptr;   // [tile_slots]
    const int32_t* group_end = nullptr;   // [groups] first row past each group
    const int32_t* num_tiles = nullptr;   // device scalar
    int tile_slots = 0;
    size_t group_bytes = 0;               // bytes between two groups' packed matrices
};
void gemm_lq_grouped(const uint8_t* W, int bits, const bf16* x, bf16* y, int ldy, int out, int in,
                     const LqRowGroups& groups, LqEpilogue epilogue, cudaStream_t stream);

}  // namespace lampo
