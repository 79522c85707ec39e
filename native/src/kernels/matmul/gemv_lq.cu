// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (models/quant/layout.py is the specification; docs/weight-format.md):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// A warp owns a strip of 16 rows and a slice of its tiles (KS slices per strip, KS in {1, 2, 4, 8},
// chosen so the grid has >= 4 blocks per SM). The tiles stream through a per-warp ring in shared
// memory (cp.async, 5 tiles in flight per warp). A tile's bytes are the A fragments of
// mma.sync.m16n8k16 in lane order: lane t reads its 16 bytes of low nibbles (plus its 4 / 8 bytes of
// fifth / sixth bits) and builds register s of k16 step j as
//   ((word_j >> (4s - P)) & (0x000F000F << P)) | magic   (P = 7 - BITS: two bf16 values)
// with the code's bits moved to the top of the mantissa of a bf16 with exponent BITS: 2^BITS + code,
// exact (one shift and one LOP3 per register, one more of each for the fifth and sixth bits). The
// B operand is x (token g = lane / 4; zeros past T), staged in shared memory in fragment order.
// Each tile's mma chain starts from -(2^BITS + 2^(BITS-1)) * (sum of the tile's x), so the tensor
// cores sum the exact products (code - 2^(BITS-1)) * x in fp32; the sums are scaled by the lane's
// two row scales into the fp32 accumulators. KS slices of a
// strip are summed through shared memory. Every weight byte is read once and serves all T tokens.
// Launched with PDL: the first tiles' copies are issued before the wait (weights are immutable).
#include <algorithm>

#include "kernels/launch_utils.cuh"
#include "kernels/matmul.cuh"
#include "kernels/mma_sync.cuh"

namespace lampo {
namespace {

constexpr int LQ_WARPS = 8;
constexpr int LQ_STAGES = 6;  // tiles per warp in its shared-memory ring (5 in flight)
constexpr int LQ_TILE_ROWS = 16;
constexpr int LQ_TILE_COLS = 64;
constexpr size_t LQ_PARTIAL_BYTES = sizeof(float) * LQ_WARPS * 32 * 4;  // the static shared partial sums

__host__ __device__ constexpr int lq_tile_bytes(int bits) { return 512 + 128 * (bits - 4) + 2 * LQ_TILE_ROWS; }

// Dynamic shared memory of a launch: the warps' rings, the tiles' start values, x of `tokens`
// tokens plus the zero token (at most 8 in all).
size_t lq_smem_bytes(int bits, int in, int tokens) {
    return size_t(LQ_WARPS) * LQ_STAGES * lq_tile_bytes(bits) + size_t(in / LQ_TILE_COLS) * 32 +
           size_t(std::min(tokens + 1, 8)) * in * 2;
}

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;  // [T, in]
    void* y;        // [T, out]
    int T, out, in, ks_count;
};

__device__ __forceinline__ uint32_t shift_right(uint32_t v, int by) { return by >= 0 ? v >> by : v << -by; }

// (a & mask) | c in one LOP3 (c in a register: LOP3 takes one immediate).
template <uint32_t MASK>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(MASK), "r"(c));
    return r;
}

// The codes become bf16 2^BITS + code: the code's bits land in mantissa bits P..6 (P = 7 - BITS)
// of a number with exponent BITS, exact. `magic` holds that exponent in both halves.
template <int BITS>
__host__ __device__ constexpr uint32_t code_magic() { return (uint32_t(127 + BITS) << 7) * 0x10001u; }
template <int BITS>
__host__ __device__ constexpr float code_centre() { return float(3 << (BITS - 1)); }  // 2^BITS + 2^(BITS-1)

// Fragment register s of k16 step j from the lane's low-nibble word and high-bit words.
template <int BITS>
__device__ __forceinline__ uint32_t a_register(uint32_t word, const uint32_t (&high)[2], int j, int s, uint32_t magic) {
    constexpr int P = 7 - BITS;
    uint32_t r = and_or<(0x000F000Fu << P)>(shift_right(word, 4 * s - P), magic);
    const int i = 4 * j + s;
    if constexpr (BITS == 5) r = and_or<0x00400040u>(shift_right(high[0], i - 6), r);
    if constexpr (BITS == 6) r = and_or<0x00600060u>(shift_right(high[i / 8], 2 * (i % 8) - 5), r);
    return r;
}

// x in shared memory in B-fragment order: for token n, tile t and quad q, 16 bf16 = the b0, b1
// pairs of k16 steps 0..3 (b0: columns 16j + 2q, +1; b1: 16j + 2q + 8, +9), 32 bytes, so a lane
// reads its tile's B fragments with two 16-byte loads. Token T (when T < 8) is all zeros: the
// fragment of the lanes past the last token. start[t][n] = -centre * (sum of tile t's 64 x values
// of token n), zero for n >= T: the start value of the tile's sums. One thread per (n, t, q); the
// four quads of a tile are adjacent lanes and add their sums by shuffles.
__device__ __forceinline__ void stage_x(uint4* xs, float* start, const bf16* x, int T, int in, float centre) {
    const int tiles = in / LQ_TILE_COLS, items = 4 * tiles * min(T + 1, 8);
    for (int base = 0; base < items; base += blockDim.x) {  // every lane of a warp takes part in the shuffles
        const int i = base + threadIdx.x, q = i & 3, t = (i >> 2) % tiles, n = (i >> 2) / tiles;
        uint32_t v[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        float sum = 0.0f;
        if (i < items && n < T) {
            const uint32_t* row = reinterpret_cast<const uint32_t*>(x + size_t(n) * in + t * LQ_TILE_COLS) + q;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                v[2 * j] = __ldg(row + 8 * j);
                v[2 * j + 1] = __ldg(row + 8 * j + 4);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) sum += __uint_as_float(v[k] << 16) + __uint_as_float(v[k] & 0xffff0000u);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (i < items) {
            xs[2 * i] = make_uint4(v[0], v[1], v[2], v[3]);
            xs[2 * i + 1] = make_uint4(v[4], v[5], v[6], v[7]);
            if (q == 0 && n < 8) start[t * 8 + n] = -centre * sum;
        }
    }
    for (int i = threadIdx.x; i < tiles * 8; i += blockDim.x)  // tokens past the staged ones
        if ((i & 7) > T) start[i] = 0.0f;
}

// The tiles stream through a ring of LQ_STAGES slots per warp in shared memory (cp.async, 16 bytes
// per lane and copy): bytes in flight do not cost registers.
template <int BITS, class OutT>
__global__ void __launch_bounds__(LQ_WARPS * 32, 3) gemv_lq_kernel(const GemvLqParams p) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS), TILE_VECS = TILE_BYTES / 16;
    extern __shared__ uint4 lq_smem[];
    __shared__ float partial[LQ_WARPS][32][4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, quad = lane & 3;
    const int strips_per_block = LQ_WARPS / p.ks_count;
    const int strip = blockIdx.x * strips_per_block + warp / p.ks_count, slice = warp % p.ks_count;
    const int tiles = p.in / LQ_TILE_COLS;
    const bool strip_live = strip < p.out / LQ_TILE_ROWS;
    const int tbeg = int(int64_t(tiles) * slice / p.ks_count), tend = int(int64_t(tiles) * (slice + 1) / p.ks_count);
    uint4* ring = lq_smem + warp * LQ_STAGES * TILE_VECS;
    float* start = reinterpret_cast<float*>(lq_smem + LQ_WARPS * LQ_STAGES * TILE_VECS);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);

    // Copies of the next tile into the next slot (zeros past the slice), one group per tile.
    const uint8_t* src = p.W + (size_t(strip_live ? strip : 0) * tiles + tbeg) * TILE_BYTES + 16 * lane;
    int fill = 0, left = strip_live ? tend - tbeg : 0;
    auto issue = [&] {
        const bool live = left > 0;
        uint4* dst = ring + fill * TILE_VECS + lane;
        cp_async_16(dst, live ? src : p.W, live);
        if (lane + 32 < TILE_VECS) cp_async_16(dst + 32, live ? src + 512 : p.W, live);
        cp_async_commit();
        src += TILE_BYTES;
        fill = fill + 1 == LQ_STAGES ? 0 : fill + 1;
        --left;
    };
    for (int k = 0; k < LQ_STAGES - 1; ++k) issue();  // weights only: before the wait
    pdl_begin();
    stage_x(xs, start, p.x, p.T, p.in, code_centre<BITS>());
    __syncthreads();

    const uint4* x_frag = xs + (min(g, p.T) * tiles * 4 + quad) * 2;
    const float2* tile_start = reinterpret_cast<const float2*>(start) + quad;  // tokens 2quad, 2quad + 1
    const uint32_t magic = code_magic<BITS>();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int slot = 0;
    for (int t = tbeg; t < tend; ++t) {
        cp_async_wait<LQ_STAGES - 2>();
        __syncwarp();
        const uint8_t* tile = reinterpret_cast<const uint8_t*>(ring + slot * TILE_VECS);
        const uint4 low = *reinterpret_cast<const uint4*>(tile + 16 * lane);
        uint32_t high[2] = {0u, 0u};
        if constexpr (BITS == 5) high[0] = reinterpret_cast<const uint32_t*>(tile + 512)[lane];
        if constexpr (BITS == 6) {
            const uint2 h = reinterpret_cast<const uint2*>(tile + 512)[lane];
            high[0] = h.x;
            high[1] = h.y;
        }
        const __half* scales = reinterpret_cast<const __half*>(tile + TILE_BYTES - 2 * LQ_TILE_ROWS);
        const float scale_lo = __half2float(scales[g]), scale_hi = __half2float(scales[g + 8]);
        const uint4 xb[2] = {x_frag[t * 8], x_frag[t * 8 + 1]};
        const uint32_t b[8] = {xb[0].x, xb[0].y, xb[0].z, xb[0].w, xb[1].x, xb[1].y, xb[1].z, xb[1].w};
        const uint32_t words[4] = {low.x, low.y, low.z, low.w};
        const float2 s0 = tile_start[4 * t];
        float sums[4] = {s0.x, s0.y, s0.x, s0.y};  // the centring: sum (2^BITS + code - centre) * x
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint32_t a[4];
#pragma unroll
            for (int s = 0; s < 4; ++s) a[s] = a_register<BITS>(words[j], high, j, s, magic);
            mma_bf16_16816(sums, a, b[2 * j], b[2 * j + 1]);
        }
        acc[0] = fmaf(scale_lo, sums[0], acc[0]);
        acc[1] = fmaf(scale_lo, sums[1], acc[1]);
        acc[2] = fmaf(scale_hi, sums[2], acc[2]);
        acc[3] = fmaf(scale_hi, sums[3], acc[3]);
        __syncwarp();  // every lane has read the slot before it is refilled
        issue();
        slot = slot + 1 == LQ_STAGES ? 0 : slot + 1;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
    __syncthreads();
    if (slice != 0 || !strip_live) return;
    // C fragment: acc[0..1] row g, tokens 2quad, 2quad + 1; acc[2..3] row g + 8, same tokens.
    OutT* y = static_cast<OutT*>(p.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = 2 * quad + (i & 1), row = strip * LQ_TILE_ROWS + g + 8 * (i >> 1);
        if (token >= p.T) continue;
        float sum = 0.0f;
        for (int k = 0; k < p.ks_count; ++k) sum += partial[warp + k][lane][i];
        if constexpr (std::is_same_v<OutT, float>) y[size_t(token) * p.out + row] = sum;
        else y[size_t(token) * p.out + row] = __float2bfloat16(sum);
    }
}

template <int BITS, class OutT>
void launch_gemv_lq(const GemvLqParams& p, int blocks, cudaStream_t stream) {
    const size_t smem = lq_smem_bytes(BITS, p.in, p.T);
    if (smem + LQ_PARTIAL_BYTES > 48 * 1024) allow_dynamic_smem(gemv_lq_kernel<BITS, OutT>, smem, "gemv_lq");
    launch_pdl("gemv_lq", gemv_lq_kernel<BITS, OutT>, blocks, LQ_WARPS * 32, smem, stream, p);
}

}  // namespace

size_t lq_packed_bytes(int out, int in, int bits) {
    return size_t(out / LQ_TILE_ROWS) * size_t(in / LQ_TILE_COLS) * size_t(lq_tile_bytes(bits));
}

template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    require(bits >= 4 && bits <= 6, "gemv_lq", "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(out > 0 && out % LQ_TILE_ROWS == 0 && in > 0 && in % LQ_TILE_COLS == 0, "gemv_lq",
            "W must be [16n, 64k], got [" + std::to_string(out) + ", " + std::to_string(in) + "]");
    require(T >= 1 && T <= GEMV_MAX_T, "gemv_lq", "T must be 1..8, got " + std::to_string(T));
    const int strips = out / LQ_TILE_ROWS, tiles = in / LQ_TILE_COLS, wave = 4 * sm_count();
    int ks = 1;
    while (ks < LQ_WARPS && ceil_div(strips, LQ_WARPS / ks) < wave && tiles / (2 * ks) >= 2) ks *= 2;
    const int blocks = ceil_div(strips, LQ_WARPS / ks);
    // x lives in shared memory beside the rings: tokens go in groups that fit (one group unless
    // T * in is large, e.g. the 27B down-projection with more than 5 tokens).
    const size_t room = smem_optin_bytes() - LQ_PARTIAL_BYTES;
    require(lq_smem_bytes(bits, in, 1) <= room, "gemv_lq", "in = " + std::to_string(in) + " is too wide");
    int group = T;
    while (lq_smem_bytes(bits, in, group) > room) --group;
    for (int t0 = 0; t0 < T; t0 += group) {
        const GemvLqParams p{W, x + size_t(t0) * in, y + size_t(t0) * out, std::min(group, T - t0), out, in, ks};
        switch (bits) {
            case 4: launch_gemv_lq<4, OutT>(p, blocks, stream); break;
            case 5: launch_gemv_lq<5, OutT>(p, blocks, stream); break;
            default: launch_gemv_lq<6, OutT>(p, blocks, stream); break;
        }
    }
}

template void gemv_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);

}  // namespace lampo
