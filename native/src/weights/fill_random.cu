// fill_random.cu - bench only: deterministic uniform random tensors written directly in VRAM
// (full-size models without a checkpoint file, and KV cache / state contents for --fast-depth).
// value[i] = lo + (hi - lo) * random_unit(seed, i), a hash of (seed, i) in [0, 1) (random_hash.cuh).
#include "kernels/common.cuh"
#include "weights/random_hash.cuh"
#include "weights/weights.h"

namespace lampo {
namespace {

template <class T>
__device__ __forceinline__ T convert(float v);
template <> __device__ __forceinline__ bf16 convert<bf16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ float convert<float>(float v) { return v; }
template <> __device__ __forceinline__ half convert<half>(float v) { return __float2half(v); }

template <class T>
__global__ void fill_uniform_kernel(T* dst, size_t n, float lo, float span, uint64_t seed) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = convert<T>(lo + span * random_unit(seed, i));
    }
}

__global__ void fill_kv_codes_kernel(uint8_t* dst, size_t n, uint64_t seed) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = uint8_t(int(random_unit(seed, i) * 255.0f) - 127 + 128);
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
void fill_kv_codes(uint8_t* dst, size_t n, uint64_t seed, cudaStream_t stream) {
    fill_kv_codes_kernel<<<grid_for(n), 256, 0, stream>>>(dst, n, seed);
}

}  // namespace lampo
