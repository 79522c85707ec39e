"""The config.json schema of the Qwen3.5/3.6 text model: one table of field specs (JSON type, range,
choices, default, where the value is read) and the reader that applies it.

`read_text_config(raw)` takes a parsed config.json (the multimodal wrapper with a nested
`text_config`, or the text config alone) and returns the keyword arguments of `ModelConfig`. It
checks every field it reads against its spec and raises `ConfigError` with one line naming the
field's JSON path (e.g. `text_config.num_attention_heads`), the value found (as JSON) and what was
expected. Nothing is coerced: `4.5` is not an integer, `true` is not a number, `"10"` is neither;
JSON's NaN/Infinity literals are refused; integers are bounded so that every size fits the engine's
32-bit ints. `check_ranges(values)` applies the same table to a `ModelConfig` built in code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lampo.models.json_quote import quote_json

DENSE_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LINEAR = "linear_attention"
FULL = "full_attention"
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # the engine keeps rope_theta and rms_norm_eps as float32
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
MAX_LAYERS = 10_000
FAMILY_CONTEXT_MAX = 262_144  # the family's max_position_embeddings, for a config.json without one
REQUIRED = object()
_TOP = "/"  # a path beginning with this is read from the document root, not from text_config


class ConfigError(ValueError):
    """A config.json that Lampo cannot run, with the offending field named."""


@dataclass(frozen=True)
class Field:
    """One value of the config: its JSON type (`int`, `float`, `bool`, `str` or `list` of strings),
    the paths it is read from (dotted, relative to text_config unless they begin with "/"; the first
    present wins; null counts as absent), its default (REQUIRED: none), its inclusive range, the
    values it may take (`choices`; for a list, the values of its items) and the models it applies
    to (`only`: "moe" or "dense"; else both)."""

    kind: type
    paths: tuple[str, ...]
    default: Any = REQUIRED
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    only: str | None = None
    why: str = ""  # said after the expectation when only one value is supported

    def expectation(self) -> str:
        if self.kind is list:
            return f"a list of {_one_of(self.choices)}"
        if self.choices:
            return _one_of(self.choices) + (f" ({self.why})" if self.why else "")
        if self.kind is bool:
            return "true or false"
        if self.kind is str:
            return "a string"
        noun = "an integer" if self.kind is int else "a number"
        if self.lo == FLOAT32_TINY:
            return f"a positive number up to {_num(self.hi)}"
        if self.lo is not None and self.hi is not None:
            return f"{noun} in {_num(self.lo)}..{_num(self.hi)}"
        return noun

    def check(self, value: Any, where: str) -> Any:
        """`value` if it is of this field's type and range; ConfigError naming `where` otherwise."""
        ok = {
            int: lambda v: type(v) is int,
            float: lambda v: type(v) is int or (type(v) is float and math.isfinite(v)),
            bool: lambda v: type(v) is bool,
            str: lambda v: type(v) is str,
            list: lambda v: type(v) is list,
        }[self.kind](value)
        if ok and self.lo is not None and value < self.lo:
            ok = False
        if ok and self.hi is not None and value > self.hi:
            ok = False
        if ok and self.choices and self.kind is not list and value not in self.choices:
            ok = False
        if not ok:
            raise ConfigError(f"config: {where} is {quote_json(value)}, expected {self.expectation()}")
        if self.kind is list:
            item = Field(str, (), choices=self.choices)
            return tuple(item.check(v, f"{where}[{i}]") for i, v in enumerate(value))
        return float(value) if self.kind is float else value


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _one_of(choices: tuple) -> str:
    shown = [quote_json(c) for c in choices]
    return shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _size(lo: int = 1, hi: int = INT32_MAX, default: Any = REQUIRED, only: str | None = None) -> Field:
    return Field(int, (), default, lo, hi, only=only)


# Every ModelConfig field read from config.json (the model is described here and nowhere else).
FIELDS: dict[str, Field] = {
    "model_type": Field(str, ("model_type", _TOP + "model_type"), choices=DENSE_TYPES + MOE_TYPES),
    "hidden_size": _size(),
    "num_hidden_layers": _size(hi=MAX_LAYERS),
    "layer_types": Field(list, (), None, choices=(LINEAR, FULL)),
    "num_attention_heads": _size(),
    "num_key_value_heads": _size(),
    "head_dim": _size(default=256),
    "linear_num_key_heads": _size(),
    "linear_num_value_heads": _size(),
    "linear_key_head_dim": _size(default=128),
    "linear_value_head_dim": _size(default=128),
    "linear_conv_kernel_dim": _size(lo=2, default=4),
    "vocab_size": _size(),
    "rms_norm_eps": Field(float, (), 1e-6, FLOAT32_TINY, 1.0),
    "rope_theta": Field(float, ("rope_parameters.rope_theta", "rope_theta"), 10_000_000.0, FLOAT32_TINY,
                        FLOAT32_MAX),
    "partial_rotary_factor": Field(float, ("rope_parameters.partial_rotary_factor", "partial_rotary_factor"),
                                   0.25, FLOAT32_TINY, 1.0),
    "max_position_embeddings": _size(default=FAMILY_CONTEXT_MAX),
    "tie_word_embeddings": Field(bool, (_TOP + "tie_word_embeddings", "tie_word_embeddings"), False,
                                 choices=(False,), why="Qwen3.6 has an untied lm_head"),
    "mtp_num_hidden_layers": _size(lo=0, hi=1, default=0),
    "intermediate_size": _size(only="dense"),
    "num_experts": _size(only="moe"),
    "num_experts_per_tok": _size(only="moe"),
    "moe_intermediate_size": _size(only="moe"),
    "shared_expert_intermediate_size": _size(lo=0, default=0, only="moe"),
}

# Values that are read but not kept: the architecture Lampo runs has exactly these.
FIXED: dict[str, Field] = {
    "full_attention_interval": _size(hi=MAX_LAYERS, default=4),  # layer_types' default
    "hidden_act": Field(str, (), "silu", choices=("silu",)),
    "attn_output_gate": Field(bool, (), True, choices=(True,)),
    "attention_bias": Field(bool, (), False, choices=(False,)),
    "mtp_use_dedicated_embeddings": Field(bool, (), False, choices=(False,)),
    "rope_type": Field(str, ("rope_parameters.rope_type",), "default", choices=("default",)),
}


class _Reader:
    """Looks fields up in one config document, naming them by their JSON path."""

    def __init__(self, raw: Any):
        if not isinstance(raw, dict):
            raise ConfigError(f"config: the top level is {_kind(raw)}, expected a JSON object")
        self.root = raw
        self.text = raw
        self.prefix = ""
        if raw.get("text_config") is not None:
            self.prefix = "text_config."
            self.text = self._object(raw["text_config"], "text_config")

    @staticmethod
    def _object(value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config: {where} is {quote_json(value)}, expected an object")
        return value

    def where(self, path: str) -> str:
        return path[len(_TOP):] if path.startswith(_TOP) else self.prefix + path

    def lookup(self, path: str) -> Any:
        """The value at `path`, or None when it (or an object on the way) is absent or null."""
        node = self.root if path.startswith(_TOP) else self.text
        keys = path.removeprefix(_TOP).split(".")
        for i, key in enumerate(keys):
            if i:
                node = self._object(node, self.where(".".join(keys[:i])))
            node = node.get(key)
            if node is None:
                return None
        return node

    def read(self, name: str, spec: Field) -> Any:
        """The value of the first of the field's paths present; every present one is checked."""
        paths = spec.paths or (name,)
        found = [spec.check(v, self.where(p)) for p in paths if (v := self.lookup(p)) is not None]
        if found:
            return found[0]
        if spec.default is REQUIRED:
            shown = " or ".join(self.where(p) for p in paths)
            raise ConfigError(f"config: required field {shown} is missing or null, expected {spec.expectation()}")
        return spec.default


def read_text_config(raw: Any) -> dict[str, Any]:
    """ModelConfig's keyword arguments from a parsed config.json (see the module docstring)."""
    r = _Reader(raw)
    model_type = r.read("model_type", FIELDS["model_type"])
    family = "moe" if model_type in MOE_TYPES else "dense"
    values: dict[str, Any] = {"model_type": "qwen3_5_moe" if family == "moe" else "qwen3_5"}
    for name, spec in FIELDS.items():
        if name != "model_type" and spec.only in (None, family):
            values[name] = r.read(name, spec)
    fixed = {name: r.read(name, spec) for name, spec in FIXED.items()}
    n = values["num_hidden_layers"]
    if values["layer_types"] is None:
        interval = fixed["full_attention_interval"]
        values["layer_types"] = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n))
    elif len(values["layer_types"]) != n:
        raise ConfigError(f"config: {r.where('layer_types')} has {len(values['layer_types'])} entries "
                          f"but {r.where('num_hidden_layers')} is {n}")
    return values


def check_ranges(values: dict[str, Any]) -> None:
    """The table's type and range checks on a ModelConfig's own values (built in code, not read)."""
    family = "moe" if values["model_type"] == "qwen3_5_moe" else "dense"
    for name, spec in FIELDS.items():
        if name not in ("model_type", "layer_types") and spec.only in (None, family):
            spec.check(values[name], name)
