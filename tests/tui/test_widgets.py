"""The TUI's pieces on their own: formatting (sparkline, context bar, HUD cells, prefill label,
footer, ages), the generation feed, sampling fields, segmented streaming Markdown and parking."""

from __future__ import annotations

import threading

import pytest
from textual.app import App
from textual.containers import VerticalScroll

from lampo.engine.protocol import BackendInfo, ContextOverflow, Done, PrefillProgress, Stats, TokenEvent
from lampo.settings import SettingsError
from lampo.tui.app import STYLESHEET
from lampo.tui.context_bar import context_bar
from lampo.tui.generation_feed import GenerationFeed
from lampo.tui.hud import DASH, hud_cells
from lampo.tui.hud_state import SAMPLE_MS, HudState
from lampo.tui.message_view import AssistantMessage, code_blocks, reply_footer
from lampo.tui.prefill_progress import prefill_label
from lampo.tui.session_list import age
from lampo.tui.settings_screen import read_sampling
from lampo.tui.sparkline import sparkline
from lampo.tui.streaming_markdown import StreamingMarkdown, estimate_height, top_level_blocks
from lampo.tui.themes import THEMES, theme_setting
from lampo.tui.transcript import Transcript

INFO = BackendInfo("cuda", "Qwen3.6-35B-A3B", "/m", 262_144)


def test_sparkline_scales_to_the_largest_value_and_keeps_the_last_width():
    assert sparkline([0, 4, 8], 3) == "▁▅█"
    assert sparkline([8, 0, 4, 8], 3) == "▁▅█"
    assert sparkline([0, 0], 5) == "▁▁" and sparkline([], 4) == ""
    with pytest.raises(ValueError, match="width"):
        sparkline([1], 0)


def test_context_bar_shows_used_pending_and_overflow():
    bar = context_bar(250, 250, 1000, 8)
    assert bar.plain == "██▒▒░░░░"
    assert context_bar(1, 1, 1000, 8).plain == "█▒░░░░░░"  # any use shows at least one cell
    overflow = context_bar(900, 200, 1000, 8)
    assert overflow.plain == "█" * 8 and overflow.spans[0].style == "$error"
    with pytest.raises(ValueError, match="maximum"):
        context_bar(0, 0, 0, 8)


def test_hud_shows_dashes_before_anything_happened():
    cells = {k: v.plain for k, v in hud_cells(HudState(INFO)).items()}
    assert cells["decode"].startswith(f"decode  {DASH} tok/s  avg {DASH}")
    assert cells["prefill"] == f"prefill {DASH}" and cells["spec"] == f"spec    {DASH}"
    assert cells["vram"] == f"VRAM    {DASH}" and "0 / 262,144" in cells["context"]
    assert "DEMO" not in cells["model"] and "Qwen3.6-35B-A3B · cuda" in cells["model"]


def test_hud_values_while_generating_and_after():
    state = HudState(BackendInfo("reference", "tiny", "/d", 4096, is_demo=True, speculative=True))
    state.begin_reply()
    stats = Stats(prompt_n=1000, prompt_ms=500.0, cached_n=24, predicted_n=40, predicted_ms=800.0, ttft_ms=520.0,
                  live_tokens_per_second=52.0, draft_n=30, draft_n_accepted=24, draft_rounds=10,
                  context_used=1064, vram_used=3 * 2**30, vram_total=8 * 2**30)
    state.on_stats(stats)
    state.set_context(1064, 20)
    cells = {k: v.plain for k, v in hud_cells(state).items()}
    assert "52.0 tok/s" in cells["decode"] and len(state.rate_samples) == int(800 // SAMPLE_MS)
    assert "2,000.0 tok/s  TTFT 0.52 s  1,000 new · 24 cached" in cells["prefill"]
    assert "80% accepted  3.40 tok/round  24/30" in cells["spec"]
    assert "3.0 / 8.0 GiB" in cells["vram"] and "1,064 / 4,096 +20 to send" in cells["context"]
    assert "DEMO (random weights)" in cells["model"]
    state.on_done(Done("stop", stats))
    cells = {k: v.plain for k, v in hud_cells(state).items()}
    assert f"{DASH} tok/s  avg 50.0" in cells["decode"]  # 40 tokens in 0.8 s


def test_prefill_label_has_rate_and_eta_when_known():
    assert prefill_label(1000, 5000, 2000.0) == "prefill 1,000 / 5,000 tokens · 2,000 tok/s · ETA 2 s · Esc cancels"
    assert prefill_label(0, 64, 0.0) == "prefill 0 / 64 tokens · Esc cancels"
    assert prefill_label(0, 64, 0.0, "f8") == "prefill 0 / 64 tokens · f8 cancels"
    # the engine's fitted time left (later tokens cost more) over the rate so far
    assert prefill_label(1000, 5000, 2000.0, seconds_left=9.4) == (
        "prefill 1,000 / 5,000 tokens · 2,000 tok/s · ETA 9 s · Esc cancels")


def test_reply_footer_and_code_blocks():
    assert reply_footer(None) == ""
    line = reply_footer({"reason": "length", "predicted_n": 3, "predicted_ms": 30.0, "context_used": 9, "context_max": 99})
    assert "3 tokens" in line and "decode 100 tok/s" in line and line.endswith("length limit")
    assert code_blocks("text\n\n```sh\nls\n```\n\n    indented\n") == ["ls\n", "indented\n"]


def test_age_reads_like_a_person_would_say_it():
    assert [age(s) for s in (5, 120, 7200, 86400, 3 * 86400)] == \
        ["just now", "2 min ago", "2 h ago", "1 day ago", "3 days ago"]


def test_read_sampling_names_the_bad_field():
    fields = {"temperature": "0.7", "top_p": "0.9", "top_k": "40", "min_p": "0", "presence_penalty": "0",
              "max_tokens": "512", "seed": ""}
    params = read_sampling(fields)
    assert (params.temperature, params.top_k, params.seed) == (0.7, 40, None)
    with pytest.raises(SettingsError, match="Top-k: 'many' is not a whole number"):
        read_sampling({**fields, "top_k": "many"})
    with pytest.raises(SettingsError, match="temperature must be >= 0"):
        read_sampling({**fields, "temperature": "-1"})


def test_theme_names_map_to_settings_values():
    assert {theme_setting(t.name) for t in THEMES.values()} == {"dark", "light"}
    assert theme_setting("textual-dark") is None


def test_generation_feed_records_events_and_refusals():
    feed = GenerationFeed()
    feed.consume(lambda: iter([PrefillProgress(4, 8), Stats(predicted_n=1), TokenEvent("a", (1, 2)),
                               Done("stop", Stats(predicted_n=2))]))
    assert (feed.tokens, feed.progress.done, feed.done.reason, feed.finished) == (2, 4, "stop", True)

    def refuse():
        raise ContextOverflow(10, 5, 8)

    refused = GenerationFeed()
    refused.consume(refuse)
    assert refused.refused is not None and refused.finished and refused.done is None

    def broken():
        yield TokenEvent("x", (1,))
        raise RuntimeError("engine fell over")

    failed = GenerationFeed()
    failed.consume(broken)
    assert failed.error == "RuntimeError: engine fell over" and failed.tokens == 1 and failed.finished


def test_generation_feed_carries_the_reply_text_split_by_the_thinking_switch():
    events = [TokenEvent("weighing it", (1,)), TokenEvent(" up</think>\n\nYes", (2, 3)), TokenEvent(".", (4,))]
    thinking, plain = GenerationFeed(thinking=True), GenerationFeed(thinking=False)
    thinking.consume(lambda: iter(events))
    plain.consume(lambda: iter(events))
    assert thinking.parts() == ("weighing it up", "Yes.")
    assert plain.parts() == ("", "weighing it up</think>\n\nYes.")


def test_generation_feed_is_filled_from_another_thread():
    feed = GenerationFeed()
    worker = threading.Thread(target=feed.consume, args=(lambda: (TokenEvent("t", (i,)) for i in range(500)),))
    worker.start()
    worker.join()
    assert feed.tokens == 500 and feed.finished


def test_top_level_blocks_and_height_estimate():
    text = "# Title\n\npara one\nstill one\n\n- a\n- b\n\n```\ncode\n```\n"
    assert [kind for _, kind in top_level_blocks(text)] == ["heading_open", "paragraph_open", "bullet_list_open", "fence"]
    assert [line for line, _ in top_level_blocks(text)] == [0, 2, 5, 8]
    assert estimate_height("x" * 25 + "\n\nabc", 10) == 3 + 1 + 1 + 1


class Host(App):
    CSS_PATH = STYLESHEET

    def __init__(self, *widgets):
        super().__init__()
        self.widgets = widgets

    def compose(self):
        with VerticalScroll(id="scroll"):
            yield from self.widgets


PARAGRAPHS = "".join(f"Paragraph number {i} says something.\n\n" for i in range(40))


async def test_streaming_markdown_freezes_segments_and_keeps_the_exact_text():
    view = StreamingMarkdown(segment_blocks=4)
    async with Host(view).run_test(size=(80, 24)) as pilot:
        for end in range(0, len(PARAGRAPHS) + 1, 37):  # frame-sized pieces
            await view.show(PARAGRAPHS[:end])
        await view.show(PARAGRAPHS)
        await pilot.pause()
        assert len(view.segments) >= 9 and all(s.frozen for s in view.frozen_segments)
        assert view.source == PARAGRAPHS
        await view.finish(PARAGRAPHS.strip())
        await pilot.pause()
        assert view.source == PARAGRAPHS.strip()
        assert "".join(s.source for s in view.segments) == PARAGRAPHS.strip()


async def test_streaming_markdown_handles_a_burst_and_a_changed_tail():
    view = StreamingMarkdown(segment_blocks=4)
    async with Host(view).run_test(size=(80, 24)) as pilot:
        await view.show(PARAGRAPHS)  # everything in one frame: split without streaming
        await pilot.pause()
        born_parked = [s for s in view.frozen_segments if s.parked]
        assert born_parked and all(s.text for s in born_parked)
        await view.show(PARAGRAPHS + "tail </thi")
        await view.show(PARAGRAPHS + "tail done")  # not an extension: the tail is re-rendered
        await pilot.pause()
        assert view.source == PARAGRAPHS + "tail done"
        assert view.segments[-1].source.endswith("tail done")


async def test_far_messages_are_parked_and_come_back_when_scrolled_to():
    records = [("answer", f"Reply {i}.\n\n" + "- point\n" * 6) for i in range(40)]
    transcript = Transcript(lambda r: AssistantMessage("", r[1]), window=60, page=20)
    app = Host()
    app.compose = lambda: iter([transcript])
    async with app.run_test(size=(80, 24)) as pilot:
        await transcript.show(records)
        for _ in range(5):
            await pilot.pause(0.05)
        parked = [w for w in transcript.message_widgets if w.parked]
        assert parked and not transcript.message_widgets[-1].parked
        assert all(not w.children for w in parked) and all(w.styles.height is not None for w in parked)
        first = transcript.message_widgets[0]
        assert first.parked
        transcript.scroll_home(animate=False, immediate=True)
        for _ in range(20):
            await pilot.pause(0.05)
            if not first.parked:
                break
        assert not first.parked and first.answer.startswith("Reply 0.")


def test_the_hud_names_the_weight_format_the_engine_runs():
    from lampo.tui.hud import hud_cells

    state = HudState(BackendInfo("cuda", "Qwen3.6-35B-A3B", "/m", 262_144, weights="q5"))
    assert "cuda q5" in hud_cells(state)["model"].plain
    assert hud_cells(HudState(INFO))["model"].plain.endswith("· cuda")
