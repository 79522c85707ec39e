"""ChatSession on the ScriptedBackend and the real tokenizer: turns, persistence, branches,
cancel, overflow, attachments, export."""

import threading
import time

import pytest
from helpers import real_tokenizer
from helpers.scripted_backend import ScriptedBackend

from lampo.attachments import user_content
from lampo.engine.protocol import ContextOverflow, Done, PrefillProgress, TokenEvent
from lampo.chat_session import ChatSession
from lampo.models.chat_format import build_prompt
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.store import Store

THOUGHT = ["<think>", "\n", "hmm", "</think>", "\n\n", "Hello", " there"]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def session(store, replies=(THOUGHT,), **kw):
    backend_kw = {k: kw.pop(k) for k in ("delay", "context_max") if k in kw}
    return ChatSession(ScriptedBackend(replies, **backend_kw), real_tokenizer(), store, **kw)


def test_send_streams_splits_reasoning_and_persists(store):
    s = session(store, system_prompt="Be brief.", sampling=GREEDY)
    events = list(s.send("Hi!"))
    assert isinstance(events[0], PrefillProgress) and isinstance(events[-1], Done)
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "".join(THOUGHT)
    user, reply = s.turns
    assert (user.role, user.content) == ("user", "Hi!")
    assert (reply.content, reply.reasoning, reply.stopped) == ("Hello there", "hmm", False)
    assert reply.stats["reason"] == "stop" and reply.stats["predicted_n"] == len(THOUGHT)
    assert s.title == "Hi!" and s.context_used == s.last_stats.context_used > 0
    # the request: the exact prompt, a snapshot at the end of the user turn, the chat's sampling
    request = s.backend.requests[0]
    prompt = build_prompt(real_tokenizer(), s.messages[:2])
    assert request.prompt_ids == prompt.ids and request.snapshot_at == (prompt.reuse_boundary,)
    assert request.sampling == GREEDY
    # stored as it happened
    chat = store.get_chat(s.chat_id)
    assert chat.title == "Hi!" and chat.system_prompt == "Be brief." and chat.sampling == GREEDY
    assert [m.content for m in store.branch(s.chat_id, None)] == ["Hi!", "Hello there"]


def test_second_turn_reuses_the_prefix_and_drops_old_reasoning(store):
    s = session(store)
    list(s.send("first"))
    list(s.send("second"))
    first, second = s.backend.requests
    boundary = first.snapshot_at[0]
    assert second.prompt_ids[:boundary] == first.prompt_ids[:boundary]
    assert "hmm" not in real_tokenizer().decode(second.prompt_ids)  # earlier reasoning dropped
    assert s.last_stats.cached_n >= boundary
    assert [t.role for t in s.turns] == ["user", "assistant"] * 2


def test_thinking_off_keeps_the_whole_reply_as_answer(store):
    s = session(store, replies=(["Plain", " answer"],), thinking=False)
    list(s.send("q"))
    assert (s.turns[-1].content, s.turns[-1].reasoning) == ("Plain answer", "")
    assert real_tokenizer().decode(s.backend.requests[0].prompt_ids).endswith("<think>\n\n</think>\n\n")


def test_cancel_keeps_the_partial_reply_marked_stopped(store):
    s = session(store, replies=(list("abcdefghijklmnopqrstuvwxyz"),), delay=0.01, thinking=False)
    seen = []
    for event in s.send("go"):
        if isinstance(event, TokenEvent):
            seen.append(event.text)
            if len(seen) == 3:
                s.cancel()
    assert s.last_done.reason == "cancelled"
    assert s.turns[-1].content == "abc" and s.turns[-1].stopped
    stored = store.branch(s.chat_id, None)[-1]
    assert stored.stopped and not stored.interrupted and stored.id == s.turns[-1].id


def test_cancel_before_any_token_stores_no_reply(store):
    s = session(store)
    events = s.send("go")
    s.cancel()
    assert isinstance(list(events)[-1], Done)
    assert [t.role for t in s.turns] == ["user"]
    assert [m.role for m in store.branch(s.chat_id, None)] == ["user"]  # no row, not even a partial one
    list(s.regenerate())  # a reply to the unanswered message
    assert [t.role for t in s.turns] == ["user", "assistant"]


def test_abandoned_stream_still_stores_what_was_generated(store):
    s = session(store, replies=(list("xyz"),), thinking=False)
    stream = s.send("go")
    for event in stream:
        if isinstance(event, TokenEvent):
            break
    stream.close()
    assert s.turns[-1].content == "x" and s.turns[-1].stopped


def test_regenerate_branches_and_resumes_from_the_snapshot(store):
    s = session(store, replies=(THOUGHT, ["other", " reply"]), thinking=True)
    list(s.send("question"))
    old_reply = s.turns[-1]
    list(s.regenerate())
    assert [t.role for t in s.turns] == ["user", "assistant"]
    new_reply = s.turns[-1]
    assert new_reply.parent_id == old_reply.parent_id and new_reply.id != old_reply.id
    assert s.backend.requests[1].prompt_ids == s.backend.requests[0].prompt_ids
    assert store.branch(s.chat_id, old_reply.id)[-1].content == "Hello there"  # old branch kept
    assert store.get_chat(s.chat_id).head_id == new_reply.id


def test_edit_last_user_makes_a_sibling_branch(store):
    s = session(store)
    list(s.send("one"))
    list(s.send("two"))
    old_user = s.turns[2]
    list(s.edit_last_user("two, edited"))
    assert [t.content for t in s.turns] == ["one", "Hello there", "two, edited", "Hello there"]
    assert s.turns[2].parent_id == old_user.parent_id and s.turns[2].id != old_user.id
    assert [m.content for m in store.branch(s.chat_id, None)][2] == "two, edited"


def test_overflow_is_refused_before_anything_changes(store):
    s = session(store, context_max=300)
    list(s.send("short"))
    turns = list(s.turns)
    long_text = "word " * 400
    with pytest.raises(ContextOverflow) as e:
        s.send(long_text)
    assert e.value.prompt_tokens == s.pending_tokens(long_text) > 300 and "300" in str(e.value)
    assert s.turns == turns and len(s.backend.requests) == 1
    assert len(store.branch(s.chat_id, None)) == 2


def test_pending_tokens_is_exact(store):
    s = session(store, system_prompt="sys")
    list(s.send("hello"))
    doc = s.add_attachment("notes.md", "```py\nprint(1)\n```\nsome notes")
    expected = len(build_prompt(real_tokenizer(), [*s.messages, _user_msg("and this?", [doc])]).ids)
    assert s.pending_tokens("and this?", [doc]) == expected
    assert s.pending_tokens("and that?", [doc]) == expected  # memoised history, new draft


def _user_msg(text, attachments):
    from lampo.models.chat_format import Message

    return Message("user", user_content(text, attachments))


def test_attachments_are_inlined_counted_and_deduplicated(store):
    s = session(store)
    text = "Report\n```\ncode\n```\n"
    a = s.add_attachment("report.txt", text)
    assert a.tokens == real_tokenizer().count(text)
    again = s.add_attachment("copy.txt", text)
    assert again.sha256 == a.sha256 and store.attachment_count() == 1
    list(s.send("summarise", [a]))
    prompt = real_tokenizer().decode(s.backend.requests[0].prompt_ids)
    assert "report.txt:\n````\nReport\n```\ncode\n```\n````\n\nsummarise" in prompt
    assert store.branch(s.chat_id, None)[0].attachments == (a,)
    assert store.branch(s.chat_id, None)[0].content == "summarise"  # text stored once, not inline


def test_load_resumes_a_chat_and_settings_persist(store):
    s = session(store)
    list(s.send("remember me"))
    s.set_sampling(SamplingParams(temperature=0.2, seed=1))
    s.set_thinking(False)
    s.rename("Memory")
    chat_id = s.chat_id
    s.new_chat()
    assert s.chat_id is None and s.turns == [] and s.title == "New chat" and s.thinking
    s.load(chat_id)
    assert s.title == "Memory" and not s.thinking and s.sampling.seed == 1
    assert [t.content for t in s.turns] == ["remember me", "Hello there"]
    assert s.context_used > 0
    list(s.send("and now?"))
    assert len(s.turns) == 4


def test_list_delete_and_export(store):
    s = session(store, system_prompt="Be kind.")
    doc = s.add_attachment("a.txt", "alpha")
    list(s.send("first question", [doc]))
    first = s.chat_id
    s.new_chat()
    list(s.send("second"))
    assert [c.title for c in s.list_chats()] == ["second", "first question"]
    md = s.export_markdown(first)
    assert md.startswith("# first question\n") and "Be kind." in md and "📎 a.txt (1 tokens)" in md
    assert "<details><summary>Thinking</summary>" in md and "Hello there" in md
    s.delete(first)
    assert [c.title for c in s.list_chats()] == ["second"]
    s.delete()
    assert s.chat_id is None and s.list_chats() == []


def test_bad_input_is_refused(store):
    s = session(store)
    with pytest.raises(ValueError, match="empty"):
        s.send("   ")
    with pytest.raises(ValueError, match="nothing to regenerate"):
        s.regenerate()
    with pytest.raises(ValueError, match="no user message"):
        s.edit_last_user("x")
    with pytest.raises(ValueError, match="temperature"):
        s.set_sampling(SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="empty"):
        s.rename("  ")


def test_generation_in_a_worker_thread_can_be_cancelled_from_another(store):
    s = session(store, replies=(list("x" * 1000),), delay=0.005, thinking=False)
    events = s.send("go")
    worker = threading.Thread(target=lambda: list(events))
    worker.start()
    while not s.reply_raw:
        time.sleep(0.001)
    s.cancel()
    worker.join(5)
    assert not worker.is_alive() and s.last_done.reason == "cancelled"
    assert 0 < len(s.turns[-1].content) < 1000


def test_scripted_backend_behaves_like_a_backend():
    from lampo.engine.protocol import Backend, GenerationRequest, Stats

    b = ScriptedBackend([list("abcdef")], context_max=100, prefill_chunk=10)
    assert isinstance(b, Backend)
    with pytest.raises(ContextOverflow):
        b.generate(GenerationRequest(tuple(range(101))), threading.Event())
    events = list(b.generate(GenerationRequest(tuple(range(25)), SamplingParams(max_tokens=4)), threading.Event()))
    assert [e.done for e in events if isinstance(e, PrefillProgress)] == [10, 20, 25]
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == "abcd"
    assert events[-1].reason == "length" and isinstance(events[-2], Stats)
    again = list(b.generate(GenerationRequest(tuple(range(25)) + b.generated_ids + (7,)), threading.Event()))
    assert again[-1].stats.cached_n == 29 and again[-1].stats.prompt_n == 1
    cancel = threading.Event()
    cancel.set()
    assert list(b.generate(GenerationRequest((1, 2)), cancel))[-1].reason == "cancelled"
    full = list(b.generate(GenerationRequest(tuple(range(98))), threading.Event()))
    assert full[-1].reason == "context" and full[-1].stats.predicted_n == 2


# ---- the reply is written as it streams -----------------------------------------------------------
def test_the_reply_is_in_the_store_while_it_streams(store, monkeypatch):
    import lampo.chat_session as chat_session

    monkeypatch.setattr(chat_session, "SAVE_INTERVAL_S", 0.0)  # rewrite at every token
    s = session(store, replies=(list("abcdef"),), thinking=False)
    seen = []
    for event in s.send("go"):
        if isinstance(event, TokenEvent):
            seen.append(event.text)
            user, reply = store.branch(s.chat_id, None)  # the chat's head is the growing reply
            assert (reply.content, reply.interrupted, reply.stats["reason"]) == ("".join(seen), True, "interrupted")
            assert reply.parent_id == user.id and [t.role for t in s.turns] == ["user"]
    final = store.branch(s.chat_id, None)[-1]
    assert (final.id, final.content, final.interrupted, final.stats["reason"]) == \
        (s.turns[-1].id, "abcdef", False, "stop")
    assert store.attachment_count() == 0 and len(store.list_chats()) == 1


def test_streaming_writes_are_bounded_by_the_save_interval(store, monkeypatch):
    from lampo.chat_session import SAVE_INTERVAL_S

    writes = []

    def counted(name):
        original = getattr(store, name)

        def write(*args, **kwargs):
            writes.append(name)
            return original(*args, **kwargs)
        return write

    for name in ("add_message", "update_message"):
        monkeypatch.setattr(store, name, counted(name))
    s = session(store, replies=(["tok "] * 3000,), thinking=False)
    t0 = time.monotonic()
    list(s.send("go"))
    elapsed = time.monotonic() - t0
    # the user message, the reply's insert at its first text, one rewrite per interval, the final write
    assert writes.count("add_message") == 2
    assert 1 <= writes.count("update_message") <= 1 + elapsed / SAVE_INTERVAL_S + 1
    assert store.branch(s.chat_id, None)[-1].content == ("tok " * 3000).strip()


def test_a_reply_cut_short_reopens_interrupted_and_can_be_regenerated(store):
    s = session(store, replies=(list("partial reply that never ends"),), thinking=False)
    stream = s.send("question")
    for event in stream:
        if isinstance(event, TokenEvent):
            break  # "the process dies here": nothing after the first write happens
    restarted = Store(store.path)  # what a new Lampo on the same file sees
    again = ChatSession(ScriptedBackend(["new reply"]), real_tokenizer(), restarted, thinking=False)
    again.load(s.chat_id)
    cut = again.turns[-1]
    assert (cut.role, cut.content, cut.interrupted, cut.stopped) == ("assistant", "p", True, False)
    assert "*(interrupted: Lampo quit before this reply was finished)*" in again.export_markdown()
    list(again.regenerate())
    assert [t.content for t in again.turns] == ["question", "new reply"] and not again.turns[-1].interrupted
    assert restarted.branch(s.chat_id, cut.id)[-1].interrupted  # kept as a branch
    list(again.edit_last_user("question, edited"))
    assert [m.content for m in restarted.branch(s.chat_id, None)] == ["question, edited", "new reply"]
    stream.close()
    restarted.close()
