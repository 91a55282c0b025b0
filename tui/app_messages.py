"""The messages the app's workers post to the UI thread, and what a reply is for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from textual.message import Message

from .chat_options import ChatOptions
from .generation import ReplyOutcome

if TYPE_CHECKING:
    from localspec import Engine


class EngineReady(Message):
    def __init__(self, engine: Engine | None, error: str | None) -> None:
        super().__init__()
        self.engine, self.error = engine, error


class ReplyEnded(Message):
    def __init__(self, outcome: ReplyOutcome) -> None:
        super().__init__()
        self.outcome = outcome


class Calibrating(Message):
    """Before the first reply on a machine not timed yet: the share of the timing done (0 to
    1), or None once it is over."""

    def __init__(self, fraction: float | None) -> None:
        super().__init__()
        self.fraction = fraction


class TurnsDropped(Message):
    """The rolling window left the oldest turns out of the prompt being sent."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n


class TargetResolved(Message):
    """/model: the target is a local file now (downloaded if it was a repo id)."""

    def __init__(self, options: ChatOptions) -> None:
        super().__init__()
        self.options = options


class ModelSwitched(Message):
    def __init__(self, engine: Engine | None, options: ChatOptions, error: str | None) -> None:
        super().__init__()
        self.engine, self.options, self.error = engine, options, error


@dataclass(frozen=True)
class ReplyPlan:
    """What a reply is for: a new turn, another version of the last reply (retry), or a new
    prompt in place of turn `index` (edit: the turns after it leave the active branch)."""

    kind: Literal["new", "retry", "edit"]
    prompt: str
    index: int  # the turn the reply belongs to (0-based)
