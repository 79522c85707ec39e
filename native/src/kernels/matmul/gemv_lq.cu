// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// Balanced split: a strip (16 rows) is cut into groups of LQ_GROUP tiles (its last group may be
// short), and the strips' groups, in order, are dealt out in equal contiguous ranges to the blocks
// of a grid no larger than what the GPU holds at once (one wave). Inside a block the groups are
// units handed out one at a time: warp w starts with unit w (its tiles requested before the PDL
// wait), then takes the next unit from a shared counter, so a warp whose loads come back late
// takes fewer units and the block's warps finish together (a static split per warp left them 5-7
// us apart on the 27B's matrices, docs/benchmarks.md). A warp's tiles go through registers
// (LqGroup: the next unit's loads are in flight while the current unit's products run on the
// tensor cores), each multiplied by lq_tile_mma against x, which every block stages once in
// fragment order (blocks of LQ_WARPS warps, or LQ_WIDE_WARPS for a large plain-x product).
// Each unit's sums (its C fragment, the lanes of live tokens) go to a slot of the block's ring;
// the warp that completes a strip's units in the block adds the slots in unit order (the sums do
// not depend on which warp ran which unit) and writes the rows, or, for a strip cut between
// blocks, its block's piece to a device scratch (fenced device-wide; slot 0 for the block's first
// strip, 1 for its last), where the block that arrives last at the strip's counter adds the pieces
// in block order and writes the rows, then resets the counter (zero between launches). A slot is
// written again only after its strip was added up (the ring holds a strip's units and two per
// warp more, so the oldest unit in flight never waits). Every weight byte is read once and serves
// all T tokens. Launched with PDL: the first unit's tiles are requested before the wait (weights
// are immutable); the scratch and counters are touched only after it, so consecutive launches
// never share them.
//
// The decode step's two folded forms (T = 1; linear.h), as gemv.cu's for BF16 weights:
// - LqIn::NormedResidual (gemv_lq_normed): every block builds x = bf16(rmsnorm(residual) * (1 + w))
//   itself (norm_row.cuh: add_rmsnorm's thread mapping and order, so the values are rmsnorm's bits)
//   in shared memory and stages it from there (lq_stage.cuh); block 0 may also write it out. The
//   norm weight is copied in before the wait; the residual row is kept in the x staging area
//   between the norm's two passes. The block size, the split and the sums are those of gemv_lq:
//   the result is bit for bit rmsnorm followed by gemv_lq.
// - LqOut::AddToResidual (gemv_lq_add_residual): residual[row] += float(bf16(y[row])), the rounding
//   of a bf16 output added by add_rmsnorm.
// gemv_lq_parts stores the bf16 rows as RowParts (linear.h) instead of one [T, out] matrix.
#include <algorithm>
#include <map>
#include <mutex>
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
// them: each block stages all of x, so half the blocks stage it half as often (at T = 5 the 27B's
// down projection takes 16% less time), and an SM's warps share one block's units. The folded norm
// runs on the block's first NORM_THREADS threads.
constexpr int LQ_WARPS = 8;
constexpr int LQ_WIDE_WARPS = 16;
constexpr int LQ_MIN_GROUPS = 2;            // groups per warp the split aims for at least
constexpr int LQ_SPLIT_MAX_BLOCKS = 1024;  // the scratch's size: blocks of one launch at most
constexpr int LQ_SPLIT_MAX_STRIPS = 1 << 16;

// Pieces of strips cut between blocks: [block][slot][lane] C fragments; per strip, the count of
// pieces arrived (zero between launches).
__device__ float4 lq_split_pieces[LQ_SPLIT_MAX_BLOCKS * 2 * 32];
__device__ unsigned lq_split_arrivals[LQ_SPLIT_MAX_STRIPS];

enum class LqIn { X, NormedResidual };
enum class LqOut { Store, AddToResidual };

// Shared memory for x: `tokens` staged tokens and the zero fragment; NormedResidual (one token):
// room for the fp32 residual row that the norm keeps there before x is staged.
__host__ __device__ size_t lq_x_area_bytes(int in, int tokens, LqIn input) {
    const size_t staged = size_t(tokens) * lq_x_bytes(in) + LQ_ZERO_X_BYTES;
    return input == LqIn::NormedResidual && sizeof(float) * in > staged ? sizeof(float) * in : staged;
}

// The block's ring of unit sums (gemv_lq_kernel): `units` slots of the C fragments of the lanes
// whose tokens exist (quad < ceil(T / 2)), per slot a `full` and an `empty` barrier (mbarrier.cuh:
// no memory fences, which would wait for the warp's tile loads in flight) and a count, and the
// block's next unit to hand out. Slot s serves units s, s + units, ... in rounds: a unit waits
// until its slot's previous unit was added up (`empty`), writes its sums (a strip of several
// units in the block) and arrives on `full`; the count in the slot of a strip's first unit is its
// units done, and the warp that completes it waits on their `full`, adds them up and arrives on
// their `empty`. A unit alone in its strip only passes its slot on. Every arrival is the whole
// warp's (barrier counts of 32). The ring holds a whole strip and two units per warp more.
__host__ __device__ int lq_ring_units(int in, int warps) {
    return (in / LQ_TILE_COLS + LQ_GROUP - 1) / LQ_GROUP + 2 * warps;
}
__host__ __device__ int lq_live_quads(int tokens) { return (tokens + 1) / 2; }
__host__ __device__ size_t lq_ring_bytes(int in, int tokens, int warps) {
    const size_t per_slot = 8 * lq_live_quads(tokens) * sizeof(float4) + 2 * sizeof(uint64_t) + sizeof(uint32_t);
    return size_t(lq_ring_units(in, warps)) * per_slot + 16;
}

struct LqRing {
    float4* slot;     // [units][8 * quads]: lane 4 g + q (q < quads) at 8 q + g
    uint64_t* full;   // [units]
    uint64_t* empty;  // [units]
    uint32_t* count;  // [units]
    int* next;        // the next unit to hand out
    int units, quads;
    // Unit u's slot, once the unit before it there was added up.
    __device__ int acquire(int u) const {
        if (u >= units) mbarrier_wait(empty + u % units, uint32_t(u / units - 1) & 1u);
        return u % units;
    }
};

__device__ __forceinline__ LqRing lq_ring_at(void* at, int in, int tokens, int warps) {
    LqRing r;
    r.units = lq_ring_units(in, warps);
    r.quads = lq_live_quads(tokens);
    r.slot = static_cast<float4*>(at);
    r.full = reinterpret_cast<uint64_t*>(r.slot + size_t(r.units) * 8 * r.quads);
    r.empty = r.full + r.units;
    r.count = reinterpret_cast<uint32_t*>(r.empty + r.units);
    r.next = reinterpret_cast<int*>(r.count + r.units);
    return r;
}

// Dynamic shared memory of a launch: the tiles' start values, the x area; NormedResidual: the norm
// weight / normed row after it; the ring.
size_t lq_smem_bytes(int in, int tokens, LqIn input, int warps) {
    return lq_start_bytes(in) + lq_x_area_bytes(in, tokens, input) +
           (input == LqIn::NormedResidual ? lq_x_bytes(in) : 0) + lq_ring_bytes(in, tokens, warps);
}

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;      // LqIn::X: [T, in]
    void* y;            // [T, out] OutT, or the fp32 residual [out] for AddToResidual
    int T, out, in;
    ResidualNorm norm;  // LqIn::NormedResidual
    RowParts parts;     // n > 0: the bf16 rows stored as parts (linear.h), not at y
};

// The split over blocks (header): groups of LQ_GROUP tiles, `per_strip` per strip, `total` in all,
// block b < blocks <= total taking [first(b), first(b + 1)) (never empty); owner(group): the block
// taking it.
struct LqSplit {
    int64_t total;
    int per_strip, blocks;
    __device__ int64_t first(int b) const { return total * b / blocks; }
    __device__ int owner(int64_t group) const { return int(((group + 1) * blocks - 1) / total); }
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

// The kernel's static shared memory: 256 bytes for the folded norm's block sums (norm_row.cuh).
constexpr size_t LQ_STATIC_SMEM_BYTES = 256;

// Adds block b's piece of a strip cut between blocks (slot 0: the block's first strip, else 1) to
// the device scratch; true for the block that arrives last, which then holds the sum of all
// pieces in block order in `sum`. b_lo / b_hi: the strip's first and last blocks.
__device__ __forceinline__ bool lq_meet(const LqSplit& split, int b, int strip, int b_lo, int b_hi, bool first_strip,
                                        int lane, const float (&piece)[4], float (&sum)[4]) {
    lq_split_pieces[(b * 2 + (first_strip ? 0 : 1)) * 32 + lane] = make_float4(piece[0], piece[1], piece[2], piece[3]);
    __threadfence();
    __syncwarp();
    unsigned arrived = 0;
    if (lane == 0) arrived = atomicAdd(lq_split_arrivals + strip, 1u);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != unsigned(b_hi - b_lo)) return false;
    if (lane == 0) lq_split_arrivals[strip] = 0u;  // ready for the next use
    __threadfence();
    sum[0] = sum[1] = sum[2] = sum[3] = 0.0f;
    for (int v = b_lo; v <= b_hi; ++v) {  // the lowest block's piece is its last strip unless it began here
        const int slot = v == b_lo && split.first(v) != int64_t(strip) * split.per_strip ? 1 : 0;
        const float4 value = __ldcg(lq_split_pieces + (v * 2 + slot) * 32 + lane);
        sum[0] += value.x;
        sum[1] += value.y;
        sum[2] += value.z;
        sum[3] += value.w;
    }
    return true;
}

// The end of unit u (block-local; the block's groups begin at b0, `units` of them), a group of
// `strip`, with its sums in acc: alone in the block, the strip's sums are acc (its slot is passed
// on unused); else acc goes to its ring slot and the warp that completes the strip's count adds
// the slots in unit order. Then the rows, or the block's piece of a strip cut between blocks.
template <class OutT, LqOut OUT>
__device__ __forceinline__ void lq_finish_unit(const GemvLqParams& p, const LqSplit& split, const LqRing& ring,
                                               int64_t b0, int units, int u, int strip, int lane,
                                               const float (&acc)[4]) {
    const int64_t s0 = int64_t(strip) * split.per_strip, s1 = s0 + split.per_strip;
    const int ua = int(max(s0, b0) - b0), ub = int(min(s1, b0 + units) - b0) - 1;  // the strip's units here
    const int g = lane >> 2, q = lane & 3, s = ring.acquire(u);
    float sum[4] = {acc[0], acc[1], acc[2], acc[3]};
    if (ua != ub && q < ring.quads) ring.slot[(s * ring.quads + q) * 8 + g] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    mbarrier_arrive(ring.full + s);
    if (ua == ub) {
        mbarrier_arrive(ring.empty + s);
    } else {
        const int first = ring.acquire(ua);  // the count's slot is the strip's
        uint32_t arrived = 0;
        if (lane == 0) arrived = atomicAdd(ring.count + first, 1u);
        arrived = __shfl_sync(0xffffffffu, arrived, 0);
        if (arrived != uint32_t(ub - ua)) return;
        if (lane == 0) ring.count[first] = 0u;
        sum[0] = sum[1] = sum[2] = sum[3] = 0.0f;
        for (int v = ua; v <= ub; ++v) {
            const int at = v % ring.units;
            mbarrier_wait(ring.full + at, uint32_t(v / ring.units) & 1u);
            if (q < ring.quads) {
                const float4 value = ring.slot[(at * ring.quads + q) * 8 + g];
                sum[0] += value.x;
                sum[1] += value.y;
                sum[2] += value.z;
                sum[3] += value.w;
            }
        }
        for (int v = ua; v <= ub; ++v) mbarrier_arrive(ring.empty + v % ring.units);
    }
    if (s0 >= b0 && s1 <= b0 + units) {
        lq_store_rows<OutT, OUT>(p, strip, lane, sum);
        return;
    }
    float total[4];
    if (lq_meet(split, blockIdx.x, strip, split.owner(s0), split.owner(s1 - 1), strip == int(b0 / split.per_strip),
                lane, sum, total))
        lq_store_rows<OutT, OUT>(p, strip, lane, total);
}

// The block's next unit for the calling warp (one counter increment by lane 0).
__device__ __forceinline__ int lq_take_unit(const LqRing& ring, int lane) {
    int u = 0;
    if (lane == 0) u = atomicAdd(ring.next, 1);
    return __shfl_sync(0xffffffffu, u, 0);
}

template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS) gemv_lq_kernel(const GemvLqParams p) {
    static_assert(IN == LqIn::X || WARPS * 32 >= NORM_THREADS, "the folded norm runs on the GEMV block");
    static_assert(OUT == LqOut::Store || std::is_same_v<OutT, float>, "residual add: an fp32 row");
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    extern __shared__ uint4 lq_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = p.in / LQ_TILE_COLS, per_strip = (tiles + LQ_GROUP - 1) / LQ_GROUP;
    const LqSplit split{int64_t(p.out / LQ_TILE_ROWS) * per_strip, per_strip, int(gridDim.x)};
    const int64_t b0 = split.first(blockIdx.x);
    const int units = int(split.first(blockIdx.x + 1) - b0);
    float* start = reinterpret_cast<float*>(lq_smem);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);
    // NormedResidual (T = 1): the norm weight, overwritten in place by the normed row, after the x
    // area; the fp32 residual row (in * 4 bytes) lives in the x area until x is staged. The ring last.
    bf16* row = reinterpret_cast<bf16*>(xs + lq_x_area_bytes(p.in, p.T, IN) / 16);
    const LqRing ring = lq_ring_at(row + (IN == LqIn::NormedResidual ? p.in : 0), p.in, p.T, WARPS);
    for (int i = threadIdx.x; i < ring.units; i += blockDim.x) {  // used after the staging's barrier
        mbarrier_init(ring.full + i, 32);
        mbarrier_init(ring.empty + i, 32);
        ring.count[i] = 0u;
    }
    if (threadIdx.x == 0) *ring.next = WARPS;
    if constexpr (IN == LqIn::NormedResidual) {
        for (int i = threadIdx.x; i < p.in / 8; i += blockDim.x) cp_async_16(row + 8 * i, p.norm.weight + 8 * i, true);
        cp_async_commit();
    }

    // Unit u of the block: tile t of `strip` (a strip's tiles follow the previous strip's).
    int u = warp, strip = 0, t = 0;
    auto place = [&](int unit, int& at_strip, int& at_tile) {
        const int64_t group = b0 + unit;
        at_strip = int(group / per_strip);
        at_tile = int(group - int64_t(at_strip) * per_strip) * LQ_GROUP;
    };
    auto tile_at = [&](int at_strip, int at_tile) { return p.W + (size_t(at_strip) * tiles + at_tile) * TILE_BYTES; };
    place(u, strip, t);
    LqGroup<BITS> a, b;
    lq_load_group(a, tile_at(strip, t), u < units ? min(LQ_GROUP, tiles - t) : 0, lane);  // before the wait
    pdl_begin();
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
    timeline_mark(TL_STAGED);
    if (u >= units) return;  // the counter starts past every warp's first unit

    const LqLaneX x = lq_lane_x(xs, start, tiles, p.T, lane);
    int next = lq_take_unit(ring, lane);
    // One register group: request the next unit's tiles and take the one after it (its index is
    // needed one unit later), multiply this one, finish it.
    auto step = [&](LqGroup<BITS>& cur, LqGroup<BITS>& following) {
        const int count = min(LQ_GROUP, tiles - t);
        int next_strip = 0, next_t = 0, after = units;
        if (next < units) {
            place(next, next_strip, next_t);
            const int next_count = min(LQ_GROUP, tiles - next_t);
            if (next_count == LQ_GROUP) lq_load_group<BITS, true>(following, tile_at(next_strip, next_t), LQ_GROUP, lane);
            else lq_load_group(following, tile_at(next_strip, next_t), next_count, lane);
            after = lq_take_unit(ring, lane);
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint4* frag = x.frag + t * x.frag_step;
        if (count == LQ_GROUP) lq_mma_group<BITS, true>(cur, frag, x.frag_step, x.start + 4 * t, LQ_GROUP, acc);
        else lq_mma_group<BITS, false>(cur, frag, x.frag_step, x.start + 4 * t, count, acc);
        lq_finish_unit<OutT, OUT>(p, split, ring, b0, units, u, strip, lane, acc);
        u = next;
        strip = next_strip;
        t = next_t;
        next = after;
        return u < units;
    };
    while (step(a, b) && step(b, a)) {}
    timeline_mark_warp(TL_DONE);
}

// The grid: as many blocks as the GPU holds at once (fewer when the matrix gives a warp fewer
// than LQ_MIN_GROUPS groups), so the split's ranges all run in one wave.
template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS>
void launch_gemv_lq_blocks(const char* op, const GemvLqParams& p, int64_t groups, cudaStream_t stream) {
    const auto kernel = gemv_lq_kernel<BITS, OutT, IN, OUT, WARPS>;
    const size_t smem = lq_smem_bytes(p.in, p.T, IN, WARPS);
    if (smem + LQ_STATIC_SMEM_BYTES > 48 * 1024) allow_dynamic_smem(kernel, smem, op);
    // Blocks per SM by device and shared memory size, asked of the runtime once each (eager
    // few-token forwards, e.g. verify windows, launch this kernel hundreds of times per call).
    static std::mutex lock;
    static std::map<std::pair<int, size_t>, int> resident;
    int device = 0, per_sm = 0;
    LAMPO_CUDA_CHECK(cudaGetDevice(&device));
    {
        const std::lock_guard<std::mutex> hold(lock);
        auto it = resident.find({device, smem});
        if (it == resident.end()) {
            LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, WARPS * 32, smem));
            it = resident.emplace(std::make_pair(device, smem), per_sm).first;
        }
        per_sm = it->second;
    }
    const int64_t wanted = (groups + LQ_MIN_GROUPS * WARPS - 1) / (LQ_MIN_GROUPS * WARPS);
    const int blocks = int(std::min<int64_t>({wanted, int64_t(std::max(per_sm, 1)) * sm_count(), LQ_SPLIT_MAX_BLOCKS}));
    launch_pdl(op, kernel, blocks, WARPS * 32, smem, stream, p);
}

template <int BITS, class OutT, LqIn IN, LqOut OUT>
void launch_gemv_lq(const char* op, const GemvLqParams& p, cudaStream_t stream) {
    const int64_t groups = int64_t(p.out / LQ_TILE_ROWS) * ceil_div(p.in / LQ_TILE_COLS, LQ_GROUP);
    if (groups >= int64_t(LQ_MIN_GROUPS) * LQ_WIDE_WARPS * sm_count())
        return launch_gemv_lq_blocks<BITS, OutT, IN, OUT, LQ_WIDE_WARPS>(op, p, groups, stream);
    launch_gemv_lq_blocks<BITS, OutT, IN, OUT, LQ_WARPS>(op, p, groups, stream);
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
    const size_t room = smem_optin_bytes() - LQ_STATIC_SMEM_BYTES;
    require(lq_smem_bytes(p.in, 1, IN, LQ_WIDE_WARPS) <= room, op, "in = " + std::to_string(p.in) + " is too wide");
    int group = p.T;
    while (lq_smem_bytes(p.in, group, IN, LQ_WIDE_WARPS) > room) --group;
    for (int t0 = 0; t0 < p.T; t0 += group) {
        GemvLqParams q = p;
        q.x = p.x ? p.x + size_t(t0) * p.in : nullptr;
        q.y = p.y ? static_cast<OutT*>(p.y) + size_t(t0) * p.out : nullptr;
        for (int i = 0; i < p.parts.n; ++i) q.parts.dst[i] += size_t(t0) * (p.parts.first[i + 1] - p.parts.first[i]);
        q.T = std::min(group, p.T - t0);
        switch (bits) {
            case 4: launch_gemv_lq<4, OutT, IN, OUT>(op, q, stream); break;
            case 5: launch_gemv_lq<5, OutT, IN, OUT>(op, q, stream); break;
            default: launch_gemv_lq<6, OutT, IN, OUT>(op, q, stream); break;
        }
    }
}

}  // namespace

size_t lq_packed_bytes(int out, int in, int bits) {
    return size_t(out / LQ_TILE_ROWS) * size_t(in / LQ_TILE_COLS) * size_t(lq_tile_bytes(bits));
}

template <class OutT>
void gemv_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    run_gemv_lq<OutT>("gemv_lq", bits, {W, x, y, T, out, in, {}, {}}, stream);
}

void gemv_lq_parts(const uint8_t* W, int bits, const bf16* x, const RowParts& parts, int T, int out, int in,
                   cudaStream_t stream) {
    require(parts.n >= 1 && parts.n <= RowParts::MAX && parts.first[parts.n] <= out, "gemv_lq_parts",
            "needs 1..4 parts within the " + std::to_string(out) + " rows");
    run_gemv_lq<bf16>("gemv_lq_parts", bits, {W, x, nullptr, T, out, in, {}, parts}, stream);
}

template <class OutT>
void gemv_lq_normed(const uint8_t* W, int bits, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream) {
    require(x.residual && x.weight, "gemv_lq_normed", "needs the residual row and the norm weight");
    run_gemv_lq<OutT, LqIn::NormedResidual>("gemv_lq_normed", bits, {W, nullptr, y, 1, out, in, x, {}}, stream);
}

void gemv_lq_add_residual(const uint8_t* W, int bits, const bf16* x, float* residual, int out, int in,
                          cudaStream_t stream) {
    run_gemv_lq<float, LqIn::X, LqOut::AddToResidual>("gemv_lq_add_residual", bits,
                                                      {W, x, residual, 1, out, in, {}, {}}, stream);
}

template void gemv_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);
template void gemv_lq_normed<bf16>(const uint8_t*, int, const ResidualNorm&, bf16*, int, int, cudaStream_t);
template void gemv_lq_normed<float>(const uint8_t*, int, const ResidualNorm&, float*, int, int, cudaStream_t);

}  // namespace lampo
