// engine.cu - Engine: allocation, prefill chunks, the CUDA-graph decode step, on-GPU sampling,
// snapshots, profiling. See engine.h for the contract.
#include "engine/engine.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/common.cuh"
#include "kernels/launch_utils.cuh"

namespace lampo {
namespace {

// d_pos[0] += n: the position advances on the device, so a replayed graph sees the next one.
__global__ void advance_position(int32_t* d_pos, int n) { pdl_begin(); d_pos[0] += n; }

}  // namespace

Engine::Engine(const ModelDims& dims, const TensorNames& names, const TensorBits& bits, const EngineOptions& options)
    : dims_(dims), opt_(options) {
    dims_.validate();
    if (opt_.context_max < 1) throw std::invalid_argument("context_max must be positive");
    if (opt_.prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be positive");
    if (opt_.snapshot_slots < 0) throw std::invalid_argument("snapshot_slots must be >= 0");
    if (opt_.verify_rows != 0 && (opt_.verify_rows < 2 || opt_.verify_rows > GEMV_MAX_T ||
                                  opt_.verify_rows > opt_.prefill_chunk)) {
        throw std::invalid_argument("verify_rows must be 0 or 2.." + std::to_string(GEMV_MAX_T) +
                                    " (and at most prefill_chunk), got " + std::to_string(opt_.verify_rows));
    }

    // A build this GPU cannot load fails here, naming the fix; and the device-code query (a function
    // attribute, which sm90_or_newer asks on sm_90+ GPUs) runs now, before any capture.
    (void)device_code_arch();
    DeviceMemory::set_limit(opt_.vram_limit);
    weights_ = std::make_unique<WeightStore>(dims_, names, bits);

    // KV cache: per attention layer K, V int8 [nkv, context_max, D] and fp16 scales per 64 values.
    const int L = dims_.n_layers();
    state_.context_max = opt_.context_max;
    state_.kv.resize(L);
    state_.gdn.resize(L);
    for (int l = 0; l < L; ++l) {
        if (dims_.mixers[l] != MixerKind::GatedAttention) continue;
        kv_mem_.emplace_back(kv_layer_bytes(), "KV cache of layer " + std::to_string(l) + " (" +
                                                   std::to_string(opt_.context_max) + " tokens)");
        state_.kv[l] = kv_layer_at(kv_mem_.back().as<char>());
    }

    // Gated DeltaNet states of all layers in one block: per layer one recurrent state, then a ring
    // of verify_rows + 1 slots of the conv state (ops.h, GdnStates: slot pos % slots is the live
    // one; a verify window leaves the conv state after each of its tokens in the next slots, and
    // for the recurrent state only records, from which settle_window rebuilds it in place).
    const int slots = opt_.verify_rows + 1;
    const size_t gdn_layers = size_t(dims_.count(MixerKind::GatedDeltaNet));
    gdn_rec_bytes_ = size_t(dims_.gdn_v_heads) * dims_.gdn_k_dim * dims_.gdn_v_dim * 4;
    gdn_conv_bytes_ = size_t(dims_.conv_channels()) * (dims_.conv_kernel - 1) * 2;
    gdn_layer_pitch_ = gdn_rec_bytes_ + align256(slots * gdn_conv_bytes_);
    gdn_mem_ = DeviceMemory(gdn_layers * gdn_layer_pitch_,
                            "Gated DeltaNet states (" + std::to_string(slots) + " conv slots per layer)");
    state_.gdn_slots = slots;
    {
        char* p = gdn_mem_.as<char>();
        for (int l = 0; l < L; ++l) {
            if (dims_.mixers[l] != MixerKind::GatedDeltaNet) continue;
            state_.gdn[l] = GdnStateLayer{reinterpret_cast<float*>(p), reinterpret_cast<bf16*>(p + gdn_rec_bytes_)};
            p += gdn_layer_pitch_;
        }
    }
    snapshot_mem_ = DeviceMemory(gdn_layers * (gdn_rec_bytes_ + gdn_conv_bytes_) * opt_.snapshot_slots,
                                 std::to_string(opt_.snapshot_slots) + " state snapshot slots");
    slot_pos_.assign(opt_.snapshot_slots, -1);
    if (opt_.verify_rows) allocate_verify_rows();
    const bool mtp = weights_->model().has_mtp;
    if (mtp) allocate_mtp();

    const int logit_rows = std::max(opt_.verify_rows, 1);
    const WorkspaceLayout layout = workspace_layout(dims_, opt_.prefill_chunk, opt_.context_max, logit_rows, mtp);
    workspace_mem_ = DeviceMemory(layout.total(), "activation workspace for a prefill chunk of " +
                                                      std::to_string(opt_.prefill_chunk) + " tokens");
    ws_ = carve_workspace(dims_, opt_.prefill_chunk, opt_.context_max, logit_rows, mtp, workspace_mem_.get());

    // step inputs/outputs: ids [chunk], pos, token, rng step, presence set [V]
    const size_t ids_bytes = align256(size_t(opt_.prefill_chunk) * 4);
    io_mem_ = DeviceMemory(ids_bytes + 3 * 256 + align256(dims_.vocab), "engine step buffers");
    char* io = io_mem_.as<char>();
    d_ids_ = reinterpret_cast<int32_t*>(io);
    d_pos_ = reinterpret_cast<int32_t*>(io + ids_bytes);
    d_tok_ = reinterpret_cast<int32_t*>(io + ids_bytes + 256);
    d_step_ = reinterpret_cast<int32_t*>(io + ids_bytes + 512);
    d_seen_ = reinterpret_cast<uint8_t*>(io + ids_bytes + 768);
    if (cudaHostAlloc(reinterpret_cast<void**>(&h_io_), (size_t(opt_.prefill_chunk) + 2 + DECODE_QUEUE) * 4,
                      cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        throw CudaError("cudaHostAlloc engine step buffers failed");
    }
    LAMPO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : token_ready_) LAMPO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    LAMPO_CUDA_CHECK(cudaMemsetAsync(io, 0, io_mem_.bytes(), stream_));
    // All zero: the ticket counters (gdn_counters, the sampler's) must be 0 between launches, and no
    // buffer holds stale bytes (expert ids stay valid indices even when LAMPO_OMIT_OPS skips the router).
    LAMPO_CUDA_CHECK(cudaMemsetAsync(workspace_mem_.get(), 0, workspace_mem_.bytes(), stream_));
    sampling_ = SamplingConfig{0.f, 0, 1.f, 0.f, 0.f, 0};
    reset();
}

Engine::~Engine() {
    if (stream_) cudaStreamSynchronize(stream_);
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    if (graph_) cudaGraphDestroy(graph_);
    for (const auto& by_size : verify_exec_)
        for (cudaGraphExec_t e : by_size)
            if (e) cudaGraphExecDestroy(e);
    for (cudaGraphExec_t e : draft_exec_)
        if (e) cudaGraphExecDestroy(e);
    if (h_io_) cudaFreeHost(h_io_);
    if (h_mtp_) cudaFreeHost(h_mtp_);
    for (cudaEvent_t e : token_ready_)
        if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
}

size_t Engine::kv_elems() const { return size_t(dims_.n_kv_heads) * opt_.context_max * dims_.head_dim; }

size_t Engine::kv_layer_bytes() const { return 2 * (align256(kv_elems()) + align256(kv_elems() / KV_GROUP * 2)); }

KvCacheLayer Engine::kv_layer_at(char* p) const {
    const size_t kv_bytes = align256(kv_elems()), scale_bytes = align256(kv_elems() / KV_GROUP * 2);
    return KvCacheLayer{reinterpret_cast<uint8_t*>(p), reinterpret_cast<uint8_t*>(p + kv_bytes),
                        reinterpret_cast<half*>(p + 2 * kv_bytes), reinterpret_cast<half*>(p + 2 * kv_bytes + scale_bytes)};
}

size_t Engine::state_bytes() const {
    size_t kv = 0;
    for (const auto& m : kv_mem_) kv += m.bytes();
    return kv + gdn_mem_.bytes() + snapshot_mem_.bytes() + verify_mem_.bytes() + mtp_mem_.bytes();
}

// ---- state ---------------------------------------------------------------------------------
void Engine::write_position() {
    h_io_[opt_.prefill_chunk] = pos_;
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_pos_, &h_io_[opt_.prefill_chunk], 4, cudaMemcpyHostToDevice,
                                     stream_));
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the pinned word is reused right away
}

void Engine::reset() {
    if (queued_ > 0) {  // queued decode steps run to their end; their samples are dropped
        LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
        queued_ = 0;
    }
    settle_window(true);
    LAMPO_CUDA_CHECK(cudaMemsetAsync(gdn_mem_.get(), 0, gdn_mem_.bytes(), stream_));
    pos_ = 0;
    held_row_ = -1;
    write_position();
}

void Engine::check_slot(int slot) const {
    if (slot < 0 || slot >= opt_.snapshot_slots) {
        throw std::out_of_range("snapshot slot " + std::to_string(slot) + " out of range (engine has " +
                                std::to_string(opt_.snapshot_slots) + ")");
    }
}

// A snapshot holds per GDN layer [recurrent | conv]: the recurrent state and the conv ring's slot live
// at its position: two strided copies (the layers' states are gdn_layer_pitch_ apart) each way.
void Engine::copy_gdn_states(int slot, int position, bool into_ring) {
    const size_t layers = size_t(dims_.count(MixerKind::GatedDeltaNet));
    if (layers == 0) return;
    const size_t ring_slot = size_t(position % state_.gdn_slots), snap_pitch = gdn_rec_bytes_ + gdn_conv_bytes_;
    char* snap = snapshot_mem_.as<char>() + size_t(slot) * layers * snap_pitch;
    char* ring = gdn_mem_.as<char>();
    char* rec = ring;
    char* conv = ring + gdn_rec_bytes_ + ring_slot * gdn_conv_bytes_;
    auto copy = [&](char* ring_part, char* snap_part, size_t width) {
        if (into_ring) {
            LAMPO_CUDA_CHECK(cudaMemcpy2DAsync(ring_part, gdn_layer_pitch_, snap_part, snap_pitch, width, layers,
                                               cudaMemcpyDeviceToDevice, stream_));
        } else {
            LAMPO_CUDA_CHECK(cudaMemcpy2DAsync(snap_part, snap_pitch, ring_part, gdn_layer_pitch_, width, layers,
                                               cudaMemcpyDeviceToDevice, stream_));
        }
    };
    copy(rec, snap, gdn_rec_bytes_);
    copy(conv, snap + gdn_rec_bytes_, gdn_conv_bytes_);
}

void Engine::snapshot(int slot) {
    require_idle("snapshot");
    check_slot(slot);
    settle_window();
    copy_gdn_states(slot, pos_, false);
    slot_pos_[slot] = pos_;
    mtp_snapshot(slot);
}

void Engine::restore(int slot) {
    require_idle("restore");
    check_slot(slot);
    if (slot_pos_[slot] < 0) throw std::invalid_argument("snapshot slot " + std::to_string(slot) + " is empty");
    settle_window(true);
    pos_ = slot_pos_[slot];
    copy_gdn_states(slot, pos_, true);
    mtp_restore(slot);
    write_position();
}

int Engine::snapshot_position(int slot) const {
    check_slot(slot);
    return slot_pos_[slot];
}

// ---- sampling ------------------------------------------------------------------------------
void Engine::set_sampling(const SamplingConfig& cfg) { sampling_ = cfg; }

void Engine::begin_generation() {
    require_idle("begin_generation");
    LAMPO_CUDA_CHECK(cudaMemsetAsync(d_seen_, 0, dims_.vocab, stream_));
    LAMPO_CUDA_CHECK(cudaMemsetAsync(d_step_, 0, 4, stream_));
    if (d_draft_step_) LAMPO_CUDA_CHECK(cudaMemsetAsync(d_draft_step_, 0, 4, stream_));
}

void Engine::sample(OpTimer* timer) {
    if (timer) timer->begin(OpFamily::Sampling);
    sample_token(ws_.logits, dims_.vocab, dims_.vocab_real, sampling_, d_seen_, d_step_, d_tok_,
                 ws_.sampling_scratch, stream_);
    LAMPO_CHECK_LAUNCH("sample_token");
    if (timer) timer->end();
}

int32_t* Engine::token_out(int slot) const { return &h_io_[opt_.prefill_chunk + 2 + slot]; }

void Engine::copy_token_out(int slot) {
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(token_out(slot), d_tok_, 4, cudaMemcpyDeviceToHost, stream_));
    LAMPO_CUDA_CHECK(cudaEventRecord(token_ready_[slot], stream_));
}

int Engine::read_token() {
    copy_token_out(0);
    LAMPO_CUDA_CHECK(cudaEventSynchronize(token_ready_[0]));
    return *token_out(0);
}

void Engine::require_idle(const char* op) const {
    if (queued_ > 0) {
        throw std::logic_error(std::string(op) + ": " + std::to_string(queued_) +
                               " decode step(s) are still queued (decode_collect them first)");
    }
}

// ---- prefill -------------------------------------------------------------------------------
ForwardStep Engine::open_window(const char* op, const int32_t* ids, int n, MtpStep& mtp) {
    if (pos_ + n > opt_.context_max) {
        throw std::out_of_range(std::string(op) + ": position " + std::to_string(pos_) + " + " + std::to_string(n) +
                                " tokens exceeds the context of " + std::to_string(opt_.context_max));
    }
    for (int i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= dims_.vocab) {
            throw std::invalid_argument(std::string(op) + ": token id " + std::to_string(ids[i]) + " at index " +
                                        std::to_string(i) + " is outside the vocabulary [0, " +
                                        std::to_string(dims_.vocab) + ")");
        }
    }
    settle_window();
    std::memcpy(h_io_, ids, size_t(n) * 4);
    h_io_[opt_.prefill_chunk] = pos_;
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_ids_, h_io_, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_pos_, &h_io_[opt_.prefill_chunk], 4, cudaMemcpyHostToDevice, stream_));
    ForwardStep step;
    step.T = n;
    step.d_ids = d_ids_;
    step.d_pos = d_pos_;
    step.pos0 = pos_;
    if (mtp_hidden_) {
        move_held_row(0);
        step.hidden_out = hidden_row(1);  // rows 1..n, after the held row
    }
    mtp = mtp_hidden_ ? mtp_window(n) : MtpStep{};
    return step;
}

void Engine::require_weights() const {
    if (!weights_->ready()) {
        throw std::logic_error("engine: weights are not loaded (call finish_loading or random_weights)");
    }
}

int Engine::prefill(const int32_t* ids, int n, bool sample_next) {
    require_weights();
    require_idle("prefill");
    if (n < 1 || n > opt_.prefill_chunk) {
        throw std::invalid_argument("prefill: " + std::to_string(n) + " tokens; a chunk holds 1.." +
                                    std::to_string(opt_.prefill_chunk));
    }
    MtpStep mtp;
    ForwardStep step = open_window("prefill", ids, n, mtp);
    step.logits = sample_next;
    step.routing_out = routing_mem_.as<int32_t>();
    model_forward(dims_, weights_->model(), state_, ws_, step, stream_, nullptr);
    if (step.routing_out) {
        routing_.resize(size_t(dims_.n_layers()) * n * dims_.top_k);
        LAMPO_CUDA_CHECK(cudaMemcpyAsync(routing_.data(), step.routing_out, routing_.size() * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, stream_));
    }
    if (sample_next) sample(nullptr);
    launch_pdl("advance_position", advance_position, 1, 1, 0, stream_, d_pos_, n);
    LAMPO_CHECK_LAUNCH("advance_position");
    if (mtp.T) mtp_forward(dims_, weights_->model(), mtp_kv_, opt_.context_max, ws_, mtp, stream_, nullptr);
    const int token = sample_next ? read_token() : -1;
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    pos_ += n;
    return token;
}

void Engine::set_record_routing(bool on) {
    if (on && !dims_.moe) throw std::invalid_argument("record_routing: the model has no MoE layers");
    routing_mem_ = on ? DeviceMemory(size_t(dims_.n_layers()) * opt_.prefill_chunk * dims_.top_k * sizeof(int32_t),
                                     "routing record")
                      : DeviceMemory();
    routing_.clear();
}

// ---- decode --------------------------------------------------------------------------------
void Engine::decode_body(OpTimer* timer) {
    if (mtp_hidden_) {
        MtpStep m = decode_mtp_step();
        mtp_forward(dims_, weights_->model(), mtp_kv_, opt_.context_max, ws_, m, stream_, timer);
    }
    ForwardStep step;
    step.T = 1;
    step.d_ids = d_tok_;
    step.d_pos = d_pos_;
    step.pos0 = -1;  // unused: T = 1 reads positions from d_pos
    step.logits = true;
    step.hidden_out = mtp_hidden_ ? hidden_row(1) : nullptr;  // the held row after the step
    model_forward(dims_, weights_->model(), state_, ws_, step, stream_, timer);
    sample(timer);
    launch_pdl("advance_position", advance_position, 1, 1, 0, stream_, d_pos_, 1);
    LAMPO_CHECK_LAUNCH("advance_position");
    if (mtp_hidden_) {
        launch_pdl("advance_position", advance_position, 1, 1, 0, stream_, d_mtp_pos_ + GEMV_MAX_T, 1);
        LAMPO_CHECK_LAUNCH("advance_position (MTP)");
    }
}

cudaGraph_t Engine::capture(const std::function<void()>& body) {
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // capture starts on an idle stream
    LAMPO_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
        body();
    } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream_, &broken);
        if (broken) cudaGraphDestroy(broken);
        cudaGetLastError();
        throw;
    }
    cudaGraph_t g = nullptr;
    LAMPO_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    return g;
}

void Engine::install_graph(cudaGraphExec_t& exec, cudaGraph_t g, const char* what) {
    if (exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(exec, g, &info) == cudaSuccess) return;
        cudaGetLastError();
        cudaGraphExecDestroy(exec);
        exec = nullptr;
    }
    const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
    if (err != cudaSuccess) {
        cudaGraphDestroy(g);
        exec = nullptr;
        cuda_check(err, what, __FILE__, __LINE__);
    }
}

void Engine::launch_captured(cudaGraphExec_t& exec, bool stale, const std::function<void()>& body, const char* what) {
    if (!exec || stale) {
        cudaGraph_t g = capture(body);
        install_graph(exec, g, what);
        cudaGraphDestroy(g);
    }
    LAMPO_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

// The step's graph bakes in the sampling settings (captured again when they change).
void Engine::ensure_decode_graph() {
    if (graph_exec_ && same_sampling(sampling_, graph_sampling_)) return;
    cudaGraph_t g = capture([this] { decode_body(nullptr); });
    install_graph(graph_exec_, g, "cudaGraphInstantiate (decode step)");
    if (graph_) cudaGraphDestroy(graph_);
    graph_ = g;
    graph_sampling_ = sampling_;

    size_t n = 0;
    LAMPO_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    LAMPO_CUDA_CHECK(cudaGraphGetNodes(graph_, nodes.data(), &n));
    graph_info_ = DecodeGraphInfo{int(n), 0};
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        LAMPO_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
        graph_info_.kernels += type == cudaGraphNodeTypeKernel;
    }
}

void Engine::feed_token(int token) {
    if (token < 0) return;
    if (token >= dims_.vocab) {
        throw std::invalid_argument("decode: token id " + std::to_string(token) +
                                    " is outside the vocabulary [0, " + std::to_string(dims_.vocab) + ")");
    }
    h_io_[opt_.prefill_chunk + 1] = token;
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_tok_, &h_io_[opt_.prefill_chunk + 1], 4,
                                     cudaMemcpyHostToDevice, stream_));
}

int Engine::decode(int token) {
    require_idle("decode");
    decode_submit(token);
    return decode_collect();
}

void Engine::decode_submit(int token) {
    require_weights();
    if (queued_ == DECODE_QUEUE) {
        throw std::logic_error("decode_submit: " + std::to_string(DECODE_QUEUE) +
                               " steps are queued already (decode_collect one first)");
    }
    if (pos_ >= opt_.context_max) {
        throw std::out_of_range("decode: the context of " + std::to_string(opt_.context_max) +
                                " tokens is full");
    }
    if (token >= 0 && queued_ > 0)  // the pinned input word would be rewritten before its copy ran
        throw std::logic_error("decode_submit: a token can be fed only when no step is queued");
    settle_window();
    feed_token(token);
    if (queued_ == 0) {
        prepare_decode_mtp();
        ensure_decode_graph();  // a new capture needs an idle stream
    } else if (!graph_exec_ || !same_sampling(sampling_, graph_sampling_))
        throw std::logic_error("decode_submit: the sampling settings changed while steps are queued");
    LAMPO_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
    copy_token_out((oldest_ + queued_) % DECODE_QUEUE);
    queued_ += 1;
    pos_ += 1;
}

int Engine::decode_collect() {
    if (queued_ == 0) throw std::logic_error("decode_collect: no decode step is queued");
    LAMPO_CUDA_CHECK(cudaEventSynchronize(token_ready_[oldest_]));
    const int token = *token_out(oldest_);
    oldest_ = (oldest_ + 1) % DECODE_QUEUE;
    queued_ -= 1;
    return token;
}

std::vector<float> Engine::logits() {
    std::vector<float> out(dims_.vocab);
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    LAMPO_CUDA_CHECK(cudaMemcpy(out.data(), ws_.logits, out.size() * 4, cudaMemcpyDeviceToHost));
    return out;
}

DecodeGraphInfo Engine::decode_graph_info() {
    require_idle("decode_graph_info");
    ensure_decode_graph();
    return graph_info_;
}

// ---- profiling and bench helpers -----------------------------------------------------------
std::vector<std::pair<std::string, double>> Engine::profile_decode(int steps, int token) {
    require_weights();
    require_idle("profile_decode");
    if (steps < 1) throw std::invalid_argument("profile_decode: steps must be >= 1");
    settle_window();
    if (pos_ + steps > opt_.context_max) throw std::out_of_range("profile_decode: context full");
    feed_token(token);
    prepare_decode_mtp();
    OpTimer timer(stream_);
    double total_ms = 0.0;
    for (int i = 0; i < steps; ++i) {
        total_ms += timed_ms([&] { decode_body(&timer); });
        timer.collect();
        pos_ += 1;
    }
    return family_means(timer, steps, total_ms);
}

double Engine::timed_ms(const std::function<void()>& body) {
    cudaEvent_t start, stop;
    LAMPO_CUDA_CHECK(cudaEventCreate(&start));
    LAMPO_CUDA_CHECK(cudaEventCreate(&stop));
    LAMPO_CUDA_CHECK(cudaEventRecord(start, stream_));
    body();
    LAMPO_CUDA_CHECK(cudaEventRecord(stop, stream_));
    LAMPO_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    LAMPO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms;
}

std::vector<std::pair<std::string, double>> Engine::family_means(const OpTimer& timer, int steps, double total_ms) {
    std::vector<std::pair<std::string, double>> out;
    for (int f = 0; f < int(OpFamily::Count); ++f) {
        out.emplace_back(op_family_name(OpFamily(f)), timer.total_ms()[f] / steps);
    }
    out.emplace_back("step_total", total_ms / steps);
    return out;
}

void Engine::fill_state_random(int depth, uint64_t seed) {
    require_idle("fill_state_random");
    if (depth < 0 || depth > opt_.context_max) {
        throw std::out_of_range("fill_state_random: depth " + std::to_string(depth) +
                                " outside the context of " + std::to_string(opt_.context_max));
    }
    settle_window(true);
    const size_t kv_elems = this->kv_elems();
    uint64_t s = seed;
    for (const KvCacheLayer& kv : state_.kv) {
        if (!kv.k) continue;
        fill_kv_codes(kv.k, kv_elems, ++s, stream_);
        fill_kv_codes(kv.v, kv_elems, ++s, stream_);
        fill_uniform_f16(kv.k_scale, kv_elems / KV_GROUP, 0.002f, 0.02f, ++s, stream_);
        fill_uniform_f16(kv.v_scale, kv_elems / KV_GROUP, 0.002f, 0.02f, ++s, stream_);
        LAMPO_CHECK_LAUNCH("fill_state_random (KV cache)");
    }
    for (const GdnStateLayer& g : state_.gdn) {  // the recurrent state, every slot of the conv ring
        if (!g.recurrent) continue;
        fill_uniform_f32(g.recurrent, gdn_rec_bytes_ / 4, -0.02f, 0.02f, ++s, stream_);
        fill_uniform_bf16(g.conv, state_.gdn_slots * gdn_conv_bytes_ / 2, -0.5f, 0.5f, ++s, stream_);
        LAMPO_CHECK_LAUNCH("fill_state_random (GDN state)");
    }
    pos_ = depth;
    held_row_ = -1;  // no trunk row ran: no MTP drafts until one does
    write_position();
}

bool Engine::healthy() {
    return cudaStreamSynchronize(stream_) == cudaSuccess && cudaPeekAtLastError() == cudaSuccess;
}

void Engine::synchronize() { LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- device-level helpers ------------------------------------------------------------------
DeviceInfo device_info() {
    int dev = 0;
    LAMPO_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    LAMPO_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    return DeviceInfo{p.name, p.multiProcessorCount, p.major, p.minor, p.totalGlobalMem, device_code_arch()};
}

std::pair<size_t, size_t> mem_info() {
    size_t free_b = 0, total_b = 0;
    LAMPO_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return {free_b, total_b};
}

double measure_copy_bandwidth(size_t bytes, int iters) {
    DeviceMemory a(bytes, "bandwidth probe source"), b(bytes, "bandwidth probe destination");
    cudaStream_t s;
    LAMPO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    LAMPO_CUDA_CHECK(cudaEventCreate(&start));
    LAMPO_CUDA_CHECK(cudaEventCreate(&stop));
    LAMPO_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, s));
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
    LAMPO_CUDA_CHECK(cudaEventRecord(start, s));
    for (int i = 0; i < iters; ++i) {
        LAMPO_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
    }
    LAMPO_CUDA_CHECK(cudaEventRecord(stop, s));
    LAMPO_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    LAMPO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(s);
    return 2.0 * double(bytes) * iters / (double(ms) * 1e-3);
}

void reset_device() { LAMPO_CUDA_CHECK(cudaDeviceReset()); }

}  // namespace lampo
