// lq_interleave.cu - one half of a gate|up block placed into its row-interleaved form
// (lq_quantize.h: lq_place_half; models/quant/layout.py interleave_halves is the specification).
//
// A gate|up block [rows, cols] (gate rows 0..rows/2 - 1, then the up rows) is kept with its halves'
// rows interleaved by 8: block row 16 j + r is gate row 8 j + r, block row 16 j + 8 + r up row
// 8 j + r (r < 8). A part strip s (16 rows of one half) thus fills the gate (half 0) or up (half 1)
// rows of block strips 2 s (its rows 0..7) and 2 s + 1 (its rows 8..15).
// In a tile's code words, lane g's rows g and g + 8 sit in complementary bit positions
// (layout.py): the low nibbles in 0x0F0F0F0F / 0xF0F0F0F0, the fifth bits in 0x55555555 /
// 0xAAAAAAAA, the fifth and sixth bits in 0x33333333 / 0xCCCCCCCC, so moving 8 rows from one row
// position to the other is a mask and a shift of 4, 1 or 2 bits of the same word; the scales are
// 8 fp16 per 8 rows (4 words). One thread per block word it writes: the word's bits of the other
// half are read and kept, so the two halves may be placed in either order.
#include <algorithm>
#include <string>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_tile.cuh"
#include "kernels/matmul.cuh"
#include "weights/lq_quantize.h"

namespace lampo {
namespace {

// Bit positions of rows 0..7 in a code word of area `w` (tile words: 128 low-nibble words, then the
// high-bit words), and the shift that moves them to rows 8..15.
template <int BITS>
__device__ __forceinline__ void lq_row_half_bits(int w, uint32_t& mask, int& shift) {
    if (w < 128 || BITS == 4) {
        mask = 0x0F0F0F0Fu;
        shift = 4;
    } else if (BITS == 5) {
        mask = 0x55555555u;
        shift = 1;
    } else {
        mask = 0x33333333u;
        shift = 2;
    }
}

// Thread i: part strip s, its row half h (0: rows 0..7), tile c, block word w (code words, then the
// 4 scale words of the part's rows) of block strip 2 (first + s) + h.
template <int BITS>
__global__ void lq_place_half_kernel(const uint32_t* __restrict__ part, int strips, int tiles, int first, int half,
                                     uint32_t* __restrict__ block) {
    constexpr int TILE_WORDS = lq_tile_bytes(BITS) / 4, CODE_WORDS = TILE_WORDS - 8, WORDS = CODE_WORDS + 4;
    const size_t n = size_t(strips) * 2 * tiles * WORDS;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const int w = int(i % WORDS);
        const size_t tile = i / WORDS;  // (s, h, c)
        const int c = int(tile % tiles), h = int(tile / tiles % 2), s = int(tile / tiles / 2);
        const uint32_t* src = part + (size_t(s) * tiles + c) * TILE_WORDS;
        uint32_t* dst = block + ((size_t(2 * (first + s) + h)) * tiles + c) * TILE_WORDS;
        if (w >= CODE_WORDS) {  // scales: rows 8 h .. 8 h + 7 of the part to rows 8 half .. of the block
            const int k = w - CODE_WORDS;
            dst[CODE_WORDS + 4 * half + k] = src[CODE_WORDS + 4 * h + k];
            continue;
        }
        uint32_t low_rows;
        int shift;
        lq_row_half_bits<BITS>(w, low_rows, shift);
        const uint32_t from = src[w] & (h ? low_rows << shift : low_rows);
        const uint32_t moved = h == half ? from : h ? from >> shift : from << shift;
        const uint32_t keep = half ? low_rows : low_rows << shift;  // the other half's rows in the block
        dst[w] = (dst[w] & keep) | moved;
    }
}

}  // namespace

void lq_place_half(const uint8_t* part, int first_strip, int strips, int cols, int bits, int half, uint8_t* block,
                   cudaStream_t stream) {
    const char* op = "lq_place_half";
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(cols > 0 && cols % LQ_TILE_COLS == 0 && strips > 0 && first_strip >= 0 && (half == 0 || half == 1), op,
            "needs cols a multiple of 64, strips > 0, first_strip >= 0 and half 0 or 1, got cols " +
                std::to_string(cols) + ", strips " + std::to_string(strips) + ", first_strip " +
                std::to_string(first_strip) + ", half " + std::to_string(half));
    require(reinterpret_cast<uintptr_t>(part) % 16 == 0 && reinterpret_cast<uintptr_t>(block) % 16 == 0, op,
            "the part and the block must be 16-byte aligned");
    const int tiles = cols / LQ_TILE_COLS;
    const size_t n = size_t(strips) * 2 * tiles * (lq_tile_bytes(bits) / 4 - 4);
    const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, 16384));
    const auto kernel = bits == 4 ? lq_place_half_kernel<4> : bits == 5 ? lq_place_half_kernel<5> : lq_place_half_kernel<6>;
    kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const uint32_t*>(part), strips, tiles, first_strip, half,
                                       reinterpret_cast<uint32_t*>(block));
    LAMPO_CHECK_LAUNCH(op);
}

}  // namespace lampo
