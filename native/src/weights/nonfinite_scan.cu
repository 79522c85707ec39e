// nonfinite_scan.cu - count the NaN/Inf values of each weight tensor in VRAM.
//   count_nonfinite_kernel<Bits>: data [n] raw bit patterns, Bits = uint16_t (bf16) or uint32_t
//   (f32), any alignment; out {count, first} (count starts at 0, first at ~0ull):
//     count += #{i : (data[i] & E) == E},  first = min(first, min such i),
//   E the exponent mask (0x7F80 / 0x7F800000): an all-ones exponent is +-Inf or a NaN.
// 256 threads per block, grid-stride over 16-byte vectors (8 bf16 / 4 f32) when data is 16-byte
// aligned, else over single elements; the tail after the last whole vector is scalar. Each block
// reduces its count (sum) and first index (min) in registers and shared memory, then thread 0
// adds them to `out` with one atomicAdd and one atomicMin, only when the block found any.
//   count_nonfinite_lq_kernel: the same over the fp16 scales of an LQ tensor (the codes are
//   integers): tiles [n_tiles] of `tile_bytes`, `tiles` to a row strip, each ending in its 16 rows'
//   scales; index = the scale's place in the tensor's scales [.., N, K/64] (row-major, as
//   models/finite_scan.py counts them): (16 (tile / tiles) + row) tiles + tile % tiles. E = 0x7C00.
//   An interleaved half of a gate|up block (TensorSlot::interleaved_half h): the block's tiles,
//   rows 8 h .. 8 h + 7 of each, at the half's own row 8 (tile / tiles) + row - 8 h.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/matmul.cuh"
#include "weights/nonfinite_scan.h"

namespace lampo {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

template <class Bits, Bits kExp = sizeof(Bits) == 2 ? Bits(0x7F80u) : Bits(0x7F800000u)>
__device__ __forceinline__ void census(Bits bits, unsigned long long index, unsigned long long& count,
                                       unsigned long long& first) {
    if ((bits & kExp) == kExp) {
        ++count;
        first = min(first, index);
    }
}

// The block's counts (sum) and first indices (min) reduced in registers and shared memory; thread
// 0 adds them to `out` when the block found any.
__device__ void add_block_census(unsigned long long count, unsigned long long first, NonFiniteCount* out) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_xor_sync(0xffffffffu, count, o);
        first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    }
    __shared__ unsigned long long s_count[kThreads / 32], s_first[kThreads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        s_count[warp] = count;
        s_first[warp] = first;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kThreads / 32; ++w) {
            count += s_count[w];
            first = min(first, s_first[w]);
        }
        if (count) {
            atomicAdd(&out->count, count);
            atomicMin(&out->first, first);
        }
    }
}

template <class Bits>
__global__ void __launch_bounds__(kThreads) count_nonfinite_kernel(const Bits* __restrict__ data, size_t n,
                                                                   NonFiniteCount* __restrict__ out) {
    constexpr int kVec = 16 / sizeof(Bits);
    unsigned long long count = 0, first = ULLONG_MAX;
    const size_t stride = size_t(gridDim.x) * kThreads;
    const size_t tid = size_t(blockIdx.x) * kThreads + threadIdx.x;
    const size_t n_vec = reinterpret_cast<uintptr_t>(data) % 16 == 0 ? n / kVec : 0;
    const uint4* vec = reinterpret_cast<const uint4*>(data);
    for (size_t v = tid; v < n_vec; v += stride) {
        const uint4 q = __ldcs(vec + v);  // read once: do not keep it in L2
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            if constexpr (sizeof(Bits) == 2) {
                census(Bits(words[w] & 0xFFFFu), v * kVec + 2 * w, count, first);
                census(Bits(words[w] >> 16), v * kVec + 2 * w + 1, count, first);
            } else {
                census(Bits(words[w]), v * kVec + w, count, first);
            }
        }
    }
    for (size_t i = n_vec * kVec + tid; i < n; i += stride) census(data[i], i, count, first);

    add_block_census(count, first, out);
}

// The index of scale `row` of `tile` in the tensor's scales [.., N, K/64] (`tiles` to a row strip);
// for an interleaved half (half >= 0: rows 8 half .. 8 half + 7 of the block's tiles) in the half's.
__device__ __forceinline__ unsigned long long lq_scale_index(size_t tile, int row, int half, int tiles) {
    const size_t strip = tile / tiles;
    const size_t own_row = half < 0 ? 16 * strip + row : 8 * strip + (row - 8 * half);
    return own_row * tiles + tile % tiles;
}

// One tile's fp16 scales per thread (all 16, or the 8 of an interleaved half), grid-stride.
__global__ void __launch_bounds__(kThreads) count_nonfinite_lq_kernel(const uint8_t* __restrict__ data, size_t n_tiles,
                                                                      int tile_bytes, int half, int tiles,
                                                                      NonFiniteCount* __restrict__ out) {
    unsigned long long count = 0, first = ULLONG_MAX;
    const size_t stride = size_t(gridDim.x) * kThreads;
    const int row0 = half < 0 ? 0 : 8 * half, vectors = half < 0 ? 2 : 1;  // 8 scales a 16-byte vector
    for (size_t t = size_t(blockIdx.x) * kThreads + threadIdx.x; t < n_tiles; t += stride) {
        const uint4* scales = reinterpret_cast<const uint4*>(data + (t + 1) * tile_bytes - 32) + row0 / 8;
        for (int v = 0; v < vectors; ++v) {
            const uint4 q = __ldcs(scales + v);
            const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const int row = row0 + 8 * v + 2 * w;
                census<uint16_t, 0x7C00u>(uint16_t(words[w] & 0xFFFFu), lq_scale_index(t, row, half, tiles), count,
                                          first);
                census<uint16_t, 0x7C00u>(uint16_t(words[w] >> 16), lq_scale_index(t, row + 1, half, tiles), count,
                                          first);
            }
        }
    }
    add_block_census(count, first, out);
}

template <class Bits>
void launch(const void* data, size_t n, NonFiniteCount* out, cudaStream_t stream) {
    constexpr size_t kVec = 16 / sizeof(Bits);
    const size_t items = reinterpret_cast<uintptr_t>(data) % 16 == 0 ? (n + kVec - 1) / kVec : n;
    const int blocks = int(std::clamp<size_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
    count_nonfinite_kernel<Bits><<<blocks, kThreads, 0, stream>>>(static_cast<const Bits*>(data), n, out);
}

// A non-blocking stream for the census, destroyed on every path out.
struct OwnStream {
    cudaStream_t s = nullptr;
    OwnStream() { LAMPO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~OwnStream() { cudaStreamDestroy(s); }
};

}  // namespace

std::vector<NonFiniteCount> count_nonfinite(const std::vector<TensorSlot>& slots) {
    std::vector<NonFiniteCount> host(slots.size(), NonFiniteCount{0, ULLONG_MAX});
    if (slots.empty()) return host;
    const size_t bytes = host.size() * sizeof(NonFiniteCount);
    DeviceMemory results(bytes, "non-finite weight counts");
    OwnStream stream;
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(results.get(), host.data(), bytes, cudaMemcpyHostToDevice, stream.s));
    for (size_t i = 0; i < slots.size(); ++i) {
        const TensorSlot& s = slots[i];
        NonFiniteCount* out = results.as<NonFiniteCount>() + i;
        if (s.bits) {
            const int tile_bytes = int(lq_packed_bytes(16, 64, s.bits));
            const bool half = s.interleaved_half >= 0;  // its rows are in every tile of the block
            const size_t n_tiles = s.bytes() / tile_bytes * (half ? 2 : 1);
            const int blocks = int(std::clamp<size_t>((n_tiles + kThreads - 1) / kThreads, 1, kMaxBlocks));
            count_nonfinite_lq_kernel<<<blocks, kThreads, 0, stream.s>>>(
                half ? s.block() : static_cast<const uint8_t*>(s.device), n_tiles, tile_bytes, s.interleaved_half,
                int(s.shape.back() / 64), out);
        } else if (s.dtype == DType::BF16) {
            launch<uint16_t>(s.device, s.numel(), out, stream.s);
        } else {
            launch<uint32_t>(s.device, s.numel(), out, stream.s);
        }
        LAMPO_CHECK_LAUNCH("count_nonfinite_kernel");
    }
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(host.data(), results.get(), bytes, cudaMemcpyDeviceToHost, stream.s));
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    return host;
}

}  // namespace lampo
