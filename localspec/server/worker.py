"""One generation at a time: a bounded FIFO queue of jobs and the one thread that runs them.

The engine's loop runs in the worker thread so the event loop stays free (health checks answer
during a generation). Events cross to the event loop in batches: the worker appends to a list
and wakes the loop only when the list was empty, so a slow reader costs one wake-up per batch,
not per token. A job whose client has gone is dropped from the queue, or, when running, its
generator is closed between two steps.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from ..engine import Engine, Event
from ..stats import Stats
from .errors import APIError, engine_error, internal_error

Start = Callable[[Engine], Iterator[Event]]
OnDone = Callable[["Job", "Outcome"], None]


@dataclass
class Outcome:
    """The end of a job: its text (when not streamed), finish reason and statistics."""

    text: str
    finish_reason: str | None
    stats: Stats
    error: APIError | None = None


class QueueFull(Exception):
    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__("the queue is full")
        self.waiting = waiting  # requests waiting, besides the one running
        self.retry_after = retry_after


def _settle(fut: asyncio.Future[None], error: APIError | None) -> None:
    if fut.done():  # the request went away meanwhile
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class Job:
    """One request's generation. ``start`` runs in the worker (it validates and may raise);
    ``started`` resolves when it has, then items arrive: Events (streaming) and an Outcome."""

    def __init__(
        self,
        start: Start,
        *,
        stream: bool,
        prompt_field: str,
        loop: asyncio.AbstractEventLoop,
        renames: dict[str, str] | None = None,
    ) -> None:
        self.start = start
        self.stream = stream
        self.prompt_field = prompt_field
        self.renames = renames or {}  # engine parameter -> the request's spelling of it
        self.cancelled = False  # set by the event loop, read by the worker between steps
        self.abort_error: APIError | None = None  # why it was cancelled, if not by its client
        self._loop = loop
        self.started: asyncio.Future[None] = loop.create_future()
        self._items: list[Event | Outcome] = []
        self._lock = threading.Lock()
        self._wake = asyncio.Event()
        self._wake_pending = False
        # seconds, set by the worker: from submission to its start and to its first token
        self.t_submit = perf_counter()
        self.queue_wait: float | None = None
        self.ttft: float | None = None
        self.result: Outcome | None = None  # set by the worker before it is posted

    def abort(self, error: APIError) -> None:
        """End the job for a reason of the server's (shutdown): a waiting request is answered
        with ``error``, a running one stops between steps and ends with it."""
        self.abort_error = error
        self.cancelled = True
        self._call(_settle, self.started, error)

    # --- worker side ---------------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: the server is gone
            self.cancelled = True

    def _post(self, item: Event | Outcome) -> None:
        with self._lock:
            self._items.append(item)
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            self._call(self._wake.set)

    def run(self, engine: Engine, on_done: OnDone | None = None) -> None:
        """Run the generation; ``on_done`` sees its Outcome before the request does."""
        if self.cancelled:  # its client left just as it was taken from the queue
            return
        self.queue_wait = perf_counter() - self.t_submit
        try:
            events = self.start(engine)
        except Exception as exc:
            self._call(_settle, self.started, engine_error(exc, self.prompt_field, self.renames))
            return
        self._call(_settle, self.started, None)
        texts: list[str] = []
        reason: str | None = None
        error: APIError | None = None
        try:
            for ev in events:
                if self.ttft is None and ev.tokens:
                    self.ttft = perf_counter() - self.t_submit
                if self.stream:
                    self._post(ev)
                else:
                    texts.append(ev.text)
                reason = ev.finish_reason or reason
                if self.cancelled:
                    break
        except Exception as exc:
            error = internal_error(exc)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # stops the generation between steps and books its statistics
        if self.cancelled and self.abort_error is not None:
            error = self.abort_error
        out = self.result = Outcome("".join(texts), reason, engine.last_stats, error)
        if on_done is not None:
            try:
                on_done(self, out)
            except Exception as exc:
                internal_error(exc)  # logged; the request is answered all the same
        self._post(out)

    # --- event loop side -----------------------------------------------------------------------

    async def items(self) -> list[Event | Outcome]:
        """The items posted since the last call (waits for at least one)."""
        await self._wake.wait()
        self._wake.clear()
        with self._lock:
            out, self._items = self._items, []
            self._wake_pending = False
        return out

    async def outcome(self) -> Outcome:
        while True:
            for item in await self.items():
                if isinstance(item, Outcome):
                    return item


class Worker:
    """The FIFO queue in front of the engine and the thread that drains it."""

    def __init__(self, engine: Engine, max_queue: int, on_done: OnDone | None = None) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.on_done = on_done  # called in the worker thread as each generation ends
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._closing = False
        self._durations: deque[float] = deque(maxlen=8)
        self._thread = threading.Thread(target=self._loop, name="localspec-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Refuse new jobs, answer the waiting ones 503 and stop the running one between
        steps, so that every open request ends promptly (the server is shutting down)."""
        error = APIError(
            503, "the server is shutting down", type="server_error", code="shutting_down"
        )
        with self._cond:
            self._closing = True
            for job in [*self._jobs, *([self._running] if self._running else [])]:
                job.abort(error)
            self._jobs.clear()
            self._cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """close(), then wait for the worker thread to end."""
        self.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job, or raise QueueFull when it would make more than max_queue jobs wait.
        With max_queue 0 a job is taken only when the worker is idle."""
        with self._cond:
            # the jobs that would wait with this one queued: all queued ones, less the one the
            # worker takes next when it is idle (queued but not yet taken)
            waiting = len(self._jobs) + (0 if self._running is None else 1)
            if self._closing or waiting > self.max_queue:
                raise QueueFull(len(self._jobs), self._retry_after())
            self._jobs.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """The client has gone: drop the job if it waits, stop it if it runs."""
        job.cancelled = True
        with self._cond:
            if job in self._jobs:
                self._jobs.remove(job)

    @property
    def queued(self) -> int:
        return len(self._jobs)

    @property
    def busy(self) -> bool:
        return self._running is not None

    def _retry_after(self) -> int:
        """Seconds until a place is likely free: the recent mean job time times the jobs
        ahead (1 to 60)."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return int(min(60, max(1, round(mean * (len(self._jobs) + 1)))))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                job = self._running = self._jobs.popleft()
            t0 = perf_counter()
            try:
                job.run(self.engine, self.on_done)
            finally:
                with self._cond:
                    self._running = None
                self._durations.append(perf_counter() - t0)
