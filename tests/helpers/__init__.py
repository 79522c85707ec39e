"""Test doubles and shared resources for the test files (importable as `helpers`)."""

from __future__ import annotations

import functools
from pathlib import Path

TOKENIZER_CACHE = Path("tokenizer") / "qwen3.6-tokenizer.json"  # under a cache dir


@functools.cache
def tokenizer_json() -> Path:
    """The built Qwen3.6 tokenizer.json (built once per machine into Lampo's cache)."""
    from lampo import paths

    return paths.tokenizer_file()


@functools.cache
def real_tokenizer():
    """The real Qwen3.6 tokenizer, loaded once per test process (~1 s)."""
    from lampo.models.tokenizer import Tokenizer

    return Tokenizer.from_file(tokenizer_json())


def docs_markdown() -> str:
    """The repository's Markdown documentation (docs/, by path: architecture.md first), one file after
    another with a blank line between: long real text for the benchmarks' pasted documents."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(docs.rglob("*.md")))


def seed_lampo_home(home: Path) -> Path:
    """Prepare a `LAMPO_HOME` whose cache already holds the tokenizer (a symlink), so nothing
    run under it spends seconds rebuilding the tokenizer. Call before setting LAMPO_HOME."""
    target = home / "cache" / TOKENIZER_CACHE
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(tokenizer_json())
    return home


class TagTokenizer:
    """Stands in for the real tokenizer where only token ids matter (a GPU test environment may lack the
    `tokenizers` package): token t streams as "<t>"; the Qwen3.6 stop ids end a reply."""

    stop_ids = (248046, 248044)

    class Decoder:
        def push(self, token):
            return f"<{token}>"

        def flush(self):
            return ""

    def stream_decoder(self):
        return self.Decoder()
