// probe_ordering.cu - what one CTA-scope ordering costs a warp that streams weights, as the LQ
// decode GEMV's warps do: a standalone program (built and run by `tests/gpu/run.sh ordering`; not
// part of lampo._native). Every warp of one 16-warp block per SM streams its own contiguous slice
// of a 1 GiB buffer in groups of 2 KiB (four 16-byte loads per lane), the next group's loads in
// flight while the current one is consumed, as gemv_lq.cu's register groups are. After each group
// the warp does one of
//   none         nothing more (the stream alone);
//   smem_write   a 16-byte shared-memory store per lane and __syncwarp;
//   atomic       lane 0 adds to a shared counter (relaxed) and the warp reads the result by shuffle
//                (how a warp would take its next unit of work);
//   fence        the store, then __threadfence_block (MEMBAR.CTA);
//   arrive       the store, then every lane arrives on a block-wide mbarrier (release, no wait).
// The same loop without any global load (`no_loads`: registers stand in for the groups) gives each
// operation's own cost. It prints one JSON object: per kind the best of several runs in ms, the
// stream's GB/s, and the extra ns per group of one warp against `none` of the same loop ((ms -
// none ms) / groups per warp). If `fence` or `arrive` cost far more with loads than without, an
// ordering waits for the warp's loads in flight.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

enum Kind { NONE, SMEM_WRITE, ATOMIC, FENCE, ARRIVE, KINDS };
const char* const KIND_NAMES[KINDS] = {"none", "smem_write", "atomic", "fence", "arrive"};

constexpr int WARPS = 16;
constexpr int LOADS = 4;                    // 16-byte loads per lane per group
constexpr int GROUP_BYTES = 32 * 16 * LOADS;  // 2 KiB per warp

struct Group {
    uint4 v[LOADS];
};

template <bool STREAM>
__device__ __forceinline__ void load_group(Group& g, const uint4* src, int lane) {
    if constexpr (STREAM) {
#pragma unroll
        for (int i = 0; i < LOADS; ++i) {
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(g.v[i].x), "=r"(g.v[i].y), "=r"(g.v[i].z), "=r"(g.v[i].w)
                         : "l"(src + i * 32 + lane));
        }
    }
}

__device__ __forceinline__ uint32_t consume(const Group& g, uint32_t acc) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) acc = (acc ^ g.v[i].x ^ g.v[i].y) + (g.v[i].z ^ g.v[i].w);
    return acc;
}

__device__ __forceinline__ void mbarrier_arrive_u64(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(uint32_t(__cvta_generic_to_shared(bar)))
                 : "memory");
}

// After the group: the kind's operation. slot: this lane's 16 bytes of shared memory.
template <int KIND>
__device__ __forceinline__ uint32_t order(uint32_t acc, uint4* slot, unsigned* counter, uint64_t* bar, int lane) {
    if constexpr (KIND == SMEM_WRITE || KIND == FENCE || KIND == ARRIVE) {
        *slot = make_uint4(acc, acc + 1, acc + 2, acc + 3);
        __syncwarp();
    }
    if constexpr (KIND == ATOMIC) {
        unsigned taken = 0;
        if (lane == 0) taken = atomicAdd(counter, 1u);
        acc += __shfl_sync(0xffffffffu, taken, 0) & 1u;
    }
    if constexpr (KIND == FENCE) __threadfence_block();
    if constexpr (KIND == ARRIVE) mbarrier_arrive_u64(bar);
    return acc;
}

template <int KIND, bool STREAM>
__global__ void __launch_bounds__(WARPS * 32, 1) stream_kernel(const uint4* buf, int groups, uint32_t* sink) {
    __shared__ uint4 slots[WARPS * 32];
    __shared__ unsigned counter;
    __shared__ uint64_t bar;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        counter = 0u;
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(uint32_t(__cvta_generic_to_shared(&bar))),
                     "r"(WARPS * 32));
    }
    __syncthreads();
    const uint4* src = buf + (size_t(blockIdx.x) * WARPS + warp) * size_t(groups) * (GROUP_BYTES / 16);
    Group a, b;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) a.v[i] = b.v[i] = make_uint4(lane, i, warp, blockIdx.x);  // no_loads
    uint32_t acc = 0;
    load_group<STREAM>(a, src, lane);
    for (int i = 0; i < groups; i += 2) {  // groups is even
        load_group<STREAM>(b, src + (i + 1) * (GROUP_BYTES / 16), lane);
        acc = order<KIND>(consume(a, acc), slots + threadIdx.x, &counter, &bar, lane);
        if (i + 2 < groups) load_group<STREAM>(a, src + (i + 2) * (GROUP_BYTES / 16), lane);
        acc = order<KIND>(consume(b, acc), slots + threadIdx.x, &counter, &bar, lane);
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads alive
}

template <int KIND, bool STREAM>
float best_ms(const uint4* buf, int blocks, int groups, uint32_t* sink) {
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    float best = 1e30f;
    for (int r = 0; r < 12; ++r) {
        check(cudaEventRecord(e0), "record");
        stream_kernel<KIND, STREAM><<<blocks, WARPS * 32>>>(buf, groups, sink);
        check(cudaGetLastError(), "launch");
        check(cudaEventRecord(e1), "record");
        check(cudaEventSynchronize(e1), "sync");
        float ms = 0.f;
        check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
        if (r > 1) best = std::min(best, ms);  // two warm-up runs
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

}  // namespace

int main() {
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
    const size_t want = size_t(1) << 30;
    const int groups = int(want / (size_t(sms) * WARPS * GROUP_BYTES)) & ~1;
    const size_t bytes = size_t(sms) * WARPS * groups * GROUP_BYTES;
    uint4* buf;
    uint32_t* sink;
    check(cudaMalloc(&buf, bytes), "malloc");
    check(cudaMemset(buf, 1, bytes), "memset");
    check(cudaMalloc(&sink, 4), "malloc");
    const float streamed[KINDS] = {
        best_ms<NONE, true>(buf, sms, groups, sink),   best_ms<SMEM_WRITE, true>(buf, sms, groups, sink),
        best_ms<ATOMIC, true>(buf, sms, groups, sink), best_ms<FENCE, true>(buf, sms, groups, sink),
        best_ms<ARRIVE, true>(buf, sms, groups, sink)};
    const float alone[KINDS] = {
        best_ms<NONE, false>(buf, sms, groups, sink),   best_ms<SMEM_WRITE, false>(buf, sms, groups, sink),
        best_ms<ATOMIC, false>(buf, sms, groups, sink), best_ms<FENCE, false>(buf, sms, groups, sink),
        best_ms<ARRIVE, false>(buf, sms, groups, sink)};
    std::printf("{\"sms\": %d, \"warps_per_sm\": %d, \"bytes\": %zu, \"groups_per_warp\": %d, \"group_bytes\": %d",
                sms, WARPS, bytes, groups, GROUP_BYTES);
    for (const bool stream : {true, false}) {
        const float* ms = stream ? streamed : alone;
        std::printf(", \"%s\": {", stream ? "streaming" : "no_loads");
        for (int k = 0; k < KINDS; ++k)
            std::printf("%s\"%s\": {\"ms\": %.4f, \"GBps\": %.1f, \"extra_ns_per_group\": %.1f}", k ? ", " : "",
                        KIND_NAMES[k], ms[k], stream ? bytes / (ms[k] * 1e6) : 0.0, (ms[k] - ms[NONE]) * 1e6 / groups);
        std::printf("}");
    }
    std::printf("}\n");
    check(cudaFree(buf), "free");
    check(cudaFree(sink), "free");
    return 0;
}
