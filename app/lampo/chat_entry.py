"""`lampo chat`: settings -> model -> backend -> ChatSession -> TUI, plain REPL or pipe mode.

Model: `--model`, else `model` in config.toml, else the random-weight demo checkpoint (created on
first use). Backend: `--backend`, else the setting; "auto" picks cuda when the CUDA extension
imports and sees a GPU, else the numpy reference. Speculative decoding: `--speculate`, else the
[speculation] setting. Stdin that is not a terminal means pipe mode.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from lampo import paths
from lampo.demo import DEMO_MAX_TOKENS, demo_dir, ensure_demo_checkpoint, is_demo_checkpoint
from lampo.engine.protocol import Backend
from lampo.engine.speculation import Speculation

EXIT_FAILURE = 1


def _say(text: str) -> None:
    print(f"lampo: {text}", file=sys.stderr, flush=True)


def _model_dir(args: argparse.Namespace, settings) -> Path:
    if args.model or settings.model_dir:
        path = Path(args.model or settings.model_dir).expanduser()
        if not path.is_dir():
            source = "--model" if args.model else f"model in {paths.config_file()}"
            raise FileNotFoundError(f"model directory {path} (from {source}) does not exist")
        return path
    if not is_demo_checkpoint(demo_dir()):
        _say(f"no model configured: creating the random-weight demo checkpoint in {demo_dir()} (once)")
    return ensure_demo_checkpoint()


def open_checkpoint_backend(kind: str, model_dir: Path, options: dict, say, tokenizer=None) -> Backend:
    """The backend of kind auto|cuda|reference for `model_dir` (`options`: open_backend's context_max,
    weights, vram_limit and speculation), with `tokenizer`, else the checkpoint's (read here)."""
    from lampo.engine.picker import open_backend
    from lampo.models.tokenizer import Tokenizer

    tokenizer = tokenizer or Tokenizer.from_checkpoint(model_dir)
    return open_backend(kind, model_dir, tokenizer=tokenizer, say=say, **options)


def _backend(kind: str, model_dir: Path, context_max: int, args: argparse.Namespace,
             speculation: Speculation) -> tuple[Backend, object]:
    """(backend, tokenizer). For the terminal interface the backend runs in a process of its own:
    the interface's rendering would otherwise hold up its generation loop (engine/process_backend.py)."""
    from lampo.models.tokenizer import Tokenizer

    options = dict(context_max=context_max, weights=args.weights, vram_limit=args.vram_limit, speculation=speculation)
    tokenizer = Tokenizer.from_checkpoint(model_dir)
    if sys.stdin.isatty() and not args.plain:  # the child reads the tokenizer itself
        from lampo.engine.process_backend import ProcessBackend

        backend = ProcessBackend(partial(open_checkpoint_backend, kind, model_dir, options), say=_say,
                                 log=paths.backend_log_file())
    else:
        backend = open_checkpoint_backend(kind, model_dir, options, _say, tokenizer)
    return backend, tokenizer


def run_chat(args: argparse.Namespace) -> int:
    from lampo.settings import Settings, SettingsError, SettingsUnsaved, load_settings

    try:
        settings = load_settings()
    except SettingsUnsaved as e:  # no settings file and none can be written: the defaults run
        _say(str(e))
        settings = Settings()
    except SettingsError as e:
        _say(str(e))
        return EXIT_FAILURE
    try:
        model_dir = _model_dir(args, settings)
        context_max = args.context or settings.context  # asked for: the model may hold less
        backend, tokenizer = _backend(args.backend or settings.backend, model_dir, context_max, args,
                                      args.speculate or settings.speculation)
    except (OSError, ValueError, RuntimeError) as e:  # checkpoint, config, tokenizer, engine errors
        _say(str(e))
        return EXIT_FAILURE
    if backend.info.context_max < context_max:
        source = "--context" if args.context else f"context in {paths.config_file()}"
        _say(f"the model holds at most {backend.info.context_max:,} tokens of context (max_position_embeddings "
             f"in its config.json): using {backend.info.context_max:,}, not the {context_max:,} of {source}")

    from lampo.chat_session import ChatSession
    from lampo.store import SchemaTooNew, Store

    try:
        store = Store()
    except SchemaTooNew as e:
        _say(str(e))
        backend.close()
        return EXIT_FAILURE
    sampling = settings.sampling
    if backend.info.is_demo and sampling.max_tokens > DEMO_MAX_TOKENS:
        sampling = replace(sampling, max_tokens=DEMO_MAX_TOKENS)
        _say(f"demo checkpoint: replies are capped at {DEMO_MAX_TOKENS} tokens")
    thinking = settings.thinking and not getattr(args, "no_think", False)
    pipe = not sys.stdin.isatty()
    if backend.info.is_demo and pipe and thinking:
        thinking = False
        _say("demo checkpoint: thinking off in pipe mode (random weights never close a <think> block)")
    session = ChatSession(backend, tokenizer, store, sampling=sampling, thinking=thinking)
    try:
        if pipe:
            from lampo.plain import read_stdin, run_pipe

            return run_pipe(session, read_stdin())
        if args.plain:
            from lampo.plain import run_plain

            return run_plain(session, stdin_is_tty=True)
        from lampo.tui.app import run_tui

        run_tui(session, settings)
        return 0
    finally:
        backend.close()
        store.close()
