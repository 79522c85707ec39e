// moe_prefill.cu - routed experts for a prefill chunk: the same function as moe_experts.cu
// (ops.h) for large T, as grouped tensor-core GEMMs.
//
//   1. moe_sort (one block): counting sort of the T*k (token, slot) pairs by expert; writes the
//      expert row ranges, the row-tile table for the GEMMs (64-row tiles that never straddle two
//      experts), sorted_token[pos] (the token of sorted row pos) and pos_of_slot[t*k + s].
//   2. grouped GEMM gate_up with the SwiGLU epilogue: act[pos] = silu(h Wg^T) * (h Wu^T) for the
//      gathered rows h[sorted_token[pos]]                      -> act [T*k, I] bf16
//   3. grouped GEMM down: y[pos] = act[pos] Wd[e]^T            -> y [T*k, H] bf16
//   4. moe_combine: out[t] = bf16(sum_s w[t, s] * y[pos_of_slot[t*k + s]]) in slot order (fp32),
//      deterministic (no atomics on values).
// Differences from the decode path: y is rounded to bf16 per expert before the weighted sum.
// Workspace (moe_prefill_workspace_bytes): the tables above, act and y; about
// T*k*(I + H)*2 bytes (35B-A3B, T = 2048: 80 MiB).
// Steps 1 and 4 are shared with the LQ banks' prefill (moe_prefill_lq.cu) through moe_prefill.h.
#include "kernels/common.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/moe/moe_common.h"
#include "kernels/moe/moe_grouped_gemm.cuh"
#include "kernels/moe/moe_prefill.h"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int SORT_THREADS = 1024;  // >= MOE_MAX_EXPERTS: one thread per expert in the scans
constexpr int COMBINE_THREADS = 256;
static_assert(moe_gemm::BM == MOE_PREFILL_TILE_ROWS, "the sort's row tiles are the grouped GEMM's");

struct PrefillLayout {
    size_t offsets, num_tiles, tile_group, tile_row0, sorted_token, pos_of_slot, act, y, total;
    int tile_slots;
};

PrefillLayout prefill_layout(int T, int k, int H, int I, int E) {
    PrefillLayout L{};
    const size_t slots = size_t(T) * k;
    L.tile_slots = int((slots + MOE_PREFILL_TILE_ROWS - 1) / MOE_PREFILL_TILE_ROWS) + E;
    size_t at = 0;
    auto take = [&](size_t bytes) { const size_t here = at; at += align256(bytes); return here; };
    L.offsets = take(sizeof(int32_t) * (E + 1));
    L.num_tiles = take(sizeof(int32_t));
    L.tile_group = take(sizeof(int32_t) * L.tile_slots);
    L.tile_row0 = take(sizeof(int32_t) * L.tile_slots);
    L.sorted_token = take(sizeof(int32_t) * slots);
    L.pos_of_slot = take(sizeof(int32_t) * slots);
    L.act = take(sizeof(bf16) * slots * I);
    L.y = take(sizeof(bf16) * slots * H);
    L.total = at;
    return L;
}

// Exclusive prefix sum over the block (one value per thread); returns the block total too.
__device__ int block_exclusive_scan(int v, int* warp_sums, int& total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int incl = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += up;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int up = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += up;
        }
        warp_sums[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    total = warp_sums[nwarps - 1];
    const int excl = incl - v + (warp > 0 ? warp_sums[warp - 1] : 0);
    __syncthreads();  // warp_sums may be reused by the caller
    return excl;
}

__global__ void __launch_bounds__(SORT_THREADS)
moe_sort(const int32_t* __restrict__ ids, int slots, int k, int E, int32_t* __restrict__ offsets,
         int32_t* __restrict__ num_tiles, int32_t* __restrict__ tile_group,
         int32_t* __restrict__ tile_row0, int32_t* __restrict__ sorted_token,
         int32_t* __restrict__ pos_of_slot) {
    __shared__ int count[SORT_THREADS];
    __shared__ int warp_sums[32];
    const int tid = threadIdx.x;
    count[tid] = 0;
    __syncthreads();
    for (int u = tid; u < slots; u += SORT_THREADS) atomicAdd(&count[ids[u]], 1);
    __syncthreads();

    const int n = count[tid];  // zero past E
    int total_rows, total_tiles;
    const int row_start = block_exclusive_scan(n, warp_sums, total_rows);
    const int tiles = (n + MOE_PREFILL_TILE_ROWS - 1) / MOE_PREFILL_TILE_ROWS;
    const int tile_start = block_exclusive_scan(tiles, warp_sums, total_tiles);
    if (tid < E) {
        offsets[tid] = row_start;
        for (int i = 0; i < tiles; ++i) {
            tile_group[tile_start + i] = tid;
            tile_row0[tile_start + i] = row_start + i * MOE_PREFILL_TILE_ROWS;
        }
    }
    if (tid == 0) {
        offsets[E] = total_rows;
        *num_tiles = total_tiles;
    }
    count[tid] = row_start;  // becomes the scatter cursor
    __syncthreads();
    for (int u = tid; u < slots; u += SORT_THREADS) {
        const int pos = atomicAdd(&count[ids[u]], 1);
        sorted_token[pos] = u / k;
        pos_of_slot[u] = pos;
    }
}

__global__ void __launch_bounds__(COMBINE_THREADS)
moe_combine(const bf16* __restrict__ y, const int32_t* __restrict__ pos_of_slot,
            const float* __restrict__ weights, bf16* __restrict__ out, int k, int H) {
    const int t = blockIdx.x;
    for (int c = threadIdx.x * 8; c < H; c += COMBINE_THREADS * 8) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < k; ++s) {
            const int slot = t * k + s;
            const float w = weights[slot];
            float v[8];
            load_bf16x8(y + size_t(pos_of_slot[slot]) * H + c, v);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = fmaf(w, v[e], acc[e]);
        }
        store_bf16x8(out + size_t(t) * H + c, acc);
    }
}

}  // namespace

size_t moe_prefill_workspace_bytes(int T, int k, int H, int I, int E) {
    return prefill_layout(T, k, H, I, E).total;
}

MoePrefillRows moe_prefill_sort(const char* op, const int32_t* ids, void* workspace, int T, int k, int H, int I,
                                int E, cudaStream_t stream) {
    moe_check_tokens(op, T, k, H);
    moe_check_experts(op, E, k);
    moe_check_intermediate(op, I);
    const PrefillLayout L = prefill_layout(T, k, H, I, E);
    char* ws = static_cast<char*>(workspace);
    auto at = [&](size_t off) { return reinterpret_cast<int32_t*>(ws + off); };
    const MoePrefillRows rows{at(L.offsets), at(L.num_tiles), at(L.tile_group), at(L.tile_row0),
                              at(L.sorted_token), at(L.pos_of_slot), reinterpret_cast<bf16*>(ws + L.act),
                              reinterpret_cast<bf16*>(ws + L.y), L.tile_slots};
    moe_sort<<<1, SORT_THREADS, 0, stream>>>(ids, T * k, k, E, rows.offsets, rows.num_tiles, rows.tile_group,
                                             rows.tile_row0, rows.sorted_token, rows.pos_of_slot);
    return rows;
}

void moe_prefill_combine(const MoePrefillRows& rows, const float* weights, bf16* out, int T, int k, int H,
                         cudaStream_t stream) {
    moe_combine<<<T, COMBINE_THREADS, 0, stream>>>(rows.y, rows.pos_of_slot, weights, out, k, H);
}

void moe_experts_prefill(const bf16* h, const bf16* gate_up, const bf16* down, const int32_t* ids,
                         const float* weights, bf16* out, void* workspace, int T, int k, int H,
                         int I, int E, cudaStream_t stream) {
    const MoePrefillRows rows = moe_prefill_sort("moe_experts_prefill", ids, workspace, T, k, H, I, E, stream);

    moe_gemm::Problem p{};
    p.tile_group = rows.tile_group;
    p.tile_row0 = rows.tile_row0;
    p.group_end = rows.offsets + 1;
    p.num_tiles = rows.num_tiles;

    p.A = h;
    p.a_rows = rows.sorted_token;
    p.B = gate_up;
    p.b_group_stride = size_t(2) * I * H;
    p.C = rows.act;
    p.ldc = I;
    p.N = 2 * I;
    p.K = H;
    moe_gemm::launch_grouped_gemm<moe_gemm::Epilogue::SWIGLU>(p, rows.tile_slots, stream);

    p.A = rows.act;
    p.a_rows = nullptr;
    p.B = down;
    p.b_group_stride = size_t(H) * I;
    p.C = rows.y;
    p.ldc = H;
    p.N = H;
    p.K = I;
    moe_gemm::launch_grouped_gemm<moe_gemm::Epilogue::BF16>(p, rows.tile_slots, stream);

    moe_prefill_combine(rows, weights, out, T, k, H, stream);
}

}  // namespace lampo
