"""Bracketed pastes stay text: nothing inside one becomes a key press.

Textual's `XTermParser` (8.2.8) still reads escape sequences inside a bracketed paste: an ESC
there starts a sequence which, once longer than 32 characters or cut short by another ESC, is
re-issued as key presses (ctrl+q quits, ctrl+n starts a new chat, escape...) and is missing from
the paste. A pasted terminal log or binary junk does exactly that. `PasteGuard` filters the
decoded input before the parser: between the paste start (ESC [200~) and end (ESC [201~) markers,
every ESC that does not begin the end marker becomes U+FFFD, so the parser sees plain text up to
the end marker. A paste's last characters that may be the start of the end marker are held back
until the next chunk decides. Outside a paste nothing is changed or held back (a lone ESC is the
Escape key). `PasteSafeParser` is the `XTermParser` that reads through a `PasteGuard`.
"""

from __future__ import annotations

from typing import Iterable

from textual._xterm_parser import BRACKETED_PASTE_END, BRACKETED_PASTE_START, XTermParser
from textual.message import Message

ESC = "\x1b"
REPLACEMENT = "\ufffd"


class PasteGuard:
    def __init__(self) -> None:
        self.in_paste = False
        self._held = ""  # in a paste: a trailing proper prefix of the end marker
        self._tail = ""  # outside: the last characters passed on, to find a start marker cut in two

    def filter(self, text: str) -> str:
        out: list[str] = []
        while text:
            if self.in_paste:
                text, self._held = self._held + text, ""
                end = text.find(BRACKETED_PASTE_END)
                if end < 0:
                    keep = _partial_marker_length(text, BRACKETED_PASTE_END)
                    body, self._held = text[:len(text) - keep], text[len(text) - keep:]
                    out.append(body.replace(ESC, REPLACEMENT))
                    break
                out += [text[:end].replace(ESC, REPLACEMENT), BRACKETED_PASTE_END]
                text, self.in_paste = text[end + len(BRACKETED_PASTE_END):], False
            else:
                seen = self._tail + text
                start = seen.find(BRACKETED_PASTE_START)
                if start < 0:
                    out.append(text)
                    self._tail = seen[-(len(BRACKETED_PASTE_START) - 1):]
                    break
                after = start + len(BRACKETED_PASTE_START) - len(self._tail)  # index in `text`
                out.append(text[:after])
                text, self.in_paste, self._tail = text[after:], True, ""
        return "".join(out)


def _partial_marker_length(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker` (0: none)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


class PasteSafeParser(XTermParser):
    def __init__(self, debug: bool = False) -> None:
        super().__init__(debug)
        self.guard = PasteGuard()

    def feed(self, data: str) -> Iterable[Message]:
        if not data:  # end of input
            return super().feed(data)
        safe = self.guard.filter(data)
        return super().feed(safe) if safe else ()  # all held back: an empty feed would mean the end
