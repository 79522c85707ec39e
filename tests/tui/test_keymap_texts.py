"""The user's `[keys]` reach every text that names a key: the footer, the prompt's placeholder, the
edit banner and the "still generating" notice. And `FIXED_KEYS` (which settings.py refuses to
rebind) are exactly the keys the app binds outside the user's key map."""

from __future__ import annotations

from dataclasses import replace

from helpers.scripted_backend import ScriptedBackend
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static
from textual.widgets._footer import FooterKey
from tui_helpers import GatedBackend, wait_idle, wait_until

from lampo.settings import DEFAULT_KEYS, FIXED_KEYS, load_settings, write_settings
from lampo.tui.app import LampoApp
from lampo.tui.prompt_input import PromptInput

SIZE = (120, 32)


async def test_texts_name_the_bound_keys(make_app):
    settings = load_settings()
    write_settings(replace(settings, keys={**settings.keys, "send": "alt+enter", "stop": "f8",
                                           "regenerate": "f9"}))
    app = make_app(GatedBackend(ScriptedBackend(["a"])))
    notices: list[str] = []
    app.notify = lambda message, **kwargs: notices.append(str(message))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        placeholder = str(app.prompt.placeholder)
        assert placeholder.startswith("Message (alt+Enter sends,"), placeholder
        shown = {key.action: key.key for key in app.query(FooterKey)}
        assert shown["submit"] == "alt+enter" and shown["regenerate"] == "f9", shown

        app.prompt.load_text("q")
        await pilot.press("alt+enter")
        await wait_until(pilot, lambda: app.generating, what="the reply to start")
        await pilot.press("f9")  # regenerate while generating: refused, naming the stop key
        await pilot.press("f8")
        await wait_idle(pilot, app)
        assert "A reply is still being generated: f8 stops it." in notices, notices

        await pilot.press("ctrl+e")
        banner = str(app.query_one("#edit-banner", Static).content)
        assert "alt+Enter resends it" in banner and "f8 cancels" in banner, banner


async def test_default_texts_say_enter_and_esc(make_app):
    app = make_app(ScriptedBackend(["a"]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert str(app.prompt.placeholder) == "Message (Enter sends, ctrl+j newline, ctrl+p commands, /attach FILE)"
        banner = str(app.query_one("#edit-banner", Static).content)
        assert banner == "Editing your last message: Enter resends it as a new branch, Esc cancels."


def test_fixed_keys_are_the_bindings_outside_the_key_map():
    ours = list(Binding.make_bindings([*LampoApp.BINDINGS, *PromptInput.BINDINGS]))
    textual = Binding.make_bindings([*App.BINDINGS, *Screen.BINDINGS])
    fixed = ({b.key for b in ours if b.id not in DEFAULT_KEYS}
             | {b.key for b in textual if b.action != "quit"}  # App's own ctrl+q is our quit action
             | {LampoApp.COMMAND_PALETTE_BINDING})
    assert set(FIXED_KEYS) == fixed
    assert set(DEFAULT_KEYS) <= {b.id for b in ours}  # every [keys] action has a binding to rebind
