// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// A warp owns a strip of 16 rows and a slice of its tiles (KS slices per strip, KS in {1, 2, 4, 8},
// chosen so the grid has >= 4 blocks per SM); its tiles stream through its LqRing, each one
// multiplied on the tensor cores by lq_tile_mma against x, which the block stages once in
// fragment order (token g = lane / 4; zeros past T). KS slices of a strip are summed through
// shared memory. Every weight byte is read once and serves all T tokens. Launched with PDL: the
// first tiles' copies are issued before the wait (weights are immutable).
#include <algorithm>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_tile.cuh"
#include "kernels/matmul.cuh"

namespace lampo {
namespace {

constexpr int LQ_WARPS = 8;
constexpr size_t LQ_PARTIAL_BYTES = sizeof(float) * LQ_WARPS * 32 * 4;  // the static shared partial sums

// Dynamic shared memory of a launch: the warps' rings, the tiles' start values, x of `tokens`
// tokens plus the zero token (at most 8 in all).
size_t lq_smem_bytes(int bits, int in, int tokens) {
    return size_t(LQ_WARPS) * LQ_STAGES * lq_tile_bytes(bits) + lq_start_bytes(in) +
           size_t(std::min(tokens + 1, 8)) * lq_x_bytes(in);
}

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;  // [T, in]
    void* y;        // [T, out]
    int T, out, in, ks_count;
};

template <int BITS, class OutT>
__global__ void __launch_bounds__(LQ_WARPS * 32, 3) gemv_lq_kernel(const GemvLqParams p) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    extern __shared__ uint4 lq_smem[];
    __shared__ float partial[LQ_WARPS][32][4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, quad = lane & 3;
    const int strips_per_block = LQ_WARPS / p.ks_count;
    const int strip = blockIdx.x * strips_per_block + warp / p.ks_count, slice = warp % p.ks_count;
    const int tiles = p.in / LQ_TILE_COLS;
    const bool strip_live = strip < p.out / LQ_TILE_ROWS;
    const int tbeg = int(int64_t(tiles) * slice / p.ks_count), tend = int(int64_t(tiles) * (slice + 1) / p.ks_count);
    float* start = reinterpret_cast<float*>(lq_smem + LQ_WARPS * LQ_STAGES * TILE_BYTES / 16);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);

    LqRing<BITS> ring(lq_smem + warp * LQ_STAGES * TILE_BYTES / 16,
                      p.W + (size_t(strip_live ? strip : 0) * tiles + tbeg) * TILE_BYTES,
                      strip_live ? tend - tbeg : 0, lane);
    ring.issue_first();  // weights only: before the wait
    pdl_begin();
    lq_stage_x(xs, start, p.x, p.T, p.in, lq_code_centre<BITS>(), threadIdx.x, blockDim.x);
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    lq_stream_tiles(ring, xs, start, tiles, p.T, tbeg, tend, lane, acc);

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
