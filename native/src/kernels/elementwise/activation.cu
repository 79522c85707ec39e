// activation.cu - element-wise activations between projections, fp32 math, bf16 in/out.
//   silu_mul:         gu [T, 2I] (gate | up) -> y [T, I] = silu(gate) * up          (I % 8 == 0)
//                     interleaved (a gate|up block kept with its halves' rows interleaved by 8,
//                     models/quant/layout.py interleaved_rows): gate i at 16 (i / 8) + i % 8, up i
//                     at 16 (i / 8) + 8 + i % 8 of the row
//   sigmoid_gate_mul: y [T, n] = x * sigmoid(gate)                                  (n % 8 == 0)
// Grid-stride loops over 16-byte vectors of 8 values.
#include <algorithm>

#include "kernels/bf16_vec.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

int vector_blocks(size_t vectors) { return int(std::min<size_t>((vectors + 255) / 256, 8192)); }

__global__ void silu_mul_kernel(const bf16* __restrict__ gu, bf16* __restrict__ y, int I, size_t vectors,
                                bool interleaved) {
    pdl_begin();
    const int per_row = I / 8;
    for (size_t v = size_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += size_t(gridDim.x) * blockDim.x) {
        const size_t t = v / per_row;
        const int c = int(v % per_row);
        const uint4* row = reinterpret_cast<const uint4*>(gu + t * 2 * I);
        float g[8], u[8], o[8];
        bf16x8_to_float(row[interleaved ? 2 * c : c], g);
        bf16x8_to_float(row[interleaved ? 2 * c + 1 : per_row + c], u);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = silu(g[i]) * u[i];
        reinterpret_cast<uint4*>(y)[v] = float_to_bf16x8(o);
    }
}

__global__ void sigmoid_gate_mul_kernel(const bf16* __restrict__ x, const bf16* __restrict__ gate,
                                        bf16* __restrict__ y, size_t vectors) {
    pdl_begin();
    for (size_t v = size_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += size_t(gridDim.x) * blockDim.x) {
        float a[8], g[8], o[8];
        bf16x8_to_float(reinterpret_cast<const uint4*>(x)[v], a);
        bf16x8_to_float(reinterpret_cast<const uint4*>(gate)[v], g);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = a[i] * sigmoid(g[i]);
        reinterpret_cast<uint4*>(y)[v] = float_to_bf16x8(o);
    }
}

}  // namespace

void silu_mul(const bf16* gu, bf16* y, int T, int I, cudaStream_t stream, bool interleaved) {
    require(I > 0 && I % 8 == 0, "silu_mul", "I must be a positive multiple of 8, got " + std::to_string(I));
    if (T <= 0) return;
    const size_t vectors = size_t(T) * I / 8;
    launch_pdl("silu_mul_kernel", silu_mul_kernel, vector_blocks(vectors), 256, 0, stream, gu, y, I, vectors, interleaved);
}

void sigmoid_gate_mul(const bf16* x, const bf16* gate, bf16* y, int T, int n, cudaStream_t stream) {
    require(n > 0 && n % 8 == 0, "sigmoid_gate_mul", "n must be a positive multiple of 8, got " + std::to_string(n));
    if (T <= 0) return;
    const size_t vectors = size_t(T) * n / 8;
    launch_pdl("sigmoid_gate_mul_kernel", sigmoid_gate_mul_kernel, vector_blocks(vectors), 256, 0,
               stream, x, gate, y, vectors);
}

}  // namespace lampo
