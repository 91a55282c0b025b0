"""What the slash commands (commands.py) and the turn actions (turn_actions.py) may read and
change of the running chat: the app as they see it. They type against this protocol, not
against the app, so neither imports app.py (which imports both)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from .chat_options import ChatOptions
    from .reply_settings import ReplySettings
    from .screens.chat import ChatScreen
    from .session import ChatSession
    from .store import ChatStore


class ChatHost(Protocol):
    # the conversation and where it is kept
    session: ChatSession
    store: ChatStore
    options: ChatOptions
    editing: int | None  # /edit N: the next prompt replaces turn N-1
    generating: bool
    next_reply: ReplySettings  # speculation and sampling for the next replies (reactive)

    @property
    def chat(self) -> ChatScreen: ...

    @property
    def last_reply(self) -> str: ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...

    def copy_to_clipboard(self, text: str) -> None: ...

    def can_draft(self, source: str | None = None) -> bool: ...

    def end_edit(self) -> None: ...

    def retry(self) -> None: ...

    def switch_model(self, spec: str) -> None: ...

    def show_gauge(self) -> None: ...

    def open_history(self, query: str = "") -> None: ...

    def export_conversation(self, conversation_id: int, path: str = "") -> str | None: ...

    def action_new_conversation(self) -> None: ...
