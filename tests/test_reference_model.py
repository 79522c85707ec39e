"""Whole-model tests of the numpy reference that need no HF oracle: state consistency (prefill vs
decode vs chunked calls), snapshots, MTP chaining, padding mask, weight validation, checkpoints."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lampo.models.bf16 import to_bf16
from lampo.models.checkpoint import Checkpoint
from lampo.models.config import FULL, LINEAR, ModelConfig
from lampo.models.reference.model import ReferenceModel
from lampo.models.synthetic import synthetic_tensor
from lampo.models.tensor_specs import LM_HEAD, expected_tensors

SMALL = ModelConfig(
    model_type="qwen3_5", hidden_size=16, num_hidden_layers=4, layer_types=(LINEAR, LINEAR, LINEAR, FULL),
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
    vocab_size=300, intermediate_size=32, mtp_num_hidden_layers=1,
)
SMALL_MOE = replace(SMALL, model_type="qwen3_5_moe", intermediate_size=None, num_experts=6,
                    num_experts_per_tok=2, moe_intermediate_size=8, shared_expert_intermediate_size=8)
IDS = np.random.default_rng(7).integers(0, 300, 90)


def weights_for(cfg: ModelConfig, seed: int = 3) -> dict[str, np.ndarray]:
    return {name: synthetic_tensor(name, spec, seed) for name, spec in expected_tensors(cfg).items()}


@pytest.fixture(scope="module", params=[SMALL, SMALL_MOE], ids=["dense", "moe"])
def weights(request):
    return request.param, weights_for(request.param)


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_prefill_then_decode_equals_one_prefill(weights):
    cfg, w = weights
    whole = ReferenceModel(cfg, w).prefill(IDS)
    m = ReferenceModel(cfg, w)
    close(m.prefill(IDS[:70]), whole[:70])
    for i in range(70, 90):
        close(m.decode(int(IDS[i])), whole[i])
    assert m.position == 90


def test_prefill_in_pieces_equals_one_call(weights):
    cfg, w = weights
    whole = ReferenceModel(cfg, w).prefill(IDS)
    m = ReferenceModel(cfg, w)
    close(m.prefill(IDS, chunk_size=29), whole)  # pieces 29, 29, 29, 3: state carried across calls
    last = ReferenceModel(cfg, w).prefill(IDS, chunk_size=89, last_only=True)  # a 1-token tail piece
    assert last.shape == (cfg.vocab_size,)
    close(last, whole[-1])


def test_snapshot_restore_reproduces_logits(weights):
    cfg, w = weights
    m = ReferenceModel(cfg, w)
    m.prefill(IDS[:50])
    snap = m.snapshot()
    first = [m.decode(int(t)) for t in IDS[50:55]]
    m.prefill(IDS[55:80])
    m.restore(snap)
    assert m.position == 50 and m.state.kv[0].length == 50
    np.testing.assert_array_equal(m.hidden_last, snap.hidden_last)
    again = [m.decode(int(t)) for t in IDS[50:55]]
    np.testing.assert_array_equal(np.array(again), np.array(first))


def test_restore_refuses_stale_snapshot():
    m = ReferenceModel(SMALL, weights_for(SMALL))
    m.prefill(IDS[:10])
    early = m.snapshot()
    m.prefill(IDS[10:20])
    late = m.snapshot()
    m.restore(early)
    m.prefill(IDS[30:40])  # rewrites KV rows 10..19 that `late` relies on
    with pytest.raises(ValueError, match="stale"):
        m.restore(late)
    m.restore(early)  # still valid: its rows 0..9 were never touched
    assert m.position == 10


def test_mtp_step_chains_like_one_mtp_prefill(weights):
    cfg, w = weights
    m = ReferenceModel(cfg, w)
    logits = m.prefill(IDS[:40])
    nxt = np.append(IDS[1:40], np.argmax(logits[-1]))
    hiddens = m.hiddens.copy()
    draft = m.mtp_prefill(hiddens, nxt, start=0)
    d = m.mtp_hidden_last.copy()
    d1 = int(np.argmax(draft[-1]))
    step = m.mtp_step(d, d1, position=40)
    ref = ReferenceModel(cfg, w).mtp_prefill(np.vstack([hiddens, d]), np.append(nxt, d1), start=0)
    close(draft, ref[:40])
    close(step, ref[40])
    # rewriting MTP rows from position 20 gives what a fresh pass over the new rows gives
    again = m.mtp_prefill(hiddens[20:], nxt[20:], start=20)
    close(again, ref[20:40])
    with pytest.raises(ValueError, match="beyond the MTP cache"):
        m.mtp_prefill(hiddens[:1], nxt[:1], start=45)


def test_weight_validation_names_the_problem():
    w = weights_for(SMALL)
    del w["model.language_model.layers.1.linear_attn.A_log"]
    with pytest.raises(ValueError, match=r"missing 1: model\.language_model\.layers\.1\.linear_attn\.A_log"):
        ReferenceModel(SMALL, w)
    w = weights_for(SMALL)
    w[LM_HEAD] = w[LM_HEAD][:, :8]
    with pytest.raises(ValueError, match=r"misshapen: lm_head\.weight \(300, 8\)"):
        ReferenceModel(SMALL, w)
    w = weights_for(SMALL)
    w[LM_HEAD] = w[LM_HEAD].astype(np.int32)
    with pytest.raises(TypeError, match="lm_head.weight"):
        ReferenceModel(SMALL, w).prefill([1])


def test_bf16_bits_equal_their_float_values():
    w = weights_for(SMALL)  # synthetic matrices are bf16-exact already
    bits = {k: to_bf16(v) for k, v in w.items()}
    close(ReferenceModel(SMALL, bits).prefill(IDS[:8]), ReferenceModel(SMALL, w).prefill(IDS[:8]))


def test_model_without_mtp_weights():
    w = {k: v for k, v in weights_for(SMALL).items() if not k.startswith("mtp.")}
    m = ReferenceModel(SMALL, w)
    m.prefill(IDS[:4])
    with pytest.raises(ValueError, match="no MTP weights"):
        m.mtp_step(m.hidden_last, 1, 4)


def test_bad_token_ids():
    m = ReferenceModel(SMALL, weights_for(SMALL))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.prefill([1, 300])
    with pytest.raises(ValueError, match="no token ids"):
        m.prefill([])


def test_tiny_checkpoint_masks_padding_ids(tiny_dense_dir):
    ck = Checkpoint.open(tiny_dense_dir)
    m = ReferenceModel.from_checkpoint(ck)
    assert m.has_mtp
    logits = m.prefill([248045, 872, 198], last_only=True)
    assert logits.shape == (248_320,)
    assert np.all(np.isneginf(logits[248_077:])) and np.all(np.isfinite(logits[:248_077]))
    draft = m.mtp_prefill(m.hiddens, [872, 198, int(np.argmax(logits))], start=0, last_only=True)
    assert np.all(np.isneginf(draft[248_077:])) and np.isfinite(draft[:248_077]).all()
