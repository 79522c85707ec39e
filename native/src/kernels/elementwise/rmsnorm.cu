// rmsnorm.cu - zero-centred RMSNorm on the fp32 residual stream, with the fused residual add.
//   rmsnorm:      y = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w))      x [rows, n] fp32, w [n] bf16,
//                 y's rows ldy apart (the MTP fc input: two halves of one [rows, 2n] row)
//   add_rmsnorm:  residual += float(delta); y = rmsnorm(residual)     delta [rows, n] bf16
//   set_rmsnorm:  residual = 0 + float(delta); y = rmsnorm(residual)  (add_rmsnorm on a zeroed residual)
//   residual_add: residual += float(delta)
// One block per row (256 threads, float4 / 4 x bf16 vectors, n % 4 == 0); statistics in fp32.
// The first pass accumulates the sum of squares (and writes the updated residual), the second
// re-reads the row (L1-resident) and scales it.
#include <algorithm>

#include "kernels/launch_utils.cuh"
#include "kernels/norm_row.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

// Add: residual += delta first, Set: residual = 0 + delta (the row is written back either way). y's
// rows are ldy apart.
enum class NormInput { Residual, Add, Set };

template <NormInput IN>
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(float* __restrict__ x, const bf16* __restrict__ delta,
                                                               const bf16* __restrict__ w, bf16* __restrict__ y,
                                                               int n, int ldy, float eps) {
    pdl_begin();
    constexpr bool with_delta = IN != NormInput::Residual;
    float* row = x + size_t(blockIdx.x) * n;
    const float inv = norm_row_inv<IN == NormInput::Set>(row, with_delta ? delta + size_t(blockIdx.x) * n : nullptr,
                                                         with_delta ? row : nullptr, n, eps);
    norm_row_scale(row, inv, w, y + size_t(blockIdx.x) * ldy, n);
}

__global__ void residual_add_kernel(float* __restrict__ residual, const bf16* __restrict__ delta, size_t n4) {
    pdl_begin();
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
        float4 v = reinterpret_cast<float4*>(residual)[i];
        const float4 d = norm_load_bf16x4(delta + 4 * i);
        v.x += d.x; v.y += d.y; v.z += d.z; v.w += d.w;
        reinterpret_cast<float4*>(residual)[i] = v;
    }
}

void check_width(const char* op, int n) {
    require(n > 0 && n % 4 == 0, op, "row width must be a positive multiple of 4, got " + std::to_string(n));
}

// y's row stride: n by default, else at least n and a multiple of 4 (aligned vector stores).
int row_stride(const char* op, int n, int ldy) {
    if (ldy == 0) return n;
    require(ldy >= n && ldy % 4 == 0, op, "y's row stride must be a multiple of 4 and at least " + std::to_string(n));
    return ldy;
}

}  // namespace

void rmsnorm(const float* x, const bf16* w, bf16* y, int rows, int n, float eps, cudaStream_t stream, int ldy) {
    check_width("rmsnorm", n);
    ldy = row_stride("rmsnorm", n, ldy);
    if (rows <= 0) return;
    launch_pdl("rmsnorm_kernel", rmsnorm_kernel<NormInput::Residual>, rows, NORM_THREADS, 0, stream,
               const_cast<float*>(x), nullptr, w, y, n, ldy, eps);
}

void add_rmsnorm(float* residual, const bf16* delta, const bf16* w, bf16* y, int rows, int n, float eps,
                 cudaStream_t stream, int ldy, bool set) {
    const char* op = set ? "set_rmsnorm" : "add_rmsnorm";
    check_width(op, n);
    ldy = row_stride(op, n, ldy);
    if (rows <= 0) return;
    launch_pdl("rmsnorm_kernel", set ? rmsnorm_kernel<NormInput::Set> : rmsnorm_kernel<NormInput::Add>, rows,
               NORM_THREADS, 0, stream, residual, delta, w, y, n, ldy, eps);
}

void residual_add(float* residual, const bf16* delta, int rows, int n, cudaStream_t stream) {
    check_width("residual_add", n);
    if (rows <= 0) return;
    const size_t n4 = size_t(rows) * n / 4;
    const int blocks = int(std::min<size_t>((n4 + 255) / 256, 4096));
    launch_pdl("residual_add_kernel", residual_add_kernel, blocks, 256, 0, stream, residual, delta, n4);
}

}  // namespace lampo
