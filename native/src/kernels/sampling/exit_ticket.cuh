// exit_ticket.cuh - "last block out" for a launch whose final step needs every block's writes
// (CUDA only). `ticket` is a global word that is 0 when the launch begins; the last block through
// grid_exit_ticket puts it back to 0 for the next launch (graph replays included).
#pragma once

#include "kernels/common.cuh"

namespace lampo {

// True in exactly one block: the last to arrive, which then sees every other block's writes
// (read them through L2, __ldcg, never the non-coherent path).
__device__ __forceinline__ bool grid_exit_ticket(unsigned* ticket) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        if (last) {
            __threadfence();
            *ticket = 0;
        }
    }
    __syncthreads();
    return last;
}

}  // namespace lampo
