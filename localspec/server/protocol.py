"""OpenAI's request and response shapes as pydantic models, with localspec's extensions.

Requests are strict: wrong types are errors, unknown fields are errors, and OpenAI fields this
server cannot honour are declared so that a non-default value is refused by name (never
silently ignored). Extensions: ``top_k``, ``n_draft``, ``tree`` in requests (as llama-server
takes ``top_k``) and a ``timings`` object in responses (where llama-server puts its own).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..engine import MAX_DRAFT
from ..errors import InvalidParameterError
from ..stats import Stats
from ..tree import TreeShape

MAX_TOKENS = 1 << 24  # the engine's own bound
MAX_SEED = 2**63 - 1
MAX_STOPS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    # "developer" is OpenAI's newer name for the system role
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None  # OpenAI's participant name: accepted, not shown to the template

    def as_template_message(self) -> dict[str, str]:
        text = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Strict):
    include_usage: bool = False


# Fields of OpenAI's API that this server does not implement, with the values besides null that
# ask for nothing (accepted); any other value is refused with a 400 naming the field.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "reasoning_effort": (),
    "verbosity": (),
    "web_search_options": (),
    "store": (False,),
}


class _Generation(_Strict):
    """The fields shared by chat and raw completions."""

    model: str | None = None  # any name is accepted; the served id is echoed back
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension (llama-server's); 0 = no limit
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n_draft: Literal["auto"] | int | None = None  # extension: a chain length, or auto
    tree: str | list[int] | None = None  # extension: "D,K,B" or [D, K, B]
    # informational fields that ask for nothing observable: accepted
    user: str | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    parallel_tool_calls: bool | None = None  # only meaningful with tools, which are refused
    # declared so that a request using them gets a clear refusal (see UNSUPPORTED_DEFAULTS)
    n: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return v

    @field_validator("n_draft")
    @classmethod
    def _n_draft(cls, v: str | int | None) -> str | int | None:
        if isinstance(v, int) and not 0 <= v <= MAX_DRAFT:
            raise ValueError(f'n_draft must be "auto" or an integer in [0, {MAX_DRAFT}]')
        return v

    @field_validator("tree")
    @classmethod
    def _tree(cls, v: str | list[int] | None) -> str | list[int] | None:
        try:
            if isinstance(v, str):
                TreeShape.parse(v)
            elif v is not None:
                if len(v) != 3:
                    raise InvalidParameterError("tree must be [depth, top_k, budget]")
                TreeShape(*v)
        except InvalidParameterError as exc:
            raise ValueError(str(exc)) from None
        return v

    def unsupported(self) -> str | None:
        """The first field set to a value this server cannot honour, if any."""
        for name, accepted in UNSUPPORTED_DEFAULTS.items():
            value = getattr(self, name, None)
            if value is not None and not any(
                value == a and type(value) is type(a) for a in accepted
            ):
                return name
        return None

    def sampling(self, default_max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for Engine.generate/chat."""
        kw: dict[str, Any] = {
            "max_tokens": self.max_completion_tokens or self.max_tokens or default_max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": self.top_k or 0,
            "seed": self.seed,
            "stop": self.stop or (),
        }
        if self.n_draft is not None:
            kw["n_draft"] = self.n_draft
        if self.tree is not None:
            kw["tree"] = self.tree if isinstance(self.tree, str) else tuple(self.tree)
        return kw

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    store: Any = None


class CompletionRequest(_Generation):
    # a string, a list holding one string, or token ids
    prompt: str | list[str] | list[int]
    best_of: Any = None
    echo: Any = None
    suffix: Any = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and (not v or (isinstance(v[0], str) and len(v) != 1)):
            raise ValueError("give one prompt: a string, [string] or a list of token ids")
        return v

    def text_or_ids(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str):
            return p
        return p[0] if isinstance(p[0], str) else [int(t) for t in p]  # type: ignore[arg-type]


# --- responses ----------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, s: Stats) -> Usage:
        return cls(
            prompt_tokens=s.prompt_tokens,
            completion_tokens=s.generated,
            total_tokens=s.prompt_tokens + s.generated,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=s.cached_tokens),
        )


class Timings(BaseModel):
    """Speculative statistics of one response. llama-server's names where it has them
    (prompt_n, cache_n, prompt_ms, predicted_n, predicted_ms, predicted_per_second, draft_n,
    draft_n_accepted); times in milliseconds."""

    prompt_n: int
    cache_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int  # tokens drafted (tree nodes verified besides the target's own)
    draft_n_accepted: int
    steps: int  # target verify decodes
    tau: float  # mean tokens per step, counting the target's own (EAGLE's tau)
    acceptance_rate: float
    acceptance_at: list[float]  # per draft position (a tree's per depth)
    mode: str  # the setting asked for: auto, plain, chain K, tree DxK/B
    shapes: dict[str, int]  # steps per shape actually run
    target_ms: float
    draft_ms: float
    glue_ms: float
    cost_model_per_second: float  # auto: the cost model's expected speed (0 otherwise)

    @classmethod
    def of(cls, s: Stats) -> Timings:
        return cls(
            prompt_n=s.prompt_tokens,
            cache_n=s.cached_tokens,
            prompt_ms=1e3 * s.t_prefill,
            predicted_n=s.generated,
            predicted_ms=1e3 * s.t_decode,
            predicted_per_second=s.tokens_per_s,
            draft_n=s.drafted,
            draft_n_accepted=s.accepted,
            steps=s.steps,
            tau=s.tau,
            acceptance_rate=s.acceptance_rate,
            acceptance_at=s.acceptance_at,
            mode=s.mode,
            shapes=dict(s.shapes),
            target_ms=1e3 * s.t_target,
            draft_ms=1e3 * s.t_draft,
            glue_ms=1e3 * s.t_glue,
            cost_model_per_second=s.predicted_tokens_per_s,
        )


FinishReason = Literal["stop", "length"]


def finish_reason(engine_reason: str | None) -> FinishReason:
    """eos and stop strings are OpenAI's "stop"; max_tokens and a full context "length"."""
    return "stop" if engine_reason in ("eos", "stop") else "length"


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    timings: Timings | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class TextCompletion(BaseModel):
    """A raw completion, whole or (with finish_reason None until the end) as a stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    timings: Timings | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "localspec"
    meta: dict[str, Any] = {}


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def error_param(exc: ValidationError) -> tuple[str | None, str]:
    """The first validation error as OpenAI's (param, message): param like messages[0].role."""
    err = exc.errors(include_url=False)[0]
    loc = err["loc"]
    if err["type"] == "extra_forbidden":
        param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        return param, f"{param}: unknown field"
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in _FIELD_NAMES:
            param += f".{part}" if param else str(part)
        else:
            break  # a union member's tag such as 'list[str]'
    msg = err["msg"].removeprefix("Value error, ")
    return (param or None), (f"{param}: {msg}" if param else msg)


_FIELD_NAMES = {
    name
    for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, TextPart, StreamOptions)
    for name in model.model_fields
}
