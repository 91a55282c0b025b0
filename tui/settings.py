"""The chat's own choices remembered across runs (whether the statistics panel shows): a small
JSON file, `chat-settings.json`, in the folder of the chat history (so `$LOCALSPEC_DATA_DIR` or
the user data directory, and a test's temp dir when a test puts the history there).

A missing or unreadable file means the defaults; a file that cannot be written leaves the choice
in effect for this run only (`set` says why).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

FILENAME = "chat-settings.json"


class ChatSettings:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            data = {}
        self._values: dict[str, Any] = data if isinstance(data, dict) else {}

    @classmethod
    def beside(cls, history_path: str) -> ChatSettings:
        """The settings file in the chat history's folder."""
        return cls(os.path.join(os.path.dirname(os.path.abspath(history_path)), FILENAME))

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def set(self, key: str, value: Any) -> str | None:
        """Remember value (a JSON value) under key; returns why it could not be written."""
        self._values[key] = value
        folder = os.path.dirname(os.path.abspath(self.path))
        tmp = None
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{FILENAME}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._values, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)  # whole or not at all
            tmp = None
        except OSError as exc:
            return f"not remembered for the next run: cannot write {self.path} ({exc})"
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return None
