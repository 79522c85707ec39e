// moe_prefill.h - the steps of the routed-expert prefill that do not depend on the weights' format
// (moe_prefill.cu), shared by moe_experts_prefill (bf16 banks, moe_prefill.cu) and
// moe_experts_prefill_lq (LQ banks, moe_prefill_lq.cu):
//   moe_prefill_sort: checks the arguments, carves the workspace (moe_prefill_workspace_bytes) and
//     launches the counting sort of the T*k (token, slot) pairs by expert, which writes the expert
//     row ranges, the table of MOE_PREFILL_TILE_ROWS-row tiles (never straddling two experts) that
//     the grouped GEMMs run over, sorted_token[pos] and pos_of_slot[t*k + s];
//   moe_prefill_combine: out[t] = bf16(sum_s w[t, s] * y[pos_of_slot[t*k + s]]) in slot order (fp32).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/ops.h"

namespace lampo {

constexpr int MOE_PREFILL_TILE_ROWS = 64;

// The sorted rows' tables and buffers, in the workspace.
struct MoePrefillRows {
    int32_t* offsets;       // [E + 1] first sorted row of each expert (offsets + 1: the groups' ends)
    int32_t* num_tiles;     // device scalar: the live row tiles
    int32_t* tile_group;    // [tile_slots] expert of each row tile
    int32_t* tile_row0;     // [tile_slots] its first sorted row
    int32_t* sorted_token;  // [T*k] token of sorted row pos
    int32_t* pos_of_slot;   // [T*k] sorted row of slot t*k + s
    bf16* act;              // [T*k, I] the gate_up GEMM's output
    bf16* y;                // [T*k, H] the down GEMM's output
    int tile_slots;         // row tiles the grids cover (an upper bound of *num_tiles)
};

MoePrefillRows moe_prefill_sort(const char* op, const int32_t* ids, void* workspace, int T, int k, int H, int I,
                                int E, cudaStream_t stream);
void moe_prefill_combine(const MoePrefillRows& rows, const float* weights, bf16* out, int T, int k, int H,
                         cudaStream_t stream);

}  // namespace lampo
