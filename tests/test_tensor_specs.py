"""expected_tensors: names, shapes and dtypes of the two real checkpoints (architecture doc §3)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lampo.models.presets import CONFIG_DIR, get_preset
from lampo.models.tensor_specs import BF16, F32, expected_tensors, is_mtp

MOE = get_preset("qwen3.6-35b-a3b")
DENSE = get_preset("qwen3.6-27b")
L = "model.language_model.layers."


def _vision_tensor_count(config_file: str) -> int:
    """Tensors of the vision tower the published shards also hold: per block norm1, norm2,
    attn.qkv, attn.proj, mlp.linear_fc1, mlp.linear_fc2 (weight + bias each); patch_embed.proj
    (weight + bias), pos_embed; merger norm, linear_fc1, linear_fc2 (weight + bias each)."""
    depth = json.loads((CONFIG_DIR / config_file).read_text())["vision_config"]["depth"]
    return depth * 12 + 3 + 6


@pytest.mark.parametrize(
    "cfg,config_file,shard_tensors",
    [(MOE, "qwen3.6-35b-a3b.json", 1045), (DENSE, "qwen3.6-27b.json", 1199)],
)
def test_counts_match_the_published_shards(cfg, config_file, shard_tensors):
    # the shards hold text + MTP + vision tensors (doc §3: 35B 1045, 27B 1199)
    specs = expected_tensors(cfg)
    assert len(specs) == shard_tensors - _vision_tensor_count(config_file)
    n_mtp = sum(is_mtp(n) for n in specs)
    assert len(expected_tensors(cfg, include_mtp=False)) == len(specs) - n_mtp
    assert n_mtp == 4 + (15 if cfg.is_moe else 11)


def test_35b_shapes():
    s = expected_tensors(MOE)
    shapes = {
        "model.language_model.embed_tokens.weight": (248320, 2048),
        "lm_head.weight": (248320, 2048),
        "model.language_model.norm.weight": (2048,),
        L + "0.linear_attn.in_proj_qkv.weight": (8192, 2048),
        L + "0.linear_attn.in_proj_z.weight": (4096, 2048),
        L + "0.linear_attn.in_proj_a.weight": (32, 2048),
        L + "0.linear_attn.in_proj_b.weight": (32, 2048),
        L + "0.linear_attn.conv1d.weight": (8192, 1, 4),
        L + "0.linear_attn.A_log": (32,),
        L + "0.linear_attn.dt_bias": (32,),
        L + "0.linear_attn.norm.weight": (128,),
        L + "0.linear_attn.out_proj.weight": (2048, 4096),
        L + "3.self_attn.q_proj.weight": (8192, 2048),
        L + "3.self_attn.k_proj.weight": (512, 2048),
        L + "3.self_attn.v_proj.weight": (512, 2048),
        L + "3.self_attn.q_norm.weight": (256,),
        L + "3.self_attn.o_proj.weight": (2048, 4096),
        L + "39.mlp.gate.weight": (256, 2048),
        L + "39.mlp.experts.gate_up_proj": (256, 1024, 2048),
        L + "39.mlp.experts.down_proj": (256, 2048, 512),
        L + "39.mlp.shared_expert.gate_proj.weight": (512, 2048),
        L + "39.mlp.shared_expert.down_proj.weight": (2048, 512),
        L + "39.mlp.shared_expert_gate.weight": (1, 2048),
        "mtp.pre_fc_norm_embedding.weight": (2048,),
        "mtp.pre_fc_norm_hidden.weight": (2048,),
        "mtp.fc.weight": (2048, 4096),
        "mtp.layers.0.self_attn.q_proj.weight": (8192, 2048),
        "mtp.layers.0.mlp.experts.gate_up_proj": (256, 1024, 2048),
        "mtp.norm.weight": (2048,),
    }
    for name, shape in shapes.items():
        assert s[name].shape == shape, name


def test_27b_shapes():
    s = expected_tensors(DENSE)
    assert s[L + "0.linear_attn.in_proj_qkv.weight"].shape == (10240, 5120)
    assert s[L + "63.self_attn.q_proj.weight"].shape == (12288, 5120)
    assert s[L + "5.mlp.down_proj.weight"].shape == (5120, 17408)
    assert s["mtp.layers.0.mlp.gate_proj.weight"].shape == (17408, 5120)
    assert s["mtp.fc.weight"].shape == (5120, 10240)
    assert not any("experts" in n for n in s)


def test_layer_kinds_follow_layer_types():
    s = expected_tensors(MOE)
    for i, kind in enumerate(MOE.layer_types):
        names = [n for n in s if n.startswith(f"{L}{i}.")]
        has_attn = any(".self_attn." in n for n in names)
        has_gdn = any(".linear_attn." in n for n in names)
        assert (has_attn, has_gdn) == ((True, False) if kind == "full_attention" else (False, True))
    assert not any(".linear_attn." in n for n in s if is_mtp(n))


def test_dtypes():
    for name, spec in expected_tensors(MOE).items():
        assert spec.dtype == BF16
        if len(spec.shape) == 1:
            assert spec.accepts(F32) and spec.accepts(BF16), name
        else:
            assert not spec.accepts(F32) and spec.accepts(BF16), name


def test_only_text_and_mtp_prefixes():
    names = expected_tensors(DENSE)
    assert all(n.startswith(("model.language_model.", "mtp.")) or n == "lm_head.weight" for n in names)
    assert not any(n.startswith("model.visual.") for n in names)


def test_no_mtp_layers_means_no_mtp_tensors():
    cfg = replace(get_preset("tiny-moe"), mtp_num_hidden_layers=0)
    assert not any(is_mtp(n) for n in expected_tensors(cfg, include_mtp=True))
