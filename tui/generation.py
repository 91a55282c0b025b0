"""One reply on the engine, run in a worker thread, streamed into a ReplyBuffer.

Per step it does as little Python as it can, since every moment it holds the interpreter lock
is one the UI cannot use and vice versa: it hands the step's text to the buffer, and takes a
statistics snapshot a few times a second. The UI renders from the buffer at its own pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localspec import LocalspecError, TreeShape

from .reply_buffer import ReplyBuffer

if TYPE_CHECKING:
    from localspec import Engine

SNAPSHOT_PERIOD_S = 0.25  # statistics for the side panel: a human rate, not per token


@dataclass
class ReplyRequest:
    messages: list[dict[str, str]]
    k: int | str  # "auto" or a chain length (0: plain)
    tree: TreeShape | None
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None


@dataclass
class ReplyOutcome:
    snapshot: dict[str, Any]  # the final statistics ({} when the reply failed to start)
    finish_reason: str
    stopped: bool  # stopped by the user (esc) or by quitting
    error: str | None = None  # why the reply failed


def stream_reply(
    engine: Engine,
    req: ReplyRequest,
    buffer: ReplyBuffer,
    should_stop: Callable[[], bool],
    snapshot: Callable[[], dict[str, Any]],
) -> ReplyOutcome:
    """Generate the reply into buffer until it ends or should_stop() says so."""
    reason, stopped = "length", False
    next_snapshot = 0.0
    try:
        events = engine.chat_stream(
            req.messages,
            max_tokens=req.max_tokens,
            n_draft=req.k,
            tree=req.tree if req.k != 0 else None,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
        )
        try:
            for ev in events:
                # accepted drafts lead a step's tokens; only then is there a span to measure
                n_acc = ev.accepted.count(True) if ev.accepted and ev.accepted[0] else 0
                acc_chars = len(engine.detokenize(ev.tokens[:n_acc])) if n_acc else 0
                buffer.put(ev.text, acc_chars)
                if ev.finish_reason:
                    reason = ev.finish_reason
                elif should_stop():
                    stopped = True
                    break
                now = time.monotonic()
                if now >= next_snapshot:
                    buffer.publish(snapshot())
                    next_snapshot = now + SNAPSHOT_PERIOD_S
        finally:
            events.close()  # ends the generator: its statistics are final
    except LocalspecError as exc:
        return ReplyOutcome({}, "error", False, str(exc))
    except Exception as exc:  # a bug must not take the conversation down with it
        return ReplyOutcome({}, "error", False, f"{type(exc).__name__}: {exc}")
    return ReplyOutcome(snapshot(), reason, stopped)
