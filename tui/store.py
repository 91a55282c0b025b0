"""Conversation history in a real SQLite file, written as each message completes.

Location: ``$LOCALSPEC_DATA_DIR/history.sqlite`` when set, else the platform's user data
directory (``$XDG_DATA_HOME/localspec`` on Linux, ``~/Library/Application Support/localspec``
on macOS, ``%LOCALAPPDATA%\\localspec`` on Windows).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from localspec.errors import LocalspecError

SCHEMA = """
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


class ChatStore:
    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.path.join(data_dir(), "history.sqlite")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self.db = sqlite3.connect(self.path, check_same_thread=False)
            self.db.execute("PRAGMA foreign_keys = ON")
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.DatabaseError) as exc:
            raise LocalspecError(f"cannot open the chat history {self.path}: {exc}") from None

    def close(self) -> None:
        self.db.close()

    def new_conversation(self, title: str, *, target: str = "", draft: str = "",
                         system: str = "") -> int:  # fmt: skip
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO conversations(title, target, draft, system, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (title, target, draft, system, now, now),
            )
        return int(cur.lastrowid or 0)

    def add_message(
        self, conversation_id: int, role: str, content: str, stats: dict[str, Any] | None = None
    ) -> int:
        now = time.time()
        with self.db:  # one transaction, committed before returning
            cur = self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, stats, created) "
                "VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, json.dumps(stats) if stats else None, now),
            )
            self.db.execute(
                "UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id)
            )
        return int(cur.lastrowid or 0)

    def set_system(self, conversation_id: int, system: str) -> None:
        with self.db:
            self.db.execute(
                "UPDATE conversations SET system = ? WHERE id = ?", (system, conversation_id)
            )

    def conversations(self) -> list[Conversation]:
        rows = self.db.execute(
            "SELECT c.id, c.title, c.target, c.draft, c.system, c.created, c.updated, "
            "COUNT(m.id) FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id "
            "GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [Conversation(*r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        for c in self.conversations():
            if c.id == conversation_id:
                return c
        raise LocalspecError(f"no conversation {conversation_id}")

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute(
            "SELECT id, role, content, stats, created FROM messages "
            "WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [Message(r[0], r[1], r[2], json.loads(r[3]) if r[3] else None, r[4]) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET title = ? WHERE id = ?",
                            (title, conversation_id))  # fmt: skip

    def delete(self, conversation_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

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
