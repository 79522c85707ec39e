// attention_prefill.cu - causal flash attention for a prefill chunk over the INT8 KV cache;
// contract in ops.h (attn_prefill_int8). Token t of the chunk sits at pos0 + t and sees cache rows
// [0, pos0 + t] (the chunk's own rows already appended).
//
// Each block takes a tile of floor(64 / group) consecutive tokens times the `group` query heads of
// one KV head (<= 64 rows, 4 warps of 16 rows) and streams all keys it can see through the shared
// tensor-core core (attention_int8.cuh, 2 pipeline stages so two blocks fit per SM); the output is
// normalised, multiplied by sigmoid(gate) and written as bf16. Tiles with the most keys start first.
// Each warp dequantizes the K/V bytes it uses in registers (the same code as decode), so the
// INT8->fp16 work is repeated per M-tile: at long contexts it, not the tensor cores, bounds speed.
#include "kernels/attention/attention_int8.cuh"
#include "kernels/launch_utils.cuh"

namespace lampo {

void attn_prefill_int8(const bf16* q, const bf16* gate, const int8_t* k_cache, const int8_t* v_cache,
                       const half* k_scale, const half* v_scale, int pos0, bf16* out, int T, int nq, int nkv,
                       int D, int context_max, cudaStream_t stream) {
    const char* op = "attn_prefill_int8";
    require(D == attn::D, op, "head dim must be 256 (the Qwen3.5/3.6 family), got " + std::to_string(D));
    require(nkv > 0 && nq % nkv == 0 && nq / nkv <= attn::MAX_ROWS, op, "nq must be a multiple of nkv, group <= 64");
    require(pos0 >= 0 && pos0 + T <= context_max, op,
            "positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + T - 1) + " exceed context_max " +
                std::to_string(context_max));
    if (T <= 0) return;
    attn::Params p{};
    p.q = q; p.gate = gate; p.k_cache = k_cache; p.v_cache = v_cache; p.k_scale = k_scale; p.v_scale = v_scale;
    p.nq = nq; p.nkv = nkv; p.group = nq / nkv; p.context_max = context_max; p.T = T;
    p.pos0 = pos0;
    p.tile_tokens = attn::MAX_ROWS / p.group;
    p.out = out;
    auto kernel = attn::attn_int8_kernel<4, 1, true>;
    const size_t smem = attn::smem_bytes(4, 1);
    allow_dynamic_smem(kernel, smem, op);
    kernel<<<dim3(ceil_div(T, p.tile_tokens), nkv), 4 * 32, smem, stream>>>(p);
    LAMPO_CHECK_LAUNCH(op);
}

}  // namespace lampo
