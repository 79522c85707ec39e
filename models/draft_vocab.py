"""The vocabulary an MTP draft is chosen from: a prefix of the token ids, sized to the conversation.

An MTP draft's cost is mostly its LM head, a GEMV over every vocabulary row (248,320 x hidden), and
an argmax over the logits. The Qwen3.6 ids run roughly by script: Latin-script text and code lie
almost wholly below 98,304 (99.86 % of the tokens of Python's standard library, 99.7 % of English
prose), CJK mostly in 81,920..151,551, and the later additions (other scripts, rarer Latin merges)
above. A draft that can only be one of the first n ids reads n rows of the LM head; it is still
only a proposal (the verify window's rows decide), so restricting it changes how often drafts are
kept, never the reply.

`DraftVocab` counts a conversation's tokens (prompt and reply) below each of PREFIXES; its `size`
is the shortest prefix holding at least COVER of them, or 0 (every id) when none does. The chat
markup (the tokenizer's added tokens from MARKUP_FROM on: <|im_start|>, <|im_end|>, <think>, tool
and vision tags) is not counted: a few per message, it is not the conversation's text, and a draft
of it is missed only where a message or a thought ends. The CUDA engine reads that many rows
(`Engine.draft_vocab`) and the numpy reference masks the other ids (`SpeculativeDecoder`), so both
draft the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PREFIXES = (98_304, 151_552)  # multiples of the LQ format's 16-row strips
COVER = 0.995
MARKUP_FROM = 248_044  # the Qwen3.6 tokenizer's first added token


class DraftVocab:
    """Token counts of a conversation, kept as tokens are added or taken back; `vocab`: the
    model's real vocabulary (a prefix as long is every id)."""

    def __init__(self, vocab: int, ids: Sequence[int] | np.ndarray = ()):
        self._vocab = vocab
        self._total = 0
        self._below = np.zeros(len(PREFIXES), np.int64)
        self.add(ids)

    def add(self, ids: Sequence[int] | np.ndarray, sign: int = 1) -> None:
        a = np.asarray(ids, np.int64).reshape(-1)
        a = a[a < MARKUP_FROM]
        self._total += sign * len(a)
        self._below += sign * (a[:, None] < np.asarray(PREFIXES)).sum(axis=0)

    def remove(self, ids: Sequence[int] | np.ndarray) -> None:
        self.add(ids, -1)

    @property
    def size(self) -> int:
        """The ids drafts are chosen among: [0, size), or every id when 0."""
        for n, below in zip(PREFIXES, self._below):
            if n < self._vocab and self._total and below >= COVER * self._total:
                return n
        return 0
