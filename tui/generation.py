"""One reply on the engine, run in a worker thread, streamed into a ReplyBuffer.

Before the first token it fits the messages into the context window (the overflow policy) and
restores the conversation's saved KV state (when reopened, and when it pays for this prompt),
both counted in the time to first token, which runs from the start of the request to the first
streamed text. Before those, an auto reply on a machine not timed yet times it (once per set-up,
tens of seconds on a CPU), reporting its progress: that time is the reply's `calibration_s`,
not part of its time to first token.

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
    temperature: float | None  # None: as the model recommends (Engine.sampling_with)
    top_k: int | None
    top_p: float | None
    seed: int | None
    overflow: str = "rolling"  # the context overflow policy: "rolling" or "stop"
    # loads a reopened conversation's KV state when it pays for the prompt text given (the
    # conversation as sent); returns the positions restored
    restore: Callable[[str], int] | None = None


@dataclass
class ReplyOutcome:
    snapshot: dict[str, Any]  # the final statistics ({} when the reply failed to start)
    finish_reason: str
    stopped: bool  # stopped by the user (esc) or by quitting
    error: str | None = None  # why the reply failed
    prompt: str = ""  # the prompt text sent (the caches hold it, then the reply)


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
    on_calibration: Callable[[float | None], object] = lambda fraction: None,
) -> ReplyOutcome:
    """Generate the reply into buffer until it ends or should_stop() says so. on_dropped
    hears, before the first token, how many old turns the rolling window left out;
    on_calibration, while the machine is timed first, the fraction done, then None."""
    reason, stopped = "length", False
    next_snapshot = 0.0
    ttft: float | None = None
    prompt = ""
    extra: dict[str, Any] = {}
    try:
        t_cal = calibrate(engine, req, on_calibration)
        if t_cal is not None:
            extra["calibration_s"] = t_cal
        t0 = time.monotonic()
        fitted = fit_messages(engine, req.messages, max_tokens=req.max_tokens, policy=req.overflow)
        if fitted.dropped_turns:
            on_dropped(fitted.dropped_turns)
        prompt = engine.format_chat(fitted.messages)[0]
        restored = req.restore(prompt) if req.restore is not None else 0
        events = engine.chat_stream(
            fitted.messages,
            max_tokens=req.max_tokens,
            n_draft=req.k,
            tree=req.tree if req.k != 0 else None,
            draft_source=req.draft_source,
            sampling=engine.sampling_with(
                temperature=req.temperature, top_k=req.top_k, top_p=req.top_p
            ),
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
                    buffer.publish(dict(snapshot(), ttft=ttft, restored=restored, **extra))
                    next_snapshot = now + SNAPSHOT_PERIOD_S
        finally:
            events.close()  # ends the generator: its statistics are final
    except LocalspecError as exc:
        return ReplyOutcome({}, "error", False, str(exc))
    except Exception as exc:  # a bug must not take the conversation down with it
        return ReplyOutcome({}, "error", False, f"{type(exc).__name__}: {exc}")
    final = dict(snapshot(), ttft=ttft, restored=restored, dropped_turns=fitted.dropped_turns,
                 **extra)  # fmt: skip
    return ReplyOutcome(final, reason, stopped, prompt=prompt)


def calibrate(
    engine: Engine, req: ReplyRequest, on_calibration: Callable[[float | None], object]
) -> float | None:
    """Time the machine now, with progress, when this reply would otherwise do it silently
    before its first token: an auto reply, or a restore (loading a state calibrates first),
    on an engine whose calibration is pending. Returns the seconds it took (None: not timed)."""
    auto = req.k == "auto" and req.tree is None and req.draft_source != "none"
    # the reply's own settings (the engine's may be a fixed k); a restore calibrates the
    # engine's own mode first
    mode: dict[str, Any] = (
        {"n_draft": "auto", "tree": None, "draft_source": req.draft_source} if auto else {}
    )
    if not (auto or req.restore is not None) or not engine.calibration_due(**mode):
        return None
    t0 = time.monotonic()
    shown = 0  # the percent last reported

    def progress(fraction: float) -> None:
        nonlocal shown
        percent = int(100 * min(1.0, max(0.0, fraction)))
        if percent != shown:  # one message per percent, not per timing step
            shown = percent
            on_calibration(percent / 100)

    on_calibration(0.0)
    try:
        timed = engine.calibrate(progress=progress, **mode)
        progress(1.0)  # done, whatever the last step reported
    finally:
        on_calibration(None)
    return time.monotonic() - t0 if timed else None
