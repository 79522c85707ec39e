// sampling.cu - on-GPU token sampling and row-wise argmax (contract in ops.h, sample_token and
// argmax_rows). Exact and sort-free. Every candidate is ranked by float_key(logit - penalty if
// seen) (padding ids -> key 0, below every real value); the largest key wins, ties -> lower id.
// Greedy (temperature <= 0), one launch:
//  sample_greedy_kernel (ceil(v_real / 4096) blocks, at most 4 per SM, x 256 threads): each
//     thread scans its float4 quads (4 loads in flight) in ascending id order keeping the first
//     largest key; a block takes (max key, min id among that key) by warp reductions, and its
//     thread 0 atomicMax-es (key << 32 | ~id) into scratch `best`. The last block to finish
//     (grid_exit_ticket) reads and zeroes `best` and writes the result (every key 0, i.e. every
//     id masked: id 0, seen untouched). The ticket and `best` are 0 between calls: the scratch
//     must be zeroed once before the first call (the engine zeroes its workspace at creation).
// Otherwise, two launches:
//  1. sample_select_kernel (16 blocks x 1024 threads): block b copies its slice of the keys into
//     shared memory, finds its K-th largest key by a 4-pass 8-bit radix select (shared-memory
//     histograms) and writes its top-K (ties at the cut -> lower ids) in id order. K = top_k, or
//     SAMPLE_MAX_K (1024) when top_k == 0: the documented cap - with top-k off the draw only
//     considers the 1024 most likely tokens.
//  2. sample_finish_kernel (1 block): the same select over the <= 16 K candidates gives the exact
//     global top-K in id order; then p = exp((l - l_max) / temperature) in fp32, top-p keeps a
//     token when the mass of the tokens ranked above it is < top_p * sum (an O(K^2) rank count,
//     ties -> lower id first), min-p keeps p >= min_p * p_max, and the draw u (splitmix64 of
//     (seed, d_step[0])) walks the CDF of the kept tokens in ascending id order.
// Both write d_out[0], seen[id] = 1, d_step[0] += 1. Graph-capturable (no host reads).
// sample_draft / sample_verify_row (ops.h) are the same two launches with the finish kernel in
// another mode: Draft writes the kept candidates' probabilities out as q (and marks nothing);
// Verify keeps the row's draft d when u * q(d) < p(d) (u the row's draw), else walks the CDF of
// max(0, p - q) with a second number from the same draw (p where that is all zero).
// argmax_rows: one block per row, the greedy scan and block reduction without the penalty.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/sampling/exit_ticket.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/ops.h"
#include "kernels/order_key.cuh"

namespace lampo {
namespace {

constexpr int SAMPLE_BLOCKS = 16;
constexpr int SAMPLE_THREADS = 1024;
constexpr int SAMPLE_CANDIDATES = SAMPLE_BLOCKS * SAMPLE_MAX_K;
static_assert(SAMPLE_MAX_K <= SAMPLE_THREADS, "one selected candidate per thread");

constexpr int SCAN_QUADS = 4;  // float4 loads in flight per thread of scan_row
constexpr int GREEDY_THREADS = 256;
constexpr int GREEDY_BLOCKS_PER_SM = 4;

struct Scratch {
    uint32_t* key;             // [SAMPLE_BLOCKS][SAMPLE_MAX_K] select -> finish candidates
    int32_t* id;               // [SAMPLE_BLOCKS][SAMPLE_MAX_K]
    int32_t* count;            // [SAMPLE_BLOCKS]
    unsigned long long* best;  // greedy: max of (key << 32 | ~id) over the finished blocks; 0 between calls
    unsigned* ticket;          // greedy: grid_exit_ticket's word; 0 between calls
};
constexpr size_t CANDIDATE_BYTES = size_t(SAMPLE_CANDIDATES) * 8 + SAMPLE_BLOCKS * 4;
static_assert(CANDIDATE_BYTES % 8 == 0, "best is 8-byte aligned");

Scratch scratch_layout(void* base) {
    uint8_t* p = static_cast<uint8_t*>(base);
    return {reinterpret_cast<uint32_t*>(p), reinterpret_cast<int32_t*>(p + SAMPLE_CANDIDATES * 4),
            reinterpret_cast<int32_t*>(p + SAMPLE_CANDIDATES * 8),
            reinterpret_cast<unsigned long long*>(p + CANDIDATE_BYTES),
            reinterpret_cast<unsigned*>(p + CANDIDATE_BYTES + 8)};
}

// A candidate's rank key (order_key.cuh) with zeros and denormals all taken as +0: -0 ties +0 as
// in the reference, and a raw logit ranks as the same value after the penalty subtraction, which
// flushes denormals (--use_fast_math: FTZ).
__device__ __forceinline__ uint32_t float_key(float f) {
    return order_key((__float_as_uint(f) & 0x7f800000u) == 0u ? 0.0f : f);
}

// Candidate id's rank key: float_key(logit - (seen[id] ? penalty : 0)); `seen` is read only when
// penalty != 0 (argmax_rows passes none).
__device__ __forceinline__ uint32_t penalised_key(float logit, int id, const uint8_t* seen, float penalty) {
    if (penalty != 0.0f && seen[id]) logit -= penalty;
    return float_key(logit);
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Block-wide exclusive scan (any blockDim multiple of 32); `total` gets the sum.
template <class T>
__device__ T block_exclusive_scan(T v, T& total) {
    __shared__ T warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    T incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? warp_sums[lane] : T(0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const T n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        warp_sums[lane] = w;
    }
    __syncthreads();
    const T before = (warp > 0 ? warp_sums[warp - 1] : T(0)) + incl - v;
    total = warp_sums[nwarps - 1];
    __syncthreads();
    return before;
}

struct Threshold {
    uint32_t tau;  // the k-th largest key
    int take_eq;   // how many keys equal to tau are taken (the lowest indices)
};

// k-th largest of keys[0..n) (1 <= k <= n) by 4 passes of an 8-bit radix histogram.
__device__ Threshold block_kth_largest(const uint32_t* keys, int n, int k) {
    __shared__ int hist[256];
    __shared__ int found[2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t prefix = 0;
    int remaining = k;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        const uint32_t high = pass == 0 ? 0u : (0xffffffffu << (shift + 8));
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t key = keys[i];
            if ((key & high) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (warp == 0) {
            int c[8], tot = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) { c[j] = hist[lane * 8 + j]; tot += c[j]; }
            int at_or_above = tot;  // keys in bins of this lane and all higher lanes
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_down_sync(0xffffffffu, at_or_above, o);
                if (lane + o < 32) at_or_above += v;
            }
            int above = at_or_above - tot;
#pragma unroll
            for (int j = 7; j >= 0; --j) {
                if (above < remaining && remaining <= above + c[j]) {
                    found[0] = lane * 8 + j;
                    found[1] = remaining - above;
                }
                above += c[j];
            }
        }
        __syncthreads();
        prefix |= uint32_t(found[0]) << shift;
        remaining = found[1];
        __syncthreads();
    }
    return {prefix, remaining};
}

// Calls emit(i, rank) for every selected index i (key > tau, or == tau among the first take_eq)
// with rank = its position among the selected in index order. Threads own contiguous index ranges.
template <class Emit>
__device__ void block_compact(const uint32_t* keys, int n, Threshold th, Emit emit) {
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int beg = min(n, int(threadIdx.x) * per), end = min(n, beg + per);
    uint32_t gt = 0, eq = 0;
    for (int i = beg; i < end; ++i) {
        gt += keys[i] > th.tau;
        eq += keys[i] == th.tau;
    }
    unsigned long long total;
    const unsigned long long before = block_exclusive_scan<unsigned long long>((uint64_t(gt) << 32) | eq, total);
    int eq_seen = int(before & 0xffffffffu);
    int rank = int(before >> 32) + min(eq_seen, th.take_eq);
    for (int i = beg; i < end; ++i) {
        const uint32_t key = keys[i];
        if (key > th.tau) {
            emit(i, rank++);
        } else if (key == th.tau) {
            if (eq_seen < th.take_eq) emit(i, rank++);
            ++eq_seen;
        }
    }
}

// The block's largest key and lowest id among its holders, valid in thread 0 (blockDim a
// multiple of 32).
__device__ ArgMax block_argmax(ArgMax a) {
    __shared__ uint32_t warp_key[32];
    __shared__ int warp_id[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    a = warp_argmax(a);
    if (lane == 0) { warp_key[warp] = a.key; warp_id[warp] = a.id; }
    __syncthreads();
    if (warp == 0) {
        const bool live = lane < int(blockDim.x >> 5);
        a = warp_argmax({live ? warp_key[lane] : 0u, live ? warp_id[lane] : INT_MAX});
    }
    return a;
}

// One thread's argmax over ids [0, v_real) of `row` (16-byte aligned), ranked by penalised_key: the
// quads q = first, first + stride, ... < v_real / 4, SCAN_QUADS float4 loads in flight at a time,
// then, in the thread with first == 0, the last v_real % 4 ids. Every thread offers ascending ids.
__device__ __forceinline__ ArgMax scan_row(const float* __restrict__ row, int v_real, int first, int stride,
                                           const uint8_t* seen, float penalty) {
    ArgMax best{0u, 0};
    auto offer = [&](float l, int id) { best.offer(penalised_key(l, id, seen, penalty), id); };
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int n4 = v_real / 4;
    for (int q0 = first; q0 < n4; q0 += SCAN_QUADS * stride) {
        float4 f[SCAN_QUADS];
#pragma unroll
        for (int u = 0; u < SCAN_QUADS; ++u)
            if (q0 + u * stride < n4) f[u] = row4[q0 + u * stride];
#pragma unroll
        for (int u = 0; u < SCAN_QUADS; ++u) {
            const int q = q0 + u * stride;
            if (q < n4) {
                offer(f[u].x, 4 * q);
                offer(f[u].y, 4 * q + 1);
                offer(f[u].z, 4 * q + 2);
                offer(f[u].w, 4 * q + 3);
            }
        }
    }
    if (first == 0)
        for (int id = 4 * n4; id < v_real; ++id) offer(row[id], id);
    return best;
}

__global__ void __launch_bounds__(GREEDY_THREADS)
sample_greedy_kernel(const float* __restrict__ logits, int v_real, float penalty, uint8_t* seen, Scratch s,
                     int32_t* __restrict__ d_step, int32_t* __restrict__ d_out) {
    pdl_begin();
    const ArgMax a = block_argmax(scan_row(logits, v_real, blockIdx.x * blockDim.x + threadIdx.x,
                                           gridDim.x * blockDim.x, seen, penalty));
    if (threadIdx.x == 0) atomicMax(s.best, (static_cast<unsigned long long>(a.key) << 32) | uint32_t(~a.id));
    if (!grid_exit_ticket(s.ticket) || threadIdx.x != 0) return;
    const unsigned long long all = atomicExch(s.best, 0ull);  // every block's max; 0 for the next call
    const uint32_t key = uint32_t(all >> 32);
    const int id = key != 0u ? int(~uint32_t(all)) : 0;
    d_out[0] = id;
    if (key != 0u) seen[id] = 1;
    d_step[0] += 1;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_select_kernel(const float* __restrict__ logits, int V, int v_real, const uint8_t* __restrict__ seen,
                     float penalty, int k, Scratch out) {
    pdl_begin();
    extern __shared__ uint32_t keys[];
    __shared__ int valid_count;
    const int slice = (V + gridDim.x - 1) / gridDim.x;
    const int beg = blockIdx.x * slice;
    const int n = max(0, min(slice, V - beg));
    if (threadIdx.x == 0) valid_count = 0;
    __syncthreads();
    int valid = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int id = beg + i;
        uint32_t key = 0;
        if (id < v_real) {
            key = penalised_key(logits[id], id, seen, penalty);
            valid += key != 0;
        }
        keys[i] = key;
    }
    atomicAdd(&valid_count, valid);
    __syncthreads();
    const int kk = min(k, valid_count);
    if (kk == 0) {
        if (threadIdx.x == 0) out.count[blockIdx.x] = 0;
        return;
    }
    const Threshold th = block_kth_largest(keys, n, kk);
    uint32_t* ckey = out.key + blockIdx.x * SAMPLE_MAX_K;
    int32_t* cid = out.id + blockIdx.x * SAMPLE_MAX_K;
    block_compact(keys, n, th, [&](int i, int rank) {
        ckey[rank] = keys[i];
        cid[rank] = beg + i;
    });
    if (threadIdx.x == 0) out.count[blockIdx.x] = kk;
}

struct FinishConfig {
    int k;
    float temperature, top_p, min_p;
    uint64_t seed;
};

// Plain: draw from p (the filtered distribution). Draft: the same draw, with p written out as the
// draft's distribution q and the presence set left alone. Verify: the row's draft (drawn from q)
// kept with probability min(1, p(d) / q(d)), else a draw from max(0, p - q).
enum class Finish { Plain, Draft, Verify };

// q(id) of a draft distribution (ids ascending), 0 where id is not in it; read through L2 (an
// earlier launch wrote it).
__device__ float draft_prob(const DraftDistribution& q, int id) {
    const int n = __ldcg(q.count);
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__ldcg(q.ids + mid) < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && __ldcg(q.ids + lo) == id ? __ldcg(q.probs + lo) : 0.0f;
}

// The index (among threads [0, kk) with weight > 0) whose cumulative weight, in thread order,
// first passes u * (sum of weights); rounding past the end takes the last one with weight.
__device__ int block_draw(float weight, float u) {
    __shared__ int first, last;
    if (threadIdx.x == 0) {
        first = INT_MAX;
        last = 0;
    }
    float total;
    const float before = block_exclusive_scan(weight, total);  // its barrier orders the reset
    if (weight > 0.0f && before + weight > u * total) atomicMin(&first, int(threadIdx.x));
    if (weight > 0.0f) atomicMax(&last, int(threadIdx.x));
    __syncthreads();
    const int chosen = first != INT_MAX ? first : last;
    __syncthreads();  // read before a later call resets them
    return chosen;
}

__device__ __forceinline__ float unit_float(uint64_t bits) { return float(bits >> 40) * (1.0f / 16777216.0f); }

// q: Draft writes it, Verify reads it (with the row's draft at draft[0]); Plain neither.
template <Finish MODE>
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_finish_kernel(const Scratch cand, FinishConfig cfg, uint8_t* __restrict__ seen, int32_t* __restrict__ d_step,
                     int32_t* __restrict__ d_out, DraftDistribution q, const int32_t* __restrict__ draft) {
    pdl_begin();
    extern __shared__ uint32_t keys[];  // all candidates, in id order
    __shared__ int offset[SAMPLE_BLOCKS + 1];
    __shared__ float sel_val[SAMPLE_MAX_K], sel_p[SAMPLE_MAX_K];
    __shared__ int sel_id[SAMPLE_MAX_K];
    __shared__ float red[32];
    __shared__ float p_draft;
    __shared__ int draft_at;
    const int tid = threadIdx.x;
    if (tid == 0) {
        offset[0] = 0;
        for (int b = 0; b < SAMPLE_BLOCKS; ++b) offset[b + 1] = offset[b] + cand.count[b];
        p_draft = 0.0f;
        draft_at = -1;
    }
    __syncthreads();
    const int n = offset[SAMPLE_BLOCKS];
    for (int b = 0; b < SAMPLE_BLOCKS; ++b)
        for (int j = tid; j < offset[b + 1] - offset[b]; j += blockDim.x)
            keys[offset[b] + j] = cand.key[b * SAMPLE_MAX_K + j];
    __syncthreads();
    if (n == 0) {  // every id masked: nothing to draw
        if (tid == 0) {
            d_out[0] = 0;
            d_step[0] += 1;
            if constexpr (MODE == Finish::Draft) *q.count = 0;
        }
        return;
    }
    const int kk = min(cfg.k, n);
    const Threshold th = block_kth_largest(keys, n, kk);
    block_compact(keys, n, th, [&](int i, int rank) {
        int b = 0;
        while (offset[b + 1] <= i) ++b;
        sel_id[rank] = cand.id[b * SAMPLE_MAX_K + (i - offset[b])];
        sel_val[rank] = key_value(keys[i]);
    });
    __syncthreads();

    int chosen = 0;
    if (kk > 1) {
        const bool mine = tid < kk;
        // max logit among the candidates
        float v = mine ? sel_val[tid] : -INFINITY;
        v = warp_max(v);
        if ((tid & 31) == 0) red[tid >> 5] = v;
        __syncthreads();
        float vmax = -INFINITY;
        for (int w = 0; w < int(blockDim.x >> 5); ++w) vmax = fmaxf(vmax, red[w]);
        const float p = mine ? __expf((sel_val[tid] - vmax) / cfg.temperature) : 0.0f;
        if (mine) sel_p[tid] = p;
        float total;
        block_exclusive_scan(p, total);  // also a barrier: sel_p complete
        bool keep = mine;
        if (mine && cfg.top_p < 1.0f) {
            float above = 0.0f;
            for (int j = 0; j < kk; ++j) {
                const bool higher = sel_val[j] > sel_val[tid] || (sel_val[j] == sel_val[tid] && sel_id[j] < sel_id[tid]);
                above += higher ? sel_p[j] : 0.0f;
            }
            keep = above < cfg.top_p * total;
        }
        if (mine && cfg.min_p > 0.0f) keep = keep && p >= cfg.min_p;  // p_max is exp(0) = 1
        const float w = keep ? p : 0.0f;
        const uint64_t bits = splitmix64(cfg.seed ^ splitmix64(uint64_t(uint32_t(d_step[0]))));
        if constexpr (MODE == Finish::Plain) {
            chosen = block_draw(w, unit_float(bits));
        } else {
            int kept_n;
            const int at = block_exclusive_scan(int(keep), kept_n);  // this kept candidate's place in q
            float kept_total;
            block_exclusive_scan(w, kept_total);
            const float prob = w / kept_total;  // p(x) of this thread's candidate
            if constexpr (MODE == Finish::Draft) {
                if (keep) {
                    q.ids[at] = sel_id[tid];
                    q.probs[at] = prob;
                }
                if (tid == 0) *q.count = kept_n;
                chosen = block_draw(w, unit_float(bits));
            } else {
                const int d = draft[0];
                if (keep && sel_id[tid] == d) {
                    p_draft = prob;
                    draft_at = tid;
                }
                __syncthreads();
                const float q_draft = draft_prob(q, d);
                if (draft_at >= 0 && unit_float(bits) * q_draft < p_draft) {
                    chosen = draft_at;  // kept with probability min(1, p(d) / q(d))
                } else {  // else drawn from max(0, p - q), renormalised; p itself where that is empty
                    const float r = keep ? fmaxf(0.0f, prob - draft_prob(q, sel_id[tid])) : 0.0f;
                    float residual;
                    block_exclusive_scan(r, residual);
                    chosen = block_draw(residual > 0.0f ? r : w, unit_float(splitmix64(bits)));
                }
            }
        }
    }
    if (tid == 0) {
        const int id = sel_id[chosen];
        d_out[0] = id;
        d_step[0] += 1;
        if constexpr (MODE == Finish::Draft) {
            if (kk <= 1) {  // one candidate: q is that token
                q.ids[0] = id;
                q.probs[0] = 1.0f;
                *q.count = 1;
            }
        } else {
            seen[id] = 1;
        }
    }
}

__global__ void __launch_bounds__(1024)
argmax_rows_kernel(const float* __restrict__ logits, int V, int v_real, int32_t* __restrict__ d_out) {
    pdl_begin();
    const ArgMax a = block_argmax(scan_row(logits + size_t(blockIdx.x) * V, v_real, threadIdx.x, blockDim.x,
                                           nullptr, 0.0f));
    if (threadIdx.x == 0) d_out[blockIdx.x] = a.id;
}

size_t select_smem_bytes(int V) { return size_t(ceil_div(V, SAMPLE_BLOCKS)) * 4; }
constexpr size_t FINISH_SMEM = size_t(SAMPLE_CANDIDATES) * 4;

}  // namespace

size_t sampling_scratch_bytes(int V) {
    (void)V;  // the candidate buffers do not grow with the vocabulary
    return CANDIDATE_BYTES + 16;  // + best (8 bytes), ticket (4, padded)
}

namespace {

void check_sampling(const char* op, int V, int v_real, const SamplingConfig& cfg) {
    require(V > 0 && v_real > 0 && v_real <= V, op, "need 0 < v_real <= V");
    require(cfg.top_k >= 0 && cfg.top_k <= SAMPLE_MAX_K, op,
            "top_k must be 0 (off) or at most " + std::to_string(SAMPLE_MAX_K) + ", got " + std::to_string(cfg.top_k));
}

// The two launches of a sampled (temperature > 0) draw in the finish mode MODE.
template <Finish MODE>
void launch_sampled(const char* op, const float* logits, int V, int v_real, const SamplingConfig& cfg, uint64_t seed,
                    uint8_t* seen, int32_t* d_step, int32_t* d_out, const DraftDistribution& q, const int32_t* draft,
                    void* scratch, cudaStream_t stream) {
    require(cfg.temperature > 0.0f, op, "needs a temperature above 0");
    require(cfg.top_p > 0.0f && cfg.top_p <= 1.0f, op, "top_p must be in (0, 1]");
    const Scratch s = scratch_layout(scratch);
    FinishConfig fin{};
    fin.k = cfg.top_k > 0 ? cfg.top_k : SAMPLE_MAX_K;
    fin.temperature = cfg.temperature;
    fin.top_p = cfg.top_p;
    fin.min_p = cfg.min_p;
    fin.seed = seed;
    allow_dynamic_smem(sample_select_kernel, select_smem_bytes(V), op);
    launch_pdl("sample_select_kernel", sample_select_kernel, SAMPLE_BLOCKS, SAMPLE_THREADS,
               select_smem_bytes(V), stream, logits, V, v_real, static_cast<const uint8_t*>(seen),
               cfg.presence_penalty, fin.k, s);
    LAMPO_CHECK_LAUNCH(op);
    const auto finish = sample_finish_kernel<MODE>;
    allow_dynamic_smem(finish, FINISH_SMEM, op);
    launch_pdl("sample_finish_kernel", finish, 1, SAMPLE_THREADS, FINISH_SMEM, stream, s, fin, seen, d_step, d_out,
               q, draft);
}

}  // namespace

void sample_token(const float* logits, int V, int v_real, const SamplingConfig& cfg, uint8_t* seen, int32_t* d_step,
                  int32_t* d_out, void* scratch, cudaStream_t stream) {
    const char* op = "sample_token";
    check_sampling(op, V, v_real, cfg);
    const Scratch s = scratch_layout(scratch);
    if (cfg.temperature <= 0.0f) {
        require(reinterpret_cast<uintptr_t>(logits) % 16 == 0, op, "logits must be 16-byte aligned");
        const int blocks = std::min(ceil_div(v_real / 4, GREEDY_THREADS * SCAN_QUADS),
                                    GREEDY_BLOCKS_PER_SM * sm_count());
        launch_pdl("sample_greedy_kernel", sample_greedy_kernel, std::max(blocks, 1), GREEDY_THREADS, 0, stream,
                   logits, v_real, cfg.presence_penalty, seen, s, d_step, d_out);
        return;
    }
    launch_sampled<Finish::Plain>(op, logits, V, v_real, cfg, cfg.seed, seen, d_step, d_out, DraftDistribution{},
                                  nullptr, scratch, stream);
}

void sample_draft(const float* logits, int V, int v_real, const SamplingConfig& cfg, const uint8_t* seen,
                  int32_t* d_draft_step, int32_t* d_out, const DraftDistribution& q, void* scratch,
                  cudaStream_t stream) {
    const char* op = "sample_draft";
    check_sampling(op, V, v_real, cfg);
    launch_sampled<Finish::Draft>(op, logits, V, v_real, cfg, cfg.seed ^ DRAFT_RNG_STREAM, const_cast<uint8_t*>(seen),
                                  d_draft_step, d_out, q, nullptr, scratch, stream);
}

void sample_verify_row(const float* logits, int V, int v_real, const SamplingConfig& cfg, uint8_t* seen,
                       int32_t* d_step, const int32_t* d_draft, const DraftDistribution& q, int32_t* d_out,
                       void* scratch, cudaStream_t stream) {
    const char* op = "sample_verify_row";
    check_sampling(op, V, v_real, cfg);
    launch_sampled<Finish::Verify>(op, logits, V, v_real, cfg, cfg.seed, seen, d_step, d_out, q, d_draft, scratch,
                                   stream);
}

void argmax_rows(const float* logits, int T, int V, int v_real, int32_t* d_out, cudaStream_t stream) {
    require(V > 0 && V % 4 == 0, "argmax_rows", "V must be a positive multiple of 4, got " + std::to_string(V));
    require(v_real > 0 && v_real <= V, "argmax_rows", "need 0 < v_real <= V");
    if (T <= 0) return;
    launch_pdl("argmax_rows_kernel", argmax_rows_kernel, T, 1024, 0, stream, logits, V, v_real, d_out);
}

}  // namespace lampo
