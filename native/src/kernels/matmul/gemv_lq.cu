// gemv_lq.cu - y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T, W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x, y bf16 (or fp32 y), fp32 sums.
//
// Units handed out within each block: a strip (16 rows) is cut into groups of LQ_GROUP tiles (its
// last group may be short) and its groups into units of p.unit_groups (its last unit may be
// short); the units, strip by strip, are dealt out in equal contiguous ranges to a grid that the
// GPU holds at once (blocks of LQ_WARPS warps, or LQ_WIDE_WARPS for a large plain-x product: each
// block stages x once in fragment order, so fewer blocks stage it less often). Inside a block the
// warps take units from a shared counter as they finish the last one, so the warps of an SM end
// together however unevenly the memory system serves them (with equal fixed shares they ended
// 4.5-6.9 us apart on the 27B). A unit's sums start from zero and go to its own slot of the
// block's shared memory, without any ordering between warps; after one barrier the block adds the
// slots of each strip in unit order (deterministic whichever warp took which unit) and writes the
// rows. A strip cut between blocks is met in a device scratch: each block's piece, and the block
// that arrives last at the strip's counter adds the pieces in block order (fenced device-wide; the
// counters stay zero between launches). A warp's tiles go through registers (LqGroup: the next
// group's loads are in flight while the current group's products run, across units too), or on
// sm_90+ through a ring of shared-memory slots filled by bulk copies (the ring form, below unless
// its x is a folded norm wider than LQ_RING_MAX_NORMED_IN or it gives a warp more than
// LQ_RING_MAX_GROUPS groups, an LM head; lq_ring_slots): the same units, the same sums. Every
// weight byte is read once and serves all T tokens. Launched with PDL: each warp's first group is
// requested before the wait (weights are immutable); the scratch and counters are touched only
// after it, so consecutive launches never share them. The ring form lets the next kernel launch
// only once a warp of every block has run out of units: its shared memory and few registers would
// otherwise let the following kernels become resident beside it from the start and load their
// weights into its stream (the step measured 0.151 / 0.049 ms shorter on the 27B / 35B-A3B at q5
// with the later trigger).
//
// The decode step's two folded forms (T = 1; linear.h), as gemv.cu's for BF16 weights:
// - LqIn::NormedResidual (gemv_lq_normed): every block builds x = bf16(rmsnorm(residual) * (1 + w))
//   itself (norm_row.cuh: add_rmsnorm's thread mapping and order, so the values are rmsnorm's bits)
//   in shared memory and stages it from there (lq_stage.cuh); block 0 may also write it out. The
//   norm weight is copied in before the wait; the residual row is kept in the x staging area
//   between the norm's two passes. The units and the sums are those of gemv_lq in LQ_WARPS blocks:
//   the result is bit for bit rmsnorm followed by gemv_lq wherever gemv_lq takes those blocks.
// - LqOut::AddToResidual (gemv_lq_add_residual): residual[row] += float(bf16(y[row])), the rounding
//   of a bf16 output added by add_rmsnorm; LqOut::SetResidual: residual[row] = 0 + float(bf16(y[row]))
//   (the same on a zeroed residual, without zeroing it: the MTP pass's fc).
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

// Warps per block: 8 (two blocks per SM), or 16 (one per SM) for a plain-x GEMV that fills every SM
// with them: each block stages all of x, so half the blocks stage it half as often (at T = 5 the
// 27B's down projection takes 16% less time). The folded-norm form keeps NORM_THREADS.
constexpr int LQ_WARPS = 8;
constexpr int LQ_WIDE_WARPS = 16;
constexpr int LQ_MIN_GROUPS = 2;            // groups per warp the grid aims for at least
constexpr int LQ_SPLIT_MAX_BLOCKS = 512;    // the scratch's size: blocks of one launch at most
constexpr int LQ_SPLIT_MAX_STRIPS = 1 << 16;
// The units' sums in shared memory: at most this many bytes per block (T * 16 floats per unit), so
// at T = 1 a block takes up to 512 units (an LM head's units hold several groups each).
constexpr size_t LQ_UNIT_SUMS_MAX_BYTES = 32 * 1024;
// The ring form (sm_90+, below): slots per warp at most, groups a warp requests before the PDL
// wait, the widest folded-norm x and the most groups per warp it takes. Measured in the decode step
// (q5, docs/benchmarks.md): 4 slots or 4 groups before the wait were slower than 2 and 1 on both
// models; rings for the 27B's 5,120-column folded norms made its step slower although each of
// those GEMVs alone ran faster, and the LM heads run slower alone in rings.
constexpr int LQ_RING_MAX = 2;
constexpr int LQ_RING_PRE_WAIT = 1;
constexpr int LQ_RING_MAX_NORMED_IN = 4096;
constexpr int64_t LQ_RING_MAX_GROUPS = 32;  // per warp of a full wave (16 warps per SM)

// The ring's instructions (mbarrier transactions, bulk copies) exist from sm_90 on; on older GPUs
// the launcher never picks the ring form and its body is not compiled.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool LQ_RING_ARCH = false;
#else
constexpr bool LQ_RING_ARCH = true;
#endif

// Pieces of strips cut between blocks: [block][slot 0: its first strip, 1: its last][token][row];
// per strip, the count of pieces arrived (zero between launches).
__device__ float lq_split_pieces[LQ_SPLIT_MAX_BLOCKS * 2 * GEMV_MAX_T * LQ_TILE_ROWS];
__device__ unsigned lq_split_arrivals[LQ_SPLIT_MAX_STRIPS];

enum class LqIn { X, NormedResidual };
enum class LqOut { Store, AddToResidual, SetResidual };

// Shared memory for x: `tokens` staged tokens and the zero fragment; NormedResidual (one token):
// room for the fp32 residual row that the norm keeps there before x is staged.
__host__ __device__ size_t lq_x_area_bytes(int in, int tokens, LqIn input) {
    const size_t staged = size_t(tokens) * lq_x_bytes(in) + LQ_ZERO_X_BYTES;
    return input == LqIn::NormedResidual && sizeof(float) * in > staged ? sizeof(float) * in : staged;
}

// Dynamic shared memory before the units' sums: the tiles' start values, the x area;
// NormedResidual: the norm weight / normed row after it.
__host__ __device__ size_t lq_smem_bytes(int in, int tokens, LqIn input) {
    return lq_start_bytes(in) + lq_x_area_bytes(in, tokens, input) +
           (input == LqIn::NormedResidual ? lq_x_bytes(in) : 0);
}


// The units (header): `per_strip` units of `unit_tiles` tiles per strip (the last one shorter where
// the strip's tiles run out), numbered strip by strip, `total` in all; block b of `blocks` takes
// [first(b), first(b + 1)); owner(unit): the block taking it. A unit's strip is one multiply-high
// (strip_magic = ceil(2^40 / per_strip): exact while unit * per_strip < 2^40), since a warp locates
// every unit it takes right before requesting its tiles.
struct LqUnitAt {
    int t, t_end;  // its tiles [t, t_end) of its strip
    size_t tile;   // the index of tile t in W
};
struct LqUnits {
    int tiles = 0, per_strip = 0, unit_tiles = 0, total = 0, blocks = 0;
    uint64_t strip_magic = 0;
    LqUnits() = default;
    LqUnits(int out, int in, int unit_groups, int blocks_)
        : tiles(in / LQ_TILE_COLS),
          per_strip((tiles + unit_groups * LQ_GROUP - 1) / (unit_groups * LQ_GROUP)),
          unit_tiles(unit_groups * LQ_GROUP),
          total(out / LQ_TILE_ROWS * per_strip),
          blocks(blocks_),
          strip_magic(((uint64_t(1) << 40) + per_strip - 1) / per_strip) {}
    __host__ __device__ int first(int b) const { return int(int64_t(total) * b / blocks); }
    __host__ __device__ int owner(int unit) const { return int((int64_t(unit + 1) * blocks - 1) / total); }
    __host__ __device__ int most_per_block() const { return (total + blocks - 1) / blocks; }
    __device__ int strip(int unit) const { return int((uint64_t(unit) * strip_magic) >> 40); }
    __device__ LqUnitAt at(int unit) const {
        const int s = strip(unit), t = (unit - s * per_strip) * unit_tiles;
        return {t, min(tiles, t + unit_tiles), size_t(s) * tiles + t};
    }
};

struct GemvLqParams {
    const uint8_t* W;
    const bf16* x;      // LqIn::X: [T, in]
    void* y;            // [T, out] OutT, or the fp32 residual [out] for Add/SetResidual
    int T, out, in;
    int slots;          // the ring form: groups per warp's ring
    ResidualNorm norm;  // LqIn::NormedResidual
    RowParts parts;     // n > 0: the bf16 rows stored as parts (linear.h), not at y
    LqUnits units;      // set by the launcher
};

// The units' sums of one block: [unit - first][token][row], fp32.
__host__ __device__ size_t lq_unit_sums_bytes(const LqUnits& units, int tokens) {
    return size_t(units.most_per_block()) * tokens * LQ_TILE_ROWS * sizeof(float);
}

// A ring slot's tile, tile count and whether its group ends its unit, in one int.
__device__ __forceinline__ int lq_slot_code(int t, int count, bool ends) { return t << 8 | count << 1 | int(ends); }

// The kernel's static shared memory at most: the unit counter and the arrival flags, the ring
// form's barriers and each slot's unit and tile, and 256 bytes for the folded norm's block sums
// (norm_row.cuh).
constexpr size_t lq_static_smem_bytes(int warps) {
    return 16 + (sizeof(uint64_t) + sizeof(int2)) * warps * LQ_RING_MAX + 256;
}

// y's element (token, row) from its fp32 sum.
template <class OutT, LqOut OUT>
__device__ __forceinline__ void lq_store(const GemvLqParams& p, int token, int row, float v) {
    OutT* y = static_cast<OutT*>(p.y);
    if constexpr (OUT == LqOut::AddToResidual) y[row] = __ldcg(y + row) + __bfloat162float(__float2bfloat16(v));
    else if constexpr (OUT == LqOut::SetResidual) y[row] = 0.0f + __bfloat162float(__float2bfloat16(v));
    else if constexpr (std::is_same_v<OutT, float>) y[size_t(token) * p.out + row] = v;
    else if (bf16* at = p.parts.n ? p.parts.at(token, row) : y + size_t(token) * p.out + row)
        *at = __float2bfloat16(v);
}

// A unit's sums (the lane's C fragment: rows g, g + 8, tokens 2 quad, 2 quad + 1) into its slot.
__device__ __forceinline__ void lq_keep_unit(float* slot, int tokens, int lane, const float (&acc)[4]) {
    const int g = lane >> 2, quad = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = 2 * quad + (i & 1);
        if (token < tokens) slot[token * LQ_TILE_ROWS + g + 8 * (i >> 1)] = acc[i];
    }
}

// After every warp's units (and a barrier): the block's strips, each (token, row) the sum of the
// strip's units in the block in a fixed order (eight interleaved runs, then a tree); a strip wholly in the block is stored, a strip cut
// between blocks meets the other blocks' pieces in the device scratch, and the block arriving last
// adds them in block order and stores the rows.
template <class OutT, LqOut OUT>
__device__ __forceinline__ void lq_finish_block(const GemvLqParams& p, const LqUnits& units, int u_begin, int u_end,
                                                const float* sums) {
    __shared__ bool last_here[2];  // the block arrived last at its first / last strip
    const int per = p.T * LQ_TILE_ROWS, b = blockIdx.x;
    const int s_lo = units.strip(u_begin), s_hi = units.strip(u_end - 1);
    auto slot_of = [&](int s) { return s == s_lo ? 0 : 1; };
    auto cut = [&](int s) { return s * units.per_strip < u_begin || (s + 1) * units.per_strip > u_end; };
    const int items = (s_hi - s_lo + 1) * per;
    // Eight threads per (strip, token, row): thread j adds units j, j + 8, ..., then three shuffles.
    const int j = threadIdx.x & 7;
    for (int base = 0; base < items; base += blockDim.x / 8) {
        const int i = base + threadIdx.x / 8, s = s_lo + i / per, e = i % per;
        float v = 0.0f;
        if (i < items) {
            const int u_lo = max(s * units.per_strip, u_begin), u_hi = min((s + 1) * units.per_strip, u_end);
            for (int u = u_lo + j; u < u_hi; u += 8) v += sums[(u - u_begin) * per + e];
        }
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        if (i >= items || j != 0) continue;
        if (!cut(s)) lq_store<OutT, OUT>(p, e / LQ_TILE_ROWS, s * LQ_TILE_ROWS + e % LQ_TILE_ROWS, v);
        else __stcg(lq_split_pieces + (b * 2 + slot_of(s)) * (GEMV_MAX_T * LQ_TILE_ROWS) + e, v);
    }
    if (!cut(s_lo) && !cut(s_hi)) return;  // (uniform in the block)
    __threadfence();
    __syncthreads();
    if (threadIdx.x < 2) {
        const int s = threadIdx.x == 0 ? s_lo : s_hi;
        bool last = false;
        if (cut(s) && (threadIdx.x == 0 || s_hi != s_lo)) {
            const int b_lo = units.owner(s * units.per_strip), b_hi = units.owner((s + 1) * units.per_strip - 1);
            last = atomicAdd(lq_split_arrivals + s, 1u) == unsigned(b_hi - b_lo);
            if (last) lq_split_arrivals[s] = 0u;  // ready for the next use
        }
        last_here[threadIdx.x] = last;
    }
    __syncthreads();
    if (!last_here[0] && !last_here[1]) return;
    __threadfence();
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        const int s = s_lo + i / per, e = i % per;
        if (!cut(s) || !last_here[s == s_lo ? 0 : 1]) continue;
        const int first_unit = s * units.per_strip;
        const int b_lo = units.owner(first_unit), b_hi = units.owner(first_unit + units.per_strip - 1);
        float v = 0.0f;
        for (int c = b_lo; c <= b_hi; ++c) {  // the lowest block's piece is its last strip unless it began here
            const int slot = c == b_lo && units.first(c) != first_unit ? 1 : 0;
            v += __ldcg(lq_split_pieces + (c * 2 + slot) * (GEMV_MAX_T * LQ_TILE_ROWS) + e);
        }
        lq_store<OutT, OUT>(p, e / LQ_TILE_ROWS, s * LQ_TILE_ROWS + e % LQ_TILE_ROWS, v);
    }
}

// RING (sm_90+): each warp's groups come through a ring of p.slots groups in shared memory, each
// slot filled by one bulk copy that lane 0 issues (with the slot's unit and tile beside it) and
// completes on the slot's mbarrier; lane 0 requests LQ_RING_PRE_WAIT groups before the wait and
// refills a slot as soon as its products are done, taking the next unit from the counter when a
// unit's groups are all requested, and marks the end by an arrival without a copy. Otherwise each
// warp's groups go through registers (LqGroup, two in turn). Both take the units in the same way:
// a warp's first two units are fixed (first + warp, first + WARPS + warp), later ones come from the
// block's counter, each asked for one unit ahead so that its latency hides behind a unit's work.
template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS, bool RING>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS) gemv_lq_kernel(const GemvLqParams p) {
    static_assert(IN == LqIn::X || WARPS * 32 == NORM_THREADS, "the folded norm runs on the GEMV block");
    static_assert(OUT == LqOut::Store || std::is_same_v<OutT, float>, "residual add: an fp32 row");
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    constexpr int GROUP_BYTES = LQ_GROUP * TILE_BYTES;
    extern __shared__ uint4 lq_smem[];
    __shared__ int unit_counter;
    __shared__ uint64_t ring_full[RING ? WARPS * LQ_RING_MAX : 1];
    __shared__ int2 ring_unit[RING ? WARPS * LQ_RING_MAX : 1];  // each slot's (unit, tile); unit -1: the end
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const LqUnits& units = p.units;
    const int tiles = units.tiles;
    const int u_begin = units.first(blockIdx.x), u_end = units.first(blockIdx.x + 1);
    if (threadIdx.x == 0) unit_counter = u_begin + 2 * WARPS;  // read after the staging's barrier
    float* start = reinterpret_cast<float*>(lq_smem);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);
    // NormedResidual (T = 1): the norm weight, overwritten in place by the normed row, after the x
    // area; the fp32 residual row (in * 4 bytes) lives in the x area until x is staged.
    bf16* row = reinterpret_cast<bf16*>(xs + lq_x_area_bytes(p.in, 1, IN) / 16);
    float* sums = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(lq_smem) + lq_smem_bytes(p.in, p.T, IN));
    if constexpr (IN == LqIn::NormedResidual) {
        for (int i = threadIdx.x; i < p.in / 8; i += blockDim.x) cp_async_16(row + 8 * i, p.norm.weight + 8 * i, true);
        cp_async_commit();
    }

    // The warp's unit and the one after it; `asked`: lane 0's answer from the counter for the one
    // after that (-1 until asked).
    int unit = u_begin + warp, next = u_begin + WARPS + warp, asked = -1;
    LqGroup<BITS> a, b;
    // The ring form: the warp's slots, lane 0's requests (unit, tile) and count.
    uint8_t* ring = reinterpret_cast<uint8_t*>(sums) + lq_unit_sums_bytes(units, p.T) + warp * p.slots * GROUP_BYTES;
    uint64_t* full = ring_full + (RING ? warp * LQ_RING_MAX : 0);
    int2* slot_unit = ring_unit + (RING ? warp * LQ_RING_MAX : 0);
    LqUnitAt r_at = units.at(unit);  // lane 0's next request: tile r_t of r_unit
    int r_unit = unit, r_t = r_at.t, issued = 0;
    bool r_done = false;
    auto request = [&](bool may_ask) {  // lane 0: the warp's next group into its next slot, or the end
        if constexpr (RING && LQ_RING_ARCH) {
            const int slot = issued++ % p.slots;
            if (r_unit >= u_end) {
                slot_unit[slot] = make_int2(-1, 0);
                mbarrier_arrive(&full[slot]);
                r_done = true;
                return;
            }
            const int count = min(LQ_GROUP, r_at.t_end - r_t);
            slot_unit[slot] = make_int2(r_unit, lq_slot_code(r_t, count, r_t + count == r_at.t_end));
            mbarrier_arrive_expect_tx(&full[slot], count * TILE_BYTES);
            bulk_load(ring + slot * GROUP_BYTES, p.W + (r_at.tile + (r_t - r_at.t)) * TILE_BYTES, count * TILE_BYTES,
                      &full[slot]);
            r_t += count;
            if (r_t == r_at.t_end) {
                r_unit = next;
                next = asked;
                asked = may_ask ? atomicAdd(&unit_counter, 1) : -1;
                r_at = units.at(r_unit);
                r_t = r_at.t;
            }
        }
    };
    const LqUnitAt first_at = units.at(unit);
    if constexpr (RING && LQ_RING_ARCH) {  // before the wait: weights only
        if (lane == 0) {
            for (int s = 0; s < p.slots; ++s) mbarrier_init(&full[s], 1);
            mbarrier_init_fence();
            for (int i = 0; i < min(p.slots, LQ_RING_PRE_WAIT) && !r_done; ++i) request(false);
        }
        __syncwarp();
    } else {
        lq_load_group(a, p.W + first_at.tile * TILE_BYTES, unit < u_end ? min(LQ_GROUP, first_at.t_end - first_at.t) : 0,
                      lane);
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
        lq_stage_x_from<LqXSource::Global>(xs, start, p.x, p.T, p.in, lq_code_centre<BITS>(), threadIdx.x,
                                           blockDim.x);
    }
    __syncthreads();
    timeline_mark(TL_STAGED);

    const LqLaneX x = lq_lane_x(xs, start, tiles, p.T, lane);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto unit_done = [&](int done) {  // the unit's sums into its slot
        lq_keep_unit(sums + (done - u_begin) * p.T * LQ_TILE_ROWS, p.T, lane, acc);
        acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    };
    if constexpr (RING && LQ_RING_ARCH) {
        if (lane == 0) {
            if (next < 0) next = atomicAdd(&unit_counter, 1);  // the unit after the one requested before the wait
            asked = atomicAdd(&unit_counter, 1);
            while (issued < p.slots && !r_done) request(true);  // the ring's remaining slots
        }
        int slot = 0;
        uint32_t parity = 0;
        while (true) {
            mbarrier_wait(&full[slot], parity);
            const int2 at = slot_unit[slot];
            if (at.x < 0) break;
            const int at_t = at.y >> 8, count = (at.y >> 1) & 0x7f;
            const uint8_t* tiles_at = ring + slot * GROUP_BYTES;
            const uint4* frag = x.frag + at_t * x.frag_step;
            if (count == LQ_GROUP) {
                lq_load_group<BITS, true, true>(a, tiles_at, LQ_GROUP, lane);
                lq_mma_group<BITS, true>(a, frag, x.frag_step, x.start + 4 * at_t, LQ_GROUP, acc);
            } else {
                lq_load_group<BITS, false, true>(a, tiles_at, count, lane);
                lq_mma_group<BITS, false>(a, frag, x.frag_step, x.start + 4 * at_t, count, acc);
            }
            __syncwarp();  // every lane has read the slot and its unit: refill it
            if (lane == 0 && !r_done) request(true);
            if (++slot == p.slots) slot = 0, parity ^= 1u;
            if (at.y & 1) unit_done(at.x);
        }
        pdl_trigger();
    } else {
        if (lane == 0 && next < u_end) asked = atomicAdd(&unit_counter, 1);
        int t = first_at.t, t_end = first_at.t_end;
        const uint8_t* src = p.W + first_at.tile * TILE_BYTES;
        // One register group: request the next one (this unit's next tiles, or the next unit's
        // first), multiply this one.
        auto step = [&](LqGroup<BITS>& cur, LqGroup<BITS>& following) {
            const int count = min(LQ_GROUP, t_end - t), done = unit, cur_t = t;
            const bool ends = t + count == t_end;
            if (ends) {
                unit = next;
                next = __shfl_sync(0xffffffffu, asked, 0);
                if (lane == 0) asked = next < u_end ? atomicAdd(&unit_counter, 1) : -1;
                const LqUnitAt at = units.at(unit);
                t = at.t;
                t_end = at.t_end;
                src = p.W + at.tile * TILE_BYTES;
            } else {
                t += count;
                src += count * TILE_BYTES;
            }
            const int n_count = unit < u_end ? min(LQ_GROUP, t_end - t) : 0;
            if (n_count == LQ_GROUP) lq_load_group<BITS, true>(following, src, LQ_GROUP, lane);
            else lq_load_group(following, src, n_count, lane);
            const uint4* frag = x.frag + cur_t * x.frag_step;
            if (count == LQ_GROUP) lq_mma_group<BITS, true>(cur, frag, x.frag_step, x.start + 4 * cur_t, LQ_GROUP, acc);
            else lq_mma_group<BITS, false>(cur, frag, x.frag_step, x.start + 4 * cur_t, count, acc);
            if (ends) unit_done(done);
        };
        while (unit < u_end) {
            step(a, b);
            if (unit >= u_end) break;
            step(b, a);
        }
    }
    timeline_mark_warp(TL_DONE);
    __syncthreads();  // every unit's sums are in shared memory
    if (u_begin < u_end) lq_finish_block<OutT, OUT>(p, units, u_begin, u_end, sums);
}

// Shared memory of one ring slot per warp of a `warps`-warp block: a group of tiles each.
constexpr size_t lq_ring_slot_bytes(int bits, int warps) { return size_t(warps) * LQ_GROUP * lq_tile_bytes(bits); }

// Ring slots per warp for a launch of `warps`-warp blocks, 16 warps per SM: as many as fit beside
// the launch's other shared memory (at most LQ_RING_MAX, the units' sums counted at their most);
// 0 (the register form) where fewer than two fit, before sm_90, for weights not 16-byte aligned
// (bulk copies need it), and where the register form measured faster in the decode step (H200,
// q5): a folded norm wider than LQ_RING_MAX_NORMED_IN (the 27B's input projections: +0.62 ms a step
// in rings) and more than LQ_RING_MAX_GROUPS groups per warp (the LM heads: 4-17 us slower alone
// in rings).
int lq_ring_slots(const GemvLqParams& p, int bits, int warps, LqIn input, int64_t groups) {
    if (!sm90_or_newer() || reinterpret_cast<uintptr_t>(p.W) % 16 != 0) return 0;
    if ((input == LqIn::NormedResidual && p.in > LQ_RING_MAX_NORMED_IN) ||
        groups > LQ_RING_MAX_GROUPS * 16 * sm_count())
        return 0;
    static const size_t per_sm = size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
    static const size_t reserved = size_t(device_attribute(cudaDevAttrReservedSharedMemoryPerBlock));
    const size_t per_block = std::min(per_sm / (16 / warps) - reserved, smem_optin_bytes());
    const size_t fixed = lq_smem_bytes(p.in, p.T, input) + LQ_UNIT_SUMS_MAX_BYTES + lq_static_smem_bytes(warps);
    const size_t slot = lq_ring_slot_bytes(bits, warps);
    const size_t slots = per_block > fixed ? (per_block - fixed) / slot : 0;
    return slots < 2 ? 0 : int(std::min<size_t>(slots, LQ_RING_MAX));
}

// Groups per unit for a grid of `blocks`: one, or as many as keep a block's sums within
// LQ_UNIT_SUMS_MAX_BYTES (at most a strip's groups: beyond that, more bytes).
int lq_unit_groups(const GemvLqParams& p, int blocks) {
    const int per_strip = ceil_div(p.in / LQ_TILE_COLS, LQ_GROUP);
    int unit_groups = 1;
    while (unit_groups < per_strip &&
           lq_unit_sums_bytes(LqUnits(p.out, p.in, unit_groups, blocks), p.T) > LQ_UNIT_SUMS_MAX_BYTES)
        ++unit_groups;
    return unit_groups;
}

// The grid: as many blocks as the GPU holds at once (fewer when the matrix gives a warp fewer than
// LQ_MIN_GROUPS groups), so all units run in one wave: 16 warps per SM, or fewer where the shared
// memory (x, the units' sums, the rings) allows fewer blocks.
template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS, bool RING>
void launch_gemv_lq_blocks(const char* op, GemvLqParams p, int64_t groups, cudaStream_t stream) {
    const auto kernel = gemv_lq_kernel<BITS, OutT, IN, OUT, WARPS, RING>;
    const size_t fixed = lq_smem_bytes(p.in, p.T, IN) + (RING ? size_t(p.slots) * lq_ring_slot_bytes(BITS, WARPS) : 0);
    // Blocks per SM by device and shared memory size, asked of the runtime once each (eager
    // few-token forwards, e.g. verify windows, launch this kernel hundreds of times per call).
    static std::mutex lock;
    static std::map<std::pair<int, size_t>, int> resident;
    int device = 0;
    LAMPO_CUDA_CHECK(cudaGetDevice(&device));
    auto blocks_per_sm = [&](size_t smem) {
        const std::lock_guard<std::mutex> hold(lock);
        auto it = resident.find({device, smem});
        if (it == resident.end()) {
            int per_sm = 0;
            LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, WARPS * 32, smem));
            it = resident.emplace(std::make_pair(device, smem), per_sm).first;
        }
        return std::min(it->second, 16 / WARPS);
    };
    const int64_t wanted = (groups + LQ_MIN_GROUPS * WARPS - 1) / (LQ_MIN_GROUPS * WARPS);
    int blocks = int(std::min<int64_t>({wanted, int64_t(16 / WARPS) * sm_count(), LQ_SPLIT_MAX_BLOCKS}));
    size_t smem = 0;
    while (true) {  // fewer blocks give each more units' sums: until the grid fits
        p.units = LqUnits(p.out, p.in, lq_unit_groups(p, blocks), blocks);
        smem = fixed + lq_unit_sums_bytes(p.units, p.T);
        if (smem + lq_static_smem_bytes(WARPS) > 48 * 1024) allow_dynamic_smem(kernel, smem, op);
        const int fit = std::max(blocks_per_sm(smem), 1) * sm_count();
        if (blocks <= fit) break;
        blocks = fit;
    }
    launch_pdl(op, kernel, blocks, WARPS * 32, smem, stream, p);
}

template <int BITS, class OutT, LqIn IN, LqOut OUT, int WARPS>
void launch_gemv_lq_form(const char* op, GemvLqParams p, int64_t groups, cudaStream_t stream) {
    p.slots = lq_ring_slots(p, BITS, WARPS, IN, groups);
    if (p.slots) launch_gemv_lq_blocks<BITS, OutT, IN, OUT, WARPS, true>(op, p, groups, stream);
    else launch_gemv_lq_blocks<BITS, OutT, IN, OUT, WARPS, false>(op, p, groups, stream);
}

template <int BITS, class OutT, LqIn IN, LqOut OUT>
void launch_gemv_lq(const char* op, const GemvLqParams& p, cudaStream_t stream) {
    const int64_t groups = int64_t(p.out / LQ_TILE_ROWS) * ceil_div(p.in / LQ_TILE_COLS, LQ_GROUP);
    if constexpr (IN == LqIn::X) {
        if (groups >= int64_t(LQ_MIN_GROUPS) * LQ_WIDE_WARPS * sm_count())
            return launch_gemv_lq_form<BITS, OutT, IN, OUT, LQ_WIDE_WARPS>(op, p, groups, stream);
    }
    launch_gemv_lq_form<BITS, OutT, IN, OUT, LQ_WARPS>(op, p, groups, stream);
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
    const size_t room = smem_optin_bytes() - lq_static_smem_bytes(LQ_WIDE_WARPS) - LQ_UNIT_SUMS_MAX_BYTES;
    require(lq_smem_bytes(p.in, 1, IN) <= room, op, "in = " + std::to_string(p.in) + " is too wide");
    int group = p.T;
    while (lq_smem_bytes(p.in, group, IN) > room) --group;
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
    run_gemv_lq<OutT>("gemv_lq", bits, {W, x, y, T, out, in, 0, {}, {}, {}}, stream);
}

void gemv_lq_parts(const uint8_t* W, int bits, const bf16* x, const RowParts& parts, int T, int out, int in,
                   cudaStream_t stream) {
    require(parts.n >= 1 && parts.n <= RowParts::MAX && parts.first[parts.n] <= out, "gemv_lq_parts",
            "needs 1..4 parts within the " + std::to_string(out) + " rows");
    run_gemv_lq<bf16>("gemv_lq_parts", bits, {W, x, nullptr, T, out, in, 0, {}, parts, {}}, stream);
}

template <class OutT>
void gemv_lq_normed(const uint8_t* W, int bits, const ResidualNorm& x, OutT* y, int out, int in, cudaStream_t stream) {
    require(x.residual && x.weight, "gemv_lq_normed", "needs the residual row and the norm weight");
    run_gemv_lq<OutT, LqIn::NormedResidual>("gemv_lq_normed", bits, {W, nullptr, y, 1, out, in, 0, x, {}, {}}, stream);
}

void gemv_lq_add_residual(const uint8_t* W, int bits, const bf16* x, float* residual, int out, int in,
                          cudaStream_t stream, bool set) {
    const GemvLqParams p{W, x, residual, 1, out, in, 0, {}, {}, {}};
    if (set) run_gemv_lq<float, LqIn::X, LqOut::SetResidual>("gemv_lq_set_residual", bits, p, stream);
    else run_gemv_lq<float, LqIn::X, LqOut::AddToResidual>("gemv_lq_add_residual", bits, p, stream);
}

template void gemv_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);
template void gemv_lq_normed<bf16>(const uint8_t*, int, const ResidualNorm&, bf16*, int, int, cudaStream_t);
template void gemv_lq_normed<float>(const uint8_t*, int, const ResidualNorm&, float*, int, int, cudaStream_t);

}  // namespace lampo
