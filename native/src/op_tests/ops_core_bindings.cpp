// ops_core_bindings.cpp - lampo._native_ops entry points for the core kernels (embedding, norms,
// attention prep / INT8 KV cache / decode / prefill, matrix products, activations, sampling), on
// numpy arrays: bf16 travels as uint16 bit patterns, fp16 as float16, INT8 as int8. Every call
// uploads its inputs, poisons its outputs (0xFF bytes: NaN for floats, -1 for ints), runs the
// launcher on a private stream and downloads the results. The bench_* functions time a kernel
// through a captured CUDA graph (which also checks that the launcher is capturable). Argument
// checks, the stream and the graph timing: op_helpers.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "kernels/linear.h"
#include "kernels/matmul.cuh"
#include "kernels/ops.h"
#include "op_tests/op_helpers.h"

namespace lampo {
namespace {

bf16* as_bf16(const DeviceBuffer& b) { return b.as<bf16>(); }

// ---- embedding, norms, activations ------------------------------------------------------------

py::array_t<float> py_embedding_gather(Arr<uint16_t> table, Arr<int32_t> ids) {
    const char* op = "embedding_gather";
    check_ndim(op, "table", table, 2);
    check_ndim(op, "ids", ids, 1);
    const int V = int(table.shape(0)), H = int(table.shape(1)), T = int(ids.shape(0));
    for (int t = 0; t < T; ++t) require(ids.at(t) >= 0 && ids.at(t) < V, op, "token id out of range");
    auto d_table = upload(table);
    auto d_ids = upload(ids);
    auto d_out = poisoned(size_t(T) * H * 4);
    OpStream st;
    embedding_gather(as_bf16(d_table), d_ids.as<int32_t>(), d_out.as<float>(), T, H, st.s);
    st.finish(op);
    return download<float>(d_out, {T, H});
}

py::array_t<uint16_t> py_rmsnorm(Arr<float> x, Arr<uint16_t> w, float eps) {
    const char* op = "rmsnorm";
    check_ndim(op, "x", x, 2);
    const int rows = int(x.shape(0)), n = int(x.shape(1));
    check_dim(op, "w", w.size(), n, "length");
    auto d_x = upload(x);
    auto d_w = upload(w);
    auto d_y = poisoned(size_t(rows) * n * 2);
    OpStream st;
    rmsnorm(d_x.as<float>(), as_bf16(d_w), as_bf16(d_y), rows, n, eps, st.s);
    st.finish(op);
    return download<uint16_t>(d_y, {rows, n});
}

py::tuple py_add_rmsnorm(Arr<float> residual, Arr<uint16_t> delta, Arr<uint16_t> w, float eps, bool set) {
    const char* op = set ? "set_rmsnorm" : "add_rmsnorm";
    check_ndim(op, "residual", residual, 2);
    const int rows = int(residual.shape(0)), n = int(residual.shape(1));
    check_dim(op, "delta", delta.size(), py::ssize_t(rows) * n, "size");
    check_dim(op, "w", w.size(), n, "length");
    auto d_r = upload(residual);
    auto d_d = upload(delta);
    auto d_w = upload(w);
    auto d_y = poisoned(size_t(rows) * n * 2);
    OpStream st;
    add_rmsnorm(d_r.as<float>(), as_bf16(d_d), as_bf16(d_w), as_bf16(d_y), rows, n, eps, st.s, 0, set);
    st.finish(op);
    return py::make_tuple(download<float>(d_r, {rows, n}), download<uint16_t>(d_y, {rows, n}));
}

py::array_t<float> py_residual_add(Arr<float> residual, Arr<uint16_t> delta) {
    const char* op = "residual_add";
    check_ndim(op, "residual", residual, 2);
    const int rows = int(residual.shape(0)), n = int(residual.shape(1));
    check_dim(op, "delta", delta.size(), py::ssize_t(rows) * n, "size");
    auto d_r = upload(residual);
    auto d_d = upload(delta);
    OpStream st;
    residual_add(d_r.as<float>(), as_bf16(d_d), rows, n, st.s);
    st.finish(op);
    return download<float>(d_r, {rows, n});
}

py::array_t<uint16_t> py_silu_mul(Arr<uint16_t> gu, bool interleaved) {
    const char* op = "silu_mul";
    check_ndim(op, "gu", gu, 2);
    const int T = int(gu.shape(0)), I = int(gu.shape(1) / 2);
    require(gu.shape(1) % 2 == 0, op, "gu must be [T, 2I]");
    auto d_gu = upload(gu);
    auto d_y = poisoned(size_t(T) * I * 2);
    OpStream st;
    silu_mul(as_bf16(d_gu), as_bf16(d_y), T, I, st.s, interleaved);
    st.finish(op);
    return download<uint16_t>(d_y, {T, I});
}

py::array_t<uint16_t> py_sigmoid_gate_mul(Arr<uint16_t> x, Arr<uint16_t> gate) {
    const char* op = "sigmoid_gate_mul";
    check_ndim(op, "x", x, 2);
    const int T = int(x.shape(0)), n = int(x.shape(1));
    check_dim(op, "gate", gate.size(), py::ssize_t(T) * n, "size");
    auto d_x = upload(x);
    auto d_g = upload(gate);
    auto d_y = poisoned(size_t(T) * n * 2);
    OpStream st;
    sigmoid_gate_mul(as_bf16(d_x), as_bf16(d_g), as_bf16(d_y), T, n, st.s);
    st.finish(op);
    return download<uint16_t>(d_y, {T, n});
}

// ---- attention ----------------------------------------------------------------------------------

struct CacheArgs {
    int nkv, context_max, D;
};

CacheArgs check_cache(const char* op, const Arr<int8_t>& kc, const Arr<int8_t>& vc, const Arr<uint16_t>& ks,
                      const Arr<uint16_t>& vs) {
    check_ndim(op, "k_cache", kc, 3);
    CacheArgs c{int(kc.shape(0)), int(kc.shape(1)), int(kc.shape(2))};
    require(vc.ndim() == 3 && vc.shape(0) == c.nkv && vc.shape(1) == c.context_max && vc.shape(2) == c.D, op,
            "v_cache must match k_cache's shape");
    for (const auto* s : {&ks, &vs})
        require(s->ndim() == 3 && s->shape(0) == c.nkv && s->shape(1) == c.context_max && s->shape(2) == c.D / KV_GROUP,
                op, "scales must be [nkv, context_max, D/64] float16");
    return c;
}

// The cache codes travel as the reference's signed q; the engine keeps each as the byte q + 128
// (offset binary, ops.h).
DeviceBuffer upload_kv_codes(const Arr<int8_t>& a) {
    py::array_t<uint8_t> bytes(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
    const int8_t* src = a.data();
    uint8_t* dst = bytes.mutable_data();
    for (py::ssize_t i = 0; i < a.size(); ++i) dst[i] = uint8_t(int(src[i]) + 128);
    return upload(Arr<uint8_t>(bytes));
}
py::array_t<int8_t> download_kv_codes(const DeviceBuffer& buf, const Shape& shape) {
    const auto bytes = download<uint8_t>(buf, shape);
    py::array_t<int8_t> codes(shape);
    const uint8_t* src = bytes.data();
    int8_t* dst = codes.mutable_data();
    for (py::ssize_t i = 0; i < codes.size(); ++i) dst[i] = int8_t(int(src[i]) - 128);
    return codes;
}

// fp16 scales travel as uint16 bit patterns inside the binding (numpy float16 <-> half).
Arr<uint16_t> half_bits(const py::array& a) {
    return Arr<uint16_t>(py::array(a).attr("view")(py::dtype("uint16")));
}

// attn_prep; with kv = (v, k_cache, v_cache, k_scale, v_scale) also the INT8 append, whose
// updated caches come back after (q, gate, k).
py::tuple py_attn_prep(Arr<uint16_t> qg, Arr<uint16_t> k_raw, Arr<uint16_t> q_norm_w, Arr<uint16_t> k_norm_w,
                       int pos0, int nq, int nkv, int rotary_dim, float theta, float eps, py::object kv) {
    const char* op = "attn_prep";
    check_ndim(op, "qg", qg, 2);
    check_ndim(op, "k_raw", k_raw, 2);
    const int T = int(qg.shape(0)), D = int(q_norm_w.size());
    check_dim(op, "qg", qg.shape(1), py::ssize_t(nq) * 2 * D, "width");
    check_dim(op, "k_raw", k_raw.shape(0), T, "rows");
    check_dim(op, "k_raw", k_raw.shape(1), py::ssize_t(nkv) * D, "width");
    check_dim(op, "k_norm_w", k_norm_w.size(), D, "length");
    auto d_qg = upload(qg);
    auto d_k = upload(k_raw);
    auto d_qw = upload(q_norm_w);
    auto d_kw = upload(k_norm_w);
    auto d_pos = device_int(pos0);
    auto d_q = poisoned(size_t(T) * nq * D * 2);
    auto d_gate = poisoned(size_t(T) * nq * D * 2);
    auto d_ko = poisoned(size_t(T) * nkv * D * 2);
    DeviceBuffer d_v, d_kc, d_vc, d_ks, d_vs;
    KvAppendTarget append;
    CacheArgs c{};
    if (!kv.is_none()) {
        const auto parts = kv.cast<py::tuple>();
        require(parts.size() == 5, op, "kv must be (v, k_cache, v_cache, k_scale, v_scale)");
        const auto v = parts[0].cast<Arr<uint16_t>>();
        const auto kc = parts[1].cast<Arr<int8_t>>(), vc = parts[2].cast<Arr<int8_t>>();
        const auto ks = half_bits(parts[3].cast<py::array>()), vs = half_bits(parts[4].cast<py::array>());
        c = check_cache(op, kc, vc, ks, vs);
        require(c.nkv == nkv && c.D == D, op, "the caches must be [nkv, context_max, D]");
        require(v.size() == py::ssize_t(T) * nkv * D, op, "v must hold [T, nkv, D] values");
        require(pos0 >= 0 && pos0 + T <= c.context_max, op, "rows past context_max");
        d_v = upload(v);
        d_kc = upload_kv_codes(kc);
        d_vc = upload_kv_codes(vc);
        d_ks = upload(ks);
        d_vs = upload(vs);
        append = {as_bf16(d_v), d_kc.as<uint8_t>(), d_vc.as<uint8_t>(), d_ks.as<half>(), d_vs.as<half>(),
                  c.context_max};
    }
    OpStream st;
    attn_prep(as_bf16(d_qg), as_bf16(d_k), as_bf16(d_qw), as_bf16(d_kw), d_pos.as<int32_t>(), as_bf16(d_q),
              as_bf16(d_gate), as_bf16(d_ko), T, nq, nkv, D, rotary_dim, theta, eps, st.s,
              kv.is_none() ? nullptr : &append);
    st.finish(op);
    py::tuple prep = py::make_tuple(download<uint16_t>(d_q, {T, nq, D}), download<uint16_t>(d_gate, {T, nq * D}),
                                    download<uint16_t>(d_ko, {T, nkv, D}));
    if (kv.is_none()) return prep;
    const Shape cs{c.nkv, c.context_max, c.D}, ss{c.nkv, c.context_max, c.D / KV_GROUP};
    auto f16 = [](py::array_t<uint16_t> a) { return py::array(a).attr("view")(py::dtype("float16")); };
    return py::make_tuple(prep[0], prep[1], prep[2], download_kv_codes(d_kc, cs), download_kv_codes(d_vc, cs),
                          f16(download<uint16_t>(d_ks, ss)), f16(download<uint16_t>(d_vs, ss)));
}

py::array_t<uint16_t> py_attn_int8(bool decode, Arr<uint16_t> q, Arr<uint16_t> gate, Arr<int8_t> k_cache,
                                   Arr<int8_t> v_cache, py::array k_scale, py::array v_scale, int pos0) {
    const char* op = decode ? "attn_decode_int8" : "attn_prefill_int8";
    const auto ks = half_bits(k_scale), vs = half_bits(v_scale);
    const CacheArgs c = check_cache(op, k_cache, v_cache, ks, vs);
    check_ndim(op, "q", q, 3);
    const int T = int(q.shape(0)), nq = int(q.shape(1));
    check_dim(op, "q", q.shape(2), c.D, "head dim");
    check_dim(op, "gate", gate.size(), py::ssize_t(T) * nq * c.D, "size");
    require(pos0 >= 0 && pos0 + T <= c.context_max, op, "query positions past context_max");
    auto d_q = upload(q);
    auto d_g = upload(gate);
    auto d_kc = upload_kv_codes(k_cache);
    auto d_vc = upload_kv_codes(v_cache);
    auto d_ks = upload(ks);
    auto d_vs = upload(vs);
    auto d_out = poisoned(size_t(T) * nq * c.D * 2);
    OpStream st;
    if (decode) {
        auto d_pos = device_int(pos0);
        auto d_part = poisoned(attn_decode_partial_floats(T, nq, c.nkv, c.D, c.context_max) * 4);
        attn_decode_int8(as_bf16(d_q), as_bf16(d_g), d_kc.as<uint8_t>(), d_vc.as<uint8_t>(), d_ks.as<half>(),
                         d_vs.as<half>(), d_pos.as<int32_t>(), as_bf16(d_out), d_part.as<float>(), T, nq, c.nkv, c.D,
                         c.context_max, st.s);
        st.finish(op);
    } else {
        attn_prefill_int8(as_bf16(d_q), as_bf16(d_g), d_kc.as<uint8_t>(), d_vc.as<uint8_t>(), d_ks.as<half>(),
                          d_vs.as<half>(), pos0, as_bf16(d_out), T, nq, c.nkv, c.D, c.context_max, st.s);
        st.finish(op);
    }
    return download<uint16_t>(d_out, {T, nq * c.D});
}

// ---- matrix products ---------------------------------------------------------------------------

enum class Path { Linear, Gemv, Gemm };

py::array py_matmul(Path path, Arr<uint16_t> w, Arr<uint16_t> x, bool f32_out) {
    const char* op = path == Path::Gemv ? "gemv" : path == Path::Gemm ? "gemm" : "linear";
    check_ndim(op, "w", w, 2);
    check_ndim(op, "x", x, 2);
    const int out = int(w.shape(0)), in = int(w.shape(1)), T = int(x.shape(0));
    check_dim(op, "x", x.shape(1), in, "width");
    auto d_w = upload(w);
    auto d_x = upload(x);
    auto d_y = poisoned(size_t(T) * out * (f32_out ? 4 : 2));
    OpStream st;
    const Linear L{WeightFormat::BF16, d_w.get(), out, in};
    if (f32_out) {
        float* y = d_y.as<float>();
        if (path == Path::Gemv) gemv_bf16(as_bf16(d_w), as_bf16(d_x), y, T, out, in, st.s);
        else if (path == Path::Gemm) gemm_bf16(as_bf16(d_w), as_bf16(d_x), y, T, out, in, st.s);
        else linear_forward_f32(L, as_bf16(d_x), y, T, st.s);
        st.finish(op);
        return download<float>(d_y, {T, out});
    }
    bf16* y = as_bf16(d_y);
    if (path == Path::Gemv) gemv_bf16(as_bf16(d_w), as_bf16(d_x), y, T, out, in, st.s);
    else if (path == Path::Gemm) gemm_bf16(as_bf16(d_w), as_bf16(d_x), y, T, out, in, st.s);
    else linear_forward(L, as_bf16(d_x), y, T, st.s);
    st.finish(op);
    return download<uint16_t>(d_y, {T, out});
}

// The decode step's folded GEMV forms (linear.h). gemv_normed -> (y [1, out], normed [1, in]):
// y = W @ bf16(rmsnorm(residual) * (1 + norm_w)), normed = the row the launch wrote out.
py::tuple py_gemv_normed(Arr<uint16_t> w, Arr<float> residual, Arr<uint16_t> norm_w, float eps, bool f32_out) {
    const char* op = "gemv_normed";
    check_ndim(op, "w", w, 2);
    const int out = int(w.shape(0)), in = int(w.shape(1));
    check_dim(op, "residual", residual.size(), in, "length");
    check_dim(op, "norm_w", norm_w.size(), in, "length");
    auto d_w = upload(w);
    auto d_r = upload(residual);
    auto d_n = upload(norm_w);
    auto d_y = poisoned(size_t(out) * (f32_out ? 4 : 2));
    auto d_normed = poisoned(size_t(in) * 2);
    OpStream st;
    const Linear L{WeightFormat::BF16, d_w.get(), out, in};
    const ResidualNorm x{d_r.as<float>(), as_bf16(d_n), eps, as_bf16(d_normed)};
    if (f32_out) linear_forward_normed_f32(L, x, d_y.as<float>(), st.s);
    else linear_forward_normed(L, x, as_bf16(d_y), st.s);
    st.finish(op);
    py::array y = f32_out ? py::array(download<float>(d_y, {1, out})) : py::array(download<uint16_t>(d_y, {1, out}));
    return py::make_tuple(y, download<uint16_t>(d_normed, {1, in}));
}

// gemv_add_residual -> residual + float(bf16(x @ W^T)) (set: 0 + float(...)), x [1, in].
py::array_t<float> py_gemv_add_residual(Arr<uint16_t> w, Arr<uint16_t> x, Arr<float> residual, bool set) {
    const char* op = set ? "gemv_set_residual" : "gemv_add_residual";
    check_ndim(op, "w", w, 2);
    const int out = int(w.shape(0)), in = int(w.shape(1));
    check_dim(op, "x", x.size(), in, "length");
    check_dim(op, "residual", residual.size(), out, "length");
    auto d_w = upload(w);
    auto d_x = upload(x);
    auto d_r = upload(residual);
    OpStream st;
    linear_forward_add_residual(Linear{WeightFormat::BF16, d_w.get(), out, in}, as_bf16(d_x), d_r.as<float>(), st.s,
                                set);
    st.finish(op);
    return download<float>(d_r, {1, out});
}

// ---- sampling ------------------------------------------------------------------------------------

py::tuple py_sample_token(Arr<float> logits, int v_real, float temperature, int top_k, float top_p, float min_p,
                          float presence_penalty, uint64_t seed, Arr<uint8_t> seen, int step, int draws) {
    const char* op = "sample_token";
    check_ndim(op, "logits", logits, 1);
    const int V = int(logits.shape(0));
    check_dim(op, "seen", seen.size(), V, "length");
    require(draws >= 1, op, "draws must be >= 1");
    auto d_logits = upload(logits);
    auto d_seen = upload(seen);
    auto d_step = device_int(step);
    auto d_out = poisoned(size_t(draws) * 4);
    DeviceBuffer scratch(sampling_scratch_bytes(V));
    const SamplingConfig cfg{temperature, top_k, top_p, min_p, presence_penalty, seed};
    OpStream st;
    LAMPO_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, scratch.bytes(), st.s));  // sample_token needs it zeroed once
    for (int i = 0; i < draws; ++i)
        sample_token(d_logits.as<float>(), V, v_real, cfg, d_seen.as<uint8_t>(), d_step.as<int32_t>(),
                     d_out.as<int32_t>() + i, scratch.get(), st.s);
    st.finish(op);
    return py::make_tuple(download<int32_t>(d_out, {draws}), download<uint8_t>(d_seen, {V}),
                          int(download<int32_t>(d_step, {1}).at(0)));
}

// One sample_draft / sample_verify_row call of `draws` launches: the logits, the step counter,
// the outputs, an empty presence set, one draft distribution and the sampler's scratch (zeroed,
// as the engine zeroes it once), on its own stream.
struct DraftOpCall {
    int V;
    SamplingConfig cfg;
    DeviceBuffer logits, step, out, seen, q_mem, scratch;
    DraftDistribution q;
    OpStream st;  // made after the buffers: its device synchronisation orders their uploads first
    DraftOpCall(Arr<float> logits_, int draws, int step_, const SamplingConfig& cfg_)
        : V(int(logits_.shape(0))), cfg(cfg_), logits(upload(logits_)), step(device_int(step_)),
          out(poisoned(size_t(draws) * 4)), seen{size_t(V)}, q_mem{DRAFT_DISTRIBUTION_BYTES},
          scratch{sampling_scratch_bytes(V)}, q(draft_distribution_at(q_mem.get())) {
        LAMPO_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, scratch.bytes(), st.s));
        LAMPO_CUDA_CHECK(cudaMemsetAsync(seen.get(), 0, seen.bytes(), st.s));
    }
    int step_after() { return int(download<int32_t>(step, {1}).at(0)); }
};

// sample_draft `draws` times (draw i at draft step step + i) -> (ids [draws], the last draw's q as
// (ids, probs), the step after).
py::tuple py_sample_draft(Arr<float> logits, int v_real, float temperature, int top_k, float top_p, float min_p,
                          uint64_t seed, int step, int draws) {
    const char* op = "sample_draft";
    check_ndim(op, "logits", logits, 1);
    require(draws >= 1, op, "draws must be >= 1");
    DraftOpCall c(logits, draws, step, {temperature, top_k, top_p, min_p, 0.0f, seed});
    for (int i = 0; i < draws; ++i)
        sample_draft(c.logits.as<float>(), c.V, v_real, c.cfg, c.seen.as<uint8_t>(), c.step.as<int32_t>(),
                     c.out.as<int32_t>() + i, c.q, c.scratch.get(), c.st.s);
    c.st.finish(op);
    int32_t n = 0;
    LAMPO_CUDA_CHECK(cudaMemcpy(&n, c.q.count, 4, cudaMemcpyDeviceToHost));
    std::vector<int32_t> ids(n);
    std::vector<float> probs(n);
    LAMPO_CUDA_CHECK(cudaMemcpy(ids.data(), c.q.ids, size_t(n) * 4, cudaMemcpyDeviceToHost));
    LAMPO_CUDA_CHECK(cudaMemcpy(probs.data(), c.q.probs, size_t(n) * 4, cudaMemcpyDeviceToHost));
    return py::make_tuple(download<int32_t>(c.out, {draws}), py::array_t<int32_t>(n, ids.data()),
                          py::array_t<float>(n, probs.data()), c.step_after());
}

// sample_verify_row once per draft (row i judging drafts[i] at step step + i) against the draft
// distribution q (q_ids ascending, q_probs) -> (ids [len(drafts)], the step after).
py::tuple py_sample_verify_row(Arr<float> logits, int v_real, float temperature, int top_k, float top_p, float min_p,
                               uint64_t seed, Arr<int32_t> drafts, Arr<int32_t> q_ids, Arr<float> q_probs, int step) {
    const char* op = "sample_verify_row";
    check_ndim(op, "logits", logits, 1);
    const int draws = int(drafts.size()), n = int(q_ids.size());
    require(draws >= 1 && n >= 1 && n <= SAMPLE_MAX_K && int(q_probs.size()) == n, op,
            "needs drafts and a q of 1..SAMPLE_MAX_K ids with one probability each");
    auto d_drafts = upload(drafts);
    DraftOpCall c(logits, draws, step, {temperature, top_k, top_p, min_p, 0.0f, seed});
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(c.q.count, &n, 4, cudaMemcpyHostToDevice, c.st.s));
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(c.q.ids, q_ids.data(), size_t(n) * 4, cudaMemcpyHostToDevice, c.st.s));
    LAMPO_CUDA_CHECK(cudaMemcpyAsync(c.q.probs, q_probs.data(), size_t(n) * 4, cudaMemcpyHostToDevice, c.st.s));
    for (int i = 0; i < draws; ++i)
        sample_verify_row(c.logits.as<float>(), c.V, v_real, c.cfg, c.seen.as<uint8_t>(), c.step.as<int32_t>(),
                          d_drafts.as<int32_t>() + i, c.q, c.out.as<int32_t>() + i, c.scratch.get(), c.st.s);
    c.st.finish(op);
    return py::make_tuple(download<int32_t>(c.out, {draws}), c.step_after());
}

py::array_t<int32_t> py_argmax_rows(Arr<float> logits, int v_real) {
    const char* op = "argmax_rows";
    check_ndim(op, "logits", logits, 2);
    const int T = int(logits.shape(0)), V = int(logits.shape(1));
    auto d_logits = upload(logits);
    auto d_out = poisoned(size_t(T) * 4);
    OpStream st;
    argmax_rows(d_logits.as<float>(), T, V, v_real, d_out.as<int32_t>(), st.s);
    st.finish(op);
    return download<int32_t>(d_out, {T});
}

// ---- timing through a captured graph (time_graph, op_helpers.h) -------------------------------

// Weight copies rotated between calls so the matrix is never served from L2.
py::dict py_bench_linear(int out, int in, int T, int iters, bool f32_out) {
    const size_t wbytes = size_t(out) * in * 2;
    const auto ws = l2_rotating_copies(wbytes, 0x3c);
    auto x = filled(size_t(T) * in * 2, 0x3c);
    auto y = filled(size_t(T) * out * 4, 0);
    const double us = time_graph(iters, [&](int i, cudaStream_t s) {
        const Linear L{WeightFormat::BF16, ws[i % ws.size()].get(), out, in};
        if (f32_out) linear_forward_f32(L, as_bf16(x), y.as<float>(), T, s);
        else linear_forward(L, as_bf16(x), as_bf16(y), T, s);
    });
    py::dict d;
    d["us"] = us;
    d["GBps"] = double(wbytes) / us / 1e3;
    d["TFLOPs"] = 2.0 * T * out * in / us / 1e6;
    return d;
}

py::dict py_bench_attn_decode(int nq, int nkv, int length, int Tq, int iters) {
    const int D = 256;
    const int context_max = (length + 63) / 64 * 64;
    const size_t rows = size_t(nkv) * context_max;
    auto kc = filled(rows * D, 0x85), vc = filled(rows * D, 0x87);  // codes 5 and 7
    auto ks = filled(rows * D / KV_GROUP * 2, 0x20), vs = filled(rows * D / KV_GROUP * 2, 0x21);
    auto q = filled(size_t(Tq) * nq * D * 2, 0x3c), gate = filled(size_t(Tq) * nq * D * 2, 0x3c);
    auto out = filled(size_t(Tq) * nq * D * 2, 0);
    auto pos = device_int(length - Tq);
    DeviceBuffer part(attn_decode_partial_floats(Tq, nq, nkv, D, context_max) * 4);
    const double us = time_graph(iters, [&](int, cudaStream_t s) {
        attn_decode_int8(as_bf16(q), as_bf16(gate), kc.as<uint8_t>(), vc.as<uint8_t>(), ks.as<half>(), vs.as<half>(),
                         pos.as<int32_t>(), as_bf16(out), part.as<float>(), Tq, nq, nkv, D, context_max, s);
    });
    const double bytes = 2.0 * nkv * double(length) * (D + D / KV_GROUP * 2);
    py::dict d;
    d["us"] = us;
    d["GBps"] = bytes / us / 1e3;
    return d;
}

py::dict py_bench_attn_prefill(int nq, int nkv, int T, int pos0, int iters) {
    const int D = 256;
    const int context_max = (pos0 + T + 63) / 64 * 64;
    const size_t rows = size_t(nkv) * context_max;
    auto kc = filled(rows * D, 0x85), vc = filled(rows * D, 0x87);  // codes 5 and 7
    auto ks = filled(rows * D / KV_GROUP * 2, 0x20), vs = filled(rows * D / KV_GROUP * 2, 0x21);
    auto q = filled(size_t(T) * nq * D * 2, 0x3c), gate = filled(size_t(T) * nq * D * 2, 0x3c);
    auto out = filled(size_t(T) * nq * D * 2, 0);
    const double us = time_graph(iters, [&](int, cudaStream_t s) {
        attn_prefill_int8(as_bf16(q), as_bf16(gate), kc.as<uint8_t>(), vc.as<uint8_t>(), ks.as<half>(), vs.as<half>(),
                          pos0, as_bf16(out), T, nq, nkv, D, context_max, s);
    });
    // causal pairs (query, visible key) x 4 D flops (QK^T and PV) per query head
    const double pairs = double(T) * pos0 + double(T) * (T + 1) / 2;
    py::dict d;
    d["us"] = us;
    d["TFLOPs"] = 4.0 * D * nq * pairs / us / 1e6;
    return d;
}

py::dict py_bench_sample(int V, int v_real, float temperature, int top_k, float top_p, int iters) {
    auto logits = filled(size_t(V) * 4, 0x3c);
    auto seen = filled(V, 0);
    auto step = device_int(0);
    auto out = filled(4, 0);
    auto scratch = filled(sampling_scratch_bytes(V), 0);
    const SamplingConfig cfg{temperature, top_k, top_p, 0.0f, 0.0f, 1234};
    const double us = time_graph(iters, [&](int, cudaStream_t s) {
        sample_token(logits.as<float>(), V, v_real, cfg, seen.as<uint8_t>(), step.as<int32_t>(), out.as<int32_t>(),
                     scratch.get(), s);
    });
    py::dict d;
    d["us"] = us;
    return d;
}

}  // namespace

void register_core_ops(py::module_& ops) {
    using namespace pybind11::literals;
    ops.def("embedding_gather", &py_embedding_gather, "table"_a, "ids"_a,
            "out[t] = float32(table[ids[t]]); table [V, H] bf16 bits (uint16), ids [T] int32");
    ops.def("rmsnorm", &py_rmsnorm, "x"_a, "w"_a, "eps"_a = 1e-6f, "zero-centred RMSNorm: fp32 x -> bf16 bits");
    ops.def("add_rmsnorm", &py_add_rmsnorm, "residual"_a, "delta"_a, "w"_a, "eps"_a = 1e-6f, "set"_a = false,
            "(residual + delta, rmsnorm(residual + delta)); set: residual taken as zeros (0 + delta)");
    ops.def("residual_add", &py_residual_add, "residual"_a, "delta"_a, "residual + float(delta)");
    ops.def("silu_mul", &py_silu_mul, "gu"_a, "interleaved"_a = false,
            "gu [T, 2I] -> silu(gate) * up [T, I] (bf16 bits); interleaved: gu's rows by 8, gate then up");
    ops.def("sigmoid_gate_mul", &py_sigmoid_gate_mul, "x"_a, "gate"_a, "x * sigmoid(gate) (bf16 bits)");
    ops.def("attn_prep", &py_attn_prep, "qg"_a, "k_raw"_a, "q_norm_w"_a, "k_norm_w"_a, "pos0"_a, "nq"_a, "nkv"_a,
            "rotary_dim"_a, "theta"_a, "eps"_a = 1e-6f, "kv"_a = py::none(),
            "-> (q [T,nq,D], gate [T,nq*D], k [T,nkv,D]) bf16 bits; with kv = (v, k_cache, v_cache, k_scale, "
            "v_scale) also the INT8 append: + updated (k_cache, v_cache, k_scale, v_scale)");
    ops.def(
        "attn_decode_int8",
        [](Arr<uint16_t> q, Arr<uint16_t> gate, Arr<int8_t> kc, Arr<int8_t> vc, py::array ks, py::array vs, int pos0) {
            return py_attn_int8(true, q, gate, kc, vc, ks, vs, pos0);
        },
        "q"_a, "gate"_a, "k_cache"_a, "v_cache"_a, "k_scale"_a, "v_scale"_a, "pos0"_a,
        "flash-decoding, query row t at pos0 + t -> [Tq, nq*D] bf16 bits");
    ops.def(
        "attn_prefill_int8",
        [](Arr<uint16_t> q, Arr<uint16_t> gate, Arr<int8_t> kc, Arr<int8_t> vc, py::array ks, py::array vs, int pos0) {
            return py_attn_int8(false, q, gate, kc, vc, ks, vs, pos0);
        },
        "q"_a, "gate"_a, "k_cache"_a, "v_cache"_a, "k_scale"_a, "v_scale"_a, "pos0"_a,
        "causal flash attention for a chunk at pos0 -> [T, nq*D] bf16 bits");
    ops.def("linear", [](Arr<uint16_t> w, Arr<uint16_t> x, bool f32) { return py_matmul(Path::Linear, w, x, f32); },
            "w"_a, "x"_a, "f32_out"_a = false, "linear_forward: x @ w.T (GEMV for T <= 8, else GEMM)");
    ops.def("gemv_normed", &py_gemv_normed, "w"_a, "residual"_a, "norm_w"_a, "eps"_a = 1e-6f, "f32_out"_a = false,
            "decode-step input projection: (W @ rmsnorm1p(residual), the normed row) (bf16 bits / f32)");
    ops.def("gemv_add_residual", &py_gemv_add_residual, "w"_a, "x"_a, "residual"_a, "set"_a = false,
            "decode-step output projection: residual + float(bf16(x @ W.T)); set: residual taken as zeros");
    ops.def("gemv", [](Arr<uint16_t> w, Arr<uint16_t> x, bool f32) { return py_matmul(Path::Gemv, w, x, f32); },
            "w"_a, "x"_a, "f32_out"_a = false, "the GEMV kernel (T <= 8)");
    ops.def("gemm", [](Arr<uint16_t> w, Arr<uint16_t> x, bool f32) { return py_matmul(Path::Gemm, w, x, f32); },
            "w"_a, "x"_a, "f32_out"_a = false, "the tensor-core GEMM kernel (any T)");
    ops.def("sample_token", &py_sample_token, "logits"_a, "v_real"_a, "temperature"_a, "top_k"_a, "top_p"_a,
            "min_p"_a, "presence_penalty"_a, "seed"_a, "seen"_a, "step"_a, "draws"_a = 1,
            "-> (ids [draws] int32, seen after, step after); draw i uses step + i");
    ops.def("sample_draft", &py_sample_draft, "logits"_a, "v_real"_a, "temperature"_a, "top_k"_a, "top_p"_a,
            "min_p"_a, "seed"_a, "step"_a, "draws"_a = 1,
            "-> (ids [draws] int32, the last draw's q: ids, probs, step after); draw i uses draft step step + i");
    ops.def("sample_verify_row", &py_sample_verify_row, "logits"_a, "v_real"_a, "temperature"_a, "top_k"_a,
            "top_p"_a, "min_p"_a, "seed"_a, "drafts"_a, "q_ids"_a, "q_probs"_a, "step"_a,
            "-> (ids [len(drafts)] int32, step after): row i judges drafts[i] (drawn from q) at step + i");
    ops.def("argmax_rows", &py_argmax_rows, "logits"_a, "v_real"_a, "row-wise argmax (ties -> lower id)");
    ops.def("bench_linear", &py_bench_linear, "out"_a, "in_"_a, "T"_a, "iters"_a = 50, "f32_out"_a = false,
            "time linear_forward in a CUDA graph -> {us, GBps, TFLOPs}");
    ops.def("bench_attn_decode", &py_bench_attn_decode, "nq"_a, "nkv"_a, "length"_a, "Tq"_a = 1, "iters"_a = 50,
            "time attn_decode_int8 at a live length -> {us, GBps of KV read}");
    ops.def("bench_attn_prefill", &py_bench_attn_prefill, "nq"_a, "nkv"_a, "T"_a, "pos0"_a = 0, "iters"_a = 5,
            "time attn_prefill_int8 -> {us, TFLOPs (causal)}");
    ops.def("bench_sample", &py_bench_sample, "V"_a, "v_real"_a, "temperature"_a, "top_k"_a, "top_p"_a,
            "iters"_a = 50, "time sample_token -> {us}");
}

}  // namespace lampo
