// weights.cpp - the device weight store: plan, allocation, staged loading, random fill.
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

// ---- WeightStore: the plan -----------------------------------------------------------------
void* WeightStore::block(const std::string& what, size_t bytes) {
    blocks_.emplace_back(bytes, "weights " + what);
    bytes_ += bytes;
    return blocks_.back().get();
}

void* WeightStore::add(const std::string& name, std::vector<int64_t> shape, DType dtype,
                       FillKind fill, int fan_in, void* device) {
    index_[name] = slots_.size();
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

Linear WeightStore::add_fused(const std::string& what,
                              const std::vector<std::pair<std::string, int>>& parts, int in,
                              int rows_total) {
    int rows = 0;
    for (const auto& p : parts) rows += p.second;
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

WeightStore::WeightStore(const ModelDims& d) : dims_(d) {
    d.validate();
    const int H = d.hidden, V = d.vocab;
    const std::string root = "model.language_model.";
    auto norm = [&](const std::string& name, int n, FillKind kind = FillKind::NormOffset) {
        return static_cast<const bf16*>(add_own(name, {n}, DType::BF16, kind));
    };

    model_.embed = static_cast<const bf16*>(
        add_own(root + "embed_tokens.weight", {V, H}, DType::BF16, FillKind::Embedding));
    model_.layers.resize(d.n_layers());
    for (int l = 0; l < d.n_layers(); ++l) {
        const std::string p = root + "layers." + std::to_string(l) + ".";
        LayerWeights& lw = model_.layers[l];
        lw.input_norm = norm(p + "input_layernorm.weight", H);
        if (d.mixers[l] == MixerKind::GatedAttention) {
            GatedAttentionWeights& a = lw.attn;
            a.qkv = add_fused(p + "self_attn.{q,k,v}_proj (fused)",
                              {{p + "self_attn.q_proj.weight", d.q_rows()},
                               {p + "self_attn.k_proj.weight", d.kv_width()},
                               {p + "self_attn.v_proj.weight", d.kv_width()}},
                              H, d.attn_qkv_rows());
            a.q_norm = norm(p + "self_attn.q_norm.weight", d.head_dim);
            a.k_norm = norm(p + "self_attn.k_norm.weight", d.head_dim);
            a.o = add_linear(p + "self_attn.o_proj.weight", H, d.attn_width());
        } else {
            GatedDeltaNetWeights& g = lw.gdn;
            const std::string q = p + "linear_attn.";
            g.in_proj = add_fused(q + "in_proj_{qkv,z,b,a} (fused)",
                                  {{q + "in_proj_qkv.weight", d.conv_channels()},
                                   {q + "in_proj_z.weight", d.gdn_value_width()},
                                   {q + "in_proj_b.weight", d.gdn_v_heads},
                                   {q + "in_proj_a.weight", d.gdn_v_heads}},
                                  H, d.gdn_in_rows());
            g.conv = static_cast<const bf16*>(add_own(q + "conv1d.weight",
                                                      {d.conv_channels(), 1, d.conv_kernel},
                                                      DType::BF16, FillKind::Conv));
            g.A_log = static_cast<const float*>(
                add_own(q + "A_log", {d.gdn_v_heads}, DType::F32, FillKind::ALog));
            g.dt_bias = static_cast<const float*>(
                add_own(q + "dt_bias", {d.gdn_v_heads}, DType::F32, FillKind::DtBias));
            g.norm = norm(q + "norm.weight", d.gdn_v_dim, FillKind::NormPlain);
            g.out = add_linear(q + "out_proj.weight", H, d.gdn_value_width());
        }
        lw.post_norm = norm(p + "post_attention_layernorm.weight", H);
        if (d.moe) {
            MoeFfnWeights& m = lw.moe;
            const int E = d.n_experts, I = d.expert_inter, Is = d.shared_inter;
            m.router = static_cast<const bf16*>(
                add_own(p + "mlp.gate.weight", {E, H}, DType::BF16, FillKind::Matrix, H));
            m.experts_gate_up = static_cast<const bf16*>(add_own(
                p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, DType::BF16, FillKind::Matrix, H));
            m.experts_down = static_cast<const bf16*>(add_own(
                p + "mlp.experts.down_proj", {E, H, I}, DType::BF16, FillKind::Matrix, I));
            m.shared_gate_up = add_fused(p + "mlp.shared_expert.{gate,up}_proj (fused)",
                                         {{p + "mlp.shared_expert.gate_proj.weight", Is},
                                          {p + "mlp.shared_expert.up_proj.weight", Is}},
                                         H, 2 * Is);
            m.shared_down = add_linear(p + "mlp.shared_expert.down_proj.weight", H, Is);
            m.shared_gate = static_cast<const bf16*>(add_own(
                p + "mlp.shared_expert_gate.weight", {1, H}, DType::BF16, FillKind::Matrix, H));
        } else {
            DenseFfnWeights& f = lw.dense;
            f.gate_up = add_fused(p + "mlp.{gate,up}_proj (fused)",
                                  {{p + "mlp.gate_proj.weight", d.ffn_inter},
                                   {p + "mlp.up_proj.weight", d.ffn_inter}},
                                  H, 2 * d.ffn_inter);
            f.down = add_linear(p + "mlp.down_proj.weight", H, d.ffn_inter);
        }
    }
    model_.final_norm = norm(root + "norm.weight", H);
    model_.lm_head = add_linear("lm_head.weight", V, H);
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
