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

#include "kernels/attention/attention_f16_tiles.cuh"
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {

namespace tiled {
using attn::D;
using namespace attn::tiles;
constexpr int STAGES = 2;  // INT8 stages

// Shared memory of a form: Q's fp16 rows, the fp16 K and V tiles, the INT8 stages.
template <int WARPS, int KEYS_T>
constexpr size_t smem_bytes() {
    return TileSmem::bytes(WARPS * 16, KEYS_T, STAGES, Int8Stage<KEYS_T>::BYTES);
}

template <int WARPS, int KEYS_T>
__global__ void __launch_bounds__(WARPS * 32, 1) attn_prefill_tiled_kernel(const attn::Params p) {
    static_assert(KEYS_T % 16 == 0 && KEYS_T <= 64, "whole k-steps of 16 keys");
    constexpr int NT = WARPS * 32;
    extern __shared__ __align__(16) uint8_t smem[];
    const TileSmem sm(smem, WARPS * 16, KEYS_T);
    const int kvh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tile = gridDim.x - 1 - blockIdx.x;  // longest key ranges first
    const int t0 = tile * p.tile_tokens, ntok = min(p.tile_tokens, p.T - t0);
    const int pos_first = p.pos0 + t0, kend = pos_first + ntok, nrows = ntok * p.group;
    const int ntiles = (kend + KEYS_T - 1) / KEYS_T;
    const size_t head_row0 = size_t(kvh) * p.context_max;

    auto stage = [&](int it) { return Int8Stage<KEYS_T>{sm.pipe + (it % STAGES) * Int8Stage<KEYS_T>::BYTES}; };
    auto load_int8 = [&](int it) {  // tile it's INT8 rows and scales into its stage, zero past kend
        load_rows<KEYS_T, NT>(stage(it), p, head_row0, it * KEYS_T, kend);
        load_scales<KEYS_T, NT>(stage(it), p, head_row0, it * KEYS_T, kend);
    };
    load_int8(0);
    cp_async_commit();
    load_q<WARPS * 16, NT>(sm.q16, p, t0, nrows, kvh);

    const int r = (lane >> 2), c = lane & 3;
    const int row0 = warp * 16 + r, row1 = row0 + 8;
    const int lim0 = row0 < nrows ? pos_first + row0 / p.group : -1;  // the last key each row sees
    const int lim1 = row1 < nrows ? pos_first + row1 / p.group : -1;
    const int warp_lim = __reduce_max_sync(0xffffffffu, max(lim0, lim1));
    const int warp_min = __reduce_min_sync(0xffffffffu, row0 < nrows ? lim0 : INT_MAX);  // every row's

    attn::WarpState s;
#pragma unroll
    for (int j = 0; j < 32; ++j) s.o[j][0] = s.o[j][1] = s.o[j][2] = s.o[j][3] = 0.0f;
    s.m[0] = s.m[1] = -INFINITY;
    s.l[0] = s.l[1] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
        if (it + 1 < ntiles) load_int8(it + 1);  // its stage held tile it - 1, dequantized before the last barrier
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // tile it's INT8 bytes are in; every warp is done with the fp16 tile of it - 1
        dequantize<KEYS_T, NT>(stage(it), sm.k16, sm.v16);
        __syncthreads();  // the fp16 tile is written
        const int key0 = it * KEYS_T;
        if (key0 > warp_lim) continue;  // causal: nothing of this tile is visible to the warp's rows
        attend_tile<KEYS_T / 8>(s, sm.q16, sm.k16, sm.v16, warp * 16, 0, key0, lim0, lim1, key0 + KEYS_T - 1 > warp_min,
                                lane);
    }
    cp_async_wait<0>();

    // ---- out = bf16(o / l * sigmoid(gate)): lane (r, c) holds dims 8j + 2c, + 1 of rows r and r + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        s.l[h] += __shfl_xor_sync(0xffffffffu, s.l[h], 1);
        s.l[h] += __shfl_xor_sync(0xffffffffu, s.l[h], 2);
        const int row = h ? row1 : row0;
        if (row >= nrows) continue;
        const int t = t0 + row / p.group, qh = kvh * p.group + row % p.group;
        const size_t base_idx = (size_t(t) * p.nq + qh) * D + 2 * c;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const size_t idx = base_idx + 8 * j;
            const __nv_bfloat162 g = *reinterpret_cast<const __nv_bfloat162*>(p.gate + idx);
            const float y0 = s.o[j][2 * h] / s.l[h] * sigmoid(__low2float(g));
            const float y1 = s.o[j][2 * h + 1] / s.l[h] * sigmoid(__high2float(g));
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

void attn_prefill_int8(const bf16* q, const bf16* gate, const uint8_t* k_cache, const uint8_t* v_cache,
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
