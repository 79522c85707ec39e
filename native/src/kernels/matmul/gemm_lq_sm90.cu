// gemm_lq_sm90.cu - the Hopper (sm_90a) path of gemm_lq: y [T, out] = x [T, in] @ W^T with W in the
// LQ format (kernels/lq_tile.cuh; models/quant/layout.py is the specification) on wgmma.
//
// Roles (as Machete's): W is the wgmma A operand, taken from registers, and x the B operand, read
// by the tensor cores from shared memory; the accumulator is y^T. That fits the format: the 512
// low-nibble bytes of a 16 x 64 tile are the mma.sync m16n8k16 A fragments of its four k16 steps
// in lane order, and wgmma's register A fragment is that same layout per warp (warp w of a
// warpgroup: rows 16w..16w+15). So a consumer warp loads its lane's 16 bytes of one tile (+4 / 8
// bytes of high bits at 5 / 6 bits, + its rows' two fp16 scales) from shared memory and decodes
// them into the 16 A registers of the tile's four wgmma k16 steps; no dequantized copy of W is
// ever written anywhere. The decode is ~7 (4-bit) to ~9 (5/6-bit) ALU instructions per register
// for a wgmma m64n256k16 that keeps the tensor cores busy for ~128 cycles per warpgroup, so it
// hides behind the asynchronous wgmma of the previous tile (A double-buffered in registers) and
// the other consumer warpgroup's.
//
// CTA: 128 output rows (8 LQ strips) x BN tokens (256, or 128 when the 256-wide grid would not fill
// the GPU once), 3 warpgroups (384 threads, one CTA per SM):
//   warpgroup 0 (40 registers): one thread produces a STAGES-deep ring: per 64-column K slice, the
//     x box [BN tokens x 64] by TMA (128-byte swizzle, zero-filled past T, as gemm_sm90.cu's) and
//     the slice's 8 packed tiles (one per strip, 544 / 672 / 800 bytes each) by 1-D bulk copies,
//     all completing on the slot's `full` mbarrier (strips past `out` are not copied).
//   warpgroups 1, 2 (232 registers): consumer c owns strips 4c..4c+3 (rows 64c..64c+63; warp w
//     strip 4c + w). Per slice: wait `full`, decode the 16 A registers (set kt % 2), wgmma_fence,
//     4 x wgmma m64nBNk16 (A registers, B = the x box + 32 bytes per k16 step), commit, wait until
//     only this group is in flight, then give the previous slot back (one `empty` arrival per
//     warp, 8 in all). The A set a group reads is rewritten two slices later, after it retired.
//   Epilogue: both consumers meet on a named barrier (the ring is free), each transposes its
//     64 rows x BN tokens of fp32 accumulators through shared memory ([token][row], 68-float
//     pitch: conflict-free) and stores 16-byte row chunks of y (coalesced; OutT fp32 or bf16).
// Tiles are visited in groups of GROUP_T token tiles (token tile fastest), so one wave of CTAs
// shares each W row block (read once from DRAM) and the x slices in L2.
// Shared memory: STAGES x (BN * 128 + 8 * tile_bytes) + barriers: 6 / 6 / 5 stages at BN = 256,
// 8 at BN = 128 (~190-225 KiB). Registers: consumers ~170-190 of 232 (128 fp32 accumulators at
// BN = 256, 2 x 16 A registers); see the build's -Xptxas -v: no spills, no serialized wgmma.
//
// Numerics: each weight is rounded once to bf16, W' = bf16_rn(scale * (code - 2^(BITS-1))): the
// decode builds the exact bf16 2^BITS + code (lq_a_register's magic), widens it to fp32, forms
// fma(scale, 2^BITS + code, -scale * 1.5 * 2^BITS) = scale * (code - 2^(BITS-1)) exactly in fp32
// (an 11-bit scale times a 7-bit integer; the fma's one rounding is exact) and rounds that to bf16
// (cvt.rn.bf16x2.f32): |W' - W| <= 2^-8 |W|. The tensor cores then sum x * W' in fp32, so y agrees
// with numpy's x @ bf16(W).T to fp32 summation order, and with x @ W.T to a bf16-level tolerance
// (the mma.sync path, T < GEMM_LQ_SM90_MIN_T, keeps gemm_lq's exact products).
#include "kernels/matmul/gemm_lq_sm90.cuh"

#if defined(LAMPO_GEMM_SM90A)

#include <cstdlib>
#include <type_traits>

#include "kernels/launch_utils.cuh"
#include "kernels/lq_tile.cuh"
#include "kernels/matmul/gemm_wgmma.cuh"

namespace lampo {
namespace {

constexpr int LQ90_THREADS = 384;
constexpr int LQ90_STRIPS = 8;                          // LQ row strips per CTA
constexpr int LQ90_ROWS = LQ90_STRIPS * LQ_TILE_ROWS;  // 128 output rows
constexpr int LQ90_BK = LQ_TILE_COLS;                   // one tile column per slice
constexpr int LQ90_PITCH = 68;                          // staging floats per token (64 rows + 4)
constexpr int LQ90_GROUP_T = 8;                         // token tiles per raster group
constexpr int LQ90_SMEM_LIMIT = 227 * 1024;             // sm_90's opt-in shared memory per block
static_assert(LQ90_BK == WGMMA_BOX_K, "a slice is one 128-byte swizzled TMA box row");

template <int BITS, int BN>
struct Lq90Cfg {
    static constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    static constexpr int X_BYTES = BN * LQ90_BK * 2;  // 1,024-byte multiple: swizzle atoms stay aligned
    static constexpr int W_BYTES = LQ90_STRIPS * TILE_BYTES;
    static constexpr int STAGE_BYTES = X_BYTES + W_BYTES;
    static constexpr int FIT = (LQ90_SMEM_LIMIT - 1024 - 256) / STAGE_BYTES;
    static constexpr int STAGES = FIT < 8 ? FIT : 8;
    static constexpr int RING = STAGES * STAGE_BYTES;
    // ring + full/empty barriers + slack to align the ring to 1,024 bytes
    static constexpr int SMEM = RING + 2 * STAGES * 8 + 1024;
    static constexpr int STAGING = 2 * BN * LQ90_PITCH * 4;
    static_assert(STAGES >= 4, "the ring needs at least 4 slots");
    static_assert(STAGING <= RING, "the epilogue's staging reuses the ring");
    static_assert(X_BYTES % 1024 == 0 && TILE_BYTES % 16 == 0, "alignment");
};

// bf16 pair (2^BITS + code) -> bf16_rn(scale * (code - 2^(BITS-1))) for both halves, neg_centre =
// -scale * (2^BITS + 2^(BITS-1)) (exact). The fma is exact (see the top comment): one rounding.
__device__ __forceinline__ uint32_t lq90_scale_pair(uint32_t pair, float scale, float neg_centre) {
    const float lo = __uint_as_float(pair << 16), hi = __uint_as_float(pair & 0xffff0000u);
    const __nv_bfloat162 w = __floats2bfloat162_rn(fmaf(scale, lo, neg_centre), fmaf(scale, hi, neg_centre));
    return *reinterpret_cast<const uint32_t*>(&w);
}

// The lane's 16 wgmma A registers of one tile (a[4j + s]: k16 step j, register s) as bf16 weights;
// `live` false (a strip past the matrix): zeros, whatever the slot holds.
template <int BITS>
__device__ __forceinline__ void lq90_decode(const uint8_t* tile, int lane, bool live, uint32_t (&a)[16]) {
    constexpr int TILE_BYTES = lq_tile_bytes(BITS);
    const LqLaneCodes codes = lq_lane_codes<BITS>(tile, lane);
    const __half* scales = reinterpret_cast<const __half*>(tile + TILE_BYTES - 2 * LQ_TILE_ROWS);
    const int g = lane >> 2;
    const float s_lo = live ? __half2float(scales[g]) : 0.0f;      // row g: registers 0, 2
    const float s_hi = live ? __half2float(scales[g + 8]) : 0.0f;  // row g + 8: registers 1, 3
    const float n_lo = -s_lo * lq_code_centre<BITS>(), n_hi = -s_hi * lq_code_centre<BITS>();
    const uint32_t magic = lq_code_magic<BITS>();
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint32_t pair = lq_a_register<BITS>(codes.low[j], codes.high, j, s, magic);
            a[4 * j + s] = (s & 1) ? lq90_scale_pair(pair, s_hi, n_hi) : lq90_scale_pair(pair, s_lo, n_lo);
        }
}

template <int BN>
__device__ __forceinline__ void lq90_wgmma(float (&acc)[BN / 2], const uint32_t (&a)[16], int j, uint64_t desc_b) {
    if constexpr (BN == 256)
        wgmma_m64n256k16_rs(acc, a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3], desc_b, 1);
    else
        wgmma_m64n128k16_rs(acc, a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3], desc_b, 1);
}

// One K slice of a consumer warp: wait for slot kt % STAGES, decode this warp's tile into `a`,
// issue the four k16 wgmma of the slice, then give back the previous slice's slot once its
// group has retired.
template <int BITS, int BN>
__device__ __forceinline__ void lq90_slice(float (&acc)[BN / 2], uint32_t (&a)[16], const uint32_t (&prev)[16], int kt,
                                           const uint8_t* Xs,
                                           const uint8_t* Ws, uint64_t* full, uint64_t* empty, int slot, int lane,
                                           bool live) {
    using C = Lq90Cfg<BITS, BN>;
    const int s = kt % C::STAGES;
    mbarrier_wait(&full[s], (kt / C::STAGES) & 1);
    lq90_decode<BITS>(Ws + s * C::W_BYTES + slot * C::TILE_BYTES, lane, live, a);
    const uint8_t* xs = Xs + s * C::X_BYTES;
    uint64_t desc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) desc[j] = wgmma_desc_sw128(xs + j * 32);
    // Pin every input of the group before the fence (as CUTLASS's warpgroup_fence_operand): no
    // decode instruction may sink between the group's wgmma (ptxas would serialize them).
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(a[i])::"memory");
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+l"(desc[j])::"memory");
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) lq90_wgmma<BN>(acc, a, j, desc[j]);
    wgmma_commit();
    wgmma_wait<1>();  // the previous slice's group has retired: its slot and A registers are free
    // Keep the previous set live up to here, so that the register allocator cannot hand its
    // registers to this slice's decode while that group could still read them.
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" ::"r"(prev[i]));
    if (kt > 0 && lane == 0) mbarrier_arrive(&empty[(kt - 1) % C::STAGES]);
}

template <int BITS, int BN, class OutT>
__global__ void __launch_bounds__(LQ90_THREADS, 1)
gemm_lq_sm90_kernel(const __grid_constant__ CUtensorMap x_map, const uint8_t* __restrict__ W,
                    OutT* __restrict__ Y, int T, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = Lq90Cfg<BITS, BN>;
    constexpr int STAGES = C::STAGES;
    extern __shared__ uint8_t gemm_lq_sm90_smem[];
    // an offset from the array (not a cast integer) keeps the loads and stores below in ld/st.shared
    uint8_t* ring = gemm_lq_sm90_smem + ((1024u - (smem_u32(gemm_lq_sm90_smem) & 1023u)) & 1023u);
    uint8_t* Xs = ring;
    uint8_t* Ws = ring + STAGES * C::X_BYTES;
    uint64_t* full = reinterpret_cast<uint64_t*>(ring + C::RING);
    uint64_t* empty = full + STAGES;

    const int tiles_t = (T + BN - 1) / BN, tiles_r = (N + LQ90_ROWS - 1) / LQ90_ROWS;
    const int per_group = LQ90_GROUP_T * tiles_r;
    const int first_t = (int(blockIdx.x) / per_group) * LQ90_GROUP_T;
    const int group_cols = min(tiles_t - first_t, LQ90_GROUP_T);
    const int in_group = int(blockIdx.x) % per_group;
    const int t0 = (first_t + in_group % group_cols) * BN;
    const int strip0 = (in_group / group_cols) * LQ90_STRIPS;
    const int strips = N / LQ_TILE_ROWS, ktiles = K / LQ90_BK;
    // Slices run in pairs (A register sets 0, 1) with no odd tail: a branch around the second
    // slice makes ptxas serialize the wgmma. An odd count gets one empty slice: x zero-filled by
    // TMA (its box lies past `in`), no W copied, zero weights.
    const int kslices = (ktiles + 1) & ~1;
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;

    ring_barriers_init(full, empty, STAGES, 8);  // 8 consumer warps

    if (wg == 0) {  // producer
        setmaxnreg_dec<40>();
        if (t == 0) {
            const int live = min(LQ90_STRIPS, strips - strip0);
            const uint8_t* src = W + size_t(strip0) * ktiles * C::TILE_BYTES;
            for (int kt = 0; kt < kslices; ++kt) {
                const int s = kt % STAGES, copies = kt < ktiles ? live : 0;
                if (kt >= STAGES) mbarrier_wait(&empty[s], ((kt / STAGES) - 1) & 1);
                mbarrier_arrive_expect_tx(&full[s], C::X_BYTES + copies * C::TILE_BYTES);
                tma_load_2d(Xs + s * C::X_BYTES, &x_map, &full[s], kt * LQ90_BK, t0);
                for (int i = 0; i < copies; ++i)
                    bulk_load(Ws + s * C::W_BYTES + i * C::TILE_BYTES,
                              src + (size_t(i) * ktiles + kt) * C::TILE_BYTES, C::TILE_BYTES, &full[s]);
            }
        }
        return;
    }

    setmaxnreg_inc<232>();
    const int c = wg - 1, warp = t / 32, lane = t % 32;
    const int slot = 4 * c + warp;  // this warp's strip in the CTA
    const bool live = strip0 + slot < strips;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    uint32_t a0[16], a1[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) a0[i] = a1[i] = 0u;
    int kt = 0;
    do {  // two A register sets, alternating by slice; kslices >= 2 (a loop that may run zero
          // times joins zeroed accumulators with in-flight ones: ptxas serializes the wgmma)
        lq90_slice<BITS, BN>(acc, a0, a1, kt, Xs, Ws, full, empty, slot, lane, live);
        lq90_slice<BITS, BN>(acc, a1, a0, kt + 1, Xs, Ws, full, empty, slot, lane, live && kt + 1 < ktiles);
        kt += 2;
    } while (kt < kslices);
    wgmma_wait<0>();

    // Epilogue. acc[4j + 2h + e]: row 16 warp + g + 8h of this consumer's 64, token 8j + 2q + e.
    named_barrier_sync(1, 256);  // both consumers are done with the ring (every slot has landed)
    float* stage = reinterpret_cast<float*>(ring) + c * BN * LQ90_PITCH;
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                stage[(8 * j + 2 * q + e) * LQ90_PITCH + 16 * warp + g + 8 * h] = acc[4 * j + 2 * h + e];
    named_barrier_sync(2 + c, 128);

    constexpr int V = 16 / int(sizeof(OutT));  // rows per 16-byte store
    constexpr int CHUNKS = 64 / V;             // per token
    const int row0 = (strip0 + 4 * c) * LQ_TILE_ROWS;
    for (int i = t; i < BN * CHUNKS; i += 128) {
        const int token = i / CHUNKS, chunk = i % CHUNKS;
        const int gt = t0 + token, gr = row0 + chunk * V;
        if (gt >= T || gr >= N) continue;
        const float* src = stage + token * LQ90_PITCH + chunk * V;
        if constexpr (std::is_same_v<OutT, float>) {
            *reinterpret_cast<float4*>(Y + size_t(gt) * N + gr) = *reinterpret_cast<const float4*>(src);
        } else {
            const float4 v0 = *reinterpret_cast<const float4*>(src);
            const float4 v1 = *reinterpret_cast<const float4*>(src + 4);
            const __nv_bfloat162 p[4] = {__floats2bfloat162_rn(v0.x, v0.y), __floats2bfloat162_rn(v0.z, v0.w),
                                         __floats2bfloat162_rn(v1.x, v1.y), __floats2bfloat162_rn(v1.z, v1.w)};
            *reinterpret_cast<uint4*>(Y + size_t(gt) * N + gr) = *reinterpret_cast<const uint4*>(p);
        }
    }
#endif
}

template <int BITS, int BN, class OutT>
void launch_lq90(const uint8_t* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    using C = Lq90Cfg<BITS, BN>;
    auto kernel = gemm_lq_sm90_kernel<BITS, BN, OutT>;
    allow_dynamic_smem(kernel, C::SMEM, "gemm_lq");
    const CUtensorMap x_map = tensor_map(x, T, in, BN);
    const long ctas = long(ceil_div(T, BN)) * ceil_div(out, LQ90_ROWS);
    require(ctas <= 0x7fffffffL, "gemm_lq", "too many tiles");
    kernel<<<unsigned(ctas), LQ90_THREADS, C::SMEM, stream>>>(x_map, W, y, T, out, in);
    LAMPO_CHECK_LAUNCH("gemm_lq (sm90)");
}

template <int BITS, class OutT>
void dispatch_lq90(const uint8_t* W, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    const long wide = long(ceil_div(T, 256)) * ceil_div(out, LQ90_ROWS);
    if (T > 128 && wide >= sm_count()) launch_lq90<BITS, 256>(W, x, y, T, out, in, stream);
    else launch_lq90<BITS, 128>(W, x, y, T, out, in, stream);
}

}  // namespace

bool gemm_lq_sm90_usable(const void* W, const void* x, const void* y) {
    const char* portable = std::getenv("LAMPO_GEMM_PORTABLE");
    if (portable && *portable && *portable != '0') return false;
    const char* mode = std::getenv("LAMPO_GEMM_LQ_SM90");
    if (mode && *mode == '0') return false;
    const bool aligned =
        (reinterpret_cast<uintptr_t>(W) | reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % 16 == 0;
    return aligned && sm90_or_newer() && device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
           device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

template <class OutT>
void gemm_lq_sm90(const uint8_t* W, int bits, const bf16* x, OutT* y, int T, int out, int in, cudaStream_t stream) {
    switch (bits) {
        case 4: dispatch_lq90<4>(W, x, y, T, out, in, stream); break;
        case 5: dispatch_lq90<5>(W, x, y, T, out, in, stream); break;
        default: dispatch_lq90<6>(W, x, y, T, out, in, stream); break;
    }
}

template void gemm_lq_sm90<bf16>(const uint8_t*, int, const bf16*, bf16*, int, int, int, cudaStream_t);
template void gemm_lq_sm90<float>(const uint8_t*, int, const bf16*, float*, int, int, int, cudaStream_t);

}  // namespace lampo

#endif  // LAMPO_GEMM_SM90A
