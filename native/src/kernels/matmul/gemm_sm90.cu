// gemm_sm90.cu - the Hopper (sm_90a) path of gemm_bf16: y [T, out] = x [T, in] @ W^T with wgmma.
//
// One CTA per 128 (tokens) x BN (outputs; 256, or 128 when the 256-wide grid would not fill the GPU
// once) tile, 3 warpgroups: warpgroup 0 is the producer (one thread issues TMA box loads of 64-wide
// K slices of x and W, 128-byte swizzled, into a STAGES-deep ring guarded by full/empty mbarriers),
// warpgroups 1 and 2 each own 64 token rows and run wgmma m64nBNk16 over the slice (fp32
// accumulators in registers), releasing a slot once the wgmma that read it has retired. TMA zero-fills
// everything outside [T, in] / [out, in], so tails need no special code; the epilogue stores only
// in-range outputs. Tiles are visited in groups of GROUP_M token tiles so that one wave of CTAs
// shares x and W slices in L2. Compiled only when CMake puts sm_90a in the architectures
// (LAMPO_GEMM_SM90A); the kernel body exists only in the sm_90a device pass.
#include "kernels/matmul/gemm_sm90.cuh"

#if defined(LAMPO_GEMM_SM90A)

#include <cstdlib>
#include <type_traits>

#include "kernels/matmul/gemm_wgmma.cuh"
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {

constexpr int BM = 128, BK = WGMMA_BOX_K, THREADS = 384;

template <int BN>
struct Sm90Tile {
    static constexpr int STAGES = BN == 256 ? 4 : 6;
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
    // ring + full/empty barriers + slack to align the ring to 1,024 bytes (128B swizzle atoms)
    static constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 2 * STAGES * 8 + 1024;
};

template <class OutT>
__device__ __forceinline__ void store_pair(OutT* y, size_t idx, float a, float b) {
    if constexpr (std::is_same_v<OutT, float>) {
        *reinterpret_cast<float2*>(y + idx) = make_float2(a, b);
    } else {
        *reinterpret_cast<__nv_bfloat162*>(y + idx) = __floats2bfloat162_rn(a, b);
    }
}

template <int BN>
__device__ __forceinline__ void wgmma_tile(float (&acc)[BN / 2], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (BN == 256) wgmma_m64n256k16(acc, da, db, accumulate);
    else wgmma_m64n128k16(acc, da, db, accumulate);
}

template <int BN, class OutT>
__global__ void __launch_bounds__(THREADS, 1)
gemm_sm90_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                 OutT* __restrict__ Y, int M, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tile = Sm90Tile<BN>;
    constexpr int STAGES = Tile::STAGES, GROUP_M = 16;
    extern __shared__ uint8_t gemm_sm90_smem[];
    uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(gemm_sm90_smem) + 1023) & ~uintptr_t(1023));
    uint8_t* As = ring;
    uint8_t* Bs = ring + STAGES * Tile::A_BYTES;
    uint64_t* full = reinterpret_cast<uint64_t*>(Bs + STAGES * Tile::B_BYTES);
    uint64_t* empty = full + STAGES;

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (int(blockIdx.x) / per_group) * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = int(blockIdx.x) % per_group;
    const int m0 = (first_m + in_group % group_rows) * BM, n0 = (in_group / group_rows) * BN;
    const int ktiles = (K + BK - 1) / BK;
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;

    ring_barriers_init(full, empty, STAGES, 8);  // 8 consumer warps

    if (wg == 0) {  // producer
        setmaxnreg_dec<40>();
        if (t == 0) {
            for (int kt = 0; kt < ktiles; ++kt) {
                const int s = kt % STAGES;
                if (kt >= STAGES) mbarrier_wait(&empty[s], ((kt / STAGES) - 1) & 1);
                mbarrier_arrive_expect_tx(&full[s], Tile::A_BYTES + Tile::B_BYTES);
                tma_load_2d(As + s * Tile::A_BYTES, &x_map, &full[s], kt * BK, m0);
                tma_load_2d(Bs + s * Tile::B_BYTES, &w_map, &full[s], kt * BK, n0);
            }
        }
        return;
    }

    setmaxnreg_inc<232>();
    const int c = wg - 1;  // consumer: token rows m0 + 64c .. +63
    float acc[BN / 2];
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        mbarrier_wait(&full[s], (kt / STAGES) & 1);
        const uint8_t* a = As + s * Tile::A_BYTES + c * 64 * (BK * 2);
        const uint8_t* b = Bs + s * Tile::B_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {  // k16 steps are 32-byte moves inside the swizzle atom
            wgmma_tile<BN>(acc, wgmma_desc_sw128(a + kk * 32), wgmma_desc_sw128(b + kk * 32), kt > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous slice's wgmma have retired: give its slot back
        if (kt > 0 && t % 32 == 0) mbarrier_arrive(&empty[(kt - 1) % STAGES]);
    }
    wgmma_wait<0>();

    const int warp = t / 32, lane = t % 32;
    const int row = m0 + c * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int col = n0 + j * 8 + 2 * (lane % 4);
        if (col < N) {
            if (row < M) store_pair(Y, size_t(row) * N + col, acc[4 * j], acc[4 * j + 1]);
            if (row + 8 < M) store_pair(Y, size_t(row + 8) * N + col, acc[4 * j + 2], acc[4 * j + 3]);
        }
    }
#endif
}

template <int BN, class OutT>
void launch_sm90(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    auto kernel = gemm_sm90_kernel<BN, OutT>;
    allow_dynamic_smem(kernel, Sm90Tile<BN>::SMEM, "gemm");
    const CUtensorMap x_map = tensor_map(x, T, in, BM), w_map = tensor_map(W, out, in, BN);
    const int tiles = ceil_div(T, BM) * ceil_div(out, BN);
    kernel<<<tiles, THREADS, Sm90Tile<BN>::SMEM, stream>>>(x_map, w_map, y, T, out, in);
    LAMPO_CHECK_LAUNCH("gemm (sm90)");
}

}  // namespace

bool gemm_sm90_usable(const bf16* W, const bf16* x) {
    const char* portable = std::getenv("LAMPO_GEMM_PORTABLE");
    if (portable && *portable && *portable != '0') return false;
    const bool aligned = (reinterpret_cast<uintptr_t>(W) | reinterpret_cast<uintptr_t>(x)) % 16 == 0;
    return aligned && sm90_or_newer() && device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
           device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

template <class OutT>
void gemm_bf16_sm90(const bf16* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    const long wide_tiles = long(ceil_div(out, 256)) * ceil_div(T, BM);
    if (wide_tiles >= sm_count()) launch_sm90<256>(W, x, y, T, out, in, stream);
    else launch_sm90<128>(W, x, y, T, out, in, stream);
}

template void gemm_bf16_sm90<bf16>(const bf16*, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemm_bf16_sm90<float>(const bf16*, const bf16*, float*, int, int, int, cudaStream_t);

}  // namespace lampo

#endif  // LAMPO_GEMM_SM90A
