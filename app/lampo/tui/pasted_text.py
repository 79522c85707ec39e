"""Pasted text made safe to edit, show and send: a line break of any kind becomes "\\n", a tab
stays, and every other control character (C0, DEL, C1) or lone surrogate becomes U+FFFD.

Shown as it is, a control character acts on the terminal instead of being displayed (SO switches
it to line-drawing characters, BS moves the cursor, CSI starts a sequence); a lone surrogate
cannot be encoded for the tokenizer, the store or a file.
"""

from __future__ import annotations

import re

_LINE_BREAK = re.compile("\r\n|[\r\x0b\x0c\x85\u2028\u2029]")
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")  # what is left after line breaks


def clean_paste(text: str) -> str:
    return _UNSAFE.sub("\ufffd", _LINE_BREAK.sub("\n", text))
