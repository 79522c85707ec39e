"""tests/gpu/app_speed.py's user message and context on the CPU: the pasted document is the docs'
first N characters, a request too long for the docs is refused, and the context holds the prompt,
the reply and a round's drafts."""

from __future__ import annotations

import pytest

from lampo.models.chat_format import Message, build_prompt
from lampo.models.tokenizer import Tokenizer

REQUEST = "\n\nQuote the first twenty lines of this text exactly."


def test_the_default_message_quotes_the_start_of_the_architecture_doc(gpu_script):
    speed = gpu_script("app_speed")
    text = speed.message(0)
    architecture = (speed.DOCS / "architecture.md").read_text(encoding="utf-8")
    assert text == architecture[:2500] + REQUEST


@pytest.mark.parametrize("chars", [3000, 60_000])
def test_a_document_is_the_docs_first_characters_architecture_first(gpu_script, chars):
    speed = gpu_script("app_speed")
    text = speed.message(chars)
    assert text.endswith(REQUEST) and len(text) == chars + len(REQUEST)
    architecture = (speed.DOCS / "architecture.md").read_text(encoding="utf-8")
    assert text.startswith(architecture[:min(chars, len(architecture))])
    assert text.count(architecture[:200]) == 1  # architecture.md is pasted once


def test_a_document_longer_than_the_docs_is_refused(gpu_script):
    speed = gpu_script("app_speed")
    with pytest.raises(SystemExit, match="the docs hold only"):
        speed.message(100_000_000)


def test_the_context_holds_the_prompt_the_reply_and_the_drafts(gpu_script, qwen_dir):
    speed = gpu_script("app_speed")
    tokenizer = Tokenizer.from_checkpoint(qwen_dir)
    ids = len(build_prompt(tokenizer, [Message("user", speed.message(60_000))], enable_thinking=False).ids)
    assert ids > 16_384
    assert speed.context_for(ids, 256) == ids + 256 + 1024
    assert speed.context_for(700, 256) == 16_384
