"""tests/gpu/train_measure_model.py on the CPU: its torch model against the numpy reference on the same
weights (trunk and MTP logits), the chunked delta rule and the chunked LM-head cross-entropy against
their plain forms, a few training steps, and the written checkpoint through Checkpoint.open.
Skipped without torch (CI has none); the script itself runs on the GPU machine."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lampo.models.checkpoint import Checkpoint
from lampo.models.config import load_config
from lampo.models.quant.engine_formats import recipe_tensor_bits
from lampo.models.quant.layout import quantizable
from lampo.models.quant.recipes import tensor_classes
from lampo.models.reference import gated_deltanet as ref_gdn
from lampo.models.reference.model import ReferenceModel
from lampo.models.synthetic import synthetic_tensor
from lampo.models.tensor_specs import expected_tensors

VOCAB = 1024  # a small vocabulary keeps the comparisons fast; the shapes are otherwise the smoke model's


@pytest.fixture(scope="module")
def tm(gpu_script):
    torch.set_num_threads(2)
    return gpu_script("train_measure_model")


def synthetic_model(tm, dense: bool, seed: int = 1):
    """The smoke config at VOCAB rows, with the synthetic checkpoint's weights (a sane scale,
    non-zero norm weights) in both the torch model and a numpy dict."""
    cfg = tm.model_config(dense=dense, smoke=True, vocab_size=VOCAB)
    weights = {name: synthetic_tensor(name, spec, seed) for name, spec in expected_tensors(cfg).items()}
    model = tm.MeasureModel(cfg)
    model.load_state_dict({name: torch.from_numpy(w) for name, w in weights.items()})
    return cfg, model, weights


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("dense", [False, True], ids=["moe", "dense"])
def test_forward_matches_the_numpy_reference(tm, dense):
    cfg, model, weights = synthetic_model(tm, dense)
    ids = np.random.default_rng(0).integers(0, VOCAB, 100)  # two GDN chunks, the second one padded
    ref = ReferenceModel(cfg, weights)
    ref_logits = ref.prefill(ids)
    ref_mtp = ref.mtp_prefill(ref.hiddens[:-1], ids[1:], start=0)
    with torch.no_grad():
        t = torch.as_tensor(ids)[None]
        hid, _ = model.trunk(t)
        d, _ = model.mtp_hiddens(hid[:, :-1], t[:, 1:])
        logits, mtp_logits = model.logits(hid)[0].numpy(), model.logits(d)[0].numpy()
    assert rel_err(logits, ref_logits) < 1e-4
    assert rel_err(mtp_logits, ref_mtp) < 1e-4
    assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()


def test_chunked_delta_rule_matches_the_recurrent_reference(tm):
    rng = np.random.default_rng(2)
    T, hk, hv, dk, dv = 40, 1, 2, 16, 8
    q = ref_gdn.l2norm(rng.standard_normal((T, hk, dk), dtype=np.float32)) / np.float32(np.sqrt(dk))
    k = ref_gdn.l2norm(rng.standard_normal((T, hk, dk), dtype=np.float32))
    v = rng.standard_normal((T, hv, dv), dtype=np.float32)
    g, beta = ref_gdn.gdn_gates(rng.standard_normal((T, hv), dtype=np.float32),
                                rng.standard_normal((T, hv), dtype=np.float32),
                                np.log(np.float32([2.0, 8.0])), np.float32([-2.0, 0.5]))
    expected, _ = ref_gdn.gated_delta_rule_recurrent(q, k, v, g, beta, np.zeros((hv, dk, dv), np.float32))

    def heads_first(x):  # [T, heads, ...] -> [1, Hv, T, ...], QK head j // (Hv / Hk)
        x = torch.as_tensor(x)
        if x.dim() == 3 and x.shape[1] != hv:
            x = x.repeat_interleave(hv // x.shape[1], 1)
        return x.transpose(0, 1)[None]

    got = tm.gated_delta_rule_chunked(*map(heads_first, (q, k, v, g, beta)), chunk=16)
    np.testing.assert_allclose(got[0].transpose(0, 1).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_chunked_cross_entropy_matches_autograd(tm):
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(50, 32, generator=gen, requires_grad=True)
    w = torch.randn(100, 32, generator=gen, requires_grad=True)
    targets = torch.randint(0, 100, (50,), generator=gen)
    loss, argmax = tm.linear_cross_entropy(h, w, targets, chunk=16)
    (2 * loss).backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    logits = h2 @ w2.T
    expected = torch.nn.functional.cross_entropy(logits, targets)
    (2 * expected).backward()
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert torch.equal(argmax, logits.argmax(-1))
    assert torch.allclose(h.grad, h2.grad, rtol=1e-4, atol=1e-6)
    assert torch.allclose(w.grad, w2.grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(tm.linear_cross_entropy(h, w, targets, chunk=16)[0], expected, rtol=1e-5)


def test_training_steps_reduce_the_loss(tm):
    cfg = tm.model_config(smoke=True, vocab_size=VOCAB)
    model = tm.MeasureModel(cfg)
    tm.init_weights(model, seed=0)
    opt = torch.optim.AdamW(tm.param_groups(model, 0.1), lr=3e-3)
    ids = torch.as_tensor(np.random.default_rng(4).integers(0, VOCAB, (2, 32)).repeat(2, axis=1))  # a repeat
    history = []
    for _ in range(8):
        r = tm.losses(model, ids)
        opt.zero_grad()
        r["total"].backward()
        opt.step()
        history.append((r["main"].item(), r["mtp"].item()))
    assert history[0][0] == pytest.approx(np.log(VOCAB), abs=0.1)  # N(0, 0.02) init: near uniform
    assert history[-1][0] < history[0][0] - 1.0
    assert history[-1][1] < history[0][1] - 0.5
    assert 0.9 < r["router"].item() < float(cfg.num_experts)


def test_micro_batches_sum_to_the_whole_batchs_gradients(tm):
    """A step in forwards of one sequence each (an 80 GB GPU's step) gives the whole batch's main and
    MTP losses and, but for the router's balance term (a function of each forward's tokens), its
    gradients."""
    cfg = tm.model_config(smoke=True, vocab_size=VOCAB)
    ids = torch.as_tensor(np.random.default_rng(5).integers(0, VOCAB, (2, 32)))
    grads, results = [], []
    for micro in (2, 1):
        model = tm.MeasureModel(cfg)
        tm.init_weights(model, seed=0)
        results.append(tm.step_losses(model, ids, micro))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    whole, parts = results
    assert parts["main"].item() == pytest.approx(whole["main"].item(), rel=1e-5)
    assert parts["mtp"].item() == pytest.approx(whole["mtp"].item(), rel=1e-5)
    assert grads[0].keys() == grads[1].keys()
    head = "lm_head.weight"  # reached by the cross-entropies only
    assert torch.allclose(grads[1][head], grads[0][head], rtol=1e-3, atol=1e-7)
    norm = [torch.sqrt(sum((g.float() ** 2).sum() for g in gs.values())) for gs in grads]
    assert norm[1].item() == pytest.approx(norm[0].item(), rel=0.05)


def test_written_checkpoint_opens_and_matches(tm, tmp_path):
    cfg, model, _ = synthetic_model(tm, dense=False, seed=5)
    out = tm.write_checkpoint(model, tmp_path / "ckpt")
    assert load_config(out) == cfg
    doc = json.loads((out / "config.json").read_text())
    assert doc["model_type"] == "qwen3_5_moe" and doc["text_config"]["router_aux_loss_coef"] == 0.001
    with Checkpoint.open(out, include_mtp=True) as ck:
        assert ck.has_mtp and set(ck.names()) == set(expected_tensors(cfg, include_mtp=True))
    check = tm.reference_check(model, out, np.arange(70) % VOCAB)
    assert check["trunk_rel_err"] < 1e-4 and check["mtp_rel_err"] < 1e-4
    assert check["trunk_top1_agree"] == 1.0


@pytest.mark.parametrize("dense", [False, True], ids=["moe", "dense"])
def test_default_config_fits_the_engine_and_the_lq_format(tm, dense):
    cfg = tm.model_config(dense=dense)
    assert cfg.vocab_size == 248_320 and cfg.hidden_size % 64 == 0 and cfg.head_dim == 256
    assert cfg.linear_key_head_dim == cfg.linear_value_head_dim == 128 and cfg.mtp_num_hidden_layers == 1
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",)
    specs = expected_tensors(cfg, include_mtp=True)
    assert all(quantizable(specs[name].shape) for name in tensor_classes(cfg))  # MTP included
    lq = recipe_tensor_bits(cfg, "q5")  # what the engine holds in LQ (a fused block only when all of it fits)
    assert set(lq) == {name for name in tensor_classes(cfg) if not name.startswith("mtp.")}
    model = tm.MeasureModel(cfg)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {n: s.shape for n, s in specs.items()}


@pytest.mark.slow
def test_smoke_run(tm, qwen_dir, tmp_path):
    """The whole script on the CPU: real tokenizer and data, a few steps, checkpoint, results."""
    assert tm.main(["--smoke", "--out", str(tmp_path / "smoke"), "--qwen-data", str(qwen_dir)]) == 0
    results = json.loads((tmp_path / "smoke" / "results.json").read_text())
    assert results["training"]["steps"] == 6
    assert results["reference_check"]["trunk_rel_err"] < 1e-4
    assert results["heldout"]["loss"] < np.log(248_077)  # below uniform after a few steps
    with Checkpoint.open(tmp_path / "smoke", include_mtp=True) as ck:
        assert ck.has_mtp
    assert (tmp_path / "smoke" / "tokenizer.json").is_file()
