"""How much the LQ format changes a model: the weight error per tensor class, and the next-token
distribution of the quantized model against the bf16 one, for Lampo's quantizer and for the
round-to-nearest baseline at the same widths (the same codes + fp16 scale per 64 weights, so the
same bits per weight).

A variant is a recipe (`recipes.RECIPES`: q5, q4) with a method (`METHODS`: `lq` the format's
quantizer `quantizer.quantize`, `rtn` the baseline `quantizer.round_to_nearest`): every tensor
that `recipes.tensor_bits` gives a width is replaced by its quantize-dequantize round trip
(`layout.values` of its codes and scales); the others (norms, conv, router, shared-expert gate)
stay as they are. The "bf16" model is the original weights. Both run through the numpy reference
(`ReferenceModel`) over the same token ids; the MTP module is left out (it is no part of the
next-token distribution), so class `mtp` is not measured.

- `relative_error` rows: per (class, width) sqrt(sum ||W_hat - W||^2 / sum ||W||^2) over every
  tensor of the class, for lq and rtn.
- `next_token` rows: per variant, mean and max over positions of KL(bf16 || quant) in nats,
  top-1 agreement %, the relative error of the final-normed hidden rows (what the layers did to
  the weight errors), the recipe's bits per weight for this config, and the bf16 model's own mean
  entropy (how peaked its distributions are, which decides what a KL or a top-1 flip means).

On synthetic checkpoints (`synthetic.synthetic_tensor`) the weights are random, not trained:
i.i.d. Gaussian matrices of std 1/sqrt(fan_in) and an N(0, 1) embedding. These numbers measure
the format on that distribution, not the quality of a quantized Qwen3.6. `--model DIR` measures a
checkpoint instead (the trained measurement model of tests/gpu/train_measure_model.py), on text
it never saw.

`--fp8-source BLOCK` measures what starting from an FP8 release costs: the variants quantize the
weights' round trip through block-scaled FP8 (`fp8_release.fp8_round_trip`, the tensors the
releases store in FP8), a first row is that round trip alone, and both rows and errors are still
against the original weights.

CLI: python -m lampo.models.quant.quality (--preset NAME [--layers N] [--vocab N] [--experts N]
     [--seed S] | --model DIR) [--tokens N] [--text FILE] [--fp8-source BLOCK] --json OUT
(--vocab / --experts cut the vocabulary / routed experts as tests/gpu/full_width.py does.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from lampo.models.config import ModelConfig
from lampo.models.fp8_release import fp8_round_trip
from lampo.models.presets import PRESETS, get_preset
from lampo.models.quant import layout, quantizer
from lampo.models.quant.recipes import BF16, CLASSES, RECIPES, get_recipe, recipe_size, tensor_bits, tensor_classes
from lampo.models.reference.model import ReferenceModel
from lampo.models.synthetic import synthetic_tensor
from lampo.models.tensor_specs import expected_tensors
from lampo.models.tokenizer import Tokenizer
from lampo.models.tokenizer_build import build_tokenizer

METHODS = {"lq": quantizer.quantize, "rtn": quantizer.round_to_nearest}
VARIANTS = tuple((recipe, method) for method in METHODS for recipe in RECIPES)


def model_config(preset: str, layers: int | None = None, vocab: int | None = None,
                 experts: int | None = None) -> ModelConfig:
    """A preset, optionally cut to its first `layers` layers, a `vocab`-row vocabulary and (MoE)
    `experts` routed experts."""
    cfg = get_preset(preset)
    if layers is not None:
        cfg = cfg.with_layers(layers)
    if vocab is not None:
        cfg = replace(cfg, vocab_size=vocab)
    if experts is not None and cfg.is_moe:
        cfg = replace(cfg, num_experts=experts)
    cfg.validate()
    return cfg


def synthetic_weights(cfg: ModelConfig, seed: int = 0, mtp: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the text model (and the MTP layer's with `mtp`) as float32: the values
    `write_checkpoint(cfg, seed)` stores."""
    return {n: synthetic_tensor(n, s, seed) for n, s in expected_tensors(cfg, include_mtp=mtp).items()}


def checkpoint_weights(model_dir: Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """The config and every text-model tensor (no MTP) of a checkpoint, as float32."""
    from lampo.models.checkpoint import Checkpoint

    with Checkpoint.open(model_dir, include_mtp=False) as ck:
        return ck.config, {n: np.array(ck.tensor_f32(n)) for n in ck.names()}


def text_tokens(path: Path, count: int, vocab: int, tokenizer: Tokenizer | None = None) -> np.ndarray:
    """The first `count` token ids of a text file (`tokenizer`, default the Qwen3.6 tokenizer
    built from its package), folded modulo `vocab` for a model with a cut vocabulary (with random
    weights an id only picks an embedding row)."""
    tokenizer = tokenizer or Tokenizer(build_tokenizer())
    ids = tokenizer.encode(Path(path).read_text(encoding="utf-8"))
    if len(ids) < count:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than the {count} asked for")
    return np.asarray(ids[:count], dtype=np.int64) % vocab


def reference_run(cfg: ModelConfig, weights: Mapping[str, np.ndarray],
                  ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference over `ids` from position 0: (log P(next token | ids[:t+1]) for every position
    t, float64 [T, real vocab]; the final-normed hidden rows, [T, H])."""
    model = ReferenceModel(cfg, weights)
    logits = model.prefill(ids)[:, : cfg.real_vocab_size].astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True)), model.hiddens


def mean_entropy(logp: np.ndarray) -> float:
    """Mean over rows of the entropy (nats) of the distributions exp(logp)."""
    return float(-(np.exp(logp) * logp).sum(axis=1).mean())


def compare(ref: tuple[np.ndarray, np.ndarray], run: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """Two `reference_run` results: KL(ref || run) per position (nats), its mean and max; top-1
    agreement %; the relative error ||h_run - h_ref|| / ||h_ref|| of the final-normed hiddens."""
    (ref_logp, ref_h), (logp, h) = ref, run
    kl = (np.exp(ref_logp) * (ref_logp - logp)).sum(axis=1)
    return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "top1_pct": float(100 * np.mean(ref_logp.argmax(axis=1) == logp.argmax(axis=1))),
            "hidden_rel_err": float(np.linalg.norm(h - ref_h) / np.linalg.norm(ref_h))}


class RoundTrips:
    """The quantized weights of each variant of a model. Each (tensor, width, method) is quantized
    once (tensors in parallel threads: numpy releases the GIL); its codes and scales are kept only
    until the last variant in `VARIANTS` order that uses them, and its squared error and squared
    norm are kept for `error_rows`."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray],
                 source: Mapping[str, np.ndarray] | None = None):
        self.weights = weights  # what the errors are measured against
        self.source = weights if source is None else source  # what is quantized
        self.classes = tensor_classes(cfg)
        self.widths = {recipe: {n: b for n, b in tensor_bits(get_recipe(recipe), cfg).items()
                                if n in weights and b != BF16} for recipe in RECIPES}
        self._uses = Counter((n, b, m) for r, m in VARIANTS for n, b in self.widths[r].items())
        self._kept: dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray]] = {}
        self.sq: dict[tuple[str, int, str], tuple[float, float]] = {}  # -> (||W_hat - W||^2, ||W||^2)

    def variant(self, recipe: str, method: str) -> dict[str, np.ndarray]:
        """The model's weights with every tensor of the recipe replaced by its round trip."""
        widths = self.widths[recipe]
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            trips = dict(zip(widths, pool.map(lambda n: self._round_trip(n, widths[n], method), widths)))
        for key in [(n, b, method) for n, b in widths.items()]:
            self._uses[key] -= 1
            if not self._uses[key]:
                self._kept.pop(key, None)
        return {**self.source, **trips}

    def _round_trip(self, name: str, bits: int, method: str) -> np.ndarray:
        w, src = self.weights[name], self.source[name]
        key = (name, bits, method)
        if key in self._kept:
            return layout.values(*self._kept[key], bits).reshape(w.shape)
        # a bank [E, N, K] is the matrix [E*N, K]: its groups lie along rows either way
        codes, scales = METHODS[method](src.reshape(-1, w.shape[-1]), bits)
        w_hat = layout.values(codes, scales, bits).reshape(w.shape)
        self.sq[key] = (_sum_sq(w_hat - w), _sum_sq(w))
        if self._uses[key] > 1:
            self._kept[key] = (codes, scales)
        return w_hat

    def error_rows(self) -> list[dict]:
        """Per (class, width), in `recipes.CLASSES` order and widest first: the relative weight
        error of each method over the class's tensors at that width."""
        err, norm, names = Counter(), Counter(), {}
        for (name, bits, method), (e, n) in self.sq.items():
            cls = self.classes[name]
            err[cls, bits, method] += e
            norm[cls, bits, method] += n
            names.setdefault((cls, bits), set()).add(name)
        return [{"part": "relative_error", "class": cls, "bits": bits, "tensors": len(ns),
                 "weights": sum(self.weights[n].size for n in ns),
                 **{m: float(np.sqrt(err[cls, bits, m] / norm[cls, bits, m])) for m in METHODS}}
                for (cls, bits), ns in sorted(names.items(), key=lambda kv: (CLASSES.index(kv[0][0]), -kv[0][1]))]


def _sum_sq(a: np.ndarray) -> float:
    """sum(a**2), accumulated in float64 (einsum casts in buffers, never a float64 copy of `a`)."""
    flat = a.reshape(-1)
    return float(np.einsum("i,i->", flat, flat, dtype=np.float64))


def fp8_weights(cfg: ModelConfig, weights: Mapping[str, np.ndarray], block: tuple[int, int]) -> dict[str, np.ndarray]:
    """The weights as Lampo reads them from an FP8 release of them (`fp8_release`)."""
    specs = expected_tensors(cfg)
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return dict(zip(weights, pool.map(lambda n: fp8_round_trip(n, specs[n], weights[n], block), weights)))


def evaluate(cfg: ModelConfig, weights: Mapping[str, np.ndarray], ids: np.ndarray,
             fp8_block: tuple[int, int] | None = None) -> list[dict]:
    """The `next_token` row of every variant, then the `relative_error` rows (module docstring).
    With `fp8_block` the variants quantize the weights' FP8 round trip (what an FP8 release holds)
    and a first row, recipe "fp8", is that round trip itself; every row still compares with the
    original weights."""
    ref = reference_run(cfg, weights, ids)
    entropy = mean_entropy(ref[0])
    rows = []
    source = None
    if fp8_block is not None:
        source = fp8_weights(cfg, weights, fp8_block)
        rows.append({"part": "next_token", "recipe": "fp8", "method": "e4m3", "bpw": 8.0,
                     **compare(ref, reference_run(cfg, source, ids)), "bf16_entropy": entropy})
    trips = RoundTrips(cfg, weights, source)
    for recipe, method in VARIANTS:
        start = time.monotonic()
        stats = compare(ref, reference_run(cfg, trips.variant(recipe, method), ids))
        rows.append({"part": "next_token", "recipe": recipe, "method": method,
                     "source": "bf16" if fp8_block is None else "fp8",
                     "bpw": round(recipe_size(get_recipe(recipe), cfg).text_bpw, 3), **stats,
                     "bf16_entropy": entropy, "seconds": round(time.monotonic() - start, 1)})
    return rows + trips.error_rows()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lampo.models.quant.quality", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=PRESETS, help="synthetic weights of a preset's shapes")
    src.add_argument("--model", type=Path, help="a bf16 checkpoint directory")
    p.add_argument("--layers", type=int, help="keep the first N layers")
    p.add_argument("--vocab", type=int, help="cut the vocabulary to N rows")
    p.add_argument("--experts", type=int, help="keep N routed experts (MoE)")
    p.add_argument("--seed", type=int, default=0, help="synthetic weights' seed (default 0)")
    p.add_argument("--tokens", type=int, default=256, help="positions compared (default 256)")
    p.add_argument("--text", type=Path, default=Path("README.md"), help="text tokenized (default README.md)")
    p.add_argument("--fp8-source", type=int, metavar="BLOCK",
                   help="quantize the weights' round trip through FP8 in BLOCK x BLOCK blocks (an FP8 release)")
    p.add_argument("--json", type=Path, required=True, help="where the result goes")
    args = p.parse_args(argv)
    start = time.monotonic()
    try:
        tokenizer = None
        if args.model is not None:
            cfg, weights = checkpoint_weights(args.model)
            tokenizer = Tokenizer.from_checkpoint(args.model)  # its own tokenizer.json
        else:
            cfg = model_config(args.preset, args.layers, args.vocab, args.experts)
            weights = synthetic_weights(cfg, args.seed)
        ids = text_tokens(args.text, args.tokens, cfg.real_vocab_size, tokenizer)
    except (ValueError, OSError) as e:  # ConfigError and CheckpointError included
        print(f"quality: {e}", file=sys.stderr)
        return 2
    rows = evaluate(cfg, weights, ids, (args.fp8_source, args.fp8_source) if args.fp8_source else None)
    doc = {"model": cfg.name or str(args.model), "weights": "checkpoint" if args.model else "synthetic",
           "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
           "vocab": cfg.vocab_size, "experts": cfg.num_experts, "seed": args.seed, "tokens": args.tokens,
           "text": str(args.text), "fp8_source": args.fp8_source, "seconds": round(time.monotonic() - start, 1), "rows": rows}
    args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
