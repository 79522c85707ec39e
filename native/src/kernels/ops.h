// ops.h - the contract between Lampo's CUDA kernels and the layer loop.
//
// Every op family lives in its own .cu file (named after the family) whose header comment states
// shapes, dtypes and the formula; each launcher below is checked against the numpy reference by a
// `cuda`-marked test through the `lampo._native_ops` bindings (op_tests/).
//
// Conventions
// - bf16 is __nv_bfloat16; activations are row-major [T, width] bf16 unless stated; the residual
//   stream is fp32 [T, H] (more accurate than the bf16 HF stream; the fp32 reference is the oracle).
// - Weights are HF layout [out, in] (row-major, `in` contiguous) behind the `Linear` seam.
// - Launchers are asynchronous on `stream`, never synchronise, never allocate, and are safe to
//   capture in a CUDA graph. Values that change from one decode step to the next (positions,
//   lengths, token ids) are read from DEVICE memory (pointers named d_*), so a captured graph
//   replays correctly for every step.
// - Launch errors are raised by the caller with LAMPO_CHECK_LAUNCH("op name") (common.cuh).
// - The kernels of the decode path go out through launch_pdl (launch_utils.cuh, programmatic
//   dependent launch on sm_90+) and begin with pdl_begin() (common.cuh): a kernel may start
//   launching while its predecessor in the stream still runs, but waits for it before touching
//   memory, so stream order keeps its usual meaning for every caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/linear.h"

namespace lampo {

using bf16 = __nv_bfloat16;

// ---- embedding.cu ------------------------------------------------------------------------
// out[t, :] = table[ids[t], :]                       table [V, H] bf16, ids [T] int32 (device)
void embedding_gather(const bf16* table, const int32_t* d_ids, float* out_residual, int T, int H,
                      cudaStream_t stream);
// The same from a table in the LQ format ([V, H] at `bits`, V % 16 == 0, H % 64 == 0).
void embedding_gather_lq(const uint8_t* table, int bits, const int32_t* d_ids, float* out_residual, int T, int H,
                         cudaStream_t stream);

// ---- rmsnorm.cu ---------------------------------------------------------------------------
// Zero-centred RMSNorm: y = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)), statistics in fp32.
// x [rows, n] fp32 or bf16 ; w [n] bf16 ; y [rows, n] bf16, its rows ldy apart (0: n; a multiple
// of 4).  Used for layer norms (n = H) and per-head q/k norms are done inside attn_prep.
void rmsnorm(const float* x, const bf16* w, bf16* y, int rows, int n, float eps, cudaStream_t stream, int ldy = 0);
// residual[t] += delta[t] (fp32 add of a bf16 delta), then y[t] = rmsnorm(residual[t]) as above.
// Fuses the residual add of one sub-block with the pre-norm of the next. set: residual[t] = 0 +
// delta[t] instead, whatever it held (the same bits as on a zeroed residual, without zeroing it).
void add_rmsnorm(float* residual, const bf16* delta, const bf16* w, bf16* y, int rows, int n,
                 float eps, cudaStream_t stream, int ldy = 0, bool set = false);
// residual[t] += delta[t] without a norm (used for the last add before the final norm).
void residual_add(float* residual, const bf16* delta, int rows, int n, cudaStream_t stream);

// ---- attention_prep.cu ---------------------------------------------------------------------
// INT8 KV cache, one fp16 scale per group of 64 values (symmetric, scale = max|x|/127, q =
// clip(rint(x / scale), -127, 127); bit-exact with kv_int8.quantize_int8_g64), each q stored offset
// binary as the byte q + 128, which the readers' fp16 conversion (0x6400 | byte = 1152 + q) takes
// as it is:
//   cache  [nkv, context_max, D] uint8 ; scales [nkv, context_max, D/64] fp16
constexpr int KV_GROUP = 64;
struct KvAppendTarget {
    const bf16* v = nullptr;       // [T, nkv, D] the new value rows
    uint8_t* k_cache = nullptr;
    uint8_t* v_cache = nullptr;
    half* k_scale = nullptr;
    half* v_scale = nullptr;
    int context_max = 0;           // rows at positions >= context_max are not written
};
// Gated attention input prep for T tokens at positions d_pos[0] + t:
//   qg [T, nq*2*D]: per head h, rows [h*2D, h*2D+D) are the query, [h*2D+D, h*2D+2D) the gate.
//   q   = rope(rmsnorm1p(query_h, q_norm_w))  -> q_out [T, nq, D] bf16
//   gate = gate_h                             -> gate_out [T, nq*D] bf16 (not normed, not roped)
//   k   = rope(rmsnorm1p(k_raw_h, k_norm_w))  -> k_out [T, nkv, D] bf16 (k_raw [T, nkv*D]; optional
//         when `append` is given)
// rope: NeoX half-split over the first rotary_dim dims, inv_freq[i] = theta^(-2i/rotary_dim),
//   angle = pos * inv_freq[i] in fp32; dims >= rotary_dim untouched.
// With `append`: the bf16 k rows and append->v are quantized into the INT8 cache at rows
// d_pos[0] + t of every kv head (D a multiple of 64). nq = 0 (with `append`): the key and value
// rows alone, for the cache (qg, q_norm_w, q_out and gate_out unused).
void attn_prep(const bf16* qg, const bf16* k_raw, const bf16* q_norm_w, const bf16* k_norm_w,
               const int32_t* d_pos, bf16* q_out, bf16* gate_out, bf16* k_out, int T, int nq,
               int nkv, int D, int rotary_dim, float theta, float eps, cudaStream_t stream,
               const KvAppendTarget* append = nullptr);

// ---- attention_decode.cu -------------------------------------------------------------------
// Flash-decoding over the INT8 cache for Tq <= 8 query rows at positions d_pos[0] + t (row t sees
// cache rows [0, d_pos[0] + t], i.e. causal inside the window; the window's own K/V rows must
// already be appended). q [Tq, nq, D] bf16 -> out [Tq, nq*D] bf16, multiplied by sigmoid(gate)
// (gate [Tq, nq*D] bf16). Scale 1/sqrt(D), softmax in fp32. Query head h reads kv head h/(nq/nkv).
// The sequence is split across SMs; `partial` is scratch of attn_decode_partial_floats() floats.
size_t attn_decode_partial_floats(int Tq, int nq, int nkv, int D, int context_max);
void attn_decode_int8(const bf16* q, const bf16* gate, const uint8_t* k_cache, const uint8_t* v_cache,
                      const half* k_scale, const half* v_scale, const int32_t* d_pos, bf16* out,
                      float* partial, int Tq, int nq, int nkv, int D, int context_max, cudaStream_t stream);

// ---- attention_prefill.cu ------------------------------------------------------------------
// Flash-style causal attention for a prefill chunk of T rows at positions pos0 .. pos0+T-1 over
// cache rows [0, pos0 + t] (the chunk's rows already appended). Same I/O and gating as decode;
// no score matrix is materialised. pos0 is a host int (prefill is not graph-captured).
void attn_prefill_int8(const bf16* q, const bf16* gate, const uint8_t* k_cache,
                       const uint8_t* v_cache, const half* k_scale, const half* v_scale, int pos0,
                       bf16* out, int T, int nq, int nkv, int D, int context_max, cudaStream_t stream);

// ---- Gated DeltaNet states ----------------------------------------------------------------
// A GDN layer's recurrent and conv states as a ring of `slots` slots: the state before the token at
// position p is slot p % slots. A call over T tokens at position pos (read from the device) reads
// slot pos % slots and writes the state after its last token to slot (pos + T) % slots; with rows
// (a speculative verify window) it writes the state after every token t to slot (pos + 1 + t) %
// slots, so T must be below `slots`, and keeping the window's first n tokens is just the position
// pos + n: no copy. slots = 1 is a single state updated in place (pos is then never read).
// With `records` (the recurrent kernels, rows): the window writes no recurrent state at all, and
// each token t leaves its record instead, from which gdn_replay rebuilds the state after any token
// of the window, bit for bit (the conv state still goes to its slot after every token). So the
// recurrent state may have fewer slots than the conv state (`recurrent_slots`; the engine's is one
// state, updated in place: every call's blocks read their slice before they write it).
struct GdnStates {
    float* recurrent = nullptr;   // [slots, Hv, 128, 128] fp32, S[j][i][m]
    bf16* conv = nullptr;         // [slots, C, K-1] bf16, oldest column first
    int slots = 1;
    const int32_t* pos = nullptr;  // [1] device: position of the call's first token
    float* records = nullptr;     // [GEMV_MAX_T, gdn_record_floats(Hk, Hv)] fp32, or null
    int recurrent_slots = 0;      // the recurrent state's ring (slot p % recurrent_slots); 0: `slots`
};

// A token's record, per layer: k [Hk, 128] (the l2-normed key), u [Hv, 128] (beta * e, the update's
// value side) and the decays exp(g) [Hv], padded to 4 floats: the token's step is
// S[j] = decay[j] * S[j] + k[j / (Hv / Hk)] u[j]^T, the product and the sum as the kernels round them.
__host__ __device__ inline int gdn_record_floats(int Hk, int Hv) { return (Hk + Hv) * 128 + (Hv + 3) / 4 * 4; }

// The recurrent state after token keep - 1 of a window that left records (GdnStates::records): read
// at slot pos % slots, the first `keep` records applied in order, written to slot (pos + keep) %
// slots (the same slot when slots = 1: each thread reads its part before it writes it); for
// `layers` layers at once, layer l's states at recurrent + l * layer_pitch (bytes) and its
// records at records + l * records_pitch (bytes). The values the window's tokens computed, bit for
// bit. keep in 1..GEMV_MAX_T.
struct GdnReplay {
    float* recurrent = nullptr;
    size_t layer_pitch = 0;
    const float* records = nullptr;
    size_t records_pitch = 0;
    int layers = 0, slots = 1, pos = 0, keep = 0, Hk = 0, Hv = 0;
};
void gdn_replay(const GdnReplay& r, cudaStream_t stream);

// ---- conv1d.cu -----------------------------------------------------------------------------
// Causal depthwise conv (kernel K, no bias) + SiLU over T tokens, continuing from the conv state:
//   x [T, C] bf16 pre-conv ; w [C, K] bf16 ; state [C, K-1] bf16 (states.conv, GdnStates' slots)
//   y[t, c] = silu(sum_j w[c, j] * xin[c, t - (K-1) + j]),  xin = state || x
//   afterwards state = last K-1 columns of xin. T = 1 is the decode step.
//   rows (T <= 64, T < slots: a verify window): the state after each token in its slot.
void causal_conv1d_silu(const bf16* x, const bf16* w, const GdnStates& states, bf16* y, int T, int C, int K,
                        cudaStream_t stream, bool rows = false);

// ---- gated_delta_rule_recurrent.cu, gated_delta_rule_chunked.cu -----------------------------
// Gated DeltaNet core over T tokens, continuing from the state [Hv, dk, dv] fp32 (S[j][i][m],
// states.recurrent, GdnStates' slots).
//   qkv [T, 2*Hk*dk + Hv*dv] bf16 (post-conv: q | k | v) ; a, b [T, Hv] bf16 ;
//   A_log, dt_bias [Hv] fp32.  Per token t and V head j (QK head j / (Hv/Hk)):
//   g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)     (fp32)
//   q = l2norm(q) / sqrt(dk); k = l2norm(k)                        (eps 1e-6 inside rsqrt)
//   S = exp(g) S; e = v - S^T k; S += k (beta e)^T; o = S^T q       -> o [T, Hv, dv] bf16
// recurrent: the token loop (decode, T small); with rows the state after every token in its slot.
// chunked: the WY form with chunk 64 (prefill), numerically the same function.
void gated_delta_rule_recurrent(const bf16* qkv, const bf16* a, const bf16* b, const float* A_log,
                                const float* dt_bias, const GdnStates& states, bf16* o, bool rows,
                                int T, int Hk, int Hv, int dk, int dv, cudaStream_t stream);
// A Gated DeltaNet layer's few-token step in one launch (decode, verify windows): causal conv + SiLU
// of the pre-conv rows qkv [T, 2*Hk*128 + Hv*128] (conv_w [C, K]), the gated delta rule, and the
// gated RMSNorm with z [T, Hv*128], norm_w [128] -> y [T, Hv*128]; both states continue from and go
// to `states` as above, with rows too. The same numbers as causal_conv1d_silu,
// gated_delta_rule_recurrent and gated_rmsnorm in sequence. counters: Hk unsigned, 0 before the
// call and 0 again after it. T <= GEMV_MAX_T; K in {2, 3, 4}; dk = dv = 128. Needs thread block clusters:
// gdn_decode_fused_available() (sm_90+).
bool gdn_decode_fused_available();
void gdn_decode_fused(const bf16* qkv, const bf16* conv_w, const bf16* a, const bf16* b, const float* A_log,
                      const float* dt_bias, const GdnStates& states, const bf16* z, const bf16* norm_w, bf16* y,
                      unsigned* counters, bool rows, int T, int Hk, int Hv, int dk, int dv, int K, float eps,
                      cudaStream_t stream);
size_t gdn_chunked_workspace_bytes(int T, int Hv, int dk, int dv);
void gated_delta_rule_chunked(const bf16* qkv, const bf16* a, const bf16* b, const float* A_log,
                              const float* dt_bias, const GdnStates& states, bf16* o, void* workspace, int T,
                              int Hk, int Hv, int dk, int dv, cudaStream_t stream);

// ---- gated_rmsnorm.cu ----------------------------------------------------------------------
// Per V head: y = w * bf16(rmsnorm(o)) * silu(z)  (plain w, no +1), fp32 math.
//   o [T, Hv, dv] bf16 ; z [T, Hv*dv] bf16 ; w [dv] bf16 -> y [T, Hv*dv] bf16
void gated_rmsnorm(const bf16* o, const bf16* z, const bf16* w, bf16* y, int T, int Hv, int dv,
                   float eps, cudaStream_t stream);

// ---- activation.cu -------------------------------------------------------------------------
// SwiGLU activation: gu [T, 2I] (gate | up) -> y [T, I] = silu(gate) * up; interleaved: gu's rows
// come from a gate|up block kept with its halves' rows interleaved by 8 (activation.cu).
void silu_mul(const bf16* gu, bf16* y, int T, int I, cudaStream_t stream, bool interleaved = false);
// Attention output gate for the prefill path when not fused: y = x * sigmoid(gate), [T, n].
void sigmoid_gate_mul(const bf16* x, const bf16* gate, bf16* y, int T, int n, cudaStream_t stream);

// ---- moe_router.cu, moe_experts.cu, moe_prefill.cu, moe_shared_combine.cu -------------------
// Limits: E <= 512, k <= 16, H a multiple of 64, I a multiple of 64.
// Router: logits = h @ Wr^T in fp32 (h [T, H] bf16, Wr [E, H] bf16); p = softmax(logits);
//   top-k (ties -> lower id), weights renormalised to sum 1 -> ids [T, k] int32, w [T, k] fp32.
//   `logits` [T, E] fp32 is caller-provided scratch (the logits are left there): the GEMV is
//   spread over many blocks, and the top-k launch that follows reads it.
//   Two launches (logits, then top-k).
void moe_router_topk(const bf16* h, const bf16* w_router, float* logits, int32_t* ids,
                     float* weights, int T, int H, int E, int k, cudaStream_t stream);
// Routed experts for few tokens (decode / verify, T <= MOE_DECODE_MAX_T), two launches:
//   act[t, s, :]  = silu(h_t @ Wg[e]^T) * (h_t @ Wu[e]^T), e = ids[t, s]
//                   gate_up [E, 2I, H] bf16 (rows 0..I-1 gate, I..2I-1 up) -> act [T, k, I] bf16
//   out[t, :]     = sum_s w[t, s] * (act[t, s] @ Wd[e]^T)   down [E, H, I] bf16 -> out [T, H] bf16
// With `shared` (optional; nullptr: routed experts only, the caller adds the shared expert through
// moe_shared_combine) the shared expert rides along as a (k+1)-th slot of both launches:
//   gate_up also writes act_s[t, :] = silu(h_t @ Sg^T) * (h_t @ Su^T) at act + T*k*I (act is then
//           [T, k, I] followed by [T, Is]) and shared->gate[t] = sigmoid(h_t . w_gate);
//   down    adds shared->gate[t] * (act_s[t] @ Sd^T) to the same fp32 sum before the one rounding,
//   so out = the whole MoE block (moe_shared_combine is not needed). Is a multiple of 64.
constexpr int MOE_DECODE_MAX_T = 8;
struct MoeSharedSlot {
    const bf16* gate_up = nullptr;  // [2 Is, H] bf16 (rows 0..Is-1 gate, Is..2Is-1 up)
    const bf16* down = nullptr;     // [H, Is] bf16
    const bf16* w_gate = nullptr;   // [H] bf16
    float* gate = nullptr;          // [T] fp32 scratch: written by gate_up, read by down
    int inter = 0;                  // Is
};
void moe_experts_gate_up(const bf16* h, const bf16* gate_up, const int32_t* ids, bf16* act, int T,
                         int k, int H, int I, cudaStream_t stream,
                         const MoeSharedSlot* shared = nullptr);
void moe_experts_down(const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                      bf16* out, int T, int k, int H, int I, cudaStream_t stream,
                      const MoeSharedSlot* shared = nullptr);
// The decode step's forms (the top-k launch and the residual add folded in):
//   gate_up_select: the same act, with the experts selected inside the launch from the router
//     logits [T, E] fp32 exactly as moe_router_topk does; ids [T, k] and weights [T, k] written.
//   down_add: residual[t, :] += float(out[t, :]) instead of storing out (residual [T, H] fp32).
void moe_experts_gate_up_select(const bf16* h, const float* logits, int E, const bf16* gate_up,
                                int32_t* ids, float* weights, bf16* act, int T, int k, int H, int I,
                                cudaStream_t stream, const MoeSharedSlot* shared = nullptr);
void moe_experts_down_add(const bf16* act, const bf16* down, const int32_t* ids, const float* weights,
                          float* residual, int T, int k, int H, int I, cudaStream_t stream,
                          const MoeSharedSlot* shared = nullptr);
// The same gate_up and down for T <= 8 with the banks in the LQ format (moe_experts_lq.cu;
// kernels/lq_tile.cuh): expert e's [2I, H] / [H, I] tiles at e * lq_packed_bytes(rows, cols, bits),
// bits in {4, 5, 6}, k <= 8, H and I multiples of 64; and their decode-step forms
// (moe_experts_lq_gate_up_select, moe_experts_lq_down_add: as moe_experts_gate_up_select /
// moe_experts_down_add, the same selection bits). `shared` (optional): the shared expert as slot k
// of both launches, its matrices in the LQ format at their own widths, with the function of
// MoeSharedSlot (act then [T, k, I] followed by [T, Is]; gate written by gate_up, read by down).
struct MoeSharedSlotLq {
    const uint8_t* gate_up = nullptr;  // [2 Is, H] LQ tiles (rows 0..Is-1 gate, Is..2Is-1 up)
    int gate_up_bits = 0;
    const uint8_t* down = nullptr;     // [H, Is] LQ tiles
    int down_bits = 0;
    const bf16* w_gate = nullptr;      // [H] bf16
    float* gate = nullptr;             // [T] fp32 scratch: written by gate_up, read by down
    int inter = 0;                     // Is
};
void moe_experts_lq_gate_up(const bf16* h, const uint8_t* gate_up, int bits, const int32_t* ids, bf16* act, int T,
                            int k, int H, int I, cudaStream_t stream, const MoeSharedSlotLq* shared = nullptr);
void moe_experts_lq_down(const bf16* act, const uint8_t* down, int bits, const int32_t* ids, const float* weights,
                         bf16* out, int T, int k, int H, int I, cudaStream_t stream,
                         const MoeSharedSlotLq* shared = nullptr);
void moe_experts_lq_gate_up_select(const bf16* h, const float* logits, int E, const uint8_t* gate_up, int bits,
                                   int32_t* ids, float* weights, bf16* act, int T, int k, int H, int I,
                                   cudaStream_t stream, const MoeSharedSlotLq* shared = nullptr);
void moe_experts_lq_down_add(const bf16* act, const uint8_t* down, int bits, const int32_t* ids,
                             const float* weights, float* residual, int T, int k, int H, int I, cudaStream_t stream,
                             const MoeSharedSlotLq* shared = nullptr);
// Routed experts for a prefill chunk (T large): tokens grouped by expert, one grouped GEMM per
// projection. workspace of moe_prefill_workspace_bytes(). Same function as the two above.
size_t moe_prefill_workspace_bytes(int T, int k, int H, int I, int E);
void moe_experts_prefill(const bf16* h, const bf16* gate_up, const bf16* down, const int32_t* ids,
                         const float* weights, bf16* out, void* workspace, int T, int k, int H,
                         int I, int E, cudaStream_t stream);
// The same with the banks in the LQ format (moe_prefill_lq.cu), as moe_experts_lq_*: expert e's
// [2I, H] / [H, I] tiles at e * lq_packed_bytes(rows, cols, bits), bits in {4, 5, 6}; the grouped
// GEMMs read the tiles directly (gemm_lq_grouped, matmul.cuh). The same workspace.
void moe_experts_prefill_lq(const bf16* h, const uint8_t* gate_up, int gate_up_bits, const uint8_t* down,
                            int down_bits, const int32_t* ids, const float* weights, bf16* out, void* workspace,
                            int T, int k, int H, int I, int E, cudaStream_t stream);
// out[t] = routed[t] + sigmoid(h_t . w_gate) * shared[t]      (w_gate [H] bf16; all [T, H] bf16)
void moe_shared_combine(const bf16* routed, const bf16* shared, const bf16* h, const bf16* w_gate,
                        bf16* out, int T, int H, cudaStream_t stream);

// ---- sampling.cu ---------------------------------------------------------------------------
// On-GPU sampling of one token from logits [V] fp32 (ids >= v_real are masked to -inf first).
// Order: presence penalty (logit -= penalty for every id with seen[id] != 0), temperature,
// top-k, top-p, min-p, then a draw from a counter-based RNG keyed by (seed, d_step[0]).
// temperature <= 0 -> argmax (ties -> lower id), one launch. Writes the id to d_out[0] and sets
// seen[id] = 1 and d_step[0] += 1. `scratch` holds sampling_scratch_bytes(V), zeroed once before
// the first call (the greedy launch leaves its counters at 0 again); logits 16-byte aligned.
struct SamplingConfig {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    float presence_penalty;
    uint64_t seed;
};
inline bool same_sampling(const SamplingConfig& a, const SamplingConfig& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p &&
           a.presence_penalty == b.presence_penalty && a.seed == b.seed;
}
size_t sampling_scratch_bytes(int V);
void sample_token(const float* logits, int V, int v_real, const SamplingConfig& cfg,
                  uint8_t* seen, int32_t* d_step, int32_t* d_out, void* scratch,
                  cudaStream_t stream);
// Speculative sampling with drafts drawn from their own distribution q (temperature > 0):
// - sample_draft draws a draft as sample_token draws a token (the presence penalty from `seen`,
//   which it does not mark; its own RNG stream, seed ^ DRAFT_RNG_STREAM, keyed by d_draft_step[0],
//   which it advances) and writes q, the filtered distribution it drew from;
// - sample_verify_row, for a verify row whose draft d_draft[0] was drawn from q: keeps the draft
//   with probability min(1, p(d) / q(d)) (p: the row's filtered distribution, as sample_token's),
//   else draws from max(0, p - q) renormalised, so the token is distributed as p; marks and steps
//   as sample_token. The token equals the draft exactly when the draft is kept.
// q: the kept candidates in ascending id order, at most SAMPLE_MAX_K of them.
constexpr int SAMPLE_MAX_K = 1024;
constexpr uint64_t DRAFT_RNG_STREAM = 0x6a09e667f3bcc908ull;
struct DraftDistribution {
    int32_t* count = nullptr;  // [1]
    int32_t* ids = nullptr;    // [SAMPLE_MAX_K]
    float* probs = nullptr;    // [SAMPLE_MAX_K]
};
// One distribution laid out from `base` (DRAFT_DISTRIBUTION_BYTES of device memory).
constexpr size_t DRAFT_DISTRIBUTION_BYTES = 16 + size_t(SAMPLE_MAX_K) * 8;
inline DraftDistribution draft_distribution_at(void* base) {
    char* p = static_cast<char*>(base);
    return {reinterpret_cast<int32_t*>(p), reinterpret_cast<int32_t*>(p + 16),
            reinterpret_cast<float*>(p + 16 + size_t(SAMPLE_MAX_K) * 4)};
}
void sample_draft(const float* logits, int V, int v_real, const SamplingConfig& cfg, const uint8_t* seen,
                  int32_t* d_draft_step, int32_t* d_out, const DraftDistribution& q, void* scratch,
                  cudaStream_t stream);
void sample_verify_row(const float* logits, int V, int v_real, const SamplingConfig& cfg, uint8_t* seen,
                       int32_t* d_step, const int32_t* d_draft, const DraftDistribution& q, int32_t* d_out,
                       void* scratch, cudaStream_t stream);
// Row-wise argmax of logits [T, V] (ids >= v_real masked) -> d_out [T] (speculative verify).
void argmax_rows(const float* logits, int T, int V, int v_real, int32_t* d_out, cudaStream_t stream);

}  // namespace lampo
