"""Soak: a day of use - 1,000 turns through the TUI - neither grows the process nor loses a turn.

The real app (Pilot) on the real numpy `ReferenceBackend` with the tiny synthetic dense
checkpoint, the real tokenizer and the real SQLite store under the test's LAMPO_HOME. A *turn* is
one reply generated through the UI, started the way a user starts it: a message pasted or typed
key by key and sent with Enter, ctrl+r (regenerate), or ctrl+e (edit the last message, resend).
Replies are capped at a few tokens so a turn is quick; what is soaked is everything around them.

The day is ten blocks of 100 turns, each five stretches, because that is how a day of chatting
goes: one long conversation (45 turns: its transcript passes the 80 messages after which the
oldest are unmounted, so the window machinery runs), a short one with thinking switched off (its
replies stream into the answer view instead of the thinking block), an older chat resumed from
the chat list (ctrl+o, a row further down each time: the engine re-prefills its whole history),
another new chat, another resumed one. Along the way every tenth turn regenerates, every 25th is
stopped with Esc mid-reply, every 50th edits the last message, and every 20th message is typed
key by key rather than pasted.

Memory is read at the same point of the day - an empty new chat - at the start of each block after
the first four and after the last, once the garbage is collected, two ways:
- the objects the garbage collector tracks (every widget, style, message and list). A widget left
  behind is 55 or more of them (an unmounted `Static`; a mounted message holds more), so one per
  turn adds over 33,000 in 600 turns; what the last 600 turns may legitimately add is the test's
  own ledger of the turns and Textual's bounded caches still filling (1,024-entry caches of queries
  and arrangements, and an `lru_cache` of 1,024 `StylesCache`s that keeps the rendered lines of the
  last 1,024 removed widgets alive, textual#6665; the rendered strips and regions they keep are most
  of it): measured, about 10 per turn. The limit is `OBJECTS_PER_TURN_LIMIT` per turn.
- the resident set, once the C allocator has also handed back the pages it keeps after `free`
  (glibc's `malloc_trim`; the reference engine's arrays for a long chat are freed when the chat is
  left, but glibc keeps their pages, so the raw figure follows the longest chat so far): it catches
  what lives outside Python's objects (a native buffer or a connection per turn). It moves with the
  allocators' fragmentation, which depends on everything the process ran before (the soak runs in
  the same process as the rest of the suite): from the first reading to the last, measured +1.4
  to +2.5 MiB on its own and +6.1 to +12.6 MiB at the end of a whole CI run. So the growth is
  the trend of all seven readings (the median of the slopes between every two of them, times the
  600 turns): a leak raises every interval, a jump of the allocators' moves one or two of them.
  Its limit is `GROWTH_LIMIT_MIB`.
A leak tied to a rarer action can be below what 600 turns resolve (the footer's keys once left
behind at each visit to the chat list): test_removed_widgets_are_freed.py checks those one by one.

Afterwards the store, reopened as a restarted Lampo would, must hold every turn: each chat's
active branch exactly as the UI left it (user messages as typed, replies as shown, stopped ones
marked), and every reply that a regenerate or an edit moved off that branch still reachable.

It takes 8 to 11 minutes on a busy 2-core machine - Textual's layout and rendering, about half a
second a turn, dominate - hence `slow`; it is part of the default run all the same.
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import time
from dataclasses import dataclass

import pytest
from helpers import real_tokenizer
from textual.events import Paste
from tui_helpers import WrappedBackend, wait_idle, wait_until

from lampo.engine.protocol import TokenEvent
from lampo.models.sampling_params import SamplingParams
from lampo.engine.reference import ReferenceBackend
from lampo.settings import Settings, write_settings
from lampo.store import Store
from lampo.tui.message_view import AssistantMessage
from lampo.tui.session_list import SessionListScreen

SIZE = (100, 32)
TURNS = 1000
BLOCK = (("new", 45), ("new, thinking off", 15), ("resume", 10), ("new", 15), ("resume", 15))
WARM_UP = 4 * sum(length for _, length in BLOCK)  # turns before memory is first measured
MAX_TOKENS = 4
STOP_AFTER_TOKENS = 2  # a stopped reply is held here until Esc
REPLY_TIMEOUT_S = 60.0  # a resumed chat's re-prefill on a busy 2-core box included
GROWTH_LIMIT_MIB = 12.0
OBJECTS_PER_TURN_LIMIT = 25
PHRASES = ("What is a good name for a lamp?",
           "Explain it again,\nbut shorter.",
           "```python\nprint('hello')\n```\nWhat does this print?",
           "Thanks! One more: which is lighter, a lampo or a lightning bolt?")


class PausingBackend(WrappedBackend):
    """Wraps a backend so that, after `pause_next_reply(n)`, the next reply holds after its n-th
    token until it is cancelled: an Esc mid-reply, whatever the machine's speed."""

    def __init__(self, inner):
        super().__init__(inner)
        self._pause_after: int | None = None

    def pause_next_reply(self, tokens: int) -> None:
        self._pause_after = tokens

    def generate(self, request, cancel):
        events = self.inner.generate(request, cancel)
        pause_after, self._pause_after = self._pause_after, None
        if pause_after is None:
            return events

        def paused():
            tokens = 0
            try:
                for event in events:
                    yield event
                    tokens += isinstance(event, TokenEvent)
                    if tokens == pause_after:
                        cancel.wait(REPLY_TIMEOUT_S)
            finally:
                events.close()

        return paused()


@dataclass(frozen=True)
class Exchange:
    """One turn as the UI showed it: the user message and the reply it got."""

    chat_id: int
    user_id: int
    user_text: str
    reply_id: int
    reasoning: str
    answer: str
    stopped: bool

    def stored_form(self) -> list[tuple]:
        return [(self.user_id, "user", self.user_text, "", False),
                (self.reply_id, "assistant", self.answer, self.reasoning, self.stopped)]


def memory() -> tuple[int, float]:
    """(objects the garbage collector tracks, resident MiB), once the garbage is collected and
    glibc has handed back the pages it keeps after `free`."""
    gc.collect()
    objects = len(gc.get_objects())
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/statm") as f:
        return objects, int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def trend_growth(readings: list[tuple[int, float]], turns: int) -> float:
    """The growth over `turns` turns of readings (turn, MiB): the median of the slopes between every
    two readings (Theil-Sen), which a step in one or two readings leaves where the rest are."""
    slopes = [(b - a) / (tb - ta) for i, (ta, a) in enumerate(readings) for tb, b in readings[i + 1:]]
    return statistics.median(slopes) * turns


def test_trend_growth_follows_a_steady_rise_and_not_one_jump():
    steady = [(turn, 100 + 0.02 * turn) for turn in range(400, 1001, 100)]
    assert trend_growth(steady, 600) == pytest.approx(12.0)
    jump = [(turn, 100 + (13.0 if turn >= 900 else 0.0)) for turn in range(400, 1001, 100)]
    assert trend_growth(jump, 600) == pytest.approx(0.0)
    assert jump[-1][1] - jump[0][1] == 13.0  # what the two ends alone would have said


def message_text(turn: int) -> str:
    if turn % 20 == 3:
        return f"typed {turn}"  # typed key by key: letters, digits, a space
    return f"Turn {turn}. {PHRASES[turn % len(PHRASES)]}"


def stored(record) -> tuple:
    return (record.id, record.role, record.content, record.reasoning, record.stopped)


class Day:
    """Drives the app through the turns and keeps the ledger of what it showed."""

    def __init__(self, app, pilot, backend: PausingBackend):
        self.app, self.pilot, self.backend = app, pilot, backend
        self.branches: dict[int, list[Exchange]] = {}  # chat id -> its active branch
        self.exchanges: list[Exchange] = []

    async def settle(self) -> None:
        await wait_until(self.pilot, lambda: not self.app.generating, timeout=REPLY_TIMEOUT_S,
                         what="the reply to finish")
        await wait_idle(self.pilot, self.app)

    async def new_chat(self, thinking: bool) -> None:
        await self.pilot.press("ctrl+n")
        if not thinking:
            await self.pilot.press("ctrl+t")
        await self.settle()
        assert self.app.session.chat_id is None and not self.app.transcript.records

    async def resume(self, row: int) -> None:
        app = self.app
        await self.pilot.press("ctrl+o")
        await wait_until(self.pilot, lambda: isinstance(app.screen, SessionListScreen), what="the chat list")
        chats = app.screen.chats
        chosen = chats[min(row, len(chats) - 1)]
        await self.pilot.press(*["down"] * min(row, len(chats) - 1), "enter")
        await wait_until(self.pilot, lambda: app.session.chat_id == chosen.id, what=f"chat {chosen.id} to load")
        await self.settle()
        expected = [r for exchange in self.branches[chosen.id] for r in exchange.stored_form()]
        assert [stored(r) for r in app.transcript.records] == expected

    async def turn(self, turn: int) -> None:
        app, pilot = self.app, self.pilot
        chat_turns = len(self.branches.get(app.session.chat_id, ()))
        if chat_turns and turn % 10 == 7:
            await pilot.press("ctrl+r")
            await self.record(self.branches[app.session.chat_id][-1].user_text, replaces_last=True)
            return
        if chat_turns and turn % 50 == 23:
            await pilot.press("ctrl+e")
            text = self.branches[app.session.chat_id][-1].user_text + " (edited)"
            app.prompt.insert(" (edited)")
            assert app.prompt.text == text
            await pilot.press("enter")
            await self.record(text, replaces_last=True)
            return
        text = message_text(turn)
        if turn % 20 == 3:
            await pilot.press(*text)
        else:
            app.post_message(Paste(text))  # as the terminal delivers it
        await wait_until(pilot, lambda: app.prompt.text == text, what="the message in the prompt")
        stop = turn % 25 == 11
        if stop:
            self.backend.pause_next_reply(STOP_AFTER_TOKENS)
        await pilot.press("enter")
        if stop:
            await wait_until(pilot, lambda: app.displayed_tokens >= STOP_AFTER_TOKENS, timeout=REPLY_TIMEOUT_S,
                             what="the reply's first tokens")
            await pilot.press("escape")
        await self.record(text, replaces_last=False, stopped=stop)

    async def record(self, user_text: str, *, replaces_last: bool, stopped: bool = False) -> None:
        """The turn just started, once finished: check the UI and add it to the ledger."""
        await self.settle()
        session = self.app.session
        user, reply = session.turns[-2:]
        shown = self.app.transcript.message_widgets[-1]
        assert isinstance(shown, AssistantMessage) and not shown.streaming
        assert (user.role, user.content, reply.role, reply.stopped) == ("user", user_text, "assistant", stopped)
        assert (shown.reasoning, shown.answer) == (reply.reasoning, reply.content) and reply.reasoning + reply.content
        assert self.app.transcript.records == session.turns
        exchange = Exchange(session.chat_id, user.id, user_text, reply.id, reply.reasoning, reply.content, stopped)
        branch = self.branches.setdefault(session.chat_id, [])
        if replaces_last:
            branch.pop()
        branch.append(exchange)
        self.exchanges.append(exchange)


def check_store(store: Store, day: Day) -> None:
    """Every turn is in the store: each chat's active branch as the UI left it, and every reply
    moved off it (regenerated, edited) still on its own branch."""
    assert sorted(c.id for c in store.list_chats()) == sorted(day.branches)
    active = set()
    for chat_id, branch in day.branches.items():
        expected = [r for exchange in branch for r in exchange.stored_form()]
        assert [stored(r) for r in store.branch(chat_id, None)] == expected, f"chat {chat_id}"
        active.update(branch)
    for exchange in day.exchanges:
        if exchange not in active:
            assert [stored(r) for r in store.branch(exchange.chat_id, exchange.reply_id)[-2:]] == \
                exchange.stored_form(), f"reply {exchange.reply_id} of chat {exchange.chat_id}"


@pytest.mark.slow
async def test_a_day_of_chatting_keeps_every_turn_and_grows_no_memory(make_app, tiny_dense_dir):
    # The user's config.toml keeps replies short (every new chat starts from it) and greedy.
    write_settings(Settings(sampling=SamplingParams(temperature=0.0, top_k=0, top_p=1.0, max_tokens=MAX_TOKENS)))
    backend = PausingBackend(ReferenceBackend(tiny_dense_dir, context_max=32_768, tokenizer=real_tokenizer()))
    app = make_app(backend)
    started = time.monotonic()
    async with app.run_test(size=SIZE) as pilot:
        day = Day(app, pilot, backend)
        turn, block, readings = 0, 0, []  # readings: (turn, memory()) from the warm-up on
        while turn < TURNS:
            for stretch, (kind, length) in enumerate(BLOCK):
                if kind == "resume":
                    await day.resume(row=1 + (block + stretch) % 4)
                else:
                    await day.new_chat(thinking=kind != "new, thinking off")
                    if stretch == 0 and turn >= WARM_UP:
                        readings.append((turn, memory()))
                for _ in range(length):
                    await day.turn(turn)
                    turn += 1
            block += 1
        await day.new_chat(thinking=True)
        readings.append((turn, memory()))
    seconds = time.monotonic() - started
    (_, start), (_, end) = readings[0], readings[-1]
    per_turn = (end[0] - start[0]) / (TURNS - WARM_UP)
    growth = trend_growth([(t, m[1]) for t, m in readings], TURNS - WARM_UP)
    figures = (f"soak: {TURNS} turns in {seconds:.0f} s; after the {WARM_UP}-turn warm-up and at the end: "
               f"{start[0]:,} and {end[0]:,} objects, {per_turn:+.1f} per turn (limit {OBJECTS_PER_TURN_LIMIT}); "
               f"resident set at the blocks' starts {', '.join(f'{m[1]:.1f}' for _, m in readings)} MiB, "
               f"trend {growth:+.2f} MiB over {TURNS - WARM_UP} turns (limit {GROWTH_LIMIT_MIB} MiB)")
    print(figures)
    assert len(day.exchanges) == TURNS
    store = Store(app.session.store.path)  # as a restarted Lampo opens it
    try:
        check_store(store, day)
    finally:
        store.close()
    assert per_turn <= OBJECTS_PER_TURN_LIMIT and growth <= GROWTH_LIMIT_MIB, figures
