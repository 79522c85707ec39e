"""Widgets the transcript removes (a new chat, a resumed one, parking, a finished live reply)
are freed: nothing app-wide - a theme watcher, a signal subscription - keeps them alive. The
soak (test_soak.py) measures the same over 1,000 turns; these catch it in seconds."""

from __future__ import annotations

import gc
import weakref

from helpers.scripted_backend import ScriptedBackend
from textual.app import App
from tui_helpers import wait_idle, wait_until

from lampo.tui.markdown_view import CODE_THEMES, MarkdownView, rich_markdown_theme
from lampo.tui.message_view import AssistantMessage, UserMessage
from lampo.tui.session_list import SessionListScreen
from lampo.tui.themes import THEMES

SIZE = (100, 32)
REPLY = ["<think>", "\n", "Let me ", "think.", "</think>", "\n\n", "The answer ", "is **42**."]


def alive(refs: list[weakref.ref]) -> list:
    gc.collect()
    return [r() for r in refs if r() is not None]


async def test_a_markdown_view_follows_the_theme():
    app = App()
    async with app.run_test(size=SIZE) as pilot:
        for theme in THEMES.values():
            app.register_theme(theme)
        app.theme = THEMES["dark"].name
        view = MarkdownView("**bold** and `code`")
        await app.screen.mount(view)
        assert view.content.theme.styles == rich_markdown_theme(THEMES["dark"]).styles
        app.theme = THEMES["light"].name
        await pilot.pause()
        assert view.content.theme.styles == rich_markdown_theme(THEMES["light"]).styles
        assert view.content.code_theme == CODE_THEMES[False]


async def test_the_widgets_of_a_left_chat_are_freed(make_app):
    app = make_app(ScriptedBackend([REPLY]))
    async with app.run_test(size=SIZE) as pilot:
        for text in ("one", "two", "three"):
            app.prompt.load_text(text)
            await pilot.press("enter")
            await wait_idle(pilot, app)
        messages = list(app.query(UserMessage)) + list(app.query(AssistantMessage))
        refs = [weakref.ref(w) for m in messages for w in (m, *m.walk_children())]
        assert len(messages) == 6 and any(isinstance(r(), MarkdownView) for r in refs)
        del messages
        await pilot.press("ctrl+n")
        await wait_idle(pilot, app)
        assert alive(refs) == []


async def test_dialogs_opened_and_closed_leave_no_footer_keys_behind(make_app):
    """The footer re-composes its keys whenever the bindings change (a dialog opens or closes);
    the keys it replaced must go."""
    app = make_app(ScriptedBackend([REPLY]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.query("FooterKey"), what="the footer's keys")
        refs = [weakref.ref(key) for key in app.query("FooterKey")]
        for _ in range(3):
            await pilot.press("ctrl+o")
            await wait_until(pilot, lambda: isinstance(app.screen, SessionListScreen), what="the chat list")
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, SessionListScreen), what="the chat")
            await pilot.pause()
        assert alive(refs) == []



async def test_a_token_count_that_lands_as_the_app_closes_is_kept_not_raised(make_app):
    """The draft's token count runs in a worker; its result may arrive after the chat screen's
    widgets are gone (the app closing): it is kept in the HUD state, not raised."""
    app = make_app(ScriptedBackend([REPLY]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.query("#hud"), what="the HUD")
        await app.query_one("#hud").remove()
        app._show_context(12, 3)
        assert (app.hud_state.context_used, app.hud_state.pending_tokens) == (12, 3)
