"""The hand-off from the generation thread to the UI: streamed text, tint spans, statistics.

The generation thread only appends here (a lock and a list append per step); the UI drains
the buffer on its own frame timer, so the cost of rendering does not grow with the engine's
speed, and the thread holding the interpreter lock is the engine's, not the UI's.
"""

from __future__ import annotations

import threading
from typing import Any


class ReplyBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: list[tuple[str, int]] = []
        self._snapshot: dict[str, Any] | None = None

    def put(self, text: str, accepted_chars: int) -> None:
        """Text that became visible; its first accepted_chars came from accepted drafts."""
        with self._lock:
            self._pieces.append((text, accepted_chars))

    def publish(self, snapshot: dict[str, Any]) -> None:
        """The latest statistics (an older one not yet drained is replaced)."""
        with self._lock:
            self._snapshot = snapshot

    def drain(self) -> tuple[list[tuple[str, int]], dict[str, Any] | None]:
        """Everything put since the last drain, and the latest snapshot if a new one came."""
        with self._lock:
            pieces, self._pieces = self._pieces, []
            snapshot, self._snapshot = self._snapshot, None
        return pieces, snapshot
