"""Follow-up latency benchmark: the host's time from sending a question about a long document to
its first token, once the document is in the conversation.

The chat session, its prompt building, the CUDA backend, its prefix cache and the generation loop
are the real code; the engine is the host-overlap benchmark's modelled GPU (`TimedNative`), on
which prefill costs nothing, so what is measured is the host's own work (the engine's prefill of
the few new tokens comes on top on a GPU). The first message attaches `--document` tokens' worth
of text (this repository's own documentation, repeated); the follow-ups are short questions whose
prompts reuse the document's state.

Run as a script (numbers for docs/benchmarks.md):
    python tests/tui/bench_follow_up.py [--document 250000] [--follow-ups 3] [--json FILE]
As a CPU test (a small document; it asserts that the replies complete):
    pytest tests/tui/bench_follow_up.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # `helpers` and the host-overlap harness, also when run as a script
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_host_overlap import PROFILES, timed_backend  # noqa: E402
from helpers import docs_markdown, real_tokenizer  # noqa: E402

from lampo.attachments import Attachment  # noqa: E402
from lampo.chat_session import ChatSession  # noqa: E402
from lampo.engine.protocol import Done, TokenEvent  # noqa: E402
from lampo.models.presets import get_preset  # noqa: E402
from lampo.models.sampling_params import GREEDY, SamplingParams  # noqa: E402
from lampo.models.synthetic import write_checkpoint  # noqa: E402
from lampo.store import Store  # noqa: E402


def document_text(tokenizer, n_tokens: int) -> str:
    """About `n_tokens` tokens of text: the repository's Markdown documentation, repeated."""
    text = docs_markdown()
    per_copy = tokenizer.count(text)
    return text * (n_tokens // per_copy) + text[: len(text) * (n_tokens % per_copy) // per_copy]


def first_token_s(session: ChatSession, question: str, attachments=()) -> tuple[float, Done]:
    """Seconds from `send` to the first streamed token, and how the reply ended."""
    started = time.perf_counter()
    first, done = None, None
    for event in session.send(question, attachments):
        if first is None and isinstance(event, TokenEvent):
            first = time.perf_counter() - started
        if isinstance(event, Done):
            done = event
    return first, done


def run(checkpoint: Path, home: Path, document_tokens: int, follow_ups: int) -> dict:
    tokenizer = real_tokenizer()
    text = document_text(tokenizer, document_tokens)
    attachment = Attachment.create("document.md", text, tokenizer)
    backend = timed_backend(checkpoint, PROFILES["35b-a3b"], "mtp:3", 64, 0.8, document=attachment.tokens)
    session = ChatSession(backend, tokenizer, Store(home / f"chat-{time.monotonic_ns()}.sqlite3"),
                          sampling=SamplingParams(**{**GREEDY.to_dict(), "max_tokens": 16}), thinking=False)
    first, done = first_token_s(session, "Summarise the document.", [attachment])
    rows = [{"message": 1, "first_token_s": round(first, 4), "reason": done.reason}]
    for i in range(follow_ups):
        first, done = first_token_s(session, f"And what does part {i + 1} say?")
        rows.append({"message": i + 2, "first_token_s": round(first, 4), "reason": done.reason})
    session.store.close()
    backend.close()
    return {"document_tokens": attachment.tokens, "context_used": session.context_used, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--document", type=int, default=250_000, help="tokens of the attached document")
    p.add_argument("--follow-ups", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        checkpoint = write_checkpoint(home / "tiny-dense", get_preset("tiny-dense"), seed=0)
        result = run(checkpoint, home, args.document, args.follow_ups)
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def test_follow_ups_about_a_document_complete(tiny_dense_dir, tmp_path):
    result = run(tiny_dense_dir, tmp_path, 3000, 2)
    assert len(result["rows"]) == 3
    assert all(r["reason"] in ("stop", "length") and r["first_token_s"] > 0 for r in result["rows"])
    assert result["context_used"] > result["document_tokens"] > 1000


if __name__ == "__main__":
    sys.exit(main())
