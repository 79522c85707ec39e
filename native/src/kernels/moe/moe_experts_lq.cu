// moe_experts_lq.cu - the experts' GEMVs for few tokens (decode, verify; T <= 8) with their banks in
// the LQ format (kernels/lq_tile.cuh): the products of moe_experts.cu and its decode-step forms.
//
//   gate_up: act[t, s, i] = bf16(silu(h_t . Wg[e][i]) * (h_t . Wu[e][i])), e = ids[t, s]
//            expert e's [2I, H] at gate_up + e * lq_packed_bytes(2I, H, bits) (rows 0..I-1 gate)
//   down:    out[t, r] = bf16(sum_s w[t, s] * (act[t, s] . Wd[e][r]))
//            expert e's [H, I] at down + e * lq_packed_bytes(H, I, bits)
//   shared slot (optional MoeSharedSlotLq, ops.h): gate_up also writes act_s[t] (at act + T k I,
//            [T, Is]) from its [2Is, H] matrix and gate[t] = sigmoid(h_t . w_gate); down adds
//            gate[t] * (act_s[t] . Sd[r]) to the same fp32 sum before the one rounding.
//   select (gate_up): e = the router's top-k of logits [T, E] (moe_topk.cuh); ids, weights written.
//   add (down): residual[t, r] += float(bf16(out[t, r])) instead of storing out.
//
// - gate_up: grid (max(I, Is) / 16 row strips, T * slots); the block's 8 warps take the gate
//   strip's tiles (warps 0-3) and the up strip's (warps 4-7) in 4 slices of H each, so the block
//   reads one expert's 32 rows once; h_t is staged once per block; the slices are summed through
//   shared memory and 16 threads apply silu * up. Selecting, every warp of routed slot s runs the
//   router's warp top-k on token t's logits for s + 1 rounds and takes slot s's expert (warp 0 of
//   strip 0, slot 0 runs all k and writes ids and weights), as moe_experts_gate_up_select does.
//   The shared slot's strip-0 block also computes gate[t] (warp 1, beside the epilogue).
// - down: grid (H / 16 row strips, T), one warp per slot (k, + 1 for the shared slot); warp s
//   streams its slot's strip over all of I (Is), with its act row staged by the warp itself; the
//   rows are summed in slot order with their weights (deterministic, no atomics).
// The shared slot's matrices are known up front: its first tiles are requested before the PDL
// wait. The routed slots read (or select) their experts after it, so their tiles follow the wait.
#include <algorithm>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/gdn_moe_vec.cuh"
#include "kernels/launch_utils.cuh"
#include "kernels/lq_stage.cuh"
#include "kernels/moe/moe_common.h"
#include "kernels/moe/moe_topk.cuh"
#include "kernels/ops.h"

namespace lampo {
namespace {

constexpr int MLQ_WARPS = 8;                // gate_up block; the most routed slots per token (k)
constexpr int DN_MAX_WARPS = MLQ_WARPS + 1;  // down block: k routed slots + the shared slot
constexpr int GU_SLICES = MLQ_WARPS / 2;    // slices of H per strip (gate: warps 0..3, up: 4..7)

struct MoeLqParams {
    const bf16* x;          // gate_up: h [T, H]; down: act [T, k, I] (then act_s [T, Is])
    const uint8_t* bank;
    int32_t* ids;           // [T, k]: read, or written by gate_up's selection
    float* weights;         // [T, k]: read by down, written by gate_up's selection
    const float* logits;    // gate_up: the router logits [T, E] to select from, or null (ids given)
    int E;
    bf16* y;                // gate_up: act; down: out [T, H] (null when adding into residual)
    float* residual;        // down: [T, H] fp32, or null
    int T, k, H, I;
    MoeSharedSlotLq shared;  // shared.gate_up null: no shared slot
};

// Routed slot s of token t: its expert, read from ids, or selected as the router's top-k does
// (this warp stops after s + 1 rounds; warp 0 of strip 0, slot 0 runs all k and writes the token's
// ids and weights). After the PDL wait.
__device__ __forceinline__ int slot_expert(const MoeLqParams& p, int t, int s) {
    if (!p.logits) return __ldcg(p.ids + t * p.k + s);
    const bool writes = s == 0 && blockIdx.x == 0 && threadIdx.x < 32;
    const TopkLane sel = warp_topk(p.logits + size_t(t) * p.E, p.E, writes ? p.k : s + 1);
    if (writes) store_topk(sel, p.ids, p.weights, t, p.k);
    return __shfl_sync(0xffffffffu, sel.id, s);
}

// shared.gate[t] = sigmoid(h_t . w_gate) by one warp, summed in moe_experts.cu's order (its bits).
__device__ __forceinline__ void shared_gate(const MoeLqParams& p, int t, int lane) {
    const bf16* hrow = p.x + size_t(t) * p.H;
    float dot = 0.f;
#pragma unroll 8
    for (int c = lane * 8; c < p.H; c += 32 * 8) dot = dot_bf16x8(ldg_u4(hrow + c), ldg_u4(p.shared.w_gate + c), dot);
    dot = warp_sum(dot);
    if (lane == 0) p.shared.gate[t] = sigmoid(dot);
}

// One gate_up block: strip blockIdx.x of the gate and up rows of token t's slot s, its matrix
// [2 inter, H] at BITS: the shared expert's (SHARED), or routed expert's.
template <int BITS, bool SHARED>
__device__ __forceinline__ void gate_up_block(const MoeLqParams& p, uint4* smem, float (&partial)[MLQ_WARPS][32][4],
                                              int t, int s) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, strip = blockIdx.x;
    const int inter = SHARED ? p.shared.inter : p.I;
    const int tiles = p.H / LQ_TILE_COLS, half = warp / GU_SLICES, slice = warp % GU_SLICES;
    const int tbeg = tiles * slice / GU_SLICES, tend = tiles * (slice + 1) / GU_SLICES;
    float* start = reinterpret_cast<float*>(smem);
    uint4* xs = reinterpret_cast<uint4*>(start + 8 * tiles);

    const uint8_t* matrix = p.shared.gate_up;  // known up front: its tiles go before the wait
    if constexpr (!SHARED) {
        pdl_begin();
        matrix = p.bank + size_t(slot_expert(p, t, s)) * (size_t(2 * inter / LQ_TILE_ROWS) * tiles * TILE_BYTES);
        timeline_mark(TL_SELECTED);
    }
    const int row_strip = strip + half * (inter / LQ_TILE_ROWS);  // the gate strip, or its up strip
    const uint8_t* src = matrix + (size_t(row_strip) * tiles + tbeg) * TILE_BYTES;
    LqGroup<BITS> first;
    lq_load_group(first, src, tend - tbeg, lane);
    if constexpr (SHARED) pdl_begin();
    lq_stage_x_from<LqXSource::Global>(xs, start, p.x + size_t(t) * p.H, 1, p.H, lq_code_centre<BITS>(),
                                       threadIdx.x, blockDim.x);
    __syncthreads();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    lq_stream_tiles(first, src, lq_lane_x(xs, start, tiles, 1, lane), tbeg, tend, lane, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
    __syncthreads();
    if (SHARED && strip == 0 && warp == 1) shared_gate(p, t, lane);
    if (threadIdx.x >= LQ_TILE_ROWS) return;
    // row rho of the strip: token 0 of lane (rho % 8) * 4, value 0 (rows 0-7) or 2 (rows 8-15)
    const int rho = threadIdx.x, src_lane = (rho & 7) * 4, value = rho < 8 ? 0 : 2;
    float gate = 0.0f, up = 0.0f;
    for (int w = 0; w < GU_SLICES; ++w) {
        gate += partial[w][src_lane][value];
        up += partial[GU_SLICES + w][src_lane][value];
    }
    bf16* out = SHARED ? p.y + size_t(p.T) * p.k * p.I + size_t(t) * inter : p.y + size_t(t * p.k + s) * p.I;
    out[strip * LQ_TILE_ROWS + rho] = __float2bfloat16(silu(gate) * up);
}

// BITS: the routed bank's width; SBITS: the shared slot's (BITS when there is none).
template <int BITS, int SBITS>
__global__ void __launch_bounds__(MLQ_WARPS * 32) moe_lq_gate_up_kernel(const MoeLqParams p) {
    extern __shared__ uint4 mlq_smem[];
    __shared__ float partial[MLQ_WARPS][32][4];
    const int slots = p.shared.gate_up ? p.k + 1 : p.k;
    const int t = blockIdx.y / slots, s = blockIdx.y % slots;
    if (s == p.k) {
        if (blockIdx.x < p.shared.inter / LQ_TILE_ROWS) gate_up_block<SBITS, true>(p, mlq_smem, partial, t, s);
    } else if (blockIdx.x < p.I / LQ_TILE_ROWS) {  // the grid spans max(I, Is)
        gate_up_block<BITS, false>(p, mlq_smem, partial, t, s);
    }
}

// acc += one down slot's strip: 16 rows x width of the LQ matrix whose strip starts at
// strip_tiles, times x [width] (an act row, staged by the warp). before_wait: the tiles are
// requested before the PDL wait (the shared slot); else the caller has waited.
template <int BITS>
__device__ __forceinline__ void down_slot(uint4* xs, float* start, const uint8_t* strip_tiles, const bf16* x, int width,
                                          bool before_wait, int lane, float (&acc)[4]) {
    const int tiles = width / LQ_TILE_COLS;
    LqGroup<BITS> first;
    lq_load_group(first, strip_tiles, tiles, lane);
    if (before_wait) pdl_begin();
    lq_stage_x_from<LqXSource::Global>(xs, start, x, 1, width, lq_code_centre<BITS>(), lane, 32);
    __syncwarp();
    lq_stream_tiles(first, strip_tiles, lq_lane_x(xs, start, tiles, 1, lane), 0, tiles, lane, acc);
}

// The block has one warp per slot: k routed (+ 1 shared). BITS / SBITS as the gate_up kernel's.
template <int BITS, int SBITS>
__global__ void __launch_bounds__(DN_MAX_WARPS * 32) moe_lq_down_kernel(const MoeLqParams p) {
    extern __shared__ uint4 mlq_smem[];
    __shared__ float partial[DN_MAX_WARPS][32][4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int strip = blockIdx.x, t = blockIdx.y;
    // per warp: its slot's act row (and the zero fragment), its tiles' start values
    const int width = max(p.I, p.shared.down ? p.shared.inter : 0);
    const int x_vecs = (lq_x_bytes(width) + LQ_ZERO_X_BYTES) / 16, start_floats = lq_start_bytes(width) / 4;
    uint4* xs = mlq_smem + warp * x_vecs;
    float* start = reinterpret_cast<float*>(mlq_smem + warps * x_vecs) + warp * start_floats;

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float residual_in = 0.0f;  // add: the epilogue thread's residual value, read now, off the tail
    if (warp < p.k) {
        pdl_begin();
        if (p.residual && threadIdx.x < LQ_TILE_ROWS)
            residual_in = __ldcg(p.residual + size_t(t) * p.H + strip * LQ_TILE_ROWS + threadIdx.x);
        const int slot = t * p.k + warp, e = __ldcg(p.ids + slot), tiles = p.I / LQ_TILE_COLS;
        const size_t strip_bytes = size_t(tiles) * lq_tile_bytes(BITS);
        down_slot<BITS>(xs, start, p.bank + (size_t(e) * (p.H / LQ_TILE_ROWS) + strip) * strip_bytes,
                        p.x + size_t(slot) * p.I, p.I, false, lane, acc);
    } else {  // the shared slot
        const int inter = p.shared.inter;
        down_slot<SBITS>(xs, start, p.shared.down + size_t(strip) * (inter / LQ_TILE_COLS) * lq_tile_bytes(SBITS),
                         p.x + size_t(p.T) * p.k * p.I + size_t(t) * inter, inter, true, lane, acc);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][lane][i] = acc[i];
    __syncthreads();
    if (threadIdx.x >= LQ_TILE_ROWS) return;
    const int rho = threadIdx.x, src_lane = (rho & 7) * 4, value = rho < 8 ? 0 : 2;
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < MLQ_WARPS; ++s)  // slot order; unrolled so the weights' loads go out together
        if (s < p.k) sum += __ldcg(p.weights + t * p.k + s) * partial[s][src_lane][value];
    if (p.shared.down) sum += __ldcg(p.shared.gate + t) * partial[p.k][src_lane][value];
    const size_t at = size_t(t) * p.H + strip * LQ_TILE_ROWS + rho;
    if (p.residual) p.residual[at] = residual_in + __bfloat162float(__float2bfloat16(sum));
    else p.y[at] = __float2bfloat16(sum);
}

// Calls f(integral_constant BITS, integral_constant SBITS) for runtime widths in {4, 5, 6}.
template <class F>
void with_widths(int bits, int sbits, F&& f) {
    auto inner = [&](auto b) {
        switch (sbits) {
            case 4: f(b, std::integral_constant<int, 4>{}); break;
            case 5: f(b, std::integral_constant<int, 5>{}); break;
            default: f(b, std::integral_constant<int, 6>{}); break;
        }
    };
    switch (bits) {
        case 4: inner(std::integral_constant<int, 4>{}); break;
        case 5: inner(std::integral_constant<int, 5>{}); break;
        default: inner(std::integral_constant<int, 6>{}); break;
    }
}

// static_warps: the rows of the kernel's static partial sums.
template <class Kernel>
void launch_moe_lq(const char* op, Kernel kernel, dim3 grid, int warps, int static_warps, size_t smem,
                   const MoeLqParams& p, cudaStream_t stream) {
    if (smem + sizeof(float) * static_warps * 32 * 4 > 48 * 1024) allow_dynamic_smem(kernel, smem, op);
    launch_pdl(op, kernel, grid, warps * 32, smem, stream, p);
}

void check_bits(const char* op, const char* what, int bits) {
    require(bits >= 4 && bits <= 6, op, std::string(what) + " must be 4, 5 or 6, got " + std::to_string(bits));
}

void check_moe_lq(const char* op, int bits, int T, int k, int H, int I) {
    check_bits(op, "bits", bits);
    require(T >= 1 && T <= GEMV_MAX_T, op, "T must be 1..8, got " + std::to_string(T));
    require(k >= 1 && k <= MLQ_WARPS, op, "k must be 1..8, got " + std::to_string(k));
    require(H > 0 && H % LQ_TILE_COLS == 0 && I > 0 && I % LQ_TILE_COLS == 0, op,
            "H and I must be positive multiples of 64, got " + std::to_string(H) + ", " + std::to_string(I));
}

// The launch-time view of the optional shared slot (all null when absent), checked once.
MoeSharedSlotLq shared_slot(const char* op, const MoeSharedSlotLq* shared) {
    if (!shared) return MoeSharedSlotLq{};
    require(shared->gate_up && shared->down && shared->w_gate && shared->gate, op,
            "the shared slot needs gate_up, down, w_gate and gate");
    check_bits(op, "the shared slot's gate_up_bits", shared->gate_up_bits);
    check_bits(op, "the shared slot's down_bits", shared->down_bits);
    moe_check_intermediate(op, shared->inter);
    return *shared;
}

// gate_up, reading ids or (logits set) selecting the experts.
void launch_gate_up(const char* op, MoeLqParams p, int bits, cudaStream_t stream, const MoeSharedSlotLq* shared) {
    check_moe_lq(op, bits, p.T, p.k, p.H, p.I);
    p.shared = shared_slot(op, shared);
    const bool has_shared = p.shared.gate_up != nullptr;
    const int sbits = has_shared ? p.shared.gate_up_bits : bits;
    const dim3 grid(std::max(p.I, p.shared.inter) / LQ_TILE_ROWS, p.T * (has_shared ? p.k + 1 : p.k));
    const size_t smem = lq_start_bytes(p.H) + size_t(lq_x_bytes(p.H)) + LQ_ZERO_X_BYTES;
    with_widths(bits, sbits, [&](auto b, auto sb) {
        launch_moe_lq(op, moe_lq_gate_up_kernel<decltype(b)::value, decltype(sb)::value>, grid, MLQ_WARPS,
                      MLQ_WARPS, smem, p, stream);
    });
}

// down, storing out or (residual set) adding into the residual.
void launch_down(const char* op, MoeLqParams p, int bits, cudaStream_t stream, const MoeSharedSlotLq* shared) {
    check_moe_lq(op, bits, p.T, p.k, p.H, p.I);
    p.shared = shared_slot(op, shared);
    const bool has_shared = p.shared.down != nullptr;
    const int sbits = has_shared ? p.shared.down_bits : bits, warps = has_shared ? p.k + 1 : p.k;
    const int width = std::max(p.I, p.shared.inter);
    const size_t smem = size_t(warps) * (size_t(lq_x_bytes(width)) + LQ_ZERO_X_BYTES + lq_start_bytes(width));
    with_widths(bits, sbits, [&](auto b, auto sb) {
        launch_moe_lq(op, moe_lq_down_kernel<decltype(b)::value, decltype(sb)::value>, dim3(p.H / LQ_TILE_ROWS, p.T),
                      warps, DN_MAX_WARPS, smem, p, stream);
    });
}

}  // namespace

void moe_experts_lq_gate_up(const bf16* h, const uint8_t* gate_up, int bits, const int32_t* ids, bf16* act, int T,
                            int k, int H, int I, cudaStream_t stream, const MoeSharedSlotLq* shared) {
    launch_gate_up("moe_experts_lq_gate_up",
                   {h, gate_up, const_cast<int32_t*>(ids), nullptr, nullptr, 0, act, nullptr, T, k, H, I, {}}, bits,
                   stream, shared);
}

void moe_experts_lq_gate_up_select(const bf16* h, const float* logits, int E, const uint8_t* gate_up, int bits,
                                   int32_t* ids, float* weights, bf16* act, int T, int k, int H, int I,
                                   cudaStream_t stream, const MoeSharedSlotLq* shared) {
    const char* op = "moe_experts_lq_gate_up_select";
    moe_check_experts(op, E, k);
    require(logits && ids && weights, op, "needs the router logits and the ids and weights to write");
    launch_gate_up(op, {h, gate_up, ids, weights, logits, E, act, nullptr, T, k, H, I, {}}, bits, stream, shared);
}

void moe_experts_lq_down(const bf16* act, const uint8_t* down, int bits, const int32_t* ids, const float* weights,
                         bf16* out, int T, int k, int H, int I, cudaStream_t stream, const MoeSharedSlotLq* shared) {
    launch_down("moe_experts_lq_down",
                {act, down, const_cast<int32_t*>(ids), const_cast<float*>(weights), nullptr, 0, out, nullptr, T, k, H,
                 I, {}},
                bits, stream, shared);
}

void moe_experts_lq_down_add(const bf16* act, const uint8_t* down, int bits, const int32_t* ids,
                             const float* weights, float* residual, int T, int k, int H, int I, cudaStream_t stream,
                             const MoeSharedSlotLq* shared) {
    launch_down("moe_experts_lq_down_add",
                {act, down, const_cast<int32_t*>(ids), const_cast<float*>(weights), nullptr, 0, nullptr, residual, T,
                 k, H, I, {}},
                bits, stream, shared);
}

}  // namespace lampo
