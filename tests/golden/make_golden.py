"""Generate the HF-transformers golden fixtures for the numpy reference (tests/test_golden.py).

Run:  python tests/golden/make_golden.py      (in an environment with torch (CPU) + transformers 5.17)
Needs only torch, transformers and numpy (not lampo). Writes tests/fixtures/golden/{dense,moe}.npz.

For a tiny Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM (real per-head dims: head_dim 256 with
partial rotary 0.25, GDN dk = dv = 128, conv 4; hidden 16; layers [lin, lin, lin, full]; vocab 512;
both attention and GDN heads grouped 2:1 so head-mapping mistakes show) in fp32 with EVERY weight
randomised to O(1)-scale values (norm weights, A_log, dt_bias and conv weights included; HF would
init norms to 0/1), the script records through HF's eager attention and pure-torch GDN/conv paths:
  prefill   one call over a 160-token prompt (chunks 64 + 64 + 32), logits of `stored_rows`;
  decode    16 greedy steps, one token at a time through the DynamicCache;
  turn      one more multi-token call (11 tokens) on top of that cache (chunked GDN with a state);
  mtp       a torch MTP head built from HF's own full-attention decoder layer (§4.7): prefill
            alignment over the prompt (tokens shifted by one, hiddens h_0..h_n after model.norm,
            positions 0..n) plus one chained step (its own output hidden and its argmax draft at
            position n+1), logits of `stored_rows` (always including both last rows).
npz keys: config_json (HF text_config), transformers_version, torch_version, "w:<name>" weights under
checkpoint names (model.language_model.*, lm_head.weight, mtp.*), stored float16 (the values are
fp16-exact, rounded before running HF, so the fp32 model sees exactly them), prompt_ids,
prefill_rows, prefill_logits [R, V], decode_tokens [S] (token fed at step i; decode_tokens[0] is the prefill's
argmax), decode_logits [S, V], turn_ids, turn_logits, mtp_next_ids, mtp_hiddens [T+1, H]
(the MTP input hiddens: trunk h_0..h_n, then the chained d_n), mtp_rows, mtp_logits [R', V].
Logits are float32.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

os.environ["USE_HUB_KERNELS"] = "0"  # no hub kernels: HF's pure-torch reference paths only

import numpy as np
import torch
import transformers
from torch import nn
from transformers import (
    DynamicCache,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
)
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

OUT_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
PROMPT_LEN = 160
DECODE_STEPS = 16
TURN_LEN = 11
VOCAB = 512
HIDDEN = 16


def stored_rows(n: int) -> np.ndarray:
    """Rows whose logits are stored (to keep fixtures small): every 8th, both sides of each
    64-token chunk boundary, and the last two."""
    edges = {r for b in range(64, n, 64) for r in (b - 2, b - 1, b, b + 1)}
    return np.array(sorted({r for r in (set(range(0, n, 8)) | edges | {1, n - 2, n - 1}) if 0 <= r < n}), np.int32)


def text_config(moe: bool) -> dict:
    cfg = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
    }
    if moe:
        cfg.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    else:
        cfg["intermediate_size"] = 64
    return cfg


def hf_config(cfg: dict):
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}  # the class fixes model_type
    cls = Qwen3_5MoeTextConfig if cfg["model_type"].startswith("qwen3_5_moe") else Qwen3_5TextConfig
    return cls(**kwargs, attn_implementation="eager")  # plain matmul + fp32 softmax (sdpa is the default)


class Mtp(nn.Module):
    """§4.7 on top of HF's own full-attention decoder layer; attribute names = checkpoint names."""

    def __init__(self, config, layer_cls):
        super().__init__()
        h = config.hidden_size
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=config.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        full_idx = config.layer_types.index("full_attention")
        self.layers = nn.ModuleList([layer_cls(config, full_idx)])
        self.norm = Qwen3_5RMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, next_embeds, hiddens, position_embeddings):
        """Whole-sequence causal pass (== a cached MTP run row by row) at positions 0..T-1."""
        T = hiddens.shape[1]
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hiddens)], dim=-1))
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=mask)
        return self.norm(u)


def randomise(module: nn.Module, gen: torch.Generator) -> None:
    """O(1)-scale random values for every parameter, rounded to fp16-exact fp32."""
    for name, p in module.named_parameters():
        shape = p.shape
        leaf = name.rsplit(".", 1)[-1] if not name.endswith(".weight") else name.rsplit(".", 2)[-2]

        def normal(std):
            return torch.randn(shape, generator=gen) * std

        if name.endswith("A_log"):
            val = torch.log(torch.empty(shape).uniform_(0.002, 0.6, generator=gen))
        elif name.endswith("dt_bias"):
            val = normal(1.0)
        elif leaf == "conv1d":
            val = normal(0.5)
        elif name.endswith("linear_attn.norm.weight"):
            val = 1.0 + normal(0.3)  # plain-weight gated norm
        elif "norm" in leaf:
            val = normal(0.3)  # zero-centred (1 + w) norms
        elif leaf == "embed_tokens":
            val = normal(1.0)
        else:  # projections, expert banks, router, lm_head: [out, in] (banks [E, out, in])
            val = normal(1.0 / np.sqrt(shape[-1]))
        with torch.no_grad():
            p.copy_(val.half().float())


def checkpoint_weights(model: nn.Module, mtp: Mtp) -> dict[str, np.ndarray]:
    out = {}
    for name, t in model.state_dict().items():
        ck = "model.language_model." + name[len("model."):] if name.startswith("model.") else name
        out[ck] = t.numpy().astype(np.float16)
    for name, t in mtp.state_dict().items():
        out["mtp." + name] = t.numpy().astype(np.float16)
    return out


def generate(moe: bool, seed: int) -> dict[str, np.ndarray]:
    cfg = text_config(moe)
    config = hf_config(cfg)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM)(config).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    mtp = Mtp(config, Qwen3_5MoeDecoderLayer if moe else Qwen3_5DecoderLayer).eval()
    randomise(model, gen)
    randomise(mtp, gen)

    final_hidden = []
    model.model.norm.register_forward_hook(lambda _m, _i, out: final_hidden.append(out.detach()))

    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen)
    turn = torch.randint(0, VOCAB, (TURN_LEN,), generator=gen)
    with torch.no_grad():
        cache = DynamicCache(config=config)
        out = model(input_ids=prompt[None], past_key_values=cache, use_cache=True)
        prefill_logits = out.logits[0]
        prompt_hidden = final_hidden[-1][0]

        tokens, step_logits = [int(prefill_logits[-1].argmax())], []
        for _ in range(DECODE_STEPS):
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            step_logits.append(out.logits[0, -1])
            tokens.append(int(out.logits[0, -1].argmax()))
        tokens = tokens[:DECODE_STEPS]
        assert cache.get_seq_length() == PROMPT_LEN + DECODE_STEPS

        turn_logits = model(input_ids=turn[None], past_key_values=cache, use_cache=True).logits[0]

        # MTP, prefill alignment: row t = (h_t, x_{t+1}) at position t; x_{n+1} = the prefill's argmax.
        embed = model.model.embed_tokens
        next_ids = torch.cat([prompt[1:], torch.tensor([tokens[0]])])
        rope = model.model.rotary_emb

        def run_mtp(ids, hiddens):
            pos = torch.arange(len(ids)).view(1, 1, -1).expand(3, 1, -1)
            pe = rope(hiddens[None], pos)
            d = mtp(embed(ids)[None], hiddens[None], pe)[0]
            return d, model.lm_head(d)

        d, _ = run_mtp(next_ids, prompt_hidden)
        draft = int(model.lm_head(d[-1]).argmax())
        mtp_ids = torch.cat([next_ids, torch.tensor([draft])])  # chained step: (d_n, draft) at n+1
        mtp_hiddens = torch.cat([prompt_hidden, d[-1:]])
        _, mtp_logits = run_mtp(mtp_ids, mtp_hiddens)

    fixture = {
        "config_json": np.array(json.dumps(cfg)),
        "transformers_version": np.array(transformers.__version__),
        "torch_version": np.array(torch.__version__),
        "prompt_ids": prompt.numpy().astype(np.int32),
        "prefill_rows": stored_rows(PROMPT_LEN),
        "prefill_logits": prefill_logits.numpy()[stored_rows(PROMPT_LEN)].astype(np.float32),
        "decode_tokens": np.array(tokens, dtype=np.int32),
        "decode_logits": torch.stack(step_logits).numpy().astype(np.float32),
        "turn_ids": turn.numpy().astype(np.int32),
        "turn_logits": turn_logits.numpy().astype(np.float32),
        "mtp_next_ids": mtp_ids.numpy().astype(np.int32),
        "mtp_hiddens": mtp_hiddens.numpy().astype(np.float32),
        "mtp_rows": stored_rows(PROMPT_LEN + 1),
        "mtp_logits": mtp_logits.numpy()[stored_rows(PROMPT_LEN + 1)].astype(np.float32),
    }
    fixture.update({"w:" + k: v for k, v in checkpoint_weights(model, mtp).items()})
    return fixture


def main() -> None:
    for package in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            raise SystemExit(f"{package} is installed: HF would use fused kernels, not its torch reference paths")
    torch.set_default_dtype(torch.float32)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, moe, seed in (("dense", False, 1234), ("moe", True, 5678)):
        path = OUT_DIR / f"{name}.npz"
        np.savez_compressed(path, **generate(moe, seed))
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
