// fill_random.cu - bench only: deterministic uniform random tensors written directly in VRAM
// (full-size models without a checkpoint file, and KV cache / state contents for --fast-depth).
// value[i] = lo + (hi - lo) * u(seed, i), u a splitmix64 hash of (seed, i) mapped to [0, 1).
#include "kernels/common.cuh"
#include "weights/weights.h"

namespace lampo {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ float unit(uint64_t seed, size_t i) {
    return float(splitmix64(seed ^ splitmix64(i)) >> 40) * (1.0f / 16777216.0f);
}

template <class T>
__device__ __forceinline__ T convert(float v);
template <> __device__ __forceinline__ bf16 convert<bf16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ float convert<float>(float v) { return v; }
template <> __device__ __forceinline__ half convert<half>(float v) { return __float2half(v); }

template <class T>
__global__ void fill_uniform_kernel(T* dst, size_t n, float lo, float span, uint64_t seed) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = convert<T>(lo + span * unit(seed, i));
    }
}

__global__ void fill_int8_kernel(int8_t* dst, size_t n, uint64_t seed) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = int8_t(int(unit(seed, i) * 255.0f) - 127);
    }
}

int grid_for(size_t n) {
    const size_t blocks = (n + 255) / 256;
    return int(blocks < 16384 ? (blocks ? blocks : 1) : 16384);
}

template <class T>
void fill_uniform(T* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
    fill_uniform_kernel<T><<<grid_for(n), 256, 0, stream>>>(dst, n, lo, hi - lo, seed);
}

}  // namespace

void fill_uniform_bf16(bf16* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
    fill_uniform(dst, n, lo, hi, seed, stream);
}
void fill_uniform_f32(float* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
    fill_uniform(dst, n, lo, hi, seed, stream);
}
void fill_uniform_f16(half* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
    fill_uniform(dst, n, lo, hi, seed, stream);
}
void fill_uniform_int8(int8_t* dst, size_t n, uint64_t seed, cudaStream_t stream) {
    fill_int8_kernel<<<grid_for(n), 256, 0, stream>>>(dst, n, seed);
}

}  // namespace lampo
