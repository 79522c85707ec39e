// moe_distinct.cuh - the distinct experts of a few-token MoE step (a verify window; CUDA only), so
// the expert launches read each distinct expert's matrices once for all the tokens that chose it.
// Slots j = t * k + s (token t's s-th choice), j < n = T * k <= MOE_DISTINCT_MAX_SLOTS; a slot's
// root is the lowest slot holding the same expert. One warp finds them: each lane holds slots lane
// and lane + 32, __match_any_sync groups equal experts within each half, and the upper half looks
// its experts up in the lower half by shuffles.
#pragma once

#include <cstdint>

namespace lampo {

constexpr int MOE_DISTINCT_MAX_SLOTS = 64;

// Shared memory: root[j] for j < n.
struct MoeDistinct {
    int8_t root[MOE_DISTINCT_MAX_SLOTS];
};

// Fills d.root from the slots' experts `experts` [n] (shared memory), by the whole warp that calls it.
__device__ __forceinline__ void moe_find_distinct(const int* experts, int n, MoeDistinct& d) {
    const int lane = threadIdx.x & 31;
    const int lo = lane < n ? experts[lane] : -1 - lane;  // absent slots: values no expert and no other slot has
    const int hi = lane + 32 < n ? experts[lane + 32] : -33 - lane;
    const int root_lo = __ffs(__match_any_sync(0xffffffffu, lo)) - 1;
    int root_hi = 32 + __ffs(__match_any_sync(0xffffffffu, hi)) - 1;
    if (n > 32) {
        for (int i = 31; i >= 0; --i)  // downwards: the lowest lower-half slot with the expert wins
            if (__shfl_sync(0xffffffffu, lo, i) == hi) root_hi = i;
    }
    if (lane < n) d.root[lane] = int8_t(root_lo);
    if (lane + 32 < n) d.root[lane + 32] = int8_t(root_hi);
}

}  // namespace lampo
