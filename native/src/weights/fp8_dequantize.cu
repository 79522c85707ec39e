// fp8_dequantize.cu - block-scaled FP8 -> bf16 (contract in fp8_dequantize.h).
//   fp8_dequantize_kernel: grid-stride over groups of four consecutive codes of a row (cols % 4 ==
//   0: one 32-bit load; otherwise one code a thread); each code decoded exactly through fp16
//   (cuda_fp8.h), multiplied by its block's scale with ieee_mul and rounded to bf16 as numpy's
//   to_bf16 does (models/bf16.py: nearest even, NaN 0x7FC0). Load-time only: the copy from host
//   memory, not this kernel, bounds a piece.
#include <cuda_fp8.h>

#include <string>

#include "kernels/ieee_f32.cuh"
#include "kernels/launch_utils.cuh"
#include "weights/fp8_dequantize.h"

namespace lampo {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;

__device__ __forceinline__ uint16_t bf16_bits_rn(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7FC0;
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ uint16_t dequantize_one(uint8_t code, float scale) {
    __nv_fp8_e4m3 v;
    v.__x = code;
    return bf16_bits_rn(ieee_mul(float(v), scale));
}

template <int VEC>
__global__ void fp8_dequantize_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales, int rows,
                                      int cols, int block_rows, int block_cols, uint16_t* __restrict__ W) {
    const int per_row = cols / VEC, scale_cols = (cols + block_cols - 1) / block_cols;
    const size_t groups = size_t(rows) * per_row;
    for (size_t g = size_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += size_t(gridDim.x) * blockDim.x) {
        const int r = int(g / per_row), c = int(g % per_row) * VEC;
        const float* row_scales = scales + size_t(r / block_rows) * scale_cols;
        const size_t at = size_t(r) * cols + c;
        if constexpr (VEC == 4) {
            const uint32_t q = *reinterpret_cast<const uint32_t*>(codes + at);
            uint16_t out[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) out[i] = dequantize_one(uint8_t(q >> (8 * i)), row_scales[(c + i) / block_cols]);
            *reinterpret_cast<uint2*>(W + at) = make_uint2(out[0] | uint32_t(out[1]) << 16, out[2] | uint32_t(out[3]) << 16);
        } else {
            W[at] = dequantize_one(codes[at], row_scales[c / block_cols]);
        }
    }
}

}  // namespace

void fp8_dequantize(const uint8_t* codes, const float* scales, int rows, int cols, int block_rows, int block_cols,
                    bf16* W, cudaStream_t stream) {
    const char* op = "fp8_dequantize";
    require(rows > 0 && cols > 0, op, "rows and cols must be positive, got " + std::to_string(rows) + " x " +
                                          std::to_string(cols));
    require(block_rows > 0 && block_cols > 0, op, "the weight block must be positive, got " +
                                                      std::to_string(block_rows) + " x " + std::to_string(block_cols));
    const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(codes) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(W) % 8 == 0;
    const size_t groups = size_t(rows) * (vec ? cols / 4 : cols);
    const unsigned blocks = unsigned(std::min<size_t>((groups + kThreads - 1) / kThreads, kMaxBlocks));
    uint16_t* out = reinterpret_cast<uint16_t*>(W);
    if (vec) {
        fp8_dequantize_kernel<4><<<blocks, kThreads, 0, stream>>>(codes, scales, rows, cols, block_rows, block_cols, out);
    } else {
        fp8_dequantize_kernel<1><<<blocks, kThreads, 0, stream>>>(codes, scales, rows, cols, block_rows, block_cols, out);
    }
    LAMPO_CHECK_LAUNCH(op);
}

}  // namespace lampo
