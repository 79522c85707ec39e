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
// start[t * 8 + n] = -centre * (sum of tile t's x of token n), zero for n >= tokens.
// The loads are 16 contiguous bytes a thread, a warp's 512 contiguous bytes of x: eight threads
// per (n, t), thread r holding the tile's 32-bit words 4r .. 4r + 3 (columns 8r .. 8r + 7). Quad
// q's 32 bytes are the words q, q + 4, ..., q + 28 (w = 4m + q, m = 0..7), column q of that 8 x 4
// matrix of words: each four threads transpose their 4 x 4 block by two exchanges of shuffles, so
// thread 4h + q holds words 4m + q for m = 4h .. 4h + 3, one 16-byte half of quad q's fragments.
// The tile sum is taken in the order of its values (m = 0..7 for each quad, the quads added by a
// fixed tree), so the start values do not depend on how the loads were cut. `thread` / `threads`
// (a multiple of 32) share the work. With peer_xs / peer_start (another block's areas of the same
// layout, in its shared memory: a pair of blocks of one cluster staging x once, each half of it)
// every value also goes there.
// xs: tokens * lq_x_bytes(in) + LQ_ZERO_X_BYTES bytes; start: lq_start_bytes(in).
#pragma once

#include "kernels/lq_tile.cuh"

namespace lampo {

enum class LqXSource { Global, Shared };

// Four threads (lane % 4 = i) holding rows i of a 4 x 4 matrix of words a[i][k] end holding its
// columns: a[k] = old a of row k, column i.
__device__ __forceinline__ void lq_transpose4x4(uint32_t (&a)[4], int lane) {
    const bool odd = lane & 1, upper = lane & 2;
    // exchange 1 (lanes i, i ^ 2): keep the 2 x 2 block of columns 2 * bit1(i), +1 of rows i, i ^ 2
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, upper ? a[0] : a[2], 2);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, upper ? a[1] : a[3], 2);
    // c[2 * (row bit 1) + (column bit 0)]: rows i & 1 and (i & 1) + 2, columns 2 * bit1(i) + 0, 1
    const uint32_t c0 = upper ? r0 : a[0], c1 = upper ? r1 : a[1];
    const uint32_t c2 = upper ? a[2] : r0, c3 = upper ? a[3] : r1;
    // exchange 2 (lanes i, i ^ 1): keep column i of the lane's rows, take it of the peer's rows
    const uint32_t q0 = __shfl_xor_sync(0xffffffffu, odd ? c0 : c1, 1);
    const uint32_t q1 = __shfl_xor_sync(0xffffffffu, odd ? c2 : c3, 1);
    const uint32_t k0 = odd ? c1 : c0, k1 = odd ? c3 : c2;
    a[0] = odd ? q0 : k0;
    a[1] = odd ? k0 : q0;
    a[2] = odd ? q1 : k1;
    a[3] = odd ? k1 : q1;
}

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
    const int tiles = in / LQ_TILE_COLS, units = 8 * tiles * tokens;
    for (int base = 0; base < units; base += threads) {  // every lane of a warp takes part in the shuffles
        const int u = base + thread, r = u & 7, q = r & 3, half = r >> 2, t = (u >> 3) % tiles, n = (u >> 3) / tiles;
        const bool live = u < units;
        uint32_t v[4] = {0u, 0u, 0u, 0u};
        if (live) {
            const uint4* at = reinterpret_cast<const uint4*>(x + size_t(n) * in + t * LQ_TILE_COLS) + r;
            uint4 w;
            if constexpr (SRC == LqXSource::Global) w = __ldg(at);
            else w = *at;
            v[0] = w.x; v[1] = w.y; v[2] = w.z; v[3] = w.w;
        }
        lq_transpose4x4(v, r);
        float sum = 0.0f;  // half 0: the quad's values m = 0..3; half 1 carries that on over m = 4..7
#pragma unroll
        for (int k = 0; k < 4; ++k) sum += __uint_as_float(v[k] << 16) + __uint_as_float(v[k] & 0xffff0000u);
        const float first = __shfl_xor_sync(0xffffffffu, sum, 4);
        if (half) {
            sum = first;
#pragma unroll
            for (int k = 0; k < 4; ++k) sum += __uint_as_float(v[k] << 16) + __uint_as_float(v[k] & 0xffff0000u);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // the tile's four quads (half 1's lanes)
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (live) {
            put_x(2 * ((n * tiles + t) * 4 + q) + half, make_uint4(v[0], v[1], v[2], v[3]));
            if (half && q == 0) put_start(t * 8 + n, -centre * sum);
        }
    }
    for (int i = thread; i < tiles * 8; i += threads)  // tokens past the staged ones
        if ((i & 7) >= tokens) put_start(i, 0.0f);
    if (thread < LQ_ZERO_X_BYTES / 16) put_x(tokens * tiles * 8 + thread, make_uint4(0u, 0u, 0u, 0u));
}

}  // namespace lampo
