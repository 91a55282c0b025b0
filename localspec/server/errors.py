"""Failures as OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.responses import JSONResponse

from ..errors import ContextFullError, GenerationError, InvalidParameterError, LocalspecError
from .protocol import ErrorBody, ErrorResponse

log = logging.getLogger("localspec.server")


class APIError(Exception):
    """An HTTP error to answer in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code)
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            ErrorResponse(error=self.body).model_dump(), self.status, headers=self.headers
        )


def internal_error(exc: BaseException) -> APIError:
    """A failure that is not the request's fault: logged with its traceback, answered 500."""
    log.error("internal error", exc_info=exc)
    return APIError(500, f"internal error: {exc}", type="server_error", code="internal_error")


# request fields whose name starts the engine's messages about them ("tree 5x8/40 does not fit
# this engine...", "top_k must be...")
_ENGINE_PARAMS = (
    "n_draft",
    "tree",
    "draft_source",
    "max_tokens",
    "seed",
    "temperature",
    "top_k",
    "top_p",
    "stop",
)


def engine_error(
    exc: Exception, prompt_field: str, renames: dict[str, str] | None = None
) -> APIError:
    """What the engine raised when asked to start a generation, as an HTTP error."""
    if isinstance(exc, ContextFullError):
        return APIError(400, str(exc), param=prompt_field, code="context_length_exceeded")
    if isinstance(exc, GenerationError) or not isinstance(exc, LocalspecError):
        return internal_error(exc)
    # bad parameters (checked again by the engine, which alone knows what fits it), token ids
    # out of the vocabulary, a chat template that refuses the messages
    message = str(exc)
    first = message.split(" ", 1)[0]
    param = first if first in _ENGINE_PARAMS else None
    if isinstance(exc, InvalidParameterError) and exc.parameter and param is None:
        param = exc.parameter  # a sampler's setting
    if param is not None and renames and param in renames:  # as the request spelled it
        message = message.replace(param, renames[param], 1)
        param = renames[param]
    if isinstance(exc, InvalidParameterError) and param is None:
        param = prompt_field if ("prompt" in message or "token ids" in message) else None
    return APIError(400, message, param=param)
