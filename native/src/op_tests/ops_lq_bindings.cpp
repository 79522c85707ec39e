// ops_lq_bindings.cpp - the LQ-format kernels on numpy arrays, for tests/cuda/test_ops_lq.py:
//   gemv_lq(packed uint8 [bytes], bits, out, in, x bf16 bits [T, in], f32_out) -> y [T, out]
//   bench_gemv_lq(out, in, bits, T, iters) -> {us, GBps} (packed bytes read per call)
//   linear_parts(w, bits, out, in, x bf16 bits [T, in], widths) -> the parts one after another, part
//     i as [T, widths[i]] (linear_forward_parts; bits 0: w is bf16 bits [out, in], else packed)
//   linear_normed(w, bits, out, in, residual f32 [T, in], norm_w [in], eps, f32_out, widths)
//     -> (y = W @ bf16(rmsnorm(residual) * (1 + norm_w)): [T, out], or with widths the parts as
//     linear_parts returns them; the normed rows [T, in] the launch wrote out)
//   linear_add_residual(w, bits, out, in, x [T, in], residual f32 [T, out]) -> residual +
//     float(bf16(x @ W^T))   (the folded forms of the decode step and the verify window, linear.h)
//   moe_lq_gate_up(h [T, H], bank uint8 [E, bytes], bits, ids [T, k], I, repeat) -> act [T, k, I]
//   moe_lq_down(act [T, k, I], bank uint8 [E, bytes], bits, ids, weights [T, k], H, repeat) -> out [T, H]
//     (+ the mean ms of `repeat` cold-L2 launches when repeat > 0)
// The packed bytes are those of models/quant/layout.py `pack`. Helpers: op_helpers.h.
#include <pybind11/stl.h>

#include "kernels/matmul.cuh"
#include "kernels/ops.h"
#include "op_tests/op_helpers.h"

namespace lampo {

using namespace pybind11::literals;

namespace {

py::array py_gemv_lq(Arr<uint8_t> packed, int bits, int out, int in, Arr<uint16_t> x, bool f32_out) {
    const char* op = "gemv_lq";
    check_ndim(op, "x", x, 2);
    check_dim(op, "x", x.shape(1), in, "width");
    require(bits >= 4 && bits <= 6 && out % 16 == 0 && in % 64 == 0, op, "needs bits 4..6 and a [16n, 64k] matrix");
    check_dim(op, "packed", packed.size(), py::ssize_t(lq_packed_bytes(out, in, bits)), "size");
    const int T = int(x.shape(0));
    auto d_w = upload(packed);
    auto d_x = upload(x);
    auto d_y = poisoned(size_t(T) * out * (f32_out ? 4 : 2));
    OpStream st;
    if (f32_out) gemv_lq(d_w.as<uint8_t>(), bits, d_x.as<bf16>(), d_y.as<float>(), T, out, in, st.s);
    else gemv_lq(d_w.as<uint8_t>(), bits, d_x.as<bf16>(), d_y.as<bf16>(), T, out, in, st.s);
    st.finish(op);
    if (f32_out) return download<float>(d_y, {T, out});
    return download<uint16_t>(d_y, {T, out});
}

// A Linear over the uploaded bytes of w: bits 0: bf16 bits [out, in], else the packed LQ tiles.
Linear upload_linear(const char* op, py::array w, int bits, int out, int in, DeviceBuffer& d_w) {
    Linear W;
    W.out = out;
    W.in = in;
    W.bits = bits;
    W.format = bits ? WeightFormat::LQ : WeightFormat::BF16;
    const Arr<uint8_t> bytes = Arr<uint8_t>::ensure(w.attr("view")("uint8"));
    check_dim(op, "w", bytes.size(), py::ssize_t(W.bytes()), "size in bytes");
    d_w = upload(bytes);
    W.data = d_w.as<uint8_t>();
    return W;
}

// Parts of the given widths, one after another in y: part i as [T, widths[i]] at T * (widths before).
RowParts row_parts(const char* op, const std::vector<int>& widths, int T, bf16* y) {
    require(widths.size() >= 1 && widths.size() <= size_t(RowParts::MAX), op, "needs 1..4 widths");
    RowParts parts;
    parts.n = int(widths.size());
    for (int i = 0; i < parts.n; ++i) parts.first[i + 1] = parts.first[i] + widths[i];
    for (int i = 0; i < parts.n; ++i) parts.dst[i] = y + size_t(T) * parts.first[i];
    return parts;
}

int parts_rows(const std::vector<int>& widths) {
    int rows = 0;
    for (int w : widths) rows += w;
    return rows;
}

py::array py_linear_parts(py::array w, int bits, int out, int in, Arr<uint16_t> x, const std::vector<int>& widths) {
    const char* op = "linear_parts";
    check_ndim(op, "x", x, 2);
    check_dim(op, "x", x.shape(1), in, "width");
    const int T = int(x.shape(0)), rows = parts_rows(widths);
    DeviceBuffer d_w;
    const Linear W = upload_linear(op, w, bits, out, in, d_w);
    auto d_x = upload(x);
    auto d_y = poisoned(size_t(T) * rows * 2);
    OpStream st;
    linear_forward_parts(W, d_x.as<bf16>(), row_parts(op, widths, T, d_y.as<bf16>()), T, st.s);
    st.finish(op);
    return download<uint16_t>(d_y, {py::ssize_t(T) * rows});
}

py::tuple py_linear_normed(py::array w, int bits, int out, int in, Arr<float> residual, Arr<uint16_t> norm_w,
                           float eps, bool f32_out, const std::vector<int>& widths) {
    const char* op = "linear_normed";
    check_ndim(op, "residual", residual, 2);
    check_dim(op, "residual", residual.shape(1), in, "width");
    check_dim(op, "norm_w", norm_w.size(), in, "length");
    require(widths.empty() || !f32_out, op, "parts are bf16 rows");
    const int T = int(residual.shape(0));
    DeviceBuffer d_w;
    const Linear W = upload_linear(op, w, bits, out, in, d_w);
    auto d_r = upload(residual);
    auto d_n = upload(norm_w);
    auto d_y = poisoned(size_t(T) * out * (f32_out ? 4 : 2));
    auto d_normed = poisoned(size_t(T) * in * 2);
    OpStream st;
    const ResidualNorm x{d_r.as<float>(), d_n.as<bf16>(), eps, d_normed.as<bf16>()};
    if (!widths.empty()) linear_forward_normed_parts(W, x, row_parts(op, widths, T, d_y.as<bf16>()), T, st.s);
    else if (f32_out) linear_forward_normed_f32(W, x, d_y.as<float>(), T, st.s);
    else linear_forward_normed(W, x, d_y.as<bf16>(), T, st.s);
    st.finish(op);
    const py::ssize_t n = widths.empty() ? py::ssize_t(T) * out : py::ssize_t(T) * parts_rows(widths);
    py::array y = f32_out ? py::array(download<float>(d_y, {T, out})) : py::array(download<uint16_t>(d_y, {n}));
    return py::make_tuple(y, download<uint16_t>(d_normed, {T, in}));
}

py::array_t<float> py_linear_add_residual(py::array w, int bits, int out, int in, Arr<uint16_t> x,
                                          Arr<float> residual) {
    const char* op = "linear_add_residual";
    check_ndim(op, "x", x, 2);
    check_dim(op, "x", x.shape(1), in, "width");
    const int T = int(x.shape(0));
    check_shape(op, "residual", residual, {T, out});
    DeviceBuffer d_w;
    const Linear W = upload_linear(op, w, bits, out, in, d_w);
    auto d_x = upload(x);
    auto d_r = upload(residual);
    OpStream st;
    linear_forward_add_residual(W, d_x.as<bf16>(), d_r.as<float>(), T, st.s);
    st.finish(op);
    return download<float>(d_r, {T, out});
}

// Weight copies rotated between calls so the matrix is never served from L2 (as bench_linear).
py::dict py_bench_gemv_lq(int out, int in, int bits, int T, int iters) {
    const size_t wbytes = lq_packed_bytes(out, in, bits);
    const auto ws = l2_rotating_copies(wbytes, 0x3c);
    auto x = filled(size_t(T) * in * 2, 0x3c);
    auto y = filled(size_t(T) * out * 2, 0);
    const double us = time_graph(iters, [&](int i, cudaStream_t s) {
        gemv_lq(ws[i % ws.size()].as<uint8_t>(), bits, x.as<bf16>(), y.as<bf16>(), T, out, in, s);
    });
    py::dict d;
    d["us"] = us;
    d["GBps"] = double(wbytes) / us / 1e3;
    return d;
}

// An LQ expert bank [E, bytes] of [rows, cols] matrices at `bits`, and expert ids below E.
void check_bank(const char* op, const Arr<uint8_t>& bank, int bits, int rows, int cols, const Arr<int32_t>& ids) {
    require(bits >= 4 && bits <= 6 && rows % 16 == 0 && cols % 64 == 0, op, "needs bits 4..6 and [16n, 64k] experts");
    check_ndim(op, "bank", bank, 2);
    check_dim(op, "bank", bank.shape(1), py::ssize_t(lq_packed_bytes(rows, cols, bits)), "bytes per expert");
    check_ids_below(op, ids, int(bank.shape(0)));
}

py::object py_moe_lq_gate_up(Arr<uint16_t> h, Arr<uint8_t> bank, int bits, Arr<int32_t> ids, int I, int repeat) {
    const char* op = "moe_lq_gate_up";
    check_ndim(op, "h", h, 2);
    check_ndim(op, "ids", ids, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), k = int(ids.shape(1));
    check_dim(op, "ids", ids.shape(0), T, "rows");
    check_bank(op, bank, bits, 2 * I, H, ids);
    DeviceBuffer d_h = upload(h), d_w = upload(bank), d_ids = upload(ids), act = poisoned(size_t(T) * k * I * 2);
    return single_or_tuple(run_op(
        op, repeat,
        [&] { moe_experts_lq_gate_up(d_h.as<bf16>(), d_w.as<uint8_t>(), bits, d_ids.as<int32_t>(), act.as<bf16>(), T, k, H, I, 0); },
        [&](py::list& out) { out.append(download<uint16_t>(act, {T, k, I})); }));
}

py::object py_moe_lq_down(Arr<uint16_t> act, Arr<uint8_t> bank, int bits, Arr<int32_t> ids, Arr<float> weights, int H,
                          int repeat) {
    const char* op = "moe_lq_down";
    check_ndim(op, "act", act, 3);
    const int T = int(act.shape(0)), k = int(act.shape(1)), I = int(act.shape(2));
    check_shape(op, "ids", ids, {T, k});
    check_shape(op, "weights", weights, {T, k});
    check_bank(op, bank, bits, H, I, ids);
    DeviceBuffer d_act = upload(act), d_w = upload(bank), d_ids = upload(ids), d_wt = upload(weights);
    DeviceBuffer d_out = poisoned(size_t(T) * H * 2);
    return single_or_tuple(run_op(
        op, repeat,
        [&] {
            moe_experts_lq_down(d_act.as<bf16>(), d_w.as<uint8_t>(), bits, d_ids.as<int32_t>(), d_wt.as<float>(),
                                d_out.as<bf16>(), T, k, H, I, 0);
        },
        [&](py::list& out) { out.append(download<uint16_t>(d_out, {T, H})); }));
}

}  // namespace

void register_lq_ops(py::module_& ops) {
    ops.def("gemv_lq", &py_gemv_lq, "packed"_a, "bits"_a, "out"_a, "in_"_a, "x"_a, "f32_out"_a = false,
            "x @ dequantize(packed).T for an LQ matrix (T <= 8) -> bf16 bits / f32");
    ops.def("linear_parts", &py_linear_parts, "w"_a, "bits"_a, "out"_a, "in_"_a, "x"_a, "widths"_a,
            "linear_forward_parts: x @ W.T stored as row parts, one after another (bits 0: bf16 W)");
    ops.def("linear_normed", &py_linear_normed, "w"_a, "bits"_a, "out"_a, "in_"_a, "residual"_a, "norm_w"_a,
            "eps"_a = 1e-6f, "f32_out"_a = false, "widths"_a = std::vector<int>{},
            "folded input projection: (W @ rmsnorm1p(residual) [T, out] or its parts, the normed rows)");
    ops.def("linear_add_residual", &py_linear_add_residual, "w"_a, "bits"_a, "out"_a, "in_"_a, "x"_a, "residual"_a,
            "folded output projection: residual + float(bf16(x @ W^T))");
    ops.def("bench_gemv_lq", &py_bench_gemv_lq, "out"_a, "in_"_a, "bits"_a, "T"_a = 1, "iters"_a = 50,
            "time gemv_lq in a CUDA graph -> {us, GBps}");
    ops.def("moe_lq_gate_up", &py_moe_lq_gate_up, "h"_a, "bank"_a, "bits"_a, "ids"_a, "I"_a, "repeat"_a = 0,
            "routed experts' silu(gate) * up with an LQ bank [E, bytes] -> act [T, k, I] bf16 bits");
    ops.def("moe_lq_down", &py_moe_lq_down, "act"_a, "bank"_a, "bits"_a, "ids"_a, "weights"_a, "H"_a, "repeat"_a = 0,
            "routed experts' weighted down-projection with an LQ bank [E, bytes] -> out [T, H] bf16 bits");
}

}  // namespace lampo
