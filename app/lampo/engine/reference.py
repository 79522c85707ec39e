"""`ReferenceBackend`: the `Backend` protocol on the numpy fp32 reference model (CPU, slow).

Opens `Checkpoint.open(model_dir)` and the checkpoint's tokenizer (checked against the model's
vocabulary), scans every tensor for NaN/Inf (`finite_scan.check_finite`, one CheckpointError line
naming the tensor), then loads `ReferenceModel.from_checkpoint` (tensors convert lazily).
`lampo.engine.loop.GenerationLoop` does the per-request work (prefix reuse through up to
`snapshot_slots` snapshots, prefill in chunks of `prefill_chunk` tokens, decoding, events); this
file supplies its engine: the model, with its snapshots kept as `ModelSnapshot`s by slot, sampling
on the CPU with `lampo.models.sampling.sample` (seeded by `sampling.seed`, else fresh entropy; the
presence penalty counts this reply's tokens). A Stats follows every decoded token. `context_max` defaults to, and is clamped at, the model's
`max_position_embeddings`.

Speculative decoding (`speculation`, default auto; `engine.speculation`): unless it is off, each
reply decodes in rounds of `lampo.models.speculative.SpeculativeDecoder` (`SpeculativeSteps`),
whose drafter and draft count a fresh `DraftPolicy` chooses per round (fresh per reply, so a seeded
reply repeats); the MTP layer then runs with the trunk through prefill too. Mode mtp on a
checkpoint without MTP weights falls back to n-gram drafts, telling `say`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from lampo.engine.protocol import BackendInfo, Event, GenerationRequest
from lampo.demo import is_demo_checkpoint
from lampo.engine.loop import Decoded, GenerationLoop, SyncDecode
from lampo.engine.speculation import MAX_DRAFTS, Speculation
from lampo.models.draft_policy import DraftPolicy
from lampo.models.checkpoint import Checkpoint
from lampo.models.finite_scan import check_finite
from lampo.models.reference.model import ModelSnapshot, ReferenceModel
from lampo.models.sampling import sample
from lampo.models.sampling_params import SamplingParams
from lampo.models.speculative import SpeculativeDecoder
from lampo.models.tokenizer import Tokenizer
from lampo.engine.prefix_cache import PrefixCache


class ReferenceBackend:
    def __init__(self, model_dir: str | Path, context_max: int | None = None, prefill_chunk: int = 64,
                 snapshot_slots: int = 4, tokenizer: Tokenizer | None = None,
                 speculation: Speculation = Speculation(), say: Callable[[str], None] | None = None):
        model_dir = Path(model_dir)
        checkpoint = Checkpoint.open(model_dir)
        cfg = checkpoint.config
        context_max = min(context_max or cfg.max_position_embeddings, cfg.max_position_embeddings)
        if context_max < 1:
            raise ValueError(f"context_max must be at least 1 (got {context_max})")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (got {prefill_chunk})")
        self.tokenizer = tokenizer or Tokenizer.from_checkpoint(model_dir)
        check_finite(checkpoint)
        self.model = ReferenceModel.from_checkpoint(checkpoint)
        self.speculation, note = speculation.for_checkpoint(self.model.has_mtp)
        if note and say is not None:
            say(note)
        self._chunk = prefill_chunk
        self._cache = PrefixCache(snapshot_slots)
        self._snapshots: dict[int, ModelSnapshot] = {}
        self._loop = GenerationLoop(self.tokenizer, self._cache, label="reference", forget=self._forget)
        self._info = BackendInfo("reference", cfg.name or model_dir.name, str(model_dir), context_max,
                                 is_demo=is_demo_checkpoint(model_dir), speculative=self.speculation.on)

    @property
    def info(self) -> BackendInfo:
        return self._info

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        if self.speculation.on:
            steps = SpeculativeSteps(self.model, self._snapshots, request.sampling, self._chunk,
                                     request.prompt_ids, self.speculation)
        else:
            steps = ReferenceSteps(self.model, self._snapshots, request.sampling, self._chunk)
        return self._loop.start(request, cancel, steps, self._info.context_max)

    def reset(self) -> None:
        self._loop.reset()

    def close(self) -> None:
        self.reset()

    def _forget(self) -> None:
        self.model.reset()
        self._snapshots.clear()


class ReferenceSteps(SyncDecode):
    """The reference model as one call's `EngineSteps`: CPU sampling with an rng seeded at
    `begin` and the ids of this reply so far (presence penalty)."""

    def __init__(self, model: ReferenceModel, snapshots: dict[int, ModelSnapshot], sampling: SamplingParams,
                 chunk: int):
        self.chunk = chunk
        self._model, self._snapshots, self._sampling = model, snapshots, sampling
        self._rng: np.random.Generator | None = None  # both set by begin()
        self._seen: list[int] = []

    def begin(self) -> None:
        self._rng = np.random.default_rng(self._sampling.seed)
        self._seen = []

    def reset(self) -> None:
        self._model.reset()

    def restore(self, slot: int) -> None:
        self._model.restore(self._snapshots[slot])

    def snapshot(self, slot: int) -> None:
        self._snapshots[slot] = self._model.snapshot()

    def prefill(self, ids: Sequence[int], last: bool) -> int | None:
        logits = self._model.prefill(ids, last_only=True)
        return sample(logits, self._sampling, self._rng, self._seen) if last else None

    def decode(self, fed: int, max_drafts: int) -> Decoded:
        self._seen.append(fed)
        return Decoded((sample(self._model.decode(fed), self._sampling, self._rng, self._seen),))

    def vram(self) -> tuple[int, int]:
        return 0, 0


class SpeculativeSteps(ReferenceSteps):
    """`ReferenceSteps` whose decode steps are speculative rounds (`SpeculativeDecoder`, made at
    `begin` with a fresh `DraftPolicy` for `speculation`); n-gram drafts look the prompt and the
    reply so far up."""

    def __init__(self, model: ReferenceModel, snapshots: dict[int, ModelSnapshot], sampling: SamplingParams,
                 chunk: int, prompt: Sequence[int], speculation: Speculation):
        super().__init__(model, snapshots, sampling, chunk)
        self._prompt, self._speculation = list(prompt), speculation
        self._decoder: SpeculativeDecoder | None = None  # set by begin()

    def begin(self) -> None:
        super().begin()
        s = self._speculation
        policy = DraftPolicy(k_max=s.drafts or MAX_DRAFTS, mode=s.mode, fixed_k=s.drafts)
        self._decoder = SpeculativeDecoder(self._model, self._sampling, policy.k_max, "auto", self._rng, policy)

    def prefill(self, ids: Sequence[int], last: bool) -> int | None:
        self._decoder.advance(ids)
        if not last:
            return None
        return sample(self._model.logits(self._model.hidden_last), self._sampling, self._rng, self._seen)

    def decode(self, fed: int, max_drafts: int) -> Decoded:
        self._seen.append(fed)
        step = self._decoder.round(self._prompt + self._seen, self._seen, max_drafts)
        self._seen += step.tokens[:-1]
        return Decoded(tuple(step.tokens), step.drafted)

    def rewind(self, n: int) -> None:
        self._decoder.rewind(n)
        del self._seen[-n:]
