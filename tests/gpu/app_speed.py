"""The chat app's decode speed on the GPU: the headless Textual app streaming a greedy reply of the
trained measurement model (tests/gpu/train_measure_model.py) from its CUDA backend (bf16), built
in the app's own process or in a ProcessBackend as `lampo chat` runs it under the terminal
interface, against the generation loop drained alone. The user message is the start of
docs/architecture.md (or, with --document N, the first N characters of the docs pasted whole, as a
long document is) with a request to quote it; the speed is the reply's decode tok/s from its last
Stats (first token to last). One JSON row per round, setting and consumer.

    python3 tests/gpu/app_speed.py MODEL_DIR [--tokens 512] [--settings off,mtp:3,auto] [--document 60000]
                                   [--rounds 2] --json OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tui"), str(HERE.parent)]

from bench_host_overlap import reply_in_app  # noqa: E402
from helpers import docs_markdown  # noqa: E402

from lampo.engine.cuda import CudaBackend  # noqa: E402
from lampo.engine.process_backend import ProcessBackend  # noqa: E402
from lampo.engine.protocol import GenerationRequest, Stats  # noqa: E402
from lampo.engine.speculation import parse_speculation  # noqa: E402
from lampo.models.chat_format import Message, build_prompt  # noqa: E402
from lampo.models.sampling_params import GREEDY, SamplingParams  # noqa: E402
from lampo.models.tokenizer import Tokenizer  # noqa: E402


DOCS = HERE.parents[1] / "docs"


def cuda_backend(model_dir: Path, setting: str, context_max: int, say=None) -> CudaBackend:
    return CudaBackend(model_dir, context_max=context_max, weights="bf16", speculation=parse_speculation(setting),
                       say=say)


def message(document: int) -> str:
    """The user message: the first `document` characters of the docs (2,500 of architecture.md if 0)
    and a request to quote them."""
    if document:
        text = docs_markdown()
        if len(text) < document:
            raise SystemExit(f"--document {document}: the docs hold only {len(text)} characters")
        text = text[:document]
    else:
        text = (DOCS / "architecture.md").read_text(encoding="utf-8")[:2500]
    return f"{text}\n\nQuote the first twenty lines of this text exactly."


def context_for(prompt_ids: int, tokens: int) -> int:
    """The engine's context for a prompt of `prompt_ids` ids and a reply of `tokens`, with room for a
    round's drafts past the reply's end."""
    return max(16_384, prompt_ids + tokens + 1024)


def loop_alone(model_dir: Path, setting: str, tokenizer, tokens: int, text: str, context_max: int) -> Stats:
    backend = cuda_backend(model_dir, setting, context_max)
    prompt = build_prompt(tokenizer, [Message("user", text)], enable_thinking=False)
    request = GenerationRequest(tuple(prompt.ids), SamplingParams(**{**GREEDY.to_dict(), "max_tokens": tokens}))
    stats = [e for e in backend.generate(request, threading.Event()) if isinstance(e, Stats)][-1]
    backend.close()
    return stats


def in_app(model_dir: Path, setting: str, tokenizer, tokens: int, text: str, context_max: int, own_process: bool,
           home: Path) -> Stats:
    factory = partial(cuda_backend, model_dir, setting, context_max)
    backend = ProcessBackend(factory) if own_process else factory()
    session = asyncio.run(reply_in_app(backend, tokenizer, home, text, tokens))
    backend.close()
    return session.last_stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--settings", default="off,mtp:3", help="speculation settings, comma-separated")
    p.add_argument("--document", type=int, default=0, help="characters of the docs pasted before the request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    tokenizer = Tokenizer.from_checkpoint(args.model)
    text = message(args.document)
    prompt_ids = len(build_prompt(tokenizer, [Message("user", text)], enable_thinking=False).ids)
    context_max = context_for(prompt_ids, args.tokens)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            for setting in args.settings.split(","):
                app = partial(in_app, args.model, setting, tokenizer, args.tokens, text, context_max, home=Path(tmp))
                runs = {"loop alone": lambda: loop_alone(args.model, setting, tokenizer, args.tokens, text, context_max),
                        "app, backend in its process": partial(app, own_process=False),
                        "app, backend in its own process": partial(app, own_process=True)}
                for consumer, run in runs.items():
                    stats = run()
                    rows.append({"round": round_, "setting": setting, "consumer": consumer, "tokens": stats.predicted_n,
                                 "decode_tok_s": round(stats.predicted_per_second, 1),
                                 "prefill_tok_s": round(stats.prompt_per_second, 1),
                                 "drafted": stats.draft_n, "accepted": stats.draft_n_accepted})
                    print(json.dumps(rows[-1]), flush=True)
    Path(args.json).write_text(json.dumps({"model": str(args.model.name), "tokens": args.tokens, "prompt_ids": prompt_ids,
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
