// weights.h - device memory ownership and the device weight store.
//
// The WeightStore plans every tensor the text model needs from the config (shapes, dtypes) and
// the caller's checkpoint names by role (TensorNames; the engine spells no checkpoint name),
// allocates them up front (fused where the layer loop wants one product: attention q|k|v, Gated
// DeltaNet qkv|z|b|a, dense gate|up, shared-expert gate|up; the first two padded with zero rows,
// see ModelDims::padded_rows), then receives
// checkpoint tensors one by one from host memory (typically a memory-mapped safetensors file) and
// copies them into place through a double-buffered pinned staging ring, so reading the next piece
// from disk overlaps the PCIe copy of the previous one. The MTP module is part of the plan when the
// names hold its roles ("mtp.fc", ..., and its layer's roles as "mtp.layer.<role>").
//
// A dense SwiGLU gate|up block in the LQ format is kept with its halves' rows interleaved by 8
// (linear.h Linear::interleaved): each half arrives as its own tensor and is placed row strip by
// row strip (lq_place_half), whatever its source (quantized on load or packed in the checkpoint).
//
// Weight formats: TensorBits names the matrices held in the LQ format (4, 5 or 6 bits; the others
// are BF16). A tensor arrives as stored in the checkpoint and is converted on the GPU where its
// slot differs: bf16 (or f32) into an LQ slot is quantized (lq_quantize: quantize-on-load), LQ into
// a BF16 slot is dequantized (a fused block whose parts were stored at different widths). The parts
// of one fused block share one format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/model.h"

namespace lampo {

// One cudaMalloc'ed block; a failed allocation throws CudaError naming `what` and the size. The
// blocks alive are counted; with a limit set (set_limit, bytes; 0: none) an allocation that would
// take the count past it throws the same way, as if the device were that small (--vram-limit).
class DeviceMemory {
public:
    static void set_limit(size_t bytes);
    static size_t allocated();  // bytes in the blocks alive now
    DeviceMemory() = default;
    DeviceMemory(size_t bytes, const std::string& what);
    ~DeviceMemory();
    DeviceMemory(const DeviceMemory&) = delete;
    DeviceMemory& operator=(const DeviceMemory&) = delete;
    DeviceMemory(DeviceMemory&& o) noexcept;
    DeviceMemory& operator=(DeviceMemory&& o) noexcept;
    void* get() const { return ptr_; }
    template <class T> T* as() const { return static_cast<T*>(ptr_); }
    size_t bytes() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// "12.50 GiB" / "3.00 MiB" for error messages.
std::string format_bytes(size_t bytes);

enum class DType : int { BF16 = 0, F32 = 1 };
const char* dtype_name(DType t);

// How `fill_random` initialises a tensor (bench mode), mimicking the scale of trained weights.
enum class FillKind : int {
    Matrix,      // U(+-sqrt(3/fan_in)): std 1/sqrt(fan_in)
    Embedding,   // U(+-0.05)
    NormOffset,  // zero-centred norm weight (used as 1 + w): U(-0.1, 0.1)
    NormPlain,   // plain norm weight: U(0.9, 1.1)
    Conv,        // U(+-0.5)
    ALog,        // log of U(1, 16), approximated by U(0, log 16)
    DtBias,      // U(-0.5, 0.5)
};

// Checkpoint names by role ("embed", "attn.q", "moe.router", ...: the roles of weights.cpp's plan),
// from lampo.models.tensor_specs.engine_tensor_names. A per-layer role's name holds "{layer}",
// which the plan replaces by the layer index.
using TensorNames = std::unordered_map<std::string, std::string>;
// Checkpoint name -> LQ width (4, 5 or 6) of each matrix the engine keeps in the LQ format.
using TensorBits = std::unordered_map<std::string, int>;

struct TensorSlot {
    std::string name;             // checkpoint name (from TensorNames, {layer} filled in)
    std::vector<int64_t> shape;
    DType dtype;                  // dtype in VRAM (checkpoint bf16/f32 is converted on load)
    FillKind fill;
    int fan_in;                   // for FillKind::Matrix
    void* device;                 // where the tensor lives (inside a possibly fused block)
    int bits = 0;                 // LQ width (4, 5, 6) of a matrix [N, K] or bank [E, N, K]; 0: dtype
    // An LQ half of a gate|up block kept interleaved (linear.h Linear::interleaved): 0 the gate
    // rows, 1 the up rows, whose places are spread over the whole block (block()); -1: none.
    int interleaved_half = -1;
    uint8_t* block() const;       // the interleaved block (interleaved_half >= 0)
    size_t numel() const;
    int64_t rows() const;         // a matrix's (or bank's) rows: product of all but the last extent
    size_t bytes() const;         // in VRAM (LQ: the packed tiles)
};

// Double-buffered pinned host staging for host -> device copies on its own stream.
class StagingRing {
public:
    static constexpr size_t kPieceBytes = size_t(64) << 20;
    StagingRing();
    ~StagingRing();
    StagingRing(const StagingRing&) = delete;
    StagingRing& operator=(const StagingRing&) = delete;
    // Copies `bytes` to `dst` (device); `fill(pinned, offset, n)` writes output bytes
    // [offset, offset + n) into the pinned piece (a memcpy, or a dtype conversion).
    template <class Fill>
    void copy(void* dst, size_t bytes, Fill&& fill);
    // Converting copy: `bytes` staged in pieces of `piece` (<= kPieceBytes) bytes, each copied to
    // a device scratch buffer and handed to `convert(scratch, offset, n, stream)`, which launches
    // the kernel writing its converted output (on the ring's stream, so the scratch is reused
    // only after it ran).
    template <class Fill, class Convert>
    void convert(size_t bytes, size_t piece, Fill&& fill, Convert&& convert);
    void wait();  // all copies issued so far have landed

private:
    void* pinned_[2] = {nullptr, nullptr};
    DeviceMemory scratch_[2];  // device side of `convert`, allocated at its first use
    cudaEvent_t done_[2] = {nullptr, nullptr};
    bool busy_[2] = {false, false};
    int next_ = 0;
    cudaStream_t stream_ = nullptr;
};

// One block-scaled FP8 matrix of a tensor that WeightStore::load_fp8 takes (models/fp8.py), in host
// memory: e4m3 codes [rows, cols] and fp32 scales [ceil(rows / block_rows), ceil(cols / block_cols)],
// both row-major.
struct Fp8Part {
    const uint8_t* codes;
    const float* scales;
    int64_t rows;
};

class WeightStore {
public:
    // Throws std::invalid_argument naming the roles of this model that `names` lacks, or a width
    // that cannot be: `bits` names a tensor the model does not have, a width other than 4, 5, 6,
    // a matrix off the 16 x 64 tile grid, or fused parts of different formats.
    WeightStore(const ModelDims& dims, const TensorNames& names, const TensorBits& bits = {});
    const std::vector<TensorSlot>& slots() const { return slots_; }
    bool has(const std::string& name) const { return index_.count(name) > 0; }
    // Copy one checkpoint tensor from host memory into place. `data` holds the elements (dtype
    // `dtype`, C order) of a tensor of `shape`, which must match the slot; bf16 <-> f32 converted;
    // into an LQ slot quantized on the GPU. With `stored_bits` > 0, `data` is the packed LQ bytes
    // (`shape` their stored shape: [bytes], or [E, bytes per matrix] of a bank) of the slot's
    // tensor at that width: copied into an LQ slot of the same width, dequantized into a BF16 one.
    void load(const std::string& name, const void* data, DType dtype,
              const std::vector<int64_t>& shape, int stored_bits = 0);
    // Load `name` from block-scaled FP8 parts whose rows, in order, are the tensor's rows (a bank
    // [E, N, K] as [E N, K]; `cols` = K). Each part's codes and scales are staged as they are (one
    // byte a weight over PCIe) and dequantized on the GPU (fp8_dequantize: the bf16 values
    // models/fp8.py gives) into a BF16 slot, or into scratch that lq_quantize reads for an LQ slot
    // (quantize-on-load, as from bf16; each part must then hold whole 16-row strips).
    void load_fp8(const std::string& name, const std::vector<Fp8Part>& parts, int cols, int block_rows,
                  int block_cols);
    // Waits for every copy and frees the staging buffers; throws naming the tensors never loaded.
    void finish_loading();
    // Bench mode: every tensor filled with deterministic random values in VRAM.
    void fill_random(uint64_t seed, cudaStream_t stream);
    bool ready() const { return ready_; }  // every tensor loaded (or randomly filled)
    const ModelWeights& model() const { return model_; }
    size_t bytes() const { return bytes_; }
    size_t loaded_bytes() const { return loaded_bytes_; }

private:
    ModelDims dims_;
    std::vector<DeviceMemory> blocks_;
    std::vector<TensorSlot> slots_;
    std::vector<bool> loaded_;
    std::unordered_map<std::string, size_t> index_;
    ModelWeights model_;
    std::unique_ptr<StagingRing> staging_;  // exists while loading (pinned host memory)
    TensorBits bits_;
    size_t bytes_ = 0, loaded_bytes_ = 0;
    bool ready_ = false;

    int bits_of(const std::string& name) const;  // 0 when BF16

    void* block(const std::string& what, size_t bytes);
    const bf16* norm(const std::string& name, int n, FillKind kind = FillKind::NormOffset);  // a [n] vector
    // One decoder layer's tensors; `name` gives the checkpoint name of each of its roles.
    LayerWeights add_layer(const std::function<std::string(const std::string&)>& name, MixerKind mixer);
    void* add(const std::string& name, std::vector<int64_t> shape, DType dtype, FillKind fill,
              int fan_in, void* device, int bits = 0);
    void* add_own(const std::string& name, std::vector<int64_t> shape, DType dtype, FillKind fill,
                  int fan_in = 0, int bits = 0);
    // Allocates one block holding the row-concatenation of `parts` ([rows_i, in] matrices, by
    // name, all BF16 or all LQ at one width), followed by zero rows up to `rows_total`, and
    // returns it as a Linear.
    // interleave: two LQ halves of a SwiGLU gate|up block, kept interleaved (TensorSlot::interleaved_half).
    Linear add_fused(const std::vector<std::pair<std::string, int>>& parts, int in, int rows_total,
                     bool interleave = false);
    // A matrix [out, in], or with `experts` > 0 a bank of that many (Linear: one expert's shape),
    // in the format `bits_` gives its name.
    Linear add_linear(const std::string& name, int out, int in, FillKind fill = FillKind::Matrix, int experts = 0);
    const TensorSlot& slot_to_load(const std::string& name, size_t* index);  // starts the staging ring
    void mark_loaded(size_t index);
    void load_packed(const TensorSlot& s, const void* data, const std::vector<int64_t>& shape, int stored_bits);
    // Rows [row0, row0 + rows) of the LQ slot `s` (whole 16-row strips), quantized from bf16 rows
    // in device memory; an interleaved half's strips go through placing_ into their places.
    void quantize_rows(const TensorSlot& s, const bf16* rows_bf16, int64_t row0, int rows, cudaStream_t stream);
    // `strips` packed row strips of interleaved half `s`, from its strip `first` on, into their places.
    void place_half(const TensorSlot& s, const void* packed, int first, int strips, cudaStream_t stream);
    DeviceMemory placing_;  // loading: a piece of an interleaved half, quantized, before it is placed
    DeviceMemory dequantized_;  // loading FP8 into an LQ slot: a piece as bf16, before it is quantized
};

// ---- fill_random.cu (bench only) -----------------------------------------------------------
// Deterministic uniform values in [lo, hi] from a counter-based hash of (seed, index).
void fill_uniform_bf16(bf16* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);
void fill_uniform_f32(float* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);
void fill_uniform_f16(half* dst, size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);
// Uniform INT8 KV cache codes q in [-127, 127], stored offset binary (q + 128, ops.h).
void fill_kv_codes(uint8_t* dst, size_t n, uint64_t seed, cudaStream_t stream);

}  // namespace lampo
