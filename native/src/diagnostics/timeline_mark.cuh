// timeline_mark.cuh - the device half of the timeline build (timeline.h; CUDA only, included by
// common.cuh after its error macros): each translation unit's view of the recording buffer,
// registered with the host side at load, and the marks: timeline_mark (a block's, which pdl_begin
// calls) and timeline_mark_warp (a warp's). Without LAMPO_TIMELINE they are empty.
#pragma once

#include "diagnostics/timeline.h"

namespace lampo {

#ifdef LAMPO_TIMELINE
namespace {
__device__ TimelineBuffer tl_buffer;  // this translation unit's view of the recording buffer
void tl_bind(const TimelineBuffer& b) { LAMPO_CUDA_CHECK(cudaMemcpyToSymbol(tl_buffer, &b, sizeof b)); }
const bool tl_registered = timeline_register(&tl_bind);
}  // namespace
#endif

// The calling thread records `stage` (and `warp`) on the timeline (timeline.h); nothing unless
// built with LAMPO_TIMELINE and a timeline is recording.
__device__ __forceinline__ void timeline_record(TimelineStage stage, uint8_t warp) {
#ifdef LAMPO_TIMELINE
    if (!tl_buffer.events) return;
    uint32_t sm;
    uint64_t t, grid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    if (sm >= tl_buffer.sms) return;
    const uint32_t i = atomicAdd(tl_buffer.counts + sm, 1u);
    if (i < tl_buffer.per_sm)
        tl_buffer.events[size_t(sm) * tl_buffer.per_sm + i] = {
            t, grid, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), uint16_t(sm), stage, warp};
#else
    (void)stage;
    (void)warp;
#endif
}

// Thread 0 of the block records `stage` (one mark per block).
__device__ __forceinline__ void timeline_mark(TimelineStage stage) {
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0) timeline_record(stage, 0);
}

// Lane 0 of the calling warp records `stage` (one mark per warp; blocks of x-threads only).
__device__ __forceinline__ void timeline_mark_warp(TimelineStage stage) {
    if ((threadIdx.x & 31) == 0) timeline_record(stage, uint8_t(threadIdx.x >> 5));
}

}  // namespace lampo
