// gemv.cu - bandwidth-bound y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T (decode, verify).
//
// The weight matrix is streamed exactly once: each warp owns R = 4 consecutive rows and a slice of
// the `in` axis (KS slices per row group, KS in {1, 2, 4, 8} chosen so the grid has >= 4 blocks per
// SM); lane l reads 16-byte vectors l, l + 32, ... of its 4 rows (two vectors per row in flight,
// L1-bypassing streaming loads) and the matching vectors of all T rows of x (small, L1/L2 resident),
// so every weight byte serves all T tokens. fp32 accumulators (T x R per lane) are summed across
// lanes by a butterfly that leaves one value per lane group, and across the KS slices of a block
// through shared memory. Tails: rows past `out` are clamped on load and never stored.
// Launched with PDL: each lane prefetches its first weight vectors into L2 before waiting for the
// kernel that produces x, so the weight stream starts during the previous kernel's tail.
#include <type_traits>

#include "bf16_vec.cuh"
#include "launch_utils.cuh"
#include "matmul.cuh"

namespace lampo {
namespace {

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_ROWS = 4;    // rows per warp (R)
constexpr int GEMV_UNROLL = 2;  // 16-byte vectors per row in flight

constexpr int next_pow2(int n) { return n <= 1 ? 1 : 2 * next_pow2((n + 1) / 2); }

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void fma_bf16x8(float& acc, const uint4& w, const float (&x)[8]) {
    acc = fmaf(bf16_lo(w.x), x[0], acc); acc = fmaf(bf16_hi(w.x), x[1], acc);
    acc = fmaf(bf16_lo(w.y), x[2], acc); acc = fmaf(bf16_hi(w.y), x[3], acc);
    acc = fmaf(bf16_lo(w.z), x[4], acc); acc = fmaf(bf16_hi(w.z), x[5], acc);
    acc = fmaf(bf16_lo(w.w), x[6], acc); acc = fmaf(bf16_hi(w.w), x[7], acc);
}

// Sum N values (N a power of two <= 32) over the warp. Afterwards lane l holds the total of value
// l / (32 / N) when l % (32 / N) == 0.
template <int N>
__device__ __forceinline__ float warp_reduce_many(float (&v)[N], int lane) {
    int n = N;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        if (n > 1) {
            const bool upper = lane & o;
#pragma unroll
            for (int i = 0; i < N / 2; ++i) {
                if (i < n / 2) {
                    const float send = upper ? v[i] : v[i + n / 2];
                    const float keep = upper ? v[i + n / 2] : v[i];
                    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                }
            }
            n >>= 1;
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
    }
    return v[0];
}

template <int T, class OutT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(const bf16* __restrict__ W, const bf16* __restrict__ x, OutT* __restrict__ y, int out, int in, int ks_count) {
    constexpr int NV = next_pow2(T * GEMV_ROWS);
    __shared__ float partial[GEMV_WARPS][NV];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups_per_block = GEMV_WARPS / ks_count;
    const int group = warp / ks_count, ks = warp % ks_count;
    const int row0 = (blockIdx.x * groups_per_block + group) * GEMV_ROWS;
    const int nvec = in / 8;
    const int vbeg = int(int64_t(nvec) * ks / ks_count), vend = int(int64_t(nvec) * (ks + 1) / ks_count);

    const uint4* wrow[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
        wrow[r] = reinterpret_cast<const uint4*>(W + size_t(min(row0 + r, out - 1)) * in);
    // The weights are immutable: pull this lane's first vectors into L2 while the previous kernel
    // finishes, then wait for it before reading x.
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
        const int v = vbeg + lane + 32 * u;
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
            if (v < vend) pdl_prefetch_l2(wrow[r] + v);
    }
    pdl_begin();
    const uint4* xv = reinterpret_cast<const uint4*>(x);

    float acc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[i] = 0.0f;

    for (int v0 = vbeg + lane; v0 < vend; v0 += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL][GEMV_ROWS];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int v = v0 + 32 * u;
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r)
                wv[u][r] = v < vend ? load_stream(wrow[r] + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int v = v0 + 32 * u;
            if (v < vend) {
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    float xf[8];
                    bf16x8_to_float(__ldg(xv + size_t(t) * nvec + v), xf);
#pragma unroll
                    for (int r = 0; r < GEMV_ROWS; ++r) fma_bf16x8(acc[t * GEMV_ROWS + r], wv[u][r], xf);
                }
            }
        }
    }

    const float total = warp_reduce_many<NV>(acc, lane);
    constexpr int SPAN = 32 / NV;
    if (lane % SPAN == 0) partial[warp][lane / SPAN] = total;
    __syncthreads();
    const int item = threadIdx.x;  // (group, value) pairs of this block
    if (item < groups_per_block * T * GEMV_ROWS) {
        const int g = item / (T * GEMV_ROWS), idx = item % (T * GEMV_ROWS);
        float sum = 0.0f;
        for (int k = 0; k < ks_count; ++k) sum += partial[g * ks_count + k][idx];
        const int row = (blockIdx.x * groups_per_block + g) * GEMV_ROWS + idx % GEMV_ROWS;
        const int t = idx / GEMV_ROWS;
        if (row < out) {
            if constexpr (std::is_same_v<OutT, float>) y[size_t(t) * out + row] = sum;
            else y[size_t(t) * out + row] = __float2bfloat16(sum);
        }
    }
}

template <int T, class OutT>
void launch_gemv(const bf16* W, const bf16* x, OutT* y, int out, int in, cudaStream_t stream) {
    const int row_groups = ceil_div(out, GEMV_ROWS);
    const int target_blocks = 4 * sm_count();
    int ks = 1;
    while (ks < GEMV_WARPS && ceil_div(row_groups, GEMV_WARPS / ks) < target_blocks && in / 8 / (2 * ks) >= 32) ks *= 2;
    const int blocks = ceil_div(row_groups, GEMV_WARPS / ks);
    launch_pdl("gemv_kernel", gemv_kernel<T, OutT>, blocks, GEMV_WARPS * 32, 0, stream, W, x, y, out, in, ks);
}

}  // namespace

template <class OutT>
void gemv_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    require(in > 0 && in % 8 == 0, "gemv", "in must be a positive multiple of 8, got " + std::to_string(in));
    require(T >= 1 && T <= GEMV_MAX_T, "gemv", "T must be 1..8, got " + std::to_string(T));
    if (out <= 0) return;
    switch (T) {
        case 1: launch_gemv<1>(W, x, y, out, in, stream); break;
        case 2: launch_gemv<2>(W, x, y, out, in, stream); break;
        case 3: launch_gemv<3>(W, x, y, out, in, stream); break;
        case 4: launch_gemv<4>(W, x, y, out, in, stream); break;
        case 5: launch_gemv<5>(W, x, y, out, in, stream); break;
        case 6: launch_gemv<6>(W, x, y, out, in, stream); break;
        case 7: launch_gemv<7>(W, x, y, out, in, stream); break;
        default: launch_gemv<8>(W, x, y, out, in, stream); break;
    }
}

template void gemv_bf16<bf16>(const bf16*, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_bf16<float>(const bf16*, const bf16*, float*, int, int, int, cudaStream_t);

}  // namespace lampo
