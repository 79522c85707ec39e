// kv_cache_int8.cu - quantize-on-append into the INT8 KV cache (contract in ops.h, kv_append_int8).
//   cache [nkv, max_ctx, D] int8, scales [nkv, max_ctx, D/64] fp16; row of token t at d_pos[0] + t.
//   Per group of 64 values: scale = fp16(max|x| / 127); q = clip(rint(x / float(scale)), -127, 127),
//   q = 0 when the scale is 0 - bit-exact with kv_int8.quantize_int8_g64 of the reference (IEEE
//   division and round-half-even, not the fast-math approximations).
// One warp per (token, kv head, K or V); lane l quantizes dims [8l, 8l+8), 8 lanes per group
// (D % 64 == 0, D <= 256). Rows at positions >= max_ctx are not written (the caller keeps the
// context inside the cache; the engine checks it on the host before every step).
#include "bf16_vec.cuh"
#include "launch_utils.cuh"
#include "ops.h"

namespace lampo {
namespace {

constexpr int APPEND_WARPS = 8;

__global__ void __launch_bounds__(APPEND_WARPS * 32)
kv_append_int8_kernel(const bf16* __restrict__ k, const bf16* __restrict__ v, int8_t* __restrict__ k_cache,
                      int8_t* __restrict__ v_cache, half* __restrict__ k_scale, half* __restrict__ v_scale,
                      const int32_t* __restrict__ d_pos, int T, int nkv, int D, int max_ctx) {
    pdl_begin();
    const int item = blockIdx.x * APPEND_WARPS + (threadIdx.x >> 5);  // ((t * nkv) + h) * 2 + is_v
    const int lane = threadIdx.x & 31;
    if (item >= T * nkv * 2) return;
    const bool is_v = item & 1;
    const int h = (item >> 1) % nkv;
    const int t = (item >> 1) / nkv;
    const int pos = d_pos[0] + t;
    if (pos < 0 || pos >= max_ctx) return;
    const bool active = lane < D / 8;

    float x[8] = {};
    if (active) bf16x8_to_float(reinterpret_cast<const uint4*>((is_v ? v : k) + (size_t(t) * nkv + h) * D)[lane], x);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const half scale = __float2half_rn(__fdiv_rn(amax, 127.0f));
    const float s = __half2float(scale);
    if (!active) return;

    uint32_t packed[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float q = s > 0.0f ? fminf(fmaxf(rintf(__fdiv_rn(x[i], s)), -127.0f), 127.0f) : 0.0f;
        packed[i / 4] |= uint32_t(uint8_t(int8_t(q))) << (8 * (i % 4));
    }
    const size_t row = size_t(h) * max_ctx + pos;
    int8_t* cache = is_v ? v_cache : k_cache;
    reinterpret_cast<uint2*>(cache + row * D)[lane] = make_uint2(packed[0], packed[1]);
    if ((lane & 7) == 0) (is_v ? v_scale : k_scale)[row * (D / KV_GROUP) + lane / 8] = scale;
}

}  // namespace

void kv_append_int8(const bf16* k, const bf16* v, int8_t* k_cache, int8_t* v_cache, half* k_scale, half* v_scale,
                    const int32_t* d_pos, int T, int nkv, int D, int max_ctx, cudaStream_t stream) {
    require(D > 0 && D % KV_GROUP == 0 && D <= 256, "kv_append_int8",
            "head dim must be a multiple of 64 up to 256, got " + std::to_string(D));
    require(nkv > 0 && max_ctx > 0, "kv_append_int8", "need nkv > 0 and max_ctx > 0");
    if (T <= 0) return;
    const int items = T * nkv * 2;
    launch_pdl("kv_append_int8_kernel", kv_append_int8_kernel, ceil_div(items, APPEND_WARPS),
               APPEND_WARPS * 32, 0, stream, k, v, k_cache, v_cache, k_scale, v_scale, d_pos, T, nkv,
               D, max_ctx);
}

}  // namespace lampo
