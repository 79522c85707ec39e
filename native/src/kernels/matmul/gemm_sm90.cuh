// gemm_sm90.cuh - the Hopper wgmma + TMA path of gemm_bf16 (gemm_sm90.cu). It exists only when
// CMake compiles for sm_90a (LAMPO_GEMM_SM90A); gemm.cu falls back to its portable mma.sync kernel
// otherwise.
//   gemm_sm90_usable: the current device is compute capability 9.0 (LAMPO_SM90 not "0":
//     launch_utils.cuh), x and W are 16-byte aligned (a TMA requirement) and LAMPO_GEMM_PORTABLE
//     is unset or "0" (set it to compare the two paths).
//   gemm_bf16_sm90: y [T, out] = x [T, in] @ W^T, same contract as gemm_bf16 (matmul.cuh); the
//     caller has checked the shapes (in, out % 8 == 0, T > 0).
#pragma once

#include "kernels/ops.h"

#if defined(LAMPO_GEMM_SM90A)
namespace lampo {

bool gemm_sm90_usable(const bf16* W, const bf16* x);

template <class OutT>
void gemm_bf16_sm90(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream);

}  // namespace lampo
#endif
