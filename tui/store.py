"""Conversation history in a real SQLite file: turns (a prompt and its reply) written whole.

Location: ``$LOCALSPEC_DATA_DIR/history.sqlite`` when set, else the platform's user data
directory (``$XDG_DATA_HOME/localspec`` on Linux, ``~/Library/Application Support/localspec``
on macOS, ``%LOCALAPPDATA%\\localspec`` on Windows). The schema is versioned with
``PRAGMA user_version``; older files are migrated when opened.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from localspec import LocalspecError

SCHEMA_VERSION = 1

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

# Version 0 (files without a user_version) stored a prompt before its reply, so a failed or
# interrupted reply left a user message with no reply after it: reopened, such a conversation
# had two user turns in a row, which strict chat templates reject. Version 1 stores turns
# whole; the migration removes those orphaned prompts (the app had already dropped them).
MIGRATIONS = {
    0: """
DELETE FROM messages WHERE role = 'user' AND COALESCE((
    SELECT n.role FROM messages AS n
    WHERE n.conversation_id = messages.conversation_id AND n.id > messages.id
    ORDER BY n.id LIMIT 1), '') != 'assistant';
""",
}


class HistoryError(LocalspecError):
    """The chat history file cannot be read or written (locked, full, read-only, corrupt)."""


def data_dir() -> str:
    env = os.environ.get("LOCALSPEC_DATA_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_data_dir("localspec", appauthor=False)


@dataclass
class Conversation:
    id: int
    title: str
    target: str
    draft: str
    system: str
    created: float
    updated: float
    n_messages: int = 0


@dataclass
class Message:
    id: int
    role: str
    content: str
    stats: dict[str, Any] | None
    created: float


@dataclass
class Turn:
    """A prompt and the reply to it (possibly stopped early): stored together or not at all."""

    prompt: str
    reply: str
    stats: dict[str, Any] | None = None


class ChatStore:
    def __init__(self, path: str | None = None, *, timeout: float = 1.0) -> None:
        """timeout: seconds a write waits for another process's lock before it fails (the UI
        waits with it, so keep it short; a failed turn is kept in memory and saved later)."""
        self.path = path or os.path.join(data_dir(), "history.sqlite")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=timeout, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"cannot open the chat history {self.path}: {exc}") from None
        try:
            self.db.execute("PRAGMA foreign_keys = ON")
            self._upgrade()
            self.db.execute("PRAGMA journal_mode = WAL")
            # WAL with NORMAL sync: never corrupt; a power cut may lose the last turns saved
            self.db.execute("PRAGMA synchronous = NORMAL")
        except HistoryError:
            self.db.close()
            raise
        except (OSError, sqlite3.Error) as exc:
            self.db.close()
            raise HistoryError(f"cannot open the chat history {self.path}: {exc}") from None

    def _upgrade(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"the chat history {self.path} has schema version {version}, written by a "
                f"newer localspec (this one reads up to {SCHEMA_VERSION})"
            )
        if version == SCHEMA_VERSION:
            return
        self.db.execute("BEGIN IMMEDIATE")  # one transaction: a file is migrated whole or not
        try:
            for statement in TABLES.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            for v in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[v].split(";"):
                    if statement.strip():
                        self.db.execute(statement)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise

    @contextmanager
    def _transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One transaction, committed on leaving; an SQLite failure becomes a HistoryError."""
        try:
            with self.db:
                yield self.db
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot {doing} in the chat history {self.path}: {exc}") from None

    def close(self) -> None:
        self.db.close()

    @property
    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

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

    def add_turns(
        self,
        conversation_id: int | None,
        turns: Sequence[Turn],
        *,
        title: str = "",
        target: str = "",
        draft: str = "",
        system: str = "",
    ) -> int:
        """Append whole turns in one transaction, creating the conversation when its id is
        None (title, target and draft describe it then); system is the conversation's system
        prompt as of these turns. Returns the conversation id."""
        with self._transaction("save the conversation") as db:
            cid = conversation_id
            if cid is None:
                cid = self._insert_conversation(db, title, target, draft, system)
            now = time.time()
            for t in turns:
                stats = json.dumps(t.stats) if t.stats else None
                db.executemany(
                    "INSERT INTO messages(conversation_id, role, content, stats, created) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(cid, "user", t.prompt, None, now), (cid, "assistant", t.reply, stats, now)],
                )
            db.execute(
                "UPDATE conversations SET updated = ?, system = ? WHERE id = ?", (now, system, cid)
            )
        return cid

    def set_system(self, conversation_id: int, system: str) -> None:
        with self._transaction("set the system prompt") as db:
            db.execute(
                "UPDATE conversations SET system = ? WHERE id = ?", (system, conversation_id)
            )

    def conversations(self) -> list[Conversation]:
        with self._transaction("list conversations") as db:
            rows = db.execute(
                "SELECT c.id, c.title, c.target, c.draft, c.system, c.created, c.updated, "
                "COUNT(m.id) FROM conversations c "
                "LEFT JOIN messages m ON m.conversation_id = c.id "
                "GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
            ).fetchall()
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        for c in self.conversations():
            if c.id == conversation_id:
                return c
        raise HistoryError(f"no conversation {conversation_id} in the chat history {self.path}")

    def messages(self, conversation_id: int) -> list[Message]:
        with self._transaction("read a conversation") as db:
            rows = db.execute(
                "SELECT id, role, content, stats, created FROM messages "
                "WHERE conversation_id = ? ORDER BY id",
                (conversation_id,),
            ).fetchall()
        return [Message(r[0], r[1], r[2], json.loads(r[3]) if r[3] else None, r[4]) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        with self._transaction("rename a conversation") as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._transaction("delete a conversation") as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def export_markdown(self, conversation_id: int) -> str:
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
