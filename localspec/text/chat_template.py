"""Chat conversations rendered with the model's own chat template (or ChatML)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import native as N
from ..errors import InvalidParameterError, LocalspecError

ROLES = ("system", "user", "assistant")


def check_messages(messages: object) -> list[dict[str, str]]:
    """A conversation as the chat template wants it: a non-empty list of {role, content}
    with known roles and string contents."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {role, content}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise InvalidParameterError(f"message {i} must be a {{role, content}} object")
        if m.get("role") not in ROLES:
            raise InvalidParameterError(
                f"message {i} has role {m.get('role')!r}; known roles: {', '.join(ROLES)}"
            )
    return list(messages)


class ChatFormatter:
    """Renders conversations with the model's own Jinja chat template (llama-cpp-python's
    formatter). A model without one gets ChatML, as llama.cpp's server does; ``note`` says so."""

    def __init__(self, model: N.NativeModel, path: str = "the model") -> None:
        template = model.chat_template()
        self.note = ""
        if not template:
            template = N.CHATML_CHAT_TEMPLATE
            self.note = f"{path} has no chat template: using ChatML"
        # one compiled template per value of add_generation_prompt (the formatter's flag)
        self._fmts: dict[bool, Any] = {}
        self._error = ""
        try:
            for open_turn in (True, False):
                self._fmts[open_turn] = model.chat_formatter(
                    template, add_generation_prompt=open_turn
                )
        except Exception as exc:  # jinja2 cannot parse it: raw prompts still work
            self._error = f"the chat template of {path} does not compile: {exc}"
        self._extra_stops = ["<|im_end|>"] if self.note else []

    def render(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> tuple[str, list[str]]:
        """The prompt text for messages and the stop strings the template declares.
        add_generation_prompt=False renders a finished conversation (training text)."""
        msgs = check_messages(messages)
        if self._error:
            raise LocalspecError(self._error)
        try:
            res = self._fmts[add_generation_prompt](messages=msgs)
        except Exception as exc:  # jinja2 errors and the template's raise_exception
            raise LocalspecError(f"the model's chat template failed: {exc}") from None
        stops = [res.stop] if isinstance(res.stop, str) else list(res.stop or [])
        return res.prompt, [s for s in [*stops, *self._extra_stops] if s]
