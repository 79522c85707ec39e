"""Screenshots of the main screen, the HUD and the chat list (pytest-textual-snapshot; SVGs in
__snapshots__/test_snapshots/). Deterministic: fixed terminal sizes, scripted replies, backend
timings rewritten by `SteadyClockBackend`, fixed clocks, no cursor blink. After an intended
change: `pytest tests/tui/test_snapshots.py --snapshot-update`, then read the diff report."""

from __future__ import annotations

import types

import pytest
from helpers.scripted_backend import ScriptedBackend
from textual.app import App
from tui_helpers import FIXED_WALL_CLOCK, SteadyClockBackend, wait_idle, wait_until

from lampo.engine.protocol import BackendInfo, Done, Stats
from lampo.tui.app import STYLESHEET
from lampo.tui.hud import Hud
from lampo.tui.hud_state import HudState
from lampo.tui.themes import THEMES

REPLY = ["<think>\n", "The user ", "wants a ", "short example.", "\n</think>\n\n",
         "Here is a **Python** function:\n\n", "```python\n", "def greet(name):\n",
         "    return f\"Hello, {name}!\"\n", "```\n\n", "- short\n", "- *typed* text\n"]


async def settle(pilot, app) -> None:
    app.prompt.cursor_blink = False
    await wait_idle(pilot, app)
    await wait_until(pilot, lambda: app.hud_state.pending_tokens or not app.prompt.text, what="pending count")
    await app.workers.wait_for_complete()
    await pilot.pause()


def test_main_screen(snap_compare, make_app):
    backend = SteadyClockBackend(ScriptedBackend([REPLY]), speculative=True,
                                 vram=(21 * 2**30 + 2**29, 32 * 2**30))
    app = make_app(backend)

    async def run_before(pilot):
        app.prompt.load_text("Write a greeting function")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        app.prompt.load_text("Now add a docstring")
        await settle(pilot, app)

    assert snap_compare(app, terminal_size=(100, 32), run_before=run_before)


def test_main_screen_light_theme_with_thinking_open(snap_compare, make_app):
    app = make_app(SteadyClockBackend(ScriptedBackend([REPLY])))

    async def run_before(pilot):
        app.theme = THEMES["light"].name
        app.prompt.load_text("Write a greeting function")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        await pilot.click(".thinking-title")
        await settle(pilot, app)

    assert snap_compare(app, terminal_size=(100, 32), run_before=run_before)


class HudApp(App):
    CSS_PATH = STYLESHEET

    def __init__(self, state: HudState):
        super().__init__()
        self.state = state
        for theme in THEMES.values():
            self.register_theme(theme)
        self.theme = THEMES["dark"].name

    def compose(self):
        yield Hud(id="hud")

    def on_mount(self) -> None:
        self.query_one(Hud).show(self.state)


def hud_state(*, demo: bool, speculative: bool, generating: bool) -> HudState:
    state = HudState(BackendInfo("cuda", "Qwen3.6-35B-A3B", "/models/q", 262_144, is_demo=demo,
                                 speculative=speculative))
    state.begin_reply()
    for n in range(1, 400):
        state.on_stats(Stats(
            prompt_n=8_192, prompt_ms=3_200.0, cached_n=20_480, predicted_n=n, predicted_ms=n * 2.0,
            ttft_ms=3_210.0, live_tokens_per_second=480.0 + (n % 7) * 9.0,
            draft_n=3 * (n // 4) if speculative else 0, draft_n_accepted=2 * (n // 4) if speculative else 0,
            draft_rounds=n // 4 if speculative else 0, context_used=28_672 + n,
            vram_used=22 * 2**30 if not demo else 0, vram_total=32 * 2**30 if not demo else 0))
    if not generating:
        state.on_done(Done("stop", state.stats))
    state.set_context(state.context_used, 1_234)
    return state


@pytest.mark.parametrize("case", ["generating", "finished-demo"])
def test_hud(snap_compare, case):
    state = (hud_state(demo=False, speculative=True, generating=True) if case == "generating"
             else hud_state(demo=True, speculative=False, generating=False))
    assert snap_compare(HudApp(state), terminal_size=(110, 3))


def test_session_list(snap_compare, make_app, monkeypatch):
    import lampo.store.sqlite_store as sqlite_store
    app = make_app(SteadyClockBackend(ScriptedBackend(["</think>\n\nOK."])))
    store, sampling = app.session.store, app.session.sampling
    for title, age_s in (("Rust lifetimes explained", 26 * 3600), ("Summarise the quarterly report", 3 * 3600),
                         ("Regex for ISO dates", 90)):
        monkeypatch.setattr(sqlite_store, "time", types.SimpleNamespace(time=lambda a=age_s: FIXED_WALL_CLOCK - a))
        chat = store.create_chat(title, "", sampling, True)
        store.add_message(chat, None, "user", title)

    async def run_before(pilot):
        app.prompt.cursor_blink = False
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("down")

    assert snap_compare(app, terminal_size=(100, 24), run_before=run_before)
