"""Conversation history in a real SQLite file: a tree of messages, written a whole turn at a time.

Each message points to the one it follows (``parent_id``; NULL for a conversation's first
prompt) and each conversation to the leaf of its active branch (``head_id``). The active
conversation is the path from the root to the head. A retried reply is a second child of its
prompt; an edited prompt is a second child of the reply before it (or a second root), so the old
reply or the old prompt with everything after it stays in the file as a version to switch back
to. Message ids grow with every insert (messages are only deleted with their conversation), so
"the newest child" is the child with the largest id.

Search uses SQLite's FTS5 full-text index (an external-content table over ``messages`` kept in
sync by triggers); with an SQLite that lacks FTS5 it scans every message instead. The triggers'
presence says whether the index is current: an SQLite without FTS5 drops them (so writes still
work) and the next one with FTS5 rebuilds the index.

Location: ``$LOCALSPEC_DATA_DIR/history.sqlite`` when set, else the platform's user data
directory (``$XDG_DATA_HOME/localspec`` on Linux, ``~/Library/Application Support/localspec``
on macOS, ``%LOCALAPPDATA%\\localspec`` on Windows). The schema is versioned with
``PRAGMA user_version``; older files are migrated when opened, in one transaction.
"""

from __future__ import annotations

import enum
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from localspec import LocalspecError

SCHEMA_VERSION = 2

# The tables of schema 1; MIGRATIONS bring them (and files of any older version) up to date.
TABLES = """
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
"""

MIGRATIONS = {
    # Version 0 (files without a user_version) stored a prompt before its reply, so a failed or
    # interrupted reply left a user message with no reply after it: reopened, such a
    # conversation had two user turns in a row, which strict chat templates reject. Version 1
    # stores turns whole; this removes those orphaned prompts (the app had already dropped them).
    0: """
DELETE FROM messages WHERE role = 'user' AND COALESCE((
    SELECT n.role FROM messages AS n
    WHERE n.conversation_id = messages.conversation_id AND n.id > messages.id
    ORDER BY n.id LIMIT 1), '') != 'assistant';
""",
    # Version 2 makes each conversation a tree (retries and edits keep the old versions): a
    # version-1 conversation is one branch, each message following the one before it.
    # parent_id has no ON DELETE action: a cascade down a long chain would nest one trigger
    # level per message, past SQLite's depth limit. Only whole conversations are deleted.
    # head_id has no foreign key: it would make the two tables refer to each other.
    1: """
ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id);
ALTER TABLE conversations ADD COLUMN head_id INTEGER;
UPDATE messages SET parent_id = (
    SELECT MAX(p.id) FROM messages AS p
    WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id);
UPDATE conversations SET head_id = (
    SELECT MAX(m.id) FROM messages AS m WHERE m.conversation_id = conversations.id);
CREATE INDEX messages_by_parent ON messages(parent_id);
""",
}

FTS_TABLE = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts "
    "USING fts5(content, content='messages', content_rowid='id')"
)
FTS_TRIGGERS = {
    "messages_fts_insert": "AFTER INSERT ON messages BEGIN "
    "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END",
    "messages_fts_delete": "AFTER DELETE ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, content) "
    "VALUES ('delete', old.id, old.content); END",
    "messages_fts_update": "AFTER UPDATE OF content ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, content) "
    "VALUES ('delete', old.id, old.content); "
    "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END",
}

# the conversation's columns, then n_messages: the length of the active path (root to head)
CONVERSATIONS = """
SELECT c.id, c.title, c.target, c.draft, c.system, c.created, c.updated,
    (WITH RECURSIVE up(id) AS (
        SELECT c.head_id
        UNION ALL
        SELECT m.parent_id FROM messages AS m JOIN up ON m.id = up.id
        WHERE m.parent_id IS NOT NULL)
     SELECT COUNT(id) FROM up),
    c.head_id
FROM conversations AS c
"""

# A message's siblings: the same conversation, parent (NULL for the roots) and role.
SIBLING = "s.conversation_id = m.conversation_id AND s.parent_id IS m.parent_id AND s.role = m.role"

# root -> head, with each message's version (1-based, creation order) and number of versions
PATH = f"""
WITH RECURSIVE up(id, depth) AS (
    SELECT ?, 0
    UNION ALL
    SELECT m.parent_id, up.depth + 1 FROM messages AS m JOIN up ON m.id = up.id
    WHERE m.parent_id IS NOT NULL
)
SELECT m.id, m.role, m.content, m.stats, m.created, m.parent_id,
    (SELECT COUNT(*) FROM messages AS s WHERE {SIBLING} AND s.id <= m.id),
    (SELECT COUNT(*) FROM messages AS s WHERE {SIBLING})
FROM up JOIN messages AS m ON m.id = up.id
ORDER BY up.depth DESC
"""

# the newest leaf below a message: follow the newest child at each step
LEAF = """
WITH RECURSIVE down(id, depth) AS (
    SELECT ?, 0
    UNION ALL
    SELECT (SELECT MAX(c.id) FROM messages AS c WHERE c.parent_id = down.id), down.depth + 1
    FROM down WHERE down.id IS NOT NULL
)
SELECT id FROM down WHERE id IS NOT NULL ORDER BY depth DESC LIMIT 1
"""

# FTS5's snippet() wraps each match in these; they become SearchHit.marks
MARK_OPEN, MARK_CLOSE = "\x02", "\x03"
SNIPPET_TOKENS = 12
SNIPPET_CHARS = 40  # without the index: context kept on each side of the match


class HistoryError(LocalspecError):
    """The chat history file cannot be read or written (locked, full, read-only, corrupt)."""


def data_dir() -> str:
    env = os.environ.get("LOCALSPEC_DATA_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_data_dir("localspec", appauthor=False)


def fts5_available(db: sqlite3.Connection) -> bool:
    """Whether this SQLite has the FTS5 module (built in or loaded): try it on a temp table."""
    try:
        db.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5(x)")
        db.execute("DROP TABLE temp.fts5_probe")
    except sqlite3.OperationalError:
        return False
    return True


@dataclass
class Conversation:
    id: int
    title: str
    target: str
    draft: str
    system: str
    created: float
    updated: float
    n_messages: int = 0  # on the active path (root to head), not counting other versions
    head_id: int | None = None


@dataclass
class Message:
    id: int
    role: str
    content: str
    stats: dict[str, Any] | None
    created: float
    parent_id: int | None = None


@dataclass
class Turn:
    """A prompt and the reply to it (possibly stopped early): stored together or not at all.

    The ids are None until the turn is saved. Versions are 1-based: which edit of this prompt
    (of how many siblings it has) and which retry of this reply."""

    prompt: str
    reply: str
    stats: dict[str, Any] | None = None
    prompt_id: int | None = None
    reply_id: int | None = None
    prompt_version: int = 1
    prompt_versions: int = 1
    reply_version: int = 1
    reply_versions: int = 1


@dataclass
class SearchHit:
    conversation_id: int
    message_id: int
    title: str
    role: str
    snippet: str  # one line of the message around the match, "…" where it was cut
    updated: float  # the conversation's
    marks: tuple[tuple[int, int], ...] = ()  # (start, end) of each match within snippet


class _Head(enum.Enum):
    HEAD = "head"


HEAD = _Head.HEAD  # add_turns(after=HEAD): after the conversation's active branch


def _message(row: Sequence[Any]) -> Message:
    return Message(row[0], row[1], row[2], json.loads(row[3]) if row[3] else None, row[4], row[5])


def _fts_query(text: str) -> str:
    """User text as one FTS5 phrase (never syntax), its last word a prefix: `spec` finds
    `speculative`, as a scan for the text would."""
    return '"' + text.replace('"', '""') + '" *'


def _one_line(marked: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """Collapse whitespace and turn the match markers into (start, end) spans."""
    text, marks, start = "", [], 0
    for ch in " ".join(marked.split()):
        if ch == MARK_OPEN:
            start = len(text)
        elif ch == MARK_CLOSE:
            marks.append((start, len(text)))
        else:
            text += ch
    return text, tuple(marks)


def _hit(row: Sequence[Any]) -> SearchHit:
    snippet, marks = _one_line(row[4])
    return SearchHit(row[0], row[1], row[2], row[3], snippet, row[5], marks)


def _scan_snippet(content: str, text: str) -> str:
    """The first match with some context on each side, marked as FTS5's snippet() marks it."""
    found = re.search(re.escape(text), content, re.IGNORECASE)
    if found is None:  # casefold() and re's folding differ in rare cases (ß, ss)
        return content[: 2 * SNIPPET_CHARS]
    a, b = found.span()
    lo, hi = max(0, a - SNIPPET_CHARS), min(len(content), b + SNIPPET_CHARS)
    before = ("…" if lo else "") + content[lo:a]
    after = content[b:hi] + ("…" if hi < len(content) else "")
    return f"{before}{MARK_OPEN}{content[a:b]}{MARK_CLOSE}{after}"


class ChatStore:
    def __init__(self, path: str | None = None, *, timeout: float = 1.0, fts: bool = True) -> None:
        """timeout: seconds a write waits for another process's lock before it fails (the UI
        waits with it, so keep it short; a failed turn is kept in memory and saved later).
        fts: search with the FTS5 index when this SQLite has it; False scans the messages (and,
        like an SQLite without FTS5, leaves the index to be rebuilt by a later open)."""
        self.filename = path or os.path.join(data_dir(), "history.sqlite")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.filename)), exist_ok=True)
            self.db = sqlite3.connect(self.filename, timeout=timeout, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"cannot open the chat history {self.filename}: {exc}") from None
        try:
            self.db.execute("PRAGMA foreign_keys = ON")
            # for searching without the index: SQLite's own lower() folds ASCII only
            self.db.create_function("casefold", 1, str.casefold, deterministic=True)
            self.fts = fts and fts5_available(self.db)
            self._upgrade()
            self.db.execute("PRAGMA journal_mode = WAL")
            # WAL with NORMAL sync: never corrupt; a power cut may lose the last turns saved
            self.db.execute("PRAGMA synchronous = NORMAL")
        except HistoryError:
            self.db.close()
            raise
        except (OSError, sqlite3.Error) as exc:
            self.db.close()
            raise HistoryError(f"cannot open the chat history {self.filename}: {exc}") from None

    # --- schema ------------------------------------------------------------------------------

    def _upgrade(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"the chat history {self.filename} has schema version {version}, written by a "
                f"newer localspec (this one reads up to {SCHEMA_VERSION})"
            )
        if version == SCHEMA_VERSION and self._index_current():
            return
        self.db.execute("BEGIN IMMEDIATE")  # one transaction: a file is migrated whole or not
        try:
            if version < SCHEMA_VERSION:
                self._migrate(version)
            self._sync_index()
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise

    def _migrate(self, version: int) -> None:
        for script in [TABLES, *(MIGRATIONS[v] for v in range(version, SCHEMA_VERSION))]:
            for statement in script.split(";"):
                if statement.strip():
                    self.db.execute(statement)
        self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _index_triggers(self) -> int:
        names = list(FTS_TRIGGERS)
        return int(
            self.db.execute(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name IN (?, ?, ?)",
                names,
            ).fetchone()[0]
        )

    def _index_current(self) -> bool:
        """With FTS5: the index and all its triggers exist. Without: no trigger needs it."""
        return self._index_triggers() == (len(FTS_TRIGGERS) if self.fts else 0)

    def _sync_index(self) -> None:
        for name in FTS_TRIGGERS:
            self.db.execute(f"DROP TRIGGER IF EXISTS {name}")
        if not self.fts:  # writes must not need a module this SQLite lacks
            return
        self.db.execute(FTS_TABLE)
        for name, body in FTS_TRIGGERS.items():
            self.db.execute(f"CREATE TRIGGER {name} {body}")
        self.db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")

    @contextmanager
    def _transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One transaction, committed on leaving; an SQLite failure becomes a HistoryError."""
        try:
            with self.db:
                yield self.db
        except sqlite3.Error as exc:
            raise HistoryError(
                f"cannot {doing} in the chat history {self.filename}: {exc}"
            ) from None

    def close(self) -> None:
        self.db.close()

    @property
    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    # --- checks ------------------------------------------------------------------------------

    def _missing(self, what: str) -> HistoryError:
        return HistoryError(f"no {what} in the chat history {self.filename}")

    def _head_of(self, db: sqlite3.Connection, conversation_id: int) -> int | None:
        row = db.execute(
            "SELECT head_id FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise self._missing(f"conversation {conversation_id}")
        return None if row[0] is None else int(row[0])

    def _check_message(
        self, db: sqlite3.Connection, conversation_id: int, message_id: int, role: str = ""
    ) -> None:
        """Raise unless message_id is a message (of this role, if given) of the conversation."""
        row = db.execute(
            "SELECT role FROM messages WHERE id = ? AND conversation_id = ?",
            (message_id, conversation_id),
        ).fetchone()
        if row is None or (role and row[0] != role):
            kind = {"user": "prompt", "assistant": "reply"}.get(role, "message")
            raise self._missing(f"{kind} {message_id} in conversation {conversation_id}")

    # --- writing -----------------------------------------------------------------------------

    def new_conversation(self, title: str, *, target: str = "", draft: str = "",
                         system: str = "") -> int:  # fmt: skip
        with self._transaction("create a conversation") as db:
            return self._insert_conversation(db, title, target, draft, system)

    @staticmethod
    def _insert_conversation(
        db: sqlite3.Connection, title: str, target: str, draft: str, system: str
    ) -> int:
        now = time.time()
        cur = db.execute(
            "INSERT INTO conversations(title, target, draft, system, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (title, target, draft, system, now, now),
        )
        return int(cur.lastrowid or 0)

    @staticmethod
    def _insert_message(
        db: sqlite3.Connection,
        conversation_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        stats: dict[str, Any] | None,
        now: float,
    ) -> int:
        cur = db.execute(
            "INSERT INTO messages(conversation_id, parent_id, role, content, stats, created) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, content, json.dumps(stats) if stats else None, now),
        )
        return int(cur.lastrowid or 0)

    def add_turns(
        self,
        conversation_id: int | None,
        turns: Sequence[Turn],
        *,
        title: str = "",
        target: str = "",
        draft: str = "",
        system: str = "",
        after: int | None | _Head = HEAD,
    ) -> int:
        """Append whole turns in one transaction, creating the conversation when its id is
        None (title, target and draft describe it then); system is the conversation's system
        prompt as of these turns. The first prompt follows reply `after`: by default the
        conversation's head, None for a new first prompt (an edit of turn 1). The head becomes
        the last reply. Fills each turn's ids and versions once committed (not when this
        raises); returns the conversation id."""
        ids: list[tuple[int, int]] = []
        with self._transaction("save the conversation") as db:
            cid = conversation_id
            if cid is None:
                if isinstance(after, int):
                    raise self._missing(f"reply {after} in a new conversation")
                cid = self._insert_conversation(db, title, target, draft, system)
            head = self._head_of(db, cid)
            parent = head if isinstance(after, _Head) else after
            if isinstance(after, int):
                self._check_message(db, cid, after, "assistant")
            now = time.time()
            for t in turns:
                prompt_id = self._insert_message(db, cid, parent, "user", t.prompt, None, now)
                parent = self._insert_message(
                    db, cid, prompt_id, "assistant", t.reply, t.stats, now
                )
                ids.append((prompt_id, parent))
            db.execute(
                "UPDATE conversations SET updated = ?, system = ?, head_id = ? WHERE id = ?",
                (now, system, parent if ids else head, cid),
            )
            first_versions = self._count_siblings(db, ids[0][0]) if ids else 1
        for i, (t, (prompt_id, reply_id)) in enumerate(zip(turns, ids, strict=True)):
            t.prompt_id, t.reply_id = prompt_id, reply_id
            t.prompt_version = t.prompt_versions = first_versions if i == 0 else 1
            t.reply_version = t.reply_versions = 1
        return cid

    @staticmethod
    def _count_siblings(db: sqlite3.Connection, message_id: int) -> int:
        return int(
            db.execute(
                f"SELECT COUNT(*) FROM messages AS m JOIN messages AS s ON {SIBLING} "
                "WHERE m.id = ?",
                (message_id,),
            ).fetchone()[0]
        )

    def add_reply(
        self, conversation_id: int, prompt_id: int, reply: str, stats: dict[str, Any] | None
    ) -> int:
        """A new version of the reply to prompt prompt_id (a retry); it becomes the head.
        Returns its id."""
        with self._transaction("save the reply") as db:
            self._head_of(db, conversation_id)
            self._check_message(db, conversation_id, prompt_id, "user")
            now = time.time()
            reply_id = self._insert_message(
                db, conversation_id, prompt_id, "assistant", reply, stats, now
            )
            db.execute(
                "UPDATE conversations SET updated = ?, head_id = ? WHERE id = ?",
                (now, reply_id, conversation_id),
            )
        return reply_id

    def set_head(self, conversation_id: int, message_id: int) -> int:
        """Make the branch through message_id active: the head becomes the newest leaf below
        it (the newest child at each step). Returns the new head's id. The conversation's
        `updated` time is left alone: browsing versions is not a change."""
        with self._transaction("switch the branch") as db:
            self._head_of(db, conversation_id)
            self._check_message(db, conversation_id, message_id)
            leaf = int(db.execute(LEAF, (message_id,)).fetchone()[0])
            db.execute("UPDATE conversations SET head_id = ? WHERE id = ?", (leaf, conversation_id))
        return leaf

    def set_system(self, conversation_id: int, system: str) -> None:
        with self._transaction("set the system prompt") as db:
            db.execute(
                "UPDATE conversations SET system = ? WHERE id = ?", (system, conversation_id)
            )

    def rename(self, conversation_id: int, title: str) -> None:
        with self._transaction("rename a conversation") as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        """Delete the conversation with all its versions (and their search index entries)."""
        with self._transaction("delete a conversation") as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # --- reading -----------------------------------------------------------------------------

    def conversations(self) -> list[Conversation]:
        """Newest first."""
        with self._transaction("list conversations") as db:
            rows = db.execute(f"{CONVERSATIONS} ORDER BY c.updated DESC, c.id DESC").fetchall()
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        with self._transaction("read a conversation") as db:
            row = db.execute(f"{CONVERSATIONS} WHERE c.id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise self._missing(f"conversation {conversation_id}")
        return Conversation(*row)

    def leaf(self, conversation_id: int, message_id: int) -> int:
        """The newest leaf below message_id (itself if it has no children), changing nothing:
        the head that set_head would choose."""
        with self._transaction("read a conversation") as db:
            self._check_message(db, conversation_id, message_id)
            return int(db.execute(LEAF, (message_id,)).fetchone()[0])

    def _path_rows(self, conversation_id: int, head: int | None) -> list[Any]:
        with self._transaction("read a conversation") as db:
            stored = self._head_of(db, conversation_id)
            if head is None:
                head = stored
            else:
                self._check_message(db, conversation_id, head)
            return [] if head is None else db.execute(PATH, (head,)).fetchall()

    def path(self, conversation_id: int, head: int | None = None) -> list[Message]:
        """The branch from the root to head (default: the stored head)."""
        return [_message(r) for r in self._path_rows(conversation_id, head)]

    def messages(self, conversation_id: int) -> list[Message]:
        """The active conversation: the path from the root to the stored head."""
        return self.path(conversation_id)

    def turns(self, conversation_id: int, head: int | None = None) -> list[Turn]:
        """The branch from the root to head (default: the stored head) as whole turns, with
        their ids and versions. A prompt without a reply (none is written so) is left out."""
        rows = self._path_rows(conversation_id, head)
        out = []
        for u, a in zip(rows, rows[1:], strict=False):
            if u[1] == "user" and a[1] == "assistant":
                m = _message(a)
                out.append(Turn(u[2], a[2], m.stats, u[0], a[0], u[6], u[7], a[6], a[7]))
        return out

    def siblings(self, message_id: int) -> list[Message]:
        """The versions of a message: same conversation, parent and role, oldest first
        (itself included)."""
        with self._transaction("read a conversation") as db:
            rows = db.execute(
                "SELECT s.id, s.role, s.content, s.stats, s.created, s.parent_id "
                f"FROM messages AS m JOIN messages AS s ON {SIBLING} WHERE m.id = ? ORDER BY s.id",
                (message_id,),
            ).fetchall()
        if not rows:
            raise self._missing(f"message {message_id}")
        return [_message(r) for r in rows]

    # --- search ------------------------------------------------------------------------------

    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
        """Messages containing text (any version, any branch), newest conversations first,
        oldest message first within one. The text is literal, never query syntax. With the
        index, words match whole or as a prefix (the last one), ignoring case, accents and
        punctuation; text without any word (`*`, `"`), and any text without the index, is
        found as a substring, ignoring case only."""
        if not text.strip():
            return []
        words = any(ch.isalnum() for ch in text)
        with self._transaction("search the conversations") as db:
            if self.fts and words:
                rows = db.execute(
                    "SELECT m.conversation_id, m.id, c.title, m.role, "
                    "snippet(messages_fts, 0, ?, ?, '…', ?), c.updated "
                    "FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid "
                    "JOIN conversations AS c ON c.id = m.conversation_id "
                    "WHERE messages_fts MATCH ? "
                    "ORDER BY c.updated DESC, c.id DESC, m.id LIMIT ?",
                    (MARK_OPEN, MARK_CLOSE, SNIPPET_TOKENS, _fts_query(text), limit),
                ).fetchall()
            else:
                rows = db.execute(
                    "SELECT m.conversation_id, m.id, c.title, m.role, m.content, c.updated "
                    "FROM messages AS m JOIN conversations AS c ON c.id = m.conversation_id "
                    "WHERE instr(casefold(m.content), casefold(?)) > 0 "
                    "ORDER BY c.updated DESC, c.id DESC, m.id LIMIT ?",
                    (text, limit),
                ).fetchall()
                rows = [(*r[:4], _scan_snippet(r[4], text), r[5]) for r in rows]
        return [_hit(r) for r in rows]

    # --- export ------------------------------------------------------------------------------

    def export_markdown(self, conversation_id: int) -> str:
        """The active conversation as Markdown."""
        c = self.conversation(conversation_id)
        out = [f"# {c.title}", ""]
        if c.target:
            out += [f"_target: {c.target}; drafter: {c.draft or 'none'}_", ""]
        if c.system:
            out += ["**system**", "", c.system, ""]
        for m in self.messages(conversation_id):
            out += [f"**{m.role}**", "", m.content, ""]
        return "\n".join(out).rstrip() + "\n"

    def export(self, conversation_id: int, path: str) -> str:
        """Write the conversation as Markdown to path, whole or not at all; returns the
        absolute path."""
        text = self.export_markdown(conversation_id)
        path = os.path.abspath(path)
        tmp = f"{path}.{os.getpid()}.part"  # beside the target, so the rename is atomic
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp)
            raise HistoryError(f"cannot export to {path}: {exc.strerror or exc}") from None
        return path
