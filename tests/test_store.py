"""Store: schema/migrations, chats and the message tree, attachment dedup, damaged files."""

import sqlite3

import pytest

from lampo.attachments import Attachment, text_sha256
from lampo.models.sampling_params import GREEDY, SamplingParams
from lampo.store import SCHEMA_VERSION, SchemaTooNew, Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "lampo.sqlite3")
    yield s
    s.close()


def doc(text="some document", name="doc.txt"):
    return Attachment(name, text, text_sha256(text), 3)


def test_fresh_database_is_migrated_and_in_wal_mode(store):
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 1
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.notice is None
    conn.close()
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: commits survive power loss


def test_chat_crud_and_ordering(store):
    a = store.create_chat("first", "be brief", GREEDY, thinking=False)
    b = store.create_chat("second", "", SamplingParams(seed=3), thinking=True)
    chat = store.get_chat(a)
    assert (chat.title, chat.system_prompt, chat.sampling, chat.thinking, chat.head_id) == \
        ("first", "be brief", GREEDY, False, None)
    assert [c.id for c in store.list_chats()] == [b, a]
    store.update_chat(a, title="renamed", sampling=SamplingParams(top_k=7), thinking=True)
    assert [c.id for c in store.list_chats()] == [a, b]
    chat = store.get_chat(a)
    assert chat.title == "renamed" and chat.sampling.top_k == 7 and chat.thinking
    with pytest.raises(ValueError, match="colour"):
        store.update_chat(a, colour="red")
    store.delete_chat(b)
    with pytest.raises(KeyError):
        store.get_chat(b)
    with pytest.raises(KeyError):
        store.delete_chat(b)


def test_message_tree_branches_and_head(store):
    c = store.create_chat("t", "", GREEDY, True)
    u1 = store.add_message(c, None, "user", "hi", attachments=[doc()])
    a1 = store.add_message(c, u1, "assistant", "hello", reasoning="think", stats={"reason": "stop"})
    u2 = store.add_message(c, a1, "user", "more")
    a2 = store.add_message(c, u2, "assistant", "par", stopped=True)
    a2b = store.add_message(c, u2, "assistant", "regenerated")  # a sibling branch
    assert store.get_chat(c).head_id == a2b
    path = store.branch(c, None)
    assert [m.id for m in path] == [u1, a1, u2, a2b]
    assert path[0].attachments == (doc(),) and path[1].reasoning == "think"
    assert path[1].stats == {"reason": "stop"}
    old = store.branch(c, a2)
    assert old[-1].stopped and old[-1].content == "par"
    store.update_chat(c, head_id=a2)
    assert store.branch(c, None)[-1].id == a2


def test_attachments_are_stored_once_and_collected_with_their_chats(store):
    c1 = store.create_chat("a", "", GREEDY, True)
    c2 = store.create_chat("b", "", GREEDY, True)
    store.add_message(c1, None, "user", "q1", attachments=[doc()])
    store.add_message(c2, None, "user", "q2", attachments=[doc(name="same.txt"), doc("other")])
    assert store.attachment_count() == 2
    assert [a.name for a in store.branch(c2, None)[0].attachments] == ["same.txt", "doc.txt"]
    store.delete_chat(c2)
    assert store.attachment_count() == 1  # still used by chat 1
    store.delete_chat(c1)
    assert store.attachment_count() == 0


def test_writes_are_visible_to_another_connection_at_once(store):
    c = store.create_chat("live", "", GREEDY, True)
    store.add_message(c, None, "user", "hello")
    other = Store(store.path)
    assert other.branch(c, None)[0].content == "hello"
    other.close()


def write_precious_chat(path) -> None:
    """A database at `path` with one chat of 100 messages (several pages), closed."""
    s = Store(path)
    c = s.create_chat("precious", "", GREEDY, True)
    for i in range(100):
        s.add_message(c, None, "user", f"message {i} " * 20)
    s.close()


@pytest.mark.parametrize("damage", [
    b"this is not a database at all" * 100,
    None,  # a real database with a page overwritten
], ids=["not-sqlite", "overwritten-pages"])
def test_damaged_file_is_moved_aside_never_wiped(tmp_path, damage):
    path = tmp_path / "lampo.sqlite3"
    write_precious_chat(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    if damage is None:
        data = bytearray(path.read_bytes())
        data[4096 * 2: 4096 * 4] = b"\xff" * 8192
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(damage)
    original = path.read_bytes()
    fresh = Store(path)
    assert fresh.notice and "moved to" in fresh.notice
    moved = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert len(moved) == 1 and moved[0].read_bytes() == original
    assert moved[0].name in fresh.notice
    assert fresh.list_chats() == []
    fresh.create_chat("new", "", GREEDY, True)
    fresh.close()


def test_newer_schema_is_refused_not_moved(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew, match="upgrade Lampo"):
        Store(path)
    assert path.exists()


def test_a_truncated_file_is_moved_aside(tmp_path):
    path = tmp_path / "lampo.sqlite3"
    write_precious_chat(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    fresh = Store(path)
    assert fresh.notice and "moved to" in fresh.notice and fresh.persistent
    [moved] = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert moved.read_bytes() == data[: len(data) // 2]
    fresh.close()


def test_a_version_1_database_is_migrated_in_place(tmp_path):
    from lampo.store.migrations import MIGRATIONS

    path = tmp_path / "lampo.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0] + "PRAGMA user_version = 1;")
    conn.execute("INSERT INTO chats (id, title, created, updated, sampling) VALUES (1, 'old', 0, 0, '{}')")
    conn.execute("INSERT INTO messages (id, chat_id, role, content, created) VALUES (1, 1, 'user', 'kept', 0)")
    conn.execute("UPDATE chats SET head_id = 1")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.notice is None
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    [message] = store.branch(1, None)
    assert message.content == "kept" and not message.interrupted  # written whole by the old Lampo
    store.close()


def test_a_streaming_reply_reads_back_interrupted_until_its_final_write(store):
    c = store.create_chat("t", "", GREEDY, True)
    u = store.add_message(c, None, "user", "hi")
    a = store.add_message(c, u, "assistant", "Hel", stats={"reason": "interrupted"}, complete=False)
    assert store.get_chat(c).head_id == a
    assert store.branch(c, None)[-1].interrupted
    store.update_message(a, "Hello", reasoning="r", stats={"reason": "interrupted"}, complete=False)
    assert (store.branch(c, None)[-1].content, store.branch(c, None)[-1].interrupted) == ("Hello", True)
    store.update_message(a, "Hello there", reasoning="r", stopped=True, stats={"reason": "cancelled"})
    last = store.branch(c, None)[-1]
    assert (last.content, last.reasoning, last.stopped, last.interrupted, last.stats) == \
        ("Hello there", "r", True, False, {"reason": "cancelled"})
    with pytest.raises(KeyError):
        store.update_message(999, "x")


def test_a_failed_write_is_a_store_error_naming_the_file(store):
    from lampo.store import StoreError

    c = store.create_chat("t", "", GREEDY, True)
    store._conn.execute("PRAGMA query_only = ON")
    with pytest.raises(StoreError, match=f"could not save to the chat database {store.path}: it is read-only"):
        store.add_message(c, None, "user", "hi")
    assert isinstance(StoreError("x"), OSError)
    store._conn.execute("PRAGMA query_only = OFF")
    assert store.branch(c, None) == []  # the failed transaction left nothing behind
