// moe_experts.cu - routed experts for few tokens (decode, speculative verify; T <= 8).
//
//   gate_up: act[t, s, i] = bf16(silu(h_t . Wg[e][i]) * (h_t . Wu[e][i])), e = ids[t, s]
//            gate_up [E, 2I, H] bf16 (rows 0..I-1 gate, I..2I-1 up) -> act [T, k, I] bf16
//   down:    out[t, r] = bf16(sum_s w[t, s] * (act[t, s] . Wd[e][r]))   down [E, H, I] bf16
//
// These GEMVs stream the selected experts' weights (35B-A3B: 8 x 6 MiB per layer per token,
// the largest byte stream of a decode step), so both kernels are built around 16-byte weight
// loads with several in flight per lane and read nothing but the selected rows:
// - gate_up: grid (row tiles of 16, T*k slots); a warp owns two (gate, up) row pairs and dots
//   them with h_t (read through L1), then applies silu * up. In the decode step's form
//   (moe_experts_gate_up_select) it also makes the selection: every warp of a routed slot runs
//   the router's warp top-k (moe_topk.cuh) on token t's logits and takes slot s's expert; one warp
//   per token writes ids and weights for the down launch. That removes the top-k launch.
// - down: grid (row tiles of 8); a warp owns one output row r and, per token, walks every slot's
//   Wd[e][r] in a fixed order, so the weighted sum over experts needs no atomics and is
//   deterministic. The decode step's form (moe_experts_down_add) adds the rounded row to the fp32
//   residual stream instead of storing it.
// - down for one token on sm_90 (moe_down_bulk): a single wave of H / 16 blocks; block b copies
//   rows [16 b, 16 b + 16) of every selected expert's Wd (and of the shared expert's) into shared
//   memory with one bulk copy per slot (the copy engine keeps the whole 19 MB of a 35B-A3B layer in
//   flight at once, where register loads reach a fraction of that), the shared slot's copy issued
//   before the PDL wait; warps then walk the same items in the same order as moe_down_gemv, from
//   shared memory, so the two forms are bit-identical.
// - gate_up for one token on sm_90 (moe_gate_up_bulk): the same idea for the (gate, up) rows, as a
//   persistent grid with a ring of bulk-copied row tiles (contract at the kernel).
// - shared expert (optional MoeSharedSlot, contract in ops.h): one more slot per token in both
//   grids, with its own matrices and intermediate size Is; the first gate_up block of that slot
//   also computes its weight sigmoid(h_t . w_gate). A MoE FFN step is then router + 2 launches.
#include <algorithm>

#include "common.cuh"
#include "launch_utils.cuh"
#include "gdn_moe_vec.cuh"
#include "mbarrier.cuh"
#include "moe_common.h"
#include "moe_topk.cuh"
#include "ops.h"

namespace lampo {
namespace {

constexpr int GU_WARPS = 8;
constexpr int GU_PAIRS = 2;  // (gate, up) row pairs per warp
constexpr int GU_ROWS_PER_BLOCK = GU_WARPS * GU_PAIRS;
constexpr int GU_UNROLL = 2;  // 16-byte chunks per lane per row per batch (x 4 rows in flight)

// How the gate_up launch learns its experts: read ids [T, k], or (logits set) select them itself
// from the router logits [T, E] and write ids and weights [T, k].
struct Routing {
    int32_t* ids;
    const float* logits;
    int E;
    float* weights;
};

// Token t's experts by one warp from the router logits (moe_topk.cuh); with `publish`, lanes < k
// also write the ids and weights for the down launch.
__device__ __forceinline__ TopkLane route_from_logits(const Routing& r, int t, int k, bool publish) {
    const TopkLane sel = warp_topk(r.logits + size_t(t) * r.E, r.E, k);
    const int lane = threadIdx.x % 32;
    if (publish && lane < k) {
        r.ids[size_t(t) * k + lane] = sel.id;
        r.weights[size_t(t) * k + lane] = sel.weight;
    }
    return sel;
}

// The shared slot's weight for token t, sigmoid(h_t . w_gate), by one warp.
__device__ __forceinline__ void shared_gate_weight(const bf16* hrow, const MoeSharedSlot& shared, int H, int t) {
    const int lane = threadIdx.x % 32;
    float dot = 0.f;
    for (int c = lane * 8; c < H; c += 32 * 8) dot = dot_bf16x8(ldg_u4(hrow + c), ldg_u4(shared.w_gate + c), dot);
    dot = warp_sum(dot);
    if (lane == 0) shared.gate[t] = sigmoid(dot);
}

__global__ void __launch_bounds__(GU_WARPS * 32)
moe_gate_up_gemv(const bf16* __restrict__ h, const bf16* __restrict__ gate_up, Routing routing,
                 bf16* __restrict__ act, int T, int k, int H, int I, MoeSharedSlot shared) {
    pdl_begin();
    const int slots = shared.gate_up ? k + 1 : k;  // per token
    const int t = blockIdx.y / slots, s = blockIdx.y % slots;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const bf16* hrow = h + size_t(t) * H;
    const bool is_shared = s == k;
    int expert = 0;
    if (!is_shared && routing.logits) {
        const TopkLane sel = route_from_logits(routing, t, k, s == 0 && blockIdx.x == 0 && warp == 0);
        expert = __shfl_sync(0xffffffffu, sel.id, s);
    } else if (!is_shared) {
        expert = routing.ids[t * k + s];
    }
    if (is_shared && blockIdx.x == 0 && warp == 0) shared_gate_weight(hrow, shared, H, t);
    const int rows_n = is_shared ? shared.inter : I;  // this slot's intermediate size
    const int r0 = blockIdx.x * GU_ROWS_PER_BLOCK + warp * GU_PAIRS;
    if (r0 >= rows_n) return;  // the grid spans max(I, Is); sizes are multiples of 64
    const bf16* W = is_shared ? shared.gate_up : gate_up + size_t(expert) * 2 * I * H;
    bf16* out = is_shared ? act + size_t(T) * k * I + size_t(t) * rows_n : act + size_t(t * k + s) * I;

    const bf16* rows[2 * GU_PAIRS];  // gate r, up r, gate r+1, up r+1
#pragma unroll
    for (int p = 0; p < GU_PAIRS; ++p) {
        rows[2 * p] = W + size_t(r0 + p) * H;
        rows[2 * p + 1] = W + size_t(rows_n + r0 + p) * H;
    }
    float acc[2 * GU_PAIRS] = {};
    for (int base = 0; base < H; base += 32 * 8 * GU_UNROLL) {
        uint4 wv[GU_UNROLL][2 * GU_PAIRS];
#pragma unroll
        for (int u = 0; u < GU_UNROLL; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) {
#pragma unroll
                for (int q = 0; q < 2 * GU_PAIRS; ++q) wv[u][q] = ldg_u4(rows[q] + c);
            }
        }
#pragma unroll
        for (int u = 0; u < GU_UNROLL; ++u) {
            const int c = base + (u * 32 + lane) * 8;
            if (c < H) {
                const uint4 hv = ldg_u4(hrow + c);
#pragma unroll
                for (int q = 0; q < 2 * GU_PAIRS; ++q) acc[q] = dot_bf16x8(wv[u][q], hv, acc[q]);
            }
        }
    }
#pragma unroll
    for (int p = 0; p < GU_PAIRS; ++p) {
        const float g = warp_sum(acc[2 * p]), u = warp_sum(acc[2 * p + 1]);
        if (lane == 0) out[r0 + p] = __float2bfloat16_rn(silu(g) * u);
    }
}

constexpr int GB_PAIRS = GU_WARPS / 2;  // (gate, up) row pairs per unit of moe_gate_up_bulk: a row per warp
constexpr int GB_MAX_STAGES = 6;
constexpr int GB_MAX_SMEM = 200 * 1024;

// Stages of moe_gate_up_bulk for width H (each 2 * GB_PAIRS rows) and its dynamic shared memory
// (the stages, then the input row h).
int gate_up_bulk_stages(int H) {
    return std::min(GB_MAX_STAGES, int((GB_MAX_SMEM - size_t(H) * 2) / (size_t(2 * GB_PAIRS) * H * 2)));
}
size_t gate_up_bulk_smem(int H) { return (size_t(gate_up_bulk_stages(H)) * 2 * GB_PAIRS + 1) * H * 2; }

// One token (T = 1): the same act as moe_gate_up_gemv (the same accumulation order). A persistent
// grid (one block per SM) walks units of GB_PAIRS (gate, up) row pairs (the shared slot's first,
// then slot 0, 1, ...); each unit's gate rows and up rows are two contiguous runs, brought into a
// ring of `stages` shared-memory buffers by bulk copies, so each block keeps up to stages x 32 KiB
// in flight. Units of the shared slot do not depend on the router and are issued before the wait.
__global__ void __launch_bounds__(GU_WARPS * 32, 1)
moe_gate_up_bulk(const bf16* __restrict__ h, const bf16* __restrict__ gate_up, Routing routing,
                 bf16* __restrict__ act, int k, int H, int I, MoeSharedSlot shared, int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bar[GB_MAX_STAGES];
    __shared__ int expert[MOE_MAX_K];
    __shared__ float dots[2][GU_WARPS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int Is = shared.gate_up ? shared.inter : 0;
    const int shared_units = Is / GB_PAIRS, units_per_slot = I / GB_PAIRS;
    const int units = shared_units + k * units_per_slot;
    const size_t stage_elems = size_t(2 * GB_PAIRS) * H;
    bf16* ring = reinterpret_cast<bf16*>(smem);
    bf16* hs = ring + stages * stage_elems;
    auto unit_of = [&](int j) { return int(blockIdx.x) + j * int(gridDim.x); };
    auto slot_of = [&](int u) { return u < shared_units ? k : (u - shared_units) / units_per_slot; };
    auto first_pair = [&](int u) { return (u < shared_units ? u : (u - shared_units) % units_per_slot) * GB_PAIRS; };
    auto issue = [&](int u, int st) {  // unit u -> ring buffer st (thread 0)
        const int s = slot_of(u), r0 = first_pair(u);
        const bf16* W = s == k ? shared.gate_up : gate_up + size_t(expert[s]) * 2 * I * H;
        const int rows_n = s == k ? Is : I;
        const uint32_t run = uint32_t(GB_PAIRS) * H * 2;
        bf16* dst = ring + st * stage_elems;
        mbarrier_arrive_expect_tx(&bar[st], 2 * run);
        bulk_load(dst, W + size_t(r0) * H, run, &bar[st]);
        bulk_load(dst + size_t(GB_PAIRS) * H, W + size_t(rows_n + r0) * H, run, &bar[st]);
    };
    if (threadIdx.x == 0) {
        for (int st = 0; st < stages; ++st) mbarrier_init(&bar[st], 1);
        mbarrier_init_fence();
        for (int j = 0; j < stages && unit_of(j) < min(units, shared_units); ++j) issue(unit_of(j), j);
    }
    pdl_begin();
    if (warp == 0) {
        if (routing.logits) {
            const TopkLane sel = route_from_logits(routing, 0, k, blockIdx.x == 0);
            if (lane < k) expert[lane] = sel.id;
        } else if (lane < k) {
            expert[lane] = routing.ids[lane];
        }
    } else if (warp == 1 && Is && blockIdx.x == 0) {
        shared_gate_weight(h, shared, H, 0);
    }
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x)
        reinterpret_cast<uint4*>(hs)[i] = ldg_u4(h + 8 * i);
    __syncthreads();
    if (threadIdx.x == 0)
        for (int j = 0; j < stages && unit_of(j) < units; ++j)
            if (unit_of(j) >= shared_units) issue(unit_of(j), j);

    for (int j = 0; unit_of(j) < units; ++j) {
        const int u = unit_of(j), st = j % stages;
        mbarrier_wait(&bar[st], (j / stages) & 1);
        const bf16* row = ring + st * stage_elems + size_t(warp) * H;  // warps 0..3 gate rows, 4..7 up rows
        float acc = 0.f;
        for (int c = lane * 8; c < H; c += 32 * 8)
            acc = dot_bf16x8(*reinterpret_cast<const uint4*>(row + c), *reinterpret_cast<const uint4*>(hs + c), acc);
        acc = warp_sum(acc);
        if (lane == 0) dots[j & 1][warp] = acc;
        __syncthreads();  // the buffer is read and the dots are in
        if (threadIdx.x < GB_PAIRS) {
            const int s = slot_of(u), p = threadIdx.x;
            const float g = dots[j & 1][p], up = dots[j & 1][GB_PAIRS + p];
            act[size_t(s) * I + first_pair(u) + p] = __float2bfloat16_rn(silu(g) * up);  // slot k: the shared act
        }
        if (threadIdx.x == 0 && unit_of(j + stages) < units) issue(unit_of(j + stages), st);
    }
#else
    __trap();  // launched only where the machine code is sm_90+ (gate_up_bulk_usable)
#endif
}

// Whether moe_gate_up_bulk serves this call: one token, sm_90+ machine code, at least two ring buffers.
bool gate_up_bulk_usable(int T, int H) {
    static const int arch = kernel_binary_arch(moe_gate_up_bulk);
    return T == 1 && arch >= 90 && gate_up_bulk_stages(H) >= 2;
}

constexpr int DN_WARPS = 8;   // one output row per warp
constexpr int DN_UNROLL = 8;  // (slot, chunk) items per lane per batch

__global__ void __launch_bounds__(DN_WARPS * 32)
moe_down_gemv(const bf16* __restrict__ act, const bf16* __restrict__ down,
              const int32_t* __restrict__ ids, const float* __restrict__ weights,
              bf16* __restrict__ out, float* __restrict__ residual, int T, int k, int H, int I,
              MoeSharedSlot shared) {
    pdl_begin();
    const int r = blockIdx.x * DN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= H) return;
    const int chunks = I / 8;                                    // 16-byte chunks per routed row
    const int routed_items = k * chunks;                         // (slot, chunk) pairs per token
    const int items = routed_items + (shared.down ? shared.inter / 8 : 0);  // + the shared row
    const bf16* act_shared = act + size_t(T) * k * I;
    for (int t = 0; t < T; ++t) {
        float acc = 0.f;
        for (int base = 0; base < items; base += 32 * DN_UNROLL) {
            uint4 wv[DN_UNROLL], av[DN_UNROLL];
            float wt[DN_UNROLL];
#pragma unroll
            for (int u = 0; u < DN_UNROLL; ++u) {
                const int item = base + u * 32 + lane;
                if (item < routed_items) {
                    const int s = item / chunks, c = (item % chunks) * 8;
                    const int slot = t * k + s;
                    const int e = __ldg(ids + slot);
                    wt[u] = __ldg(weights + slot);
                    wv[u] = ldg_u4(down + (size_t(e) * H + r) * I + c);
                    av[u] = *reinterpret_cast<const uint4*>(act + size_t(slot) * I + c);
                } else if (item < items) {
                    const int c = (item - routed_items) * 8;
                    wt[u] = shared.gate[t];
                    wv[u] = ldg_u4(shared.down + size_t(r) * shared.inter + c);
                    av[u] = *reinterpret_cast<const uint4*>(act_shared + size_t(t) * shared.inter + c);
                }
            }
#pragma unroll
            for (int u = 0; u < DN_UNROLL; ++u) {
                const int item = base + u * 32 + lane;
                if (item < items) acc = fmaf(wt[u], dot_bf16x8(wv[u], av[u], 0.f), acc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) {  // out, or (residual set) the residual stream += the rounded row
            if (residual) residual[size_t(t) * H + r] += __bfloat162float(__float2bfloat16_rn(acc));
            else out[size_t(t) * H + r] = __float2bfloat16_rn(acc);
        }
    }
}

constexpr int DB_ROWS = 16;  // output rows per block of moe_down_bulk
constexpr int DB_MAX_SMEM = 200 * 1024;

// Dynamic shared memory of moe_down_bulk: DB_ROWS rows of each routed slot (I wide) and of the
// shared slot (Is wide), bf16.
size_t down_bulk_smem(int k, int I, int Is) { return size_t(DB_ROWS) * (size_t(k) * I + Is) * 2; }

// One token (T = 1). Same contract and item order as moe_down_gemv; rows = H / DB_ROWS blocks.
__global__ void __launch_bounds__(DN_WARPS * 32, 1)
moe_down_bulk(const bf16* __restrict__ act, const bf16* __restrict__ down, const int32_t* __restrict__ ids,
              const float* __restrict__ weights, bf16* __restrict__ out, float* __restrict__ residual, int k, int H,
              int I, MoeSharedSlot shared) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t tiles[];  // slot s at s * DB_ROWS * I bf16; shared slot last
    __shared__ uint64_t bar[MOE_MAX_K + 1];
    __shared__ float slot_w[MOE_MAX_K + 1];
    const int r0 = blockIdx.x * DB_ROWS, Is = shared.down ? shared.inter : 0;
    const bf16* w_tiles = reinterpret_cast<const bf16*>(tiles);
    bf16* shared_tile = reinterpret_cast<bf16*>(tiles) + size_t(DB_ROWS) * k * I;
    if (threadIdx.x == 0) {
        for (int s = 0; s <= k; ++s) mbarrier_init(&bar[s], 1);
        mbarrier_init_fence();
        if (shared.down) {  // router-independent: on its way before the wait
            const uint32_t bytes = uint32_t(DB_ROWS) * Is * 2;
            mbarrier_arrive_expect_tx(&bar[k], bytes);
            bulk_load(shared_tile, shared.down + size_t(r0) * Is, bytes, &bar[k]);
        }
    }
    pdl_begin();
    if (threadIdx.x == 0) {
        const uint32_t bytes = uint32_t(DB_ROWS) * I * 2;
        for (int s = 0; s < k; ++s) {
            mbarrier_arrive_expect_tx(&bar[s], bytes);
            bulk_load(reinterpret_cast<bf16*>(tiles) + size_t(s) * DB_ROWS * I,
                      down + (size_t(__ldcg(ids + s)) * H + r0) * I, bytes, &bar[s]);
        }
    }
    if (threadIdx.x < k) slot_w[threadIdx.x] = __ldcg(weights + threadIdx.x);
    if (threadIdx.x == 0 && shared.down) slot_w[k] = __ldcg(shared.gate);
    __syncthreads();
    for (int s = 0; s < k; ++s) mbarrier_wait(&bar[s], 0);
    if (shared.down) mbarrier_wait(&bar[k], 0);

    const int lane = threadIdx.x % 32;
    const int chunks = I / 8, routed_items = k * chunks, items = routed_items + Is / 8;
    for (int rr = threadIdx.x / 32; rr < DB_ROWS; rr += DN_WARPS) {
        float acc = 0.f;
        for (int item = lane; item < items; item += 32) {
            uint4 wv, av;
            float wt;
            if (item < routed_items) {
                const int s = item / chunks, c = (item % chunks) * 8;
                wv = *reinterpret_cast<const uint4*>(w_tiles + (size_t(s) * DB_ROWS + rr) * I + c);
                av = *reinterpret_cast<const uint4*>(act + size_t(s) * I + c);
                wt = slot_w[s];
            } else {
                const int c = (item - routed_items) * 8;
                wv = *reinterpret_cast<const uint4*>(shared_tile + size_t(rr) * Is + c);
                av = *reinterpret_cast<const uint4*>(act + size_t(k) * I + c);
                wt = slot_w[k];
            }
            acc = fmaf(wt, dot_bf16x8(wv, av, 0.f), acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            if (residual) residual[r0 + rr] += __bfloat162float(__float2bfloat16_rn(acc));
            else out[r0 + rr] = __float2bfloat16_rn(acc);
        }
    }
#else
    __trap();  // launched only where the machine code is sm_90+ (down_bulk_usable)
#endif
}

// Whether moe_down_bulk serves this call: one token, the machine code of the kernel is sm_90+,
// whole row tiles, and the tiles fit the block's shared memory.
bool down_bulk_usable(int T, int k, int H, int I, int Is) {
    static const int arch = kernel_binary_arch(moe_down_bulk);
    return T == 1 && arch >= 90 && H % DB_ROWS == 0 && down_bulk_smem(k, I, Is) <= DB_MAX_SMEM;
}

void check_decode_dims(const char* op, int T, int k, int H, int I) {
    moe_check_tokens(op, T, k, H);
    moe_check_intermediate(op, I);
    if (T > MOE_DECODE_MAX_T)
        throw std::invalid_argument(std::string(op) + ": T must be <= 8 (use moe_experts_prefill), got " +
                                    std::to_string(T));
}

// The launch-time view of the optional shared slot (all null when absent), checked once.
MoeSharedSlot shared_slot(const char* op, const MoeSharedSlot* shared) {
    if (!shared) return MoeSharedSlot{};
    if (!shared->gate_up || !shared->down || !shared->w_gate || !shared->gate)
        throw std::invalid_argument(std::string(op) + ": the shared slot needs gate_up, down, w_gate and gate");
    moe_check_intermediate(op, shared->inter);
    return *shared;
}

void launch_gate_up(const char* op, const bf16* h, const bf16* gate_up, Routing routing, bf16* act, int T, int k,
                    int H, int I, cudaStream_t stream, const MoeSharedSlot* shared) {
    check_decode_dims(op, T, k, H, I);
    const MoeSharedSlot sh = shared_slot(op, shared);
    if (gate_up_bulk_usable(T, H)) {
        const size_t smem = gate_up_bulk_smem(H);
        allow_dynamic_smem(moe_gate_up_bulk, smem, op);
        launch_pdl(op, moe_gate_up_bulk, sm_count(), GU_WARPS * 32, smem, stream, h, gate_up, routing, act, k, H,
                   I, sh, gate_up_bulk_stages(H));
        return;
    }
    const int rows = sh.gate_up ? std::max(I, sh.inter) : I;
    const dim3 grid(rows / GU_ROWS_PER_BLOCK, T * (sh.gate_up ? k + 1 : k));
    launch_pdl(op, moe_gate_up_gemv, grid, GU_WARPS * 32, 0, stream, h, gate_up, routing, act, T, k, H, I, sh);
}

void launch_down(const char* op, const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                 bf16* out, float* residual, int T, int k, int H, int I, cudaStream_t stream,
                 const MoeSharedSlot* shared) {
    check_decode_dims(op, T, k, H, I);
    const MoeSharedSlot sh = shared_slot(op, shared);
    const int Is = sh.down ? sh.inter : 0;
    if (down_bulk_usable(T, k, H, I, Is)) {
        const size_t smem = down_bulk_smem(k, I, Is);
        allow_dynamic_smem(moe_down_bulk, smem, op);
        launch_pdl(op, moe_down_bulk, H / DB_ROWS, DN_WARPS * 32, smem, stream, act, down, ids, weights, out,
                   residual, k, H, I, sh);
        return;
    }
    launch_pdl(op, moe_down_gemv, ceil_div(H, DN_WARPS), DN_WARPS * 32, 0, stream, act, down, ids, weights,
               out, residual, T, k, H, I, sh);
}

}  // namespace

void moe_experts_gate_up(const bf16* h, const bf16* gate_up, const int32_t* ids, bf16* act, int T,
                         int k, int H, int I, cudaStream_t stream, const MoeSharedSlot* shared) {
    launch_gate_up("moe_experts_gate_up", h, gate_up, {const_cast<int32_t*>(ids), nullptr, 0, nullptr}, act, T,
                   k, H, I, stream, shared);
}

void moe_experts_gate_up_select(const bf16* h, const float* logits, int E, const bf16* gate_up, int32_t* ids,
                                float* weights, bf16* act, int T, int k, int H, int I, cudaStream_t stream,
                                const MoeSharedSlot* shared) {
    const char* op = "moe_experts_gate_up_select";
    moe_check_experts(op, E, k);
    launch_gate_up(op, h, gate_up, {ids, logits, E, weights}, act, T, k, H, I, stream, shared);
}

void moe_experts_down(const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                      bf16* out, int T, int k, int H, int I, cudaStream_t stream,
                      const MoeSharedSlot* shared) {
    launch_down("moe_experts_down", act, down, ids, weights, out, nullptr, T, k, H, I, stream, shared);
}

void moe_experts_down_add(const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                          float* residual, int T, int k, int H, int I, cudaStream_t stream,
                          const MoeSharedSlot* shared) {
    launch_down("moe_experts_down_add", act, down, ids, weights, nullptr, residual, T, k, H, I, stream, shared);
}

}  // namespace lampo
