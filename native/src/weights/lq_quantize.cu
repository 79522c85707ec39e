// lq_quantize.cu - the LQ format made and unmade on the GPU (contracts in lq_quantize.h; the format
// is models/quant/layout.py, the quantizer models/quant/quantizer.py).
//
// lq_quantize_kernel<BITS>: a warp quantizes two consecutive tiles (tile index 2w and 2w + 1 in
// storage order, so the warp's output is one contiguous run of bytes): lane 16h + r takes row r of
// tile 2w + h, one group of 64 weights, into registers (eight 16-byte loads) and runs the
// quantizer's search on it alone (a thread per group: the search's sums need no shuffles, and
// numpy's summation order is a plain loop). The chosen codes are staged in shared memory as
// [row][64] bytes; each lane then gathers its mma fragment of each tile (layout.py: lane t owns rows
// t/4 and t/4 + 8, columns 16j + 2(t%4) + {0, 1, 8, 9}) and stores its 16 bytes of low nibbles
// and its high-bit word(s), so each region of a tile is written by one coalesced warp store; every
// lane stores its own row's scale.
//
// The search, per group (quantizer._search_groups, every step the same IEEE operation as numpy's):
//   peak = the first weight of largest magnitude (signed);
//   for end in (-m, m - 1), then stretch in quantizer.STRETCH (fp32), m = 2^(BITS-1):
//     first = peak / (end * stretch)                                   fp32
//     q = clip(rint(w / first), -m, m - 1) (0 where first == 0)        fp32 division, ties to even
//     refit = sum(w q) / sum(q q) (first where sum(q q) == 0)          fp64
//     scale = fp32(fp16(clip(refit, -65504, 65504)))                   one rounding, fp64 -> fp16
//     q = the codes of scale as above;  err = sum((w - q scale)^2)     fp32 difference, fp64 squares
//     kept if err < the best err so far (strictly: the first of equal errors wins)
//   codes = the codes of the kept scale + m.
// Exactness: the engine builds with --use_fast_math, so the fp32 steps go through PTX without
// .ftz (ieee_* of ieee_f32.cuh: subnormals kept as numpy keeps them) and comparisons with zero use bits.
// sum(w q) is exact in fp64 for bf16 weights (each product has <= 8 + 6 significant bits, the
// weights with q != 0 lie within a factor 64 of |peak|, so the 64 products and their sum fit in 30
// bits), hence equal to numpy's einsum whatever the order; sum(q q) is an exact integer. The
// squares (w - q scale)^2 of fp32 differences are exact in fp64 and are summed in numpy's pairwise
// order for 64 doubles: eight running sums r[i % 8] in index order, then
// ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)).
//
// lq_dequantize_kernel<BITS>: a warp per tile; each lane decodes its fragment registers with the
// GEMV's reader (lq_a_register: two bf16 values 2^BITS + code), forms (value - centre) * scale
// (exact in fp32) rounded to bf16, stages the tile in shared memory and the warp stores the 16 rows
// with 16-byte stores.
//
// lq_fill_random_kernel: a thread per 32-bit word of the packed bytes (grid-stride): a code word is
// random_bits(seed, word index) (random_hash.cuh), a scale word two fp16 scales from the same hash.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/ieee_f32.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/lq_tile.cuh"
#include "kernels/matmul.cuh"
#include "weights/lq_quantize.h"
#include "weights/random_hash.cuh"

namespace lampo {
namespace {

constexpr int kWarps = 4;  // per block, in every kernel here
constexpr int kRowPad = 4;  // bytes after each 64-byte staged row of codes (bank-conflict-free lanes)

// ---- fp64 steps and zero tests, whatever the build's fast-math flags (fp32 steps: ieee_f32.cuh) --

// volatile: keeps the compiler from hoisting the refit's 64 loop-invariant conversions out of the
// candidate loop (128 more registers, 230 in all: half the occupancy).
__device__ __forceinline__ double to_f64(float a) {
    double r;
    asm volatile("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ bool is_zero(float a) { return (__float_as_uint(a) << 1) == 0u; }

// quantizer.STRETCH (np.linspace(0.84, 1.0, 9) in fp32), exactly.
__constant__ float kStretch[9] = {0x1.ae147ap-1f, 0x1.b851ecp-1f, 0x1.c28f5cp-1f, 0x1.ccccccp-1f, 0x1.d70a3ep-1f,
                                  0x1.e147aep-1f, 0x1.eb851ep-1f, 0x1.f5c290p-1f, 0x1.0p+0f};

// ---- the search -----------------------------------------------------------------------------------

// One group of 64 bf16 weights in registers: word p holds weights 2p (low half) and 2p + 1.
struct Group {
    uint32_t w[32];
    __device__ __forceinline__ float at(int i) const {
        return __uint_as_float(i % 2 ? w[i / 2] & 0xFFFF0000u : w[i / 2] << 16);
    }
};

// The signed level clip(rint(x / scale), -m, m - 1) of x for a non-zero scale (the conversion to
// int rounds to nearest even and saturates, as rint then clip does).
template <int BITS>
__device__ __forceinline__ int level(float x, float scale) {
    constexpr int m = 1 << (BITS - 1);
    return min(max(__float2int_rn(ieee_div(x, scale)), -m), m - 1);
}

// sum((w - q scale)^2) over the group for the codes q of `scale` (fp32 of an fp16), in numpy's order.
template <int BITS>
__device__ __forceinline__ double squared_error(const Group& g, float scale) {
    const bool zero = is_zero(scale);
    double r[8];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        const int q = zero ? 0 : level<BITS>(g.at(i), scale);
        const double d = to_f64(ieee_sub(g.at(i), ieee_mul(float(q), scale)));
        r[i % 8] = i < 8 ? __dmul_rn(d, d) : __fma_rn(d, d, r[i % 8]);  // d * d is exact
    }
    return __dadd_rn(__dadd_rn(__dadd_rn(r[0], r[1]), __dadd_rn(r[2], r[3])),
                     __dadd_rn(__dadd_rn(r[4], r[5]), __dadd_rn(r[6], r[7])));
}

// The least-squares scale for the codes of `first`, rounded to fp16 (clamped to the finite range).
template <int BITS>
__device__ __forceinline__ __half refit_scale(const Group& g, float first) {
    double wq = 0.0;
    int qq = 0;
    if (!is_zero(first)) {
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            const int q = level<BITS>(g.at(i), first);
            qq += q * q;
            wq = __fma_rn(to_f64(g.at(i)), double(q), wq);  // exact: see the file comment
        }
    }
    const double refit = qq > 0 ? __ddiv_rn(wq, double(qq)) : to_f64(first);
    return __double2half(fmin(fmax(refit, -65504.0), 65504.0));
}

// The group's fp16 scale by the quantizer's search.
template <int BITS>
__device__ __forceinline__ __half search_scale(const Group& g) {
    constexpr int m = 1 << (BITS - 1);
    float peak = g.at(0);
    uint32_t peak_abs = __float_as_uint(peak) & 0x7FFFFFFFu;
#pragma unroll
    for (int i = 1; i < 64; ++i) {
        const uint32_t a = __float_as_uint(g.at(i)) & 0x7FFFFFFFu;
        if (a > peak_abs) {
            peak_abs = a;
            peak = g.at(i);
        }
    }
    double best_err = INFINITY;
    __half best = __ushort_as_half(0);
#pragma unroll 1
    for (int c = 0; c < 18; ++c) {
        const float end = c < 9 ? float(-m) : float(m - 1);
        const __half scale = refit_scale<BITS>(g, ieee_div(peak, ieee_mul(end, kStretch[c % 9])));
        const double err = squared_error<BITS>(g, __half2float(scale));
        if (err < best_err) {
            best_err = err;
            best = scale;
        }
    }
    return best;
}

// The staged codes of (row, col) and (row, col + 1), col even, as the low two bytes of a word
// (64 codes + kRowPad bytes per staged row).
__device__ __forceinline__ uint32_t staged_pair(const uint8_t* tile_codes, int row, int col) {
    return *reinterpret_cast<const uint16_t*>(tile_codes + row * (64 + kRowPad) + col);
}

// Stores one tile from its staged codes [16][64 + kRowPad]: lane t's low-nibble words and high-bit
// words (layout.py: element 2s of register s of step j at nibble s, 2s + 1 at nibble s + 4; their
// fifth / sixth bits at i / 2i' (+16) of the high word(s), i = 4j + s, i' = i % 8). The scales
// are stored by their rows' lanes.
template <int BITS>
__device__ __forceinline__ void store_tile(const uint8_t* tile_codes, int lane, uint8_t* tile) {
    const int g = lane / 4, quad = lane % 4;
    uint32_t low[4] = {0u, 0u, 0u, 0u}, high[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {  // register s: row g (+8 for odd s), columns 16j + 2quad (+8 for s >= 2), +1
            const uint32_t pair = staged_pair(tile_codes, g + 8 * (s % 2), 16 * j + 2 * quad + 8 * (s / 2));
            const uint32_t c0 = pair & 0xFFu, c1 = pair >> 8, i = 4 * j + s;
            low[j] |= (c0 & 0xFu) << (4 * s) | (c1 & 0xFu) << (4 * s + 16);
            if constexpr (BITS == 5) high[0] |= (c0 >> 4) << i | (c1 >> 4) << (i + 16);
            if constexpr (BITS == 6) high[i / 8] |= (c0 >> 4) << (2 * (i % 8)) | (c1 >> 4) << (2 * (i % 8) + 16);
        }
    }
    reinterpret_cast<uint4*>(tile)[lane] = make_uint4(low[0], low[1], low[2], low[3]);
    if constexpr (BITS == 5) reinterpret_cast<uint32_t*>(tile + 512)[lane] = high[0];
    if constexpr (BITS == 6) reinterpret_cast<uint2*>(tile + 512)[lane] = make_uint2(high[0], high[1]);
}

template <int BITS>
__global__ void __launch_bounds__(kWarps * 32)
    lq_quantize_kernel(const bf16* __restrict__ W, int cols, size_t tiles, uint8_t* __restrict__ packed) {
    constexpr int m = 1 << (BITS - 1), TILE_BYTES = lq_tile_bytes(BITS), STAGED = 16 * (64 + kRowPad);
    __shared__ __align__(16) uint8_t staged[kWarps][2][STAGED];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, row = lane % 16;
    const size_t first_tile = (size_t(blockIdx.x) * kWarps + warp) * 2, tile = first_tile + half;
    if (first_tile >= tiles) return;  // warp-uniform
    if (tile < tiles) {
        const size_t col_tiles = size_t(cols) / 64, strip = tile / col_tiles, col0 = (tile % col_tiles) * 64;
        const uint4* src = reinterpret_cast<const uint4*>(W + (strip * 16 + row) * size_t(cols) + col0);
        Group g;
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            const uint4 x = __ldcs(src + v);  // read once
            g.w[4 * v] = x.x;
            g.w[4 * v + 1] = x.y;
            g.w[4 * v + 2] = x.z;
            g.w[4 * v + 3] = x.w;
        }
        const __half scale = search_scale<BITS>(g);
        const float s = __half2float(scale);
        const bool zero = is_zero(s);
        uint32_t* codes = reinterpret_cast<uint32_t*>(staged[warp][half] + row * (64 + kRowPad));
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            uint32_t word = 0u;
#pragma unroll
            for (int b = 0; b < 4; ++b)
                word |= uint32_t((zero ? 0 : level<BITS>(g.at(4 * k + b), s)) + m) << (8 * b);
            codes[k] = word;
        }
        reinterpret_cast<__half*>(packed + (tile + 1) * TILE_BYTES - 32)[row] = scale;
    }
    __syncwarp();
    for (int h = 0; h < 2 && first_tile + h < tiles; ++h)
        store_tile<BITS>(staged[warp][h], lane, packed + (first_tile + h) * TILE_BYTES);
}

// ---- dequantize -------------------------------------------------------------------------------------

template <int BITS>
__global__ void __launch_bounds__(kWarps * 32)
    lq_dequantize_kernel(const uint8_t* __restrict__ packed, int cols, size_t tiles, bf16* __restrict__ W) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS), ROW_WORDS = 36;  // 32 bf16 pairs + 4: conflict-free lanes
    __shared__ __align__(16) uint32_t staged[kWarps][16 * ROW_WORDS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
    const size_t tile = size_t(blockIdx.x) * kWarps + warp;
    if (tile >= tiles) return;  // warp-uniform
    const uint8_t* t = packed + tile * TILE_BYTES;
    const LqLaneCodes codes = lq_lane_codes<BITS>(t, lane);
    const __half* scales = reinterpret_cast<const __half*>(t + TILE_BYTES - 32);
    const float scale[2] = {__half2float(scales[g]), __half2float(scales[g + 8])};
    const uint32_t magic = lq_code_magic<BITS>();
    constexpr float centre = lq_code_centre<BITS>();
    uint32_t* mine = staged[warp];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {  // register s: row g (+8 for odd s), columns 16j + 2quad (+8 for s >= 2), +1
            const uint32_t r = lq_a_register<BITS>(codes.low[j], codes.high, j, s, magic);
            const float lo = (__uint_as_float(r << 16) - centre) * scale[s % 2];
            const float hi = (__uint_as_float(r & 0xFFFF0000u) - centre) * scale[s % 2];
            const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
            mine[(g + 8 * (s % 2)) * ROW_WORDS + 8 * j + quad + 4 * (s / 2)] = *reinterpret_cast<const uint32_t*>(&v);
        }
    }
    __syncwarp();
    const size_t col_tiles = size_t(cols) / 64, strip = tile / col_tiles, col0 = (tile % col_tiles) * 64;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // 16 rows x 8 vectors of 16 bytes
        const int v = 32 * k + lane, row = v / 8, part = v % 8;
        const uint4 x = *reinterpret_cast<const uint4*>(mine + row * ROW_WORDS + 4 * part);
        reinterpret_cast<uint4*>(W + (strip * 16 + row) * size_t(cols) + col0)[part] = x;
    }
}

// ---- random fill ------------------------------------------------------------------------------------

__global__ void lq_fill_random_kernel(uint32_t* __restrict__ words, size_t n_words, int tile_words, float scale,
                                      uint64_t seed) {
    const int code_words = tile_words - 8;  // the last 8 words of a tile are its 16 scales
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t w = size_t(blockIdx.x) * blockDim.x + threadIdx.x; w < n_words; w += stride) {
        const uint64_t bits = random_bits(seed, w);
        if (int(w % tile_words) < code_words) {
            words[w] = uint32_t(bits);
        } else {  // two uniforms in [-1, 1) from bits 40..63 and 16..39
            const float u0 = float(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;
            const float u1 = float((bits >> 16) & 0xFFFFFFu) * (2.0f / 16777216.0f) - 1.0f;
            const __half2 s = __floats2half2_rn(scale * (1.0f + 0.1f * u0), scale * (1.0f + 0.1f * u1));
            words[w] = *reinterpret_cast<const uint32_t*>(&s);
        }
    }
}

// ---- launchers --------------------------------------------------------------------------------------

// The tiles of a [rows, cols] matrix at `bits`, after the checks every function here makes.
size_t checked_tiles(const char* op, int rows, int cols, int bits, const void* a, const void* b) {
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(rows > 0 && rows % LQ_TILE_ROWS == 0 && cols > 0 && cols % LQ_TILE_COLS == 0, op,
            "W must be [16n, 64k], got [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    require(reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0, op,
            "the matrix and the packed bytes must be 16-byte aligned");
    return size_t(rows / LQ_TILE_ROWS) * size_t(cols / LQ_TILE_COLS);
}

unsigned blocks_for(size_t items) { return unsigned((items + kWarps - 1) / kWarps); }

}  // namespace

void lq_quantize(const bf16* W, int rows, int cols, int bits, uint8_t* packed, cudaStream_t stream) {
    const char* op = "lq_quantize";
    const size_t tiles = checked_tiles(op, rows, cols, bits, W, packed);
    const auto kernel = bits == 4 ? lq_quantize_kernel<4> : bits == 5 ? lq_quantize_kernel<5> : lq_quantize_kernel<6>;
    kernel<<<blocks_for((tiles + 1) / 2), kWarps * 32, 0, stream>>>(W, cols, tiles, packed);
    LAMPO_CHECK_LAUNCH(op);
}

void lq_dequantize(const uint8_t* packed, int rows, int cols, int bits, bf16* W, cudaStream_t stream) {
    const char* op = "lq_dequantize";
    const size_t tiles = checked_tiles(op, rows, cols, bits, W, packed);
    const auto kernel =
        bits == 4 ? lq_dequantize_kernel<4> : bits == 5 ? lq_dequantize_kernel<5> : lq_dequantize_kernel<6>;
    kernel<<<blocks_for(tiles), kWarps * 32, 0, stream>>>(packed, cols, tiles, W);
    LAMPO_CHECK_LAUNCH(op);
}

void lq_fill_random(uint8_t* packed, int rows, int cols, int bits, float weight_std, uint64_t seed,
                    cudaStream_t stream) {
    const char* op = "lq_fill_random";
    checked_tiles(op, rows, cols, bits, packed, packed);
    const double levels = double(1 << bits), scale = double(weight_std) / std::sqrt((levels * levels - 1.0) / 12.0);
    require(std::isfinite(scale) && scale > 0.0 && scale * 1.1 <= 65504.0, op,
            "weight_std must be > 0 with scales that fit fp16, got " + std::to_string(weight_std));
    const size_t n_words = lq_packed_bytes(rows, cols, bits) / 4;
    const unsigned blocks = unsigned(std::min<size_t>((n_words + 255) / 256, 16384));
    lq_fill_random_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(packed), n_words,
                                                     lq_tile_bytes(bits) / 4, float(scale), seed);
    LAMPO_CHECK_LAUNCH(op);
}

}  // namespace lampo
