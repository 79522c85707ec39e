// mbarrier.cuh - shared-memory transaction barriers and 1-D bulk copies (sm_90+; include freely,
// use only from code compiled for sm_90 or newer): the TMA GEMM rings (matmul/gemm_sm90.cu,
// gemm_lq_sm90.cu) and the LQ GEMV's per-warp rings of weight tiles (matmul/gemv_lq.cu).
//   mbarrier_init / mbarrier_init_fence: a barrier waiting for `count` arrivals, made visible to the
//     asynchronous proxy (bulk copies) by the fence.
//   mbarrier_arrive / mbarrier_arrive_expect_tx: an arrival (with the bytes the phase must also
//     receive from bulk copies); mbarrier_wait: spin until the phase of the given parity completed.
//   bulk_load: cp.async.bulk global -> shared of `bytes` (a multiple of 16; both addresses 16-byte
//     aligned), counted in the barrier's transaction bytes.
#pragma once

#include <cstdint>

namespace lampo {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

}  // namespace lampo
