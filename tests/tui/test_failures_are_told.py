"""Failures outside the chat itself are told in the TUI and never end it: an engine error whose
text looks like markup, a settings file that cannot be saved, a chat database that fails while
the chat list renames / deletes / exports, an export folder that cannot be written."""

from __future__ import annotations

from helpers.scripted_backend import ScriptedBackend
from tui_helpers import wait_idle, wait_until

from lampo.engine.protocol import Done, Stats
from lampo.tui.session_list import SessionListScreen

SIZE = (100, 32)


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


class FailingBackend(ScriptedBackend):
    """Every reply fails at once with an error text full of Textual markup."""

    ERROR = "RuntimeError: [/] [bold]kernel [red failed[/red"

    def generate(self, request, cancel):
        return iter([Done("error", Stats(), self.ERROR)])


async def test_an_engine_error_that_looks_like_markup_is_shown_as_text(make_app):
    app = make_app(FailingBackend())
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("hello")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        await wait_until(pilot, lambda: FailingBackend.ERROR in messages(app), what="the error toast")
        assert app.is_running


async def test_a_settings_file_that_cannot_be_saved_is_a_warning(make_app, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    app = make_app(ScriptedBackend(["Hi."]), settings_path=blocker / "config.toml")
    async with app.run_test(size=SIZE) as pilot:
        app.action_set_lampo_theme("light")
        await wait_until(pilot, lambda: any(m.startswith("The settings could not be saved") for m in messages(app)),
                         what="the warning")
        assert app.settings.theme == "light"  # the change holds for this run


async def test_the_chat_list_survives_a_failing_database_and_export_folder(make_app, tmp_path):
    app = make_app(ScriptedBackend(["Hi."]), export_dir=tmp_path / "file" / "exports")
    (tmp_path / "file").write_text("not a directory")
    app.session.set_thinking(False)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.load_text("hello")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionListScreen), what="the chat list")
        screen = app.screen

        def hint() -> str:
            return str(screen.query_one("#session-hint").render())

        await pilot.press("e")  # the export folder cannot be created
        await wait_until(pilot, lambda: hint().startswith("⚠"), what="the export failure")
        app.session.store._conn.execute("PRAGMA query_only = ON")  # the file turns read-only
        await pilot.press("r", "x", "enter")  # the open chat: kept in memory, saved when possible
        await wait_until(pilot, lambda: any(m.startswith("Not saved:") for m in messages(app)),
                         what="the not-saved toast")
        await pilot.press("d", "d")
        await wait_until(pilot, lambda: "could not save to the chat database" in hint(), what="the delete failure")
        assert len(screen.chats) == 1 and app.is_running
        app.session.store._conn.execute("PRAGMA query_only = OFF")
