// order_key.cuh - ranking floats by integer compares (CUDA only), shared by the router's top-k
// (moe_topk.cuh) and the sampler's arg-max (sampling.cu).
//   order_key: order-preserving float -> uint32 (a larger float gets a larger key; -0 gets +0's
//   key so they tie; only the NaN 0xffffffff maps to key 0, which callers use for "absent");
//   key_value inverts it.
//   ArgMax / warp_argmax: the largest key and, among its holders, the lowest id.
#pragma once

#include <climits>
#include <cstdint>

namespace lampo {

__device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t b = __float_as_uint(f);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Running arg-max of keys offered in ascending id order: only a strictly larger key replaces, so
// ties keep the lower id. Key 0 (absent) never replaces the initial {0, 0}.
struct ArgMax {
    uint32_t key;
    int id;
    __device__ __forceinline__ void offer(uint32_t k, int i) {
        if (k > key) { key = k; id = i; }
    }
};

// Largest key of the warp, lowest id among its holders; in every lane (sm_80+ redux).
__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
    const uint32_t key = __reduce_max_sync(0xffffffffu, a.key);
    return {key, __reduce_min_sync(0xffffffffu, a.key == key ? a.id : INT_MAX)};
}

}  // namespace lampo
