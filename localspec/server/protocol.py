"""OpenAI's request and response shapes as pydantic models, with localspec's extensions.

Requests are strict: wrong types are errors, unknown fields are errors, and OpenAI fields this
server cannot honour are declared so that a non-default value is refused by name (never
silently ignored); null or empty, such fields ask for nothing and are accepted, as OpenAI
accepts them (clients send its response message back with its unused fields null). What
validates but cannot be served comes back from ``problem()``. Extensions: ``top_k``,
``n_draft``, ``tree``, ``draft_source`` in requests (as llama-server takes ``top_k``), a
``timings`` object in responses (where llama-server puts its own) and, in chat responses, a
``localspec`` object saying what was done to fit the conversation into the context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..options import (
    DRAFT_SOURCES,
    MAX_DRAFT,
    check_draft_source,
    check_n_draft,
    check_stops,
    check_tree,
)
from ..stats import Stats

MAX_TOKENS = 1 << 24  # the engine's own bound
MAX_SEED = 2**63 - 1
MAX_STOPS = 16  # the server's own bound: each stop string is searched at every token


@dataclass(frozen=True)
class Problem:
    """A request that validates but cannot be served as written: a 400 naming ``param``."""

    param: str
    message: str
    unsupported: bool = False  # valid OpenAI, not implemented here (code unsupported_parameter)


def _empty(value: Any) -> bool:
    """null, "", [] or {}: OpenAI's clients send these for what they do not use."""
    return value is None or (isinstance(value, (str, list, dict)) and not value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# OpenAI's content part types besides text: valid there, refused here by name
OTHER_PART_TYPES = ("image_url", "input_audio", "file", "refusal")
# fields of OpenAI's messages that ask for something this server cannot do when set (its own
# response message carries them all as null, and clients send that message back)
UNSUPPORTED_MESSAGE_FIELDS = ("tool_calls", "function_call", "audio", "refusal", "tool_call_id")


class ChatMessage(_Strict):
    # "developer" is OpenAI's newer name for the system role; "tool" and "function" are
    # declared so that they are refused by name (see problem)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # a string or a list of content parts, checked in problem(), which knows the message's
    # index: a bad part gets a message naming the real problem, not a union's first mismatch
    content: Any = None
    name: str | None = None  # OpenAI's participant name: accepted, not shown to the template
    annotations: Any = None  # citations describing the content (OpenAI's responses): ignored
    tool_calls: Any = None
    function_call: Any = None
    audio: Any = None
    refusal: Any = None
    tool_call_id: Any = None

    def problem(self, i: int) -> Problem | None:
        where = f"messages[{i}]"
        if self.role in ("tool", "function"):
            return Problem(
                f"{where}.role",
                f"{where}.role: {self.role!r} messages are not supported by localspec serve "
                "(it has no tool calling)",
                unsupported=True,
            )
        for name in UNSUPPORTED_MESSAGE_FIELDS:
            if not _empty(getattr(self, name)):
                return Problem(
                    f"{where}.{name}",
                    f"{where}.{name} is not supported by localspec serve",
                    unsupported=True,
                )
        content = self.content
        if content is None:
            return Problem(f"{where}.content", f"{where}.content is missing")
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return Problem(
                f"{where}.content",
                f"{where}.content must be a string or a list of content parts, "
                f"got {json.dumps(content)}",
            )
        for j, part in enumerate(content):
            what = f"content part {j} of {where}"
            if not isinstance(part, dict):
                return Problem(
                    f"{where}.content[{j}]", f"{what} must be an object, got {json.dumps(part)}"
                )
            problem = _part_problem(part, f"{where}.content[{j}]", what)
            if problem is not None:
                return problem
        return None

    def as_template_message(self) -> dict[str, str]:
        """{role, content} for the chat template (after problem() found nothing)."""
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p["text"] for p in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


def _part_problem(part: dict[str, Any], param: str, what: str) -> Problem | None:
    kind = part.get("type")
    if kind == "text":
        if "text" not in part:
            return Problem(f"{param}.text", f"{what} has type 'text' but no 'text' field")
        if not isinstance(part["text"], str):
            return Problem(
                f"{param}.text", f"{what}: 'text' must be a string, got {json.dumps(part['text'])}"
            )
        extra = sorted(set(part) - {"type", "text"})
        if extra:
            return Problem(f"{param}.{extra[0]}", f"{what} has an unknown field {extra[0]!r}")
        return None
    if kind in OTHER_PART_TYPES:
        return Problem(
            f"{param}.type",
            f"unsupported content part type {kind!r} in {what}: localspec serve takes text only",
            unsupported=True,
        )
    if "type" not in part:
        return Problem(f"{param}.type", f"{what} has no 'type' field")
    return Problem(f"{param}.type", f"{what} has an unknown type {json.dumps(kind)}")


class StreamOptions(_Strict):
    include_usage: bool | None = None


# Fields of OpenAI's API that this server does not implement, with the values besides null that
# ask for nothing (accepted); any other value is refused with a 400 naming the field.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
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


# request fields passed to the engine under their own names when given
SAMPLER_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "min_p",
    "typical_p",
    "repeat_last_n",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
)


class _Generation(_Strict):
    """The fields shared by chat and raw completions."""

    model: str | None = None  # any name is accepted; the served id is echoed back
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)  # extension (llama-server's); 0 = no limit
    # a sampler field left out samples as the model recommends (Engine.sampling_with)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    # llama.cpp's samplers under llama-server's names (ranges checked by SamplingParams, which
    # names the field); OpenAI's penalties and logit_bias are among them
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Any = None  # {"token id": bias}, or [[id or text, bias]]; false bans
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's name for repeat_penalty
    repeat_last_n: int | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    # checked by the engine's own functions (options.py), so that the two cannot disagree
    stop: Any = None  # a string or a list of strings
    stream: bool | None = None  # null: false, as OpenAI
    stream_options: StreamOptions | None = None
    n_draft: Any = None  # extension: "auto" or a chain length
    tree: Any = None  # extension: "D,K,B" or [D, K, B]; a TreeShape once validated
    draft_source: Any = None  # extension: "auto", "eagle", "mtp", "ngram" or "none"
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

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Any) -> list[tuple[int | str, float]] | None:
        """OpenAI's {"token id": bias} or llama-server's [[token id or text, bias]]; a bias of
        false bans the token (-inf); a text biases each of its tokens."""
        if v is None:
            return None
        if isinstance(v, dict):  # OpenAI's {"token id": bias}; a key that is no id is a text
            pairs = [(int(k) if k.strip().isdigit() else k, b) for k, b in v.items()]
        elif isinstance(v, list) and all(isinstance(e, list) and len(e) == 2 for e in v):
            pairs = [(e[0], e[1]) for e in v]
        else:
            raise ValueError(
                'logit_bias must be {"token id": bias} or [[token id or text, bias], ...]'
            )
        out: list[tuple[int | str, float]] = []
        for t, b in pairs:
            if isinstance(t, bool) or not isinstance(t, (int, str)):
                raise ValueError(f"logit_bias names a token by id or text, got {json.dumps(t)}")
            if b is False:
                bias = float("-inf")
            elif isinstance(b, bool) or not isinstance(b, (int, float)):
                raise ValueError(f"logit_bias values are numbers or false, got {json.dumps(b)}")
            else:
                try:
                    bias = float(b)
                except OverflowError:  # an integer beyond any float: out of range
                    bias = float("inf")
            out.append((t, bias))
        return out

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> list[str] | None:
        if v is None:
            return None
        stops = check_stops(v)  # InvalidParameterError is a ValueError: pydantic reports it
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        return stops

    @field_validator("n_draft")
    @classmethod
    def _n_draft(cls, v: Any) -> Any:
        if v is None:
            return None
        try:
            return check_n_draft(v)
        except ValueError:
            # the engine decides; the message names both forms and shows the JSON value
            # (3.0 is refused, as on the command line and in the engine: not an integer)
            raise ValueError(
                f'n_draft must be "auto" or an integer in [0, {MAX_DRAFT}], got {json.dumps(v)}'
            ) from None

    @field_validator("tree")
    @classmethod
    def _tree(cls, v: Any) -> Any:
        return check_tree(v)

    @field_validator("draft_source")
    @classmethod
    def _draft_source(cls, v: Any) -> Any:
        if v is None:
            return None
        try:
            return check_draft_source(v)
        except ValueError:
            # the engine decides; the message shows the names and the value as JSON
            names = ", ".join(json.dumps(n) for n in DRAFT_SOURCES)
            raise ValueError(f"draft_source must be one of {names}, got {json.dumps(v)}") from None

    def problem(self) -> Problem | None:
        """The first field set to a value this server cannot honour, if any."""
        if (
            self.repeat_penalty is not None
            and self.repetition_penalty is not None
            and self.repeat_penalty != self.repetition_penalty
        ):
            return Problem(
                "repetition_penalty",
                "repeat_penalty and repetition_penalty (its vLLM spelling) disagree: give one",
            )
        for name, accepted in UNSUPPORTED_DEFAULTS.items():
            value = getattr(self, name, None)
            if value is not None and not any(
                value == a and type(value) is type(a) for a in accepted
            ):
                return Problem(name, f"{name} is not supported by localspec serve", True)
        return None

    def sampling(self, default_max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for Engine.complete_stream/chat_stream, less the samplers
        (sampler_settings)."""
        kw: dict[str, Any] = {
            "max_tokens": self.max_completion_tokens or self.max_tokens or default_max_tokens,
            "seed": self.seed,
            "stop": self.stop or (),
        }
        if self.n_draft is not None:
            kw["n_draft"] = self.n_draft
        if self.tree is not None:
            kw["tree"] = self.tree
        if self.draft_source is not None:
            kw["draft_source"] = self.draft_source
        return kw

    def sampler_settings(self) -> dict[str, Any]:
        """The sampler fields given, for Engine.sampling_with: the rest are the model's
        recommendation (its GGUF's general.sampling.*, else llama.cpp's defaults)."""
        out = {name: getattr(self, name) for name in SAMPLER_FIELDS}
        out["repeat_penalty"] = (
            self.repeat_penalty if self.repeat_penalty is not None else self.repetition_penalty
        )
        return {k: v for k, v in out.items() if v is not None}

    @property
    def renames(self) -> dict[str, str]:
        """Engine parameters this request spelled otherwise (for errors naming its field)."""
        if self.repetition_penalty is not None and self.repeat_penalty is None:
            return {"repeat_penalty": "repetition_penalty"}
        return {}

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

    def problem(self) -> Problem | None:
        found = super().problem()
        for i, m in enumerate(self.messages):
            if found is not None:
                break
            found = m.problem(i)
        return found


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
    cost_model_per_second: float  # auto: the cost model's expected speed, on its cost clock
    cost_model_speedup: float  # auto: its expected speed over plain decoding (0 otherwise)
    notes: list[str]  # what the engine could not do as asked (n_draft without a drafter...)
    # auto: why it runs what it runs, in the cost model's numbers (None for fixed modes)
    auto: dict[str, Any] | None = None
    # per draft source ("eagle", "ngram"): steps it drafted in, drafted, accepted, tau,
    # acceptance_rate (a token both proposed counts for both)
    sources: dict[str, dict[str, float]] = {}

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
            cost_model_speedup=s.predicted_speedup,
            notes=list(s.notes),
            auto=s.auto.as_dict() if s.auto is not None else None,
            sources={name: x.as_dict() for name, x in sorted(s.sources.items())},
        )


class ContextReport(BaseModel):
    """How the conversation was fitted into the context (the server's --context-overflow)."""

    context_overflow: str  # "rolling" or "stop"
    dropped_turns: int  # oldest turns (a user message and the replies after it) left out


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
    localspec: ContextReport | None = None


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
    localspec: ContextReport | None = None


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
    if not param or msg.startswith(param):  # the engine's checks name their parameter
        return (param or None), msg
    return param, f"{param}: {msg}"


_FIELD_NAMES = {
    name
    for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, StreamOptions)
    for name in model.model_fields
}
