// engine_mtp.cu - Engine: the MTP module's state and drafts (engine.h).
//
// mtp_mem_: the MTP layer's INT8 KV cache (as a trunk attention layer's), then mtp_hidden_
// [prefill_chunk + 1, H], mtp_chain_ [H], slot_held_ [snapshot_slots, H] (bf16), then
// d_mtp_ids_ [GEMV_MAX_T + 1], d_mtp_pos_ [GEMV_MAX_T + 1] and d_draft_step_ [1] (int32, 256 bytes
// each), then draft_q_: GEMV_MAX_T draft distributions (count, SAMPLE_MAX_K ids, SAMPLE_MAX_K probs).
//
// The held row: a forward writes its final-normed rows to mtp_hidden_ rows 1..n (hidden_out),
// after row 0 holds the previous forward's last row, so the MTP rows a forward completes read
// [held, rows 1..n-1] as one contiguous block; held_row_ then names row n (accept(keep): row
// keep). A decode step (the graph) reads the held row from row 1, where prepare_decode_mtp puts it
// before an idle submit, runs the MTP row of the fed token first and then writes its own hidden to
// row 1; its MTP position is a device counter of its own (d_mtp_pos_[GEMV_MAX_T]) that each step
// advances.
#include "engine/engine.h"

#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/matmul.cuh"
#include "kernels/ops.h"

namespace lampo {

bool Engine::has_mtp() const { return weights_->model().has_mtp; }

void Engine::allocate_mtp() {
    const size_t H = size_t(dims_.hidden), b16 = 2;
    const size_t hidden_bytes = align256((size_t(opt_.prefill_chunk) + 1) * H * b16);
    const size_t chain_bytes = align256(H * b16), held_bytes = align256(size_t(opt_.snapshot_slots) * H * b16);
    const size_t ids_bytes = align256((GEMV_MAX_T + 1) * 4);
    const size_t q_bytes = align256(DRAFT_DISTRIBUTION_BYTES);
    mtp_mem_ = DeviceMemory(kv_layer_bytes() + hidden_bytes + chain_bytes + held_bytes + 3 * ids_bytes +
                                GEMV_MAX_T * q_bytes,
                            "MTP layer KV cache (" + std::to_string(opt_.context_max) + " tokens) and rows");
    char* p = mtp_mem_.as<char>();
    mtp_kv_ = kv_layer_at(p);
    p += kv_layer_bytes();
    mtp_hidden_ = reinterpret_cast<bf16*>(p);
    p += hidden_bytes;
    mtp_chain_ = reinterpret_cast<bf16*>(p);
    p += chain_bytes;
    slot_held_ = reinterpret_cast<bf16*>(p);
    p += held_bytes;
    d_mtp_ids_ = reinterpret_cast<int32_t*>(p);
    d_mtp_pos_ = reinterpret_cast<int32_t*>(p + ids_bytes);
    d_draft_step_ = reinterpret_cast<int32_t*>(p + 2 * ids_bytes);
    p += 3 * ids_bytes;
    for (DraftDistribution& q : draft_q_) {
        q = draft_distribution_at(p);
        p += q_bytes;
    }
    LAMPO_CUDA_CHECK(cudaMemset(d_draft_step_, 0, 4));  // before the engine's stream exists
    slot_held_row_.assign(opt_.snapshot_slots, -1);
    if (cudaHostAlloc(reinterpret_cast<void**>(&h_mtp_), 2 * (GEMV_MAX_T + 1) * 4, cudaHostAllocDefault) !=
        cudaSuccess) {
        cudaGetLastError();
        throw CudaError("cudaHostAlloc MTP step buffers failed");
    }
}

bf16* Engine::hidden_row(int r) const { return mtp_hidden_ + size_t(r) * dims_.hidden; }

void Engine::copy_hidden(bf16* dst, const bf16* src) {
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(dims_.hidden) * 2, cudaMemcpyDeviceToDevice, stream_));
}

void Engine::move_held_row(int to) {
    if (held_row_ < 0) return;
    if (held_row_ != to) copy_hidden(hidden_row(to), hidden_row(held_row_));
    held_row_ = to;
}

MtpStep Engine::mtp_window(int n) {
    // Row t of the MTP pass: the hidden of trunk position pos_ - 1 + t and the id fed at pos_ + t.
    // Without a held row (the conversation's first chunk) the pass starts one row later.
    const int skip = held_row_ == 0 ? 0 : 1;
    MtpStep m;
    m.T = n - skip;
    held_row_ = n;
    if (m.T < 1) return MtpStep{};
    m.pos0 = pos_ - 1 + skip;
    h_mtp_[0] = m.pos0;  // the caller synchronizes before the next call rewrites it
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_mtp_pos_, h_mtp_, 4, cudaMemcpyHostToDevice, stream_));
    m.d_ids = d_ids_ + skip;
    m.d_pos = d_mtp_pos_;
    m.hiddens = hidden_row(skip);
    m.out = nullptr;  // only the cache rows are kept
    return m;
}

std::vector<int32_t> Engine::mtp_draft(int token, int k) {
    if (!mtp_hidden_) throw std::logic_error("mtp_draft: the MTP module is not loaded");
    require_weights();
    require_idle("mtp_draft");
    if (k < 1 || k > GEMV_MAX_T) {
        throw std::invalid_argument("mtp_draft: " + std::to_string(k) + " drafts; the chain makes 1.." +
                                    std::to_string(GEMV_MAX_T));
    }
    if (held_row_ < 0) throw std::logic_error("mtp_draft: no trunk row has run since the reset");
    if (token < 0 || token >= dims_.vocab) {
        throw std::invalid_argument("mtp_draft: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                                    std::to_string(dims_.vocab) + ")");
    }
    if (pos_ - 1 + k > opt_.context_max) {
        throw std::out_of_range("mtp_draft: " + std::to_string(k) + " drafts from position " + std::to_string(pos_) +
                                " exceed the context of " + std::to_string(opt_.context_max));
    }
    settle_window();  // the chain's passes overwrite the logits a verify window left
    move_held_row(0);  // where the chain's first step reads it
    h_mtp_[0] = token;
    for (int i = 0; i < k; ++i) h_mtp_[GEMV_MAX_T + 1 + i] = pos_ - 1 + i;
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_mtp_ids_, h_mtp_, 4, cudaMemcpyHostToDevice, stream_));
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_mtp_pos_, h_mtp_ + GEMV_MAX_T + 1, size_t(k) * 4, cudaMemcpyHostToDevice,
                                     stream_));
    const int rows = draft_vocab_;
    const bool sampled = sampling_.temperature > 0.0f;
    const int V = rows ? rows : dims_.vocab, v_real = rows ? rows : dims_.vocab_real;
    auto body = [&] {
        for (int i = 0; i < k; ++i) {
            MtpStep m;
            m.T = 1;
            m.d_ids = d_mtp_ids_ + i;
            m.d_pos = d_mtp_pos_ + i;
            m.pos0 = -1;  // unused: one row reads its position from d_pos
            m.hiddens = i == 0 ? hidden_row(0) : mtp_chain_;
            m.out = mtp_chain_;
            m.logits = ws_.logits;
            m.logit_rows = rows;
            mtp_forward(dims_, weights_->model(), mtp_kv_, opt_.context_max, ws_, m, stream_, nullptr);
            if (sampled) {
                sample_draft(ws_.logits, V, v_real, sampling_, d_seen_, d_draft_step_, d_mtp_ids_ + i + 1, draft_q_[i],
                             ws_.sampling_scratch, stream_);
            } else {
                argmax_rows(ws_.logits, 1, V, v_real, d_mtp_ids_ + i + 1, stream_);
            }
            LAMPO_CHECK_LAUNCH("MTP draft");
        }
    };
    if (opt_.speculative_graphs) {  // one graph per chain length: fixed pointers, positions on the device
        const bool stale = draft_exec_vocab_[k] != rows || !same_sampling(sampling_, draft_sampling_[k]);
        launch_captured(draft_exec_[k], stale, body, "cudaGraphInstantiate (MTP draft chain)");
        draft_exec_vocab_[k] = rows;
        draft_sampling_[k] = sampling_;
    } else {
        body();
    }
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(h_mtp_, d_mtp_ids_ + 1, size_t(k) * 4, cudaMemcpyDeviceToHost, stream_));
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<int32_t> drafts(h_mtp_, h_mtp_ + k);
    sampled_drafts_ = sampled ? drafts : std::vector<int32_t>{};
    return drafts;
}

void Engine::set_draft_vocab(int n) {
    if (n != 0 && (n < LQ_TILE_ROWS || n % LQ_TILE_ROWS != 0 || n > dims_.vocab_real)) {
        throw std::invalid_argument("set_draft_vocab: the draft vocabulary must be 0 (every id) or a multiple of " +
                                    std::to_string(LQ_TILE_ROWS) + " up to the real vocabulary of " +
                                    std::to_string(dims_.vocab_real) + ", got " + std::to_string(n));
    }
    draft_vocab_ = n;
}

MtpStep Engine::decode_mtp_step() const {
    MtpStep m;
    m.T = 1;
    m.d_ids = d_tok_;  // the fed token, read before the step's sample replaces it
    m.d_pos = d_mtp_pos_ + GEMV_MAX_T;  // the decode steps' own counter
    m.pos0 = -1;  // unused: one row reads its position from d_pos
    m.hiddens = hidden_row(1);  // the held row, then this step's hidden
    m.out = nullptr;  // only the cache row is kept
    return m;
}

void Engine::prepare_decode_mtp() {
    if (!mtp_hidden_) return;
    move_held_row(1);
    held_row_ = 1;  // after the step, with or without a held row before it
    int32_t* word = h_mtp_ + 2 * (GEMV_MAX_T + 1) - 1;  // read by its copy before the next idle submit
    *word = pos_ - 1;
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_mtp_pos_ + GEMV_MAX_T, word, 4, cudaMemcpyHostToDevice, stream_));
}

void Engine::mtp_snapshot(int slot) {
    if (!mtp_hidden_) return;
    slot_held_row_[slot] = held_row_ < 0 ? -1 : 0;
    if (held_row_ >= 0) copy_hidden(slot_held_ + size_t(slot) * dims_.hidden, hidden_row(held_row_));
}

void Engine::mtp_restore(int slot) {
    if (!mtp_hidden_) return;
    held_row_ = slot_held_row_[slot];
    if (held_row_ >= 0) copy_hidden(hidden_row(0), slot_held_ + size_t(slot) * dims_.hidden);
}

}  // namespace lampo
