// attention_decode.cu - flash-decoding over the INT8 KV cache for Tq <= 8 query rows (decode and
// speculative verify); contract in ops.h (attn_decode_int8).
//
// The grid is fixed (nsplit x nkv blocks, one wave: decode_splits) so the call can be graph-captured;
// each block reads the live length L = d_pos[0] + Tq from device memory and takes keys
// [s * chunk, (s + 1) * chunk), chunk = max(64, ceil(L / nsplit) rounded up to 64); blocks past L
// exit at once. A block runs the shared tensor-core core (attention_int8.cuh) for all Tq x group
// query rows of its KV head, writing the unnormalised output, max and sum of its split; a verify
// window whose rows fill three or four M-tiles takes the tiled form instead (attention_window.cu:
// each key dequantized once for all M-tiles; window_form). The combine
// kernel (one block per (token, query head) and 32 dims, 64 for a verify window; 16 warps sharing
// the splits) merges the live splits and applies the sigmoid output gate. Needs head dim 256 and
// Tq * (nq / nkv) <= 64.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/attention/attention_int8.cuh"
#include "kernels/attention/attention_window.h"
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {

constexpr int COMBINE_WARPS = 16;     // each warp sums every 16th split for 32 dims
constexpr int COMBINE_PER_WARP = 16;  // splits per warp, their outputs held in registers
constexpr int COMBINE_MAX_SPLITS = COMBINE_WARPS * COMBINE_PER_WARP;  // <= the block's threads

// Blocks of the one-M-tile form resident on one SM by registers and shared memory, asked of the
// runtime once: two on an H100 or H200, one where an SM has about 100 KiB of shared memory.
int decode_blocks_per_sm() {
    static const int blocks = [] {
        auto kernel = attn::attn_int8_kernel<1, 4, false>;
        const size_t smem = attn::smem_bytes(1, 4);
        allow_dynamic_smem(kernel, smem, "attn_decode_int8");
        int per_sm = 0;
        LAMPO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 4 * 32, smem));
        return std::max(per_sm, 1);
    }();
    return blocks;
}

// Splits per KV head: as many as make one wave of blocks of the form (per_sm of them on every SM),
// at most one per 64 keys and COMBINE_MAX_SPLITS. A second wave of blocks as long as the first only
// queues (the 27B's four KV heads in 132 splits each: step 7.311 against 7.242 ms at 8,192 in one
// wave, H200 q5).
int decode_splits(int context_max, int nkv, int per_sm) {
    return std::max(1, std::min({ceil_div(per_sm * sm_count(), nkv), ceil_div(context_max, attn::KEYS),
                                 COMBINE_MAX_SPLITS}));
}

// The form a call of `mt` M-tiles takes. From three M-tiles on (the 35B-A3B's 5-token window: 40
// rows) the tiled form (attention_window.cu) with 64-key tiles where the GPU lets a block hold them,
// else with 32-key tiles; the core's form below that: with two M-tiles the core's two blocks a SM
// read the cache faster than the tiled form's dequantization shared by the block (H100, q5: the
// 27B's 4-token window 13.31 against 14.96 ms at 261,873 keys, docs/benchmarks.md), with three its
// warps each dequantize every key. LAMPO_ATTN_WINDOW_TILED=0 / 64 / 32 asks for the core's form /
// 64-key / 32-key tiles from two M-tiles on (read at every call, for A/B runs and the tests of every
// form in one process).
WindowForm window_form(int mt) {
    const char* env = std::getenv("LAMPO_ATTN_WINDOW_TILED");
    const std::string asked = env ? env : "";
    if (asked == "0" || (asked.empty() && mt < 3)) return WindowForm::Core;
    if (asked != "32" && attn_window_tiled_fits(WindowForm::Tiled64, mt)) return WindowForm::Tiled64;
    if (attn_window_tiled_fits(WindowForm::Tiled32, mt)) return WindowForm::Tiled32;
    return WindowForm::Core;
}

// Block (row = t * nq + query head, 32 * DIMS dims, lane l: dims DIMS l .. DIMS l + DIMS - 1 of
// them): the live length is known before the PDL wait (d_pos is fixed for the forward pass,
// common.cuh), and every load goes out at once after it (thread s: split s's max and sum; warp w:
// the outputs of splits w, w + 16, ...; warp 0 the gate); split weights w_s = exp2(m_s - M) in
// shared memory, warp w accumulates its splits in ascending order, then the warps' sums are added
// and normalised. Each dim's arithmetic is the same whatever DIMS: a verify window takes two dims
// a lane (DIMS 2), half the blocks of 32 dims (the 27B's 4-token window: 384 blocks, not 768 in
// one and a half waves), and its rows keep the step's bits.
template <int DIMS>
__global__ void __launch_bounds__(COMBINE_WARPS * 32)
attn_decode_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                           const bf16* __restrict__ gate, const int32_t* __restrict__ d_pos, bf16* __restrict__ out,
                           int Tq, int nq, int nsplit) {
    static_assert(DIMS == 1 || DIMS == 2, "one or two dims a lane");
    using Vec = std::conditional_t<DIMS == 2, float2, float>;
    __shared__ float weight[COMBINE_MAX_SPLITS];
    __shared__ float acc_w[COMBINE_WARPS][32 * DIMS];
    __shared__ float red[COMBINE_WARPS];
    __shared__ float M, l_total;
    const int row = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int d = (blockIdx.y * 32 + lane) * DIMS;
    const int L = __ldcg(d_pos) + Tq;  // fixed for the forward pass (common.cuh): read before the wait
    const int chunk = attn::split_chunk(L, nsplit);
    const int live = (L + chunk - 1) / chunk;
    const size_t rows = size_t(Tq) * nq;
    const size_t idx = size_t(row) * attn::D + d;
    auto dims_of = [](Vec v, int e) {
        if constexpr (DIMS == 2) return e == 0 ? v.x : v.y;
        else return v;
    };
    pdl_begin();
    float g[DIMS] = {};  // the output gate, loaded with the other loads
    if (warp == 0) {
#pragma unroll
        for (int e = 0; e < DIMS; ++e) g[e] = sigmoid(__bfloat162float(gate[idx + e]));
    }

    float2 ml = make_float2(-INFINITY, 0.0f);  // a split that saw no key: m = -inf -> weight 0
    if (threadIdx.x < live) ml = *reinterpret_cast<const float2*>(part_ml + (threadIdx.x * rows + row) * 2);
    Vec o[COMBINE_PER_WARP];
#pragma unroll
    for (int j = 0; j < COMBINE_PER_WARP; ++j) {
        const int s = warp + j * COMBINE_WARPS;
        o[j] = s < live ? *reinterpret_cast<const Vec*>(part_o + (s * rows + row) * attn::D + d) : Vec{};
    }

    const float m = warp_max(ml.x);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = -INFINITY;
        for (int w = 0; w < COMBINE_WARPS; ++w) mm = fmaxf(mm, red[w]);
        M = mm;
    }
    __syncthreads();
    float l = 0.0f;
    if (threadIdx.x < live) {
        const float w = exp2f(ml.x - M);
        weight[threadIdx.x] = w;
        l = w * ml.y;
    }
    l = warp_sum(l);
    __syncthreads();
    if (lane == 0) red[warp] = l;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < COMBINE_WARPS; ++w) t += red[w];
        l_total = t;
    }
#pragma unroll
    for (int e = 0; e < DIMS; ++e) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < COMBINE_PER_WARP; ++j) {
            const int s = warp + j * COMBINE_WARPS;
            if (s < live) acc += weight[s] * dims_of(o[j], e);
        }
        acc_w[warp][lane * DIMS + e] = acc;
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int e = 0; e < DIMS; ++e) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < COMBINE_WARPS; ++w) sum += acc_w[w][lane * DIMS + e];
            out[idx + e] = __float2bfloat16(sum / l_total * g[e]);
        }
    }
}

template <int MT, int KG>
void launch_decode(const attn::Params& p, cudaStream_t stream) {
    auto kernel = attn::attn_int8_kernel<MT, KG, false>;
    const size_t smem = attn::smem_bytes(MT, KG);
    allow_dynamic_smem(kernel, smem, "attn_decode_int8");
    launch_pdl("attn_int8_kernel", kernel, dim3(p.nsplit, p.nkv), MT * KG * 32, smem, stream, p);
}

}  // namespace

// Room for every Tq up to the given one: the most splits any form takes, for Tq rows of each.
size_t attn_decode_partial_floats(int Tq, int nq, int nkv, int D, int context_max) {
    int per_sm = decode_blocks_per_sm();
    for (WindowForm form : {WindowForm::Tiled64, WindowForm::Tiled32})
        for (int mt = 2; mt <= 4; ++mt)
            if (attn_window_tiled_fits(form, mt)) per_sm = std::max(per_sm, attn_window_tiled_blocks_per_sm(form, mt));
    return size_t(decode_splits(context_max, nkv, per_sm)) * Tq * nq * (D + 2);
}

void attn_decode_int8(const bf16* q, const bf16* gate, const uint8_t* k_cache, const uint8_t* v_cache,
                      const half* k_scale, const half* v_scale, const int32_t* d_pos, bf16* out, float* partial,
                      int Tq, int nq, int nkv, int D, int context_max, cudaStream_t stream) {
    const char* op = "attn_decode_int8";
    require(D == attn::D, op, "head dim must be 256 (the Qwen3.5/3.6 family), got " + std::to_string(D));
    require(nkv > 0 && nq % nkv == 0, op, "nq must be a multiple of nkv");
    require(Tq >= 1 && Tq <= 8, op, "Tq must be 1..8, got " + std::to_string(Tq));
    require(Tq * (nq / nkv) <= attn::MAX_ROWS, op, "Tq * (nq / nkv) must be <= 64");
    require(context_max > 0, op, "context_max must be positive");
    attn::Params p{};
    p.q = q; p.gate = gate; p.k_cache = k_cache; p.v_cache = v_cache; p.k_scale = k_scale; p.v_scale = v_scale;
    p.nq = nq; p.nkv = nkv; p.group = nq / nkv; p.context_max = context_max; p.T = Tq;
    p.d_pos = d_pos;
    const int mt = ceil_div(Tq * p.group, 16);
    const WindowForm form = window_form(mt);
    const bool tiled = form != WindowForm::Core;
    p.nsplit = decode_splits(context_max, nkv, tiled ? attn_window_tiled_blocks_per_sm(form, mt) : decode_blocks_per_sm());
    p.part_o = partial;
    p.part_ml = partial + size_t(p.nsplit) * Tq * nq * D;
    if (tiled) {
        attn_window_tiled(form, p, mt, stream);
    } else {
        switch (mt) {
            case 1: launch_decode<1, 4>(p, stream); break;
            case 2: launch_decode<2, 2>(p, stream); break;
            case 3: launch_decode<3, 1>(p, stream); break;
            default: launch_decode<4, 1>(p, stream); break;
        }
    }
    LAMPO_CHECK_LAUNCH(op);
    const int dims = Tq == 1 ? 1 : 2;  // dims a lane: two in a verify window
    launch_pdl("attn_decode_combine_kernel", dims == 1 ? attn_decode_combine_kernel<1> : attn_decode_combine_kernel<2>,
               dim3(Tq * nq, attn::D / (32 * dims)), COMBINE_WARPS * 32, 0, stream, p.part_o, p.part_ml, gate,
               d_pos, out, Tq, nq, p.nsplit);
}

}  // namespace lampo
