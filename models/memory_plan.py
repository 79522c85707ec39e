"""GPU memory plan: what the engine allocates for a model at a given context, computed before
allocating so that it can print the plan and refuse clearly when it does not fit.

Items (architecture doc §5):
- weights, text and MTP: bf16 2 bytes per parameter (`params.count_params`), q5 and q4 the exact
  size of that LQ recipe (`quant.recipes.recipe_size`);
- KV cache: per full-attention layer (and the MTP layer) and token, K and V of nkv heads × D values;
  `int8` stores 1 byte per value plus one fp16 scale per 64 values, `bf16` 2 bytes per value;
- GDN recurrent state: per GDN layer Hv × dk × dv fp32; conv windows: conv_dim × (K−1) bf16;
- state snapshot slots (turn-boundary reuse): one more copy of both GDN states per slot;
- a verify window's rows: the conv state after each row (the recurrent state is one, rebuilt
  from the rows' records, `gdn_records_bytes`);
- activations for one prefill chunk of T tokens, T × `activation_bytes_per_token` (see there),
  plus logits and sampling scratch for the rows that need them;
- CUDA graphs and a runtime reserve: fixed estimates (graph executables and their pools; kernel
  modules loaded lazily, allocator granularity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lampo.models.config import ModelConfig
from lampo.models.params import count_params, short_count
from lampo.models.quant.recipes import active_bytes_per_token, get_recipe, recipe_size

GIB = 1 << 30
MIB = 1 << 20
WEIGHT_FORMATS = ("bf16", "q5", "q4")  # best quality first; q5 and q4 are LQ recipes (quant/recipes.py)
KV_FORMATS = ("int8", "bf16")
KV_SCALE_GROUP = 64  # int8 KV: one fp16 scale per this many values of a head row
DEFAULT_PREFILL_CHUNK = 2048
GDN_CHUNK = 64  # chunked gated-delta-rule block length
PRENORM_STRIP = 16  # rows per fp32 strip sum of squares of the normed rows (linear.h PRENORM_STRIP)
CUDA_GRAPHS_BYTES = 64 * MIB
RUNTIME_RESERVE_BYTES = 256 * MIB
CONTEXT_STEP = 1024  # suggested contexts are multiples of this


@dataclass(frozen=True)
class MemoryItem:
    name: str
    bytes: int
    note: str = ""


def kv_bytes_per_token_per_layer(cfg: ModelConfig, kv: str) -> int:
    """K and V rows of one attention layer for one token."""
    if kv == "int8":
        row = cfg.head_dim + 2 * math.ceil(cfg.head_dim / KV_SCALE_GROUP)
    elif kv == "bf16":
        row = 2 * cfg.head_dim
    else:
        raise ValueError(f"memory plan: kv must be one of {', '.join(KV_FORMATS)}, got {kv!r}")
    return 2 * cfg.num_key_value_heads * row


def gdn_state_bytes(cfg: ModelConfig) -> tuple[int, int]:
    """(recurrent state fp32, conv windows bf16) over all GDN layers."""
    n = len(cfg.linear_layer_ids)
    recurrent = n * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = n * cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * 2
    return recurrent, conv


def gdn_records_bytes(cfg: ModelConfig, verify_rows: int) -> int:
    """A verify window's per-token GDN records over all GDN layers (the engine's GdnStates::records):
    per row the normed key of each key head, beta * e of each value head (fp32, 128 each) and the value
    heads' decays, padded to 4 floats; each layer's rows padded to 256 bytes."""
    if verify_rows <= 0:
        return 0
    floats = (cfg.linear_num_key_heads + cfg.linear_num_value_heads) * cfg.linear_key_head_dim
    floats += -(-cfg.linear_num_value_heads // 4) * 4
    per_layer = -(-verify_rows * floats * 4 // 256) * 256
    return len(cfg.linear_layer_ids) * per_layer


def activation_bytes_per_token(cfg: ModelConfig, mtp: bool = False) -> dict[str, int]:
    """Live activation bytes per prefill token, by buffer (bf16 = 2 B, fp32 = 4 B). Buffers are
    reused across layers, so each term is the widest layer kind's need:
    - residual: the residual stream in fp32 and the sublayer output added to it (2 × 4H);
    - normed: the normed sublayer input, bf16, and its strip sums of squares, fp32 per 16 (2H + H/4);
    - projections: mixer input projections, bf16: GDN qkv + z + a + b, or attention q|gate + k + v;
    - mixer: fp32 mixer internals: GDN conv output + core output, or the attention output;
    - gdn_chunk: chunked delta-rule workspace per V head: a C×C block, U [C, dv], W [C, dk] per C tokens;
    - ffn: dense gate|up + activation (3I, bf16); MoE: k experts' gate|up + activation (3·k·I) and
      the shared expert's (3S) in bf16, router logits (fp32 E) and k weighted expert outputs (fp32 k·H);
    - mtp (with the MTP module): the trunk's final hidden rows and the MTP fc input [2H], bf16 (6H).
    """
    h = cfg.hidden_size
    if cfg.is_moe:
        k = cfg.num_experts_per_tok
        ffn = (2 * (3 * k * cfg.moe_intermediate_size + 3 * cfg.shared_expert_intermediate_size)
               + 4 * cfg.num_experts + 4 * k * h)
    else:
        ffn = 2 * 3 * cfg.intermediate_size
    return {
        "residual": 2 * 4 * h,
        "normed": 2 * h + 4 * (h // PRENORM_STRIP),
        "projections": 2 * max(cfg.gdn_proj_rows, cfg.attn_proj_rows),
        "mixer": 4 * max(cfg.conv_dim + cfg.value_dim, cfg.attn_inner),
        "gdn_chunk": 4 * cfg.linear_num_value_heads * (GDN_CHUNK + cfg.linear_key_head_dim + cfg.linear_value_head_dim),
        "ffn": ffn,
        **({"mtp": 2 * 3 * h} if mtp else {}),
    }


def weight_bytes(cfg: ModelConfig, weights: str) -> tuple[int, int]:
    """(text, MTP) weight bytes of `cfg` in a WEIGHT_FORMATS format."""
    if weights == "bf16":
        counts = count_params(cfg)
        return 2 * counts.total_text, 2 * counts.mtp
    size = recipe_size(get_recipe(weights), cfg)
    return int(size.text_bytes), int(size.mtp_bytes)


def active_weight_bytes(cfg: ModelConfig, weights: str) -> int:
    """Weight bytes one decoded token reads in a WEIGHT_FORMATS format (the roofline's weights)."""
    if weights == "bf16":
        return 2 * count_params(cfg).active_per_token
    return int(active_bytes_per_token(get_recipe(weights), cfg))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _fmt(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= 100 * MIB:
        return f"{n / MIB:.0f} MiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / 1024:.1f} KiB"


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    context_max: int
    weight_format: str  # a WEIGHT_FORMATS name
    kv: str
    items: tuple[MemoryItem, ...]
    kv_bytes_per_token: int  # trunk + MTP KV bytes per token of context

    @property
    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def fixed_bytes(self) -> int:
        """Everything but the KV cache (the activations, sized for this plan's context, included)."""
        return self.total_bytes - self.kv_bytes_per_token * self.context_max

    def item(self, name: str) -> MemoryItem:
        for i in self.items:
            if i.name == name:
                return i
        raise KeyError(f"memory plan has no item {name!r}")

    def fitting_context_max(self, free_bytes: int) -> int:
        """The largest context that fits in `free_bytes`: this plan's own if the plan fits, else
        a multiple of CONTEXT_STEP (0: not even CONTEXT_STEP tokens)."""
        tokens = (free_bytes - self.fixed_bytes) // self.kv_bytes_per_token
        return self.context_max if tokens >= self.context_max else max(0, tokens // CONTEXT_STEP * CONTEXT_STEP)

    def fits(self, free_bytes: int) -> tuple[bool, str]:
        """Whether the plan fits in `free_bytes`, and a one-paragraph explanation with numbers."""
        total = self.total_bytes
        if total <= free_bytes:
            return True, (f"memory plan {_fmt(total)} fits in {_fmt(free_bytes)} free "
                          f"({_fmt(free_bytes - total)} spare)")
        weights = sum(i.bytes for i in self.items if i.name.startswith("weights"))
        kv = total - self.fixed_bytes
        other = self.fixed_bytes - weights
        msg = (f"not enough GPU memory: the plan needs {_fmt(total)} but only {_fmt(free_bytes)} is free "
               f"(weights {_fmt(weights)} in {self.weight_format}, KV cache {_fmt(kv)} for "
               f"{self.context_max:,} tokens ({self.kv}), state/activations/reserve {_fmt(other)}); ")
        best = self.fitting_context_max(free_bytes)
        if best > 0:
            return False, msg + f"try --context {best} (the largest that fits)"
        return False, msg + "the weights and fixed buffers alone do not fit, even with a tiny --context"

    def format_table(self) -> str:
        return format_plans_table([self], [self.weight_format])


def format_plans_table(plans: list[MemoryPlan], headers: list[str]) -> str:
    """Aligned text table: one row per item, one column per plan (headers), then the item's note."""
    names = list(dict.fromkeys(i.name for p in plans for i in p.items))
    rows = [["", *headers, ""]]
    for name in names:
        present = [next((i for i in p.items if i.name == name), None) for p in plans]
        note = next(i.note for i in present if i is not None)
        rows.append([name, *[_fmt(i.bytes) if i else "-" for i in present], note])
    rows.append(["total", *[_fmt(p.total_bytes) for p in plans], ""])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = []
    for r in rows:
        cols = [r[0].ljust(widths[0])] + [r[c].rjust(widths[c]) for c in range(1, len(r) - 1)] + [r[-1]]
        lines.append("  ".join(cols).rstrip())
    return "\n".join(lines)


def preferred_plan(plans: list[MemoryPlan], free_bytes: int) -> MemoryPlan | None:
    """Of `plans` (one model at one context, in order of preference), the first that fits in
    `free_bytes`, else the one that allows the longest context (the earlier on a tie); None when
    none allows CONTEXT_STEP tokens."""
    best = max(plans, key=lambda p: p.fitting_context_max(free_bytes))
    return best if best.fitting_context_max(free_bytes) else None


def plan_memory(
    cfg: ModelConfig,
    context_max: int | None = None,
    weights: str = "bf16",
    kv: str = "int8",
    with_mtp: bool = True,
    snapshot_slots: int = 0,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    verify_rows: int = 0,
) -> MemoryPlan:
    """The memory plan of `cfg` at `context_max` tokens (default: the model's
    max_position_embeddings). `weights`: a WEIGHT_FORMATS name; `snapshot_slots`: GDN state
    snapshots (turn reuse); `prefill_chunk`: tokens per prefill call; `verify_rows`: the most tokens
    of a verify window, whose logits rows, conv states and GDN records the engine keeps."""
    if context_max is None:
        context_max = cfg.max_position_embeddings
    if not 1 <= context_max <= cfg.max_position_embeddings:
        raise ValueError(f"memory plan: context_max must be in 1..{cfg.max_position_embeddings:,}, "
                         f"got {context_max:,}")
    if snapshot_slots < 0 or prefill_chunk < 1 or verify_rows < 0:
        raise ValueError(f"memory plan: snapshot_slots and verify_rows must be >= 0 and prefill_chunk >= 1 "
                         f"(got {snapshot_slots}, {verify_rows}, {prefill_chunk})")
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"memory plan: unknown weight format {weights!r} (formats: {', '.join(WEIGHT_FORMATS)})")
    mtp = with_mtp and cfg.mtp_num_hidden_layers > 0
    counts = count_params(cfg)
    text_bytes, mtp_bytes = weight_bytes(cfg, weights)
    per_layer_kv = kv_bytes_per_token_per_layer(cfg, kv)
    n_full = len(cfg.full_layer_ids)
    recurrent, conv = gdn_state_bytes(cfg)
    act = activation_bytes_per_token(cfg, mtp)
    chunk = min(prefill_chunk, context_max)
    logit_rows = max(verify_rows, 1)
    # fp32 logits of the rows that need them, plus sampling scratch (sort keys and ids) for one row
    logits = 4 * logit_rows * cfg.vocab_size + 8 * cfg.vocab_size

    items = [MemoryItem("weights (text)", text_bytes, f"{short_count(counts.total_text)} params")]
    if mtp:
        items.append(MemoryItem("weights (MTP)", mtp_bytes, f"{short_count(counts.mtp)} params"))
    items.append(MemoryItem("KV cache (trunk)", n_full * per_layer_kv * context_max,
                            f"{_plural(n_full, 'layer')} × {_plural(cfg.num_key_value_heads, 'KV head')} × "
                            f"{cfg.head_dim}, {kv}, {context_max:,} tokens"))
    if mtp:
        items.append(MemoryItem("KV cache (MTP)", cfg.mtp_num_hidden_layers * per_layer_kv * context_max,
                                f"{_plural(cfg.mtp_num_hidden_layers, 'layer')}, {kv}"))
    items.append(MemoryItem("GDN recurrent state", recurrent,
                            f"{_plural(len(cfg.linear_layer_ids), 'layer')} × {_plural(cfg.linear_num_value_heads, 'head')} × "
                            f"{cfg.linear_key_head_dim}×{cfg.linear_value_head_dim} fp32"))
    items.append(MemoryItem("GDN conv windows", conv, f"{cfg.conv_dim} channels × {cfg.linear_conv_kernel_dim - 1} bf16"))
    if snapshot_slots:
        items.append(MemoryItem("GDN state snapshots", snapshot_slots * (recurrent + conv),
                                f"{_plural(snapshot_slots, 'slot')} × (recurrent + conv)"))
    if verify_rows:
        items.append(MemoryItem("GDN conv ring", verify_rows * conv, f"{_plural(verify_rows, 'row')} × conv windows"))
    if records := gdn_records_bytes(cfg, verify_rows):
        items.append(MemoryItem("GDN window records", records,
                                f"{_plural(verify_rows, 'row')} × (keys, beta e, decays) fp32"))
    items.append(MemoryItem("activations", chunk * sum(act.values()) + logits,
                            f"prefill chunk {chunk:,} × {sum(act.values()) / 1024:.0f} KiB + logits"))
    items.append(MemoryItem("CUDA graphs", CUDA_GRAPHS_BYTES, "estimate"))
    items.append(MemoryItem("runtime reserve", RUNTIME_RESERVE_BYTES, "lazy kernel modules, allocator slack"))
    kv_per_token = (n_full + (cfg.mtp_num_hidden_layers if mtp else 0)) * per_layer_kv
    return MemoryPlan(cfg.name, context_max, weights, kv, tuple(items), kv_per_token)
