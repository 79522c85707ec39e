"""UI throughput benchmark: can the TUI display what the engine produces, and scroll a long chat?

1. Streaming: the `FloodBackend` emits a Markdown reply (a thinking part, then prose, lists and
   code fences) with one TokenEvent + one Stats per token, as fast as it can (or paced with
   --rate). Every 50 ms we sample tokens received by the UI (`GenerationFeed.tokens`) against
   tokens displayed (`LampoApp.displayed_tokens`: handed to the Markdown views in a frame).
   Reported: tokens/s received and displayed, the largest backlog (tokens and milliseconds of
   stream), the catch-up time after the last token, frame-callback durations, the longest
   event-loop stall, and whether the final text is complete.
2. Scrolling: a stored chat of N messages is resumed and scrolled from the bottom to the very
   top in steps of a few lines (older messages are mounted as the view reaches them). Reported:
   time from each scroll to the next screen update, and the longest event-loop stall.

Run as a script (numbers for docs/ui-benchmark.md):
    python tests/tui/bench_ui.py [--tokens 20000] [--rate 0] [--messages 300] [--json FILE]
As CPU tests (small sizes; they record the numbers and assert only correctness and sanity):
    pytest tests/tui/bench_ui.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # `helpers` and `tui_helpers`, also when run as a script
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from helpers import real_tokenizer  # noqa: E402
from helpers.flood_backend import FloodBackend  # noqa: E402

from lampo.chat_session import ChatSession  # noqa: E402
from lampo.models.chat_format import split_reasoning  # noqa: E402
from lampo.models.sampling_params import SamplingParams  # noqa: E402
from lampo.settings import Settings  # noqa: E402
from lampo.store import Store  # noqa: E402
from lampo.tui.app import LampoApp  # noqa: E402
from lampo.tui.message_view import AssistantMessage  # noqa: E402

SIZE = (120, 40)
SAMPLE_S = 0.05


class StallMeter:
    """Longest gap between wake-ups of a task that asks to sleep 5 ms: how long the event loop
    (input, rendering) was blocked."""

    def __init__(self):
        self.max_gap_ms = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            self.max_gap_ms = max(self.max_gap_ms, (now - last) * 1000.0)
            last = now

    def __enter__(self) -> StallMeter:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        self._task.cancel()


def _quantiles_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {"count": len(values), "mean_ms": round(statistics.fmean(values) * 1000, 2),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2)}


def _session(backend, home: Path) -> ChatSession:
    return ChatSession(backend, real_tokenizer(), Store(home / "bench.sqlite3"),
                       sampling=SamplingParams(max_tokens=10**6))


async def stream_benchmark(n_tokens: int, rate: float | None, home: Path, frame_hz: float = 30.0) -> dict:
    backend = FloodBackend(n_tokens, thinking_tokens=min(200, n_tokens // 10), tokens_per_second=rate)
    session = _session(backend, home)
    app = LampoApp(session, Settings(), frame_hz=frame_hz, export_dir=home)
    frame_times: list[float] = []
    samples: list[tuple[float, int, int]] = []  # (seconds, received, displayed)
    async with app.run_test(size=SIZE) as pilot:
        timed_frame = app._frame

        async def frame() -> None:
            t = time.perf_counter()
            await timed_frame()
            frame_times.append(time.perf_counter() - t)

        app._frame = frame
        app.prompt.load_text("Flood me.")
        with StallMeter() as stalls:
            t0 = time.perf_counter()
            app.prompt.action_submit()  # what Enter does (pilot.press would wait for the reply)
            while not app.generating:
                await asyncio.sleep(0.001)
            while app.generating:
                samples.append((time.perf_counter() - t0, app._feed.tokens, app.displayed_tokens))
                await asyncio.sleep(SAMPLE_S)
            t_end = time.perf_counter() - t0
        await app.workers.wait_for_complete()
        await pilot.pause()
        view = app.query(AssistantMessage).last()
        reasoning, answer = split_reasoning(backend.text)
        complete = (view.reasoning, view.answer) == (reasoning, answer) == \
            (session.turns[-1].reasoning, session.turns[-1].content)
        received_all = next((t for t, r, _ in samples if r >= n_tokens), t_end)
    session.store.close()
    backlog = max(((r - d), t) for t, r, d in samples) if samples else (0, 0.0)
    rate_seen = n_tokens / received_all if received_all > 0 else float("inf")
    # Falling behind would show as a backlog growing from one quarter of the stream to the next.
    quarters = [max((r - d for t, r, d in samples if q * received_all / 4 <= t < (q + 1) * received_all / 4),
                    default=0) for q in range(4)]
    return {
        "tokens": n_tokens, "paced_rate": rate, "frame_hz": frame_hz,
        "seconds": round(t_end, 3),
        "received_tok_per_s": round(rate_seen, 1),
        "displayed_tok_per_s": round(n_tokens / t_end, 1),
        "max_backlog_tokens": backlog[0],
        "max_backlog_ms_of_stream": round(backlog[0] / rate_seen * 1000, 1) if rate_seen else 0.0,
        "max_backlog_tokens_by_quarter": quarters,
        "catch_up_after_last_token_ms": round((t_end - received_all) * 1000, 1),
        "frames": _quantiles_ms(frame_times),
        "max_event_loop_stall_ms": round(stalls.max_gap_ms, 1),
        "final_text_complete": complete,
        "chars": len(answer) + len(reasoning),
    }


def _seed_long_chat(store: Store, n_messages: int) -> int:
    chat = store.create_chat("A long chat", "", SamplingParams(), True)
    parent = None
    for i in range(n_messages):
        if i % 2 == 0:
            text = f"Question {i // 2}: how do I do thing number {i // 2} properly?"
            parent = store.add_message(chat, parent, "user", text)
        else:
            text = (f"Answer {i // 2}. Here is a **short** explanation with `inline code` and a list:\n\n"
                    "- first point\n- second point\n\n"
                    f"```python\ndef thing_{i // 2}(x):\n    return x * {i}\n```\n\nThat is all.")
            parent = store.add_message(chat, parent, "assistant", text, reasoning="Some reasoning.")
    return chat


async def scroll_benchmark(n_messages: int, home: Path, step_lines: int = 6) -> dict:
    session = _session(FloodBackend(1), home)
    session.load(_seed_long_chat(session.store, n_messages))
    app = LampoApp(session, Settings(), export_dir=home)
    step_times: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        transcript = app.transcript
        mounted_at_start = len(transcript.message_widgets)
        updates = 0
        display = app._display

        def counting_display(screen, renderable) -> None:
            nonlocal updates
            updates += 1
            display(screen, renderable)

        app._display = counting_display
        with StallMeter() as stalls:
            t0 = time.perf_counter()
            while transcript.scroll_y > 0 or transcript.earlier_count > 0:
                seen, t = updates, time.perf_counter()
                transcript.scroll_to(y=max(0, transcript.scroll_y - step_lines), animate=False, immediate=True)
                while updates == seen and time.perf_counter() - t < 2.0:
                    await asyncio.sleep(0)
                step_times.append(time.perf_counter() - t)
                if transcript.scroll_y <= 0 and transcript.earlier_count > 0:
                    await asyncio.sleep(0.01)  # the scroll-up loader mounts the previous page
                if len(step_times) > 20 * n_messages:
                    raise RuntimeError("scrolling never reached the top")
            total = time.perf_counter() - t0
        first, mounted_at_top = transcript.message_widgets[0], len(transcript.message_widgets)
    session.store.close()
    return {
        "messages": n_messages, "mounted_at_start": mounted_at_start,
        "mounted_at_top": mounted_at_top, "step_lines": step_lines,
        "seconds": round(total, 3), "steps": _quantiles_ms(step_times),
        "max_event_loop_stall_ms": round(stalls.max_gap_ms, 1),
        "reached_first_message": getattr(first, "text", "").startswith("Question 0:"),
    }


# ---- as CPU tests: small sizes, correctness and sanity only --------------------------------
async def test_stream_benchmark_displays_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    result = await stream_benchmark(3_000, None, tmp_path)
    print(json.dumps(result, indent=1))
    assert result["final_text_complete"]
    assert result["displayed_tok_per_s"] > 0 and result["frames"]["count"] > 0


async def test_scroll_benchmark_reaches_the_first_message(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMPO_HOME", str(tmp_path))
    result = await scroll_benchmark(120, tmp_path, step_lines=20)
    print(json.dumps(result, indent=1))
    assert result["reached_first_message"] and result["mounted_at_top"] < 100  # a window, not all 120
    assert result["mounted_at_start"] < 120 and result["steps"]["count"] > 0


# ---- as a script -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000, help="tokens per flood reply")
    parser.add_argument("--rate", type=float, action="append",
                        help="paced tokens/s (repeatable); 0 = as fast as possible (default: 0, 2000, 5000)")
    parser.add_argument("--messages", type=int, default=300, help="messages in the scrolled chat")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    rates = args.rate or [0.0, 2000.0, 5000.0]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        os.environ["LAMPO_HOME"] = str(home)
        results = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "stream": [], "scroll": None}
        for rate in rates:
            run_home = home / f"stream-{rate:g}"
            run_home.mkdir()
            result = asyncio.run(stream_benchmark(args.tokens, rate or None, run_home))
            results["stream"].append(result)
            print(json.dumps(result), flush=True)
        scroll_home = home / "scroll"
        scroll_home.mkdir()
        results["scroll"] = asyncio.run(scroll_benchmark(args.messages, scroll_home))
        print(json.dumps(results["scroll"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
