// probe_expert_reads.cu - the timing half of tests/gpu/probe_expert_reads.py, loaded through ctypes
// (built by `tests/gpu/run.sh probe` with nvcc; the machine has no CuPy). Not part of lampo._native.
//
//   probe_init(bytes)            one allocation of `bytes` (every pattern's banks), filled with 0x01
//   probe_time(starts, launches, blocks, runs_per_block, run_vecs, repeats)
//       starts: int64 [launches, blocks, runs_per_block], run starts in 16-byte vectors from the
//       allocation's base; captures `launches` read_runs kernels (256 threads, one per "layer and
//       token") as one CUDA graph, replays it once to warm up, then `repeats` times; returns the best
//       replay's seconds, or a negative number (probe_error() says why).
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "probe_common.cuh"

using probe::failed;

namespace {

uint4* g_base = nullptr;

// Block b reads runs b * runs_per_block .. + runs_per_block - 1, each run_vecs 16-byte vectors from
// base + run_start[run]; item i of the block is (run i / run_vecs, vector i % run_vecs), nine loads
// in flight per thread (the expert kernels' depth). Only loads: the xor keeps them alive.
__global__ void read_runs(const uint4* __restrict__ base, const long long* __restrict__ run_start, int runs_per_block,
                          int run_vecs, unsigned* __restrict__ sink) {
    constexpr int IN_FLIGHT = 9;
    const int items = runs_per_block * run_vecs;
    const long long* starts = run_start + (long long)blockIdx.x * runs_per_block;
    unsigned acc = 0;
    for (int i0 = threadIdx.x; i0 < items; i0 += IN_FLIGHT * blockDim.x) {
        uint4 v[IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < IN_FLIGHT; ++u) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < items ? __ldg(base + starts[i / run_vecs] + i % run_vecs) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < IN_FLIGHT; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // practically never stores
}

}  // namespace

extern "C" const char* probe_error() { return probe::g_error; }

extern "C" int probe_init(size_t bytes) { return probe::alloc_filled(&g_base, bytes); }

extern "C" double probe_time(const long long* starts, int launches, int blocks, int runs_per_block, int run_vecs,
                             int repeats) {
    const size_t per_launch = size_t(blocks) * runs_per_block;
    long long* d_starts = nullptr;
    unsigned* sink = nullptr;
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t t0 = nullptr, t1 = nullptr;
    double best = -1.0;
    if (failed(cudaMalloc(&d_starts, per_launch * launches * sizeof(long long)), "cudaMalloc starts") ||
        failed(cudaMemcpy(d_starts, starts, per_launch * launches * sizeof(long long), cudaMemcpyHostToDevice),
               "copy starts") ||
        failed(cudaMalloc(&sink, blocks * sizeof(unsigned)), "cudaMalloc sink") ||
        failed(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
        failed(cudaEventCreate(&t0), "event") || failed(cudaEventCreate(&t1), "event") ||
        failed(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture"))
        goto done;
    for (int l = 0; l < launches; ++l)
        read_runs<<<blocks, 256, 0, stream>>>(g_base, d_starts + per_launch * l, runs_per_block, run_vecs, sink);
    if (failed(cudaStreamEndCapture(stream, &graph), "end capture") ||
        failed(cudaGraphInstantiate(&exec, graph, 0), "instantiate") ||
        failed(cudaGraphLaunch(exec, stream), "warm-up launch") || failed(cudaStreamSynchronize(stream), "warm-up"))
        goto done;
    for (int r = 0; r < repeats; ++r) {
        float ms = 0.f;
        if (failed(cudaEventRecord(t0, stream), "record") || failed(cudaGraphLaunch(exec, stream), "launch") ||
            failed(cudaEventRecord(t1, stream), "record") || failed(cudaEventSynchronize(t1), "replay") ||
            failed(cudaEventElapsedTime(&ms, t0, t1), "elapsed")) {
            best = -1.0;
            goto done;
        }
        if (best < 0 || ms / 1e3 < best) best = ms / 1e3;
    }
done:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(sink);
    cudaFree(d_starts);
    return best;
}
