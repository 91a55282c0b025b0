"""The chat history in real SQLite files: whole turns, schema versions, migration, errors."""

from __future__ import annotations

import sqlite3

import pytest

from localspec.errors import LocalspecError
from localspec.tui.session import ChatSession
from localspec.tui.store import SCHEMA_VERSION, ChatStore, HistoryError, Turn

# the tables as every file written before schema versions had them (user_version 0)
UNVERSIONED = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
    target TEXT NOT NULL DEFAULT '', draft TEXT NOT NULL DEFAULT '',
    system TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL
    REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL,
    stats TEXT, created REAL NOT NULL);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
"""


def test_turns_are_stored_whole_and_survive_reopen(tmp_path) -> None:
    path = str(tmp_path / "h.sqlite")
    s = ChatStore(path)
    assert s.schema_version == SCHEMA_VERSION == 1
    cid = s.add_turns(None, [Turn("q1", "a1", {"tau": 2.0}), Turn("q2", "a2")], title="t")
    s.close()
    s = ChatStore(path)
    (conv,) = s.conversations()
    assert (conv.id, conv.title, conv.n_messages) == (cid, "t", 4)
    msgs = s.messages(cid)
    assert [(m.role, m.content) for m in msgs] == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2"),
    ]
    assert msgs[1].stats == {"tau": 2.0}


def test_unversioned_file_is_migrated(tmp_path) -> None:
    """A file from before schema versions: orphaned prompts (a failed or interrupted reply
    left them without an answer) are removed, whole turns are kept, the version is set."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(UNVERSIONED)
    db.execute("INSERT INTO conversations VALUES (1, 'c', '', '', '', 0, 0)")
    db.execute("INSERT INTO conversations VALUES (2, 'd', '', '', '', 0, 0)")
    rows = [
        (1, "user", "q1"),
        (1, "assistant", "a1"),
        (1, "user", "failed"),  # orphan: another user turn follows
        (1, "user", "q2"),
        (1, "assistant", "a2"),
        (2, "user", "d1"),
        (2, "assistant", "e1"),
        (1, "user", "interrupted"),  # orphan: last of its conversation
    ]
    db.executemany(
        "INSERT INTO messages(conversation_id, role, content, created) VALUES (?, ?, ?, 0)", rows
    )
    db.commit()
    db.close()
    s = ChatStore(str(path))
    assert s.schema_version == 1
    assert [m.content for m in s.messages(1)] == ["q1", "a1", "q2", "a2"]
    assert [m.content for m in s.messages(2)] == ["d1", "e1"]
    s.add_turns(1, [Turn("q3", "a3")])  # the migrated file is written as usual
    assert [m.content for m in s.messages(1)][-2:] == ["q3", "a3"]


def test_newer_schema_is_refused_untouched(tmp_path) -> None:
    path = tmp_path / "new.sqlite"
    db = sqlite3.connect(path)
    db.executescript(UNVERSIONED)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match="schema version 99.*newer localspec"):
        ChatStore(str(path))
    assert path.read_bytes() == before


def test_garbage_file_is_refused_untouched(tmp_path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(LocalspecError, match="chat history"):
        ChatStore(str(bad))
    assert bad.read_bytes().startswith(b"not a database")  # nothing overwritten


def test_locked_database_fails_the_write_whole(tmp_path) -> None:
    path = str(tmp_path / "h.sqlite")
    s = ChatStore(path, timeout=0.05)
    cid = s.add_turns(None, [Turn("q1", "a1")], title="t")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(HistoryError, match="cannot save the conversation.*locked"):
        s.add_turns(cid, [Turn("q2", "a2"), Turn("q3", "a3")])
    with pytest.raises(HistoryError, match="locked"):
        s.add_turns(None, [Turn("new", "conversation")], title="n")
    other.execute("ROLLBACK")
    assert [m.content for m in s.messages(cid)] == ["q1", "a1"]  # nothing half-written
    assert len(s.conversations()) == 1


def test_session_retries_unsaved_turns(tmp_path) -> None:
    """Memory keeps every turn; the store gets them all once it accepts writes again."""
    path = str(tmp_path / "h.sqlite")
    session = ChatSession(ChatStore(path, timeout=0.05), system="be brief")
    assert session.add_turn(Turn("q1", "a1")) is None
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    assert isinstance(session.add_turn(Turn("q2", "a2")), HistoryError)
    assert len(session.history) == 4 and len(session.unsaved) == 1
    other.execute("ROLLBACK")
    assert session.add_turn(Turn("q3", "a3")) is None and session.unsaved == []
    stored = session.store.messages(session.conversation_id)
    assert [{"role": m.role, "content": m.content} for m in stored] == session.history
    assert session.messages_for("q4")[0] == {"role": "system", "content": "be brief"}
    assert session.messages_for("q4")[-1] == {"role": "user", "content": "q4"}
    reopened = ChatSession(ChatStore(path))
    title, _ = reopened.open(session.conversation_id)
    assert title == "q1" and reopened.history == session.history
    assert reopened.system == "be brief"
