"""The Engine takes the parsed ModelConfig itself and its tensors' names by role (GPU).

`lampo._native.Engine(cfg, engine_tensor_names(cfg), context_max=...)`: the binding reads the
config's attributes by their Python names and names a missing or ill-typed one; the weight plan
names the roles it lacks, and every name it plans (fused blocks included) comes from the table
(tests/test_engine_model_description.py checks the same table against the sources on the CPU).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from lampo.models.config import FULL, LINEAR
from lampo.models.presets import get_preset
from lampo.models.tensor_specs import engine_tensor_names, expected_tensors

_native = pytest.importorskip("lampo._native")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_native.device_count() < 1, reason="no CUDA device"),
]

MOE = get_preset("tiny-moe")
DENSE = get_preset("tiny-dense")


def engine(cfg, names=None, context_max=256):
    return _native.Engine(cfg, engine_tensor_names(cfg) if names is None else names, context_max=context_max,
                          prefill_chunk=64, snapshot_slots=1)


def config_like(cfg, **changes) -> SimpleNamespace:
    """The config's attributes (fields and derived properties) as a plain object, with `changes`;
    a change to None removes that attribute."""
    attrs = {k: getattr(cfg, k) for k in dir(cfg) if not k.startswith("_") and not callable(getattr(cfg, k))}
    attrs.update(changes)
    return SimpleNamespace(**{k: v for k, v in attrs.items() if v is not None})


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_the_engine_plans_exactly_the_expected_tensors(cfg):
    e = engine(cfg)
    assert e.context_max == 256
    planned = [name for name, _shape, _dtype in e.weight_specs()]
    assert sorted(planned) == sorted(expected_tensors(cfg, include_mtp=False))
    assert engine(config_like(cfg)).weight_bytes == e.weight_bytes  # any object with the attributes


def test_the_names_come_from_the_table():
    names = {role: "renamed." + name for role, name in engine_tensor_names(DENSE).items()}
    planned = {name for name, _shape, _dtype in engine(DENSE, names).weight_specs()}
    assert planned == {"renamed." + name for name in expected_tensors(DENSE, include_mtp=False)}


@pytest.mark.parametrize(
    "changes,error,match",
    [
        (dict(rotary_dim=None), TypeError, r"model config: the types\.SimpleNamespace has no attribute 'rotary_dim'"),
        (dict(real_vocab_size=None), TypeError, r"no attribute 'real_vocab_size'"),
        (dict(hidden_size="abc"), TypeError, r"model config: hidden_size is 'abc' \(str\), expected an int"),
        (dict(hidden_size=True), TypeError, r"hidden_size is True \(bool\), expected an int"),
        (dict(num_attention_heads=2.0), TypeError, r"num_attention_heads is 2\.0 \(float\), expected an int"),
        (dict(rms_norm_eps="1e-6"), TypeError, r"rms_norm_eps is '1e-6' \(str\), expected a float"),
        (dict(is_moe=1), TypeError, r"is_moe is 1 \(int\), expected a bool"),
        (dict(layer_types="linear_attention"), TypeError,
         r"layer_types is 'linear_attention' \(str\), expected a tuple"),
        (dict(layer_types=(LINEAR, 3)), TypeError, r"layer_types\[1\] is 3 \(int\), expected a str"),
        (dict(layer_types=(LINEAR, "sliding")), ValueError, r"layer_types\[1\] is 'sliding', expected"),
        (dict(vocab_size=2**40), ValueError, r"vocab_size is 1099511627776, outside the engine's 32-bit ints"),
    ],
    ids=["no-rotary_dim", "no-real_vocab_size", "str-int", "bool-int", "float-int", "str-float", "int-bool",
         "str-layer_types", "int-layer_type", "unknown-layer_type", "int-over-32-bits"],
)
def test_a_bad_config_attribute_is_named(changes, error, match):
    with pytest.raises(error, match=match):
        engine(config_like(DENSE, **changes), engine_tensor_names(DENSE))


def test_the_family_decides_which_ffn_sizes_are_read():
    assert engine(config_like(DENSE, num_experts="unused")).weight_bytes > 0
    with pytest.raises(TypeError, match=r"intermediate_size is None \(NoneType\)"):
        engine(SimpleNamespace(**{**vars(config_like(DENSE)), "intermediate_size": None}), engine_tensor_names(DENSE))
    with pytest.raises(TypeError, match=r"no attribute 'num_experts_per_tok'"):
        engine(config_like(MOE, num_experts_per_tok=None), engine_tensor_names(MOE))


def test_a_missing_role_is_named():
    names = {k: v for k, v in engine_tensor_names(MOE).items() if k not in ("attn.q", "moe.router")}
    with pytest.raises(ValueError, match=r"no tensor name for the role\(s\) attn\.q, moe\.router"):
        engine(MOE, names)


def test_a_per_layer_name_without_the_layer_index_is_refused():
    names = {**engine_tensor_names(DENSE), "gdn.z": "model.language_model.layers.0.linear_attn.in_proj_z.weight"}
    with pytest.raises(ValueError, match=r"per-layer name\(s\) of gdn\.z .* hold no \{layer\}"):
        engine(DENSE, names)


def test_the_context_has_no_default():
    with pytest.raises(TypeError):
        _native.Engine(DENSE, engine_tensor_names(DENSE))
    with pytest.raises(ValueError, match="context_max must be positive"):
        engine(DENSE, context_max=0)


# One huge fused block (more bytes than any GPU has) after small tensors: the allocation failure
# names the block by the display name the plan derives from its parts' names.
@pytest.mark.parametrize(
    "cfg,shown",
    [
        (replace(DENSE, layer_types=(FULL,), num_attention_heads=400_000),
         r"layers\.0\.self_attn\.\{q,k,v\}_proj \(fused\)"),
        (replace(DENSE, layer_types=(LINEAR,), linear_num_value_heads=1_000_000),
         r"layers\.0\.linear_attn\.in_proj_\{qkv,z,b,a\} \(fused\)"),
        (replace(DENSE, layer_types=(LINEAR,), intermediate_size=200_000_000),
         r"layers\.0\.mlp\.\{gate,up\}_proj \(fused\)"),
        (replace(MOE, layer_types=(LINEAR,), shared_expert_intermediate_size=200_000_000),
         r"layers\.0\.mlp\.shared_expert\.\{gate,up\}_proj \(fused\)"),
    ],
    ids=["attention", "gdn", "dense", "shared-expert"],
)
def test_a_fused_block_is_shown_by_its_parts(cfg, shown):
    cfg = replace(cfg, num_hidden_layers=1, hidden_size=1024, vocab_size=1024)
    with pytest.raises(_native.CudaError, match=r"cudaMalloc weights model\.language_model\." + shown):
        engine(cfg)
