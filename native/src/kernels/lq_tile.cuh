// lq_tile.cuh - reading tiles of the LQ weight format on the tensor cores (models/quant/layout.py
// is the specification; docs/weight-format.md), shared by the LQ GEMV (matmul/gemv_lq.cu) and the
// LQ expert GEMVs (moe/moe_experts_lq.cu).
//
// A tile is 16 rows x 64 columns of W at BITS in {4, 5, 6}: W[n, k] = scale[n] * (code - 2^(BITS-1)).
// Its first 512 bytes are the A fragments of mma.sync.m16n8k16 in lane order; lane t (g = t / 4,
// quad = t % 4) turns register s of k16 step j into two bf16 values 2^BITS + code with
//   ((word_j >> (4s - P)) & (0x000F000F << P)) | magic     (P = 7 - BITS: the code in the top
// mantissa bits of a bf16 with exponent BITS, exact), plus one shift and LOP3 for the fifth / sixth
// bits. The B operand is x in fragment order (lq_stage.cuh), and each tile's mma chain starts from
// -(2^BITS + 2^(BITS-1)) * (sum of the tile's x): the tensor cores sum the exact products
// (code - 2^(BITS-1)) * x in fp32, which the lane scales by its rows' fp16 scales (lq_tile_mma).
// Tiles stream through a per-warp ring in shared memory (LqRing, cp.async, 5 in flight).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/matmul.cuh"
#include "kernels/mma_sync.cuh"
#include "kernels/ops.h"

namespace lampo {

constexpr int LQ_STAGES = 6;  // ring slots per warp (5 tiles in flight)

__host__ __device__ constexpr int lq_tile_bytes(int bits) { return 512 + 128 * (bits - 4) + 2 * LQ_TILE_ROWS; }
// x of one token in fragment order (lq_stage.cuh) and its tiles' start values, in bytes.
__host__ __device__ constexpr int lq_x_bytes(int in) { return in * 2; }
__host__ __device__ constexpr int lq_start_bytes(int in) { return in / LQ_TILE_COLS * 8 * 4; }

__device__ __forceinline__ uint32_t lq_shift_right(uint32_t v, int by) { return by >= 0 ? v >> by : v << -by; }

// (a & MASK) | c in one LOP3 (c in a register: LOP3 takes one immediate).
template <uint32_t MASK>
__device__ __forceinline__ uint32_t lq_and_or(uint32_t a, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(MASK), "r"(c));
    return r;
}

template <int BITS>
__host__ __device__ constexpr uint32_t lq_code_magic() { return (uint32_t(127 + BITS) << 7) * 0x10001u; }
template <int BITS>
__host__ __device__ constexpr float lq_code_centre() { return float(3 << (BITS - 1)); }  // 2^BITS + 2^(BITS-1)

// Fragment register s of k16 step j from the lane's low-nibble word and high-bit words.
template <int BITS>
__device__ __forceinline__ uint32_t lq_a_register(uint32_t word, const uint32_t (&high)[2], int j, int s,
                                                  uint32_t magic) {
    constexpr int P = 7 - BITS;
    uint32_t r = lq_and_or<(0x000F000Fu << P)>(lq_shift_right(word, 4 * s - P), magic);
    const int i = 4 * j + s;
    if constexpr (BITS == 5) r = lq_and_or<0x00400040u>(lq_shift_right(high[0], i - 6), r);
    if constexpr (BITS == 6) r = lq_and_or<0x00600060u>(lq_shift_right(high[i / 8], 2 * (i % 8) - 5), r);
    return r;
}

// One warp's ring of LQ_STAGES tile slots in shared memory, filled by cp.async (16 bytes per lane
// and copy, one commit group per tile) from `count` consecutive tiles at `src`; slots past the
// run are zero-filled and never read. Use: issue_first() (may precede the PDL wait: weights are
// immutable), then per tile next() -> its bytes, then release().
template <int BITS>
struct LqRing {
    static constexpr int TILE_BYTES = lq_tile_bytes(BITS), TILE_VECS = TILE_BYTES / 16;
    uint4* slots;         // LQ_STAGES * TILE_BYTES bytes
    const uint8_t* src;   // the next tile to copy, + 16 * lane
    const uint8_t* safe;  // a valid address for the zero-filling copies
    int left, fill = 0, read = 0, lane;

    __device__ LqRing(uint4* slots_, const uint8_t* first_tile, int count, int lane_)
        : slots(slots_), src(first_tile + 16 * lane_), safe(first_tile), left(count), lane(lane_) {}

    __device__ void issue() {
        const bool live = left > 0;
        uint4* dst = slots + fill * TILE_VECS + lane;
        cp_async_16(dst, live ? src : safe, live);
        if (lane + 32 < TILE_VECS) cp_async_16(dst + 32, live ? src + 512 : safe, live);
        cp_async_commit();
        src += TILE_BYTES;
        fill = fill + 1 == LQ_STAGES ? 0 : fill + 1;
        --left;
    }
    __device__ void issue_first() {
        for (int k = 0; k < LQ_STAGES - 1; ++k) issue();
    }
    __device__ const uint8_t* next() {
        cp_async_wait<LQ_STAGES - 2>();
        __syncwarp();
        return reinterpret_cast<const uint8_t*>(slots + read * TILE_VECS);
    }
    __device__ void release() {
        __syncwarp();  // every lane has read the slot before it is refilled
        issue();
        read = read + 1 == LQ_STAGES ? 0 : read + 1;
    }
    __device__ void drain() { cp_async_wait<0>(); }
};

// A lane's code words of a tile: its low-nibble word of each k16 step and its fifth / sixth-bit
// words, as lq_a_register reads them.
struct LqLaneCodes {
    uint32_t low[4];
    uint32_t high[2];
};
template <int BITS>
__device__ __forceinline__ LqLaneCodes lq_lane_codes(const uint8_t* tile, int lane) {
    const uint4 low = *reinterpret_cast<const uint4*>(tile + 16 * lane);
    LqLaneCodes c = {{low.x, low.y, low.z, low.w}, {0u, 0u}};
    if constexpr (BITS == 5) c.high[0] = reinterpret_cast<const uint32_t*>(tile + 512)[lane];
    if constexpr (BITS == 6) {
        const uint2 h = reinterpret_cast<const uint2*>(tile + 512)[lane];
        c.high[0] = h.x;
        c.high[1] = h.y;
    }
    return c;
}

// acc (the lane's C fragment: [0..1] row g, tokens 2quad, 2quad + 1; [2..3] row g + 8) +=
// scale_row * sum over the tile's 64 columns of (code - 2^(BITS-1)) * x, x_frag the lane's
// two 16-byte B fragments of this tile, start its tokens' start values.
template <int BITS>
__device__ __forceinline__ void lq_tile_mma(const uint8_t* tile, int lane, const uint4* x_frag, float2 start,
                                            float (&acc)[4]) {
    const int g = lane >> 2;
    const LqLaneCodes codes = lq_lane_codes<BITS>(tile, lane);
    const __half* scales = reinterpret_cast<const __half*>(tile + lq_tile_bytes(BITS) - 2 * LQ_TILE_ROWS);
    const float scale_lo = __half2float(scales[g]), scale_hi = __half2float(scales[g + 8]);
    const uint4 xb[2] = {x_frag[0], x_frag[1]};
    const uint32_t b[8] = {xb[0].x, xb[0].y, xb[0].z, xb[0].w, xb[1].x, xb[1].y, xb[1].z, xb[1].w};
    const uint32_t magic = lq_code_magic<BITS>();
    float sums[4] = {start.x, start.y, start.x, start.y};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t a[4];
#pragma unroll
        for (int s = 0; s < 4; ++s) a[s] = lq_a_register<BITS>(codes.low[j], codes.high, j, s, magic);
        mma_bf16_16816(sums, a, b[2 * j], b[2 * j + 1]);
    }
    acc[0] = fmaf(scale_lo, sums[0], acc[0]);
    acc[1] = fmaf(scale_lo, sums[1], acc[1]);
    acc[2] = fmaf(scale_hi, sums[2], acc[2]);
    acc[3] = fmaf(scale_hi, sums[3], acc[3]);
}

// acc += the tiles [tbeg, tend) that `ring` streams, times x as lq_stage_x_from (lq_stage.cuh) staged it at xs / start
// for `tokens` tokens of width `in`/64 = `tiles` tiles (the lane's token g = lane / 4, the zero
// token past them); the ring is drained afterwards.
template <int BITS>
__device__ __forceinline__ void lq_stream_tiles(LqRing<BITS>& ring, const uint4* xs, const float* start, int tiles,
                                                int tokens, int tbeg, int tend, int lane, float (&acc)[4]) {
    const uint4* x_frag = xs + (min(lane >> 2, tokens) * tiles * 4 + (lane & 3)) * 2;
    const float2* tile_start = reinterpret_cast<const float2*>(start) + (lane & 3);  // tokens 2quad, 2quad + 1
    for (int t = tbeg; t < tend; ++t) {
        lq_tile_mma<BITS>(ring.next(), lane, x_frag + t * 8, tile_start[4 * t], acc);
        ring.release();
    }
    ring.drain();
}

}  // namespace lampo
