"""The bodies of one request's answer: a whole response, or server-sent events for a stream.

A streamed text chunk is a fixed prefix, the JSON-encoded text and a fixed suffix: the chunk's
shape is serialised once per request (from the protocol models), and per chunk only the new
text is encoded.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel

from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    CompletionChoice,
    ContextReport,
    Delta,
    ErrorResponse,
    TextCompletion,
    Timings,
    Usage,
    finish_reason,
)
from .worker import Outcome

DONE = b"data: [DONE]\n\n"
_MARK = "\x00text\x00"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _chunk_dict(model: BaseModel) -> dict[str, Any]:
    """A chunk as JSON data, leaving out the parts OpenAI leaves out when empty (a delta's
    unset role or content, usage and timings; and localspec's report), keeping
    finish_reason: null."""
    d = model.model_dump(mode="json")
    for key in ("usage", "timings", "localspec"):
        if d.get(key) is None:
            d.pop(key, None)
    for choice in d["choices"]:
        delta = choice.get("delta")
        if delta is not None:
            choice["delta"] = {k: v for k, v in delta.items() if v is not None}
    return d


class Answer:
    """Builds the answer to one chat (kind "chat") or raw completion (kind "text") request.
    ``context``: how a chat's conversation was fitted, set by the job as it starts (before
    anything is answered), reported beside the timings."""

    def __init__(self, kind: Literal["chat", "text"], model: str, include_usage: bool) -> None:
        self.kind = kind
        self.model = model
        self.include_usage = include_usage
        self.context: ContextReport | None = None
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        prefix, suffix = json.dumps(self._piece_dict(), separators=(",", ":")).split(
            json.dumps(_MARK)
        )
        self._prefix = b"data: " + prefix.encode()
        self._suffix = suffix.encode() + b"\n\n"

    # --- a whole response ----------------------------------------------------------------------

    def whole(self, out: Outcome) -> dict[str, Any]:
        usage, timings = Usage.of(out.stats), Timings.of(out.stats)
        reason = finish_reason(out.finish_reason)
        if self.kind == "chat":
            body: BaseModel = ChatCompletion(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[
                    ChatChoice(message=AssistantMessage(content=out.text), finish_reason=reason)
                ],
                usage=usage,
                timings=timings,
                localspec=self.context,
            )
        else:
            body = TextCompletion(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[CompletionChoice(text=out.text, finish_reason=reason)],
                usage=usage,
                timings=timings,
            )
        return body.model_dump(mode="json")

    # --- a stream ------------------------------------------------------------------------------

    def _chunk(
        self,
        text: str | None,
        reason: str | None = None,
        *,
        role: bool = False,
        usage: Usage | None = None,
        timings: Timings | None = None,
        no_choice: bool = False,
    ) -> BaseModel:
        """A chunk; the one that carries the timings carries the context report too."""
        fr = finish_reason(reason) if reason else None
        if self.kind == "chat":
            choices = [
                ChatChunkChoice(
                    delta=Delta(role="assistant" if role else None, content=text), finish_reason=fr
                )
            ]
            return ChatCompletionChunk(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[] if no_choice else choices,
                usage=usage,
                timings=timings,
                localspec=self.context if timings is not None else None,
            )
        return TextCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[] if no_choice else [CompletionChoice(text=text or "", finish_reason=fr)],
            usage=usage,
            timings=timings,
        )

    def _piece_dict(self) -> dict[str, Any]:
        return _chunk_dict(self._chunk(_MARK))

    def head(self) -> bytes:
        """The first event: the assistant's role (chat), sent before any token."""
        if self.kind == "chat":
            return sse(_chunk_dict(self._chunk("", role=True)))
        return b""

    def piece(self, text: str) -> bytes:
        return self._prefix + json.dumps(text).encode() + self._suffix

    def tail(self, out: Outcome) -> bytes:
        """The finishing events: finish_reason, then usage if asked for; the last chunk
        carries the timings (and a chat's context report); then [DONE]. A failure
        mid-stream becomes an error event."""
        if out.error is not None:
            return sse(ErrorResponse(error=out.error.body).model_dump()) + DONE
        timings = Timings.of(out.stats)
        text = "" if self.kind == "text" else None
        if not self.include_usage:
            return sse(_chunk_dict(self._chunk(text, out.finish_reason, timings=timings))) + DONE
        usage = Usage.of(out.stats)
        return (
            sse(_chunk_dict(self._chunk(text, out.finish_reason)))
            + sse(_chunk_dict(self._chunk(None, usage=usage, timings=timings, no_choice=True)))
            + DONE
        )
