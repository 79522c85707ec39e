// fp8_dequantize.h - block-scaled FP8 weights (Qwen's *-FP8 releases, models/fp8.py) turned into
// bf16 on the GPU while the weights load (fp8_dequantize.cu).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/ops.h"

namespace lampo {

// W [rows, cols] bf16 (row-major) = bf16(e4m3(codes[r, c]) * scales[r / block_rows, c / block_cols])
// for codes [rows, cols] uint8 (e4m3 "fn": 0x7F and 0xFF are NaN) and scales
// [ceil(rows / block_rows), ceil(cols / block_cols)] fp32, both row-major: the fp32 product rounded
// once (IEEE, subnormals kept), then to bf16 to nearest even, NaN as 0x7FC0 - bit for bit what
// models/fp8.py dequantize_bf16 gives. Device pointers; one launch on `stream`; bad sizes throw
// std::invalid_argument.
void fp8_dequantize(const uint8_t* codes, const float* scales, int rows, int cols, int block_rows, int block_cols,
                    bf16* W, cudaStream_t stream);

}  // namespace lampo
