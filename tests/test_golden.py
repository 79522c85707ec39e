"""The numpy reference against HF transformers golden outputs (tests/golden/make_golden.py).

Tolerance: for every compared block of logits, max |reference - HF| <= 2e-5 * max |HF| (logits
here reach ~5, so about 1e-4 absolute; observed differences are ~5e-6, fp32 rounding). Greedy
tokens must be identical. Perturbation tests prove the fixtures have teeth: three classic
mistakes each push the error far (>= 1000x) above the tolerance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from lampo.models.config import ModelConfig
from lampo.models.reference import attention, gated_deltanet, norms
from lampo.models.reference.model import ReferenceModel

FIXTURES = Path(__file__).parent / "fixtures" / "golden"
REL_TOL = 2e-5


@dataclass(frozen=True)
class Golden:
    cfg: ModelConfig
    weights: dict[str, np.ndarray]
    data: dict[str, np.ndarray]


@lru_cache(maxsize=None)
def golden(name: str) -> Golden:
    with np.load(FIXTURES / f"{name}.npz") as z:
        data = {k: z[k] for k in z.files}
    weights = {k[2:]: v for k, v in data.items() if k.startswith("w:")}
    return Golden(ModelConfig.from_dict(json.loads(str(data["config_json"]))), weights, data)


def rel_err(ref: np.ndarray, hf: np.ndarray) -> float:
    return float(np.abs(ref - hf).max() / np.abs(hf).max())


def run_reference(g: Golden, decode_steps: int | None = None) -> dict[str, object]:
    """Replay the fixture's calls on the reference: prefill, MTP (prefill alignment + one chained
    step), greedy decode through the cache, then a multi-token turn on top."""
    d = g.data
    m = ReferenceModel(g.cfg, g.weights)
    T = len(d["prompt_ids"])
    out: dict[str, object] = {"prefill": m.prefill(d["prompt_ids"])[d["prefill_rows"]]}

    mtp_ids = d["mtp_next_ids"]
    mtp_rows = m.mtp_prefill(m.hiddens, mtp_ids[:T], start=0)
    out["mtp_draft"] = int(np.argmax(mtp_rows[-1]))
    out["mtp_chained_hidden"] = m.mtp_hidden_last.copy()
    chained = m.mtp_step(m.mtp_hidden_last, int(mtp_ids[T]), position=T)
    out["mtp"] = np.vstack([mtp_rows, chained[None]])[d["mtp_rows"]]

    steps = d["decode_tokens"][:decode_steps]
    out["decode"] = np.array([m.decode(int(t)) for t in steps])
    out["greedy"] = [int(np.argmax(out["prefill"][-1]))] + [int(np.argmax(x)) for x in out["decode"][:-1]]
    if decode_steps is None:
        out["turn"] = m.prefill(d["turn_ids"])
    return out


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_reference_matches_hf(name):
    g = golden(name)
    d = g.data
    assert str(d["transformers_version"]).startswith("5.17"), "fixture made with another transformers"
    out = run_reference(g)
    assert rel_err(out["prefill"], d["prefill_logits"]) <= REL_TOL
    for i, (ref, hf) in enumerate(zip(out["decode"], d["decode_logits"])):
        assert rel_err(ref, hf) <= REL_TOL, f"decode step {i}"
    assert out["greedy"] == d["decode_tokens"].tolist()
    assert rel_err(out["turn"], d["turn_logits"]) <= REL_TOL
    assert out["mtp_draft"] == int(d["mtp_next_ids"][-1])
    assert rel_err(out["mtp_chained_hidden"], d["mtp_hiddens"][-1]) <= REL_TOL
    assert rel_err(out["mtp"], d["mtp_logits"]) <= REL_TOL


def test_serial_gdn_prefill_also_matches_hf(monkeypatch):
    """Forcing the token loop for the multi-token prefill gives the same logits as the chunked form."""
    g = golden("dense")
    chunked = ReferenceModel(g.cfg, g.weights).prefill(g.data["prompt_ids"])
    monkeypatch.setattr(gated_deltanet, "gated_delta_rule_chunked",
                        lambda *args, chunk=64: gated_deltanet.gated_delta_rule_recurrent(*args))
    serial = ReferenceModel(g.cfg, g.weights).prefill(g.data["prompt_ids"])
    assert rel_err(serial, chunked) <= REL_TOL
    assert rel_err(serial[g.data["prefill_rows"]], g.data["prefill_logits"]) <= REL_TOL


# ---- the goldens have teeth -----------------------------------------------------------------
def _rmsnorm_without_one(x, w, eps=1e-6):
    x = np.asarray(x, np.float32)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _split_q_gate_blockwise(qg, nq, head_dim):
    """Wrong: the first nq*D rows as query, the rest as gate (instead of per-head interleaving)."""
    q = qg[:, : nq * head_dim].reshape(qg.shape[0], nq, head_dim)
    return q, qg[:, nq * head_dim :]


def _delta_rule_decay_after_update(q, k, v, g, beta, state, chunk=64):
    """Wrong: the delta update uses the undecayed state and the decay is applied afterwards."""
    r = v.shape[1] // q.shape[1]
    qh, kh = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1)
    S = state.copy()
    out = np.empty_like(v)
    for t in range(len(v)):
        err = v[t] - np.einsum("hkv,hk->hv", S, kh[t])
        S = S + kh[t][:, :, None] * (beta[t][:, None] * err)[:, None, :]
        S = S * np.exp(g[t])[:, None, None]
        out[t] = np.einsum("hkv,hk->hv", S, qh[t])
    return out, S


PERTURBATIONS = {
    "rmsnorm_without_1_plus": [(norms, "rmsnorm1p", _rmsnorm_without_one)],
    "q_gate_split_blockwise": [(attention, "split_q_gate", _split_q_gate_blockwise)],
    "decay_after_delta_update": [
        (gated_deltanet, "gated_delta_rule_recurrent", _delta_rule_decay_after_update),
        (gated_deltanet, "gated_delta_rule_chunked", _delta_rule_decay_after_update),
    ],
}


@pytest.mark.parametrize("mistake", sorted(PERTURBATIONS))
def test_goldens_catch_classic_mistakes(mistake, monkeypatch):
    g = golden("dense")
    for module, attr, wrong in PERTURBATIONS[mistake]:
        monkeypatch.setattr(module, attr, wrong)
    out = run_reference(g, decode_steps=2)
    assert rel_err(out["prefill"], g.data["prefill_logits"]) > 1000 * REL_TOL
    assert rel_err(out["decode"], g.data["decode_logits"][:2]) > 1000 * REL_TOL
