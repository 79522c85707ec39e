"""One description of the model for Python and the CUDA engine, checked without a GPU: the engine's
weight plan (native/src/weights/weights.cpp) knows tensors by role only and takes their names from
`tensor_specs.engine_tensor_names`, and its binding reads the ModelConfig's own attributes
(native/src/bindings/engine_bindings.cpp). The engine's own errors for a bad config or a missing
role are tested on the GPU (tests/cuda/test_engine_config.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lampo.models.config import FULL, LINEAR
from lampo.models.presets import PRESETS, get_preset
from lampo.models.tensor_specs import LAYER_PREFIX, engine_tensor_names, expected_tensors

NATIVE = Path(__file__).parents[1] / "native" / "src"
WEIGHTS_CPP = NATIVE / "weights" / "weights.cpp"
BINDINGS_CPP = NATIVE / "bindings" / "engine_bindings.cpp"


def plan_roles() -> dict[str, list[str]]:
    """weights.cpp's role lists by part: {"kModelRoles": [...], "kAttentionRoles": [...], ...}."""
    src = WEIGHTS_CPP.read_text()
    lists = re.findall(r"const std::vector<std::string> (k\w+Roles) = \{([^}]*)\};", src)
    return {name: re.findall(r'"([^"]+)"', body) for name, body in lists}


def planned_names(cfg, mtp: bool = False) -> list[str]:
    """The names the engine's plan gives its tensors for `cfg`: its roles per part, the model's
    names for them from the table, {layer} filled in as the plan does; with `mtp`, the MTP
    module's roles and its layer's (full attention) as "mtp.layer.<role>"."""
    roles, names = plan_roles(), engine_tensor_names(cfg, mtp)
    ffn = roles["kMoeRoles"] if cfg.is_moe else roles["kDenseRoles"]
    out = [names[r] for r in roles["kModelRoles"]]
    for i, layer_type in enumerate(cfg.layer_types):
        mixer = roles["kAttentionRoles"] if layer_type == FULL else roles["kGdnRoles"]
        out += [names[r].replace("{layer}", str(i)) for r in roles["kLayerRoles"] + mixer + ffn]
    if mtp:
        out += [names[r] for r in roles["kMtpRoles"]]
        out += [names["mtp.layer." + r] for r in roles["kLayerRoles"] + roles["kAttentionRoles"] + ffn]
    return out


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("mtp", [False, True])
def test_the_plan_names_exactly_the_expected_tensors(preset, mtp):
    cfg = get_preset(preset)
    planned = planned_names(cfg, mtp)
    assert len(planned) == len(set(planned))
    assert set(planned) == set(expected_tensors(cfg, include_mtp=mtp))


def test_the_table_gives_every_role_of_the_plan_and_no_other():
    plan = plan_roles()
    assert set(plan) == {"kModelRoles", "kLayerRoles", "kAttentionRoles", "kGdnRoles", "kDenseRoles", "kMoeRoles",
                         "kMtpRoles"}
    dense, moe = get_preset("qwen3.6-27b"), get_preset("qwen3.6-35b-a3b")
    assert {FULL, LINEAR} <= set(dense.layer_types) and {FULL, LINEAR} <= set(moe.layer_types)
    everything = set().union(*(roles for part, roles in plan.items() if part != "kMtpRoles"))
    assert set(engine_tensor_names(dense)) | set(engine_tensor_names(moe)) == everything
    assert set(engine_tensor_names(dense)) == everything - set(plan["kMoeRoles"])
    mtp_layer = {"mtp.layer." + r for r in plan["kLayerRoles"] + plan["kAttentionRoles"] + plan["kMoeRoles"]}
    assert set(engine_tensor_names(moe, mtp=True)) == set(engine_tensor_names(moe)) | set(plan["kMtpRoles"]) | mtp_layer


def test_a_per_layer_name_holds_the_layer_index_and_a_model_name_does_not():
    names = engine_tensor_names(get_preset("qwen3.6-35b-a3b"))
    model_roles = set(plan_roles()["kModelRoles"])
    for role, name in names.items():
        assert ("{layer}" in name) == (role not in model_roles), role
        assert role in model_roles or name.startswith(LAYER_PREFIX)


def test_no_native_source_spells_a_tensor_name():
    names = {**engine_tensor_names(get_preset("qwen3.6-27b"), mtp=True),
             **engine_tensor_names(get_preset("qwen3.6-35b-a3b"), mtp=True)}
    spelled = {name.removeprefix(LAYER_PREFIX) for name in names.values()}
    for path in NATIVE.rglob("*"):
        if path.suffix in (".cpp", ".cu", ".h", ".cuh"):
            text = path.read_text()
            assert not [n for n in spelled if n in text], path
            assert "model.language_model" not in text, path


def binding_reads() -> dict[str, str]:
    """{attribute: reader} of every ModelConfig attribute engine_bindings.cpp reads."""
    src = BINDINGS_CPP.read_text()
    body = src[src.index("ModelDims dims_from_config"):src.index("void load_tensor")]
    return {attr: kind for kind, attr in re.findall(r'\bc\.(integer|number|boolean|strings)\("(\w+)"\)', body)}


@pytest.mark.parametrize("preset", ["qwen3.6-27b", "qwen3.6-35b-a3b", "tiny-dense", "tiny-moe"])
def test_the_binding_reads_attributes_the_config_has_with_their_types(preset):
    cfg = get_preset(preset)
    reads = binding_reads()
    assert {"hidden_size", "layer_types", "rotary_dim", "real_vocab_size", "is_moe", "rms_norm_eps"} <= set(reads)
    family_only = {"intermediate_size"} if cfg.is_moe else {
        "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"}
    for attr, kind in reads.items():
        value = getattr(cfg, attr)  # AttributeError: the binding reads a name the config lacks
        if attr in family_only:
            continue  # read only for the other family (dense: intermediate_size; MoE: the expert sizes)
        ok = {
            "integer": lambda v: type(v) is int,
            "number": lambda v: type(v) in (int, float),
            "boolean": lambda v: type(v) is bool,
            "strings": lambda v: isinstance(v, tuple) and all(type(x) is str for x in v),
        }[kind](value)
        assert ok, f"{preset}: {attr} = {value!r} is not what c.{kind} reads"
