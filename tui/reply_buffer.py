"""The hand-off from the generation thread to the UI: streamed text, tint spans, statistics.

The generation thread only appends here (a lock and a list append per step); the UI drains
the buffer on its own frame timer, so the cost of rendering does not grow with the engine's
speed, and the thread holding the interpreter lock is the engine's, not the UI's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from .tint import Span


class ReplyBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: list[tuple[str, Sequence[Span]]] = []
        self._snapshot: dict[str, Any] | None = None

    def put(self, text: str, spans: Sequence[Span] = ()) -> None:
        """Text that became visible; spans: its leading (characters, source) runs that came
        from accepted drafts (source "eagle", "ngram" or "eagle+ngram")."""
        with self._lock:
            self._pieces.append((text, spans))

    def publish(self, snapshot: dict[str, Any]) -> None:
        """The latest statistics (an older one not yet drained is replaced)."""
        with self._lock:
            self._snapshot = snapshot

    def drain(self) -> tuple[list[tuple[str, Sequence[Span]]], dict[str, Any] | None]:
        """Everything put since the last drain, and the latest snapshot if a new one came."""
        with self._lock:
            pieces, self._pieces = self._pieces, []
            snapshot, self._snapshot = self._snapshot, None
        return pieces, snapshot
