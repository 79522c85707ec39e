// ops_lq_quant_bindings.cpp - the LQ format made and unmade on the GPU (weights/lq_quantize.h) on
// numpy arrays, for tests/cuda/test_ops_lq_quant.py:
//   lq_quantize(w bf16 bits [rows, cols], bits) -> packed uint8 [lq_packed_bytes]
//   lq_dequantize(packed uint8, rows, cols, bits) -> w bf16 bits [rows, cols]
//   lq_fill_random(rows, cols, bits, weight_std, seed) -> packed uint8
//   bench_lq_quantize(rows, cols, bits, iters) -> {ms, GBps} (bf16 bytes read per second)
//   lq_place_half(block uint8, part uint8, first_strip, cols, bits, half) -> the block's bytes after
//     lq_place_half put the part's strips (len(part) / strip bytes of them) into their places
//   fp8_dequantize(codes uint8 [rows, cols], scales f32, block_rows, block_cols) -> w bf16 bits
//     [rows, cols] (weights/fp8_dequantize.h; models/fp8.py dequantize_bf16)
// The packed bytes are those of models/quant/layout.py `pack`. Each call runs on a private stream
// (OpStream); the benchmark times a captured CUDA graph. Helpers: op_helpers.h.
#include "kernels/matmul.cuh"
#include "op_tests/op_helpers.h"
#include "weights/fp8_dequantize.h"
#include "weights/lq_quantize.h"
#include "weights/weights.h"

namespace lampo {

using namespace pybind11::literals;

namespace {

// The packed size of a [rows, cols] matrix at `bits`, 0 where the arguments are ones the launchers
// refuse (they raise the error, naming the op).
size_t packed_bytes_or_zero(int rows, int cols, int bits) {
    return rows > 0 && cols > 0 && bits >= 4 && bits <= 6 ? lq_packed_bytes(rows, cols, bits) : 0;
}

py::array py_lq_quantize(Arr<uint16_t> w, int bits) {
    const char* op = "lq_quantize";
    check_ndim(op, "w", w, 2);
    const int rows = int(w.shape(0)), cols = int(w.shape(1));
    auto d_w = upload(w);
    auto d_packed = poisoned(packed_bytes_or_zero(rows, cols, bits));
    OpStream st;
    lq_quantize(d_w.as<bf16>(), rows, cols, bits, d_packed.as<uint8_t>(), st.s);
    st.finish(op);
    return download<uint8_t>(d_packed, {py::ssize_t(d_packed.bytes())});
}

py::array py_lq_dequantize(Arr<uint8_t> packed, int rows, int cols, int bits) {
    const char* op = "lq_dequantize";
    const size_t bytes = packed_bytes_or_zero(rows, cols, bits);
    if (bytes) check_dim(op, "packed", packed.size(), py::ssize_t(bytes), "size");
    auto d_packed = upload(packed);
    auto d_w = poisoned(bytes ? size_t(rows) * size_t(cols) * 2 : 0);
    OpStream st;
    lq_dequantize(d_packed.as<uint8_t>(), rows, cols, bits, d_w.as<bf16>(), st.s);
    st.finish(op);
    return download<uint16_t>(d_w, {rows, cols});
}

py::array py_lq_fill_random(int rows, int cols, int bits, float weight_std, uint64_t seed) {
    const char* op = "lq_fill_random";
    auto d_packed = poisoned(packed_bytes_or_zero(rows, cols, bits));
    OpStream st;
    lq_fill_random(d_packed.as<uint8_t>(), rows, cols, bits, weight_std, seed, st.s);
    st.finish(op);
    return download<uint8_t>(d_packed, {py::ssize_t(d_packed.bytes())});
}

py::array py_lq_place_half(Arr<uint8_t> block, Arr<uint8_t> part, int first_strip, int cols, int bits, int half) {
    const char* op = "lq_place_half";
    const size_t strip = packed_bytes_or_zero(16, cols, bits);
    require(strip > 0 && part.size() > 0 && size_t(part.size()) % strip == 0, op,
            "part must be whole packed row strips of [16, cols] at bits");
    auto d_block = upload(block);
    auto d_part = upload(part);
    OpStream st;
    lq_place_half(d_part.as<uint8_t>(), first_strip, int(size_t(part.size()) / strip), cols, bits, half,
                  d_block.as<uint8_t>(), st.s);
    st.finish(op);
    return download<uint8_t>(d_block, {block.size()});
}

py::array py_fp8_dequantize(Arr<uint8_t> codes, Arr<float> scales, int block_rows, int block_cols) {
    const char* op = "fp8_dequantize";
    check_ndim(op, "codes", codes, 2);
    check_ndim(op, "scales", scales, 2);
    const int rows = int(codes.shape(0)), cols = int(codes.shape(1));
    if (block_rows > 0 && block_cols > 0)
        check_shape(op, "scales", scales, {(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols});
    auto d_codes = upload(codes);
    auto d_scales = upload(scales);
    auto d_w = poisoned(size_t(rows) * size_t(cols) * 2);
    OpStream st;
    fp8_dequantize(d_codes.as<uint8_t>(), d_scales.as<float>(), rows, cols, block_rows, block_cols, d_w.as<bf16>(), st.s);
    st.finish(op);
    return download<uint16_t>(d_w, {rows, cols});
}

// W uniform in [-0.05, 0.05); one checked call before the capture, so bad arguments raise there.
py::dict py_bench_lq_quantize(int rows, int cols, int bits, int iters) {
    const char* op = "bench_lq_quantize";
    require(iters >= 1, op, "iters must be >= 1, got " + std::to_string(iters));
    const size_t w_bytes = rows > 0 && cols > 0 ? size_t(rows) * size_t(cols) * 2 : 0;
    DeviceBuffer w(w_bytes), packed = filled(packed_bytes_or_zero(rows, cols, bits), 0);
    if (w_bytes) fill_uniform_bf16(w.as<bf16>(), w_bytes / 2, -0.05f, 0.05f, 1, nullptr);
    {
        OpStream st;
        lq_quantize(w.as<bf16>(), rows, cols, bits, packed.as<uint8_t>(), st.s);
        st.finish(op);
    }
    const double us = time_graph(iters, [&](int, cudaStream_t s) {
        lq_quantize(w.as<bf16>(), rows, cols, bits, packed.as<uint8_t>(), s);
    });
    py::dict d;
    d["ms"] = us / 1e3;
    d["GBps"] = double(w_bytes) / us / 1e3;
    return d;
}

}  // namespace

void register_lq_quant_ops(py::module_& ops) {
    ops.def("lq_quantize", &py_lq_quantize, "w"_a, "bits"_a,
            "quantize a bf16 matrix (bits) into LQ tiles on the GPU -> packed uint8");
    ops.def("lq_dequantize", &py_lq_dequantize, "packed"_a, "rows"_a, "cols"_a, "bits"_a,
            "an LQ matrix back to bf16 -> bf16 bits [rows, cols]");
    ops.def("lq_fill_random", &py_lq_fill_random, "rows"_a, "cols"_a, "bits"_a, "weight_std"_a, "seed"_a,
            "a random LQ matrix (bench) -> packed uint8");
    ops.def("lq_place_half", &py_lq_place_half, "block"_a, "part"_a, "first_strip"_a, "cols"_a, "bits"_a, "half"_a,
            "an interleaved gate|up block's bytes with the part's strips of one half (0 gate, 1 up) placed");
    ops.def("fp8_dequantize", &py_fp8_dequantize, "codes"_a, "scales"_a, "block_rows"_a, "block_cols"_a,
            "a block-scaled FP8 matrix (e4m3 codes, fp32 scales) as bf16 -> bf16 bits [rows, cols]");
    ops.def("bench_lq_quantize", &py_bench_lq_quantize, "rows"_a, "cols"_a, "bits"_a, "iters"_a = 3,
            "time lq_quantize in a CUDA graph -> {ms, GBps}");
}

}  // namespace lampo
