// lq_element.cuh - one weight of an LQ tile by its (row, column), for the kernels that read single
// rows of an LQ matrix (the embedding gather) rather than whole tiles on the tensor cores
// (lq_tile.cuh). models/quant/layout.py is the specification: element (r, c) of a tile belongs to
// lane t = 4 (r % 8) + (c % 8) / 2 at k16 step j = c / 16 as element e = 4 [c % 16 >= 8] +
// 2 [r >= 8] + c % 2 of its fragment, i.e. register s = e / 2, half h = e % 2: low nibble at bit
// 4 s + 16 h of the lane's word j; BITS = 5: the fifth bit at bit i + 16 h of the lane's high
// word (i = 4 j + s); BITS = 6: bits 4-5 at bit 2 (i % 8) + 16 h of high word i / 8.
#pragma once

#include <cstdint>
#include <cuda_fp16.h>

#include "kernels/lq_tile.cuh"

namespace lampo {

// scale(r) * (code(r, c) - 2^(BITS-1)) of the tile at `tile`, r < 16, c < 64.
template <int BITS>
__device__ __forceinline__ float lq_element(const uint8_t* tile, int r, int c) {
    const int w = c & 15, j = c >> 4;
    const int lane = 4 * (r & 7) + ((w & 7) >> 1);
    const int s = 2 * (w >> 3) + (r >> 3), half = 16 * (c & 1);
    const uint32_t word = reinterpret_cast<const uint32_t*>(tile + 16 * lane)[j];
    uint32_t code = (word >> (4 * s + half)) & 0xFu;
    const int i = 4 * j + s;
    if constexpr (BITS == 5) {
        const uint32_t high = reinterpret_cast<const uint32_t*>(tile + 512)[lane];
        code |= ((high >> (i + half)) & 1u) << 4;
    }
    if constexpr (BITS == 6) {
        const uint32_t high = reinterpret_cast<const uint32_t*>(tile + 512)[2 * lane + (i >> 3)];
        code |= ((high >> (2 * (i & 7) + half)) & 3u) << 4;
    }
    const float scale = __half2float(reinterpret_cast<const __half*>(tile + lq_tile_bytes(BITS) - 2 * LQ_TILE_ROWS)[r]);
    return scale * (float(code) - float(1 << (BITS - 1)));
}

}  // namespace lampo
