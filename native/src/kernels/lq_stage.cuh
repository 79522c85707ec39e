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
// `threads` (a multiple of 32) share the work: one thread per (n, t, q); a tile's four quads are
// adjacent lanes and add their sums by shuffles. With peer_xs / peer_start (another block's areas
// of the same layout, in its shared memory: a pair of blocks of one cluster staging x once, each
// half of it) every value also goes there.
// xs: tokens * lq_x_bytes(in) + LQ_ZERO_X_BYTES bytes; start: lq_start_bytes(in).
#pragma once

#include "kernels/lq_tile.cuh"

namespace lampo {

enum class LqXSource { Global, Shared };

// x [tokens, in] bf16 in SRC.
template <LqXSource SRC>
__device__ __forceinline__ void lq_stage_x_from(uint4* xs, float* start, const bf16* x, int tokens, int in,
                                                float centre, int thread, int threads, uint4* peer_xs = nullptr,
                                                float* peer_start = nullptr) {
    auto put_x = [&](int i, uint4 value) {
        xs[i] = value;
        if (peer_xs) peer_xs[i] = value;
    };
    auto put_start = [&](int i, float value) {
        start[i] = value;
        if (peer_start) peer_start[i] = value;
    };
    const int tiles = in / LQ_TILE_COLS, items = 4 * tiles * tokens;
    for (int base = 0; base < items; base += threads) {  // every lane of a warp takes part in the shuffles
        const int i = base + thread, q = i & 3, t = (i >> 2) % tiles, n = (i >> 2) / tiles;
        uint32_t v[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        float sum = 0.0f;
        if (i < items) {
            const uint32_t* row = reinterpret_cast<const uint32_t*>(x + size_t(n) * in + t * LQ_TILE_COLS) + q;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if constexpr (SRC == LqXSource::Global) {
                    v[2 * j] = __ldg(row + 8 * j);
                    v[2 * j + 1] = __ldg(row + 8 * j + 4);
                } else {
                    v[2 * j] = row[8 * j];
                    v[2 * j + 1] = row[8 * j + 4];
                }
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) sum += __uint_as_float(v[k] << 16) + __uint_as_float(v[k] & 0xffff0000u);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (i < items) {
            put_x(2 * i, make_uint4(v[0], v[1], v[2], v[3]));
            put_x(2 * i + 1, make_uint4(v[4], v[5], v[6], v[7]));
            if (q == 0) put_start(t * 8 + n, -centre * sum);
        }
    }
    for (int i = thread; i < tiles * 8; i += threads)  // tokens past the staged ones
        if ((i & 7) >= tokens) put_start(i, 0.0f);
    if (thread < LQ_ZERO_X_BYTES / 16) put_x(tokens * tiles * 8 + thread, make_uint4(0u, 0u, 0u, 0u));
}

}  // namespace lampo
