// ops_gdn_moe_bindings.cpp - lampo._native_ops entry points for the Gated DeltaNet and MoE
// kernels, on numpy arrays (bf16 as uint16 bit patterns, fp32 as float32, ids as int32), for the
// cuda-marked tests: each call uploads its inputs, runs the launcher once on the default stream
// and downloads the outputs (in-place state arguments come back as new arrays). Outputs and
// workspaces start poisoned (all bytes 0xFF: NaN for bf16/fp32, -1 for ids), so a value the
// kernel forgot to write, or a workspace read before it was written, shows up in the result.
//
// Timing: every function takes `repeat` (default 0). With repeat = N > 0 the launcher is re-run
// N more times on the same device buffers (after the outputs were downloaded), each run after
// evicting L2 with a 256 MiB memset, and the mean time per run in ms (CUDA events) is appended
// to the returned tuple (run_op). Argument checks and run_op: op_helpers.h.
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "kernels/ops.h"
#include "op_tests/op_helpers.h"

namespace lampo {
namespace {

// A GDN state ring for one op call (ops.h, GdnStates): `slots` slots of the given state's size, all
// poisoned but slot pos % slots, which holds the state, and the device position pos. slots = 0
// takes the fewest the call allows (T + 1 with rows, else 1).
template <class E>
struct StateRing {
    int slots, pos;
    size_t slot_elems;
    std::vector<py::ssize_t> shape;
    std::vector<E> input;
    DeviceBuffer buf, d_pos;

    StateRing(const char* op, const Arr<E>& state, int slots_in, int pos_in, int T, bool rows)
        : slots(slots_in ? slots_in : (rows ? T + 1 : 1)), pos(pos_in), slot_elems(size_t(state.size())),
          shape(state.shape(), state.shape() + state.ndim()), input(state.data(), state.data() + state.size()),
          buf(poisoned(size_t(slots) * slot_elems * sizeof(E))), d_pos(device_int(pos_in)) {
        require(slots >= 1 && pos >= 0, op, "slots must be >= 1 and pos >= 0");
        LAMPO_CUDA_CHECK(cudaMemcpy(buf.as<E>() + offset(pos), input.data(), slot_elems * sizeof(E),
                                    cudaMemcpyHostToDevice));
    }
    size_t offset(int position) const { return size_t(position % slots) * slot_elems; }
    py::array_t<E> at(int position) const { return download<E>(buf, shape, offset(position)); }
    // [T, state...]: the states after each of the call's T tokens (its rows).
    py::array_t<E> rows(int T) const {
        std::vector<py::ssize_t> rows_shape{T};
        rows_shape.insert(rows_shape.end(), shape.begin(), shape.end());
        py::array_t<E> out(rows_shape);
        LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
        for (int t = 0; t < T; ++t)
            LAMPO_CUDA_CHECK(cudaMemcpy(out.mutable_data() + t * slot_elems, buf.as<E>() + offset(pos + 1 + t),
                                        slot_elems * sizeof(E), cudaMemcpyDeviceToHost));
        return out;
    }
    // Throws unless the slots the call must not write are as they were: the slot read (when no
    // token's state goes there) still holds the input, every other one is still poisoned. none: the
    // call writes no slot at all (a window that leaves records).
    void check_untouched(const char* op, int T, bool with_rows, bool none = false) const {
        std::vector<bool> written(slots, false);
        for (int t = with_rows ? 0 : T - 1; t < T && !none; ++t) written[(pos + 1 + t) % slots] = true;
        std::vector<E> host(size_t(slots) * slot_elems);
        LAMPO_CUDA_CHECK(cudaMemcpy(host.data(), buf.get(), host.size() * sizeof(E), cudaMemcpyDeviceToHost));
        for (int slot = 0; slot < slots; ++slot) {
            if (written[slot]) continue;
            const unsigned char* got = reinterpret_cast<const unsigned char*>(host.data() + slot * slot_elems);
            const bool read_slot = slot == pos % slots;
            const unsigned char* want = reinterpret_cast<const unsigned char*>(input.data());
            for (size_t i = 0; i < slot_elems * sizeof(E); ++i) {
                if (got[i] != (read_slot ? want[i] : 0xFF))
                    throw std::runtime_error(std::string(op) + ": state slot " + std::to_string(slot) +
                                             " was written, and no token's state belongs there");
            }
        }
    }
};

// Records of a window (GdnStates::records) when asked for: room for GEMV_MAX_T tokens, poisoned.
struct WindowRecords {
    int Hk, Hv;
    DeviceBuffer buf;
    WindowRecords(bool on, int Hk_in, int Hv_in)
        : Hk(Hk_in), Hv(Hv_in), buf(on ? poisoned(size_t(GEMV_MAX_T) * gdn_record_floats(Hk_in, Hv_in) * 4) : DeviceBuffer{}) {}
    float* get() const { return buf.get() ? buf.as<float>() : nullptr; }
    // The recurrent states after tokens 0 .. T-1 rebuilt in their slots by gdn_replay (the window
    // wrote none of them): rows() and at() then read what replay made. With keep > 0 only the state
    // after token keep - 1, in its slot (the slot read, when the ring has one).
    void replay_rows(const StateRing<float>& rec, int T, int only_keep = 0) const {
        for (int keep = only_keep ? only_keep : 1; keep <= (only_keep ? only_keep : T); ++keep) {
            GdnReplay r;
            r.recurrent = rec.buf.as<float>();
            r.records = get();
            r.layers = 1;
            r.slots = rec.slots;
            r.pos = rec.pos;
            r.keep = keep;
            r.Hk = Hk;
            r.Hv = Hv;
            gdn_replay(r, 0);
            LAMPO_CHECK_LAUNCH("gdn_replay");
        }
        LAMPO_CUDA_CHECK(cudaDeviceSynchronize());
    }
};

GdnStates conv_ring(const StateRing<uint16_t>& conv) {
    return GdnStates{nullptr, conv.buf.as<bf16>(), conv.slots, conv.d_pos.as<int32_t>()};
}
GdnStates rec_ring(const StateRing<float>& rec) {
    return GdnStates{rec.buf.as<float>(), nullptr, rec.slots, rec.d_pos.as<int32_t>()};
}

// (y, new state[, the state after each token]); rows: ask for the row states (T <= 64).
py::tuple conv1d_op(const Arr<uint16_t>& x, const Arr<uint16_t>& w, const Arr<uint16_t>& state, bool rows,
                    int slots, int pos, int repeat) {
    const char* op = "causal_conv1d_silu";
    check_ndim(op, "x", x, 2);
    check_ndim(op, "w", w, 2);
    const int T = int(x.shape(0)), C = int(x.shape(1)), K = int(w.shape(1));
    check_shape(op, "w", w, {C, K});
    check_shape(op, "state", state, {C, K - 1});
    DeviceBuffer dx = upload(x), dw = upload(w), dy = poisoned(size_t(T) * C * 2);
    const StateRing<uint16_t> ring(op, state, slots, pos, T, rows);
    return run_op(op, repeat,
                  [&] { causal_conv1d_silu(dx.as<bf16>(), dw.as<bf16>(), conv_ring(ring), dy.as<bf16>(), T, C, K, 0, rows); },
                  [&](py::list& out) {
                      ring.check_untouched(op, T, rows);
                      out.append(download<uint16_t>(dy, {T, C}));
                      out.append(ring.at(pos + T));
                      if (rows) out.append(ring.rows(T));
                  });
}

struct GdnInputs {
    int T, Hk, Hv;
    DeviceBuffer qkv, a, b, A_log, dt_bias, o;
};

GdnInputs gdn_inputs(const char* op, const Arr<uint16_t>& qkv, const Arr<uint16_t>& a,
                     const Arr<uint16_t>& b, const Arr<float>& A_log, const Arr<float>& dt_bias,
                     const Arr<float>& state, int Hk) {
    check_ndim(op, "qkv", qkv, 2);
    check_ndim(op, "a", a, 2);
    const int T = int(qkv.shape(0)), Hv = int(a.shape(1)), D = 128;
    require(Hk >= 1, op, "Hk must be >= 1");
    check_shape(op, "qkv", qkv, {T, 2 * Hk * D + Hv * D});
    check_shape(op, "a", a, {T, Hv});
    check_shape(op, "b", b, {T, Hv});
    check_shape(op, "A_log", A_log, {Hv});
    check_shape(op, "dt_bias", dt_bias, {Hv});
    check_shape(op, "state", state, {Hv, D, D});
    return GdnInputs{T, Hk, Hv, upload(qkv), upload(a), upload(b), upload(A_log), upload(dt_bias),
                     poisoned(size_t(T) * Hv * D * 2)};
}

py::tuple gdn_recurrent_op(const Arr<uint16_t>& qkv, const Arr<uint16_t>& a, const Arr<uint16_t>& b,
                           const Arr<float>& A_log, const Arr<float>& dt_bias, const Arr<float>& state,
                           int Hk, bool rows, int slots, int pos, bool records, int repeat) {
    const char* op = "gated_delta_rule_recurrent";
    GdnInputs g = gdn_inputs(op, qkv, a, b, A_log, dt_bias, state, Hk);
    require(!records || (rows && g.T <= GEMV_MAX_T), op, "records are a window's (rows, T <= 8)");
    const StateRing<float> ring(op, state, slots, pos, g.T, rows);
    const WindowRecords recs(records, Hk, g.Hv);
    return run_op(op, repeat,
                  [&] {
                      GdnStates states = rec_ring(ring);
                      states.records = recs.get();
                      gated_delta_rule_recurrent(g.qkv.as<bf16>(), g.a.as<bf16>(), g.b.as<bf16>(),
                                                 g.A_log.as<float>(), g.dt_bias.as<float>(), states,
                                                 g.o.as<bf16>(), rows, g.T, g.Hk, g.Hv, 128, 128, 0);
                  },
                  [&](py::list& out) {
                      ring.check_untouched(op, g.T, rows, records);
                      out.append(download<uint16_t>(g.o, {g.T, g.Hv, 128}));
                      if (records) recs.replay_rows(ring, g.T);
                      out.append(ring.at(pos + g.T));
                      if (rows)
                          out.append(ring.rows(g.T));
                      else
                          out.append(py::none());
                  });
}

py::tuple gdn_decode_fused_op(const Arr<uint16_t>& qkv, const Arr<uint16_t>& conv_w,
                              const Arr<uint16_t>& conv_state, const Arr<uint16_t>& a, const Arr<uint16_t>& b,
                              const Arr<float>& A_log, const Arr<float>& dt_bias, const Arr<float>& state,
                              const Arr<uint16_t>& z, const Arr<uint16_t>& norm_w, int Hk, bool rows, float eps,
                              int slots, int pos, bool records, int recurrent_slots, int keep, int repeat) {
    const char* op = "gdn_decode_fused";
    GdnInputs g = gdn_inputs(op, qkv, a, b, A_log, dt_bias, state, Hk);
    require(!records || rows, op, "records are a window's (rows)");
    require(keep == 0 || (records && keep >= 1 && keep <= g.T), op, "keep is 1..T of a window with records");
    check_ndim(op, "conv_w", conv_w, 2);
    const int T = g.T, C = int(qkv.shape(1)), K = int(conv_w.shape(1)), D = 128;
    check_shape(op, "conv_w", conv_w, {C, K});
    check_shape(op, "conv_state", conv_state, {C, K - 1});
    check_shape(op, "z", z, {T, g.Hv * D});
    check_shape(op, "norm_w", norm_w, {D});
    DeviceBuffer d_cw = upload(conv_w), d_z = upload(z), d_nw = upload(norm_w);
    DeviceBuffer d_y = poisoned(size_t(T) * g.Hv * D * 2), counters = filled(size_t(Hk) * 4, 0);
    const StateRing<uint16_t> conv(op, conv_state, slots, pos, T, rows);
    // the fewest slots by default: one for a window replayed at one keep, else one a row as the conv's
    const StateRing<float> rec(op, state, recurrent_slots ? recurrent_slots : slots, pos, T, rows && keep == 0);
    const WindowRecords recs(records, Hk, g.Hv);
    return run_op(op, repeat,
                  [&] {
                      const GdnStates states{rec.buf.as<float>(), conv.buf.as<bf16>(), conv.slots,
                                             rec.d_pos.as<int32_t>(), recs.get(), rec.slots};
                      gdn_decode_fused(g.qkv.as<bf16>(), d_cw.as<bf16>(), g.a.as<bf16>(), g.b.as<bf16>(),
                                       g.A_log.as<float>(), g.dt_bias.as<float>(), states, d_z.as<bf16>(),
                                       d_nw.as<bf16>(), d_y.as<bf16>(), counters.as<unsigned>(), rows, T, Hk, g.Hv,
                                       D, D, K, eps, 0);
                  },
                  [&](py::list& out) {
                      std::vector<unsigned> left(static_cast<size_t>(Hk));
                      LAMPO_CUDA_CHECK(cudaMemcpy(left.data(), counters.get(), counters.bytes(), cudaMemcpyDeviceToHost));
                      for (unsigned v : left)
                          if (v != 0)
                              throw std::runtime_error(std::string(op) + ": a block counter was left at " +
                                                       std::to_string(v) + " (must return to 0)");
                      conv.check_untouched(op, T, rows);
                      rec.check_untouched(op, T, rows, records);
                      out.append(download<uint16_t>(d_y, {T, g.Hv * D}));
                      out.append(conv.at(pos + T));
                      if (records) recs.replay_rows(rec, T, keep);
                      out.append(rec.at(pos + (keep ? keep : T)));
                      if (rows) {
                          out.append(conv.rows(T));
                          if (keep)
                              out.append(py::none());
                          else
                              out.append(rec.rows(T));
                      }
                  });
}

py::tuple gdn_chunked_op(const Arr<uint16_t>& qkv, const Arr<uint16_t>& a, const Arr<uint16_t>& b,
                         const Arr<float>& A_log, const Arr<float>& dt_bias, const Arr<float>& state,
                         int Hk, int slots, int pos, int repeat) {
    const char* op = "gated_delta_rule_chunked";
    GdnInputs g = gdn_inputs(op, qkv, a, b, A_log, dt_bias, state, Hk);
    const StateRing<float> ring(op, state, slots, pos, g.T, false);
    DeviceBuffer ws = poisoned(gdn_chunked_workspace_bytes(g.T, g.Hv, 128, 128));
    return run_op(op, repeat,
                  [&] {
                      gated_delta_rule_chunked(g.qkv.as<bf16>(), g.a.as<bf16>(), g.b.as<bf16>(),
                                               g.A_log.as<float>(), g.dt_bias.as<float>(), rec_ring(ring),
                                               g.o.as<bf16>(), ws.get(), g.T, g.Hk, g.Hv, 128, 128, 0);
                  },
                  [&](py::list& out) {
                      ring.check_untouched(op, g.T, false);
                      out.append(download<uint16_t>(g.o, {g.T, g.Hv, 128}));
                      out.append(ring.at(pos + g.T));
                  });
}

py::object gated_rmsnorm_op(const Arr<uint16_t>& o, const Arr<uint16_t>& z, const Arr<uint16_t>& w,
                            float eps, int repeat) {
    const char* op = "gated_rmsnorm";
    check_ndim(op, "o", o, 3);
    const int T = int(o.shape(0)), Hv = int(o.shape(1)), dv = int(o.shape(2));
    check_shape(op, "z", z, {T, Hv * dv});
    check_shape(op, "w", w, {dv});
    DeviceBuffer d_o = upload(o), d_z = upload(z), d_w = upload(w), d_y = poisoned(size_t(T) * Hv * dv * 2);
    return single_or_tuple(run_op(
        op, repeat,
        [&] { gated_rmsnorm(d_o.as<bf16>(), d_z.as<bf16>(), d_w.as<bf16>(), d_y.as<bf16>(), T, Hv, dv, eps, 0); },
        [&](py::list& out) { out.append(download<uint16_t>(d_y, {T, Hv * dv})); }));
}

py::tuple router_op(const Arr<uint16_t>& h, const Arr<uint16_t>& w_router, int k, int repeat) {
    const char* op = "moe_router_topk";
    check_ndim(op, "h", h, 2);
    check_ndim(op, "w_router", w_router, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), E = int(w_router.shape(0));
    check_shape(op, "w_router", w_router, {E, H});
    DeviceBuffer d_h = upload(h), d_w = upload(w_router);
    DeviceBuffer logits = poisoned(size_t(T) * E * 4), ids = poisoned(size_t(T) * k * 4),
                 weights = poisoned(size_t(T) * k * 4);
    return run_op(op, repeat,
                  [&] {
                      moe_router_topk(d_h.as<bf16>(), d_w.as<bf16>(), logits.as<float>(),
                                      ids.as<int32_t>(), weights.as<float>(), T, H, E, k, 0);
                  },
                  [&](py::list& out) {
                      out.append(download<int32_t>(ids, {T, k}));
                      out.append(download<float>(weights, {T, k}));
                      out.append(download<float>(logits, {T, E}));
                  });
}

py::object gate_up_op(const Arr<uint16_t>& h, const Arr<uint16_t>& gate_up, const Arr<int32_t>& ids,
                      int repeat) {
    const char* op = "moe_experts_gate_up";
    check_ndim(op, "h", h, 2);
    check_ndim(op, "gate_up", gate_up, 3);
    check_ndim(op, "ids", ids, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), E = int(gate_up.shape(0));
    const int I = int(gate_up.shape(1)) / 2, k = int(ids.shape(1));
    check_shape(op, "gate_up", gate_up, {E, 2 * I, H});
    check_shape(op, "ids", ids, {T, k});
    check_ids_below(op, ids, E);
    DeviceBuffer d_h = upload(h), d_w = upload(gate_up), d_ids = upload(ids), act = poisoned(size_t(T) * k * I * 2);
    return single_or_tuple(run_op(
        op, repeat,
        [&] { moe_experts_gate_up(d_h.as<bf16>(), d_w.as<bf16>(), d_ids.as<int32_t>(), act.as<bf16>(), T, k, H, I, 0); },
        [&](py::list& out) { out.append(download<uint16_t>(act, {T, k, I})); }));
}

py::object down_op(const Arr<uint16_t>& act, const Arr<uint16_t>& down, const Arr<int32_t>& ids,
                   const Arr<float>& weights, int repeat) {
    const char* op = "moe_experts_down";
    check_ndim(op, "act", act, 3);
    check_ndim(op, "down", down, 3);
    const int T = int(act.shape(0)), k = int(act.shape(1)), I = int(act.shape(2));
    const int E = int(down.shape(0)), H = int(down.shape(1));
    check_shape(op, "down", down, {E, H, I});
    check_shape(op, "ids", ids, {T, k});
    check_shape(op, "weights", weights, {T, k});
    check_ids_below(op, ids, E);
    DeviceBuffer d_act = upload(act), d_w = upload(down), d_ids = upload(ids), d_wt = upload(weights);
    DeviceBuffer d_out = poisoned(size_t(T) * H * 2);
    return single_or_tuple(run_op(
        op, repeat,
        [&] {
            moe_experts_down(d_act.as<bf16>(), d_w.as<bf16>(), d_ids.as<int32_t>(), d_wt.as<float>(),
                             d_out.as<bf16>(), T, k, H, I, 0);
        },
        [&](py::list& out) { out.append(download<uint16_t>(d_out, {T, H})); }));
}

// The routed experts' arguments of a whole-FFN call (h [T,H], gate_up [E,2I,H], down [E,H,I],
// ids and weights [T,k]), checked; returns T, H, E, I, k.
struct ExpertDims {
    int T, H, E, I, k;
};

ExpertDims check_expert_args(const char* op, const Arr<uint16_t>& h, const Arr<uint16_t>& gate_up,
                             const Arr<uint16_t>& down, const Arr<int32_t>& ids, const Arr<float>& weights) {
    check_ndim(op, "h", h, 2);
    check_ndim(op, "gate_up", gate_up, 3);
    check_ndim(op, "ids", ids, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1)), E = int(gate_up.shape(0));
    const int I = int(gate_up.shape(1)) / 2, k = int(ids.shape(1));
    check_shape(op, "gate_up", gate_up, {E, 2 * I, H});
    check_shape(op, "down", down, {E, H, I});
    check_shape(op, "ids", ids, {T, k});
    check_shape(op, "weights", weights, {T, k});
    check_ids_below(op, ids, E);
    return {T, H, E, I, k};
}

py::object prefill_op(const Arr<uint16_t>& h, const Arr<uint16_t>& gate_up, const Arr<uint16_t>& down,
                      const Arr<int32_t>& ids, const Arr<float>& weights, int repeat) {
    const char* op = "moe_experts_prefill";
    const ExpertDims dims = check_expert_args(op, h, gate_up, down, ids, weights);
    const int T = dims.T, H = dims.H, E = dims.E, I = dims.I, k = dims.k;
    DeviceBuffer d_h = upload(h), d_gu = upload(gate_up), d_dn = upload(down), d_ids = upload(ids);
    DeviceBuffer d_wt = upload(weights), d_out = poisoned(size_t(T) * H * 2);
    DeviceBuffer ws = poisoned(moe_prefill_workspace_bytes(T, k, H, I, E));
    return single_or_tuple(run_op(
        op, repeat,
        [&] {
            moe_experts_prefill(d_h.as<bf16>(), d_gu.as<bf16>(), d_dn.as<bf16>(), d_ids.as<int32_t>(),
                                d_wt.as<float>(), d_out.as<bf16>(), ws.get(), T, k, H, I, E, 0);
        },
        [&](py::list& out) { out.append(download<uint16_t>(d_out, {T, H})); }));
}

// The shared expert's buffers for the decode launches' (k+1)-th slot (MoeSharedSlot in ops.h).
struct SharedSlotBuffers {
    DeviceBuffer gate_up, down, w_gate, gate;
    MoeSharedSlot slot;
};

SharedSlotBuffers upload_shared_slot(const char* op, int T, int H, const Arr<uint16_t>& shared_gate_up,
                                     const Arr<uint16_t>& shared_down, const Arr<uint16_t>& w_gate) {
    check_ndim(op, "shared_down", shared_down, 2);
    const int Is = int(shared_down.shape(1));
    check_shape(op, "shared_gate_up", shared_gate_up, {2 * Is, H});
    check_shape(op, "shared_down", shared_down, {H, Is});
    require(w_gate.size() == H, op,
            "w_gate must hold H = " + std::to_string(H) + " values ([H] or [1, H]), got shape " +
                shape_str(shape_of(w_gate)));
    SharedSlotBuffers b{upload(shared_gate_up), upload(shared_down), upload(w_gate), poisoned(size_t(T) * 4), {}};
    b.slot.gate_up = b.gate_up.as<bf16>();
    b.slot.down = b.down.as<bf16>();
    b.slot.w_gate = b.w_gate.as<bf16>();
    b.slot.gate = b.gate.as<float>();
    b.slot.inter = Is;
    return b;
}

// Both decode launches with the shared expert as the (k+1)-th slot.
py::tuple experts_decode_shared_op(const Arr<uint16_t>& h, const Arr<uint16_t>& gate_up,
                                   const Arr<uint16_t>& down, const Arr<int32_t>& ids,
                                   const Arr<float>& weights, const Arr<uint16_t>& shared_gate_up,
                                   const Arr<uint16_t>& shared_down, const Arr<uint16_t>& w_gate,
                                   int repeat) {
    const char* op = "moe_experts_decode_shared";
    const ExpertDims dims = check_expert_args(op, h, gate_up, down, ids, weights);
    const int T = dims.T, H = dims.H, I = dims.I, k = dims.k;
    SharedSlotBuffers sh = upload_shared_slot(op, T, H, shared_gate_up, shared_down, w_gate);
    DeviceBuffer d_h = upload(h), d_gu = upload(gate_up), d_dn = upload(down), d_ids = upload(ids);
    DeviceBuffer d_wt = upload(weights);
    DeviceBuffer act = poisoned((size_t(T) * k * I + size_t(T) * sh.slot.inter) * 2), d_out = poisoned(size_t(T) * H * 2);
    return run_op(
        op, repeat,
        [&] {
            moe_experts_gate_up(d_h.as<bf16>(), d_gu.as<bf16>(), d_ids.as<int32_t>(), act.as<bf16>(), T, k, H,
                                I, 0, &sh.slot);
            moe_experts_down(act.as<bf16>(), d_dn.as<bf16>(), d_ids.as<int32_t>(), d_wt.as<float>(),
                             d_out.as<bf16>(), T, k, H, I, 0, &sh.slot);
        },
        [&](py::list& out) {
            out.append(download<uint16_t>(d_out, {T, H}));
            out.append(download<float>(sh.gate, {T}));
        });
}

// The decode step's MoE launches (gate_up selecting its experts from the router logits, down
// adding into the residual), with the shared slot. Returns (ids [T,k], weights [T,k],
// residual + MoE block [T,H]) (+ ms; with repeat the residual keeps accumulating).
py::tuple experts_decode_select_op(const Arr<uint16_t>& h, const Arr<float>& logits, const Arr<uint16_t>& gate_up,
                                   const Arr<uint16_t>& down, const Arr<uint16_t>& shared_gate_up,
                                   const Arr<uint16_t>& shared_down, const Arr<uint16_t>& w_gate,
                                   const Arr<float>& residual, int k, int repeat) {
    const char* op = "moe_experts_decode_select";
    check_ndim(op, "h", h, 2);
    check_ndim(op, "logits", logits, 2);
    check_ndim(op, "gate_up", gate_up, 3);
    const int T = int(h.shape(0)), H = int(h.shape(1)), E = int(gate_up.shape(0));
    const int I = int(gate_up.shape(1)) / 2;
    check_shape(op, "logits", logits, {T, E});
    check_shape(op, "gate_up", gate_up, {E, 2 * I, H});
    check_shape(op, "down", down, {E, H, I});
    check_shape(op, "residual", residual, {T, H});
    SharedSlotBuffers sh = upload_shared_slot(op, T, H, shared_gate_up, shared_down, w_gate);
    DeviceBuffer d_h = upload(h), d_lg = upload(logits), d_gu = upload(gate_up), d_dn = upload(down);
    DeviceBuffer d_res = upload(residual), d_ids = poisoned(size_t(T) * k * 4), d_wt = poisoned(size_t(T) * k * 4);
    DeviceBuffer act = poisoned((size_t(T) * k * I + size_t(T) * sh.slot.inter) * 2);
    return run_op(
        op, repeat,
        [&] {
            moe_experts_gate_up_select(d_h.as<bf16>(), d_lg.as<float>(), E, d_gu.as<bf16>(), d_ids.as<int32_t>(),
                                       d_wt.as<float>(), act.as<bf16>(), T, k, H, I, 0, &sh.slot);
            moe_experts_down_add(act.as<bf16>(), d_dn.as<bf16>(), d_ids.as<int32_t>(), d_wt.as<float>(),
                                 d_res.as<float>(), T, k, H, I, 0, &sh.slot);
        },
        [&](py::list& out) {
            out.append(download<int32_t>(d_ids, {T, k}));
            out.append(download<float>(d_wt, {T, k}));
            out.append(download<float>(d_res, {T, H}));
        });
}

py::object shared_combine_op(const Arr<uint16_t>& routed, const Arr<uint16_t>& shared,
                             const Arr<uint16_t>& h, const Arr<uint16_t>& w_gate, int repeat) {
    const char* op = "moe_shared_combine";
    check_ndim(op, "h", h, 2);
    const int T = int(h.shape(0)), H = int(h.shape(1));
    check_shape(op, "routed", routed, {T, H});
    check_shape(op, "shared", shared, {T, H});
    require(w_gate.size() == H, op,
            "w_gate must hold H = " + std::to_string(H) + " values ([H] or [1, H]), got shape " +
                shape_str(shape_of(w_gate)));
    DeviceBuffer d_r = upload(routed), d_s = upload(shared), d_h = upload(h), d_g = upload(w_gate);
    DeviceBuffer d_out = poisoned(size_t(T) * H * 2);
    return single_or_tuple(run_op(
        op, repeat,
        [&] {
            moe_shared_combine(d_r.as<bf16>(), d_s.as<bf16>(), d_h.as<bf16>(), d_g.as<bf16>(),
                               d_out.as<bf16>(), T, H, 0);
        },
        [&](py::list& out) { out.append(download<uint16_t>(d_out, {T, H})); }));
}

}  // namespace

void register_gdn_moe_ops(py::module_& ops) {
    using py::arg;
    const char* ring_doc = "; the states live in a ring of `slots` slots (0: the fewest allowed, T + 1 with rows, "
                           "else 1) read at slot pos % slots and written at the slots after it (ops.h, GdnStates)";
    const char* records_doc = "; records=True (with rows): the window leaves records and no recurrent state, and "
                              "the new state and the state rows are what gdn_replay rebuilds from them";
    ops.def("causal_conv1d_silu", &conv1d_op, arg("x"), arg("w"), arg("state"), arg("rows") = false,
            arg("slots") = 0, arg("pos") = 0, arg("repeat") = 0,
            (std::string("x [T,C], w [C,K], state [C,K-1] (bf16 bits) -> (y [T,C], new_state [C,K-1]"
                         "[, rows [T,C,K-1]: the state after each token, with rows=True])") + ring_doc).c_str());
    ops.def("gated_delta_rule_recurrent", &gdn_recurrent_op, arg("qkv"), arg("a"), arg("b"),
            arg("A_log"), arg("dt_bias"), arg("state"), arg("Hk"), arg("rows") = false, arg("slots") = 0,
            arg("pos") = 0, arg("records") = false, arg("repeat") = 0,
            (std::string("qkv [T, 2*Hk*128 + Hv*128], a, b [T,Hv] (bf16 bits), A_log, dt_bias [Hv], state "
                         "[Hv,128,128] f32 -> (o [T,Hv,128] bf16 bits, new_state, rows [T,Hv,128,128] or None)") +
             ring_doc + records_doc).c_str());
    ops.def("gated_delta_rule_chunked", &gdn_chunked_op, arg("qkv"), arg("a"), arg("b"), arg("A_log"),
            arg("dt_bias"), arg("state"), arg("Hk"), arg("slots") = 0, arg("pos") = 0, arg("repeat") = 0,
            (std::string("same inputs as gated_delta_rule_recurrent -> (o, new_state)") + ring_doc).c_str());
    ops.def("gdn_decode_fused", &gdn_decode_fused_op, arg("qkv"), arg("conv_w"), arg("conv_state"), arg("a"),
            arg("b"), arg("A_log"), arg("dt_bias"), arg("state"), arg("z"), arg("norm_w"), arg("Hk"),
            arg("rows") = false, arg("eps") = 1e-6f, arg("slots") = 0, arg("pos") = 0, arg("records") = false,
            arg("recurrent_slots") = 0, arg("keep") = 0, arg("repeat") = 0,
            (std::string("a GDN layer's few-token step: pre-conv qkv [T, 2*Hk*128 + Hv*128], conv_w [C,K], "
                         "conv_state [C,K-1], a, b [T,Hv], z [T,Hv*128], norm_w [128] (bf16 bits), A_log, dt_bias "
                         "[Hv], state [Hv,128,128] f32 -> (y [T,Hv*128] = gated_rmsnorm(rule(conv(qkv)), z), new "
                         "conv_state, new state[, conv rows [T,C,K-1], state rows [T,Hv,128,128] with rows=True]); "
                         "recurrent_slots: the recurrent state's own ring (0: slots); keep (records): only the "
                         "state after token keep - 1 rebuilt, returned as the new state (state rows None)") +
             ring_doc + records_doc).c_str());
    ops.def("gated_rmsnorm", &gated_rmsnorm_op, arg("o"), arg("z"), arg("w"), arg("eps") = 1e-6f,
            arg("repeat") = 0, "o [T,Hv,dv], z [T,Hv*dv], w [dv] (bf16 bits) -> y [T,Hv*dv]");
    ops.def("moe_router_topk", &router_op, arg("h"), arg("w_router"), arg("k"), arg("repeat") = 0,
            "h [T,H], w_router [E,H] (bf16 bits) -> (ids [T,k] int32, weights [T,k], logits [T,E])");
    ops.def("moe_experts_gate_up", &gate_up_op, arg("h"), arg("gate_up"), arg("ids"), arg("repeat") = 0,
            "h [T,H], gate_up [E,2I,H] (bf16 bits), ids [T,k] int32 -> act [T,k,I]");
    ops.def("moe_experts_down", &down_op, arg("act"), arg("down"), arg("ids"), arg("weights"),
            arg("repeat") = 0, "act [T,k,I], down [E,H,I] (bf16 bits), ids, weights [T,k] -> out [T,H]");
    ops.def("moe_experts_prefill", &prefill_op, arg("h"), arg("gate_up"), arg("down"), arg("ids"),
            arg("weights"), arg("repeat") = 0,
            "h [T,H], gate_up [E,2I,H], down [E,H,I] (bf16 bits), ids, weights [T,k] -> out [T,H]");
    ops.def("moe_experts_decode_shared", &experts_decode_shared_op, arg("h"), arg("gate_up"), arg("down"),
            arg("ids"), arg("weights"), arg("shared_gate_up"), arg("shared_down"), arg("w_gate"),
            arg("repeat") = 0,
            "h [T,H], gate_up [E,2I,H], down [E,H,I], shared_gate_up [2Is,H], shared_down [H,Is], w_gate [H] "
            "(bf16 bits), ids, weights [T,k] -> (out [T,H] = routed + sigmoid(h.w_gate) * shared, gate [T])");
    ops.def("moe_experts_decode_select", &experts_decode_select_op, arg("h"), arg("logits"), arg("gate_up"),
            arg("down"), arg("shared_gate_up"), arg("shared_down"), arg("w_gate"), arg("residual"), arg("k"),
            arg("repeat") = 0,
            "the decode step's MoE launches: experts selected from logits [T,E] f32, the block added into "
            "residual [T,H] f32 -> (ids [T,k], weights [T,k], residual + block)");
    ops.def("moe_shared_combine", &shared_combine_op, arg("routed"), arg("shared"), arg("h"),
            arg("w_gate"), arg("repeat") = 0,
            "routed, shared, h [T,H], w_gate [H] (bf16 bits) -> routed + sigmoid(h.w_gate) * shared");
}

}  // namespace lampo
