"""`lampo info MODEL [--context N] [--vram N]`: model shape, parameter counts and the GPU memory plan.

MODEL is a checkpoint directory (validated: every header is read, no tensor data), a config.json
(or a directory holding only one), or a preset name (`lampo.models.presets.PRESETS`). The plan has
one column per weight format (bf16 and the LQ recipes q5, q4); `--vram N` (a card's memory in GiB)
adds which formats fit such a card, with the longest context each allows, and the one to use.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from lampo.cli import context_tokens
from lampo.engine.cuda import chat_plan
from lampo.models.checkpoint import INDEX_NAME, SINGLE_NAME, Checkpoint, CheckpointError
from lampo.models.config import ConfigError, ModelConfig, load_config
from lampo.models.memory_plan import (
    CONTEXT_STEP,
    GIB,
    WEIGHT_FORMATS,
    MemoryPlan,
    format_plans_table,
    preferred_plan,
)
from lampo.models.params import count_params, short_count
from lampo.models.presets import PRESETS, get_preset

# A card's memory is more than the engine gets: the CUDA context and driver (~0.3-0.5 GiB) and, on a
# desktop, the display take their share first. `--vram` plans for the card minus this; at start-up
# the engine checks the memory actually free.
VRAM_HEADROOM_BYTES = GIB // 2


def _resolve(model: str | Path) -> tuple[ModelConfig, Checkpoint | None, str]:
    """(config, the opened checkpoint if MODEL is one, a label of where it came from)."""
    path = Path(model)
    if path.is_dir() and ((path / INDEX_NAME).is_file() or (path / SINGLE_NAME).is_file()):
        ckpt = Checkpoint.open(path)
        return ckpt.config, ckpt, f"checkpoint {path}"
    if path.is_dir() or path.is_file():
        return load_config(path), None, f"config {path / 'config.json' if path.is_dir() else path}"
    if str(model) in PRESETS:
        return get_preset(str(model)), None, f"preset {model}"
    raise ConfigError(f"{model!r} is not a checkpoint directory, a config.json or a preset ({', '.join(PRESETS)})")


def vram_gib(text: str) -> float:
    """`--vram N`: a card's memory in GiB, a finite number above the headroom (no unit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not VRAM_HEADROOM_BYTES / GIB < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected the card's memory in GiB, "
                                         f"a number above {VRAM_HEADROOM_BYTES / GIB:g} such as 24")
    return value


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _fit_line(plan: MemoryPlan, budget: int) -> str:
    """How `plan` (one weight format) fares in `budget` bytes: fits, fits a shorter context, or not."""
    tokens = plan.fitting_context_max(budget)
    if tokens == plan.context_max:
        return f"fits at {tokens:,} tokens: {_gib(plan.total_bytes)} of {_gib(budget)}"
    if tokens:
        return f"fits up to {tokens:,} tokens; {plan.context_max:,} would need {_gib(plan.total_bytes)}"
    smallest = plan.fixed_bytes + plan.kv_bytes_per_token * CONTEXT_STEP
    return f"does not fit: needs {_gib(smallest)} even at {CONTEXT_STEP:,} tokens"


def vram_advice(plans: list[MemoryPlan], vram: float) -> list[str]:
    """Lines saying how each plan (one per weight format, best first, at one context) fares on a
    card of `vram` GiB less VRAM_HEADROOM_BYTES, and which format to use."""
    budget = round(vram * GIB) - VRAM_HEADROOM_BYTES
    lines = [f"A card of {vram:g} GiB ({_gib(budget)} for Lampo, {_gib(VRAM_HEADROOM_BYTES)} kept for the driver "
             "and display):"]
    lines += [f"  {p.weight_format:<5} {_fit_line(p, budget)}" for p in plans]
    best = preferred_plan(plans, budget)
    context = plans[0].context_max
    tokens = best.fitting_context_max(budget) if best else 0
    if best is None:
        lines.append(f"recommended: none: no weight format fits in {_gib(budget)}, even at {CONTEXT_STEP:,} tokens")
    elif tokens == context:
        lines.append(f"recommended: {best.weight_format}, the best format that fits at {context:,} tokens")
    else:
        lines.append(f"recommended: {best.weight_format} with --context {tokens} (no format fits at {context:,} "
                     f"tokens; {best.weight_format} allows the longest context)")
    return lines


def describe(model: str | Path, context_max: int | None = None, vram: float | None = None) -> str:
    """Human-readable summary of MODEL, with the memory plan at `context_max` tokens (default: the
    model's max_position_embeddings) and, given `vram` (GiB), what fits such a card (`vram_advice`);
    raises ConfigError / CheckpointError / ValueError."""
    cfg, ckpt, source = _resolve(model)
    if context_max is None:
        context_max = cfg.max_position_embeddings
    counts = count_params(cfg)
    n_lin, n_full = len(cfg.linear_layer_ids), len(cfg.full_layer_ids)
    if cfg.is_moe:
        ffn = (f"MoE: {cfg.num_experts} experts, top-{cfg.num_experts_per_tok}, expert width "
               f"{cfg.moe_intermediate_size}, shared expert {cfg.shared_expert_intermediate_size}")
    else:
        ffn = f"dense SwiGLU, width {cfg.intermediate_size:,}"
    rows = [
        ("model", f"{cfg.model_type} ({source})"),
        ("layers", f"{cfg.num_hidden_layers} ({n_lin} Gated DeltaNet + {n_full} full attention)"),
        ("hidden", f"{cfg.hidden_size:,}"),
        ("attention", f"{cfg.num_attention_heads} query heads, {cfg.num_key_value_heads} KV heads × "
                      f"{cfg.head_dim} (rotary {cfg.rotary_dim}, theta {cfg.rope_theta:,.0f})"),
        ("Gated DeltaNet", f"{cfg.linear_num_key_heads} QK heads × {cfg.linear_key_head_dim}, "
                           f"{cfg.linear_num_value_heads} V heads × {cfg.linear_value_head_dim}, "
                           f"conv {cfg.linear_conv_kernel_dim}"),
        ("FFN", ffn),
        ("vocab", f"{cfg.vocab_size:,} rows ({cfg.real_vocab_size:,} real tokens)"),
        ("max context", f"{cfg.max_position_embeddings:,}"),
        ("MTP layers", str(cfg.mtp_num_hidden_layers)),
    ]
    if ckpt is not None:
        n_files = len(ckpt.shards())
        mtp = "with MTP" if ckpt.has_mtp else "without MTP"
        rows.append(("checkpoint", f"{len(ckpt.names())} tensors in {n_files} file{'s' if n_files != 1 else ''}, "
                                   f"{ckpt.total_bytes / 1e9:.2f} GB, {mtp}, {len(ckpt.ignored)} tensors ignored"))
        if ckpt.lq is not None:
            rows.append(("weights", f"converted, LQ recipe {ckpt.lq.recipe} ({ckpt.total_bytes / 1e9:.2f} GB packed)"))
        elif ckpt.fp8_block is not None:
            bo, bi = ckpt.fp8_block
            rows.append(("weights", f"FP8 (e4m3, {bo}x{bi} blocks): read as bf16, quantized to LQ on load "
                                    f"(or --weights bf16)"))
    with_mtp = ckpt.has_mtp if ckpt is not None else True
    rows += [
        ("params, text", f"{counts.total_text:,} ({short_count(counts.total_text)})"),
        ("params, MTP", f"{counts.mtp:,} ({short_count(counts.mtp)})"),
        ("params, active/token", f"{counts.active_per_token:,} ({short_count(counts.active_per_token)})"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    if ckpt is not None:
        lines += [f"note: {n}" for n in ckpt.notes]
    plans = [chat_plan(cfg, fmt, context_max, with_mtp) for fmt in WEIGHT_FORMATS]
    lines += ["", f"GPU memory plan of `lampo chat` at {context_max:,} tokens:",
              format_plans_table(plans, list(WEIGHT_FORMATS))]
    if vram is not None:
        lines += ["", *vram_advice(plans, vram)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lampo info", description=__doc__.splitlines()[0], exit_on_error=False)
    p.add_argument("model", help=f"checkpoint directory, config.json, or preset ({', '.join(PRESETS)})")
    p.add_argument("--context", type=context_tokens, metavar="N",
                   help="context length for the memory plan, in the range --context of `lampo chat` takes "
                   "(default: the model's max_position_embeddings)")
    p.add_argument("--vram", type=vram_gib, metavar="N",
                   help="a card's memory in GiB (e.g. 24): which weight formats fit it, with the longest "
                   f"context each allows, keeping {VRAM_HEADROOM_BYTES / GIB:g} GiB for the driver and display")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    except argparse.ArgumentError as e:  # a bad --context or --vram: one line, like every other error here
        print(f"lampo info: {e}", file=sys.stderr)
        return 2
    try:
        print(describe(args.model, args.context, args.vram))
    except (ConfigError, CheckpointError, ValueError) as e:
        print(f"lampo info: {e}", file=sys.stderr)
        return 2
    return 0
