// gemv.cu - bandwidth-bound y [T, out] = x [T, in] @ W^T for T <= GEMV_MAX_T (decode, verify).
//
// The weight matrix is streamed exactly once: each warp owns R consecutive rows (R = 4, or 3 where
// that makes a one-token grid exactly one wave: launch_gemv) and a slice of the `in` axis (KS slices
// per row group, KS in {1, 2, 4, 8} chosen so the grid has >= 4 blocks per SM; KS = 1 with R = 3);
// lane l reads 16-byte vectors l, l + 32, ... of its R rows (two vectors per row in flight,
// L1-bypassing streaming loads) and the matching vectors of all T rows of x (small, L1/L2 resident),
// so every weight byte serves all T tokens. fp32 accumulators (T x R per lane) are summed across
// lanes by a butterfly that leaves one value per lane group, and across the KS slices of a block
// through shared memory. Tails: rows past `out` are clamped on load and never stored.
// Launched with PDL: the weights are immutable, so before waiting for the kernel that produces x
// each lane already loads its first batch of weight vectors into registers; the weight stream
// starts during the previous kernel.
//
// Two decode-step (T = 1) forms fold the residual stream in (linear.h):
// - GemvIn::NormedResidual: x = bf16(rmsnorm(residual) * (1 + w)) is built by every block in
//   shared memory (norm_row.cuh: the same thread mapping and order as add_rmsnorm, so bit-identical
//   values); block 0 may also write it out for later kernels. The norm weight is copied into shared
//   memory before the wait and the first pass over the residual keeps the row there, so the second
//   pass reads no global memory.
// - GemvOut::AddToResidual: residual[row] += float(bf16(y[row])), the rounding the separate
//   bf16 output + add_rmsnorm would apply; the row's residual value is read right after the wait,
//   so the kernel's tail is a store, not a read-modify-write. GemvOut::SetResidual: residual[row] =
//   0 + float(bf16(y[row])), the same on a zeroed residual without zeroing it (the MTP pass's fc).
// gemv_bf16_parts stores the bf16 rows as RowParts (linear.h) instead of one [T, out] matrix.
#include <type_traits>

#include "kernels/bf16_vec.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/matmul.cuh"
#include "kernels/mma_sync.cuh"
#include "kernels/norm_row.cuh"

namespace lampo {
namespace {

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_ROWS = 4;    // rows per warp (R)
constexpr int GEMV_UNROLL = 2;  // 16-byte vectors per row in flight
static_assert(GEMV_WARPS * 32 == NORM_THREADS, "the folded norm runs on the GEMV block");

enum class GemvIn { X, NormedResidual };
enum class GemvOut { Store, AddToResidual, SetResidual };

struct GemvParams {
    const bf16* W;
    const bf16* x;       // GemvIn::X: [T, in]
    void* y;             // [T, out] OutT, or the fp32 residual [out] for Add/SetResidual
    int out, in, ks_count;
    ResidualNorm norm;   // GemvIn::NormedResidual
    RowParts parts;      // n > 0: the bf16 rows stored as parts (linear.h), not at y
};

constexpr int next_pow2(int n) { return n <= 1 ? 1 : 2 * next_pow2((n + 1) / 2); }

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

// This lane's weight vectors v0 + 32 u of its R rows (zeros past the slice end).
template <int R>
__device__ __forceinline__ void load_weights(uint4 (&wv)[GEMV_UNROLL][R], const uint4* const (&wrow)[R], int v0,
                                             int vend) {
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
        const int v = v0 + 32 * u;
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = v < vend ? load_stream(wrow[r] + v) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// R: rows per warp (GEMV_ROWS, or 3 where that makes the grid one wave: launch_gemv).
template <int T, class OutT, GemvIn IN, GemvOut OUT, int R>
__global__ void __launch_bounds__(GEMV_WARPS * 32, T == 1 ? 4 : 1) gemv_kernel(const GemvParams p) {
    static_assert(IN == GemvIn::X || T == 1, "the folded norm serves one token");
    static_assert(OUT == GemvOut::Store || (T == 1 && std::is_same_v<OutT, float>), "residual add: one fp32 row");
    constexpr int NV = next_pow2(T * R);
    __shared__ float partial[GEMV_WARPS][NV];
    // GemvIn::NormedResidual: the normed row (in bf16), the norm weight (in bf16), the residual row (in fp32)
    extern __shared__ uint4 x_normed[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups_per_block = GEMV_WARPS / p.ks_count;
    const int group = warp / p.ks_count, ks = warp % p.ks_count;
    const int row0 = (blockIdx.x * groups_per_block + group) * R;
    const int nvec = p.in / 8;
    const int vbeg = int(int64_t(nvec) * ks / p.ks_count), vend = int(int64_t(nvec) * (ks + 1) / p.ks_count);

    const uint4* wrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        wrow[r] = reinterpret_cast<const uint4*>(p.W + size_t(min(row0 + r, p.out - 1)) * p.in);
    // Before the wait (weights only): the first batch into registers. L2 prefetches of later
    // batches measured slower (a lane's whole share: 27B decode -20%; the second batch: -2 to -3%).
    int v0 = vbeg + lane;
    uint4 wv[GEMV_UNROLL][R];
    load_weights(wv, wrow, v0, vend);
    if constexpr (IN == GemvIn::NormedResidual) {
        bf16* w_norm = reinterpret_cast<bf16*>(x_normed) + p.in;
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) cp_async_16(w_norm + 8 * i, p.norm.weight + 8 * i, true);
        cp_async_commit();
    }
    pdl_begin();
    // The epilogue's thread `item` owns (group, value) pair item of the block: output row item_row.
    const int item = threadIdx.x;
    auto item_row = [&] {
        return (blockIdx.x * groups_per_block + item / (T * R)) * R + item % R;
    };
    auto item_live = [&] { return item < groups_per_block * T * R && item_row() < p.out; };
    float residual_in = 0.0f;  // AddToResidual: the row's residual, read now, off the kernel's tail (Set: 0)
    if constexpr (OUT == GemvOut::AddToResidual)
        if (item_live()) residual_in = __ldcg(static_cast<const float*>(p.y) + item_row());

    const uint4* xv = reinterpret_cast<const uint4*>(p.x);
    if constexpr (IN == GemvIn::NormedResidual) {
        bf16* xs = reinterpret_cast<bf16*>(x_normed);
        const bf16* w_norm = xs + p.in;
        float* r_row = reinterpret_cast<float*>(xs + 2 * p.in);
        cp_async_wait<0>();  // w_norm: visible to every thread after norm_row_inv's block sum
        const float inv = norm_row_inv(p.norm.residual, nullptr, r_row, p.in, p.norm.eps);
        norm_row_scale<true>(r_row, inv, w_norm, xs, p.in);
        __syncthreads();
        if (p.norm.normed_out && blockIdx.x == 0)
            for (int i = threadIdx.x; i < nvec; i += blockDim.x) reinterpret_cast<uint4*>(p.norm.normed_out)[i] = x_normed[i];
        xv = x_normed;
    }

    float acc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[i] = 0.0f;
    while (true) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int v = v0 + 32 * u;
            if (v < vend) {
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    float xf[8];
                    if constexpr (IN == GemvIn::NormedResidual) bf16x8_to_float(xv[v], xf);
                    else bf16x8_to_float(__ldg(xv + size_t(t) * nvec + v), xf);
#pragma unroll
                    for (int r = 0; r < R; ++r) fma_bf16x8(acc[t * R + r], wv[u][r], xf);
                }
            }
        }
        v0 += 32 * GEMV_UNROLL;
        if (v0 >= vend) break;
        load_weights(wv, wrow, v0, vend);
    }

    const float total = warp_reduce_many<NV>(acc, lane);
    constexpr int SPAN = 32 / NV;
    if (lane % SPAN == 0) partial[warp][lane / SPAN] = total;
    __syncthreads();
    if (item_live()) {
        const int g = item / (T * R), idx = item % (T * R);
        float sum = 0.0f;
        for (int k = 0; k < p.ks_count; ++k) sum += partial[g * p.ks_count + k][idx];
        const int row = item_row(), t = idx / R;
        OutT* y = static_cast<OutT*>(p.y);
        if constexpr (OUT != GemvOut::Store) y[row] = residual_in + __bfloat162float(__float2bfloat16(sum));
        else if constexpr (std::is_same_v<OutT, float>) y[size_t(t) * p.out + row] = sum;
        else if (bf16* at = p.parts.n ? p.parts.at(t, row) : y + size_t(t) * p.out + row) *at = __float2bfloat16(sum);
    }
}

template <int T, class OutT, GemvIn IN, GemvOut OUT, int R>
void launch_gemv_rows(GemvParams p, int blocks, cudaStream_t stream) {
    const size_t smem = IN == GemvIn::NormedResidual ? size_t(p.in) * 8 : 0;
    if (smem > 48 * 1024) allow_dynamic_smem(gemv_kernel<T, OutT, IN, OUT, R>, smem, "gemv_normed");
    launch_pdl("gemv_kernel", gemv_kernel<T, OutT, IN, OUT, R>, blocks, GEMV_WARPS * 32, smem, stream, p);
}

// The grid: K slices (ks) doubled until there are >= 4 blocks per SM. A grid of 1.x waves starts
// its second wave cold, after the first exits; for one token, when 3 rows per warp over the whole
// K fill one wave (>= 90% of it), that shape is taken instead (the 35B-A3B GDN in-projection: 515
// blocks instead of 772; docs/design/kernels-core.md).
template <int T, class OutT, GemvIn IN = GemvIn::X, GemvOut OUT = GemvOut::Store>
void launch_gemv(GemvParams p, cudaStream_t stream) {
    const int row_groups = ceil_div(p.out, GEMV_ROWS);
    const int wave = 4 * sm_count();
    int ks = 1;
    while (ks < GEMV_WARPS && ceil_div(row_groups, GEMV_WARPS / ks) < wave && p.in / 8 / (2 * ks) >= 32) ks *= 2;
    const int blocks = ceil_div(row_groups, GEMV_WARPS / ks);
    if constexpr (T == 1) {
        const int blocks3 = ceil_div(ceil_div(p.out, 3), GEMV_WARPS);
        if (blocks > wave && blocks3 <= wave && blocks3 * 10 >= wave * 9) {
            p.ks_count = 1;
            launch_gemv_rows<T, OutT, IN, OUT, 3>(p, blocks3, stream);
            return;
        }
    }
    p.ks_count = ks;
    launch_gemv_rows<T, OutT, IN, OUT, GEMV_ROWS>(p, blocks, stream);
}

void check_gemv(int out, int in) {
    require(in > 0 && in % 8 == 0, "gemv", "in must be a positive multiple of 8, got " + std::to_string(in));
    require(out >= 0, "gemv", "out must be >= 0");
}

template <class OutT>
void run_gemv(const GemvParams& p, int T, cudaStream_t stream) {
    check_gemv(p.out, p.in);
    require(T >= 1 && T <= GEMV_MAX_T, "gemv", "T must be 1..8, got " + std::to_string(T));
    if (p.out == 0) return;
    switch (T) {
        case 1: launch_gemv<1, OutT>(p, stream); break;
        case 2: launch_gemv<2, OutT>(p, stream); break;
        case 3: launch_gemv<3, OutT>(p, stream); break;
        case 4: launch_gemv<4, OutT>(p, stream); break;
        case 5: launch_gemv<5, OutT>(p, stream); break;
        case 6: launch_gemv<6, OutT>(p, stream); break;
        case 7: launch_gemv<7, OutT>(p, stream); break;
        default: launch_gemv<8, OutT>(p, stream); break;
    }
}

}  // namespace

template <class OutT>
void gemv_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    run_gemv<OutT>({W, x, y, out, in, 1, {}, {}}, T, stream);
}

void require_row_parts(const char* op, const RowParts& parts, int min_n, int out) {
    require(parts.n >= min_n && parts.n <= RowParts::MAX && parts.first[parts.n] <= out, op,
            "needs " + std::to_string(min_n) + ".." + std::to_string(RowParts::MAX) + " parts within the " +
                std::to_string(out) + " rows");
}

void gemv_bf16_parts(const bf16* W, const bf16* x, const RowParts& parts, int T, int out, int in, cudaStream_t stream) {
    require_row_parts("gemv_parts", parts, 1, out);
    run_gemv<bf16>({W, x, nullptr, out, in, 1, {}, parts}, T, stream);
}

template <class OutT>
void gemv_bf16_normed(const bf16* W, const ResidualNorm& norm, OutT* y, int out, int in, cudaStream_t stream) {
    check_gemv(out, in);
    require(norm.residual && norm.weight, "gemv_normed", "needs the residual row and the norm weight");
    if (out == 0) return;
    launch_gemv<1, OutT, GemvIn::NormedResidual>({W, nullptr, y, out, in, 1, norm, {}}, stream);
}

void gemv_bf16_add_residual(const bf16* W, const bf16* x, float* residual, int out, int in, cudaStream_t stream,
                            bool set) {
    check_gemv(out, in);
    if (out == 0) return;
    const GemvParams p{W, x, residual, out, in, 1, {}, {}};
    if (set) launch_gemv<1, float, GemvIn::X, GemvOut::SetResidual>(p, stream);
    else launch_gemv<1, float, GemvIn::X, GemvOut::AddToResidual>(p, stream);
}

template void gemv_bf16<bf16>(const bf16*, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemv_bf16<float>(const bf16*, const bf16*, float*, int, int, int, cudaStream_t);
template void gemv_bf16_normed<bf16>(const bf16*, const ResidualNorm&, bf16*, int, int, cudaStream_t);
template void gemv_bf16_normed<float>(const bf16*, const ResidualNorm&, float*, int, int, cudaStream_t);

}  // namespace lampo
