// lq_stage.cuh - x staged for the LQ tiles' mma (lq_tile.cuh) from either memory space, for the
// LQ GEMV (matmul/gemv_lq.cu) and the LQ expert GEMVs (moe/moe_experts_lq.cu): the decode step's
// folded-norm GEMV (gemv_lq_normed) builds its normed row in shared memory and stages it from there.
//
// lq_stage_x_from<SRC> takes the rows' loads from global memory (SRC = Global: __ldg) or shared
// memory (SRC = Shared): the same fragment order and the same fp32 sums in the same order, so a
// row staged from shared memory gives the same bits as the same row staged from global memory.
//
// x staged in shared memory for the mma B operand: for token n, tile t and quad q, 16 bf16 = the
// b0, b1 pairs of k16 steps 0..3 (b0: columns 16j + 2q, +1; b1: 16j + 2q + 8, +9), 32 bytes, so a
// lane reads its tile's B fragments with two 16-byte loads. After the tokens, LQ_ZERO_X_BYTES of
// zeros: the one tile's fragments that every lane past the last token reads (lq_lane_x).
// start[t * 8 + n] = -centre * (sum of tile t's x of token n), zero for n >= tokens. `thread` /
// `threads` (a multiple of 32: a block, or one warp) share the work: the rows' 16-byte vectors,
// then one thread per (n, t, q) for the sums; a tile's four quads are adjacent lanes and add their
// sums by shuffles.
// xs: tokens * lq_x_bytes(in) + LQ_ZERO_X_BYTES bytes; start: lq_start_bytes(in).
#pragma once

#include "kernels/lq_tile.cuh"

namespace lampo {

enum class LqXSource { Global, Shared };

// Columns staged per thread in flight: LQ_STAGE_BATCH vectors of 8 (one 16-byte load each).
constexpr int LQ_STAGE_BATCH = 4;

// The staging, in two passes: (1) every 8 consecutive columns of every row (a uint4 of 4 bf16
// pairs) from `load8(n, c8)` (token n, columns 8 c8 .. 8 c8 + 7), LQ_STAGE_BATCH vectors per thread
// in flight, each of its words scattered to its place (word w of the vector at tile offset 8 o is
// word o of item (n, t, w)); (2) after the barrier (WARP: the threads are one warp), each item's
// eight words read back and summed in order, the quads' sums added by shuffles. Every row is read
// in coalesced 16-byte loads, a batch per round trip, instead of one round trip per item row.
template <bool WARP, class Load8>
__device__ __forceinline__ void lq_stage_rows(uint4* xs, float* start, int tokens, int in, float centre, int thread,
                                              int threads, Load8&& load8) {
    const int tiles = in / LQ_TILE_COLS, per_row = in / 8, vectors = tokens * per_row;
    uint32_t* words = reinterpret_cast<uint32_t*>(xs);
    for (int base = thread; base < vectors; base += LQ_STAGE_BATCH * threads) {
        uint4 v[LQ_STAGE_BATCH];
#pragma unroll
        for (int b = 0; b < LQ_STAGE_BATCH; ++b) {
            const int idx = base + b * threads;
            if (idx < vectors) v[b] = load8(idx / per_row, idx % per_row);
        }
#pragma unroll
        for (int b = 0; b < LQ_STAGE_BATCH; ++b) {
            const int idx = base + b * threads;
            if (idx >= vectors) continue;
            const int n = idx / per_row, c8 = idx % per_row;
            uint32_t* item0 = words + ((n * tiles + c8 / 8) * 4) * 8 + c8 % 8;  // quad 0's word
            item0[0] = v[b].x;
            item0[8] = v[b].y;
            item0[16] = v[b].z;
            item0[24] = v[b].w;
        }
    }
    if constexpr (WARP) __syncwarp();
    else __syncthreads();
    const int items = 4 * tiles * tokens;
    for (int base = 0; base < items; base += threads) {  // every lane of a warp takes part in the shuffles
        const int i = base + thread, q = i & 3, t = (i >> 2) % tiles, n = (i >> 2) / tiles;
        float sum = 0.0f;
        if (i < items) {
            const uint4 a = xs[2 * i], b = xs[2 * i + 1];
            const uint32_t v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int k = 0; k < 8; ++k) sum += __uint_as_float(v[k] << 16) + __uint_as_float(v[k] & 0xffff0000u);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (i < items && q == 0) start[t * 8 + n] = -centre * sum;
    }
    for (int i = thread; i < tiles * 8; i += threads)  // tokens past the staged ones
        if ((i & 7) >= tokens) start[i] = 0.0f;
    if (thread < LQ_ZERO_X_BYTES / 16) xs[tokens * tiles * 8 + thread] = make_uint4(0u, 0u, 0u, 0u);
}

// x [tokens, in] bf16 in SRC; WARP: staged by one warp (thread = lane, threads = 32).
template <LqXSource SRC, bool WARP = false>
__device__ __forceinline__ void lq_stage_x_from(uint4* xs, float* start, const bf16* x, int tokens, int in,
                                                float centre, int thread, int threads) {
    lq_stage_rows<WARP>(xs, start, tokens, in, centre, thread, threads, [&](int n, int c8) {
        const uint4* at = reinterpret_cast<const uint4*>(x + size_t(n) * in) + c8;
        if constexpr (SRC == LqXSource::Global) return __ldg(at);
        else return *at;
    });
}

}  // namespace lampo
