"""`lampo.keymap` against Textual's own input parser: every key Textual reports is accepted exactly
as it is reported, other spellings of it are rewritten to it, and anything else fails with a
ValueError - never another exception."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from textual._ansi_sequences import ANSI_SEQUENCES_KEYS
from textual._keyboard_protocol import FUNCTIONAL_KEYS, MODIFIER_FUNCTIONAL_KEYS
from textual._xterm_parser import XTermParser

from lampo.keymap import MODIFIERS, canonical_key, canonical_keys, key_label, types_text
from lampo.settings import DEFAULT_KEYS


def reported_keys(sequence: str) -> list[str]:
    """The keys Textual's parser reports for `sequence`, less the control characters it reports
    for a few sequences it reads as Kitty code points (e.g. "\x1b[28~" as "\x1c"): no binding can
    name those."""
    return [event.key for event in XTermParser().feed(sequence) if hasattr(event, "key") and event.key.isprintable()]


LEGACY = sorted({key.value for keys in ANSI_SEQUENCES_KEYS.values() if isinstance(keys, tuple)
                 for key in keys if not key.value.startswith("<")})
# Kitty functional keys as "code" + "u" or "~" / letter; modifier keys alone are left out (Textual
# asks for Kitty flag 1 only, under which terminals do not report them).
FUNCTIONAL = [code for code, name in FUNCTIONAL_KEYS.items() if name not in MODIFIER_FUNCTIONAL_KEYS]


def kitty_sequence(code: str, modifier_bits: int) -> str:
    """CSI code ; modifiers final, without associated text (flag 1 sends none)."""
    number, final = code[:-1], code[-1]
    return f"\x1b[{number};{modifier_bits + 1}{final}"


@pytest.mark.parametrize("key", LEGACY)
def test_every_key_of_textuals_escape_sequence_table_is_accepted_as_written(key):
    assert canonical_key(key) == key


# A Kitty terminal sends a character key as its unshifted (lower case) code point.
unshifted = st.characters(min_codepoint=33, categories=["L", "N", "P", "S"]).filter(lambda c: c.lower() == c)


@given(st.one_of(st.sampled_from(FUNCTIONAL), unshifted.map(lambda c: f"{ord(c)}u")), st.integers(0, 63))
@example("47u", 4)  # ctrl+/
@example("13u", 1)  # shift+enter
def test_every_kitty_key_textual_reports_is_accepted_as_reported(code, modifier_bits):
    for key in reported_keys(kitty_sequence(code, modifier_bits)):
        assert canonical_key(key) == key, key


@given(st.characters(categories=["L", "N", "P", "S"]))  # not spaces: Textual strips them from a binding
def test_a_typed_character_is_named_as_textual_names_it(char):
    for key in reported_keys(char):
        assert canonical_key(char) == key and types_text(key)


@given(st.lists(st.sampled_from(MODIFIERS), unique=True), st.sampled_from(["r", "up", "f5", "slash", "/"]))
def test_modifier_order_does_not_matter(modifiers, name):
    forward = canonical_key("+".join([*modifiers, name]))
    assert canonical_key("+".join([*reversed(modifiers), name])) == forward
    assert forward.split("+")[:-1] == sorted(modifiers)


@given(st.one_of(st.text(max_size=20),
                 st.lists(st.sampled_from([*MODIFIERS, "enter", "a", "A", "+", ",", "", " ", "f99", "é"]),
                          max_size=4).map("+".join)))
def test_anything_else_is_a_value_error_and_canonical_forms_are_fixed_points(text):
    try:
        keys = canonical_keys(text)
    except ValueError as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert canonical_keys(keys) == keys


@pytest.mark.parametrize("text, message", [
    ("bogus+key+zz", "'bogus' is not a modifier"),
    ("ctrl+ctrl+a", "'ctrl' twice"),
    ("ctrl+enterr", "unknown key 'enterr'"),
    ("Enter", "lower case"),
    ("ctrl+A", r"ctrl\+shift\+a"),
    ("ctrl+", "nothing after the last"),
    ("ctrl++", "empty part"),
    ("left_shift", "unknown key"),  # never reported on its own
    ("ctrl+\x01", "not a key"),
])
def test_what_is_wrong_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        canonical_key(text)


def test_defaults_are_canonical_and_type_nothing():
    for key in DEFAULT_KEYS.values():
        assert canonical_keys(key) == key and not types_text(key)


def test_labels():
    assert key_label("enter") == "Enter" and key_label("escape") == "Esc"
    assert key_label("alt+enter,f5") == "alt+Enter" and key_label("ctrl+s") == "ctrl+s"
