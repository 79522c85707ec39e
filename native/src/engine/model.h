// model.h - the model as the layer loop sees it: dimensions, device weights grouped by role (not
// by checkpoint name), the conversation state (INT8 KV cache, Gated DeltaNet states), the
// activation workspace, and `model_forward`, the layer loop itself (model_forward.cu).
//
// Nothing here knows the weight format: every projection is a `Linear` (linear.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "kernels/ops.h"

namespace lampo {

enum class MixerKind : int { GatedDeltaNet = 0, GatedAttention = 1 };

// Model hyper-parameters (a Qwen3.5/3.6 text config), as plain numbers.
struct ModelDims {
    int hidden = 0;
    std::vector<MixerKind> mixers;  // one per layer
    // gated full attention
    int n_q_heads = 0, n_kv_heads = 0, head_dim = 0, rotary_dim = 0;
    float rope_theta = 1e7f;
    // Gated DeltaNet
    int gdn_k_heads = 0, gdn_v_heads = 0, gdn_k_dim = 0, gdn_v_dim = 0, conv_kernel = 0;
    // FFN: dense SwiGLU (moe = false) or routed experts + a gated shared expert
    bool moe = false;
    int ffn_inter = 0;
    int n_experts = 0, top_k = 0, expert_inter = 0, shared_inter = 0;
    int vocab = 0, vocab_real = 0;
    float eps = 1e-6f;

    int n_layers() const { return int(mixers.size()); }
    int q_rows() const { return n_q_heads * 2 * head_dim; }   // q_proj: per head query | gate
    int attn_width() const { return n_q_heads * head_dim; }
    int kv_width() const { return n_kv_heads * head_dim; }
    int gdn_key_width() const { return gdn_k_heads * gdn_k_dim; }
    int gdn_value_width() const { return gdn_v_heads * gdn_v_dim; }
    int conv_channels() const { return 2 * gdn_key_width() + gdn_value_width(); }
    // Rows of the fused projections whose output is split into parts; padded with zero rows to a
    // multiple of FUSED_ROW_ALIGN so one product covers them (tiny configs have 2-row parts).
    int attn_qkv_rows() const { return padded_rows(q_rows() + 2 * kv_width()); }
    int gdn_in_rows() const { return padded_rows(conv_channels() + gdn_value_width() + 2 * gdn_v_heads); }
    static constexpr int FUSED_ROW_ALIGN = 64;
    static int padded_rows(int rows) { return (rows + FUSED_ROW_ALIGN - 1) / FUSED_ROW_ALIGN * FUSED_ROW_ALIGN; }
    int count(MixerKind k) const;
    // Throws std::invalid_argument naming the first unusable field.
    void validate() const;
};

// ---- weights (device pointers; owned by the WeightStore) ---------------------------------------
struct GatedAttentionWeights {
    Linear qkv;                     // fused rows: q_proj (query|gate per head) | k_proj | v_proj | 0 pad
    const bf16* q_norm = nullptr;   // [head_dim], 1 + w
    const bf16* k_norm = nullptr;
    Linear o;                       // [H, nq*D]
};

struct GatedDeltaNetWeights {
    Linear in_proj;                 // fused rows: in_proj_qkv | in_proj_z | in_proj_b | in_proj_a | 0 pad
    const bf16* conv = nullptr;     // [conv_channels, K]
    const float* A_log = nullptr;   // [Hv]
    const float* dt_bias = nullptr; // [Hv]
    const bf16* norm = nullptr;     // [dv], plain w
    Linear out;                     // [H, value_width]
};

struct DenseFfnWeights {
    Linear gate_up;                 // fused rows: gate_proj | up_proj  [2I, H]
    Linear down;                    // [H, I]
};

struct MoeFfnWeights {
    const bf16* router = nullptr;           // [E, H]
    Linear experts_gate_up;                 // E matrices [2I, H] one after another (BF16 or LQ)
    Linear experts_down;                    // E matrices [H, I], same
    Linear shared_gate_up;                  // fused rows: shared gate_proj | up_proj  [2Is, H]
    Linear shared_down;                     // [H, Is]
    const bf16* shared_gate = nullptr;      // [H]
};

// Whether an MoE layer's banks and shared expert share one format (the one-slot MoE launches).
bool moe_one_format(const MoeFfnWeights& m);

struct LayerWeights {
    const bf16* input_norm = nullptr;  // 1 + w
    const bf16* post_norm = nullptr;   // 1 + w
    GatedAttentionWeights attn;        // set when the mixer is GatedAttention
    GatedDeltaNetWeights gdn;          // set when the mixer is GatedDeltaNet
    DenseFfnWeights dense;             // set when !moe
    MoeFfnWeights moe;                 // set when moe
};

// The MTP (multi-token prediction) module: one full-attention decoder layer with the model's FFN
// type, fed by fc over [rmsnorm1p(embedding of the next token) | rmsnorm1p(trunk hidden)].
struct MtpWeights {
    const bf16* pre_fc_norm_embedding = nullptr;  // [H], 1 + w
    const bf16* pre_fc_norm_hidden = nullptr;     // [H], 1 + w
    Linear fc;                                    // [H, 2H]: embedding half first
    LayerWeights layer;                           // attn + (moe or dense)
    const bf16* norm = nullptr;                   // [H], 1 + w: the draft hidden d
};

struct ModelWeights {
    Linear embed;                 // [V, H] (BF16 or LQ), gathered by row
    std::vector<LayerWeights> layers;
    const bf16* final_norm = nullptr;
    Linear lm_head;               // [V, H]
    bool has_mtp = false;         // the checkpoint's MTP module is loaded (`mtp`)
    MtpWeights mtp;
    // The decode step may fold its norms (linear.h): its MoE launches take the shared expert as
    // one more slot, which they read in the banks' format, so every layer's four expert matrices
    // must share one format (a dense model always folds).
    bool decode_foldable = true;
    bool mtp_foldable = true;  // the same for the MTP layer's one-row passes
    // Decode steps and verify windows carry the norms between blocks in halves (linear.h Prenorm):
    // a dense model whose layers' projections are all in the LQ format.
    bool decode_prenormable = false;
};

// ---- conversation state (device pointers; owned by the Engine) ---------------------------------
struct KvCacheLayer {        // [nkv, context_max, D] INT8 (offset binary, ops.h) + [nkv, context_max, D/64] fp16 scales
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    half* k_scale = nullptr;
    half* v_scale = nullptr;
};

struct GdnStateLayer {  // ops.h GdnStates: one recurrent state, a ring of ModelState::gdn_slots conv states
    float* recurrent = nullptr;  // [Hv, dk, dv] fp32, updated in place
    bf16* conv = nullptr;        // [slots, conv_channels, K-1] bf16 (slot pos % slots is the live one)
    float* records = nullptr;    // a verify window's records (GdnStates::records), or null without verify rows
};

struct ModelState {
    int context_max = 0;
    int gdn_slots = 1;               // conv slots: 1, or a verify window's most tokens + 1 (ForwardStep::rows)
    std::vector<KvCacheLayer> kv;    // per layer; null entries for GDN layers
    std::vector<GdnStateLayer> gdn;  // per layer; null entries for attention layers
};

// ---- activation workspace for up to `max_tokens` rows (device pointers; owned by the Engine) ---
struct Workspace {
    int max_tokens = 0;
    int logit_rows = 1;
    float* residual = nullptr;   // [T, H] fp32 residual stream
    bf16* normed = nullptr;      // [T, H] pre-norm output, input of every mixer / FFN (prenormed
                                 // rows where the norms are carried in halves: linear.h Prenorm)
    float* norm_squares = nullptr;  // [T, H / PRENORM_STRIP] their strip sums of squares (Prenorm)
    bf16* fused = nullptr;       // [T, padded rows] product of a fused projection (T > 1)
    bf16* proj = nullptr;        // its parts, each [T, width] (see project_parts); FFN gate|up
    bf16* q = nullptr;           // [T, nq, D]
    bf16* gate = nullptr;        // [T, nq*D]
    bf16* mixed = nullptr;       // [T, max(nq*D, value_width)] mixer output before its out proj
    bf16* conv_out = nullptr;    // [T, conv_channels]
    bf16* gdn_o = nullptr;       // [T, Hv, dv]
    bf16* act = nullptr;         // [T, max(I, Is)] SwiGLU activations; MoE decode: [T, k, I_expert]
                                 // then the shared expert's [T, Is] (MoeSharedSlot)
    bf16* delta = nullptr;       // [T, H] sub-block output added to the residual
    bf16* routed = nullptr;      // [T, H]
    bf16* shared = nullptr;      // [T, H]
    float* router_logits = nullptr;  // [T, E]
    unsigned* gdn_counters = nullptr; // [Hk] block counters of gdn_decode_fused; same rule
    int32_t* expert_ids = nullptr;   // [T, k]
    float* expert_weights = nullptr; // [T, k]
    float* shared_gate = nullptr;    // [T] sigmoid(h_t . w_shared_gate), MoE decode
    void* gdn_chunked = nullptr;
    void* moe_prefill = nullptr;
    float* attn_partial = nullptr;
    float* logits = nullptr;     // [logit_rows, V] fp32: the last row, or a verify window's rows
    void* sampling_scratch = nullptr;
    bf16* mtp_in = nullptr;      // [T, 2H] the MTP fc's input (engines with the MTP module)
};

// Bytes of each workspace buffer for `max_tokens` rows, in the order of Workspace's fields.
struct WorkspaceLayout {
    std::vector<std::pair<const char*, size_t>> buffers;
    size_t total() const;
};
// logit_rows: rows of fp32 logits (1, or a verify window's most tokens); mtp: room for the MTP
// module's input.
WorkspaceLayout workspace_layout(const ModelDims& d, int max_tokens, int context_max, int logit_rows, bool mtp);
// Points a Workspace at consecutive 256-byte aligned pieces of `base` (workspace_layout order).
Workspace carve_workspace(const ModelDims& d, int max_tokens, int context_max, int logit_rows, bool mtp,
                          void* base);

// ---- profiling hook ----------------------------------------------------------------------------
enum class OpFamily : int {
    Embedding, Norms, AttentionPrep, Attention, GdnConv, GdnRule, GatedNorm,
    Projections, Activations, MoeRouter, MoeExperts, LmHead, Sampling, Count
};
const char* op_family_name(OpFamily f);

// Times op families with cudaEvent pairs around each op (un-graphed runs only).
class OpTimer {
public:
    explicit OpTimer(cudaStream_t stream) : stream_(stream) {}
    ~OpTimer();
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;
    void begin(OpFamily f);
    void end();
    // Waits for the recorded events, adds their times to the totals and recycles the events.
    void collect();
    const std::array<double, size_t(OpFamily::Count)>& total_ms() const { return total_ms_; }

private:
    cudaStream_t stream_;
    std::vector<cudaEvent_t> pool_;
    std::vector<std::pair<OpFamily, size_t>> marks_;  // family, index of its start event
    size_t used_ = 0;
    std::array<double, size_t(OpFamily::Count)> total_ms_{};
    cudaEvent_t next_event();
};

// ---- the layer loop ----------------------------------------------------------------------------
struct ForwardStep {
    int T = 0;                        // tokens in this call (1 for decode)
    const int32_t* d_ids = nullptr;   // [T] token ids (device)
    const int32_t* d_pos = nullptr;   // [1] position of the first token (device)
    int pos0 = 0;                     // same position on the host (prefill attention only)
    bool logits = false;              // final norm + LM head on the last row -> ws.logits
    // A verify window (T < ModelState::gdn_slots): each GDN layer also keeps the conv state after
    // every token in its slot and each token's record (the recurrent state stays the window's first:
    // Engine::accept rebuilds it), and the LM head runs on every row -> ws.logits [T, V] (with `logits`).
    bool rows = false;
    int32_t* routing_out = nullptr;   // optional [layers, T, k] (device): each MoE layer's expert ids
    // Optional [T, H] (device): the final-normed rows are written here instead of ws.normed (the
    // LM head reads them from here): the MTP module's trunk hiddens. With it a folded decode step
    // runs its final norm even without `logits`.
    bf16* hidden_out = nullptr;
};

// Runs every layer over T tokens at positions d_pos[0].., appending to the KV cache and advancing
// the Gated DeltaNet states. Asynchronous on `stream`; graph-capturable when T <= GEMV_MAX_T.
// `timer` (may be null) brackets each op family with events.
void model_forward(const ModelDims& d, const ModelWeights& w, const ModelState& s,
                   const Workspace& ws, const ForwardStep& step, cudaStream_t stream,
                   OpTimer* timer);

// One pass of the MTP module (ModelWeights::mtp) over T rows: row t fuses hiddens[t] with the
// embedding of ids[t] at position d_pos[0] + t of the MTP layer's own KV cache `kv` (appended):
//   u = [rmsnorm1p(embed(ids[t]), pre_fc_norm_embedding) | rmsnorm1p(hiddens[t], pre_fc_norm_hidden)] @ fc^T
//   out[t] = rmsnorm1p(decoder_layer(u), mtp.norm)
// and, with `logits`, the LM head on the last row of out. `out` may alias `hiddens` (a draft chain
// feeds each step the previous step's out). Without `out` (the MTP rows of a decode step, a verify
// window or a prefill chunk, kept for the cache alone) the pass ends with the layer's K and V
// appended: its attention, output projection, FFN and final norm would only make rows nobody reads.
// Same paths as model_forward by T.
struct MtpStep {
    int T = 0;
    const int32_t* d_ids = nullptr;   // [T] the token after each row's trunk position (device)
    const int32_t* d_pos = nullptr;   // [1] MTP cache position of the first row (device)
    int pos0 = 0;                     // the same on the host (T > GEMV_MAX_T)
    const bf16* hiddens = nullptr;    // [T, H] final-normed trunk rows, or the MTP's own out
    bf16* out = nullptr;              // [T, H]; null: the rows only fill the MTP layer's KV cache
    float* logits = nullptr;          // optional [V] fp32 (or [logit_rows]); needs out
    int logit_rows = 0;               // > 0: the logits of ids [0, logit_rows) only (the LM head's first rows)
};
void mtp_forward(const ModelDims& d, const ModelWeights& w, const KvCacheLayer& kv, int context_max,
                 const Workspace& ws, const MtpStep& step, cudaStream_t stream, OpTimer* timer);

// Fused forms of parts of the decode step (T = 1), chosen by LAMPO_DECODE_FUSION in the environment
// (read once per process), a comma list of:
//   norms  - no add_rmsnorm launches: each block's input projection builds the normed row itself
//            and each output projection adds into the fp32 residual (linear.h), and the gate_up
//            launch selects the experts from the router logits (no top-k launch);
//   gdn    - conv + delta rule + gated norm in one launch;
//   swiglu - a dense model's interleaved LQ gate|up GEMV applies silu(gate) * up itself (no
//            silu_mul launch), where its input is prenormed rows (norms carried in halves, so with
//            norms; verify windows too).
// Unset, "all" or "1" = norms,gdn,swiglu; "none" or "0" = the separate launches. Every
// form computes the same values as the separate launches, bit for bit (both take the router logits
// from the same GEMV kernel). (One-launch router and whole-MoE-FFN forms, and the experts' gate_up
// and down as one launch of clusters, were measured slower and removed: docs/design/decode.md.)
enum class DecodeFusion : int { Norms, Gdn, Swiglu };
bool decode_fusion_enabled(DecodeFusion f);

// Diagnostic for `lampo bench` only: LAMPO_OMIT_OPS=norms,moe_router (op family names) leaves those
// ops out of every forward pass, so the decode graph's time without them measures what they cost
// in the graph. The model's outputs are meaningless while it is set.
bool op_family_omitted(OpFamily f);

}  // namespace lampo
