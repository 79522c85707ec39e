// ops_lq_bindings.cpp - the LQ-format kernels on numpy arrays, for tests/cuda/test_ops_lq.py:
//   gemv_lq(packed uint8 [bytes], bits, out, in, x bf16 bits [T, in], f32_out) -> y [T, out]
//   bench_gemv_lq(out, in, bits, T, iters) -> {us, GBps} (packed bytes read per call)
// The packed bytes are those of models/quant/layout.py `pack`. Helpers: op_helpers.h.
#include "kernels/matmul.cuh"
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

}  // namespace

void register_lq_ops(py::module_& ops) {
    ops.def("gemv_lq", &py_gemv_lq, "packed"_a, "bits"_a, "out"_a, "in_"_a, "x"_a, "f32_out"_a = false,
            "x @ dequantize(packed).T for an LQ matrix (T <= 8) -> bf16 bits / f32");
    ops.def("bench_gemv_lq", &py_bench_gemv_lq, "out"_a, "in_"_a, "bits"_a, "T"_a = 1, "iters"_a = 50,
            "time gemv_lq in a CUDA graph -> {us, GBps}");
}

}  // namespace lampo
