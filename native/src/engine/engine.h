// engine.h - one model resident in VRAM plus one conversation's state.
//
// The Engine owns the weights (WeightStore), the INT8 KV cache of every attention layer, the
// Gated DeltaNet recurrent (fp32) and conv (bf16) states of every GDN layer (a ring of slots by
// position, so a verify window keeps the state after each of its tokens), a fixed number of
// snapshot slots for those states, the activation workspace for one prefill chunk, and the
// device-side inputs of a step (token ids, position, sampled token, presence-penalty set, RNG
// step). Everything is allocated in the constructor; an allocation that fails throws CudaError
// naming what and how much.
//
// Prefill runs a chunk of up to `prefill_chunk` tokens (the caller drives the chunks) and samples
// the next token from the last row only. Decode is one CUDA graph, captured once and replayed per
// token: embedding of the device-resident token -> layers -> LM head -> on-GPU sampling, which
// writes the next token where the next replay reads it, then the position advances on the device.
// The host only reads back the sampled id. Sampling parameters are baked into the graph's kernel
// arguments; changing them re-captures and applies cudaGraphExecUpdate (no re-instantiation).
//
// Snapshots copy only the GDN states (and remember the position): KV rows below a snapshot's
// position are never rewritten while it is valid (the caller's PrefixCache enforces that).
//
// With the MTP module loaded (its roles in the tensor names), the engine also keeps the MTP layer's
// KV cache and the final-normed hidden of the last trunk row ("held"; snapshots keep it too). The
// MTP row of trunk position p fuses that position's hidden with the token at p + 1, so it can run
// only once that token is fed: every prefill chunk, verify window and decode step runs the MTP rows
// it completes (one MTP pass over the same ids; the decode step's inside its graph), and mtp_draft
// chains the MTP layer from the held row to draft tokens.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "weights/weights.h"

namespace lampo {

struct EngineOptions {
    int context_max = 0;  // tokens of KV cache; no default: the caller passes the model's, or less
    int prefill_chunk = 2048;
    int snapshot_slots = 4;
    size_t vram_limit = 0;  // bytes the process may hold in cudaMalloc'ed blocks (0: no cap; weights.h)
    int verify_rows = 0;    // most tokens of a verify window (0: none; else 2..GEMV_MAX_T): the GDN
                            // states' ring holds verify_rows + 1 slots; the logits rows of speculative verify
    bool speculative_graphs = true;  // each verify window size and MTP draft count captured once as a CUDA
                                     // graph (false: eager launches)
};

struct DecodeGraphInfo {
    int nodes = 0;    // all nodes of the captured decode step
    int kernels = 0;  // kernel nodes among them (launches per decoded token)
};

class Engine {
public:
    // `names`: the checkpoint name of each weight by role (weights.h, TensorNames); `bits`: the
    // matrices held in the LQ format and their widths (TensorBits; the others BF16).
    Engine(const ModelDims& dims, const TensorNames& names, const TensorBits& bits, const EngineOptions& options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    const ModelDims& dims() const { return dims_; }
    const EngineOptions& options() const { return opt_; }
    WeightStore& weights() { return *weights_; }
    void random_weights(uint64_t seed) { weights_->fill_random(seed, stream_); }
    size_t state_bytes() const;
    size_t workspace_bytes() const { return workspace_mem_.bytes(); }

    // ---- conversation state ----
    int position() const { return pos_; }
    void reset();                      // empty conversation (GDN states zeroed, position 0; queued
                                       // decode steps are waited for and dropped)
    void snapshot(int slot);           // GDN states + position -> slot
    void restore(int slot);            // slot -> GDN states + position
    int snapshot_position(int slot) const;

    // ---- sampling ----
    void set_sampling(const SamplingConfig& cfg);
    void begin_generation();           // clears the presence-penalty set and the RNG step

    // ---- compute ----
    // Runs `n` (1..prefill_chunk) tokens at the current position. With `sample`, the LM head runs
    // on the last row and the sampled next token is returned; otherwise returns -1.
    int prefill(const int32_t* ids, int n, bool sample);
    // One decode step (graph replay): feeds `token` (or, when token < 0, the token sampled by the
    // previous step) and returns the next sampled token.
    int decode(int token);
    // The same step in two halves, so the host can keep a step queued on the GPU while it handles
    // the previous token: decode_submit queues one step (feeding `token`, or the last sample when
    // token < 0; a queued step's sample is fed by the step after it) and an asynchronous copy of
    // its sample; decode_collect waits for the oldest queued step and returns its sample. At most
    // DECODE_QUEUE steps are queued; every other call needs an empty queue.
    static constexpr int DECODE_QUEUE = 2;
    void decode_submit(int token);
    int decode_collect();
    int decode_queued() const { return queued_; }
    std::vector<float> logits();       // fp32 logits [V] of the last row of the last call

    // ---- speculative verify (EngineOptions::verify_rows > 0) ----
    // Runs the window `ids` (2..verify_rows tokens: the last sampled token, then the drafts) at the
    // current position through the few-token forward (the decode step's kernels for T rows), keeping
    // each row's GDN conv state and recurrent record (engine_verify.cu), and returns each row's
    // token drawn by the sampler with the current settings, row after row (row i sees rows < i in
    // the presence set and draws with the next RNG step): a draft is right where it equals its row's
    // token, so keeping the drafts up to the first that is not, plus that row's token, decodes
    // exactly as plain steps would in distribution (and token for token when greedy). The position
    // moves past the whole window.
    // mtp_drafts: ids[1..n) are the drafts of the last mtp_draft, which a sampled reply (temperature
    // > 0) draws from the MTP layer's own distributions q: each row then keeps its draft with
    // probability min(1, p / q) and otherwise draws from max(0, p - q) (sample_verify_row), the
    // row's token still distributed as p. Without it (or greedy) a draft is kept where it equals the
    // row's own draw, as for any deterministic drafter.
    std::vector<int32_t> verify(const int32_t* ids, int n, bool mtp_drafts = false);
    // Keeps the first `keep` (1..n) rows of the last verify: the GDN states become those after row
    // keep - 1, the position verify's start + keep (the KV rows past it are rewritten later) and the
    // presence set holds the tokens of rows < keep only. May be called again with a smaller keep
    // until the next forward or snapshot (taking back kept drafts): the GDN recurrent states are
    // rebuilt once, for the last keep, when the window is settled (settle_window).
    void accept(int keep);
    // Ends the held window now, as the next forward would first (its kept rows' recurrent states
    // rebuilt), and waits for it: a bench times a window with all the work it causes.
    void settle();
    std::vector<float> verify_logits();  // fp32 logits [n, V] of the last verify's rows
    // `steps` un-graphed verify windows of `ids`, each accepted at its first row (the position
    // moves one token per window), timed per op family: {family: mean ms per window}, as
    // profile_decode.
    std::vector<std::pair<std::string, double>> profile_verify(const int32_t* ids, int n, int steps);

    // ---- MTP drafts (the MTP module loaded) ----
    bool has_mtp() const;
    // Feeds `token` (sampled, not yet fed to the trunk) to the MTP layer with the held trunk row,
    // then chains the MTP layer on its own output and each draft: returns k (1..GEMV_MAX_T) drafts
    // over the draft vocabulary: the argmax (greedy sampling settings, no presence penalty), or a
    // draw from the filtered draft distribution q (sample_draft: temperature > 0), whose q is kept
    // for verify(..., mtp_drafts). Writes the MTP cache rows from position - 1 on; the
    // trunk's state is untouched (but a held verify window can no longer be accepted).
    std::vector<int32_t> mtp_draft(int token, int k);
    // The drafts' vocabulary: ids [0, n) only, i.e. the LM head's first n rows (n a multiple of 16,
    // at most the real vocabulary), or 0 for every id. With n > 0 a draft's logits() hold the
    // first n entries only (the others are left as they were).
    void set_draft_vocab(int n);
    int draft_vocab() const { return draft_vocab_; }
    // With recording on (MoE models), each prefill keeps the experts every layer chose for each of
    // its tokens: routing() = ids [layers * T * k] of the last prefill (the exact oracle of the
    // tests: the reference replays them, lampo.models.reference.ffn.Routing).
    void set_record_routing(bool on);
    std::vector<int32_t> routing() const { return routing_; }
    DecodeGraphInfo decode_graph_info();
    // Runs `steps` decode steps un-graphed with events around each op family (the first feeds
    // `token`, or the last sampled one when token < 0); returns mean ms per step for each family
    // and "step_total". Advances the conversation like decode.
    std::vector<std::pair<std::string, double>> profile_decode(int steps, int token);
    // Bench --fast-depth: random KV cache contents and GDN states, position set to `depth`.
    void fill_state_random(int depth, uint64_t seed);
    // False when the CUDA context has a sticky error (then the process must reset the device).
    bool healthy();
    void synchronize();

private:
    ModelDims dims_;
    EngineOptions opt_;
    cudaStream_t stream_ = nullptr;
    std::unique_ptr<WeightStore> weights_;
    std::vector<DeviceMemory> kv_mem_;
    DeviceMemory gdn_mem_, snapshot_mem_, workspace_mem_, io_mem_, routing_mem_, verify_mem_;
    std::vector<int32_t> routing_;
    size_t gdn_rec_bytes_ = 0, gdn_conv_bytes_ = 0;  // one slot of a GDN layer's recurrent / conv state
    size_t gdn_layer_pitch_ = 0;                      // one GDN layer's rings (both, the conv ring padded to 256)
    size_t gdn_records_pitch_ = 0;                    // one GDN layer's window records (inside verify_mem_)
    ModelState state_;
    Workspace ws_;
    // device step inputs/outputs (inside io_mem_)
    int32_t* d_ids_ = nullptr;
    int32_t* d_pos_ = nullptr;
    int32_t* d_tok_ = nullptr;
    int32_t* d_step_ = nullptr;
    uint8_t* d_seen_ = nullptr;
    // pinned host mirrors
    int32_t* h_io_ = nullptr;  // [prefill_chunk ids | pos | token in | DECODE_QUEUE tokens out]
    cudaEvent_t token_ready_[DECODE_QUEUE] = {};

    int pos_ = 0;       // the position once every queued decode step has run
    int verify_start_ = 0;  // the position where the last verify window began
    int verified_ = 0;      // rows of the last verify still held (0 after any other forward)
    int window_keep_ = 0;   // rows of the held window whose recurrent states settle_window rebuilds (0: none)
    int32_t* d_verify_out_ = nullptr;  // [verify_rows] the rows' sampled tokens (inside verify_mem_)
    int queued_ = 0;    // decode steps submitted and not yet collected
    int oldest_ = 0;    // the out slot of the oldest queued step
    std::vector<int> slot_pos_;
    SamplingConfig sampling_{};
    SamplingConfig graph_sampling_{};
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t graph_exec_ = nullptr;
    DecodeGraphInfo graph_info_;

    // the verify window of each size, once captured, [1]: its rows judging sampled MTP drafts by q
    cudaGraphExec_t verify_exec_[2][GEMV_MAX_T + 1] = {};
    SamplingConfig verify_sampling_[2][GEMV_MAX_T + 1] = {};  // the settings baked into each
    cudaGraphExec_t draft_exec_[GEMV_MAX_T + 1] = {};   // the MTP draft chain of each length, once captured
    int draft_exec_vocab_[GEMV_MAX_T + 1] = {};         // the draft vocabulary baked into each
    SamplingConfig draft_sampling_[GEMV_MAX_T + 1] = {};  // and its sampling settings
    int draft_vocab_ = 0;                               // set_draft_vocab (0: the whole vocabulary)
    DraftDistribution draft_q_[GEMV_MAX_T] = {};        // q of each sampled draft (inside mtp_mem_)
    int32_t* d_draft_step_ = nullptr;                   // the drafts' RNG step (inside mtp_mem_)
    std::vector<int32_t> sampled_drafts_;               // the last chain's drafts, when drawn from q
    std::vector<int32_t> verify_tokens_; // the last verify's row tokens
    bool verify_penalised_ = false;      // it ran with a presence penalty (seen_backup_ holds the set before)
    uint8_t* seen_backup_ = nullptr;     // [V] (inside verify_mem_)

    void decode_body(OpTimer* timer);
    void sample(OpTimer* timer);
    cudaGraph_t capture(const std::function<void()>& body);  // body's launches as a graph (not run)
    // Makes `exec` run `g`: updated in place where the topology allows, else instantiated anew.
    void install_graph(cudaGraphExec_t& exec, cudaGraph_t g, const char* what);
    // Launches `exec`, first capturing `body` into it when it has none or is `stale`.
    void launch_captured(cudaGraphExec_t& exec, bool stale, const std::function<void()>& body, const char* what);
    void ensure_decode_graph();
    void write_position();
    void check_slot(int slot) const;
    void require_weights() const;
    int32_t* token_out(int slot) const;  // pinned word of out slot `slot` (h_io_)
    void copy_token_out(int slot);        // the last sample -> that word, then token_ready_[slot]
    int read_token();                     // the last sample, copied through slot 0 and waited for
    void require_idle(const char* op) const;  // no decode step queued
    void feed_token(int token);  // token >= 0: the next step's input (else the last sampled id)
    void allocate_verify_rows();  // verify_mem_: the rows' tokens, the presence set's copy, the GDN records
    // Ends the held verify window before anything else reads or writes the GDN states: the
    // recurrent states after row window_keep_ - 1, rebuilt in place from the window's records
    // (gdn_replay, one launch for every layer). `drop`: the states are about to be overwritten, so
    // nothing is rebuilt.
    void settle_window(bool drop = false);
    // The GDN states of ring slot position % slots <-> snapshot `slot` (into_ring: restore).
    void copy_gdn_states(int slot, int position, bool into_ring);
    // verify; with `timer`, un-graphed, its ops timed and the window's GPU time added to *body_ms.
    std::vector<int32_t> run_verify(const int32_t* ids, int n, bool mtp_drafts, OpTimer* timer = nullptr,
                                    double* body_ms = nullptr);
    double timed_ms(const std::function<void()>& body);  // GPU time of the launches `body` queues
    static std::vector<std::pair<std::string, double>> family_means(const OpTimer& timer, int steps,
                                                                    double total_ms);
    // An attention layer's INT8 KV cache: K and V [nkv, context_max, D] offset-binary bytes (ops.h),
    // then their fp16 scales per KV_GROUP values, each piece 256-byte aligned.
    size_t kv_elems() const;
    size_t kv_layer_bytes() const;
    KvCacheLayer kv_layer_at(char* p) const;  // the layer carved from kv_layer_bytes() at p
    // ---- MTP (engine_mtp.cu) ----
    DeviceMemory mtp_mem_;
    KvCacheLayer mtp_kv_;
    bf16* mtp_hidden_ = nullptr;   // [prefill_chunk + 1, H]: row 0 the held row before a forward,
                                   // rows 1.. the forward's final-normed rows (ForwardStep::hidden_out)
    bf16* mtp_chain_ = nullptr;    // [H] the draft chain's MTP output
    bf16* slot_held_ = nullptr;    // [snapshot_slots, H] the held row of each snapshot
    int32_t* d_mtp_ids_ = nullptr;  // [GEMV_MAX_T + 1] the fed token, then the drafts
    int32_t* d_mtp_pos_ = nullptr;  // [GEMV_MAX_T] MTP positions of a pass or of the chain's steps
    int32_t* h_mtp_ = nullptr;      // pinned [2 * (GEMV_MAX_T + 1)]
    int held_row_ = -1;             // the row of mtp_hidden_ holding the last trunk row's hidden (-1: none)
    std::vector<int> slot_held_row_;  // per snapshot: 0 when it holds a held row, else -1
    void allocate_mtp();
    bf16* hidden_row(int r) const;                  // row r of mtp_hidden_
    void copy_hidden(bf16* dst, const bf16* src);   // one [H] row, on the stream
    void move_held_row(int to);                     // the held row (if any) to row `to`
    // The MTP pass over the rows that the n ids uploaded at position pos_ complete (T = 0: none; its
    // position uploaded); the held row becomes row n.
    MtpStep mtp_window(int n);
    void mtp_snapshot(int slot);
    void mtp_restore(int slot);
    MtpStep decode_mtp_step() const;  // the decode step's MTP row (fixed pointers: graph-captured)
    void prepare_decode_mtp();        // before an idle decode submit: the held row to row 1, the counter
    // Checks `n` ids at the current position (context, vocabulary; `op` names the caller), drops
    // the verify rows, queues the ids and the position for the next forward and parks the held
    // row; returns that forward (its final hidden rows kept for the MTP module) and, in `mtp`, the
    // MTP pass over the rows it completes (T = 0: none, or no MTP module).
    ForwardStep open_window(const char* op, const int32_t* ids, int n, MtpStep& mtp);
};

struct DeviceInfo {
    std::string name;
    int sm_count = 0;
    int cc_major = 0, cc_minor = 0;
    size_t memory = 0;
    int code_arch = 0;  // the architecture the running device code was built for (device_code_arch)
};
DeviceInfo device_info();
// Device memory (free, total) in bytes.
std::pair<size_t, size_t> mem_info();
// Device-to-device copy bandwidth in bytes/s, counting bytes read + written.
double measure_copy_bandwidth(size_t bytes, int iters);
// Destroys the process's CUDA context (after a sticky error, once no Engine is alive).
void reset_device();

}  // namespace lampo
