// attention_window.h - the tiled form of a verify window's attention (attention_window.cu), for
// attention_decode.cu, which chooses the form of each call and runs the combine after it.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention/attention_int8.cuh"

namespace lampo {

// A verify window's attention: the shared core's form, or the tiled form with 64-key tiles (146-162
// KiB a block) or 32-key tiles (81-97 KiB).
enum class WindowForm { Core, Tiled64, Tiled32 };

// Whether a window whose rows fill `mt` M-tiles of 16 (Tq * group rows) may take the tiled `form`:
// 2 <= mt <= 4 (one M-tile has no key to dequantize twice) and the GPU lets a block hold its shared
// memory.
bool attn_window_tiled_fits(WindowForm form, int mt);

// Blocks of that form resident on one SM (its splits make one wave of them).
int attn_window_tiled_blocks_per_sm(WindowForm form, int mt);

// The tiled form over p's splits: grid (p.nsplit, p.nkv), Params::part_o / part_ml written as the
// core's decode form writes them; where attn_window_tiled_fits(form, mt).
void attn_window_tiled(WindowForm form, const attn::Params& p, int mt, cudaStream_t stream);

}  // namespace lampo
