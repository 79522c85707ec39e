"""Plain and pipe mode read bytes that are not UTF-8 as U+FFFD: the REPL's terminal input (on a
real pseudo-terminal) and the whole of a piped stdin. prompt_toolkit's own input would hand a
lone surrogate on, which the tokenizer refuses ("TextInputSequence must be str")."""

from __future__ import annotations

import io
import os
import time

from prompt_toolkit.input.vt100 import Vt100Input

from lampo.plain import read_stdin
from lampo.plain_input import ReplacingInput


def typed(input_class, data: bytes, expected_length: int) -> str:
    """What `input_class` on a terminal reads of `data` typed into it (Enter is "\\r")."""
    main, secondary = os.openpty()
    with open(secondary, encoding="utf-8") as stdin:
        terminal = input_class(stdin)
        with terminal.raw_mode():  # as while the prompt runs: no line editing, "\r" stays "\r"
            os.write(main, data)
            text, deadline = "", time.monotonic() + 30
            while len(text) < expected_length and time.monotonic() < deadline:
                text += "".join(key.data for key in terminal.read_keys())
                time.sleep(0.01)
    os.close(main)
    return text


def test_prompt_toolkit_alone_lets_a_lone_surrogate_through():
    """The root of the plain REPL's crash (if prompt_toolkit changes this, the test says so)."""
    assert typed(Vt100Input, b"caf\xe9\r", 5) == "caf\udce9\r"


def test_the_repl_input_reads_bytes_that_are_not_utf8_as_replacement_characters():
    assert typed(ReplacingInput, b"caf\xe9 \xff\xfe\xe2\x82\xac\r", 9) == "caf\ufffd \ufffd\ufffd\u20ac\r"


def test_piped_stdin_that_is_not_utf8_reads_as_replacement_characters():
    stdin = io.TextIOWrapper(io.BytesIO(b"caf\xe9 au lait\xff"), encoding="utf-8")
    assert read_stdin(stdin) == "caf\ufffd au lait\ufffd"
