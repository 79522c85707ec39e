// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// A warp owns a strip of 16 rows and a slice of its tiles (KS slices per strip, KS in {1, 2, 4, 8},
// chosen so the grid has >= 4 blocks per SM); its tiles stream into registers (lq_stream_tiles),
// each one multiplied on the tensor cores by lq_tile_mma against x, which the block stages once in
// fragment order (token g = lane / 4; zeros past T). KS slices of a strip are summed through
// shared memory. Every weight byte is read once and serves all T tokens. Launched with PDL: the
// first group of tiles is requested before the wait (weights are immutable).
//
// The decode step's two folded forms (T = 1; linear.h), as gemv.cu's for BF16 weights:
// - LqIn::NormedResidual (gemv_lq_normed): every block builds x = bf16(rmsnorm(residual) * (1 + w))
//   itself (norm_row.cuh: add_rmsnorm's thread mapping and order, so the values are rmsnorm's bits)
//   in shared memory and stages it from there (lq_stage.cuh); block 0 may also write it out. The
//   norm weight is copied in before the wait; the residual row is kept in the x staging area
//   between the norm's two passes. The grid and the sums are gemv_lq's: the result is bit for bit
//   rmsnorm followed by gemv_lq.
// - LqOut::AddToResidual (gemv_lq_add_residual): residual[row] += float(bf16(y[row])), the rounding
//   of a bf16 output added by add_rmsnorm; the rows' residual values are read right after the wait.
#include <algorithm>
#include <type_traits>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_stage.cuh"
#include "kernels/matmul.cuh"
#include "kernels/norm_row.cuh"

namespace lampo {
namespace {

constexpr int LQ_WARPS = 8;
constexpr size_t LQ_PARTIAL_BYTES = sizeof(float) * LQ_WARPS * 32 * 4;  // the static shared partial sums
static_assert(LQ_WARPS * 32 == NORM_THREADS, "the folded norm runs on the GEMV block");

enum class LqIn { X, NormedResidual };
enum class LqOut { Store, AddToResidual };

// Shared memory for x: `tokens` staged tokens and the zero fragment; NormedResidual (one token):
// room for the fp32 residual row that the norm keeps there before x is staged.
__host__ __device__ size_t lq_x_area_bytes(int in, int tokens, LqIn input) {
    const size_t staged = size_t(tokens) * lq_x_bytes(in) + LQ_ZERO_X_BYTES;
    return input == LqIn::NormedResidual && sizeof(float) * in > staged ? sizeof(float) * in : staged;
}

// Dynamic shared memory of a launch: the tiles' start values, the x area; NormedResidual: the norm
// weight / normed row after it.
size_t lq_smem_bytes(int in, int tokens, LqIn input) {
    return lq_start_bytes(in) + lq_x_area_bytes(in, tokens, input) +
           (input == LqIn::NormedResidual ? lq_x_bytes(in) : 0);
}

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;      // LqIn::X: [T, in]
    void* y;            // [T, out] OutT, or the fp32 residual [out] for AddToResidual
    int T, out, in, ks_count;
    ResidualNorm norm;  // LqIn::NormedResidual
};

template <int BITS, class OutT, LqIn IN, LqOut OUT>
__global__ void __launch_bounds__(LQ_WARPS * 32, 2) gemv_lq_kernel(const GemvLqParams p) {
    static_assert(OUT == LqOut::Store || std::is_same_v<OutT, float>, "residual add: an fp32 row");
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
    float* start = reinterpret_cast<float*>(lq_smem);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);
    // NormedResidual (T = 1): the norm weight, overwritten in place by the normed row, after the x
    // area; the fp32 residual row (in * 4 bytes) lives in the x area until x is staged.
    bf16* row = reinterpret_cast<bf16*>(xs + lq_x_area_bytes(p.in, 1, IN) / 16);
    if constexpr (IN == LqIn::NormedResidual) {
        for (int i = threadIdx.x; i < p.in / 8; i += blockDim.x) cp_async_16(row + 8 * i, p.norm.weight + 8 * i, true);
        cp_async_commit();
    }

    const int count = strip_live ? tend - tbeg : 0;
    const uint8_t* src = p.W + (size_t(strip_live ? strip : 0) * tiles + tbeg) * TILE_BYTES;
    LqGroup<BITS> first;
    lq_load_group(first, src, count, lane);  // weights only: before the wait
    pdl_begin();
    // AddToResidual: the writing lanes' rows g and g + 8 (token 0), read now, off the kernel's tail.
    const bool writes = slice == 0 && strip_live;
    float residual_in[2] = {0.0f, 0.0f};
    if constexpr (OUT == LqOut::AddToResidual) {
        if (writes && quad == 0) {
            const float* residual = static_cast<const float*>(p.y) + strip * LQ_TILE_ROWS + g;
            residual_in[0] = __ldcg(residual);
            residual_in[1] = __ldcg(residual + 8);
        }
    }
    if constexpr (IN == LqIn::NormedResidual) {
        // The norm weight, visible to every thread after norm_row_inv's block sum.
        cp_async_wait<0>();
        float* r_row = reinterpret_cast<float*>(xs);
        const float inv = norm_row_inv(p.norm.residual, nullptr, r_row, p.in, p.norm.eps);
        norm_row_scale<true>(r_row, inv, row, row, p.in);  // a thread reads its weights, then writes them over
        __syncthreads();
        if (p.norm.normed_out && blockIdx.x == 0)
            for (int i = threadIdx.x; i < p.in / 8; i += blockDim.x)
                reinterpret_cast<uint4*>(p.norm.normed_out)[i] = reinterpret_cast<const uint4*>(row)[i];
        lq_stage_x_from<LqXSource::Shared>(xs, start, row, 1, p.in, lq_code_centre<BITS>(), threadIdx.x, blockDim.x);
    } else {
        lq_stage_x_from<LqXSource::Global>(xs, start, p.x, p.T, p.in, lq_code_centre<BITS>(), threadIdx.x,
                                           blockDim.x);
    }
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    lq_stream_tiles(first, src, lq_lane_x(xs, start, tiles, p.T, lane), tbeg, tbeg + count, lane, acc);

#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
    __syncthreads();
    if (!writes) return;
    // C fragment: acc[0..1] row g, tokens 2quad, 2quad + 1; acc[2..3] row g + 8, same tokens.
    OutT* y = static_cast<OutT*>(p.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = 2 * quad + (i & 1), row_i = strip * LQ_TILE_ROWS + g + 8 * (i >> 1);
        if (token >= p.T) continue;
        float sum = 0.0f;
        for (int k = 0; k < p.ks_count; ++k) sum += partial[warp + k][lane][i];
        if constexpr (OUT == LqOut::AddToResidual)
            y[row_i] = residual_in[i >> 1] + __bfloat162float(__float2bfloat16(sum));
        else if constexpr (std::is_same_v<OutT, float>) y[size_t(token) * p.out + row_i] = sum;
        else y[size_t(token) * p.out + row_i] = __float2bfloat16(sum);
    }
}

template <int BITS, class OutT, LqIn IN, LqOut OUT>
void launch_gemv_lq(const char* op, const GemvLqParams& p, int blocks, cudaStream_t stream) {
    const size_t smem = lq_smem_bytes(p.in, p.T, IN);
    if (smem + LQ_PARTIAL_BYTES > 48 * 1024) allow_dynamic_smem(gemv_lq_kernel<BITS, OutT, IN, OUT>, smem, op);
    launch_pdl(op, gemv_lq_kernel<BITS, OutT, IN, OUT>, blocks, LQ_WARPS * 32, smem, stream, p);
}

// The checks, the grid and the launches of every form; p.x / p.y point at token 0 (p.T tokens).
template <class OutT, LqIn IN = LqIn::X, LqOut OUT = LqOut::Store>
void run_gemv_lq(const char* op, int bits, const GemvLqParams& p, cudaStream_t stream) {
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(p.out > 0 && p.out % LQ_TILE_ROWS == 0 && p.in > 0 && p.in % LQ_TILE_COLS == 0, op,
            "W must be [16n, 64k], got [" + std::to_string(p.out) + ", " + std::to_string(p.in) + "]");
    require(p.T >= 1 && p.T <= GEMV_MAX_T, op, "T must be 1..8, got " + std::to_string(p.T));
    const int strips = p.out / LQ_TILE_ROWS, tiles = p.in / LQ_TILE_COLS, wave = 4 * sm_count();
    int ks = 1;
    while (ks < LQ_WARPS && ceil_div(strips, LQ_WARPS / ks) < wave && tiles / (2 * ks) >= 2) ks *= 2;
    const int blocks = ceil_div(strips, LQ_WARPS / ks);
    // x lives in shared memory: tokens go in groups that fit (one group unless
    // T * in is large, e.g. the 27B down-projection with more than 6 tokens).
    const size_t room = smem_optin_bytes() - LQ_PARTIAL_BYTES;
    require(lq_smem_bytes(p.in, 1, IN) <= room, op, "in = " + std::to_string(p.in) + " is too wide");
    int group = p.T;
    while (lq_smem_bytes(p.in, group, IN) > room) --group;
    for (int t0 = 0; t0 < p.T; t0 += group) {
        GemvLqParams q = p;
        q.x = p.x ? p.x + size_t(t0) * p.in : nullptr;
        q.y = static_cast<OutT*>(p.y) + size_t(t0) * p.out;
        q.T = std::min(group, p.T - t0);
        q.ks_count = ks;
        switch (bits) {
            case 4: launch_gemv_lq<4, OutT, IN, OUT>(op, q, blocks, stream); break;
            case 5: launch_gemv_lq<5, OutT, IN, OUT>(op, q, blocks, stream); break;
            default: launch_gemv_lq<6, OutT, IN, OUT>(op, q, blocks, stream); break;
        }
    }
}

}  // namespace

size_t lq_packed_bytes(int out, int in, int bits) {
    return size_t(out / LQ_TILE_ROWS) * size_t(in / LQ_TILE_COLS) * size_t(lq_tile_bytes(bits));
}

template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    run_gemv_lq<OutT>("gemv_lq", bits, {W, x, y, T, out, in, 1, {}}, stream);
}

template <class OutT>
void gemv_lq_normed(const uint8_t* W, int bits, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream) {
    require(x.residual && x.weight, "gemv_lq_normed", "needs the residual row and the norm weight");
    run_gemv_lq<OutT, LqIn::NormedResidual>("gemv_lq_normed", bits, {W, nullptr, y, 1, out, in, 1, x}, stream);
}

void gemv_lq_add_residual(const uint8_t* W, int bits, const bf16* x, float* residual, int out, int in,
                          cudaStream_t stream) {
    run_gemv_lq<float, LqIn::X, LqOut::AddToResidual>("gemv_lq_add_residual", bits,
                                                      {W, x, residual, 1, out, in, 1, {}}, stream);
}

template void gemv_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);
template void gemv_lq_normed<bf16>(const uint8_t*, int, const ResidualNorm&, bf16*, int, int, cudaStream_t);
template void gemv_lq_normed<float>(const uint8_t*, int, const ResidualNorm&, float*, int, int, cudaStream_t);

}  // namespace lampo
