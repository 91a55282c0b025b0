"""What the chat keeps beyond one run, in one place: the conversations (the SQLite store, with
the session that keeps the branch on screen in agreement with it), the choices remembered
across runs (the settings file) and conversations' KV states on disk. And what that needs to
know: which conversation the engine's caches hold, and the prompt text they hold, so that the
state saved is the one of the branch on screen, and a reopened conversation's state is
restored before its next reply only when the caches do not hold it already.

Nothing here touches the screen: each method returns why something could not be kept, and the
app says it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from localspec import LocalspecError, fit_messages

from .saved_states import SavedStates
from .session import ChatSession
from .settings import ChatSettings
from .store import ChatStore, HistoryError

if TYPE_CHECKING:
    from localspec import Engine


class Persistence:
    def __init__(
        self,
        store: ChatStore,
        *,
        system: str,
        settings: ChatSettings | None = None,
        states_bytes: int,
    ) -> None:
        self.store = store
        self.session = ChatSession(store, system=system)
        # remembered choices (the panel shown or not), beside the history by default
        self.settings = settings or ChatSettings.beside(store.filename)
        self.states = SavedStates(store.filename, states_bytes)
        self.cached: int | None = None  # the conversation whose history the caches hold
        self.holds = ""  # ...and the prompt text they hold (the branch last replied to)
        self.restore: int | None = None  # a reopened conversation whose KV state is on disk

    # --- what the caches hold ------------------------------------------------------------------

    def replied(self, prompt: str, reply: str) -> None:
        """A reply ended (or stopped): the caches hold this conversation's prompt and reply."""
        self.cached = self.session.conversation_id
        self.holds = prompt + reply

    def caches_lost(self) -> None:
        """A failed step emptied the caches, or another engine has empty ones."""
        self.cached, self.holds = None, ""

    def opened(self, conversation_id: int) -> None:
        """A saved conversation is shown: its state is restored before the next reply, unless
        the caches hold it already."""
        self.restore = None if self.cached == conversation_id else conversation_id

    def take_restorer(self, engine: Engine | None) -> Callable[[str], int] | None:
        """For the reply starting now: restores the reopened conversation's saved state when
        it pays for the prompt (once; None when nothing is pending)."""
        cid, self.restore = self.restore, None
        if cid is None or engine is None:
            return None
        states = self.states
        return lambda prompt: states.restore(engine, cid, prompt)

    # --- keeping ----------------------------------------------------------------------------

    def save_state(self, engine: Engine | None, max_tokens: int, overflow: str) -> str | None:
        """Keep the current conversation's KV state on disk for when it reopens: the state of
        the branch on screen (the caches may hold another one, after /branch or f2/f3).
        Returns why it could not (the conversation is safe; only its reopening is slower)."""
        cid = self.session.conversation_id
        # only what the caches hold: a conversation opened but not replied to yet still has
        # its saved state on disk, and the caches another conversation's history
        if engine is None or cid is None or self.cached != cid or self.restore:
            return None
        branch = self._branch_text(engine, max_tokens, overflow)
        return self.states.save(engine, cid, self.holds, branch)

    def _branch_text(self, engine: Engine, max_tokens: int, overflow: str) -> str:
        """The branch on screen as the next prompt would send it (the prompt text up to the
        new message); empty when the chat template cannot format it."""
        system = self.session.system
        messages = [
            *([{"role": "system", "content": system}] if system else []),
            *self.session.history,
            {"role": "user", "content": ""},
        ]
        with contextlib.suppress(LocalspecError):  # not even the last turn fits: compared whole
            messages = fit_messages(
                engine, messages, max_tokens=max_tokens, policy=overflow
            ).messages
        try:
            return engine.format_chat(messages)[0]
        except LocalspecError:
            return ""

    def forget(self, conversation_id: int) -> None:
        """A deleted conversation: its saved KV state goes too."""
        self.states.drop(conversation_id)

    def export(self, conversation_id: int, path: str = "") -> str:
        """Write a conversation as Markdown; where it went (HistoryError when it cannot)."""
        return self.store.export(
            conversation_id, path or f"localspec-conversation-{conversation_id}.md"
        )

    def remember(self, key: str, value: object) -> str | None:
        """A choice kept for the next runs; why it could not be written."""
        return self.settings.set(key, value)

    def save_turns(self) -> HistoryError | None:
        """The turns the store refused so far get another try; the store's refusal, if any."""
        return self.session.save()

    def close(self) -> None:
        self.store.close()
