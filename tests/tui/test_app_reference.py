"""The chat UI on the real numpy `ReferenceBackend` with the tiny synthetic MoE checkpoint (random
weights, the real Qwen3.6 tokenizer): streaming and the HUD, Esc, a 200 KB paste with its prefill
progress, the overflow refusal and a chat that survives a restart."""

from __future__ import annotations

import pytest
from helpers import real_tokenizer
from textual.events import Paste
from tui_helpers import wait_idle, wait_until

from lampo.models.sampling_params import SamplingParams
from lampo.engine.reference import ReferenceBackend
from lampo.tui.attachment_chip import AttachmentChip
from lampo.tui.hud import hud_cells
from lampo.tui.message_view import AssistantMessage, UserMessage

SIZE = (100, 32)
DOCUMENT = ("Lampo keeps the whole conversation in the engine; a long document is prefilled once "
            "and every later question reuses it. ") * 1800  # ~205 KB


@pytest.fixture(scope="module")
def backend(tiny_moe_dir):
    return ReferenceBackend(tiny_moe_dir, context_max=131_072, tokenizer=real_tokenizer())


@pytest.fixture
def app(make_app, backend):
    backend.reset()
    app = make_app(backend)
    app.session.set_sampling(SamplingParams(temperature=0.0, top_k=0, top_p=1.0, max_tokens=200))
    return app


def decode_cell(app) -> str:
    return hud_cells(app.hud_state)["decode"].plain


async def test_tokens_stream_hud_changes_and_escape_keeps_the_partial_reply(app):
    async with app.run_test(size=SIZE) as pilot:
        hud_before = decode_cell(app)
        assert "decode  — tok/s" in hud_before and app.hud_state.context_used == 0
        app.prompt.load_text("Hello there")
        await pilot.press("enter")
        live = app.query_one(AssistantMessage)
        await wait_until(pilot, lambda: app.displayed_tokens >= 3 and app.hud_state.stats.predicted_n >= 3,
                         timeout=60, what="3 streamed tokens")
        shown = live.reasoning + live.answer
        assert shown  # tokens reached the transcript while generating
        assert app.generating and app.hud_state.stats.predicted_n >= 3
        assert decode_cell(app) != hud_before and app.hud_state.context_used > 10
        app.prompt.insert("my next question")
        await pilot.press("escape")
        await wait_idle(pilot, app)
        reply = app.session.turns[-1]
        assert reply.role == "assistant" and reply.stopped
        assert live.reasoning == reply.reasoning and live.answer == reply.content
        assert (reply.reasoning + reply.content).startswith(shown.strip()[:10])
        assert app.prompt.text == "my next question"
        assert app.hud_state.last_reason == "cancelled" and app.hud_state.last_reply_rate > 0
        assert "stopped" in str(live.query_one(".reply-footer").render())


@pytest.mark.slow
async def test_a_200_kb_paste_becomes_a_chip_and_its_prefill_shows_progress(app):
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(Paste(DOCUMENT))
        await wait_until(pilot, lambda: app.attachments, timeout=30, what="the attachment chip")
        chip = app.query_one("#chips AttachmentChip", AttachmentChip)
        tokens = real_tokenizer().count(DOCUMENT)
        assert chip.info.tokens == tokens > 30_000 and f"{tokens:,} tokens" in str(chip.render())
        assert app.prompt.text == ""
        await wait_until(pilot, lambda: app.hud_state.pending_tokens > tokens, timeout=30, what="pending count")
        assert f"+{app.hud_state.pending_tokens:,} to send" in hud_cells(app.hud_state)["context"].plain
        app.prompt.load_text("What does this say?")
        await pilot.press("enter")
        bar = app.query_one("#prefill")
        await wait_until(pilot, lambda: bar.has_class("-active") and app._feed.progress is not None,
                         timeout=60, what="prefill progress")
        label = str(bar.query_one("#prefill-label").render())
        assert f"/ {app._feed.progress.total:,} tokens" in label and "tok/s" in label and "ETA" in label
        await pilot.press("escape")  # a long prefill can be cancelled
        await wait_idle(pilot, app)
        assert not bar.has_class("-active") and app.hud_state.last_reason == "cancelled"
        user = app.session.turns[0]
        assert [a.tokens for a in user.attachments] == [tokens]
        assert app.query_one(UserMessage).query(AttachmentChip)


async def test_a_prompt_over_the_context_is_refused_with_the_numbers(make_app, tiny_moe_dir):
    small = ReferenceBackend(tiny_moe_dir, context_max=256, tokenizer=real_tokenizer())
    app = make_app(small)
    async with app.run_test(size=SIZE) as pilot:
        text = "too long " * 200
        app.prompt.load_text(text)
        await wait_until(pilot, lambda: app.hud_state.pending_tokens > 256, timeout=30, what="pending count")
        await pilot.press("enter")
        await wait_idle(pilot, app)
        assert not app.session.turns and not app.query(UserMessage)
        assert app.prompt.text == text
        message = list(app._notifications)[-1].message
        assert "context holds 256" in message and "nothing was truncated" in message


async def test_a_chat_survives_an_app_restart(make_app, backend):
    backend.reset()
    first = make_app(backend)
    first.session.set_sampling(SamplingParams(temperature=0.0, top_k=0, top_p=1.0, max_tokens=4))
    async with first.run_test(size=SIZE) as pilot:
        first.prompt.load_text("Remember me")
        await pilot.press("enter")
        await wait_idle(pilot, first)
        stored = [(t.role, t.content, t.reasoning, t.stopped) for t in first.session.turns]
        assert [t[0] for t in stored] == ["user", "assistant"]

    backend.reset()
    second = make_app(backend)
    async with second.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert [c.title for c in second.screen.chats] == ["Remember me"]
        await pilot.press("enter")
        await pilot.pause()
        assert [(t.role, t.content, t.reasoning, t.stopped) for t in second.session.turns] == stored
        views = second.query(AssistantMessage)
        assert [(v.answer, v.reasoning) for v in views] == [stored[1][1:3]]
        assert [v.text for v in second.query(UserMessage)] == ["Remember me"]
        assert second.session.sampling.max_tokens == 4  # the chat's own sampling came back too
