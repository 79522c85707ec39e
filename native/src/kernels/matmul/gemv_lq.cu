// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// Strip slices: a strip (16 rows, all tiles of `in`) is cut into `slices` runs of consecutive
// tiles (1, 2, 4 or 8, from the matrix's shape alone: lq_slices), one warp per slice, the slices
// of a strip in one block of LQ_WARPS warps. A warp streams its tiles through registers in groups
// of LQ_GROUP (the next group's loads in flight while the current group's products run on the
// tensor cores; the first group requested before the PDL wait, weights being immutable) and reads
// its B fragments of x straight from x's rows (lq_x_frags: L1-resident after a block's first
// loads), so no block stages x and nothing waits on a barrier before the products; the codes'
// offset is subtracted by a second mma per k16 step (lq_tile_mma_direct). The slices' C fragments
// meet in the block's shared memory and the strip's first warp adds them in slice order
// (deterministic), so no sum leaves its block. The split depends on the shape alone: every token
// of a window gets the bits of a one-token product, in every input and output form.
//
// The decode step's two folded forms (T = 1; linear.h), as gemv.cu's for BF16 weights:
// - LqIn::NormedResidual (gemv_lq_normed): every block builds x = bf16(rmsnorm(residual) * (1 + w))
//   itself (norm_row.cuh: add_rmsnorm's thread mapping and order, so the values are rmsnorm's bits)
//   in shared memory and its warps read their fragments from there; block 0 may also write it
//   out. The norm weight is copied in before the wait; the residual row stays in shared memory
//   between the norm's two passes. The result is bit for bit rmsnorm followed by gemv_lq.
// - LqOut::AddToResidual (gemv_lq_add_residual): residual[row] += float(bf16(y[row])), the rounding
//   of a bf16 output added by add_rmsnorm.
// gemv_lq_parts stores the bf16 rows as RowParts (linear.h) instead of one [T, out] matrix.
#include <type_traits>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_stage.cuh"
#include "kernels/matmul.cuh"
#include "kernels/norm_row.cuh"

namespace lampo {
namespace {

constexpr int LQ_WARPS = 8;  // a block: its strips' tiles dealt out to 8 warps
static_assert(LQ_WARPS * 32 == NORM_THREADS, "the folded norm runs on the GEMV block");

enum class LqIn { X, NormedResidual };
enum class LqOut { Store, AddToResidual };

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;      // LqIn::X: [T, in]
    void* y;            // [T, out] OutT, or the fp32 residual [out] for AddToResidual
    int T, out, in;
    int block_strips;   // strips per block: lq_block_strips(out)
    ResidualNorm norm;  // LqIn::NormedResidual
    RowParts parts;     // n > 0: the bf16 rows stored as parts (linear.h), not at y
};

// rows g and g + 8 of `strip` for tokens 2 quad, 2 quad + 1 from the lane's C fragment `v`.
template <class OutT, LqOut OUT>
__device__ __forceinline__ void lq_store_rows(const GemvLqParams& p, int strip, int lane, const float (&v)[4]) {
    const int g = lane >> 2, quad = lane & 3;
    OutT* y = static_cast<OutT*>(p.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = 2 * quad + (i & 1), row = strip * LQ_TILE_ROWS + g + 8 * (i >> 1);
        if (token >= p.T) continue;
        if constexpr (OUT == LqOut::AddToResidual) y[row] = __ldcg(y + row) + __bfloat162float(__float2bfloat16(v[i]));
        else if constexpr (std::is_same_v<OutT, float>) y[size_t(token) * p.out + row] = v[i];
        else if (bf16* at = p.parts.n ? p.parts.at(token, row) : y + size_t(token) * p.out + row)
            *at = __float2bfloat16(v[i]);
    }
}

// Dynamic shared memory of the folded norm: the fp32 residual row, then the norm weight that the
// normed row overwrites.
size_t lq_norm_smem_bytes(int in) { return size_t(in) * (sizeof(float) + sizeof(bf16)); }

// A block's tiles dealt out to its warps: warp w takes [first(w), first(w + 1)) of the block's
// `total` tiles (strip-major), owner(i) is the warp holding tile i.
struct LqDeal {
    int total;
    __device__ int first(int w) const { return int(int64_t(total) * w / LQ_WARPS); }
    __device__ int owner(int i) const { return int((int64_t(i + 1) * LQ_WARPS - 1) / total); }
};

template <int BITS, class OutT, LqIn IN, LqOut OUT>
__global__ void __launch_bounds__(LQ_WARPS * 32, 2) gemv_lq_kernel(const GemvLqParams p) {
    static_assert(OUT == LqOut::Store || std::is_same_v<OutT, float>, "residual add: an fp32 row");
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    extern __shared__ uint4 lq_smem[];
    __shared__ float4 pieces[LQ_WARPS][2][32];  // a warp's sums of its first / last strip where cut
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = p.in / LQ_TILE_COLS, strip0 = blockIdx.x * p.block_strips;
    const LqDeal deal{min(p.block_strips, p.out / LQ_TILE_ROWS - strip0) * tiles};
    const int begin = deal.first(warp), end = deal.first(warp + 1);
    int i = begin, t = begin % tiles;  // the next tile: block-wide index and column in its strip
    const uint8_t* src = p.W + (size_t(strip0) * tiles + begin) * TILE_BYTES;  // a warp's range is contiguous
    LqGroup<BITS> a, b;
    lq_load_group(a, src, min(LQ_GROUP, min(tiles - t, end - i)), lane);  // before the wait
    float* r_row = reinterpret_cast<float*>(lq_smem);  // NormedResidual: the residual row,
    bf16* row = reinterpret_cast<bf16*>(r_row + p.in);  // then the norm weight / normed row
    if constexpr (IN == LqIn::NormedResidual) {
        for (int k = threadIdx.x; k < p.in / 8; k += blockDim.x) cp_async_16(row + 8 * k, p.norm.weight + 8 * k, true);
        cp_async_commit();
    }
    pdl_begin();
    if constexpr (IN == LqIn::NormedResidual) {
        cp_async_wait<0>();  // the norm weight: visible to every thread after norm_row_inv's block sum
        const float inv = norm_row_inv(p.norm.residual, nullptr, r_row, p.in, p.norm.eps);
        norm_row_scale<true>(r_row, inv, row, row, p.in);  // a thread reads its weights, then writes them over
        __syncthreads();
        if (p.norm.normed_out && blockIdx.x == 0)
            for (int k = threadIdx.x; k < p.in / 8; k += blockDim.x)
                reinterpret_cast<uint4*>(p.norm.normed_out)[k] = reinterpret_cast<const uint4*>(row)[k];
    }
    float* start = reinterpret_cast<float*>(lq_smem + (IN == LqIn::NormedResidual ? p.in * 6 / 16 : 0));
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);
    if constexpr (IN == LqIn::NormedResidual)
        lq_stage_x_from<LqXSource::Shared>(xs, start, row, 1, p.in, lq_code_centre<BITS>(), threadIdx.x, blockDim.x);
    else
        lq_stage_x_from<LqXSource::Global>(xs, start, p.x, p.T, p.in, lq_code_centre<BITS>(), threadIdx.x, blockDim.x);
    __syncthreads();
    const LqLaneX x = lq_lane_x(xs, start, tiles, p.T, lane);

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // One register group (tiles of one strip): request the next one (the rest of this strip, or
    // the next strip's first), multiply this one; at a strip's end store its rows, or keep the
    // warp's piece where the strip is cut.
    auto step = [&](LqGroup<BITS>& cur, LqGroup<BITS>& next) {
        const int count = min(LQ_GROUP, min(tiles - t, end - i));
        const int next_t = t + count == tiles ? 0 : t + count;
        const int next_count = min(LQ_GROUP, min(tiles - next_t, end - i - count));
        src += count * TILE_BYTES;
        if (next_count == LQ_GROUP) lq_load_group<BITS, true>(next, src, LQ_GROUP, lane);
        else lq_load_group(next, src, next_count, lane);
        const uint4* frag = x.frag + t * x.frag_step;
        if (count == LQ_GROUP) lq_mma_group<BITS, true>(cur, frag, x.frag_step, x.start + 4 * t, LQ_GROUP, acc);
        else lq_mma_group<BITS, false>(cur, frag, x.frag_step, x.start + 4 * t, count, acc);
        i += count;
        if (t + count == tiles || i == end) {
            const int strip = (i - 1) / tiles, strip_begin = strip * tiles;
            if (strip_begin >= begin && strip_begin + tiles <= end) {
                lq_store_rows<OutT, OUT>(p, strip0 + strip, lane, acc);
            } else {
                pieces[warp][strip_begin < begin ? 0 : 1][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            }
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
        }
        t = next_t;
    };
    if (begin < end) {
        while (true) {
            step(a, b);
            if (i == end) break;
            step(b, a);
            if (i == end) break;
        }
    }
    __syncthreads();
    // A cut strip is added up, in warp order, by the warp holding its first tile: that warp's
    // piece is its last strip's (slot 1), every later warp's its first strip's (slot 0).
    // Warps between them with no tiles (a block of fewer than 8 tiles) hold no piece.
    for (int strip = (begin + tiles - 1) / tiles; strip * tiles < end; ++strip) {
        const int strip_end = (strip + 1) * tiles;
        if (strip_end <= end) continue;  // whole: stored
        float4 sum = pieces[warp][1][lane];
        for (int v = warp + 1; v <= deal.owner(strip_end - 1); ++v) {
            if (deal.first(v) == deal.first(v + 1)) continue;
            const float4 piece = pieces[v][0][lane];
            sum.x += piece.x;
            sum.y += piece.y;
            sum.z += piece.z;
            sum.w += piece.w;
        }
        lq_store_rows<OutT, OUT>(p, strip0 + strip, lane, {sum.x, sum.y, sum.z, sum.w});
    }
}

// Strips per block: the fewest that keep the grid within two blocks per SM (all resident at
// once), so every block holds the same number of strips (the last may hold fewer) and every warp
// about the same number of tiles. Depends on the matrix and the GPU, never on T or the form.
int lq_block_strips(int out) { return ceil_div(out / LQ_TILE_ROWS, 2 * sm_count()); }

template <int BITS, class OutT, LqIn IN, LqOut OUT>
void launch_gemv_lq(const char* op, GemvLqParams p, cudaStream_t stream) {
    const auto kernel = gemv_lq_kernel<BITS, OutT, IN, OUT>;
    const size_t smem = (IN == LqIn::NormedResidual ? lq_norm_smem_bytes(p.in) : 0) + lq_start_bytes(p.in) +
                        size_t(IN == LqIn::NormedResidual ? 1 : p.T) * lq_x_bytes(p.in) + LQ_ZERO_X_BYTES;
    if (smem > 32 * 1024) allow_dynamic_smem(kernel, smem, op);
    p.block_strips = lq_block_strips(p.out);
    launch_pdl(op, kernel, ceil_div(p.out / LQ_TILE_ROWS, p.block_strips), LQ_WARPS * 32, smem, stream, p);
}

// The checks and the launches of every form; p.x / p.y point at token 0 (p.T tokens).
template <class OutT, LqIn IN = LqIn::X, LqOut OUT = LqOut::Store>
void run_gemv_lq(const char* op, int bits, const GemvLqParams& p, cudaStream_t stream) {
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(p.out > 0 && p.out % LQ_TILE_ROWS == 0 && p.in > 0 && p.in % LQ_TILE_COLS == 0, op,
            "W must be [16n, 64k], got [" + std::to_string(p.out) + ", " + std::to_string(p.in) + "]");
    require(p.T >= 1 && p.T <= GEMV_MAX_T, op, "T must be 1..8, got " + std::to_string(p.T));
    if constexpr (IN == LqIn::NormedResidual)
        require(lq_norm_smem_bytes(p.in) + sizeof(float4) * LQ_WARPS * 2 * 32 + 256 <= smem_optin_bytes(), op,
                "in = " + std::to_string(p.in) + " is too wide");
    switch (bits) {
        case 4: launch_gemv_lq<4, OutT, IN, OUT>(op, p, stream); break;
        case 5: launch_gemv_lq<5, OutT, IN, OUT>(op, p, stream); break;
        default: launch_gemv_lq<6, OutT, IN, OUT>(op, p, stream); break;
    }
}

}  // namespace

size_t lq_packed_bytes(int out, int in, int bits) {
    return size_t(out / LQ_TILE_ROWS) * size_t(in / LQ_TILE_COLS) * size_t(lq_tile_bytes(bits));
}

template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    run_gemv_lq<OutT>("gemv_lq", bits, {W, x, y, T, out, in, 0, {}, {}}, stream);
}

void gemv_lq_parts(const uint8_t* W, int bits, const bf16* x, const RowParts& parts, int T, int out, int in,
                   cudaStream_t stream) {
    require(parts.n >= 1 && parts.n <= RowParts::MAX && parts.first[parts.n] <= out, "gemv_lq_parts",
            "needs 1..4 parts within the " + std::to_string(out) + " rows");
    run_gemv_lq<bf16>("gemv_lq_parts", bits, {W, x, nullptr, T, out, in, 0, {}, parts}, stream);
}

template <class OutT>
void gemv_lq_normed(const uint8_t* W, int bits, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream) {
    require(x.residual && x.weight, "gemv_lq_normed", "needs the residual row and the norm weight");
    run_gemv_lq<OutT, LqIn::NormedResidual>("gemv_lq_normed", bits, {W, nullptr, y, 1, out, in, 0, x, {}}, stream);
}

void gemv_lq_add_residual(const uint8_t* W, int bits, const bf16* x, float* residual, int out, int in,
                          cudaStream_t stream) {
    run_gemv_lq<float, LqIn::X, LqOut::AddToResidual>("gemv_lq_add_residual", bits,
                                                      {W, x, residual, 1, out, in, 0, {}, {}}, stream);
}

template void gemv_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);
template void gemv_lq_normed<bf16>(const uint8_t*, int, const ResidualNorm&, bf16*, int, int, cudaStream_t);
template void gemv_lq_normed<float>(const uint8_t*, int, const ResidualNorm&, float*, int, int, cudaStream_t);

}  // namespace lampo
