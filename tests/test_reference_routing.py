"""The reference's MoE routing can be recorded and replayed (models/reference/ffn.py `Routing`): the
exact oracle for an engine whose top-k may differ on near ties, e.g. with quantized weights."""

from __future__ import annotations

import numpy as np
import pytest

from lampo.models.checkpoint import Checkpoint
from lampo.models.reference.ffn import Routing
from lampo.models.reference.model import ReferenceModel

IDS = [11, 250, 4, 4, 77, 1023, 9, 3000]


@pytest.fixture(scope="module")
def model(tiny_moe_dir):
    return ReferenceModel.from_checkpoint(Checkpoint.open(tiny_moe_dir))


def run(model, routing=None, ids=IDS):
    model.reset()
    return model.prefill(ids, routing=routing)


def test_recorded_routing_replays_to_the_same_logits(model):
    recorded = Routing()
    plain = run(model, recorded)
    k = model.cfg.num_experts_per_tok
    assert len(recorded.chosen) == model.cfg.num_hidden_layers
    assert all(c.shape == (len(IDS), k) for c in recorded.chosen)
    np.testing.assert_array_equal(run(model), plain)
    np.testing.assert_array_equal(run(model, Routing(np.stack(recorded.chosen))), plain)


def test_a_replayed_choice_changes_that_token_and_what_follows_only(model):
    recorded = Routing()
    plain = run(model, recorded)
    replay = np.stack(recorded.chosen)
    token, layer = 4, 1
    unused = next(e for e in range(model.cfg.num_experts) if e not in replay[layer, token])
    replay[layer, token, 0] = unused
    changed = run(model, Routing(replay))
    # The earlier tokens keep their values up to BLAS rounding: an expert's tokens go through one
    # matmul, and its row count may change how the library sums a row (seen with OpenBLAS 0.3.31).
    np.testing.assert_allclose(changed[:token], plain[:token], rtol=1e-5, atol=1e-5)
    finite = np.isfinite(plain[token])
    assert np.abs(changed[token][finite] - plain[token][finite]).max() > 1e-2


def test_decode_records_one_row_per_layer(model):
    model.reset()
    model.prefill(IDS)
    recorded = Routing()
    model.decode(5, routing=recorded)
    assert [c.shape for c in recorded.chosen] == [(1, model.cfg.num_experts_per_tok)] * model.cfg.num_hidden_layers


@pytest.mark.parametrize("replay, message", [
    (np.zeros((4, len(IDS), 1), np.int64), "replayed ids must be"),
    (np.full((4, len(IDS), 2), 99, np.int64), "replayed ids must be"),
    (np.zeros((1, len(IDS), 2), np.int64), "1 layers replayed"),
])
def test_bad_replays_are_named(model, replay, message):
    with pytest.raises(ValueError, match=message):
        run(model, Routing(replay))


def test_routing_needs_one_call(model):
    model.reset()
    with pytest.raises(ValueError, match="not for chunks"):
        model.prefill(IDS, chunk_size=3, routing=Routing())
