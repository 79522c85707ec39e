// moe_prefill_lq.cu - routed experts for a prefill chunk with the banks in the LQ format
// (kernels/lq_tile.cuh): the function of moe_experts_prefill (moe_prefill.cu, ops.h) with
//   gate_up: expert e's [2I, H] matrix (rows 0..I-1 gate, I..2I-1 up) at
//            gate_up + e * lq_packed_bytes(2I, H, gate_up_bits)
//   down:    expert e's [H, I] matrix at down + e * lq_packed_bytes(H, I, down_bits)
// bits in {4, 5, 6}; h [T, H] bf16, ids / weights [T, k], out [T, H] bf16.
//   1. moe_prefill_sort (moe_prefill.h): the (token, slot) pairs sorted by expert, the 64-row tile
//      table; 2. gemm_lq_grouped SWIGLU: act[pos] = bf16(silu(h Wg^T) * (h Wu^T)) for the gathered
//      rows h[sorted_token[pos]]; 3. gemm_lq_grouped BF16: y[pos] = bf16(act[pos] Wd[e]^T);
//   4. moe_prefill_combine: out[t] = bf16(sum_s w[t, s] * y[pos_of_slot[t*k + s]]) in slot order.
// The grouped GEMMs read the packed tiles directly (matmul/gemm_lq.cu). As in moe_experts_prefill,
// y is rounded to bf16 per expert before the weighted sum. Workspace: moe_prefill_workspace_bytes.
#include "kernels/launch_utils.cuh"
#include "kernels/matmul.cuh"
#include "kernels/moe/moe_prefill.h"
#include "kernels/ops.h"

namespace lampo {

static_assert(LQ_GEMM_TILE_ROWS == MOE_PREFILL_TILE_ROWS, "the sort's row tiles are the LQ GEMM's");

void moe_experts_prefill_lq(const bf16* h, const uint8_t* gate_up, int gate_up_bits, const uint8_t* down,
                            int down_bits, const int32_t* ids, const float* weights, bf16* out, void* workspace,
                            int T, int k, int H, int I, int E, cudaStream_t stream) {
    const char* op = "moe_experts_prefill_lq";
    for (const int bits : {gate_up_bits, down_bits})
        require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    const MoePrefillRows rows = moe_prefill_sort(op, ids, workspace, T, k, H, I, E, stream);

    LqRowGroups groups;
    groups.tile_group = rows.tile_group;
    groups.tile_row0 = rows.tile_row0;
    groups.group_end = rows.offsets + 1;
    groups.num_tiles = rows.num_tiles;
    groups.tile_slots = rows.tile_slots;

    groups.x_rows = rows.sorted_token;
    groups.group_bytes = lq_packed_bytes(2 * I, H, gate_up_bits);
    gemm_lq_grouped(gate_up, gate_up_bits, h, rows.act, I, 2 * I, H, groups, LqEpilogue::SWIGLU, stream);

    groups.x_rows = nullptr;
    groups.group_bytes = lq_packed_bytes(H, I, down_bits);
    gemm_lq_grouped(down, down_bits, rows.act, rows.y, H, H, I, groups, LqEpilogue::BF16, stream);

    moe_prefill_combine(rows, weights, out, T, k, H, stream);
}

}  // namespace lampo
