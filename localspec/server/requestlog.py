"""One log line per request on the ``localspec.server`` logger, and the request counter.

The line is written when the response has been sent (a stream: when it ends), e.g.::

    127.0.0.1 POST /v1/chat/completions 200 prompt_tokens=12 completion_tokens=30
    tokens_per_s=85.2 tau=2.41 queue_s=0.000 total_s=0.412

(one line). Generations add their tokens, decoding speed, tau (mean tokens per verify step)
and the seconds they waited in the queue; failures add ``error=CODE``. /health and /metrics,
which probes and scrapers poll, are logged at DEBUG, everything else at INFO.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .worker import Job

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger("localspec.server")

SCOPE_KEY = "localspec.request"
QUIET_PATHS = ("/health", "/metrics")


@dataclass
class RequestRecord:
    """What the routes tell the log about one request."""

    job: Job | None = None
    error: str | None = None  # the error's code (or type) when one was answered
    gone: bool = False  # the client left before its answer


def record(request: Request) -> RequestRecord:
    """The request's record (a detached one for an app without RequestLog)."""
    rec = request.scope.get(SCOPE_KEY)
    return rec if isinstance(rec, RequestRecord) else RequestRecord()


class RequestLog:
    """ASGI middleware: logs each request as it ends and counts it (metrics on) as its
    response starts. ``endpoints``: the served paths; others are counted as "other"."""

    def __init__(self, app: ASGIApp, metrics: Metrics | None, endpoints: tuple[str, ...]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = perf_counter()
        rec = scope[SCOPE_KEY] = RequestRecord()
        status: int | None = None

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                self._count(scope, status)
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except Exception:
            if status is None:  # answered 500 by Starlette's outermost middleware
                status, rec.error = 500, "internal_error"
                self._count(scope, status)
            raise
        finally:
            self._log(scope, rec, status, perf_counter() - t0)

    def _count(self, scope: Scope, status: int) -> None:
        if self.metrics is not None:
            path = scope["path"]
            self.metrics.request(path if path in self.endpoints else "other", status)

    def _log(self, scope: Scope, rec: RequestRecord, status: int | None, seconds: float) -> None:
        level = logging.DEBUG if scope["path"] in QUIET_PATHS else logging.INFO
        if not log.isEnabledFor(level):
            return
        client = scope.get("client")
        parts = [
            client[0] if client else "-",
            scope["method"],
            scope["path"],
            str(status) if status is not None else "-",
        ]
        job = rec.job
        out = job.result if job is not None else None
        if out is not None:
            s = out.stats
            parts += [
                f"prompt_tokens={s.prompt_tokens}",
                f"completion_tokens={s.generated}",
                f"tokens_per_s={s.tokens_per_s:.1f}",
                f"tau={s.tau:.2f}",
            ]
            if out.error is not None:
                rec.error = out.error.body.code or out.error.body.type
        if job is not None and job.queue_wait is not None:
            parts.append(f"queue_s={job.queue_wait:.3f}")
        if rec.error:
            parts.append(f"error={rec.error}")
        if rec.gone:
            parts.append("client_gone")
        parts.append(f"total_s={seconds:.3f}")
        log.log(level, " ".join(parts))
