"""Lets the UI wait for its worker threads before it frees what they use (the engine).

A worker enters before touching the engine and leaves when done; close() refuses new entries
and waits until every worker inside has left, so the engine is never closed under a decode.
"""

from __future__ import annotations

import threading


class ThreadGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def enter(self) -> bool:
        """False once the gate is closed: the worker must not start."""
        with self._cond:
            if self._closed:
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._inside -= 1
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new entries and wait for the workers inside; False if timeout ran out."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._inside == 0, timeout)
