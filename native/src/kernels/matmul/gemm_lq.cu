// gemm_lq.cu - y [T, out] = x [T, in] @ W^T for any T (the prefill path), W in the LQ format
// (kernels/lq_tile.cuh; models/quant/layout.py is the specification):
//   W[n, k] = scale[n, k/64] * (code[n, k] - 2^(BITS-1)),  BITS in {4, 5, 6}, fp16 scales,
//   tiles of 16 rows x 64 columns, out % 16 == 0, in % 64 == 0; x bf16, y bf16 or fp32.
// The same kernel serves gemm_lq_grouped (matmul.cuh): rows in 64-row tiles of a device table,
// x rows gathered, one matrix per group, a BF16 or SWIGLU epilogue (the MoE prefill experts).
//
// Numerics (as gemv_lq): the tensor cores sum the exact products (2^BITS + code) * x in fp32, from
// the start value -(2^BITS + 2^(BITS-1)) * (sum of the tile's x), so each 64-column tile of a row
// contributes scale * fp32(sum (code - 2^(BITS-1)) * x); no bf16 copy of W, no rounded weight.
//
// Roles: x is the mma A operand (M = 16 tokens), W the B operand (N = 8 output rows). A lane's 16
// bytes of a tile hold its A fragments of the tile's four k16 steps (lq_a_register); A registers
// s = 0, 2 of a step are the B fragment of the tile's rows 0-7 and s = 1, 3 that of rows 8-15
// (B col-major 16x8: b0 = (k 2q..2q+1, n g), b1 = (k 2q+8.., n g); A: a0 = (row g, k 2q..),
// a1 = (row g+8, k 2q..), a2 = (row g, k 2q+8..), a3 = (row g+8, k 2q+8..)). The C fragment is then
// y[token g / g+8][rows 2q, 2q+1]: stored as pairs, no transposition.
//
// Block: 64 tokens x 256 output rows (16 row strips), 8 warps as 2 (tokens) x 4 (rows), warp tile
// 32 tokens x 64 rows (2 m16 x 4 tiles = 8 n8). Per 64-column step (one LQ tile column), a 4-stage
// cp.async ring holds x [64][64] bf16 (128-byte rows, 16-byte chunks XOR-swizzled by row: ldmatrix
// conflict-free) and the 16 strips' packed tiles as stored (16 * tile_bytes). A warp loads its x
// fragments of the four k16 steps with 8 ldmatrix.x4, gets its tokens' start values from the tensor
// cores too (x against a B of -centre: 8 mma beside the 64 of the products), then per tile decodes
// each B register once and runs two mma per m16 tile and k16 step into a chain started from the
// start values; the chain is scaled into the fp32 accumulators by the lane's rows' scales (rows
// 2q, 2q+1 and 2q+8, 2q+9). Shared memory 4 x (8 KiB + 16 tile_bytes) = 66 / 74 / 82 KiB at 4 / 5 /
// 6 bits; ~200 registers (accumulators 64, x fragments 32): one block of 8 warps per SM. Invalid
// rows / tiles are zero-filled and not stored. The grid is (row tiles, row blocks), row tiles
// fastest: the blocks that share a block of W run together (W is read about once from DRAM, x
// stays in L2). SWIGLU: a block's 16 slots are 8 gate strips and their 8 up strips, paired per
// warp (slots 4w, 4w + 1 gate; 4w + 2, 4w + 3 the matching up), so silu(gate) * up is formed in
// registers.
//
// On an H200 / H100 with the sm_90a code compiled in, gemm_lq hands T >= GEMM_LQ_SM90_MIN_T tokens
// to gemm_lq_sm90.cu (wgmma, weights rounded once to bf16; LAMPO_GEMM_LQ_SM90=0 / 1 forces this
// kernel / that one for any T: gemm_lq_sm90.cuh).
#include <cstdlib>
#include <type_traits>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_tile.cuh"
#include "kernels/matmul.cuh"
#include "kernels/matmul/gemm_lq_sm90.cuh"

namespace lampo {
namespace {

constexpr int GL_TOKENS = LQ_GEMM_TILE_ROWS;  // x rows (tokens) per block
constexpr int GL_SLOTS = 16;                  // LQ row strips per block: 256 output rows
constexpr int GL_STAGES = 4;
constexpr int GL_THREADS = 256;
constexpr int GL_X_BYTES = GL_TOKENS * LQ_TILE_COLS * 2;  // one stage of x: 8 KiB

constexpr int gl_stage_bytes(int bits) { return GL_X_BYTES + GL_SLOTS * lq_tile_bytes(bits); }
constexpr size_t gl_smem_bytes(int bits) { return size_t(GL_STAGES) * gl_stage_bytes(bits); }

enum class Ep { F32, BF16, SWIGLU };

struct GemmLqParams {
    const uint8_t* W;
    size_t group_bytes;
    const bf16* x;
    const int32_t* x_rows;
    void* y;
    int ldy, out, in;
    const int32_t* tile_group;  // null: dense, tile i = rows [64 i, 64 i + 64) of `rows`
    const int32_t* tile_row0;
    const int32_t* group_end;
    const int32_t* num_tiles;
    int rows;
};

// Byte offset of 16-byte chunk `chunk` of x row `row` in a stage (128-byte rows).
__device__ __forceinline__ uint32_t x_swz(int row, int chunk) {
    return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The row strip of W that block row `block` keeps in tile slot `slot`, or -1 past the matrix.
template <Ep EP>
__device__ __forceinline__ int slot_strip(int slot, int block, int strips) {
    if constexpr (EP == Ep::SWIGLU) {
        const int half = strips / 2, c = block * 8 + 2 * (slot >> 2) + (slot & 1);
        return c < half ? c + ((slot & 2) ? half : 0) : -1;
    } else {
        const int s = block * GL_SLOTS + slot;
        return s < strips ? s : -1;
    }
}

// d = a * b + c (mma.m16n8k16 bf16, fp32), c not overwritten: a chain's first step from its start.
__device__ __forceinline__ void mma_bf16_16816_from(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                    const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

template <class OutT>
__device__ __forceinline__ void store_pair(OutT* y, float a, float b) {
    if constexpr (std::is_same_v<OutT, float>) *reinterpret_cast<float2*>(y) = make_float2(a, b);
    else *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(a, b);
}

template <int BITS, Ep EP>
__global__ void __launch_bounds__(GL_THREADS, 1) gemm_lq_kernel(const GemmLqParams p) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS), TILE_VECS = TILE_BYTES / 16;
    constexpr int STAGE_BYTES = gl_stage_bytes(BITS);
    constexpr int W_VECS = GL_SLOTS * TILE_VECS, W_ITERS = (W_VECS + GL_THREADS - 1) / GL_THREADS;
    // bf16 pair (-centre, -centre): -(1.5 * 2^BITS), exact
    constexpr uint32_t NEG_CENTRE = (0x8000u | (uint32_t(127 + BITS) << 7) | 0x40u) * 0x10001u;
    extern __shared__ __align__(16) uint8_t gl_smem[];

    const int tile = blockIdx.x;
    if (p.num_tiles && tile >= *p.num_tiles) return;
    const int group = p.tile_group ? p.tile_group[tile] : 0;
    const int row0 = p.tile_row0 ? p.tile_row0[tile] : tile * GL_TOKENS;
    const int row_end = p.group_end ? p.group_end[group] : p.rows;
    const int strips = p.out / LQ_TILE_ROWS, ktiles = p.in / LQ_TILE_COLS;
    const uint8_t* W = p.W + size_t(group) * p.group_bytes;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wt = warp >> 2, wr = warp & 3;  // tokens 32 wt.., tile slots 4 wr..4 wr + 3

    // Copies: this thread moves x chunk (tid % 8) of rows tid / 8 and tid / 8 + 32, and the 16-byte
    // vectors tid + 256 i of the stage's packed tiles (slot v / TILE_VECS, its vector v % TILE_VECS).
    const int chunk = tid & 7;
    const bf16* x_src[2];
    bool x_ok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = row0 + (tid >> 3) + 32 * i;
        x_ok[i] = r < row_end;
        const int xr = x_ok[i] ? (p.x_rows ? p.x_rows[r] : r) : 0;
        x_src[i] = p.x + size_t(xr) * p.in + chunk * 8;
    }
    const uint8_t* w_src[W_ITERS];
    bool w_ok[W_ITERS];
#pragma unroll
    for (int i = 0; i < W_ITERS; ++i) {
        const int v = tid + GL_THREADS * i;
        const int strip = v < W_VECS ? slot_strip<EP>(v / TILE_VECS, blockIdx.y, strips) : -1;
        w_ok[i] = strip >= 0;
        w_src[i] = W + size_t(w_ok[i] ? strip : 0) * ktiles * TILE_BYTES + (v % TILE_VECS) * 16;
    }
    auto load_stage = [&](int stage, int kt) {
        uint8_t* xs = gl_smem + stage * STAGE_BYTES;
        uint8_t* ws = xs + GL_X_BYTES;
#pragma unroll
        for (int i = 0; i < 2; ++i)
            cp_async_16(xs + x_swz((tid >> 3) + 32 * i, chunk), x_ok[i] ? x_src[i] + kt * LQ_TILE_COLS : p.x, x_ok[i]);
#pragma unroll
        for (int i = 0; i < W_ITERS; ++i) {
            const int v = tid + GL_THREADS * i;
            if (W_VECS % GL_THREADS == 0 || v < W_VECS)
                cp_async_16(ws + v * 16, w_ok[i] ? w_src[i] + size_t(kt) * TILE_BYTES : p.W, w_ok[i]);
        }
    };

    float acc[2][8][4];  // [m16 tile][n8 tile: 2 * tile + half][C fragment]
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < GL_STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    const int quad = lane & 3;
    const uint32_t magic = lq_code_magic<BITS>();
    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<GL_STAGES - 2>();
        __syncthreads();  // stage kt landed for all; stage kt - 1 is free for the next copy
        if (kt + GL_STAGES - 1 < ktiles) load_stage((kt + GL_STAGES - 1) % GL_STAGES, kt + GL_STAGES - 1);
        cp_async_commit();
        const uint8_t* xs = gl_smem + (kt % GL_STAGES) * STAGE_BYTES;
        const uint8_t* ws = xs + GL_X_BYTES + 4 * wr * TILE_BYTES;

        uint32_t xa[2][4][4];  // [m16 tile][k16 step] A fragments
        float start[2][4];     // -centre * (sum of the tile's x) of tokens g, g (c0, c1) and g + 8 (c2, c3)
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int r = wt * 32 + mi * 16 + (lane & 15);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) ldmatrix_x4(xa[mi][kk], xs + x_swz(r, 2 * kk + (lane >> 4)));
            start[mi][0] = start[mi][1] = start[mi][2] = start[mi][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // two independent chains
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) mma_bf16_16816(start[mi], xa[mi][kk], NEG_CENTRE, NEG_CENTRE);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const uint8_t* t = ws + nt * TILE_BYTES;
            const LqLaneCodes codes = lq_lane_codes<BITS>(t, lane);
            const __half2* scales = reinterpret_cast<const __half2*>(t + TILE_BYTES - 2 * LQ_TILE_ROWS);
            // the scales of rows 2q, 2q + 1 (half 0) and 8 + 2q, 9 + 2q (half 1)
            const float2 sc[2] = {__half22float2(scales[quad]), __half22float2(scales[4 + quad])};
            float chain[2][2][4];  // [m16 tile][half: rows 0-7, 8-15]
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                uint32_t b[4];
#pragma unroll
                for (int s = 0; s < 4; ++s) b[s] = lq_a_register<BITS>(codes.low[kk], codes.high, kk, s, magic);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    if (kk == 0) {
                        mma_bf16_16816_from(chain[mi][0], xa[mi][0], b[0], b[2], start[mi]);
                        mma_bf16_16816_from(chain[mi][1], xa[mi][0], b[1], b[3], start[mi]);
                    } else {
                        mma_bf16_16816(chain[mi][0], xa[mi][kk], b[0], b[2]);
                        mma_bf16_16816(chain[mi][1], xa[mi][kk], b[1], b[3]);
                    }
                }
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float* a = acc[mi][2 * nt + h];
                    a[0] = fmaf(sc[h].x, chain[mi][h][0], a[0]);
                    a[1] = fmaf(sc[h].y, chain[mi][h][1], a[1]);
                    a[2] = fmaf(sc[h].x, chain[mi][h][2], a[2]);
                    a[3] = fmaf(sc[h].y, chain[mi][h][3], a[3]);
                }
        }
    }
    cp_async_wait<0>();

    // acc[mi][2 nt + h]: tokens g (values 0, 1) and g + 8 (2, 3) of m16 tile mi, rows 2q, 2q + 1 of
    // half h of slot 4 wr + nt.
    const int g = lane >> 2;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = row0 + wt * 32 + mi * 16 + g + 8 * hr;
            if (r >= row_end) continue;
            if constexpr (EP == Ep::SWIGLU) {
                bf16* y = static_cast<bf16*>(p.y) + size_t(r) * p.ldy;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    const int c = blockIdx.y * 8 + 2 * wr + nt;  // the gate strip (slot 4 wr + nt)
                    if (c >= strips / 2) continue;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float* gate = acc[mi][2 * nt + h] + 2 * hr;
                        const float* up = acc[mi][2 * (nt + 2) + h] + 2 * hr;
                        store_pair(y + c * LQ_TILE_ROWS + 8 * h + 2 * quad, silu(gate[0]) * up[0],
                                   silu(gate[1]) * up[1]);
                    }
                }
            } else {
                using OutT = std::conditional_t<EP == Ep::F32, float, bf16>;
                OutT* y = static_cast<OutT*>(p.y) + size_t(r) * p.ldy;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int strip = blockIdx.y * GL_SLOTS + 4 * wr + nt;
                    if (strip >= strips) continue;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float* v = acc[mi][2 * nt + h] + 2 * hr;
                        store_pair(y + strip * LQ_TILE_ROWS + 8 * h + 2 * quad, v[0], v[1]);
                    }
                }
            }
        }
}

template <Ep EP>
void launch_gemm_lq(const GemmLqParams& p, int bits, int tile_slots, int row_blocks, cudaStream_t stream) {
    auto go = [&](auto kernel, size_t smem) {
        allow_dynamic_smem(kernel, smem, "gemm_lq");
        kernel<<<dim3(tile_slots, row_blocks), GL_THREADS, smem, stream>>>(p);
    };
    switch (bits) {
        case 4: go(gemm_lq_kernel<4, EP>, gl_smem_bytes(4)); break;
        case 5: go(gemm_lq_kernel<5, EP>, gl_smem_bytes(5)); break;
        default: go(gemm_lq_kernel<6, EP>, gl_smem_bytes(6)); break;
    }
}

void check_gemm_lq(const char* op, const uint8_t* W, int bits, const bf16* x, int out, int in) {
    require(bits >= 4 && bits <= 6, op, "bits must be 4, 5 or 6, got " + std::to_string(bits));
    require(out > 0 && out % LQ_TILE_ROWS == 0 && in > 0 && in % LQ_TILE_COLS == 0, op,
            "W must be [16n, 64k], got [" + std::to_string(out) + ", " + std::to_string(in) + "]");
    require(ceil_div(out, GL_SLOTS * LQ_TILE_ROWS) <= 65535, op, "out = " + std::to_string(out) + " is too large");
    require((reinterpret_cast<uintptr_t>(W) | reinterpret_cast<uintptr_t>(x)) % 16 == 0, op,
            "W and x must be 16-byte aligned");
}

}  // namespace

bool gemm_lq_takes_sm90(int T) {
#if defined(LAMPO_GEMM_SM90A)
    const char* mode = std::getenv("LAMPO_GEMM_LQ_SM90");
    const bool forced = mode && mode[0] == '1' && mode[1] == '\0';
    return (forced || T >= GEMM_LQ_SM90_MIN_T) && gemm_lq_sm90_usable(nullptr, nullptr, nullptr);
#else
    (void)T;
    return false;
#endif
}

template <class OutT>
void gemm_lq(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    check_gemm_lq("gemm_lq", W, bits, x, out, in);
    require(T >= 1, "gemm_lq", "T must be >= 1, got " + std::to_string(T));
#if defined(LAMPO_GEMM_SM90A)
    if (gemm_lq_takes_sm90(T) && gemm_lq_sm90_usable(W, x, y)) return gemm_lq_sm90(W, bits, x, y, T, out, in, stream);
#endif
    const GemmLqParams p{W, 0, x, nullptr, y, out, out, in, nullptr, nullptr, nullptr, nullptr, T};
    constexpr Ep EP = std::is_same_v<OutT, float> ? Ep::F32 : Ep::BF16;
    launch_gemm_lq<EP>(p, bits, ceil_div(T, GL_TOKENS), ceil_div(out, GL_SLOTS * LQ_TILE_ROWS), stream);
}

template void gemm_lq<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemm_lq<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);

void gemm_lq_grouped(const uint8_t* W, int bits, const bf16* x, bf16* y, int ldy, int out, int in,
                     const LqRowGroups& groups, LqEpilogue epilogue, cudaStream_t stream) {
    const char* op = "gemm_lq_grouped";
    check_gemm_lq(op, W, bits, x, out, in);
    require(groups.tile_group && groups.tile_row0 && groups.group_end && groups.num_tiles, op, "needs a tile table");
    require(groups.group_bytes % 16 == 0, op, "groups' matrices must be 16-byte aligned");
    if (groups.tile_slots <= 0) return;
    const GemmLqParams p{W, groups.group_bytes, x, groups.x_rows, y, ldy, out, in,
                         groups.tile_group, groups.tile_row0, groups.group_end, groups.num_tiles, 0};
    const int strips = out / LQ_TILE_ROWS;
    if (epilogue == LqEpilogue::SWIGLU) {
        require(out % (2 * LQ_TILE_ROWS) == 0, op, "SWIGLU needs out a multiple of 32, got " + std::to_string(out));
        require(ldy >= out / 2, op, "ldy must be >= out / 2");
        launch_gemm_lq<Ep::SWIGLU>(p, bits, groups.tile_slots, ceil_div(strips / 2, GL_SLOTS / 2), stream);
    } else {
        require(ldy >= out, op, "ldy must be >= out");
        launch_gemm_lq<Ep::BF16>(p, bits, groups.tile_slots, ceil_div(strips, GL_SLOTS), stream);
    }
}

}  // namespace lampo
