// ops_lq_fused_bindings.cpp - the decode step's folded forms for LQ weights on numpy arrays, for
// tests/cuda/test_ops_lq_fused.py (bf16 travels as uint16 bits; packed matrices and banks as
// models/quant/layout.py `pack` writes them; helpers: op_helpers.h):
//   gemv_lq_normed(packed, bits, out, in_, residual f32 [1, in], norm_w [in], eps, f32_out)
//     -> (y [1, out] = W @ bf16(rmsnorm(residual) * (1 + norm_w)), the normed row [1, in] it wrote)
//   gemv_lq_add_residual(packed, bits, out, in_, x [1, in], residual f32 [1, out], set)
//     -> residual + float(bf16(x @ W^T)) (set: 0 + float(...), the residual's values unused)
//   gemv_lq_add_residual_prenorm(packed, bits, out, in_, x [T, in], residual f32 [T, out], norm_w [out])
//     -> (residual + float(bf16(x @ W^T)), prenormed rows [T, out], strip sums of squares [T, out / 16])
//   gemv_lq_prenormed(packed, bits, out, in_, rows [T, in], strip_squares f32 [T, in / 16], eps, widths)
//     -> bf16(inv_t * (rows @ W^T)) [T, out], or with widths the row parts one after another as
//     linear_parts returns them
//   moe_lq_decode_shared(h [T, H], gate_up [E, bytes], bits_gu, down [E, bytes], bits_dn, ids [T, k],
//     weights [T, k], I, <shared>) -> (act [T, k, I], act_s [T, Is], out [T, H], gate [T]):
//     moe_experts_lq_gate_up + moe_experts_lq_down with the shared slot
//   moe_lq_decode_select(h, logits [T, E], gate_up, bits_gu, down, bits_dn, I, residual f32 [T, H], k,
//     <shared>) -> (ids, weights, act, act_s, residual + the MoE block): moe_experts_lq_gate_up_select
//     + moe_experts_lq_down_add (act_s None without the shared slot)
//   <shared>: shared_gate_up [bytes of [2Is, H]], shared_gate_up_bits, shared_down [bytes of [H, Is]],
//     shared_down_bits, w_gate [H], Is (None: no shared slot; only the select form allows that).
// The MoE ops run on the default stream; with repeat > 0 the mean ms of `repeat` cold-L2 runs of
// both launches is appended (run_op).
#include <optional>

#include <pybind11/stl.h>

#include "kernels/matmul.cuh"
#include "kernels/ops.h"
#include "op_tests/op_helpers.h"

namespace lampo {

using namespace pybind11::literals;

namespace {

void check_lq_matrix(const char* op, const char* name, py::ssize_t bytes, int bits, int rows, int cols) {
    require(bits >= 4 && bits <= 6 && rows > 0 && rows % 16 == 0 && cols > 0 && cols % 64 == 0, op,
            std::string(name) + " needs bits 4..6 and a [16n, 64k] matrix");
    check_dim(op, name, bytes, py::ssize_t(lq_packed_bytes(rows, cols, bits)), "size");
}

py::tuple py_gemv_lq_normed(Arr<uint8_t> packed, int bits, int out, int in, Arr<float> residual, Arr<uint16_t> norm_w,
                            float eps, bool f32_out) {
    const char* op = "gemv_lq_normed";
    check_lq_matrix(op, "packed", packed.size(), bits, out, in);
    check_dim(op, "residual", residual.size(), in, "length");
    check_dim(op, "norm_w", norm_w.size(), in, "length");
    auto d_w = upload(packed);
    auto d_r = upload(residual);
    auto d_n = upload(norm_w);
    auto d_y = poisoned(size_t(out) * (f32_out ? 4 : 2));
    auto d_normed = poisoned(size_t(in) * 2);
    OpStream st;
    const ResidualNorm x{d_r.as<float>(), d_n.as<bf16>(), eps, d_normed.as<bf16>()};
    if (f32_out) gemv_lq_normed(d_w.as<uint8_t>(), bits, x, d_y.as<float>(), out, in, st.s);
    else gemv_lq_normed(d_w.as<uint8_t>(), bits, x, d_y.as<bf16>(), out, in, st.s);
    st.finish(op);
    py::array y = f32_out ? py::array(download<float>(d_y, {1, out})) : py::array(download<uint16_t>(d_y, {1, out}));
    return py::make_tuple(y, download<uint16_t>(d_normed, {1, in}));
}

py::array_t<float> py_gemv_lq_add_residual(Arr<uint8_t> packed, int bits, int out, int in, Arr<uint16_t> x,
                                           Arr<float> residual, bool set) {
    const char* op = set ? "gemv_lq_set_residual" : "gemv_lq_add_residual";
    check_lq_matrix(op, "packed", packed.size(), bits, out, in);
    check_dim(op, "x", x.size(), in, "length");
    check_dim(op, "residual", residual.size(), out, "length");
    auto d_w = upload(packed);
    auto d_x = upload(x);
    auto d_r = upload(residual);
    OpStream st;
    gemv_lq_add_residual(d_w.as<uint8_t>(), bits, d_x.as<bf16>(), d_r.as<float>(), out, in, st.s, set);
    st.finish(op);
    return download<float>(d_r, {1, out});
}

py::tuple py_gemv_lq_add_residual_prenorm(Arr<uint8_t> packed, int bits, int out, int in, Arr<uint16_t> x,
                                          Arr<float> residual, Arr<uint16_t> norm_w) {
    const char* op = "gemv_lq_add_residual_prenorm";
    check_lq_matrix(op, "packed", packed.size(), bits, out, in);
    check_ndim(op, "x", x, 2);
    check_dim(op, "x", x.shape(1), in, "width");
    const int T = int(x.shape(0));
    check_dim(op, "residual", residual.size(), py::ssize_t(T) * out, "size");
    check_dim(op, "norm_w", norm_w.size(), out, "length");
    auto d_w = upload(packed);
    auto d_x = upload(x);
    auto d_r = upload(residual);
    auto d_n = upload(norm_w);
    auto d_rows = poisoned(size_t(T) * out * 2);
    auto d_sq = poisoned(size_t(T) * (out / 16) * 4);
    OpStream st;
    gemv_lq_add_residual_prenorm(d_w.as<uint8_t>(), bits, d_x.as<bf16>(), d_r.as<float>(),
                                 {d_n.as<bf16>(), d_rows.as<bf16>(), d_sq.as<float>()}, T, out, in, st.s);
    st.finish(op);
    return py::make_tuple(download<float>(d_r, {T, out}), download<uint16_t>(d_rows, {T, out}),
                          download<float>(d_sq, {T, out / 16}));
}

// The tokens of a prenormed input projection's arguments, after checking their shapes.
int checked_prenormed_tokens(const char* op, const Arr<uint8_t>& packed, int bits, int out, int in,
                             const Arr<uint16_t>& rows, const Arr<float>& strip_squares) {
    check_lq_matrix(op, "packed", packed.size(), bits, out, in);
    check_ndim(op, "rows", rows, 2);
    check_dim(op, "rows", rows.shape(1), in, "width");
    const int T = int(rows.shape(0));
    check_dim(op, "strip_squares", strip_squares.size(), py::ssize_t(T) * (in / 16), "size");
    return T;
}

py::array py_gemv_lq_prenormed(Arr<uint8_t> packed, int bits, int out, int in, Arr<uint16_t> rows,
                               Arr<float> strip_squares, float eps, const std::vector<int>& widths) {
    const char* op = "gemv_lq_prenormed";
    const int T = checked_prenormed_tokens(op, packed, bits, out, in, rows, strip_squares);
    require(int(widths.size()) <= RowParts::MAX, op, "at most 4 parts");
    auto d_w = upload(packed);
    auto d_x = upload(rows);
    auto d_sq = upload(strip_squares);
    RowParts parts;
    parts.n = int(widths.size());
    for (int i = 0; i < parts.n; ++i) parts.first[i + 1] = parts.first[i] + widths[i];
    const int stored = parts.n ? parts.first[parts.n] : out;
    auto d_y = poisoned(size_t(T) * stored * 2);
    for (int i = 0; i < parts.n; ++i) parts.dst[i] = d_y.as<bf16>() + size_t(T) * parts.first[i];
    OpStream st;
    gemv_lq_prenormed(d_w.as<uint8_t>(), bits, {d_x.as<bf16>(), d_sq.as<float>(), eps}, d_y.as<bf16>(), parts, T,
                      out, in, st.s);
    st.finish(op);
    return parts.n ? py::array(download<uint16_t>(d_y, {py::ssize_t(T) * stored}))
                   : py::array(download<uint16_t>(d_y, {T, out}));
}

py::array_t<uint16_t> py_gemv_lq_prenormed_swiglu(Arr<uint8_t> packed, int bits, int out, int in, Arr<uint16_t> rows,
                                                  Arr<float> strip_squares, float eps) {
    const char* op = "gemv_lq_prenormed_swiglu";
    const int T = checked_prenormed_tokens(op, packed, bits, out, in, rows, strip_squares);
    auto d_w = upload(packed);
    auto d_x = upload(rows);
    auto d_sq = upload(strip_squares);
    auto d_act = poisoned(size_t(T) * (out / 2) * 2);
    OpStream st;
    gemv_lq_prenormed_swiglu(d_w.as<uint8_t>(), bits, {d_x.as<bf16>(), d_sq.as<float>(), eps}, d_act.as<bf16>(), T,
                             out, in, st.s);
    st.finish(op);
    return download<uint16_t>(d_act, {T, out / 2});
}

// The shared expert's buffers for slot k of the LQ decode launches (MoeSharedSlotLq in ops.h).
struct SharedLqBuffers {
    DeviceBuffer gate_up, down, w_gate, gate;
    MoeSharedSlotLq slot;
    const MoeSharedSlotLq* get() const { return slot.gate_up ? &slot : nullptr; }
};

SharedLqBuffers upload_shared(const char* op, int T, int H, const std::optional<Arr<uint8_t>>& gate_up,
                              int gate_up_bits, const std::optional<Arr<uint8_t>>& down, int down_bits,
                              const std::optional<Arr<uint16_t>>& w_gate, int Is) {
    SharedLqBuffers b;
    require(gate_up.has_value() == down.has_value() && gate_up.has_value() == w_gate.has_value(), op,
            "shared_gate_up, shared_down and w_gate come together");
    if (!gate_up) return b;
    check_lq_matrix(op, "shared_gate_up", gate_up->size(), gate_up_bits, 2 * Is, H);
    check_lq_matrix(op, "shared_down", down->size(), down_bits, H, Is);
    check_dim(op, "w_gate", w_gate->size(), H, "length");
    b.gate_up = upload(*gate_up);
    b.down = upload(*down);
    b.w_gate = upload(*w_gate);
    b.gate = poisoned(size_t(T) * 4);
    b.slot = {b.gate_up.as<uint8_t>(), gate_up_bits, b.down.as<uint8_t>(), down_bits, b.w_gate.as<bf16>(),
              b.gate.as<float>(), Is};
    return b;
}

// An LQ expert bank [E, bytes] of [rows, cols] matrices at `bits`.
void check_bank(const char* op, const char* name, const Arr<uint8_t>& bank, int bits, int rows, int cols) {
    check_ndim(op, name, bank, 2);
    check_lq_matrix(op, name, bank.shape(1), bits, rows, cols);
}

// act [T, k, I] and (Is > 0) act_s [T, Is] out of the act buffer.
void append_act(py::list& out, const DeviceBuffer& act, int T, int k, int I, int Is) {
    const py::array flat = download<uint16_t>(act, {py::ssize_t(T) * k * I + py::ssize_t(T) * Is});
    const py::ssize_t routed = py::ssize_t(T) * k * I;
    out.append(flat[py::slice(0, routed, 1)].attr("reshape")(T, k, I));
    out.append(Is ? py::object(flat[py::slice(routed, routed + py::ssize_t(T) * Is, 1)].attr("reshape")(T, Is))
                  : py::object(py::none()));
}

py::tuple py_moe_lq_decode_shared(Arr<uint16_t> h, Arr<uint8_t> gate_up, int bits_gu, Arr<uint8_t> down, int bits_dn,
                                  Arr<int32_t> ids, Arr<float> weights, int I, Arr<uint8_t> shared_gate_up,
                                  int shared_gate_up_bits, Arr<uint8_t> shared_down, int shared_down_bits,
                                  Arr<uint16_t> w_gate, int Is, int repeat) {
    const char* op = "moe_lq_decode_shared";
    check_ndim(op, "h", h, 2);
    check_ndim(op, "ids", ids, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), k = int(ids.shape(1));
    check_shape(op, "weights", weights, {T, k});
    check_bank(op, "gate_up", gate_up, bits_gu, 2 * I, H);
    check_bank(op, "down", down, bits_dn, H, I);
    check_dim(op, "down", down.shape(0), gate_up.shape(0), "experts");
    check_ids_below(op, ids, int(gate_up.shape(0)));
    const SharedLqBuffers sh =
        upload_shared(op, T, H, shared_gate_up, shared_gate_up_bits, shared_down, shared_down_bits, w_gate, Is);
    DeviceBuffer d_h = upload(h), d_gu = upload(gate_up), d_dn = upload(down), d_ids = upload(ids);
    DeviceBuffer d_wt = upload(weights), d_out = poisoned(size_t(T) * H * 2);
    DeviceBuffer act = poisoned((size_t(T) * k * I + size_t(T) * Is) * 2);
    return run_op(
        op, repeat,
        [&] {
            moe_experts_lq_gate_up(d_h.as<bf16>(), d_gu.as<uint8_t>(), bits_gu, d_ids.as<int32_t>(), act.as<bf16>(),
                                   T, k, H, I, 0, sh.get());
            moe_experts_lq_down(act.as<bf16>(), d_dn.as<uint8_t>(), bits_dn, d_ids.as<int32_t>(), d_wt.as<float>(),
                                d_out.as<bf16>(), T, k, H, I, 0, sh.get());
        },
        [&](py::list& out) {
            append_act(out, act, T, k, I, Is);
            out.append(download<uint16_t>(d_out, {T, H}));
            out.append(download<float>(sh.gate, {T}));
        });
}

py::tuple py_moe_lq_decode_select(Arr<uint16_t> h, Arr<float> logits, Arr<uint8_t> gate_up, int bits_gu,
                                  Arr<uint8_t> down, int bits_dn, int I, Arr<float> residual, int k,
                                  std::optional<Arr<uint8_t>> shared_gate_up, int shared_gate_up_bits,
                                  std::optional<Arr<uint8_t>> shared_down, int shared_down_bits,
                                  std::optional<Arr<uint16_t>> w_gate, int Is, int repeat) {
    const char* op = "moe_lq_decode_select";
    check_ndim(op, "h", h, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), E = int(gate_up.shape(0));
    check_shape(op, "logits", logits, {T, E});
    check_shape(op, "residual", residual, {T, H});
    check_bank(op, "gate_up", gate_up, bits_gu, 2 * I, H);
    check_bank(op, "down", down, bits_dn, H, I);
    check_dim(op, "down", down.shape(0), E, "experts");
    const SharedLqBuffers sh =
        upload_shared(op, T, H, shared_gate_up, shared_gate_up_bits, shared_down, shared_down_bits, w_gate, Is);
    const int act_s = sh.get() ? Is : 0;
    DeviceBuffer d_h = upload(h), d_lg = upload(logits), d_gu = upload(gate_up), d_dn = upload(down);
    DeviceBuffer d_res = upload(residual), d_ids = poisoned(size_t(T) * k * 4), d_wt = poisoned(size_t(T) * k * 4);
    DeviceBuffer act = poisoned((size_t(T) * k * I + size_t(T) * act_s) * 2);
    return run_op(
        op, repeat,
        [&] {
            moe_experts_lq_gate_up_select(d_h.as<bf16>(), d_lg.as<float>(), E, d_gu.as<uint8_t>(), bits_gu,
                                          d_ids.as<int32_t>(), d_wt.as<float>(), act.as<bf16>(), T, k, H, I, 0,
                                          sh.get());
            moe_experts_lq_down_add(act.as<bf16>(), d_dn.as<uint8_t>(), bits_dn, d_ids.as<int32_t>(), d_wt.as<float>(),
                                    d_res.as<float>(), T, k, H, I, 0, sh.get());
        },
        [&](py::list& out) {
            out.append(download<int32_t>(d_ids, {T, k}));
            out.append(download<float>(d_wt, {T, k}));
            append_act(out, act, T, k, I, act_s);
            out.append(download<float>(d_res, {T, H}));
        });
}

}  // namespace

void register_lq_fused_ops(py::module_& ops) {
    ops.def("gemv_lq_normed", &py_gemv_lq_normed, "packed"_a, "bits"_a, "out"_a, "in_"_a, "residual"_a, "norm_w"_a,
            "eps"_a = 1e-6f, "f32_out"_a = false,
            "decode-step input projection, LQ W: (W @ rmsnorm1p(residual), the normed row) (bf16 bits / f32)");
    ops.def("gemv_lq_add_residual", &py_gemv_lq_add_residual, "packed"_a, "bits"_a, "out"_a, "in_"_a, "x"_a,
            "residual"_a, "set"_a = false,
            "decode-step output projection, LQ W: residual + float(bf16(x @ W^T)); set: residual taken as zeros");
    ops.def("gemv_lq_add_residual_prenorm", &py_gemv_lq_add_residual_prenorm, "packed"_a, "bits"_a, "out"_a, "in_"_a,
            "x"_a, "residual"_a, "norm_w"_a,
            "output projection carrying the next norm's first half, LQ W -> (residual, prenormed rows, strip squares)");
    ops.def("gemv_lq_prenormed", &py_gemv_lq_prenormed, "packed"_a, "bits"_a, "out"_a, "in_"_a, "rows"_a,
            "strip_squares"_a, "eps"_a = 1e-6f, "widths"_a = std::vector<int>{},
            "input projection on prenormed rows, LQ W: bf16(inv_t * (rows @ W^T)), or its row parts");
    ops.def("gemv_lq_prenormed_swiglu", &py_gemv_lq_prenormed_swiglu, "packed"_a, "bits"_a, "out"_a, "in_"_a, "rows"_a,
            "strip_squares"_a, "eps"_a = 1e-6f,
            "gemv_lq_prenormed of an interleaved gate|up block with silu(gate) * up applied: act [T, out / 2] bf16 bits");
    ops.def("moe_lq_decode_shared", &py_moe_lq_decode_shared, "h"_a, "gate_up"_a, "bits_gu"_a, "down"_a, "bits_dn"_a,
            "ids"_a, "weights"_a, "I"_a, "shared_gate_up"_a, "shared_gate_up_bits"_a, "shared_down"_a,
            "shared_down_bits"_a, "w_gate"_a, "Is"_a, "repeat"_a = 0,
            "LQ expert launches with the shared slot -> (act, act_s, out [T, H], gate [T])");
    ops.def("moe_lq_decode_select", &py_moe_lq_decode_select, "h"_a, "logits"_a, "gate_up"_a, "bits_gu"_a, "down"_a,
            "bits_dn"_a, "I"_a, "residual"_a, "k"_a, "shared_gate_up"_a = py::none(), "shared_gate_up_bits"_a = 0,
            "shared_down"_a = py::none(), "shared_down_bits"_a = 0, "w_gate"_a = py::none(), "Is"_a = 0,
            "repeat"_a = 0,
            "the decode step's LQ MoE launches (select, add) -> (ids, weights, act, act_s, residual + block)");
}

}  // namespace lampo
