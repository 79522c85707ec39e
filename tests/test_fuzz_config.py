"""Hostile input to the config.json parser, fuzzed with Hypothesis: arbitrary JSON values, arbitrary
file bytes, and mutations of the real Qwen3.6 configs (any field, nested ones included, replaced by
any JSON value or removed). The only outcomes allowed are a ModelConfig that passes its own checks
(every size in range, a tensor plan built from it) or one `ConfigError` line; never another
exception."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lampo.models.config import ConfigError, ModelConfig, load_config
from lampo.models.config_schema import FIELDS, INT32_MAX
from lampo.models.presets import CONFIG_DIR
from lampo.models.tensor_specs import expected_tensors

REAL = [json.loads(p.read_text()) for p in sorted(CONFIG_DIR.glob("*.json"))]
MAX_MESSAGE = 400


def _outcome(parse) -> ModelConfig | None:
    try:
        cfg = parse()
    except ConfigError as e:
        msg = str(e)
        assert msg.startswith("config: ") and "\n" not in msg and len(msg) <= MAX_MESSAGE, msg
        return None
    cfg.validate()
    for name, spec in FIELDS.items():
        value = getattr(cfg, name)
        if spec.kind is int and value is not None:
            assert type(value) is int and value <= INT32_MAX
        if spec.kind is float:
            assert type(value) is float and math.isfinite(value) and value > 0
    assert all(size < INT32_MAX for size in cfg.engine_sizes().values())
    assert expected_tensors(cfg)
    return cfg


# ---- strategies --------------------------------------------------------------------------------
hostile_scalars = st.sampled_from([None, True, False, 0, -1, 1, 2, 3, 4.5, 0.0, -0.0, 2**31 - 1, 2**31, 2**63, 10**40,
                                   1e300, math.nan, math.inf, -math.inf, "", "4", "abc", "silu", "default",
                                   "linear_attention", "full_attention", "qwen3_5_moe", "qwen3_5_text"])
json_scalars = hostile_scalars | st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12)


def _paths(node, prefix=()) -> list[tuple]:
    """Every key / index path inside a JSON document."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out.append(prefix + (key,))
        out.extend(_paths(child, prefix + (key,)))
    return out


@st.composite
def mutated_real_configs(draw) -> object:
    """A shipped config (or its text_config alone) with one to three fields replaced or removed."""
    raw = copy.deepcopy(draw(st.sampled_from(REAL)))
    if draw(st.booleans()):
        raw = raw["text_config"]
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(raw)
        if not paths:
            break
        *parents, leaf = draw(st.sampled_from(paths))
        node = raw
        for key in parents:
            node = node[key]
        if isinstance(node, dict) and draw(st.integers(0, 4)) == 0:
            del node[leaf]
        else:
            node[leaf] = draw(json_values)
    return raw


# ---- properties --------------------------------------------------------------------------------
@given(json_values)
def test_arbitrary_json_values(raw: object):
    assert _outcome(lambda: ModelConfig.from_dict(raw)) is None or isinstance(raw, dict)


@given(st.dictionaries(st.sampled_from(sorted(FIELDS) + ["text_config", "rope_parameters", "layer_types"]),
                       json_values, max_size=12))
def test_arbitrary_values_under_the_real_keys(raw: dict):
    _outcome(lambda: ModelConfig.from_dict(raw))


@given(mutated_real_configs())
def test_mutated_real_configs(raw: object):
    _outcome(lambda: ModelConfig.from_dict(raw))


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-config")


@given(st.binary(max_size=200) | st.sampled_from([b"[" * 50_000, b"{" + b"1" * 5000, b"\xef\xbb\xbf{}"]))
def test_arbitrary_file_bytes(config_dir: Path, data: bytes):
    (config_dir / "config.json").write_bytes(data)
    _outcome(lambda: load_config(config_dir))


@given(mutated_real_configs(), st.booleans())
def test_mutated_real_config_files(config_dir: Path, raw: object, allow_nan: bool):
    try:
        text = json.dumps(raw, allow_nan=allow_nan)
    except ValueError:  # NaN or Infinity with allow_nan=False
        text = json.dumps(raw).replace("NaN", "nan")
    (config_dir / "config.json").write_text(text)
    cfg = _outcome(lambda: load_config(config_dir))
    assert cfg is None or cfg.name == config_dir.name
