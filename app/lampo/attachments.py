"""Attachments: documents (files, long pastes) sent along with a user message.

An attachment is stored once, keyed by the SHA-256 of its text, and referenced from every
message that uses it. The model sees each attachment inside the user message, before the typed
text, as a Markdown fenced block headed by the file name:

    report.txt:
    ````
    <the file's text>
    ````

    <typed text>

The fence is one backtick longer than the longest backtick run in the text (at least three),
so a document containing code blocks cannot close it early.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol, Sequence


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str
    sha256: str
    tokens: int  # tokens of the text alone (the block framing adds a few)

    @classmethod
    def create(cls, name: str, text: str, tokenizer: TokenCounter) -> Attachment:
        if not name.strip():
            raise ValueError("an attachment needs a name")
        return cls(name, text, text_sha256(text), tokenizer.count(text))


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def user_content(text: str, attachments: Sequence[Attachment] = ()) -> str:
    """The user message content the model sees: attachment blocks, then the typed text."""
    blocks = []
    for a in attachments:
        fence = _fence(a.text)
        body = a.text if a.text.endswith("\n") or not a.text else a.text + "\n"
        blocks.append(f"{a.name}:\n{fence}\n{body}{fence}")
    return "\n\n".join([*blocks, text] if text else blocks)
