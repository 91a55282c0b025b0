"""Conversations' KV states on disk, so that a reopened conversation does not pay its whole
prefill again: saved when the app leaves a conversation (another one opens, a new one starts,
the model changes, the app quits), restored before the first reply after it reopens.

A state is keyed by the history file and the conversation; the engine checks the rest (the
model files' identity and the settings that shape the cache): a state saved with another model
or other settings, or a broken file, is a miss and is replaced at the next save. A state
whose conversation changed since (an edit, another version) is still used up to the prefix
the next prompt shares with it.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from localspec import LocalspecError, SessionCache

if TYPE_CHECKING:
    from localspec import Engine


class SavedStates:
    def __init__(self, history_path: str, max_bytes: int, directory: str | None = None) -> None:
        self.history = os.path.realpath(history_path)
        self.cache = SessionCache(directory, max_bytes=max_bytes) if max_bytes > 0 else None

    def key(self, conversation_id: int) -> str:
        ident = f"{self.history}\0{conversation_id}"
        return "chat:" + hashlib.sha256(ident.encode()).hexdigest()[:32]

    def save(self, engine: Engine, conversation_id: int | None) -> str | None:
        """Keep the engine's state for the conversation; returns why not, when it failed."""
        if self.cache is None or conversation_id is None or engine.cached_tokens == 0:
            return None
        try:
            written = self.cache.save(engine, self.key(conversation_id))
        except (LocalspecError, OSError) as exc:
            return f"the conversation's KV state was not saved: {exc}"
        if written == 0:
            return (
                "the conversation's KV state was not saved: the session cache folder cannot be "
                "written, or the state alone is over --session-cache-size"
            )
        return None

    def restore(self, engine: Engine, conversation_id: int) -> int:
        """Positions restored (0: nothing usable was saved)."""
        if self.cache is None:
            return 0
        return self.cache.restore(engine, self.key(conversation_id))

    def drop(self, conversation_id: int) -> None:
        if self.cache is not None:
            self.cache.drop(self.key(conversation_id))
