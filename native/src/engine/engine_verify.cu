// engine_verify.cu - Engine: the speculative verify window (engine.h). verify runs the window
// through model_forward with ForwardStep::rows, so each GDN layer leaves the conv state after every
// row in the next slots of its ring (ops.h, GdnStates: slot pos % slots is the state before position
// pos), and the LM head fills one logits row per token; the sampler draws each row's token, row
// after row, and the MTP pass runs the window's MTP rows: one CUDA graph per window size. accept
// moves the position (the kept row's conv states are already the live slot's). The KV rows past
// the kept position are simply rewritten by later steps, and so are the MTP rows that the window
// ran for its rejected drafts.
//
// The GDN layers keep one recurrent state each, which the window leaves as it found it: it writes
// the tokens' records instead (ops.h, GdnStates::records). The state after the kept rows is
// rebuilt in place from them (gdn_replay, one launch for every layer) when the window is settled:
// by the next forward or snapshot, once for the last accept (which may take drafts back), or for
// the whole window when none came. One state read and written a round, where a ring of R + 1
// states would cost R more states of memory.
//
// verify_mem_: the R row tokens (R = verify_rows), the presence set's copy, then per GDN layer R
// tokens' records.
#include "engine/engine.h"

#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/ops.h"

namespace lampo {

void Engine::allocate_verify_rows() {
    const size_t out_bytes = align256(size_t(opt_.verify_rows) * 4), seen_bytes = align256(size_t(dims_.vocab));
    const int gdn_layers = dims_.count(MixerKind::GatedDeltaNet);
    gdn_records_pitch_ =
        gdn_layers ? align256(size_t(opt_.verify_rows) * gdn_record_floats(dims_.gdn_k_heads, dims_.gdn_v_heads) * 4) : 0;
    verify_mem_ = DeviceMemory(out_bytes + seen_bytes + gdn_layers * gdn_records_pitch_,
                               "verify window tokens, presence set and GDN records");
    d_verify_out_ = verify_mem_.as<int32_t>();
    seen_backup_ = reinterpret_cast<uint8_t*>(verify_mem_.as<char>() + out_bytes);
    char* records = verify_mem_.as<char>() + out_bytes + seen_bytes;
    for (int l = 0; l < dims_.n_layers(); ++l) {
        if (dims_.mixers[l] != MixerKind::GatedDeltaNet) continue;
        state_.gdn[l].records = reinterpret_cast<float*>(records);
        records += gdn_records_pitch_;
    }
}

std::vector<int32_t> Engine::verify(const int32_t* ids, int n, bool mtp_drafts) {
    return run_verify(ids, n, mtp_drafts);
}

std::vector<std::pair<std::string, double>> Engine::profile_verify(const int32_t* ids, int n, int steps) {
    if (steps < 1) throw std::invalid_argument("profile_verify: steps must be >= 1");
    OpTimer timer(stream_);
    double total_ms = 0.0;
    for (int i = 0; i < steps; ++i) {
        run_verify(ids, n, false, &timer, &total_ms);
        timer.collect();
        accept(1);
    }
    return family_means(timer, steps, total_ms);
}

std::vector<int32_t> Engine::run_verify(const int32_t* ids, int n, bool mtp_drafts, OpTimer* timer,
                                        double* body_ms) {
    require_weights();
    require_idle("verify");
    if (opt_.verify_rows == 0) throw std::logic_error("verify: the engine keeps no verify rows (verify_rows = 0)");
    if (n < 2 || n > opt_.verify_rows) {
        throw std::invalid_argument("verify: a window of " + std::to_string(n) + " tokens; this engine verifies 2.." +
                                    std::to_string(opt_.verify_rows));
    }
    // Rows judging sampled drafts by their q: only for the drafts that q drew (the last chain's)
    const bool by_q = mtp_drafts && sampling_.temperature > 0.0f;
    if (by_q && sampled_drafts_ != std::vector<int32_t>(ids + 1, ids + n)) {
        throw std::logic_error("verify: the drafts are not the last MTP chain's sampled drafts");
    }
    sampled_drafts_.clear();
    MtpStep mtp;  // the MTP rows of all n ids: those up to a kept row are right whatever is kept
    ForwardStep step = open_window("verify", ids, n, mtp);
    step.logits = true;
    step.rows = true;
    const bool penalised = sampling_.presence_penalty != 0.0f;
    auto body = [&] {
        model_forward(dims_, weights_->model(), state_, ws_, step, stream_, timer);
        if (penalised)  // the presence set before the rows mark theirs (accept puts it back)
            LAMPO_CUDA_CHECK(cudaMemcpyAsync(seen_backup_, d_seen_, dims_.vocab, cudaMemcpyDeviceToDevice, stream_));
        if (timer) timer->begin(OpFamily::Sampling);
        for (int i = 0; i < n; ++i) {
            const float* row = ws_.logits + size_t(i) * dims_.vocab;
            if (by_q && i + 1 < n) {  // the row's draft, d_ids_[i + 1], drawn from draft_q_[i]
                sample_verify_row(row, dims_.vocab, dims_.vocab_real, sampling_, d_seen_, d_step_, d_ids_ + i + 1,
                                  draft_q_[i], d_verify_out_ + i, ws_.sampling_scratch, stream_);
            } else {
                sample_token(row, dims_.vocab, dims_.vocab_real, sampling_, d_seen_, d_step_, d_verify_out_ + i,
                             ws_.sampling_scratch, stream_);
            }
            LAMPO_CHECK_LAUNCH("sample_token (verify row)");
        }
        if (timer) timer->end();
        if (mtp.T) mtp_forward(dims_, weights_->model(), mtp_kv_, opt_.context_max, ws_, mtp, stream_, timer);
    };
    // A graph per window size: its pointers are fixed, positions come from the device, the
    // sampling settings are baked in (a change updates the graphs), and the MTP pass has one shape
    // per size once a held row exists (without one it runs eagerly).
    if (timer) {
        *body_ms += timed_ms(body);
    } else if (opt_.speculative_graphs && (!mtp_hidden_ || mtp.T == n)) {
        launch_captured(verify_exec_[by_q][n], !same_sampling(sampling_, verify_sampling_[by_q][n]), body,
                        "cudaGraphInstantiate (verify window)");
        verify_sampling_[by_q][n] = sampling_;
    } else {
        body();
    }
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(h_io_, d_verify_out_, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<int32_t> tokens(h_io_, h_io_ + n);
    verify_tokens_ = tokens;
    verify_penalised_ = penalised;
    verify_start_ = pos_;
    verified_ = n;
    window_keep_ = n;
    pos_ += n;
    write_position();
    return tokens;
}

void Engine::accept(int keep) {
    require_idle("accept");
    if (keep < 1 || keep > verified_) {
        throw std::invalid_argument("accept: keep " + std::to_string(keep) + " of a verify window of " +
                                    std::to_string(verified_) + " rows" +
                                    (verified_ ? std::string() : std::string(" (none held: a forward or snapshot ran since)")));
    }
    if (verify_penalised_ && keep < verified_) {  // the presence set without the dropped rows' tokens
        LAMPO_CUDA_CHECK(cudaMemcpyAsync(d_seen_, seen_backup_, dims_.vocab, cudaMemcpyDeviceToDevice, stream_));
        for (int i = 0; i < keep; ++i) LAMPO_CUDA_CHECK(cudaMemsetAsync(d_seen_ + verify_tokens_[i], 1, 1, stream_));
    }
    pos_ = verify_start_ + keep;  // the conv states after row keep - 1 are at slot pos_ % slots
    window_keep_ = keep;          // the recurrent states after it: settle_window
    if (mtp_hidden_) held_row_ = keep;  // hidden row keep - 1 of the window
    write_position();
}

void Engine::settle() {
    require_idle("settle");
    settle_window();
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Engine::settle_window(bool drop) {
    const int keep = window_keep_;
    verified_ = 0;
    window_keep_ = 0;
    if (drop || keep == 0) return;
    int first = 0;
    while (first < dims_.n_layers() && dims_.mixers[first] != MixerKind::GatedDeltaNet) ++first;
    if (first == dims_.n_layers()) return;
    GdnReplay r;
    r.recurrent = state_.gdn[first].recurrent;  // the layers' rings gdn_layer_pitch_ apart, in order
    r.layer_pitch = gdn_layer_pitch_;
    r.records = state_.gdn[first].records;
    r.records_pitch = gdn_records_pitch_;
    r.layers = dims_.count(MixerKind::GatedDeltaNet);
    r.slots = 1;  // one recurrent state, updated in place
    r.pos = verify_start_;
    r.keep = keep;
    r.Hk = dims_.gdn_k_heads;
    r.Hv = dims_.gdn_v_heads;
    gdn_replay(r, stream_);
    LAMPO_CHECK_LAUNCH("gdn_replay");
}

std::vector<float> Engine::verify_logits() {
    if (verified_ == 0) throw std::logic_error("verify_logits: no verify window is held");
    std::vector<float> out(size_t(verified_) * dims_.vocab);
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(out.data(), ws_.logits, out.size() * 4, cudaMemcpyDeviceToHost, stream_));
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return out;
}

}  // namespace lampo
