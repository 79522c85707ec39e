// lq_quantize.h - the LQ weight format made and unmade on the GPU (lq_quantize.cu): bf16 matrices
// quantized while the weights load (quantize-on-load), packed matrices turned back into bf16 (a
// fused block that cannot be LQ), and random packed matrices for benchmarks. The format is
// models/quant/layout.py (docs/weight-format.md): a [rows, cols] matrix at `bits` in {4, 5, 6},
// rows % 16 == 0, cols % 64 == 0, is lq_packed_bytes(rows, cols, bits) bytes of 16 x 64 tiles, and
//   W[n, k] = scale[n, k / 64] * (code[n, k] - 2^(bits-1)),   code in [0, 2^bits), scale fp16.
// Every pointer is device memory, 16-byte aligned. Each function is one kernel launch on `stream`
// (graph-capturable, no host synchronisation); bad arguments throw std::invalid_argument naming the
// function.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/ops.h"

namespace lampo {

// packed = layout.pack(*quantizer.quantize(W, bits), bits) for W [rows, cols] bf16 row-major: per
// group of 64 weights the quantizer's scale search (both ends x 9 stretch factors, least-squares
// refit, fp16 rounding clamped to +-65504, the first of equal errors kept; an all-zero group gets a
// zero scale and codes 2^(bits-1)). Bit-identical to numpy for finite inputs: every fp32 step is
// the same IEEE operation (no flush-to-zero), the refit's dot product is exact (as numpy's fp64 sum
// is, for bf16 weights) and the squared errors are summed in numpy's order. Non-finite weights give
// unspecified codes.
void lq_quantize(const bf16* W, int rows, int cols, int bits, uint8_t* packed, cudaStream_t stream);

// W [rows, cols] bf16 = bf16(scale * (code - 2^(bits-1))) of the packed matrix (the fp32 values of
// layout.dequantize, exact, rounded to nearest even).
void lq_dequantize(const uint8_t* packed, int rows, int cols, int bits, bf16* W, cudaStream_t stream);

// Bench only: a random packed matrix, a pure function of `seed`. Every code is uniform over
// [0, 2^bits) (the code bytes are random words); each scale is s * (1 + 0.1 u), u uniform in
// [-1, 1), s = weight_std / sqrt((4^bits - 1) / 12), so the weights' standard deviation is about
// weight_std (> 0; s * 1.1 must fit fp16).
void lq_fill_random(uint8_t* packed, int rows, int cols, int bits, float weight_std, uint64_t seed,
                    cudaStream_t stream);

// The rows of `strips` row strips of one half of a gate|up block (half 0: gate, 1: up; the half's
// strips first_strip .. first_strip + strips - 1, packed as a [16 strips, cols] matrix at `part`)
// put where models/quant/layout.py interleave_halves puts them in the block [rows, cols] at `block`
// (its row 16 j + 8 half + r is the half's row 8 j + r, r < 8); the other half's rows are kept, so
// placing both halves, in either order, gives the interleaved block (lq_interleave.cu).
void lq_place_half(const uint8_t* part, int first_strip, int strips, int cols, int bits, int half, uint8_t* block,
                   cudaStream_t stream);

}  // namespace lampo
