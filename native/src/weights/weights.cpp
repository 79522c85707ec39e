// weights.cpp - the device weight store: plan (tensors by role, their names from the caller),
// allocation, staged loading, random fill.
#include "weights/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "kernels/common.cuh"

namespace lampo {

// ---- DeviceMemory --------------------------------------------------------------------------
DeviceMemory::DeviceMemory(size_t bytes, const std::string& what) : bytes_(bytes) {
    if (!bytes_) return;
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
}

DeviceMemory::~DeviceMemory() {
    if (ptr_) cudaFree(ptr_);
}

DeviceMemory::DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
    if (this != &o) {
        if (ptr_) cudaFree(ptr_);
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
const std::string kLayer = "{layer}";

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

void* WeightStore::add(const std::string& name, std::vector<int64_t> shape, DType dtype,
                       FillKind fill, int fan_in, void* device) {
    if (!index_.emplace(name, slots_.size()).second) {
        throw std::invalid_argument("weights: two tensors of the plan are named '" + name + "'");
    }
    slots_.push_back(TensorSlot{name, std::move(shape), dtype, fill, fan_in, device});
    return device;
}

void* WeightStore::add_own(const std::string& name, std::vector<int64_t> shape, DType dtype,
                           FillKind fill, int fan_in) {
    TensorSlot probe{name, shape, dtype, fill, fan_in, nullptr};
    return add(name, std::move(shape), dtype, fill, fan_in, block(name, probe.bytes()));
}

Linear WeightStore::add_linear(const std::string& name, int out, int in) {
    Linear l;
    l.data = add_own(name, {out, in}, DType::BF16, FillKind::Matrix, in);
    l.out = out;
    l.in = in;
    return l;
}

Linear WeightStore::add_fused(const std::vector<std::pair<std::string, int>>& parts, int in,
                              int rows_total) {
    int rows = 0;
    std::vector<std::string> names;
    for (const auto& p : parts) {
        rows += p.second;
        names.push_back(p.first);
    }
    const std::string what = fused_name(names);
    if (rows_total < rows) throw std::logic_error("weights: " + what + " has more rows than its block");
    char* base = static_cast<char*>(block(what, size_t(rows_total) * size_t(in) * 2));
    if (rows_total > rows) {
        LAMPO_CUDA_CHECK(cudaMemset(base + size_t(rows) * size_t(in) * 2, 0,
                                    size_t(rows_total - rows) * size_t(in) * 2));
    }
    size_t row = 0;
    for (const auto& [name, r] : parts) {
        add(name, {r, in}, DType::BF16, FillKind::Matrix, in, base + row * size_t(in) * 2);
        row += size_t(r);
    }
    Linear l;
    l.data = base;
    l.out = rows_total;
    l.in = in;
    return l;
}

// ---- WeightStore: the plan -------------------------------------------------------------------
WeightStore::WeightStore(const ModelDims& d, const TensorNames& names) : dims_(d) {
    d.validate();
    check_names(d, names);
    const int H = d.hidden, V = d.vocab;
    auto norm = [&](const std::string& tensor, int n, FillKind kind = FillKind::NormOffset) {
        return static_cast<const bf16*>(add_own(tensor, {n}, DType::BF16, kind));
    };

    model_.embed = static_cast<const bf16*>(
        add_own(names.at("embed"), {V, H}, DType::BF16, FillKind::Embedding));
    model_.layers.resize(d.n_layers());
    for (int l = 0; l < d.n_layers(); ++l) {
        auto name = [&](const char* role) { return layer_name(names.at(role), l); };
        LayerWeights& lw = model_.layers[l];
        lw.input_norm = norm(name("input_norm"), H);
        if (d.mixers[l] == MixerKind::GatedAttention) {
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
            g.conv = static_cast<const bf16*>(add_own(name("gdn.conv"),
                                                      {d.conv_channels(), 1, d.conv_kernel},
                                                      DType::BF16, FillKind::Conv));
            g.A_log = static_cast<const float*>(
                add_own(name("gdn.A_log"), {d.gdn_v_heads}, DType::F32, FillKind::ALog));
            g.dt_bias = static_cast<const float*>(
                add_own(name("gdn.dt_bias"), {d.gdn_v_heads}, DType::F32, FillKind::DtBias));
            g.norm = norm(name("gdn.norm"), d.gdn_v_dim, FillKind::NormPlain);
            g.out = add_linear(name("gdn.out"), H, d.gdn_value_width());
        }
        lw.post_norm = norm(name("post_norm"), H);
        if (d.moe) {
            MoeFfnWeights& m = lw.moe;
            const int E = d.n_experts, I = d.expert_inter, Is = d.shared_inter;
            m.router = static_cast<const bf16*>(
                add_own(name("moe.router"), {E, H}, DType::BF16, FillKind::Matrix, H));
            m.experts_gate_up = static_cast<const bf16*>(add_own(
                name("moe.experts_gate_up"), {E, 2 * I, H}, DType::BF16, FillKind::Matrix, H));
            m.experts_down = static_cast<const bf16*>(add_own(
                name("moe.experts_down"), {E, H, I}, DType::BF16, FillKind::Matrix, I));
            m.shared_gate_up = add_fused({{name("moe.shared_expert.gate"), Is},
                                          {name("moe.shared_expert.up"), Is}},
                                         H, 2 * Is);
            m.shared_down = add_linear(name("moe.shared_expert.down"), H, Is);
            m.shared_gate = static_cast<const bf16*>(add_own(
                name("moe.shared_gate"), {1, H}, DType::BF16, FillKind::Matrix, H));
        } else {
            DenseFfnWeights& f = lw.dense;
            f.gate_up = add_fused({{name("dense.gate"), d.ffn_inter}, {name("dense.up"), d.ffn_inter}},
                                  H, 2 * d.ffn_inter);
            f.down = add_linear(name("dense.down"), H, d.ffn_inter);
        }
    }
    model_.final_norm = norm(names.at("final_norm"), H);
    model_.lm_head = add_linear(names.at("lm_head"), V, H);
    loaded_.assign(slots_.size(), false);
    LAMPO_CUDA_CHECK(cudaDeviceSynchronize());  // the padding memsets ran on the legacy stream
}

// ---- WeightStore: loading ------------------------------------------------------------------
void WeightStore::load(const std::string& name, const void* data, DType dtype,
                       const std::vector<int64_t>& shape) {
    const auto it = index_.find(name);
    if (it == index_.end()) throw std::invalid_argument("load_tensor: '" + name + "' is not a tensor of this model");
    const TensorSlot& s = slots_[it->second];
    if (shape != s.shape) {
        throw std::invalid_argument("load_tensor: '" + name + "' has shape " + shape_str(shape) +
                                    ", expected " + shape_str(s.shape));
    }
    const size_t n = s.numel();
    if (!staging_) staging_ = std::make_unique<StagingRing>();
    if (dtype == s.dtype) {
        staging_->copy(s.device, s.bytes(), [&](void* pinned, size_t off, size_t len) {
            std::memcpy(pinned, static_cast<const char*>(data) + off, len);
        });
    } else if (s.dtype == DType::F32) {  // bf16 checkpoint tensor -> f32 slot
        const uint16_t* src = static_cast<const uint16_t*>(data);
        staging_->copy(s.device, n * 4, [&](void* pinned, size_t off, size_t len) {
            float* out = static_cast<float*>(pinned);
            for (size_t i = 0; i < len / 4; ++i) out[i] = bf16_bits_to_f32(src[off / 4 + i]);
        });
    } else {  // f32 checkpoint tensor -> bf16 slot
        const float* src = static_cast<const float*>(data);
        staging_->copy(s.device, n * 2, [&](void* pinned, size_t off, size_t len) {
            uint16_t* out = static_cast<uint16_t*>(pinned);
            for (size_t i = 0; i < len / 2; ++i) out[i] = f32_to_bf16_bits(src[off / 2 + i]);
        });
    }
    if (!loaded_[it->second]) loaded_bytes_ += s.bytes();
    loaded_[it->second] = true;
}

void WeightStore::finish_loading() {
    if (staging_) {
        staging_->wait();
        staging_.reset();
    }
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
        if (s.dtype == DType::BF16) {
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
