// attention_f16_tiles.cuh - the INT8 KV cache dequantized once per block into fp16 tiles in shared
// memory, for the attention forms whose warps share every tile of keys: the tiled prefill
// (attention_prefill.cu) and the tiled verify window (attention_window.cu). Private to those files.
//
// A tile of KEYS_T keys arrives as INT8 rows and fp16 scales by cp.async into an Int8Stage (K rows,
// V rows, K scales, V scales; rows past the key range zero-filled, their source not read); the
// block's threads then dequantize it into fp16 K and V tiles, fp16(q * scale) with one rounding as
// the decode core computes it. fp16 rows (Q, K, V) are 512 bytes, 16-byte chunk c of row r stored
// at chunk c ^ (r % 8) (chunk_at), so ldmatrix reads them bank-conflict free.
// attend_tile: one warp's 16 query rows against NJ * 8 keys of the fp16 tiles: S = Q K^T (Q and K
// fragments by ldmatrix, mma.m16n8k16 f16 -> f32), the online softmax (base 2), O += P V (V by
// ldmatrix.trans). The warp's output n-tile j holds dims 8j .. 8j + 7: lane (r, c) = (lane / 4,
// lane % 4) dims 8j + 2c, + 1 of rows r and r + 8.
#pragma once

#include "kernels/attention/attention_int8.cuh"

namespace lampo {
namespace attn {
namespace tiles {

constexpr int ROW_BYTES = D * 2;  // an fp16 row of 256 dims

// Byte offset of 16-byte chunk `chunk` (0..31) of fp16 row `row`.
__device__ __forceinline__ int chunk_at(int row, int chunk) { return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4); }

// One INT8 stage of KEYS_T keys: K rows, V rows, K scales, V scales.
template <int KEYS_T>
struct Int8Stage {
    static constexpr int BYTES = 2 * KEYS_T * D + 2 * KEYS_T * GROUPS * 2;
    uint8_t* base;
    __device__ uint8_t* k() const { return base; }
    __device__ uint8_t* v() const { return base + KEYS_T * D; }
    __device__ half* k_scale() const { return reinterpret_cast<half*>(base + 2 * KEYS_T * D); }
    __device__ half* v_scale() const { return reinterpret_cast<half*>(base + 2 * KEYS_T * D + KEYS_T * GROUPS * 2); }
};

// A tiled block's shared memory: Q's q_rows fp16 rows, the fp16 K and V tiles of keys_t keys, then
// `stages` INT8 stages.
struct TileSmem {
    uint8_t *q16, *k16, *v16, *pipe;
    __device__ TileSmem(uint8_t* smem, int q_rows, int keys_t)
        : q16(smem), k16(smem + q_rows * ROW_BYTES), v16(k16 + keys_t * ROW_BYTES), pipe(v16 + keys_t * ROW_BYTES) {}
    static constexpr size_t bytes(int q_rows, int keys_t, int stages, int stage_bytes) {
        return size_t(q_rows + 2 * keys_t) * ROW_BYTES + size_t(stages) * stage_bytes;
    }
};

// The INT8 K and V rows of keys key0 .. key0 + KEYS_T - 1 of the KV head whose rows start at
// head_row0, by cp.async.cg (through L2); keys >= kend are zero-filled. Threads of the block share
// the 16-byte copies.
template <int KEYS_T, int NT>
__device__ __forceinline__ void load_rows(const Int8Stage<KEYS_T>& st, const Params& p, size_t head_row0, int key0,
                                          int kend) {
    for (int e = threadIdx.x; e < 2 * KEYS_T * 16; e += NT) {
        const bool is_v = e >= KEYS_T * 16;
        const int key = (e >> 4) % KEYS_T, ch = e & 15;
        const bool valid = key0 + key < kend;
        const size_t row = head_row0 + (valid ? key0 + key : 0);
        cp_async_16((is_v ? st.v() : st.k()) + key * D + ch * 16, (is_v ? p.v_cache : p.k_cache) + row * D + ch * 16,
                    valid);
    }
}

// The same keys' fp16 scales (GROUPS a row), zero-filled past kend.
template <int KEYS_T, int NT>
__device__ __forceinline__ void load_scales(const Int8Stage<KEYS_T>& st, const Params& p, size_t head_row0, int key0,
                                            int kend) {
    for (int e = threadIdx.x; e < 2 * KEYS_T; e += NT) {
        const bool is_v = e >= KEYS_T;
        const int key = e % KEYS_T;
        const bool valid = key0 + key < kend;
        const size_t row = head_row0 + (valid ? key0 + key : 0);
        cp_async_8((is_v ? st.v_scale() : st.k_scale()) + key * GROUPS, (is_v ? p.v_scale : p.k_scale) + row * GROUPS,
                   valid);
    }
}

// A stage -> the fp16 K and V tiles: thread e takes 8 dims (8 INT8 bytes) of one key of K or V.
template <int KEYS_T, int NT>
__device__ __forceinline__ void dequantize(const Int8Stage<KEYS_T>& st, uint8_t* k16, uint8_t* v16) {
    for (int e = threadIdx.x; e < 2 * KEYS_T * 32; e += NT) {
        const bool is_v = e >= KEYS_T * 32;
        const int key = (e >> 5) % KEYS_T, chunk = e & 31;
        const uint2 raw = *reinterpret_cast<const uint2*>((is_v ? st.v() : st.k()) + key * D + chunk * 8);
        const __half2 s = __half2half2((is_v ? st.v_scale() : st.k_scale())[key * GROUPS + (chunk >> 3)]);
        *reinterpret_cast<uint4*>((is_v ? v16 : k16) + chunk_at(key, chunk)) =
            make_uint4(dequant2(raw.x, 0x4140, s), dequant2(raw.x, 0x4342, s), dequant2(raw.y, 0x4140, s),
                       dequant2(raw.y, 0x4342, s));
    }
}

// The block's ROWS query rows as fp16 rows (zero past nrows): row rho is token t0 + rho / group,
// query head kvh * group + rho % group; thread e takes 8 dims (one 16-byte chunk).
template <int ROWS, int NT>
__device__ __forceinline__ void load_q(uint8_t* q16, const Params& p, int t0, int nrows, int kvh) {
    for (int e = threadIdx.x; e < ROWS * 32; e += NT) {
        const int row = e >> 5, chunk = e & 31;
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (row < nrows) {
            const int t = t0 + row / p.group, qh = kvh * p.group + row % p.group;
            raw = *reinterpret_cast<const uint4*>(p.q + (size_t(t) * p.nq + qh) * D + chunk * 8);
        }
        *reinterpret_cast<uint4*>(q16 + chunk_at(row, chunk)) = bf16x8_to_half(raw);
    }
}

// One warp: its query rows q_row0 .. q_row0 + 15 of q16 against keys kofs .. kofs + 8 NJ - 1 of the
// fp16 tiles, whose first is key index key. lim0 / lim1: the last key rows r / r + 8 see (-1: none);
// `masked`: some key of these is past some row's last one.
template <int NJ>
__device__ __forceinline__ void attend_tile(WarpState& s, const uint8_t* q16, const uint8_t* k16, const uint8_t* v16,
                                            int q_row0, int kofs, int key, int lim0, int lim1, bool masked, int lane) {
    static_assert(NJ % 2 == 0 && NJ <= 8, "whole k-steps of 16 keys, at most 64");
    const int c = lane & 3;
    // ldmatrix row addresses: matrix lane / 8 of the four
    const int mi = lane >> 3, lr = lane & 7;
    const int q_row = q_row0 + (mi & 1) * 8 + lr, q_chunk = mi >> 1;  // A: rows, then dims + 8
    const int k_key = kofs + (mi >> 1) * 8 + lr, k_chunk = mi & 1;    // B of S: keys + 8, dims + 8
    const int v_key = kofs + (mi & 1) * 8 + lr, v_chunk = mi >> 1;    // B of PV (trans): keys + 8, dims + 8

    // ---- S = Q K^T: 16 rows x 8 NJ keys (n-tile j: keys 8j .. 8j + 7), 16 k-steps over the dims
    float sc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll(NJ > 4 ? 4 : 16)  // fully unrolled with 64 keys it spills (255 registers)
    for (int st = 0; st < 16; ++st) {
        uint32_t a[4];
        ldmatrix_x4(a, q16 + chunk_at(q_row, 2 * st + q_chunk));
#pragma unroll
        for (int jj = 0; jj < NJ / 2; ++jj) {
            uint32_t b[4];
            ldmatrix_x4(b, k16 + chunk_at(16 * jj + k_key, 2 * st + k_chunk));
            mma_f16_16816(sc[2 * jj], a, b[0], b[1]);
            mma_f16_16816(sc[2 * jj + 1], a, b[2], b[3]);
        }
    }
    // ---- online softmax (log2 domain); element e: row r (+8 for e >= 2), key 8j + 2c + e % 2
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = sc[j][e] * SCALE_LOG2;
            if (masked && key + 8 * j + 2 * c + (e & 1) > (e < 2 ? lim0 : lim1)) v = -INFINITY;
            sc[j][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
    }
    float alpha[2], base[2];
    rebase_rows(s, mx, base, alpha);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sc[j][e] = exp2f(sc[j][e] - base[e >> 1]);
            s.l[e >> 1] += sc[j][e];
        }
    }
    rescale_rows(s.o, alpha);
    // ---- O += P V: k-steps of 16 keys (P's A fragment from S's n-tiles 2kk, 2kk + 1), 32 n-tiles of dims
#pragma unroll
    for (int kk = 0; kk < NJ / 2; ++kk) {
        const uint32_t pa[4] = {pack_half2(sc[2 * kk][0], sc[2 * kk][1]), pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                                pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < 16; ++nn) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, v16 + chunk_at(16 * kk + v_key, 2 * nn + v_chunk));
            mma_f16_16816(s.o[2 * nn], pa, b[0], b[1]);
            mma_f16_16816(s.o[2 * nn + 1], pa, b[2], b[3]);
        }
    }
}

}  // namespace tiles
}  // namespace attn
}  // namespace lampo
