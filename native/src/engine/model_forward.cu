// model_forward.cu - the layer loop, top to bottom:
//
//   embedding -> for each layer: pre-norm, mixer (Gated DeltaNet or gated attention), residual add
//   + post-norm, FFN (SwiGLU or MoE), residual add + next pre-norm -> final norm -> LM head.
//
// The residual stream is fp32 [T, H]; `add_rmsnorm` fuses each residual add with the norm that
// follows it, except in the decode step (T = 1, DecodeFusion::Norms), where each block's input
// projection builds its normed row from the residual itself and each output projection adds into
// the residual: no norm launches between the blocks (input_projection / output_projection). A
// dense model in the LQ format carries those norms in halves instead, in decode steps and verify
// windows alike (linear.h Prenorm): the output projection leaves the next block's prenormed rows
// and strip sums of squares, the input projection scales its sums by the norm's factor.
// T <= GEMV_MAX_T (decode, verify windows) takes the GEMV / recurrent / flash-decoding
// paths that read positions from device memory (graph-capturable); larger T (prefill chunks) takes
// the GEMM / chunked GDN / flash prefill / grouped-MoE paths. Every launch is checked with its op
// name, so a failure surfaces as CudaError("<op>: ...").
//
// Over 500 lines on purpose: the whole forward pass in one order, so that decode and prefill paths
// of each block sit side by side; the kernels it calls live under kernels/.
#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "engine/model.h"

namespace lampo {

// ---- ModelDims -----------------------------------------------------------------------------
int ModelDims::count(MixerKind k) const {
    int n = 0;
    for (MixerKind m : mixers) n += (m == k);
    return n;
}

void ModelDims::validate() const {
    auto need = [](bool ok, const std::string& what) {
        if (!ok) throw std::invalid_argument("model config: " + what);
    };
    need(hidden > 0 && hidden % 64 == 0, "hidden_size must be a positive multiple of 64");
    need(!mixers.empty(), "num_hidden_layers must be positive");
    need(vocab > 0 && vocab_real > 0 && vocab_real <= vocab, "vocab sizes are inconsistent");
    if (count(MixerKind::GatedAttention)) {
        need(n_q_heads > 0 && n_kv_heads > 0 && n_q_heads % n_kv_heads == 0,
             "num_attention_heads must be a positive multiple of num_key_value_heads");
        need(head_dim > 0 && head_dim % KV_GROUP == 0, "head_dim must be a multiple of 64");
        need(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, "bad rotary dim");
    }
    if (count(MixerKind::GatedDeltaNet)) {
        need(gdn_k_heads > 0 && gdn_v_heads % gdn_k_heads == 0,
             "linear_num_value_heads must be a multiple of linear_num_key_heads");
        need(gdn_k_dim > 0 && gdn_v_dim > 0 && conv_kernel >= 2, "bad Gated DeltaNet dims");
    }
    if (moe) {
        need(n_experts > 0 && top_k > 0 && top_k <= n_experts && expert_inter > 0 && shared_inter > 0,
             "MoE sizes (num_experts, num_experts_per_tok, moe/shared intermediate) must be positive");
    } else {
        need(ffn_inter > 0, "intermediate_size must be positive");
    }
}

// ---- workspace -----------------------------------------------------------------------------
size_t WorkspaceLayout::total() const {
    size_t t = 0;
    for (const auto& b : buffers) t += (b.second + 255) / 256 * 256;
    return t;
}

WorkspaceLayout workspace_layout(const ModelDims& d, int max_tokens, int context_max, int logit_rows, bool mtp) {
    const size_t T = size_t(max_tokens), H = size_t(d.hidden), b16 = 2;
    const bool attn = d.count(MixerKind::GatedAttention) > 0;
    const bool gdn = d.count(MixerKind::GatedDeltaNet) > 0;
    const size_t fused_w = std::max(attn ? size_t(d.attn_qkv_rows()) : 0, gdn ? size_t(d.gdn_in_rows()) : 0);
    const size_t proj_w = std::max(fused_w, size_t(2 * (d.moe ? d.shared_inter : d.ffn_inter)));
    const size_t mixed_w = std::max(size_t(d.attn_width()), size_t(d.gdn_value_width()));
    const size_t act_rows = std::max(T * size_t(d.moe ? d.shared_inter : d.ffn_inter),
                                     d.moe ? size_t(MOE_DECODE_MAX_T) * (size_t(d.top_k) * d.expert_inter +
                                                                          d.shared_inter) : 0);
    const int k = d.moe ? d.top_k : 0;
    WorkspaceLayout l;
    l.buffers = {
        {"residual", T * H * 4},
        {"normed", T * H * b16},
        {"norm_squares", T * (H / PRENORM_STRIP) * 4},
        {"fused", T > 1 ? T * fused_w * b16 : 0},
        {"proj", T * proj_w * b16},
        {"q", T * d.attn_width() * b16},
        {"gate", T * d.attn_width() * b16},
        {"mixed", T * mixed_w * b16},
        {"conv_out", T * d.conv_channels() * b16},
        {"gdn_o", T * d.gdn_value_width() * b16},
        {"act", act_rows * b16},
        {"delta", T * H * b16},
        {"routed", d.moe ? T * H * b16 : 0},
        {"shared", d.moe ? T * H * b16 : 0},
        {"router_logits", d.moe ? T * d.n_experts * 4 : 0},
        {"gdn_counters", gdn ? size_t(d.gdn_k_heads) * 4 : 0},
        {"expert_ids", T * k * 4},
        {"expert_weights", T * k * 4},
        {"shared_gate", d.moe ? T * 4 : 0},
        {"gdn_chunked", gdn ? gdn_chunked_workspace_bytes(max_tokens, d.gdn_v_heads, d.gdn_k_dim,
                                                          d.gdn_v_dim) : 0},
        {"moe_prefill", d.moe ? moe_prefill_workspace_bytes(max_tokens, d.top_k, d.hidden,
                                                            d.expert_inter, d.n_experts) : 0},
        {"attn_partial", attn ? attn_decode_partial_floats(GEMV_MAX_T, d.n_q_heads, d.n_kv_heads, d.head_dim,
                                                           context_max) * 4 : 0},
        {"logits", size_t(std::max(logit_rows, 1)) * d.vocab * 4},
        {"sampling_scratch", sampling_scratch_bytes(d.vocab)},
        {"mtp_in", mtp ? T * 2 * H * b16 : 0},
    };
    return l;
}

Workspace carve_workspace(const ModelDims& d, int max_tokens, int context_max, int logit_rows, bool mtp,
                          void* base) {
    const WorkspaceLayout l = workspace_layout(d, max_tokens, context_max, logit_rows, mtp);
    char* p = static_cast<char*>(base);
    std::vector<void*> ptr;
    for (const auto& b : l.buffers) {
        ptr.push_back(b.second ? p : nullptr);
        p += (b.second + 255) / 256 * 256;
    }
    Workspace ws;
    ws.max_tokens = max_tokens;
    ws.logit_rows = std::max(logit_rows, 1);
    size_t i = 0;
    ws.residual = static_cast<float*>(ptr[i++]);
    ws.normed = static_cast<bf16*>(ptr[i++]);
    ws.norm_squares = static_cast<float*>(ptr[i++]);
    ws.fused = static_cast<bf16*>(ptr[i++]);
    ws.proj = static_cast<bf16*>(ptr[i++]);
    ws.q = static_cast<bf16*>(ptr[i++]);
    ws.gate = static_cast<bf16*>(ptr[i++]);
    ws.mixed = static_cast<bf16*>(ptr[i++]);
    ws.conv_out = static_cast<bf16*>(ptr[i++]);
    ws.gdn_o = static_cast<bf16*>(ptr[i++]);
    ws.act = static_cast<bf16*>(ptr[i++]);
    ws.delta = static_cast<bf16*>(ptr[i++]);
    ws.routed = static_cast<bf16*>(ptr[i++]);
    ws.shared = static_cast<bf16*>(ptr[i++]);
    ws.router_logits = static_cast<float*>(ptr[i++]);
    ws.gdn_counters = static_cast<unsigned*>(ptr[i++]);
    ws.expert_ids = static_cast<int32_t*>(ptr[i++]);
    ws.expert_weights = static_cast<float*>(ptr[i++]);
    ws.shared_gate = static_cast<float*>(ptr[i++]);
    ws.gdn_chunked = ptr[i++];
    ws.moe_prefill = ptr[i++];
    ws.attn_partial = static_cast<float*>(ptr[i++]);
    ws.logits = static_cast<float*>(ptr[i++]);
    ws.sampling_scratch = ptr[i++];
    ws.mtp_in = static_cast<bf16*>(ptr[i++]);
    return ws;
}

// ---- profiling -----------------------------------------------------------------------------
const char* op_family_name(OpFamily f) {
    static const char* names[] = {"embedding", "norms", "attention_prep", "attention",
                                  "gdn_conv", "gdn_rule", "gated_norm", "projections",
                                  "activations", "moe_router", "moe_experts", "lm_head",
                                  "sampling"};
    return names[int(f)];
}

OpTimer::~OpTimer() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

cudaEvent_t OpTimer::next_event() {
    if (used_ == pool_.size()) {
        cudaEvent_t e;
        LAMPO_CUDA_CHECK(cudaEventCreate(&e));
        pool_.push_back(e);
    }
    return pool_[used_++];
}

void OpTimer::begin(OpFamily f) {
    marks_.emplace_back(f, used_);
    LAMPO_CUDA_CHECK(cudaEventRecord(next_event(), stream_));
}

void OpTimer::end() { LAMPO_CUDA_CHECK(cudaEventRecord(next_event(), stream_)); }

void OpTimer::collect() {
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (const auto& [family, start] : marks_) {
        float ms = 0.f;
        LAMPO_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[start], pool_[start + 1]));
        total_ms_[size_t(family)] += ms;
    }
    marks_.clear();
    used_ = 0;
}

// ---- the loop ------------------------------------------------------------------------------
namespace {

// Everything one forward call needs, so the sub-blocks below read like the model's math.
struct Ctx {
    const ModelDims& d;
    const ModelWeights& w;
    const Workspace& ws;
    const ForwardStep& step;
    cudaStream_t st;
    OpTimer* timer;
    bool fold;     // the decode step with its norms and residual adds folded into the projections
    bool prenorm;  // the norms between blocks carried in halves (linear.h Prenorm; T <= GEMV_MAX_T)

    // Runs one op (any launcher call), times it under `family` and checks its launch.
    template <class F>
    void op(OpFamily family, const char* name, F&& launch) const {
        if (op_family_omitted(family)) return;
        if constexpr (timeline_built()) timeline_note_op(name);
        if (timer) timer->begin(family);
        launch();
        LAMPO_CHECK_LAUNCH(name);
        if (timer) timer->end();
    }
    bool small() const { return step.T <= GEMV_MAX_T; }
    bool small_moe() const { return step.T <= MOE_DECODE_MAX_T; }
    bool folded() const { return fold; }
};

// The norms around one block: of its input (`in`; `in_prenormed`: that input is the prenormed rows
// in ws.normed) and, carrying norms in halves, the next block's (`next`), which its output
// projection prepares.
struct BlockNorms {
    const bf16* in = nullptr;
    bool in_prenormed = false;
    const bf16* next = nullptr;
};

PrenormedRows prenormed_rows(const Ctx& c) { return {c.ws.normed, c.ws.norm_squares, c.d.eps}; }

// A block's input projection y = W @ normed input: reads ws.normed, or, folded, builds the normed
// row from the residual stream itself, or scales the product of the prenormed rows.
void input_projection(const Ctx& c, const Linear& W, const BlockNorms& norms, bf16* y, const char* name) {
    if (norms.in_prenormed) {
        c.op(OpFamily::Projections, name,
             [&] { linear_forward_prenormed(W, prenormed_rows(c), y, {}, c.step.T, c.st); });
    } else if (c.folded()) {
        c.op(OpFamily::Projections, name,
             [&] { linear_forward_normed(W, {c.ws.residual, norms.in, c.d.eps}, y, c.st); });
    } else {
        c.op(OpFamily::Projections, name, [&] { linear_forward(W, c.ws.normed, y, c.step.T, c.st); });
    }
}

// A block's output projection: into ws.delta (the next add_rmsnorm adds it), or, folded, straight
// into the residual stream, or into it with the next block's prenormed rows.
void output_projection(const Ctx& c, const Linear& W, const bf16* x, const BlockNorms& norms, const char* name) {
    if (c.prenorm) {
        c.op(OpFamily::Projections, name, [&] {
            linear_forward_add_residual_prenorm(W, x, c.ws.residual, {norms.next, c.ws.normed, c.ws.norm_squares},
                                                c.step.T, c.st);
        });
    } else if (c.folded()) {
        c.op(OpFamily::Projections, name, [&] { linear_forward_add_residual(W, x, c.ws.residual, c.st); });
    } else {
        c.op(OpFamily::Projections, name, [&] { linear_forward(W, x, c.ws.delta, c.step.T, c.st); });
    }
}

// A fused projection whose output is used as separate parts (its rows: the parts, then zero
// padding). Part i of T rows ends up contiguous as [T, width_i] at proj + T * (sum of the widths
// before it). With T == 1 that is exactly one row of the fused product, so one GEMV over the fused
// matrix writes every part in place; a verify window (T <= GEMV_MAX_T) has the GEMV store each
// part where it goes (RowParts); a prefill chunk's product writes ws.fused [T, padded rows] and a
// strided copy per part gathers its columns. The input is the block's normed input (norms).
template <size_t N>
std::array<bf16*, N> project_parts(const Ctx& c, const Linear& fused, const std::array<int, N>& widths,
                                   const BlockNorms& norms, const char* name) {
    std::array<bf16*, N> out{};
    const int T = c.step.T;
    int row = 0;
    for (size_t i = 0; i < N; ++i) {
        out[i] = c.ws.proj + size_t(T) * row;
        row += widths[i];
    }
    if (row > fused.out) throw std::logic_error(std::string(name) + ": parts exceed the fused rows");
    if (T == 1) {
        input_projection(c, fused, norms, c.ws.proj, name);
        return out;
    }
    if (c.small()) {
        static_assert(N <= RowParts::MAX, "a fused block of at most RowParts::MAX parts");
        RowParts split;
        split.n = int(N);
        for (size_t i = 0; i < N; ++i) {
            split.dst[i] = out[i];
            split.first[i + 1] = split.first[i] + widths[i];
        }
        c.op(OpFamily::Projections, name, [&] {
            if (norms.in_prenormed) linear_forward_prenormed(fused, prenormed_rows(c), nullptr, split, T, c.st);
            else linear_forward_parts(fused, c.ws.normed, split, T, c.st);
        });
        return out;
    }
    c.op(OpFamily::Projections, name, [&] { linear_forward(fused, c.ws.normed, c.ws.fused, T, c.st); });
    row = 0;
    for (size_t i = 0; i < N; ++i) {
        c.op(OpFamily::Projections, "split fused projection", [&] {
            LAMPO_CUDA_CHECK(cudaMemcpy2DAsync(out[i], size_t(widths[i]) * 2, c.ws.fused + row,
                                               size_t(fused.out) * 2, size_t(widths[i]) * 2, T,
                                               cudaMemcpyDeviceToDevice, c.st));
        });
        row += widths[i];
    }
    return out;
}

// Gated full attention, first half: fused q|k|v projection, then q/k norm + partial RoPE with the
// INT8 KV append in the same launch (ws.q, ws.gate: the rows' queries and output gates). Without
// `queries` (rows kept for the cache alone) only the k and v rows of the projection and their append.
void attention_append(const Ctx& c, const GatedAttentionWeights& w, const KvCacheLayer& kv, int context_max,
                      const BlockNorms& norms, bool queries = true) {
    const ModelDims& d = c.d;
    const Workspace& ws = c.ws;
    const int T = c.step.T;
    const bf16 *qg = nullptr, *k_raw = nullptr, *v = nullptr;
    if (queries) {
        const auto parts = project_parts<3>(c, w.qkv, {d.q_rows(), d.kv_width(), d.kv_width()}, norms,
                                            "attention qkv projection");
        qg = parts[0], k_raw = parts[1], v = parts[2];
    } else {
        const auto parts = project_parts<2>(c, w.qkv.rows(d.q_rows(), 2 * d.kv_width()), {d.kv_width(), d.kv_width()},
                                            norms, "attention kv projection");
        k_raw = parts[0], v = parts[1];
    }
    c.op(OpFamily::AttentionPrep, "attn_prep", [&] {
        const KvAppendTarget append{v, kv.k, kv.v, kv.k_scale, kv.v_scale, context_max};
        attn_prep(qg, k_raw, w.q_norm, w.k_norm, c.step.d_pos, ws.q, ws.gate, nullptr, T, queries ? d.n_q_heads : 0,
                  d.n_kv_heads, d.head_dim, d.rotary_dim, d.rope_theta, d.eps, c.st, &append);
    });
}

// Gated full attention: attention_append, causal attention over the cache times sigmoid(gate),
// output projection.
void gated_attention(const Ctx& c, const GatedAttentionWeights& w, const KvCacheLayer& kv,
                     int context_max, const BlockNorms& norms) {
    const ModelDims& d = c.d;
    const Workspace& ws = c.ws;
    const int T = c.step.T;
    attention_append(c, w, kv, context_max, norms);
    if (c.small()) {
        c.op(OpFamily::Attention, "attn_decode_int8", [&] {
            attn_decode_int8(ws.q, ws.gate, kv.k, kv.v, kv.k_scale, kv.v_scale, c.step.d_pos,
                             ws.mixed, ws.attn_partial, T, d.n_q_heads, d.n_kv_heads, d.head_dim,
                             context_max, c.st);
        });
    } else {
        c.op(OpFamily::Attention, "attn_prefill_int8", [&] {
            attn_prefill_int8(ws.q, ws.gate, kv.k, kv.v, kv.k_scale, kv.v_scale, c.step.pos0,
                              ws.mixed, T, d.n_q_heads, d.n_kv_heads, d.head_dim, context_max, c.st);
        });
    }
    output_projection(c, w.o, ws.mixed, norms, "attention o_proj");
}

// Gated DeltaNet: fused qkv|z|b|a projection, causal conv + SiLU on qkv, the gated delta rule
// (recurrent for few tokens, chunked WY form for prefill), gated RMSNorm with z, out proj. A
// decode step or verify window (T <= GEMV_MAX_T) on sm_90+ runs the first three as one
// gdn_decode_fused launch (LAMPO_DECODE_FUSION without gdn: three launches). The states move
// through the layer's ring of slots by position (ops.h, GdnStates).
void gated_deltanet(const Ctx& c, const GatedDeltaNetWeights& w, const GdnStates& s, const BlockNorms& norms) {
    const ModelDims& d = c.d;
    const Workspace& ws = c.ws;
    const int T = c.step.T, C = d.conv_channels(), Hv = d.gdn_v_heads;
    const bool rows = c.step.rows;
    const auto parts = project_parts<4>(c, w.in_proj, {C, d.gdn_value_width(), Hv, Hv},
                                        norms, "gdn in projection");
    const bf16 *qkv = parts[0], *z = parts[1], *b = parts[2], *a = parts[3];
    if (c.small() && decode_fusion_enabled(DecodeFusion::Gdn) && gdn_decode_fused_available()) {
        c.op(OpFamily::GdnRule, "gdn_decode_fused", [&] {  // conv + rule + gated norm in one launch
            gdn_decode_fused(qkv, w.conv, a, b, w.A_log, w.dt_bias, s, z, w.norm, ws.mixed, ws.gdn_counters, rows, T,
                             d.gdn_k_heads, Hv, d.gdn_k_dim, d.gdn_v_dim, d.conv_kernel, d.eps, c.st);
        });
        output_projection(c, w.out, ws.mixed, norms, "gdn out_proj");
        return;
    }
    c.op(OpFamily::GdnConv, "causal_conv1d_silu",
         [&] {
             causal_conv1d_silu(qkv, w.conv, s, ws.conv_out, T, C, d.conv_kernel, c.st, rows);
         });
    if (c.small()) {
        c.op(OpFamily::GdnRule, "gated_delta_rule_recurrent", [&] {
            gated_delta_rule_recurrent(ws.conv_out, a, b, w.A_log, w.dt_bias, s, ws.gdn_o, rows, T,
                                       d.gdn_k_heads, Hv, d.gdn_k_dim, d.gdn_v_dim, c.st);
        });
    } else {
        c.op(OpFamily::GdnRule, "gated_delta_rule_chunked", [&] {
            gated_delta_rule_chunked(ws.conv_out, a, b, w.A_log, w.dt_bias, s, ws.gdn_o,
                                     ws.gdn_chunked, T, d.gdn_k_heads, Hv, d.gdn_k_dim,
                                     d.gdn_v_dim, c.st);
        });
    }
    c.op(OpFamily::GatedNorm, "gated_rmsnorm",
         [&] { gated_rmsnorm(ws.gdn_o, z, w.norm, ws.mixed, T, Hv, d.gdn_v_dim, d.eps, c.st); });
    output_projection(c, w.out, ws.mixed, norms, "gdn out_proj");
}

// SwiGLU: down(silu(gate(h)) * up(h)). An interleaved LQ gate|up block on prenormed rows applies
// the activation in its GEMV (`swiglu` fusion); otherwise the product, then silu_mul.
void dense_ffn(const Ctx& c, const DenseFfnWeights& w, const BlockNorms& norms) {
    if (norms.in_prenormed && w.gate_up.interleaved && decode_fusion_enabled(DecodeFusion::Swiglu)) {
        c.op(OpFamily::Projections, "ffn gate_up+silu_mul", [&] {
            linear_forward_prenormed_swiglu(w.gate_up, prenormed_rows(c), c.ws.act, c.step.T, c.st);
        });
    } else {
        input_projection(c, w.gate_up, norms, c.ws.proj, "ffn gate_up");
        c.op(OpFamily::Activations, "silu_mul", [&] {
            silu_mul(c.ws.proj, c.ws.act, c.step.T, c.d.ffn_inter, c.st, w.gate_up.interleaved);
        });
    }
    output_projection(c, w.down, c.ws.act, norms, "ffn down");
}

// The shared expert as the (k+1)-th slot of the few-token MoE launches, in the banks' format.
MoeSharedSlot shared_slot_bf16(const Ctx& c, const MoeFfnWeights& w) {
    MoeSharedSlot shared;
    shared.gate_up = static_cast<const bf16*>(w.shared_gate_up.data);
    shared.down = static_cast<const bf16*>(w.shared_down.data);
    shared.w_gate = w.shared_gate;
    shared.gate = c.ws.shared_gate;
    shared.inter = c.d.shared_inter;
    return shared;
}

MoeSharedSlotLq shared_slot_lq(const Ctx& c, const MoeFfnWeights& w) {
    MoeSharedSlotLq shared;
    shared.gate_up = static_cast<const uint8_t*>(w.shared_gate_up.data);
    shared.gate_up_bits = w.shared_gate_up.bits;
    shared.down = static_cast<const uint8_t*>(w.shared_down.data);
    shared.down_bits = w.shared_down.bits;
    shared.w_gate = w.shared_gate;
    shared.gate = c.ws.shared_gate;
    shared.inter = c.d.shared_inter;
    return shared;
}

// The shared expert through its own projections, gated and added to the routed experts' sum in
// ws.routed: ws.delta = routed + sigmoid(h . w_gate) * shared(h).
void shared_expert_and_combine(const Ctx& c, const MoeFfnWeights& w) {
    const Workspace& ws = c.ws;
    const int T = c.step.T;
    c.op(OpFamily::Projections, "shared expert gate_up",
         [&] { linear_forward(w.shared_gate_up, ws.normed, ws.proj, T, c.st); });
    c.op(OpFamily::Activations, "silu_mul", [&] { silu_mul(ws.proj, ws.act, T, c.d.shared_inter, c.st); });
    c.op(OpFamily::Projections, "shared expert down",
         [&] { linear_forward(w.shared_down, ws.act, ws.shared, T, c.st); });
    c.op(OpFamily::Activations, "moe_shared_combine", [&] {
        moe_shared_combine(ws.routed, ws.shared, ws.normed, w.shared_gate, ws.delta, T, c.d.hidden, c.st);
    });
}

// Sparse MoE: router top-k, then the routed experts and the shared expert, their gated sum in
// ws.delta. Few tokens: the expert GEMVs of the banks' format (BF16 or LQ), with the shared expert
// as one more slot of the same two launches when it is in that format too. Folded (decode):
// router logits from the residual stream (which also leaves the normed row in ws.normed), gate_up
// selecting its experts from the logits, down adding into the residual: three launches. A prefill
// chunk: the grouped GEMMs of the banks' format. Outside the one-slot forms the shared expert
// runs through its own projections and moe_shared_combine.
void moe_ffn(const Ctx& c, const MoeFfnWeights& w, const bf16* norm_w) {
    const ModelDims& d = c.d;
    const Workspace& ws = c.ws;
    const int T = c.step.T, H = d.hidden, k = d.top_k, I = d.expert_inter;
    const bool lq = w.experts_gate_up.format == WeightFormat::LQ;
    if (lq != (w.experts_down.format == WeightFormat::LQ))
        throw std::logic_error("moe: the gate_up and down banks differ in format");
    const bool one_slot = moe_one_format(w);
    const bf16* gate_up = static_cast<const bf16*>(w.experts_gate_up.data);
    const bf16* down = static_cast<const bf16*>(w.experts_down.data);
    const uint8_t* gate_up_lq = static_cast<const uint8_t*>(w.experts_gate_up.data);
    const uint8_t* down_lq = static_cast<const uint8_t*>(w.experts_down.data);
    const int gu_bits = w.experts_gate_up.bits, down_bits = w.experts_down.bits;
    const MoeSharedSlot shared = shared_slot_bf16(c, w);
    const MoeSharedSlotLq shared_lq = shared_slot_lq(c, w);
    if (c.folded()) {  // decode_foldable: one_slot holds
        const Linear router{WeightFormat::BF16, w.router, d.n_experts, H};
        c.op(OpFamily::MoeRouter, "moe router logits", [&] {
            linear_forward_normed_f32(router, {ws.residual, norm_w, d.eps, ws.normed}, ws.router_logits, c.st);
        });
        c.op(OpFamily::MoeExperts, "moe_experts_gate_up_select", [&] {
            if (lq) {
                moe_experts_lq_gate_up_select(ws.normed, ws.router_logits, d.n_experts, gate_up_lq, gu_bits,
                                              ws.expert_ids, ws.expert_weights, ws.act, 1, k, H, I, c.st, &shared_lq);
            } else {
                moe_experts_gate_up_select(ws.normed, ws.router_logits, d.n_experts, gate_up, ws.expert_ids,
                                           ws.expert_weights, ws.act, 1, k, H, I, c.st, &shared);
            }
        });
        c.op(OpFamily::MoeExperts, "moe_experts_down_add", [&] {
            if (lq) {
                moe_experts_lq_down_add(ws.act, down_lq, down_bits, ws.expert_ids, ws.expert_weights, ws.residual, 1,
                                        k, H, I, c.st, &shared_lq);
            } else {
                moe_experts_down_add(ws.act, down, ws.expert_ids, ws.expert_weights, ws.residual, 1, k, H, I, c.st,
                                     &shared);
            }
        });
        return;
    }
    c.op(OpFamily::MoeRouter, "moe_router_topk", [&] {
        moe_router_topk(ws.normed, w.router, ws.router_logits, ws.expert_ids, ws.expert_weights, T,
                        H, d.n_experts, k, c.st);
    });
    if (c.small_moe()) {
        bf16* out = one_slot ? ws.delta : ws.routed;  // with the shared slot: the whole block
        c.op(OpFamily::MoeExperts, "moe_experts_gate_up", [&] {
            if (lq) {
                moe_experts_lq_gate_up(ws.normed, gate_up_lq, gu_bits, ws.expert_ids, ws.act, T, k, H, I, c.st,
                                       one_slot ? &shared_lq : nullptr);
            } else {
                moe_experts_gate_up(ws.normed, gate_up, ws.expert_ids, ws.act, T, k, H, I, c.st,
                                    one_slot ? &shared : nullptr);
            }
        });
        c.op(OpFamily::MoeExperts, "moe_experts_down", [&] {
            if (lq) {
                moe_experts_lq_down(ws.act, down_lq, down_bits, ws.expert_ids, ws.expert_weights, out, T, k, H, I,
                                    c.st, one_slot ? &shared_lq : nullptr);
            } else {
                moe_experts_down(ws.act, down, ws.expert_ids, ws.expert_weights, out, T, k, H, I, c.st,
                                 one_slot ? &shared : nullptr);
            }
        });
        if (one_slot) return;
    } else if (lq) {
        c.op(OpFamily::MoeExperts, "moe_experts_prefill_lq", [&] {
            moe_experts_prefill_lq(ws.normed, gate_up_lq, gu_bits, down_lq, down_bits, ws.expert_ids,
                                   ws.expert_weights, ws.routed, ws.moe_prefill, T, k, H, I, d.n_experts, c.st);
        });
    } else {
        c.op(OpFamily::MoeExperts, "moe_experts_prefill", [&] {
            moe_experts_prefill(ws.normed, gate_up, down, ws.expert_ids, ws.expert_weights, ws.routed,
                                ws.moe_prefill, T, k, H, I, d.n_experts, c.st);
        });
    }
    shared_expert_and_combine(c, w);
}

// The embedding rows of the step's ids (BF16 or LQ table) -> ws.residual [T, H] fp32.
void embed_rows(const Ctx& c) {
    const int32_t* d_ids = c.step.d_ids;
    const Linear& e = c.w.embed;
    c.op(OpFamily::Embedding, "embedding_gather", [&] {
        if (e.format == WeightFormat::LQ) {
            embedding_gather_lq(static_cast<const uint8_t*>(e.data), e.bits, d_ids, c.ws.residual, c.step.T,
                                c.d.hidden, c.st);
        } else {
            embedding_gather(static_cast<const bf16*>(e.data), d_ids, c.ws.residual, c.step.T, c.d.hidden, c.st);
        }
    });
}

// residual += ws.delta (set: residual = 0 + ws.delta), then y = rmsnorm1p(residual, norm_w).
void add_norm(const Ctx& c, const bf16* norm_w, bf16* y, bool set = false) {
    c.op(OpFamily::Norms, set ? "set_rmsnorm" : "add_rmsnorm", [&] {
        add_rmsnorm(c.ws.residual, c.ws.delta, norm_w, y, c.step.T, c.d.hidden, c.d.eps, c.st, 0, set);
    });
}

// The layer's FFN (MoE or dense SwiGLU) on its post-normed input (norms.in: the post norm).
void ffn(const Ctx& c, const LayerWeights& lw, const BlockNorms& norms) {
    if (c.d.moe) {
        moe_ffn(c, lw.moe, norms.in);
    } else {
        dense_ffn(c, lw.dense, norms);
    }
}

// Bit i set for each names[i] in the comma-separated value of environment variable `var`
// (unset: 0); an unknown name throws, naming the variable.
unsigned env_name_mask(const char* var, const std::vector<std::string>& names) {
    const char* env = std::getenv(var);
    const std::string list = env ? env : "";
    unsigned m = 0;
    for (size_t start = 0; start < list.size();) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        const std::string name = list.substr(start, end - start);
        const auto it = std::find(names.begin(), names.end(), name);
        if (it == names.end())
            throw std::invalid_argument(std::string(var) + ": unknown name '" + name + "'");
        m |= 1u << (it - names.begin());
        start = end + 1;
    }
    return m;
}

}  // namespace

bool op_family_omitted(OpFamily f) {
    static const unsigned mask = [] {
        std::vector<std::string> names;
        for (int i = 0; i < int(OpFamily::Count); ++i) names.push_back(op_family_name(OpFamily(i)));
        const unsigned m = env_name_mask("LAMPO_OMIT_OPS", names);
        if (m >> int(OpFamily::Embedding) & 1u)  // it opens every pass (pdl_begin_pass, common.cuh)
            throw std::invalid_argument("LAMPO_OMIT_OPS: the embedding cannot be omitted: the kernels after it "
                                        "read the previous pass's states before their PDL wait");
        return m;
    }();
    return mask >> int(f) & 1u;
}

bool decode_fusion_enabled(DecodeFusion f) {
    static const unsigned mask = [] {
        auto bit = [](DecodeFusion g) { return 1u << int(g); };
        const char* env = std::getenv("LAMPO_DECODE_FUSION");
        const std::string v = env ? env : "";
        if (v == "0" || v == "none") return 0u;
        if (v.empty() || v == "1" || v == "all")
            return bit(DecodeFusion::Norms) | bit(DecodeFusion::Gdn) | bit(DecodeFusion::Swiglu);
        return env_name_mask("LAMPO_DECODE_FUSION", {"norms", "gdn", "swiglu"});  // enum order
    }();
    return mask >> int(f) & 1u;
}

void model_forward(const ModelDims& d, const ModelWeights& w, const ModelState& s,
                   const Workspace& ws, const ForwardStep& step, cudaStream_t stream,
                   OpTimer* timer) {
    if (step.T < 1 || step.T > ws.max_tokens) {
        throw std::invalid_argument("model_forward: " + std::to_string(step.T) +
                                    " tokens do not fit the workspace of " +
                                    std::to_string(ws.max_tokens));
    }
    if (step.rows && (step.T > GEMV_MAX_T || step.T > ws.logit_rows)) {
        throw std::invalid_argument("model_forward: a verify window of " + std::to_string(step.T) +
                                    " tokens; the engine keeps " + std::to_string(std::min(ws.logit_rows, GEMV_MAX_T)) +
                                    " rows");
    }
    const bool folded = step.T == 1 && w.decode_foldable && decode_fusion_enabled(DecodeFusion::Norms);
    const bool prenorm = step.T <= GEMV_MAX_T && w.decode_prenormable && decode_fusion_enabled(DecodeFusion::Norms);
    const Ctx c{d, w, ws, step, stream, timer, folded, prenorm};  // else each block's input is ws.normed
    const int T = step.T, H = d.hidden, L = d.n_layers();
    if constexpr (timeline_built()) timeline_forward_begin(T);
    struct OpsDone {  // launches after the forward pass (the sampler) are the engine's
        ~OpsDone() { if constexpr (timeline_built()) timeline_note_op("engine"); }
    } ops_done;

    embed_rows(c);
    if (!folded)
        c.op(OpFamily::Norms, "rmsnorm",
             [&] { rmsnorm(ws.residual, w.layers[0].input_norm, ws.normed, T, H, d.eps, stream); });

    bf16* final_rows = step.hidden_out ? step.hidden_out : ws.normed;  // the last norm's output
    for (int l = 0; l < L; ++l) {
        const LayerWeights& lw = w.layers[l];
        const bool last = l + 1 == L;
        // carried in halves: layer 0's input is normed as without (its rows come from the embedding)
        const BlockNorms mixer{lw.input_norm, prenorm && l > 0, prenorm ? lw.post_norm : nullptr};
        const BlockNorms mlp{lw.post_norm, prenorm,
                             prenorm ? (last ? w.final_norm : w.layers[l + 1].input_norm) : nullptr};
        if (d.mixers[l] == MixerKind::GatedAttention) {
            gated_attention(c, lw.attn, s.kv[l], s.context_max, mixer);
        } else {
            gated_deltanet(c, lw.gdn,
                           GdnStates{s.gdn[l].recurrent, s.gdn[l].conv, s.gdn_slots, step.d_pos,
                                     step.rows ? s.gdn[l].records : nullptr, 1},
                           mixer);
        }
        if (!folded && !prenorm) add_norm(c, lw.post_norm, ws.normed);
        ffn(c, lw, mlp);
        if (d.moe && step.routing_out) {
            const size_t n = size_t(T) * d.top_k;
            LAMPO_CUDA_CHECK(cudaMemcpyAsync(step.routing_out + l * n, ws.expert_ids, n * sizeof(int32_t),
                                             cudaMemcpyDeviceToDevice, stream));
        }
        if (!folded && !prenorm)
            add_norm(c, last ? w.final_norm : w.layers[l + 1].input_norm, last ? final_rows : ws.normed);
    }

    if ((folded || prenorm) && (step.logits || step.hidden_out))
        c.op(OpFamily::Norms, "rmsnorm", [&] { rmsnorm(ws.residual, w.final_norm, final_rows, T, H, d.eps, stream); });
    if (step.logits) {  // the last row, or every row of a verify window
        const int rows = step.rows ? T : 1;
        const bf16* first = final_rows + size_t(T - rows) * H;
        c.op(OpFamily::LmHead, "lm_head",
             [&] { linear_forward_f32(w.lm_head, first, ws.logits, rows, stream); });
    }
}

void mtp_forward(const ModelDims& d, const ModelWeights& w, const KvCacheLayer& kv, int context_max,
                 const Workspace& ws, const MtpStep& m, cudaStream_t stream, OpTimer* timer) {
    if (!w.has_mtp) throw std::logic_error("mtp_forward: the MTP module is not loaded");
    if (m.logits && !m.out) throw std::logic_error("mtp_forward: logits need the rows' out");
    if (m.T < 1 || m.T > ws.max_tokens || !ws.mtp_in) {
        throw std::invalid_argument("mtp_forward: " + std::to_string(m.T) + " rows do not fit the workspace of " +
                                    std::to_string(ws.mtp_in ? ws.max_tokens : 0));
    }
    ForwardStep step;
    step.T = m.T;
    step.d_ids = m.d_ids;
    step.d_pos = m.d_pos;
    step.pos0 = m.pos0;
    // One row (a draft, or a decode step's MTP row) folds its norms as the decode step does.
    const bool folded = m.T == 1 && w.mtp_foldable && decode_fusion_enabled(DecodeFusion::Norms);
    const Ctx c{d, w, ws, step, stream, timer, folded, false};
    const MtpWeights& mw = w.mtp;
    const int T = m.T, H = d.hidden;
    // The fc input [T, 2H]: the normed embedding, then the normed hidden, each norm writing its half;
    // the residual takes the hidden (0 + hidden, as if added to zeros), then u: each set over what it held.
    embed_rows(c);
    c.op(OpFamily::Norms, "rmsnorm",
         [&] { rmsnorm(ws.residual, mw.pre_fc_norm_embedding, ws.mtp_in, T, H, d.eps, stream, 2 * H); });
    c.op(OpFamily::Norms, "set_rmsnorm", [&] {
        add_rmsnorm(ws.residual, m.hiddens, mw.pre_fc_norm_hidden, ws.mtp_in + H, T, H, d.eps, stream, 2 * H, true);
    });
    if (folded) {  // u set into the residual as rounded bf16 rows; the next block norms it
        c.op(OpFamily::Projections, "mtp fc",
             [&] { linear_forward_add_residual(mw.fc, ws.mtp_in, ws.residual, stream, true); });
    } else {
        c.op(OpFamily::Projections, "mtp fc", [&] { linear_forward(mw.fc, ws.mtp_in, ws.delta, T, stream); });
        add_norm(c, mw.layer.input_norm, ws.normed, true);
    }
    if (!m.out) {  // rows for the cache only: their K and V are all that is kept
        attention_append(c, mw.layer.attn, kv, context_max, {mw.layer.input_norm}, false);
        return;
    }
    gated_attention(c, mw.layer.attn, kv, context_max, {mw.layer.input_norm});
    if (!folded) add_norm(c, mw.layer.post_norm, ws.normed);
    ffn(c, mw.layer, {mw.layer.post_norm});
    if (folded) {
        c.op(OpFamily::Norms, "rmsnorm", [&] { rmsnorm(ws.residual, mw.norm, m.out, 1, H, d.eps, stream); });
    } else {
        add_norm(c, mw.norm, m.out);
    }
    if (m.logits) {
        Linear head = w.lm_head;  // its first rows: a prefix of the packed tiles (or bf16 rows)
        if (m.logit_rows > 0) head.out = m.logit_rows;
        c.op(OpFamily::LmHead, "lm_head",
             [&] { linear_forward_f32(head, m.out + size_t(T - 1) * H, m.logits, 1, stream); });
    }
}

}  // namespace lampo
