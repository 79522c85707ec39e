// moe_ffn_decode.cu - the decode step's MoE experts in one launch (T <= 8, sm_90+: thread block
// clusters). For token t, its k routed slots s (expert e = ids[t, s], weight w_s) and the shared
// expert as slot k (weight sigmoid(h_t . w_gate)):
//   act_s = bf16(silu(h_t . Wg_s) * (h_t . Wu_s))            gate_up [E, 2I, H], shared [2Is, H] bf16
//   y[t, r] = sum_s w_s * (act_s . Wd_s[r])                  down [E, H, I], shared [H, Is] bf16
//   residual[t, r] += float(bf16(y[t, r]))                  residual [T, H] fp32
// The same function as moe_experts_gate_up + moe_experts_down (with the shared slot); the sum over
// slots runs in a different, fixed order, so the two agree to fp32 rounding, not bit for bit.
//
// Grid (rows / 16, T * (k + 1)): block (x, y) computes the 16 act values of rows 16x .. 16x + 15 of
// slot y's intermediate (moe_gate_up.cuh, unchanged), so the gate_up stream is the two-launch
// form's. Clusters of C blocks along x (C = 16 for the 35B-A3B's I = Is = 512, smaller when I or Is
// is not a multiple of 256) hold 16C consecutive act values between them. After a cluster barrier
// each block reads them from its peers' shared memory and computes its part of the down product:
// rank b of cluster c takes output rows [b H/C, (b + 1) H/C) over columns [16Cc, 16C(c + 1)), one
// run of 32C bytes per row; 2C lanes share a row (16-byte vectors), 16 rows per lane in flight.
// So down starts as soon as a cluster's act is complete, not after the whole gate_up grid, and no
// act round trip through global memory is needed.
// The cluster's partial rows, times w_s, go to partials [T, P, H] fp32 (P = clusters per token);
// the last of the P blocks with rank b of token t (a ticket per (t, b)) sums its H/C rows over the
// P partials in order p = 0 .. P-1 (deterministic) and writes them out.
// Routing as in moe_gate_up.cuh: ids and weights given, or selected from the router logits.
#include <algorithm>
#include <string>

#include <cooperative_groups.h>

#include "common.cuh"
#include "launch_utils.cuh"
#include "moe_common.h"
#include "moe_gate_up.cuh"
#include "ops.h"

namespace lampo {
namespace {

constexpr int MAX_CLUSTER = 16;  // blocks per cluster (16 is above the portable 8: H100/H200 allow it)
constexpr int DN_BATCH = 16;     // down: 16-byte weight vectors per lane in flight
constexpr int SUM_BATCH = 16;    // partial rows per load batch of the last block's sum

// Blocks per cluster for intermediate sizes I and Is (0: no shared slot): the largest power of two
// <= MAX_CLUSTER that divides both tile counts (a slot's rows then fill whole clusters).
int cluster_size(int I, int Is) {
    int c = MAX_CLUSTER;
    while (c > 1 && ((I / GU_ROWS_PER_BLOCK) % c || (Is && (Is / GU_ROWS_PER_BLOCK) % c))) c /= 2;
    return c;
}

// Partial rows per token: one per cluster of every slot.
__host__ __device__ inline int partial_count(int k, int I, int Is, int C) {
    return (k * I + Is) / (GU_ROWS_PER_BLOCK * C);
}

__global__ void __launch_bounds__(GU_WARPS * 32, 4)
moe_ffn_decode_kernel(const bf16* __restrict__ h, const bf16* __restrict__ gate_up, const bf16* __restrict__ down,
                      Routing routing, MoeSharedSlot shared, float* __restrict__ residual, float* __restrict__ partials,
                      unsigned* tickets, int T, int k, int H, int I, int C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ __align__(16) bf16 act_tile[GU_ROWS_PER_BLOCK];              // this block's act (peers read it)
    __shared__ __align__(16) bf16 act_cluster[GU_ROWS_PER_BLOCK * MAX_CLUSTER];  // the cluster's 16C values
    __shared__ float slot_weight;
    __shared__ bool last;
    const int slots = shared.gate_up ? k + 1 : k;
    const int t = blockIdx.y / slots, s = blockIdx.y % slots;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bf16* hrow = h + size_t(t) * H;
    const bool is_shared = s == k;
    const int rows_n = is_shared ? shared.inter : I;
    const int r0 = blockIdx.x * GU_ROWS_PER_BLOCK + warp * GU_PAIRS;
    const int rank = blockIdx.x % C, cl = blockIdx.x / C;
    // Whole clusters lie past rows_n (rows_n is a multiple of 16C), so they leave together.
    const bool has_rows = blockIdx.x * GU_ROWS_PER_BLOCK < rows_n;

    GateUpWarp rows;
    if (is_shared && has_rows) {  // known rows: the first batch before the wait
        rows.point(shared.gate_up, rows_n, r0, H);
        rows.load(0, H);
    }
    pdl_begin();
    SlotRoute route{0, 0.f};
    if (!is_shared) route = route_slot(routing, t, s, k, s == 0 && blockIdx.x == 0 && warp == 0);
    if (is_shared && has_rows && warp == 0) {
        route.weight = shared_expert_gate(hrow, shared.w_gate, H);
        if (blockIdx.x == 0 && lane == 0) shared.gate[t] = route.weight;
    }
    timeline_mark(TL_SELECTED);
    if (!has_rows) return;
    if (warp == 0 && lane == 0) slot_weight = route.weight;
    if (!is_shared) {
        rows.point(gate_up + size_t(route.expert) * 2 * I * H, rows_n, r0, H);
        rows.load(0, H);
    }
    float acc[2 * GU_PAIRS];
    rows.dot(hrow, H, acc);

    // down: this lane's rows and columns; the first batch goes out before the act exchange.
    const int Q = 2 * C;  // lanes per row (16-byte vectors of the cluster's 16C columns)
    const int j = lane % Q, rows_per_load = 32 / Q;
    const int block_rows = H / C, warp_rows = block_rows / GU_WARPS;
    const int row0 = rank * block_rows + warp * warp_rows + lane / Q;
    const bf16* Wd = is_shared ? shared.down : down + size_t(route.expert) * H * I;
    const bf16* wcol = Wd + size_t(row0) * rows_n + cl * GU_ROWS_PER_BLOCK * C + j * 8;
    const size_t load_stride = size_t(rows_per_load) * rows_n;  // elements between a lane's rows
    const int loads = warp_rows / rows_per_load;                 // = H / 64 per lane
    uint4 wv[DN_BATCH];
    auto load_down = [&](int first) {
#pragma unroll
        for (int u = 0; u < DN_BATCH; ++u)
            if (first + u < loads) wv[u] = ldg_u4(wcol + size_t(first + u) * load_stride);
    };
#pragma unroll
    for (int p = 0; p < GU_PAIRS; ++p) {
        const float a = gate_up_act(acc, p);
        if (lane == 0) act_tile[warp * GU_PAIRS + p] = __float2bfloat16_rn(a);
    }
    load_down(0);
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    if (threadIdx.x < GU_ROWS_PER_BLOCK * C / 8) {  // 16-byte pieces: two per peer
        const int peer = threadIdx.x / 2;
        reinterpret_cast<uint4*>(act_cluster)[threadIdx.x] =
            reinterpret_cast<const uint4*>(cluster.map_shared_rank(act_tile, peer))[threadIdx.x % 2];
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");  // peers' tiles read
    __syncthreads();
    const float w = slot_weight;
    float xa[8];
    bf16x8_to_float(reinterpret_cast<const uint4*>(act_cluster)[j], xa);

    const int P = partial_count(k, I, shared.gate_up ? shared.inter : 0, C);
    const int p_index = (is_shared ? k * (I / (GU_ROWS_PER_BLOCK * C)) : s * (I / (GU_ROWS_PER_BLOCK * C))) + cl;
    float* prow = partials + (size_t(t) * P + p_index) * H + row0;
    for (int first = 0; first < loads; first += DN_BATCH) {
        if (first) load_down(first);
#pragma unroll
        for (int u = 0; u < DN_BATCH; ++u) {
            if (first + u < loads) {
                float y = 0.f;
                const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv[u]);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 f = __bfloat1622float2(w2[i]);
                    y = fmaf(f.x, xa[2 * i], y);
                    y = fmaf(f.y, xa[2 * i + 1], y);
                }
                for (int o = Q / 2; o >= 1; o >>= 1) y += __shfl_xor_sync(0xffffffffu, y, o);
                if (j == 0) __stcg(prow + size_t(first + u) * rows_per_load, w * y);
            }
        }
    }

    // The last of token t's P blocks of rank `rank` sums the partial rows, p in order.
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* ticket = tickets + t * C + rank;
        __threadfence();
        last = atomicAdd(ticket, 1u) == unsigned(P - 1);
        if (last) {
            __threadfence();
            *ticket = 0;
        }
    }
    __syncthreads();
    if (last) {
        for (int r = rank * block_rows + threadIdx.x; r < (rank + 1) * block_rows; r += blockDim.x) {
            const float* col = partials + size_t(t) * P * H + r;
            float y = 0.f;
            for (int p0 = 0; p0 < P; p0 += SUM_BATCH) {  // SUM_BATCH loads in flight, added in order
                float v[SUM_BATCH];
#pragma unroll
                for (int i = 0; i < SUM_BATCH; ++i) v[i] = p0 + i < P ? __ldcg(col + size_t(p0 + i) * H) : 0.f;
#pragma unroll
                for (int i = 0; i < SUM_BATCH; ++i)
                    if (p0 + i < P) y += v[i];
            }
            residual[size_t(t) * H + r] += round_to_bf16(y);
        }
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // before leaving: peers done reading
#else
    __trap();  // moe_ffn_decode launches it on sm_90+ only
#endif
}

}  // namespace

bool moe_ffn_decode_available() { return sm90_or_newer(); }

size_t moe_ffn_decode_scratch_bytes(int T, int k, int H, int I, int Is) {
    const int C = cluster_size(I, Is);
    const size_t tickets = (size_t(T) * C * 4 + 255) / 256 * 256;
    return tickets + size_t(T) * partial_count(k, I, Is, C) * H * 4;
}

void moe_ffn_decode(const bf16* h, const bf16* gate_up, const bf16* down, const int32_t* ids, const float* weights,
                    const float* logits, int E, int32_t* ids_out, float* weights_out, const MoeSharedSlot& shared,
                    float* residual, void* scratch, int T, int k, int H, int I, cudaStream_t stream) {
    const char* op = "moe_ffn_decode";
    moe_check_tokens(op, T, k, H);
    moe_check_intermediate(op, I);
    require(T <= MOE_DECODE_MAX_T, op, "T must be <= 8, got " + std::to_string(T));
    require(moe_ffn_decode_available(), op, "needs thread block clusters (sm_90 or newer)");
    require(shared.gate_up && shared.down && shared.w_gate && shared.gate, op,
            "the shared slot needs gate_up, down, w_gate and gate");
    moe_check_intermediate(op, shared.inter);
    require(residual != nullptr, op, "needs the residual rows");
    require(scratch != nullptr, op, "needs moe_ffn_decode_scratch_bytes() of zeroed scratch");
    Routing routing{};
    if (logits) {
        moe_check_experts(op, E, k);
        require(ids_out && weights_out, op, "selecting from logits writes ids and weights");
        routing = {ids_out, logits, E, weights_out};
    } else {
        require(ids && weights, op, "needs ids and weights, or logits");
        routing = {const_cast<int32_t*>(ids), nullptr, 0, const_cast<float*>(weights)};
    }
    const int C = cluster_size(I, shared.inter);
    const dim3 grid(std::max(I, shared.inter) / GU_ROWS_PER_BLOCK, T * (k + 1));
    if (C > 8) {
        static const bool allowed = [] {
            LAMPO_CUDA_CHECK(cudaFuncSetAttribute(moe_ffn_decode_kernel,
                                                  cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
            return true;
        }();
        (void)allowed;
    }
    unsigned* tickets = static_cast<unsigned*>(scratch);
    float* partials = reinterpret_cast<float*>(static_cast<char*>(scratch) + (size_t(T) * C * 4 + 255) / 256 * 256);
    launch_pdl_clusters(op, C, moe_ffn_decode_kernel, grid, GU_WARPS * 32, 0, stream, h, gate_up, down, routing,
                        shared, residual, partials, tickets, T, k, H, I, C);
}

}  // namespace lampo
