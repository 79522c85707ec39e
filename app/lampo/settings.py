"""User settings: `config.toml` in the config dir, created with comments on first run.

Read with `tomllib`; written by `render_settings` (our own commented template, no TOML writer
dependency), so `load_settings(write_settings(s)) == s`. Every value is checked: a wrong one
raises `SettingsError` naming the key, the bad value and what is allowed. Keys missing from the
file take their defaults, so an old file keeps working after an upgrade.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from lampo import paths
from lampo.models.sampling_params import SamplingParams

BACKENDS = ("auto", "cuda", "reference")
THEMES = ("dark", "light")
CONTEXT_RANGE = (256, 262_144)

# Action -> key, in Textual's key names. The TUI binds these; plain mode documents its own keys.
DEFAULT_KEYS: Mapping[str, str] = MappingProxyType({
    "send": "enter",
    "newline": "shift+enter",
    "stop": "escape",
    "regenerate": "ctrl+r",
    "edit_last": "ctrl+e",
    "new_chat": "ctrl+n",
    "chats": "ctrl+o",
    "toggle_thinking": "ctrl+t",
    "toggle_hud": "ctrl+h",
    "copy_last": "ctrl+y",
    "attach": "ctrl+a",
    "export": "ctrl+s",
    "quit": "ctrl+q",
})


class SettingsError(ValueError):
    """An invalid config.toml value; the message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class Settings:
    model_dir: str = ""  # "" = the random-weight demo checkpoint
    backend: str = "auto"
    context: int = 262_144
    sampling: SamplingParams = field(default_factory=SamplingParams)
    thinking: bool = True
    theme: str = "dark"
    paste_threshold: int = 2500  # pasted text at least this long becomes an attachment; 0 = never
    keys: Mapping[str, str] = field(default_factory=lambda: DEFAULT_KEYS)


def load_settings(path: Path | None = None) -> Settings:
    """Read the settings file, writing the commented default one first if there is none."""
    path = path or paths.config_file()
    if not path.exists():
        write_settings(Settings(), path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None
    try:
        return parse_settings(raw)
    except SettingsError as e:
        raise SettingsError(f"{path}: {e}") from None


def write_settings(settings: Settings, path: Path | None = None) -> Path:
    path = path or paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(render_settings(settings), encoding="utf-8")
    tmp.replace(path)
    return path


# ---- parsing -----------------------------------------------------------------------------------
def _bad(key: str, value: Any, allowed: str) -> SettingsError:
    return SettingsError(f"{key} = {value!r} is invalid: expected {allowed}")


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _get(table: Mapping[str, Any], prefix: str, key: str, kind: type, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    name = f"{prefix}{key}"
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise _bad(name, value, _KIND_NAMES[kind])
    if kind is float and not math.isfinite(value):
        raise _bad(name, value, "a finite number")
    return value


def _check_keys(table: Mapping[str, Any], prefix: str, allowed: tuple[str, ...]) -> None:
    for key in table:
        if key not in allowed:
            raise SettingsError(f"unknown setting {prefix}{key!s}; known: {', '.join(prefix + a for a in allowed)}")


def parse_settings(raw: Mapping[str, Any]) -> Settings:
    d = Settings()
    _check_keys(raw, "", ("model", "backend", "context", "thinking", "sampling", "ui", "keys"))
    model = _get(raw, "", "model", str, d.model_dir)
    backend = _get(raw, "", "backend", str, d.backend)
    if backend not in BACKENDS:
        raise _bad("backend", backend, " | ".join(BACKENDS))
    context = _get(raw, "", "context", int, d.context)
    if not CONTEXT_RANGE[0] <= context <= CONTEXT_RANGE[1]:
        raise _bad("context", context, f"an integer from {CONTEXT_RANGE[0]:,} to {CONTEXT_RANGE[1]:,}")
    thinking = _get(raw, "", "thinking", bool, d.thinking)
    return Settings(
        model_dir=model, backend=backend, context=context, thinking=thinking,
        sampling=parse_sampling(_table(raw, "sampling"), "sampling."),
        **_parse_ui(_table(raw, "ui")),
        keys=_parse_keys(_table(raw, "keys")),
    )


def parse_sampling(table: Mapping[str, Any], prefix: str = "", base: SamplingParams | None = None) -> SamplingParams:
    """Sampling values from a TOML table (or a /set command); unknown keys and bad values raise."""
    base = base or SamplingParams()
    kinds = {f.name: (int if f.name in ("top_k", "max_tokens", "seed") else float) for f in fields(SamplingParams)}
    _check_keys(table, prefix, tuple(kinds))
    values = {k: _get(table, prefix, k, kinds[k], getattr(base, k)) for k in kinds}
    params = SamplingParams(**values)
    try:
        params.validate()
    except ValueError as e:  # "<key> must be <allowed> (got <value>)"
        raise SettingsError(f"{prefix}{e}") from None
    return params


def _table(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise _bad(key, value, "a table")
    return value


def _parse_ui(table: Mapping[str, Any]) -> dict[str, Any]:
    d = Settings()
    _check_keys(table, "ui.", ("theme", "paste_threshold"))
    theme = _get(table, "ui.", "theme", str, d.theme)
    if theme not in THEMES:
        raise _bad("ui.theme", theme, " | ".join(THEMES))
    threshold = _get(table, "ui.", "paste_threshold", int, d.paste_threshold)
    if threshold < 0:
        raise _bad("ui.paste_threshold", threshold, "a character count >= 0 (0 disables)")
    return {"theme": theme, "paste_threshold": threshold}


def _parse_keys(table: Mapping[str, Any]) -> Mapping[str, str]:
    _check_keys(table, "keys.", tuple(DEFAULT_KEYS))
    keys = dict(DEFAULT_KEYS)
    for action, key in table.items():
        if not isinstance(key, str) or not key.strip():
            raise _bad(f"keys.{action}", key, 'a key name such as "ctrl+r"')
        keys[action] = key
    return MappingProxyType(keys)


# ---- writing -----------------------------------------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)  # JSON string escapes are valid TOML basic strings


def render_settings(s: Settings) -> str:
    sp = s.sampling
    seed = f"seed = {sp.seed}" if sp.seed is not None else "# seed = 1234"
    keys = "\n".join(f"{action} = {_toml(key)}" for action, key in s.keys.items())
    return f"""\
# Lampo settings. Edit freely; Lampo checks every value at start-up and names any bad one.

# Checkpoint directory (Hugging Face format: config.json, *.safetensors, tokenizer.json).
# Empty: use the small random-weight demo checkpoint (it talks gibberish).
model = {_toml(s.model_dir)}

# Engine: "auto" (cuda when an NVIDIA GPU and the CUDA extension are available), "cuda",
# or "reference" (numpy on the CPU; slow, for small checkpoints).
backend = {_toml(s.backend)}

# Maximum context in tokens ({CONTEXT_RANGE[0]:,} to {CONTEXT_RANGE[1]:,}). Prompts that do not fit
# are refused, never truncated.
context = {_toml(s.context)}

# Let the model think (<think> ... </think>) before answering. Toggle per chat with /think.
thinking = {_toml(s.thinking)}

# Default sampling for new chats (each chat keeps its own copy; change it with /set).
[sampling]
temperature = {_toml(sp.temperature)}   # 0 = greedy
top_k = {_toml(sp.top_k)}   # 0 = off
top_p = {_toml(sp.top_p)}   # 1.0 = off
min_p = {_toml(sp.min_p)}   # 0.0 = off
presence_penalty = {_toml(sp.presence_penalty)}   # -2.0 to 2.0
max_tokens = {_toml(sp.max_tokens)}   # per reply
{seed}   # fixed seed for reproducible sampling; leave commented for a random one

[ui]
theme = {_toml(s.theme)}   # "dark" or "light"
# A paste of at least this many characters becomes an attachment chip; 0 = never.
paste_threshold = {_toml(s.paste_threshold)}

# Key bindings of the full-screen UI, action = key (Textual key names, e.g. "ctrl+r", "f5").
[keys]
{keys}
"""
