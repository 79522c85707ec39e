// probe_stream.cu - the timing half of tests/gpu/probe_stream.py, loaded through ctypes (built by
// `tests/gpu/run.sh stream` with nvcc for sm_90a). Not part of lampo._native.
//
// A persistent weight stream with dependency points, the core of a persistent decode step: one
// CTA per SM (cooperative launch, so all are resident), a producer thread issuing bulk copies
// (cp.async.bulk, global -> shared, completing on mbarriers) of fixed-size tiles into a ring of
// shared-memory stages, and consumer warps reading every tile from shared memory.
//
//   stream_init(bytes)        one allocation of `bytes` (the step's weights), filled with 0x01
//   stream_time(phase_bytes, phase_work_ns, producer_dep, consumer_dep, phases, tile_bytes, stages, repeats)
//       phase p streams phase_bytes[p] bytes (laid out one phase after the other from the base;
//       tile t of a phase goes to CTA t % gridDim.x). Its consumers wait until phase
//       consumer_dep[p] is finished on every CTA (a grid-wide counter; -1: no wait, e.g. a
//       dependency on a few heads only), spin phase_work_ns[p] ns (the latency-bound work of that
//       point: GDN step, top-k...), then consume their tiles. The producer issues phase p's tiles
//       as soon as ring stages are free and, if producer_dep[p] >= 0, phase producer_dep[p] is
//       finished on every CTA (the routed experts' ids); producer_dep[p] = p - 1 makes it wait like
//       a separate kernel without preloading. Counters are polled with acquire loads. Returns the
//       best of `repeats` runs in seconds, or a negative number (stream_error() says why).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_common.cuh"

using probe::failed;

namespace {

constexpr int CONSUMER_WARPS = 4;
constexpr int THREADS = 32 + CONSUMER_WARPS * 32;  // warp 0: producer
constexpr int MAX_PHASES = 1024;
constexpr int MAX_STAGES = 32;

char* g_base = nullptr;

struct Plan {
    const long long* offset;  // [phases] byte offset of each phase from the base
    const long long* bytes;   // [phases]
    const int* work_ns;       // [phases]
    const int* prod_dep;      // [phases]
    const int* cons_dep;      // [phases]
    int phases, tile_bytes, stages;
    unsigned* done;           // [phases] CTAs that finished the phase
    unsigned* sink;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
                     "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void wait_phase_done(const unsigned* done, int p) {
    unsigned v;
    do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(done + p) : "memory");
    while (v < gridDim.x);
}

__device__ __forceinline__ void spin_ns(int ns) {
    if (ns <= 0) return;
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < uint64_t(ns));
}

// Tiles of phase p that belong to this CTA: t = blockIdx.x, blockIdx.x + gridDim.x, ...
__device__ __forceinline__ long long tiles_of(const Plan& pl, int p) {
    const long long n = (pl.bytes[p] + pl.tile_bytes - 1) / pl.tile_bytes;
    return n > blockIdx.x ? (n - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
}

__global__ void __launch_bounds__(THREADS, 1) stream_kernel(const char* __restrict__ base, Plan pl) {
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < pl.stages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMER_WARPS * 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == 0) {  // producer: one thread walks every tile of this CTA in phase order
        if (threadIdx.x != 0) return;
        long long use = 0;
        for (int p = 0; p < pl.phases; ++p) {
            if (pl.prod_dep[p] >= 0) wait_phase_done(pl.done, pl.prod_dep[p]);
            const long long n = tiles_of(pl, p);
            for (long long i = 0; i < n; ++i, ++use) {
                const int s = int(use % pl.stages);
                if (use >= pl.stages) mbar_wait(&empty[s], uint32_t((use / pl.stages - 1) & 1));
                const long long off = (blockIdx.x + i * gridDim.x) * pl.tile_bytes;
                const uint32_t bytes = uint32_t(min((long long)pl.tile_bytes, pl.bytes[p] - off));
                bulk_load(ring + size_t(s) * pl.tile_bytes, base + pl.offset[p] + off, bytes, &full[s]);
            }
        }
        return;
    }

    // consumers: every thread reads its share of each tile (16-byte words) and keeps a checksum
    const int ct = threadIdx.x - 32;
    unsigned acc = 0;
    long long use = 0;
    for (int p = 0; p < pl.phases; ++p) {
        if (ct == 0) {
            if (pl.cons_dep[p] >= 0) wait_phase_done(pl.done, pl.cons_dep[p]);
            spin_ns(pl.work_ns[p]);
        }
        asm volatile("bar.sync 1, %0;" ::"n"(CONSUMER_WARPS * 32));
        const long long n = tiles_of(pl, p);
        for (long long i = 0; i < n; ++i, ++use) {
            const int s = int(use % pl.stages);
            mbar_wait(&full[s], uint32_t((use / pl.stages) & 1));
            const uint4* tile = reinterpret_cast<const uint4*>(ring + size_t(s) * pl.tile_bytes);
            for (int w = ct; w < pl.tile_bytes / 16; w += CONSUMER_WARPS * 32) {
                const uint4 v = tile[w];
                acc ^= v.x + v.y + v.z + v.w;
            }
            mbar_arrive(&empty[s]);
        }
        asm volatile("bar.sync 1, %0;" ::"n"(CONSUMER_WARPS * 32));
        if (ct == 0) {
            __threadfence();
            atomicAdd(pl.done + p, 1u);
        }
    }
    if (acc == 0x9e3779b9u) pl.sink[blockIdx.x] = acc;  // practically never stores
}

}  // namespace

extern "C" const char* stream_error() { return probe::g_error; }

extern "C" int stream_init(size_t bytes) { return probe::alloc_filled(&g_base, bytes); }

extern "C" double stream_time(const long long* phase_bytes, const int* phase_work_ns, const int* producer_dep,
                              const int* consumer_dep, int phases, int tile_bytes, int stages, int repeats) {
    if (phases < 1 || phases > MAX_PHASES || stages < 2 || stages > MAX_STAGES || tile_bytes % 16) {
        std::snprintf(probe::g_error, sizeof probe::g_error, "bad plan: %d phases, %d stages, tile %d bytes",
                      phases, stages, tile_bytes);
        return -1.0;
    }
    std::vector<long long> offset(phases);
    long long total = 0;
    for (int p = 0; p < phases; ++p) {
        offset[p] = total;
        total += (phase_bytes[p] + 255) / 256 * 256;
    }
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    long long *d_off = nullptr, *d_bytes = nullptr;
    int *d_work = nullptr, *d_pdep = nullptr, *d_cdep = nullptr;
    unsigned *d_done = nullptr, *d_sink = nullptr;
    const size_t smem = size_t(tile_bytes) * stages;
    if (failed(cudaMalloc(&d_off, phases * 8), "cudaMalloc") || failed(cudaMalloc(&d_bytes, phases * 8), "cudaMalloc")
        || failed(cudaMalloc(&d_work, phases * 4), "cudaMalloc") || failed(cudaMalloc(&d_pdep, phases * 4), "cudaMalloc")
        || failed(cudaMalloc(&d_cdep, phases * 4), "cudaMalloc") || failed(cudaMalloc(&d_done, phases * 4), "cudaMalloc")
        || failed(cudaMalloc(&d_sink, sms * 4), "cudaMalloc"))
        return -1.0;
    cudaMemcpy(d_off, offset.data(), phases * 8, cudaMemcpyHostToDevice);
    cudaMemcpy(d_bytes, phase_bytes, phases * 8, cudaMemcpyHostToDevice);
    cudaMemcpy(d_work, phase_work_ns, phases * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_pdep, producer_dep, phases * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_cdep, consumer_dep, phases * 4, cudaMemcpyHostToDevice);
    if (failed(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute"))
        return -1.0;
    Plan pl{d_off, d_bytes, d_work, d_pdep, d_cdep, phases, tile_bytes, stages, d_done, d_sink};
    const char* base = g_base;
    void* args[] = {&base, &pl};
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    double best = 1e30;
    for (int r = 0; r <= repeats; ++r) {  // run 0 warms up
        cudaMemset(d_done, 0, phases * 4);
        cudaEventRecord(t0);
        if (failed(cudaLaunchCooperativeKernel((void*)stream_kernel, dim3(sms), dim3(THREADS), args, smem, 0),
                   "cudaLaunchCooperativeKernel"))
            return -1.0;
        cudaEventRecord(t1);
        if (failed(cudaEventSynchronize(t1), "stream_kernel")) return -1.0;
        float ms = 0.f;
        cudaEventElapsedTime(&ms, t0, t1);
        if (r > 0 && ms * 1e-3 < best) best = ms * 1e-3;
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(d_off);
    cudaFree(d_bytes);
    cudaFree(d_work);
    cudaFree(d_pdep);
    cudaFree(d_cdep);
    cudaFree(d_done);
    cudaFree(d_sink);
    return best;
}
