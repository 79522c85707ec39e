"""Key names for `[keys]` in config.toml, checked against what Textual 8.2.8 can report.

A key is written `modifier+...+key`: modifiers from alt, ctrl, hyper, meta, shift, super (those
Textual's input parser reports), then one key name from Textual's own tables (its escape-sequence
table and its Kitty-protocol table of functional keys) or one printable character, written as
itself ("/") or by Textual's name for it ("slash"). Several keys for one action are separated by
commas, as Textual's key maps allow.

`canonical_keys` returns the exact strings Textual puts in its key events - modifiers in
alphabetical order, characters by name - because a binding matches that string exactly: Textual
would accept "shift+ctrl+up" or "ctrl+/" as a binding and never fire it. Anything it cannot
report raises ValueError saying which part is wrong. `key_label` is a key as the UI's texts name
it ("Enter", "ctrl+s").

Textual's tables are read on first use, so importing this module does not import Textual.
"""

from __future__ import annotations

import functools
import itertools
import unicodedata

MODIFIERS = ("alt", "ctrl", "hyper", "meta", "shift", "super")
_MAX_NAME_WORDS = 15  # the most words in the Unicode name of a character Textual names
_LABELS = {"enter": "Enter", "escape": "Esc", "tab": "Tab", "space": "Space", "backspace": "Backspace"}


@functools.cache
def _textual_tables() -> tuple[frozenset[str], frozenset[str]]:
    """(keys Textual's escape-sequence parser reports verbatim, e.g. "ctrl+@" or "shift+tab";
    names a key can have after its modifiers, e.g. "enter", "f35", "media_play")."""
    from textual._ansi_sequences import ANSI_SEQUENCES_KEYS
    from textual._keyboard_protocol import FUNCTIONAL_KEYS, MODIFIER_FUNCTIONAL_KEYS

    reported = frozenset(key.value for keys in ANSI_SEQUENCES_KEYS.values() if isinstance(keys, tuple)
                         for key in keys if not key.value.startswith("<"))  # not <scroll-up> etc.
    # Textual asks the terminal only to disambiguate keys (Kitty flag 1), so a modifier pressed
    # alone is never reported.
    functional = set(FUNCTIONAL_KEYS.values()) - MODIFIER_FUNCTIONAL_KEYS
    names = {key.rpartition("+")[2] for key in reported} | functional
    return reported, frozenset(name for name in names if len(name) > 1)


def character_key(char: str) -> str:
    """Textual's name for the key of a printable character: "a", "slash", "question_mark"."""
    from textual.keys import _character_to_key

    return _character_to_key(char)


def _character_of(name: str) -> str | None:
    """The printable character Textual names `name`, if it does ("slash" -> "/", "a" -> "a")."""
    from textual.keys import REPLACED_KEYS

    if len(name) == 1:
        return name if name.isprintable() and character_key(name) == name else None
    # Textual names a character by its Unicode name in lower case, spaces and hyphens turned into
    # underscores ("emoji_modifier_fitzpatrick_type_1_2"): try both for each underscore.
    words = REPLACED_KEYS.get(name, name).upper().split("_")
    if len(words) > _MAX_NAME_WORDS:
        return None
    for separators in itertools.product(" -", repeat=len(words) - 1):
        try:
            char = unicodedata.lookup(words[0] + "".join(map(str.__add__, separators, words[1:])))
        except KeyError:
            continue
        if len(char) == 1 and char.isprintable() and character_key(char) == name:
            return char
    return None


def types_text(key: str) -> bool:
    """Whether pressing `key` (canonical) in the prompt types a character."""
    *modifiers, name = key.split("+")
    return set(modifiers) <= {"shift"} and _character_of(name) is not None


def canonical_key(text: str) -> str:
    """One key as Textual reports it; ValueError naming the part it cannot report."""
    reported, names = _textual_tables()
    key = text.strip()
    if not key:
        raise ValueError("an empty key (the space key is written space, the comma key comma)")
    if key in reported:
        return key
    if len(key) == 1:
        if not key.isprintable():
            raise ValueError(f"{key!r} is not a printable character")
        return character_key(key)
    *modifiers, name = key.split("+")
    for modifier in modifiers:
        if not modifier:
            raise ValueError("an empty part between + signs (the + key is written plus)")
        if modifier not in MODIFIERS:
            raise ValueError(f"{modifier!r} is not a modifier")
        if modifiers.count(modifier) > 1:
            raise ValueError(f"{modifier!r} twice")
    if not name:
        raise ValueError("nothing after the last + (the + key is written plus)")
    if len(name) == 1:
        if not name.isprintable() or name.isspace():
            raise ValueError(f"{name!r} is not a key (a space is written space)")
        if name != name.lower():
            shifted = "+".join([*sorted({*modifiers, "shift"}), name.lower()])
            raise ValueError(f"a letter after a modifier is lower case: {shifted}")
        name = character_key(name)
    elif name not in names and _character_of(name) is None:
        hint = " (key names are lower case)" if name.lower() in names or _character_of(name.lower()) else ""
        raise ValueError(f"unknown key {name!r}{hint}")
    return "+".join([*sorted(modifiers), name])


def canonical_keys(text: str) -> str:
    """A comma-separated list of keys, each as Textual reports it; ValueError if one is wrong or
    one is listed twice."""
    keys = [canonical_key(part) for part in text.split(",")]
    for key in keys:
        if keys.count(key) > 1:
            raise ValueError(f"{key} is listed twice")
    return ",".join(keys)


def key_label(keys: str) -> str:
    """The first of `keys` (canonical) as the UI's texts name it: "Enter", "alt+Enter", "ctrl+s"."""
    return "+".join(_LABELS.get(part, part) for part in keys.split(",")[0].split("+"))
