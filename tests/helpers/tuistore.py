"""The chat history's SQLite file as another program can hold it: its write lock taken by
another connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def locked(path: str) -> Iterator[None]:
    """Another connection holds the write lock meanwhile."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()
