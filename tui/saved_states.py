"""Conversations' KV states on disk, so that a reopened conversation does not pay its whole
prefill again: saved when the app leaves a conversation (another one opens, a new one starts,
the model changes, the app quits), restored before the first reply after it reopens.

A state is keyed by the history file and the conversation; the engine checks the rest (the
model files' identity and the settings that shape the cache): a state saved with another model
or other settings, or a broken file, is a miss and is replaced at the next save.

Beside each state a small JSON file says what it holds: the prompt text the caches held (the
conversation as sent, then the reply) and how many positions. With it the app saves the state
of the branch on screen only (the caches may hold another branch, after /branch or f2/f3), and
restores a state only when the next prompt shares enough of it to pay (see `pays`). A state
without that file (saved by an older localspec) cannot be judged and is not restored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localspec import LocalspecError, SessionCache

if TYPE_CHECKING:
    from localspec import Engine

# When a restore pays. It costs time for every saved position (the file is read, both caches
# are set, then the positions the prompt does not share are cut back), whatever the prompt
# reuses; it saves the prefill of the shared positions only. Per position a restore is far
# cheaper than a prefill (0.07 ms against 4 ms on the project's 2-core box, with SmolLM2:
# docs/prompt-cache.md), yet a restore of 680 positions to reuse 23 gave a slower reply than a
# fresh prefill (issue 48): the ratio differs between machines, disks and models. So a state is
# restored only when the prompt shares at least RESTORE_SHARE of its positions (and at least
# RESTORE_MIN_TOKENS, below which a prefill is quick anyway): then a restore pays whenever a
# position costs less to restore than half a prefilled one, some 25 times the margin measured,
# and a state that mostly holds another branch (or an edited start) is never restored.
RESTORE_SHARE = 0.5
RESTORE_MIN_TOKENS = 16
INFO_SUFFIX = ".json"  # beside SessionCache's NAME.session: NAME.session.json


def pays(shared: int, saved: int) -> bool:
    """Whether restoring `saved` positions to reuse `shared` of them beats prefilling those."""
    return shared >= RESTORE_MIN_TOKENS and shared >= RESTORE_SHARE * saved


def shared_tokens(engine: Engine, a: str, b: str) -> int:
    """About how many tokens two chat prompt texts share at their start (the common text,
    tokenized as a chat prompt is)."""
    n = len(os.path.commonprefix([a, b]))
    if n == 0:
        return 0
    return len(engine.tokenize(a[:n], add_special=False, parse_special=True))


@dataclass(frozen=True)
class SavedInfo:
    text: str  # the prompt text the saved caches hold: the conversation as sent, the reply
    tokens: int  # positions saved


class SavedStates:
    def __init__(self, history_path: str, max_bytes: int, directory: str | None = None) -> None:
        self.history = os.path.realpath(history_path)
        self.cache = SessionCache(directory, max_bytes=max_bytes) if max_bytes > 0 else None

    def key(self, conversation_id: int) -> str:
        ident = f"{self.history}\0{conversation_id}"
        return "chat:" + hashlib.sha256(ident.encode()).hexdigest()[:32]

    def info(self, conversation_id: int) -> SavedInfo | None:
        """What the conversation's saved state holds; None when there is none (or no file
        saying what it holds)."""
        if self.cache is None:
            return None
        path = self.cache.path(self.key(conversation_id))
        try:
            if not os.path.exists(path):
                return None
            with open(path + INFO_SUFFIX, encoding="utf-8") as fh:
                data = json.load(fh)
            return SavedInfo(str(data["text"]), int(data["tokens"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, engine: Engine, conversation_id: int | None, holds: str,
             shown: str) -> str | None:  # fmt: skip
        """Keep the engine's state for the conversation, when it is the state of the branch on
        screen: holds is the prompt text the caches hold, shown the branch's (as the next
        prompt would send it). A state saved before stays when it serves that branch better.
        Returns why the state was not saved, when saving failed."""
        n = engine.cached_tokens
        if self.cache is None or conversation_id is None or n == 0 or not holds:
            return None
        now = shared_tokens(engine, holds, shown)
        if not pays(now, n):  # the caches hold another branch: nothing of the one on screen
            return None
        old = self.info(conversation_id)
        if old is not None and shared_tokens(engine, old.text, shown) > now:
            return None  # e.g. reopened, another branch replied to, then switched back
        key = self.key(conversation_id)
        try:
            written = self.cache.save(engine, key)
        except (LocalspecError, OSError) as exc:
            return f"the conversation's KV state was not saved: {exc}"
        if written == 0:
            return (
                "the conversation's KV state was not saved: the session cache folder cannot be "
                "written, or the state alone is over --session-cache-size"
            )
        why = self._write_info(self.cache.path(key), SavedInfo(holds, n))
        if why is not None:
            self.cache.drop(key)  # a state nothing says anything about is never restored
            return f"the conversation's KV state was not saved: {why}"
        self._sweep_infos()
        return None

    def restore(self, engine: Engine, conversation_id: int, prompt: str) -> int:
        """Restore the conversation's state when the prompt (the text about to be sent) shares
        enough of it to pay; positions restored (0: nothing usable, or not worth it)."""
        info = self.info(conversation_id)
        if self.cache is None or info is None:
            return 0
        if not pays(shared_tokens(engine, info.text, prompt), info.tokens):
            return 0
        return self.cache.restore(engine, self.key(conversation_id))

    def drop(self, conversation_id: int) -> None:
        if self.cache is not None:
            path = self.cache.path(self.key(conversation_id))
            self.cache.drop(self.key(conversation_id))
            with contextlib.suppress(OSError):
                os.unlink(path + INFO_SUFFIX)

    # --- the files saying what states hold ----------------------------------------------------

    @staticmethod
    def _write_info(state_path: str, info: SavedInfo) -> str | None:
        path = state_path + INFO_SUFFIX
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".info.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"text": info.text, "tokens": info.tokens}, fh)
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            return str(exc)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return None

    def _sweep_infos(self) -> None:
        """Remove the files of states the cache evicted."""
        assert self.cache is not None
        folder = self.cache.directory
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if name.endswith(INFO_SUFFIX) and not os.path.exists(
                os.path.join(folder, name[: -len(INFO_SUFFIX)])
            ):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
