"""The MTP drafts' vocabulary (lampo.models.draft_vocab): the shortest prefix of the ids holding
99.5 % of a conversation's tokens, kept as tokens come and go; on the real Qwen3.6 tokenizer,
Latin-script text and code get the 98,304-id prefix, Chinese the 151,552-id one, other scripts
every id."""

from __future__ import annotations

import pytest
from lampo.models.chat_format import Message, render
from lampo.models.draft_vocab import COVER, MARKUP_FROM, PREFIXES, DraftVocab
from lampo.models.tokenizer import Tokenizer

REAL = 248_077


def test_the_shortest_prefix_that_covers_the_conversation():
    v = DraftVocab(REAL, [5, 70, 900] * 1000)
    assert v.size == PREFIXES[0]
    v.add([200_000] * 10)  # 10 in 3,010 beyond every prefix: still covered
    assert v.size == PREFIXES[0]
    v.add([120_000] * 500)  # a sixth of the tokens need the longer prefix
    assert v.size == PREFIXES[1]
    v.add([240_000] * 100)  # and some none covers
    assert v.size == 0
    v.remove([240_000] * 100)
    v.remove([120_000] * 500)
    assert v.size == PREFIXES[0]


def test_the_cover_threshold_and_the_edges():
    n = 1000
    beyond = int(n * (1 - COVER))  # as many past the first prefix as the threshold allows
    assert DraftVocab(REAL, [0] * (n - beyond) + [PREFIXES[0]] * beyond).size == PREFIXES[0]
    assert DraftVocab(REAL, [0] * (n - beyond - 1) + [PREFIXES[0]] * (beyond + 1)).size == PREFIXES[1]
    assert DraftVocab(REAL, [PREFIXES[0] - 1]).size == PREFIXES[0]  # the last id of the prefix is in it
    assert DraftVocab(REAL).size == 0  # nothing seen: every id
    assert DraftVocab(PREFIXES[0], [1, 2, 3]).size == 0  # a prefix as long as the vocabulary is every id


def test_the_chat_markup_is_not_counted(qwen_dir):
    """A chat of short English messages: its <|im_start|> / <|im_end|> tokens are several percent of
    it, but not its text; the tokenizer's added tokens all lie from MARKUP_FROM on."""
    tok = Tokenizer.from_checkpoint(qwen_dir)
    assert tok.token_to_id("<|endoftext|>") == MARKUP_FROM  # the first added token; the markup follows it
    assert all(tok.token_to_id(t) > MARKUP_FROM for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"))
    messages = [Message("user", "Hi! What is a list in Python?"), Message("assistant", "An ordered, mutable sequence."),
                Message("user", "And a tuple?")]
    ids = tok.encode(render(messages, add_generation_prompt=True))
    assert sum(t >= MARKUP_FROM for t in ids) / len(ids) > 1 - COVER  # enough to tip the count
    assert DraftVocab(REAL, ids).size == PREFIXES[0]
    assert DraftVocab(REAL, [MARKUP_FROM + 2] * 50).size == 0  # markup alone: nothing to count


@pytest.mark.parametrize("text, want", [
    ("The quick brown fox jumps over the lazy dog, then writes a function:\n"
     "def area(radius: float) -> float:\n    return 3.14159 * radius ** 2\n", PREFIXES[0]),
    ("快速的棕色狐狸跳过了懒狗。我们今天讨论一下这个问题的解决办法。", PREFIXES[1]),
    ("Быстрая коричневая лиса перепрыгивает через ленивую собаку.", 0),
])
def test_the_qwen_ids_run_by_script(qwen_dir, text, want):
    tok = Tokenizer.from_checkpoint(qwen_dir)
    assert DraftVocab(REAL, tok.encode(text)).size == want
