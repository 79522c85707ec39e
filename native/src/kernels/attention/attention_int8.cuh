// attention_int8.cuh - the flash-attention core shared by attention_decode.cu (split over the key
// axis, partial results combined afterwards) and attention_prefill.cu (one block per token tile,
// final output). Private to those two files.
//
// A block serves one KV head and up to 64 query rows; row rho is (token t0 + rho / group,
// query head kvh * group + rho % group), so all query heads of a GQA group share every K/V read.
// Row rho at position pos(rho) sees keys [0, pos(rho)] intersected with the block's key range.
//
// Pipeline: K/V INT8 rows and their fp16 scales stream through shared memory in tiles of 64 keys
// (cp.async, 2 stages). Warp w owns M-tile w % MT (16 rows) and key quarter/half w / MT of each
// tile (KG key groups), keeping its own online softmax (max, sum, 16x256 fp32 output accumulator).
// Tensor cores do both products (mma.m16n8k16, fp16 inputs, fp32 accumulation):
//  - Q K^T: the head dim is the reduction axis, so it may be permuted freely as long as Q and K
//    agree. Lane (r = lane/4, c = lane%4) reads 16 contiguous INT8 bytes of key r (dims
//    64i + 16c .. +16, i = 0..3, all inside scale group i) which are four k-steps of its B
//    fragment; the Q fragments are pre-permuted the same way in shared memory (fp16), each k-step's
//    A fragment one 16-byte entry.
//  - P V: keys are the reduction axis and P comes straight from the Q K^T accumulators (the usual
//    FA2 register reuse). The output dim is permuted instead: n-tile j, column n holds dim
//    128 (j / 16) + 16 n + j % 16, so lane (r, c) reads 16 contiguous bytes of each of its keys.
//  INT8 -> fp16 is exact (magic-number trick on the offset-binary byte: 0x6400 | (q + 128) =
//  1152 + q), then one fp16 multiply by the scale (single rounding); p in [0, 1] as fp16. Softmax
//  is in fp32, base 2.
// At the end the KG warps of an M-tile merge (max, sum, output) through shared memory, over the Q
// fragments and the pipeline that no warp reads any more.
// Decode blocks read d_pos and issue the INT8 rows of their leading tiles (up to STAGES) that hold
// only keys of earlier forward passes before the PDL wait (the rule in common.cuh).
#pragma once

#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/mma_sync.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace attn {

constexpr int D = 256;                 // head dim of the Qwen3.5/3.6 family (checked by the launchers)
constexpr int KEYS = 64;               // keys per pipeline stage
constexpr int MAX_ROWS = 64;           // query rows per block
constexpr int GROUPS = D / KV_GROUP;   // scale groups per row (4)
constexpr int STAGE_BYTES = 2 * KEYS * D + 2 * KEYS * GROUPS * 2;
// Pipeline stages. Two keep a decode block at 74 KiB: with three (107 KiB) the kernels queued
// behind it in the decode step found no room beside its blocks (35B-A3B step 2.371 vs 2.326 ms at
// 8,192; docs/design/kernels-core.md), and prefill fits two blocks per SM.
constexpr int STAGES = 2;
static_assert(STAGES == 2, "the loop waits for every copy in flight (cp_async_wait<0>) and the prologue commits once");
constexpr int QFRAG_BYTES = 16 * D * 2;  // one M-tile of fp16 Q fragments
constexpr int MERGE_STRIDE = 268;        // floats per merged row: D + D/32 skew, bank-conflict free
constexpr float SCALE_LOG2 = 0.0625f * 1.4426950408889634f;  // 1/sqrt(D) * log2(e)

struct Params {
    const bf16* q;     // [T, nq, D]
    const bf16* gate;  // [T, nq * D]
    const uint8_t* k_cache;  // offset binary (ops.h)
    const uint8_t* v_cache;
    const half* k_scale;
    const half* v_scale;
    int nq, nkv, group, context_max;
    int T;       // query tokens in q
    // decode: the key axis [0, d_pos[0] + T) is cut into nsplit chunks (split_chunk)
    const int32_t* d_pos;
    int nsplit;
    float* part_o;   // [nsplit, T, nq, D]   unnormalised output relative to the split's max
    float* part_ml;  // [nsplit, T, nq, 2]   (max in log2 units, sum of exp2)
    // prefill: rows at positions pos0 + t, block b serves tokens [b * tile_tokens, ...)
    int pos0;
    int tile_tokens;
    bf16* out;  // [T, nq * D]
};

// Keys per decode split for a live length L: a multiple of KEYS, at least KEYS (splits of at least
// 2 or 4 tiles were measured no faster: docs/design/kernels-core.md).
__host__ __device__ inline int split_chunk(int L, int nsplit) {
    const int per = (L + nsplit - 1) / nsplit;
    const int rounded = (per + KEYS - 1) / KEYS * KEYS;
    return rounded > KEYS ? rounded : KEYS;
}

__host__ __device__ constexpr int merge_bytes(int mt, int kg) {
    return kg * mt * 16 * (MERGE_STRIDE + 2) * 4;
}

// The Q fragments and the pipeline, or the merge area laid over both once the key loop is done:
// 98 KiB for the prefill's four M-tiles, under the 99 KiB a block may have on sm_86 / sm_89 /
// sm_120 (the merge after the pipeline alone would take 99.5).
__host__ inline size_t smem_bytes(int mt, int kg) {
    const int loop = mt * QFRAG_BYTES + STAGES * STAGE_BYTES;
    const int merge = merge_bytes(mt, kg);
    return size_t(loop > merge ? loop : merge);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    return __byte_perm(a, b, sel);
}

// fp16x2 of the codes 1152 + q of two offset-binary INT8 values (bytes 0,1 of `u` when sel = 0x4140,
// bytes 2,3 when 0x4342): exact, no scale.
__device__ __forceinline__ uint32_t codes2(uint32_t u, uint32_t sel) { return prmt(u, 0x64646464u, sel); }

// The same two values -> fp16x2 of q * scale.
__device__ __forceinline__ uint32_t dequant2(uint32_t u, uint32_t sel, __half2 scale) {
    const uint32_t magic = codes2(u, sel);
    __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&magic), __half2half2(__ushort_as_half(0x6480)));
    v = __hmul2(v, scale);
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// Shared-memory layout of one pipeline stage (byte offsets).
struct Stage {
    uint8_t* base;
    __device__ uint8_t* k() const { return base; }
    __device__ uint8_t* v() const { return base + KEYS * D; }
    __device__ half* k_scale() const { return reinterpret_cast<half*>(base + 2 * KEYS * D); }
    __device__ half* v_scale() const { return reinterpret_cast<half*>(base + 2 * KEYS * D + KEYS * GROUPS * 2); }
};
// 16-byte chunk ch of key row `key` is stored at chunk ch ^ swizzle (conflict-free fragment reads).
__device__ __forceinline__ int k_swizzle(int key) { return (key & 1) << 2; }
__device__ __forceinline__ int v_swizzle(int key) { return ((key >> 1) & 3) << 1; }

// Eight bf16 values (a 16-byte row chunk) as eight fp16 values, in order.
__device__ __forceinline__ uint4 bf16x8_to_half(uint4 raw) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = pack_half2(__uint_as_float(w[k] << 16), __uint_as_float(w[k] & 0xffff0000u));
    return make_uint4(h[0], h[1], h[2], h[3]);
}

// A rows-as-M warp's output accumulators (rows r and r + 8 of its M-tile, 256 dims) scaled by their
// rows' online-softmax factors, where the max moved for some row of the warp.
__device__ __forceinline__ void rescale_rows(float (&o)[32][4], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
            o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
        }
    }
}

// One online-softmax step of a row (a query): the new running max from the step's max `mx` (already
// reduced over the lanes that share the row), the base the step's exponentials take (0 while
// nothing is visible) and the factor `alpha` the earlier sum and outputs take.
__device__ __forceinline__ void softmax_rebase(float& m, float& l, float mx, float& base, float& alpha) {
    const float m_new = fmaxf(m, mx);
    base = m_new == -INFINITY ? 0.0f : m_new;
    alpha = exp2f(m - base);
    m = m_new;
    l *= alpha;
}

// Online-softmax state of one warp: rows r and r + 8 of its M-tile.
struct WarpState {
    float o[32][4];
    float m[2];
    float l[2];
};

// A rows-as-M step's rebase of the warp's two rows: each row's max over the step (mx, this lane's
// part) reduced over the four lanes that share the row, then softmax_rebase.
__device__ __forceinline__ void rebase_rows(WarpState& s, float (&mx)[2], float (&base)[2], float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        softmax_rebase(s.m[h], s.l[h], mx[h], base[h], alpha[h]);
    }
}

// One step of 16 keys (stage rows kb .. kb + 15, global key index key0 + kb ...) for one warp.
__device__ __forceinline__ void attend16(WarpState& s, const Stage& st, const uint4* __restrict__ qw, int kb,
                                         int key0, int lim0, int lim1, int lane) {
    const int r = lane >> 2, c = lane & 3;
    float sc[2][4] = {};
    // ---- S = Q K^T over the 256 head dims (four 16-byte chunks per lane, four k-steps each)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t a[4][4];  // k-step t's A fragment, as stored (one 16-byte load each, no register moves)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const uint4 q = qw[(i * 4 + t) * 32 + lane];
            a[t][0] = q.x; a[t][1] = q.y; a[t][2] = q.z; a[t][3] = q.w;
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int key = kb + 8 * nt + r;
            const uint4 kw = *reinterpret_cast<const uint4*>(st.k() + key * D + (((4 * i + c) ^ k_swizzle(key)) * 16));
            const __half2 ks = __half2half2(st.k_scale()[key * GROUPS + i]);
            const uint32_t w[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
            for (int t = 0; t < 4; ++t)
                mma_f16_16816(sc[nt], a[t], dequant2(w[t], 0x4140, ks), dequant2(w[t], 0x4342, ks));
        }
    }
    // ---- online softmax (log2 domain); accumulator element e: row r (+8 for e >= 2), key 2c + e%2
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = key0 + kb + 8 * nt + 2 * c + (e & 1);
            const float v = sc[nt][e] * SCALE_LOG2;
            sc[nt][e] = key <= (e < 2 ? lim0 : lim1) ? v : -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
        }
    }
    float alpha[2], base[2];
    rebase_rows(s, mx, base, alpha);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sc[nt][e] = exp2f(sc[nt][e] - base[e >> 1]);
            s.l[e >> 1] += sc[nt][e];
        }
    }
    rescale_rows(s.o, alpha);
    const uint32_t pa[4] = {pack_half2(sc[0][0], sc[0][1]), pack_half2(sc[0][2], sc[0][3]),
                            pack_half2(sc[1][0], sc[1][1]), pack_half2(sc[1][2], sc[1][3])};
    // ---- O += P V: lane reads keys kb + 2c, +1, +8, +9, 16 bytes at dims 128 h + 16 r
    const int k0 = kb + 2 * c;
    const int swz = v_swizzle(k0);  // the same for the four keys
    const half* vs = st.v_scale();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int off = ((8 * h + r) ^ swz) * 16;
        const uint4 A0 = *reinterpret_cast<const uint4*>(st.v() + (k0 + 0) * D + off);
        const uint4 A1 = *reinterpret_cast<const uint4*>(st.v() + (k0 + 1) * D + off);
        const uint4 A2 = *reinterpret_cast<const uint4*>(st.v() + (k0 + 8) * D + off);
        const uint4 A3 = *reinterpret_cast<const uint4*>(st.v() + (k0 + 9) * D + off);
        const int g = 2 * h + (r >> 2);
        const __half2 s01 = __halves2half2(vs[(k0 + 0) * GROUPS + g], vs[(k0 + 1) * GROUPS + g]);
        const __half2 s89 = __halves2half2(vs[(k0 + 8) * GROUPS + g], vs[(k0 + 9) * GROUPS + g]);
        const uint32_t w0[4] = {A0.x, A0.y, A0.z, A0.w};
        const uint32_t w1[4] = {A1.x, A1.y, A1.z, A1.w};
        const uint32_t w2[4] = {A2.x, A2.y, A2.z, A2.w};
        const uint32_t w3[4] = {A3.x, A3.y, A3.z, A3.w};
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
            // interleave the two keys of each B register: [k0 b0, k1 b0, k0 b1, k1 b1], ...
            const uint32_t t01[2] = {prmt(w0[wi], w1[wi], 0x5140), prmt(w0[wi], w1[wi], 0x7362)};
            const uint32_t t89[2] = {prmt(w2[wi], w3[wi], 0x5140), prmt(w2[wi], w3[wi], 0x7362)};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint32_t sel = (e & 1) ? 0x4342 : 0x4140;
                mma_f16_16816(s.o[16 * h + 4 * wi + e], pa, dequant2(t01[e >> 1], sel, s01),
                              dequant2(t89[e >> 1], sel, s89));
            }
        }
    }
}

// A decode block's keys [kbeg, kend): split blockIdx.x of the live length d_pos[0] + T
// (split_chunk); none where kbeg >= kend. pos_first = d_pos[0], the first position the pass appends.
// d_pos and the keys below it come from earlier forward passes (common.cuh): read before the wait.
struct DecodeKeys {
    int pos_first, kbeg, kend;
};
__device__ __forceinline__ DecodeKeys decode_keys(const Params& p) {
    const int p0 = __ldcg(p.d_pos);
    const int L = p0 + p.T;
    const int chunk = split_chunk(L, p.nsplit), kbeg = blockIdx.x * chunk;
    return {p0, kbeg, min(L, kbeg + chunk)};
}

// A decode block's leading tiles of `keys` keys (at most `most`) that hold only keys below
// pos_first, the first position the pass appends: their INT8 rows may stream in before the PDL wait.
__device__ __forceinline__ int early_tiles(int kbeg, int kend, int pos_first, int ntiles, int most, int keys) {
    int early = 0;
    while (early < most && early < ntiles && min(kbeg + (early + 1) * keys, kend) <= pos_first) ++early;
    return early;
}

// Warms in L2 the K and V scale lines of keys kbeg .. kbeg + keys - 1 (clamped to kend - 1), before
// the PDL wait: the scales' 8-byte copies go through L1, so they wait for the wait.
template <int NT>
__device__ __forceinline__ void prefetch_scale_lines(const Params& p, size_t head_row0, int kbeg, int kend, int keys) {
    const int lines = keys * GROUPS * 2 / 128 + 1;  // 128-byte lines a scale run touches
    for (int e = threadIdx.x; e < 2 * lines; e += NT) {
        const int key = min(kbeg + (e % lines) * (128 / (GROUPS * 2)), kend - 1);
        const half* sc = (e < lines ? p.k_scale : p.v_scale) + (head_row0 + key) * GROUPS;
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(sc));
    }
}

// A rows-as-M warp's state into the merge area (merge_and_store's layout), its rows r and r + 8
// at slot row `slot0` and slot0 + 8: the row sums over the four lanes of a row first; dim(j, e) is
// the output dim of element e (and e + 2, the row + 8) of accumulator j.
template <class Dim>
__device__ __forceinline__ void put_rows_state(float* mo, float* mml, WarpState& s, int slot0, int c, Dim dim) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        s.l[h] += __shfl_xor_sync(0xffffffffu, s.l[h], 1);
        s.l[h] += __shfl_xor_sync(0xffffffffu, s.l[h], 2);
    }
    float* o0 = mo + slot0 * MERGE_STRIDE;
    float* o1 = mo + (slot0 + 8) * MERGE_STRIDE;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int d = dim(j, e);
            o0[d + (d >> 5)] = s.o[j][e];
            o1[d + (d >> 5)] = s.o[j][2 + e];
        }
    }
    if (c == 0) {
        mml[slot0 * 2] = s.m[0];
        mml[slot0 * 2 + 1] = s.l[0];
        mml[(slot0 + 8) * 2] = s.m[1];
        mml[(slot0 + 8) * 2 + 1] = s.l[1];
    }
}

// The end of a block whose KG warps of each M-tile kept their own online softmax over a share of the
// keys: their states, in the merge area (row rho of warp group k at mo[(k * MT * 16 + rho) *
// MERGE_STRIDE + d + d / 32], its max and sum at mml[(k * MT * 16 + rho) * 2]), merged per row, then
// stored: the prefill's output bf16(o / l * sigmoid(gate)), or a decode split's unnormalised output
// with its max and sum (Params::part_o / part_ml). Every thread of the block takes part.
template <int MT, int KG, bool PREFILL>
__device__ __forceinline__ void merge_and_store(const float* mo, const float* mml, const Params& p, int nrows, int t0,
                                                int split, int kvh) {
    constexpr int NT = MT * KG * 32;
    for (int e = threadIdx.x; e < nrows * D; e += NT) {
        const int row = e / D, d = e % D;
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < KG; ++k) M = fmaxf(M, mml[(k * MT * 16 + row) * 2]);
        float acc = 0.0f, l = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int k = 0; k < KG; ++k) {
                const float w = exp2f(mml[(k * MT * 16 + row) * 2] - M);
                acc += w * mo[(k * MT * 16 + row) * MERGE_STRIDE + d + (d >> 5)];
                l += w * mml[(k * MT * 16 + row) * 2 + 1];
            }
        }
        const int t = t0 + row / p.group, qh = kvh * p.group + row % p.group;
        const size_t idx = (size_t(t) * p.nq + qh) * D + d;
        if (PREFILL) {
            p.out[idx] = __float2bfloat16(acc / l * sigmoid(__bfloat162float(p.gate[idx])));
        } else {
            const size_t prow = (size_t(split) * p.T + t) * p.nq + qh;
            p.part_o[prow * D + d] = acc;
            if (d == 0) {
                p.part_ml[prow * 2] = M;
                p.part_ml[prow * 2 + 1] = l;
            }
        }
    }
}

// Q entry e of the block's fragment build: 8 dims 64 i + 16 (ln % 4) + 8 part of row
// mt * 16 + hh * 8 + ln / 4, where e = (((mt * 4 + i) * 2 + hh) * 2 + part) * 32 + ln.
struct QChunk {
    int ln, part, hh, i, mt;
    __device__ explicit QChunk(int e) : ln(e & 31), part((e >> 5) & 1), hh((e >> 6) & 1), i((e >> 7) & 3), mt(e >> 9) {}
};

template <int MT, int KG, bool PREFILL>
__global__ void __launch_bounds__(MT * KG * 32) attn_int8_kernel(const Params p) {
    constexpr int NT = MT * KG * 32;
    extern __shared__ __align__(16) uint8_t smem[];
    uint4* qfrag = reinterpret_cast<uint4*>(smem);
    uint8_t* pipe = smem + MT * QFRAG_BYTES;
    const int kvh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    int t0, ntok, kbeg, kend, pos_first, split = 0;
    if (PREFILL) {
        const int tile = gridDim.x - 1 - blockIdx.x;  // longest key ranges first
        t0 = tile * p.tile_tokens;
        ntok = min(p.tile_tokens, p.T - t0);
        pos_first = p.pos0 + t0;
        kbeg = 0;
        kend = pos_first + ntok;
    } else {
        const DecodeKeys keys = decode_keys(p);
        if (keys.kbeg >= keys.kend) return;
        split = blockIdx.x;
        kbeg = keys.kbeg;
        kend = keys.kend;
        t0 = 0;
        ntok = p.T;
        pos_first = keys.pos_first;
    }
    const int nrows = ntok * p.group;

    // ---- K/V tile loader (cp.async, zero-fill beyond kend): the INT8 rows, then their scales
    const size_t head_row0 = size_t(kvh) * p.context_max;
    // Thread t copies 16-byte chunk t % 16 of key rows t / 16 + ROWS j of K and V: fixed chunk, fixed
    // swizzles (ROWS a multiple of 8) and a fixed stride, so a tile wholly below kend (every tile but
    // a split's last) takes one copy per row and no per-row arithmetic.
    constexpr int ROWS = NT / 16;  // key rows one pass of the block's threads covers
    const int ch = threadIdx.x % 16, first = threadIdx.x / 16;
    auto load_kv = [&](int tile, int slot) {
        const int key0 = kbeg + tile * KEYS;
        const Stage st{pipe + slot * STAGE_BYTES};
        auto copy = [&](int key, size_t row, bool valid) {  // key row `key` of the stage from cache row `row`
            cp_async_16(st.k() + key * D + ((ch ^ k_swizzle(key)) * 16), p.k_cache + row * D + ch * 16, valid);
            cp_async_16(st.v() + key * D + ((ch ^ v_swizzle(key)) * 16), p.v_cache + row * D + ch * 16, valid);
        };
        constexpr int PASSES = (KEYS + ROWS - 1) / ROWS;
        if (key0 + KEYS <= kend) {  // the whole tile is live (the same branch for every thread)
            const size_t row = head_row0 + key0 + first;
#pragma unroll
            for (int j = 0; j < PASSES; ++j)
                if (KEYS % ROWS == 0 || first + j * ROWS < KEYS) copy(first + j * ROWS, row + j * ROWS, true);
        } else {
#pragma unroll
            for (int j = 0; j < PASSES; ++j) {
                const int key = first + j * ROWS;
                if (KEYS % ROWS != 0 && key >= KEYS) break;
                const bool valid = key0 + key < kend;
                copy(key, head_row0 + (valid ? key0 + key : 0), valid);
            }
        }
    };
    auto load_scales = [&](int tile, int slot) {
        const int key0 = kbeg + tile * KEYS;
        const Stage st{pipe + slot * STAGE_BYTES};
        for (int e = threadIdx.x; e < 2 * KEYS; e += NT) {
            const bool is_v = e >= KEYS;
            const int key = e & (KEYS - 1);
            const bool valid = key0 + key < kend;
            const size_t row = head_row0 + (valid ? key0 + key : 0);
            cp_async_8((is_v ? st.v_scale() : st.k_scale()) + key * GROUPS,
                       (is_v ? p.v_scale : p.k_scale) + row * GROUPS, valid);
        }
    };

    // Decode: the split's leading tiles (up to STAGES) that hold no key this pass appends (>=
    // pos_first) stream in before the wait (cp.async.cg, through L2) and their scale lines are
    // warmed in L2 (the scales' 8-byte copies go through L1, so they wait for the wait).
    const int ntiles = (kend - kbeg + KEYS - 1) / KEYS;
    const int early = PREFILL ? 0 : early_tiles(kbeg, kend, pos_first, ntiles, STAGES, KEYS);
    if (early > 0) {
        for (int s = 0; s < early; ++s) load_kv(s, s);
        prefetch_scale_lines<NT>(p, head_row0, kbeg, kend, early * KEYS);
    }
    pdl_begin();

    // The prologue tiles first (they do not need Q), then Q: every thread's Q loads of a group go
    // out before any is converted (compiled as written, the loop waited for each load in turn).
    const int prologue = max(STAGES - 1, early);  // tiles in flight before the loop
    for (int s = 0; s < prologue && s < ntiles; ++s) {
        if (s >= early) load_kv(s, s);
        load_scales(s, s);
    }
    cp_async_commit();

    // ---- Q -> fp16 fragments. Thread e converts QChunk(e) and stores mma A fragments: entry
    //      ((mt * 4 + i) * 4 + t) * 32 + ln is k-step t of group i for lane ln = (r, c): {row r,
    //      row r + 8} x dims 64 i + 16 c + 4 t + {0, 1}, then the same rows' dims + {2, 3}.
    constexpr int Q_PER_THREAD = MT * 512 / NT, Q_GROUP = Q_PER_THREAD < 4 ? Q_PER_THREAD : 4;
    static_assert(MT * 512 % NT == 0 && Q_PER_THREAD % Q_GROUP == 0, "whole groups of Q entries per thread");
#pragma unroll
    for (int g0 = 0; g0 < Q_PER_THREAD; g0 += Q_GROUP) {
        uint4 raw[Q_GROUP];
#pragma unroll
        for (int g = 0; g < Q_GROUP; ++g) {
            const QChunk qc(threadIdx.x + (g0 + g) * NT);
            const int row = qc.mt * 16 + qc.hh * 8 + (qc.ln >> 2);
            raw[g] = make_uint4(0u, 0u, 0u, 0u);
            if (row < nrows) {
                const int t = t0 + row / p.group, qh = kvh * p.group + row % p.group;
                raw[g] = *reinterpret_cast<const uint4*>(p.q + (size_t(t) * p.nq + qh) * D + 64 * qc.i +
                                                         16 * (qc.ln & 3) + 8 * qc.part);
            }
        }
#pragma unroll
        for (int g = 0; g < Q_GROUP; ++g) {
            const int e = threadIdx.x + (g0 + g) * NT;
            const uint4 h = bf16x8_to_half(raw[g]);
            const QChunk qc(e);
            uint32_t* a = reinterpret_cast<uint32_t*>(qfrag + ((qc.mt * 4 + qc.i) * 4 + 2 * qc.part) * 32 + qc.ln);
            a[qc.hh] = h.x;  // k-step 2 part
            a[2 + qc.hh] = h.y;
            a[128 + qc.hh] = h.z;  // k-step 2 part + 1, 32 entries on
            a[128 + 2 + qc.hh] = h.w;
        }
    }

    const int mt = warp % MT, kg = warp / MT;
    const int row0 = mt * 16 + (lane >> 2), row1 = row0 + 8;
    const int lim0 = row0 < nrows ? min(pos_first + row0 / p.group, kend - 1) : -1;
    const int lim1 = row1 < nrows ? min(pos_first + row1 / p.group, kend - 1) : -1;
    const int warp_lim = __reduce_max_sync(0xffffffffu, max(lim0, lim1));
    const uint4* qw = qfrag + mt * 512;

    WarpState s;
#pragma unroll
    for (int j = 0; j < int(sizeof(s.o) / sizeof(s.o[0])); ++j) s.o[j][0] = s.o[j][1] = s.o[j][2] = s.o[j][3] = 0.0f;
    s.m[0] = s.m[1] = -INFINITY;
    s.l[0] = s.l[1] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = it + STAGES - 1;
        if (next >= prologue && next < ntiles) {
            load_kv(next, next % STAGES);
            load_scales(next, next % STAGES);
        }
        cp_async_commit();
        const Stage st{pipe + (it % STAGES) * STAGE_BYTES};
        const int key0 = kbeg + it * KEYS;
#pragma unroll 1
        for (int sub = 0; sub < 4 / KG; ++sub) {
            const int kb = kg * (KEYS / KG) + sub * 16;
            if (key0 + kb > warp_lim) break;  // causal: nothing visible from here on for this warp
            attend16(s, st, qw, kb, key0, lim0, lim1, lane);
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // ---- merge the KG key groups of each M-tile, then write
    float* mo = reinterpret_cast<float*>(smem);        // [KG][MT*16][MERGE_STRIDE], over Q and the pipeline
    float* mml = mo + KG * MT * 16 * MERGE_STRIDE;     // [KG][MT*16][2]
    const int c = lane & 3;
    // the output dims as attend16 permuted them
    put_rows_state(mo, mml, s, kg * MT * 16 + row0, c,
                   [c](int j, int e) { return 128 * (j >> 4) + 16 * (2 * c + e) + (j & 15); });
    __syncthreads();
    merge_and_store<MT, KG, PREFILL>(mo, mml, p, nrows, t0, split, kvh);
}

}  // namespace attn
}  // namespace lampo
