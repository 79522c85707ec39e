// common.cuh - error checking (host) and small device helpers (CUDA only) shared by every
// kernel file; safe to include from plain C++ translation units.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "diagnostics/timeline.h"

namespace lampo {

// A CUDA failure, carrying the op that failed; surfaces in Python as CudaError (bindings/cuda_error.h).
struct CudaError : std::runtime_error {
    explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

inline void cuda_check(cudaError_t err, const char* op, const char* file, int line) {
    if (err != cudaSuccess) {
        throw CudaError(std::string(op) + ": " + cudaGetErrorString(err) + " (" + file + ":" +
                        std::to_string(line) + ")");
    }
}

}  // namespace lampo

#define LAMPO_CUDA_CHECK(expr) ::lampo::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: raises with the op name if the launch failed.
#define LAMPO_CHECK_LAUNCH(op) ::lampo::cuda_check(cudaGetLastError(), op, __FILE__, __LINE__)

#if defined(__CUDACC__)
#include "diagnostics/timeline_mark.cuh"

namespace lampo {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Programmatic dependent launch (PDL, sm_90+; no-ops elsewhere and in kernels launched without
// the attribute, see launch_pdl in launch_utils.cuh). Every kernel of the decode step begins with
// pdl_begin() (or a form below) BEFORE its first access to memory that an earlier kernel of its
// forward pass may write or read. It first lets the next kernel of the stream start launching, then
// waits until the previous kernel has completed and its writes are visible. Triggering first lets
// a chain of kernels be resident at once (as far as registers and shared memory allow), each
// loading its first weights while the kernels ahead of it run; every one still waits for its
// predecessor, which waited for its own, so completion stays in stream order. Hence the rule:
// before pdl_begin() a kernel reads only
// - immutable data (weights; the GEMV loads its first weight vectors into registers there), and
// - data that no kernel of the current forward pass writes before it: the position d_pos, the KV
//   cache rows below d_pos[0], the GDN recurrent and conv states (each written in a pass only by
//   the kernel that reads it). This holds because the first kernel of every pass
//   (embedding_gather) calls pdl_begin_pass(), which waits before it triggers, so no later kernel
//   of the pass starts before everything queued ahead of the pass has completed. Such reads go
//   through L2 (__ldcg, cp.async.cg): an L1 line filled in an earlier pass could be stale.
//
// Lets the next kernel of the stream launch once every block of this grid has called it (the
// block's first call counts) or exited.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the previous kernel has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The PDL entry of a kernel: trigger then wait (pdl_begin), wait then trigger (pdl_begin_pass), or
// wait alone (pdl_begin_untriggered: the kernel calls pdl_trigger() itself later).
enum class PdlEntry { TriggerFirst, WaitFirst, WaitOnly };
template <PdlEntry ENTRY>
__device__ __forceinline__ void pdl_enter() {
    timeline_mark(TL_ENTRY);
    if constexpr (ENTRY != PdlEntry::TriggerFirst) pdl_wait();
    if constexpr (ENTRY != PdlEntry::WaitOnly) pdl_trigger();
    if constexpr (ENTRY == PdlEntry::TriggerFirst) pdl_wait();
    timeline_mark(TL_RELEASED);
}

__device__ __forceinline__ void pdl_begin() { pdl_enter<PdlEntry::TriggerFirst>(); }

// pdl_begin for the first kernel of a forward pass: wait, then trigger (see the rule above).
__device__ __forceinline__ void pdl_begin_pass() { pdl_enter<PdlEntry::WaitFirst>(); }

// pdl_begin for a kernel whose successors should not become resident beside it while it streams
// (the LQ GEMV's ring form): wait only; the kernel triggers when its blocks are nearly done.
__device__ __forceinline__ void pdl_begin_untriggered() { pdl_enter<PdlEntry::WaitOnly>(); }

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

}  // namespace lampo
#endif  // __CUDACC__

namespace lampo {
inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }  // device blocks carved in 256-byte pieces
}  // namespace lampo
