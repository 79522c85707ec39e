"""tests/gpu/spec_acceptance.py's engine measurement (`engine_rows`) on the fake native module of
test_engine_cuda_cpu.py with the Markov model of test_engine_cuda_speculative.py: one row per
setting and prompt, each reply compared with the plain one, the draft counts taken from the
reply's last Stats."""

from __future__ import annotations

import test_engine_cuda_cpu as fake
import test_engine_cuda_speculative as markov_model
from helpers import TagTokenizer

from lampo.engine import cuda
from lampo.models.presets import get_preset


def test_engine_rows_measure_every_setting_against_the_plain_reply(gpu_script, tiny_dense_dir, monkeypatch):
    spec_acceptance = gpu_script("spec_acceptance")
    native = fake.FakeNative(get_preset("tiny-dense"))
    monkeypatch.setattr(cuda, "load_native", lambda: native)
    monkeypatch.setattr(fake, "next_token", markov_model.markov)
    prompts = {"chat": list(markov_model.PROMPT), "document": list(markov_model.PROMPT[3:])}
    rows = spec_acceptance.engine_rows(tiny_dense_dir, prompts, 24, TagTokenizer())
    settings = ["off"] + [f"{d}:{k}" for d in ("mtp", "ngram") for k in (1, 2, 3, 4)]
    assert [(r["setting"], r["prompt"]) for r in rows] == [(s, p) for s in settings for p in prompts]
    assert all(r["differs_at"] is None and r["tokens"] == 24 for r in rows)
    assert all(r["drafted"] == 0 for r in rows[:2]) and all(r["drafted"] > 0 for r in rows[2:])
    assert all(0 < r["acceptance_pct"] <= 100 and r["decode_tok_s"] > 0 for r in rows[2:])
