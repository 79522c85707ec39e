"""Which engine runs a model: the one picker behind `lampo chat` and `lampo bench`.

`native_for(kind)` is the `lampo._native` module for kind "cuda" or "auto" when the CUDA
extension imports and sees a GPU, else None (the numpy reference engine). "cuda" without a usable
engine raises `EngineUnavailable` saying how to run on the CPU instead; "auto" falls back and
tells `say` why. `open_backend` builds the `Backend` for a checkpoint on the engine picked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lampo.engine.protocol import Backend
from lampo.engine.speculation import Speculation

KINDS = ("auto", "cuda", "reference")


def native_for(kind: str, say: Callable[[str], None] | None = None):
    if kind not in KINDS:
        raise ValueError(f"backend {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "reference":
        return None
    from lampo.engine.cuda import EngineUnavailable, load_native

    try:
        return load_native()
    except EngineUnavailable as e:
        if kind == "cuda":
            raise EngineUnavailable(f"{e}; run with --backend reference for the CPU engine") from None
        if say is not None:
            say(f"{e}: using the reference backend (numpy on the CPU)")
        return None


def open_backend(kind: str, model_dir: Path, *, context_max: int, tokenizer,
                 say: Callable[[str], None] | None = None, weights: str = "auto", vram_limit: int = 0,
                 speculation: Speculation = Speculation()) -> Backend:
    """`weights` and `vram_limit` (the CUDA engine's): see CudaBackend; the reference engine runs
    the checkpoint as stored (saying so when they ask for something else). `speculation`: see
    ReferenceBackend and CudaBackend (each says at start-up where it runs less than the setting
    asks: no MTP weights, a damaged MTP module, no room for it)."""
    native = native_for(kind, say)
    if native is not None:
        from lampo.engine.cuda import CudaBackend

        return CudaBackend(model_dir, context_max=context_max, native=native, tokenizer=tokenizer, weights=weights,
                           vram_limit=vram_limit, speculation=speculation, say=say)
    from lampo.engine.reference import ReferenceBackend

    if say is not None and (weights not in ("auto", "bf16") or vram_limit):
        say("--weights and --vram-limit apply to the CUDA engine: the reference backend runs the checkpoint as stored")

    return ReferenceBackend(model_dir, context_max=context_max, tokenizer=tokenizer, speculation=speculation, say=say)
