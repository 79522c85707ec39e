"""How many distinct experts a verify window of T consecutive tokens reads, with a model's own
routing on real text, against independent uniform routing of the same shape.

A MoE verify window reads each (token, expert) pair's matrices; an expert chosen by several of
its tokens could be read once (docs/design/speculative.md). Under uniform routing each token picks
k of E experts, so a window of T tokens reads on average E (1 - (1 - k/E)^T) distinct experts
(`uniform_distinct`), nearly T k for the 35B-A3B's E = 256, k = 8. A trained router may send
neighbouring tokens to the same experts more often; this measures by how much: the model prefills
the text in one call with its routing recorded (the CUDA engine's `set_record_routing`, or the
numpy reference's `ffn.Routing`), and every window of T consecutive tokens of every MoE layer
counts its distinct experts (`window_distinct`).

    python3 tests/gpu/expert_reuse.py MODEL_DIR --text FILE [--tokens N] [--backend cuda|reference]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lampo.models.checkpoint import Checkpoint
from lampo.models.tokenizer import Tokenizer

WINDOWS = range(1, 9)  # tokens per window: a plain step, then verify windows of 1..7 drafts


def window_distinct(ids: np.ndarray, T: int) -> np.ndarray:
    """ids [layers, N, k] (each token's experts per MoE layer) -> [layers, N - T + 1]: the number of
    distinct experts in each window of T consecutive tokens."""
    layers, n, k = ids.shape
    if not 1 <= T <= n:
        raise ValueError(f"window_distinct: a window of {T} tokens in {n}")
    windows = np.lib.stride_tricks.sliding_window_view(ids, T, axis=1)  # [layers, N-T+1, k, T]
    flat = np.sort(windows.reshape(layers, n - T + 1, k * T), axis=-1)
    return 1 + (np.diff(flat, axis=-1) != 0).sum(axis=-1)


def uniform_distinct(E: int, k: int, T: int) -> float:
    """Expected distinct experts of T tokens that each pick k of E experts uniformly, independently."""
    return E * (1.0 - (1.0 - k / E) ** T)


def recorded_routing(ck: Checkpoint, ids: np.ndarray, backend: str) -> np.ndarray:
    """The experts [moe layers, N, k] the model of the open checkpoint `ck` chooses for `ids`
    prefilled in one call."""
    cfg = ck.config
    if not cfg.is_moe:
        raise ValueError(f"{ck.model_dir}: not a MoE model")
    if backend == "reference":
        from lampo.models.reference.ffn import Routing
        from lampo.models.reference.model import ReferenceModel

        routing = Routing()
        ReferenceModel.from_checkpoint(ck).prefill(ids, last_only=True, routing=routing)
        return np.stack(routing.chosen)
    from lampo.engine.cuda import load_native, load_weights
    from lampo.models.tensor_specs import engine_tensor_names

    engine = load_native().Engine(cfg, engine_tensor_names(cfg), {}, context_max=len(ids) + 1,
                                  prefill_chunk=len(ids), snapshot_slots=1, vram_limit=0)
    load_weights(engine, ck)
    engine.set_record_routing(True)
    engine.prefill(ids, True)
    return np.asarray(engine.routing())


def measure(ids: np.ndarray, E: int) -> list[dict]:
    """One row per window size: the measured mean distinct experts (over layers and windows), its
    layers' range, the uniform expectation, and the reads a window makes against T k."""
    k = ids.shape[-1]
    rows = []
    for T in WINDOWS:
        if T > ids.shape[1]:
            break
        per_layer = window_distinct(ids, T).mean(axis=1)
        rows.append({"tokens": T, "distinct": float(per_layer.mean()), "layer_min": float(per_layer.min()),
                     "layer_max": float(per_layer.max()), "uniform": uniform_distinct(E, k, T),
                     "share_of_pairs": float(per_layer.mean() / (T * k))})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--text", type=Path, required=True, help="text to prefill (tokenized with the model's tokenizer)")
    p.add_argument("--tokens", type=int, default=2048, help="at most this many of its tokens")
    p.add_argument("--backend", choices=("cuda", "reference"), default="cuda")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    ids = np.asarray(Tokenizer.from_checkpoint(args.model).encode(args.text.read_text())[: args.tokens], np.int32)
    with Checkpoint.open(args.model) as ck:
        E = ck.config.num_experts
        routing = recorded_routing(ck, ids, args.backend)
    rows = measure(routing, E)
    print(f"{args.model.name}: {routing.shape[0]} MoE layers, top-{routing.shape[2]} of {E} experts, "
          f"{len(ids)} tokens of {args.text.name} ({args.backend})")
    print(f"{'tokens':>6} {'distinct':>9} {'layers':>13} {'uniform':>8} {'of T k':>7}")
    for r in rows:
        print(f"{r['tokens']:>6} {r['distinct']:>9.2f} {r['layer_min']:>6.2f}-{r['layer_max']:<6.2f} "
              f"{r['uniform']:>8.2f} {r['share_of_pairs']:>7.3f}")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model.name), "experts": E, "top_k": int(routing.shape[2]),
                                         "moe_layers": int(routing.shape[0]), "tokens": len(ids),
                                         "text": args.text.name, "backend": args.backend, "windows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
