"""What the parts of the chat may read and change of the running app: the slash commands
(commands.py) and the turn actions (turn_actions.py) see ChatHost, the reply controller
(replies.py) sees ReplyHost. They type against these protocols, not against the app, so none
imports app.py (which imports them all)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.message import Message
    from textual.notifications import SeverityLevel
    from textual.timer import Timer
    from textual.worker import Worker

    from localspec import Engine

    from .chat_options import ChatOptions
    from .persistence import Persistence
    from .reply_settings import ReplySettings
    from .screens.chat import ChatScreen
    from .session import ChatSession
    from .store import ChatStore, HistoryError


class _Host(Protocol):
    """What both see: the conversation, the screen, and notifications."""

    options: ChatOptions
    editing: int | None  # /edit N: the next prompt replaces turn N-1
    next_reply: ReplySettings  # speculation and sampling for the next replies (reactive)

    @property
    def session(self) -> ChatSession: ...

    @property
    def chat(self) -> ChatScreen: ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...

    def end_edit(self) -> None: ...

    def show_gauge(self) -> None: ...


class ChatHost(_Host, Protocol):
    @property
    def store(self) -> ChatStore: ...

    @property
    def generating(self) -> bool: ...

    @property
    def last_reply(self) -> str: ...

    def copy_to_clipboard(self, text: str) -> None: ...

    def can_draft(self, source: str | None = None) -> bool: ...

    def retry(self) -> None: ...

    def switch_model(self, spec: str) -> None: ...

    def open_history(self, query: str = "") -> None: ...

    def export_conversation(self, conversation_id: int, path: str = "") -> str | None: ...

    def action_new_conversation(self) -> None: ...


class ReplyHost(_Host, Protocol):
    """The app as the reply controller sees it."""

    engine: Engine | None
    memory: Persistence
    switching: bool
    tint: bool

    def report_unsaved(self, exc: HistoryError | None) -> bool: ...

    def post_message(self, message: Message) -> bool: ...

    def call_after_refresh(self, callback: Callable[..., Any], *args: Any) -> bool: ...

    def set_interval(
        self, interval: float, callback: Callable[..., Any], *, pause: bool = False
    ) -> Timer: ...

    def run_worker(
        self, work: Callable[[], Any], *, thread: bool, exclusive: bool, group: str
    ) -> Worker[Any]: ...
