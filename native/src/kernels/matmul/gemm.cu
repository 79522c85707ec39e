// gemm.cu - tensor-core y [T, out] = x [T, in] @ W^T for prefill chunks (any T; in, out % 8 == 0).
//
// Block tile 128 (tokens) x BN (outputs, 256 or 128) x 32 (in), 8 warps as 2 x 4, warp tile 64 x
// BN/4, mma.sync.m16n8k16 bf16 -> fp32. A (x) and B (W) tiles are both K-contiguous ("TN"), loaded
// with 16-byte cp.async into a 4-stage ring and read with ldmatrix.x4; each 64-byte smem row stores
// its 16-byte chunk ch at ch ^ ((row / 2) % 4), which makes the ldmatrix reads bank-conflict free.
// Out-of-range rows and k-chunks are zero-filled, out-of-range outputs not stored. BN = 128 is used
// when the 256-wide grid would not fill the GPU once. This is the portable (sm_80+) path; on a 9.0
// device with the sm_90a code compiled in, gemm_bf16 hands the product to gemm_sm90.cu instead.
#include <type_traits>

#include "kernels/matmul/gemm_sm90.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/matmul.cuh"
#include "kernels/mma_sync.cuh"

namespace lampo {
namespace {

constexpr int BM = 128, BK = 32, STAGES = 4, GEMM_THREADS = 256;

__device__ __forceinline__ int swz(int row, int ch) { return row * BK + ((ch ^ ((row >> 1) & 3)) * 8); }

template <int BN>
constexpr int gemm_smem_bytes() { return STAGES * (BM + BN) * BK * 2; }

template <class OutT>
__device__ __forceinline__ void store_pair(OutT* y, size_t idx, float a, float b) {
    if constexpr (std::is_same_v<OutT, float>) {
        *reinterpret_cast<float2*>(y + idx) = make_float2(a, b);
    } else {
        *reinterpret_cast<__nv_bfloat162*>(y + idx) = __floats2bfloat162_rn(a, b);
    }
}

template <int BN, class OutT>
__global__ void __launch_bounds__(GEMM_THREADS, 1)
gemm_kernel(const bf16* __restrict__ X, const bf16* __restrict__ W, OutT* __restrict__ Y, int M, int N, int K) {
    constexpr int WN = BN / 4;       // warp tile width
    constexpr int NT = WN / 8;       // n8 tiles per warp
    constexpr int MTL = 4;           // m16 tiles per warp (64 rows)
    extern __shared__ __align__(16) bf16 gsm[];
    bf16* As = gsm;                          // [STAGES][BM * BK]
    bf16* Bs = gsm + STAGES * BM * BK;       // [STAGES][BN * BK]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = warp >> 2, wn = warp & 3;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int ktiles = (K + BK - 1) / BK;

    auto load_stage = [&](int kt, int slot) {
        const int k0 = kt * BK;
        bf16* as = As + slot * BM * BK;
        bf16* bs = Bs + slot * BN * BK;
#pragma unroll
        for (int e = threadIdx.x; e < BM * 4; e += GEMM_THREADS) {
            const int row = e >> 2, ch = e & 3;
            const bool ok = m0 + row < M && k0 + ch * 8 < K;
            cp_async_16(as + swz(row, ch), ok ? X + size_t(m0 + row) * K + k0 + ch * 8 : X, ok);
        }
#pragma unroll
        for (int e = threadIdx.x; e < BN * 4; e += GEMM_THREADS) {
            const int row = e >> 2, ch = e & 3;
            const bool ok = n0 + row < N && k0 + ch * 8 < K;
            cp_async_16(bs + swz(row, ch), ok ? W + size_t(n0 + row) * K + k0 + ch * 8 : W, ok);
        }
    };

    float acc[MTL][NT][4];
#pragma unroll
    for (int i = 0; i < MTL; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < ktiles) load_stage(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
        const bf16* as = As + (kt % STAGES) * BM * BK;
        const bf16* bs = Bs + (kt % STAGES) * BN * BK;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t a[MTL][4];
#pragma unroll
            for (int i = 0; i < MTL; ++i) {
                const int row = wm * 64 + i * 16 + (lane & 15);
                ldmatrix_x4(a[i], as + swz(row, kk * 2 + (lane >> 4)));
            }
#pragma unroll
            for (int j = 0; j < NT / 2; ++j) {
                uint32_t b[4];
                const int row = wn * WN + j * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(b, bs + swz(row, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
                for (int i = 0; i < MTL; ++i) {
                    mma_bf16_16816(acc[i][2 * j], a[i], b[0], b[1]);
                    mma_bf16_16816(acc[i][2 * j + 1], a[i], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < MTL; ++i) {
        const int row = m0 + wm * 64 + i * 16 + (lane >> 2);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int col = n0 + wn * WN + j * 8 + 2 * (lane & 3);
            if (col < N) {
                if (row < M) store_pair(Y, size_t(row) * N + col, acc[i][j][0], acc[i][j][1]);
                if (row + 8 < M) store_pair(Y, size_t(row + 8) * N + col, acc[i][j][2], acc[i][j][3]);
            }
        }
    }
}

template <int BN, class OutT>
void launch_gemm(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    auto kernel = gemm_kernel<BN, OutT>;
    allow_dynamic_smem(kernel, gemm_smem_bytes<BN>(), "gemm");
    const dim3 grid(ceil_div(out, BN), ceil_div(T, BM));
    kernel<<<grid, GEMM_THREADS, gemm_smem_bytes<BN>(), stream>>>(x, W, y, T, out, in);
}

}  // namespace

template <class OutT>
void gemm_bf16(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    require(in > 0 && in % 8 == 0, "gemm", "in must be a positive multiple of 8, got " + std::to_string(in));
    require(out > 0 && out % 8 == 0, "gemm", "out must be a positive multiple of 8, got " + std::to_string(out));
    require(T <= 65535 * BM, "gemm", "T too large: " + std::to_string(T));
    if (T <= 0) return;
#if defined(LAMPO_GEMM_SM90A)
    if (gemm_sm90_usable(W, x)) return gemm_bf16_sm90(W, x, y, T, out, in, stream);
#endif
    const long wide_blocks = long(ceil_div(out, 256)) * ceil_div(T, BM);
    if (wide_blocks >= sm_count()) launch_gemm<256>(W, x, y, T, out, in, stream);
    else launch_gemm<128>(W, x, y, T, out, in, stream);
}

template void gemm_bf16<bf16>(const bf16*, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemm_bf16<float>(const bf16*, const bf16*, float*, int, int, int, cudaStream_t);

}  // namespace lampo
