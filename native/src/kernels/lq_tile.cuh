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
// GEMVs stream a warp's tiles straight into registers (lq_stream_tiles): groups of LQ_GROUP tiles,
// the next group's loads issued before the current group's products, so 4-8 tiles per warp are
// in flight; each lane loads its own 16 bytes of codes (+ 4 / 8 of high bits) and 2 + 2 of scales.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/bf16_vec.cuh"
#include "kernels/matmul.cuh"
#include "kernels/mma_sync.cuh"
#include "kernels/ops.h"

namespace lampo {

constexpr int LQ_GROUP = 4;  // tiles per register group of lq_stream_tiles

__host__ __device__ constexpr int lq_tile_bytes(int bits) { return 512 + 128 * (bits - 4) + 2 * LQ_TILE_ROWS; }
// x of one token in fragment order (lq_stage.cuh) and its tiles' start values, in bytes; the
// zero fragment that lanes past the last token read.
__host__ __device__ constexpr int lq_x_bytes(int in) { return in * 2; }
constexpr int LQ_ZERO_X_BYTES = 128;
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

// Streaming reads of immutable packed weights used once (the read-only path, not kept in L1).
__device__ __forceinline__ uint32_t lq_load_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 lq_load_u2(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint16_t lq_load_u16(const void* p) {
    uint16_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
    return v;
}

// A lane's share of one tile, in registers: its code words and the fp16 scales of its rows g, g + 8
// (kept as loaded; converted where the products use them, so no instruction waits on the load).
template <int BITS>
struct LqTileRegs {
    LqLaneCodes codes;
    uint16_t scale_lo, scale_hi;
};

template <int BITS>
__device__ __forceinline__ void lq_load_tile(LqTileRegs<BITS>& r, const uint8_t* tile, int lane) {
    const uint4 low = load_stream(tile + 16 * lane);
    r.codes = {{low.x, low.y, low.z, low.w}, {0u, 0u}};
    if constexpr (BITS == 5) r.codes.high[0] = lq_load_u32(tile + 512 + 4 * lane);
    if constexpr (BITS == 6) {
        const uint2 h = lq_load_u2(tile + 512 + 8 * lane);
        r.codes.high[0] = h.x;
        r.codes.high[1] = h.y;
    }
    const uint8_t* scales = tile + lq_tile_bytes(BITS) - 2 * LQ_TILE_ROWS + 2 * (lane >> 2);
    r.scale_lo = lq_load_u16(scales);
    r.scale_hi = lq_load_u16(scales + 16);
}

// acc (the lane's C fragment: [0..1] row g, tokens 2quad, 2quad + 1; [2..3] row g + 8) +=
// scale_row * sum over the tile's 64 columns of (code - 2^(BITS-1)) * x, x_frag the lane's
// two 16-byte B fragments of this tile, start its tokens' start values.
template <int BITS>
__device__ __forceinline__ void lq_tile_mma(const LqTileRegs<BITS>& tile, const uint4* x_frag, float2 start,
                                            float (&acc)[4]) {
    const uint4 xb[2] = {x_frag[0], x_frag[1]};
    const uint32_t b[8] = {xb[0].x, xb[0].y, xb[0].z, xb[0].w, xb[1].x, xb[1].y, xb[1].z, xb[1].w};
    const uint32_t magic = lq_code_magic<BITS>();
    float sums[4] = {start.x, start.y, start.x, start.y};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t a[4];
#pragma unroll
        for (int s = 0; s < 4; ++s) a[s] = lq_a_register<BITS>(tile.codes.low[j], tile.codes.high, j, s, magic);
        mma_bf16_16816(sums, a, b[2 * j], b[2 * j + 1]);
    }
    const float scale_lo = __half2float(__ushort_as_half(tile.scale_lo));
    const float scale_hi = __half2float(__ushort_as_half(tile.scale_hi));
    acc[0] = fmaf(scale_lo, sums[0], acc[0]);
    acc[1] = fmaf(scale_lo, sums[1], acc[1]);
    acc[2] = fmaf(scale_hi, sums[2], acc[2]);
    acc[3] = fmaf(scale_hi, sums[3], acc[3]);
}

// A lane's share of a tile that lies in shared memory (the LQ GEMV's ring, matmul/gemv_lq.cu).
template <int BITS>
__device__ __forceinline__ void lq_read_tile(LqTileRegs<BITS>& r, const uint8_t* tile, int lane) {
    r.codes = lq_lane_codes<BITS>(tile, lane);
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(tile + lq_tile_bytes(BITS) - 2 * LQ_TILE_ROWS);
    r.scale_lo = scales[lane >> 2];
    r.scale_hi = scales[(lane >> 2) + 8];
}

// LQ_GROUP consecutive tiles in a lane's registers.
template <int BITS>
struct LqGroup {
    LqTileRegs<BITS> tile[LQ_GROUP];
};

// Requests the first min(count, LQ_GROUP) tiles at `first` (none when count <= 0; FULL: count ==
// LQ_GROUP, no checks), from global memory, or SHARED: from shared memory (lq_read_tile). Weights
// are immutable: a kernel may request its first group before the PDL wait.
template <int BITS, bool FULL = false, bool SHARED = false>
__device__ __forceinline__ void lq_load_group(LqGroup<BITS>& group, const uint8_t* first, int count, int lane) {
#pragma unroll
    for (int u = 0; u < LQ_GROUP; ++u) {
        if (!(FULL || u < count)) continue;
        if constexpr (SHARED) lq_read_tile<BITS>(group.tile[u], first + u * lq_tile_bytes(BITS), lane);
        else lq_load_tile<BITS>(group.tile[u], first + u * lq_tile_bytes(BITS), lane);
    }
}

// x as lq_stage_x_from (lq_stage.cuh) staged it, seen from one lane: its B fragments of tile 0
// and the step to the next tile (0 for a lane past the last token, which reads the zero fragment),
// and its tokens' start values of tile 0 (tile t at start[4 t]).
struct LqLaneX {
    const uint4* frag;
    int frag_step;
    const float2* start;
};
__device__ __forceinline__ LqLaneX lq_lane_x(const uint4* xs, const float* start, int tiles, int tokens, int lane) {
    const int token = lane >> 2, quad = lane & 3;
    const bool live = token < tokens;
    const uint4* zero = xs + tokens * tiles * 8;  // LQ_ZERO_X_BYTES after the staged tokens
    return {live ? xs + (token * tiles * 4 + quad) * 2 : zero, live ? 8 : 0,
            reinterpret_cast<const float2*>(start) + quad};  // tokens 2quad, 2quad + 1
}

// acc += the products of tiles [t, t + count) held in `group` (FULL: count == LQ_GROUP, no checks).
template <int BITS, bool FULL>
__device__ __forceinline__ void lq_mma_group(const LqGroup<BITS>& group, const uint4* frag, int frag_step,
                                             const float2* start, int count, float (&acc)[4]) {
#pragma unroll
    for (int u = 0; u < LQ_GROUP; ++u)
        if (FULL || u < count) lq_tile_mma<BITS>(group.tile[u], frag + u * frag_step, start[4 * u], acc);
}

// acc += the strip's tiles [tbeg, tend) times x, in tile order; `first` holds the group that
// lq_load_group(first, src, tend - tbeg, lane) requested, src the address of tile tbeg. While one
// group's products run, the next group's loads are in flight.
template <int BITS>
__device__ __forceinline__ void lq_stream_tiles(LqGroup<BITS>& first, const uint8_t* src, const LqLaneX& x,
                                                int tbeg, int tend, int lane, float (&acc)[4]) {
    constexpr int GROUP_BYTES = LQ_GROUP * lq_tile_bytes(BITS);
    const int step = x.frag_step;
    const uint4* frag = x.frag + tbeg * step;
    const float2* start = x.start + 4 * tbeg;
    LqGroup<BITS> second;
    int left = tend - tbeg;  // tiles not yet multiplied; `first` holds the next ones
    // Whole pairs of groups: the loads of one group go out before the other's products.
    for (; left >= 2 * LQ_GROUP; left -= 2 * LQ_GROUP) {
        lq_load_group<BITS, true>(second, src + GROUP_BYTES, LQ_GROUP, lane);
        lq_mma_group<BITS, true>(first, frag, step, start, LQ_GROUP, acc);
        lq_load_group(first, src + 2 * GROUP_BYTES, left - 2 * LQ_GROUP, lane);
        lq_mma_group<BITS, true>(second, frag + LQ_GROUP * step, step, start + 4 * LQ_GROUP, LQ_GROUP, acc);
        src += 2 * GROUP_BYTES;
        frag += 2 * LQ_GROUP * step;
        start += 8 * LQ_GROUP;
    }
    if (left > LQ_GROUP) {  // `first` is full, a partial group follows
        lq_load_group(second, src + GROUP_BYTES, left - LQ_GROUP, lane);
        lq_mma_group<BITS, true>(first, frag, step, start, LQ_GROUP, acc);
        lq_mma_group<BITS, false>(second, frag + LQ_GROUP * step, step, start + 4 * LQ_GROUP, left - LQ_GROUP, acc);
    } else {
        lq_mma_group<BITS, false>(first, frag, step, start, left, acc);
    }
}

}  // namespace lampo
