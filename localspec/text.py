"""Text around a loaded model: tokenizing, token texts, and the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence

from . import _native as N
from .errors import InvalidParameterError, LocalspecError


def tokenize(
    model: N.NativeModel, text: str, *, add_special: bool = True, parse_special: bool = False
) -> list[int]:
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (N.C.llama_token * cap)()
    n = N.C.llama_tokenize(model.vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:  # the buffer was too small: -n is the size needed
        cap = -n
        buf = (N.C.llama_token * cap)()
        n = N.C.llama_tokenize(model.vocab, data, len(data), buf, cap, add_special, parse_special)
    return list(buf[:n])


def token_text(model: N.NativeModel, token: int) -> str:
    if token < 0:
        return ""
    raw = N.C.llama_vocab_get_text(model.vocab, token)
    return raw.decode("utf-8", errors="replace") if raw else ""


def chat_prompt(
    model: N.NativeModel, messages: Sequence[dict[str, str]], *, path: str = "the model"
) -> tuple[str, list[str]]:
    """The prompt text for messages, rendered by the model's template with llama-cpp-python's
    Jinja formatter, and the stop strings it declares."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = model.meta("tokenizer.chat_template")
    if not template:
        raise LocalspecError(f"{path} has no chat template (tokenizer.chat_template)")
    if not messages or any(not isinstance(m, dict) or "role" not in m for m in messages):
        raise InvalidParameterError("messages must be a non-empty list of {role, content}")
    bos = token_text(model, N.C.llama_vocab_bos(model.vocab))
    eos = token_text(model, N.C.llama_vocab_eos(model.vocab))
    try:
        fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
        res = fmt(messages=list(messages))  # type: ignore[arg-type]
    except Exception as exc:  # jinja2 errors and the template's raise_exception
        raise LocalspecError(f"the model's chat template failed: {exc}") from None
    stops = [res.stop] if isinstance(res.stop, str) else res.stop or []
    return res.prompt, [s for s in stops if s]
