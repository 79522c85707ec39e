"""The prompt editor under fast and hostile input: text and Enter that arrive in one terminal read
send that text; a paste (fuzzed with Hypothesis, control characters and lone surrogates
included) lands in the editor or becomes a `LongPaste`, cleaned, and puts no control character
on the screen."""

from __future__ import annotations

import asyncio
import threading
import unicodedata

import pytest
from helpers.scripted_backend import ScriptedBackend
from hypothesis import given
from hypothesis import strategies as st
from textual import events
from textual.app import App, ComposeResult
from tui_helpers import wait_idle, wait_until

from lampo.tui.prompt_input import PromptInput

SIZE = (100, 32)
THRESHOLD = 24  # paste_threshold of the fuzzed editor: short examples reach both outcomes


async def post_keys(pilot, app: App, keys: list[tuple[str, str]]) -> None:
    """Queue key events the way the terminal driver does for one read: all of them before the
    app handles the first (Pilot's `press` waits for the app between keys)."""
    await wait_until(pilot, lambda: app.focused is app.prompt, what="the prompt to have the focus")
    for key, character in keys:
        app.post_message(events.Key(key, character))


async def test_text_and_enter_arriving_in_one_read_send_the_text(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await post_keys(pilot, app, [("h", "h"), ("i", "i"), ("enter", "\r")])
        await wait_until(pilot, lambda: app.session.turns, what="the message to be sent")
        await wait_idle(pilot, app)
        assert [(t.role, t.content) for t in app.session.turns[:1]] == [("user", "hi")] and app.prompt.text == ""


async def test_keys_typed_after_enter_in_the_same_read_stay_in_the_editor(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await post_keys(pilot, app, [("h", "h"), ("i", "i"), ("enter", "\r"), *((c, c) for c in "next")])
        await wait_until(pilot, lambda: app.session.turns, what="the message to be sent")
        await wait_idle(pilot, app)
        assert app.session.turns[0].content == "hi" and app.prompt.text == "next"


async def test_a_newline_key_arriving_with_text_lands_between_it(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await post_keys(pilot, app, [("a", "a"), ("ctrl+j", "\n"), ("b", "b")])
        await wait_until(pilot, lambda: app.prompt.text == "a\nb", what="'a\\nb' in the editor")
        assert not app.session.turns


def cleaned(text: str) -> str:
    """The paste contract, written out: any line break is "\\n", a tab stays, any other control
    character or lone surrogate is U+FFFD."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\r" and text[i + 1:i + 2] == "\n":
            i += 1
        if c in "\r\n\x0b\x0c\x85\u2028\u2029":
            out.append("\n")
        elif c != "\t" and unicodedata.category(c) in ("Cc", "Cs"):
            out.append("\ufffd")
        else:
            out.append(c)
        i += 1
    return "".join(out)


class PromptApp(App):
    """Just the prompt editor, recording the long pastes it posts."""

    def __init__(self) -> None:
        super().__init__()
        self.long_pastes: list[str] = []

    def compose(self) -> ComposeResult:
        yield PromptInput(paste_threshold=THRESHOLD, id="prompt")

    def on_prompt_input_long_paste(self, message: PromptInput.LongPaste) -> None:
        self.long_pastes.append(message.text)


class LiveApp:
    """An app kept running (Pilot, headless) on an event loop in a thread of its own, so a
    Hypothesis test - called synchronously once per example - drives one app through them all."""

    def __init__(self, app: App):
        self.app, self.loop = app, asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._ready = threading.Event()
        self._hosting = asyncio.run_coroutine_threadsafe(self._host(), self.loop)
        assert self._ready.wait(60), "the app did not start within 60 s"

    async def _host(self) -> None:
        self._stop = asyncio.Event()
        async with self.app.run_test(size=(80, 24)) as self.pilot:
            self._ready.set()
            await self._stop.wait()

    def call(self, step):
        """Run `await step(pilot)` in the app's loop; its result."""
        return asyncio.run_coroutine_threadsafe(step(self.pilot), self.loop).result(60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._hosting.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(60)
        self.loop.close()


@pytest.fixture(scope="module")
def live_prompt():
    live = LiveApp(PromptApp())
    yield live
    live.close()


TYPED = st.text(st.characters(categories=("L", "N", "P", "Zs")), max_size=12)
PASTED = st.text(st.one_of(st.characters(), st.characters(max_codepoint=0x9F),
                           st.sampled_from("\r\n\t\x1b\x00\x0e\x9b\u2028\ud800\udfff")), max_size=2 * THRESHOLD)


@given(typed=TYPED, pasted=PASTED)
def test_fuzz_a_paste_lands_cleaned_in_the_editor_or_becomes_a_long_paste(live_prompt, typed, pasted):
    app: PromptApp = live_prompt.app

    async def paste(pilot):
        prompt = app.query_one(PromptInput)
        prompt.load_text(typed)
        prompt.move_cursor(prompt.document.end)
        app.long_pastes.clear()
        app.post_message(events.Paste(pasted))  # as the driver delivers it: the app forwards it
        await pilot.pause()
        screen = [prompt.render_line(y).text for y in range(prompt.size.height)]
        return prompt.text, list(app.long_pastes), screen

    text, long_pastes, screen = live_prompt.call(paste)
    expected = cleaned(pasted)
    if len(expected) >= THRESHOLD:
        assert (text, long_pastes) == (typed, [expected])
    else:
        assert (text, long_pastes) == (typed + expected, [])
    unsafe = [c for line in screen for c in line if unicodedata.category(c) in ("Cc", "Cs")]
    assert not unsafe, f"control characters on the screen: {unsafe!r}"
