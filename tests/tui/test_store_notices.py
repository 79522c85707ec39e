"""The chat store's news in the TUI: a write that fails mid-session is a toast (once) and the chat
goes on, the toast after saving recovers, and a reply cut short by a crash shows "interrupted"."""

from __future__ import annotations

from helpers.scripted_backend import ScriptedBackend
from tui_helpers import wait_idle, wait_until

from lampo.models.sampling_params import GREEDY
from lampo.tui.message_view import AssistantMessage

SIZE = (100, 32)


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


async def send(pilot, app, text: str) -> None:
    app.prompt.load_text(text)
    await pilot.press("enter")


async def test_a_failed_write_is_a_toast_and_the_chat_goes_on(make_app):
    app = make_app(ScriptedBackend(["First.", "Second.", "Third."]))
    store = app.session.store
    app.session.set_thinking(False)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "one")
        await wait_idle(pilot, app)
        store._conn.execute("PRAGMA query_only = ON")  # the file turns read-only
        await send(pilot, app, "two")
        await wait_idle(pilot, app)
        await wait_until(pilot, lambda: any(m.startswith("Not saved:") for m in messages(app)),
                         what="the not-saved toast")
        assert [t.content for t in app.session.turns] == ["one", "First.", "two", "Second."]
        assert len(app.query(AssistantMessage)) == 2
        store._conn.execute("PRAGMA query_only = OFF")
        await send(pilot, app, "three")
        await wait_idle(pilot, app)
        await wait_until(pilot, lambda: "Saving works again: this chat is stored." in messages(app),
                         what="the saved-again toast")
        assert sum(m.startswith("Not saved:") for m in messages(app)) == 1
    assert [m.content for m in store.branch(app.session.chat_id, None)] == \
        ["one", "First.", "two", "Second.", "three", "Third."]


async def test_an_interrupted_reply_says_so_in_its_footer(make_app):
    app = make_app(ScriptedBackend(["unused"]))
    store = app.session.store
    c = store.create_chat("cut short", "", GREEDY, False)
    u = store.add_message(c, None, "user", "tell me")
    store.add_message(c, u, "assistant", "Once upon a", complete=False,
                      stats={"reason": "interrupted", "predicted_n": 3, "context_max": 4096})
    app.session.load(c)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: len(app.query(AssistantMessage)) == 1, what="the stored reply")
        footer = str(app.query_one(AssistantMessage).query_one(".reply-footer").render())
        assert footer.endswith(" · interrupted") and "3 tokens" in footer
