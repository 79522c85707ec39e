"""The `lampo` command line: `chat` (the default), `info`, `bench`, `convert`, `check`.

Each subcommand's module is imported only when it runs, so `lampo info` never loads Textual and the
CPU-only install never touches the CUDA extension unless asked to.
"""

from __future__ import annotations

import argparse
import os
import sys

REPORTS = ("info", "bench", "convert", "check")  # subcommands that own their options
SUBCOMMANDS = ("chat", *REPORTS)


def context_tokens(text: str) -> int:
    """`--context N`: the range config.toml's `context` takes, nothing clamped."""
    from lampo.settings import CONTEXT_EXPECTED, CONTEXT_RANGE

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not CONTEXT_RANGE[0] <= value <= CONTEXT_RANGE[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {CONTEXT_EXPECTED}")
    return value


def speculation(text: str):
    """`--speculate MODE[:DRAFTS]`: the spelling `lampo.engine.speculation` parses."""
    from lampo.engine.speculation import parse_speculation

    try:
        return parse_speculation(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_UNITS = {"": 1 << 30, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6}


def vram_bytes(text: str) -> int:
    """`--vram-limit SIZE`: bytes from "24GiB", "24G", "23.5" (GiB), "24GB", "800MiB"."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a size such as 24GiB, 23.5G or 800MiB")
    return int(float(m.group(1)) * _UNITS[unit])


def _chat_parser(sub: argparse._SubParsersAction) -> None:
    from lampo.models.quant.engine_formats import WEIGHT_CHOICES
    from lampo.settings import CONTEXT_RANGE

    p = sub.add_parser("chat", help="chat with the model (default)")
    p.add_argument("--model", metavar="DIR", help="checkpoint directory (HF format); default: settings, else the demo")
    p.add_argument("--backend", choices=("auto", "cuda", "reference"), default=None,
                   help="engine: cuda (GPU), reference (numpy, CPU), auto (cuda when a GPU is present)")
    p.add_argument("--plain", action="store_true", help="line-mode REPL instead of the full-screen UI")
    p.add_argument("--context", type=context_tokens, metavar="N",
                   help=f"maximum context in tokens, {CONTEXT_RANGE[0]:,} to {CONTEXT_RANGE[1]:,} "
                   "(default: context in config.toml)")
    p.add_argument("--no-think", action="store_true", help="start with thinking off")
    p.add_argument("--speculate", type=speculation, metavar="MODE[:DRAFTS]",
                   help="speculative decoding: auto, off, mtp or ngram, optionally with "
                   "the drafts per round, 1 to 4 (e.g. mtp:3; default: [speculation] in config.toml, auto)")
    p.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto",
                   help="weight format on the GPU: auto (a converted checkpoint's own; a bf16 checkpoint is "
                   "quantized while loading to the best recipe that fits, q5 else q4), bf16 to opt out")
    p.add_argument("--vram-limit", type=vram_bytes, default=0, metavar="SIZE",
                   help="cap what the engine allocates on the GPU, e.g. 24GiB (plans as if the card were that size)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lampo",
        description="Lampo: a terminal chat for Qwen3.6 on one NVIDIA GPU. "
        "With no subcommand, starts the chat.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{chat,info,bench,convert,check}")
    _chat_parser(sub)
    sub.add_parser("info", help="model shape, parameter counts and the memory plan (lampo info -h)")
    sub.add_parser("bench", help="measure prefill and decode speed (lampo bench -h)")
    sub.add_parser("convert", help="write the ~5 bpw checkpoint of a bf16 one (lampo convert -h)")
    sub.add_parser("check", help="the CUDA engine on this GPU against the numpy reference (lampo check -h)")
    return parser


def _report(command: str, argv: list[str]) -> int:
    """A subcommand that prints a report; a reader that stops early (`lampo info | head`) ends it
    quietly, as other command-line tools do."""
    from importlib import import_module

    try:
        return import_module(f"lampo.{command}").main(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE, as the shell reports it


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The numpy reference backend does many small products: a multi-threaded BLAS spends more time
    # spinning than computing on them (95 vs 11 tok/s for the demo on a 2-core box). Before numpy
    # is first imported; an explicit setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # The reports own their options (argparse.REMAINDER would not pass "--flags" through).
    if argv and argv[0] in REPORTS:
        return _report(argv[0], argv[1:])
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["chat", *argv]
    args = build_parser().parse_args(argv)
    from lampo.chat_entry import run_chat

    return run_chat(args)


if __name__ == "__main__":
    sys.exit(main())
