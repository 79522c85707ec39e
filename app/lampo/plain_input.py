"""Plain mode's terminal input: prompt_toolkit's, with bytes that are not valid in the
terminal's encoding read as U+FFFD.

prompt_toolkit's `Vt100Input` decodes with errors="surrogateescape" (so that odd mouse reports
reach key bindings; plain mode uses no mouse): one Latin-1 byte typed or pasted (b"caf\\xe9")
becomes a lone surrogate in the prompt's text, which the tokenizer rejects ("TextInputSequence
must be str") and no UTF-8 file or database can hold. `ReplacingInput` reads with
errors="replace" instead.
"""

from __future__ import annotations

from typing import TextIO

from prompt_toolkit.input.posix_utils import PosixStdinReader
from prompt_toolkit.input.vt100 import Vt100Input


class ReplacingInput(Vt100Input):
    def __init__(self, stdin: TextIO):
        super().__init__(stdin)
        self.stdin_reader = PosixStdinReader(stdin.fileno(), errors="replace", encoding=stdin.encoding)
