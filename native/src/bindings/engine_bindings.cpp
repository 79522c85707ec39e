// engine_bindings.cpp - lampo._native.Engine and the device helpers (mem_info, copy bandwidth).
// The Engine is built from the parsed model config itself (a lampo.models.config.ModelConfig, read
// by attribute into ModelDims) and the checkpoint names of its weights by role (TensorNames).
// Long calls release the GIL; numpy inputs are read while the GIL is still held.
#include <limits>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/cuda_error.h"
#include "engine/engine.h"
#include "kernels/matmul.cuh"
#include "weights/fp8_dequantize.h"
#include "weights/lq_quantize.h"
#include "weights/nonfinite_scan.h"

namespace py = pybind11;

namespace lampo {
namespace {

// ---- the model config: a lampo.models.config.ModelConfig, read by attribute --------------------
// Every value is checked for its Python type (no coercion: a bool is not an int); a missing or
// ill-typed attribute raises TypeError naming it, an int outside 32 bits ValueError.
class ConfigReader {
public:
    explicit ConfigReader(const py::object& cfg) : cfg_(cfg) {}

    int integer(const char* name) const {
        const py::object v = get(name);
        if (!is_int(v)) wrong(name, v, "an int");
        const long long x = PyLong_AsLongLong(v.ptr());
        if (PyErr_Occurred() || x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
            PyErr_Clear();
            throw py::value_error("model config: " + std::string(name) + " is " + repr(v) +
                                  ", outside the engine's 32-bit ints");
        }
        return int(x);
    }

    float number(const char* name) const {
        const py::object v = get(name);
        if (!is_int(v) && !py::isinstance<py::float_>(v)) wrong(name, v, "a float");
        return float(v.cast<double>());
    }

    bool boolean(const char* name) const {
        const py::object v = get(name);
        if (!py::isinstance<py::bool_>(v)) wrong(name, v, "a bool");
        return v.cast<bool>();
    }

    std::vector<std::string> strings(const char* name) const {
        const py::object v = get(name);
        if (!py::isinstance<py::tuple>(v) && !py::isinstance<py::list>(v)) wrong(name, v, "a tuple of str");
        std::vector<std::string> out;
        for (const py::handle item : v) {
            if (!py::isinstance<py::str>(item)) {
                wrong((std::string(name) + "[" + std::to_string(out.size()) + "]").c_str(),
                      py::reinterpret_borrow<py::object>(item), "a str");
            }
            out.push_back(item.cast<std::string>());
        }
        return out;
    }

private:
    py::object cfg_;

    py::object get(const char* name) const {
        if (!py::hasattr(cfg_, name)) {
            throw py::type_error("model config: the " + std::string(Py_TYPE(cfg_.ptr())->tp_name) +
                                 " has no attribute '" + name +
                                 "' (the Engine takes a lampo.models.config.ModelConfig)");
        }
        return cfg_.attr(name);
    }
    static bool is_int(const py::object& v) { return py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v); }
    static std::string repr(const py::object& v) { return py::repr(v).cast<std::string>(); }
    [[noreturn]] static void wrong(const char* name, const py::object& v, const char* expected) {
        throw py::type_error("model config: " + std::string(name) + " is " + repr(v) + " (" +
                             Py_TYPE(v.ptr())->tp_name + "), expected " + expected);
    }
};

// ModelDims from the config's fields and derived properties (their Python names).
ModelDims dims_from_config(const py::object& cfg) {
    const ConfigReader c(cfg);
    ModelDims d;
    d.hidden = c.integer("hidden_size");
    const std::vector<std::string> types = c.strings("layer_types");
    for (size_t l = 0; l < types.size(); ++l) {
        if (types[l] == "linear_attention") {
            d.mixers.push_back(MixerKind::GatedDeltaNet);
        } else if (types[l] == "full_attention") {
            d.mixers.push_back(MixerKind::GatedAttention);
        } else {
            throw py::value_error("model config: layer_types[" + std::to_string(l) + "] is '" + types[l] +
                                  "', expected 'linear_attention' or 'full_attention'");
        }
    }
    d.n_q_heads = c.integer("num_attention_heads");
    d.n_kv_heads = c.integer("num_key_value_heads");
    d.head_dim = c.integer("head_dim");
    d.rotary_dim = c.integer("rotary_dim");
    d.rope_theta = c.number("rope_theta");
    d.gdn_k_heads = c.integer("linear_num_key_heads");
    d.gdn_v_heads = c.integer("linear_num_value_heads");
    d.gdn_k_dim = c.integer("linear_key_head_dim");
    d.gdn_v_dim = c.integer("linear_value_head_dim");
    d.conv_kernel = c.integer("linear_conv_kernel_dim");
    d.moe = c.boolean("is_moe");
    if (d.moe) {
        d.n_experts = c.integer("num_experts");
        d.top_k = c.integer("num_experts_per_tok");
        d.expert_inter = c.integer("moe_intermediate_size");
        d.shared_inter = c.integer("shared_expert_intermediate_size");
    } else {
        d.ffn_inter = c.integer("intermediate_size");
    }
    d.vocab = c.integer("vocab_size");
    d.vocab_real = c.integer("real_vocab_size");
    d.eps = c.number("rms_norm_eps");
    return d;
}

void load_tensor(Engine& e, const std::string& name, const py::array& a, int bits) {
    DType dtype = DType::BF16;
    if (bits) {
        if (!a.dtype().is(py::dtype::of<uint8_t>())) {
            throw std::invalid_argument("load_tensor: '" + name + "' at " + std::to_string(bits) +
                                        " bits must be the packed uint8 bytes, got numpy dtype " +
                                        py::str(a.dtype()).cast<std::string>());
        }
    } else if (a.dtype().is(py::dtype::of<uint16_t>())) {
        dtype = DType::BF16;  // bf16 travels as its uint16 bit pattern
    } else if (a.dtype().is(py::dtype::of<float>())) {
        dtype = DType::F32;
    } else {
        throw std::invalid_argument("load_tensor: '" + name + "' has numpy dtype " +
                                    py::str(a.dtype()).cast<std::string>() +
                                    "; expected uint16 (bf16 bits) or float32");
    }
    if (!(a.flags() & py::array::c_style)) {
        throw std::invalid_argument("load_tensor: '" + name + "' is not C-contiguous");
    }
    std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
    const void* data = a.data();
    py::gil_scoped_release release;  // `a` stays alive: the caller holds a reference
    e.weights().load(name, data, dtype, shape, bits);
}

// parts: [(codes uint8 [rows, cols], scales float32 [ceil(rows / block_rows), ceil(cols / block_cols)])],
// C-contiguous, the tensor's rows in order.
// An FP8 matrix's block scales must be [ceil(rows / block_rows), ceil(cols / block_cols)] for its
// codes [rows, cols], with positive blocks; `who` starts the message otherwise.
void check_fp8_scales(const std::string& who, const py::array& codes, const py::array& scales, int block_rows,
                      int block_cols) {
    const int64_t rows = codes.shape(0), cols = codes.shape(1);
    if (block_rows <= 0 || block_cols <= 0 || scales.shape(0) != (rows + block_rows - 1) / block_rows ||
        scales.shape(1) != (cols + block_cols - 1) / block_cols) {
        throw std::invalid_argument(who + ": scales of shape [" + std::to_string(scales.shape(0)) + ", " +
                                    std::to_string(scales.shape(1)) + "] for codes [" + std::to_string(rows) +
                                    ", " + std::to_string(cols) + "] in blocks of " + std::to_string(block_rows) +
                                    " x " + std::to_string(block_cols));
    }
}

void load_tensor_fp8(Engine& e, const std::string& name, const py::list& parts, int block_rows, int block_cols) {
    std::vector<py::array> held;  // the arrays stay referenced while the GIL is released
    std::vector<Fp8Part> views;
    int cols = -1;
    for (const py::handle item : parts) {
        const auto pair = item.cast<py::tuple>();
        if (pair.size() != 2) throw std::invalid_argument("load_tensor_fp8: '" + name + "': each part is (codes, scales)");
        const auto codes = pair[0].cast<py::array>(), scales = pair[1].cast<py::array>();
        const bool contiguous = (codes.flags() & py::array::c_style) && (scales.flags() & py::array::c_style);
        if (!codes.dtype().is(py::dtype::of<uint8_t>()) || codes.ndim() != 2 ||
            !scales.dtype().is(py::dtype::of<float>()) || scales.ndim() != 2 || !contiguous) {
            throw std::invalid_argument("load_tensor_fp8: '" + name + "': a part must be C-contiguous uint8 codes "
                                        "[rows, cols] with float32 scales [row blocks, column blocks]");
        }
        const int64_t rows = codes.shape(0), c = codes.shape(1);
        check_fp8_scales("load_tensor_fp8: '" + name + "'", codes, scales, block_rows, block_cols);
        if (cols >= 0 && c != cols) throw std::invalid_argument("load_tensor_fp8: '" + name + "': parts of different widths");
        cols = int(c);
        views.push_back({static_cast<const uint8_t*>(codes.data()), static_cast<const float*>(scales.data()), rows});
        held.push_back(codes);
        held.push_back(scales);
    }
    if (views.empty()) throw std::invalid_argument("load_tensor_fp8: '" + name + "': no parts");
    py::gil_scoped_release release;
    e.weights().load_fp8(name, views, cols, block_rows, block_cols);
}

int prefill(Engine& e, const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
            bool sample) {
    if (ids.ndim() != 1) throw std::invalid_argument("prefill: ids must be a 1-D array");
    std::vector<int32_t> v(ids.data(), ids.data() + ids.size());
    py::gil_scoped_release release;
    return e.prefill(v.data(), int(v.size()), sample);
}

py::array_t<int32_t> verify(Engine& e, const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
                            bool mtp_drafts) {
    if (ids.ndim() != 1) throw std::invalid_argument("verify: ids must be a 1-D array");
    std::vector<int32_t> v(ids.data(), ids.data() + ids.size()), tokens;
    {
        py::gil_scoped_release release;
        tokens = e.verify(v.data(), int(v.size()), mtp_drafts);
    }
    py::array_t<int32_t> out(tokens.size());
    std::copy(tokens.begin(), tokens.end(), out.mutable_data());
    return out;
}

py::dict profile_verify(Engine& e, const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& ids,
                        int steps) {
    if (ids.ndim() != 1) throw std::invalid_argument("profile_verify: ids must be a 1-D array");
    std::vector<int32_t> v(ids.data(), ids.data() + ids.size());
    std::vector<std::pair<std::string, double>> r;
    {
        py::gil_scoped_release release;
        r = e.profile_verify(v.data(), int(v.size()), steps);
    }
    py::dict d;
    for (const auto& [k, ms] : r) d[py::str(k)] = ms;
    return d;
}

py::array_t<int32_t> mtp_draft(Engine& e, int token, int k) {
    std::vector<int32_t> drafts;
    {
        py::gil_scoped_release release;
        drafts = e.mtp_draft(token, k);
    }
    py::array_t<int32_t> out(drafts.size());
    std::copy(drafts.begin(), drafts.end(), out.mutable_data());
    return out;
}

py::array_t<float> verify_logits(Engine& e) {
    std::vector<float> v;
    {
        py::gil_scoped_release release;
        v = e.verify_logits();
    }
    const py::ssize_t V = e.dims().vocab;
    py::array_t<float> out({py::ssize_t(v.size()) / V, V});
    std::copy(v.begin(), v.end(), out.mutable_data());
    return out;
}

// lampo convert's GPU quantizer: blocks of whole rows of a bf16 matrix, or of a block-scaled FP8
// one, in; their packed LQ tiles out (lq_quantize: bit for bit the numpy quantizer and packer; an
// FP8 block is first decoded by fp8_dequantize, bit for bit models/fp8.py's bf16 values), through
// device buffers kept between blocks and grown as needed.
class LqBlockQuantizer {
public:
    LqBlockQuantizer() { LAMPO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
    ~LqBlockQuantizer() { cudaStreamDestroy(stream_); }
    LqBlockQuantizer(const LqBlockQuantizer&) = delete;
    LqBlockQuantizer& operator=(const LqBlockQuantizer&) = delete;

    py::bytes quantize(const py::array_t<uint16_t, py::array::c_style | py::array::forcecast>& w, int bits) {
        if (w.ndim() != 2) throw std::invalid_argument("LqBlockQuantizer.quantize: w must be [rows, cols] bf16 bits");
        const int rows = int(w.shape(0)), cols = int(w.shape(1));
        check_block("LqBlockQuantizer.quantize", rows, cols, bits);
        const size_t w_bytes = size_t(rows) * size_t(cols) * 2;
        return packed(rows, cols, bits, [&] {
            LAMPO_CUDA_CHECK(cudaMemcpyAsync(bf16_.get(), w.data(), w_bytes, cudaMemcpyHostToDevice, stream_));
        });
    }

    py::bytes quantize_fp8(const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& codes,
                           const py::array_t<float, py::array::c_style | py::array::forcecast>& scales,
                           int block_rows, int block_cols, int bits) {
        const char* who = "LqBlockQuantizer.quantize_fp8";
        if (codes.ndim() != 2 || scales.ndim() != 2)
            throw std::invalid_argument(std::string(who) + ": codes [rows, cols] uint8 and scales [row blocks, "
                                        "column blocks] float32 expected");
        check_fp8_scales(who, codes, scales, block_rows, block_cols);
        const int rows = int(codes.shape(0)), cols = int(codes.shape(1));
        check_block(who, rows, cols, bits);
        const size_t code_bytes = size_t(codes.size()), scale_bytes = size_t(scales.size()) * sizeof(float);
        if (codes_.bytes() < code_bytes) codes_ = DeviceMemory(code_bytes, "lampo convert: a block of FP8 codes");
        if (scales_.bytes() < scale_bytes) scales_ = DeviceMemory(scale_bytes, "lampo convert: a block's FP8 scales");
        return packed(rows, cols, bits, [&] {
            LAMPO_CUDA_CHECK(cudaMemcpyAsync(codes_.get(), codes.data(), code_bytes, cudaMemcpyHostToDevice, stream_));
            LAMPO_CUDA_CHECK(cudaMemcpyAsync(scales_.get(), scales.data(), scale_bytes, cudaMemcpyHostToDevice, stream_));
            fp8_dequantize(codes_.as<uint8_t>(), scales_.as<float>(), rows, cols, block_rows, block_cols,
                           bf16_.as<bf16>(), stream_);
        });
    }

private:
    static void check_block(const char* who, int rows, int cols, int bits) {
        if (bits < 4 || bits > 6 || rows <= 0 || rows % 16 != 0 || cols <= 0 || cols % 64 != 0) {
            throw std::invalid_argument(std::string(who) + ": needs bits 4..6 and a [16n, 64k] block, got bits " +
                                        std::to_string(bits) + ", [" + std::to_string(rows) + ", " +
                                        std::to_string(cols) + "]");
        }
    }

    // The packed tiles of the [rows, cols] block that `fill_bf16` (enqueued on stream_) leaves in bf16_.
    template <class FillBf16>
    py::bytes packed(int rows, int cols, int bits, const FillBf16& fill_bf16) {
        const size_t w_bytes = size_t(rows) * size_t(cols) * 2, out_bytes = lq_packed_bytes(rows, cols, bits);
        if (bf16_.bytes() < w_bytes) bf16_ = DeviceMemory(w_bytes, "lampo convert: a block of bf16 rows");
        if (out_.bytes() < out_bytes) out_ = DeviceMemory(out_bytes, "lampo convert: a block's packed tiles");
        std::string result(out_bytes, '\0');
        {
            py::gil_scoped_release release;
            fill_bf16();
            lq_quantize(bf16_.as<bf16>(), rows, cols, bits, out_.as<uint8_t>(), stream_);
            LAMPO_CUDA_CHECK(cudaMemcpyAsync(result.data(), out_.get(), out_bytes, cudaMemcpyDeviceToHost, stream_));
            LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
        return py::bytes(result);
    }

    cudaStream_t stream_ = nullptr;
    DeviceMemory bf16_, out_, codes_, scales_;
};

}  // namespace

void register_engine(py::module_& m) {
    py::class_<LqBlockQuantizer>(m, "LqBlockQuantizer",
                                 "lampo convert's GPU quantizer: bf16 or FP8 row blocks in, packed LQ tiles out")
        .def(py::init<>())
        .def("quantize", &LqBlockQuantizer::quantize, py::arg("w"), py::arg("bits"),
             "The packed LQ tiles (bytes) of w [rows, cols] bf16 bits at `bits`: layout.pack(*quantize(w, bits))")
        .def("quantize_fp8", &LqBlockQuantizer::quantize_fp8, py::arg("codes"), py::arg("scales"),
             py::arg("block_rows"), py::arg("block_cols"), py::arg("bits"),
             "The packed LQ tiles (bytes) of the FP8 rows codes [rows, cols] uint8 with their block scales "
             "(float32) at `bits`: quantize(fp8.dequantize_bf16(codes, scales, block), bits)");

    using release = py::call_guard<py::gil_scoped_release>;
    py::class_<Engine>(m, "Engine", "One model in VRAM and one conversation's state (engine.h)")
        .def(py::init([](const py::object& config, const TensorNames& tensor_names, const TensorBits& tensor_bits,
                         int context_max, int prefill_chunk, int snapshot_slots, size_t vram_limit,
                         int verify_rows, bool speculative_graphs) {
                 return std::make_unique<Engine>(
                     dims_from_config(config), tensor_names, tensor_bits,
                     EngineOptions{context_max, prefill_chunk, snapshot_slots, vram_limit, verify_rows,
                                   speculative_graphs});
             }),
             py::arg("config"), py::arg("tensor_names"), py::arg("tensor_bits") = TensorBits{}, py::kw_only(),
             py::arg("context_max"), py::arg("prefill_chunk") = 2048, py::arg("snapshot_slots") = 4,
             py::arg("vram_limit") = size_t(0), py::arg("verify_rows") = 0, py::arg("speculative_graphs") = true,
             "Allocate the engine for a lampo.models.config.ModelConfig: tensor_names maps each weight "
             "role to its checkpoint name (lampo.models.tensor_specs.engine_tensor_names), tensor_bits "
             "each matrix held in the LQ format to its width (lampo.models.quant.engine_formats; the "
             "others bf16), context_max is the tokens of KV cache, vram_limit caps the bytes of the "
             "engine's device blocks (0: none), verify_rows the most tokens of a speculative verify "
             "window (0: none), speculative_graphs whether verify windows and MTP draft chains run as captured "
             "CUDA graphs")
        .def("weight_specs",
             [](Engine& e) {
                 py::list out;
                 for (const TensorSlot& s : e.weights().slots()) {
                     const std::string format = s.bits ? "LQ" + std::to_string(s.bits) : dtype_name(s.dtype);
                     out.append(py::make_tuple(s.name, py::tuple(py::cast(s.shape)), format));
                 }
                 return out;
             },
             "[(checkpoint name, logical shape, 'BF16'|'F32'|'LQ4'|'LQ5'|'LQ6')] of every tensor the engine loads")
        .def("load_tensor", &load_tensor, py::arg("name"), py::arg("array"), py::arg("bits") = 0,
             "Copy one tensor (numpy uint16 bf16 bits or float32, C order; with bits 4..6 the uint8 "
             "packed LQ bytes of a converted checkpoint) into VRAM, converting it to the engine's format")
        .def("load_tensor_fp8", &load_tensor_fp8, py::arg("name"), py::arg("parts"), py::arg("block_rows"),
             py::arg("block_cols"),
             "Copy one tensor stored as block-scaled FP8 matrices (a list of (uint8 codes, float32 scales), "
             "its rows in order) into VRAM: dequantized on the GPU, then held as bf16 or quantized on load")
        .def("finish_loading", [](Engine& e) { e.weights().finish_loading(); }, release(),
             "Wait for every copy and check that all tensors arrived")
        .def("nonfinite_census",
             [](Engine& e) {
                 std::vector<NonFiniteCount> counts;
                 {
                     py::gil_scoped_release r;
                     counts = count_nonfinite(e.weights().slots());
                 }
                 py::list bad;
                 for (size_t i = 0; i < counts.size(); ++i) {
                     if (counts[i].count) {
                         bad.append(py::make_tuple(e.weights().slots()[i].name, counts[i].count, counts[i].first));
                     }
                 }
                 return bad;
             },
             "Count the NaN/Inf values of every tensor in VRAM (after finish_loading or random_weights): "
             "[(name, count, flat index of the first)] of those holding any (empty: none)")
        .def("random_weights", &Engine::random_weights, py::arg("seed") = 0, release(),
             "Bench mode: deterministic random weights in VRAM")
        .def_property_readonly("weight_bytes", [](Engine& e) { return e.weights().bytes(); })
        .def_property_readonly("loaded_bytes", [](Engine& e) { return e.weights().loaded_bytes(); })
        .def_property_readonly("state_bytes", &Engine::state_bytes)
        .def_property_readonly("workspace_bytes", &Engine::workspace_bytes)
        .def_property_readonly("position", &Engine::position)
        .def_property_readonly("context_max", [](Engine& e) { return e.options().context_max; })
        .def_property_readonly("prefill_chunk", [](Engine& e) { return e.options().prefill_chunk; })
        .def_property_readonly("snapshot_slots", [](Engine& e) { return e.options().snapshot_slots; })
        .def_property_readonly("vocab", [](Engine& e) { return e.dims().vocab; })
        .def_property_readonly("real_vocab_size", [](Engine& e) { return e.dims().vocab_real; })
        .def("reset", &Engine::reset, release())
        .def("snapshot", &Engine::snapshot, py::arg("slot"), release())
        .def("restore", &Engine::restore, py::arg("slot"), release())
        .def("snapshot_position", &Engine::snapshot_position, py::arg("slot"))
        .def("set_sampling",
             [](Engine& e, float temperature, int top_k, float top_p, float min_p,
                float presence_penalty, uint64_t seed) {
                 e.set_sampling(SamplingConfig{temperature, top_k, top_p, min_p, presence_penalty, seed});
             },
             py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("min_p"),
             py::arg("presence_penalty"), py::arg("seed"))
        .def("begin_generation", &Engine::begin_generation, release())
        .def("prefill", &prefill, py::arg("ids"), py::arg("sample"),
             "Run one chunk at the current position; returns the sampled next id, or -1")
        .def("decode", &Engine::decode, py::arg("token") = -1, release(),
             "One graph-replayed decode step; returns the sampled next id")
        .def("decode_submit", &Engine::decode_submit, py::arg("token") = -1, release(),
             "Queue one decode step (at most 2 queued); its sample is returned by decode_collect")
        .def("decode_collect", &Engine::decode_collect, release(),
             "Wait for the oldest queued decode step; returns its sampled id")
        .def_property_readonly("decode_queued", &Engine::decode_queued)
        .def("verify", &verify, py::arg("ids"), py::arg("mtp_drafts") = false,
             "Run a verify window (the last sampled token, then the drafts) at the current position; "
             "returns each row's token, drawn with the sampling settings (mtp_drafts: the drafts are the "
             "last mtp_draft's, judged by their own distribution when sampled; engine.h)")
        .def("accept", &Engine::accept, py::arg("keep"), release(),
             "Keep the first `keep` rows of the last verify window (states and position)")
        .def("settle", &Engine::settle, release(),
             "End the held verify window now (its kept rows' GDN states rebuilt, as the next forward "
             "does first) and wait for it")
        .def("verify_logits", &verify_logits, "fp32 logits [n, V] of the last verify window's rows")
        .def("profile_verify", &profile_verify, py::arg("ids"), py::arg("steps"),
             "Un-graphed verify windows of `ids`, each accepted at its first row, timed per op family: "
             "{family: mean ms per window}")
        .def_property_readonly("has_mtp", &Engine::has_mtp,
                               "Whether the MTP module is loaded (its roles were in tensor_names)")
        .def("mtp_draft", &mtp_draft, py::arg("token"), py::arg("k"),
             "Feed the sampled `token` to the MTP layer with the last trunk row and chain it: k drafts, "
             "greedy or drawn from the MTP layer's distribution with the sampling settings")
        .def_property("draft_vocab", &Engine::draft_vocab, &Engine::set_draft_vocab,
                      "MTP drafts are chosen among ids [0, draft_vocab) (the LM head's first rows; a multiple "
                      "of 16), or every id when 0")
        .def("logits",
             [](Engine& e) {
                 std::vector<float> v;
                 {
                     py::gil_scoped_release r;
                     v = e.logits();
                 }
                 py::array_t<float> out(v.size());
                 std::copy(v.begin(), v.end(), out.mutable_data());
                 return out;
             })
        .def("set_record_routing", &Engine::set_record_routing, py::arg("on"),
             "MoE models: keep each prefill's expert ids per layer and token (routing())")
        .def("routing",
             [](Engine& e) {
                 const std::vector<int32_t> r = e.routing();
                 const py::ssize_t L = e.dims().n_layers(), k = e.dims().top_k;
                 py::array_t<int32_t> out({L, py::ssize_t(r.size()) / std::max<py::ssize_t>(L * k, 1), k});
                 std::copy(r.begin(), r.end(), out.mutable_data());
                 return out;
             },
             "Expert ids [layers, T, k] of the last prefill (record_routing on; T = 0 before)")
        .def("decode_graph_info",
             [](Engine& e) {
                 DecodeGraphInfo g;
                 {
                     py::gil_scoped_release r;
                     g = e.decode_graph_info();
                 }
                 py::dict d;
                 d["nodes"] = g.nodes;
                 d["kernels"] = g.kernels;
                 return d;
             })
        .def("profile_decode",
             [](Engine& e, int steps, int token) {
                 std::vector<std::pair<std::string, double>> r;
                 {
                     py::gil_scoped_release rel;
                     r = e.profile_decode(steps, token);
                 }
                 py::dict d;
                 for (const auto& [k, v] : r) d[py::str(k)] = v;
                 return d;
             },
             py::arg("steps"), py::arg("token") = -1,
             "Un-graphed decode steps timed per op family: {family: mean ms per step}")
        .def("fill_state_random", &Engine::fill_state_random, py::arg("depth"), py::arg("seed") = 0,
             release())
        .def("healthy", &Engine::healthy, release())
        .def("synchronize", &Engine::synchronize, release());

    m.def("mem_info", &mem_info, "(free, total) device memory in bytes");
    m.def("engine_allocated", &DeviceMemory::allocated, "Bytes held in the engines' device blocks now");
    m.def("device_info", [] {
        const DeviceInfo i = device_info();
        py::dict d;
        d["name"] = i.name;
        d["sm_count"] = i.sm_count;
        d["compute_capability"] = std::to_string(i.cc_major) + "." + std::to_string(i.cc_minor);
        d["memory"] = i.memory;
        d["device_code"] = std::to_string(i.code_arch / 10) + "." + std::to_string(i.code_arch % 10);
        return d;
    }, "Name, SM count, compute capability and memory of the current device, and the architecture "
       "its device code was built for (older than the device's when the driver compiled the PTX of "
       "an older build)");
    m.def("measure_copy_bandwidth", &measure_copy_bandwidth, py::arg("bytes") = size_t(1) << 30,
          py::arg("iters") = 10, py::call_guard<py::gil_scoped_release>(),
          "Device-to-device copy bandwidth in bytes/s (read + written)");
    m.def("reset_device", &reset_device, "Destroy the CUDA context (after a sticky error)");
}

}  // namespace lampo
