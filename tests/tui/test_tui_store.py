"""The chat history in real SQLite files: whole turns, a tree of versions, search, schema
versions, migration, errors."""

from __future__ import annotations

import sqlite3

import pytest

from localspec.errors import LocalspecError
from localspec.tui import store as store_module
from localspec.tui.session import ChatSession
from localspec.tui.store import SCHEMA_VERSION, ChatStore, HistoryError, Turn

from helpers.tuistore import locked

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

# schema 1, exactly as localspec wrote it (one branch per conversation, no search index)
SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    target TEXT NOT NULL DEFAULT '',
    draft TEXT NOT NULL DEFAULT '',
    system TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
PRAGMA user_version = 1;
"""


def index_is_sound(s: ChatStore) -> None:
    """FTS5's own check of the index against the messages table (raises if they differ)."""
    with s.db:  # a write for Python's sqlite3: commit it, releasing the lock
        s.db.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")


def contents(messages) -> list[str]:
    return [m.content for m in messages]


def test_turns_are_stored_whole_and_survive_reopen(tmp_path) -> None:
    path = str(tmp_path / "h.sqlite")
    s = ChatStore(path)
    assert s.schema_version == SCHEMA_VERSION == 2
    turns = [Turn("q1", "a1", {"tau": 2.0}), Turn("q2", "a2")]
    cid = s.add_turns(None, turns, title="t")
    assert [(t.prompt_id, t.reply_id) for t in turns] == [(1, 2), (3, 4)]  # filled on commit
    s.close()
    s = ChatStore(path)
    (conv,) = s.conversations()
    assert (conv.id, conv.title, conv.n_messages, conv.head_id) == (cid, "t", 4, 4)
    msgs = s.messages(cid)
    assert [(m.role, m.content) for m in msgs] == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2"),
    ]
    assert [m.parent_id for m in msgs] == [None, 1, 2, 3]
    assert msgs[1].stats == {"tau": 2.0}
    assert s.turns(cid) == turns


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
    assert s.schema_version == SCHEMA_VERSION
    assert contents(s.messages(1)) == ["q1", "a1", "q2", "a2"]
    assert [m.parent_id for m in s.messages(1)] == [None, 1, 2, 4]  # 3 was an orphan
    assert contents(s.messages(2)) == ["d1", "e1"]
    assert [h.message_id for h in s.search("q2")] == [4]
    assert s.search("failed") == []  # removed, index included
    s.add_turns(1, [Turn("q3", "a3")])  # the migrated file is written as usual
    assert contents(s.messages(1))[-2:] == ["q3", "a3"]
    index_is_sound(s)


def test_schema_1_file_is_migrated(tmp_path) -> None:
    """Each conversation becomes one branch in the order written (ids interleaved between
    conversations), its last message the head, and every message is searchable."""
    path = tmp_path / "v1.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.execute("INSERT INTO conversations VALUES (1, 'first', 't.gguf', '', 'sys', 0, 10)")
    db.execute("INSERT INTO conversations VALUES (2, 'second', '', '', '', 0, 20)")
    rows = [
        (1, "user", "how do zebras sleep"),
        (1, "assistant", "standing up, mostly"),
        (2, "user", "name a prime"),
        (1, "user", "and giraffes?"),
        (2, "assistant", "seven"),
        (1, "assistant", "also standing, briefly"),
    ]
    db.executemany(
        "INSERT INTO messages(conversation_id, role, content, stats, created) "
        "VALUES (?, ?, ?, '{\"tau\": 3.0}', 0)",
        rows,
    )
    db.commit()
    db.close()
    s = ChatStore(str(path))
    assert s.schema_version == SCHEMA_VERSION
    one = s.messages(1)
    assert contents(one) == [
        "how do zebras sleep",
        "standing up, mostly",
        "and giraffes?",
        "also standing, briefly",
    ]
    assert [m.parent_id for m in one] == [None, 1, 2, 4]
    assert [m.parent_id for m in s.messages(2)] == [None, 3]
    assert one[1].stats == {"tau": 3.0}
    assert [(c.id, c.n_messages, c.head_id, c.system) for c in s.conversations()] == [
        (2, 2, 5, ""),
        (1, 4, 6, "sys"),
    ]
    assert [(h.conversation_id, h.message_id) for h in s.search("standing")] == [(1, 2), (1, 6)]
    assert [h.message_id for h in s.search("prime")] == [3]
    index_is_sound(s)
    turn = Turn("and owls?", "in trees")
    s.add_turns(1, [turn])
    assert turn.prompt_id is not None and s.messages(1)[-2].parent_id == 6
    s.close()
    assert ChatStore(str(path)).turns(1)[-1] == turn  # a second open changes nothing


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
    first = Turn("q1", "a1")
    cid = s.add_turns(None, [first], title="t")
    turn = Turn("q2", "a2")
    with locked(path):
        with pytest.raises(HistoryError, match="cannot save the conversation.*locked"):
            s.add_turns(cid, [turn, Turn("q3", "a3")])
        with pytest.raises(HistoryError, match="locked"):
            s.add_turns(None, [Turn("new", "conversation")], title="n")
        with pytest.raises(HistoryError, match="cannot save the reply.*locked"):
            s.add_reply(cid, 1, "a1 again", None)
        with pytest.raises(HistoryError, match="locked"):
            s.set_head(cid, 1)
        assert contents(s.messages(cid)) == ["q1", "a1"]  # reading still works
    assert contents(s.messages(cid)) == ["q1", "a1"]  # nothing half-written
    assert turn.prompt_id is None and turn.reply_id is None  # ids only for what is stored
    assert len(s.conversations()) == 1
    assert s.siblings(first.reply_id) == s.messages(cid)[1:]


def test_retries_and_edits_form_a_tree(tmp_path) -> None:
    s = ChatStore(str(tmp_path / "h.sqlite"))
    t1, t2 = Turn("q1", "a1"), Turn("q2", "a2")
    cid = s.add_turns(None, [t1, t2], title="t")
    a2b = s.add_reply(cid, t2.prompt_id, "a2 again", {"tau": 1.0})
    assert contents(s.messages(cid)) == ["q1", "a1", "q2", "a2 again"]
    assert contents(s.siblings(t2.reply_id)) == contents(s.siblings(a2b)) == ["a2", "a2 again"]
    edit = Turn("q2 edited", "a2 edited")
    s.add_turns(cid, [edit], after=t1.reply_id)  # an edit of turn 2
    assert (edit.prompt_version, edit.prompt_versions) == (2, 2)
    assert contents(s.siblings(edit.prompt_id)) == ["q2", "q2 edited"]
    root = Turn("q1 edited", "a1 edited")
    s.add_turns(cid, [root], after=None)  # an edit of turn 1: a second root
    assert contents(s.messages(cid)) == ["q1 edited", "a1 edited"]
    assert s.conversation(cid).n_messages == 2  # the active path, not all 10 messages
    assert contents(s.siblings(root.prompt_id)) == ["q1", "q1 edited"]
    # an explicit head: the branch from the root down to it, the stored head unchanged
    assert contents(s.path(cid, t2.reply_id)) == ["q1", "a1", "q2", "a2"]
    assert s.conversation(cid).head_id == root.reply_id
    # set_head follows the newest child at each step from any message
    assert s.set_head(cid, t1.prompt_id) == edit.reply_id
    assert contents(s.messages(cid)) == ["q1", "a1", "q2 edited", "a2 edited"]
    assert s.set_head(cid, t2.prompt_id) == a2b  # the newest reply of q2
    assert s.set_head(cid, t2.reply_id) == t2.reply_id  # a leaf is its own head
    assert s.leaf(cid, t1.reply_id) == edit.reply_id
    versions = s.turns(cid)
    assert [(t.prompt_version, t.prompt_versions, t.reply_version, t.reply_versions)
            for t in versions] == [(1, 2, 1, 1), (1, 2, 1, 2)]  # fmt: skip
    s.add_turns(cid, [Turn("q3", "a3")])  # after the head by default
    assert contents(s.messages(cid)) == ["q1", "a1", "q2", "a2", "q3", "a3"]
    assert "q3" in s.export_markdown(cid) and "edited" not in s.export_markdown(cid)


def test_tree_writes_are_checked(tmp_path) -> None:
    s = ChatStore(str(tmp_path / "h.sqlite"))
    t = Turn("q", "a")
    cid = s.add_turns(None, [t], title="t")
    other = s.add_turns(None, [Turn("x", "y")], title="u")
    with pytest.raises(HistoryError, match="no reply 1 in conversation"):
        s.add_turns(cid, [Turn("q2", "a2")], after=t.prompt_id)  # a turn follows a reply
    with pytest.raises(HistoryError, match="no prompt 2 in conversation"):
        s.add_reply(cid, t.reply_id, "r", None)  # a reply answers a prompt
    with pytest.raises(HistoryError, match="no message 3 in conversation 1"):
        s.set_head(cid, 3)  # another conversation's
    with pytest.raises(HistoryError, match="no reply 2 in a new conversation"):
        s.add_turns(None, [Turn("q", "a")], after=t.reply_id)
    with pytest.raises(HistoryError, match="no conversation 99"):
        s.add_turns(99, [Turn("q", "a")])
    with pytest.raises(HistoryError, match="no message 99"):
        s.siblings(99)
    with pytest.raises(HistoryError, match="no message 3 in conversation 1"):
        s.path(cid, 3)
    assert len(s.conversations()) == 2 and contents(s.messages(other)) == ["x", "y"]


def test_long_conversations_read_and_delete(tmp_path) -> None:
    """Paths are walked by recursive queries, and deleting must not nest per message."""
    s = ChatStore(str(tmp_path / "h.sqlite"))
    cid = s.add_turns(None, [Turn(f"q{i}", f"a{i}") for i in range(1500)], title="long")
    assert s.conversation(cid).n_messages == 3000
    assert s.messages(cid)[-1].content == "a1499"
    assert s.set_head(cid, 1) == 3000
    s.delete(cid)
    assert s.conversations() == [] and s.search("q7") == []
    index_is_sound(s)


def make_searchable(s: ChatStore) -> tuple[int, int]:
    old = s.add_turns(None, [Turn("Tell me about zebras", "Zebras are striped horses.")])
    s.add_turns(None, [Turn("café culture", "A CAFÉ serves coffee")], title="coffee")
    new = s.add_turns(
        None,
        [
            Turn("what about zebra crossings?", "A zebra crossing is a striped road crossing."),
            Turn('odd text: "quoted" *star* a OR b -x NEAR(', "100% sure_ok"),
        ],
        title="roads",
    )
    return old, new


def test_search_finds_snippets_newest_first(tmp_path) -> None:
    s = ChatStore(str(tmp_path / "h.sqlite"))
    assert s.fts
    old, new = make_searchable(s)
    hits = s.search("zebra")
    assert [(h.conversation_id, h.role) for h in hits] == [
        (new, "user"),
        (new, "assistant"),
        (old, "user"),
        (old, "assistant"),
    ]
    h = hits[1]
    assert (h.title, h.updated) == ("roads", s.conversation(new).updated)
    assert h.snippet == "A zebra crossing is a striped road crossing."
    assert [h.snippet[a:b] for a, b in h.marks] == ["zebra"]
    old_reply = hits[3]
    assert [old_reply.snippet[a:b] for a, b in old_reply.marks] == ["Zebras"]  # a prefix
    assert len(s.search("zebra", limit=2)) == 2
    assert [h.message_id for h in s.search("striped road")] == [h.message_id]
    assert s.search("road striped") == []  # a phrase, in order
    # long messages are cut around the match, on one line
    s.add_turns(new, [Turn("long", " ".join(["filler"] * 50) + "\nneedle\n" + "tail " * 50)])
    (long,) = s.search("needle")
    assert long.snippet.startswith("…") and long.snippet.endswith("…") and "\n" not in long.snippet
    assert len(long.snippet) < 120


@pytest.mark.parametrize(
    "text", ['"', "*", "a OR b", "-x", "NEAR(", '"quoted', "AND", "(", "^", "\\", "%", "_"]
)
def test_search_text_is_literal(tmp_path, text: str) -> None:
    """User text is never query syntax: nothing raises, and what matches contains the text."""
    s = ChatStore(str(tmp_path / "h.sqlite"))
    make_searchable(s)
    hits = s.search(text)
    contents_by_id = {m.id: m.content for c in s.conversations() for m in s.messages(c.id)}
    for h in hits:
        assert text.lower() in contents_by_id[h.message_id].lower()
    if text in ('"', "*", "a OR b", "-x", "NEAR(", '"quoted', "%", "_"):
        assert hits, text  # present in the odd turn: found literally


def test_search_of_nothing_finds_nothing(tmp_path) -> None:
    s = ChatStore(str(tmp_path / "h.sqlite"))
    make_searchable(s)
    assert s.search("") == s.search("   ") == s.search("absent words") == []


def test_search_sees_old_branches_and_forgets_deleted_conversations(tmp_path) -> None:
    s = ChatStore(str(tmp_path / "h.sqlite"))
    old, new = make_searchable(s)
    first = s.turns(new)[0]
    s.add_turns(new, [Turn("edited away", "gone from the active path")], after=None)
    (hit,) = s.search("crossing is")
    assert hit.message_id == first.reply_id  # an old branch
    assert hit.message_id not in [m.id for m in s.messages(new)]
    s.delete(new)
    assert s.search("crossing") == [] and s.search("edited") == []
    assert {h.conversation_id for h in s.search("zebras")} == {old}
    index_is_sound(s)


def test_search_without_fts5_scans_alike(tmp_path, monkeypatch) -> None:
    """An SQLite without FTS5 (forced here) scans with LIKE and gives the same hits for word
    searches; its writes skip the index, and the next open with FTS5 rebuilds it."""
    path = str(tmp_path / "h.sqlite")
    indexed = ChatStore(path)
    make_searchable(indexed)
    queries = ["zebra", "striped", "sure", "Tell me", "road", "quoted", "CAFÉ"]
    expected = {q: indexed.search(q) for q in queries}
    indexed.close()
    monkeypatch.setattr(store_module, "fts5_available", lambda db: False)
    scanning = ChatStore(path)
    assert not scanning.fts
    for q in queries:
        got = scanning.search(q)
        assert [(h.conversation_id, h.message_id, h.role) for h in got] == [
            (h.conversation_id, h.message_id, h.role) for h in expected[q]
        ], q
        assert all(h.snippet[a:b].lower() == q.lower() for h in got for a, b in h.marks)
    cid = scanning.add_turns(None, [Turn("written without the index", "by a plain SQLite")])
    assert [h.conversation_id for h in scanning.search("plain SQLite")] == [cid]
    scanning.close()
    monkeypatch.undo()
    reopened = ChatStore(path)
    assert reopened.fts and [h.conversation_id for h in reopened.search("plain sqlite")] == [cid]
    index_is_sound(reopened)
    assert not ChatStore(path, fts=False).fts  # the flag forces the scan as well


def test_session_retries_unsaved_turns(tmp_path) -> None:
    """Memory keeps every turn; the store gets them all once it accepts writes again."""
    path = str(tmp_path / "h.sqlite")
    session = ChatSession(ChatStore(path, timeout=0.05), system="be brief")
    assert session.add_turn(Turn("q1", "a1")) is None
    with locked(path):
        assert isinstance(session.add_turn(Turn("q2", "a2")), HistoryError)
        assert len(session.history) == 4 and len(session.unsaved) == 1
    assert session.add_turn(Turn("q3", "a3")) is None and session.unsaved == []
    stored = session.store.messages(session.conversation_id)
    assert [{"role": m.role, "content": m.content} for m in stored] == session.history
    assert session.messages_for("q4")[0] == {"role": "system", "content": "be brief"}
    assert session.messages_for("q4")[-1] == {"role": "user", "content": "q4"}
    reopened = ChatSession(ChatStore(path))
    title, turns, index = reopened.open(session.conversation_id)
    assert title == "q1" and reopened.history == session.history and index is None
    assert turns == reopened.turns == session.turns
    assert reopened.system == "be brief"
