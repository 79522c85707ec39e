"""Plain mode (a line-oriented prompt_toolkit REPL) and pipe mode (stdin -> stdout), both on a
`ChatSession`.

REPL keys: Enter sends; Esc then Enter (Alt+Enter) inserts a newline; a multi-line paste arrives
whole (bracketed paste) and is never sent line by line; Up/Down walk the input history (kept in
the data dir); Ctrl-C while generating stops and keeps the partial reply; Ctrl-C at the prompt
clears it; Ctrl-D or /quit leaves. While the prompt is prefilled a live progress line (done /
total tokens, rate, ETA) is rewritten in place on a terminal, then erased; reasoning is printed
dimmed, the answer plainly, then a one-line stats footer. Commands are listed in `HELP`.

Both read bytes that are not valid in the terminal's (or stdin's) encoding as U+FFFD.

Pipe mode: all of stdin is one user message; only the answer goes to stdout, the stats line (and
any warning, and the prefill progress line when stderr is a terminal) to stderr; exit 0, or
non-zero with a message on overflow (3) or error (1).
"""

from __future__ import annotations

import shlex
import signal
import sys
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

from lampo import paths
from lampo.attachments import Attachment
from lampo.chat_session import ChatSession
from lampo.engine.protocol import ContextOverflow, Done, Event, PrefillProgress, TokenEvent
from lampo.models.chat_format import split_reasoning
from lampo.settings import SettingsError, parse_sampling
from lampo.stats_format import footer, prefill_text

HELP = """\
Commands:
  /new                 start a new chat            /regen          regenerate the last reply
  /edit TEXT           replace your last message   /think on|off   thinking for this chat
  /system [TEXT]       set (or clear) the system prompt
  /set KEY VALUE       sampling: temperature, top_k, top_p, min_p, presence_penalty, max_tokens, seed
  /attach FILE         attach a text file to your next message
  /chats               list saved chats            /load ID        resume a saved chat
  /rename TITLE        rename this chat            /delete         delete this chat
  /save [FILE]         export this chat as Markdown (default: the data dir's exports/)
  /help                this list                   /quit           leave (also Ctrl-D)
Keys: Enter sends, Esc Enter (Alt+Enter) inserts a newline, Ctrl-C stops a reply."""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_OVERFLOW = 0, 1, 2, 3


class _Printer:
    """Writes a streaming reply from its events' text: reasoning dimmed (on a terminal), then the
    answer (split the way the chat format does, by the prompt's thinking switch)."""

    def __init__(self, out: TextIO, session: ChatSession, color: bool):
        self.out, self.session, self.color = out, session, color
        self.thinking = session.thinking
        self.shown_reasoning = self.shown_answer = 0
        self._pieces: list[str] = []

    def _write(self, text: str, dim: bool = False) -> None:
        self.out.write(f"\x1b[2m{text}\x1b[0m" if dim and self.color and text else text)
        self.out.flush()

    def parts(self) -> tuple[str, str]:
        return split_reasoning("".join(self._pieces), self.thinking)

    def update(self, text: str, answer_only: bool = False) -> None:
        self._pieces.append(text)
        reasoning, answer = self.parts()
        if not answer_only and len(reasoning) > self.shown_reasoning:
            self._write(reasoning[self.shown_reasoning:], dim=True)
            self.shown_reasoning = len(reasoning)
        if len(answer) > self.shown_answer:
            if not answer_only and self.shown_answer == 0 and self.shown_reasoning:
                self._write("\n\n")
            self._write(answer[self.shown_answer:])
            self.shown_answer = len(answer)


class _PrefillLine:
    """Prefill progress as one live line, rewritten in place, on a terminal (and erased before the
    reply is printed over it); nothing on anything else. `last` is the last progress event."""

    def __init__(self, out: TextIO):
        self.out, self.live, self.shown = out, out.isatty(), False
        self.last: PrefillProgress | None = None

    def show(self, event: PrefillProgress) -> None:
        self.last = event
        if self.live:
            text = prefill_text(event.done, event.total, event.tokens_per_second, event.seconds_left)
            self.out.write(f"\r\x1b[2K\x1b[2m{text} · Ctrl-C stops\x1b[0m")
            self.out.flush()
            self.shown = True

    def erase(self) -> None:
        if self.shown:
            self.out.write("\r\x1b[2K")
            self.out.flush()
            self.shown = False


@contextmanager
def _ctrl_c_cancels(session: ChatSession) -> Iterator[None]:
    """While generating, Ctrl-C sets the cancel flag instead of raising KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, lambda *_: session.cancel())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _consume(events: Iterator[Event], printer: _Printer, progress: _PrefillLine, answer_only: bool = False) -> Done:
    done = None
    with _ctrl_c_cancels(printer.session):
        for event in events:
            if isinstance(event, PrefillProgress):
                progress.show(event)
            elif isinstance(event, TokenEvent):
                progress.erase()
                printer.update(event.text, answer_only)
            elif isinstance(event, Done):
                done = event
    progress.erase()
    return done


# ---- pipe mode ---------------------------------------------------------------------------------
def read_stdin(stream: TextIO | None = None) -> str:
    """All of stdin (or `stream`) as text; bytes that are not valid in its encoding become U+FFFD.
    A stream without a byte buffer (already text, e.g. StringIO) is read as it is."""
    stream = sys.stdin if stream is None else stream
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return stream.read()
    return buffer.read().decode(stream.encoding or "utf-8", "replace")


def run_pipe(session: ChatSession, stdin_text: str, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out  # looked up now: sys.stdout may have been replaced
    err = sys.stderr if err is None else err
    if not stdin_text.strip():
        print("lampo: nothing on stdin to send", file=err)
        return EXIT_USAGE
    if session.store.notice:
        print(f"lampo: {session.store.notice}", file=err)
    try:
        events = session.send(stdin_text)
    except ContextOverflow as e:
        print(f"lampo: {e}", file=err)
        return EXIT_OVERFLOW
    progress = _PrefillLine(err)  # on stderr, and only when that is a terminal
    printer = _Printer(out, session, color=False)
    done = _consume(events, printer, progress, answer_only=True)
    out.write("\n")
    out.flush()
    for warning in session.take_warnings():
        print(f"lampo: {warning}", file=err)
    print(footer(done.stats, done.reason, progress.last), file=err)
    if done.reason == "error":
        print(f"lampo: generation failed: {done.error}", file=err)
        return EXIT_ERROR
    if session.thinking and not printer.parts()[1]:
        print("lampo: the reply ended while still thinking, so there is no answer "
              "(raise max_tokens, or use --no-think)", file=err)
    return EXIT_OK


# ---- plain REPL -------------------------------------------------------------------------------
class PlainRepl:
    def __init__(self, session: ChatSession, out: TextIO | None = None):
        self.session, self.out = session, sys.stdout if out is None else out
        self.color = self.out.isatty()
        self.pending: list[Attachment] = []
        self.draft = ""  # text to put back in the prompt (after an overflow)

    def say(self, text: str) -> None:
        self.out.write(f"\x1b[2m{text}\x1b[0m\n" if self.color else f"{text}\n")
        self.out.flush()

    def banner(self) -> None:
        info = self.session.backend.info
        weights = f" ({info.weights} weights)" if info.weights else ""
        self.say(f"Lampo · {info.model_name} on the {info.backend} backend{weights} · context {info.context_max:,} tokens")
        if info.is_demo:
            self.say("DEMO: random-weight checkpoint - replies are gibberish. Set `model` in "
                     f"{paths.config_file()} or pass --model DIR for a real model.")
        if self.session.store.notice:
            self.say(self.session.store.notice)
        self.say("Type /help for commands. Enter sends, Esc Enter inserts a newline, Ctrl-D quits.")

    def generate(self, events: Iterator[Event]) -> None:
        printer = _Printer(self.out, self.session, self.color)
        progress = _PrefillLine(self.out)
        done = _consume(events, printer, progress)
        self.out.write("\n")
        if done.reason == "cancelled":
            shown = printer.shown_reasoning or printer.shown_answer
            self.say("[stopped - the partial reply is kept]" if shown else "[stopped before the reply began]")
        elif done.reason == "error":
            self.say(f"[error: {done.error}]")
        self.say(footer(done.stats, done.reason, progress.last))

    def send(self, text: str) -> None:
        try:
            events = self.session.send(text, self.pending)
        except ContextOverflow as e:
            self.say(f"Not sent: {e}")
            self.draft = text
            return
        self.pending = []
        self.generate(events)

    def command(self, line: str) -> bool:
        """Run a /command; False means quit."""
        name, _, arg = line[1:].partition(" ")
        arg = arg.strip()
        s = self.session
        try:
            if name in ("quit", "exit", "q"):
                return False
            elif name == "help":
                self.say(HELP)
            elif name == "new":
                s.new_chat()
                self.pending = []
                self.say("New chat.")
            elif name == "regen":
                self.generate(s.regenerate())
            elif name == "edit":
                self.generate(s.edit_last_user(arg))
            elif name == "think":
                if arg not in ("on", "off"):
                    raise ValueError("usage: /think on|off")
                s.set_thinking(arg == "on")
                self.say(f"Thinking {arg}.")
            elif name == "system":
                s.set_system_prompt(arg)
                self.say(f"System prompt {'set' if arg else 'cleared'}.")
            elif name == "set":
                self.set_sampling(arg)
            elif name == "attach":
                self.attach(arg)
            elif name == "chats":
                self.list_chats()
            elif name == "load":
                s.load(int(arg))
                self.say(f"Resumed chat {s.chat_id}: {s.title} ({len(s.turns)} messages, "
                         f"{s.context_used:,} tokens).")
                if s.turns and s.turns[-1].interrupted:
                    self.say("Its last reply was interrupted (Lampo quit before it was finished); "
                             "/regen writes a new one.")
            elif name == "rename":
                s.rename(arg)
                self.say(f"Renamed to {s.title}.")
            elif name == "delete":
                s.delete()
                self.say("Chat deleted; this is a new chat.")
            elif name == "save":
                self.save(arg)
            else:
                self.say(f"Unknown command /{name}. Type /help for the list.")
        except ContextOverflow as e:
            self.say(f"Not sent: {e}")
        except (ValueError, KeyError, OSError, SettingsError) as e:
            self.say(f"/{name}: {e}")
        return True

    def set_sampling(self, arg: str) -> None:
        key, _, raw = arg.partition(" ")
        if not key or not raw.strip():
            raise ValueError("usage: /set KEY VALUE, e.g. /set temperature 0.7")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        self.session.set_sampling(parse_sampling({key: value}, base=self.session.sampling))
        self.say(f"{key} = {getattr(self.session.sampling, key)}")

    def attach(self, arg: str) -> None:
        if not arg:
            raise ValueError("usage: /attach FILE")
        path = Path(shlex.split(arg)[0]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text") from None
        attachment = self.session.add_attachment(path.name, text)
        self.pending.append(attachment)
        self.say(f"📎 {attachment.name} ({attachment.tokens:,} tokens) goes with your next message.")

    def list_chats(self) -> None:
        chats = self.session.list_chats()
        if not chats:
            self.say("No saved chats yet.")
        for c in chats:
            mark = "*" if c.id == self.session.chat_id else " "
            self.say(f"{mark}{c.id:>5}  {c.title}")

    def save(self, arg: str) -> None:
        if self.session.chat_id is None:
            raise ValueError("nothing to save yet")
        target = Path(arg).expanduser() if arg else paths.data_dir() / "exports" / f"chat-{self.session.chat_id}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.session.export_markdown(), encoding="utf-8")
        self.say(f"Saved {target}")

    def run(self) -> int:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.key_binding import KeyBindings

        from lampo.plain_input import ReplacingInput

        keys = KeyBindings()

        @keys.add("enter")
        def _send(event):
            event.current_buffer.validate_and_handle()

        @keys.add("escape", "enter")
        def _newline(event):
            event.current_buffer.insert_text("\n")

        prompt = PromptSession(history=_input_history(), multiline=True, input=ReplacingInput(sys.stdin),
                               key_bindings=keys, prompt_continuation="… ")
        self.banner()
        while True:
            for warning in self.session.take_warnings():
                self.say(warning)
            chips = "".join(f"[📎 {a.name}] " for a in self.pending)
            try:
                text = prompt.prompt(f"{chips}> ", default=self.draft)
            except KeyboardInterrupt:
                self.draft = ""
                continue
            except EOFError:
                return EXIT_OK
            self.draft = ""
            if text.strip().startswith("/"):
                if not self.command(text.strip()):
                    return EXIT_OK
            elif text.strip() or self.pending:
                self.send(text)


def _input_history():
    """The input history file in the data dir, or a history in memory when it cannot be written."""
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    try:
        path = paths.history_file()
        with open(path, "ab"):
            pass
    except OSError:
        return InMemoryHistory()
    return FileHistory(str(path))


def run_plain(session: ChatSession, *, stdin_is_tty: bool) -> int:
    """The REPL on a terminal; pipe mode when stdin is not one."""
    if not stdin_is_tty:
        return run_pipe(session, read_stdin())
    return PlainRepl(session).run()
