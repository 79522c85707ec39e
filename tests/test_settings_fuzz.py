"""Fuzzing the config.toml loader: whatever the file holds, `load_settings` returns `Settings`
or raises `SettingsError` with one line that starts with the file's path - never anything else.

Documents are built from the real keys (and misspelt ones) with values of every TOML type, so most
of them get past the TOML parser and exercise the checks; key bindings get arbitrary strings and
strings assembled from Textual's own key names. Arbitrary text and bytes cover the parser.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import fields

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from lampo.models.sampling_params import SamplingParams
from lampo.settings import CONTEXT_RANGE, DEFAULT_KEYS, Settings, SettingsError, load_settings, write_settings


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    """One config.toml for the module (Hypothesis reruns a test body, not a fixture)."""
    return tmp_path_factory.mktemp("config") / "config.toml"


# ---- a small TOML writer for the generated documents ---------------------------------------------
def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else toml_string(key)


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_document(doc: dict) -> str:
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{toml_key(name)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


# ---- strategies -------------------------------------------------------------------------------------
scalars = st.one_of(
    st.booleans(), st.integers(), st.integers(min_value=-300, max_value=300_000),
    st.floats(), st.text(max_size=20), st.dates(), st.times(),
    st.sampled_from(["auto", "cuda", "reference", "dark", "light", "", "off", "mtp", "ngram"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
misspelt = st.text(max_size=12)

key_words = st.sampled_from(["ctrl", "shift", "alt", "meta", "super", "hyper", "enter", "escape",
                             "f5", "f35", "tab", "space", "up", "pageup", "slash", "a", "R", "@",
                             "+", ",", "bogus", "ctrl+j", "ctrl+n", "ctrl+p", "f2", " "])
key_specs = st.one_of(st.text(max_size=16), st.lists(key_words, min_size=1, max_size=4).map("+".join),
                      st.lists(key_words, min_size=1, max_size=3).map(",".join))

SAMPLING_KEYS = [f.name for f in fields(SamplingParams)]


def table(keys, value_strategy):
    return st.dictionaries(st.one_of(st.sampled_from(keys), misspelt), value_strategy, max_size=len(keys) + 1)


hostile_documents = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.text(max_size=30), values),
    "backend": values,
    "context": st.one_of(st.integers(CONTEXT_RANGE[0] - 2, CONTEXT_RANGE[1] + 2), values),
    "thinking": values,
    "sampling": st.one_of(table(SAMPLING_KEYS, values), values),
    "speculation": st.one_of(table(["mode", "drafts"], values), values),
    "ui": st.one_of(table(["theme", "paste_threshold"], values), values),
    "keys": st.one_of(table(list(DEFAULT_KEYS), st.one_of(key_specs, values)), values),
}).flatmap(lambda doc: st.dictionaries(misspelt, values, max_size=1).map(lambda extra: {**doc, **extra}))

# Documents of the right types, mostly in range: these get past the type checks to the range,
# sampling and key-binding checks, and load when all of those pass.
bound_keys = st.builds(lambda modifiers, name: "+".join([*modifiers, name]),
                       st.lists(st.sampled_from(["ctrl", "alt", "shift", "super", "meta", "hyper"]),
                                unique=True, max_size=2),
                       st.sampled_from(["r", "x", "f5", "f12", "enter", "up", "pageup", "slash", "delete"]))
typed_documents = st.fixed_dictionaries({}, optional={
    "model": st.text(max_size=30),
    "backend": st.sampled_from(["auto", "cuda", "reference"]),
    "context": st.integers(CONTEXT_RANGE[0], CONTEXT_RANGE[1]),
    "thinking": st.booleans(),
    "sampling": st.fixed_dictionaries({}, optional={
        "temperature": st.floats(0, 2), "top_k": st.integers(0, 100), "top_p": st.floats(0.01, 1),
        "min_p": st.floats(0, 0.99), "presence_penalty": st.floats(-2, 2),
        "max_tokens": st.integers(1, 100_000), "seed": st.integers(0, 2**63 - 1)}),
    "speculation": st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["auto", "off", "mtp", "ngram"]),
                                                       "drafts": st.one_of(st.just("auto"), st.integers(0, 5))}),
    "ui": st.fixed_dictionaries({}, optional={"theme": st.sampled_from(["dark", "light"]),
                                              "paste_threshold": st.integers(0, 10**6)}),
    "keys": st.dictionaries(st.sampled_from(list(DEFAULT_KEYS)), bound_keys, max_size=3),
})
documents = st.one_of(typed_documents, hostile_documents)


def check_load(path) -> None:
    try:
        settings = load_settings(path)
    except SettingsError as e:
        message = str(e)
        assert message.startswith(f"{path}: "), message
        assert "\n" not in message and "\r" not in message, message
        event("refused")
    else:
        event("loaded")
        assert isinstance(settings, Settings)
        settings.sampling.validate()
        assert CONTEXT_RANGE[0] <= settings.context <= CONTEXT_RANGE[1]
        copy = path.with_name("written.toml")  # what Lampo writes back reads back the same
        assert load_settings(write_settings(settings, copy)) == settings


@given(documents)
@example({"keys": {"send": "bogus+key+zz"}})
@example({"keys": {"regenerate": "ctrl+n"}})
@example({"a\nb": 1})
@example({"model": "models/\x7f"})  # DEL: TOML wants it escaped
def test_generated_documents_load_or_fail_in_one_line(config_path, doc):
    config_path.write_text(toml_document(doc), encoding="utf-8")
    check_load(config_path)


@given(st.text(max_size=200))
@example("a = " + "[" * 3000)
@example('"\\n" = 1')
def test_arbitrary_text_loads_or_fails_in_one_line(config_path, text):
    config_path.write_text(text, encoding="utf-8", newline="")
    check_load(config_path)


@given(st.binary(max_size=200))
@example(b'theme = "caf\xe9"')
@example(b"\xff\xfe")
def test_arbitrary_bytes_load_or_fail_in_one_line(config_path, data):
    config_path.write_bytes(data)
    check_load(config_path)
