"""Test doubles and shared resources for the test files (importable as `helpers`)."""

from __future__ import annotations

import functools


@functools.cache
def real_tokenizer():
    """The real Qwen3.6 tokenizer, loaded once per test process (~1 s)."""
    from lampo.models.tokenizer import Tokenizer, default_tokenizer_path

    return Tokenizer.from_file(default_tokenizer_path())
