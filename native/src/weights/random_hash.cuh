// random_hash.cuh - the counter-based hash behind the bench-only random fills (fill_random.cu,
// lq_quantize.cu's lq_fill_random): value i of a fill is a pure function of (seed, i), so a fill
// is deterministic per seed, independent of the launch shape, and needs no generator state.
//   random_bits(seed, i) = splitmix64(seed ^ splitmix64(i))       (64 bits)
//   random_unit(seed, i) = top 24 bits of random_bits / 2^24       (in [0, 1))
#pragma once

#include <cstddef>
#include <cstdint>

namespace lampo {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t random_bits(uint64_t seed, size_t i) { return splitmix64(seed ^ splitmix64(i)); }

__device__ __forceinline__ float random_unit(uint64_t seed, size_t i) {
    return float(random_bits(seed, i) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace lampo
