"""The LQ quality measure (models/quant/quality.py) on tiny-dense cut to a 2,048-row vocabulary
(the 248,320-row embedding and LM head would make each quantization take seconds) over 32 tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lampo.models.presets import get_preset
from lampo.models.quant import layout, quality, quantizer
from lampo.models.quant.recipes import RECIPES, tensor_classes
from lampo.models.tokenizer_build import build_tokenizer

VOCAB = 2048
TOKENS = 32


@pytest.fixture(scope="module")
def dense():
    cfg = quality.model_config("tiny-dense", vocab=VOCAB)
    ids = np.random.default_rng(0).integers(0, cfg.real_vocab_size, TOKENS)
    return cfg, quality.synthetic_weights(cfg), ids


@pytest.fixture(scope="module")
def rows(dense):
    return quality.evaluate(*dense)


def next_token(rows) -> dict[tuple[str, str], dict]:
    return {(r["recipe"], r["method"]): r for r in rows if r["part"] == "next_token"}


def test_a_model_against_itself_has_zero_kl_and_full_agreement(dense):
    run = quality.reference_run(*dense)
    assert quality.compare(run, run) == {"mean_kl": 0.0, "max_kl": 0.0, "top1_pct": 100.0, "hidden_rel_err": 0.0}


def test_quantized_models_differ_and_q5_is_closer_than_q4(rows):
    by = next_token(rows)
    assert set(by) == set(quality.VARIANTS)
    for (recipe, method), row in by.items():
        assert 0 < row["mean_kl"] <= row["max_kl"] and row["hidden_rel_err"] > 0, (recipe, method)
    for method in quality.METHODS:
        assert by["q5", method]["mean_kl"] < by["q4", method]["mean_kl"], method


def test_the_format_quantizer_is_no_worse_than_round_to_nearest_on_tiny_dense(rows):
    by = next_token(rows)
    for recipe in RECIPES:
        assert by[recipe, "lq"]["mean_kl"] <= by[recipe, "rtn"]["mean_kl"], recipe


def test_weight_errors_cover_each_class_at_each_recipe_width(dense, rows):
    cfg = dense[0]
    errors = {(r["class"], r["bits"]): r for r in rows if r["part"] == "relative_error"}
    classes = set(tensor_classes(cfg).values()) - {"mtp"}  # the MTP module is left out
    assert set(errors) == {(c, r.bits[c]) for c in classes for r in RECIPES.values()}
    for row in errors.values():
        assert 0 < row["lq"] < row["rtn"], row
    assert errors["embedding", 4]["lq"] > errors["embedding", 5]["lq"]


def test_each_tensor_width_and_method_is_quantized_once(dense, monkeypatch):
    cfg, weights, _ = dense
    calls = []

    def counting(method):
        def counted(w, bits):
            calls.append(bits)
            return method(w, bits)
        return counted

    monkeypatch.setattr(quality, "METHODS", {m: counting(f) for m, f in quality.METHODS.items()})
    trips = quality.RoundTrips(cfg, weights)
    for variant in quality.VARIANTS:
        trips.variant(*variant)
    assert len(calls) == len(trips.sq)  # one quantization per (tensor, width, method) ...
    # ... fewer than one per tensor of each variant: ffn_gate_up is 4 bits in both recipes
    assert len(calls) < sum(len(trips.widths[r]) for r, _ in quality.VARIANTS)


def test_an_expert_bank_is_quantized_expert_by_expert():
    cfg = quality.model_config("tiny-moe", layers=1, vocab=VOCAB)
    weights = quality.synthetic_weights(cfg)
    trips = quality.RoundTrips(cfg, weights)
    name = next(n for n, c in trips.classes.items() if c == "experts_down")
    bits = trips.widths["q5"][name]
    got = trips.variant("q5", "lq")[name]
    for e, w in enumerate(weights[name]):
        assert np.array_equal(got[e], layout.values(*quantizer.quantize(w, bits), bits))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def built_once(tokenizer, monkeypatch):
    """The tokenizer is built once for this file's tests (it takes seconds)."""
    monkeypatch.setattr(quality, "build_tokenizer", lambda: tokenizer)


@pytest.mark.usefixtures("built_once")
def test_the_runner_writes_the_rows(tmp_path, capsys):
    text = tmp_path / "text.md"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8, encoding="utf-8")
    out = tmp_path / "q.json"
    common = ["--preset", "tiny-dense", "--vocab", str(VOCAB), "--text", str(text), "--json", str(out)]
    assert quality.main([*common, "--tokens", "16"]) == 0
    doc = json.loads(out.read_text())
    assert (doc["model"], doc["vocab"], doc["tokens"]) == ("tiny-dense", VOCAB, 16)
    assert [(r["recipe"], r["method"]) for r in doc["rows"] if r["part"] == "next_token"] == list(quality.VARIANTS)
    assert quality.main([*common, "--tokens", "1000"]) == 2
    assert "fewer than the 1000" in capsys.readouterr().err


@pytest.mark.usefixtures("built_once")
def test_text_tokens_are_folded_into_a_cut_vocabulary(tmp_path):
    text = tmp_path / "text.md"
    text.write_text("<|im_start|>user\nHello<|im_end|>", encoding="utf-8")  # ids 248045, ..., 248046
    ids = quality.text_tokens(text, 3, VOCAB)
    assert ids[0] == 248045 % VOCAB and ids.max() < VOCAB


def test_the_runner_measures_a_checkpoint(tmp_path, tokenizer, monkeypatch):
    from lampo.models.synthetic import write_checkpoint

    model = write_checkpoint(tmp_path / "m", get_preset("tiny-dense"), seed=4, with_mtp=False)
    (model / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")  # the checkpoint's own is read
    monkeypatch.setattr(quality, "build_tokenizer", lambda: pytest.fail("the package tokenizer was built"))
    text = tmp_path / "text.md"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 8, encoding="utf-8")
    out = tmp_path / "q.json"
    assert quality.main(["--model", str(model), "--text", str(text), "--tokens", "16", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["weights"] == "checkpoint" and doc["vocab"] == get_preset("tiny-dense").vocab_size
    assert {r["method"] for r in doc["rows"] if r["part"] == "next_token"} == {"lq", "rtn"}


def test_an_fp8_source_adds_its_error_and_is_measured_against_the_original(dense, rows):
    fp8_rows = quality.evaluate(*dense, fp8_block=(64, 64))
    by, base = next_token(fp8_rows), next_token(rows)
    assert list(by)[0] == ("fp8", "e4m3") and 0 < by["fp8", "e4m3"]["mean_kl"] < base["q5", "lq"]["mean_kl"]
    assert {r["source"] for r in fp8_rows if r["part"] == "next_token" and r["recipe"] != "fp8"} == {"fp8"}
    errors = {(r["class"], r["bits"]): r["lq"] for r in fp8_rows if r["part"] == "relative_error"}
    base_errors = {(r["class"], r["bits"]): r["lq"] for r in rows if r["part"] == "relative_error"}
    assert errors.keys() == base_errors.keys()
    worse = [k for k in errors if errors[k] > base_errors[k]]
    assert ("attention", 5) in worse and ("embedding", 5) not in worse  # the releases keep the embedding bf16
