// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// Balanced split: a strip (16 rows) is cut into groups of LQ_GROUP tiles (its last group may be
// short), and the strips' groups, in order, are dealt out in equal contiguous ranges to every warp
// of a grid no larger than what the GPU holds at once, so each warp streams about the same number
// of bytes and no second wave idles most SMs. A warp's tiles go through registers (LqGroup: the
// next group's loads are in flight while the current group's products run on the tensor cores,
// across strip boundaries too), each multiplied by lq_tile_mma against x, which every block stages
// once in fragment order (blocks of LQ_WARPS warps, or LQ_WIDE_WARPS for a large product).
// On sm_90+ a GEMV brings each warp's groups into shared memory by bulk copies instead (the ring
// form, gemv_lq_kernel: the same tiles in the same order, the same sums) unless it gives a warp
// more than LQ_RING_MAX_GROUPS groups (an LM head; lq_ring_slots). A strip that lies wholly in
// one warp's range is written by that warp; a strip cut between warps gets one partial sum per
// warp (its C fragment, in a slot: 0 for the warp's first strip, 1 for its last), and the warp
// that arrives last at the strip's counter adds the pieces in warp order (deterministic) and
// writes the rows, then resets the counter. The slots and counters are the block's shared memory
// when the strip's warps are all in one block (small matrices), else a device scratch (fenced
// device-wide; its counters stay zero between launches).
// Every weight byte is read once and serves all T tokens. Launched with PDL: the first group is
// requested before the wait (weights are immutable); the scratch and counters are touched only
// after it, so consecutive launches never share them. The ring form lets the next kernel launch
// only once a warp of every block has finished its groups: its shared memory and few registers
// would otherwise let the following kernels become resident beside it from the start and load
// their weights into its stream (the step measured 0.151 / 0.049 ms shorter on the 27B /
// 35B-A3B at q5 with the later trigger).
// Where a launch stages at least LQ_PAIR_MIN_X_BYTES of x (a verify window's wide products), the
// blocks go in pairs, clusters of two (the pair form): each block stages half of x's items into its
// own shared memory and its peer's, between two cluster barriers, so x is read from L2 once per
// pair; the split, the tiles and the sums are those of single blocks.
//
// The decode step's two folded forms (T = 1; linear.h), as gemv.cu's for BF16 weights:
// - LqIn::NormedResidual (gemv_lq_normed): every block builds x = bf16(rmsnorm(residual) * (1 + w))
//   itself (norm_row.cuh: add_rmsnorm's thread mapping and order, so the values are rmsnorm's bits)
//   in shared memory and stages it from there (lq_stage.cuh); block 0 may also write it out. The
//   norm weight is copied in before the wait; the residual row is kept in the x staging area
//   between the norm's two passes (run by the block's first NORM_THREADS threads). The blocks, the
//   split and the sums are those of gemv_lq: the result is bit for bit rmsnorm followed by gemv_lq.
// - LqOut::AddToResidual (gemv_lq_add_residual): residual[row] += float(bf16(y[row])), the rounding
//   of a bf16 output added by add_rmsnorm; LqOut::SetResidual: residual[row] = 0 + float(bf16(y[row]))
//   (the same on a zeroed residual, without zeroing it: the MTP pass's fc).
// gemv_lq_parts stores the bf16 rows as RowParts (linear.h) instead of one [T, out] matrix.
// LqOut::SwiGlu (gemv_lq_prenormed_swiglu): W an interleaved gate|up block (linear.h), so rows g
// and g + 8 of a lane's C fragment are the gate and up rows of output 8 strip + g; the lane writes
// act = bf16(silu(bf16(gate)) * bf16(up)) for its two tokens, silu_mul's values from the stored rows.
//
// The two halves of a norm between blocks (T <= 8; linear.h: Prenorm, PrenormedRows):
// - LqOut::AddToResidualPrenorm (gemv_lq_add_residual_prenorm): the warp that writes a strip's rows
//   adds them into the residual [T, out] as AddToResidual does, writes bf16(r * (1 + w)) of each
//   row and, per token, the strip's sum of r^2 (rows g + 8 h of the lane's fragment, (r_g^2 +
//   r_{g+8}^2) summed over g by shuffles in a fixed order).
// - LqIn::Prenormed (gemv_lq_prenormed): x is staged as LqIn::X; each token's inv = rsqrt(sum of
//   its strips' squares / in + eps) is summed by one warp (lane l: strips l, l + 32, ... in order,
//   then the fixed shuffle tree) while the others stage, and the rows are written as inv * sums.
// Each token's values are those of the same token alone: a verify window's rows take the step's
// bits.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_stage.cuh"
#include "kernels/matmul.cuh"
#include "kernels/mbarrier.cuh"
#include "kernels/norm_row.cuh"

namespace lampo {
namespace {

// Warps per block: 8 (two blocks per SM), or 16 (one per SM) for a GEMV that fills every SM with
// them: each block stages all of x (the folded norm: builds it), so half the blocks stage it half
// as often (at T = 5 the 27B's down projection takes 16% less time). The split aims for at least
// LQ_MIN_GROUPS groups per warp, but a product that gives one group to each warp of nearly a whole
// 16-warp wave (LQ_WIDE_FILL of it) takes that wave with one group each rather than 8-warp blocks
// with two (the 35B-A3B's 2,048-group out-projections: its step 1.905 against 1.923 ms, q5).
constexpr int LQ_WARPS = 8;
constexpr int LQ_WIDE_WARPS = 16;
constexpr int LQ_MIN_GROUPS = 2;
constexpr double LQ_WIDE_FILL = 0.9;
constexpr int LQ_SPLIT_MAX_WARPS = 4096;   // the scratch's size: warps of one launch at most
constexpr int LQ_SPLIT_MAX_STRIPS = 1 << 16;
// The ring form (sm_90+, below): slots per warp at most, groups a warp requests before the PDL
// wait and the most groups per warp it takes. Measured in the decode step (q5, docs/benchmarks.md):
// 4 slots or 4 groups before the wait were slower than 2 and 1 on both models (2 before the wait
// again slower with the later trigger: 27B 7.069 against 7.000 ms), and the LM heads run slower
// alone in rings. The 27B's 5,120-column folded norms lost in rings while they took 8-warp blocks
// (+0.62 ms a step) and gain since they take 16-warp ones (6.734 against 7.000 ms).
constexpr int LQ_RING_MAX = 2;
constexpr int LQ_RING_PRE_WAIT = 1;
constexpr int64_t LQ_RING_MAX_GROUPS = 32;  // per warp of a full wave (16 warps per SM)

// The ring's and the pair's instructions (mbarrier transactions, bulk copies, cluster barriers) exist
// from sm_90 on; on older GPUs the launcher never picks those forms and their bodies are not compiled.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool LQ_SM90_ARCH = false;
#else
constexpr bool LQ_SM90_ARCH = true;
#endif

// The pair form's cluster barrier in halves (every thread of both blocks): arrive (release: this
// thread's shared-memory stores, into the peer's too, are visible after the wait; relaxed: none to
// publish) and wait (acquire). The block's rank in its cluster, and where an address of this
// block's shared memory lies in the peer block's (a generic address).
template <bool RELEASE>
__device__ __forceinline__ void lq_cluster_arrive() {
    if constexpr (LQ_SM90_ARCH && RELEASE) asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    if constexpr (LQ_SM90_ARCH && !RELEASE) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void lq_cluster_wait() {
    if constexpr (LQ_SM90_ARCH) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned lq_cluster_rank() {
    unsigned rank = 0;
    if constexpr (LQ_SM90_ARCH) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}
template <class Tp>
__device__ __forceinline__ Tp* lq_in_block(Tp* local, unsigned rank) {
    uint64_t at = reinterpret_cast<uint64_t>(local);
    if constexpr (LQ_SM90_ARCH) asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(at) : "l"(at), "r"(rank));
    return reinterpret_cast<Tp*>(at);
}

// Partial sums of strips cut between warps: [warp][slot][lane] C fragments; per strip, the count
// of pieces arrived (zero between launches).
__device__ float4 lq_split_pieces[LQ_SPLIT_MAX_WARPS * 2 * 32];
__device__ unsigned lq_split_arrivals[LQ_SPLIT_MAX_STRIPS];

static_assert(PRENORM_STRIP == LQ_TILE_ROWS, "a strip sum of squares is one strip's rows");

enum class LqIn { X, NormedResidual, Prenormed };
enum class LqOut { Store, AddToResidual, SetResidual, AddToResidualPrenorm, SwiGlu };

// Shared memory for x: `tokens` staged tokens and the zero fragment; NormedResidual (one token):
// room for the fp32 residual row that the norm keeps there before x is staged.
__host__ __device__ size_t lq_x_area_bytes(int in, int tokens, LqIn input) {
    const size_t staged = size_t(tokens) * lq_x_bytes(in) + LQ_ZERO_X_BYTES;
    return input == LqIn::NormedResidual && sizeof(float) * in > staged ? sizeof(float) * in : staged;
}

// Dynamic shared memory of a launch: the tiles' start values, the x area; NormedResidual: the norm
// weight / normed row after it.
__host__ __device__ size_t lq_smem_bytes(int in, int tokens, LqIn input) {
    return lq_start_bytes(in) + lq_x_area_bytes(in, tokens, input) +
           (input == LqIn::NormedResidual ? lq_x_bytes(in) : 0);
}

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;      // LqIn::X: [T, in]
    void* y;            // [T, out] OutT, or the fp32 residual [out] for Add/SetResidual
    int T, out, in;
    int warps;          // the split's ranges: at most the grid's warps and the number of groups
    int slots;          // the ring form: groups per warp's ring (after lq_smem_bytes)
    ResidualNorm norm;  // LqIn::NormedResidual
    RowParts parts;     // n > 0: the bf16 rows stored as parts (linear.h), not at y
    Prenorm pre;        // LqOut::AddToResidualPrenorm (y: the residual [T, out])
    const float* strip_squares = nullptr;  // LqIn::Prenormed: [T, in / 16] (x: the prenormed rows)
    float eps = 0.0f;
};

// The split (header): groups of LQ_GROUP tiles, `per_strip` per strip, `total` in all, warp w <
// warps <= total taking [first(w), first(w + 1)) (never empty); owner(group): the warp taking it.
struct LqSplit {
    int64_t total;
    int per_strip, warps;
    __device__ int64_t first(int w) const { return total * w / warps; }
    __device__ int owner(int64_t group) const { return int(((group + 1) * warps - 1) / total); }
};

// AddToResidualPrenorm: rows g and g + 8 of `strip` for tokens 2 quad, 2 quad + 1 added into the
// residual, their prenormed rows, and the strip's sum of squares per token (every lane of the warp).
__device__ __forceinline__ void lq_store_prenorm(const GemvLqParams& p, int strip, int lane, const float (&v)[4]) {
    const int g = lane >> 2, quad = lane & 3;
    float* residual = static_cast<float*>(p.y);
    float square[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = 2 * quad + (i & 1), row = strip * LQ_TILE_ROWS + g + 8 * (i >> 1);
        square[i] = 0.0f;
        if (token >= p.T) continue;
        const size_t at = size_t(token) * p.out + row;
        const float r = __ldcg(residual + at) + __bfloat162float(__float2bfloat16(v[i]));
        residual[at] = r;
        p.pre.rows[at] = __float2bfloat16(r * (1.0f + __bfloat162float(p.pre.weight[row])));
        square[i] = r * r;
    }
    float even = square[0] + square[2], odd = square[1] + square[3];  // tokens 2 quad, 2 quad + 1
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        even += __shfl_xor_sync(0xffffffffu, even, o);
        odd += __shfl_xor_sync(0xffffffffu, odd, o);
    }
    const int strips = p.out / PRENORM_STRIP;
    if (g == 0 && 2 * quad < p.T) p.pre.strip_squares[2 * quad * strips + strip] = even;
    if (g == 0 && 2 * quad + 1 < p.T) p.pre.strip_squares[(2 * quad + 1) * strips + strip] = odd;
}

// SwiGlu: output 8 strip + g of tokens 2 quad, 2 quad + 1 from rows g (gate) and g + 8 (up) of the
// lane's C fragment `v` (each scaled by token_inv[token] where it is given), into act [T, out / 2].
__device__ __forceinline__ void lq_store_swiglu(const GemvLqParams& p, int strip, int lane, const float (&v)[4],
                                                const float* token_inv) {
    const int g = lane >> 2, quad = lane & 3, outputs = p.out / 2;
    bf16* act = static_cast<bf16*>(p.y);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int token = 2 * quad + i;
        if (token >= p.T) continue;
        const float gate = __bfloat162float(__float2bfloat16(token_inv ? v[i] * token_inv[token] : v[i]));
        const float up = __bfloat162float(__float2bfloat16(token_inv ? v[i + 2] * token_inv[token] : v[i + 2]));
        act[size_t(token) * outputs + strip * (LQ_TILE_ROWS / 2) + g] = __float2bfloat16(silu(gate) * up);
    }
}

// Prenormed: inv of token t (lane 0 of the warp that sums it; linear.h PrenormedRows).
__device__ __forceinline__ float lq_token_inv(const GemvLqParams& p, int t, int lane) {
    const int strips = p.in / PRENORM_STRIP;
    const float* squares = p.strip_squares + size_t(t) * strips;
    float sum = 0.0f;
#pragma unroll 4
    for (int s = lane; s < strips; s += 32) sum += __ldcg(squares + s);
    return rsqrtf(warp_sum(sum) / float(p.in) + p.eps);
}

// rows g and g + 8 of `strip` for tokens 2 quad, 2 quad + 1 from the lane's C fragment `v` (each
// token's sums times token_inv[token] where it is given: LqIn::Prenormed).
template <class OutT, LqOut OUT>
__device__ __forceinline__ void lq_store_rows(const GemvLqParams& p, int strip, int lane, const float (&v)[4],
                                              const float* token_inv) {
    if constexpr (OUT == LqOut::AddToResidualPrenorm) {
        lq_store_prenorm(p, strip, lane, v);
        return;
    }
    if constexpr (OUT == LqOut::SwiGlu) {
        lq_store_swiglu(p, strip, lane, v, token_inv);
        return;
    }
    const int g = lane >> 2, quad = lane & 3;
    OutT* y = static_cast<OutT*>(p.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = 2 * quad + (i & 1), row = strip * LQ_TILE_ROWS + g + 8 * (i >> 1);
        if (token >= p.T) continue;
        const float value = token_inv ? v[i] * token_inv[token] : v[i];
        if constexpr (OUT == LqOut::AddToResidual) y[row] = __ldcg(y + row) + __bfloat162float(__float2bfloat16(v[i]));
        else if constexpr (OUT == LqOut::SetResidual) y[row] = 0.0f + __bfloat162float(__float2bfloat16(v[i]));
        else if constexpr (std::is_same_v<OutT, float>) y[size_t(token) * p.out + row] = value;
        else if (bf16* at = p.parts.n ? p.parts.at(token, row) : y + size_t(token) * p.out + row)
            *at = __float2bfloat16(value);
    }
}

// The kernel's static shared memory at most: the block's pieces and counters (lq_finish_strip), the
// ring form's barriers and 256 bytes for the folded norm's block sums (norm_row.cuh).
constexpr size_t lq_static_smem_bytes(int warps) {
    return sizeof(float4) * warps * 2 * 32 + sizeof(unsigned) * warps + sizeof(uint64_t) * warps * LQ_RING_MAX + 256;
}

// Where the pieces of strips cut between warps meet: the device scratch and counters, or, for a
// strip whose warps all belong to one block, that block's shared memory (no device-wide fence).
struct LqPieces {
    float4* piece;       // [warp][slot][lane]
    unsigned* arrivals;  // the strip's counter
    int first_warp;      // warp index of piece[0]
};

// Adds this warp's piece (slot 0: its first strip, else 1) to the strip's; true for the warp that
// arrives last, which then holds the sum of all pieces in warp order in `sum`. It loads them
// BATCH at a time: one after another, a strip of the 27B's down projection (pieces from about
// seven warps) took seven trips to L2 behind the warp's last products. The ring form takes
// LQ_MEET_BATCH; the register form, whose registers hold the next group's tiles here, one (eight
// spilled inside its main loop).
constexpr int LQ_MEET_BATCH = 8;
template <bool SHARED, int BATCH>
__device__ __forceinline__ bool lq_meet(const LqPieces& at, const LqSplit& split, int w, int strip, int w_lo, int w_hi,
                                        bool first_strip, int lane, const float (&acc)[4], float (&sum)[4]) {
    at.piece[((w - at.first_warp) * 2 + (first_strip ? 0 : 1)) * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    if constexpr (SHARED) __threadfence_block();
    else __threadfence();
    __syncwarp();
    unsigned arrived = 0;
    if (lane == 0) arrived = atomicAdd(at.arrivals, 1u);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != unsigned(w_hi - w_lo)) return false;
    if (lane == 0) *at.arrivals = 0u;  // ready for the next use
    if constexpr (SHARED) __threadfence_block();
    else __threadfence();
    // The pieces in warp order, BATCH loads in flight at once, each added in turn (the lowest
    // warp's piece is its last strip unless it began here).
    const int lo_slot = split.first(w_lo) != int64_t(strip) * split.per_strip ? 1 : 0;
    sum[0] = sum[1] = sum[2] = sum[3] = 0.0f;
    for (int v0 = w_lo; v0 <= w_hi; v0 += BATCH) {
        float4 value[BATCH];
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            if (v0 + i > w_hi) continue;
            const int slot = i == 0 && v0 == w_lo ? lo_slot : 0;
            const float4* piece = at.piece + ((v0 + i - at.first_warp) * 2 + slot) * 32 + lane;
            value[i] = SHARED ? *piece : __ldcg(piece);
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            if (v0 + i > w_hi) continue;
            sum[0] += value[i].x;
            sum[1] += value[i].y;
            sum[2] += value[i].z;
            sum[3] += value[i].w;
        }
    }
    return true;
}

// The end of warp w's part of `strip` (acc its sums): the rows, if the warp holds the whole strip;
// else its piece, and the rows from all pieces if it is the last to arrive. block_pieces /
// block_arrivals: the block's shared memory for strips within it (counter: the lowest warp's).
// A strip's pieces in the device scratch are loaded MEET_BATCH at a time, in shared memory one.
template <int WARPS, class OutT, LqOut OUT, int MEET_BATCH>
__device__ __forceinline__ void lq_finish_strip(const GemvLqParams& p, const LqSplit& split, int w, int strip,
                                                bool whole, bool first_strip, int lane, const float (&acc)[4],
                                                float4* block_pieces, unsigned* block_arrivals,
                                                const float* token_inv) {
    if (whole) {
        lq_store_rows<OutT, OUT>(p, strip, lane, acc, token_inv);
        return;
    }
    const int w_lo = split.owner(int64_t(strip) * split.per_strip);
    const int w_hi = split.owner(int64_t(strip + 1) * split.per_strip - 1);
    float sum[4];
    const bool last = w_lo / WARPS == w_hi / WARPS
        ? lq_meet<true, 1>({block_pieces, block_arrivals + w_lo % WARPS, w_lo - w_lo % WARPS}, split, w, strip,
                           w_lo, w_hi, first_strip, lane, acc, sum)
        : lq_meet<false, MEET_BATCH>({lq_split_pieces, lq_split_arrivals + strip, 0}, split, w, strip, w_lo, w_hi,
                                     first_strip, lane, acc, sum);
    if (last) lq_store_rows<OutT, OUT>(p, strip, lane, sum, token_inv);
}

// RING (sm_90+): each warp's groups come through a ring of p.slots groups in shared memory, each
// slot filled by one bulk copy that lane 0 issues and completes on the slot's mbarrier; the warp
// requests up to LQ_RING_PRE_WAIT groups before the wait and refills a slot as soon as its
// products are done, so p.slots - 1 groups stay in flight while it computes, and no warp holds a
// weight load in flight when it hands sums on. Otherwise each warp's groups go through registers
// (LqGroup, two in turn). Both read the same tiles in the same order: the same sums, bit for bit.
template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS, bool RING, bool PAIR>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS) gemv_lq_kernel(const GemvLqParams p) {
    static_assert(IN != LqIn::NormedResidual || WARPS * 32 >= NORM_THREADS, "the folded norm runs on the GEMV block");
    static_assert(!PAIR || IN != LqIn::NormedResidual, "the pair stages a given x");
    static_assert(OUT == LqOut::Store || OUT == LqOut::SwiGlu || std::is_same_v<OutT, float>,
                  "residual add: an fp32 row");
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    extern __shared__ uint4 lq_smem[];
    __shared__ float4 block_pieces[WARPS * 2 * 32];  // within lq_static_smem_bytes(WARPS)
    __shared__ unsigned block_arrivals[WARPS];
    __shared__ uint64_t ring_full[RING ? WARPS * LQ_RING_MAX : 1];
    __shared__ float token_inv[IN == LqIn::Prenormed ? GEMV_MAX_T : 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w = blockIdx.x * WARPS + warp;
    if (threadIdx.x < WARPS) block_arrivals[threadIdx.x] = 0u;  // read after the staging's barrier
    if constexpr (PAIR) lq_cluster_arrive<false>();  // this block runs: the peer may store into it
    const int tiles = p.in / LQ_TILE_COLS, per_strip = (tiles + LQ_GROUP - 1) / LQ_GROUP;
    const LqSplit split{int64_t(p.out / LQ_TILE_ROWS) * per_strip, per_strip, p.warps};
    const bool idle = w >= p.warps;  // the last block's warps past the split's count
    const int64_t g_end = idle ? 0 : split.first(w + 1);
    int64_t g = idle ? 0 : split.first(w);
    float* start = reinterpret_cast<float*>(lq_smem);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);
    // NormedResidual (T = 1): the norm weight, overwritten in place by the normed row, after the x
    // area; the fp32 residual row (in * 4 bytes) lives in the x area until x is staged.
    bf16* row = reinterpret_cast<bf16*>(xs + lq_x_area_bytes(p.in, 1, IN) / 16);
    if constexpr (IN == LqIn::NormedResidual) {
        for (int i = threadIdx.x; i < p.in / 8; i += blockDim.x) cp_async_16(row + 8 * i, p.norm.weight + 8 * i, true);
        cp_async_commit();
    }

    // The warp's position: group g = tile t of `strip`, at src (a strip's tiles follow the previous
    // strip's).
    int strip = int(g / per_strip), t = int(g - int64_t(strip) * per_strip) * LQ_GROUP;
    const uint8_t* src = p.W + (size_t(strip) * tiles + t) * TILE_BYTES;
    LqGroup<BITS> a, b;
    // The ring form: the warp's slots, and where its next request goes (lane 0's).
    constexpr int GROUP_BYTES = LQ_GROUP * TILE_BYTES;
    uint8_t* ring = reinterpret_cast<uint8_t*>(lq_smem) + lq_smem_bytes(p.in, p.T, IN) + warp * p.slots * GROUP_BYTES;
    uint64_t* full = ring_full + (RING ? warp * LQ_RING_MAX : 0);
    const int groups = int(g_end - g);
    int issued = 0, issue_t = t;
    const uint8_t* issue_src = src;
    auto request = [&] {  // the warp's next group into its slot (lane 0)
        if constexpr (RING && LQ_SM90_ARCH) {
            const int count = min(LQ_GROUP, tiles - issue_t), slot = issued % p.slots;
            mbarrier_arrive_expect_tx(&full[slot], count * TILE_BYTES);
            bulk_load(ring + slot * GROUP_BYTES, issue_src, count * TILE_BYTES, &full[slot]);
            issue_src += count * TILE_BYTES;
            issue_t = issue_t + count == tiles ? 0 : issue_t + count;
            ++issued;
        }
    };
    if constexpr (RING && LQ_SM90_ARCH) {  // before the wait: weights only
        if (lane == 0 && groups > 0) {
            for (int s = 0; s < p.slots; ++s) mbarrier_init(&full[s], 1);
            mbarrier_init_fence();
            while (issued < min(min(p.slots, LQ_RING_PRE_WAIT), groups)) request();
        }
        __syncwarp();
    } else {
        lq_load_group(a, src, g < g_end ? min(LQ_GROUP, tiles - t) : 0, lane);  // before the wait
    }
    if constexpr (RING) pdl_begin_untriggered();
    else pdl_begin();
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
        int thread = threadIdx.x, threads = blockDim.x;
        float* peer_start = nullptr;  // PAIR: the peer block's start values and x, which this block
        uint4* peer_xs = nullptr;     // writes as well as its own, each block staging half the items
        if constexpr (PAIR) {
            lq_cluster_wait();  // the peer block runs
            const unsigned rank = lq_cluster_rank();
            peer_start = lq_in_block(start, rank ^ 1u);
            peer_xs = lq_in_block(xs, rank ^ 1u);
            thread += rank * blockDim.x;
            threads *= 2;
        }
        lq_stage_x_from<LqXSource::Global>(xs, start, p.x, p.T, p.in, lq_code_centre<BITS>(), thread, threads,
                                           peer_xs, peer_start);
        if constexpr (IN == LqIn::Prenormed)  // the last warps, which have the fewest items to stage
            for (int t = WARPS - 1 - warp; t < p.T; t += WARPS) {
                const float inv = lq_token_inv(p, t, lane);
                if (lane == 0) token_inv[t] = inv;
            }
    }
    if constexpr (PAIR) {  // both blocks' x staged
        lq_cluster_arrive<true>();
        lq_cluster_wait();
    } else {
        __syncthreads();
    }
    timeline_mark(TL_STAGED);
    if (g >= g_end) return;
    if constexpr (RING && LQ_SM90_ARCH)
        if (lane == 0) while (issued < min(p.slots, groups)) request();  // the ring's remaining slots

    const LqLaneX x = lq_lane_x(xs, start, tiles, p.T, lane);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    bool first_strip = true;
    int seg_begin = t;  // where the warp's part of the current strip began
    // After a group's products: finish the strip where it ends, and move to the next group.
    auto advance = [&](int count) {
        const bool strip_ends = t + count == tiles;
        ++g;
        if (strip_ends || g == g_end) {
            lq_finish_strip<WARPS, OutT, OUT, RING ? LQ_MEET_BATCH : 1>(
                p, split, w, strip, seg_begin == 0 && strip_ends, first_strip, lane, acc, block_pieces, block_arrivals,
                IN == LqIn::Prenormed ? token_inv : nullptr);
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
            first_strip = false;
            seg_begin = 0;
        }
        strip += strip_ends;
        t = strip_ends ? 0 : t + LQ_GROUP;
    };
    // One register group: request the next one (the following tiles of this strip, or the next
    // strip's first), multiply this one. The full-group forms are the ones real shapes take (in a
    // multiple of 256).
    auto step = [&](LqGroup<BITS>& cur, LqGroup<BITS>& next) {
        const int count = min(LQ_GROUP, tiles - t);
        const int next_t = t + count == tiles ? 0 : t + LQ_GROUP;
        const int next_count = g + 1 < g_end ? min(LQ_GROUP, tiles - next_t) : 0;
        src += count * TILE_BYTES;
        if (next_count == LQ_GROUP) lq_load_group<BITS, true>(next, src, LQ_GROUP, lane);
        else lq_load_group(next, src, next_count, lane);
        const uint4* frag = x.frag + t * x.frag_step;
        if (count == LQ_GROUP) lq_mma_group<BITS, true>(cur, frag, x.frag_step, x.start + 4 * t, LQ_GROUP, acc);
        else lq_mma_group<BITS, false>(cur, frag, x.frag_step, x.start + 4 * t, count, acc);
        advance(count);
    };
    if constexpr (RING && LQ_SM90_ARCH) {
        int slot = 0;
        uint32_t parity = 0;
        while (true) {
            const int count = min(LQ_GROUP, tiles - t);
            mbarrier_wait(&full[slot], parity);
            const uint8_t* tiles_at = ring + slot * GROUP_BYTES;
            const uint4* frag = x.frag + t * x.frag_step;
            if (count == LQ_GROUP) {
                lq_load_group<BITS, true, true>(a, tiles_at, LQ_GROUP, lane);
                lq_mma_group<BITS, true>(a, frag, x.frag_step, x.start + 4 * t, LQ_GROUP, acc);
            } else {
                lq_load_group<BITS, false, true>(a, tiles_at, count, lane);
                lq_mma_group<BITS, false>(a, frag, x.frag_step, x.start + 4 * t, count, acc);
            }
            __syncwarp();  // every lane has read the slot: refill it
            if (lane == 0 && issued < groups) request();
            if (++slot == p.slots) slot = 0, parity ^= 1u;
            advance(count);
            if (g == g_end) break;
        }
        pdl_trigger();  // (a block's warps without groups returned above: exiting counts as triggering)
    } else {
        while (true) {
            step(a, b);
            if (g == g_end) break;
            step(b, a);
            if (g == g_end) break;
        }
    }
    timeline_mark_warp(TL_DONE);
}

// Shared memory of one ring slot per warp of a `warps`-warp block: a group of tiles each.
constexpr size_t lq_ring_slot_bytes(int bits, int warps) { return size_t(warps) * LQ_GROUP * lq_tile_bytes(bits); }

// Ring slots per warp for a launch of `warps`-warp blocks, 16 warps per SM: as many as fit beside
// the launch's other shared memory (at most LQ_RING_MAX); 0 (the register form) where fewer than
// two fit, before sm_90, for weights not 16-byte aligned (bulk copies need it), and where the
// register form measured faster in the decode step (H200, q5): more than LQ_RING_MAX_GROUPS groups
// per warp (the LM heads: 4-17 us slower alone in rings).
int lq_ring_slots(const GemvLqParams& p, int bits, int warps, LqIn input, int64_t groups) {
    if (!sm90_or_newer() || reinterpret_cast<uintptr_t>(p.W) % 16 != 0) return 0;
    if (groups > LQ_RING_MAX_GROUPS * 16 * sm_count()) return 0;
    static const size_t per_sm = size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
    static const size_t reserved = size_t(device_attribute(cudaDevAttrReservedSharedMemoryPerBlock));
    const size_t per_block = std::min(per_sm / (16 / warps) - reserved, smem_optin_bytes());
    const size_t fixed = lq_smem_bytes(p.in, p.T, input) + lq_static_smem_bytes(warps);
    const size_t slot = lq_ring_slot_bytes(bits, warps);
    const size_t slots = per_block > fixed ? (per_block - fixed) / slot : 0;
    return slots < 2 ? 0 : int(std::min<size_t>(slots, LQ_RING_MAX));
}

// Blocks of `kernel` the GPU holds at once with `smem` bytes each: per SM times the SMs, or, for
// pairs (clusters of two), twice the clusters it holds. Asked of the runtime once per device and
// size (eager few-token forwards, e.g. verify windows, launch this kernel hundreds of times).
template <class Kernel>
int lq_resident_blocks(Kernel kernel, int warps, size_t smem, bool pair) {
    static std::mutex lock;
    static std::map<std::tuple<int, size_t, bool, const void*>, int> resident;
    int device = 0;
    LAMPO_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> hold(lock);
    const auto key = std::make_tuple(device, smem, pair, reinterpret_cast<const void*>(kernel));
    auto it = resident.find(key);
    if (it == resident.end()) {
        int n = 0;
        if (pair) {
            cudaLaunchAttribute cluster{};
            cluster.id = cudaLaunchAttributeClusterDimension;
            cluster.val.clusterDim = {2, 1, 1};
            cudaLaunchConfig_t cfg{};
            cfg.gridDim = dim3(2 * sm_count());
            cfg.blockDim = dim3(warps * 32);
            cfg.dynamicSmemBytes = smem;
            cfg.attrs = &cluster;
            cfg.numAttrs = 1;
            LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
            n *= 2;
        } else {
            LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, warps * 32, smem));
            n *= sm_count();
        }
        it = resident.emplace(key, n).first;
    }
    return it->second;
}

// Pairs of blocks (clusters of two, sm_90+) stage x once between them, each block half of it into
// both, where a launch stages at least LQ_PAIR_MIN_X_BYTES of x (T > 1 tokens): every block of a
// verify window's GEMV reads all T rows at once, and at T = 4 the 27B's 17,408-column down
// projection spent 7.2 us staging them against 2.8 us for one token (the blocks' reads of the
// same rows from L2, not their latency: more loads in flight were slower). The pair's cluster
// barriers (one at entry, relaxed; one after staging, with a release fence) are what it costs.
constexpr size_t LQ_PAIR_MIN_X_BYTES = 64 * 1024;
std::atomic<long long> lq_pair_launch_count{0};  // gemv_lq_pair_launches()

// The grid: as many blocks as the GPU holds at once (fewer when the matrix gives a warp fewer
// than min_groups groups), so the split's ranges all run in one wave; the ring form keeps to
// 16 warps per SM, as the register form's registers do. Pairs take the same split (each token's
// row keeps the bits of its one-token launch), an odd count one more block that stages its half
// of x and has no groups; where the GPU cannot hold that many pairs at once, single blocks.
template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS, bool RING>
void launch_gemv_lq_blocks(const char* op, GemvLqParams p, int64_t groups, int min_groups, cudaStream_t stream) {
    const size_t smem =
        lq_smem_bytes(p.in, p.T, IN) + (RING ? size_t(p.slots) * lq_ring_slot_bytes(BITS, WARPS) : 0);
    const bool large = smem + lq_static_smem_bytes(WARPS) > 48 * 1024;
    const auto single = gemv_lq_kernel<BITS, OutT, IN, OUT, WARPS, RING, false>;
    if (large) allow_dynamic_smem(single, smem, op);
    int most = lq_resident_blocks(single, WARPS, smem, false);
    if (RING) most = std::min(most, 16 / WARPS * sm_count());
    const int64_t wanted = (groups + min_groups * WARPS - 1) / (min_groups * WARPS);
    const int blocks = int(std::min<int64_t>({wanted, int64_t(std::max(most, 1)), LQ_SPLIT_MAX_WARPS / WARPS}));
    p.warps = int(std::min<int64_t>(int64_t(blocks) * WARPS, groups));  // each warp has a group at least
    if constexpr (IN != LqIn::NormedResidual) {
        if (p.T > 1 && size_t(p.T) * lq_x_bytes(p.in) >= LQ_PAIR_MIN_X_BYTES && sm90_or_newer()) {
            const auto pair = gemv_lq_kernel<BITS, OutT, IN, OUT, WARPS, RING, true>;
            if (large) allow_dynamic_smem(pair, smem, op);
            const int launched = blocks + (blocks & 1);
            if (launched <= lq_resident_blocks(pair, WARPS, smem, true)) {
                lq_pair_launch_count.fetch_add(1, std::memory_order_relaxed);
                return launch_pdl_clusters(op, 2, pair, launched, WARPS * 32, smem, stream, p);
            }
        }
    }
    launch_pdl(op, single, blocks, WARPS * 32, smem, stream, p);
}

template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS>
void launch_gemv_lq_form(const char* op, GemvLqParams p, int64_t groups, int min_groups, cudaStream_t stream) {
    p.slots = lq_ring_slots(p, BITS, WARPS, IN, groups);
    if (p.slots) launch_gemv_lq_blocks<BITS, OutT, IN, OUT, WARPS, true>(op, p, groups, min_groups, stream);
    else launch_gemv_lq_blocks<BITS, OutT, IN, OUT, WARPS, false>(op, p, groups, min_groups, stream);
}

template <int BITS, class OutT, LqIn IN, LqOut OUT>
void launch_gemv_lq(const char* op, const GemvLqParams& p, cudaStream_t stream) {
    const int64_t groups = int64_t(p.out / LQ_TILE_ROWS) * ceil_div(p.in / LQ_TILE_COLS, LQ_GROUP);
    const int64_t wide_wave = int64_t(LQ_WIDE_WARPS) * sm_count();
    if (groups >= LQ_MIN_GROUPS * wide_wave)
        return launch_gemv_lq_form<BITS, OutT, IN, OUT, LQ_WIDE_WARPS>(op, p, groups, LQ_MIN_GROUPS, stream);
    if (groups >= LQ_WIDE_FILL * double(wide_wave))
        return launch_gemv_lq_form<BITS, OutT, IN, OUT, LQ_WIDE_WARPS>(op, p, groups, 1, stream);
    launch_gemv_lq_form<BITS, OutT, IN, OUT, LQ_WARPS>(op, p, groups, LQ_MIN_GROUPS, stream);
}

// The checks and the launches of every form; p.x / p.y point at token 0 (p.T tokens).
template <class OutT, LqIn IN = LqIn::X, LqOut OUT = LqOut::Store>
void run_gemv_lq(const char* op, int bits, const GemvLqParams& p, cudaStream_t stream) {
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(p.out > 0 && p.out % LQ_TILE_ROWS == 0 && p.in > 0 && p.in % LQ_TILE_COLS == 0, op,
            "W must be [16n, 64k], got [" + std::to_string(p.out) + ", " + std::to_string(p.in) + "]");
    require(p.out / LQ_TILE_ROWS <= LQ_SPLIT_MAX_STRIPS, op,
            "out must be at most " + std::to_string(LQ_SPLIT_MAX_STRIPS * LQ_TILE_ROWS) + ", got " +
                std::to_string(p.out));
    require(p.T >= 1 && p.T <= GEMV_MAX_T, op, "T must be 1..8, got " + std::to_string(p.T));
    // x lives in shared memory: tokens go in groups that fit (one group unless T * in is large,
    // e.g. the 27B down-projection with more than 6 tokens).
    const size_t room = smem_optin_bytes() - lq_static_smem_bytes(LQ_WIDE_WARPS);
    require(lq_smem_bytes(p.in, 1, IN) <= room, op, "in = " + std::to_string(p.in) + " is too wide");
    int group = p.T;
    while (lq_smem_bytes(p.in, group, IN) > room) --group;
    for (int t0 = 0; t0 < p.T; t0 += group) {
        GemvLqParams q = p;
        q.x = p.x ? p.x + size_t(t0) * p.in : nullptr;
        q.y = p.y ? static_cast<OutT*>(p.y) + size_t(t0) * (OUT == LqOut::SwiGlu ? p.out / 2 : p.out) : nullptr;
        for (int i = 0; i < p.parts.n; ++i) q.parts.dst[i] += size_t(t0) * (p.parts.first[i + 1] - p.parts.first[i]);
        if constexpr (OUT == LqOut::AddToResidualPrenorm) {
            q.pre.rows += size_t(t0) * p.out;
            q.pre.strip_squares += size_t(t0) * (p.out / PRENORM_STRIP);
        }
        if constexpr (IN == LqIn::Prenormed) q.strip_squares += size_t(t0) * (p.in / PRENORM_STRIP);
        q.T = std::min(group, p.T - t0);
        switch (bits) {
            case 4: launch_gemv_lq<4, OutT, IN, OUT>(op, q, stream); break;
            case 5: launch_gemv_lq<5, OutT, IN, OUT>(op, q, stream); break;
            default: launch_gemv_lq<6, OutT, IN, OUT>(op, q, stream); break;
        }
    }
}

}  // namespace

long long gemv_lq_pair_launches() { return lq_pair_launch_count.load(std::memory_order_relaxed); }

size_t lq_packed_bytes(int out, int in, int bits) {
    return size_t(out / LQ_TILE_ROWS) * size_t(in / LQ_TILE_COLS) * size_t(lq_tile_bytes(bits));
}

template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    run_gemv_lq<OutT>("gemv_lq", bits, {W, x, y, T, out, in, 0, 0, {}, {}}, stream);
}

void gemv_lq_parts(const uint8_t* W, int bits, const bf16* x, const RowParts& parts, int T, int out, int in,
                   cudaStream_t stream) {
    require_row_parts("gemv_lq_parts", parts, 1, out);
    run_gemv_lq<bf16>("gemv_lq_parts", bits, {W, x, nullptr, T, out, in, 0, 0, {}, parts}, stream);
}

template <class OutT>
void gemv_lq_normed(const uint8_t* W, int bits, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream) {
    require(x.residual && x.weight, "gemv_lq_normed", "needs the residual row and the norm weight");
    run_gemv_lq<OutT, LqIn::NormedResidual>("gemv_lq_normed", bits, {W, nullptr, y, 1, out, in, 0, 0, x, {}}, stream);
}

void gemv_lq_add_residual_prenorm(const uint8_t* W, int bits, const bf16* x, float* residual, const Prenorm& next,
                                  int T, int out, int in, cudaStream_t stream) {
    const char* op = "gemv_lq_add_residual_prenorm";
    require(x && residual && next.weight && next.rows && next.strip_squares, op,
            "needs x, the residual rows, the next norm's weight, its prenormed rows and strip sums");
    GemvLqParams p{W, x, residual, T, out, in, 0, 0, {}, {}};
    p.pre = next;
    run_gemv_lq<float, LqIn::X, LqOut::AddToResidualPrenorm>(op, bits, p, stream);
}

namespace {

GemvLqParams prenormed_params(const char* op, const uint8_t* W, const PrenormedRows& x, bf16* y, const RowParts& parts,
                              int T, int out, int in) {
    require(x.rows && x.strip_squares && (y || parts.n > 0), op, "needs the prenormed rows, their strip sums and y");
    GemvLqParams p{W, x.rows, parts.n ? nullptr : y, T, out, in, 0, 0, {}, parts};
    p.strip_squares = x.strip_squares;
    p.eps = x.eps;
    return p;
}

}  // namespace

void gemv_lq_prenormed(const uint8_t* W, int bits, const PrenormedRows& x, bf16* y, const RowParts& parts, int T,
                       int out, int in, cudaStream_t stream) {
    const char* op = "gemv_lq_prenormed";
    require_row_parts(op, parts, 0, out);
    run_gemv_lq<bf16, LqIn::Prenormed>(op, bits, prenormed_params(op, W, x, y, parts, T, out, in), stream);
}

void gemv_lq_prenormed_swiglu(const uint8_t* W, int bits, const PrenormedRows& x, bf16* act, int T, int out, int in,
                              cudaStream_t stream) {
    const char* op = "gemv_lq_prenormed_swiglu";
    require(out % (2 * LQ_TILE_ROWS) == 0, op,
            "an interleaved gate|up block has out a multiple of 32, got " + std::to_string(out));
    run_gemv_lq<bf16, LqIn::Prenormed, LqOut::SwiGlu>(op, bits, prenormed_params(op, W, x, act, {}, T, out, in),
                                                       stream);
}

void gemv_lq_add_residual(const uint8_t* W, int bits, const bf16* x, float* residual, int out, int in,
                          cudaStream_t stream, bool set) {
    const GemvLqParams p{W, x, residual, 1, out, in, 0, 0, {}, {}};
    if (set) run_gemv_lq<float, LqIn::X, LqOut::SetResidual>("gemv_lq_set_residual", bits, p, stream);
    else run_gemv_lq<float, LqIn::X, LqOut::AddToResidual>("gemv_lq_add_residual", bits, p, stream);
}

template void gemv_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);
template void gemv_lq_normed<bf16>(const uint8_t*, int, const ResidualNorm&, bf16*, int, int, cudaStream_t);
template void gemv_lq_normed<float>(const uint8_t*, int, const ResidualNorm&, float*, int, int, cudaStream_t);

}  // namespace lampo
