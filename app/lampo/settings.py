"""User settings: `config.toml` in the config dir, created with comments on first run.

Read with `tomllib`; written by `render_settings` (our own commented template, no TOML writer
dependency), so `load_settings(write_settings(s)) == s`. Every value is checked: a wrong one
raises `SettingsError`, one line naming the file, the key, the bad value and what is allowed; so
does a file that cannot be read, is not UTF-8 or is not TOML. Keys missing from the file take
their defaults, so an old file keeps working after an upgrade.

Key bindings (`[keys]`) are stored as Textual reports the keys (`lampo.keymap`); a key Textual
cannot report, a key two actions share, one of `FIXED_KEYS` or one that types a character in the
prompt is refused.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from lampo import paths
from lampo.engine.speculation import MAX_DRAFTS, Speculation
from lampo.keymap import MODIFIERS, canonical_keys, types_text
from lampo.models.draft_policy import MODES as SPECULATION_MODES
from lampo.models.config_schema import FAMILY_CONTEXT_MAX
from lampo.models.sampling_params import SamplingParams

BACKENDS = ("auto", "cuda", "reference")
THEMES = ("dark", "light")
CONTEXT_RANGE = (256, FAMILY_CONTEXT_MAX)  # --context on the command line takes the same range
CONTEXT_EXPECTED = f"an integer from {CONTEXT_RANGE[0]:,} to {CONTEXT_RANGE[1]:,}"

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
# Keys the full-screen UI binds whatever [keys] says (a key there may not take one of them).
FIXED_KEYS: Mapping[str, str] = MappingProxyType({
    "ctrl+j": "newline",
    "ctrl+up": "previous message",
    "ctrl+down": "next message",
    "ctrl+pageup": "load earlier messages",
    "f2": "settings",
    "ctrl+p": "the command palette",
    "ctrl+c": "copy the selected text",
    "super+c": "copy the selected text",
    "tab": "focus the next widget",
    "shift+tab": "focus the previous widget",
})
KEYS_EXPECTED = (f'a Textual key name such as "ctrl+r", "f5", "alt+enter" or "ctrl+slash" (modifiers: '
                 f'{", ".join(MODIFIERS)}; several keys: "ctrl+r,f5")')


class SettingsError(ValueError):
    """An invalid config.toml value; the message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class Settings:
    model_dir: str = ""  # "" = the random-weight demo checkpoint
    backend: str = "auto"
    context: int = FAMILY_CONTEXT_MAX
    sampling: SamplingParams = field(default_factory=SamplingParams)
    thinking: bool = True
    speculation: Speculation = Speculation()
    theme: str = "dark"
    paste_threshold: int = 2500  # pasted text at least this long becomes an attachment; 0 = never
    keys: Mapping[str, str] = field(default_factory=lambda: DEFAULT_KEYS)


class SettingsUnsaved(SettingsError):
    """There is no settings file and none can be written (read-only config directory): the caller
    may run on the defaults, saying so with this message."""


def load_settings(path: Path | None = None) -> Settings:
    """Read the settings file, writing the commented default one first if there is none."""
    path = path or paths.config_file()
    if not path.exists():
        try:
            write_settings(Settings(), path)
        except OSError as e:
            raise SettingsUnsaved(f"{path}: the settings file cannot be created ({e.strerror or e}); using the "
                                  f"default settings, and changes to them will not be saved") from None
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SettingsError(f"{path}: cannot read or create the settings file: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SettingsError(f"{path}: not UTF-8 text (byte {e.start}, line {line}); TOML files are UTF-8") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise SettingsError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
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
_SHOWN_CHARS = 80  # a value longer than this is shown cut, so the error stays one readable line


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _name(prefix: str, key: str) -> str:
    """A setting's dotted name, the key quoted as TOML would when it is not a bare key."""
    return prefix + (key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key))


def _bad(key: str, value: Any, allowed: str) -> SettingsError:
    return SettingsError(f"{key} = {_shown(value)} is invalid: expected {allowed}")


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
            known = ", ".join(prefix + a for a in allowed)
            raise SettingsError(f"unknown setting {_name(prefix, key)}; known: {known}")


def parse_settings(raw: Mapping[str, Any]) -> Settings:
    d = Settings()
    _check_keys(raw, "", ("model", "backend", "context", "thinking", "sampling", "speculation", "ui", "keys"))
    model = _get(raw, "", "model", str, d.model_dir)
    backend = _get(raw, "", "backend", str, d.backend)
    if backend not in BACKENDS:
        raise _bad("backend", backend, " | ".join(BACKENDS))
    context = _get(raw, "", "context", int, d.context)
    if not CONTEXT_RANGE[0] <= context <= CONTEXT_RANGE[1]:
        raise _bad("context", context, CONTEXT_EXPECTED)
    thinking = _get(raw, "", "thinking", bool, d.thinking)
    return Settings(
        model_dir=model, backend=backend, context=context, thinking=thinking,
        sampling=parse_sampling(_table(raw, "sampling"), "sampling."),
        speculation=_parse_speculation(_table(raw, "speculation")),
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


def _parse_speculation(table: Mapping[str, Any]) -> Speculation:
    _check_keys(table, "speculation.", ("mode", "drafts"))
    mode = _get(table, "speculation.", "mode", str, Settings().speculation.mode)
    if mode not in SPECULATION_MODES:
        raise _bad("speculation.mode", mode, " | ".join(SPECULATION_MODES))
    drafts = table.get("drafts", "auto")
    if drafts != "auto" and (type(drafts) is not int or not 1 <= drafts <= MAX_DRAFTS):
        raise _bad("speculation.drafts", drafts, f'"auto" or a draft count from 1 to {MAX_DRAFTS}')
    if mode == "off" and drafts != "auto":
        raise _bad("speculation.drafts", drafts, '"auto" while speculation.mode is "off" (it makes no drafts)')
    return Speculation(mode, None if drafts == "auto" else drafts)


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
    if not table:
        return DEFAULT_KEYS  # (checked by the tests) without reading Textual's key tables
    keys = dict(DEFAULT_KEYS)
    for action, value in table.items():
        if not isinstance(value, str) or not value.strip():
            raise _bad(f"keys.{action}", value, KEYS_EXPECTED)
        try:
            keys[action] = canonical_keys(value)
        except ValueError as e:
            raise SettingsError(f"keys.{action} = {_shown(value)} is invalid: {e}; "
                                f"expected {KEYS_EXPECTED}") from None
    # Check the defaults first, so that a clash is reported on the entry the file changed.
    owner: dict[str, str] = {}
    for action in sorted(keys, key=lambda a: a in table):
        for key in keys[action].split(","):
            where = f"keys.{action} = {_shown(table.get(action, keys[action]))} is invalid"
            if key in FIXED_KEYS:
                raise SettingsError(f"{where}: {key} is bound to {FIXED_KEYS[key]} and cannot be rebound")
            if types_text(key):
                raise SettingsError(f"{where}: the key {key} types a character in the prompt; "
                                    "add a modifier such as ctrl+ or alt+")
            if key in owner:
                other = owner[key]
                raise SettingsError(f"{where}: {key} clashes with keys.{other} = {keys[other]!r}"
                                    f"{'' if other in table else ' (its default)'}; each key can do one thing")
            owner[key] = action
    return MappingProxyType(keys)


# ---- writing -----------------------------------------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # JSON's string escapes are valid in a TOML basic string; DEL, which JSON leaves raw, is not.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def render_settings(s: Settings) -> str:
    sp, spec = s.sampling, s.speculation
    drafts = _toml("auto" if spec.drafts is None else spec.drafts)
    seed = f"seed = {sp.seed}" if sp.seed is not None else "# seed = 1234"
    keys = "\n".join(f"{action} = {_toml(key)}" for action, key in s.keys.items())
    fixed = ", ".join(FIXED_KEYS)
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

# Speculative decoding: cheap drafts (the checkpoint's MTP layer, or text the conversation repeats)
# checked by the model in one pass, so a step can emit several tokens; the output is the same.
# `--speculate MODE[:DRAFTS]` overrides this for one run.
[speculation]
mode = {_toml(spec.mode)}   # "auto" (MTP drafts, n-gram drafts where the context repeats), "mtp", "ngram" or "off"
drafts = {drafts}   # per round: "auto" (as they pay) or 1 to {MAX_DRAFTS} (forced)

[ui]
theme = {_toml(s.theme)}   # "dark" or "light"
# A paste of at least this many characters becomes an attachment chip; 0 = never.
paste_threshold = {_toml(s.paste_threshold)}

# Key bindings of the full-screen UI, action = key: Textual key names such as "ctrl+r", "f5" or
# "alt+enter" (modifiers {", ".join(MODIFIERS)}), several separated by commas.
# Bound whatever this says: {fixed}.
[keys]
{keys}
"""
