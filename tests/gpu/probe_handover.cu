// probe_handover.cu - what one dependency point costs on its own, without any weight stream: a
// standalone program (built and run by `tests/gpu/run.sh handover`; not part of lampo._native).
// It prints one JSON object: microseconds per hand-over, the best of several graph replays, for
//   pdl_chain   N kernels of G blocks captured in a graph with programmatic dependent launch, each
//               triggering, waiting, then reading in every block the word the kernel before wrote
//               (the decode step's kernel boundary);
//   plain_chain the same without the PDL attribute (a graph's ordinary dependency);
//   barrier     one resident grid of G blocks (cooperative launch) passing N phases, each phase a
//               grid-wide counter (every block: bar.sync, fence, atomic add; then polling with
//               acquire loads until all G arrived): the persistent kernel's form of the same point;
//   flag        one resident grid passing N hops of a single word: block p % G, once it sees hop
//               p - 1, publishes hop p (release store) and every block polls for it (acquire): the
//               cost of one producer's post as a mailbox would see it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One link of the chain: kernel i reads word i - 1 (written by the kernel before) in every block
// after its wait, and block 0 writes word i.
__global__ void link_kernel(unsigned* words, int i) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    __shared__ unsigned seen;
    if (threadIdx.x == 0) seen = i > 0 ? __ldcg(words + i - 1) : 0u;
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) words[i] = seen + 1u;
}

__global__ void barrier_kernel(unsigned* counters, int phases) {
    for (int p = 0; p < phases; ++p) {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(counters + p, 1u);
            while (ld_acquire(counters + p) < gridDim.x) {
            }
        }
    }
    __syncthreads();
}

__global__ void flag_kernel(unsigned* flags, int hops) {
    for (int p = 0; p < hops; ++p) {
        if (threadIdx.x == 0) {
            if (int(blockIdx.x) == p % int(gridDim.x)) {
                if (p > 0)
                    while (ld_acquire(flags + p - 1) == 0u) {
                    }
                st_release(flags + p, 1u);
            }
            while (ld_acquire(flags + p) == 0u) {
            }
        }
        __syncthreads();
    }
}

constexpr int THREADS = 256;
constexpr int REPLAYS = 20;

// The best of REPLAYS timings (ms) of what `launch` enqueues on `s`, each after `prepare`.
template <class Prepare, class Launch>
float best_ms(cudaStream_t s, Prepare&& prepare, Launch&& launch) {
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "event");
    check(cudaEventCreate(&b), "event");
    float best = 1e30f;
    for (int r = 0; r < REPLAYS; ++r) {
        prepare();
        check(cudaEventRecord(a, s), "record");
        launch();
        check(cudaEventRecord(b, s), "record");
        check(cudaEventSynchronize(b), "sync");
        float ms = 0.f;
        check(cudaEventElapsedTime(&ms, a, b), "elapsed");
        best = std::min(best, ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

// Best time per link of a graph of `n` link kernels of `grid` blocks, in microseconds.
double chain_us(cudaStream_t s, unsigned* words, int n, int grid, bool pdl) {
    cudaGraph_t g;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "capture");
    for (int i = 0; i < n; ++i) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = THREADS;
        cfg.stream = s;
        cfg.attrs = &attr;
        cfg.numAttrs = pdl ? 1 : 0;
        check(cudaLaunchKernelEx(&cfg, link_kernel, words, i), "link launch");
    }
    check(cudaStreamEndCapture(s, &g), "end capture");
    cudaGraphExec_t exec;
    check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
    const float best = best_ms(s, [] {}, [&] { check(cudaGraphLaunch(exec, s), "graph launch"); });
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return best * 1000.0 / n;
}

// Best time per phase of a cooperative launch of `kernel` over `n` phases, in microseconds.
double resident_us(cudaStream_t s, void (*kernel)(unsigned*, int), unsigned* words, int n, int grid) {
    void* args[] = {&words, &n};
    const float best = best_ms(
        s, [&] { check(cudaMemsetAsync(words, 0, size_t(n) * 4, s), "memset"); },
        [&] {
            check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), grid, THREADS, args, 0, s),
                  "coop launch");
        });
    return best * 1000.0 / n;
}

}  // namespace

int main() {
    constexpr int N = 512;
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    unsigned* words;
    check(cudaMalloc(&words, N * 4), "malloc");
    check(cudaMemset(words, 0, N * 4), "memset");
    const int grids[] = {1, sms, 4 * sms};
    std::printf("{\"sms\": %d, \"links\": %d, \"threads\": %d", sms, N, THREADS);
    for (const bool pdl : {true, false})
        for (const int g : grids)
            std::printf(", \"%s_chain_g%d_us\": %.3f", pdl ? "pdl" : "plain", g, chain_us(s, words, N, g, pdl));
    for (const int g : {sms, 4 * sms}) {
        std::printf(", \"barrier_g%d_us\": %.3f", g, resident_us(s, barrier_kernel, words, N, g));
        std::printf(", \"flag_g%d_us\": %.3f", g, resident_us(s, flag_kernel, words, N, g));
    }
    std::printf("}\n");
    check(cudaFree(words), "free");
    return 0;
}
