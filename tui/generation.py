"""One reply on the engine, run in a worker thread, streamed into a ReplyBuffer.

Before the first token it restores the conversation's saved KV state (when reopened) and fits
the messages into the context window (the overflow policy), both counted in the time to first
token, which runs from the start of the request to the first streamed text.

Per step it does as little Python as it can, since every moment it holds the interpreter lock
is one the UI cannot use and vice versa: it hands the step's text to the buffer, and takes a
statistics snapshot a few times a second. The UI renders from the buffer at its own pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localspec import LocalspecError, TreeShape, fit_messages

from .reply_buffer import ReplyBuffer
from .tint import Span

if TYPE_CHECKING:
    from localspec import Engine, Event

SNAPSHOT_PERIOD_S = 0.25  # statistics for the side panel: a human rate, not per token


@dataclass
class ReplyRequest:
    messages: list[dict[str, str]]
    k: int | str  # "auto" or a chain length (0: plain)
    tree: TreeShape | None
    draft_source: str  # "auto", "eagle", "ngram" or "none" (plain)
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    overflow: str = "rolling"  # the context overflow policy: "rolling" or "stop"
    restore: Callable[[], int] | None = None  # loads a reopened conversation's KV state


@dataclass
class ReplyOutcome:
    snapshot: dict[str, Any]  # the final statistics ({} when the reply failed to start)
    finish_reason: str
    stopped: bool  # stopped by the user (esc) or by quitting
    error: str | None = None  # why the reply failed


def draft_spans(engine: Engine, ev: Event) -> list[Span]:
    """The event's leading accepted drafts as (characters, source) runs: accepted drafts lead
    a step's tokens, and consecutive tokens from the same source make one run."""
    sources = ev.sources
    if not sources or not sources[0]:
        return []
    spans: list[Span] = []
    done = start = 0  # characters measured so far; the run's first token
    for i in range(1, len(sources) + 1):
        if i < len(sources) and sources[i] == sources[start]:
            continue
        chars = len(engine.detokenize(ev.tokens[:i]))
        spans.append((chars - done, sources[start]))
        done, start = chars, i
        if i == len(sources) or not sources[i]:
            break
    return spans


def stream_reply(
    engine: Engine,
    req: ReplyRequest,
    buffer: ReplyBuffer,
    should_stop: Callable[[], bool],
    snapshot: Callable[[], dict[str, Any]],
    on_dropped: Callable[[int], object] = lambda n: None,
) -> ReplyOutcome:
    """Generate the reply into buffer until it ends or should_stop() says so. on_dropped
    hears, before the first token, how many old turns the rolling window left out."""
    reason, stopped = "length", False
    next_snapshot = 0.0
    t0 = time.monotonic()
    ttft: float | None = None
    try:
        restored = req.restore() if req.restore is not None else 0
        fitted = fit_messages(engine, req.messages, max_tokens=req.max_tokens, policy=req.overflow)
        if fitted.dropped_turns:
            on_dropped(fitted.dropped_turns)
        events = engine.chat_stream(
            fitted.messages,
            max_tokens=req.max_tokens,
            n_draft=req.k,
            tree=req.tree if req.k != 0 else None,
            draft_source=req.draft_source,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
        )
        try:
            for ev in events:
                if ttft is None:
                    ttft = time.monotonic() - t0
                buffer.put(ev.text, draft_spans(engine, ev))
                if ev.finish_reason:
                    reason = ev.finish_reason
                elif should_stop():
                    stopped = True
                    break
                now = time.monotonic()
                if now >= next_snapshot:
                    buffer.publish(dict(snapshot(), ttft=ttft, restored=restored))
                    next_snapshot = now + SNAPSHOT_PERIOD_S
        finally:
            events.close()  # ends the generator: its statistics are final
    except LocalspecError as exc:
        return ReplyOutcome({}, "error", False, str(exc))
    except Exception as exc:  # a bug must not take the conversation down with it
        return ReplyOutcome({}, "error", False, f"{type(exc).__name__}: {exc}")
    final = dict(snapshot(), ttft=ttft, restored=restored, dropped_turns=fitted.dropped_turns)
    return ReplyOutcome(final, reason, stopped)
