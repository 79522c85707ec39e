// ops_lq_bindings.cpp - the LQ-format kernels on numpy arrays, for tests/cuda/test_ops_lq.py:
//   gemv_lq(packed uint8 [bytes], bits, out, in, x bf16 bits [T, in], f32_out) -> y [T, out]
//   bench_gemv_lq(out, in, bits, T, iters) -> {us, GBps} (packed bytes read per call)
//   linear_parts(w, bits, out, in, x bf16 bits [T, in], widths) -> the parts one after another, part
//     i as [T, widths[i]] (linear_forward_parts; bits 0: w is bf16 bits [out, in], else packed)
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

py::array py_linear_parts(py::array w, int bits, int out, int in, Arr<uint16_t> x, const std::vector<int>& widths) {
    const char* op = "linear_parts";
    check_ndim(op, "x", x, 2);
    check_dim(op, "x", x.shape(1), in, "width");
    require(widths.size() >= 1 && widths.size() <= size_t(RowParts::MAX), op, "needs 1..4 widths");
    const int T = int(x.shape(0));
    Linear W;
    W.out = out;
    W.in = in;
    W.bits = bits;
    W.format = bits ? WeightFormat::LQ : WeightFormat::BF16;
    const Arr<uint8_t> bytes = Arr<uint8_t>::ensure(w.attr("view")("uint8"));
    check_dim(op, "w", bytes.size(), py::ssize_t(W.bytes()), "size in bytes");
    auto d_w = upload(bytes);
    auto d_x = upload(x);
    RowParts parts;
    parts.n = int(widths.size());
    for (int i = 0; i < parts.n; ++i) parts.first[i + 1] = parts.first[i] + widths[i];
    auto d_y = poisoned(size_t(T) * parts.first[parts.n] * 2);
    for (int i = 0; i < parts.n; ++i) parts.dst[i] = d_y.as<bf16>() + size_t(T) * parts.first[i];
    W.data = d_w.as<uint8_t>();
    OpStream st;
    linear_forward_parts(W, d_x.as<bf16>(), parts, T, st.s);
    st.finish(op);
    return download<uint16_t>(d_y, {py::ssize_t(T) * parts.first[parts.n]});
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
    ops.def("gemv_lq_pair_launches", &gemv_lq_pair_launches,
            "gemv_lq launches so far that went out as pairs of blocks (clusters of two)");
    ops.def("linear_parts", &py_linear_parts, "w"_a, "bits"_a, "out"_a, "in_"_a, "x"_a, "widths"_a,
            "linear_forward_parts: x @ W.T stored as row parts, one after another (bits 0: bf16 W)");
    ops.def("bench_gemv_lq", &py_bench_gemv_lq, "out"_a, "in_"_a, "bits"_a, "T"_a = 1, "iters"_a = 50,
            "time gemv_lq in a CUDA graph -> {us, GBps}");
    ops.def("moe_lq_gate_up", &py_moe_lq_gate_up, "h"_a, "bank"_a, "bits"_a, "ids"_a, "I"_a, "repeat"_a = 0,
            "routed experts' silu(gate) * up with an LQ bank [E, bytes] -> act [T, k, I] bf16 bits");
    ops.def("moe_lq_down", &py_moe_lq_down, "act"_a, "bank"_a, "bits"_a, "ids"_a, "weights"_a, "H"_a, "repeat"_a = 0,
            "routed experts' weighted down-projection with an LQ bank [E, bytes] -> out [T, H] bf16 bits");
}

}  // namespace lampo
