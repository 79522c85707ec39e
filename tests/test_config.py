"""ModelConfig parsing: the two shipped Qwen3.6 configs, text-only configs, clear errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from lampo.models.config import FULL, LINEAR, ConfigError, ModelConfig, load_config
from lampo.models.presets import CONFIG_DIR, PRESETS, get_preset

MOE_JSON = CONFIG_DIR / "qwen3.6-35b-a3b.json"
DENSE_JSON = CONFIG_DIR / "qwen3.6-27b.json"


def test_35b_a3b_config():
    c = load_config(MOE_JSON)
    assert c.is_moe and c.model_type == "qwen3_5_moe"
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (2048, 40, 248320)
    assert c.full_layer_ids == tuple(range(3, 40, 4))
    assert len(c.linear_layer_ids) == 30
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 2, 256)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size) == (256, 8, 512, 512)
    # derived dimensions, architecture doc §2.3
    assert (c.q_proj_rows, c.attn_inner, c.kv_width, c.gqa_group, c.rotary_dim) == (8192, 4096, 512, 8, 64)
    assert (c.key_dim, c.value_dim, c.conv_dim, c.gdn_ratio) == (2048, 4096, 8192, 2)
    assert c.rope_theta == 10_000_000 and c.rms_norm_eps == 1e-6 and c.mtp_num_hidden_layers == 1
    assert c.real_vocab_size == 248077 and c.max_position_embeddings == 262144


def test_27b_config():
    c = load_config(DENSE_JSON)
    assert not c.is_moe and c.model_type == "qwen3_5"
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (5120, 64, 17408)
    assert c.full_layer_ids == tuple(range(3, 64, 4))
    assert (c.q_proj_rows, c.attn_inner, c.kv_width, c.gqa_group, c.rotary_dim) == (12288, 6144, 1024, 6, 64)
    assert (c.key_dim, c.value_dim, c.conv_dim, c.gdn_ratio) == (2048, 6144, 10240, 3)
    assert c.num_experts == 0


@pytest.mark.parametrize("path", [MOE_JSON, DENSE_JSON])
def test_text_config_alone_parses_the_same(path: Path):
    raw = json.loads(path.read_text())
    assert ModelConfig.from_dict(raw["text_config"]) == ModelConfig.from_dict(raw)


@pytest.mark.parametrize("name", PRESETS)
def test_serialisation_round_trips(name: str):
    c = get_preset(name)
    assert ModelConfig.from_dict(c.to_hf_dict()) == c
    assert ModelConfig.from_dict(c.to_text_config()) == c


def test_load_config_from_directory(tmp_path: Path):
    (tmp_path / "config.json").write_text(MOE_JSON.read_text())
    assert load_config(tmp_path) == load_config(MOE_JSON)


def test_layer_types_default_from_interval():
    raw = json.loads(DENSE_JSON.read_text())["text_config"]
    del raw["layer_types"]
    c = ModelConfig.from_dict(raw)
    assert c.layer_types == load_config(DENSE_JSON).layer_types
    assert c.layer_types[:4] == (LINEAR, LINEAR, LINEAR, FULL)


def test_with_layers_keeps_widths():
    c = load_config(MOE_JSON).with_layers(4)
    assert c.num_hidden_layers == 4 and c.full_layer_ids == (3,) and c.hidden_size == 2048


def _mutated(edit) -> dict:
    raw = copy.deepcopy(json.loads(MOE_JSON.read_text()))
    edit(raw["text_config"])
    return raw


BAD_FIELDS = [
    ("model_type", lambda t: t.update(model_type="llama")),
    ("hidden_size", lambda t: t.pop("hidden_size")),
    ("num_experts", lambda t: t.pop("num_experts")),
    ("layer_types", lambda t: t.update(layer_types=t["layer_types"][:-1])),
    ("layer_types", lambda t: t["layer_types"].__setitem__(0, "sliding_attention")),
    ("num_attention_heads", lambda t: t.update(num_attention_heads=15)),
    ("linear_num_value_heads", lambda t: t.update(linear_num_value_heads=33)),
    ("rope_type", lambda t: t["rope_parameters"].update(rope_type="yarn")),
    ("hidden_act", lambda t: t.update(hidden_act="gelu")),
    ("mtp_num_hidden_layers", lambda t: t.update(mtp_num_hidden_layers=2)),
    ("num_experts_per_tok", lambda t: t.update(num_experts_per_tok=0)),
    ("hidden_size", lambda t: t.update(hidden_size=-1)),
]


@pytest.mark.parametrize("field,edit", BAD_FIELDS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_FIELDS)])
def test_bad_field_is_named(field: str, edit):
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict(_mutated(edit))
    msg = str(e.value)
    assert field in msg and "\n" not in msg and msg.startswith("config: ")


def test_tied_embeddings_are_refused():
    raw = json.loads(MOE_JSON.read_text())
    raw["tie_word_embeddings"] = True  # the wrapper's top-level flag governs
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        ModelConfig.from_dict(raw)


def test_missing_and_invalid_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)


def test_unknown_preset_lists_names():
    with pytest.raises(ConfigError) as e:
        get_preset("qwen3.6-7b")
    assert all(name in str(e.value) for name in PRESETS)
