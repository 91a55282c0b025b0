"""The app factory: OpenAI's endpoints over one loaded Engine, behind the FIFO worker."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..engine import Engine
from ..text.context_fit import check_overflow_policy, fit_messages
from .errors import APIError, internal_error
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ContextReport,
    ModelCard,
    ModelList,
    error_param,
)
from .requestlog import RequestLog, record
from .responses import Answer
from .worker import Job, Outcome, QueueFull, Start, Worker

if TYPE_CHECKING:
    from .metrics import Metrics

M = TypeVar("M", ChatCompletionRequest, CompletionRequest)
T = TypeVar("T")

DEFAULT_MAX_QUEUE = 16
DEFAULT_MAX_BODY = 8 << 20  # bytes: far more than any context's worth of text
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for raw completions


class _JobStream(StreamingResponse):
    """A server-sent event stream that cancels its job however it ends (a client that
    disconnects cancels the stream); ``on_close`` is told whether all of it was sent."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[bool], None]) -> None:
        super().__init__(
            self._all(body),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close
        self._sent_all = False

    async def _all(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in body:
            yield chunk
        self._sent_all = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close(self._sent_all)


class Server:
    """The state behind the routes: the engine, its worker and the settings."""

    def __init__(
        self,
        engine: Engine,
        *,
        api_key: str | None,
        max_queue: int,
        max_body: int,
        model_id: str | None,
        context_overflow: str,
        metrics: bool = False,
    ) -> None:
        self.engine = engine
        self.worker = Worker(engine, max_queue)
        self.metrics: Metrics | None = None
        if metrics:
            try:
                from .metrics import Metrics
            except ImportError as exc:
                raise ImportError(
                    f"metrics need prometheus-client ({exc.name} is missing): "
                    'pip install "prometheus-client>=0.17"',
                    name=exc.name,
                ) from None

            w = self.worker
            self.metrics = Metrics(queued=lambda: w.queued, busy=lambda: w.busy)
            w.on_done = self.metrics.generation
        self.api_key = api_key.encode() if api_key else None
        self.max_body = max_body
        self.context_overflow = context_overflow
        self.model_id = model_id or os.path.basename(engine.target_path)
        self.created = int(time.time())

    # --- request handling helpers -------------------------------------------------------------

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise APIError(
                401,
                "missing API key: send Authorization: Bearer KEY",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(key.strip().encode(), self.api_key):
            raise APIError(
                401,
                "incorrect API key",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def parse(self, request: Request, model: type[M]) -> M:
        self.authorize(request)
        too_large = APIError(
            413, f"the request body is larger than {self.max_body} bytes", code="body_too_large"
        )
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise too_large
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.max_body:
                    raise too_large
        except ClientDisconnect:  # gone while sending: nobody reads the answer
            raise APIError(400, "the client disconnected while sending its request") from None
        try:
            data = json.loads(body)
        except ValueError as exc:  # includes bad UTF-8
            raise APIError(400, f"the request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            req = model.model_validate(data)
        except ValidationError as exc:
            param, message = error_param(exc)
            raise APIError(400, message, param=param) from None
        problem = req.problem()
        if problem is not None:
            raise APIError(
                400,
                problem.message,
                param=problem.param,
                code="unsupported_parameter" if problem.unsupported else None,
            )
        return req

    async def respond(
        self,
        request: Request,
        req: ChatCompletionRequest | CompletionRequest,
        start: Start,
        answer: Answer,
        prompt_field: str,
    ) -> Response:
        """Queue the generation, then answer whole or as a stream; a client that goes away
        drops its job from the queue or stops it between steps."""
        stream = bool(req.stream)
        job = Job(
            start,
            stream=stream,
            prompt_field=prompt_field,
            loop=asyncio.get_running_loop(),
            renames=req.renames,
        )
        rec = record(request)
        rec.job = job
        try:
            self.worker.submit(job)
        except QueueFull as full:
            raise APIError(
                503,
                f"the server is busy: a generation is running and the queue is full "
                f"({full.waiting} of at most {self.worker.max_queue} requests waiting)",
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(full.retry_after)},
            ) from None
        try:
            if stream:
                here, _ = await _unless_disconnected(request, job.started)
                if not here:
                    self.worker.cancel(job)
                    rec.gone = True
                    return Response(status_code=204)  # nobody is listening

                def closed(sent_all: bool) -> None:
                    rec.gone = not sent_all
                    self.worker.cancel(job)

                return _JobStream(_events(job, answer), closed)
            here, out = await _unless_disconnected(request, _started_then_outcome(job))
            if not here or out is None:
                self.worker.cancel(job)
                rec.gone = True
                return Response(status_code=204)
            if out.error is not None:
                raise out.error
            return JSONResponse(answer.whole(out))
        except BaseException:
            self.worker.cancel(job)
            raise

    # --- routes ---------------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        req = await self.parse(request, ChatCompletionRequest)
        messages = [m.as_template_message() for m in req.messages]
        kw = req.sampling(default_max_tokens=self.engine.n_ctx)
        settings = req.sampler_settings()
        answer = Answer("chat", self.model_id, req.include_usage)
        policy = self.context_overflow

        def start(eng: Engine) -> Any:
            # fitted in the worker: counting tokens is the engine's work, in its turn
            sent, dropped = messages, 0
            if policy == "rolling":
                fitted = fit_messages(eng, messages, max_tokens=kw["max_tokens"], policy=policy)
                sent, dropped = fitted.messages, fitted.dropped_turns
            answer.context = ContextReport(context_overflow=policy, dropped_turns=dropped)
            return eng.chat_stream(sent, sampling=eng.sampling_with(**settings), **kw)

        return await self.respond(request, req, start, answer, "messages")

    async def completions(self, request: Request) -> Response:
        req = await self.parse(request, CompletionRequest)
        prompt = req.text_or_ids()
        kw = req.sampling(default_max_tokens=COMPLETION_MAX_TOKENS)
        settings = req.sampler_settings()

        def start(eng: Engine) -> Any:
            return eng.complete_stream(prompt, sampling=eng.sampling_with(**settings), **kw)

        answer = Answer("text", self.model_id, req.include_usage)
        return await self.respond(request, req, start, answer, "prompt")

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        eng = self.engine
        card = ModelCard(
            id=self.model_id,
            created=self.created,
            meta={
                "target": eng.target_path,
                "drafter": eng.draft_path,
                "draft_variant": eng.draft_variant,
                "n_ctx": eng.n_ctx,
                "context_overflow": self.context_overflow,
            },
        )
        return JSONResponse(ModelList(data=[card]).model_dump(mode="json"))

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "busy": self.worker.busy, "queued": self.worker.queued}
        )

    async def metrics_text(self, request: Request) -> Response:
        """Prometheus' exposition of the counters (the route exists with metrics on)."""
        self.authorize(request)
        assert self.metrics is not None
        body, content_type = self.metrics.exposition(request.headers.get("accept", ""))
        return Response(body, headers={"Content-Type": content_type})


async def _started_then_outcome(job: Job) -> Outcome:
    await job.started
    return await job.outcome()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, aw: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, aw's result), or (False, None) when the client disconnects first (aw is then
    cancelled)."""
    task = asyncio.ensure_future(aw)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # cancel() only asks: wait until both have ended, so that neither is left pending
        # and the task's state is final when it is read below
        for t in (gone, task):
            if not t.done():
                t.cancel()
        await asyncio.wait({task, gone})
    left = gone.done() and not gone.cancelled()
    if left:
        gone.result()  # re-raises a failure of receive() itself
    if left or task.cancelled():
        if not task.cancelled():
            task.exception()  # the task ended too, maybe failing: nobody reads it now
        return False, None
    return True, task.result()


async def _events(job: Job, answer: Answer) -> AsyncIterator[bytes]:
    head = answer.head()
    if head:
        yield head
    while True:
        texts: list[str] = []
        outcome: Outcome | None = None
        for item in await job.items():
            if isinstance(item, Outcome):
                outcome = item
            elif item.text:
                texts.append(item.text)
        if texts:
            yield answer.piece("".join(texts))
        if outcome is not None:
            yield answer.tail(outcome)
            return


def create_app(
    engine: Engine,
    *,
    api_key: str | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_body: int = DEFAULT_MAX_BODY,
    model_id: str | None = None,
    context_overflow: str = "rolling",
    metrics: bool = False,
) -> Starlette:
    """An ASGI app serving ``engine`` (loaded and owned by the caller) with OpenAI's API.

    api_key: required as ``Authorization: Bearer KEY`` on /v1 routes when set; max_queue:
    requests that may wait while one generates (more get 503 with Retry-After); max_body:
    the largest request body in bytes; model_id: the served id (default: the target's file
    name); context_overflow: "rolling" drops a chat's oldest turns when the conversation and
    a reserve for the reply would not fit the context, "stop" sends it as it is (see
    localspec.text.context_fit); metrics: serve Prometheus metrics at /metrics (needs
    prometheus-client; behind the API key when one is set). Each request is logged on the
    ``localspec.server`` logger (see localspec.server.requestlog)."""
    if max_queue < 0:
        raise ValueError("max_queue must be >= 0")
    srv = Server(
        engine,
        api_key=api_key,
        max_queue=max_queue,
        max_body=max_body,
        model_id=model_id,
        context_overflow=check_overflow_policy(context_overflow),
        metrics=metrics,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        srv.worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(srv.worker.stop)

    def answer(request: Request, err: APIError) -> Response:
        record(request).error = err.body.code or err.body.type
        return err.response()

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return answer(request, exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return answer(
            request, APIError(exc.status_code, str(exc.detail), code=None, headers=exc.headers)
        )

    async def unexpected(request: Request, exc: Exception) -> Response:
        return internal_error(exc).response()  # outside RequestLog, which logs it as a 500

    routes = [
        Route("/health", srv.health, methods=["GET"]),
        Route("/v1/models", srv.models, methods=["GET"]),
        Route("/v1/chat/completions", srv.chat_completions, methods=["POST"]),
        Route("/v1/completions", srv.completions, methods=["POST"]),
    ]
    if srv.metrics is not None:
        routes.append(Route("/metrics", srv.metrics_text, methods=["GET"]))
    endpoints = tuple(r.path for r in routes)
    app = Starlette(
        routes=routes,
        middleware=[Middleware(RequestLog, metrics=srv.metrics, endpoints=endpoints)],
        exception_handlers={APIError: api_error, HTTPException: http_error, Exception: unexpected},
        lifespan=lifespan,
    )
    app.state.server = srv
    return app
