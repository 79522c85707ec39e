"""Property-based fuzzing (Hypothesis) of what ChatSession writes to the store while writes fail
at arbitrary moments: any sequence of sends, stopped replies, regenerates, edits, system-prompt
changes and reloads, with the database turning read-only and writable again in between, never
raises anything but the documented refusals, never loses a turn from memory, tells the user at
most once per outage, and - once the store takes writes again - the stored active branch is
exactly the session's turns (ids, parents, text, flags, stats), with the head on the last one."""

import tempfile
from pathlib import Path

from helpers import real_tokenizer
from helpers.scripted_backend import ScriptedBackend
from hypothesis import given
from hypothesis import strategies as st

from lampo.engine.protocol import TokenEvent
from lampo.chat_session import ChatSession
from lampo.store import Store

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(str.strip)
OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), TEXT),
    st.tuples(st.just("send_and_stop"), TEXT),
    st.tuples(st.just("edit"), TEXT),
    st.tuples(st.just("system"), st.text(max_size=20)),
    st.tuples(st.sampled_from(["regenerate", "reload", "break", "repair"]), st.none()),
), max_size=12)


def _fields(m):
    return m.id, m.parent_id, m.role, m.content, m.reasoning, m.stopped, m.stats, m.attachments, m.interrupted


def _apply(session: ChatSession, op: str, arg) -> None:
    conn = session.store._conn
    if op == "break":
        conn.execute("PRAGMA query_only = ON")  # every write fails as on a read-only file
    elif op == "repair":
        conn.execute("PRAGMA query_only = OFF")
    elif op == "send":
        list(session.send(arg))
    elif op == "send_and_stop":
        stream = session.send(arg)
        for event in stream:
            if isinstance(event, TokenEvent):
                break
        stream.close()
    elif op == "edit":
        list(session.edit_last_user(arg))
    elif op == "regenerate":
        list(session.regenerate())
    elif op == "system":
        session.set_system_prompt(arg)
    elif op == "reload" and session.chat_id is not None:
        session.load(session.chat_id)


@given(OPS)
def test_the_store_catches_up_with_the_session_after_any_failures(ops):
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "lampo.sqlite3", busy_timeout=0.1)
        session = ChatSession(ScriptedBackend(["A reply.", ["<think>", "hm", "</think>", "Yes."]], context_max=100_000),
                              real_tokenizer(), store)
        warnings = []
        for op, arg in ops:
            before = len(session.turns)
            try:
                _apply(session, op, arg)
            except ValueError as e:  # the documented refusals: nothing to regenerate / edit
                assert "nothing to regenerate" in str(e) or "no user message" in str(e)
                assert len(session.turns) == before
            warnings += session.take_warnings()
        store._conn.execute("PRAGMA query_only = OFF")
        session.set_thinking(session.thinking)  # any change writes the backlog
        warnings += session.take_warnings()
        outages = sum(op == "break" for op, _ in ops)
        assert sum(w.startswith("Not saved:") for w in warnings) <= outages
        if session.turns:
            stored = store.branch(session.chat_id, None)
            assert [_fields(m) for m in stored] == [_fields(t) for t in session.turns]
            assert [m.parent_id for m in stored] == [None] + [m.id for m in stored[:-1]]
            chat = store.get_chat(session.chat_id)
            assert chat.head_id == stored[-1].id and chat.system_prompt == session.system_prompt
            assert not any(m.interrupted for m in stored)
        store.close()
