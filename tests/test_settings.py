"""Settings: commented template on first run, round trip, and clear errors for bad values."""

import tomllib
from dataclasses import replace

import pytest

from lampo import paths
from lampo.models.sampling_params import SamplingParams
from lampo.settings import (
    DEFAULT_KEYS,
    Settings,
    SettingsError,
    load_settings,
    parse_sampling,
    render_settings,
    write_settings,
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    return tmp_path


def test_first_run_creates_commented_defaults(home):
    s = load_settings()
    assert s == Settings()
    path = home / "config" / "config.toml"
    assert paths.config_file() == path
    text = path.read_text()
    assert text.count("#") > 10 and "paste_threshold = 2500" in text
    assert tomllib.loads(text)["keys"]["regenerate"] == "ctrl+r"


def test_round_trip_of_non_default_values(home):
    s = Settings(
        model_dir='/models/Qwen3.6 "35B"\\x', backend="reference", context=32768,
        sampling=SamplingParams(temperature=1e-05, top_k=0, top_p=0.8, min_p=0.05,
                                presence_penalty=-1.5, max_tokens=77, seed=42),
        thinking=False, theme="light", paste_threshold=0,
        keys={**DEFAULT_KEYS, "regenerate": "f5"},
    )
    assert load_settings(write_settings(s)) == s
    assert load_settings(write_settings(Settings())) == Settings()


def test_partial_file_takes_defaults(home):
    paths.config_file().write_text('backend = "cuda"\n[sampling]\ntemperature = 1\n')
    s = load_settings()
    assert s.backend == "cuda" and s.sampling.temperature == 1.0 and s.sampling.top_k == 20
    assert s.keys == DEFAULT_KEYS


@pytest.mark.parametrize("text, words", [
    ('backend = "gpu"', ["backend", "'gpu'", "auto | cuda | reference"]),
    ("context = 10", ["context", "10", "256"]),
    ('context = "big"', ["context", "'big'", "an integer"]),
    ("thinking = 1", ["thinking", "true or false"]),
    ("[sampling]\ntemperature = -1", ["sampling.temperature", ">= 0", "-1"]),
    ("[sampling]\ntop_p = 0.0", ["sampling.top_p", "(0, 1]"]),
    ("[sampling]\ntop_k = 2.5", ["sampling.top_k", "2.5", "an integer"]),
    ("[sampling]\ntemperature = true", ["sampling.temperature", "True", "a number"]),
    ("[sampling]\ntemprature = 1", ["sampling.temprature", "sampling.temperature"]),
    ('[ui]\ntheme = "blue"', ["ui.theme", "'blue'", "dark | light"]),
    ("[ui]\npaste_threshold = -5", ["ui.paste_threshold", "-5"]),
    ('[keys]\nfly = "f1"', ["keys.fly", "keys.regenerate"]),
    ('[keys]\nquit = ""', ["keys.quit", "key name"]),
    ("sampling = 3", ["sampling", "table"]),
    ("colour = 1", ["colour", "backend"]),
    ("this is not toml", ["not valid TOML"]),
])
def test_invalid_values_name_key_value_and_allowed(home, text, words):
    paths.config_file().write_text(text + "\n")
    with pytest.raises(SettingsError) as e:
        load_settings()
    for word in words:
        assert word in str(e.value)
    assert str(paths.config_file()) in str(e.value)


def test_parse_sampling_over_a_base():
    base = SamplingParams(temperature=0.3, seed=5)
    assert parse_sampling({"top_k": 5}, base=base) == replace(base, top_k=5)


def test_render_is_valid_toml_for_defaults():
    assert tomllib.loads(render_settings(Settings()))["sampling"]["top_k"] == 20
