// embedding.cu - token embedding gather into the fp32 residual stream.
//   out_residual[t, :] = float(table[ids[t], :])     table [V, H] bf16, ids [T] int32 (device)
// One block per token, 16-byte loads (H % 8 == 0).
// embedding_gather_lq: the same from a table in the LQ format (V % 16 == 0, H % 64 == 0):
//   out_residual[t, c] = scale(row, c / 64) * (code(row, c) - 2^(bits-1)), row = ids[t]
// (lq_element.cuh), one block per token, a thread per column. Ids are trusted (the caller validates them
// against V when it tokenizes); no sqrt(H) scaling in this model family. It opens every forward
// pass, so it waits before it lets the pass's next kernel launch (pdl_begin_pass, common.cuh).
#include "kernels/bf16_vec.cuh"
#include "kernels/lq_element.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

__global__ void embedding_gather_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ ids,
                                        float* __restrict__ out, int H) {
    pdl_begin_pass();
    const int t = blockIdx.x;
    const uint4* row = reinterpret_cast<const uint4*>(table + size_t(ids[t]) * H);
    float4* dst = reinterpret_cast<float4*>(out + size_t(t) * H);
    for (int v = threadIdx.x; v < H / 8; v += blockDim.x) {
        float f[8];
        bf16x8_to_float(row[v], f);
        dst[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
        dst[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

template <int BITS>
__global__ void embedding_gather_lq_kernel(const uint8_t* __restrict__ table, const int32_t* __restrict__ ids,
                                           float* __restrict__ out, int H) {
    pdl_begin_pass();
    const int t = blockIdx.x, row = ids[t], tiles = H / LQ_TILE_COLS;
    const uint8_t* strip = table + size_t(row / LQ_TILE_ROWS) * tiles * lq_tile_bytes(BITS);
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        const uint8_t* tile = strip + size_t(c / LQ_TILE_COLS) * lq_tile_bytes(BITS);
        out[size_t(t) * H + c] = lq_element<BITS>(tile, row % LQ_TILE_ROWS, c % LQ_TILE_COLS);
    }
}

}  // namespace

void embedding_gather_lq(const uint8_t* table, int bits, const int32_t* d_ids, float* out_residual, int T, int H,
                         cudaStream_t stream) {
    require(H > 0 && H % LQ_TILE_COLS == 0, "embedding_gather_lq", "H must be a positive multiple of 64, got " + std::to_string(H));
    require(bits >= 4 && bits <= 6, "embedding_gather_lq", "bits must be 4, 5 or 6, got " + std::to_string(bits));
    if (T <= 0) return;
    auto kernel = bits == 4 ? embedding_gather_lq_kernel<4> : bits == 5 ? embedding_gather_lq_kernel<5>
                                                                        : embedding_gather_lq_kernel<6>;
    launch_pdl("embedding_gather_lq_kernel", kernel, T, 256, 0, stream, table, d_ids, out_residual, H);
}

void embedding_gather(const bf16* table, const int32_t* d_ids, float* out_residual, int T, int H,
                      cudaStream_t stream) {
    require(H > 0 && H % 8 == 0, "embedding_gather", "H must be a positive multiple of 8, got " + std::to_string(H));
    if (T <= 0) return;
    launch_pdl("embedding_gather_kernel", embedding_gather_kernel, T, 256, 0, stream, table, d_ids,
               out_residual, H);
}

}  // namespace lampo
