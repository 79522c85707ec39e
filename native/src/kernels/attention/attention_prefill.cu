// attention_prefill.cu - causal flash attention for a prefill chunk over the INT8 KV cache;
// contract in ops.h (attn_prefill_int8). Token t of the chunk sits at pos0 + t and sees cache rows
// [0, pos0 + t] (the chunk's own rows already appended). Output bf16(o / l * sigmoid(gate)).
//
// The forms, the same rows of the same GQA groups (row rho of a block: token t0 + rho / group,
// query head kvh * group + rho % group), tiles with the most keys first:
// - The tiled forms, WARPS warps and 16 * WARPS query rows a block (floor(rows / group) tokens):
//   each tile of KEYS_T keys of K and V comes in as INT8 by cp.async (2 stages), then the block's
//   threads dequantize it once into fp16 tiles in shared memory (fp16(q * scale), one rounding, as
//   the decode core does), and each warp runs S = Q K^T (16 rows x KEYS_T keys), the online softmax
//   (base 2) and O += P V on the tensor cores (mma.m16n8k16 f16 -> f32) with its fragments read by
//   ldmatrix from fp16 rows of 512 bytes whose 16-byte chunk c is stored at c ^ (row % 8) (bank-
//   conflict free). Q is kept the same way as fp16 rows. Two block barriers a tile: the INT8 tile
//   has arrived / the fp16 tile is written. 8 warps and 64-key tiles take 194 KiB of shared memory
//   (H100 / H200); 4 warps and 32-key tiles 97 KiB, what a block may hold on sm_86 / sm_89 / sm_120.
// - The core shared with decode (attention_int8.cuh), 4 warps of 16 rows, each dequantizing the
//   K/V bytes it uses in registers (so the INT8 -> fp16 work is repeated per M-tile), for a GPU with
//   less shared memory a block, or LAMPO_ATTN_PREFILL_TILED=0.
#include <climits>
#include <cstdlib>
#include <string>

#include "kernels/attention/attention_int8.cuh"
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {

namespace tiled {
using attn::D;
using attn::GROUPS;
constexpr int ROW_BYTES = D * 2;  // an fp16 row of 256 dims
constexpr int STAGES = 2;         // INT8 stages

// One INT8 stage of KEYS_T keys: K rows, V rows, K scales, V scales.
template <int KEYS_T>
struct Int8Stage {
    static constexpr int BYTES = 2 * KEYS_T * D + 2 * KEYS_T * GROUPS * 2;
    uint8_t* base;
    __device__ int8_t* k() const { return reinterpret_cast<int8_t*>(base); }
    __device__ int8_t* v() const { return reinterpret_cast<int8_t*>(base + KEYS_T * D); }
    __device__ half* k_scale() const { return reinterpret_cast<half*>(base + 2 * KEYS_T * D); }
    __device__ half* v_scale() const { return reinterpret_cast<half*>(base + 2 * KEYS_T * D + KEYS_T * GROUPS * 2); }
};

// Shared memory of a form: Q's fp16 rows, the fp16 K and V tiles, the INT8 stages.
template <int WARPS, int KEYS_T>
constexpr size_t smem_bytes() {
    return size_t(WARPS * 16) * ROW_BYTES + size_t(2 * KEYS_T) * ROW_BYTES + size_t(STAGES) * Int8Stage<KEYS_T>::BYTES;
}

// Byte offset of 16-byte chunk `chunk` (0..31) of fp16 row `row`.
__device__ __forceinline__ int chunk_at(int row, int chunk) { return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4); }

template <int WARPS, int KEYS_T>
__global__ void __launch_bounds__(WARPS * 32, 1) attn_prefill_tiled_kernel(const attn::Params p) {
    static_assert(KEYS_T % 16 == 0 && KEYS_T <= 64, "whole k-steps of 16 keys");
    constexpr int NT = WARPS * 32, NJ = KEYS_T / 8;  // threads; n-tiles of S
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* q16 = smem;
    uint8_t* k16 = smem + WARPS * 16 * ROW_BYTES;
    uint8_t* v16 = k16 + KEYS_T * ROW_BYTES;
    uint8_t* pipe = v16 + KEYS_T * ROW_BYTES;
    const int kvh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tile = gridDim.x - 1 - blockIdx.x;  // longest key ranges first
    const int t0 = tile * p.tile_tokens, ntok = min(p.tile_tokens, p.T - t0);
    const int pos_first = p.pos0 + t0, kend = pos_first + ntok, nrows = ntok * p.group;
    const int ntiles = (kend + KEYS_T - 1) / KEYS_T;
    const size_t head_row0 = size_t(kvh) * p.context_max;

    auto load_int8 = [&](int it) {  // tile it's INT8 rows and scales into stage it % 2, zero past kend
        const int key0 = it * KEYS_T;
        const Int8Stage<KEYS_T> st{pipe + (it % STAGES) * Int8Stage<KEYS_T>::BYTES};
        for (int e = threadIdx.x; e < 2 * KEYS_T * 16; e += NT) {
            const bool is_v = e >= KEYS_T * 16;
            const int key = (e >> 4) % KEYS_T, ch = e & 15;
            const bool valid = key0 + key < kend;
            const size_t row = head_row0 + (valid ? key0 + key : 0);
            cp_async_16((is_v ? st.v() : st.k()) + key * D + ch * 16, (is_v ? p.v_cache : p.k_cache) + row * D + ch * 16,
                        valid);
        }
        for (int e = threadIdx.x; e < 2 * KEYS_T; e += NT) {
            const bool is_v = e >= KEYS_T;
            const int key = e % KEYS_T;
            const bool valid = key0 + key < kend;
            const size_t row = head_row0 + (valid ? key0 + key : 0);
            cp_async_8((is_v ? st.v_scale() : st.k_scale()) + key * GROUPS, (is_v ? p.v_scale : p.k_scale) + row * GROUPS,
                       valid);
        }
    };
    load_int8(0);
    cp_async_commit();

    // Q -> fp16 rows (zero past the block's rows): thread e takes 8 dims (one 16-byte chunk)
    for (int e = threadIdx.x; e < WARPS * 16 * 32; e += NT) {
        const int row = e >> 5, chunk = e & 31;
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (row < nrows) {
            const int t = t0 + row / p.group, qh = kvh * p.group + row % p.group;
            raw = *reinterpret_cast<const uint4*>(p.q + (size_t(t) * p.nq + qh) * D + chunk * 8);
        }
        *reinterpret_cast<uint4*>(q16 + chunk_at(row, chunk)) = attn::bf16x8_to_half(raw);
    }

    const int r = lane >> 2, c = lane & 3;
    const int row0 = warp * 16 + r, row1 = row0 + 8;
    const int lim0 = row0 < nrows ? pos_first + row0 / p.group : -1;  // the last key each row sees
    const int lim1 = row1 < nrows ? pos_first + row1 / p.group : -1;
    const int warp_lim = __reduce_max_sync(0xffffffffu, max(lim0, lim1));
    const int warp_min = __reduce_min_sync(0xffffffffu, row0 < nrows ? lim0 : INT_MAX);  // every row's
    // ldmatrix row addresses: matrix l / 8 of the four
    const int mi = lane >> 3, lr = lane & 7;
    const int q_row = warp * 16 + (mi & 1) * 8 + lr, q_chunk = mi >> 1;          // A: rows, then dims + 8
    const int k_key = (mi >> 1) * 8 + lr, k_chunk = mi & 1;                       // B of S: keys + 8, dims + 8
    const int v_key = (mi & 1) * 8 + lr, v_chunk = mi >> 1;                       // B of PV (trans): keys + 8, dims + 8

    float o[32][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int it = 0; it < ntiles; ++it) {
        if (it + 1 < ntiles) load_int8(it + 1);  // its stage held tile it - 1, dequantized before the last barrier
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // tile it's INT8 bytes are in; every warp is done with the fp16 tile of it - 1
        {  // dequantize: thread e takes 8 dims (8 INT8 bytes) of one key of K or V -> one fp16 chunk
            const Int8Stage<KEYS_T> st{pipe + (it % STAGES) * Int8Stage<KEYS_T>::BYTES};
            for (int e = threadIdx.x; e < 2 * KEYS_T * 32; e += NT) {
                const bool is_v = e >= KEYS_T * 32;
                const int key = (e >> 5) % KEYS_T, chunk = e & 31;
                const uint2 raw = *reinterpret_cast<const uint2*>((is_v ? st.v() : st.k()) + key * D + chunk * 8);
                const __half2 s = __half2half2((is_v ? st.v_scale() : st.k_scale())[key * GROUPS + (chunk >> 3)]);
                const uint32_t lo = raw.x ^ 0x80808080u, hi = raw.y ^ 0x80808080u;
                *reinterpret_cast<uint4*>((is_v ? v16 : k16) + chunk_at(key, chunk)) =
                    make_uint4(attn::dequant2(lo, 0x4140, s), attn::dequant2(lo, 0x4342, s), attn::dequant2(hi, 0x4140, s),
                               attn::dequant2(hi, 0x4342, s));
            }
        }
        __syncthreads();  // the fp16 tile is written
        const int key0 = it * KEYS_T;
        if (key0 > warp_lim) continue;  // causal: nothing of this tile is visible to the warp's rows

        // ---- S = Q K^T: 16 rows x KEYS_T keys (n-tile j: keys 8j .. 8j + 7), 16 k-steps over the dims
        float sc[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll 4  // fully unrolled it spills (255 registers)
        for (int s = 0; s < 16; ++s) {
            uint32_t a[4];
            ldmatrix_x4(a, q16 + chunk_at(q_row, 2 * s + q_chunk));
#pragma unroll
            for (int jj = 0; jj < NJ / 2; ++jj) {
                uint32_t b[4];
                ldmatrix_x4(b, k16 + chunk_at(16 * jj + k_key, 2 * s + k_chunk));
                mma_f16_16816(sc[2 * jj], a, b[0], b[1]);
                mma_f16_16816(sc[2 * jj + 1], a, b[2], b[3]);
            }
        }
        // ---- online softmax (log2 domain); element e: row r (+8 for e >= 2), key 8j + 2c + e % 2
        const bool masked = key0 + KEYS_T - 1 > warp_min;  // some key of the tile is past some row's position
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = sc[j][e] * attn::SCALE_LOG2;
                if (masked && key0 + 8 * j + 2 * c + (e & 1) > (e < 2 ? lim0 : lim1)) v = -INFINITY;
                sc[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float alpha[2], base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            attn::softmax_rebase(m[h], l[h], mx[h], base[h], alpha[h]);
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                sc[j][e] = exp2f(sc[j][e] - base[e >> 1]);
                l[e >> 1] += sc[j][e];
            }
        }
        attn::rescale_rows(o, alpha);
        // ---- O += P V: k-steps of 16 keys (P's A fragment from S's n-tiles 2kk, 2kk + 1), 32 n-tiles of dims
#pragma unroll
        for (int kk = 0; kk < NJ / 2; ++kk) {
            const uint32_t pa[4] = {attn::pack_half2(sc[2 * kk][0], sc[2 * kk][1]),
                                    attn::pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
                                    attn::pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                    attn::pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
            for (int nn = 0; nn < 16; ++nn) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, v16 + chunk_at(16 * kk + v_key, 2 * nn + v_chunk));
                mma_f16_16816(o[2 * nn], pa, b[0], b[1]);
                mma_f16_16816(o[2 * nn + 1], pa, b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();

    // ---- out = bf16(o / l * sigmoid(gate)): lane (r, c) holds dims 8j + 2c, + 1 of rows r and r + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const int row = h ? row1 : row0;
        if (row >= nrows) continue;
        const int t = t0 + row / p.group, qh = kvh * p.group + row % p.group;
        const size_t base_idx = (size_t(t) * p.nq + qh) * D + 2 * c;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const size_t idx = base_idx + 8 * j;
            const __nv_bfloat162 g = *reinterpret_cast<const __nv_bfloat162*>(p.gate + idx);
            const float y0 = o[j][2 * h] / l[h] * sigmoid(__low2float(g));
            const float y1 = o[j][2 * h + 1] / l[h] * sigmoid(__high2float(g));
            *reinterpret_cast<__nv_bfloat162*>(p.out + idx) = __floats2bfloat162_rn(y0, y1);
        }
    }
}
}  // namespace tiled

// The form a call takes: the tiled form of 8 warps where the GPU lets a block hold its shared
// memory, else the one of 4 warps, else the core; LAMPO_ATTN_PREFILL_TILED=0 / 4 asks for the core /
// the 4-warp form (read at every call, for A/B measurements and the tests of every form in one
// process).
enum class PrefillForm { Core, Tiled4, Tiled8 };
PrefillForm prefill_form() {
    const char* env = std::getenv("LAMPO_ATTN_PREFILL_TILED");
    const std::string asked = env ? env : "";
    const size_t room = smem_optin_bytes();
    if (asked == "0") return PrefillForm::Core;
    if (asked != "4" && room >= tiled::smem_bytes<8, 64>()) return PrefillForm::Tiled8;
    if (room >= tiled::smem_bytes<4, 32>()) return PrefillForm::Tiled4;
    return PrefillForm::Core;
}

template <int WARPS, int KEYS_T>
void launch_tiled(attn::Params p, const char* op, cudaStream_t stream) {
    p.tile_tokens = WARPS * 16 / p.group;
    auto kernel = tiled::attn_prefill_tiled_kernel<WARPS, KEYS_T>;
    constexpr size_t smem = tiled::smem_bytes<WARPS, KEYS_T>();
    allow_dynamic_smem(kernel, smem, op);
    kernel<<<dim3(ceil_div(p.T, p.tile_tokens), p.nkv), WARPS * 32, smem, stream>>>(p);
}

}  // namespace

void attn_prefill_int8(const bf16* q, const bf16* gate, const int8_t* k_cache, const int8_t* v_cache,
                       const half* k_scale, const half* v_scale, int pos0, bf16* out, int T, int nq, int nkv,
                       int D, int context_max, cudaStream_t stream) {
    const char* op = "attn_prefill_int8";
    require(D == attn::D, op, "head dim must be 256 (the Qwen3.5/3.6 family), got " + std::to_string(D));
    require(nkv > 0 && nq % nkv == 0 && nq / nkv <= attn::MAX_ROWS, op, "nq must be a multiple of nkv, group <= 64");
    require(pos0 >= 0 && pos0 + T <= context_max, op,
            "positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + T - 1) + " exceed context_max " +
                std::to_string(context_max));
    if (T <= 0) return;
    attn::Params p{};
    p.q = q; p.gate = gate; p.k_cache = k_cache; p.v_cache = v_cache; p.k_scale = k_scale; p.v_scale = v_scale;
    p.nq = nq; p.nkv = nkv; p.group = nq / nkv; p.context_max = context_max; p.T = T;
    p.pos0 = pos0;
    p.out = out;
    switch (prefill_form()) {
        case PrefillForm::Tiled8: launch_tiled<8, 64>(p, op, stream); break;
        case PrefillForm::Tiled4: launch_tiled<4, 32>(p, op, stream); break;
        case PrefillForm::Core: {
            p.tile_tokens = attn::MAX_ROWS / p.group;
            auto kernel = attn::attn_int8_kernel<4, 1, true>;
            const size_t smem = attn::smem_bytes(4, 1);
            allow_dynamic_smem(kernel, smem, op);
            kernel<<<dim3(ceil_div(T, p.tile_tokens), nkv), 4 * 32, smem, stream>>>(p);
            break;
        }
    }
    LAMPO_CHECK_LAUNCH(op);
}

}  // namespace lampo
