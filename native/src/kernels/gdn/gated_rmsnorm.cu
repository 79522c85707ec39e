// gated_rmsnorm.cu - the Gated DeltaNet output norm, per V head (plain weight, no +1):
//   o [T, Hv, dv] bf16 ; z [T, Hv*dv] bf16 ; w [dv] bf16 -> y [T, Hv*dv] bf16
//   n = o * rsqrt(mean(o^2) + eps)          (fp32)
//   y = bf16(w * bf16(n) * silu(z))         (n is rounded to bf16 first, as HF does)
// One warp per (token, head); each lane owns groups of 4 channels (8-byte accesses).
#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/gdn/gdn_common.cuh"
#include "kernels/ops.h"

#include <stdexcept>
#include <string>

namespace lampo {
namespace {

constexpr int GRN_WARPS = 8;

__global__ void __launch_bounds__(GRN_WARPS * 32)
gated_rmsnorm_kernel(const bf16* __restrict__ o, const bf16* __restrict__ z,
                     const bf16* __restrict__ w, bf16* __restrict__ y, int rows, int dv,
                     float eps) {
    pdl_begin();
    const int row = blockIdx.x * GRN_WARPS + threadIdx.x / 32;  // row = t * Hv + head
    if (row >= rows) return;
    const size_t base = size_t(row) * dv;
    gated_rmsnorm_row(o + base, z + base, w, y + base, dv, eps);
}

}  // namespace

void gated_rmsnorm(const bf16* o, const bf16* z, const bf16* w, bf16* y, int T, int Hv, int dv,
                   float eps, cudaStream_t stream) {
    if (T < 1 || Hv < 1) throw std::invalid_argument("gated_rmsnorm: T and Hv must be >= 1");
    if (dv < 4 || dv % 4 != 0)
        throw std::invalid_argument("gated_rmsnorm: dv must be a positive multiple of 4, got " +
                                    std::to_string(dv));
    const int rows = T * Hv;
    launch_pdl("gated_rmsnorm_kernel", gated_rmsnorm_kernel, ceil_div(rows, GRN_WARPS), GRN_WARPS * 32,
               0, stream, o, z, w, y, rows, dv, eps);
}

}  // namespace lampo
