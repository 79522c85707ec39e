"""Parameter counts vs the architecture doc §3.6 (derived from the tensor specs)."""

from __future__ import annotations

from lampo.models.params import count_params
from lampo.models.presets import get_preset


def test_35b_a3b_counts():
    c = count_params(get_preset("qwen3.6-35b-a3b"))
    assert c.total_text == 34_660_610_688
    assert c.mtp == 844_640_768
    assert c.embedding == 508_559_360
    assert c.full_attention_mixer == 27_263_488
    assert c.gdn_mixer == 33_718_464
    assert c.ffn == 808_978_432
    assert c.decoder_layers == 33_643_489_920
    assert c.final_norm + c.lm_head == 508_561_408
    assert c.routed_experts * 40 == 32_212_254_720  # "main Text routed banks" of the published shards
    assert round(c.active_per_token / 1e9, 2) == 2.95
    # 8 of 256 experts: everything else in the layers, final norm and lm_head
    assert c.active_per_token == c.decoder_layers - 40 * c.routed_experts * 248 // 256 + c.final_norm + c.lm_head


def test_27b_counts():
    c = count_params(get_preset("qwen3.6-27b"))
    assert c.total_text == 26_895_998_464
    assert c.mtp == 424_699_392
    assert c.embedding == 1_271_398_400
    assert c.full_attention_mixer == 104_858_112
    assert c.gdn_mixer == 115_876_064
    assert c.ffn == 267_386_880
    assert c.decoder_layers == 24_353_196_544
    assert c.final_norm + c.lm_head == 1_271_403_520
    assert c.routed_experts == 0
    assert round(c.active_per_token / 1e9, 2) == 25.62
    assert c.active_per_token == c.total_text - c.embedding


def test_parts_add_up():
    for name in ("tiny-dense", "tiny-moe", "qwen3.6-35b-a3b"):
        c = count_params(get_preset(name))
        assert c.total_text == c.embedding + c.decoder_layers + c.final_norm + c.lm_head
        assert c.active_per_token < c.total_text
