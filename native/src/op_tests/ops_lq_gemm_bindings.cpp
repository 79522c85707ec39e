// ops_lq_gemm_bindings.cpp - the LQ-format prefill kernels on numpy arrays, for
// tests/cuda/test_ops_lq_gemm.py:
//   gemm_lq(packed uint8 [bytes], bits, out, in, x bf16 bits [T, in], f32_out) -> y [T, out]
//   bench_gemm_lq(out, in, bits, T, iters) -> {us, TFLOPs} (a CUDA graph of `iters` calls)
//   gemm_lq_takes_sm90(T) -> whether gemm_lq runs T tokens on its sm_90a wgmma kernel (weights
//     rounded to bf16) under the current LAMPO_GEMM_LQ_SM90 (gemm_lq_sm90.cuh)
//   moe_lq_prefill(h [T, H], gate_up uint8 [E, bytes], gu_bits, down uint8 [E, bytes], down_bits,
//                  ids [T, k], weights [T, k], I, repeat) -> out [T, H] bf16 bits
//     (+ the mean ms of `repeat` cold-L2 launches when repeat > 0)
// The packed bytes are those of models/quant/layout.py `pack`. Helpers: op_helpers.h.
#include "kernels/matmul.cuh"
#include "kernels/matmul/gemm_lq_sm90.cuh"
#include "kernels/ops.h"
#include "op_tests/op_helpers.h"

namespace lampo {

using namespace pybind11::literals;

namespace {

py::array py_gemm_lq(Arr<uint8_t> packed, int bits, int out, int in, Arr<uint16_t> x, bool f32_out) {
    const char* op = "gemm_lq";
    check_ndim(op, "x", x, 2);
    check_dim(op, "x", x.shape(1), in, "width");
    require(bits >= 4 && bits <= 6 && out > 0 && out % 16 == 0 && in > 0 && in % 64 == 0, op,
            "needs bits 4..6 and a [16n, 64k] matrix");
    check_dim(op, "packed", packed.size(), py::ssize_t(lq_packed_bytes(out, in, bits)), "size");
    const int T = int(x.shape(0));
    require(T >= 1, op, "x must have at least one row");
    auto d_w = upload(packed);
    auto d_x = upload(x);
    auto d_y = poisoned(size_t(T) * out * (f32_out ? 4 : 2));
    OpStream st;
    if (f32_out) gemm_lq(d_w.as<uint8_t>(), bits, d_x.as<bf16>(), d_y.as<float>(), T, out, in, st.s);
    else gemm_lq(d_w.as<uint8_t>(), bits, d_x.as<bf16>(), d_y.as<bf16>(), T, out, in, st.s);
    st.finish(op);
    if (f32_out) return download<float>(d_y, {T, out});
    return download<uint16_t>(d_y, {T, out});
}

// Weight copies rotated between calls so the matrix is never served from L2 (as bench_linear).
py::dict py_bench_gemm_lq(int out, int in, int bits, int T, int iters) {
    const size_t wbytes = lq_packed_bytes(out, in, bits);
    const auto ws = l2_rotating_copies(wbytes, 0x3c);
    auto x = filled(size_t(T) * in * 2, 0x3c);
    auto y = filled(size_t(T) * out * 2, 0);
    const double us = time_graph(iters, [&](int i, cudaStream_t s) {
        gemm_lq(ws[i % ws.size()].as<uint8_t>(), bits, x.as<bf16>(), y.as<bf16>(), T, out, in, s);
    });
    py::dict d;
    d["us"] = us;
    d["TFLOPs"] = 2.0 * T * out * in / us / 1e6;
    return d;
}

// An LQ expert bank [E, bytes] of [rows, cols] matrices at `bits`.
void check_lq_bank(const char* op, const char* name, const Arr<uint8_t>& bank, int bits, int rows, int cols) {
    require(bits >= 4 && bits <= 6, op, std::string(name) + ": bits must be 4, 5 or 6, got " + std::to_string(bits));
    check_ndim(op, name, bank, 2);
    check_dim(op, name, bank.shape(1), py::ssize_t(lq_packed_bytes(rows, cols, bits)), "bytes per expert");
}

py::object py_moe_lq_prefill(Arr<uint16_t> h, Arr<uint8_t> gate_up, int gu_bits, Arr<uint8_t> down, int down_bits,
                             Arr<int32_t> ids, Arr<float> weights, int I, int repeat) {
    const char* op = "moe_lq_prefill";
    check_ndim(op, "h", h, 2);
    check_ndim(op, "ids", ids, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), k = int(ids.shape(1));
    require(H % 64 == 0 && I > 0 && I % 64 == 0, op, "H and I must be positive multiples of 64");
    check_shape(op, "ids", ids, {T, k});
    check_shape(op, "weights", weights, {T, k});
    check_lq_bank(op, "gate_up", gate_up, gu_bits, 2 * I, H);
    check_lq_bank(op, "down", down, down_bits, H, I);
    const int E = int(gate_up.shape(0));
    check_dim(op, "down", down.shape(0), E, "experts");
    check_ids_below(op, ids, E);
    DeviceBuffer d_h = upload(h), d_gu = upload(gate_up), d_dn = upload(down), d_ids = upload(ids);
    DeviceBuffer d_wt = upload(weights), d_out = poisoned(size_t(T) * H * 2);
    DeviceBuffer ws = poisoned(moe_prefill_workspace_bytes(T, k, H, I, E));
    return single_or_tuple(run_op(
        op, repeat,
        [&] {
            moe_experts_prefill_lq(d_h.as<bf16>(), d_gu.as<uint8_t>(), gu_bits, d_dn.as<uint8_t>(), down_bits,
                                   d_ids.as<int32_t>(), d_wt.as<float>(), d_out.as<bf16>(), ws.get(), T, k, H, I, E,
                                   0);
        },
        [&](py::list& out) { out.append(download<uint16_t>(d_out, {T, H})); }));
}

}  // namespace

void register_lq_gemm_ops(py::module_& ops) {
    ops.def("gemm_lq", &py_gemm_lq, "packed"_a, "bits"_a, "out"_a, "in_"_a, "x"_a, "f32_out"_a = false,
            "x @ dequantize(packed).T for an LQ matrix (any T, tensor cores) -> bf16 bits / f32");
    ops.def("bench_gemm_lq", &py_bench_gemm_lq, "out"_a, "in_"_a, "bits"_a, "T"_a = 2048, "iters"_a = 20,
            "time gemm_lq in a CUDA graph -> {us, TFLOPs}");
    ops.def("gemm_lq_takes_sm90", &gemm_lq_takes_sm90, "T"_a,
            "whether gemm_lq hands T tokens to its sm_90a wgmma kernel (bf16-rounded weights)");
    ops.def("moe_lq_prefill", &py_moe_lq_prefill, "h"_a, "gate_up"_a, "gu_bits"_a, "down"_a, "down_bits"_a, "ids"_a,
            "weights"_a, "I"_a, "repeat"_a = 0,
            "routed experts of a prefill chunk with LQ banks [E, bytes] -> out [T, H] bf16 bits");
}

}  // namespace lampo
