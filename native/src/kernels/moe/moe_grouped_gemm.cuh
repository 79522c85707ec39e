// moe_grouped_gemm.cuh - tensor-core GEMM over groups of rows, one weight matrix per group
// (the MoE prefill experts; also the router logits of a prefill chunk as a single group).
//
//   for each tile of rows [row0, min(row0 + 64, group_end[g])) of group g:
//     C[r, n] = sum_k A[a_row(r), k] * B[g][n, k]         bf16 x bf16 -> fp32 accumulation
//   a_row(r) = a_rows[r] (gathered activations) or r ; B [groups][N][K] bf16 (HF [out, in]).
//   Epilogues: F32 (C fp32 [rows][ldc]), BF16, SWIGLU (B rows are gate (0..N/2) | up (N/2..N);
//   C[r, i] = bf16(silu(gate_i) * up_i), C [rows][N/2]).
//   Tiles come from a device table (tile_group, tile_row0, *num_tiles) built on the GPU, so the
//   launch grid is a fixed upper bound and needs no host synchronisation; a null table means
//   one dense group of `rows` rows.
//
// Kernel: 64 x 128 x 64 tiles, 4 warps (2 x 2, warp tile 32 x 64), mma.sync m16n8k16 bf16,
// ldmatrix from XOR-swizzled shared memory (conflict-free), 3-stage cp.async pipeline,
// out-of-range rows / columns zero-filled by cp.async. K must be a multiple of 64; N even for
// BF16, a multiple of 128 for SWIGLU, any N for F32.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "kernels/common.cuh"
#include "kernels/mbarrier.cuh"

namespace lampo {
namespace moe_gemm {

constexpr int BM = 64, BN = 128, BK = 64, STAGES = 3, THREADS = 128;
constexpr size_t SMEM_BYTES = size_t(STAGES) * (BM + BN) * BK * sizeof(__nv_bfloat16);

enum class Epilogue { F32, BF16, SWIGLU };

struct Problem {
    const __nv_bfloat16* A;       // activations, rows of K
    const int32_t* a_rows;        // gather index per output row, or null
    const __nv_bfloat16* B;       // [groups][N][K]
    size_t b_group_stride;        // elements between groups' matrices
    void* C;                      // output rows of ldc elements
    int ldc;
    int N, K;
    const int32_t* tile_group;    // [tiles] or null (dense)
    const int32_t* tile_row0;     // [tiles] or null (dense)
    const int32_t* group_end;     // [groups] first row past each group, or null (dense)
    const int32_t* num_tiles;     // device scalar, or null (dense)
    int rows;                     // dense row count
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][64] bf16 tile (128-byte rows,
// chunk index XOR-swizzled by row so that ldmatrix's 8 row reads hit distinct banks).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}

template <Epilogue EP>
__global__ void __launch_bounds__(THREADS) grouped_gemm_kernel(Problem p) {
    extern __shared__ uint4 gemm_smem[];
    const int tile = blockIdx.y;
    if (p.num_tiles && tile >= *p.num_tiles) return;
    const int group = p.tile_group ? p.tile_group[tile] : 0;
    const int row0 = p.tile_row0 ? p.tile_row0[tile] : tile * BM;
    const int row_end = p.group_end ? p.group_end[group] : p.rows;
    const int n0 = blockIdx.x * BN;
    const __nv_bfloat16* B = p.B + size_t(group) * p.b_group_stride;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp / 2, wn = warp % 2;
    const uint32_t smem_base = smem_u32(gemm_smem);
    constexpr uint32_t A_STAGE = BM * BK * 2, B_STAGE = BN * BK * 2;
    auto a_stage = [&](int s) { return smem_base + s * (A_STAGE + B_STAGE); };
    auto b_stage = [&](int s) { return smem_base + s * (A_STAGE + B_STAGE) + A_STAGE; };

    // This thread copies chunk (tid % 8) of rows tid/8 + 16i: 4 rows of A, 8 rows of B.
    const int chunk = tid % 8, rsub = tid / 8;
    const __nv_bfloat16* a_src[BM / 16];
    bool a_ok[BM / 16];
#pragma unroll
    for (int i = 0; i < BM / 16; ++i) {
        const int r = row0 + rsub + 16 * i;
        a_ok[i] = r < row_end;
        const int ar = a_ok[i] ? (p.a_rows ? p.a_rows[r] : r) : 0;
        a_src[i] = p.A + size_t(ar) * p.K + chunk * 8;
    }
    const __nv_bfloat16* b_src[BN / 16];
    bool b_ok[BN / 16];
#pragma unroll
    for (int i = 0; i < BN / 16; ++i) {
        const int n = rsub + 16 * i;  // row of the B tile
        int wrow;
        if constexpr (EP == Epilogue::SWIGLU) {
            // interleave: tile row 2c -> gate row n0/2 + c, tile row 2c+1 -> up row N/2 + n0/2 + c
            wrow = (n & 1) ? p.N / 2 + (n0 + n) / 2 : (n0 + n) / 2;
        } else {
            wrow = n0 + n;
        }
        b_ok[i] = wrow < p.N;
        b_src[i] = B + size_t(b_ok[i] ? wrow : 0) * p.K + chunk * 8;
    }

    auto load_stage = [&](int s, int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < BM / 16; ++i)
            cp_async16(a_stage(s) + swz(rsub + 16 * i, chunk), a_src[i] + k0, a_ok[i]);
#pragma unroll
        for (int i = 0; i < BN / 16; ++i)
            cp_async16(b_stage(s) + swz(rsub + 16 * i, chunk), b_src[i] + k0, b_ok[i]);
    };

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    const int KT = p.K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int nk = kt + STAGES - 1;
        if (nk < KT) load_stage(nk % STAGES, nk);
        cp_async_commit();

        const uint32_t As = a_stage(kt % STAGES), Bs = b_stage(kt % STAGES);
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t af[2][4], bfrag[8][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int r = wm * 32 + mi * 16 + (lane & 15);
                ldmatrix_x4(As + swz(r, kk * 2 + (lane >> 4)), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
            }
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                const int r = wn * 64 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(Bs + swz(r, kk * 2 + ((lane >> 3) & 1)), bfrag[2 * np][0], bfrag[2 * np][1],
                            bfrag[2 * np + 1][0], bfrag[2 * np + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfrag[ni]);
        }
    }
    cp_async_wait<0>();

    // Epilogue: acc[mi][ni] = rows (gid, gid + 8) x columns (2 tig, 2 tig + 1) of an m16n8 tile.
    const int gid = lane / 4, tig = lane % 4;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = row0 + wm * 32 + mi * 16 + gid + half * 8;
            if (r >= row_end) continue;
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) {
                const int n = n0 + wn * 64 + ni * 8 + 2 * tig;
                const float c0 = acc[mi][ni][2 * half], c1 = acc[mi][ni][2 * half + 1];
                if constexpr (EP == Epilogue::F32) {
                    float* C = static_cast<float*>(p.C) + size_t(r) * p.ldc;
                    if (n < p.N) C[n] = c0;
                    if (n + 1 < p.N) C[n + 1] = c1;
                } else if constexpr (EP == Epilogue::BF16) {
                    __nv_bfloat16* C = static_cast<__nv_bfloat16*>(p.C) + size_t(r) * p.ldc;
                    if (n < p.N) *reinterpret_cast<__nv_bfloat162*>(C + n) = __floats2bfloat162_rn(c0, c1);
                } else {
                    __nv_bfloat16* C = static_cast<__nv_bfloat16*>(p.C) + size_t(r) * p.ldc;
                    C[n / 2] = __float2bfloat16_rn(silu(c0) * c1);
                }
            }
        }
}

// Launches the kernel over `tile_slots` row tiles (an upper bound when a tile table is given).
template <Epilogue EP>
void launch_grouped_gemm(const Problem& p, int tile_slots, cudaStream_t stream) {
    static const bool smem_configured = [] {
        LAMPO_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<EP>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              int(SMEM_BYTES)));
        return true;
    }();
    (void)smem_configured;
    const dim3 grid((p.N + BN - 1) / BN, tile_slots);
    grouped_gemm_kernel<EP><<<grid, THREADS, SMEM_BYTES, stream>>>(p);
}

}  // namespace moe_gemm
}  // namespace lampo
