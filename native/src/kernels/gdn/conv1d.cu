// conv1d.cu - causal depthwise conv (kernel K, no bias) + SiLU over T tokens, continuing from a
// rolling state (Gated DeltaNet's short conv on the q|k|v channels).
//
//   x [T, C] bf16 pre-conv ; w [C, K] bf16 ; state [C, K-1] bf16 (oldest column first)
//   xin = state || x (per channel, along time)
//   y[t, c] = bf16(silu(sum_j w[c, j] * xin[c, t + j]))     j = 0..K-1, fp32 math
//   afterwards state = last K-1 columns of xin
//
// The state is read from and written to GdnStates' ring of slots (ops.h). One thread owns 8
// consecutive channels (16-byte accesses of x and y) and a run of tokens, keeping the K-1 previous
// inputs in registers. When one run covers all T tokens (decode, short verify windows) the same
// thread also writes the new state: one launch; and, with rows, the state after each token (a
// verify window's rows, to keep any prefix of them). Longer sequences split time into tiles across
// blocks; the state is then written by a second tiny launch, after every tile has read the old one
// (the slots may be the same one).
#include "kernels/common.cuh"
#include "kernels/gdn/gdn_common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/ops.h"

#include <stdexcept>
#include <string>

namespace lampo {
namespace {

constexpr int CONV_VEC = 8;        // channels per thread
constexpr int CONV_THREADS = 128;  // threads per block
constexpr int CONV_TILE_T = 64;    // tokens per thread when time is split

// state [C, K-1] of the thread's 8 channels from hist (the K-1 latest inputs, oldest first).
template <int K>
__device__ __forceinline__ void store_conv_state(bf16* state, int c0, const float (&hist)[K - 1][CONV_VEC]) {
    uint4 s_raw[K - 1];
    bf16* s8 = reinterpret_cast<bf16*>(s_raw);
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
#pragma unroll
        for (int v = 0; v < CONV_VEC; ++v) s8[v * (K - 1) + j] = __float2bfloat16_rn(hist[j][v]);
#pragma unroll
    for (int q = 0; q < K - 1; ++q) reinterpret_cast<uint4*>(state + size_t(c0) * (K - 1))[q] = s_raw[q];
}

template <int K>
__global__ void __launch_bounds__(CONV_THREADS)
conv1d_silu_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, GdnStates states,
                   bf16* __restrict__ y, int T, int C, int tile_t, bool write_state, bool rows) {
    pdl_begin();
    const int c0 = (blockIdx.x * CONV_THREADS + threadIdx.x) * CONV_VEC;
    if (c0 >= C) return;
    const size_t slot_elems = size_t(C) * (K - 1);
    const int p = gdn_first_position(states);
    const bf16* state = states.conv + gdn_slot_offset(states, p, slot_elems);
    const int t0 = blockIdx.y * tile_t;
    const int t1 = min(T, t0 + tile_t);

    // The thread's 8 channels own 8*K consecutive weights and 8*(K-1) consecutive state values:
    // K and K-1 16-byte accesses.
    uint4 w_raw[K];
#pragma unroll
    for (int q = 0; q < K; ++q) w_raw[q] = reinterpret_cast<const uint4*>(w + size_t(c0) * K)[q];
    const bf16* w8 = reinterpret_cast<const bf16*>(w_raw);
    float wk[CONV_VEC][K];
#pragma unroll
    for (int v = 0; v < CONV_VEC; ++v)
#pragma unroll
        for (int j = 0; j < K; ++j) wk[v][j] = __bfloat162float(w8[v * K + j]);

    // hist[j] = xin column t0 + j (the K-1 inputs before token t0): the state for the first
    // tile, x rows t0 - (K-1) + j otherwise (tiles are longer than K-1).
    float hist[K - 1][CONV_VEC];
    if (t0 == 0) {
        uint4 s_raw[K - 1];
#pragma unroll
        for (int q = 0; q < K - 1; ++q) s_raw[q] = reinterpret_cast<const uint4*>(state + size_t(c0) * (K - 1))[q];
        const bf16* s8 = reinterpret_cast<const bf16*>(s_raw);
#pragma unroll
        for (int j = 0; j < K - 1; ++j)
#pragma unroll
            for (int v = 0; v < CONV_VEC; ++v) hist[j][v] = __bfloat162float(s8[v * (K - 1) + j]);
    } else {
#pragma unroll
        for (int j = 0; j < K - 1; ++j) load_bf16x8(x + size_t(t0 - (K - 1) + j) * C + c0, hist[j]);
    }

    for (int t = t0; t < t1; ++t) {
        float cur[CONV_VEC];
        load_bf16x8(x + size_t(t) * C + c0, cur);
        float out[CONV_VEC];
#pragma unroll
        for (int v = 0; v < CONV_VEC; ++v) {
            float acc = wk[v][K - 1] * cur[v];
#pragma unroll
            for (int j = 0; j < K - 1; ++j) acc = fmaf(wk[v][j], hist[j][v], acc);
            out[v] = silu(acc);
        }
        store_bf16x8(y + size_t(t) * C + c0, out);
#pragma unroll
        for (int j = 0; j < K - 2; ++j)
#pragma unroll
            for (int v = 0; v < CONV_VEC; ++v) hist[j][v] = hist[j + 1][v];
#pragma unroll
        for (int v = 0; v < CONV_VEC; ++v) hist[K - 2][v] = cur[v];
        if (rows || (write_state && t == T - 1))  // the state after token t
            store_conv_state<K>(states.conv + gdn_slot_offset(states, p + 1 + t, slot_elems), c0, hist);
    }
}

// state[c, j] = x[T - (K-1) + j, c]   (T >= K-1: the new state comes from x alone)
template <int K>
__global__ void conv1d_state_from_x_kernel(const bf16* __restrict__ x, GdnStates states, int T, int C) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    bf16* state = states.conv + gdn_slot_offset(states, gdn_first_position(states) + T, size_t(C) * (K - 1));
#pragma unroll
    for (int j = 0; j < K - 1; ++j) state[size_t(c) * (K - 1) + j] = x[size_t(T - (K - 1) + j) * C + c];
}

template <int K>
void launch_conv1d(const bf16* x, const bf16* w, const GdnStates& states, bf16* y, int T, int C, bool rows,
                   cudaStream_t stream) {
    const int blocks_c = ceil_div(C / CONV_VEC, CONV_THREADS);
    if (T <= CONV_TILE_T) {
        launch_pdl("conv1d_silu_kernel", conv1d_silu_kernel<K>, dim3(blocks_c, 1), CONV_THREADS, 0, stream,
                   x, w, states, y, T, C, T, true, rows);
        return;
    }
    if (rows)
        throw std::invalid_argument("causal_conv1d_silu: row states need T <= " + std::to_string(CONV_TILE_T) +
                                    ", got " + std::to_string(T));
    launch_pdl("conv1d_silu_kernel", conv1d_silu_kernel<K>, dim3(blocks_c, ceil_div(T, CONV_TILE_T)),
               CONV_THREADS, 0, stream, x, w, states, y, T, C, CONV_TILE_T, false, false);
    launch_pdl("conv1d_state_from_x_kernel", conv1d_state_from_x_kernel<K>, ceil_div(C, 256), 256, 0,
               stream, x, states, T, C);
}

}  // namespace

void causal_conv1d_silu(const bf16* x, const bf16* w, const GdnStates& states, bf16* y, int T, int C, int K,
                        cudaStream_t stream, bool rows) {
    if (T < 1) throw std::invalid_argument("causal_conv1d_silu: T must be >= 1, got " + std::to_string(T));
    gdn_check_states("causal_conv1d_silu", states, T, rows);
    if (C < CONV_VEC || C % CONV_VEC != 0)
        throw std::invalid_argument("causal_conv1d_silu: C must be a positive multiple of 8, got " +
                                    std::to_string(C));
    switch (K) {
        case 2: launch_conv1d<2>(x, w, states, y, T, C, rows, stream); break;
        case 3: launch_conv1d<3>(x, w, states, y, T, C, rows, stream); break;
        case 4: launch_conv1d<4>(x, w, states, y, T, C, rows, stream); break;
        default:
            throw std::invalid_argument("causal_conv1d_silu: kernel size K must be 2, 3 or 4, got " +
                                        std::to_string(K));
    }
}

}  // namespace lampo
