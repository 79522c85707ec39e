"""config.json is checked field by field: a wrong type, range or shape gives one ConfigError line
naming the file, the field's JSON path, the value found and what was expected; nothing is coerced
(issue case 5: `num_attention_heads: [2]`, a top-level list, `hidden_size: "abc"`, `true`, `4.5`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from lampo.models.config import ConfigError, ModelConfig, load_config
from lampo.models.presets import CONFIG_DIR

MOE = json.loads((CONFIG_DIR / "qwen3.6-35b-a3b.json").read_text())
DENSE = json.loads((CONFIG_DIR / "qwen3.6-27b.json").read_text())


def _load_error(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path)
    msg = str(e.value)
    assert msg.startswith("config: ") and "\n" not in msg and str(path) in msg
    return msg


def _edited(base: dict, path: str, value) -> dict:
    raw = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[leaf] = value
    return raw


# (JSON path, value, text the message shows for the value, words of the expectation)
BAD_VALUES = [
    ("text_config.num_attention_heads", [2], "[2]", "an integer"),
    ("text_config.hidden_size", "abc", '"abc"', "an integer"),
    ("text_config.hidden_size", True, "true", "an integer"),
    ("text_config.hidden_size", 0, "0", "an integer in 1.."),
    ("text_config.hidden_size", -128, "-128", "an integer in 1.."),
    ("text_config.hidden_size", 2**40, str(2**40), "..2,147,483,647"),
    ("text_config.num_hidden_layers", 4.5, "4.5", "an integer"),
    ("text_config.num_hidden_layers", 10**9, str(10**9), "an integer in 1.."),
    ("text_config.vocab_size", None, "missing or null", "an integer"),
    ("text_config.num_experts", {"n": 256}, '{"n": 256}', "an integer"),
    ("text_config.rms_norm_eps", "1e-6", '"1e-6"', "a positive number"),
    ("text_config.rms_norm_eps", 0, "0", "a positive number up to 1"),
    ("text_config.partial_rotary_factor", 1.5, "1.5", "a positive number up to 1"),
    ("text_config.rope_parameters.rope_theta", [1e7], "[10000000.0]", "a positive number"),
    ("text_config.rope_parameters.rope_theta", 1e300, "1e+300", "a positive number up to 3.40282e+38"),
    ("text_config.rope_parameters", [1, 2], "[1, 2]", "an object"),
    ("text_config.rope_parameters", "default", '"default"', "an object"),
    ("text_config.rope_parameters.rope_type", 7, "7", '"default"'),
    ("text_config.layer_types", "linear_attention", '"linear_attention"', "a list"),
    ("text_config.layer_types", {"0": "full_attention"}, '{"0": "full_attention"}', "a list"),
    ("text_config.hidden_act", ["silu"], '["silu"]', '"silu"'),
    ("text_config.attn_output_gate", "true", '"true"', "true"),
    ("text_config.tie_word_embeddings", 0, "0", "false"),
    ("text_config.mtp_num_hidden_layers", 0.0, "0.0", "an integer"),
    ("text_config.model_type", "llama", '"llama"', "one of"),
    ("text_config", ["a"], '["a"]', "an object"),
]


@pytest.mark.parametrize("path,value,shown,expected", BAD_VALUES,
                         ids=[f"{p}={v!r}"[:60] for p, v, _, _ in BAD_VALUES])
def test_wrong_value_names_file_field_value_and_expectation(tmp_path: Path, path, value, shown, expected):
    msg = _load_error(tmp_path, json.dumps(_edited(MOE, path, value)))
    assert path in msg and shown in msg and expected in msg and "expected" in msg


def test_layer_types_entry_is_named_by_index(tmp_path: Path):
    raw = _edited(MOE, "text_config.layer_types", ["linear_attention"] * 39 + [3])
    msg = _load_error(tmp_path, json.dumps(raw))
    assert "text_config.layer_types[39] is 3" in msg and '"full_attention"' in msg


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(tmp_path: Path, literal: str):
    text = json.dumps(MOE).replace('"rms_norm_eps": 1e-06', f'"rms_norm_eps": {literal}')
    assert literal in text
    msg = _load_error(tmp_path, text)
    assert f"text_config.rms_norm_eps is {literal}" in msg and "a positive number" in msg


def test_top_level_must_be_an_object(tmp_path: Path):
    for text, shown in (("[1, 2]", "a list"), ('"qwen"', "a string"), ("3", "a number"), ("null", "null")):
        msg = _load_error(tmp_path, text)
        assert f"the top level is {shown}" in msg and "expected a JSON object" in msg


def test_text_only_config_names_fields_without_prefix(tmp_path: Path):
    msg = _load_error(tmp_path, json.dumps(_edited(DENSE["text_config"], "hidden_size", "5120")))
    assert 'hidden_size is "5120"' in msg and "text_config." not in msg


def test_missing_required_field_is_named(tmp_path: Path):
    raw = copy.deepcopy(DENSE)
    del raw["text_config"]["intermediate_size"]
    assert "text_config.intermediate_size is missing" in _load_error(tmp_path, json.dumps(raw))


def test_sizes_that_overflow_the_engine_are_refused():
    # each field alone is a valid int32, but q_proj rows = heads * head_dim * 2 is not
    raw = _edited(_edited(MOE, "text_config.num_attention_heads", 2**16), "text_config.num_key_value_heads", 2**16)
    raw = _edited(raw, "text_config.head_dim", 2**15)
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict(raw)
    assert "q_proj" in str(e.value) and "2,147,483,647" in str(e.value)


@pytest.mark.parametrize("data,words", [
    (b'{"model_type": "caf\xe9"}', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"hidden_size": 1' + b"0" * 5000 + b"}", "not valid JSON"),
], ids=["latin-1", "deeply-nested", "5000-digit-int"])
def test_unreadable_json_is_one_line(tmp_path: Path, data: bytes, words: str):
    assert words in _load_error(tmp_path, data)


def test_a_directory_in_place_of_the_file(tmp_path: Path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


def test_shipped_configs_and_their_text_configs_still_parse():
    for raw in (MOE, DENSE):
        assert ModelConfig.from_dict(raw) == ModelConfig.from_dict(raw["text_config"])
