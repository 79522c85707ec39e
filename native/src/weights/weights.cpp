// weights.cpp - the device weight store: plan (tensors by role, their names from the caller),
// allocation, staged loading, random fill.
#include "weights/weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "kernels/common.cuh"
#include "kernels/matmul.cuh"
#include "weights/fp8_dequantize.h"
#include "weights/lq_quantize.h"

namespace lampo {

// ---- DeviceMemory --------------------------------------------------------------------------
namespace {
std::atomic<size_t> g_allocated{0};
std::atomic<size_t> g_limit{0};
}  // namespace

void DeviceMemory::set_limit(size_t bytes) { g_limit = bytes; }
size_t DeviceMemory::allocated() { return g_allocated; }

DeviceMemory::DeviceMemory(size_t bytes, const std::string& what) : bytes_(bytes) {
    if (!bytes_) return;
    const size_t limit = g_limit;
    if (limit && g_allocated + bytes_ > limit) {
        throw CudaError("cudaMalloc " + what + " (" + format_bytes(bytes_) + "): the VRAM limit of " +
                        format_bytes(limit) + " would be passed (" + format_bytes(g_allocated) + " allocated)");
    }
    const cudaError_t err = cudaMalloc(&ptr_, bytes_);
    if (err != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky; clear it
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        ptr_ = nullptr;
        throw CudaError("cudaMalloc " + what + " (" + format_bytes(bytes_) + "): " +
                        cudaGetErrorString(err) + "; " + format_bytes(free_b) + " free of " +
                        format_bytes(total_b));
    }
    g_allocated += bytes_;
}

DeviceMemory::~DeviceMemory() {
    if (ptr_) {
        cudaFree(ptr_);
        g_allocated -= bytes_;
    }
}

DeviceMemory::DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
    if (this != &o) {
        if (ptr_) {
            cudaFree(ptr_);
            g_allocated -= bytes_;
        }
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        o.ptr_ = nullptr;
        o.bytes_ = 0;
    }
    return *this;
}

std::string format_bytes(size_t bytes) {
    char buf[32];
    const double b = double(bytes);
    if (b >= double(1ull << 30)) {
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
    } else {
        std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
    }
    return buf;
}

const char* dtype_name(DType t) { return t == DType::BF16 ? "BF16" : "F32"; }

size_t TensorSlot::numel() const {
    size_t n = 1;
    for (int64_t s : shape) n *= size_t(s);
    return n;
}

int64_t TensorSlot::rows() const { return shape.empty() ? 0 : int64_t(numel() / size_t(shape.back())); }

size_t TensorSlot::bytes() const {
    if (bits) return lq_packed_bytes(int(rows()), int(shape.back()), bits);
    return numel() * (dtype == DType::BF16 ? 2 : 4);
}

// ---- StagingRing ---------------------------------------------------------------------------
StagingRing::StagingRing() {
    LAMPO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
        if (cudaHostAlloc(&pinned_[i], kPieceBytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            throw CudaError("cudaHostAlloc weight staging buffer (" + format_bytes(kPieceBytes) +
                            ") failed");
        }
        LAMPO_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
}

StagingRing::~StagingRing() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
        if (pinned_[i]) cudaFreeHost(pinned_[i]);
        if (done_[i]) cudaEventDestroy(done_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
}

template <class Fill>
void StagingRing::copy(void* dst, size_t bytes, Fill&& fill) {
    for (size_t off = 0; off < bytes; off += kPieceBytes) {
        const size_t n = std::min(kPieceBytes, bytes - off);
        const int i = next_;
        next_ ^= 1;
        if (busy_[i]) LAMPO_CUDA_CHECK(cudaEventSynchronize(done_[i]));
        fill(pinned_[i], off, n);  // the disk read of a memory-mapped source happens here
        LAMPO_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, pinned_[i], n,
                                         cudaMemcpyHostToDevice, stream_));
        LAMPO_CUDA_CHECK(cudaEventRecord(done_[i], stream_));
        busy_[i] = true;
    }
}

template <class Fill, class Convert>
void StagingRing::convert(size_t bytes, size_t piece, Fill&& fill, Convert&& convert) {
    if (!scratch_[0].get()) {
        for (DeviceMemory& m : scratch_) m = DeviceMemory(kPieceBytes, "weight conversion scratch");
    }
    for (size_t off = 0; off < bytes; off += piece) {
        const size_t n = std::min(piece, bytes - off);
        const int i = next_;
        next_ ^= 1;
        if (busy_[i]) LAMPO_CUDA_CHECK(cudaEventSynchronize(done_[i]));
        fill(pinned_[i], off, n);
        LAMPO_CUDA_CHECK(cudaMemcpyAsync(scratch_[i].get(), pinned_[i], n, cudaMemcpyHostToDevice, stream_));
        LAMPO_CUDA_CHECK(cudaEventRecord(done_[i], stream_));
        busy_[i] = true;
        convert(scratch_[i].get(), off, n, stream_);
    }
}

void StagingRing::wait() { LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- bf16 conversion on the host (load-time dtype mismatches only) -----------------------------
namespace {

float bf16_bits_to_f32(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16_bits(float f) {  // round to nearest even, NaN kept quiet
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
    o << "]";
    return o.str();
}

}  // namespace

// ---- tensor names by role -------------------------------------------------------------------
namespace {

// The roles the plan below reads, by part of the model; a part's roles are needed when the model
// has that part (lampo.models.tensor_specs has the same roles, each with its checkpoint name).
const std::vector<std::string> kModelRoles = {"embed", "final_norm", "lm_head"};
const std::vector<std::string> kLayerRoles = {"input_norm", "post_norm"};
const std::vector<std::string> kAttentionRoles = {"attn.q", "attn.k", "attn.v",
                                                  "attn.q_norm", "attn.k_norm", "attn.o"};
const std::vector<std::string> kGdnRoles = {"gdn.qkv", "gdn.z", "gdn.b", "gdn.a", "gdn.conv",
                                            "gdn.A_log", "gdn.dt_bias", "gdn.norm", "gdn.out"};
const std::vector<std::string> kDenseRoles = {"dense.gate", "dense.up", "dense.down"};
const std::vector<std::string> kMoeRoles = {"moe.router", "moe.experts_gate_up", "moe.experts_down",
                                            "moe.shared_expert.gate", "moe.shared_expert.up",
                                            "moe.shared_expert.down", "moe.shared_gate"};
const std::vector<std::string> kMtpRoles = {"mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.fc",
                                            "mtp.norm"};
const std::string kLayer = "{layer}";
const std::string kMtpLayer = "mtp.layer.";  // + a layer role: the name in the MTP module's layer

// Throws std::invalid_argument naming every role of `d` that `names` lacks, or a per-layer name
// without {layer} (every layer would then claim the same tensor).
void check_names(const ModelDims& d, const TensorNames& names) {
    std::vector<std::string> missing, unplaced;
    auto need = [&](const std::vector<std::string>& roles, bool per_layer) {
        for (const std::string& r : roles) {
            const auto it = names.find(r);
            if (it == names.end()) {
                missing.push_back(r);
            } else if (per_layer && it->second.find(kLayer) == std::string::npos) {
                unplaced.push_back(r + " ('" + it->second + "')");
            }
        }
    };
    need(kModelRoles, false);
    need(kLayerRoles, true);
    if (d.count(MixerKind::GatedAttention)) need(kAttentionRoles, true);
    if (d.count(MixerKind::GatedDeltaNet)) need(kGdnRoles, true);
    need(d.moe ? kMoeRoles : kDenseRoles, true);
    if (names.count("mtp.fc")) {  // the MTP module is wanted: its own roles, and its layer's by name
        need(kMtpRoles, false);
        for (const auto* roles : {&kLayerRoles, &kAttentionRoles, d.moe ? &kMoeRoles : &kDenseRoles}) {
            std::vector<std::string> in_mtp;
            for (const std::string& r : *roles) in_mtp.push_back(kMtpLayer + r);
            need(in_mtp, false);
        }
    }
    auto join = [](const std::vector<std::string>& v) {
        std::string out;
        for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
        return out;
    };
    if (!missing.empty()) {
        throw std::invalid_argument("weights: no tensor name for the role(s) " + join(missing) +
                                    " (tensor_names maps each role of the model to its checkpoint "
                                    "name: lampo.models.tensor_specs.engine_tensor_names)");
    }
    if (!unplaced.empty()) {
        throw std::invalid_argument("weights: the per-layer name(s) of " + join(unplaced) + " hold no " +
                                    kLayer + " for the layer index");
    }
}

// `name` with every {layer} replaced by the layer index.
std::string layer_name(std::string name, int layer) {
    const std::string index = std::to_string(layer);
    for (size_t at = name.find(kLayer); at != std::string::npos; at = name.find(kLayer, at + index.size())) {
        name.replace(at, kLayer.size(), index);
    }
    return name;
}

// The display name of a fused block, from its parts' names: their common prefix, the parts'
// differing middles in braces, and their common suffix up to its first '.' ("p.{q,k,v}_proj
// (fused)" from "p.q_proj.weight", "p.k_proj.weight", "p.v_proj.weight").
std::string fused_name(const std::vector<std::string>& parts) {
    const std::string& first = parts.front();
    size_t pre = first.size(), suf = first.size(), shortest = first.size();
    for (const std::string& n : parts) {
        size_t i = 0;
        while (i < pre && i < n.size() && n[i] == first[i]) ++i;
        pre = i;
        size_t j = 0;
        while (j < suf && j < n.size() && n[n.size() - 1 - j] == first[first.size() - 1 - j]) ++j;
        suf = j;
        shortest = std::min(shortest, n.size());
    }
    suf = std::min(suf, shortest - pre);
    std::string out = first.substr(0, pre) + "{";
    for (size_t i = 0; i < parts.size(); ++i) {
        out += (i ? "," : "") + parts[i].substr(pre, parts[i].size() - pre - suf);
    }
    const std::string suffix = first.substr(first.size() - suf);
    return out + "}" + suffix.substr(0, suffix.find('.')) + " (fused)";
}

}  // namespace

// ---- WeightStore: allocation ----------------------------------------------------------------
void* WeightStore::block(const std::string& what, size_t bytes) {
    blocks_.emplace_back(bytes, "weights " + what);
    bytes_ += bytes;
    return blocks_.back().get();
}

int WeightStore::bits_of(const std::string& name) const {
    const auto it = bits_.find(name);
    return it == bits_.end() ? 0 : it->second;
}

void* WeightStore::add(const std::string& name, std::vector<int64_t> shape, DType dtype,
                       FillKind fill, int fan_in, void* device, int bits) {
    if (!index_.emplace(name, slots_.size()).second) {
        throw std::invalid_argument("weights: two tensors of the plan are named '" + name + "'");
    }
    slots_.push_back(TensorSlot{name, std::move(shape), dtype, fill, fan_in, device, bits});
    return device;
}

void* WeightStore::add_own(const std::string& name, std::vector<int64_t> shape, DType dtype,
                           FillKind fill, int fan_in, int bits) {
    TensorSlot probe{name, shape, dtype, fill, fan_in, nullptr, bits};
    return add(name, std::move(shape), dtype, fill, fan_in, block(name, probe.bytes()), bits);
}

namespace {

// Throws unless a matrix of `rows` x `in` can be held at `bits` (0: BF16, anything goes).
void check_lq_shape(const std::string& name, int bits, int64_t rows, int in) {
    if (!bits) return;
    if (bits < 4 || bits > 6) {
        throw std::invalid_argument("weights: '" + name + "' at " + std::to_string(bits) +
                                    " bits: the LQ widths are 4, 5 and 6");
    }
    if (rows % LQ_TILE_ROWS || in % LQ_TILE_COLS) {
        throw std::invalid_argument("weights: '" + name + "' [" + std::to_string(rows) + ", " + std::to_string(in) +
                                    "] is off the LQ tile grid (rows a multiple of 16, columns of 64): keep it bf16");
    }
}

}  // namespace

Linear WeightStore::add_linear(const std::string& name, int out, int in, FillKind fill, int experts) {
    Linear l;
    l.bits = bits_of(name);
    l.format = l.bits ? WeightFormat::LQ : WeightFormat::BF16;
    check_lq_shape(name, l.bits, out, in);
    std::vector<int64_t> shape = {out, in};
    if (experts) shape.insert(shape.begin(), experts);
    l.data = add_own(name, std::move(shape), DType::BF16, fill, in, l.bits);
    l.out = out;
    l.in = in;
    return l;
}

Linear WeightStore::add_fused(const std::vector<std::pair<std::string, int>>& parts, int in,
                              int rows_total, bool interleave) {
    int rows = 0;
    std::vector<std::string> names;
    for (const auto& p : parts) {
        rows += p.second;
        names.push_back(p.first);
    }
    const std::string what = fused_name(names);
    if (rows_total < rows) throw std::logic_error("weights: " + what + " has more rows than its block");
    Linear l;
    l.bits = bits_of(parts.front().first);
    l.format = l.bits ? WeightFormat::LQ : WeightFormat::BF16;
    l.out = rows_total;
    l.in = in;
    for (const auto& [name, r] : parts) {
        if (bits_of(name) != l.bits) {
            throw std::invalid_argument("weights: the parts of " + what + " are stored in one block and need one "
                                        "format, but '" + parts.front().first + "' is " +
                                        (l.bits ? "LQ" + std::to_string(l.bits) : "bf16") + " and '" + name + "' " +
                                        (bits_of(name) ? "LQ" + std::to_string(bits_of(name)) : "bf16"));
        }
        check_lq_shape(name, l.bits, r, in);
    }
    check_lq_shape(what, l.bits, rows_total, in);
    auto row_bytes = [&](int r) { return l.bits ? lq_packed_bytes(r, in, l.bits) : size_t(r) * size_t(in) * 2; };
    char* base = static_cast<char*>(block(what, row_bytes(rows_total)));
    if (rows_total > rows) {  // zero rows (LQ: zero scales and codes, weights 0 too)
        LAMPO_CUDA_CHECK(cudaMemset(base + row_bytes(rows), 0, row_bytes(rows_total) - row_bytes(rows)));
    }
    l.interleaved = interleave && l.bits;
    if (l.interleaved && (parts.size() != 2 || parts[0].second != parts[1].second || rows != rows_total)) {
        throw std::logic_error("weights: " + what + " is interleaved, so it holds two halves of equal rows");
    }
    int row = 0;
    for (const auto& [name, r] : parts) {
        add(name, {r, in}, DType::BF16, FillKind::Matrix, in, base + row_bytes(row), l.bits);
        if (l.interleaved) slots_.back().interleaved_half = row ? 1 : 0;
        row += r;
    }
    l.data = base;
    return l;
}

uint8_t* TensorSlot::block() const { return static_cast<uint8_t*>(device) - size_t(interleaved_half) * bytes(); }

void WeightStore::place_half(const TensorSlot& s, const void* packed, int first, int strips, cudaStream_t stream) {
    lq_place_half(static_cast<const uint8_t*>(packed), first, strips, int(s.shape.back()), s.bits, s.interleaved_half,
                  s.block(), stream);
}

// ---- WeightStore: the plan -------------------------------------------------------------------
bool moe_one_format(const MoeFfnWeights& m) {
    const WeightFormat f = m.experts_gate_up.format;
    return m.experts_down.format == f && m.shared_gate_up.format == f && m.shared_down.format == f;
}

const bf16* WeightStore::norm(const std::string& name, int n, FillKind kind) {
    return static_cast<const bf16*>(add_own(name, {n}, DType::BF16, kind));
}

LayerWeights WeightStore::add_layer(const std::function<std::string(const std::string&)>& name, MixerKind mixer) {
    const ModelDims& d = dims_;
    const int H = d.hidden;
    LayerWeights lw;
    lw.input_norm = norm(name("input_norm"), H);
    if (mixer == MixerKind::GatedAttention) {
        GatedAttentionWeights& a = lw.attn;
        a.qkv = add_fused({{name("attn.q"), d.q_rows()},
                           {name("attn.k"), d.kv_width()},
                           {name("attn.v"), d.kv_width()}},
                          H, d.attn_qkv_rows());
        a.q_norm = norm(name("attn.q_norm"), d.head_dim);
        a.k_norm = norm(name("attn.k_norm"), d.head_dim);
        a.o = add_linear(name("attn.o"), H, d.attn_width());
    } else {
        GatedDeltaNetWeights& g = lw.gdn;
        g.in_proj = add_fused({{name("gdn.qkv"), d.conv_channels()},
                               {name("gdn.z"), d.gdn_value_width()},
                               {name("gdn.b"), d.gdn_v_heads},
                               {name("gdn.a"), d.gdn_v_heads}},
                              H, d.gdn_in_rows());
        g.conv = static_cast<const bf16*>(add_own(name("gdn.conv"), {d.conv_channels(), 1, d.conv_kernel},
                                                  DType::BF16, FillKind::Conv));
        g.A_log = static_cast<const float*>(add_own(name("gdn.A_log"), {d.gdn_v_heads}, DType::F32, FillKind::ALog));
        g.dt_bias = static_cast<const float*>(
            add_own(name("gdn.dt_bias"), {d.gdn_v_heads}, DType::F32, FillKind::DtBias));
        g.norm = norm(name("gdn.norm"), d.gdn_v_dim, FillKind::NormPlain);
        g.out = add_linear(name("gdn.out"), H, d.gdn_value_width());
    }
    lw.post_norm = norm(name("post_norm"), H);
    if (d.moe) {
        MoeFfnWeights& m = lw.moe;
        const int E = d.n_experts, I = d.expert_inter, Is = d.shared_inter;
        m.router = static_cast<const bf16*>(add_own(name("moe.router"), {E, H}, DType::BF16, FillKind::Matrix, H));
        m.experts_gate_up = add_linear(name("moe.experts_gate_up"), 2 * I, H, FillKind::Matrix, E);
        m.experts_down = add_linear(name("moe.experts_down"), H, I, FillKind::Matrix, E);
        m.shared_gate_up = add_fused({{name("moe.shared_expert.gate"), Is}, {name("moe.shared_expert.up"), Is}}, H,
                                     2 * Is);
        m.shared_down = add_linear(name("moe.shared_expert.down"), H, Is);
        m.shared_gate = static_cast<const bf16*>(
            add_own(name("moe.shared_gate"), {1, H}, DType::BF16, FillKind::Matrix, H));
    } else {
        DenseFfnWeights& f = lw.dense;
        f.gate_up = add_fused({{name("dense.gate"), d.ffn_inter}, {name("dense.up"), d.ffn_inter}}, H, 2 * d.ffn_inter,
                              true);
        f.down = add_linear(name("dense.down"), H, d.ffn_inter);
    }
    return lw;
}

WeightStore::WeightStore(const ModelDims& d, const TensorNames& names, const TensorBits& bits)
    : dims_(d), bits_(bits) {
    d.validate();
    check_names(d, names);
    const int H = d.hidden, V = d.vocab;
    model_.embed = add_linear(names.at("embed"), V, H, FillKind::Embedding);
    for (int l = 0; l < d.n_layers(); ++l) {
        model_.layers.push_back(add_layer([&](const std::string& role) { return layer_name(names.at(role), l); },
                                          d.mixers[l]));
    }
    model_.final_norm = norm(names.at("final_norm"), H);
    model_.lm_head = add_linear(names.at("lm_head"), V, H);
    if (names.count("mtp.fc")) {
        MtpWeights& m = model_.mtp;
        m.pre_fc_norm_embedding = norm(names.at("mtp.pre_fc_norm_embedding"), H);
        m.pre_fc_norm_hidden = norm(names.at("mtp.pre_fc_norm_hidden"), H);
        m.fc = add_linear(names.at("mtp.fc"), H, 2 * H);
        m.layer = add_layer([&](const std::string& role) { return names.at(kMtpLayer + role); },
                            MixerKind::GatedAttention);
        m.norm = norm(names.at("mtp.norm"), H);
        model_.has_mtp = true;
    }
    for (const auto& [name, b] : bits_) {
        if (!index_.count(name)) {
            throw std::invalid_argument("weights: a width is given for '" + name + "', which is not a tensor of "
                                        "this model's plan");
        }
    }
    if (d.moe) {
        for (const LayerWeights& lw : model_.layers) {
            model_.decode_foldable = model_.decode_foldable && moe_one_format(lw.moe);
        }
        model_.mtp_foldable = !model_.has_mtp || moe_one_format(model_.mtp.layer.moe);
    } else {
        const auto lq = [](const Linear& l) { return l.format == WeightFormat::LQ; };
        model_.decode_prenormable = true;
        for (size_t l = 0; l < model_.layers.size(); ++l) {
            const LayerWeights& lw = model_.layers[l];
            const bool mixer = d.mixers[l] == MixerKind::GatedAttention ? lq(lw.attn.qkv) && lq(lw.attn.o)
                                                                         : lq(lw.gdn.in_proj) && lq(lw.gdn.out);
            model_.decode_prenormable = model_.decode_prenormable && mixer && lq(lw.dense.gate_up) && lq(lw.dense.down);
        }
    }
    loaded_.assign(slots_.size(), false);
    LAMPO_CUDA_CHECK(cudaDeviceSynchronize());  // the padding memsets ran on the legacy stream
}

// ---- WeightStore: loading ------------------------------------------------------------------
const TensorSlot& WeightStore::slot_to_load(const std::string& name, size_t* index) {
    const auto it = index_.find(name);
    if (it == index_.end()) throw std::invalid_argument("load_tensor: '" + name + "' is not a tensor of this model");
    if (!staging_) staging_ = std::make_unique<StagingRing>();
    *index = it->second;
    return slots_[it->second];
}

void WeightStore::mark_loaded(size_t index) {
    if (!loaded_[index]) loaded_bytes_ += slots_[index].bytes();
    loaded_[index] = true;
}

void WeightStore::quantize_rows(const TensorSlot& s, const bf16* rows_bf16, int64_t row0, int rows,
                                cudaStream_t stream) {
    const int cols = int(s.shape.back());
    if (s.interleaved_half < 0) {
        lq_quantize(rows_bf16, rows, cols, s.bits,
                    static_cast<uint8_t*>(s.device) + lq_packed_bytes(int(row0), cols, s.bits), stream);
        LAMPO_CHECK_LAUNCH("lq_quantize");
        return;
    }
    if (!placing_.get()) placing_ = DeviceMemory(StagingRing::kPieceBytes / 2, "interleaved weight placing");
    if (lq_packed_bytes(rows, cols, s.bits) > placing_.bytes())
        throw std::logic_error("weights: a packed piece of '" + s.name + "' exceeds the placing scratch");
    lq_quantize(rows_bf16, rows, cols, s.bits, placing_.as<uint8_t>(), stream);
    LAMPO_CHECK_LAUNCH("lq_quantize");
    place_half(s, placing_.as<uint8_t>(), int(row0 / LQ_TILE_ROWS), rows / LQ_TILE_ROWS, stream);
}

void WeightStore::load(const std::string& name, const void* data, DType dtype,
                       const std::vector<int64_t>& shape, int stored_bits) {
    size_t index = 0;
    const TensorSlot& s = slot_to_load(name, &index);
    if (stored_bits) {
        load_packed(s, data, shape, stored_bits);
    } else {
        if (shape != s.shape) {
            throw std::invalid_argument("load_tensor: '" + name + "' has shape " + shape_str(shape) +
                                        ", expected " + shape_str(s.shape));
        }
        const size_t n = s.numel();
        const uint16_t* src16 = static_cast<const uint16_t*>(data);
        const float* src32 = static_cast<const float*>(data);
        // bf16 bytes [off, off + len) of the tensor, from a bf16 or an f32 source
        auto fill_bf16 = [&](void* pinned, size_t off, size_t len) {
            if (dtype == DType::BF16) {
                std::memcpy(pinned, static_cast<const char*>(data) + off, len);
            } else {
                uint16_t* out = static_cast<uint16_t*>(pinned);
                for (size_t i = 0; i < len / 2; ++i) out[i] = f32_to_bf16_bits(src32[off / 2 + i]);
            }
        };
        if (s.bits) {  // quantize on load: whole row strips of bf16 per piece
            const size_t row_bytes = size_t(s.shape.back()) * 2, strip = LQ_TILE_ROWS * row_bytes;
            const size_t piece = StagingRing::kPieceBytes / strip * strip;
            staging_->convert(n * 2, piece, fill_bf16, [&](void* scratch, size_t off, size_t len, cudaStream_t st) {
                quantize_rows(s, static_cast<const bf16*>(scratch), int64_t(off / row_bytes), int(len / row_bytes), st);
            });
        } else if (s.dtype == DType::BF16) {
            staging_->copy(s.device, n * 2, fill_bf16);
        } else if (dtype == DType::F32) {
            staging_->copy(s.device, n * 4, [&](void* pinned, size_t off, size_t len) {
                std::memcpy(pinned, static_cast<const char*>(data) + off, len);
            });
        } else {  // bf16 checkpoint tensor -> f32 slot
            staging_->copy(s.device, n * 4, [&](void* pinned, size_t off, size_t len) {
                float* out = static_cast<float*>(pinned);
                for (size_t i = 0; i < len / 4; ++i) out[i] = bf16_bits_to_f32(src16[off / 4 + i]);
            });
        }
    }
    mark_loaded(index);
}

void WeightStore::load_fp8(const std::string& name, const std::vector<Fp8Part>& parts, int cols, int block_rows,
                           int block_cols) {
    size_t index = 0;
    const TensorSlot& s = slot_to_load(name, &index);
    const auto refuse = [&](const std::string& why) { throw std::invalid_argument("load_fp8: '" + name + "' " + why); };
    if (s.dtype != DType::BF16 || s.shape.size() < 2)
        refuse(std::string("is a ") + dtype_name(s.dtype) + " tensor of the engine, not a matrix that can arrive as FP8");
    if (cols != s.shape.back()) refuse("has " + std::to_string(cols) + " columns, expected " + std::to_string(s.shape.back()));
    if (block_rows <= 0 || block_cols <= 0)
        refuse("has a weight block of " + std::to_string(block_rows) + " x " + std::to_string(block_cols));
    int64_t rows = 0;
    for (const Fp8Part& p : parts) {
        if (p.rows <= 0 || (s.bits && p.rows % LQ_TILE_ROWS))
            refuse("has a part of " + std::to_string(p.rows) + " rows" +
                   (s.bits ? "; quantized on load, every part must hold whole 16-row strips" : ""));
        rows += p.rows;
    }
    if (rows != s.rows()) refuse("parts hold " + std::to_string(rows) + " rows, expected " + std::to_string(s.rows()));
    // A piece: whole weight blocks and whole 16-row strips of one part, its codes at most a quarter
    // of the staging piece (so its bf16 rows fit dequantized_), then the scales of its block rows.
    const int64_t unit = std::lcm(int64_t(block_rows), int64_t(LQ_TILE_ROWS));
    const size_t max_codes = StagingRing::kPieceBytes / 4;
    if (size_t(unit) * size_t(cols) > max_codes) refuse("has rows too wide to stage in blocks of " + std::to_string(unit));
    const int64_t piece_rows = int64_t(max_codes / (size_t(unit) * size_t(cols))) * unit;
    const int scale_cols = (cols + block_cols - 1) / block_cols;
    const auto codes_bytes = [&](int64_t n) { return (size_t(n) * size_t(cols) + 15) / 16 * 16; };
    const auto scale_bytes = [&](int64_t n) { return size_t((n + block_rows - 1) / block_rows) * scale_cols * 4; };
    const size_t piece = codes_bytes(piece_rows) + scale_bytes(piece_rows);
    if (s.bits && !dequantized_.get()) dequantized_ = DeviceMemory(max_codes * 2, "FP8 weight dequantizing");
    int64_t row0 = 0;
    for (const Fp8Part& p : parts) {
        const auto piece_at = [&](size_t off) {  // (first row in the part, rows) of the piece at `off`
            const int64_t r = int64_t(off / piece) * piece_rows;
            return std::make_pair(r, std::min(piece_rows, p.rows - r));
        };
        const int64_t last = p.rows % piece_rows;
        const size_t bytes = size_t(p.rows / piece_rows) * piece + (last ? codes_bytes(last) + scale_bytes(last) : 0);
        staging_->convert(bytes, piece, [&](void* pinned, size_t off, size_t) {
            const auto [r, n] = piece_at(off);
            std::memcpy(pinned, p.codes + size_t(r) * cols, size_t(n) * cols);
            std::memcpy(static_cast<char*>(pinned) + codes_bytes(n), p.scales + size_t(r / block_rows) * scale_cols,
                        scale_bytes(n));
        }, [&](void* scratch, size_t off, size_t, cudaStream_t st) {
            const auto [r, n] = piece_at(off);
            const uint8_t* codes = static_cast<const uint8_t*>(scratch);
            const float* scales = reinterpret_cast<const float*>(codes + codes_bytes(n));
            if (s.bits) {
                fp8_dequantize(codes, scales, int(n), cols, block_rows, block_cols, dequantized_.as<bf16>(), st);
                quantize_rows(s, dequantized_.as<bf16>(), row0 + r, int(n), st);
            } else {
                fp8_dequantize(codes, scales, int(n), cols, block_rows, block_cols,
                               static_cast<bf16*>(s.device) + size_t(row0 + r) * cols, st);
            }
        });
        row0 += p.rows;
    }
    mark_loaded(index);
}

// The packed bytes of a tensor stored at `stored_bits`: copied into an LQ slot of that width, or
// dequantized into a BF16 slot (whole row strips per piece).
void WeightStore::load_packed(const TensorSlot& s, const void* data, const std::vector<int64_t>& shape,
                              int stored_bits) {
    const std::string& name = s.name;
    if (stored_bits < 4 || stored_bits > 6) {
        throw std::invalid_argument("load_tensor: '" + name + "' is stored at " + std::to_string(stored_bits) +
                                    " bits; the LQ widths are 4, 5 and 6");
    }
    if (s.dtype != DType::BF16 || s.shape.size() < 2) {
        throw std::invalid_argument("load_tensor: '" + name + "' is a " + dtype_name(s.dtype) +
                                    " tensor of the engine, not a matrix that can arrive packed");
    }
    const int cols = int(s.shape.back());
    const int64_t rows = s.rows();
    check_lq_shape(name, stored_bits, rows, cols);
    const size_t packed = lq_packed_bytes(int(rows), cols, stored_bits);
    size_t got = 1;
    for (int64_t e : shape) got *= size_t(e);
    if (got != packed) {
        throw std::invalid_argument("load_tensor: '" + name + "' " + shape_str(s.shape) + " at " +
                                    std::to_string(stored_bits) + " bits packs into " + std::to_string(packed) +
                                    " bytes, got " + std::to_string(got) + " (shape " + shape_str(shape) + ")");
    }
    auto fill = [&](void* pinned, size_t off, size_t len) {
        std::memcpy(pinned, static_cast<const char*>(data) + off, len);
    };
    const size_t strip = lq_packed_bytes(LQ_TILE_ROWS, cols, stored_bits);
    const size_t piece = StagingRing::kPieceBytes / strip * strip;
    if (s.bits == stored_bits && s.interleaved_half >= 0) {
        staging_->convert(packed, piece, fill, [&](void* scratch, size_t off, size_t len, cudaStream_t st) {
            place_half(s, scratch, int(off / strip), int(len / strip), st);
        });
        return;
    }
    if (s.bits == stored_bits) {
        staging_->copy(s.device, packed, fill);
        return;
    }
    if (s.bits) {
        throw std::invalid_argument("load_tensor: '" + name + "' is stored at " + std::to_string(stored_bits) +
                                    " bits and the engine holds it at " + std::to_string(s.bits));
    }
    bf16* dst = static_cast<bf16*>(s.device);
    staging_->convert(packed, piece, fill, [&](void* scratch, size_t off, size_t len, cudaStream_t st) {
        const int row0 = int(off / strip) * LQ_TILE_ROWS, rows_here = int(len / strip) * LQ_TILE_ROWS;
        lq_dequantize(static_cast<const uint8_t*>(scratch), rows_here, cols, stored_bits, dst + size_t(row0) * cols, st);
        LAMPO_CHECK_LAUNCH("lq_dequantize");
    });
}

void WeightStore::finish_loading() {
    if (staging_) {
        staging_->wait();
        staging_.reset();
    }
    placing_ = DeviceMemory();
    dequantized_ = DeviceMemory();
    std::vector<std::string> missing;
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (!loaded_[i]) missing.push_back(slots_[i].name);
    }
    if (!missing.empty()) {
        std::string msg = "weights: " + std::to_string(missing.size()) + " tensor(s) never loaded: " + missing[0];
        for (size_t i = 1; i < std::min<size_t>(missing.size(), 5); ++i) msg += ", " + missing[i];
        if (missing.size() > 5) msg += ", ...";
        throw std::runtime_error(msg);
    }
    ready_ = true;
}

void WeightStore::fill_random(uint64_t seed, cudaStream_t stream) {
    for (size_t i = 0; i < slots_.size(); ++i) {
        const TensorSlot& s = slots_[i];
        float lo = 0.f, hi = 0.f;
        switch (s.fill) {
            case FillKind::Matrix: hi = std::sqrt(3.0f / float(s.fan_in)); lo = -hi; break;
            case FillKind::Embedding: lo = -0.05f; hi = 0.05f; break;
            case FillKind::NormOffset: lo = -0.1f; hi = 0.1f; break;
            case FillKind::NormPlain: lo = 0.9f; hi = 1.1f; break;
            case FillKind::Conv: lo = -0.5f; hi = 0.5f; break;
            case FillKind::ALog: lo = 0.f; hi = 2.7726f; break;
            case FillKind::DtBias: lo = -0.5f; hi = 0.5f; break;
        }
        const uint64_t tensor_seed = seed * 0x9E3779B97F4A7C15ull + i;
        if (s.bits) {  // uniform codes with scales giving the same standard deviation as U(lo, hi)
            lq_fill_random(static_cast<uint8_t*>(s.device), int(s.rows()), int(s.shape.back()), s.bits,
                           (hi - lo) / std::sqrt(12.0f), tensor_seed, stream);
        } else if (s.dtype == DType::BF16) {
            fill_uniform_bf16(static_cast<bf16*>(s.device), s.numel(), lo, hi, tensor_seed, stream);
        } else {
            fill_uniform_f32(static_cast<float*>(s.device), s.numel(), lo, hi, tensor_seed, stream);
        }
        LAMPO_CHECK_LAUNCH("fill_random");
        loaded_[i] = true;
    }
    loaded_bytes_ = bytes_;
    LAMPO_CUDA_CHECK(cudaStreamSynchronize(stream));
    ready_ = true;
}

}  // namespace lampo
