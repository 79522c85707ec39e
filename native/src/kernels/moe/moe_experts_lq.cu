// moe_experts_lq.cu - the routed experts' GEMVs for few tokens (decode, verify; T <= 8) with
// their banks in the LQ format (kernels/lq_tile.cuh): the products of moe_experts.cu.
//
//   gate_up: act[t, s, i] = bf16(silu(h_t . Wg[e][i]) * (h_t . Wu[e][i])), e = ids[t, s]
//            expert e's [2I, H] at gate_up + e * lq_packed_bytes(2I, H, bits) (rows 0..I-1 gate)
//   down:    out[t, r] = bf16(sum_s w[t, s] * (act[t, s] . Wd[e][r]))
//            expert e's [H, I] at down + e * lq_packed_bytes(H, I, bits)
//
// - gate_up: grid (I / 16 row strips, T * k slots); the block's 8 warps take the gate strip's
//   tiles (warps 0-3) and the up strip's (warps 4-7) in 4 slices of H each, so the block reads
//   one expert's 32 rows once; h_t is staged once per block; the slices are summed through shared
//   memory and 16 threads apply silu * up.
// - down: grid (H / 16 row strips, T); warp s < k streams slot s's expert strip over all of I,
//   with act[t, s] staged by the warp itself; the k rows are summed in slot order with their
//   weights (deterministic, no atomics).
// Both read the expert ids after the PDL wait (the router writes them), so their weights cannot be
// requested before it.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/lq_tile.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int MLQ_WARPS = 8;
constexpr int GU_SLICES = MLQ_WARPS / 2;  // slices of H per strip (gate: warps 0..3, up: 4..7)

struct MoeLqParams {
    const bf16* x;  // gate_up: h [T, H]; down: act [T, k, I]
    const uint8_t* bank;
    const int32_t* ids;
    const float* weights;  // down
    bf16* y;               // gate_up: act [T, k, I]; down: out [T, H]
    int T, k, H, I;
};

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

template <int BITS>
__global__ void __launch_bounds__(MLQ_WARPS * 32) moe_lq_gate_up_kernel(const MoeLqParams p) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    extern __shared__ uint4 mlq_smem[];
    __shared__ float partial[MLQ_WARPS][32][4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int strip = blockIdx.x, slot = blockIdx.y, t = slot / p.k;
    const int tiles = p.H / LQ_TILE_COLS, half = warp / GU_SLICES, slice = warp % GU_SLICES;
    const int tbeg = tiles * slice / GU_SLICES, tend = tiles * (slice + 1) / GU_SLICES;
    float* start = reinterpret_cast<float*>(mlq_smem + MLQ_WARPS * LQ_STAGES * TILE_BYTES / 16);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);

    pdl_begin();
    const int e = __ldcg(p.ids + slot);
    const size_t expert_bytes = size_t(2 * p.I / LQ_TILE_ROWS) * tiles * TILE_BYTES;
    const int row_strip = strip + half * (p.I / LQ_TILE_ROWS);  // the gate strip, or its up strip
    LqRing<BITS> ring(mlq_smem + warp * LQ_STAGES * TILE_BYTES / 16,
                      p.bank + e * expert_bytes + (size_t(row_strip) * tiles + tbeg) * TILE_BYTES, tend - tbeg, lane);
    ring.issue_first();
    lq_stage_x(xs, start, p.x + size_t(t) * p.H, 1, p.H, lq_code_centre<BITS>(), threadIdx.x, blockDim.x);
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    lq_stream_tiles(ring, xs, start, tiles, 1, tbeg, tend, lane, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
    __syncthreads();
    if (threadIdx.x >= LQ_TILE_ROWS) return;
    // row rho of the strip: token 0 of lane (rho % 8) * 4, value 0 (rows 0-7) or 2 (rows 8-15)
    const int rho = threadIdx.x, src_lane = (rho & 7) * 4, value = rho < 8 ? 0 : 2;
    float gate = 0.0f, up = 0.0f;
    for (int w = 0; w < GU_SLICES; ++w) {
        gate += partial[w][src_lane][value];
        up += partial[GU_SLICES + w][src_lane][value];
    }
    p.y[size_t(slot) * p.I + strip * LQ_TILE_ROWS + rho] = __float2bfloat16(silu(gate) * up);
}

template <int BITS>
__global__ void __launch_bounds__(MLQ_WARPS * 32) moe_lq_down_kernel(const MoeLqParams p) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    extern __shared__ uint4 mlq_smem[];
    __shared__ float partial[MLQ_WARPS][32][4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int strip = blockIdx.x, t = blockIdx.y, tiles = p.I / LQ_TILE_COLS;
    // per warp: its ring, its slot's act row (and the zero token), its tiles' start values
    const int x_vecs = 2 * lq_x_bytes(p.I) / 16, start_floats = lq_start_bytes(p.I) / 4;
    uint4* xs = mlq_smem + MLQ_WARPS * LQ_STAGES * TILE_BYTES / 16 + warp * x_vecs;
    float* start = reinterpret_cast<float*>(mlq_smem + MLQ_WARPS * (LQ_STAGES * TILE_BYTES / 16 + x_vecs)) +
                   warp * start_floats;

    pdl_begin();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (warp < p.k) {
        const int slot = t * p.k + warp, e = __ldcg(p.ids + slot);
        const size_t expert_bytes = size_t(p.H / LQ_TILE_ROWS) * tiles * TILE_BYTES;
        LqRing<BITS> ring(mlq_smem + warp * LQ_STAGES * TILE_BYTES / 16,
                          p.bank + e * expert_bytes + size_t(strip) * tiles * TILE_BYTES, tiles, lane);
        ring.issue_first();
        lq_stage_x(xs, start, p.x + size_t(slot) * p.I, 1, p.I, lq_code_centre<BITS>(), lane, 32);
        __syncwarp();
        lq_stream_tiles(ring, xs, start, tiles, 1, 0, tiles, lane, acc);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
    __syncthreads();
    if (threadIdx.x >= LQ_TILE_ROWS) return;
    const int rho = threadIdx.x, src_lane = (rho & 7) * 4, value = rho < 8 ? 0 : 2;
    float sum = 0.0f;
    for (int s = 0; s < p.k; ++s) sum += __ldcg(p.weights + t * p.k + s) * partial[s][src_lane][value];
    p.y[size_t(t) * p.H + strip * LQ_TILE_ROWS + rho] = __float2bfloat16(sum);
}

// Shared memory beyond the static partial sums: the warps' rings, then the staged x and start values.
size_t gate_up_smem(int bits, int H) {
    return size_t(MLQ_WARPS) * LQ_STAGES * lq_tile_bytes(bits) + lq_start_bytes(H) + 2 * size_t(lq_x_bytes(H));
}
size_t down_smem(int bits, int I) {
    return size_t(MLQ_WARPS) * (LQ_STAGES * lq_tile_bytes(bits) + 2 * size_t(lq_x_bytes(I)) + lq_start_bytes(I));
}

template <class Kernel>
void launch_moe_lq(const char* op, Kernel kernel, dim3 grid, size_t smem, const MoeLqParams& p, cudaStream_t stream) {
    if (smem + sizeof(float) * MLQ_WARPS * 32 * 4 > 48 * 1024) allow_dynamic_smem(kernel, smem, op);
    launch_pdl(op, kernel, grid, MLQ_WARPS * 32, smem, stream, p);
}

void check_moe_lq(const char* op, int bits, int T, int k, int H, int I) {
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(T >= 1 && T <= GEMV_MAX_T, op, "T must be 1..8, got " + std::to_string(T));
    require(k >= 1 && k <= MLQ_WARPS, op, "k must be 1..8, got " + std::to_string(k));
    require(H > 0 && H % LQ_TILE_COLS == 0 && I > 0 && I % LQ_TILE_COLS == 0, op,
            "H and I must be positive multiples of 64, got " + std::to_string(H) + ", " + std::to_string(I));
}

}  // namespace

void moe_experts_lq_gate_up(const bf16* h, const uint8_t* gate_up, int bits, const int32_t* ids, bf16* act, int T,
                            int k, int H, int I, cudaStream_t stream) {
    check_moe_lq("moe_experts_lq_gate_up", bits, T, k, H, I);
    const MoeLqParams p{h, gate_up, ids, nullptr, act, T, k, H, I};
    const dim3 grid(I / LQ_TILE_ROWS, T * k);
    const size_t smem = gate_up_smem(bits, H);
    const char* op = "moe_experts_lq_gate_up";
    switch (bits) {
        case 4: launch_moe_lq(op, moe_lq_gate_up_kernel<4>, grid, smem, p, stream); break;
        case 5: launch_moe_lq(op, moe_lq_gate_up_kernel<5>, grid, smem, p, stream); break;
        default: launch_moe_lq(op, moe_lq_gate_up_kernel<6>, grid, smem, p, stream); break;
    }
}

void moe_experts_lq_down(const bf16* act, const uint8_t* down, int bits, const int32_t* ids, const float* weights,
                         bf16* out, int T, int k, int H, int I, cudaStream_t stream) {
    check_moe_lq("moe_experts_lq_down", bits, T, k, H, I);
    const MoeLqParams p{act, down, ids, weights, out, T, k, H, I};
    const dim3 grid(H / LQ_TILE_ROWS, T);
    const size_t smem = down_smem(bits, I);
    const char* op = "moe_experts_lq_down";
    switch (bits) {
        case 4: launch_moe_lq(op, moe_lq_down_kernel<4>, grid, smem, p, stream); break;
        case 5: launch_moe_lq(op, moe_lq_down_kernel<5>, grid, smem, p, stream); break;
        default: launch_moe_lq(op, moe_lq_down_kernel<6>, grid, smem, p, stream); break;
    }
}

}  // namespace lampo
