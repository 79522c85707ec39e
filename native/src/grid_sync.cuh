// grid_sync.cuh - synchronisation between the blocks of one persistent launch (CUDA only).
//
// Only for grids whose blocks are all resident at once (the launcher sizes the grid from the
// occupancy calculator, at most one wave); a block that waits here never waits for a block that
// has not started. `counter` is a global word that is 0 when the launch begins; barrier n (1, 2, ...)
// of the launch waits until it reaches n * gridDim.x. The last block through `grid_exit_ticket`
// puts the words back to 0 for the next launch (graph replays included).
#pragma once

#include "common.cuh"

namespace lampo {

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every write made by any block before the barrier is visible (through L2: read it with
// ld.global.cg / __ldcg, never the non-coherent path) to every block after it.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
        while (load_acquire_gpu(counter) < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

// True in exactly one block: the last to arrive, which then sees every other block's writes and
// resets counter[0] (the barrier word) and counter[1] (this ticket) to 0 before it returns.
__device__ __forceinline__ bool grid_exit_ticket(unsigned* counter) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(counter + 1, 1u) == gridDim.x - 1;
        if (last) {
            __threadfence();
            counter[0] = 0;
            counter[1] = 0;
        }
    }
    __syncthreads();
    return last;
}

}  // namespace lampo
