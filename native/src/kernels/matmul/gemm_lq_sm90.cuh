// gemm_lq_sm90.cuh - the Hopper (sm_90a) path of gemm_lq (gemm_lq_sm90.cu): wgmma with the LQ
// weights dequantized in registers as the A operand. The kernel exists only when CMake compiles
// for sm_90a (LAMPO_GEMM_SM90A); gemm_lq (gemm_lq.cu) falls back to its mma.sync kernel otherwise.
//   gemm_lq_takes_sm90(T): whether gemm_lq hands a product of T tokens to gemm_lq_sm90 (given
//     16-byte aligned pointers): compiled in, a compute capability 9.0 device (LAMPO_SM90 not
//     "0": launch_utils.cuh), and
//     LAMPO_GEMM_LQ_SM90 unset (T >= GEMM_LQ_SM90_MIN_T), "1" (any T) or "0" (never; so is
//     LAMPO_GEMM_PORTABLE=1). The environment is read on every call (tests switch it).
//   gemm_lq_sm90_usable: the device and environment part of that, plus W, x, y 16-byte aligned.
//   gemm_lq_sm90: y [T, out] = x [T, in] @ bf16(W)^T, the contract of gemm_lq (matmul.cuh) except
//     that each weight is rounded once to bf16 (see gemm_lq_sm90.cu); the caller has checked the
//     shapes (out % 16 == 0, in % 64 == 0, T >= 1, bits 4..6).
#pragma once

#include "kernels/ops.h"

namespace lampo {

constexpr int GEMM_LQ_SM90_MIN_T = 128;

bool gemm_lq_takes_sm90(int T);

#if defined(LAMPO_GEMM_SM90A)
bool gemm_lq_sm90_usable(const void* W, const void* x, const void* y);

template <class OutT>
void gemm_lq_sm90(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);
#endif

}  // namespace lampo
