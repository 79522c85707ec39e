"""The chat UI through Textual's Pilot on the scripted backend: streaming, thinking, stop,
regenerate, edit, history, attachments, overflow, settings, chats, palette, key map."""

from __future__ import annotations

from helpers.scripted_backend import ScriptedBackend
from textual.events import Paste
from tui_helpers import GatedBackend, wait_idle, wait_until

from lampo.settings import load_settings, write_settings
from lampo.tui.attachment_chip import AttachmentChip
from lampo.tui.message_view import AssistantMessage, UserMessage

THOUGHT = ["<think>", "\n", "Let me ", "think.", "</think>", "\n\n", "The answer ", "is **42**.\n\n",
           "```python\n", "print(42)\n", "```\n"]
SIZE = (100, 32)


async def send(pilot, app, text: str) -> None:
    """Type `text` (set directly: simulated key presses are slow while the app is busy) and
    press Enter."""
    app.prompt.load_text(text)
    await pilot.press("enter")


def assistant_views(app) -> list[AssistantMessage]:
    return list(app.query(AssistantMessage))


async def test_send_streams_thinking_then_answer_and_stores_it(make_app):
    backend = GatedBackend(ScriptedBackend([THOUGHT]))
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        backend.release(4)
        await wait_until(pilot, lambda: "Let me" in app.query_one(AssistantMessage).reasoning,
                         what="thinking to stream")
        live = app.query_one(AssistantMessage)
        assert live.thinking.display and not live.thinking.folded and live.answer == ""
        assert app.hud_state.generating and app.query_one(".thinking-title").render().plain.startswith("▼ thinking…")
        backend.release(3)
        await wait_until(pilot, lambda: live.answer.startswith("The answer"), what="the answer")
        assert live.thinking.folded  # folded as soon as the answer started
        backend.release(100)
        await wait_idle(pilot, app)
        assert (live.reasoning, live.answer) == ("Let me think.", "The answer is **42**.\n\n```python\nprint(42)\n```")
        assert [t.role for t in app.session.turns] == ["user", "assistant"]
        assert app.transcript.records == app.session.turns
        assert "11 tokens" in str(live.query_one(".reply-footer").render())
        assert app.prompt.text == "" and app.hud_state.last_reply_rate > 0


async def test_escape_stops_and_keeps_partial_reply_and_typed_text(make_app):
    backend = GatedBackend(ScriptedBackend([list("abcdefghijklmnopqrstuvwxyz" * 4)]))
    app = make_app(backend)
    app.session.set_thinking(False)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go")
        backend.release(6)
        await wait_until(pilot, lambda: len(app.query_one(AssistantMessage).answer) >= 5, what="5 tokens")
        app.prompt.insert("next question")  # typing while it generates
        await pilot.press("escape")
        await wait_idle(pilot, app)
        reply = app.session.turns[-1]
        assert reply.stopped and reply.content == "abcdef"
        assert app.query_one(AssistantMessage).answer == reply.content
        assert "stopped" in str(app.query_one(AssistantMessage).query_one(".reply-footer").render())
        assert app.prompt.text == "next question"
        assert app.hud_state.last_reason == "cancelled"


async def test_enter_while_generating_does_not_send(make_app):
    backend = GatedBackend(ScriptedBackend(["x" * 100]))
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "a")
        backend.release(3)
        await wait_until(pilot, lambda: app._feed.tokens > 2, what="tokens")
        app.prompt.load_text("b")
        await pilot.press("enter")
        assert app.prompt.text == "b"
        await pilot.press("escape")
        await wait_idle(pilot, app)
        assert [t.content for t in app.session.turns if t.role == "user"] == ["a"]


async def test_regenerate_replaces_the_shown_reply_and_edit_resends(make_app):
    app = make_app(ScriptedBackend(["first reply", "second reply", "third reply"]))
    app.session.set_thinking(False)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "question")
        await wait_idle(pilot, app)
        await pilot.press("ctrl+r")
        await wait_idle(pilot, app)
        assert [v.answer for v in assistant_views(app)] == ["second reply"]
        await pilot.press("ctrl+e")
        assert app.prompt.text == "question" and app.query_one("#edit-banner").has_class("-editing")
        app.prompt.insert(" (edited)")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        assert [v.text for v in app.query(UserMessage)] == ["question (edited)"]
        assert [v.answer for v in assistant_views(app)] == ["third reply"]
        assert [t.content for t in app.session.turns] == ["question (edited)", "third reply"]


async def test_history_recall_with_up_and_ctrl_down(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        for text in ("one", "two"):
            await pilot.press(*text, "enter")
            await wait_idle(pilot, app)
        app.prompt.load_text("draft")
        await pilot.press("up")
        assert app.prompt.text == "two"
        await pilot.press("up")
        assert app.prompt.text == "one"
        await pilot.press("ctrl+down", "ctrl+down")
        assert app.prompt.text == "draft"


async def test_newline_key_inserts_instead_of_sending(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a", "ctrl+j", "b")
        assert app.prompt.text == "a\nb" and not app.session.turns


async def test_long_paste_becomes_a_chip_and_is_sent_as_attachment(make_app):
    app = make_app(ScriptedBackend(["read it"]))
    document = "The quick brown fox jumps over the lazy dog. " * 100  # 4,500 characters
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(Paste(document))  # as the terminal driver delivers it
        await wait_until(pilot, lambda: app.attachments, what="the attachment")
        chip = app.query_one("#chips AttachmentChip", AttachmentChip)
        assert chip.info.tokens == app.session.tokenizer.count(document) > 100
        assert f"{chip.info.tokens:,} tokens" in str(chip.render())
        assert app.prompt.text == ""  # the paste did not flood the editor
        await wait_until(pilot, lambda: app.hud_state.pending_tokens > chip.info.tokens, what="pending count")
        await send(pilot, app, "summarise")
        await wait_idle(pilot, app)
        user = app.session.turns[0]
        assert user.content == "summarise" and [a.text for a in user.attachments] == [document]
        assert not app.attachments and app.query_one(UserMessage).query(AttachmentChip)


async def test_short_paste_is_inserted_as_text(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(Paste("short text"))
        await pilot.pause()
        assert app.prompt.text == "short text" and not app.attachments


async def test_attach_command_reads_a_file_and_removing_the_chip_drops_it(make_app, tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nSome text.\n", encoding="utf-8")
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, f"/attach {doc}")
        await wait_until(pilot, lambda: app.attachments, what="the attachment")
        assert app.attachments[0].name == "notes.md" and app.prompt.text == ""
        await pilot.click("#chips AttachmentChip")
        await wait_until(pilot, lambda: not app.attachments, what="the attachment to be dropped")
        assert not app.attachments and not app.query("#chips AttachmentChip")
        await send(pilot, app, f"/attach {tmp_path / 'missing.txt'}")
        await pilot.pause()
        assert any("no such file" in n.message for n in app._notifications)


async def test_overflow_is_refused_with_numbers_and_the_draft_kept(make_app):
    app = make_app(ScriptedBackend(["never"], context_max=64))
    async with app.run_test(size=SIZE) as pilot:
        long_text = "word " * 200
        app.prompt.load_text(long_text)
        await wait_until(pilot, lambda: app.hud_state.pending_tokens > 64, what="pending count")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        assert not app.session.turns and not app.query(UserMessage) and not app.query(AssistantMessage)
        assert app.prompt.text == long_text  # nothing lost, nothing truncated
        message = app._notifications.last.message if hasattr(app._notifications, "last") else \
            list(app._notifications)[-1].message
        assert "context holds 64" in message and "nothing was truncated" in message


async def test_theme_and_sampling_changes_persist(make_app, lampo_home):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hi")
        await wait_idle(pilot, app)
        await pilot.press("f2")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#field-temperature").value = "0.25"
        screen.query_one("#field-top_k").value = "7"
        screen.query_one("#field-theme").value = "light"
        screen.query_one("#as-default").value = True
        await pilot.click("#save")
        await pilot.pause()
        assert app.theme == "lampo-light"
        chat = app.session.store.get_chat(app.session.chat_id)
        assert (chat.sampling.temperature, chat.sampling.top_k) == (0.25, 7)
    saved = load_settings()
    assert saved.theme == "light" and saved.sampling.temperature == 0.25 and saved.sampling.top_k == 7


async def test_settings_dialog_names_a_bad_value_and_stays_open(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one("#field-top_p").value = "1.5"
        await pilot.click("#save")
        await pilot.pause()
        assert "top_p must be in (0, 1]" in str(app.screen.query_one("#settings-error").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.session.sampling.top_p == 0.95


async def test_palette_theme_command_is_saved(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause()
        app.screen.query_one("Input").value = "theme light"
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert app.theme == "lampo-light"
    assert load_settings().theme == "light"


async def test_user_keymap_from_settings_rebinds_actions(make_app):
    settings = load_settings()
    write_settings(type(settings)(keys={**settings.keys, "new_chat": "f5", "regenerate": "f6"}))
    app = make_app(ScriptedBackend(["a", "b"]))
    app.session.set_thinking(False)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "q")
        await wait_idle(pilot, app)
        await pilot.press("f6")
        await wait_idle(pilot, app)
        assert app.session.turns[-1].content == "b"
        await pilot.press("f5")
        await pilot.pause()
        assert not app.session.turns and not app.query(UserMessage)


async def test_copy_last_reply_and_code_block(make_app):
    app = make_app(ScriptedBackend([THOUGHT]))
    copied = []
    async with app.run_test(size=SIZE) as pilot:
        app.copy_to_clipboard = copied.append
        await send(pilot, app, "code please")
        await wait_idle(pilot, app)
        await pilot.press("ctrl+y")
        await app.run_action("copy_code(0)")
        assert copied == ["The answer is **42**.\n\n```python\nprint(42)\n```", "print(42)\n"]


async def test_chats_survive_a_restart_and_can_be_renamed_deleted_exported(make_app, tmp_path):
    app = make_app(ScriptedBackend(["</think>\n\nfirst answer"]))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first chat")
        await wait_idle(pilot, app)
        await pilot.press("ctrl+n")
        await send(pilot, app, "second chat")
        await wait_idle(pilot, app)

    app = make_app(ScriptedBackend(["more"]))  # a new process: same LAMPO_HOME, fresh session
    async with app.run_test(size=SIZE) as pilot:
        assert not app.session.turns
        await pilot.press("ctrl+o")
        await pilot.pause()
        screen = app.screen
        assert [c.title for c in screen.chats] == ["second chat", "first chat"]
        await pilot.press("down", "r", "ctrl+a", "ctrl+k", *"renamed", "enter")
        await pilot.pause()
        assert [c.title for c in screen.chats] == ["renamed", "second chat"]  # renaming bumps it
        await pilot.press("e")
        exported = tmp_path / f"lampo-{screen.chats[0].id}-renamed.md"
        assert exported.read_text().startswith("# renamed\n") and "first answer" in exported.read_text()
        await pilot.press("down", "d", "d")
        await pilot.pause()
        assert [c.title for c in screen.chats] == ["renamed"]
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is not screen
        assert [t.content for t in app.session.turns] == ["first chat", "first answer"]
        assert [v.answer for v in assistant_views(app)] == ["first answer"]
        assert "renamed" in app.sub_title


async def test_the_view_follows_while_anchored_before_the_layout_catches_up(make_app):
    """A message appended before the layout pass has moved the anchored view down still finds it
    following (a busy machine lags that pass: the window then never trimmed); a scroll by the
    user releases the anchor and stops following."""
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        transcript = app.transcript
        for i in range(6):
            await send(pilot, app, f"m{i}")
            await wait_idle(pilot, app)
        assert transcript.max_scroll_y > 1
        transcript.scroll_y = 0  # where a lagging layout pass leaves the anchored view for a moment
        assert transcript.following
        transcript.scroll_to(y=0, animate=False, immediate=True)  # the user scrolls up: the anchor is released
        assert not transcript.following


async def test_long_chat_mounts_a_window_and_loads_earlier(make_app):
    app = make_app(ScriptedBackend(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        transcript = app.transcript
        transcript.window, transcript.page = 10, 5
        for i in range(9):
            await send(pilot, app, f"m{i}")
            await wait_idle(pilot, app)
        assert len(transcript.message_widgets) <= 15
        assert len(transcript.records) == 18
        assert transcript.earlier_count == 18 - len(transcript.message_widgets)
        before = transcript.earlier_count
        await pilot.press("ctrl+pageup")
        await pilot.pause()
        assert transcript.earlier_count == before - 5
        transcript.scroll_home(animate=False)
        await wait_until(pilot, lambda: transcript.earlier_count == 0, what="scroll-up loading")
        assert len(transcript.message_widgets) == 18
        assert transcript.message_widgets[0].text == "m0"
