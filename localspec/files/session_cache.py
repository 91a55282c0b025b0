"""A folder of saved sessions, one per caller's key, bounded in size: the oldest used go first.

The chat app saves a conversation's caches when it leaves the conversation and restores them
when the conversation is reopened. A file holds the KV cache of the whole history (about 23 KB
per token for SmolLM2-135M with its drafter at f16, 29 KB for Qwen2.5-Coder-1.5B: see
docs/prompt-cache.md), so DEFAULT_MAX_BYTES (2 GiB) keeps some 90,000 tokens of SmolLM2
conversations, dozens of long chats, while staying small beside the models themselves.

Two processes may share the folder: files are replaced by atomic renames, and a file that
vanishes or turns out stale or broken is a miss, never an error. "Last use" is a file's
modification time: restoring one touches it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from typing import TYPE_CHECKING

from ..errors import SessionStateError

if TYPE_CHECKING:
    from ..engine import Engine

DEFAULT_MAX_BYTES = 2 << 30
SUFFIX = ".session"
TMP_AGE_S = 3600.0  # a temporary file older than this was left by a process that died


def default_dir() -> str:
    env = os.environ.get("LOCALSPEC_CACHE_DIR")
    if env:
        return os.path.join(env, "sessions")
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("localspec", appauthor=False), "sessions")


class SessionCache:
    """Saved sessions by key (an opaque string: file names are its hash)."""

    DEFAULT_MAX_BYTES = DEFAULT_MAX_BYTES

    def __init__(self, directory: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = directory or default_dir()
        self.max_bytes = max_bytes

    def path(self, key: str) -> str:
        name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
        return os.path.join(self.directory, name + SUFFIX)

    def save(self, engine: Engine, key: str) -> int:
        """Save the engine's caches under key; bytes kept (0 when the folder cannot be written,
        or when this one file alone is larger than max_bytes: it is then not kept). The oldest
        used files then go until the total fits max_bytes."""
        path = self.path(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            size = engine.save_session(path)
        except (OSError, SessionStateError):
            return 0
        if size > self.max_bytes:
            self._remove(path)
            size = 0
        self._evict(keep=path)
        return size

    def restore(self, engine: Engine, key: str) -> int:
        """Restore the engine's caches from key's file: the positions restored, 0 on a miss.
        A file that cannot serve this engine (stale, of other model files or settings,
        broken) is deleted and counts as a miss; the engine's caches are then empty."""
        path = self.path(key)
        try:
            before = os.stat(path)
        except OSError:
            return 0
        try:
            n = engine.load_session(path)
        except SessionStateError:
            self._remove(path, unless_replaced_since=before)
            return 0
        with contextlib.suppress(OSError):
            os.utime(path)  # last use
        return n

    def drop(self, key: str) -> None:
        self._remove(self.path(key))

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._files())

    # --- the folder ----------------------------------------------------------------------------

    def _files(self) -> list[tuple[int, int, str]]:
        """(last use, size, path) of every session file, the oldest first."""
        out = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
            except OSError:  # another process removed it meanwhile
                continue
            out.append((st.st_mtime_ns, st.st_size, path))
        return sorted(out)

    def _evict(self, keep: str) -> None:
        files = self._files()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= self.max_bytes:
                break
            if path != keep:
                self._remove(path)
                total -= size
        self._sweep_temporaries()

    def _sweep_temporaries(self) -> None:
        """Remove temporary files that processes which died while writing left behind."""
        now = time.time()
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                path = os.path.join(self.directory, name)
                try:
                    if now - os.stat(path).st_mtime > TMP_AGE_S:
                        os.unlink(path)
                except OSError:
                    pass

    @staticmethod
    def _remove(path: str, unless_replaced_since: os.stat_result | None = None) -> None:
        try:
            if unless_replaced_since is not None:
                st, was = os.stat(path), unless_replaced_since
                if (st.st_ino, st.st_mtime_ns) != (was.st_ino, was.st_mtime_ns):
                    return  # another process wrote a new one meanwhile
            os.unlink(path)
        except OSError:
            pass
