// gemm_wgmma.cuh - thin wrappers over the sm_90a-only instructions of gemm_sm90.cu (include only
// from code compiled for sm_90a; the callers guard on __CUDA_ARCH_FEAT_SM90_ALL):
//   ring_barriers_init: a producer / consumer ring's full / empty barriers (kernels/mbarrier.cuh).
//   tma_load_2d: cp.async.bulk.tensor box load (tensor map -> shared), completing on an mbarrier.
//   wgmma_desc_sw128: the shared-memory matrix descriptor of a K-major bf16 tile whose 128-byte rows
//     are TMA 128B-swizzled (8-row groups 1,024 bytes apart; tile base 1,024-byte aligned).
//   wgmma_m64n{256,128}k16: D[64 x N] (+)= A[64 x 16] * B[N x 16]^T for one warpgroup, A and B
//     from descriptors, fp32 accumulators in the m16n8 C-fragment layout repeated over N/8 column
//     blocks (thread t: row 16 * (t / 32) + (t % 32) / 4 (+8), columns 8j + 2 (t % 4) (+1));
//     `accumulate == 0` overwrites D. wgmma_fence / wgmma_commit / wgmma_wait<N> order them.
//   wgmma_m64n{256,128}k16_rs: the same with A [64 x 16] from registers: warp w of the warpgroup
//     holds rows 16w..16w+15 as the mma.sync m16n8k16 A fragment (a0: row g, k 2q..2q+1; a1: row
//     g+8; a2: row g, k 2q+8..; a3: row g+8, k 2q+8..; g = lane / 4, q = lane % 4). The registers
//     must stay unchanged until the wgmma that reads them has retired (wgmma_wait).
//   named_barrier_sync: bar.sync over `threads` threads (id > 0).
//   tensor_map_encoder / tensor_map (host): the driver's cuTensorMapEncodeTiled and the map of a
//     row-major [rows, cols] bf16 matrix read in 128-byte swizzled boxes of box_rows x 64.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include "kernels/common.cuh"
#include "kernels/mbarrier.cuh"

namespace lampo {

// A producer / consumer ring's barriers, by the whole block: thread 0 makes each stage's `full`
// barrier wait for one arrival (the producer's, with its transaction bytes) and its `empty`
// barrier for one arrival per consumer warp, then every thread waits for that.
__device__ __forceinline__ void ring_barriers_init(uint64_t* full, uint64_t* empty, int stages, int consumer_warps) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], consumer_warps);
        }
        mbarrier_init_fence();
    }
    __syncthreads();
}

// Box at (c0 = inner/K coordinate, c1 = row coordinate); out-of-range elements are zero-filled
// and still counted in the transaction bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, uint64_t* bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
            "r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* tile) {
    uint64_t desc = (smem_u32(tile) & 0x3FFFFu) >> 4;  // start address
    desc |= uint64_t(1) << 16;                          // leading byte offset (unused for swizzled K-major)
    desc |= uint64_t(1024 >> 4) << 32;                  // stride byte offset: 8 rows x 128 bytes
    desc |= uint64_t(1) << 62;                          // layout: 128-byte swizzle
    return desc;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// The accumulator operands of a wgmma over float d[N] ("+f"(d[0]) .. "+f"(d[N - 1]), in order) and
// their place-holders "%0, ..., %N-1" in the instruction's {...} list.
#define LAMPO_WGMMA_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                          "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define LAMPO_WGMMA_D32(i) LAMPO_WGMMA_D8(i), LAMPO_WGMMA_D8(i + 8), LAMPO_WGMMA_D8(i + 16), LAMPO_WGMMA_D8(i + 24)
#define LAMPO_WGMMA_D64(i) LAMPO_WGMMA_D32(i), LAMPO_WGMMA_D32(i + 32)
#define LAMPO_WGMMA_R64                                                                             \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                        \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                              \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                              \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define LAMPO_WGMMA_R128                                                                            \
    LAMPO_WGMMA_R64 ","                                                                             \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                              \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                              \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"                  \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LAMPO_WGMMA_R128
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : LAMPO_WGMMA_D64(0), LAMPO_WGMMA_D64(64)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate)
        : "memory");
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LAMPO_WGMMA_R64
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : LAMPO_WGMMA_D64(0)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate)
        : "memory");
}

__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LAMPO_WGMMA_R128
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : LAMPO_WGMMA_D64(0), LAMPO_WGMMA_D64(64)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate)
        : "memory");
}

__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LAMPO_WGMMA_R64
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : LAMPO_WGMMA_D64(0)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(accumulate)
        : "memory");
}

#undef LAMPO_WGMMA_D8
#undef LAMPO_WGMMA_D32
#undef LAMPO_WGMMA_D64
#undef LAMPO_WGMMA_R64
#undef LAMPO_WGMMA_R128

// ---- host: TMA tensor maps ------------------------------------------------------------------------

constexpr int WGMMA_BOX_K = 64;  // the inner box: 64 bf16 = one 128-byte swizzle row

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        LAMPO_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        if (found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    });
    if (!fn) throw CudaError("gemm: the CUDA driver has no cuTensorMapEncodeTiled");
    return fn;
}

// Row-major [rows, cols] bf16 matrix read in boxes of box_rows x WGMMA_BOX_K, 128-byte swizzled.
inline CUtensorMap tensor_map(const __nv_bfloat16* base, int rows, int cols, int box_rows) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(cols) * sizeof(__nv_bfloat16)};
    const cuuint32_t box[2] = {cuuint32_t(WGMMA_BOX_K), cuuint32_t(box_rows)};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(base),
                                            dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) throw CudaError("gemm: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)));
    return map;
}

}  // namespace lampo
