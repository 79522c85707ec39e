"""Settings: commented template on first run, round trip, and one clear line for bad values, bad
key bindings (keys Textual cannot report, clashes, fixed keys) and unreadable files."""

import tomllib
from dataclasses import replace

import pytest

from lampo import paths
from lampo.engine.speculation import Speculation
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
        thinking=False, speculation=Speculation("mtp", 3), theme="light", paste_threshold=0,
        keys={**DEFAULT_KEYS, "regenerate": "f5"},
    )
    assert load_settings(write_settings(s)) == s
    assert load_settings(write_settings(Settings())) == Settings()


def test_partial_file_takes_defaults(home):
    paths.config_file().write_text('backend = "cuda"\n[sampling]\ntemperature = 1\n')
    s = load_settings()
    assert s.backend == "cuda" and s.sampling.temperature == 1.0 and s.sampling.top_k == 20
    assert s.keys == DEFAULT_KEYS


def assert_refused_in_one_line(words) -> None:
    """Loading the settings fails with one line that names the file and holds every word."""
    with pytest.raises(SettingsError) as e:
        load_settings()
    message = str(e.value)
    assert message.startswith(f"{paths.config_file()}: ") and "\n" not in message
    for word in words:
        assert word in message, (word, message)


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
    ('[speculation]\nmode = "always"', ["speculation.mode", "'always'", "auto | off | mtp | ngram"]),
    ("[speculation]\nmode = 1", ["speculation.mode", "a string"]),
    ("[speculation]\ndrafts = 5", ["speculation.drafts", "5", '"auto" or a draft count from 1 to 4']),
    ('[speculation]\ndrafts = "3"', ["speculation.drafts", "'3'", "from 1 to 4"]),
    ("[speculation]\ndrafts = true", ["speculation.drafts", "True", "from 1 to 4"]),
    ('[speculation]\nmode = "off"\ndrafts = 2', ["speculation.drafts = 2", 'while speculation.mode is "off"']),
    ("[speculation]\nk = 2", ["speculation.k", "speculation.mode, speculation.drafts"]),
    ("speculation = \"mtp\"", ["speculation", "table"]),
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
    assert_refused_in_one_line(words)


@pytest.mark.parametrize("text, want", [
    ('mode = "ngram"', Speculation("ngram")),
    ('drafts = 2', Speculation("auto", 2)),
    ('mode = "mtp"\ndrafts = "auto"', Speculation("mtp")),
    ('mode = "off"', Speculation("off")),
])
def test_speculation_table(home, text, want):
    paths.config_file().write_text(f"[speculation]\n{text}\n")
    assert load_settings().speculation == want


def test_parse_sampling_over_a_base():
    base = SamplingParams(temperature=0.3, seed=5)
    assert parse_sampling({"top_k": 5}, base=base) == replace(base, top_k=5)


def test_render_is_valid_toml_for_defaults():
    assert tomllib.loads(render_settings(Settings()))["sampling"]["top_k"] == 20


# ---- [keys]: only keys Textual can deliver, no clashes --------------------------------------------
@pytest.mark.parametrize("text, words", [
    ('[keys]\nsend = "bogus+key+zz"', ["keys.send", "'bogus+key+zz'", "'bogus' is not a modifier", "ctrl+r", "alt"]),
    ('[keys]\nsend = "ctrl+enterr"', ["keys.send", "unknown key 'enterr'"]),
    ('[keys]\nsend = "F5"', ["keys.send", "unknown key 'F5'", "lower case"]),
    ('[keys]\nregenerate = "ctrl+R"', ["keys.regenerate", "ctrl+shift+r"]),
    ('[keys]\nregenerate = "ctrl+ctrl+r"', ["keys.regenerate", "'ctrl' twice"]),
    ('[keys]\nregenerate = "ctrl+r,"', ["keys.regenerate", "empty key", "comma"]),
    ('[keys]\nregenerate = "ctrl+n"', ["keys.regenerate = 'ctrl+n'", "keys.new_chat", "clash"]),
    ('[keys]\nnew_chat = "f5"\nregenerate = "ctrl+r,f5"', ["keys.regenerate", "keys.new_chat", "f5"]),
    ('[keys]\nsend = "ctrl+j"', ["keys.send", "ctrl+j", "newline", "cannot be rebound"]),
    ('[keys]\nchats = "ctrl+p"', ["keys.chats", "ctrl+p", "command palette"]),
    ('[keys]\nexport = "f2"', ["keys.export", "f2", "settings"]),
    ('[keys]\nquit = "ctrl+up"', ["keys.quit", "ctrl+up", "previous message"]),
    ('[keys]\nsend = "a"', ["keys.send", "'a'", "types a character"]),
    ('[keys]\nstop = "shift+space"', ["keys.stop", "types a character"]),
    ('[keys]\ncopy_last = "f4,f4"', ["keys.copy_last", "f4", "twice"]),
])
def test_key_bindings_are_checked(home, text, words):
    paths.config_file().write_text(text + "\n")
    assert_refused_in_one_line(words)


@pytest.mark.parametrize("written, bound", [
    ("f5", "f5"),
    ("shift+ctrl+up", "ctrl+shift+up"),  # Textual reports modifiers in alphabetical order
    ("ctrl+/", "ctrl+slash"),  # and characters by name
    ("alt+?", "alt+question_mark"),
    ("ctrl+shift+1", "ctrl+shift+1"),
    ("ctrl+@", "ctrl+@"),  # a name in Textual's own table, kept as written
    (" ctrl+r , f6 ", "ctrl+r,f6"),
    ("super+enter", "super+enter"),
    ("ctrl+plus", "ctrl+plus"),
])
def test_key_bindings_are_stored_as_textual_reports_them(home, written, bound):
    paths.config_file().write_text(f'[keys]\nregenerate = "{written}"\n')
    assert load_settings().keys["regenerate"] == bound


def test_swapping_two_keys_is_not_a_clash(home):
    paths.config_file().write_text('[keys]\nregenerate = "ctrl+n"\nnew_chat = "ctrl+r"\n')
    keys = load_settings().keys
    assert (keys["regenerate"], keys["new_chat"]) == ("ctrl+n", "ctrl+r")


# ---- the file itself ------------------------------------------------------------------------------
@pytest.mark.parametrize("content, words", [
    pytest.param(b"backend = \"caf\xe9\"\n", ["not UTF-8", "byte 14"], id="latin-1"),
    pytest.param(b"a = " + b"[" * 5000, ["not valid TOML", "nested"], id="nested-5000"),
    pytest.param(b'"bad\\nkey" = 1\n', ['unknown setting "bad\\nkey"'], id="newline-in-key"),
    pytest.param(b'[sampling]\n"x y" = 1\n', ['unknown setting sampling."x y"'], id="quoted-key"),
])
def test_unreadable_files_are_one_line_naming_the_file(home, content, words):
    paths.config_file().write_bytes(content)
    assert_refused_in_one_line(words)


def test_a_settings_path_that_is_a_directory_is_one_line(home):
    paths.config_file().mkdir(parents=True)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings()
