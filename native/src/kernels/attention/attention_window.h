// attention_window.h - the tiled form of a verify window's attention (attention_window.cu), for
// attention_decode.cu, which chooses the form of each call and runs the combine after it.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention/attention_int8.cuh"

namespace lampo {

// Whether a window whose rows fill `mt` M-tiles of 16 (Tq * group rows) may take the tiled form:
// 2 <= mt <= 4 (one M-tile has no key to dequantize twice) and the GPU lets a block hold its shared
// memory (about 146-162 KiB: an H100 / H200, not a desktop card's 99 KiB).
bool attn_window_tiled_fits(int mt);

// Blocks of the tiled form for `mt` M-tiles resident on one SM (its splits make one wave of them).
int attn_window_tiled_blocks_per_sm(int mt);

// The tiled form over p's splits: grid (p.nsplit, p.nkv), Params::part_o / part_ml written as the
// core's decode form writes them. mt as above, where attn_window_tiled_fits(mt).
void attn_window_tiled(const attn::Params& p, int mt, cudaStream_t stream);

}  // namespace lampo
