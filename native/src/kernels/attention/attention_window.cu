// attention_window.cu - a verify window's attention with every tile of keys dequantized once per
// block: flash-decoding over the INT8 KV cache for Tq query tokens whose Tq * group rows fill two to
// four M-tiles of 16 (the 35B-A3B's 5-token window: 40 rows). The shared core
// (attention_int8.cuh) dequantizes each key in registers once per M-tile; here the block's threads
// dequantize a tile into fp16 shared memory once (attention_f16_tiles.cuh) and every M-tile's warps
// read it. Same splits and partial outputs as the core's decode form, so attention_decode.cu's
// combine merges either. The engine takes it from three M-tiles on (attention_decode.cu,
// window_form): with two, the core's two blocks a SM read a deep cache faster.
//
//   q [Tq, nq, 256] bf16; K, V [nkv, context_max, 256] INT8 with fp16 scales [nkv, context_max, 4];
//   live keys L = d_pos[0] + Tq, token t sees keys [0, d_pos[0] + t]. Split s of nsplit:
//   part_o [s, t, head, 256] = sum over its keys k of exp2(x_k - m) v_k (fp32, unnormalised),
//   part_ml [s, t, head] = (m, sum of exp2(x_k - m)), x_k = q . k_k / 16 * log2(e) (base 2).
//
// Block (split s, KV head kvh) of MT * KG warps: warp w takes M-tile w % MT and keys
// (w / MT) * KEYS_T / KG .. + KEYS_T / KG - 1 of each tile of KEYS_T keys, with its own online
// softmax; at the end the KG warps of an M-tile merge through shared memory (merge_and_store). The
// INT8 tiles stream in by cp.async (two stages); the split's leading tiles that hold only keys
// below d_pos[0] are requested before the PDL wait (the rule in common.cuh). Two block barriers a
// tile: the INT8 tile is in / the fp16 tile is written. Two tile sizes: 64 keys (146-162 KiB a
// block: an H100 / H200) and 32 keys (81-97 KiB: what a block may hold on an RTX 3090 / 4090 / 5090).
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/attention/attention_f16_tiles.cuh"
#include "kernels/attention/attention_window.h"
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {
using namespace attn;
using namespace attn::tiles;

constexpr int STAGES = 2;  // INT8 stages; a split's keys are a multiple of KEYS (64: split_chunk)

// Warps per M-tile, each taking KEYS_T / KG keys (at least 16) of a tile: with 64-key tiles 8, 6 and
// 8 warps for 2, 3 and 4 M-tiles; with 32-key tiles 4, 3 and 4 (their merge area fits 99 KiB).
__host__ __device__ constexpr int key_groups(int mt, int keys_t) {
    return keys_t == KEYS ? (mt <= 2 ? 4 : 2) : (mt <= 2 ? 2 : 1);
}

constexpr size_t tiled_smem_bytes(int mt, int keys_t) {
    const size_t loop = TileSmem::bytes(mt * 16, keys_t, STAGES,
                                        keys_t == KEYS ? Int8Stage<KEYS>::BYTES : Int8Stage<KEYS / 2>::BYTES);
    const size_t merge = merge_bytes(mt, key_groups(mt, keys_t));
    return loop > merge ? loop : merge;
}

template <int MT, int KEYS_T>
__global__ void __launch_bounds__(MT * key_groups(MT, KEYS_T) * 32, 1) attn_window_tiled_kernel(const Params p) {
    static_assert(KEYS % KEYS_T == 0, "whole tiles in a split");
    constexpr int KG = key_groups(MT, KEYS_T), NT = MT * KG * 32, SUB = KEYS_T / KG;
    extern __shared__ __align__(16) uint8_t smem[];
    const TileSmem sm(smem, MT * 16, KEYS_T);
    const int kvh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const DecodeKeys keys = decode_keys(p);
    if (keys.kbeg >= keys.kend) return;
    const int kbeg = keys.kbeg, kend = keys.kend, nrows = p.T * p.group;
    const int ntiles = (kend - kbeg + KEYS_T - 1) / KEYS_T;
    const size_t head_row0 = size_t(kvh) * p.context_max;
    auto stage = [&](int it) { return Int8Stage<KEYS_T>{sm.pipe + (it % STAGES) * Int8Stage<KEYS_T>::BYTES}; };

    const int early = early_tiles(kbeg, kend, keys.pos_first, ntiles, STAGES, KEYS_T);
    for (int it = 0; it < early; ++it) load_rows<KEYS_T, NT>(stage(it), p, head_row0, kbeg + it * KEYS_T, kend);
    if (early > 0) prefetch_scale_lines<NT>(p, head_row0, kbeg, kend, early * KEYS_T);
    pdl_begin();
    if (early == 0) load_rows<KEYS_T, NT>(stage(0), p, head_row0, kbeg, kend);
    load_scales<KEYS_T, NT>(stage(0), p, head_row0, kbeg, kend);
    cp_async_commit();
    load_q<MT * 16, NT>(sm.q16, p, 0, nrows, kvh);

    const int mt = warp % MT, kg = warp / MT, r = lane >> 2, c = lane & 3;
    const int row0 = mt * 16 + r, row1 = row0 + 8;
    const int lim0 = row0 < nrows ? min(keys.pos_first + row0 / p.group, kend - 1) : -1;  // the last key each row sees
    const int lim1 = row1 < nrows ? min(keys.pos_first + row1 / p.group, kend - 1) : -1;
    const int warp_lim = __reduce_max_sync(0xffffffffu, max(lim0, lim1));
    const int warp_min = __reduce_min_sync(0xffffffffu, row0 < nrows ? lim0 : INT_MAX);  // every row's

    WarpState s;
#pragma unroll
    for (int j = 0; j < 32; ++j) s.o[j][0] = s.o[j][1] = s.o[j][2] = s.o[j][3] = 0.0f;
    s.m[0] = s.m[1] = -INFINITY;
    s.l[0] = s.l[1] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
        if (it + 1 < ntiles) {  // its stage held tile it - 1, dequantized before the last barrier
            const int key0 = kbeg + (it + 1) * KEYS_T;
            if (it + 1 >= early) load_rows<KEYS_T, NT>(stage(it + 1), p, head_row0, key0, kend);
            load_scales<KEYS_T, NT>(stage(it + 1), p, head_row0, key0, kend);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // tile it's INT8 bytes are in; every warp is done with the fp16 tile of it - 1
        dequantize<KEYS_T, NT>(stage(it), sm.k16, sm.v16);
        __syncthreads();  // the fp16 tile is written
        const int key = kbeg + it * KEYS_T + kg * SUB;  // the warp's first key of the tile
        if (key <= warp_lim)
            attend_tile<SUB / 8>(s, sm.q16, sm.k16, sm.v16, mt * 16, kg * SUB, key, lim0, lim1, key + SUB - 1 > warp_min,
                                 lane);
    }
    cp_async_wait<0>();
    __syncthreads();  // the merge area lies over Q, the fp16 tiles and the stages

    // ---- the KG warps of each M-tile merged, a split's partial output stored
    float* mo = reinterpret_cast<float*>(smem);     // [KG][MT * 16][MERGE_STRIDE]
    float* mml = mo + KG * MT * 16 * MERGE_STRIDE;  // [KG][MT * 16][2]
    put_rows_state(mo, mml, s, kg * MT * 16 + row0, c, [c](int j, int e) { return 8 * j + 2 * c + e; });
    __syncthreads();
    merge_and_store<MT, KG, false>(mo, mml, p, nrows, 0, blockIdx.x, kvh);
}

// f(kernel, threads, shared bytes) for the form of `mt` M-tiles and keys_t-key tiles.
template <int KEYS_T, class F>
auto with_form_keys(int mt, F&& f) {
    switch (mt) {
        case 2: return f(attn_window_tiled_kernel<2, KEYS_T>, 2 * key_groups(2, KEYS_T) * 32, tiled_smem_bytes(2, KEYS_T));
        case 3: return f(attn_window_tiled_kernel<3, KEYS_T>, 3 * key_groups(3, KEYS_T) * 32, tiled_smem_bytes(3, KEYS_T));
        case 4: return f(attn_window_tiled_kernel<4, KEYS_T>, 4 * key_groups(4, KEYS_T) * 32, tiled_smem_bytes(4, KEYS_T));
        default: throw std::logic_error("attn_window_tiled: 2 to 4 M-tiles, got " + std::to_string(mt));
    }
}
template <class F>
auto with_form(WindowForm form, int mt, F&& f) {
    if (form == WindowForm::Tiled64) return with_form_keys<KEYS>(mt, f);
    if (form == WindowForm::Tiled32) return with_form_keys<KEYS / 2>(mt, f);
    throw std::logic_error("attn_window_tiled: the core's form has no tiles");
}

}  // namespace

bool attn_window_tiled_fits(WindowForm form, int mt) {
    if (mt < 2 || mt > 4 || form == WindowForm::Core) return false;
    return tiled_smem_bytes(mt, form == WindowForm::Tiled64 ? KEYS : KEYS / 2) <= smem_optin_bytes();
}

int attn_window_tiled_blocks_per_sm(WindowForm form, int mt) {
    static int blocks[3][5] = {};  // by form and mt; 0: not asked yet
    int& n = blocks[int(form)][std::clamp(mt, 0, 4)];
    if (!n) {
        n = with_form(form, mt, [](auto kernel, int threads, size_t smem) {
            allow_dynamic_smem(kernel, smem, "attn_window_tiled");
            int per_sm = 0;
            LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
            return std::max(per_sm, 1);
        });
    }
    return n;
}

void attn_window_tiled(WindowForm form, const attn::Params& p, int mt, cudaStream_t stream) {
    with_form(form, mt, [&](auto kernel, int threads, size_t smem) {
        allow_dynamic_smem(kernel, smem, "attn_window_tiled");
        launch_pdl("attn_window_tiled_kernel", kernel, dim3(p.nsplit, p.nkv), threads, smem, stream, p);
        return 0;
    });
}

}  // namespace lampo
